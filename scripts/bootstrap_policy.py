#!/usr/bin/env python3
"""Write least-privilege CloudFormation execution policies for `cdk bootstrap`, from cdk.out, offline.

Reads the synthesized templates of every stack (`make synth` first), unions the IAM actions the
CloudFormation handlers of their resource types call, and writes them as managed-policy documents
of at most 6,144 characters each; then prints the `aws iam create-policy` commands and the
`cdk bootstrap --cloudformation-execution-policies ...` command that uses them (and, for a
later change, the `aws iam create-policy-version` commands). No AWS call is made.

    make synth && .venv/bin/python scripts/bootstrap_policy.py

Regenerate after any change that adds a resource type, before deploying it (docs/deploy.md,
"Before the first deploy"). Exit codes: see --help (the table in docs/operator-tools.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operator_tools import cli  # noqa: E402
from operator_tools.bootstrap_policy import (  # noqa: E402
    GLOBAL_SERVICES,
    MAX_POLICIES_PER_ROLE,
    MAX_POLICY_CHARS,
    commands,
    generate,
)
from platform_config import ConfigError  # noqa: E402

TOOL = "bootstrap_policy.py"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.splitlines()[0])
    cli.add_config_option(parser)
    parser.add_argument("--assembly", type=Path, default=Path("cdk.out"), metavar="DIR",
                        help="the cloud assembly `make synth` wrote")
    parser.add_argument("--out", type=Path, default=Path("dist/bootstrap-policy"), metavar="DIR",
                        help="where to write the policy documents (<project>-cfn-execution-<n>.json)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        project = cli.load_config(args.config)
    except ConfigError as exc:
        return cli.fail(exc)
    platform = project.platform
    prefix = f"{platform.project}-cfn-execution"
    result = generate(args.assembly, prefix)
    if (result.account, result.region) != (platform.account, platform.region):
        return cli.fail(f"{args.assembly} was synthesized for {result.account}/{result.region}, the config says "
                        f"{platform.account}/{platform.region}; run `make synth` with this config first")

    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob(f"{prefix}-*.json"):
        stale.unlink()
    files: dict[str, Path] = {}
    for document in result.documents:
        path = args.out / f"{document.name}.json"
        path.write_text(json.dumps(document.document, indent=2) + "\n", encoding="utf-8")
        files[document.name] = path
    exempt = sorted(s for s in GLOBAL_SERVICES if any(s in d.services for d in result.documents))
    lines = [f"wrote {files[d.name]}  {d.chars:>5,} of {MAX_POLICY_CHARS:,} characters  {', '.join(d.services)}"
             for d in result.documents]
    lines.append(f"{len(result.collected.types)} resource types in {len(result.collected.templates)} templates, "
                 f"{result.action_count} actions, {len(result.documents)} documents "
                 f"(a role holds at most {MAX_POLICIES_PER_ROLE}); aws:RequestedRegion = {result.region} "
                 f"except {', '.join(exempt) or 'none'}")
    lines += [f"left out {action} (listed by the {rtype} schema's handlers; not an IAM action name)"
              for action, rtype in sorted(result.collected.not_actions.items())]
    create, update = commands(result, files)
    lines += ["", "# first time: create the policies, then bootstrap with them", *create,
              "", "# after a change: a new default version of each policy (a new document number needs "
              "create-policy and the bootstrap command above)", *update]
    cli.emit("\n".join(lines))
    return cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
