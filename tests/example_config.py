"""The scenario config of the tests, and helpers for tests that edit a copy of it.

Scenario tests (exact values: instance groups, line names, sizes) read ``tests/fixtures/config``,
never the user's ``config/``: a fork that replaces or removes the example business lines keeps a
green ``make test``. Tests that must hold for *whatever* ``config/`` holds (it loads, every line
synthesizes, every manifest is valid) read :data:`USER_CONFIG` and iterate over its lines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
#: The user's configuration, the input of ``make synth``: ``$KVCACHE_CONFIG_DIR`` (``make test CONFIG=dir``
#: sets it), else ``config/``.
USER_CONFIG = Path(os.environ["KVCACHE_CONFIG_DIR"]).resolve() if os.environ.get("KVCACHE_CONFIG_DIR") \
    else REPO / "config"
#: The scenario configuration of the tests; its line names are fixed.
FIXTURE_CONFIG = REPO / "tests" / "fixtures" / "config"
#: Business lines of :data:`FIXTURE_CONFIG`, sorted. The first two mirror the shipped examples;
#: ``legal-search`` (FSx weights, L2 off) and ``ticket-triage`` (a second S3 bucket, L1 off,
#: ``deploy: false``) cover what the examples do not.
FIXTURE_LINES = ("legal-search", "rag-assistant", "research-reasoning", "ticket-triage")
# Older names, kept so existing imports read naturally.
EXAMPLE = FIXTURE_CONFIG
EXAMPLE_LINES = FIXTURE_LINES


def copy_example_config(target: Path) -> Path:
    """Copy the scenario config (``platform.yaml`` and its lines) to ``target``; return ``target``."""
    shutil.copytree(FIXTURE_CONFIG, target)
    return target


def copy_line_file(source: Path, target: Path, text: str | None = None) -> Path:
    """Copy the business-line file ``source`` to ``target`` (a file path), with the prefix files its
    ``hot_prefixes`` name (relative to it) beside it; ``text`` replaces the line file's text. Returns ``target``."""
    text = source.read_text(encoding="utf-8") if text is None else text
    target.write_text(text, encoding="utf-8")
    data = yaml.safe_load(text) or {}
    for prefix in (data.get("hot_prefixes") or {}).get("prefixes") or []:
        for file in [m.get("file") for m in prefix.get("messages") or []] + [prefix.get("file")]:
            if file:
                (target.parent / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source.parent / file, target.parent / file)
    return target


def edit_yaml(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Load a YAML mapping, apply ``change`` to it in place, write it back."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def set_fixed(data: dict[str, Any], **fields: Any) -> None:
    """``data.update(fields)`` on a business line's mapping, without its ``autoscaling``: a test of fixed
    ``replicas`` on a line the scenario autoscales (``rag-assistant``)."""
    data.pop("autoscaling", None)
    data.update(fields)


def run_app(config_dir: Path, outdir: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python app.py`` over ``config_dir`` into ``outdir``, exactly as ``cdk synth`` runs it
    (``KVCACHE_CONFIG_DIR``, ``CDK_OUTDIR``; cdk-nag as a validation plugin); text output captured."""
    outdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "KVCACHE_CONFIG_DIR": str(config_dir), "CDK_OUTDIR": str(outdir)}
    return subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
