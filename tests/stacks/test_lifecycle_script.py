"""lifecycle/on_create.sh: logs to its log file, prepares the Curvine data dir, moves containerd's
data root onto the secondary EBS volume, exits non-zero on failure.

The script runs for real (bash, coreutils) against directories under ``tmp_path``. Only the two
commands that touch the host's mounts and services are replaced, by fakes first on ``PATH``:
``mountpoint`` answers from a list of "mounted" directories, and ``systemctl`` records its calls
and, on ``start <x>.mount``, "mounts" the ``Where=`` of the unit file the script wrote. No test
touches the real /etc/systemd, /var/lib/containerd or any mount.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from stacks.hyperpod_stack import LIFECYCLE_DIR

SCRIPT = LIFECYCLE_DIR / "on_create.sh"

FAKE_MOUNTPOINT = """#!/usr/bin/env bash
# Fake mountpoint(1): a path is mounted if listed in $FAKE_MOUNTS (':'-separated) or bound by
# the fake systemctl.
path="${@: -1}"
IFS=: read -ra mounts <<< "${FAKE_MOUNTS:-}"
for m in "${mounts[@]}"; do [[ "$path" == "$m" ]] && exit 0; done
[[ -f "$FAKE_STATE/bound" ]] && grep -qxF -- "$path" "$FAKE_STATE/bound" && exit 0
exit 1
"""

FAKE_SYSTEMCTL = """#!/usr/bin/env bash
# Fake systemctl: records calls; services in $FAKE_ACTIVE are active; 'start <unit>.mount'
# binds the Where= of that unit file (fails if $FAKE_MOUNT_FAILS is set).
echo "$*" >> "$FAKE_STATE/calls"
case "$1" in
  is-active) [[ " ${FAKE_ACTIVE:-} " == *" ${@: -1} "* ]]; exit ;;
  start)
    if [[ "$2" == *.mount ]]; then
      [[ -z "${FAKE_MOUNT_FAILS:-}" ]] || exit 1
      sed -n 's/^Where=//p' "$KVCACHE_SYSTEMD_DIR/$2" >> "$FAKE_STATE/bound"
    fi ;;
esac
exit 0
"""


@dataclass
class Node:
    """A stand-in node: its directories, the fakes' state, and what the script printed."""

    root: Path
    nvme: Path
    ebs: Path
    containerd: Path
    systemd: Path
    state: Path
    log_file: Path

    @property
    def target(self) -> Path:
        return self.ebs / "containerd" / "data-root"

    def calls(self) -> list[str]:
        calls = self.state / "calls"
        return calls.read_text().splitlines() if calls.exists() else []


@pytest.fixture
def node(tmp_path) -> Node:
    n = Node(root=tmp_path, nvme=tmp_path / "nvme", ebs=tmp_path / "opt-sagemaker",
             containerd=tmp_path / "var/lib/containerd", systemd=tmp_path / "etc/systemd/system",
             state=tmp_path / "fake-state", log_file=tmp_path / "provision" / "provisioning.log")
    for d in (n.nvme, n.ebs, n.containerd, n.state, tmp_path / "bin", tmp_path / "lifecycle"):
        d.mkdir(parents=True)
    # What the AMI pre-loads into containerd (e.g. the pause image).
    blob = n.containerd / "io.containerd.content.v1.content" / "blobs" / "sha256" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_text("pause image layer")
    for name, text in (("mountpoint", FAKE_MOUNTPOINT), ("systemctl", FAKE_SYSTEMCTL)):
        fake = tmp_path / "bin" / name
        fake.write_text(text)
        fake.chmod(0o755)
    shutil.copy(SCRIPT, tmp_path / "lifecycle" / "on_create.sh")
    return n


