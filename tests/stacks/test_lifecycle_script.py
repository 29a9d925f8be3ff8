"""lifecycle/on_create.sh: logs to its log file, finds the instance storage, puts the Curvine data
dir on it, moves containerd's data root onto /opt/sagemaker, exits non-zero on failure.

The script runs for real (bash, coreutils) against directories under ``tmp_path``. Only the
commands that read or change the host's mounts and services are replaced, by fakes first on
``PATH``: ``mountpoint`` answers from a list of "mounted" directories, ``findmnt`` and ``lsblk``
from a table of which device backs each mount and which disk models lie under each device, and
``systemctl`` records its calls and, on ``start <x>.mount``, "mounts" the ``Where=`` of the unit
file the script wrote. No test touches the real /etc/systemd, /var/lib/containerd or any mount.

Node layouts (docs/sources.md §10): the DLAMI's (instance NVMe at /opt/dlami/nvme, the secondary
EBS volume at /opt/sagemaker), HyperPod EKS's LVM layout (the instance NVMe as one LVM volume at
/opt/sagemaker, nothing at /opt/dlami/nvme), and neither.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from stacks.hyperpod_stack import INSTANCE_STORE_MOUNTS, LIFECYCLE_DIR

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

FAKE_FINDMNT = """#!/usr/bin/env bash
# Fake findmnt -n -o SOURCE --mountpoint <dir>: the device listed for <dir> in $FAKE_STATE/findmnt.
awk -F '\t' -v d="${@: -1}" '$1 == d { print $2; found = 1 } END { exit !found }' "$FAKE_STATE/findmnt" 2>/dev/null
"""

FAKE_LSBLK = """#!/usr/bin/env bash
# Fake lsblk --noheadings --inverse --output MODEL <dev>: the models listed for <dev> in
# $FAKE_STATE/lsblk (one line per device in its chain; an LVM volume itself has no model).
awk -F '\t' -v d="${@: -1}" '$1 == d { print $2 }' "$FAKE_STATE/lsblk" 2>/dev/null
exit 0
"""

INSTANCE_STORE = "Amazon EC2 NVMe Instance Storage"
EBS = "Amazon Elastic Block Store"


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

    def disks(self, **devices: tuple[Path | None, list[str]]) -> None:
        """Which device backs which mount and the disk models under it: ``name=(mount, models)``."""
        with open(self.state / "findmnt", "a") as findmnt, open(self.state / "lsblk", "a") as lsblk:
            for name, (mount, models) in devices.items():
                device = f"/dev/{name}"
                if mount is not None:
                    findmnt.write(f"{mount}\t{device}\n")
                for model in models:
                    lsblk.write(f"{device}\t{model}\n")

    def dlami_layout(self) -> None:
        """NVMe at /opt/dlami/nvme (md RAID over two instance-store disks), EBS at /opt/sagemaker."""
        self.disks(md0=(self.nvme, ["", INSTANCE_STORE, INSTANCE_STORE]), nvme1n1=(self.ebs, [EBS]))

    def lvm_layout(self) -> None:
        """The instance NVMe as one LVM volume at /opt/sagemaker; nothing at /opt/dlami/nvme."""
        self.disks(**{"mapper/vg-lv": (self.ebs, ["", INSTANCE_STORE, INSTANCE_STORE])})


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
    for name, text in (("mountpoint", FAKE_MOUNTPOINT), ("systemctl", FAKE_SYSTEMCTL),
                       ("findmnt", FAKE_FINDMNT), ("lsblk", FAKE_LSBLK)):
        fake = tmp_path / "bin" / name
        fake.write_text(text)
        fake.chmod(0o755)
    shutil.copy(SCRIPT, tmp_path / "lifecycle" / "on_create.sh")
    return n


def settings(node: Node, group: str = "g6e", data_dir: Path | str = "") -> str:
    """The ``kvcache.env`` the stack writes, with the node's stand-in mount paths."""
    return (f"KVCACHE_INSTANCE_GROUP={group}\nKVCACHE_INSTANCE_STORE_MOUNTS={node.nvme}:{node.ebs}\n"
            f"KVCACHE_CURVINE_DATA_DIR={data_dir}\n")


