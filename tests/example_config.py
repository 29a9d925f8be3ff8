"""The shipped example config, copied for tests that edit a file and load or synthesize the result.

One helper for every suite. Only ``platform.yaml`` and the shipped example lines are copied, not
lines a user added to ``config/``, so adding a business line as the README describes leaves
these tests meaningful and green.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config"
EXAMPLE_LINES = ("rag-assistant", "research-reasoning")


def copy_example_config(target: Path) -> Path:
    """Copy ``platform.yaml`` and the example lines to ``target`` (created); return ``target``."""
    (target / "business-lines").mkdir(parents=True)
    shutil.copy(EXAMPLE / "platform.yaml", target / "platform.yaml")
    for name in EXAMPLE_LINES:
        shutil.copy(EXAMPLE / "business-lines" / f"{name}.yaml", target / "business-lines" / f"{name}.yaml")
    return target


def edit_yaml(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Load a YAML mapping, apply ``change`` to it in place, write it back."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
