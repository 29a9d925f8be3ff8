"""A FUSE passthrough file system whose failure mode the test switches while it is in use.

It stands in for the Curvine FUSE mount of a line's PVC: every operation on ``--mount`` is
passed to the same path under ``--backing`` (a plain directory standing in for Curvine's
namespace and Workers), unless the mode of the control file ``--control`` says otherwise. The
file system runs in a process of its own over libfuse3 (PyPI ``mfusepy``, ctypes bindings of
libfuse's high-level API; Debian ``fuse3`` / ``libfuse3-3``), multithreaded like curvine-fuse.

Modes (:data:`MODES`), re-read from the control file by every operation (so an operation that
starts after the file was replaced sees the new mode; nothing depends on a polling interval):

``ok``
    plain passthrough.
``hang`` (an absent Curvine Primary)
    every operation that needs the Primary blocks until the mode changes or ``hang_ms`` has
    passed, then fails with ``EIO``. This models curvine-fuse with the client settings of the
    StorageClass (:func:`k8s.curvine_config.fuse_master_op_bound_ms`, Curvine v0.3.2-alpha): a
    metadata RPC is retried (``ClusterConnector::rpc``) until the retry window closes and the
    error maps to ``EIO`` (``FuseError::from(FsError::IO)``); an attempt that starts after the
    Primary is back succeeds, which is why a mode switch ends the wait with the operation
    carried out. The ``read`` and ``write`` requests of an open file go to a Worker, not the
    Primary, and pass (so does ``release``, which must close the backing descriptor); the
    kernel's attribute request before a read still waits (Curvine's attribute cache expires after
    1 s, this one's at once), and ``flush`` of a file opened for writing completes the file at
    the Primary and waits like a metadata operation.
``enotconn`` (a dead FUSE session)
    every operation fails with ``ENOTCONN``, the errno the kernel returns for every operation on
    a mount whose FUSE daemon is gone. Switching the mode back to ``ok`` stands for the mount
    being replaced (the healing of issue 15 item 2).
``eio``
    every operation fails with ``EIO`` at once (an RPC error that is not retried, a Worker
    read failure).
``enospc``
    ``write`` fails with ``ENOSPC`` (Curvine's ``DiskOutOfSpace`` when a Worker cannot place a
    block); metadata operations, reads and deletions pass.
``slow_read``
    every ``read`` waits ``read_delay_ms`` first.

What the model leaves out: Curvine's own caches (curvine-fuse keeps the kernel's entry and
attribute caches 1 s, ``FuseConf::TTR_TIMEOUT``; here both are 0 so that every operation
reaches this process and a mode switch takes effect at the next operation), the differing
retry durations of a refused, a black-holed and a hung Primary (``hang`` waits the longest
of them, :func:`k8s.curvine_config.fuse_master_op_bound_ms`), and everything about data
placement. Usage::

    python -m tests_faults.faultfs --backing DIR --mount DIR --control FILE
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mfusepy
from mfusepy import FuseOSError

#: Every mode the control file may name (module docstring).
MODES = ("ok", "hang", "enotconn", "eio", "enospc", "slow_read")
#: How often a hung operation looks at the control file again (seconds). Only how soon a hung
#: operation notices the switch depends on it, not whether it does.
HANG_POLL_S = 0.005


@dataclass(frozen=True)
class Mode:
    """What the control file says: the mode and its parameters (milliseconds)."""

    name: str = "ok"
    hang_ms: int = 0
    read_delay_ms: int = 0


def write_control(path: Path, mode: str, *, hang_ms: int = 0, read_delay_ms: int = 0) -> None:
    """Switch the file system at ``path``'s control file to ``mode`` (atomically: a rename).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`, or a delay is negative.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if hang_ms < 0 or read_delay_ms < 0:
        raise ValueError("hang_ms and read_delay_ms must be >= 0")
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(json.dumps({"mode": mode, "hang_ms": hang_ms, "read_delay_ms": read_delay_ms}), encoding="utf-8")
    os.replace(tmp, path)


