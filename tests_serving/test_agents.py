"""The line's in-cluster agents against real vLLM servers: the cross-pod hit canary
(:mod:`cluster_agents.kv_canary`) and the hot-prefix warmer (:mod:`cluster_agents.hot_prefixes`),
each with its rendered configuration, talking to the servers' real ``/v1/completions``,
``/tokenize`` and ``/metrics`` (tests_lmcache/ tests them against stand-in replicas).

Proven here: the canary's ratio comes out of the real vLLM/LMCache counters and agrees with
vLLM's own external-hit count; the warmer's chunk names, computed from the server's chunk key (or
its NONE_HASH seed when it runs unkeyed) and the real tokenizer's ``/tokenize``, are exactly the files the real server wrote, and the warmed
prefix is a full L2 hit on the other server.
"""

from __future__ import annotations

import json
from typing import Any

from cluster_agents import hot_prefixes, kv_canary
from cluster_agents.hot_prefixes import HotPrefixConfig, HotPrefixWarmer
from tests_serving.servers import LINE, Server
from tests_serving.workload import EXTERNAL_HITS, delta


def pod_object(server: Server, endpoint: str = LINE, uid: str | None = None) -> dict[str, Any]:
    """The server as ``GET /api/v1/namespaces/<ns>/pods`` lists its Pod: the operator's ``app``
    label, Running and Ready, Pod IP 127.0.0.1, vLLM's port named ``http`` (this server's port), and
    the vLLM container's env as rendered (in-cluster paths), as tests_lmcache's replicas do."""
    return {"metadata": {"name": f"{LINE}-{server.name}", "uid": uid or f"uid-{server.name}", "labels": {"app": endpoint}},
            "spec": {"containers": [{"name": endpoint, "ports": [{"name": "http", "containerPort": server.port}],
                                     "env": [{"name": k, "value": v} for k, v in server.rendered_env.items()]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def chunk_key(server: Server) -> str:
    """What the janitor's Secret gives the warmer for ``server``: its ``KVCACHE_L2_KEY`` when the harness
    sets one (the kubelet's ``secretKeyRef``); else the server runs unkeyed (``L2KEYS unkeyed``) and
    LMCache starts its ``sha256_cbor`` chain from the string ``PYTHONHASHSEED``, which the warmer's
    ``keyed_none_hash`` then takes as the key (docs/security.md, "Chunk keys")."""
    return server.env.get("KVCACHE_L2_KEY") or server.env["PYTHONHASHSEED"]


def test_the_canary_measures_a_full_cross_pod_hit_from_the_real_counters(rig):
    config = kv_canary.config_from_dict(rig.exported["lines"][LINE]["canary_config"])
    canary = kv_canary.Canary(config, list_pods=lambda: [pod_object(rig.a), pod_object(rig.b)], log=lambda _: None)
    for server in (rig.a, rig.b):
        server.wait_gate_closed()  # an open gate neither saves nor looks up (an earlier test's fault)
    b0 = rig.b.counters()
    run = canary.run_once()
    b1 = rig.b.counters()
    assert (run.writer, run.reader) == (f"{LINE}-a", f"{LINE}-b"), run
    assert run.result == "measured" and run.exact and run.ratio == 1.0, run
    assert run.writer_chunks_written == config.prompt_chunks and run.reader_lookups == 1, run
    assert run.reader_l2_tokens == run.expected_l2_tokens == config.prompt_chunks * config.chunk_size
    # vLLM's own count of the tokens its connector served agrees with the canary's LMCache reading.
    assert delta(b1, b0, EXTERNAL_HITS) == run.reader_l2_tokens
    print(f"canary: ratio {run.ratio}, TTFT cold {run.ttft_cold_s} s, warm {run.ttft_warm_s} s")


def test_the_warmer_names_the_chunk_files_the_real_server_wrote(rig, tmp_path):
    rendered = rig.exported["lines"][LINE]["hot_prefixes"]
    assert rendered is not None, "the scenario's rag-assistant declares a hot prefix"
    for key, text in rendered.items():
        (tmp_path / key).write_text(text, encoding="utf-8")
    config = hot_prefixes.load_config(tmp_path / "hot_prefixes.json")
    config = HotPrefixConfig(**{**config.__dict__, "settle_s": 30.0, "min_request_interval_s": 0.0})
    logs: list[dict[str, Any]] = []
    before = rig.chunk_files()
    rig.a.wait_gate_closed()  # an open gate saves nothing (an earlier test's fault)
    warmer = HotPrefixWarmer(config, rig.mount.mount, list_pods=lambda: [pod_object(rig.a)],
                             log=lambda line: logs.append(json.loads(line)), chunk_key=lambda: chunk_key(rig.a))
    round_ = warmer.tick()
    assert round_ is not None and round_["reason"] == "start", logs
    (report,) = round_["prefixes"]
    assert report["result"] == "stored", round_
    full = report["tokens"] // config.chunk_size * config.chunk_size
    assert full >= config.chunk_size and report["pinned_tokens"] == report["l2_tokens"] == full, report
    # Exactly LMCache's names: the files the real server wrote for the prefix carry the hashes computed here.
    written = rig.chunk_files() - before
    assert sorted(name.split("@")[3] for name in written) == sorted(warmer.pinned()), (written, warmer.pinned())
    assert warmer.names_ok is True
    # A user's chat request that starts with the declared system prompt: a full L2 hit on the other server.
    messages = [{"role": role, "content": text} for role, text in config.prefixes[0].messages]
    tokens = _tokenize_chat(rig.b, messages)
    rig.b.wait_gate_closed()
    b0 = rig.b.counters()
    reply = rig.b.complete(tokens + [5, 6, 7], max_tokens=2)
    assert reply.ok
    assert delta(rig.b.counters(), b0, EXTERNAL_HITS) == full


def _tokenize_chat(server: Server, messages: list[dict[str, str]]) -> list[int]:
    status, body = server._request("POST", "/tokenize", {"model": server.model, "messages": messages,
                                                         "add_generation_prompt": False})
    assert status == 200, body[:500]
    return json.loads(body)["tokens"]

