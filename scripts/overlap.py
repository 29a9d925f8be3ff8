#!/usr/bin/env python3
"""Prompt-overlap analysis: the share of prompt tokens a perfect cross-pod prefix cache could
serve (whole 256-token chunks, as LMCache stores them), overall and per system prompt, with
the prompt-length distribution, against the ~40% adoption threshold.

    .venv/bin/python scripts/overlap.py requests.jsonl --tokenizer /models/qwen2-7b/tokenizer.json
    .venv/bin/python scripts/overlap.py requests.jsonl.gz --json

Input: JSON Lines of OpenAI chat or completion requests (Batch API lines with "body" too).
Malformed lines are counted and reported, never fatal. Exit code 0 at or above the threshold,
1 below it, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_tools.overlap import (  # noqa: E402
    ADOPTION_THRESHOLD,
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_MAX_CACHED_CHUNKS,
    DEFAULT_MAX_GROUPS,
    HFTokenizer,
    analyse_file,
    format_report,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("log", help="JSONL request log (.gz allowed; - for stdin)")
    parser.add_argument("--tokenizer", type=Path, help="the model's tokenizer.json (else ~4 characters/token)")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_TOKENS, help="LMCache chunk, tokens")
    parser.add_argument("--template", choices=["chatml", "plain"], default="chatml",
                        help="how chat messages are rendered before tokenizing")
    parser.add_argument("--max-chunks", type=int, default=DEFAULT_MAX_CACHED_CHUNKS,
                        help="bound on remembered chunk keys (LRU; ~100 B each)")
    parser.add_argument("--max-groups", type=int, default=DEFAULT_MAX_GROUPS,
                        help="distinct system prompts tracked; the rest are pooled")
    parser.add_argument("--top", type=int, default=10, help="system prompts shown")
    parser.add_argument("--threshold", type=float, default=ADOPTION_THRESHOLD, help="adoption threshold (share)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the report")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tokenizer = None
    if args.tokenizer:
        try:
            tokenizer = HFTokenizer(args.tokenizer)
        except Exception as exc:  # the tokenizers package raises a bare Exception for a bad file
            print(f"error: cannot load tokenizer {args.tokenizer}: {exc}", file=sys.stderr)
            return 2
    try:
        report = analyse_file(args.log, tokenizer=tokenizer, chunk_tokens=args.chunk_size,
                              max_cached_chunks=args.max_chunks, max_groups=args.max_groups,
                              template=args.template, threshold=args.threshold)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(args.top), indent=2))
    else:
        print(format_report(report, args.top))
    return 0 if report.requests and report.share >= args.threshold else 1


if __name__ == "__main__":
    sys.exit(main())
