"""``python app.py`` with bad config: exit 1, an error naming file and field, and nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.example_config import copy_example_config, edit_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    return copy_example_config(tmp_path / "config")


def run_app(config_dir: Path, outdir: Path) -> subprocess.CompletedProcess:
    outdir.mkdir()
    env = {**os.environ, "KVCACHE_CONFIG_DIR": str(config_dir), "CDK_OUTDIR": str(outdir)}
    return subprocess.run([sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_bad_platform_value_exits_1_names_file_and_field_and_writes_nothing(config_dir, tmp_path) -> None:
    platform = config_dir / "platform.yaml"
    edit_yaml(platform, lambda d: d["hyperpod"]["tiered_storage"].update(memory_allocation_percentage=15))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 1
    assert str(platform) in result.stderr
    assert "hyperpod.tiered_storage.memory_allocation_percentage" in result.stderr
    assert "15" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_bad_business_line_exits_1_names_the_line_file(config_dir, tmp_path) -> None:
    line = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line, lambda d: d.update(instance_type="ml.g6e.48xlarge"))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 1
    assert str(line) in result.stderr
    assert "instance_type" in result.stderr
    assert "allowed: ml.g6e.12xlarge, ml.p5.48xlarge" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_value_beyond_ebs_limits_is_a_config_error_before_any_output(config_dir, tmp_path) -> None:
    """The schema allows iops up to 64,000 (io2); gp3 stops at 16,000, which the volume construct knows."""
    platform = config_dir / "platform.yaml"
    edit_yaml(platform, lambda d: d["curvine"]["primary_volume"].update(iops=20000))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert str(platform) in result.stderr
    assert "curvine.primary_volume.iops" in result.stderr
    assert "3000-16000" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []
