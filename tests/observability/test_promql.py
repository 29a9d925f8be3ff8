"""Every PromQL expression of the dashboards and alerts parses, and selects only sourced series and labels."""

from __future__ import annotations

import promql_parser
import pytest

from observability import targets
from observability.metrics import series_index
from tests.observability.conftest import panel_targets, selectors

#: Labels a series can carry besides the component's own: target labels set by the scrape
#: jobs' relabelling (observability.targets) and the ones every scrape adds.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "node", "business_line", targets.L2_CACHE_TARGET_LABEL}


def _expressions(dashboard, all_alerts) -> list[tuple[str, str]]:
    return [(f"panel {t}", e) for t, e in panel_targets(dashboard)] + [(f"alert {a.name}", a.expr) for a in all_alerts]


def test_every_expression_parses_with_promql_parser(dashboard, all_alerts) -> None:
    exprs = _expressions(dashboard, all_alerts)
    assert len(exprs) > 60
    for where, expr in exprs:
        try:
            promql_parser.parse(expr)
        except Exception as exc:  # the parser raises ValueError-like errors with a position
            pytest.fail(f"{where}: {exc}\n{expr}")


def test_every_selected_series_is_in_the_sourced_metric_table(dashboard, all_alerts) -> None:
    index = series_index()
    for where, expr in _expressions(dashboard, all_alerts):
        for name, _ in selectors(expr):
            assert name in index, f"{where}: series {name!r} is not in observability.metrics"


def test_every_label_matcher_names_a_label_the_series_has(dashboard, all_alerts) -> None:
    index = series_index()
    for where, expr in _expressions(dashboard, all_alerts):
        for name, matchers in selectors(expr):
            metric = index[name]
            allowed = set(metric.labels) | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
            unknown = set(matchers) - allowed
            assert not unknown, f"{where}: {name} has no label(s) {sorted(unknown)}"


def test_every_selector_is_scoped_to_one_of_our_scrape_jobs(dashboard, all_alerts) -> None:
    """No expression reads a series of the same name from someone else's job (``capacity`` is generic)."""
    ours = {targets.JOB_VLLM, targets.JOB_CURVINE_MASTER, targets.JOB_CURVINE_WORKER, targets.JOB_KYVERNO,
            targets.JOB_DCGM, targets.JOB_L2_JANITOR, targets.JOB_L2_MOUNT_WATCHDOG, targets.JOB_KV_CANARY,
            targets.JOB_APISERVER}
    for where, expr in _expressions(dashboard, all_alerts):
        for name, matchers in selectors(expr):
            assert matchers.get("job", ("", ""))[0] == "Equal" and matchers["job"][1] in ours, f"{where}: {name}"


def test_vllm_and_lmcache_series_are_selected_per_business_line(obs_project, dashboard) -> None:
    names = {l.name for l in obs_project.business_lines}
    for title, expr in panel_targets(dashboard):
        for name, matchers in selectors(expr):
            if name.startswith(("vllm:", "lmcache:")):
                assert matchers["business_line"][0] == "Equal" and matchers["business_line"][1] in names, title


def test_lmcache_token_counters_read_one_tensor_parallel_rank(dashboard) -> None:
    """Every rank retrieves its own shard of the same tokens: token counts come from rank 0 only."""
    for title, expr in panel_targets(dashboard):
        for name, matchers in selectors(expr):
            if name in ("lmcache:num_hit_tokens_total", "lmcache:num_requested_tokens_total",
                        "lmcache:num_remote_read_requests_total"):
                assert matchers["worker_id"] == ("Equal", "0"), title


def test_rule_durations_parse(all_alerts) -> None:
    for alert in all_alerts:
        assert promql_parser.parse_duration(alert.for_).total_seconds() >= 120, alert.name
