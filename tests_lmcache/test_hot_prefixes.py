"""Hot prefixes (issue 17) against the real LMCache: stand-in replicas (:mod:`tests_lmcache.replica`)
that tokenize (``/tokenize``, a chat template), look up, retrieve and store through a real
``LMCacheEngine`` configured from the rendered env, with LMCache's keys chained from vLLM's
``NONE_HASH`` as in a vLLM Pod (:mod:`tests_lmcache.vllm_none_hash`); the warmer
(:mod:`cluster_agents.hot_prefixes`) with the rendered ``hot_prefixes.json`` and prefix file of the
janitor's ConfigMap; the janitor (:func:`cluster_agents.l2_janitor.run`) with its rendered ``janitor.json``.

Proven: the chunk names the warmer computes are exactly the files LMCache wrote (and not those of a
chain from 0); a warmed prefix is a full L2 hit on a replica that never saw it; under pressure and
past the age limit the janitor keeps every pinned chunk and evicts the others oldest first; a wiped
chunk is back after the next warm-up, which a new replica triggers (a replica that holds the prefix
in its CPU buffer stores nothing: recorded); a warmer whose names are wrong says so.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from types import SimpleNamespace

import pytest

from cluster_agents import hot_prefixes, l2_janitor
from cluster_agents.hot_prefixes import HotPrefixConfig, HotPrefixWarmer, Prefix
from tests_lmcache.conftest import make_tier
from tests_lmcache.replica import render_chat
from tests_lmcache.test_lmcache_l2 import RAG

HOUR = 3600.0


def _post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


#: What the Pods' ``KVCACHE_L2_KEY`` ``secretKeyRef`` gives in this tier (the janitor's Secret in a cluster).
CHUNK_KEY = "tier-chunk-key-" + "ab" * 24


def config_is_keyed(config: HotPrefixConfig) -> bool:
    """The rendered hot_prefixes.json names keyed sha256_cbor chunks (the platform's pinned algorithm)."""
    return config.hash_algorithm == hot_prefixes.SHA256_CBOR and bool(config.key_secret)


def _pod(replica, uid: str) -> dict:
    pod = replica.pod_object(RAG)
    pod["metadata"]["uid"] = uid
    return pod


@pytest.fixture(scope="module")
def hot(exported, tmp_path_factory):
    base = tmp_path_factory.mktemp("hot")
    tier = make_tier(exported, base)
    rendered = exported["lines"][RAG]["hot_prefixes"]
    assert rendered is not None, "the scenario's rag-assistant declares a hot prefix"
    cm = base / "configmap"
    cm.mkdir()
    for key, text in rendered.items():
        (cm / key).write_text(text, encoding="utf-8")
    config = hot_prefixes.load_config(cm / "hot_prefixes.json")
    config = HotPrefixConfig(**{**config.__dict__, "settle_s": 5.0, "min_request_interval_s": 0.0})
    started = []
    try:
        def start(pod: int, name: str):
            replica = tier.start_replica(RAG, name, pod=pod, vllm_none_hash=True, chunk_key=CHUNK_KEY)
            started.append(replica)
            return replica

        a, b = start(0, f"{RAG}-7d9-a"), start(1, f"{RAG}-7d9-b")
        pods = [_pod(a, "uid-a")]
        logs: list[dict] = []
        warmer = HotPrefixWarmer(config, tier.root, list_pods=lambda: list(pods),
                                 log=lambda line: logs.append(json.loads(line)), chunk_key=lambda: CHUNK_KEY)
        yield SimpleNamespace(tier=tier, config=config, a=a, b=b, pods=pods, warmer=warmer, logs=logs,
                              start=start, janitor=exported["lines"][RAG]["janitor_config"],
                              system=config.prefixes[0].messages[0][1])
    finally:
        for replica in started:
            replica.stop()


def _chunk_files(hot) -> list[str]:
    return sorted(f for f in os.listdir(hot.tier.line_dir(RAG)) if f.endswith(".data"))


def _user_request(hot, replica, question: str) -> dict:
    """A user's chat request: the declared system prompt, then a question of their own."""
    messages = [{"role": "system", "content": hot.system}, {"role": "user", "content": question}]
    return _post(replica.url, "/v1/chat/completions", {"messages": messages, "max_tokens": 1})["lmcache"]


def test_1_the_warm_up_stores_the_prefix_under_the_names_it_computed(hot):
    round_ = hot.warmer.tick()
    assert round_["reason"] == "start" and round_["new_replicas"] == [hot.a.name]
    (report,) = round_["prefixes"]
    tokens = render_chat([{"role": "system", "content": hot.system}], add_generation_prompt=False)
    full = len(tokens) // 256 * 256
    assert report["result"] == "stored" and report["tokens"] == len(tokens) and full >= 512
    assert report["pinned_tokens"] == report["l2_tokens"] == full and report["replicas_tried"] == [hot.a.name]
    # Exactly LMCache's names: the files it wrote for the prefix are the hashes computed here, one per chunk.
    files = _chunk_files(hot)
    assert sorted(name.split("@")[3] for name in files) == sorted(hot.warmer.pinned())
    assert len(files) == full // 256 and hot.warmer.names_ok is True
    assert "Initialized NONE_HASH=" in hot.a.log_path.read_text()  # LMCache's vLLM branch chained them
    # Control: a chain from 0 (LMCache without vLLM) or from the seed alone (no key) names other files.
    assert config_is_keyed(hot.config)
    from_zero = {hot_prefixes.hash_hex(h) for h in hot_prefixes.keyed_chunk_hashes(tokens, 256, 0)}
    from_seed = {hot_prefixes.hash_hex(h) for h in hot_prefixes.keyed_chunk_hashes(
        tokens, 256, hot_prefixes.keyed_none_hash("0"))}
    assert not (from_zero | from_seed) & hot.warmer.pinned()
    text = hot.warmer.metrics()
    labels = f'line="{RAG}",namespace="{RAG}",prefix="system-prompt"'
    assert f"{hot_prefixes.L2_TOKENS_METRIC}{{{labels}}} {full}" in text
    assert f"{hot_prefixes.DECLARED_TOKENS_METRIC}{{{labels}}} {len(tokens)}" in text
    assert f'{hot_prefixes.WARMUPS_METRIC}_total{{{labels},result="stored"}} 1' in text
    # Idempotent: the next round finds it all in L2 and sends the request as a full hit.
    hot.warmer._last_round = 0.0
    again = hot.warmer.tick()
    assert again["reason"] == "schedule" and again["prefixes"][0]["result"] == "in_l2"
    assert _chunk_files(hot) == files


def test_2_a_replica_that_never_saw_the_prefix_hits_it_in_full_from_l2(hot):
    hit = _user_request(hot, hot.b, "How many vacation days do I get?")
    full = len(hot.warmer.pinned()) * 256
    assert hit["lookup_hit_tokens"] == full and hit["retrieved_tokens"] == full


def test_3_under_pressure_and_past_the_age_limit_the_janitor_keeps_every_pinned_chunk(hot):
    """Other prompts fill the directory; every file is made older than the pinned ones' neighbours:
    the pinned chunks are the oldest (hit, never rewritten). The watermarks evict the other chunks
    oldest first and keep the pinned ones; the age limit deletes every other old chunk and keeps them."""
    rng = random.Random(17)
    for _ in range(6):
        _post(hot.b.url, "/v1/completions", {"prompt": [rng.randrange(1000, 30000) for _ in range(2 * 256 + 8)],
                                             "max_tokens": 1})
    d = hot.tier.line_dir(RAG)
    pinned = hot.warmer.pinned()
    files = _chunk_files(hot)
    others = [f for f in files if f.split("@")[3] not in pinned]
    assert len(others) == 12
    now = l2_janitor.time.time()
    for f in files:  # pinned: 48 h old; the others 47 h .. 36 h old, one hour apart
        age = 48 * HOUR if f.split("@")[3] in pinned else 47 * HOUR - others.index(f) * HOUR
        os.utime(d / f, (now - age, now - age))
    size = sum((d / f).stat().st_size for f in files)
    per_file = (d / files[0]).stat().st_size
    # Pressure only (no age limit): 90% of the capacity used, down to 60% means 5 of the 12 others go.
    # Deleted at once (no retire grace): which chunks go is the point here; their retirement first is
    # tests/agents/test_l2_janitor.py's and tests_serving/test_evictions.py's.
    config = l2_janitor.config_from_dict({**hot.janitor, "capacity_bytes": int(size / 0.9), "max_age_s": None,
                                          "retire_grace_s": 0})
    s = l2_janitor.run(config, hot.tier.root, list_pods=lambda: [p for p in hot.pods], now=now, pinned=pinned)
    gone = [f for f in others if not (d / f).exists()]
    assert gone == others[:len(gone)] and len(gone) == s.evicted_chunks_deleted >= 1  # oldest first
    assert all((d / f).exists() for f in files if f.split("@")[3] in pinned)
    assert s.pinned_chunk_files == len(pinned) and s.pinned_bytes == len(pinned) * per_file
    assert s.pinned_chunks_kept == len(pinned)  # the oldest files: eviction would have taken them first
    # The age limit (24 h): every other chunk is past it and goes; the pinned ones stay.
    config = l2_janitor.config_from_dict({**hot.janitor, "max_age_s": 24 * HOUR, "retire_grace_s": 0})
    s = l2_janitor.run(config, hot.tier.root, list_pods=lambda: [p for p in hot.pods], now=now, pinned=pinned)
    assert sorted(f.split("@")[3] for f in _chunk_files(hot)) == sorted(pinned)
    assert s.expired_chunks_deleted == 12 - len(gone) and s.pinned_chunks_kept == len(pinned)
    # ... and they still serve: a full hit on the replica that never computed them.
    hit = _user_request(hot, hot.b, "Where is the expense policy?")
    assert hit["lookup_hit_tokens"] == len(pinned) * 256


def test_4_a_wiped_chunk_is_back_after_the_next_warm_up(hot):
    d = hot.tier.line_dir(RAG)
    state = hot.warmer.states["system-prompt"]
    middle = next(f for f in _chunk_files(hot) if f.split("@")[3] == state.hashes[1])
    (d / middle).unlink()  # a Worker lost, a directory wiped
    hot.warmer.refresh_presence()
    assert state.leading_chunks == 1  # what a lookup hits now: up to the missing chunk
    labels = f'line="{RAG}",namespace="{RAG}",prefix="system-prompt"'
    assert f"{hot_prefixes.L2_TOKENS_METRIC}{{{labels}}} 256" in hot.warmer.metrics()
    # Recorded behaviour of LMCache 0.5.5: both replicas hold the prefix in their CPU buffer (L1: A
    # stored it, B retrieved it), so a warm-up on either is a full L1 hit and stores nothing; each is
    # tried once, the chunk stays missing ("partial"), and users of A and B lose nothing meanwhile.
    hot.pods.append(_pod(hot.b, "uid-b"))
    (blocked,) = hot.warmer.tick()["prefixes"]
    assert blocked["result"] == "partial" and sorted(blocked["replicas_tried"]) == [hot.a.name, hot.b.name]
    assert not (d / middle).exists()
    # A scale-out: a new replica turns Ready; the warm-up runs on it first (its CPU buffer is empty).
    c = hot.start(2, f"{RAG}-7d9-c")
    hot.pods.append(_pod(c, "uid-c"))
    round_ = hot.warmer.tick()
    assert round_["reason"] == "new_replica" and round_["new_replicas"] == [c.name]
    (report,) = round_["prefixes"]
    assert report["result"] == "stored" and report["replicas_tried"] == [c.name]
    assert report["chunks_missing_before"] == 1 and report["chunks_missing_after"] == 0
    assert (d / middle).exists() and report["l2_tokens"] == len(state.hashes) * 256
    hit = _user_request(hot, hot.a, "And sick leave?")
    assert hit["lookup_hit_tokens"] == len(state.hashes) * 256


def test_5_a_warmer_whose_names_are_wrong_says_so(hot, tmp_path):
    """Another chunk key than the Pods': the replica stores the prefix under LMCache's names, none of
    which the warmer computed: ``names_mismatch``, ``names_ok`` 0, nothing pinned silently."""
    text = " ".join(f"tool-{i}" for i in range(600))
    config = HotPrefixConfig(**{**hot.config.__dict__, "prefixes": (Prefix("tools", text=text),)})
    warmer = HotPrefixWarmer(config, tmp_path / "other-root", list_pods=lambda: [_pod(hot.b, "uid-b")],
                             log=lambda _: None, chunk_key=lambda: "not-the-lines-key")
    warmer.root = hot.tier.root  # same directory, no state file of the module's warmer
    (report,) = warmer.tick()["prefixes"]
    assert report["result"] == "names_mismatch" and warmer.names_ok is False
    assert "the names computed here are not LMCache's" in report["errors"][0]
    assert f'{hot_prefixes.NAMES_OK_METRIC}{{line="{RAG}",namespace="{RAG}"}} 0' in warmer.metrics()
