"""Dashboards as code: one Grafana dashboard of the three tiers, a row per business line.

Built with ``grafana-foundation-sdk`` (Grafana's own typed builders), serialized to the JSON
model Grafana imports. Every query comes from :mod:`observability.queries`. The dashboard has a
``datasource`` variable of type ``prometheus``, so it binds to whichever Prometheus data source
the Grafana has (the AMP workspace's, in Amazon Managed Grafana).

Rows: "Platform" (Curvine pool and health, Kyverno admission, GPUs), then one per business line
(tier shares of prompt tokens, L0 and LMCache hit rates, L1/L2 hit tokens, TTFT p50/p90/p99
against the line's SLO, tokens per second, requests, L2 use against ``l2_size``, L2 traffic,
GPU KV-cache and L1 use, GPU utilisation), then "Cross-pod hit canary" (every L2 line's canary: ratio,
cold and warm TTFT, runs by result). What each panel means: docs/observability.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import gauge, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from cluster_agents import hot_prefixes, kv_canary
from observability import queries, targets
from platform_config import BusinessLineConfig, PlatformConfig

#: Name of the data-source variable every panel uses.
DATASOURCE_VARIABLE: Final = "datasource"
#: Directory of the dashboards in the synthesized output (``cdk.out/dashboards/``).
DASHBOARD_DIR: Final = "dashboards"

_DS = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")


def dashboard_uid(platform: PlatformConfig) -> str:
    """Stable dashboard uid (Grafana limits uids to 40 characters): ``<project>-kv-tiers``."""
    return f"{platform.project}-kv-tiers"[:40]


def _query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def _targets(panel: Any, queries_: list[tuple[str, str]]) -> Any:
    for i, (expr, legend) in enumerate(queries_):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def _thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def _series(title: str, description: str, unit: str, queries_: list[tuple[str, str]], *,
            span: int = 8, stacked: bool = False, threshold: float | None = None,
            max_value: float | None = None) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).datasource(_DS).unit(unit)
             .height(8).span(span).fill_opacity(10 if not stacked else 60))
    panel = _targets(panel, queries_)
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    if threshold is not None:
        panel = (panel.thresholds(_thresholds((None, "green"), (threshold, "red")))
                 .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED)))
    if max_value is not None:
        panel = panel.min(0).max(max_value)
    return panel


def _stat(title: str, description: str, expr: str, *, unit: str = "none", span: int = 4,
          steps: tuple[tuple[float | None, str], ...] = ((None, "green"),)) -> stat.Panel:
    panel = (stat.Panel().title(title).description(description).datasource(_DS).unit(unit).height(4).span(span)
             .thresholds(_thresholds(*steps)).color_mode(cm.BigValueColorMode.BACKGROUND))
    return _targets(panel, [(expr, title)])


def _gauge(title: str, description: str, expr: str, *, unit: str, max_value: float,
           steps: tuple[tuple[float | None, str], ...], span: int = 8) -> gauge.Panel:
    panel = (gauge.Panel().title(title).description(description).datasource(_DS).unit(unit).height(8).span(span)
             .min(0).max(max_value).thresholds(_thresholds(*steps)).show_threshold_markers(True))
    return _targets(panel, [(expr, title)])


def platform_panels(platform: PlatformConfig) -> list[Any]:
    """Panels of the "Platform" row: Curvine, Kyverno, GPUs."""
    alerts = platform.observability.alerts
    panels: list[Any] = []
    if platform.curvine.enabled:
        panels += [
            _gauge("L2 pool used", "Curvine pool: bytes used / capacity over all Workers (Primary's view). "
                   f"Alert above {alerts.pool_usage_threshold:.0%}.", queries.pool_used_ratio(),
                   unit="percentunit", max_value=1,
                   steps=((None, "green"), (platform.curvine.eviction.high_watermark, "orange"),
                          (alerts.pool_usage_threshold, "red"))),
            _series("L2 pool bytes", "Curvine pool capacity and bytes used.", "bytes",
                    [(queries.pool_bytes("capacity"), "capacity"), (queries.pool_bytes("fs_used"), "used")]),
            _stat("Curvine Primary up", "1 when the Primary answers its metrics endpoint.",
                  queries.targets_up(targets.JOB_CURVINE_MASTER), steps=((None, "red"), (1, "green"))),
            _stat("Workers live", "Workers the Primary sees as live.", queries.curvine_workers("live"),
                  steps=((None, "red"), (1, "green"))),
            _stat("Workers lost", "Workers the Primary lost (their chunks are gone until they return).",
                  queries.curvine_workers("lost"), steps=((None, "green"), (1, "red"))),
            _stat("Worker failed disks", "Failed storage directories over all Workers.",
                  queries.worker_failed_disks(), steps=((None, "green"), (1, "red"))),
        ]
        if platform.curvine.mount_watchdog.enabled:
            panels.append(_series(
                "L2 mounts not alive", "Pods whose Curvine L2 mount the watchdog on their node found dead (a "
                "restarted FUSE session; healed by evicting the pod), hung or failing (the Primary or the FUSE "
                "pod; never healed), by state.", "short",
                [(queries.l2_mounts_not_alive_by_state(), "{{state}}")]))
        panels += [
            _stat("Kyverno admission up", "Admission-controller pods answering; 0 blocks every new vLLM pod of "
                  "an L2 line (the policy fails closed).", queries.targets_up(targets.JOB_KYVERNO),
                  steps=((None, "red"), (1, "orange"), (2, "green"))),
            _series("Pod admissions by outcome", "Pod admission requests per second Kyverno answered, by "
                    "request_allowed.", "reqps", [(queries.admission_requests_by_outcome(), "allowed={{request_allowed}}")]),
            _series("Admission latency p99", "99th percentile of Kyverno's admission review time.", "s",
                    [(queries.admission_latency(0.99), "p99")]),
        ]
    panels += [
        _series("GPU utilisation by node", "Mean DCGM GPU utilisation per node.", "percent",
                [(queries.gpu_utilisation_by_node(), "{{Hostname}}")], span=12, max_value=100),
        _series("GPU memory used by node", "GPU memory used / total per node.", "percentunit",
                [(queries.gpu_memory_used_ratio_by_node(), "{{Hostname}}")], span=12, max_value=1),
    ]
    return panels


def line_panels(platform: PlatformConfig, line: BusinessLineConfig) -> list[Any]:
    """Panels of one business line's row (L2 panels only when the line uses L2)."""
    prompt = queries.prompt_tokens_rate(line)
    slo_s = line.slo.ttft_p90_ms / 1000
    shares = [(f"{queries.l0_hit_tokens_rate(line)} / {prompt}", "L0 (GPU prefix cache)")]
    hit_tokens = [(queries.l0_hit_tokens_rate(line), "L0")]
    if line.cache.l1_enabled or line.cache.l2_enabled:
        shares.append((f"{queries.l1_hit_tokens_rate(line)} / {prompt}", "L1 (CPU, LMCache)"))
        hit_tokens.append((queries.l1_hit_tokens_rate(line), "L1"))
    if line.cache.l2_enabled:
        shares.append((f"{queries.l2_hit_tokens_rate(line)} / {prompt}", "L2 (Curvine)"))
        hit_tokens.append((queries.l2_hit_tokens_rate(line), "L2"))
    panels: list[Any] = [
        _series("Prompt tokens served from cache, by tier",
                "Share of prompt tokens served by each tier; the rest is prefilled (recomputed).",
                "percentunit", shares, stacked=True, max_value=1),
        _series("Hit rates", "L0: prefix-cache hit tokens / queried tokens. LMCache: retrieved tokens / "
                "tokens asked of LMCache (L1 and L2).", "percentunit",
                [(queries.l0_hit_rate(line), "L0"), (queries.lmcache_hit_rate(line), "LMCache (L1+L2)")],
                max_value=1),
        _series("Hit tokens per second, by tier", "Tokens per second each tier served.", "short", hit_tokens),
        _series(f"TTFT p50 / p90 / p99 (SLO p90 {line.slo.ttft_p90_ms} ms)",
                "Time to first token; the dashed line is the line's slo.ttft_p90_ms.", "s",
                [(queries.ttft_quantile(line, q), f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)],
                threshold=slo_s),
        _series("Tokens per second", "Prompt and generated tokens per second over all replicas.", "short",
                [(prompt, "prompt"), (queries.generation_tokens_rate(line), "generated")]),
        _series("Requests", "Requests running on the GPUs and waiting in vLLM's queue.", "short",
                [(queries.requests(line, "running"), "running"), (queries.requests(line, "waiting"), "waiting")]),
        _series("Share of prompt tokens per replica", f"Each replica's share of the line's prompt tokens and "
                f"requests over {queries.SHARE_WINDOW}: near 1 / replicas each when routing spreads the load; one "
                "replica near 100% is a hot spot (KvCacheReplicaHotSpot; docs/routing.md).", "percentunit",
                [(queries.replica_share(line, "prompt_tokens"), "{{pod}} prompt tokens"),
                 (queries.replica_share(line, "requests"), "{{pod}} requests")], max_value=1),
    ]
    if line.cache.l2_enabled and platform.curvine.enabled:
        size = queries.l2_size_bytes(line)
        panels += [
            _gauge(f"L2 use of {line.cache.l2_size}", "Bytes in the line's L2 directory (the janitor's last "
                   "measurement) against cache.l2_size; orange from the high watermark.",
                   queries.l2_used_bytes(line), unit="bytes", max_value=size,
                   steps=((None, "green"), (platform.curvine.eviction.high_watermark * size, "orange"),
                          (size, "red"))),
            _series("L2 traffic", "Bytes per second LMCache read from and wrote to L2 (all ranks).", "Bps",
                    [(queries.l2_traffic_bytes_rate(line, "read"), "read"),
                     (queries.l2_traffic_bytes_rate(line, "write"), "write")]),
            _series("LMCache retrieve / store speed (median)", "Tokens per second per request.", "short",
                    [(queries.lmcache_speed(line, "retrieve"), "retrieve"),
                     (queries.lmcache_speed(line, "store"), "store")]),
        ]
        if line.hot_prefixes.active:
            panels.append(_series(
                "Hot prefixes: tokens kept in L2", "Per declared prefix (hot_prefixes): the tokens in full chunks "
                "that L2 should hold (pinned) and the leading tokens whose chunks are in L2 now (in L2; the janitor "
                "never evicts them, a warm-up restores a loss). In L2 below pinned: chunks lost and not yet "
                "restored (docs/l2-cache.md, 'Hot prefixes').", "short",
                [(queries.hot_prefix_tokens(line, hot_prefixes.PINNED_TOKENS_METRIC), "{{prefix}} pinned"),
                 (queries.hot_prefix_tokens(line, hot_prefixes.L2_TOKENS_METRIC), "{{prefix}} in L2")]))
    panels += [
        _series("GPU KV-cache usage", "Share of the GPU KV-cache blocks in use, per pod.", "percentunit",
                [(queries.kv_cache_usage(line), "{{pod}}")], max_value=1),
        _series("L1 bytes", "Bytes in LMCache's CPU tier, per pod.", "bytes",
                [(queries.l1_used_bytes(line), "{{pod}}")]),
        _series("GPU utilisation", "Mean utilisation of the GPUs the line's pods use (DCGM).", "percent",
                [(queries.line_gpu_utilisation(line), "GPU util")], max_value=100),
    ]
    return panels


