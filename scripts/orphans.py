#!/usr/bin/env python3
"""Find deployed business-line stacks that no config file backs any more, and destroy them.

Deleting config/business-lines/<name>.yaml takes the line out of the CDK app, so
`cdk destroy` can no longer find its stack: this lists such stacks (read-only) and, with
--destroy, deletes them after you confirm (or with --yes, as CI does behind its approval).

    .venv/bin/python scripts/orphans.py                 # list (exit 1 when there are orphans)
    .venv/bin/python scripts/orphans.py --destroy       # list, ask, delete, wait

Region and account come from platform.yaml; credentials from the standard chain (AWS_PROFILE,
env, SSO, ...). Exit codes: 0 no orphans (or all deleted), 1 orphans remain (listed, declined or
a deletion failed), 2 bad input or AWS unreachable (invalid config, other account, no credentials).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_tools.orphans import delete_stacks, describe_all_stacks, find_orphans, format_table  # noqa: E402
from kv_tools.preflight import check_account  # noqa: E402
from platform_config import ConfigError, load_project  # noqa: E402

CONFIRM_WORD = "delete"


def main(argv: list[str] | None = None, *, session_factory=None, confirm=input) -> int:
    """CLI entry; ``session_factory`` (a ``boto3.Session``-like callable) and ``confirm`` are for tests."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config", help="config directory (default: %(default)s)")
    parser.add_argument("--destroy", action="store_true", help="delete the orphaned stacks after confirmation")
    parser.add_argument("--yes", action="store_true", help="with --destroy: do not ask (CI, behind an approval)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.yes and not args.destroy:
        parser.error("--yes only applies to --destroy")
    try:
        project = load_project(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    for warning in project.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    platform = project.platform
    if session_factory is None:
        import boto3

        session_factory = boto3.Session
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        session = session_factory(region_name=platform.region)
        account = check_account(platform, session.client("sts").get_caller_identity())
        if not account.ok:
            print(f"error: {account.detail}; refusing to look for its stacks there", file=sys.stderr)
            return 2
        cloudformation = session.client("cloudformation")
        orphans = find_orphans(project, describe_all_stacks(cloudformation))
    except (BotoCoreError, ClientError) as exc:
        print(f"error: cannot query AWS in {platform.region}: {exc}", file=sys.stderr)
        return 2

    report: dict = {"region": platform.region, "orphans": [asdict(o) for o in orphans]}
    if not args.json:
        print(format_table(orphans))
    if not orphans or not args.destroy:
        if args.json:
            print(json.dumps(report, indent=2))
        return 1 if orphans else 0

    if not args.yes:
        if not sys.stdin.isatty() and confirm is input:
            print("error: --destroy asks for confirmation on a terminal; pass --yes to skip it", file=sys.stderr)
            return 2
        answer = confirm(f"Delete these {len(orphans)} stack(s) in {platform.region} (account {platform.account})? "
                         f"Type '{CONFIRM_WORD}' to confirm: ")
        if answer.strip() != CONFIRM_WORD:
            print("not confirmed; nothing deleted", file=sys.stderr)
            return 1
    try:
        results = delete_stacks(cloudformation, orphans)
    except (BotoCoreError, ClientError) as exc:
        print(f"error: CloudFormation refused a deletion: {exc}", file=sys.stderr)
        return 1
    report["deleted"] = [{"stack": r.stack.name, "ok": r.ok, "detail": r.detail} for r in results]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for r in results:
            print(f"{'deleted' if r.ok else 'FAILED '}  {r.stack.name}  {'' if r.ok else r.detail}".rstrip())
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
