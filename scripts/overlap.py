#!/usr/bin/env python3
"""Prompt-overlap analysis: the share of prompt tokens a perfect cross-pod prefix cache could
serve (whole 256-token chunks, as LMCache stores them), overall and per system prompt, with
the prompt-length distribution, against the ~40% adoption threshold; and the routing strategy
the log calls for (one prefix shared by all, per-session or per-document reuse, short prompts).

    .venv/bin/python scripts/overlap.py requests.jsonl --tokenizer /models/qwen2-7b/tokenizer.json
    .venv/bin/python scripts/overlap.py requests.jsonl.gz --threshold 35% --json --plot overlap.png
    .venv/bin/python scripts/overlap.py requests.jsonl --session-key user --break-even-tokens 783 --no-l2

Input: JSON Lines of OpenAI chat or completion requests (Batch API lines with "body" too).
Malformed lines are counted and reported, never fatal; a log without one usable request is an
error. Exit codes: see --help (the table in docs/operator-tools.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operator_tools import cli  # noqa: E402
from operator_tools.overlap import (  # noqa: E402
    ADOPTION_THRESHOLD,
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_MAX_CACHED_CHUNKS,
    DEFAULT_MAX_GROUPS,
    HFTokenizer,
    analyse_file,
    format_report,
    format_share,
)

TOOL = "overlap.py"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.split("\n\n")[0])
    parser.add_argument("log", help="JSONL request log (.gz allowed; - for stdin)")
    parser.add_argument("--tokenizer", type=cli.existing_file,
                        help="the model's tokenizer.json (default: ~4 characters per token, labelled approximate)")
    parser.add_argument("--chunk-size", type=cli.positive_int, default=DEFAULT_CHUNK_TOKENS,
                        help="LMCache chunk, tokens")
    parser.add_argument("--template", choices=["chatml", "plain"], default="chatml",
                        help="how chat messages are rendered before tokenizing")
    parser.add_argument("--max-chunks", type=cli.positive_int, default=DEFAULT_MAX_CACHED_CHUNKS,
                        help="bound on remembered chunk keys (LRU; ~100 B each)")
    parser.add_argument("--max-groups", type=cli.positive_int, default=DEFAULT_MAX_GROUPS,
                        help="distinct system prompts tracked; the rest are pooled")
    parser.add_argument("--top", type=cli.positive_int, default=10, help="system prompts shown")
    parser.add_argument("--threshold", type=cli.fraction, default=ADOPTION_THRESHOLD,
                        help=f"adoption threshold: a fraction (0.4) or a percentage (40%%) "
                             f"(default: {format_share(ADOPTION_THRESHOLD).replace('%', '%%')})")
    parser.add_argument("--session-key", default="user",
                        help="request field (or metadata field) holding the session id, for the routing advice")
    parser.add_argument("--break-even-tokens", type=cli.positive_int,
                        help="prompt length below which an L2 read does not pay: scripts/plan.py's break-even "
                             "for the line (default: the reference deployment's, about 783)")
    parser.add_argument("--l2", action=argparse.BooleanOptionalAction, default=True,
                        help="whether the line has the shared L2 (the routing advice differs)")
    parser.add_argument("--gateway", action=argparse.BooleanOptionalAction, default=False,
                        help="whether the platform runs the HyperPod Inference Gateway "
                             "(inference_operator.gateway.enabled): routing_strategy gateway may then be advised")
    parser.add_argument("--plot", type=Path, metavar="FILE",
                        help="also draw the shared-prefix distribution against the threshold (.png, .svg, .pdf)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction,
                        help="progress bar on stderr (default: only on a terminal and without --json)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the report")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot:
        from operator_tools.plots import check_plot_path

        try:
            check_plot_path(args.plot)
        except ValueError as exc:
            return cli.fail(f"--plot: {exc}")
    tokenizer = None
    if args.tokenizer:
        try:
            tokenizer = HFTokenizer(args.tokenizer)
        except Exception as exc:  # the tokenizers package raises a bare Exception for a bad file
            return cli.fail(f"--tokenizer {args.tokenizer}: not a readable tokenizer.json ({exc})")
    try:
        report = analyse_file(args.log, tokenizer=tokenizer, chunk_tokens=args.chunk_size,
                              max_cached_chunks=args.max_chunks, max_groups=args.max_groups,
                              template=args.template, threshold=args.threshold, session_key=args.session_key,
                              break_even_tokens=args.break_even_tokens, l2=args.l2, gateway=args.gateway,
                              progress=cli.progress_wanted(args.progress, args.json),
                              progress_delay_s=0.0 if args.progress else 1.0)
    except (OSError, ValueError) as exc:
        return cli.fail(exc)
    if not report.requests:
        bad = sum(report.malformed.values())
        return cli.fail(f"no usable request in {args.log}: {report.lines:,} line(s) read, {bad:,} malformed"
                        + (f" ({', '.join(f'{n} {r}' for r, n in report.malformed.items())})" if bad else "")
                        + "; expected JSON Lines of OpenAI chat (messages) or completion (prompt) requests")
    cli.emit(json.dumps(report.to_dict(args.top), indent=2) if args.json else format_report(report, args.top))
    if args.plot:
        from operator_tools.plots import overlap_figure, save

        try:
            save(overlap_figure(report), args.plot, log=sys.stderr)
        except ValueError as exc:  # written after the report: say why the figure is missing
            return cli.fail(exc)
    return cli.EXIT_OK if report.share >= args.threshold else cli.EXIT_NO


if __name__ == "__main__":
    cli.run(main)
