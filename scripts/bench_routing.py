#!/usr/bin/env python3
"""Routing benchmark of one business line (issue 29): p50/p99 TTFT and each replica's share of the work
per routing strategy, with and without the shared L2, on a trace fitted to Mooncake's public traces.

    .venv/bin/python scripts/bench_routing.py                              # rag-assistant, both traces
    .venv/bin/python scripts/bench_routing.py --business-line research-reasoning --replicas 2 --json
    .venv/bin/python scripts/bench_routing.py --trace conversation --requests 3000 --load 0.8 --seed 7

The line gives the model, GPU, TP, L1 and ``l2_size`` (the planner's service times and cache sizes:
capacity/routing_sim.py); ``--replicas`` defaults to its ``autoscaling.max_replicas``, else ``replicas``.
The trace keeps Mooncake's shape (burstiness, lengths, reuse) and is replayed at the rate that keeps the
replicas ``--load`` busy with nothing cached, so the figures are for this line's size, not Mooncake's
cluster. Deterministic: the same flags print the same figures. Strategies: capacity/routing_sim.py
(production-stack's router at a cited commit, and the load-dominant blend ``leastwork``). Prints a table
per trace (``--json``: the figures as JSON). See --help.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capacity.fit import inputs_from_line  # noqa: E402
from capacity.planner import plan  # noqa: E402
from capacity.routing_sim import (  # noqa: E402
    MOONCAKE_CONVERSATION,
    MOONCAKE_SYNTHETIC,
    STRATEGIES,
    ServiceModel,
    compare,
    format_results,
    make_trace,
    rate_for_load,
)
from operator_tools import cli  # noqa: E402
from platform_config import ConfigError  # noqa: E402

TRACES = {"conversation": MOONCAKE_CONVERSATION, "synthetic": MOONCAKE_SYNTHETIC}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", type=Path, help="config directory (if not given: $KVCACHE_CONFIG_DIR, else config/)")
    parser.add_argument("--business-line", default="rag-assistant", help="the line whose model and caches to use")
    parser.add_argument("--replicas", type=int, help="replicas (if not given: the line's max_replicas, else replicas)")
    parser.add_argument("--trace", choices=[*TRACES, "both"], default="both", help="which trace shape")
    parser.add_argument("--requests", type=int, help="requests per trace (if not given: the trace's own count); "
                        "prefix groups scale with it")
    parser.add_argument("--load", type=float, default=0.7, help="cold utilisation the arrival rate is set for")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace and of prefixaware's random pick")
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    parser.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        project = cli.load_config(args.config)  # every check, as every command loads the config
        line = project.business_line(args.business_line)
    except ConfigError as exc:
        return cli.fail(exc)
    except KeyError as exc:  # an unknown line: the message lists the known ones
        return cli.fail(exc.args[0])
    replicas = args.replicas or (line.autoscaling.max_replicas if line.autoscaling else line.replicas)
    p = plan(inputs_from_line(line, project.platform))
    service = ServiceModel.from_plan(p)
    out = []
    for name in (TRACES if args.trace == "both" else [args.trace]):
        shape = TRACES[name]
        if p.inputs.max_model_len:  # vLLM refuses longer prompts: the line's context bounds the trace's
            shape = replace(shape, max_input_tokens=min(shape.max_input_tokens, p.inputs.max_model_len))
        if args.requests:
            shape = replace(shape, requests=args.requests,
                            groups=max(1, round(shape.groups * args.requests / shape.requests)))
        trace = make_trace(shape, seed=args.seed)
        rate = rate_for_load(trace, service, replicas=replicas, load=args.load)
        results = compare(trace.scaled_to(rate), service, replicas=replicas, strategies=args.strategies, seed=args.seed)
        out.append({
            "trace": shape.name, "requests": len(trace.requests), "prefix_groups": shape.groups,
            "reuse_ceiling": round(trace.reuse_ceiling, 4), "input_p50_tokens": trace.input_p50_tokens,
            "arrival_cv": round(trace.arrival_cv, 2), "rate_per_s": round(rate, 3), "replicas": replicas,
            "line": args.business_line, "model": p.inputs.model.name, "instance_type": p.instance.name, "tp": p.fit.tp,
            "local_tokens_per_replica": service.local_tokens, "l2_tokens": service.l2_tokens,
            "results": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(r).items()
                         if k != "assignments"} | {"request_share": [round(s, 4) for s in r.request_share],
                                                   "work_share": [round(s, 4) for s in r.work_share],
                                                   "prefill_token_share": [round(s, 4) for s in r.prefill_token_share]}
                        for r in results],
            "table": format_results(results),
        })
    if args.json:
        print(json.dumps([{k: v for k, v in o.items() if k != "table"} for o in out], indent=2))
        return 0
    for o in out:
        print(f"{o['trace']}: {o['requests']:,} requests in {o['prefix_groups']:,} prefix groups, reuse ceiling "
              f"{o['reuse_ceiling']:.0%}, input p50 {o['input_p50_tokens']:,.0f} tokens, arrival CV {o['arrival_cv']}; "
              f"{o['line']} ({o['model']} on {o['instance_type']}, TP {o['tp']}) x {o['replicas']} replicas at "
              f"{o['rate_per_s']} req/s (cold load {args.load:.0%}); L0+L1 {o['local_tokens_per_replica']:,} tokens "
              f"per replica, L2 {o['l2_tokens']:,} tokens")
        print(o["table"])
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
