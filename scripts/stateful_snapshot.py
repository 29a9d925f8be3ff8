#!/usr/bin/env python3
"""Check, or record, the stateful resources' logical IDs and replacing properties against a snapshot.

Synthesizes the platform from ``--config`` (offline, like ``make synth``) and compares the EKS
cluster, the HyperPod cluster and the Curvine volume, with every resource their create-only
properties refer to, against ``--snapshot`` (see ``stacks/stateful.py``). A difference means a
deploy would replace (or delete) one of them; each line names the config field that caused it.

Usage::

    # your deployment (the defaults: config/ against stateful-resources.json at the repo root)
    .venv/bin/python scripts/stateful_snapshot.py --write    # once; commit the file
    .venv/bin/python scripts/stateful_snapshot.py            # before each deploy (the fork's CI does)

    # the tests' scenario config (what `make test` checks)
    .venv/bin/python scripts/stateful_snapshot.py --config tests/fixtures/config \\
        --snapshot tests/fixtures/stateful-resources.json [--write]

Exit codes: see --help (the table in docs/operator-tools.md).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from operator_tools import cli  # noqa: E402

TOOL = "stateful_snapshot.py"
#: Your deployment's config and its committed snapshot (the fork's workflow checks this pair).
DEFAULT_CONFIG = "config"
DEFAULT_SNAPSHOT = "stateful-resources.json"
#: The scenario config of the tests and its snapshot (tests/stacks/test_stateful_snapshot.py).
FIXTURE_CONFIG = "tests/fixtures/config"
FIXTURE_SNAPSHOT = "tests/fixtures/stateful-resources.json"


def current_snapshot(config_dir: str) -> dict:
    """Synthesize ``config_dir`` (relative to the repository root unless absolute) in a temporary
    directory and return its snapshot.

    Raises:
        ConfigError: the config is invalid.
    """
    import stacks  # starts jsii; importing ``stacks`` quiets Node's end-of-life notice first
    from stacks.stateful import snapshot

    project = cli.load_config(REPO_ROOT / config_dir if not Path(config_dir).is_absolute() else Path(config_dir))
    with tempfile.TemporaryDirectory() as out:
        app = stacks.new_app(outdir=out)
        stacks.build_platform(app, project)
        assembly = app.synth()
        templates = {s.stack_name: s.template for s in assembly.stacks}
    return snapshot(templates, project.platform, stack_names=stacks.stack_ids(project), config_dir=config_dir)


def build_parser():
    parser = cli.make_parser(TOOL, __doc__.splitlines()[0])
    cli.add_config_option(parser, help="config directory, relative to the repository root (default: "
                                       "$KVCACHE_CONFIG_DIR, else config)")
    parser.add_argument("--snapshot", default=DEFAULT_SNAPSHOT, help="snapshot file (JSON), relative to the repo root")
    parser.add_argument("--write", action="store_true", help="record the current state instead of checking it")
    return parser


def command(args, *, write: bool) -> str:
    """The command line that repeats this run (with ``--write``), for the messages."""
    flags = (f" --config {args.config}" if args.config != DEFAULT_CONFIG else "") + (
        f" --snapshot {args.snapshot}" if args.snapshot != DEFAULT_SNAPSHOT else "")
    return f".venv/bin/python scripts/{TOOL}{flags}{' --write' if write else ''}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from platform_config import ConfigError
    from platform_config.loader import CONFIG_DIR_ENV

    args.config = str(args.config) if args.config else os.environ.get(CONFIG_DIR_ENV) or DEFAULT_CONFIG

    path = Path(args.snapshot) if Path(args.snapshot).is_absolute() else REPO_ROOT / args.snapshot
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    if not args.write and not path.is_file():
        return cli.fail(f"{shown}: no snapshot to check against; record one (once, then commit it): "
                        f"{command(args, write=True)}")
    try:
        current = current_snapshot(args.config)
    except ConfigError as exc:
        return cli.fail(exc)
    if args.write:
        path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        cli.emit(f"wrote {shown}")
        return cli.EXIT_OK
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return cli.fail(f"{shown}: not a readable snapshot ({exc}); record it again: {command(args, write=True)}")
    from stacks.stateful import compare

    problems = compare(saved, current, regenerate=command(args, write=True))
    if problems:
        cli.emit("\n".join(problems))
        return cli.EXIT_NO
    cli.emit(f"no stateful resource would be replaced ({args.config} vs {args.snapshot})")
    return cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
