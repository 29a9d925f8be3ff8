"""The canary's logic without LMCache: pairing, prompts, the exact and bounded ratio, busy readers,
TTFT buckets, its metrics and command line. (Against the real LMCache: tests_lmcache/test_canary.py.)"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_agents import kv_canary
from cluster_agents.kv_canary import Canary, CanaryConfig, Snapshot, comparable_replicas

REPO = Path(__file__).resolve().parents[2]
CONFIG = CanaryConfig(line="rag", namespace="rag", pod_label=("app", "rag"), port=8000, port_name="http",
                      chunk_size=256, prompt_chunks=4, period_s=300, settle_s=2)
URL = "fs://localhost:0/mnt/curvine/l2cache/qwen2-7b-abc/"


def pod(name: str, *, url: str = URL, phase: str = "Running", ready: bool = True, label: str = "rag",
        ip: str = "10.0.0.1", port_name: str = "http", port: int = 8000, deleting: bool = False) -> dict:
    meta = {"name": name, "labels": {"app": label}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"name": "sidecar"}, {"name": "vllm", "ports": [{"name": port_name, "containerPort": port}],
                                                           "env": [{"name": "LMCACHE_REMOTE_URL", "value": url}]}]},
            "status": {"phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_only_running_ready_endpoint_pods_of_one_l2_directory_are_compared() -> None:
    pods = [pod("rag-b", ip="10.0.0.2"), pod("rag-a"), pod("rag-c", ready=False), pod("rag-d", phase="Pending"),
            pod("router", label="router"), pod("rag-e", deleting=True), pod("rag-ft", url=URL.replace("abc", "def"))]
    replicas, ready = comparable_replicas(pods, CONFIG)
    assert [r.name for r in replicas] == ["rag-a", "rag-b"] and ready == 3
    assert replicas[1].url == "http://10.0.0.2:8000" and replicas[0].l2_url == URL
    # The named container port wins (the operator's modelInvocationPort); IPv6 Pod IPs are bracketed.
    (r,), _ = comparable_replicas([pod("rag-a", ip="fd00::1", port=8080)], CONFIG)
    assert r.url == "http://[fd00::1]:8080"
    assert comparable_replicas([], CONFIG) == ([], 0)


def test_prompts_are_full_chunks_plus_a_tail_and_new_every_run() -> None:
    day = dt.date(2026, 12, 1)
    p1 = kv_canary.canary_prompt(CONFIG, 1, "n1", day)
    assert len(p1) == 4 * 256 + kv_canary.TAIL_TOKENS
    assert all(kv_canary.TOKEN_ID_RANGE[0] <= t < kv_canary.TOKEN_ID_RANGE[1] for t in p1)
    assert p1 == kv_canary.canary_prompt(CONFIG, 1, "n1", day)  # deterministic in its seed
    others = [kv_canary.canary_prompt(CONFIG, 2, "n1", day), kv_canary.canary_prompt(CONFIG, 1, "n2", day),
              kv_canary.canary_prompt(CONFIG, 1, "n1", dt.date(2026, 12, 2))]
    assert all(o[:256] != p1[:256] for o in others)  # the first chunk differs, so every chunk key does


def metrics_text(lookups=0.0, reads=0.0, writes=0.0, ttft: dict[str, float] | None = None) -> str:
    ttft = ttft or {}
    lines = [f'lmcache:num_lookup_requests_total{{model_name="m",worker_id="0"}} {lookups}',
             f'lmcache:num_lookup_requests_total{{model_name="m",worker_id="1"}} {lookups * 7}',  # rank 1: ignored
             f'lmcache:num_remote_read_requests_total{{model_name="m",worker_id="0"}} {reads}',
             f'lmcache:num_remote_write_requests_total{{model_name="m",worker_id="0"}} {writes}']
    cumulative = 0.0
    for bound in (*kv_canary.VLLM_TTFT_BUCKETS, float("inf")):
        le = kv_canary.format_le(bound)
        cumulative += ttft.get(le, 0.0)
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {cumulative}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {cumulative}')
    return "\n".join(lines) + "\n"


class FakeReplicas:
    """Replicas whose counters move by script: each completion applies the next scripted effect."""

    def __init__(self, effects: dict[str, list[dict]]) -> None:
        self.state = {name: {"lookups": 0.0, "reads": 0.0, "writes": 0.0, "ttft": {}} for name in effects}
        self.effects = effects
        self.posts: list[tuple[str, int]] = []

    def metrics(self, url: str):
        s = self.state[url]
        return kv_canary.parse_metrics(metrics_text(s["lookups"], s["reads"], s["writes"], s["ttft"]))

    def complete(self, url: str, prompt: list[int]) -> float:
        self.posts.append((url, len(prompt)))
        effect = self.effects[url].pop(0)
        s = self.state[url]
        for key in ("lookups", "reads", "writes"):
            s[key] += effect.get(key, 0)
        for le, n in effect.get("ttft", {}).items():
            s["ttft"][le] = s["ttft"].get(le, 0) + n
        return effect.get("seconds", 0.3)


def run_with(effects: dict[str, list[dict]]) -> tuple[kv_canary.RunResult, Canary, FakeReplicas]:
    fake = FakeReplicas(effects)
    pods = [pod("a"), pod("b")]
    clock = [1000.0]
    canary = Canary(CONFIG, list_pods=lambda: pods, client=fake, log=lambda _: None,
                    sleep=lambda s: clock.__setitem__(0, clock[0] + s), now=lambda: clock[0])
    # The fake is keyed by URL: both pods share an IP here, so key them by name instead.
    replicas = {"a": "a", "b": "b"}
    canary.client = fake
    real = kv_canary.comparable_replicas
    kv_canary.comparable_replicas = lambda p, c: ([kv_canary.Replica(n, replicas[n], URL) for n in ("a", "b")], 2)
    try:
        return canary.run_once(), canary, fake
    finally:
        kv_canary.comparable_replicas = real


def test_an_isolated_reader_gives_the_exact_ratio() -> None:
    run, canary, fake = run_with({"a": [{"writes": 4, "lookups": 1, "ttft": {"0.5": 1}}],
                                  "b": [{"lookups": 1, "reads": 3, "ttft": {"0.25": 1}}]})
    assert run.result == "measured" and run.exact and run.ratio == 0.75 and run.reader_l2_tokens == 768
    assert fake.posts == [("a", 1040), ("b", 1040)]  # exactly two requests a run
    # Each request counted in the bucket vLLM put it in (its count rose by one).
    assert canary.ttft_counts == {"0.5": 1, "0.25": 1}


def test_a_busy_reader_bounds_the_ratio_or_proves_nothing() -> None:
    # Others looked up too, but fewer chunks were read than the prompt has: at most 2 of 4 were ours.
    run, _, _ = run_with({"a": [{"writes": 4, "ttft": {"0.5": 1}}], "b": [{"lookups": 3, "reads": 2, "ttft": {"0.5": 2}}]})
    assert run.result == "measured" and not run.exact and run.ratio == 0.5
    # As many reads as the prompt has chunks, with other lookups: could all be others'.
    run, canary, _ = run_with({"a": [{"writes": 4, "ttft": {"0.5": 1}}],
                               "b": [{"lookups": 3, "reads": 9, "ttft": {"0.25": 3}, "seconds": 0.9}]})
    assert run.result == "busy" and run.ratio is None
    assert kv_canary.RATIO_METRIC not in canary.metrics()
    # TTFT counts rose by more than one (others' requests): the canary's own measurement decides.
    assert canary.ttft_counts == {"0.5": 1, "1.0": 1}  # writer: vLLM's bucket; reader: its own 0.9 s


def test_ttft_buckets_follow_vllm_and_its_label_format() -> None:
    assert kv_canary.bucket_of(0.3) == "0.5" and kv_canary.bucket_of(1.0) == "1.0" and kv_canary.bucket_of(9999) == "+Inf"
    before = Snapshot(0, 0, 0, 5, {"0.25": 2, "0.5": 3, "+Inf": 5})
    assert kv_canary.vllm_bucket(before, Snapshot(0, 0, 0, 6, {"0.25": 2, "0.5": 4, "+Inf": 6})) == "0.5"
    assert kv_canary.vllm_bucket(before, Snapshot(0, 0, 0, 7, {"0.25": 3, "0.5": 5, "+Inf": 7})) is None
    # vLLM 0.29.0's buckets (vllm/v1/metrics/loggers.py), as Python's prometheus_client writes them.
    from prometheus_client import Histogram, CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    Histogram("h", "h", buckets=kv_canary.VLLM_TTFT_BUCKETS, registry=registry).observe(1)
    les = [s[1]["le"] for s in kv_canary.parse_metrics(generate_latest(registry).decode()) if s[0] == "h_bucket"]
    assert les == [kv_canary.format_le(b) for b in (*kv_canary.VLLM_TTFT_BUCKETS, float("inf"))]


def test_a_failing_cluster_is_an_error_run_not_a_crash() -> None:
    def boom():
        raise OSError("connection refused")

    canary = Canary(CONFIG, list_pods=boom, log=lambda _: None)
    run = canary.run_once()
    assert run.result == "error" and "connection refused" in run.errors[0]
    assert f'{kv_canary.RUNS_METRIC}_total{{line="rag",namespace="rag",result="error"}} 1.0' in canary.metrics()


def test_metrics_text_parses_with_prometheus_client_and_matches_the_table() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from observability.metrics import METRICS

    run, canary, _ = run_with({"a": [{"writes": 4, "ttft": {"0.5": 1}}], "b": [{"lookups": 1, "reads": 4, "ttft": {"0.5": 1}}]})
    families = {f.name: f for f in text_string_to_metric_families(canary.metrics())}
    for name, metric in METRICS.items():
        if metric.source.path != "cluster_agents/kv_canary.py":
            continue
        family = families[name.removesuffix("_total")]
        assert family.type == metric.kind, name
        assert {frozenset(set(s.labels) - {"le"}) for s in family.samples} == {frozenset(metric.labels)}, name


def test_config_is_validated_and_the_command_line_reports_a_bad_one(tmp_path) -> None:
    with pytest.raises(ValueError):
        kv_canary.config_from_dict({"line": "x"})
    with pytest.raises(ValueError):
        CanaryConfig(line="x", namespace="x", pod_label=("app", "x"), port=1, port_name="http", chunk_size=256,
                     prompt_chunks=0, period_s=60)
    bad = tmp_path / "canary.json"
    bad.write_text("{}")
    result = subprocess.run([sys.executable, str(REPO / "cluster_agents" / "kv_canary.py"), "--config", str(bad), "--once"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and json.loads(result.stdout)["errors"][0].startswith("config:")


def test_the_prompt_must_fit_max_model_len_and_the_tail_is_the_configs(tmp_path) -> None:
    from platform_config import ConfigError, load_project
    from platform_config.line_models import CANARY_TAIL_TOKENS
    from tests.example_config import copy_example_config, edit_yaml

    assert kv_canary.TAIL_TOKENS == CANARY_TAIL_TOKENS
    copy = copy_example_config(tmp_path / "config")
    # rag-assistant: --max-model-len 8192, 256-token chunks: 31 chunks + 17 tokens fit, 32 do not.
    edit_yaml(copy / "business-lines" / "rag-assistant.yaml", lambda d: d.update(canary={"prompt_chunks": 16}))
    assert load_project(copy).business_line("rag-assistant").canary.prompt_chunks == 16
    edit_yaml(copy / "business-lines" / "rag-assistant.yaml",
              lambda d: d.update(canary={"prompt_chunks": 16}, cache={**d["cache"], "chunk_size_tokens": 512}))
    with pytest.raises(ConfigError) as error:
        load_project(copy)
    text = str(error.value)
    assert "rag-assistant.yaml" in text and "exceed vllm.args --max-model-len 8192" in text
    assert "canary.prompt_chunks 1..15" in text
