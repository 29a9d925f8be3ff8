#!/usr/bin/env python3
"""Capacity, latency and cost planner: weights, KV per token, L0/L1/L2 capacity, L2 read vs
prefill time, cold vs warm TTFT, break-even prompt length, cost per endpoint-hour.

    .venv/bin/python scripts/plan.py --business-line config/business-lines/rag-assistant.yaml
    .venv/bin/python scripts/plan.py --model Qwen2-7B --instance-type ml.g6e.12xlarge \
        --tokens 1925 --l2-read-gibps 1.84 --json
    .venv/bin/python scripts/plan.py --model Qwen2-7B --instance-type ml.g6e.12xlarge --plot ttft.png

Exit codes: see --help (the table in docs/operator-tools.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from operator_tools import cli  # noqa: E402
from capacity.fit import (  # noqa: E402
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_NVME_RESERVE_FRACTION,
    DEFAULT_RUNTIME_RESERVE_GIB,
    PlanInputs,
    inputs_from_line,
)
from capacity.latency import DEFAULT_CALIBRATION, REFERENCE_RUN, calibration_dict  # noqa: E402
from capacity.model_specs import DTYPE_BYTES, MODELS, load_hf_config, lookup_model  # noqa: E402
from capacity.planner import format_plan, format_scaling, plan, recommend, scaling_plan  # noqa: E402
from capacity.prices import DEFAULT_PRICES_FILE, load_prices  # noqa: E402
from capacity.project_checks import hot_prefix_budget  # noqa: E402
from capacity.routing_sim import line_routing_notes  # noqa: E402
from platform_config import INSTANCE_TYPES, ConfigError, ConfigProblem, load_business_line, load_platform  # noqa: E402
from platform_config.loader import default_config_dir  # noqa: E402
from platform_config import node_fit  # noqa: E402
from platform_config.loader import (  # noqa: E402
    CONFIG_DIR_ENV, PLATFORM_FILE, business_line_files, config_dir_of, cross_check, node_fit_problems)

TOOL = "plan.py"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.split("\n\n")[0])
    src = parser.add_argument_group("what to plan (a business-line file, or flags)")
    src.add_argument("--business-line", type=cli.existing_file, help="business-line YAML; its platform is --config")
    src.add_argument("--model", help=f"model name, matched by normalized name against: {', '.join(MODELS)}; "
                                     "with --hf-config, the name the report is titled with")
    src.add_argument("--hf-config", type=cli.existing_path,
                     help="a Hugging Face config.json (file or directory) instead of the table")
    src.add_argument("--instance-type", choices=sorted(INSTANCE_TYPES), help="(default: the line's)")
    src.add_argument("--tp", type=cli.positive_int, help="tensor parallelism (default: the line's gpus_per_replica, "
                                                         "else the smallest that fits)")
    src.add_argument("--replicas", type=cli.positive_int, help="replicas of the endpoint (default: the line's, else 1)")
    src.add_argument("--dtype", choices=list(DTYPE_BYTES), help="weights dtype (default: the line's, else bfloat16)")
    src.add_argument("--kv-dtype", choices=list(DTYPE_BYTES), help="KV cache dtype (default: as vLLM's 'auto')")
    src.add_argument("--max-model-len", type=cli.positive_int, help="one sequence of this length must fit in L0 "
                                                                    "(default: the line's --max-model-len)")
    parser.add_argument("--config", type=Path, metavar="DIR",
                        help="config directory holding platform.yaml (default: $KVCACHE_CONFIG_DIR, else the one the "
                             "--business-line file sits in, <dir>/business-lines/, else the repository's config/)")
    parser.add_argument("--tokens", type=cli.positive_int, default=REFERENCE_RUN.prompt_tokens,
                        help="prompt length, tokens")
    parser.add_argument("--l2-read-gibps", type=cli.positive_float, default=REFERENCE_RUN.l2_read_gibps,
                        help="L2 read bandwidth per TP rank, GiB/s (reference: 1.84 cross-node)")
    parser.add_argument("--hit-ratio", type=cli.fraction, default=1.0,
                        help="share of the prompt in L2 for the warm case, 0.62 or 62%% "
                             "(scripts/overlap.py measures it)")
    parser.add_argument("--chunk-size", type=cli.positive_int,
                        help="LMCache chunk, tokens (default: the line's, else 256)")
    parser.add_argument("--gpu-memory-utilization", type=cli.fraction, help=f"vLLM's, 0.9 or 90%% (default "
                        f"{DEFAULT_GPU_MEMORY_UTILIZATION}, or the line's --gpu-memory-utilization)")
    parser.add_argument("--runtime-reserve-gib", type=cli.non_negative_float, default=DEFAULT_RUNTIME_RESERVE_GIB,
                        help="GiB per GPU for activations, CUDA context and graphs")
    parser.add_argument("--l1-gib", type=cli.non_negative_float, help="LMCache CPU buffer (L1) per replica, GiB; "
                        "0: L1 off (default: the line's cache.l1_cpu_gib, else LMCache's 5 GiB per TP rank)")
    parser.add_argument("--l2-nodes", type=cli.non_negative_int, help="Curvine Worker nodes (default: the "
                        "platform's, else the endpoint's nodes)")
    parser.add_argument("--l2-node-capacity-gib", type=cli.positive_float, help="L2 GiB per node (default: the "
                        "platform's Curvine pool, else NVMe less the reserve)")
    parser.add_argument("--nvme-reserve-fraction", type=cli.fraction, default=DEFAULT_NVME_RESERVE_FRACTION,
                        help="share of NVMe kept out of L2")
    parser.add_argument("--region", help="price region (default: the platform's, else us-west-2)")
    parser.add_argument("--prices", type=Path, help="price table YAML (default: prices.yaml of the config "
                        f"directory when it has one, else {DEFAULT_PRICES_FILE.relative_to(ROOT)})")
    parser.add_argument("--candidates", help="comma-separated instance types to compare (default: the "
                        "platform's instance group types with a --business-line, else every priced type)")
    parser.add_argument("--ttft-slo-ms", type=cli.positive_float,
                        help="recommend the cheapest option meeting this TTFT")
    parser.add_argument("--l2-overhead-ms", type=cli.non_negative_float, help="fixed L2 cost per warm request, ms "
                        f"(default: {DEFAULT_CALIBRATION.l2_overhead_ms:.1f}, calibrated on the reference run)")
    parser.add_argument("--prefill-efficiency", type=cli.fraction, help="achieved prefill FLOP/s over the GPU's "
                        f"dense BF16 peak (default: {DEFAULT_CALIBRATION.efficiency:.4f}, calibrated on the reference "
                        "run)")
    parser.add_argument("--plot", type=Path, metavar="FILE",
                        help="also draw cold vs warm TTFT across prompt lengths, break-even marked (.png, .svg, .pdf)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the report")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.plot:
            from operator_tools.plots import check_plot_path

            check_plot_path(args.plot)
        prices = load_prices(args.prices or _default_prices(args))
        model = None
        if args.hf_config:
            model = load_hf_config(args.hf_config, name=args.model or "")
        elif args.model:
            model = lookup_model(args.model)
        overrides = dict(
            instance_type=args.instance_type, tp=args.tp, replicas=args.replicas, dtype=args.dtype,
            kv_dtype=args.kv_dtype, max_model_len=args.max_model_len, tokens=args.tokens,
            l2_read_gibps=args.l2_read_gibps, hit_ratio=args.hit_ratio, chunk_tokens=args.chunk_size,
            gpu_memory_utilization=args.gpu_memory_utilization, runtime_reserve_gib=args.runtime_reserve_gib,
            l1_gib_per_replica=args.l1_gib, l2_nodes=args.l2_nodes, l2_node_capacity_gib=args.l2_node_capacity_gib,
            nvme_reserve_fraction=args.nvme_reserve_fraction, region=args.region,
        )
        platform = None
        platform_file = None
        hot: dict | None = None
        node_report: list[str] = []
        nodes_json = None
        nodes_fit = True
        line = None
        most_that_fit: int | None = None
        if args.business_line:
            line = load_business_line(args.business_line)
            config_dir = args.config or (Path(os.environ[CONFIG_DIR_ENV]) if os.environ.get(CONFIG_DIR_ENV)
                                         else config_dir_of(args.business_line, default_config_dir()))
            platform_file = config_dir / PLATFORM_FILE
            if not platform_file.is_file():
                raise ConfigError([ConfigProblem(str(platform_file), "", "no such file; a business line is "
                                                 "planned against its platform: pass --config DIR")])
            platform = load_platform(platform_file)
            # The same cross-file rules as synthesis, so no false green; the node fit is reported below.
            problems = cross_check(platform, platform_file, [(args.business_line, line)], check_node_fit=False)
            if problems:
                raise ConfigError(problems)
            others, notes = _other_lines(platform_file, line)
            inputs = inputs_from_line(line, platform, model=model, lines=[line, *(l for _, l in others)], **overrides)
            # Packed as planned: an --instance-type or --tp given here replaces the line's.
            planned = line.model_copy(update={k: v for k, v in (("instance_type", args.instance_type),
                                                                ("gpus_per_replica", args.tp)) if v is not None})
            node_report, nodes_json, nodes_fit = _node_fit(platform, platform_file, args.business_line, planned,
                                                           others, notes)
            if line.autoscaling is not None:  # the bound of max_replicas: the config check's packing
                most_that_fit = node_fit.most_replicas(
                    platform, sorted([(args.business_line, planned), *others], key=lambda pl: str(pl[0])), line.name)
            hot = _hot_prefixes(line)
        else:
            if model is None or not args.instance_type:
                parser.error("give --business-line, or --model/--hf-config and --instance-type")
            inputs = PlanInputs(model=model, **{k: v for k, v in overrides.items() if v is not None})
        if args.candidates:
            candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
        elif platform is not None:
            candidates = [g.instance_type for g in platform.hyperpod.instance_groups]
        else:
            candidates = sorted(prices.regions.get(inputs.region, {}))
        calibration = DEFAULT_CALIBRATION
        if args.l2_overhead_ms is not None:
            calibration = replace(calibration, l2_overhead_ms=args.l2_overhead_ms)
        if args.prefill_efficiency is not None:
            if args.prefill_efficiency == 0:
                raise ValueError("--prefill-efficiency must be above 0")
            calibration = replace(calibration, efficiency=args.prefill_efficiency)
        result = plan(inputs, prices=prices, calibration=calibration)
        scaling = (scaling_plan(result, min_replicas=line.autoscaling.min_replicas,
                                max_replicas=line.autoscaling.max_replicas, most_that_fit=most_that_fit)
                   if line is not None and line.autoscaling is not None else None)
        rec = recommend(inputs, candidates, prices=prices, ttft_slo_ms=args.ttft_slo_ms,
                        calibration=calibration) if candidates else None
    except ConfigError as exc:
        return cli.fail(exc)
    except (KeyError, ValueError, OSError) as exc:
        # KeyError's str() is the repr of its message; print the message itself.
        return cli.fail(exc.args[0] if isinstance(exc, KeyError) else exc)
    if args.json:
        out = result.to_dict()
        out["platform_file"] = None if platform_file is None else str(platform_file)
        out["nodes"] = nodes_json
        out["hot_prefixes"] = hot
        out["routing"] = ({"strategy": line.routing_strategy, "notes": line_routing_notes(line, result)}
                          if line is not None else None)
        out["autoscaling"] = scaling.to_dict() if scaling else None
        out["recommendation"] = rec.to_dict() if rec else None
        out["calibration"] = calibration_dict(calibration)
        cli.emit(json.dumps(out, indent=2))
    else:
        read = [f"config        {platform_file} (the platform this line is planned against)"] if platform_file else []
        scaling_report = format_scaling(scaling, result.instance.name) if scaling else []
        routing = ([f"routing       {line.routing_strategy}"
                    + "".join(f"; {note}" for note in line_routing_notes(line, result))] if line is not None else [])
        cli.emit("\n".join(read + [format_plan(result, rec, node_report=node_report)] + scaling_report
                           + _hot_prefix_report(hot) + routing))
    if args.plot:
        from operator_tools.plots import plan_figure, save

        try:
            save(plan_figure(result), args.plot, log=sys.stderr)
        except ValueError as exc:  # written after the report: say why the figure is missing
            return cli.fail(exc)
    return cli.EXIT_OK if result.fit.fits and nodes_fit and (scaling is None or scaling.fits) else cli.EXIT_NO


def _hot_prefixes(line) -> dict | None:
    """The pinned share of ``l2_size`` of the line's hot prefixes (the config check's bound,
    :func:`capacity.project_checks.hot_prefix_budget`), or None when the line pins nothing."""
    if not (line.cache.l2_enabled and line.hot_prefixes.active):
        return None
    try:
        b = hot_prefix_budget(line)
    except KeyError:  # a model the table does not know: the config check warns
        return {"prefixes": [p.name for p in line.hot_prefixes.prefixes], "pinned_bytes_bound": None}
    return {"prefixes": [p.name for p in line.hot_prefixes.prefixes], "token_bound": b.token_bound,
            "pinned_tokens_bound": b.pinned_tokens, "kv_bytes_per_token": b.kv_bytes_per_token, "files": b.files,
            "pinned_bytes_bound": b.pinned_bytes, "l2_size_bytes": b.l2_size_bytes,
            "pinned_share_of_l2_size": round(b.share, 6), "max_l2_fraction": b.max_share, "fits": b.fits}


def _hot_prefix_report(hot: dict | None) -> list[str]:
    if hot is None:
        return []
    names = ", ".join(hot["prefixes"])
    if hot["pinned_bytes_bound"] is None:
        return [f"hot prefixes  {names}: pinned share of l2_size not known offline (model not in the table)"]
    return [f"hot prefixes  {names}: at most {hot['pinned_bytes_bound'] / 2**30:,.3f} GiB pinned in L2, "
            f"{hot['pinned_share_of_l2_size']:.2%} of l2_size (allowed: {hot['max_l2_fraction']:.0%}); at most "
            f"{hot['token_bound']:,} tokens, {hot['pinned_tokens_bound']:,} in full chunks, x "
            f"{hot['kv_bytes_per_token']:,} B/token, {hot['files']} chunk files"
            + ("" if hot["fits"] else " -- MORE THAN ALLOWED")]


def _default_prices(args: argparse.Namespace) -> Path:
    """``prices.yaml`` of the config directory in use (--config, $KVCACHE_CONFIG_DIR, the
    --business-line file's) when it has one, else the repository's."""
    config_dir = args.config or (Path(os.environ[CONFIG_DIR_ENV]) if os.environ.get(CONFIG_DIR_ENV) else None)
    if config_dir is None and args.business_line:
        config_dir = config_dir_of(args.business_line, default_config_dir())
    candidate = (config_dir or default_config_dir()) / "prices.yaml"
    return candidate if candidate.is_file() else DEFAULT_PRICES_FILE


def _other_lines(platform_file: Path, line) -> tuple[list[tuple[Path, object]], list[str]]:
    """The config's other business lines (the files beside ``platform.yaml``), and a note for each
    file that does not load (left out; ``make synth`` says why)."""
    others: list[tuple[Path, object]] = []
    notes: list[str] = []
    files, _ignored, _problems = business_line_files(platform_file.parent)
    for path in files:
        if path.stem == line.name:
            continue
        try:
            others.append((path, load_business_line(path)))
        except ConfigError:
            notes.append(f"  (not counted: {path} does not load; `make synth` reports why)")
    return others, notes


def _node_fit(platform, platform_file: Path, line_file: Path, line, others, notes) -> tuple[list[str], dict | None, bool]:
    """The line's instance type packed with the config's other lines, by the config check's own
    function (:func:`platform_config.node_fit.fit_lines`, :func:`~platform_config.loader.node_fit_problems`).

    Returns the report lines, the JSON, and whether every replica fits.
    """
    # In file order, as the config check reads them (so its message is word for word the same).
    lines = sorted([(line_file, line), *others], key=lambda pl: str(pl[0]))
    fit = node_fit.fit_lines(platform, lines).get(line.instance_type)
    if fit is None:
        return [], None, True
    # Every problem of this instance type names it (the packing and each too-large line).
    problems = [str(p) for p in node_fit_problems(platform, platform_file, lines) if line.instance_type in p.message]
    sharing = sorted({l.name for _, l in fit.lines} - {line.name})
    report = node_fit.format_node_fit(fit) + notes
    report.append(f"  placed by first-fit decreasing with {', '.join(sharing) if sharing else 'no other line'}: "
                  + ("every replica fits" if fit.fits else "DOES NOT FIT"))
    report += [textwrap.fill(f"problem: {p}", width=100, initial_indent="  ", subsequent_indent="    ",
                             break_on_hyphens=False, break_long_words=False) for p in problems]
    nodes_json = {
        "instance_type": fit.instance_type,
        "fits": fit.fits,
        "budgets": [{"group": b.group, "gpus": b.gpus, "cpu_millicores": b.cpu_millicores,
                     "memory_gib": round(b.memory_bytes / 2**30, 2),
                     "reservations": [{"name": r.name, "cpu_millicores": r.cpu_millicores,
                                       "memory_gib": round(r.memory_bytes / 2**30, 2)} for r in b.reservations],
                     "free_cpu_millicores": b.free_cpu_millicores,
                     "free_memory_gib": round(b.free_memory_bytes / 2**30, 2)} for b in fit.budgets()],
        "placement": [[r.line for r in n.replicas] for n in fit.nodes],
        "problems": problems,
    }
    return report, nodes_json, fit.fits


if __name__ == "__main__":
    cli.run(main)
