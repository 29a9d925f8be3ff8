"""The cross-pod hit canary against the real LMCache: stand-in replicas (:mod:`tests_lmcache.replica`)
that tokenize, look up, retrieve and store through a real ``LMCacheEngine`` configured from the
rendered env, and the canary (:mod:`cluster_agents.kv_canary`) with the rendered ``canary.json``.

Positive: a prompt one replica computed is served from L2 on the other, both ways, measured exactly
(the reader served nothing else meanwhile), and the canary's own TTFT observations are exactly what
vLLM's histograms counted for them (what the SLO query subtracts). Negative: one replica (reported,
no ratio), replicas of two models (no pair; as a control, paired anyway the reader misses), a dead
mount of the reader (ratio 0) and of the writer (it writes nothing, the reader misses).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster_agents import kv_canary
from tests_lmcache.conftest import make_tier, point_mount
from tests_lmcache.test_lmcache_l2 import FINE_TUNED, RAG


@pytest.fixture(scope="module")
def pods(exported, tmp_path_factory):
    base = tmp_path_factory.mktemp("canary")
    tier = make_tier(exported, base)
    started = []
    try:
        def start(line: str, pod: int, name: str):
            started.append(tier.start_replica_on_mount(line, name, base / f"mount-{name}", pod=pod))
            return started[-1]

        a, b = start(RAG, 0, f"{RAG}-7d9-a"), start(RAG, 1, f"{RAG}-7d9-b")
        ft = start(FINE_TUNED, 2, f"{RAG}-8e1-ft")
        yield SimpleNamespace(tier=tier, a=a, b=b, ft=ft, config=kv_canary.config_from_dict(
            {**exported["lines"][RAG]["canary_config"], "settle_s": 4}))
    finally:
        for replica in started:
            replica.stop()


def canary(pods, replicas, **kwargs) -> kv_canary.Canary:
    return kv_canary.Canary(pods.config, list_pods=lambda: [r.pod_object(RAG) for r in replicas], log=lambda _: None,
                            **kwargs)


def histogram(replica) -> kv_canary.Snapshot:
    return kv_canary.Snapshot.of(kv_canary.ReplicaClient(30).metrics(replica.url))


def test_a_prefix_one_replica_computed_is_served_from_l2_on_the_other_both_ways(pods):
    c = canary(pods, [pods.a, pods.b])
    before = {r.name: histogram(r) for r in (pods.a, pods.b)}
    first, second = c.run_once(), c.run_once()
    assert (first.writer, first.reader) == (pods.a.name, pods.b.name)
    assert (second.writer, second.reader) == (pods.b.name, pods.a.name)  # the pair rotates
    for run in (first, second):
        assert run.result == "measured" and run.exact and run.ratio == 1.0, run
        assert run.prompt_tokens == 4 * 256 + kv_canary.TAIL_TOKENS and run.expected_l2_tokens == 1024
        assert run.writer_chunks_written == 4 and run.reader_l2_tokens == 1024 and run.reader_lookups == 1
        assert run.ttft_cold_s > 0 and run.ttft_warm_s > 0
    text = c.metrics()
    assert f'{kv_canary.RATIO_METRIC}{{line="{RAG}",namespace="{RAG}"}} 1.0' in text
    # The canary's TTFT histogram is, bucket by bucket, what vLLM's histograms counted for its four
    # requests: the SLO query's subtraction leaves no canary request in it (and takes no user's).
    after = {r.name: histogram(r) for r in (pods.a, pods.b)}
    vllm_delta: dict[str, float] = {}
    for name in after:
        for le, value in after[name].ttft_buckets.items():
            vllm_delta[le] = vllm_delta.get(le, 0) + value - before[name].ttft_buckets.get(le, 0)
    ours = {s[1]["le"]: s[2] for s in kv_canary.parse_metrics(text)
            if s[0] == f"{kv_canary.REQUEST_TTFT_METRIC}_bucket"}
    assert ours == vllm_delta and ours["+Inf"] == 4


def test_one_replica_is_reported_not_alarmed(pods):
    c = canary(pods, [pods.a])
    run = c.run_once()
    assert run.result == "one_replica" and run.replicas == 1 and run.ratio is None
    text = c.metrics()
    assert kv_canary.RATIO_METRIC not in text
    assert f'{kv_canary.REPLICAS_METRIC}{{line="{RAG}",namespace="{RAG}"}} 1.0' in text
    assert f'{kv_canary.RUNS_METRIC}_total{{line="{RAG}",namespace="{RAG}",result="one_replica"}} 1.0' in text
    # A replica that is not Ready does not count either.
    c2 = kv_canary.Canary(pods.config, list_pods=lambda: [pods.a.pod_object(RAG), pods.b.pod_object(RAG, ready=False)],
                          log=lambda _: None)
    assert c2.run_once().result == "one_replica"


def test_replicas_of_two_models_are_not_paired(pods):
    """During a model change one replica serves the old model and one the new: their chunk keys and
    L2 directories differ by design, so the canary reports no pair instead of a miss."""
    c = canary(pods, [pods.a, pods.ft])
    run = c.run_once()
    assert run.result == "no_pair" and run.ready_pods == 2 and run.replicas == 1 and run.ratio is None
    assert kv_canary.RATIO_METRIC not in c.metrics()
    # Control: told they share a directory, the canary measures a miss (what it would have alarmed on).
    lying = dict(pods.ft.pod_object(RAG))
    lying["spec"] = {"containers": [{**lying["spec"]["containers"][0],
                                     "env": [{"name": "LMCACHE_REMOTE_URL",
                                              "value": pods.a.rendered_env["LMCACHE_REMOTE_URL"]}]}]}
    blind = kv_canary.Canary(pods.config, list_pods=lambda: [pods.a.pod_object(RAG), lying], log=lambda _: None)
    run = blind.run_once()
    assert (run.writer, run.reader) == (pods.a.name, pods.ft.name)
    assert run.result == "measured" and run.ratio == 0.0 and run.writer_chunks_written == 4


def test_a_dead_mount_of_the_reader_is_a_miss(pods):
    c = canary(pods, [pods.a, pods.b])
    point_mount(pods.b.mount, pods.tier.root.parent / "gone")
    try:
        run = c.run_once()
    finally:
        point_mount(pods.b.mount, pods.tier.root)
    assert (run.writer, run.reader) == (pods.a.name, pods.b.name)
    assert run.result == "measured" and run.exact and run.ratio == 0.0 and run.writer_chunks_written == 4, run
    assert f'{kv_canary.RATIO_METRIC}{{line="{RAG}",namespace="{RAG}"}} 0.0' in c.metrics()


def test_a_dead_mount_of_the_writer_is_a_miss_it_says_it_did_not_write(pods):
    c = canary(pods, [pods.a, pods.b])
    point_mount(pods.a.mount, pods.tier.root.parent / "gone")
    try:
        run = c.run_once()
    finally:
        point_mount(pods.a.mount, pods.tier.root)
    assert (run.writer, run.reader) == (pods.a.name, pods.b.name)
    assert run.result == "measured" and run.ratio == 0.0 and run.writer_chunks_written == 0, run
