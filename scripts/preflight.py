#!/usr/bin/env python3
"""Before `cdk deploy`: check account, zones, add-on versions and schemas, cluster version, bootstrap.

Add-on versions are checked against the cluster's Kubernetes version and HyperPod's minimums, every
configuration key the platform sets against the pinned version's schema, and a running cluster's
version against the versions HyperPod supports and eks.version.

With --cloud-assembly, the hyperpod stack's synthesized template is compared with the deployed one:
when the deploy would update the HyperPod cluster while deep health checks run on its nodes, the
"hyperpod update" check fails and names them (without it, any deploy is taken to change the stack).
A change of curvine.primary_volume that EBS would refuse (a smaller size, a modification within six
hours of the last one or before it completed) fails the "Curvine Primary volume" check.

Read-only AWS calls with the standard credential chain (AWS_PROFILE, env, SSO, ...).
Exit codes: see --help (the table in docs/operator-tools.md): 2 also when AWS cannot be queried.

    .venv/bin/python scripts/preflight.py [--config DIR] [--cloud-assembly cdk.out] [--only "hyperpod update"] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operator_tools import cli  # noqa: E402
from operator_tools.preflight import HYPERPOD_UPDATE_CHECK, run_preflight  # noqa: E402
from platform_config import ConfigError  # noqa: E402
from platform_config.stack_names import platform_stack_name  # noqa: E402


TOOL = "preflight.py"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.splitlines()[0])
    cli.add_config_option(parser)
    parser.add_argument("--cloud-assembly", metavar="DIR",
                        help="the synthesized cloud assembly about to be deployed (cdk.out): the hyperpod stack's "
                        "template in it decides whether the deploy updates the HyperPod cluster")
    parser.add_argument("--only", choices=[HYPERPOD_UPDATE_CHECK],
                        help="run this check alone (CI runs it right before the hyperpod stack)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: list[str] | None = None, session_factory=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        project = cli.load_config(args.config)
    except ConfigError as exc:
        return cli.fail(exc)
    template = None
    if args.cloud_assembly:
        path = Path(args.cloud_assembly) / f"{platform_stack_name(project.platform.project, 'hyperpod')}.template.json"
        try:
            template = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return cli.fail(f"--cloud-assembly: cannot read {path}: {exc}")
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        results = run_preflight(project.platform, session_factory=session_factory, hyperpod_template=template,
                                only=args.only)
    except (BotoCoreError, ClientError) as exc:
        return cli.fail(f"cannot query AWS in {project.platform.region}: {exc}")
    if args.json:
        cli.emit(json.dumps([asdict(r) for r in results], indent=2))
    else:
        width = max(len(r.name) for r in results)
        cli.emit("\n".join(f"{'PASS' if r.ok else 'FAIL'}  {r.name:<{width}}  {r.detail}" for r in results))
    return cli.EXIT_OK if all(r.ok for r in results) else cli.EXIT_NO


if __name__ == "__main__":
    cli.run(main)
