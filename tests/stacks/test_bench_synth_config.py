"""The synth benchmark's generated configs are valid, so `make bench` measures real synths."""

from __future__ import annotations

from pathlib import Path

import pytest

from platform_config import load_project
from tests.tools.script_loader import load_script


@pytest.mark.parametrize("lines", [1, 10, 50])
def test_generated_config_loads(tmp_path: Path, lines: int) -> None:
    load_script("bench_synth").make_config(tmp_path / "config", lines)
    project = load_project(tmp_path / "config")
    assert len(project.business_lines) == lines
    assert len({line.namespace for line in project.business_lines}) == lines
