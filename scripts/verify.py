#!/usr/bin/env python3
"""After deploy: check that the tiered KV cache works, as a pass/fail table.

Tiered Storage on the HyperPod cluster, the ai-toolkit DaemonSet, Curvine Primary and
Workers, the CSI driver, and per business line: PVC Bound, pods Ready, exactly one fs://
LMCACHE_REMOTE_URL, exactly one of every other variable of the line's cache env (the policy's,
k8s.patch.line_cache_env), the L2 mount, one shared PYTHONHASHSEED, and no replica with more than
1.5x its fair share of the line's prompt tokens (a routing hot spot; docs/routing.md);
optionally a live cross-pod hit (--cross-pod-hit). Uses the standard kubeconfig (or
in-cluster config) and AWS credential chain; reads only, except the two probe requests.

    .venv/bin/python scripts/verify.py [--config DIR] [--line rag-assistant] [--cross-pod-hit] [--json]

Exit codes: see --help (the table in docs/operator-tools.md): 2 also when the cluster or AWS
cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operator_tools import cli  # noqa: E402
from operator_tools.verify import LiveReader, format_results, verify  # noqa: E402
from platform_config import ConfigError  # noqa: E402


TOOL = "verify.py"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.split("\n\n")[0])
    cli.add_config_option(parser)
    parser.add_argument("--line", action="append", help="check only this business line (repeatable)")
    parser.add_argument("--lines-only", action="store_true", help="skip the platform checks")
    parser.add_argument("--cross-pod-hit", action="store_true",
                        help="send one prompt to pod A and B of each line and look for an L2 hit in B's log")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: list[str] | None = None, reader_factory=LiveReader) -> int:
    args = build_parser().parse_args(argv)
    try:
        project = cli.load_config(args.config)
        for name in args.line or []:
            project.business_line(name)
    except (ConfigError, KeyError) as exc:
        # KeyError's str() is the repr of its message; print the message itself.
        return cli.fail(exc.args[0] if isinstance(exc, KeyError) else exc)
    try:
        reader = reader_factory(project.platform.region, context=args.context)
        results = verify(reader, project, lines=args.line, cross_pod=args.cross_pod_hit,
                         platform_checks=not args.lines_only)
    except Exception as exc:  # no kubeconfig, no credentials, API unreachable: say so, exit 2
        return cli.fail(f"cannot query the cluster or AWS: {exc}")
    cli.emit(json.dumps([asdict(r) for r in results], indent=2) if args.json else format_results(results))
    return cli.EXIT_OK if all(r.ok for r in results) else cli.EXIT_NO


if __name__ == "__main__":
    cli.run(main)
