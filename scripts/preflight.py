#!/usr/bin/env python3
"""Before `cdk deploy`: check account, zones, add-on versions and schemas, cluster version, bootstrap.

Add-on versions are checked against the cluster's Kubernetes version and HyperPod's minimums, every
configuration key the platform sets against the pinned version's schema, and a running cluster's
version against the versions HyperPod supports and eks.version.

Read-only AWS calls with the standard credential chain (AWS_PROFILE, env, SSO, ...).
Exit code 1 if any check fails, 2 on invalid config or when AWS cannot be queried.

    .venv/bin/python scripts/preflight.py [--config config] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_tools.preflight import run_preflight  # noqa: E402
from platform_config import ConfigError, load_project  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config", help="config directory (default: config)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        project = load_project(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        results = run_preflight(project.platform)
    except (BotoCoreError, ClientError) as exc:
        print(f"cannot query AWS in {project.platform.region}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            print(f"{'PASS' if r.ok else 'FAIL'}  {r.name:<{width}}  {r.detail}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
