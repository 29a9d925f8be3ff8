"""lifecycle/on_create.sh: logs to its log file, prepares the Curvine data dir, exits non-zero on failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from stacks.hyperpod_stack import LIFECYCLE_DIR

SCRIPT = LIFECYCLE_DIR / "on_create.sh"
#: A mounted, writable directory stands in for the instance NVMe (tmpfs in most containers).
SHM = Path("/dev/shm")


def run(tmp_path: Path, env_file: str) -> tuple[subprocess.CompletedProcess, str]:
    workdir = tmp_path / "lifecycle"
    workdir.mkdir()
    shutil.copy(SCRIPT, workdir / "on_create.sh")
    (workdir / "kvcache.env").write_text(env_file)
    log = tmp_path / "provision" / "provisioning.log"
    env = {**os.environ, "KVCACHE_LOG_FILE": str(log), "KVCACHE_MOUNT_WAIT_S": "0", "KVCACHE_FAIL_DELAY_S": "0"}
    result = subprocess.run(["bash", str(workdir / "on_create.sh")], env=env, capture_output=True, text=True,
                            timeout=60)
    return result, log.read_text()


def test_script_is_executable_bash_with_strict_mode() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -Eeuo pipefail" in text
    assert "/var/log/provision/provisioning.log" in text
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.skipif(not (SHM.is_dir() and os.path.ismount(SHM) and os.access(SHM, os.W_OK)),
                    reason="needs a writable mount point to stand in for the NVMe")
def test_success_creates_the_worker_data_dir_and_logs(tmp_path) -> None:
    data_dir = SHM / f"kvcache-test-{uuid.uuid4().hex}" / "curvine-data"
    try:
        result, log = run(tmp_path, f"KVCACHE_INSTANCE_GROUP=g6e\nKVCACHE_NVME_ROOT={SHM}\n"
                                    f"KVCACHE_CURVINE_DATA_DIR={data_dir}\n")
        assert result.returncode == 0, result.stdout + result.stderr
        assert data_dir.is_dir()
        assert oct(data_dir.stat().st_mode & 0o777) == "0o750"
        assert "[start] instance group g6e" in log
        assert "[stop] instance group g6e: done" in log
    finally:
        shutil.rmtree(data_dir.parent, ignore_errors=True)


def test_missing_nvme_on_a_worker_group_fails_with_a_logged_error(tmp_path) -> None:
    not_mounted = tmp_path / "nvme"
    not_mounted.mkdir()
    result, log = run(tmp_path, f"KVCACHE_INSTANCE_GROUP=p5\nKVCACHE_NVME_ROOT={not_mounted}\n"
                                f"KVCACHE_CURVINE_DATA_DIR={not_mounted}/curvine-data\n")
    assert result.returncode != 0
    assert f"{not_mounted} not mounted" in log
    assert "node provisioning fails" in log
    assert "[stop]" not in log
    assert not (not_mounted / "curvine-data").exists()


def test_group_without_worker_tolerates_missing_nvme(tmp_path) -> None:
    result, log = run(tmp_path, f"KVCACHE_INSTANCE_GROUP=cpu\nKVCACHE_NVME_ROOT={tmp_path}/none\n"
                                "KVCACHE_CURVINE_DATA_DIR=\n")
    assert result.returncode == 0, log
    assert "no Curvine Worker on this group, continuing" in log


def test_missing_settings_file_fails(tmp_path) -> None:
    workdir = tmp_path / "lifecycle"
    workdir.mkdir()
    shutil.copy(SCRIPT, workdir / "on_create.sh")
    log = tmp_path / "provisioning.log"
    env = {**os.environ, "KVCACHE_LOG_FILE": str(log), "KVCACHE_FAIL_DELAY_S": "0"}
    result = subprocess.run(["bash", str(workdir / "on_create.sh")], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "kvcache.env is missing" in log.read_text()
