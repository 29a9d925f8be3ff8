#!/usr/bin/env python3
"""Find deployed business-line stacks that no config file backs any more, and destroy them.

Deleting config/business-lines/<name>.yaml takes the line out of the CDK app, so
`cdk destroy` can no longer find its stack: this lists such stacks (read-only) and, with
--destroy, deletes them after you confirm (or with --yes, as CI does behind its approval).

    .venv/bin/python scripts/orphans.py                 # list
    .venv/bin/python scripts/orphans.py --destroy       # list, ask, delete, wait

Region and account come from platform.yaml; credentials from the standard chain (AWS_PROFILE,
env, SSO, ...). Exit codes: see --help (the table in docs/operator-tools.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operator_tools import cli  # noqa: E402
from operator_tools.orphans import delete_stacks, describe_all_stacks, find_orphans, format_table  # noqa: E402
from operator_tools.preflight import check_account  # noqa: E402
from platform_config import ConfigError  # noqa: E402

TOOL = "orphans.py"
CONFIRM_WORD = "delete"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.splitlines()[0])
    cli.add_config_option(parser)
    parser.add_argument("--destroy", action="store_true", help="delete the orphaned stacks after confirmation")
    parser.add_argument("--yes", action="store_true", help="with --destroy: do not ask (CI, behind an approval)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None, *, session_factory: Callable[..., Any] | None = None,
         confirm: Callable[[str], str] = input) -> int:
    """CLI entry; ``session_factory`` (a ``boto3.Session``-like callable) and ``confirm`` are for tests."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.yes and not args.destroy:
        parser.error("--yes only applies to --destroy")
    try:
        project = cli.load_config(args.config)
    except ConfigError as exc:
        return cli.fail(exc)
    platform = project.platform
    if session_factory is None:
        import boto3

        session_factory = boto3.Session
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        session = session_factory(region_name=platform.region)
        account = check_account(platform, session.client("sts").get_caller_identity())
        if not account.ok:
            return cli.fail(f"{account.detail}; refusing to look for its stacks there")
        cloudformation = session.client("cloudformation")
        orphans = find_orphans(project, describe_all_stacks(cloudformation))
    except (BotoCoreError, ClientError) as exc:
        return cli.fail(f"cannot query AWS in {platform.region}: {exc}")

    report: dict = {"region": platform.region, "orphans": [asdict(o) for o in orphans]}
    if not args.json:
        cli.emit(format_table(orphans))
    if not orphans or not args.destroy:
        if args.json:
            cli.emit(json.dumps(report, indent=2))
        return cli.EXIT_NO if orphans else cli.EXIT_OK

    if not args.yes:
        if not sys.stdin.isatty() and confirm is input:
            return cli.fail("--destroy asks for confirmation on a terminal; pass --yes to skip it")
        answer = confirm(f"Delete these {len(orphans)} stack(s) in {platform.region} (account {platform.account})? "
                         f"Type '{CONFIRM_WORD}' to confirm: ")
        if answer.strip() != CONFIRM_WORD:
            print("not confirmed; nothing deleted", file=sys.stderr)
            return cli.EXIT_NO
    try:
        results = delete_stacks(cloudformation, orphans)
    except (BotoCoreError, ClientError) as exc:
        # The orphans are still there: the answer is "no", not a failure to ask.
        print(f"error: CloudFormation refused a deletion: {exc}", file=sys.stderr)
        return cli.EXIT_NO
    report["deleted"] = [{"stack": r.stack.name, "ok": r.ok, "detail": r.detail} for r in results]
    if args.json:
        cli.emit(json.dumps(report, indent=2))
    else:
        cli.emit("\n".join(f"{'deleted' if r.ok else 'FAILED '}  {r.stack.name}  {'' if r.ok else r.detail}".rstrip()
                           for r in results))
    return cli.EXIT_OK if all(r.ok for r in results) else cli.EXIT_NO


if __name__ == "__main__":
    cli.run(main)
