#!/usr/bin/env python3
"""Check, or rewrite, the snapshot of the stateful resources' logical IDs and replacing properties.

Synthesizes the platform from ``--config`` (offline, like ``make synth``) and compares the EKS
cluster, the HyperPod cluster and the Curvine volume, with every resource their create-only
properties refer to, against ``--snapshot`` (see ``stacks/stateful.py``). A difference means a
deploy would replace (or delete) one of them; each message names the config field that caused it.

Usage::

    # the scenario config of the tests (what `make test` checks; the defaults)
    .venv/bin/python scripts/stateful_snapshot.py            # check: exit 1 and one line per change
    .venv/bin/python scripts/stateful_snapshot.py --write    # record the current state

    # your own deployment: record once, check before every deploy (e.g. in CI)
    .venv/bin/python scripts/stateful_snapshot.py --config config --snapshot stateful-resources.json --write
    .venv/bin/python scripts/stateful_snapshot.py --config config --snapshot stateful-resources.json

Exit status: 0 no change (or written), 1 a stateful resource would be replaced or the snapshot is
missing, 2 invalid config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

DEFAULT_CONFIG = "tests/fixtures/config"
DEFAULT_SNAPSHOT = "tests/fixtures/stateful-resources.json"


def current_snapshot(config_dir: str) -> dict:
    """Synthesize ``config_dir`` in a temporary directory and return its snapshot.

    Raises:
        ConfigError: the config is invalid.
    """
    import stacks
    from platform_config import load_project
    from stacks.stateful import snapshot

    project = load_project(REPO_ROOT / config_dir if not Path(config_dir).is_absolute() else config_dir)
    with tempfile.TemporaryDirectory() as out:
        app = stacks.new_app(outdir=out)
        stacks.build_platform(app, project)
        assembly = app.synth()
        templates = {s.stack_name: s.template for s in assembly.stacks}
    return snapshot(templates, project.platform, stack_names=stacks.stack_ids(project), config_dir=config_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"config directory (default {DEFAULT_CONFIG})")
    parser.add_argument("--snapshot", default=DEFAULT_SNAPSHOT, help=f"snapshot file (default {DEFAULT_SNAPSHOT})")
    parser.add_argument("--write", action="store_true", help="rewrite the snapshot instead of checking it")
    args = parser.parse_args(argv)

    from platform_config import ConfigError
    from stacks.stateful import compare

    try:
        current = current_snapshot(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    path = Path(args.snapshot) if Path(args.snapshot).is_absolute() else REPO_ROOT / args.snapshot
    if args.write:
        path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")
        return 0
    if not path.exists():
        print(f"{path}: no snapshot yet; record one with --write", file=sys.stderr)
        return 1
    regenerate = ".venv/bin/python scripts/stateful_snapshot.py --write" + (
        f" --config {args.config}" if args.config != DEFAULT_CONFIG else "") + (
        f" --snapshot {args.snapshot}" if args.snapshot != DEFAULT_SNAPSHOT else "")
    problems = compare(json.loads(path.read_text(encoding="utf-8")), current, regenerate=regenerate)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"no stateful resource would be replaced ({args.config} vs {args.snapshot})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
