"""LMCache's metrics reach vLLM's ``/metrics`` through the rendered ``PROMETHEUS_MULTIPROC_DIR``.

In a pod, LMCache counts in vLLM's engine-core/worker processes and vLLM's API server, another
process, serves ``/metrics``; it shows LMCache's series only from a Prometheus multiprocess
directory shared by the whole container (docs/sources.md §13). Here each pod is a process
configured from the env the line's rendered Policy gives the vLLM container, its
``PROMETHEUS_MULTIPROC_DIR`` re-pointed from the Pod's ``emptyDir`` mount to a temporary
directory; another process reads that directory as vLLM's API server does
(:mod:`tests_lmcache.scrape`). The result is compared with the LMCache rows of
``observability/metrics.py`` (imported: a renamed metric, a changed type or label set fails) and
with the label matchers the dashboards and alerts select LMCache series with.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from observability import metrics
from observability.metrics import METRICS
from tests_lmcache.conftest import REPO, Tier, make_tier
from tests_lmcache.test_lmcache_l2 import PROMPT, RAG

#: The LMCache rows of the metric table the dashboards and alerts are built from.
LMCACHE_ROWS = {name: m for name, m in METRICS.items() if m.source is metrics.LMCACHE}
#: What LMCache 0.5.5 writes by itself when PROMETHEUS_MULTIPROC_DIR is unset
#: (``PrometheusLogger._ensure_multiprocess_dir``, ``lmcache/observability.py``).
LMCACHE_FALLBACK_DIR = "/tmp/lmcache_prometheus"


def scrape(metrics_dir: Path) -> dict[str, Any]:
    """Family name -> parsed family, as vLLM's ``/metrics`` would serve ``metrics_dir``, read in a
    process of its own that shares nothing with the pods but the directory."""
    text = subprocess.run([sys.executable, "-m", "tests_lmcache.scrape"], cwd=REPO, check=True, capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"], "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
                          timeout=120).stdout
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(families: dict[str, Any], series: str) -> list[Any]:
    """Every sample named ``series`` (a stored series name such as ``..._total``, ``..._bucket``)."""
    return [s for f in families.values() for s in f.samples if s.name == series]


def value(families: dict[str, Any], series: str, **labels: str) -> float:
    """The value of the one sample of ``series`` whose labels include ``labels``."""
    (hit,) = [s for s in samples(families, series) if labels.items() <= s.labels.items()]
    return hit.value


@pytest.fixture(scope="module")
def pods(exported, tmp_path_factory) -> SimpleNamespace:
    """Pod A stores a prompt of four full chunks (L1 and L2); pod B, with an empty L1, retrieves
    it from L2. Each logs its statistics once more before it exits; each has its own directory."""
    tier = make_tier(exported, tmp_path_factory.mktemp("metrics"))
    a = tier.run(RAG, [{"op": "store", "prompt": PROMPT}, {"op": "flush_metrics"}, {"op": "metrics_state"}], pod=0)
    b = tier.run(RAG, [{"op": "lookup", "prompt": PROMPT}, {"op": "retrieve", "prompt": PROMPT},
                       {"op": "flush_metrics"}, {"op": "metrics_state"}], pod=1)
    return SimpleNamespace(tier=tier, a=a, b=b, writer=scrape(tier.metrics_dir(RAG, 0)),
                           reader=scrape(tier.metrics_dir(RAG, 1)))


def test_every_l2_pod_has_its_multiproc_dir_on_an_emptydir(exported):
    """The admitted Pod's env names a directory that exists before vLLM starts: the mount of a
    size-limited ``emptyDir`` in the vLLM container (read from the rendered objects)."""
    for line, doc in exported["lines"].items():
        metrics_dir = doc["metrics_dir"]
        assert metrics_dir is not None, f"{line}: PROMETHEUS_MULTIPROC_DIR unset or not mounted once"
        assert set(metrics_dir["volume"]) == {"name", "emptyDir"} and metrics_dir["volume"]["emptyDir"]["sizeLimit"]
        assert {env["PROMETHEUS_MULTIPROC_DIR"] for env in doc["envs"]} == {metrics_dir["mount_path"]}


def test_pod_processes_write_multiprocess_files_to_the_rendered_dir(pods):
    for run, pod in ((pods.a, 0), (pods.b, 1)):
        (state,) = run.of("metrics_state")
        directory = pods.tier.metrics_dir(RAG, pod)
        assert state["env"] == str(directory) and state["value_class"] == "MmapedValue"
        files = sorted(p.name for p in directory.iterdir())
        assert files and all(f.endswith(f"_{state['pid']}.db") for f in files), files


@pytest.mark.parametrize("name", sorted(LMCACHE_ROWS))
def test_another_process_reads_every_lmcache_metric_of_the_table(pods, name):
    """Name, type, stored series names and label names of each LMCache row, as served (a
    histogram only once observed: ``store_speed`` by pod A, ``retrieve_speed`` by pod B)."""
    metric = LMCACHE_ROWS[name]
    served = [families[metric.name] for families in (pods.writer, pods.reader) if metric.name in families]
    assert served, f"{metric.name} is not exposed by lmcache {metrics.LMCACHE.versions}"
    for family in served:
        assert family.type == metric.kind, (metric.name, family.type)
        assert {s.name for s in family.samples} <= set(metric.series())
        label_sets = {frozenset(set(s.labels) - {"le"}) for s in family.samples}
        assert label_sets == {frozenset(metric.labels)}, (metric.name, label_sets)  # no pid label either
        assert {s.labels["worker_id"] for s in family.samples} == {"0"}
        assert {s.labels["model_name"] for s in family.samples} == {pods.tier.doc["lines"][RAG]["engine"]["model_name"]}


def test_every_lmcache_selector_of_the_dashboards_and_alerts_finds_its_series(pods, exported):
    """The matchers the panels and alerts put on LMCache's own labels (``worker_id="0"``: one TP
    rank) select a served series. A selector for a series missing from both pods fails too."""
    assert exported["lmcache_selections"], "no LMCache series in the dashboards and alerts"
    ops = {"Equal": lambda v, want: v == want, "NotEqual": lambda v, want: v != want,
           "EqualRegex": lambda v, want: re.fullmatch(want, v) is not None,
           "NotEqualRegex": lambda v, want: re.fullmatch(want, v) is None}
    for series, matcher_sets in exported["lmcache_selections"].items():
        served = samples(pods.writer, series) + samples(pods.reader, series)
        assert served, f"{series} (selected by a panel or alert) is not served"
        for matchers in matcher_sets:
            assert any(all(label in s.labels and ops[op](s.labels[label], want)
                           for label, (op, want) in matchers.items()) for s in served), (series, matchers)


def test_served_values_are_what_the_pods_did(pods):
    """Exact counts of the store in pod A and the L2 retrieve in pod B (one TP rank)."""
    rank0 = {"worker_id": "0"}
    (store,) = pods.a.of("store")
    (retrieve,) = pods.b.of("retrieve")
    chunk = 256
    payload = retrieve["bytes"]  # KV bytes of the 4 chunks, without the files' headers
    assert retrieve["retrieved_tokens"] == 4 * chunk and store["stored_files"] == 4
    # Pod A: L2 writes; its L1 holds the 4 chunks. LMCache counts the store request's tokens,
    # the 100-token tail it does not store (save_unfull_chunk false) included.
    assert value(pods.writer, "lmcache:num_stored_tokens_total", **rank0) == PROMPT[0][1]
    assert value(pods.writer, "lmcache:num_remote_write_bytes_total", **rank0) == payload
    assert value(pods.writer, "lmcache:store_speed_count", **rank0) == 1
    assert value(pods.writer, "lmcache:local_cache_usage", **rank0) == payload
    # Pod B: every hit came from L2, one read per chunk: the dashboards' L2 hit tokens
    # (remote read requests x chunk size, observability/queries.py) equal LMCache's hit tokens.
    hits = value(pods.reader, "lmcache:num_hit_tokens_total", **rank0)
    assert hits == retrieve["retrieved_tokens"]
    assert value(pods.reader, "lmcache:num_requested_tokens_total", **rank0) == PROMPT[0][1]
    assert value(pods.reader, "lmcache:num_remote_read_requests_total", **rank0) * chunk == hits
    assert value(pods.reader, "lmcache:num_remote_read_bytes_total", **rank0) == payload
    assert value(pods.reader, "lmcache:retrieve_speed_count", **rank0) == 1
    assert value(pods.reader, "lmcache:num_remote_write_bytes_total", **rank0) == 0


def test_one_process_leaves_well_under_the_volumes_size_limit(pods, exported):
    """The footprint the ``emptyDir``'s ``sizeLimit`` is chosen from (k8s/patch.py)."""
    limit = exported["lines"][RAG]["metrics_dir"]["volume"]["emptyDir"]["sizeLimit"]
    assert limit.endswith("Mi")
    for pod in (0, 1):
        used = sum(p.stat().st_size for p in pods.tier.metrics_dir(RAG, pod).iterdir())
        assert used <= 1 << 20, f"{used} bytes for one LMCache process"
        assert 64 * used <= int(limit[:-2]) << 20  # room for 64 process lifetimes


def test_control_without_the_env_lmcache_metrics_stay_in_the_process(tier: Tier):
    """Why the env must come from the container: unset, LMCache 0.5.5 sets its own fallback
    directory only after ``prometheus_client`` chose in-memory values at import, so nothing is
    written for another process to read (and vLLM would serve its own registry only)."""
    run = tier.run(RAG, [{"op": "store", "prompt": PROMPT}, {"op": "flush_metrics"}, {"op": "metrics_state"}],
                   env=tier.pod_env(RAG, overrides={"PROMETHEUS_MULTIPROC_DIR": None}))
    (state,) = run.of("metrics_state")
    assert state["env"] == LMCACHE_FALLBACK_DIR and state["value_class"] == "MutexValue"
    assert not list(Path(LMCACHE_FALLBACK_DIR).glob(f"*_{state['pid']}.db"))
