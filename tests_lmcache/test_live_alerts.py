"""The L2 alerts, evaluated by a live Prometheus that scrapes real LMCache pods, the janitor and the canary.

Two stand-in replicas of ``rag-assistant`` (:mod:`tests_lmcache.replica`: a real ``LMCacheEngine``
each, configured from the rendered env), the real L2 janitor (``cluster_agents/l2_janitor.py --serve``
with the rendered ``janitor.json``) and the real canary (:mod:`cluster_agents.kv_canary`, the rendered
``canary.json``) serve ``/metrics``; a Prometheus (:mod:`tests_lmcache.prometheus`) scrapes them
through the generated scrape jobs and relabel rules and evaluates the generated rule file. Faults
are real operating-system errors on LMCache's and the janitor's own code paths (no FUSE here; the
L2 fault tier has it):

* **stores failing**: a replica's temp directory (``fs_connector_relative_tmp_dir``) replaced by a
  file, so every L2 write fails (``ENOTDIR``) while reads work;
* **a dead mount** of one pod: each replica reaches the L2 root through its own symlink (its
  "mount"); pointing it nowhere fails every L2 operation of that pod only, as a dead FUSE mount
  does (there ``ENOTCONN``, here ``ENOENT``): LMCache's lookups miss and its writes fail;
* **the janitor failing**: its PVC mount point gone (``not a directory``).

Each test asserts the alert fires with the labels a receiver gets and resolves once the fault is
gone. ``for:`` is 0 in the live rule file (:func:`tests_lmcache.prometheus.fast_rules`); the
``for:`` windows are proven by promtool. ``KvCacheL2MountDead`` is proven live in the fault tier
(``tests_faults/test_live_alerts.py``: the real watchdog on a real FUSE mount); not live anywhere:
``KvCacheL2RetrieveFailing`` (its 10-minute window outlasts a test; promtool covers it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from cluster_agents import kv_canary
from tests_lmcache.conftest import REPO, make_tier, point_mount
from tests_lmcache.prometheus import LivePrometheus, free_port
from tests_lmcache.test_lmcache_l2 import RAG

JOB_VLLM, JOB_JANITOR, JOB_CANARY = "kvcache-vllm", "kvcache-l2-janitor", "kvcache-kv-canary"
NS = RAG  # the fixture line's namespace is its name


def _fresh_prompt(seed: int) -> list[int]:
    """Four full chunks and a tail no other request shares (token ids)."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(1000, 30000) for _ in range(4 * 256 + 16)]