def canary_panels(platform: PlatformConfig) -> list[Any]:
    """Panels of the "Cross-pod hit canary" row, one series per line that runs the canary."""
    low = platform.observability.alerts.canary_min_hit_ratio
    return [
        _series("Cross-pod hit ratio (canary)", "Share of a fresh prompt's full chunks that the second replica "
                "served from L2 after the first computed it (last measured run; 1 = L2 shares across pods). "
                f"The alert fires below {low:.0%} for several runs in a row; no value while only one "
                "comparable replica runs.", "percentunit",
                [(queries.canary_by_line(kv_canary.RATIO_METRIC), "{{line}}")], span=8, threshold=low, max_value=1),
        _series("Canary TTFT: cold / warm", "Time to the one-token response "
                "of the canary's two requests (last measured run): cold on the first replica, warm on the second (from L2); warm well below cold = L2 pays.", "s",
                [(queries.canary_by_line(kv_canary.TTFT_METRIC, by="line, phase"), "{{line}} {{phase}}")], span=8),
        _series("Canary runs per hour, by result", "measured; busy (the second replica served others meanwhile, "
                "nothing proven); one_replica / no_pair (nothing to compare: reported, not alarmed); error.",
                "short", [(queries.canary_runs_by_line_and_result(), "{{line}} {{result}}")], span=8),
    ]


