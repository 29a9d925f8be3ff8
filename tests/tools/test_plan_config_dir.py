"""`plan.py --business-line FILE` run from any directory: its platform is found, or a clean exit 2.

Rule (docs/operator-tools.md, "Planner"): ``--config DIR`` when given; else ``$KVCACHE_CONFIG_DIR``;
else the directory the file sits in as ``<dir>/business-lines/<name>.yaml`` when
``<dir>/platform.yaml`` exists; else the repository's ``config/``. The report's first line names
the platform file it read. No platform.yaml there: a config error naming the path, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.example_config import REPO, copy_example_config, copy_line_file

PLAN = REPO / "scripts" / "plan.py"


def plan(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PLAN), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_config_dir_is_inferred_from_the_line_file(tmp_path) -> None:
    config = copy_example_config(tmp_path / "my-config")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = plan(["--business-line", str(config / "business-lines" / "rag-assistant.yaml"),
                   "--prices", str(config / "prices.yaml")], elsewhere)
    assert result.returncode == 0, result.stderr
    assert "Qwen2-7B (bfloat16) on ml.g6e.12xlarge" in result.stdout


def test_a_line_file_without_its_platform_exits_2_cleanly(tmp_path) -> None:
    config = copy_example_config(tmp_path / "my-config")
    lone = copy_line_file(config / "business-lines" / "rag-assistant.yaml", tmp_path / "rag-assistant.yaml")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = plan(["--business-line", str(lone), "--config", str(empty)], tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"error: {empty}/platform.yaml: no such file; a business line is planned against its "
                             "platform: pass --config DIR\n")
    result = plan(["--business-line", str(lone), "--config", str(config)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"config        {config}/platform.yaml (the platform this line is planned against)")


def test_the_default_config_directory_is_the_same_for_every_command(tmp_path, monkeypatch) -> None:
    """Without --config: $KVCACHE_CONFIG_DIR, else the repository's config/ (named relative to the
    current directory when below it), wherever the command runs from."""
    from platform_config.loader import REPOSITORY_CONFIG, default_config_dir

    monkeypatch.delenv("KVCACHE_CONFIG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_config_dir() == REPOSITORY_CONFIG == REPO / "config"
    monkeypatch.chdir(REPO)
    assert default_config_dir() == Path("config")
    monkeypatch.setenv("KVCACHE_CONFIG_DIR", "../my-config")
    assert default_config_dir() == Path("../my-config")


def test_the_config_directory_comes_from_the_environment_too(tmp_path) -> None:
    config = copy_example_config(tmp_path / "my-config")
    lone = copy_line_file(config / "business-lines" / "rag-assistant.yaml", tmp_path / "rag-assistant.yaml")
    result = subprocess.run([sys.executable, str(PLAN), "--business-line", str(lone)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "KVCACHE_CONFIG_DIR": str(config)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"config        {config}/platform.yaml ")


def test_the_line_is_checked_against_the_inferred_platform(tmp_path) -> None:
    """Cross-file rules still apply: a type no instance group of *that* platform has is refused."""
    config = copy_example_config(tmp_path / "my-config")
    line = config / "business-lines" / "rag-assistant.yaml"
    line.write_text(line.read_text().replace("instance_type: ml.g6e.12xlarge", "instance_type: ml.g6e.48xlarge"))
    result = plan(["--business-line", str(line)], tmp_path)
    assert result.returncode == 2
    assert f"{line}: instance_type: no HyperPod instance group has this type" in result.stderr