def _post(replica, prompt) -> dict:
    import urllib.request

    request = urllib.request.Request(f"{replica.url}/v1/completions", data=json.dumps(
        {"prompt": prompt, "max_tokens": 1}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def live(exported, tmp_path_factory):
    base = tmp_path_factory.mktemp("live")
    tier = make_tier(exported, base)
    doc = exported["lines"][RAG]
    mounts = base / "mounts"
    mounts.mkdir()
    started = []
    prometheus = None
    try:
        for pod, name in ((0, f"{RAG}-5d8f7c9b4-a"), (1, f"{RAG}-5d8f7c9b4-b")):
            started.append(tier.start_replica_on_mount(RAG, name, mounts / name, pod=pod))
        a, b = started
        # The janitor, as its Deployment runs it (--no-pods: no API server here), through its own mount.
        janitor_mount = mounts / "l2-janitor"
        janitor_mount.symlink_to(tier.root)
        janitor_json = base / "janitor.json"
        janitor_json.write_text(json.dumps(doc["janitor_config"]), encoding="utf-8")
        janitor_port = free_port()
        janitor = subprocess.Popen(
            [sys.executable, str(REPO / "cluster_agents" / "l2_janitor.py"), "--config", str(janitor_json), "--root",
             str(janitor_mount), "--serve", "--port", str(janitor_port), "--period-s", "1", "--no-pods"],
            cwd=base, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        # The canary, in this process (its Pod list: the two replicas as the API server lists them).
        config = kv_canary.config_from_dict({**doc["canary_config"], "settle_s": 4})
        canary = kv_canary.Canary(config, list_pods=lambda: [r.pod_object(RAG) for r in (a, b)], log=lambda _: None)
        server = kv_canary.make_server(canary, 0, host="127.0.0.1")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        prometheus = LivePrometheus(base / "prometheus", rule_file=exported["rule_file"],
                                    scrape_config=exported["scrape_config"]).start()
        meta = doc["scrape_meta"]

        def target(job: str, port: int, pod: str) -> tuple[str, dict[str, str]]:
            return f"127.0.0.1:{port}", {**meta[job], "__meta_kubernetes_pod_name": pod,
                                         "__meta_kubernetes_pod_node_name": "hyperpod-i-0abc"}

        prometheus.set_targets(JOB_VLLM, [target(JOB_VLLM, r.port, r.name) for r in (a, b)])
        prometheus.set_targets(JOB_JANITOR, [target(JOB_JANITOR, janitor_port, "l2-janitor-7f6d-x")])
        prometheus.set_targets(JOB_CANARY, [target(JOB_CANARY, server.server_address[1], "kv-canary-6c5b-x")])
        prometheus.wait_for_scrapes(JOB_VLLM, 2)
        prometheus.wait_for_scrapes(JOB_JANITOR, 1)
        prometheus.wait_for_scrapes(JOB_CANARY, 1)
        yield SimpleNamespace(tier=tier, a=a, b=b, janitor_mount=janitor_mount, canary=canary, prometheus=prometheus)
        server.shutdown()
        janitor.terminate()
        janitor.wait(timeout=30)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for replica in started:
            replica.stop()


L2_ALERTS = ("KvCacheL2StoreFailing", "KvCacheL2RetrieveFailing", "KvCacheCrossPodCanaryFailing",
             "KvCacheL2JanitorFailing", "KvCacheL2JanitorStale", "KvCachePodWithoutL2",
             "KvCacheLineL2AboveHighWatermark")


def _until(prometheus: LivePrometheus, step, done, most: int = 8) -> int:
    """Call ``step(i)`` (a request) until ``done()`` holds once Prometheus scraped and evaluated the
    result, at most ``most`` times; how many steps it took. The store alert compares, per pod and
    over 10 minutes, the chunks written with those stored, so it takes a few failing (or, to
    resolve, working) requests to outweigh what the pod stored before in the window."""
    for i in range(1, most + 1):
        step(i)
        prometheus.settle()
        if done():
            return i
    raise AssertionError(f"not done after {most} requests; firing: {[a['labels'] for a in prometheus.alerts()]}")


def _l2_firing(prometheus: LivePrometheus) -> list[dict]:
    return [a["labels"] for a in prometheus.alerts() if a["labels"]["alertname"] in L2_ALERTS]


def test_the_generated_scrape_jobs_label_the_real_targets(live):
    """The generated relabel rules, run by Prometheus on pod-discovery labels: the vLLM series carry
    ``business_line``, ``namespace``, ``pod``, ``l2_cache``; the janitor's and the canary's keep their
    own ``line``/``namespace`` (no target label clashes with them)."""
    up = {s["metric"]["pod"]: s["metric"] for s in live.prometheus.query(f'up{{job="{JOB_VLLM}"}}')}
    assert set(up) == {live.a.name, live.b.name}
    for labels in up.values():
        assert labels["business_line"] == RAG and labels["namespace"] == NS and labels["l2_cache"] == "curvine"
    (stored,) = live.prometheus.query(f'lmcache:num_stored_tokens_total{{job="{JOB_VLLM}",pod="{live.a.name}"}}')
    assert stored["metric"]["worker_id"] == "0" and stored["metric"]["business_line"] == RAG
    (used,) = live.prometheus.query(f'kvcache_l2_janitor_used_bytes{{job="{JOB_JANITOR}"}}')
    assert used["metric"]["line"] == RAG and used["metric"]["namespace"] == NS and "exported_namespace" not in used["metric"]


def test_a_healthy_line_fires_no_l2_alert(live):
    run = live.canary.run_once()
    assert run.result == "measured" and run.ratio == 1.0 and run.exact, run
    _post(live.a, _fresh_prompt(1))
    live.prometheus.settle()
    assert _l2_firing(live.prometheus) == []
    (ratio,) = live.prometheus.query(f'{kv_canary.RATIO_METRIC}{{job="{JOB_CANARY}"}}')
    assert float(ratio["value"][1]) == 1.0


def test_stores_failing_fire_for_that_pod_and_resolve(live):
    """A's temp directory becomes a file: every L2 write of A fails, A still stores into L1."""
    prometheus = live.prometheus
    store_alert = lambda pod: [a for a in prometheus.alerts("KvCacheL2StoreFailing") if a["labels"]["pod"] == pod]
    tmp_dir = json.loads(live.a.env["LMCACHE_EXTRA_CONFIG"])["fs_connector_relative_tmp_dir"]
    line_dir = live.tier.line_dir(RAG)
    (line_dir / tmp_dir).rmdir()
    (line_dir / tmp_dir).write_text("not a directory")
    try:
        _until(prometheus, lambda i: _post(live.a, _fresh_prompt(100 + i)), lambda: store_alert(live.a.name))
        (alert,) = store_alert(live.a.name)
        assert alert["labels"] == {"alertname": "KvCacheL2StoreFailing", "business_line": RAG, "namespace": NS,
                                   "pod": live.a.name, "severity": "warning"}
        assert alert["annotations"]["summary"] == f"{RAG}: {live.a.name} stores KV chunks that do not reach L2"
        assert store_alert(live.b.name) == []
        # LMCache 0.5.5 counts failed puts in a gauge read by a callback (set_function) in the
        # worker process; a multiprocess registry reads files only, so vLLM's /metrics never
        # serves it: why the alert counts chunks instead (docs/observability.md).
        assert prometheus.query(f'lmcache:put_failed_count{{pod="{live.a.name}"}}') == []
        assert prometheus.query(f'lmcache:num_stored_tokens_total{{pod="{live.a.name}"}}')  # the pod is scraped
    finally:
        (line_dir / tmp_dir).unlink()
        (line_dir / tmp_dir).mkdir()
    _until(prometheus, lambda i: _post(live.a, _fresh_prompt(200 + i)), lambda: not store_alert(live.a.name))


def test_the_janitor_failing_fires_and_resolves(live):
    """The janitor's mount point disappears: its passes fail ('not a directory'), then recover."""
    point_mount(live.janitor_mount, live.tier.root.parent / "gone")
    try:
        alert = live.prometheus.wait_for_alert("KvCacheL2JanitorFailing", {"business_line": RAG})
        assert alert["labels"] == {"alertname": "KvCacheL2JanitorFailing", "business_line": RAG, "severity": "warning"}
        assert alert["annotations"]["summary"].startswith(f"{RAG}: the L2 janitor's passes fail (")
        assert live.prometheus.alerts("KvCacheL2JanitorStale") == []  # it still finishes passes
    finally:
        point_mount(live.janitor_mount, live.tier.root)
    live.prometheus.wait_for_resolved("KvCacheL2JanitorFailing", {"business_line": RAG})


def test_a_dead_mount_fails_the_canary_and_the_pods_stores_then_both_resolve(live):
    """B's mount dies: the canary's prompt, computed by A, is not served from L2 on B (ratio 0), and
    B's own writes fail. Both alerts fire; both resolve once the mount is back (the canary's next
    measured run; B's writes outweighing its failed ones in the window)."""
    if live.canary.runs % 2:  # the next run must have A write and B read (the pair rotates)
        assert live.canary.run_once().result == "measured"
    point_mount(live.b.mount, live.tier.root.parent / "gone")
    try:
        run = live.canary.run_once()
        assert (run.writer, run.reader) == (live.a.name, live.b.name)
        assert run.result == "measured" and run.ratio == 0.0 and run.exact and run.writer_chunks_written == 4, run
        alert = live.prometheus.wait_for_alert("KvCacheCrossPodCanaryFailing", {"business_line": RAG})
        assert alert["labels"] == {"alertname": "KvCacheCrossPodCanaryFailing", "business_line": RAG,
                                   "severity": "warning"}
        assert alert["annotations"]["summary"] == f"{RAG}: cross-pod L2 hits of the canary at 0% for 3 runs"
        # B's own stores fail too; the store alert weighs them against what B wrote before in the window.
        _until(live.prometheus, lambda i: _post(live.b, _fresh_prompt(400 + i)),
               lambda: [a for a in live.prometheus.alerts("KvCacheL2StoreFailing") if a["labels"]["pod"] == live.b.name])
    finally:
        point_mount(live.b.mount, live.tier.root)
    run = live.canary.run_once()
    run = run if run.reader == live.b.name else live.canary.run_once()
    assert run.result == "measured" and run.ratio == 1.0, run
    live.prometheus.wait_for_resolved("KvCacheCrossPodCanaryFailing", {"business_line": RAG})
    _until(live.prometheus, lambda i: _post(live.b, _fresh_prompt(300 + i)),
           lambda: not [a for a in live.prometheus.alerts("KvCacheL2StoreFailing") if a["labels"]["pod"] == live.b.name])
