#!/usr/bin/env python3
"""TTFT benchmark for an OpenAI-compatible streaming endpoint: cold (new shared prefix) vs warm
(reused prefix) time to first token and end-to-end latency, p50/p90/p99.

    .venv/bin/python scripts/bench_ttft.py --base-url http://127.0.0.1:8000 --model /opt/ml/model \
        --prefix-tokens 2500 --requests 20 --reuse-share 0.5
    # cross-pod, as the reference deployment measured it: pod A writes, pod B reads
    .venv/bin/python scripts/bench_ttft.py --base-url http://127.0.0.1:8001 --read-base-url http://127.0.0.1:8002 ...

Reach pods with `kubectl port-forward` (one local port per pod). Exit code 0 when every
request succeeded, 1 when any failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_tools.bench_ttft import BenchConfig, format_report, run  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--base-url", required=True, help="endpoint (pod A): http(s)://host:port")
    parser.add_argument("--read-base-url", help="second endpoint (pod B) for the warm phase")
    parser.add_argument("--model", required=True, help="the 'model' of the requests (see GET /v1/models)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default: $OPENAI_API_KEY)")
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                        help="/v1/chat/completions or /v1/completions")
    parser.add_argument("--requests", type=int, default=20, help="total requests")
    parser.add_argument("--reuse-share", type=float, default=0.5, help="share of requests reusing a prefix")
    parser.add_argument("--prefix-tokens", type=int, default=2000, help="shared prefix length, tokens")
    parser.add_argument("--suffix-tokens", type=int, default=32, help="unique suffix length, tokens")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--duration", type=float, default=300.0, help="no request starts after this, seconds")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    parser.add_argument("--tokenizer", help="tokenizer.json for exact prompt lengths")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt words")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = BenchConfig(base_url=args.base_url, read_base_url=args.read_base_url, model=args.model,
                          api_key=args.api_key, endpoint=args.endpoint, requests=args.requests,
                          reuse_share=args.reuse_share, prefix_tokens=args.prefix_tokens,
                          suffix_tokens=args.suffix_tokens, concurrency=args.concurrency,
                          max_tokens=args.max_tokens, duration_s=args.duration, timeout_s=args.timeout,
                          seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        report = run(cfg, tokenizer_path=args.tokenizer, progress=progress)
    except Exception as exc:  # e.g. an unreadable tokenizer file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 0 if report.results and not report.errors else 1


if __name__ == "__main__":
    sys.exit(main())
