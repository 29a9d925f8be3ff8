"""The fault file system itself does what docs/l2-cache.md says each mode stands for: checked on a
mount of its own with plain system calls, before anything is built on it."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from tests_faults.harness import FaultMount


@pytest.fixture
def fs(tmp_path):
    backing, mount = tmp_path / "backing", tmp_path / "mount"
    backing.mkdir()
    mount.mkdir()
    (backing / "d").mkdir()
    (backing / "d" / "f").write_bytes(b"x" * 1000)
    started = FaultMount(backing, mount, tmp_path / "control.json", tmp_path / "log")
    yield started
    started.stop()


def _errno(call) -> int | None:
    try:
        call()
        return None
    except OSError as exc:
        return exc.errno


def test_ok_passes_through(fs):
    f = fs.mount / "d" / "f"
    assert f.read_bytes() == b"x" * 1000
    (fs.mount / "d" / "g").write_bytes(b"y")
    os.replace(fs.mount / "d" / "g", fs.mount / "d" / "h")
    assert (fs.backing / "d" / "h").read_bytes() == b"y" and not (fs.backing / "d" / "g").exists()


def test_hang_waits_its_bound_then_fails_with_eio(fs):
    fs.switch("hang", hang_ms=400)
    t0 = time.monotonic()
    assert _errno(lambda: os.stat(fs.mount / "d" / "f")) == errno.EIO
    assert time.monotonic() - t0 >= 0.4


def test_a_hung_operation_is_carried_out_when_the_mode_changes(fs):
    """As Curvine's next attempt succeeds once the Primary answers."""
    fs.switch("hang", hang_ms=60_000)
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(os.stat(fs.mount / "d" / "f").st_size))
    waiter.start()
    fs.switch("ok")
    waiter.join(timeout=30)
    assert result == [1000]


@pytest.mark.parametrize(("mode", "code"), [("eio", errno.EIO), ("enotconn", errno.ENOTCONN)])
def test_failing_modes_fail_every_operation_at_once(fs, mode, code):
    fs.switch(mode)
    assert _errno(lambda: os.stat(fs.mount / "d" / "f")) == code
    assert _errno(lambda: os.listdir(fs.mount)) == code
    assert _errno(lambda: os.mkdir(fs.mount / "e")) == code
    assert _errno(lambda: os.unlink(fs.mount / "d" / "f")) == code
    assert (fs.backing / "d" / "f").exists()


def test_enospc_refuses_writes_only(fs):
    fs.switch("enospc")
    assert (fs.mount / "d" / "f").read_bytes() == b"x" * 1000
    fd = os.open(fs.mount / "d" / "new", os.O_WRONLY | os.O_CREAT)
    try:
        assert _errno(lambda: os.write(fd, b"z" * 100)) == errno.ENOSPC
    finally:
        os.close(fd)
    os.unlink(fs.mount / "d" / "new")  # deleting needs no space
    assert not (fs.backing / "d" / "new").exists()


def test_slow_read_delays_reads_only(fs):
    fs.switch("slow_read", read_delay_ms=300)
    t0 = time.monotonic()
    os.stat(fs.mount / "d" / "f")
    assert time.monotonic() - t0 < 0.3
    t0 = time.monotonic()
    assert (fs.mount / "d" / "f").read_bytes() == b"x" * 1000
    assert time.monotonic() - t0 >= 0.3


def test_enotconn_is_what_the_kernel_answers_for_a_dead_session(fs):
    """The ``enotconn`` mode stands for a FUSE daemon that is gone: with the daemon killed, the
    kernel itself answers every operation on the mount with ENOTCONN."""
    fs.proc.kill()
    fs.proc.wait(timeout=30)
    assert _errno(lambda: os.stat(fs.mount / "d" / "f")) == errno.ENOTCONN
    assert _errno(lambda: os.listdir(fs.mount)) == errno.ENOTCONN
    assert (fs.backing / "d" / "f").exists()
