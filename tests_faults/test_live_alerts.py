"""The L2 alerts under real FUSE faults, evaluated by a live Prometheus (issue 16 item 2, the fault tier).

The rig of this module (:func:`tests_faults.harness.start_rig`: the fault file system mounted where
the kubelet keeps a pod's CSI volume, a writer and a reader pod with real LMCache engines, the
node's L2 mount watchdog) is scraped by :class:`tests_lmcache.prometheus.LivePrometheus` through
the generated scrape jobs (each target carrying the pod-discovery labels of the rendered pods) and
the generated rule file (``for:`` 0; promtool proves the ``for:`` windows). The pods' ``/metrics``
is their Prometheus multiprocess directory served as vLLM serves it (``tests_lmcache.scrape --serve``).

* A **dead mount** (the FUSE session answers ENOTCONN, what the kernel gives a dead one): the
  watchdog's next pass reports ``kvcache_l2_mount_up`` 0 and ``KvCacheL2MountDead`` fires with the
  pod's labels; the session back, it resolves.
* **No space** (ENOSPC on writes): the writer's stores fail while it stores on, and
  ``KvCacheL2StoreFailing`` fires for that pod; space back and stores working, it resolves.
* **No watchdog** on the node (its target gone while the node's vLLM pods answer):
  ``KvCacheL2MountWatchdogMissing`` fires for the node; the watchdog back, it resolves.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from cluster_agents import l2_mount_watchdog
from tests_faults import harness
from tests_lmcache.conftest import REPO
from tests_lmcache.prometheus import LivePrometheus

JOB_VLLM, JOB_WATCHDOG = "kvcache-vllm", "kvcache-l2-mount-watchdog"


def _metrics_server(metrics_dir) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "tests_lmcache.scrape", "--serve"], cwd=REPO,
                            env={"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
                            stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


@pytest.fixture(scope="module")
def live(rig, exported, tmp_path_factory):
    base = tmp_path_factory.mktemp("live")
    servers, prometheus = [], None
    try:
        pods = {}
        for role, index in (("writer", 0), ("reader", 1)):
            proc, port = _metrics_server(rig.tier.metrics_dir(harness.LINE, index))
            servers.append(proc)
            pods[role] = (f"{harness.LINE}-5d8f7c9b4-{role}", port)
        watchdog_http = l2_mount_watchdog.make_server(rig.watchdog, 0, host="127.0.0.1")
        threading.Thread(target=watchdog_http.serve_forever, daemon=True).start()
        prometheus = LivePrometheus(base / "prometheus", rule_file=exported["rule_file"],
                                    scrape_config=exported["scrape_config"]).start()
        vllm_meta = exported["lines"][harness.LINE]["scrape_meta"][JOB_VLLM]
        prometheus.set_targets(JOB_VLLM, [(f"127.0.0.1:{port}", {**vllm_meta, "__meta_kubernetes_pod_name": name,
                                                                 "__meta_kubernetes_pod_node_name": harness.NODE})
                                          for name, port in pods.values()])
        watchdog_targets = [(f"127.0.0.1:{watchdog_http.server_address[1]}", {
            **exported["mount_watchdog_scrape_meta"], "__meta_kubernetes_pod_name": "l2-mount-watchdog-x",
            "__meta_kubernetes_pod_node_name": harness.NODE})]
        prometheus.set_targets(JOB_WATCHDOG, watchdog_targets)
        rig.watchdog.run_pass()  # the watchdog serves nothing before its first pass
        prometheus.wait_for_scrapes(JOB_VLLM, 2)
        prometheus.wait_for_scrapes(JOB_WATCHDOG, 1)
        yield SimpleNamespace(prometheus=prometheus, writer=pods["writer"][0], watchdog_targets=watchdog_targets)
        watchdog_http.shutdown()
    finally:
        if prometheus is not None:
            prometheus.stop()
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=30)


def test_a_dead_mount_fires_kvcache_l2_mount_dead_and_resolves(rig, live):
    prometheus = live.prometheus
    prometheus.settle()
    assert prometheus.alerts("KvCacheL2MountDead") == []
    rig.mount.switch("enotconn")
    try:
        (mount,) = rig.watchdog.run_pass().mounts
        assert mount.state == "dead", mount
        alert = prometheus.wait_for_alert("KvCacheL2MountDead", {"node": harness.NODE})
        labels = alert["labels"]
        assert labels["alertname"] == "KvCacheL2MountDead" and labels["severity"] == "warning"
        assert labels["job"] == JOB_WATCHDOG and labels["volume"] == harness.PV_NAME  # the watchdog's own labels
        assert alert["annotations"]["summary"].startswith(f"{labels.get('namespace', '')}/{labels.get('pod', '')} on "
                                                          f"{harness.NODE}: its L2 mount has not answered")
    finally:
        rig.mount.switch("ok")
    (mount,) = rig.watchdog.run_pass().mounts
    assert mount.state == "alive", mount
    prometheus.wait_for_resolved("KvCacheL2MountDead", {"node": harness.NODE})


def test_no_space_fails_the_writers_stores_then_resolves(rig, live):
    prometheus = live.prometheus
    files_dir = str(rig.backing_line_dir())
    firing = lambda: [a for a in prometheus.alerts("KvCacheL2StoreFailing") if a["labels"]["pod"] == live.writer]

    def store(seed: int) -> dict:
        record = rig.writer.act({"op": "store_drain", "prompt": [[seed, harness.PROMPT_TOKENS]], "files_dir": files_dir})
        rig.writer.act({"op": "flush_metrics"})
        return record

    rig.mount.switch("enospc")
    try:
        for seed in range(5000, 5008):
            assert store(seed)["stored_files"] == 0
            prometheus.settle()
            if firing():
                break
        (alert,) = firing()
        assert alert["labels"] == {"alertname": "KvCacheL2StoreFailing", "business_line": harness.LINE,
                                   "namespace": harness.LINE, "pod": live.writer, "severity": "warning"}
    finally:
        rig.mount.switch("ok")
    for seed in range(6000, 6008):
        assert store(seed)["stored_files"] == harness.CHUNKS
        prometheus.settle()
        if not firing():
            break
    assert firing() == []


def test_a_node_without_its_watchdog_fires_kvcache_l2_mount_watchdog_missing_and_resolves(rig, live):
    """The node's vLLM pods answer while its watchdog's target is gone (its pod deleted, crashing or
    unscheduled): the join of the vLLM job's ``node`` with the watchdog's gauge leaves the node;
    the watchdog back and passing, it resolves."""
    prometheus = live.prometheus
    rig.watchdog.run_pass()
    prometheus.settle()
    assert prometheus.alerts("KvCacheL2MountWatchdogMissing") == []
    prometheus.set_targets(JOB_WATCHDOG, [])
    try:
        alert = prometheus.wait_for_alert("KvCacheL2MountWatchdogMissing", {"node": harness.NODE})
        assert alert["labels"] == {"alertname": "KvCacheL2MountWatchdogMissing", "node": harness.NODE,
                                   "severity": "warning"}
        assert alert["annotations"]["summary"] == (f"{harness.NODE} runs vLLM pods of L2 lines with no L2 mount "
                                                   "watchdog passing")
    finally:
        prometheus.set_targets(JOB_WATCHDOG, live.watchdog_targets)
    rig.watchdog.run_pass()
    prometheus.wait_for_resolved("KvCacheL2MountWatchdogMissing", {"node": harness.NODE})
