"""The fault tier's FUSE file system (:mod:`tests_faults.faultfs`) plus one fault of single chunk files.

Every mode of :class:`tests_faults.faultfs.FaultFs` is kept as it is (the same control file, the
same ``mode``); the control file may also carry ``"vanish": [file names]``: for a named file,
``getattr`` still answers (so LMCache's lookup, ``FSConnector.exists`` = ``os.path.exists``,
finds the chunk) but ``open`` fails with ``ENOENT``, so the load that follows the lookup
(``FSConnector.get`` opens the file, lmcache/v1/storage_backend/connector/fs_connector.py, lmcache
0.5.5) finds it gone: a chunk deleted between lookup and load (a janitor pass, a Curvine eviction)
every time, with no dependence on timing. Usage as faultfs::

    python -m tests_serving.chunkfs --backing DIR --mount DIR --control FILE
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path

import mfusepy
from mfusepy import FuseOSError

from tests_faults.faultfs import MODES, FaultFs


def write_control(path: Path, mode: str = "ok", *, vanish: list[str] | tuple[str, ...] = (), hang_ms: int = 0,
                  read_delay_ms: int = 0) -> None:
    """Switch the file system to ``mode`` (as :func:`tests_faults.faultfs.write_control`) with the
    chunk files ``vanish`` (names, not paths) made to vanish at ``open``; an atomic rename."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(json.dumps({"mode": mode, "hang_ms": hang_ms, "read_delay_ms": read_delay_ms,
                               "vanish": sorted(vanish)}), encoding="utf-8")
    os.replace(tmp, path)


class ChunkFaultFs(FaultFs):
    """:class:`FaultFs` with ``vanish`` (module docstring)."""

    def _vanished(self) -> set[str]:
        try:
            return set(json.loads(Path(self.control).read_text(encoding="utf-8")).get("vanish") or ())
        except FileNotFoundError:
            return set()

    def open(self, path: str, flags: int) -> int:
        if os.path.basename(path) in self._vanished():
            raise FuseOSError(errno.ENOENT)
        return super().open(path, flags)


def serve(backing: Path, mount: Path, control: Path) -> None:
    """Mount :class:`ChunkFaultFs` in the foreground, with the options of
    :func:`tests_faults.faultfs.serve` (kernel caches off, multithreaded)."""
    mfusepy.FUSE(ChunkFaultFs(backing, control), str(mount), foreground=True, nothreads=False,
                 entry_timeout=0, attr_timeout=0, negative_timeout=0, default_permissions=True,
                 fsname="faultfs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests_serving.chunkfs", description=__doc__.splitlines()[0])
    parser.add_argument("--backing", type=Path, required=True)
    parser.add_argument("--mount", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args(argv)
    serve(args.backing, args.mount, args.control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
