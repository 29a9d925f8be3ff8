"""A minimal real FUSE file system for the L2 mount watchdog's test: ``/`` holds ``pv/`` (the
stand-in for a PV's directory that the Curvine CSI driver bind-mounts into a pod) with one file.

Deliberately minimal: no fault injection (a controllable fault file system is the FUSE fault
tier's). Run ``python -m tests.agents.fuse_minimal MOUNTPOINT [FSNAME]``: it mounts in the foreground until
SIGTERM (unmounting) or SIGKILL (leaving the mount dead: ENOTCONN, as an OOM-killed curvine-fuse).
``FSNAME`` (e.g. ``curvinefs``) becomes the mount's source and subtype, as curvine-fuse v0.4.1 names
its mounts (``fuse.curvinefs``, source ``curvinefs``).
"""

from __future__ import annotations

import errno
import stat
import sys
import time

import mfusepy as fuse

PV_DIR = "pv"
FILE = "chunk.data"
CONTENT = b"kv"


class MinimalFs(fuse.Operations):
    """Read-only: ``/``, ``/pv`` and ``/pv/chunk.data``; ``statfs`` answers (the watchdog's probe)."""

    def getattr(self, path: str, fh: int | None = None) -> dict:
        now = time.time()
        if path in ("/", f"/{PV_DIR}"):
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_mtime": now, "st_ctime": now, "st_atime": now}
        if path == f"/{PV_DIR}/{FILE}":
            return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": len(CONTENT),
                    "st_mtime": now, "st_ctime": now, "st_atime": now}
        raise fuse.FuseOSError(errno.ENOENT)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", PV_DIR] if path == "/" else [".", "..", FILE]

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return CONTENT[offset:offset + size]

    def statfs(self, path: str) -> dict:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1024, "f_bfree": 512, "f_bavail": 512}


if __name__ == "__main__":
    names = {"fsname": sys.argv[2], "subtype": sys.argv[2]} if len(sys.argv) > 2 else {}
    fuse.FUSE(MinimalFs(), sys.argv[1], foreground=True, allow_other=True, **names)
