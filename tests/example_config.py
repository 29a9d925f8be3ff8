"""The scenario config of the tests, and helpers for tests that edit a copy of it.

Scenario tests (exact values: instance groups, line names, sizes) read ``tests/fixtures/config``,
never the user's ``config/``: a fork that replaces or removes the example business lines keeps a
green ``make test``. Tests that must hold for *whatever* ``config/`` holds (it loads, every line
synthesizes, every manifest is valid) read :data:`USER_CONFIG` and iterate over its lines.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
#: The user's configuration (``config/``), the input of ``make synth``.
USER_CONFIG = REPO / "config"
#: The scenario configuration of the tests; its line names are fixed.
FIXTURE_CONFIG = REPO / "tests" / "fixtures" / "config"
#: Business lines of :data:`FIXTURE_CONFIG`.
FIXTURE_LINES = ("rag-assistant", "research-reasoning")
# Older names, kept so existing imports read naturally.
EXAMPLE = FIXTURE_CONFIG
EXAMPLE_LINES = FIXTURE_LINES


def copy_example_config(target: Path) -> Path:
    """Copy the scenario config (``platform.yaml`` and its lines) to ``target``; return ``target``."""
    shutil.copytree(FIXTURE_CONFIG, target)
    return target


def edit_yaml(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Load a YAML mapping, apply ``change`` to it in place, write it back."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