def run(node: Node, env_file: str | None = None, *, mounted: tuple[Path, ...] = (), active: str = "",
        write_env: bool = True, **extra: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run the script on ``node`` with ``mounted`` directories and ``active`` services."""
    if env_file is None:
        env_file = settings(node)
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


def mount_unit(node: Node, where: Path | None = None) -> Path:
    """The mount unit the script wrote for ``where`` (default: containerd's data root)."""
    where = where or node.containerd
    (unit,) = [u for u in node.systemd.glob("*.mount") if f"Where={where}" in u.read_text().splitlines()]
    return unit


def kubelet_dropin(node: Node) -> str:
    """The one directive of the kubelet drop-in the script wrote for the Worker's data directory."""
    text = (node.systemd / "kubelet.service.d" / "10-kvcache-curvine-data.conf").read_text()
    (directive,) = [line for line in text.splitlines() if line and not line.startswith(("#", "["))]
    return directive


def test_script_is_executable_bash_with_strict_mode() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -Eeuo pipefail" in text
    assert "/var/log/provision/provisioning.log" in text
    assert os.access(SCRIPT, os.X_OK)


def test_production_defaults_are_hyperpods_paths() -> None:
    text = SCRIPT.read_text()
    assert INSTANCE_STORE_MOUNTS == ("/opt/dlami/nvme", "/opt/sagemaker")  # shipped in kvcache.env
    assert 'EBS_ROOT="${KVCACHE_EBS_ROOT-/opt/sagemaker}"' in text
    assert 'CONTAINERD_ROOT="${KVCACHE_CONTAINERD_ROOT:-/var/lib/containerd}"' in text
    assert 'SYSTEMD_DIR="${KVCACHE_SYSTEMD_DIR:-/etc/systemd/system}"' in text


# --- instance storage and the Curvine Worker data directory ------------------------------------

def test_dlami_layout_creates_the_worker_data_dir_on_the_nvme_mount(node) -> None:
    node.dlami_layout()
    data_dir = node.nvme / "curvine-data"
    result, log = run(node, settings(node, data_dir=data_dir), mounted=(node.nvme, node.ebs))
    assert result.returncode == 0, result.stdout + result.stderr
    assert data_dir.is_dir()
    assert oct(data_dir.stat().st_mode & 0o777) == "0o750"
    assert f"instance storage (NVMe) chosen: {node.nvme}, from /dev/md0" in log
    assert f"Curvine Worker data directory ready: {data_dir} (on the instance storage at {node.nvme}; " \
           "kubelet requires its mounts)" in log
    # Already on instance storage: no bind mount; containerd goes to the EBS volume.
    assert [u.name for u in node.systemd.glob("*.mount")] == [mount_unit(node).name]
    # But kubelet (so the Worker) still waits for the mounts holding the data directory at every
    # later boot: without the drop-in, a boot where the NVMe mounts after kubelet would let the
    # Worker write to the root volume.
    assert kubelet_dropin(node) == f"RequiresMountsFor={data_dir}"
    assert "daemon-reload" in node.calls()
    assert "share" not in log
    assert "[start] instance group g6e" in log
    assert "[stop] instance group g6e: done" in log


def test_lvm_layout_binds_the_worker_data_dir_from_the_instance_storage_at_opt_sagemaker(node) -> None:
    node.lvm_layout()
    data_dir = node.nvme / "curvine-data"  # the configured hostPath, under the DLAMI path
    result, log = run(node, settings(node, data_dir=data_dir), mounted=(node.ebs,), active="containerd")
    assert result.returncode == 0, log
    backing = node.ebs / "curvine-data"
    assert backing.is_dir() and oct(backing.stat().st_mode & 0o777) == "0o750"
    assert f"instance storage (NVMe) chosen: {node.ebs}, from /dev/mapper/vg-lv" in log
    assert f"Curvine Worker data directory ready: {data_dir} (bind mount of {backing}" in log
    unit = mount_unit(node, data_dir)
    for line in (f"What={backing}", f"Where={data_dir}", "Type=none", "Options=bind",
                 f"RequiresMountsFor={node.ebs}", "Before=kubelet.service"):
        assert line in unit.read_text().splitlines(), line
    assert kubelet_dropin(node) == f"RequiresMountsFor={data_dir}"
    assert str(data_dir) in (node.state / "bound").read_text().split()
    # containerd moves onto the same volume; the log says they share it.
    assert f"data root is {node.target}" in log
    assert f"containerd's images and the Curvine Worker's data share {node.ebs}" in log
    assert "[stop] instance group g6e: done" in log


def test_waits_for_the_instance_storage_to_be_mounted_during_boot(node) -> None:
    """The DLAMI mounts the NVMe during boot, possibly after OnCreate starts (the EBS volume is already there)."""
    import threading

    node.dlami_layout()
    data_dir = node.nvme / "curvine-data"
    mount_later = threading.Timer(1.0, lambda: (node.state / "bound").open("a").write(f"{node.nvme}\n"))
    mount_later.start()
    try:
        result, log = run(node, settings(node, data_dir=data_dir), mounted=(node.ebs,), KVCACHE_MOUNT_WAIT_S="30")
    finally:
        mount_later.cancel()
    assert result.returncode == 0, log
    assert f"instance storage (NVMe) chosen: {node.nvme}, from /dev/md0" in log
    assert data_dir.is_dir()


def test_an_ebs_mount_is_never_taken_for_instance_storage(node) -> None:
    # /opt/sagemaker listed first but on EBS: the NVMe mount is chosen, whatever the order.
    node.dlami_layout()
    data_dir = node.nvme / "curvine-data"
    env = settings(node, data_dir=data_dir).replace(f"{node.nvme}:{node.ebs}", f"{node.ebs}:{node.nvme}")
    result, log = run(node, env, mounted=(node.nvme, node.ebs))
    assert result.returncode == 0, log
    assert f"instance storage (NVMe) chosen: {node.nvme}" in log


def test_data_dir_configured_under_opt_sagemaker_is_bound_from_the_dlami_nvme(node) -> None:
    node.dlami_layout()
    data_dir = node.ebs / "kv" / "curvine-data"
    result, log = run(node, settings(node, data_dir=data_dir), mounted=(node.nvme, node.ebs))
    assert result.returncode == 0, log
    assert (node.nvme / "kv" / "curvine-data").is_dir()  # same relative path on the NVMe
    assert f"What={node.nvme / 'kv' / 'curvine-data'}" in mount_unit(node, data_dir).read_text().splitlines()


@pytest.mark.parametrize("layout", ["nothing mounted", "only the EBS volume"])
def test_no_instance_storage_on_a_worker_group_fails_with_a_logged_error(node, layout) -> None:
    mounted = ()
    if layout == "only the EBS volume":
        node.disks(nvme1n1=(node.ebs, [EBS]))
        mounted = (node.ebs,)
    result, log = run(node, settings(node, group="p5", data_dir=node.nvme / "curvine-data"), mounted=mounted)
    assert result.returncode != 0
    assert (f"[error] no instance storage (NVMe) mount after 0s among {node.nvme} {node.ebs}; this group "
            "hosts a Curvine Worker (L2) and needs one") in log
    assert f"  {node.nvme}: not a mount point" in log
    assert (f"  {node.ebs}: mounted from /dev/nvme1n1 (ebs)" if mounted else f"  {node.ebs}: not a mount point") in log
    assert "node provisioning fails" in log
    assert "[stop]" not in log
    assert not (node.nvme / "curvine-data").exists()
    assert not (node.ebs / "curvine-data").exists()


def test_group_without_worker_tolerates_missing_instance_storage(node) -> None:
    node.disks(nvme1n1=(node.ebs, [EBS]))
    result, log = run(node, mounted=(node.ebs,))
    assert result.returncode == 0, log
    assert "no Curvine Worker on this group, continuing" in log


def test_worker_data_dir_bind_mount_is_idempotent(node) -> None:
    node.lvm_layout()
    env = settings(node, data_dir=node.nvme / "curvine-data")
    first, _ = run(node, env, mounted=(node.ebs,))
    assert first.returncode == 0
    calls = len(node.calls())
    second, log = run(node, env, mounted=(node.ebs,))
    assert second.returncode == 0, log
    assert f"{node.nvme / 'curvine-data'} is already a mount point; keeping it" in log
    assert len(node.calls()) == calls


def test_failed_worker_data_bind_mount_fails_provisioning(node) -> None:
    node.lvm_layout()
    result, log = run(node, settings(node, data_dir=node.nvme / "curvine-data"), mounted=(node.ebs,),
                      FAKE_MOUNT_FAILS="1")
    assert result.returncode != 0
    assert "node provisioning fails" in log
    assert "[stop]" not in log


def test_mount_probes_accept_the_real_util_linux_flags() -> None:
    """The real findmnt/lsblk take the flags the script passes (fakes elsewhere cannot tell)."""
    if shutil.which("findmnt") is None or shutil.which("lsblk") is None:
        pytest.skip("needs util-linux findmnt and lsblk")
    functions = subprocess.run(["sed", "-n", "/^mount_source()/,/^}/p;/^mount_backing()/,/^}/p", str(SCRIPT)],
                               capture_output=True, text=True, check=True).stdout
    assert "mount_backing()" in functions
    script = (f'INSTANCE_STORE_MODEL="{INSTANCE_STORE}"; EBS_MODEL="{EBS}"\n{functions}\n'
              'source="$(mount_source /)"; [[ -n "$source" ]] || exit 3\n'
              'lsblk --noheadings --inverse --output MODEL "$source" >/dev/null 2>&1 || [[ ! -b "$source" ]] || exit 4\n'
              'mount_backing /')
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in {"instance-store", "ebs", "other"}


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


# --- one bind-mount helper; kubelet guarded in every layout (review of the Worker data dir) -----

def test_one_helper_writes_every_bind_mount_unit() -> None:
    """The systemd bind-mount code exists once (bind_mount), used for containerd and the Worker."""
    text = SCRIPT.read_text()
    assert text.count("[Mount]") == 1 and text.count("Options=bind") == 1
    assert text.count("\nbind_mount() {") == 1 and text.count("\n  bind_mount ") == 2
    # One drop-in helper, called once for containerd and once for kubelet (both Worker layouts).
    assert text.count("RequiresMountsFor=${path}") == 1 and text.count("\n  require_mounts_for ") == 2


@pytest.mark.parametrize("layout, data_dir", [
    ("dlami", "nvme/curvine-data"),          # under the chosen mount: created there
    ("lvm", "nvme/curvine-data"),            # bind-mounted from /opt/sagemaker
    ("dlami", "opt-sagemaker/kv/curvine-data"),  # bind-mounted from the NVMe
])
def test_every_layout_keeps_kubelet_from_starting_without_the_data_dir_mounts(node, layout, data_dir) -> None:
    getattr(node, f"{layout}_layout")()
    path = node.root / data_dir
    mounted = (node.nvme, node.ebs) if layout == "dlami" else (node.ebs,)
    result, log = run(node, settings(node, data_dir=path), mounted=mounted)
    assert result.returncode == 0, log
    assert kubelet_dropin(node) == f"RequiresMountsFor={path}"
    binds = [u for u in node.systemd.glob("*.mount") if f"Where={path}" in u.read_text().splitlines()]
    assert len(binds) == (0 if path.is_relative_to(node.nvme) and layout == "dlami" else 1)