def _replica_count(line: BusinessLineConfig) -> str:
    """``2x`` for a fixed line, ``autoscaled 1-2x`` for an autoscaling one (its row title)."""
    if line.autoscaling is None:
        return f"{line.replicas}x"
    return f"autoscaled {line.autoscaling.min_replicas}-{line.autoscaling.max_replicas}x"


def build_dashboard(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a dict), rows in order: Platform, then each line.

    Panel ids are assigned 1..N in order (Grafana keeps them stable for links).
    """
    dashboard = (db.Dashboard(f"{platform.project}: KV cache tiers (L0 / L1 / L2)")
                 .uid(dashboard_uid(platform)).tags(["kvcache", platform.project]).editable()
                 .time("now-6h", "now").refresh("1m").timezone("browser")
                 .with_variable(db.DatasourceVariable(DATASOURCE_VARIABLE).label("Prometheus").type("prometheus")))
    dashboard = dashboard.with_row(db.Row("Platform: Curvine L2 pool, Kyverno admission, GPUs"))
    for panel in platform_panels(platform):
        dashboard = dashboard.with_panel(panel)
    for line in lines:
        dashboard = dashboard.with_row(db.Row(
            f"Business line {line.name} (namespace {line.namespace}, {line.model.name}, "
            f"{_replica_count(line)} {line.instance_type})"))
        for panel in line_panels(platform, line):
            dashboard = dashboard.with_panel(panel)
    if any(line.runs_canary for line in queries.l2_lines(platform, lines)):
        dashboard = dashboard.with_row(db.Row("Cross-pod hit canary (every L2 line): is one replica's prefix "
                                              "served from L2 on another?"))
        for panel in canary_panels(platform):
            dashboard = dashboard.with_panel(panel)
    model = json.loads(json.dumps(dashboard.build(), cls=JSONEncoder))
    _flow_layout(model["panels"])
    for i, panel in enumerate(model["panels"], start=1):
        panel["id"] = i
    return model


def _flow_layout(panels: list[dict[str, Any]]) -> None:
    """Place panels left to right on Grafana's 24-column grid, wrapping lines; rows span the width.

    (The builder's own placement lets a panel run past column 24 after panels of mixed heights.)
    """
    x = y = line_bottom = 0
    for panel in panels:
        pos = panel["gridPos"]
        if panel["type"] == "row":
            y = line_bottom if x else y
            pos.update(x=0, y=y, w=24, h=1)
            x, y = 0, y + 1
            line_bottom = y
            continue
        if x + pos["w"] > 24:
            x, y = 0, line_bottom
        pos.update(x=x, y=y)
        x += pos["w"]
        line_bottom = max(line_bottom, y + pos["h"])


def write_dashboards(outdir: str | Path, models: list[dict[str, Any]]) -> list[Path]:
    """Write dashboard JSON models into ``<outdir>/dashboards/<uid>.json`` (beside the templates).

    Returns:
        The files written, in the order of ``models``.
    """
    target = Path(outdir) / DASHBOARD_DIR
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for model in models:
        path = target / f"{model['uid']}.json"
        path.write_text(json.dumps(model, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written
