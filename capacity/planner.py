"""Capacity, latency and cost planner for one model on one HyperPod instance type.

What it computes (all per GPU, per replica and per endpoint where it matters):

* memory fit (:mod:`capacity.fit`): weights ``params x bytes per element`` in GiB (2^30 B) and GB
  (10^9 B); whether they fit with a tensor-parallel (TP) degree, and the smallest TP that fits;
* KV cache bytes per token: ``2 x layers x KV heads x head_dim x bytes`` (docs/sources.md §5);
* tier capacities: L0 = usable GPU memory (what CUDA reports, :mod:`capacity.gpu_memory`) x
  ``gpu_memory_utilization`` - weights/TP - runtime reserve, in tokens; L1 = LMCache's CPU buffer
  in each vLLM pod (``cache.l1_cpu_gib``, else LMCache's default 5 GiB per TP rank) x the replicas
  on a node; L2 = the line's ``l2_size`` and the Curvine pool it shares
  (:func:`platform_config.loader.l2_pool_gib`, the config check's figure), or from flags NVMe less a
  reserve x nodes;
* times (:mod:`capacity.latency`): reading N tokens of KV from L2 at a bandwidth, prefilling N
  tokens at a calibrated rate, cold vs warm TTFT and their ratio, and the break-even prompt length;
* cost per endpoint-hour from ``config/prices.yaml`` and a recommendation.

The calibration of the times, and why L2 reads are timed cross-node: :mod:`capacity.latency`.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from capacity.fit import LMCACHE_DEFAULT_L1_GIB_PER_RANK, Fit, PlanInputs, choose_tp, replicas_per_node
from capacity.gpu_memory import usable_gpu_memory_gib
from capacity.latency import DEFAULT_CALIBRATION, GIB, Calibration, Timing, timing
from capacity.prices import Price, PriceTable
from platform_config import (
    InstanceType,
    get_instance_type,
)

GB = 10**9


@dataclass(frozen=True)
class Cost:
    """What the endpoint costs per hour (``None`` figures when the table has no price)."""

    nodes: int
    price: Price | None
    cost_per_endpoint_hour: float | None
    gpu_share_cost_per_hour: float | None


@dataclass(frozen=True)
class Plan:
    """The planner's answer for one model on one instance type (see :func:`plan`)."""

    inputs: PlanInputs
    instance: InstanceType
    fit: Fit
    min_tp: int | None
    kv_bytes_per_token: int
    l2_nodes: int
    l2_gib_per_node: float
    timing: Timing
    cost: Cost
    warnings: tuple[str, ...] = ()
    #: The constants the timing was computed with (for :func:`ttft_curve`).
    calibration: Calibration = DEFAULT_CALIBRATION

    @property
    def weights_gib(self) -> float:
        return self.inputs.model.weights_bytes(self.inputs.dtype) / GIB

    @property
    def weights_gb(self) -> float:
        return self.inputs.model.weights_bytes(self.inputs.dtype) / GB

    @property
    def replicas_per_node(self) -> int:
        """Replicas one node holds (GPUs over TP, and CPU and memory when counted: :func:`replicas_per_node`)."""
        return replicas_per_node(self.inputs, self.instance, self.fit.tp)

    @property
    def l1_gib_per_replica(self) -> float:
        """The L1 buffer of one replica, GiB: the line's ``cache.l1_cpu_gib``, else LMCache's
        default per TP rank x TP (0 with L1 off)."""
        given = self.inputs.l1_gib_per_replica
        return LMCACHE_DEFAULT_L1_GIB_PER_RANK * self.fit.tp if given is None else given

    @property
    def replicas_on_a_node(self) -> int:
        """Replicas one node holds: the line's replicas, at most :attr:`replicas_per_node`."""
        return min(self.inputs.replicas, self.replicas_per_node)

    @property
    def l1_gib_per_node(self) -> float:
        """L1 of one node, GiB: :attr:`l1_gib_per_replica` x :attr:`replicas_on_a_node`."""
        return self.l1_gib_per_replica * self.replicas_on_a_node

    @property
    def l2_pool_gib(self) -> float:
        """The usable L2 pool, GiB: the platform's (:func:`platform_config.loader.l2_pool_gib`),
        else nodes x capacity per node."""
        given = self.inputs.l2_pool_gib
        return self.l2_gib_per_node * self.l2_nodes if given is None else given

    def tokens_in(self, gib: float) -> int:
        """Tokens of this model's KV that ``gib`` GiB hold (whole model, every TP rank's share)."""
        return int(gib * GIB // self.kv_bytes_per_token)

    @property
    def expected_ttft_ms(self) -> float:
        """TTFT this option delivers: warm when L2 pays at this prompt length, else cold
        (where L2 does not pay it should be left off)."""
        return min(self.timing.cold_ttft_ms, self.timing.warm_ttft_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures; units in the key names (``_gib`` GiB, ``_gb`` GB, ``_ms``)."""
        i, t, m = self.inputs, self.timing, self.inputs.model
        kv_per_token = self.kv_bytes_per_token
        price = self.cost.price
        return {
            "model": {"name": m.name, "params": m.params, "layers": m.layers, "hidden_size": m.hidden_size,
                      "attention_heads": m.attention_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
                      "source": m.source},
            "instance_type": self.instance.name,
            "gpu": {"model": self.instance.gpu_model, "count": self.instance.gpus,
                    "memory_gib": self.instance.gpu_memory_gib,
                    "usable_memory_gib": usable_gpu_memory_gib(self.instance.gpu_model)},
            "dtype": i.dtype,
            "kv_dtype": i.effective_kv_dtype,
            "tp": self.fit.tp,
            "min_tp": self.min_tp,
            "replicas": i.replicas,
            "weights_gib": round(self.weights_gib, 3),
            "weights_gb": round(self.weights_gb, 3),
            "weights_per_gpu_gib": round(self.fit.weights_per_gpu_gib, 3),
            "fits": self.fit.fits,
            "fit_reason": self.fit.reason,
            "kv_bytes_per_token": kv_per_token,
            "tokens": i.tokens,
            "kv_gib": round(t.kv_gib, 4),
            "kv_gb": round(t.kv_gib * GIB / GB, 4),
            "l0": {"kv_gib_per_gpu": round(self.fit.kv_free_per_gpu_gib, 2),
                   "tokens_per_replica": self.fit.l0_tokens_per_replica,
                   "tokens_per_endpoint": self.fit.l0_tokens_per_replica * i.replicas},
            "l1": {"gib_per_node": round(self.l1_gib_per_node, 2),
                   "gib_per_replica": round(self.l1_gib_per_replica, 2),
                   "lmcache_default": i.l1_gib_per_replica is None,
                   "tokens_per_node": self.tokens_in(self.l1_gib_per_node)},
            "l2": {"nodes": self.l2_nodes, "gib_per_node": round(self.l2_gib_per_node, 1),
                   "gib": round(self.l2_pool_gib, 1),
                   "tokens": self.tokens_in(self.l2_pool_gib),
                   "line_gib": None if i.l2_size_gib is None else round(i.l2_size_gib, 1),
                   "line_tokens": None if i.l2_size_gib is None else self.tokens_in(i.l2_size_gib),
                   "janitor_high_watermark": i.l2_high_watermark,
                   "read_gibps_per_rank": i.l2_read_gibps},
            "l2_read_ms": round(t.l2_read_ms, 2),
            "prefill_ms": round(t.prefill_ms, 1),
            "cold_ttft_ms": round(t.cold_ttft_ms, 1),
            "warm_ttft_ms": round(t.warm_ttft_ms, 1),
            "ttft_ratio": round(t.ttft_ratio, 2),
            "hit_ratio": i.hit_ratio,
            "cached_tokens": t.cached_tokens,
            "break_even_tokens": None if t.break_even_tokens is None else round(t.break_even_tokens),
            "l2_pays": t.l2_pays,
            "cost": {"nodes": self.cost.nodes,
                     "usd_per_instance_hour": price.usd_per_hour if price else None,
                     "cost_per_endpoint_hour": _round(self.cost.cost_per_endpoint_hour, 2),
                     "gpu_share_cost_per_hour": _round(self.cost.gpu_share_cost_per_hour, 2),
                     "price_as_of": price.as_of.isoformat() if price else None,
                     "price_source": price.source if price else None,
                     "price_checked": price.checked if price else None,
                     "region": i.region},
            "warnings": list(self.warnings),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def plan(inputs: PlanInputs, *, prices: PriceTable | None = None,
         calibration: Calibration = DEFAULT_CALIBRATION) -> Plan:
    """Compute every figure for ``inputs`` (pure: no I/O).

    Raises:
        ValueError: from :class:`PlanInputs` validation (never for a model that does not
            fit: that is reported as ``fit.fits == False``).
    """
    instance = get_instance_type(inputs.instance_type)
    fit, min_tp = choose_tp(inputs)
    kv_dtype = inputs.effective_kv_dtype
    t = timing(inputs.model, instance, fit.tp, kv_dtype, tokens=inputs.tokens, hit_ratio=inputs.hit_ratio,
               chunk_tokens=inputs.chunk_tokens, l2_read_gibps=inputs.l2_read_gibps, calibration=calibration)
    nodes = math.ceil(inputs.replicas / replicas_per_node(inputs, instance, fit.tp))
    nvme_gib = instance.nvme_gb * GB / GIB * (1.0 - inputs.nvme_reserve_fraction)
    l2_per_node = min(nvme_gib, inputs.l2_node_capacity_gib) if inputs.l2_node_capacity_gib else nvme_gib
    price = prices.price(inputs.region, instance.name) if prices else None
    warnings = price_warnings(prices, inputs.region, instance.name) if prices is not None else []
    if not t.l2_pays:
        warnings.append(f"L2 does not pay at {inputs.tokens:,} tokens (break-even about "
                        f"{t.break_even_tokens:,.0f} tokens): warm {t.warm_ttft_ms:.0f} ms vs cold {t.cold_ttft_ms:.0f} ms")
    cost = cost_of(inputs.replicas, replicas_per_node(inputs, instance, fit.tp), fit.tp, instance, price)
    return Plan(inputs=inputs, instance=instance, fit=fit, min_tp=min_tp,
                kv_bytes_per_token=inputs.model.kv_bytes_per_token(kv_dtype),
                l2_nodes=inputs.l2_nodes if inputs.l2_nodes is not None else nodes,
                l2_gib_per_node=l2_per_node, timing=t, cost=cost, warnings=tuple(warnings),
                calibration=calibration)


def cost_of(replicas: int, per_node: int, tp: int, instance: InstanceType, price: Price | None) -> Cost:
    """What ``replicas`` replicas of ``tp`` GPUs cost per hour: whole nodes (ceil(replicas / ``per_node``)
    x the instance price) and the GPU share (replicas x TP / the instance's GPUs x the price)."""
    nodes = math.ceil(replicas / per_node)
    return Cost(nodes=nodes, price=price,
                cost_per_endpoint_hour=nodes * price.usd_per_hour if price else None,
                gpu_share_cost_per_hour=replicas * tp / instance.gpus * price.usd_per_hour if price else None)


@dataclass(frozen=True)
class ScalingPlan:
    """An autoscaling line's bounds, what its nodes allow and its cost at both ends (:func:`scaling_plan`).

    Attributes:
        min_replicas, max_replicas, initial_replicas: the line's ``autoscaling`` bounds and ``replicas``.
        most_that_fit: the most replicas of the line its instance type's nodes hold next to every other
            line at its own maximum (:func:`platform_config.node_fit.most_replicas`, the config check's
            packing); None when not known (planned without the platform's lines).
        at_min, at_max: :class:`Cost` at ``min_replicas`` and at ``max_replicas``.
    """

    min_replicas: int
    max_replicas: int
    initial_replicas: int
    most_that_fit: int | None
    at_min: Cost
    at_max: Cost

    @property
    def fits(self) -> bool:
        """Whether ``max_replicas`` is within the node budget (unknown counts as yes)."""
        return self.most_that_fit is None or self.max_replicas <= self.most_that_fit

    def to_dict(self) -> dict[str, Any]:
        def cost(c: Cost) -> dict[str, Any]:
            return {"nodes": c.nodes, "cost_per_endpoint_hour": _round(c.cost_per_endpoint_hour, 2),
                    "gpu_share_cost_per_hour": _round(c.gpu_share_cost_per_hour, 2)}

        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": self.initial_replicas, "most_replicas_that_fit": self.most_that_fit,
                "max_replicas_fits": self.fits, "at_min": cost(self.at_min), "at_max": cost(self.at_max)}


def scaling_plan(p: Plan, *, min_replicas: int, max_replicas: int, most_that_fit: int | None) -> ScalingPlan:
    """The cost of plan ``p``'s endpoint at ``min_replicas`` and at ``max_replicas`` (same instance,
    TP, replicas per node and price as ``p``), and whether ``max_replicas`` fits ``most_that_fit``."""
    per_node = p.replicas_per_node
    return ScalingPlan(
        min_replicas=min_replicas, max_replicas=max_replicas, initial_replicas=p.inputs.replicas,
        most_that_fit=most_that_fit,
        at_min=cost_of(min_replicas, per_node, p.fit.tp, p.instance, p.cost.price),
        at_max=cost_of(max_replicas, per_node, p.fit.tp, p.instance, p.cost.price))


def format_scaling(s: ScalingPlan, instance_type: str) -> list[str]:
    """Report lines of an autoscaling line: its bounds, the node budget's bound and the cost at each end."""
    bound = ("" if s.most_that_fit is None else
             f"; the {instance_type} nodes hold at most {s.most_that_fit} of them next to the other lines at "
             f"their maximum" + ("" if s.fits else f" -- max_replicas {s.max_replicas} DOES NOT FIT"))

    def cost(label: str, n: int, c: Cost) -> str:
        if c.cost_per_endpoint_hour is None or c.gpu_share_cost_per_hour is None:
            return f"{label} {n}: {c.nodes} node(s), no price"
        return (f"{label} {n}: {c.nodes} node(s), ${c.cost_per_endpoint_hour:,.2f}/endpoint-hour "
                f"(GPU share ${c.gpu_share_cost_per_hour:,.2f}/h)")

    return [f"autoscaling   {s.min_replicas}..{s.max_replicas} replicas, starts at {s.initial_replicas}{bound}",
            f"scaling cost  {cost('at min', s.min_replicas, s.at_min)}; {cost('at max', s.max_replicas, s.at_max)}"]


def price_warnings(prices: PriceTable, region: str, instance_type: str) -> list[str]:
    """The warning the report prints for a price it uses: missing from the table, or not yet
    checked against its source (``checked: false`` in ``config/prices.yaml``)."""
    price = prices.price(region, instance_type)
    if price is None:
        return [f"no price for {instance_type} in {region} in the price table"]
    if not price.checked:
        return [f"price of {instance_type} ({price.usd_per_hour} {prices.currency}/h, as of "
                f"{price.as_of}) is unchecked; verify at {price.source}"]
    return []


def ttft_curve(p: Plan, lengths: Iterable[int]) -> list[Timing]:
    """Cold and warm TTFT of ``p``'s deployment (model, GPU, TP, KV dtype, hit ratio, chunk,
    L2 bandwidth, calibration) at each prompt length in ``lengths`` (tokens >= 1); what
    ``plan.py --plot`` draws."""
    i = p.inputs
    return [timing(i.model, p.instance, p.fit.tp, i.effective_kv_dtype, tokens=n, hit_ratio=i.hit_ratio,
                   chunk_tokens=i.chunk_tokens, l2_read_gibps=i.l2_read_gibps, calibration=p.calibration)
            for n in lengths]


@dataclass(frozen=True)
class Recommendation:
    """The chosen option among candidate instance types, why, and every option considered."""

    instance_type: str | None
    tp: int | None
    use_l2: bool
    reason: str
    options: tuple[Plan, ...] = field(default_factory=tuple)
    #: Price warnings (missing or unchecked) of every option whose price the comparison uses.
    warnings: tuple[str, ...] = ()
    #: Candidates that cannot run the inputs' TP at all, ``(instance type, why)``.
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def chosen(self) -> Plan | None:
        """The option recommended (None when nothing fits with a price)."""
        return next((p for p in self.options if p.instance.name == self.instance_type), None)

    def cost_ratio(self, option: Plan) -> float | None:
        """``option``'s cost per endpoint-hour over the chosen one's (None without both prices)."""
        best = self.chosen
        if best is None or not best.cost.cost_per_endpoint_hour or option.cost.cost_per_endpoint_hour is None:
            return None
        return option.cost.cost_per_endpoint_hour / best.cost.cost_per_endpoint_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type, "tp": self.tp, "use_l2": self.use_l2, "reason": self.reason,
            "options": [{
                "instance_type": p.instance.name, "fits": p.fit.fits, "tp": p.fit.tp, "nodes": p.cost.nodes,
                "cost_per_endpoint_hour": _round(p.cost.cost_per_endpoint_hour, 2),
                "cost_ratio": _round(self.cost_ratio(p), 2),
                "cold_ttft_ms": round(p.timing.cold_ttft_ms, 1), "warm_ttft_ms": round(p.timing.warm_ttft_ms, 1),
                "expected_ttft_ms": round(p.expected_ttft_ms, 1),
                "l2_pays": p.timing.l2_pays, "fit_reason": p.fit.reason,
            } for p in self.options] + [{"instance_type": name, "fits": False, "fit_reason": why}
                                        for name, why in self.refused],
            "warnings": list(self.warnings),
        }


def _money(value: float | None) -> str:
    return "no price" if value is None else f"${value:,.2f}/endpoint-hour"


def recommend(inputs: PlanInputs, candidates: Iterable[str], *, prices: PriceTable,
              ttft_slo_ms: float | None = None, calibration: Calibration = DEFAULT_CALIBRATION) -> Recommendation:
    """Pick the instance type for ``inputs``' model among ``candidates``.

    Each candidate is evaluated at ``inputs.tp`` (a business line's own TP), or, when that is None,
    at its smallest fitting TP; a candidate with fewer GPUs than ``inputs.tp``, or whose heads
    ``inputs.tp`` does not divide, is refused with the reason. With CPU and memory counted
    (:attr:`PlanInputs.node_room`) an option whose replica does not fit a node's CPU or memory
    does not fit, and its node count covers them. Rule:
    among options that fit and have a price, keep those whose expected TTFT (warm with L2
    where L2 pays, else cold) meets ``ttft_slo_ms`` (all, if no SLO), then take the cheapest
    per endpoint-hour, ties to the faster. If no option meets the SLO, the fastest is chosen and
    the reason says the SLO is missed. The reason states the choice in clauses separated by
    ``"; "``; :func:`format_recommendation` tabulates every option beside it.
    ``warnings`` carries the price warnings of every fitting option (the ones the comparison
    prices), so an unchecked price is flagged whichever option it belongs to.
    """
    options_list: list[Plan] = []
    refused: list[tuple[str, str]] = []
    for c in dict.fromkeys(candidates):
        gpus = get_instance_type(c).gpus
        if inputs.tp is not None and inputs.tp > gpus:
            refused.append((c, f"TP {inputs.tp} needs {inputs.tp} GPUs per replica; {c} has {gpus}"))
            continue
        options_list.append(plan(replace(inputs, instance_type=c), prices=prices, calibration=calibration))
    options = tuple(options_list)
    warnings = tuple(dict.fromkeys(w for p in options if p.fit.fits
                                   for w in price_warnings(prices, inputs.region, p.instance.name)))
    usable = [p for p in options if p.fit.fits and p.cost.cost_per_endpoint_hour is not None]
    if not usable:
        why = "; ".join([f"{p.instance.name}: {p.fit.reason if not p.fit.fits else 'no price'}" for p in options]
                        + [f"{name}: {reason}" for name, reason in refused])
        return Recommendation(None, None, False, f"no candidate fits {inputs.model.name} with a price: {why}",
                              options, warnings, tuple(refused))
    meeting = [p for p in usable if ttft_slo_ms is None or p.expected_ttft_ms <= ttft_slo_ms]
    fastest = min(usable, key=lambda p: (p.expected_ttft_ms, p.cost.cost_per_endpoint_hour))
    if meeting:
        best = min(meeting, key=lambda p: (p.cost.cost_per_endpoint_hour, p.expected_ttft_ms))
    else:
        best = fastest
    t = best.timing
    tier = (f"with L2 (warm TTFT {t.warm_ttft_ms:.0f} ms vs {t.cold_ttft_ms:.0f} ms cold, "
            f"{t.ttft_ratio:.1f}x)" if t.l2_pays else
            f"without L2 (TTFT {t.cold_ttft_ms:.0f} ms; L2 pays only above about "
            f"{t.break_even_tokens:,.0f} tokens)")
    reason = (f"{best.instance.name} TP {best.fit.tp} {tier}; {_money(best.cost.cost_per_endpoint_hour)} for "
              f"{best.cost.nodes} node(s), {inputs.replicas} replica(s) of {inputs.tokens:,}-token prompts")
    if ttft_slo_ms is not None and not meeting:
        reason = f"no option meets the {ttft_slo_ms:.0f} ms TTFT target; fastest: " + reason
    elif ttft_slo_ms is not None:
        reason += f"; cheapest option meeting the {ttft_slo_ms:.0f} ms TTFT target"
    else:
        reason += "; the cheapest option that fits"
    return Recommendation(best.instance.name, best.fit.tp, best.timing.l2_pays, reason, options, warnings,
                          tuple(refused))


def format_recommendation(rec: Recommendation) -> str:
    """The recommendation as a table: one row per candidate instance type (``*`` marks the
    choice), with TP, nodes, cold/warm/expected TTFT, whether L2 pays, cost per endpoint-hour
    and cost relative to the choice; then why each other candidate does not fit."""
    # One clause of the reason per line, each wrapped at 100 columns.
    lines = [textwrap.fill(("recommendation: " if k == 0 else "  ") + clause, width=100, subsequent_indent="    ",
                           break_on_hyphens=False) for k, clause in enumerate(rec.reason.split("; "))] + [""]
    header = (f"  {'instance type':<18} {'TP':>2} {'nodes':>5} {'fits':>4} {'cold ms':>8} {'warm ms':>8} "
              f"{'L2 pays':>7} {'TTFT ms':>8} {'$/endpoint-h':>12} {'cost':>6}")
    lines.append(header)
    fitting = sorted((p for p in rec.options if p.fit.fits),
                     key=lambda p: (p.cost.cost_per_endpoint_hour is None, p.cost.cost_per_endpoint_hour or 0.0,
                                    p.expected_ttft_ms))
    for p in fitting:
        t, cost, ratio = p.timing, p.cost.cost_per_endpoint_hour, rec.cost_ratio(p)
        mark = "*" if p.instance.name == rec.instance_type else " "
        lines.append(f"{mark} {p.instance.name:<18} {p.fit.tp:>2} {p.cost.nodes:>5} {'yes':>4} {t.cold_ttft_ms:>8,.0f} "
                     f"{t.warm_ttft_ms:>8,.0f} {'yes' if t.l2_pays else 'no':>7} {p.expected_ttft_ms:>8,.0f} "
                     f"{'no price' if cost is None else f'{cost:,.2f}':>12} "
                     f"{'-' if ratio is None else f'{ratio:.1f}x':>6}")
    for p in rec.options:
        if not p.fit.fits:
            lines.append(f"  {p.instance.name:<18} {p.fit.tp:>2} {'-':>5} {'no':>4}  {p.fit.reason}")
    for name, reason in rec.refused:
        lines.append(f"  {name:<18} {'-':>2} {'-':>5} {'no':>4}  {reason}")
    lines.append("  (TTFT ms: warm where L2 pays, else cold; cost: relative to the choice marked *)")
    return "\n".join(lines)


def collapse_unchecked_prices(warnings: list[str], plans: Iterable[Plan]) -> list[str]:
    """``warnings`` with two or more "price of X (...) is unchecked" lines (:func:`price_warnings`)
    replaced, where the first stood, by one line: how many, as of when, and how to check them.

    The report uses it so that a table whose prices are all unchecked (the shipped
    ``config/prices.yaml``) adds one line, not one per candidate type; ``--json`` keeps every
    warning as it is. ``plans`` are the plans whose prices the report uses (their ``cost.price``).
    """
    unchecked = {q.instance.name: q.cost.price for q in plans if q.cost.price is not None and not q.cost.price.checked}
    detailed = {w: name for w in warnings for name in unchecked
                if w.startswith(f"price of {name} (") and w.endswith(f"is unchecked; verify at {unchecked[name].source}")}
    if len(detailed) < 2:
        return warnings
    prices = [unchecked[name] for name in detailed.values()]
    dates = sorted({price.as_of for price in prices})
    sources = list(dict.fromkeys(price.source for price in prices))
    when = f"as of {dates[0]}" if len(dates) == 1 else f"as of {dates[0]} to {dates[-1]}"
    where = sources[0] if len(sources) == 1 else "its source"
    line = (f"{len(detailed)} prices used here are unchecked ({when}): compare each with {where}, then set "
            "checked: true in the price table (--prices, default config/prices.yaml); --json lists each")
    first = warnings.index(next(iter(detailed)))
    kept = [w for w in warnings if w not in detailed]
    return kept[:first] + [line] + kept[first:]


def format_plan(p: Plan, recommendation: Recommendation | None = None, *,
                node_report: Iterable[str] = ()) -> str:
    """The readable report ``scripts/plan.py`` prints (``--json`` prints :meth:`Plan.to_dict`).

    Titled with the model's name (``--model``, the config's ``_name_or_path``, or the Hub
    cache folder it was read from: see :func:`capacity.model_specs.load_hf_config`); every
    price it shows that is missing or unchecked is warned about, the recommendation's too.
    ``node_report``: the node budget and placement of a business line's instance type
    (:func:`platform_config.node_fit.format_node_fit` and the config check's verdict), printed
    after the tiers.
    """
    i, t, m, inst = p.inputs, p.timing, p.inputs.model, p.instance
    kv_per_token = p.kv_bytes_per_token
    fit = "fits" if p.fit.fits else "DOES NOT FIT"
    min_tp = f"smallest TP that fits: {p.min_tp}" if p.min_tp else f"no TP on {inst.name} fits"
    per_node = p.replicas_on_a_node
    l1_basis = ("L1 off" if p.l1_gib_per_replica == 0 else
                f"{p.l1_gib_per_replica:g} GiB x {per_node} replicas" if i.l1_gib_per_replica is not None else
                f"LMCache default {LMCACHE_DEFAULT_L1_GIB_PER_RANK:g} GiB x TP {p.fit.tp} x {per_node} replicas")
    pool_basis = (f"Curvine pool, {p.l2_nodes} Workers" if i.l2_pool_gib is not None
                  else f"{p.l2_nodes} node(s) x {p.l2_gib_per_node:,.0f} GiB NVMe")
    l2_rows = []
    if i.l2_size_gib is not None:
        kept = (f" (its janitor deletes above {i.l2_high_watermark:.0%})" if i.l2_high_watermark is not None else "")
        l2_rows.append(f"{'L2':<5} {f'{i.l2_size_gib:,.0f} GiB, the line' + chr(39) + 's l2_size':<40} "
                       f"{p.tokens_in(i.l2_size_gib):,} for this line{kept}")
    l2_rows.append(f"{'' if l2_rows else 'L2':<5} {f'{p.l2_pool_gib:,.0f} GiB {pool_basis}':<40} "
                   f"{p.tokens_in(p.l2_pool_gib):,} " + ("shared by the L2 lines" if l2_rows else "in the pool"))
    usable_gib = usable_gpu_memory_gib(inst.gpu_model)
    lines = [
        f"{m.name} ({i.dtype}) on {inst.name}: {inst.gpus} x {inst.gpu_model} ({inst.gpu_memory_gib:.0f} GB, "
        f"{usable_gib:.2f} GiB usable), TP {p.fit.tp}, {i.replicas} replica(s)",
        f"  model facts: {m.params / 1e9:.2f}B params, {m.layers} layers, {m.kv_heads} KV heads x {m.head_dim} "
        f"head_dim ({m.source})",
        "",
        f"weights       {p.weights_gib:.2f} GiB ({p.weights_gb:.2f} GB), {p.fit.weights_per_gpu_gib:.2f} GiB per GPU "
        f"at TP {p.fit.tp}: {fit}{'' if p.fit.fits else f' ({p.fit.reason})'}; {min_tp}",
        f"KV per token  {kv_per_token:,} B ({i.effective_kv_dtype})",
        f"prompt        {i.tokens:,} tokens = {t.kv_gib:.4f} GiB ({t.kv_gib * GIB / GB:.4f} GB) of KV",
        "",
        f"{'tier':<5} {'capacity':<40} tokens",
        f"{'L0':<5} {f'{p.fit.kv_free_per_gpu_gib:.2f} GiB KV per GPU':<40} "
        f"{p.fit.l0_tokens_per_replica:,} per replica ({p.fit.l0_tokens_per_replica * i.replicas:,} per endpoint)",
        f"{'L1':<5} {f'{p.l1_gib_per_node:.2f} GiB per node ({l1_basis})':<40} "
        f"{p.tokens_in(p.l1_gib_per_node):,} per node",
        *l2_rows,
        *([""] + list(node_report) if node_report else []),
        "",
        f"latency for {i.tokens:,} tokens, {t.cached_tokens:,} of them read from L2",
        f"  L2 read       {t.l2_read_ms:8.1f} ms  all {i.tokens:,} tokens at {i.l2_read_gibps} GiB/s x TP {p.fit.tp}",
        f"  cold TTFT     {t.cold_ttft_ms:8.1f} ms  prefill at the calibrated rate",
        f"  warm TTFT     {t.warm_ttft_ms:8.1f} ms  L2 overhead + read + prefill of uncached tokens",
        f"  cold / warm   {t.ttft_ratio:8.2f} x",
        f"  break-even    {t.break_even_tokens or 0:8,.0f} tokens  (L2 pays above; below, leave it to L0/L1)",
    ]
    if p.cost.price is not None:
        price = p.cost.price
        lines += ["", f"cost          {p.cost.nodes} node(s) x ${price.usd_per_hour:,.2f}/h = "
                      f"${p.cost.cost_per_endpoint_hour:,.2f} per endpoint-hour (GPU share "
                      f"${p.cost.gpu_share_cost_per_hour:,.2f}/h); {i.region} price as of {price.as_of}"
                      f"{'' if price.checked else ' (unchecked)'}"]
    warnings = list(p.warnings)
    if recommendation is not None:
        lines += ["", format_recommendation(recommendation)]
        warnings += recommendation.warnings
    warnings = list(dict.fromkeys(warnings))
    warnings = collapse_unchecked_prices(warnings, [p, *(recommendation.options if recommendation else ())])
    if warnings:
        lines += [""] + [f"warning: {w}" for w in warnings]
    return "\n".join(lines)
