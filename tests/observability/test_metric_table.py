"""The metric table: every entry sourced, and its series names as the real client libraries write them."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from observability import metrics
from observability.metrics import METRICS, Naming
from platform_config.models import LMCACHE_VERSION


def test_every_metric_names_its_component_file_and_versions() -> None:
    for metric in METRICS.values():
        src = metric.source
        assert src.component and src.repository and src.path and src.read_from, metric.name
        assert src.versions and all(src.versions), metric.name
        assert metric.kind in ("counter", "gauge", "histogram")
        assert metric.meaning and metric.unit


def test_versioned_sources_are_the_pinned_ones() -> None:
    """The table is read at the versions the platform runs (docs/sources.md §13): LMCache's is the
    pinned release (a new pin fails here until the table is re-read; ``make test-lmcache`` then
    checks the table against that release's exposition), vLLM's the ones its image can carry."""
    assert metrics.VLLM.versions == ("v0.29.0", "v0.30.0")
    assert metrics.LMCACHE.versions == (f"v{LMCACHE_VERSION}",)
    assert metrics.CURVINE_MASTER.versions == metrics.CURVINE_WORKER.versions == ("v0.3.2-alpha",)
    assert metrics.KYVERNO_WEBHOOK.versions == metrics.KYVERNO_ENGINE.versions == ("v1.15.2",)
    assert metrics.DCGM.versions == ("4.5.3-4.8.2",)


@pytest.mark.parametrize("name", [n for n, m in METRICS.items() if m.source.naming is Naming.PYTHON_CLIENT])
def test_python_client_series_names_match_what_prometheus_client_writes(name: str) -> None:
    """vLLM and LMCache register with prometheus_client; the same registration here shows the names."""
    metric = METRICS[name]
    registry = CollectorRegistry()
    cls = {"counter": prometheus_client.Counter, "gauge": prometheus_client.Gauge,
           "histogram": prometheus_client.Histogram}[metric.kind]
    instrument = cls(name, "doc", labelnames=list(metric.labels), registry=registry)
    child = instrument.labels(*["x"] * len(metric.labels)) if metric.labels else instrument
    getattr(child, {"counter": "inc", "gauge": "set", "histogram": "observe"}[metric.kind])(
        *(() if metric.kind == "counter" else (1.0,)))
    written = {s.name for fam in text_string_to_metric_families(generate_latest(registry).decode())
               for s in fam.samples}
    written.discard(f"{name.removesuffix('_total')}_created")  # not written in multiprocess mode
    assert written == set(metric.series())


def test_naming_rules_for_each_exposition() -> None:
    assert metrics.series("vllm:prompt_tokens") == "vllm:prompt_tokens_total"
    assert metrics.series("kyverno_admission_requests") == "kyverno_admission_requests_total"
    assert metrics.series("read_bytes") == "read_bytes"  # Rust prometheus crate: as registered
    assert metrics.series("vllm:time_to_first_token_seconds", "_bucket") == "vllm:time_to_first_token_seconds_bucket"
    with pytest.raises(KeyError, match="not in observability.metrics.METRICS"):
        metrics.series("vllm:gpu_prefix_cache_hits")


def test_l2_janitor_writes_the_metrics_the_dashboards_read_when_it_is_present() -> None:
    """The janitor (issue 8) prints these gauges; once merged, this test binds the two."""
    try:
        from kv_tools import l2_janitor
    except ImportError:
        pytest.skip("kv_tools.l2_janitor is not in this tree yet (issue 8)")
    text = l2_janitor.prometheus_text(l2_janitor.RunSummary(line="l", namespace="n"))  # type: ignore[call-arg]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, metric in METRICS.items():
        if metric.source is metrics.L2_JANITOR:
            assert name in families and families[name].type == "gauge", name
            assert set(families[name].samples[0].labels) == set(metric.labels)
