"""Every alert evaluated by Prometheus' own rule engine: ``promtool check rules`` and ``promtool test rules``.

The rule file is the one the observability stack sends to AMP (the ``Data`` of its
``AWS::APS::RuleGroupsNamespace`` in the synthesized template). AMP takes a rules file "of the same
format as a rules file in standalone Prometheus" and evaluates its PromQL (AMP user guide,
docs/sources.md §20); the engine here is Debian 12's Prometheus 2.42.0.

For every alert (:data:`CASES`, which must cover every alert name of the rule file: a test fails
naming any alert without one) the input series fire it at the right time after its ``for:``, the
nearest healthy series must not, and the expected alerts carry the exact labels and annotations a
receiver gets (summary rendered by Prometheus' templates). A mutated expression is caught
(:func:`test_a_mutated_expression_is_caught`). Per-line alerts are exercised on ``rag-assistant``
(SLO 1,000 ms, ``l2_size`` 500Gi, 256-token chunks, canary every 5 minutes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from cluster_agents.kv_canary import VLLM_TTFT_BUCKETS, format_le
from k8s.fuse_pod_guard import FUSE_POD_DELETES_ADMITTED, FUSE_POD_GUARD
from observability import targets
from tests.observability import promtool
from tests.observability.promtool import expect, series

LINE = "rag-assistant"
NS = "rag-assistant"
VLLM = {"job": targets.JOB_VLLM, "business_line": LINE, "namespace": NS}
MASTER = {"job": targets.JOB_CURVINE_MASTER, "instance": "10.0.0.5:9001"}
KYVERNO = {"job": targets.JOB_KYVERNO, "instance": "10.0.0.6:8000"}
JANITOR = {"job": targets.JOB_L2_JANITOR, "line": LINE, "namespace": NS}
CANARY = {"job": targets.JOB_KV_CANARY, "line": LINE, "namespace": NS}


def pod(name: str, **extra: str) -> dict[str, str]:
    """Labels of one rank-0 LMCache series of a vLLM pod of the line."""
    return {**VLLM, "pod": name, "worker_id": "0", **extra}


def ttft_buckets(name: str, labels: dict[str, str], per_minute: dict[float, int], minutes: int) -> list[dict[str, str]]:
    """Histogram bucket series of ``name``: ``per_minute`` requests a minute land in each bound (vLLM's buckets)."""
    out, cumulative = [], 0
    for bound in (*VLLM_TTFT_BUCKETS, float("inf")):
        cumulative += per_minute.get(bound, 0)
        out.append(series(f"{name}_bucket", {**labels, "le": format_le(bound)}, f"0+{cumulative}x{minutes}"))
    return out


# --- the cases: one function per alert, returning promtool test groups (input + expected) ----------


def _pool_full(ann) -> list[dict[str, Any]]:
    fires = {"interval": "1m", "input_series": [series("fs_used", MASTER, "900x30"), series("capacity", MASTER, "1000x30")],
             "alert_rule_test": [expect("KvCacheCurvinePoolAlmostFull", "14m", []),
                                 expect("KvCacheCurvinePoolAlmostFull", "16m",
                                        [({"severity": "critical"}, ann("Curvine L2 pool above 85%: 90%"))])]}
    at_threshold = {"interval": "1m", "input_series": [series("fs_used", MASTER, "850x30"), series("capacity", MASTER, "1000x30")],
                    "alert_rule_test": [expect("KvCacheCurvinePoolAlmostFull", "30m", [])]}
    return [fires, at_threshold]


def _primary_down(ann) -> list[dict[str, Any]]:
    # absent() of a comparison, not of a bare selector, carries no label of the selector.
    labels = {"severity": "critical"}
    fires = {"interval": "1m", "input_series": [series("up", MASTER, "1x4 0x20")],
             "alert_rule_test": [expect("KvCacheCurvinePrimaryDown", "6m", []),
                                 expect("KvCacheCurvinePrimaryDown", "8m", [(labels, ann())])]}
    # One of two Primaries' targets down (a rolling restart) is not the Primary down.
    healthy = {"interval": "1m", "input_series": [series("up", MASTER, "1x20"),
                                                  series("up", {**MASTER, "instance": "10.0.0.7:9001"}, "0x20")],
               "alert_rule_test": [expect("KvCacheCurvinePrimaryDown", "15m", [])]}
    return [fires, healthy]


def _workers_lost(ann) -> list[dict[str, Any]]:
    fires = {"interval": "1m", "input_series": [series("worker_num", {**MASTER, "tag": "lost"}, "0x4 1x20"),
                                                series("worker_num", {**MASTER, "tag": "live"}, "3x25")],
             "alert_rule_test": [expect("KvCacheCurvineWorkersLost", "9m", []),
                                 expect("KvCacheCurvineWorkersLost", "11m",
                                        [({"severity": "warning"}, ann("Curvine reports 1 lost Worker(s)"))])]}
    healthy = {"interval": "1m", "input_series": [series("worker_num", {**MASTER, "tag": "lost"}, "0x20"),
                                                  series("worker_num", {**MASTER, "tag": "decommission"}, "2x20")],
               "alert_rule_test": [expect("KvCacheCurvineWorkersLost", "15m", [])]}
    return [fires, healthy]


def _webhook_down(ann) -> list[dict[str, Any]]:
    labels = {"severity": "critical"}
    fires = {"interval": "1m", "input_series": [series("up", KYVERNO, "1x4 0x20")],
             "alert_rule_test": [expect("KvCacheAdmissionWebhookDown", "9m", []),
                                 expect("KvCacheAdmissionWebhookDown", "11m", [(labels, ann())])]}
    healthy = {"interval": "1m", "input_series": [series("up", KYVERNO, "1x20"),
                                                  series("up", {**KYVERNO, "instance": "10.0.0.8:8000"}, "0x20")],
               "alert_rule_test": [expect("KvCacheAdmissionWebhookDown", "15m", [])]}
    return [fires, healthy]


def _admission_failing(ann) -> list[dict[str, Any]]:
    base = {"job": targets.JOB_KYVERNO, "resource_kind": "Pod", "resource_request_operation": "CREATE"}
    denied = series("kyverno_admission_requests_total", {**base, "request_allowed": "false",
                                                          "resource_namespace": NS}, "0+3x20")
    fires = {"interval": "1m", "input_series": [denied],
             "alert_rule_test": [expect("KvCacheAdmissionFailing", "5m", []),
                                 expect("KvCacheAdmissionFailing", "7m", [(
                                     {"severity": "critical", "resource_namespace": NS},
                                     ann(f"Kyverno refuses or fails pod admission in {NS}"))])]}
    # Denials elsewhere, and admissions allowed in the line's namespace, are not ours.
    healthy = {"interval": "1m", "input_series": [
        series("kyverno_admission_requests_total", {**base, "request_allowed": "false", "resource_namespace": "other"},
               "0+3x20"),
        series("kyverno_admission_requests_total", {**base, "request_allowed": "true", "resource_namespace": NS},
               "0+3x20")],
        "alert_rule_test": [expect("KvCacheAdmissionFailing", "15m", [])]}
    return [fires, healthy]


def _pod_without_l2(ann) -> list[dict[str, Any]]:
    fires = {"interval": "1m", "input_series": [series("up", {**VLLM, "pod": "rag-7d9-a"}, "1x20")],
             "alert_rule_test": [expect("KvCachePodWithoutL2", "4m", []),
                                 expect("KvCachePodWithoutL2", "6m", [(
                                     {"severity": "warning", "business_line": LINE, "namespace": NS, "pod": "rag-7d9-a"},
                                     ann(f"rag-7d9-a ({LINE}) runs without the L2 patch"))])]}
    healthy = {"interval": "1m", "input_series": [
        series("up", {**VLLM, "pod": "rag-7d9-b", targets.L2_CACHE_TARGET_LABEL: "curvine"}, "1x20"),
        # A line without L2 has no patch to lack.
        series("up", {**VLLM, "business_line": "legal-search", "namespace": "legal-search", "pod": "l"}, "1x20")],
        "alert_rule_test": [expect("KvCachePodWithoutL2", "15m", [])]}
    return [fires, healthy]


def _ttft(ann) -> list[dict[str, Any]]:
    name = "vllm:time_to_first_token_seconds"
    slow = ttft_buckets(name, VLLM, {2.5: 10}, 30)  # every request between 1 s and 2.5 s: p90 2.35 s
    fires = {"interval": "1m", "input_series": slow,
             "alert_rule_test": [expect("KvCacheTtftP90OverSlo", "10m", []),
                                 expect("KvCacheTtftP90OverSlo", "12m", [(
                                     {"severity": "critical", "business_line": LINE},
                                     ann(f"{LINE}: TTFT p90 2.35s over its SLO of 1000 ms"))])]}
    fast = {"interval": "1m", "input_series": ttft_buckets(name, VLLM, {0.75: 9, 2.5: 1}, 30),
            "alert_rule_test": [expect("KvCacheTtftP90OverSlo", "20m", [])]}
    # The same slow requests, all the canary's own (in vLLM's histogram and in the canary's): no
    # user request is slow, so nothing fires (the SLO leaves the canary out).
    canary_only = {"interval": "1m", "input_series": slow + ttft_buckets(
        "kvcache_canary_request_ttft_seconds", CANARY, {2.5: 10}, 30),
        "alert_rule_test": [expect("KvCacheTtftP90OverSlo", "20m", [])]}
    return [fires, fast, canary_only]


def _hot_spot(ann) -> list[dict[str, Any]]:
    """rag-assistant (up to 2 replicas here): a replica over 1.5x its fair share of prompt tokens for 30 minutes."""
    tokens = "vllm:prompt_tokens_total"
    # prefixaware on a shared system prompt: one replica gets 90% of the prompt tokens (9,000 a minute vs 1,000).
    hot = [series(tokens, {**VLLM, "pod": "rag-7d9-a"}, "0+9000x60"),
           series(tokens, {**VLLM, "pod": "rag-7d9-b"}, "0+1000x60")]
    fires = {"interval": "1m", "input_series": hot,
             "alert_rule_test": [expect("KvCacheReplicaHotSpot", "29m", []),
                                 expect("KvCacheReplicaHotSpot", "33m", [(
                                     {"severity": "warning", "business_line": LINE, "pod": "rag-7d9-a"},
                                     ann(f"{LINE}: rag-7d9-a takes 90% of the line's prompt tokens"))])]}
    # 70% on one of two replicas (under 1.5 x 50%); a line of one replica (its share 1 < 1.5).
    uneven = [series(tokens, {**VLLM, "pod": "rag-7d9-a"}, "0+7000x60"),
              series(tokens, {**VLLM, "pod": "rag-7d9-b"}, "0+3000x60")]
    healthy = {"interval": "1m", "input_series": uneven,
               "alert_rule_test": [expect("KvCacheReplicaHotSpot", "45m", [])]}
    one = {"interval": "1m", "input_series": [series(tokens, {**VLLM, "pod": "rag-7d9-a"}, "0+9000x60")],
           "alert_rule_test": [expect("KvCacheReplicaHotSpot", "45m", [])]}
    # A hot spot that ends: the second replica takes over half the traffic after 20 minutes.
    ends = {"interval": "1m", "input_series": [series(tokens, {**VLLM, "pod": "rag-7d9-a"}, "0+9000x20 180000+5000x40"),
                                               series(tokens, {**VLLM, "pod": "rag-7d9-b"}, "0+1000x20 20000+5000x40")],
            "alert_rule_test": [expect("KvCacheReplicaHotSpot", "30m", []), expect("KvCacheReplicaHotSpot", "35m", []),
                                expect("KvCacheReplicaHotSpot", "50m", [])]}
    return [fires, healthy, one, ends]


def _watermark(ann) -> list[dict[str, Any]]:
    size = 500 * 2**30
    fires = {"interval": "1m", "input_series": [series("kvcache_l2_janitor_used_bytes", JANITOR, f"{int(0.9 * size)}x40")],
             "alert_rule_test": [expect("KvCacheLineL2AboveHighWatermark", "29m", []),
                                 expect("KvCacheLineL2AboveHighWatermark", "31m", [(
                                     {"severity": "warning", "business_line": LINE},
                                     ann(f"{LINE}: L2 directory above 80% of its l2_size 500Gi"))])]}
    at_mark = {"interval": "1m", "input_series": [series("kvcache_l2_janitor_used_bytes", JANITOR, f"{int(0.8 * size)}x40")],
               "alert_rule_test": [expect("KvCacheLineL2AboveHighWatermark", "40m", [])]}
    return [fires, at_mark]


def _janitor_stale(ann) -> list[dict[str, Any]]:
    metric = "kvcache_l2_janitor_last_run_timestamp_seconds"
    labels = {"severity": "warning", "business_line": LINE}
    # Its last pass finished at t=0 and it was scraped for 10 more minutes, then vanished: stale
    # after 30 minutes, firing 5 minutes later; the summary says how long ago.
    fires = {"interval": "1m", "input_series": [series(metric, JANITOR, "0x10")],
             "alert_rule_test": [expect("KvCacheL2JanitorStale", "34m", []),
                                 expect("KvCacheL2JanitorStale", "40m", [(labels, ann(
                                     f"{LINE}: the L2 janitor's last pass finished 40m 0s ago"))])]}
    # A pass every 10 minutes (the gauge holds the finish time of the last one).
    passes = " ".join(f"{600 * k}x9" for k in range(6))
    healthy = {"interval": "1m", "input_series": [series(metric, JANITOR, passes)],
               "alert_rule_test": [expect("KvCacheL2JanitorStale", "55m", [])]}
    return [fires, healthy]


def _janitor_failing(ann) -> list[dict[str, Any]]:
    fires = {"interval": "1m", "input_series": [series("kvcache_l2_janitor_errors", JANITOR, "1x30")],
             "alert_rule_test": [expect("KvCacheL2JanitorFailing", "19m", []),
                                 expect("KvCacheL2JanitorFailing", "21m", [(
                                     {"severity": "warning", "business_line": LINE},
                                     ann(f"{LINE}: the L2 janitor's passes fail (1 error(s) in the last one)"))])]}
    # Two failed passes (20 minutes of errors less one scrape), then a good one.
    healthy = {"interval": "1m", "input_series": [series("kvcache_l2_janitor_errors", JANITOR, "1x18 0x10")],
               "alert_rule_test": [expect("KvCacheL2JanitorFailing", "25m", [])]}
    return [fires, healthy]


def _store_failing(ann) -> list[dict[str, Any]]:
    p = pod("rag-7d9-a")
    stores = [series("lmcache:num_stored_tokens_total", p, "0+1124x30"),  # 4 full chunks + 100 a minute
              series("lmcache:num_store_requests_total", p, "0+1x30")]   # i.e. at least 3.39 chunks due
    firing = [({"severity": "warning", "business_line": LINE, "namespace": NS, "pod": "rag-7d9-a"},
               ann(f"{LINE}: rag-7d9-a stores KV chunks that do not reach L2"))]
    none_written = {"interval": "1m", "input_series": stores + [
        series("lmcache:num_remote_write_requests_total", p, "0x30")],
        "alert_rule_test": [expect("KvCacheL2StoreFailing", "10m", []), expect("KvCacheL2StoreFailing", "12m", firing)]}
    # One write a minute of 3.39 due: most lost (say one of two Curvine paths fails), and a pod
    # that never had the counter (its remote backend never connected).
    most_lost = {"interval": "1m", "input_series": stores + [
        series("lmcache:num_remote_write_requests_total", p, "0+1x30")],
        "alert_rule_test": [expect("KvCacheL2StoreFailing", "12m", firing)]}
    no_counter = {"interval": "1m", "input_series": stores,
                  "alert_rule_test": [expect("KvCacheL2StoreFailing", "12m", firing)]}
    writes = {"interval": "1m", "input_series": stores + [
        series("lmcache:num_remote_write_requests_total", p, "0+4x30")],
        "alert_rule_test": [expect("KvCacheL2StoreFailing", "25m", [])]}
    # Two of 3.39 a minute written (duplicates skipped in flight, a full CPU buffer): not a fault.
    some_lost = {"interval": "1m", "input_series": stores + [
        series("lmcache:num_remote_write_requests_total", p, "0+2x30")],
        "alert_rule_test": [expect("KvCacheL2StoreFailing", "25m", [])]}
    # Short prompts: every request's tokens fit in its unstored tail, so no chunk was due.
    tails_only = {"interval": "1m", "input_series": [
        series("lmcache:num_stored_tokens_total", p, "0+200x30"), series("lmcache:num_store_requests_total", p, "0+1x30"),
        series("lmcache:num_remote_write_requests_total", p, "0x30")],
        "alert_rule_test": [expect("KvCacheL2StoreFailing", "25m", [])]}
    return [none_written, most_lost, no_counter, writes, some_lost, tails_only]


def _retrieve_failing(ann) -> list[dict[str, Any]]:
    p = pod("rag-7d9-b")
    fires = {"interval": "1m", "input_series": [
        series("lmcache:num_requested_tokens_total", p, "0+1024x40"), series("lmcache:num_hit_tokens_total", p, "0+512x40")],
        "alert_rule_test": [expect("KvCacheL2RetrieveFailing", "10m", []),
                            expect("KvCacheL2RetrieveFailing", "25m", [(
                                {"severity": "warning", "business_line": LINE, "namespace": NS, "pod": "rag-7d9-b"},
                                ann(f"{LINE}: rag-7d9-b fails to load 5.12k KV tokens it found"))])]}
    healthy = {"interval": "1m", "input_series": [
        series("lmcache:num_requested_tokens_total", p, "0+1024x40"), series("lmcache:num_hit_tokens_total", p, "0+1024x40"),
        # Less than a chunk missed per 10 minutes in another pod (a lookup-retrieve race): not a fault.
        series("lmcache:num_requested_tokens_total", pod("rag-7d9-c"), "0+1024x40"),
        series("lmcache:num_hit_tokens_total", pod("rag-7d9-c"), "0+1014x40")],
        "alert_rule_test": [expect("KvCacheL2RetrieveFailing", "30m", [])]}
    return [fires, healthy]


def _canary(ann) -> list[dict[str, Any]]:
    metric = "kvcache_canary_cross_pod_hit_ratio"
    labels = {"severity": "warning", "business_line": LINE}
    fires = {"interval": "1m", "input_series": [series(metric, CANARY, "0x20")],
             "alert_rule_test": [expect("KvCacheCrossPodCanaryFailing", "9m", []),
                                 expect("KvCacheCrossPodCanaryFailing", "11m", [(labels, ann(
                                     f"{LINE}: cross-pod L2 hits of the canary at 0% for 3 runs"))])]}
    # Two low runs, then a good one; and a line whose canary exports no ratio (one replica).
    healthy = {"interval": "1m", "input_series": [series(metric, CANARY, "0x8 1x12")],
               "alert_rule_test": [expect("KvCacheCrossPodCanaryFailing", "15m", [])]}
    one_replica = {"interval": "1m", "input_series": [
        series("kvcache_canary_replicas", CANARY, "1x20")],
        "alert_rule_test": [expect("KvCacheCrossPodCanaryFailing", "15m", [])]}
    return [fires, healthy, one_replica]


def _hit_rate_collapsed(ann) -> list[dict[str, Any]]:
    rank0 = {**VLLM, "pod": "rag-7d9-a", "worker_id": "0"}
    prompts = series("vllm:prompt_tokens_total", {**VLLM, "pod": "rag-7d9-a"}, "0+1000x430")
    # 2 chunks (512 tokens) of every 1,000 prompt tokens from L2 for 6 h 15 min, then none.
    reads = series("lmcache:num_remote_read_requests_total", rank0, "0+2x375 750x55")
    labels = {"severity": "warning", "business_line": LINE}
    fires = {"interval": "1m", "input_series": [prompts, reads],
             "alert_rule_test": [expect("KvCacheL2HitRateCollapsed", "400m", []),
                                 expect("KvCacheL2HitRateCollapsed", "425m", [(labels, ann(
                                     f"{LINE}: L2 hit rate fell below 50% of its 6-hour level"))])]}
    # The same drop because traffic stopped: a change of traffic, not a collapse.
    quiet = {"interval": "1m", "input_series": [
        series("vllm:prompt_tokens_total", {**VLLM, "pod": "rag-7d9-a"}, "0+1000x375 375000x55"), reads],
        "alert_rule_test": [expect("KvCacheL2HitRateCollapsed", "425m", [])]}
    return [fires, quiet]


def _mount_dead(ann) -> list[dict[str, Any]]:
    """The per-node L2 mount watchdog's signal (issue 15): healing normally ends within the hold."""
    mount = {"job": targets.JOB_L2_MOUNT_WATCHDOG, "namespace": NS, "pod": "rag-7d9-a", "node": "hyperpod-i-0abc",
             "volume": "pvc-1234", "pod_uid": "0b9c"}
    fires = {"interval": "1m", "input_series": [series("kvcache_l2_mount_up", mount, "1x4 0x30")],
             "alert_rule_test": [expect("KvCacheL2MountDead", "25m", []),
                                 expect("KvCacheL2MountDead", "27m", [({"severity": "warning", **mount}, ann(
                                     f"{NS}/rag-7d9-a on hyperpod-i-0abc: its L2 mount has not answered for 21 minutes"))])]}
    # Dead for 10 minutes, then the watchdog's eviction replaced the pod (alive again).
    healed = {"interval": "1m", "input_series": [series("kvcache_l2_mount_up", mount, "1x4 0x10 1x20"),
                                                 series("kvcache_l2_mount_up", {**mount, "pod": "rag-7d9-b"}, "1x35")],
              "alert_rule_test": [expect("KvCacheL2MountDead", "30m", [])]}
    return [fires, healed]


def _watchdog_missing(ann) -> list[dict[str, Any]]:
    """A node with L2 vLLM pods and no watchdog passing there: absent, or present but stalled."""
    watchdog = {"job": targets.JOB_L2_MOUNT_WATCHDOG}
    last_pass = "kvcache_l2_mount_watchdog_last_pass_timestamp_seconds"

    def vllm_up(node: str, values: str = "1x40", **extra: str) -> dict[str, str]:
        return series("up", {**VLLM, "pod": f"rag-{node}", "node": node, **extra}, values)

    def passing(node: str, values: str = "0+60x40") -> dict[str, str]:  # a pass every minute: value = time()
        return series(last_pass, {**watchdog, "node": node}, values)

    def firing(node: str) -> list[tuple[dict[str, str], dict[str, str]]]:
        return [({"severity": "warning", "node": node},
                 ann(f"{node} runs vLLM pods of L2 lines with no L2 mount watchdog passing"))]

    # hyperpod-b's watchdog never ran (hyperpod-a's does): pending from the start, firing after 10 min.
    absent = {"interval": "1m", "input_series": [vllm_up("hyperpod-a"), passing("hyperpod-a"), vllm_up("hyperpod-b")],
              "alert_rule_test": [expect("KvCacheL2MountWatchdogMissing", "9m", []),
                                  expect("KvCacheL2MountWatchdogMissing", "11m", firing("hyperpod-b"))]}
    # Its last pass finished at 4 min and it is still scraped: stale (150 s, 5 periods) from 6.5 min,
    # so pending at 7 min and firing at 17.
    stalled = {"interval": "1m", "input_series": [vllm_up("hyperpod-a"), passing("hyperpod-a", "0+60x4 240x36")],
               "alert_rule_test": [expect("KvCacheL2MountWatchdogMissing", "16m", []),
                                   expect("KvCacheL2MountWatchdogMissing", "18m", firing("hyperpod-a"))]}
    # Watched nodes; a line without L2 (nothing to watch); a vLLM pod that does not answer yet.
    healthy = {"interval": "1m", "input_series": [
        vllm_up("hyperpod-a"), passing("hyperpod-a"),
        vllm_up("hyperpod-c", business_line="legal-search", namespace="legal-search"),
        vllm_up("hyperpod-d", "0x40")],
        "alert_rule_test": [expect("KvCacheL2MountWatchdogMissing", "30m", [])]}
    return [absent, stalled, healthy]


def _hot_prefix_warmups_failing(ann) -> list[dict[str, Any]]:
    """Warm-ups of a declared prefix failing (error, too_long) with none succeeding, past one warm-up
    period (60 min) and its 5-minute slack: two rounds in a row, not one."""
    prefix = {**JANITOR, "prefix": "system-prompt"}

    def warmups(result: str, values: str) -> dict[str, str]:
        return series("kvcache_hot_prefix_warmups_total", {**prefix, "result": result}, values)

    firing = [({"severity": "warning", "business_line": LINE, "prefix": "system-prompt"},
               ann(f"{LINE}: the warm-ups of hot prefix system-prompt keep failing"))]
    # Rounds at 10 and 70 min fail (the replicas refuse): pending from 10 min, firing at 75.
    failing = {"interval": "1m", "input_series": [warmups("error", "0x10 1x60 2x120"), warmups("stored", "0x190")],
               "alert_rule_test": [expect("KvCacheHotPrefixWarmupFailing", "74m", []),
                                   expect("KvCacheHotPrefixWarmupFailing", "76m", firing)]}
    # A prefix longer than the model's context fails every round the same way.
    too_long = {"interval": "1m", "input_series": [warmups("too_long", "0x10 1x60 2x60 3x60"), warmups("in_l2", "0x190")],
                "alert_rule_test": [expect("KvCacheHotPrefixWarmupFailing", "76m", firing)]}
    # One failed round, the next one stores; and every round answered from the replicas' CPU
    # buffers (not_stored, partial: L2 lacks chunks that no user misses) is not a failure.
    recovered = {"interval": "1m", "input_series": [warmups("error", "0x10 1x180"), warmups("stored", "0x70 1x120")],
                 "alert_rule_test": [expect("KvCacheHotPrefixWarmupFailing", "74m", []),
                                     expect("KvCacheHotPrefixWarmupFailing", "150m", [])]}
    l1_held = {"interval": "1m", "input_series": [warmups("not_stored", "0x10 1x60 2x60 3x60"),
                                                  warmups("partial", "0x40 1x150"), warmups("error", "0x190")],
               "alert_rule_test": [expect("KvCacheHotPrefixWarmupFailing", "180m", [])]}
    return [failing, too_long, recovered, l1_held]


def _hot_prefix_names(ann) -> list[dict[str, Any]]:
    metric = "kvcache_hot_prefix_names_ok"
    fires = {"interval": "1m", "input_series": [series(metric, JANITOR, "1x3 0x20")],
             "alert_rule_test": [expect("KvCacheHotPrefixNamesMismatch", "7m", []),
                                 expect("KvCacheHotPrefixNamesMismatch", "9m", [(
                                     {"severity": "warning", "business_line": LINE},
                                     ann(f"{LINE}: the janitor cannot pin the hot prefixes (their chunk names "
                                         "are not LMCache's)"))])]}
    # A janitor that has not self-checked yet exports no gauge; one that has, 1.
    healthy = {"interval": "1m", "input_series": [series(metric, JANITOR, "_x5 1x20")],
               "alert_rule_test": [expect("KvCacheHotPrefixNamesMismatch", "25m", [])]}
    return [fires, healthy]


APISERVER = {"job": targets.JOB_APISERVER, "instance": "10.0.1.10:443"}
GUARD_CHECKS = "apiserver_validating_admission_policy_check_total"


def _guard_check(policy: str, action: str, error_type: str = "no_error") -> dict[str, str]:
    return {**APISERVER, "policy": policy, "policy_binding": policy, "error_type": error_type,
            "enforcement_action": action}


def _fuse_pod_replaced(ann) -> list[dict[str, Any]]:
    """Deletes the FUSE pod guard admitted, counted by its warn-only twin (issue 24 item 4)."""
    admitted = _guard_check(FUSE_POD_DELETES_ADMITTED, "warn")
    refused = series(GUARD_CHECKS, _guard_check(FUSE_POD_GUARD, "deny"), "0+1x60")

    def firing(n: int) -> list[tuple[dict[str, str], dict[str, str]]]:
        return [({"severity": "warning"}, ann(f"The Curvine CSI node plugin deleted {n} FUSE pod(s) in the last 15m"))]

    # The first admitted delete since the API server started: its series appears at 1 (increase()
    # alone would see nothing); pending at 10 min, firing at 12, gone 15 min after the event; a
    # second delete at 40 min fires again.
    first = {"interval": "1m", "input_series": [series(GUARD_CHECKS, admitted, "_x10 1x30 2x20"), refused],
             "alert_rule_test": [expect("KvCacheFusePodReplaced", "11m", []),
                                 expect("KvCacheFusePodReplaced", "13m", firing(1)),
                                 expect("KvCacheFusePodReplaced", "27m", []),
                                 expect("KvCacheFusePodReplaced", "43m", firing(1))]}
    # Refusals only, an old admission long before the window, and an evaluation error of the
    # counting policy (not an admitted delete): quiet.
    quiet = {"interval": "1m", "input_series": [
        series(GUARD_CHECKS, admitted, "1x60"), refused,
        series(GUARD_CHECKS, _guard_check(FUSE_POD_DELETES_ADMITTED, "allow", "invalid_error"), "_x10 1x50")],
        "alert_rule_test": [expect("KvCacheFusePodReplaced", "30m", [])]}
    return [first, quiet]


def _fuse_pod_guard_failing(ann) -> list[dict[str, Any]]:
    failing = _guard_check(FUSE_POD_GUARD, "deny", "invalid_error")
    labels = {"severity": "critical", "policy": FUSE_POD_GUARD, "error_type": "invalid_error"}
    fires = {"interval": "1m", "input_series": [series(GUARD_CHECKS, failing, "_x5 1+1x30")],
             "alert_rule_test": [expect("KvCacheFusePodGuardFailing", "6m", []),
                                 expect("KvCacheFusePodGuardFailing", "8m", [(labels, ann(
                                     f"The FUSE pod guard's policy {FUSE_POD_GUARD} fails to evaluate (invalid_error)"))])]}
    # The guard refusing (its job) and admitting: no error.
    healthy = {"interval": "1m", "input_series": [
        series(GUARD_CHECKS, _guard_check(FUSE_POD_GUARD, "deny"), "0+1x30"),
        series(GUARD_CHECKS, _guard_check(FUSE_POD_DELETES_ADMITTED, "warn"), "_x5 1x25")],
        "alert_rule_test": [expect("KvCacheFusePodGuardFailing", "20m", [])]}
    return [fires, healthy]


def _fuse_pod_guard_unmeasured(ann) -> list[dict[str, Any]]:
    down = {"interval": "1m", "input_series": [series("up", APISERVER, "0x30")],
            "alert_rule_test": [expect("KvCacheFusePodGuardUnmeasured", "14m", []),
                                expect("KvCacheFusePodGuardUnmeasured", "16m", [({"severity": "warning"}, ann())])]}
    # Two API servers, one answering.
    up = {"interval": "1m", "input_series": [series("up", APISERVER, "1x30"),
                                             series("up", {**APISERVER, "instance": "10.0.2.10:443"}, "0x30")],
          "alert_rule_test": [expect("KvCacheFusePodGuardUnmeasured", "20m", [])]}
    return [down, up]


#: alertname -> its promtool test groups (given a function that completes the annotations).
CASES: dict[str, Callable[[Callable[..., dict[str, str]]], list[dict[str, Any]]]] = {
    "KvCacheCurvinePoolAlmostFull": _pool_full,
    "KvCacheCurvinePrimaryDown": _primary_down,
    "KvCacheCurvineWorkersLost": _workers_lost,
    "KvCacheAdmissionWebhookDown": _webhook_down,
    "KvCacheAdmissionFailing": _admission_failing,
    "KvCachePodWithoutL2": _pod_without_l2,
    "KvCacheTtftP90OverSlo": _ttft,
    "KvCacheReplicaHotSpot": _hot_spot,
    "KvCacheLineL2AboveHighWatermark": _watermark,
    "KvCacheL2JanitorStale": _janitor_stale,
    "KvCacheL2JanitorFailing": _janitor_failing,
    "KvCacheL2StoreFailing": _store_failing,
    "KvCacheL2RetrieveFailing": _retrieve_failing,
    "KvCacheCrossPodCanaryFailing": _canary,
    "KvCacheL2HitRateCollapsed": _hit_rate_collapsed,
    "KvCacheL2MountDead": _mount_dead,
    "KvCacheL2MountWatchdogMissing": _watchdog_missing,
    "KvCacheHotPrefixWarmupFailing": _hot_prefix_warmups_failing,
    "KvCacheHotPrefixNamesMismatch": _hot_prefix_names,
    "KvCacheFusePodReplaced": _fuse_pod_replaced,
    "KvCacheFusePodGuardFailing": _fuse_pod_guard_failing,
    "KvCacheFusePodGuardUnmeasured": _fuse_pod_guard_unmeasured,
}


@pytest.fixture(scope="module")
def rule_file(obs_project, templates, tmp_path_factory) -> Path:
    """The rule file exactly as the observability stack sends it to AMP (its template's ``Data``)."""
    stack = templates[f"{obs_project.platform.project}-observability"]
    (namespace,) = stack.find_resources("AWS::APS::RuleGroupsNamespace").values()
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(namespace["Properties"]["Data"], encoding="utf-8")
    return path


def rules_by_name(rule_file: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for group in yaml.safe_load(rule_file.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            out.setdefault(rule["alert"], []).append(rule)
    return out


def annotations_of(rule_file: Path, alertname: str) -> Callable[..., dict[str, str]]:
    """``ann(summary=None)``: the rule's annotations with ``summary`` as Prometheus renders it (the
    rule of ``rag-assistant`` for per-line alerts; description and runbook are not templated)."""
    rules = rules_by_name(rule_file)[alertname]
    rule = next((r for r in rules if r["labels"].get("business_line") == LINE), rules[0])

    def ann(summary: str | None = None) -> dict[str, str]:
        out = dict(rule["annotations"])
        if summary is not None:
            out["summary"] = summary
        assert "{{" not in out["summary"], f"{alertname}: give the rendered summary"
        return out

    return ann


def unit_tests(rule_file: Path, names: list[str]) -> dict[str, Any]:
    """A ``promtool test rules`` file of the cases of ``names`` against ``rule_file``."""
    tests = [t for name in names for t in CASES[name](annotations_of(rule_file, name))]
    return {"rule_files": [rule_file.name], "evaluation_interval": "1m", "tests": tests}


def test_the_rule_file_passes_promtool_check_rules(rule_file) -> None:
    result = promtool.promtool(["check", "rules", rule_file.name], cwd=rule_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(r) for r in rules_by_name(rule_file).values())} rules found" in result.stdout
    assert promtool.version().startswith("promtool, version 2.")  # Debian 12's is 2.42.0 (docs/observability.md)


def test_every_alert_of_the_rule_file_has_a_promtool_test(rule_file) -> None:
    """An alert added to observability/alerts.py without a case in :data:`CASES` fails here, by name."""
    untested = sorted(set(rules_by_name(rule_file)) - set(CASES))
    assert not untested, f"alerts without a promtool test (add them to tests/observability/test_promtool.py CASES): {untested}"
    assert not set(CASES) - set(rules_by_name(rule_file)), "a case for an alert the rule file does not have"


@pytest.mark.parametrize("alertname", sorted(CASES))
def test_promtool_test_rules(rule_file, alertname) -> None:
    """The alert fires when it should (after its ``for:``), stays quiet on the nearest healthy input,
    and carries the labels and annotations a receiver gets."""
    tests = promtool.write_yaml(rule_file.parent / f"test-{alertname}.yaml", unit_tests(rule_file, [alertname]))
    result = promtool.promtool(["test", "rules", tests.name], cwd=rule_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


#: One mutation per kind of mistake: a flipped comparison, a wrong join, a lost threshold.
MUTATIONS = [
    ("KvCacheL2StoreFailing", ") > 0.5 * ", ") < 0.5 * "),
    ("KvCacheCrossPodCanaryFailing", "< 0.5", "<= 1"),
    ("KvCacheCurvinePrimaryDown", "== 1)", "== 0)"),
    ("KvCacheL2MountWatchdogMissing", "unless on (node)", "and on (node)"),
    ("KvCacheHotPrefixWarmupFailing", "unless on (prefix)", "or on (prefix)"),
    ("KvCacheFusePodReplaced", " unless ", " and "),
    ("KvCacheReplicaHotSpot", " > 1.5 / ", " > 0.5 / "),
]


@pytest.mark.parametrize(("alertname", "old", "new"), MUTATIONS)
def test_a_mutated_expression_is_caught(rule_file, tmp_path, alertname, old, new) -> None:
    """The same tests on a rule file with one expression of ``alertname`` mutated fail, naming it."""
    data = yaml.safe_load(rule_file.read_text(encoding="utf-8"))
    mutated = 0
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alertname and old in rule["expr"]:
                rule["expr"] = rule["expr"].replace(old, new)
                mutated += 1
    assert mutated, f"{old!r} not in {alertname}"
    mutant = promtool.write_yaml(tmp_path / rule_file.name, data)
    assert promtool.promtool(["check", "rules", mutant.name], cwd=tmp_path).returncode == 0  # still valid PromQL
    tests = promtool.write_yaml(tmp_path / "tests.yaml", unit_tests(rule_file, [alertname]))
    result = promtool.promtool(["test", "rules", tests.name], cwd=tmp_path)
    assert result.returncode != 0, f"mutation {old!r} -> {new!r} of {alertname} was not caught"
    assert f"alertname: {alertname}" in result.stdout + result.stderr


def test_the_scrape_configuration_passes_promtool_check_config(scrape_config, tmp_path) -> None:
    """``promtool check config`` on the scraper's configuration, as far as Debian's Prometheus can:
    it is built without Kubernetes discovery, so it rejects exactly the ``kubernetes_sd_configs``
    blocks, and nothing else; with file discovery in their place every job, relabel rule and
    interval passes. What is left unchecked by Prometheus here is the Kubernetes discovery itself
    (role ``pod``, namespaces): ``tests/observability/test_targets.py`` checks it against the charts'
    pods, and the live Prometheus of the real-LMCache tier runs the same relabel rules on targets
    carrying Kubernetes' meta labels."""
    raw = promtool.write_yaml(tmp_path / "scrape.yaml", scrape_config)
    result = promtool.promtool(["check", "config", "--syntax-only", raw.name], cwd=tmp_path)
    if result.returncode != 0:  # Debian's build: every job's Kubernetes discovery, and nothing else
        errors = [line.strip() for line in (result.stdout + result.stderr).splitlines() if "not found in type" in line]
        assert len(errors) == len(scrape_config["scrape_configs"]), result.stdout + result.stderr
        assert all(f"field {promtool.K8S_SD} not found in type config.ScrapeConfig" in e for e in errors), errors
    filed = promtool.write_yaml(tmp_path / "scrape-file-sd.yaml", promtool.with_file_sd(scrape_config, tmp_path))
    full = promtool.promtool(["check", "config", filed.name], cwd=tmp_path)
    assert full.returncode == 0, full.stdout + full.stderr
    assert "SUCCESS" in full.stdout
