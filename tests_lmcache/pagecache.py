"""Dropping chunk files from the page cache, so a benchmark's or a test's next read comes from the
file system under test (the L2 mount), not from memory. Standard library only."""

from __future__ import annotations

import os
from pathlib import Path


def evict_from_page_cache(path: Path) -> None:
    """Write ``path`` out and drop it from the page cache, so its next read comes from the file system."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