def run(node: Node, env_file: str | None = None, *, mounted: tuple[Path, ...] = (), active: str = "",
        write_env: bool = True, **extra: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run the script on ``node`` with ``mounted`` directories and ``active`` services."""
    if env_file is None:
        env_file = f"KVCACHE_INSTANCE_GROUP=g6e\nKVCACHE_NVME_ROOT={node.nvme}\nKVCACHE_CURVINE_DATA_DIR=\n"
    if write_env:
        (node.root / "lifecycle" / "kvcache.env").write_text(env_file)
    env = {
        **os.environ,
        "PATH": f"{node.root / 'bin'}:{os.environ['PATH']}",
        "KVCACHE_LOG_FILE": str(node.log_file),
        "KVCACHE_MOUNT_WAIT_S": "0",
        "KVCACHE_FAIL_DELAY_S": "0",
        "KVCACHE_EBS_ROOT": str(node.ebs),
        "KVCACHE_CONTAINERD_ROOT": str(node.containerd),
        "KVCACHE_SYSTEMD_DIR": str(node.systemd),
        "FAKE_STATE": str(node.state),
        "FAKE_MOUNTS": ":".join(str(m) for m in mounted),
        "FAKE_ACTIVE": active,
        **extra,
    }
    result = subprocess.run(["bash", str(node.root / "lifecycle" / "on_create.sh")], env=env,
                            capture_output=True, text=True, timeout=60)
    return result, node.log_file.read_text() if node.log_file.exists() else ""


def mount_unit(node: Node) -> Path:
    (unit,) = node.systemd.glob("*.mount")
    return unit


def test_script_is_executable_bash_with_strict_mode() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -Eeuo pipefail" in text
    assert "/var/log/provision/provisioning.log" in text
    assert os.access(SCRIPT, os.X_OK)


def test_production_defaults_are_hyperpods_paths() -> None:
    text = SCRIPT.read_text()
    assert 'EBS_ROOT="${KVCACHE_EBS_ROOT-/opt/sagemaker}"' in text
    assert 'CONTAINERD_ROOT="${KVCACHE_CONTAINERD_ROOT:-/var/lib/containerd}"' in text
    assert 'SYSTEMD_DIR="${KVCACHE_SYSTEMD_DIR:-/etc/systemd/system}"' in text


# --- NVMe and the Curvine Worker data directory -------------------------------------------------

def test_success_creates_the_worker_data_dir_and_logs(node) -> None:
    data_dir = node.nvme / "curvine-data"
    result, log = run(node, f"KVCACHE_INSTANCE_GROUP=g6e\nKVCACHE_NVME_ROOT={node.nvme}\n"
                            f"KVCACHE_CURVINE_DATA_DIR={data_dir}\n", mounted=(node.nvme, node.ebs))
    assert result.returncode == 0, result.stdout + result.stderr
    assert data_dir.is_dir()
    assert oct(data_dir.stat().st_mode & 0o777) == "0o750"
    assert "[start] instance group g6e" in log
    assert "[stop] instance group g6e: done" in log


def test_missing_nvme_on_a_worker_group_fails_with_a_logged_error(node) -> None:
    result, log = run(node, f"KVCACHE_INSTANCE_GROUP=p5\nKVCACHE_NVME_ROOT={node.nvme}\n"
                            f"KVCACHE_CURVINE_DATA_DIR={node.nvme}/curvine-data\n", mounted=(node.ebs,))
    assert result.returncode != 0
    assert f"{node.nvme} not mounted" in log
    assert "node provisioning fails" in log
    assert "[stop]" not in log
    assert not (node.nvme / "curvine-data").exists()


def test_group_without_worker_tolerates_missing_nvme(node) -> None:
    result, log = run(node, mounted=(node.ebs,))
    assert result.returncode == 0, log
    assert "no Curvine Worker on this group, continuing" in log


def test_missing_settings_file_fails(node) -> None:
    result, log = run(node, write_env=False)
    assert result.returncode != 0
    assert "kvcache.env is missing" in log


# --- containerd's data root on the secondary EBS volume -----------------------------------------

def test_containerd_root_is_copied_and_bind_mounted_from_the_ebs_volume(node) -> None:
    result, log = run(node, mounted=(node.nvme, node.ebs), active="containerd kubelet")
    assert result.returncode == 0, log
    # The AMI's store is on the EBS volume, bind-mounted where containerd looks for it.
    assert (node.target / "io.containerd.content.v1.content/blobs/sha256/abc").read_text() == "pause image layer"
    assert (node.state / "bound").read_text().split() == [str(node.containerd)]
    unit = mount_unit(node).read_text()
    for line in (f"What={node.target}", f"Where={node.containerd}", "Type=none", "Options=bind",
                 f"RequiresMountsFor={node.ebs}", "Before=containerd.service"):
        assert line in unit.splitlines(), line
    dropin = (node.systemd / "containerd.service.d" / "10-kvcache-data-root.conf").read_text()
    assert f"RequiresMountsFor={node.containerd}" in dropin.splitlines()
    # kubelet and containerd stopped for the copy, started again afterwards (a restart).
    assert node.calls() == [
        "is-active --quiet kubelet", "stop kubelet", "is-active --quiet containerd", "stop containerd",
        "daemon-reload", f"start {mount_unit(node).name}", "start containerd", "start kubelet"]
    assert f"data root is {node.target}" in log
    assert "[stop] instance group g6e: done" in log


@pytest.mark.skipif(shutil.which("systemd-escape") is None, reason="needs systemd-escape to compare with")
def test_mount_unit_is_named_the_way_systemd_names_the_mount_point(node) -> None:
    # tmp paths contain '-', which systemd escapes as \x2d; a wrong name would never start.
    result, log = run(node, mounted=(node.ebs,))
    assert result.returncode == 0, log
    expected = subprocess.run(["systemd-escape", "--path", "--suffix=mount", str(node.containerd)],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert mount_unit(node).name == expected


@pytest.mark.parametrize("path, unit", [
    ("/var/lib/containerd", "var-lib-containerd.mount"),
    ("/opt/my-disk/.hidden/", "opt-my\\x2ddisk-.hidden.mount"),
    ("/.snapshots", "\\x2esnapshots.mount"),
])
def test_mount_unit_name_escapes_like_systemd(path, unit) -> None:
    function = subprocess.run(["sed", "-n", "/^mount_unit_name()/,/^}/p", str(SCRIPT)],
                              capture_output=True, text=True, check=True).stdout
    assert function, "mount_unit_name() not found in on_create.sh"
    result = subprocess.run(["bash", "-c", f'{function}\nmount_unit_name "$1"', "bash", path],
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == unit


def test_containerd_move_is_idempotent(node) -> None:
    first, _ = run(node, mounted=(node.ebs,), active="containerd")
    assert first.returncode == 0
    calls = len(node.calls())
    second, log = run(node, mounted=(node.ebs,), active="containerd")
    assert second.returncode == 0, log
    assert f"{node.containerd} is already a mount point; nothing to do" in log
    assert len(node.calls()) == calls  # no stop, no restart the second time


def test_stopped_services_are_not_started_by_the_move(node) -> None:
    result, log = run(node, mounted=(node.ebs,), active="")
    assert result.returncode == 0, log
    assert node.calls() == ["is-active --quiet kubelet", "is-active --quiet containerd", "daemon-reload",
                            f"start {mount_unit(node).name}"]


def test_data_left_by_an_earlier_root_image_is_replaced(node) -> None:
    stale = node.target / "io.containerd.metadata.v1.bolt" / "meta.db"
    stale.parent.mkdir(parents=True)
    stale.write_text("metadata of the previous root image")
    result, log = run(node, mounted=(node.ebs,))
    assert result.returncode == 0, log
    assert not stale.exists()
    assert (node.target / "io.containerd.content.v1.content/blobs/sha256/abc").exists()
    assert "left by an earlier root image" in log


def test_without_the_ebs_mount_containerd_stays_on_the_root_volume(node) -> None:
    result, log = run(node, mounted=(node.nvme,))
    assert result.returncode == 0, log
    assert f"{node.ebs} not mounted after 0s; containerd stays on the root volume" in log
    assert node.calls() == []
    assert not node.systemd.exists()
    assert not node.target.exists()


def test_failed_bind_mount_fails_provisioning_with_a_logged_error(node) -> None:
    result, log = run(node, mounted=(node.ebs,), active="containerd", FAKE_MOUNT_FAILS="1")
    assert result.returncode != 0
    assert "node provisioning fails" in log
    assert "[stop]" not in log
    assert "start containerd" not in node.calls()  # never started on the unmounted root volume
