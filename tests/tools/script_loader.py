"""Load a ``scripts/*.py`` entry point in-process, so tests call its ``main(argv)`` directly.

A plain module rather than a ``conftest.py`` fixture: other test directories import names from
their own ``conftest`` module, which a second ``conftest.py`` here would shadow.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (once) and return it as a module."""
    spec = importlib.util.spec_from_file_location(f"_script_{name}", REPO / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
