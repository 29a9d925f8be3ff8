#!/usr/bin/env python3
"""TTFT benchmark for an OpenAI-compatible streaming endpoint: cold (new shared prefix) vs warm
(reused prefix) time to first token and end-to-end latency, p50/p90/p99.

    .venv/bin/python scripts/bench_ttft.py --base-url http://127.0.0.1:8000/v1 --model /opt/ml/model \
        --prefix-tokens 2500 --requests 20 --reuse-share 0.5
    # cross-pod, as the reference deployment measured it: pod A writes, pod B reads
    .venv/bin/python scripts/bench_ttft.py --base-url http://127.0.0.1:8001 --read-base-url http://127.0.0.1:8002 ...

Reach pods with `kubectl port-forward` (one local port per pod). --base-url takes the server's
root or its OpenAI base URL (ending in /v1). Exit codes: see --help (the table in
docs/operator-tools.md); a run that did not measure both cold and warm TTFT exits 2 and says why.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operator_tools import cli  # noqa: E402
from operator_tools.bench_ttft import BenchConfig, format_report, run  # noqa: E402

TOOL = "bench_ttft.py"
API_KEY_ENV = "OPENAI_API_KEY"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True,
                        help="endpoint (pod A): http(s)://host:port, with or without the /v1 suffix")
    parser.add_argument("--read-base-url", help="second endpoint (pod B) for the warm phase (default: --base-url)")
    parser.add_argument("--model", required=True, help="the 'model' of the requests (see GET /v1/models)")
    # The default is read in main(), so --help never prints the key itself.
    parser.add_argument("--api-key", help=f"bearer token (default: ${API_KEY_ENV}, if set)")
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                        help="/v1/chat/completions or /v1/completions")
    parser.add_argument("--requests", type=cli.positive_int, default=20, help="total requests")
    parser.add_argument("--reuse-share", type=cli.fraction, default=0.5,
                        help="share of requests reusing a prefix: a fraction (0.5) or a percentage (50%%)")
    parser.add_argument("--prefix-tokens", type=cli.positive_int, default=2000, help="shared prefix length, tokens")
    parser.add_argument("--suffix-tokens", type=cli.non_negative_int, default=32, help="unique suffix length, tokens")
    parser.add_argument("--concurrency", type=cli.positive_int, default=1, help="requests in flight")
    parser.add_argument("--max-tokens", type=cli.positive_int, default=16, help="output tokens per request")
    parser.add_argument("--duration", type=cli.positive_float, default=300.0,
                        help="no request starts after this, seconds")
    parser.add_argument("--timeout", type=cli.positive_float, default=120.0, help="per-request timeout, seconds")
    parser.add_argument("--tokenizer", type=cli.existing_file,
                        help="tokenizer.json for exact prompt lengths (default: one common word per token)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt words")
    parser.add_argument("--plot", type=Path, metavar="FILE",
                        help="also draw cold vs warm TTFT histograms (.png, .svg, .pdf)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction,
                        help="progress bar on stderr (default: only on a terminal and without --json)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = BenchConfig(base_url=args.base_url, read_base_url=args.read_base_url, model=args.model,
                          api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, endpoint=args.endpoint,
                          requests=args.requests, reuse_share=args.reuse_share, prefix_tokens=args.prefix_tokens,
                          suffix_tokens=args.suffix_tokens, concurrency=args.concurrency,
                          max_tokens=args.max_tokens, duration_s=args.duration, timeout_s=args.timeout,
                          seed=args.seed)
        if args.plot:
            from operator_tools.plots import check_plot_path

            check_plot_path(args.plot)
    except ValueError as exc:
        return cli.fail(exc)
    try:
        report = run(cfg, tokenizer_path=args.tokenizer and str(args.tokenizer),
                     progress=cli.progress_wanted(args.progress, args.json),
                     progress_delay_s=0.0 if args.progress else 1.0)
    except (OSError, ValueError) as exc:  # an unreadable tokenizer file
        return cli.fail(exc)
    cli.emit(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    if args.plot:
        from operator_tools.plots import bench_figure, save

        try:
            save(bench_figure(report), args.plot, log=sys.stderr)
        except ValueError as exc:  # written after the report: say why the figure is missing
            return cli.fail(exc)
    if report.unanswered:
        hint = ""
        if report.all_unreachable:
            hint = "; is the endpoint up (kubectl port-forward running) and the URL right?"
        elif report.stopped_by_duration("warm"):
            hint = "; raise --duration or lower --requests"
        return cli.fail(report.unanswered + hint)
    ratio = report.cold_warm_ratio
    if report.errors or ratio is None or ratio <= 1.0:
        return cli.EXIT_NO
    return cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
