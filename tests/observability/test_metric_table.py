"""The metric table: every entry sourced, and its series names as the real client libraries write them."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from observability import metrics
from observability.metrics import METRICS, Naming
from platform_config.fields import LMCACHE_VERSION


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


def test_l2_janitor_serves_the_metrics_the_dashboards_and_alerts_read(tmp_path: Path) -> None:
    """What the janitor's HTTP server answers on GET /metrics after a pass (the scraped text), parsed
    with prometheus_client's parser: every janitor metric of the table, as a gauge, with its labels."""
    from cluster_agents import l2_janitor

    config = l2_janitor.JanitorConfig(line="rag-assistant", namespace="rag-assistant", live_dir="m",
                                      capacity_bytes=2**30, high_watermark=0.8, low_watermark=0.6, max_age_s=None,
                                      min_delete_age_s=600, mount_path="/mnt/curvine/l2cache")
    service = l2_janitor.JanitorService(config, tmp_path, list_pods=None, log=lambda line: None)
    service.run_pass()
    server = l2_janitor.make_server(service, 0, host="127.0.0.1")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}{l2_janitor.METRICS_PATH}"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    janitor_metrics = [m for m in METRICS.values() if m.source is metrics.L2_JANITOR]
    assert {m.name for m in janitor_metrics} == {
        "kvcache_l2_janitor_used_bytes", "kvcache_l2_janitor_last_run_timestamp_seconds", "kvcache_l2_janitor_errors",
        "kvcache_l2_janitor_pinned_bytes"}
    for metric in janitor_metrics:
        assert metric.name in families and families[metric.name].type == "gauge", metric.name
        (sample,) = families[metric.name].samples
        assert sample.labels == {"line": "rag-assistant", "namespace": "rag-assistant"}
        assert set(sample.labels) == set(metric.labels)
