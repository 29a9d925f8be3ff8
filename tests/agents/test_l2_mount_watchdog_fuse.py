"""The L2 mount watchdog on real FUSE mounts (root and /dev/fuse; skipped elsewhere).

The fault as it happens on a node (docs/l2-cache.md, "Dead L2 mounts"): a FUSE session mounted at
the Curvine plugin path ``<kubelet>/plugins/curvine/<mount key>/fuse-mount``, a pod's target bind-
mounted from a directory of it (``mount --bind``, as ``NodePublishVolume`` does), then the FUSE
daemon killed (an OOM kill: SIGKILL) and a new session mounted at the plugin path (what a new FUSE
pod does), to which a second pod is bound. The watchdog reads the real ``/proc/self/mountinfo`` and
probes with the real ``statvfs``: the first pod's bind is dead, the second alive, a stopped daemon
is hung within the probe's bound, and the dead bind, once detached, no longer fails the ``stat``
the kubelet's teardown makes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_agents import l2_mount_watchdog as wd
from cluster_agents.l2_mount_watchdog import ALIVE, DEAD, HUNG, WatchdogConfig, Watchdog

ROOT = Path(__file__).resolve().parents[2]
KEY = "5f0c2a9e1d3b4c6a8e7f90123456789a"
PV = "pvc-0d6c9f3e"
UID_OLD, UID_NEW = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


def _fuse_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mount --bind, FUSE allow_other)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse3 missing (make system-deps)
        return f"mfusepy unusable: {exc}"
    return None


pytestmark = pytest.mark.skipif(_fuse_usable() is not None, reason=str(_fuse_usable()))


def _mount_points(prefix: str) -> list[str]:
    return [e.mount_point for e in wd.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
            if e.mount_point.startswith(prefix)]


class Node:
    """A fake node's kubelet dir with real mounts; everything undone by :meth:`close`."""

    def __init__(self, base: Path) -> None:
        self.kubelet = base.resolve() / "kubelet"
        self.plugin_dir = self.kubelet / "plugins" / "curvine"
        self.fuse_mount = self.plugin_dir / KEY / "fuse-mount"
        self.fuse_mount.mkdir(parents=True)
        self.daemons: list[subprocess.Popen] = []

    def start_session(self, fsname: str | None = None) -> subprocess.Popen:
        """A FUSE daemon mounted at the plugin path; ``fsname``: its source and subtype
        (``curvinefs``: named as curvine-fuse v0.4.1 names its mounts)."""
        proc = subprocess.Popen([sys.executable, "-m", "tests.agents.fuse_minimal", str(self.fuse_mount),
                                 *([fsname] if fsname else [])], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.daemons.append(proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tops = wd.top_mounts(wd.parse_mountinfo(Path("/proc/self/mountinfo").read_text()))
            entry = tops.get(str(self.fuse_mount))
            if entry is not None and entry.is_fuse and proc.poll() is None and os.path.isdir(self.fuse_mount / "pv"):
                return proc
            if proc.poll() is not None:
                pytest.fail(f"FUSE server exited: {proc.stderr.read().decode()}")
            time.sleep(0.05)
        pytest.fail("FUSE server did not mount within 20 s")

    def publish(self, uid: str) -> Path:
        """What kubelet + NodePublishVolume leave: vol_data.json and a bind of <session>/pv."""
        vol = self.kubelet / "pods" / uid / "volumes" / "kubernetes.io~csi" / PV
        (vol / "mount").mkdir(parents=True)
        (vol / "vol_data.json").write_text(json.dumps({"specVolID": PV, "driverName": "curvine",
                                                        "volumeHandle": f"c@/kvcache@{PV}"}))
        subprocess.run(["mount", "--bind", str(self.fuse_mount / "pv"), str(vol / "mount")], check=True)
        return vol / "mount"

    def close(self) -> None:
        for proc in self.daemons:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        for point in sorted(_mount_points(str(self.kubelet)), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path)
    yield n
    n.close()
    shutil.rmtree(tmp_path, ignore_errors=True)


def watchdog(n: Node, probe_timeout_s: float = 2.0) -> Watchdog:
    config = WatchdogConfig(heal=False, period_s=30, probe_timeout_s=probe_timeout_s,
                            kubelet_dir=str(n.kubelet), plugin_dir=str(n.plugin_dir))
    return Watchdog("node-1", config, api=None, log=lambda line: None)


def states(report: wd.PassReport) -> dict[str, str]:
    return {m.pod_uid: m.state for m in report.mounts}


def test_a_bind_of_a_killed_session_is_dead_and_a_bind_of_the_new_session_alive(node: Node) -> None:
    first = node.start_session()
    old_target = node.publish(UID_OLD)
    assert states(watchdog(node).run_pass()) == {UID_OLD: ALIVE}

    first.send_signal(signal.SIGKILL)  # OOM kill of curvine-fuse
    first.wait(10)
    # statvfs always reaches the (gone) daemon: ENOTCONN at once. A stat may still be answered from
    # the kernel's attribute cache (libfuse's default attr_timeout, 1 s; curvine-fuse's is 1 s too);
    # past it, the bind is dead for every caller, including mountpoint(1), which the driver's
    # NodeUnpublishVolume asks before unmounting, and the stat of the kubelet's teardown.
    with pytest.raises(OSError) as dead:
        os.statvfs(old_target)
    assert dead.value.errno == 107  # ENOTCONN
    time.sleep(1.5)
    with pytest.raises(OSError) as dead:
        os.stat(old_target)
    assert dead.value.errno == 107
    assert subprocess.run(["mountpoint", "-q", str(old_target)]).returncode != 0
    report = watchdog(node).run_pass()
    assert states(report) == {UID_OLD: DEAD}  # no new session yet: the probe's ENOTCONN says so
    assert report.mounts[0].reason == "ENOTCONN: its FUSE session is gone"

    # A new FUSE pod: the driver cleans the stale plugin mount (umount -l) and mounts a new session.
    subprocess.run(["umount", "-l", str(node.fuse_mount)], check=True)
    node.start_session()
    new_target = node.publish(UID_NEW)
    report = watchdog(node).run_pass()
    assert states(report) == {UID_OLD: DEAD, UID_NEW: ALIVE}
    old = next(m for m in report.mounts if m.pod_uid == UID_OLD)
    assert old.reason.startswith("stale FUSE session")  # told apart by device, without a probe
    assert os.listdir(new_target) == ["chunk.data"]

    # Detaching the dead bind (the watchdog's heal for a terminating pod) leaves a plain directory:
    # the kubelet's IsLikelyNotMountPoint stat now succeeds and the pod can finish terminating.
    wd.unmount_detach(str(old_target))
    assert os.path.isdir(old_target) and str(old_target) not in _mount_points(str(node.kubelet))
    assert states(watchdog(node).run_pass()) == {UID_NEW: ALIVE}


def test_a_stopped_daemon_is_hung_within_the_probe_bound_and_the_pass_does_not_block(node: Node) -> None:
    session = node.start_session()
    node.publish(UID_OLD)
    w = watchdog(node, probe_timeout_s=1.0)
    os.kill(session.pid, signal.SIGSTOP)  # the daemon answers nothing (as with a stuck Primary)
    try:
        started = time.monotonic()
        report = w.run_pass()
        elapsed = time.monotonic() - started
        again = w.run_pass()  # the stuck probe is reused, no second thread
        assert states(report) == {UID_OLD: HUNG} and states(again) == {UID_OLD: HUNG}
        assert elapsed < 5 and again.probes_stuck == 1
    finally:
        os.kill(session.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while w.prober.stuck and time.monotonic() < deadline:
        time.sleep(0.05)
    assert states(w.run_pass()) == {UID_OLD: ALIVE}


@pytest.fixture
def init_stand_in():
    """A process in this test's mount namespace standing in for the host's PID 1 (whose own
    ``/proc/1/ns/mnt`` a test sandbox may not open): the DaemonSet reads ``/proc/1/mountinfo`` and
    its unmount child enters ``/proc/1/ns/mnt``; here ``/proc/<pid>/`` of this process."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait(10)


def test_the_daemon_sets_way_host_table_session_probe_and_an_unmount_in_the_hosts_namespace(
        node: Node, init_stand_in: int) -> None:
    """As the DaemonSet runs it (issue 24 item 5): the mount table of "PID 1", no kubelet layout
    read (vol_data.json removed), each session probed at the plugin path, and the dead bind detached
    by a child that enters "PID 1"'s mount namespace (``setns``, then ``umount2``)."""
    first = node.start_session(fsname=wd.CURVINE_FUSE_SOURCE)
    old_target = node.publish(UID_OLD)
    (old_target.parent / "vol_data.json").unlink()  # the host mode never reads it
    config = WatchdogConfig(heal=False, period_s=30, probe_timeout_s=2.0, kubelet_dir=str(node.kubelet),
                            plugin_dir=str(node.plugin_dir), host_mountinfo=f"/proc/{init_stand_in}/mountinfo")
    host = Watchdog("node-1", config, api=None, log=lambda line: None)
    assert states(host.run_pass()) == {UID_OLD: ALIVE}
    assert states(watchdog(node).run_pass()) == {}  # the kubelet-layout mode finds nothing without vol_data.json

    first.send_signal(signal.SIGKILL)
    first.wait(10)
    report = host.run_pass()
    assert states(report) == {UID_OLD: DEAD}  # the dead session is still on top at the plugin path: its probe
    assert "ENOTCONN" in report.mounts[0].reason

    subprocess.run(["umount", "-l", str(node.fuse_mount)], check=True)
    node.start_session(fsname=wd.CURVINE_FUSE_SOURCE)
    new_target = node.publish(UID_NEW)
    report = host.run_pass()
    assert states(report) == {UID_OLD: DEAD, UID_NEW: ALIVE}
    assert next(m for m in report.mounts if m.pod_uid == UID_OLD).reason.startswith("stale FUSE session")

    namespace = f"/proc/{init_stand_in}/ns/mnt"
    wd.unmount_in_host_namespace(str(old_target), kubelet_dir=str(node.kubelet), namespace=namespace)
    assert os.path.isdir(old_target) and str(old_target) not in _mount_points(str(node.kubelet))
    assert states(host.run_pass()) == {UID_NEW: ALIVE} and os.listdir(new_target) == ["chunk.data"]
    with pytest.raises(OSError) as not_mounted:  # the child's errno comes back: nothing is mounted there now
        wd.unmount_in_host_namespace(str(old_target), kubelet_dir=str(node.kubelet), namespace=namespace)
    assert not_mounted.value.errno == errno.EINVAL