class FaultFs(mfusepy.Operations):
    """Passthrough operations over ``backing`` with the failure modes of the module docstring."""

    use_ns = True

    def __init__(self, backing: Path, control: Path) -> None:
        self.backing = str(backing)
        self.control = control
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._mode = Mode()
        self._writers: set[int] = set()

    # --- the mode --------------------------------------------------------------------------------

    def mode(self) -> Mode:
        """The control file's mode; re-read whenever the file was replaced (its inode changes)."""
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            return Mode()
        stamp = (st.st_ino, st.st_mtime_ns)
        with self._lock:
            if stamp != self._stamp:
                doc = json.loads(Path(self.control).read_text(encoding="utf-8"))
                self._mode = Mode(doc["mode"], int(doc.get("hang_ms", 0)), int(doc.get("read_delay_ms", 0)))
                self._stamp = stamp
            return self._mode

    def _gate(self, kind: str) -> None:
        """Apply the mode to one operation of ``kind``: ``meta`` (needs the Primary), ``read``,
        ``write`` (data of an open file) or ``delete``. Returns to carry the operation out."""
        mode = self.mode()
        if mode.name in ("eio", "enotconn"):
            raise FuseOSError(errno.EIO if mode.name == "eio" else errno.ENOTCONN)
        if mode.name == "hang" and kind in ("meta", "delete"):
            deadline = time.monotonic() + mode.hang_ms / 1000
            while time.monotonic() < deadline:
                time.sleep(HANG_POLL_S)
                if self.mode().name != "hang":
                    return self._gate(kind)
            raise FuseOSError(errno.EIO)
        if mode.name == "enospc" and kind == "write":
            raise FuseOSError(errno.ENOSPC)
        if mode.name == "slow_read" and kind == "read":
            time.sleep(mode.read_delay_ms / 1000)

    def _full(self, path: str) -> str:
        return self.backing + path

    # --- metadata --------------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self._gate("meta")
        st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
        return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_uid": st.st_uid, "st_gid": st.st_gid,
                "st_size": st.st_size, "st_ino": st.st_ino, "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns}

    def readdir(self, path: str, fh: int) -> list[str]:
        self._gate("meta")
        return [".", "..", *os.listdir(self._full(path))]

    def access(self, path: str, amode: int) -> int:
        self._gate("meta")
        if not os.access(self._full(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._gate("meta")
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self._gate("delete")
        os.rmdir(self._full(path))
        return 0

    def unlink(self, path: str) -> int:
        self._gate("delete")
        os.unlink(self._full(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._gate("meta")
        os.replace(self._full(old), self._full(new))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._gate("meta")
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._gate("meta")
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._gate("meta")
        os.utime(self._full(path), ns=times) if times else os.utime(self._full(path))
        return 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._gate("write" if length else "meta")
        os.truncate(self._full(path), length)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        self._gate("meta")
        st = os.statvfs(self._full(path))
        return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                   "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    # --- files -----------------------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        self._gate("meta")
        fd = os.open(self._full(path), flags)
        if flags & (os.O_WRONLY | os.O_RDWR):
            self._writers.add(fd)
        return fd

    def create(self, path: str, mode: int, fi: int | None = None) -> int:
        self._gate("meta")
        fd = os.open(self._full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        self._writers.add(fd)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._gate("read")
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._gate("write")
        return os.pwrite(fh, data, offset)

    def flush(self, path: str, fh: int) -> int:
        if fh in self._writers:
            self._gate("meta")  # completing a written file is a call to the Primary
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._gate("meta")
        os.fdatasync(fh) if datasync else os.fsync(fh)
        return 0

    def release(self, path: str, fh: int) -> int:
        self._writers.discard(fh)
        os.close(fh)
        return 0


def serve(backing: Path, mount: Path, control: Path) -> None:
    """Mount :class:`FaultFs` at ``mount`` in the foreground until unmounted (``fusermount3 -u``).

    libfuse's multithreaded loop starts threads as operations arrive (14 hung operations at once
    all ended after one ``hang_ms`` here); curvine-fuse serves with 32 I/O threads by default.
    Kernel caches off (``entry_timeout``, ``attr_timeout``, ``negative_timeout`` 0), so that every
    operation reaches the daemon; ``default_permissions`` lets the kernel check modes as for a
    local file system.
    """
    mfusepy.FUSE(FaultFs(backing, control), str(mount), foreground=True, nothreads=False,
                 entry_timeout=0, attr_timeout=0, negative_timeout=0, default_permissions=True,
                 fsname="faultfs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests_faults.faultfs", description=__doc__.splitlines()[0])
    parser.add_argument("--backing", type=Path, required=True, help="directory standing in for Curvine")
    parser.add_argument("--mount", type=Path, required=True, help="mount point (an empty directory)")
    parser.add_argument("--control", type=Path, required=True, help="JSON control file (write_control)")
    args = parser.parse_args(argv)
    serve(args.backing, args.mount, args.control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
