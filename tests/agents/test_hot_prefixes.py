"""The hot-prefix warmer (cluster_agents/hot_prefixes.py) on a real directory, with a scripted replica client,
and its chart objects. The names against the real LMCache: tests_lmcache/test_hot_prefixes.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from k8s import janitor as janitor_chart
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from cluster_agents import hot_prefixes
from cluster_agents.hot_prefixes import (HotPrefixConfig, HotPrefixWarmer, Prefix, chunk_hashes, hash_hex, parse_chunk_name,
                                   ready_replicas)
from capacity.project_checks import load_checked_project
from tests.example_config import FIXTURE_CONFIG, copy_example_config, edit_yaml

LIVE = "qwen2-7b-instruct-0123456789ab"
MOUNT = "/mnt/curvine/l2cache"
FRAME = "-SEP-opt-SEP-ml-SEP-model"


def config(**kw) -> HotPrefixConfig:
    base = dict(line="rag-assistant", namespace="rag-assistant", live_dir=LIVE, mount_path=MOUNT,
                pod_label=("app", "rag-assistant"), port=8000, port_name="http", chunk_size=4, world_size=2,
                python_hash_seed=0, warm_period_s=3600, prefixes=(Prefix("sys", messages=(("system", "be brief"),)),),
                settle_s=0.0, min_request_interval_s=2.0)
    return HotPrefixConfig(**{**base, **kw})


def pod(name: str, *, ready: bool = True, live: str = LIVE, created: str = "2026-01-01T00:00:00Z",
        deleting: bool = False, label: str = "rag-assistant") -> dict:
    meta = {"name": name, "uid": f"uid-{name}", "labels": {"app": label}, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}],
                                     "env": [{"name": "LMCACHE_REMOTE_URL", "value": f"fs://localhost:0{MOUNT}/{live}/"}]}]},
            "status": {"phase": "Running", "podIP": f"10.0.0.{len(name)}",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class FakeReplicas:
    """Scripted replicas: ``/tokenize`` gives ``tokens``; ``/v1/completions`` on a replica that
    ``stores`` writes each full chunk's file for every rank (names from ``none_hash``, as LMCache would
    with the Pods' seed), unless the replica ``fails``."""

    def __init__(self, root: Path, tokens: list[int], none_hash: int, *, world: int = 2, chunk: int = 4) -> None:
        self.root, self.tokens, self.none_hash, self.world, self.chunk = root, tokens, none_hash, world, chunk
        self.calls: list[tuple[str, str]] = []
        self.stores: set[str] = set()
        self.fails: set[str] = set()
        self.chain = chunk_hashes  # the Pods' hash (hot_prefixes.keyed_chunk_hashes for a keyed line)

    def tokenize(self, url: str, prefix: Prefix) -> tuple[list[int], int]:
        self.calls.append(("tokenize", url))
        return list(self.tokens), 8192

    def complete(self, url: str, tokens: list[int]) -> dict:
        self.calls.append(("complete", url))
        if url in self.fails:
            raise OSError(f"POST {url}/v1/completions: HTTP 503")
        if url in self.stores:
            d = self.root / LIVE
            d.mkdir(parents=True, exist_ok=True)
            for h in self.chain(tokens, self.chunk, self.none_hash):
                for w in range(self.world):
                    (d / f"{FRAME}@{self.world}@{w}@{hash_hex(h)}@bfloat16.data").write_bytes(b"kv")
        return {}


def seeded_none_hash(seed: int) -> int:
    return int(subprocess.run([sys.executable, "-c", "print(hash('%d'))" % seed], env={"PYTHONHASHSEED": str(seed)},
                              capture_output=True, text=True, check=True).stdout)


def warmer(tmp_path: Path, replicas: FakeReplicas, pods: list[dict], **kw) -> tuple[HotPrefixWarmer, list[dict], list[float]]:
    logs: list[dict] = []
    clock = [1000.0]
    w = HotPrefixWarmer(config(**kw), tmp_path, list_pods=lambda: pods, client=replicas, log=lambda l: logs.append(json.loads(l)),
                        now=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    return w, logs, clock


# --- names ---------------------------------------------------------------------------------------


def test_the_chain_covers_full_chunks_only_and_each_key_depends_on_everything_before() -> None:
    a = chunk_hashes(list(range(10)), 4, 7)
    assert len(a) == 2  # 10 tokens: two full chunks, the last 2 tokens are never stored
    assert a[0] == hash((7, (0, 1, 2, 3), ())) and a[1] == hash((a[0], (4, 5, 6, 7), ()))
    b = chunk_hashes([99, 1, 2, 3, 4, 5, 6, 7], 4, 7)
    assert a[0] != b[0] and a[1] != b[1]  # a change in chunk 0 re-keys chunk 1 too
    assert hash_hex(-255) == "-ff" and hash_hex(255) == "ff"  # CacheEngineKey.chunk_hash_hex: %x


def test_none_hash_is_the_seeded_str_hash_not_this_processes() -> None:
    assert hot_prefixes.none_hash(0) == seeded_none_hash(0)
    assert hot_prefixes.none_hash(0) != hot_prefixes.none_hash(1)
    hot_prefixes.check_hash_family()  # this machine's CPython 3.11 hashes str as the vLLM image's 3.12


# Known answers, computed by LMCache 0.5.5's own ChunkedTokenDatabase (pre_caching_hash_algorithm
# sha256_cbor, chunk_size 4, save_unfull_chunk false) with vLLM 0.29.0's sha256_cbor, NONE_HASH set as the
# L2 gate sets it (l2_gate.apply_chunk_key), in .venv-serving; tests_serving/test_chunk_keys.py compares the
# two for random tokens and keys on every run of the serving tier.
KAT_TOKENS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 0, 1]
KAT = {"0": (5625442194607170974, ["101c74900f888c0c", "7a845f55fad0cd3c"]),
       "kvcache-test-key": (16749282841941532325, ["ac926ab2d255f6be", "c73af05e4a6375c3"])}


@pytest.mark.parametrize("secret", sorted(KAT))
def test_keyed_names_are_lmcaches_sha256_cbor_names(secret: str) -> None:
    start, names = KAT[secret]
    assert hot_prefixes.keyed_none_hash(secret) == start
    assert [hash_hex(h) for h in hot_prefixes.keyed_chunk_hashes(KAT_TOKENS, 4, start)] == names
    assert hot_prefixes.chain_hashes(KAT_TOKENS, 4, "sha256_cbor", start) == hot_prefixes.keyed_chunk_hashes(
        KAT_TOKENS, 4, start)


def test_the_keyed_chain_depends_on_the_key_and_on_everything_before() -> None:
    a = hot_prefixes.keyed_chunk_hashes(list(range(10)), 4, hot_prefixes.keyed_none_hash("k1"))
    b = hot_prefixes.keyed_chunk_hashes(list(range(10)), 4, hot_prefixes.keyed_none_hash("k2"))
    c = hot_prefixes.keyed_chunk_hashes([99, *range(1, 10)], 4, hot_prefixes.keyed_none_hash("k1"))
    assert len(a) == 2 and not set(a) & set(b) and a[0] != c[0] and a[1] != c[1]
    assert all(0 <= h < 2**64 for h in a)  # the first 8 bytes, unsigned: no "-" in a keyed name
    with pytest.raises(ValueError):
        hot_prefixes.keyed_none_hash("")
    with pytest.raises(ValueError):
        hot_prefixes.chain_hashes([1, 2, 3, 4], 4, "xxhash", 0)


@pytest.mark.parametrize("value,encoded", [
    # RFC 8949 Appendix A (the examples of the shapes the chain holds).
    (0, "00"), (1, "01"), (10, "0a"), (23, "17"), (24, "1818"), (25, "1819"), (100, "1864"), (1000, "1903e8"),
    (1000000, "1a000f4240"), (1000000000000, "1b000000e8d4a51000"), (18446744073709551615, "1bffffffffffffffff"),
    ("", "60"), ("a", "6161"), ("IETF", "6449455446"), ("\u00fc", "62c3bc"), ("\u6c34", "63e6b0b4"),
    ([], "80"), ([1, 2, 3], "83010203"), ([1, [2, 3], [4, 5]], "8301820203820405"),
    (list(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819"),
    ((7, (1, 2), ()), "83078201028" + "0"),
])
def test_the_cbor_encoder_writes_rfc_8949s_encodings(value, encoded: str) -> None:
    assert hot_prefixes.cbor(value).hex() == encoded


@pytest.mark.parametrize("value", [True, -1, 2**64, 1.5, {"a": 1}, b"x", None])
def test_the_cbor_encoder_refuses_what_the_chain_never_holds(value) -> None:
    with pytest.raises(ValueError):
        hot_prefixes.cbor(value)


def test_a_keyed_line_needs_the_secrets_name_and_the_warmer_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key_secret"):
        config(hash_algorithm="sha256_cbor")
    with pytest.raises(ValueError, match="key_secret"):
        config(key_secret="kvcache-l2-key-1")  # builtin names take no key
    with pytest.raises(ValueError, match="hash_algorithm"):
        config(hash_algorithm="xxhash", key_secret="kvcache-l2-key-1")
    keyed = config(hash_algorithm="sha256_cbor", key_secret="kvcache-l2-key-1")
    assert hot_prefixes.config_fingerprint(keyed) != hot_prefixes.config_fingerprint(
        config(hash_algorithm="sha256_cbor", key_secret="kvcache-l2-key-2"))
    fake = FakeReplicas(tmp_path, list(range(10)), hot_prefixes.keyed_none_hash("line-secret"))
    fake.chain = hot_prefixes.keyed_chunk_hashes
    fake.stores.add("http://10.0.0.1:8000")
    logs: list[dict] = []
    # Without the key the prefix is an error (tried again next round), never builtin names.
    w = HotPrefixWarmer(keyed, tmp_path, list_pods=lambda: [pod("a")], client=fake, log=lambda l: logs.append(json.loads(l)),
                        now=lambda: 1000.0, sleep=lambda s: None)
    report = w.tick()["prefixes"][0]
    assert report["result"] == "error" and "kvcache-l2-key-1" in report["errors"][0] and w.pinned() == frozenset()
    # With it, the warmer names exactly the files the (keyed) replicas write, and pins them.
    w = HotPrefixWarmer(keyed, tmp_path, list_pods=lambda: [pod("a")], client=fake, log=lambda l: logs.append(json.loads(l)),
                        now=lambda: 1000.0, sleep=lambda s: None, chunk_key=lambda: "line-secret")
    report = w.tick()["prefixes"][0]
    assert report["result"] == "stored" and w.names_ok is True
    assert w.pinned() == {hash_hex(h) for h in hot_prefixes.keyed_chunk_hashes(
        list(range(10)), 4, hot_prefixes.keyed_none_hash("line-secret"))}
    # Another key: the files are there, but not under the names computed: the self-check says so.
    other = tmp_path / "other"
    other.mkdir()
    fake2 = FakeReplicas(other, list(range(10)), hot_prefixes.keyed_none_hash("line-secret"))
    fake2.chain = hot_prefixes.keyed_chunk_hashes
    fake2.stores.add("http://10.0.0.1:8000")
    w = HotPrefixWarmer(keyed, other, list_pods=lambda: [pod("a")], client=fake2, log=lambda l: logs.append(json.loads(l)),
                        now=lambda: 1000.0, sleep=lambda s: None, chunk_key=lambda: "another-secret")
    assert w.tick()["prefixes"][0]["result"] == "names_mismatch" and w.names_ok is False


def test_chunk_names_are_parsed_as_lmcache_splits_them() -> None:
    assert parse_chunk_name(f"{FRAME}@8@3@-1a2b@bfloat16.data") == (8, 3, "-1a2b")
    assert parse_chunk_name(f"{FRAME}@1@0@ff@half@user%alice.data") == (1, 0, "ff")  # a request tag
    assert parse_chunk_name(f"{FRAME}@1@0@ff@half.data.tmp") is None and parse_chunk_name("x.data") is None


def test_replicas_are_the_ready_endpoint_pods_on_the_configured_directory_newest_last() -> None:
    pods = [pod("b", created="2026-01-02T00:00:00Z"), pod("a"), pod("c", ready=False), pod("d", live="other-model-0"),
            pod("e", deleting=True), pod("f", label="other")]
    got = ready_replicas(pods, config())
    assert [(r.name, r.url) for r in got] == [("a", "http://10.0.0.1:8000"), ("b", "http://10.0.0.1:8000")]


# --- rounds ----------------------------------------------------------------------------------------


def test_a_first_round_warms_on_the_new_replica_and_pins_what_it_stored(tmp_path: Path) -> None:
    fake = FakeReplicas(tmp_path, list(range(10)), seeded_none_hash(0))
    pods = [pod("a")]
    fake.stores.add("http://10.0.0.1:8000")
    w, logs, _ = warmer(tmp_path, fake, pods)
    round_ = w.tick()
    (report,) = round_["prefixes"]
    assert round_["reason"] == "start" and report["result"] == "stored" and report["pinned_tokens"] == 8
    assert w.pinned() == {hash_hex(h) for h in chunk_hashes(list(range(10)), 4, seeded_none_hash(0))}
    assert report["l2_tokens"] == 8 and w.names_ok is True and logs == [round_]
    # Nothing new: no round, only a count later; a scheduled round finds it in L2 (a full hit).
    assert w.tick() is None
    w._last_round -= 3600
    assert w.tick()["prefixes"][0]["result"] == "in_l2"


def test_a_failing_replica_is_skipped_and_requests_are_paced(tmp_path: Path) -> None:
    fake = FakeReplicas(tmp_path, list(range(10)), seeded_none_hash(0))
    pods = [pod("aa", created="2026-01-01T00:00:00Z"), pod("bbb", created="2026-01-02T00:00:00Z")]
    fake.fails.add("http://10.0.0.3:8000")  # the newest, tried first
    fake.stores.add("http://10.0.0.2:8000")
    w, _, clock = warmer(tmp_path, fake, pods)
    start = clock[0]
    (report,) = w.tick()["prefixes"]
    assert report["result"] == "stored" and report["replicas_tried"] == ["bbb", "aa"]
    assert "HTTP 503" in report["errors"][0]
    assert clock[0] - start >= 2.0  # the second request waited min_request_interval_s


def test_nothing_written_or_other_names_written_are_told_apart(tmp_path: Path) -> None:
    fake = FakeReplicas(tmp_path, list(range(10)), seeded_none_hash(0))
    w, _, _ = warmer(tmp_path, fake, [pod("a")])
    assert w.tick()["prefixes"][0]["result"] == "not_stored" and w.names_ok is None
    # The replica stores under another seed's names: the self-check says the names are wrong.
    fake.none_hash = seeded_none_hash(1)
    fake.stores.add("http://10.0.0.1:8000")
    w._last_round -= 3600
    (report,) = w.tick()["prefixes"]
    assert report["result"] == "names_mismatch" and w.names_ok is False
    text = w.metrics()
    assert f'{hot_prefixes.NAMES_OK_METRIC}{{line="rag-assistant",namespace="rag-assistant"}} 0' in text


def test_the_hashes_survive_a_restart_so_the_janitor_pins_before_the_first_round(tmp_path: Path) -> None:
    fake = FakeReplicas(tmp_path, list(range(10)), seeded_none_hash(0))
    fake.stores.add("http://10.0.0.1:8000")
    first, _, _ = warmer(tmp_path, fake, [pod("a")])
    first.tick()
    again, _, _ = warmer(tmp_path, fake, [])
    assert again.pinned() == first.pinned() and len(again.pinned()) == 2
    # Another configuration (here the seed) does not reuse them.
    other, _, _ = warmer(tmp_path, fake, [], python_hash_seed=1)
    assert other.pinned() == frozenset()


def test_a_lost_chunk_shows_at_the_next_count(tmp_path: Path) -> None:
    fake = FakeReplicas(tmp_path, list(range(10)), seeded_none_hash(0))
    fake.stores.add("http://10.0.0.1:8000")
    w, _, clock = warmer(tmp_path, fake, [pod("a")])
    w.tick()
    victim = next((tmp_path / LIVE).glob(f"*@2@1@{w.states['sys'].hashes[0]}@*"))
    victim.unlink()  # rank 1 of chunk 0
    clock[0] += 61
    assert w.tick() is None  # no round: a count
    assert w.states["sys"].leading_chunks == 0 and w.states["sys"].chunks_present == 1


def test_the_warmers_metrics_parse_and_reach_the_janitors_endpoint(tmp_path: Path) -> None:
    from cluster_agents import l2_janitor

    fake = FakeReplicas(tmp_path, list(range(10)), seeded_none_hash(0))
    fake.stores.add("http://10.0.0.1:8000")
    w, _, _ = warmer(tmp_path, fake, [pod("a")])
    w.tick()
    jc = l2_janitor.JanitorConfig(line="rag-assistant", namespace="rag-assistant", live_dir=LIVE, capacity_bytes=2**30,
                                  high_watermark=0.8, low_watermark=0.6, max_age_s=None, min_delete_age_s=600,
                                  mount_path=MOUNT)
    service = l2_janitor.JanitorService(jc, tmp_path, list_pods=None, log=lambda _: None, pinned=w.pinned,
                                        extra_metrics=w.metrics)
    summary = service.run_pass()
    assert summary.pinned_chunk_files == 4 and summary.pinned_bytes == 8
    families = {f.name: f for f in text_string_to_metric_families(service.metrics())}
    labels = {"line": "rag-assistant", "namespace": "rag-assistant", "prefix": "sys"}
    for name, value in ((hot_prefixes.DECLARED_TOKENS_METRIC, 10), (hot_prefixes.PINNED_TOKENS_METRIC, 8),
                        (hot_prefixes.L2_TOKENS_METRIC, 8)):
        (sample,) = families[name].samples
        assert sample.labels == labels and sample.value == value
    stored = [s for s in families[hot_prefixes.WARMUPS_METRIC].samples if s.labels["result"] == "stored"]
    assert stored[0].value == 1 and families["kvcache_l2_janitor_pinned_bytes"].samples[0].value == 8


# --- the chart -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests():
    project = load_checked_project(FIXTURE_CONFIG)
    return project, render_manifests(project, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(project))


def _janitor(objects, kind):
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == janitor_chart.NAME]
    return obj


def test_the_janitor_configmap_carries_the_prefixes_and_the_warmer(manifests) -> None:
    project, rendered = manifests
    line = project.business_line("rag-assistant")
    objects = rendered["line-rag-assistant"] if "line-rag-assistant" in rendered else next(
        v for k, v in rendered.items() if k.endswith("rag-assistant"))
    data = _janitor(objects, "ConfigMap")["data"]
    hot = json.loads(data[janitor_chart.HOT_PREFIX_CONFIG_FILE])
    assert hot["prefixes"] == [{"name": "system-prompt", "messages": [{"role": "system", "file": "prefix-0-0.txt"}]}]
    assert data["prefix-0-0.txt"] == line.hot_prefixes.prefixes[0].messages[0].text
    assert (hot["world_size"], hot["chunk_size"], hot["python_hash_seed"], hot["warm_period_s"]) == (1, 256, 0, 3600)
    assert data[janitor_chart.HOT_PREFIX_SCRIPT_FILE] == Path(hot_prefixes.__file__).read_text(encoding="utf-8")
    (container,) = _janitor(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"][-2:] == ["--hot-prefixes", f"{janitor_chart.CONFIG_DIR}/hot_prefixes.json"]
    # No new right for the warm-up: the janitor's Role lists Pods and, for the chunk key, creates Secrets and
    # reads the line's one (docs/security.md, "Chunk keys"), nothing else.
    assert _janitor(objects, "Role")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["kvcache-l2-key-1"]}]
    # research-reasoning declares none: no warmer there.
    research = next(v for k, v in rendered.items() if k.endswith("research-reasoning"))
    assert janitor_chart.HOT_PREFIX_CONFIG_FILE not in _janitor(research, "ConfigMap")["data"]


def test_the_switch_turns_the_warm_up_and_the_pins_off(tmp_path: Path) -> None:
    cfg = copy_example_config(tmp_path / "config")
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["hot_prefixes"].update(enabled=False))
    project = load_checked_project(cfg)
    assert janitor_chart.hot_prefix_config(project.platform, project.business_line("rag-assistant")) is None


def test_the_largest_prefix_text_of_the_worst_kind_keeps_the_line_under_the_template_limit(tmp_path: Path) -> None:
    """128 KiB of quotes and backslashes (4 bytes each once the manifest is a JSON string inside the
    template's JSON) on top of the line's manifests: still below CloudFormation's 1,000,000 bytes.
    Everything of the line's template but its manifest is about 9 KB (make synth, 2026-12-02: 251,143
    bytes in all, the manifest 242,603), so 100 KB are kept for that and for growth."""
    from platform_config.line_models import MAX_HOT_PREFIX_BYTES
    from stacks.synthesis_checks import TEMPLATE_BODY_LIMIT_BYTES

    cfg = copy_example_config(tmp_path / "config")
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["hot_prefixes"].update(
        prefixes=[{"name": "worst", "text": '"\\' * (MAX_HOT_PREFIX_BYTES // 2)}]))
    project = load_checked_project(cfg)
    rendered = render_manifests(project, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(project))
    objects = next(v for k, v in rendered.items() if k.endswith("rag-assistant"))
    as_in_template = json.dumps(json.dumps(objects))  # the manifest, a string property of the template
    assert 4 * MAX_HOT_PREFIX_BYTES < len(as_in_template) < TEMPLATE_BODY_LIMIT_BYTES - 100_000


def test_a_key_recreated_under_the_same_secret_re_keys_the_saved_names_at_the_next_round(tmp_path: Path) -> None:
    """The state file pins its names from the start (before the key is read); the first round of a new
    process recomputes them with the key it read, so a Secret deleted and recreated does not leave the
    janitor pinning the old key's names."""
    keyed = config(hash_algorithm="sha256_cbor", key_secret="kvcache-l2-key-1")
    tokens = list(range(10))

    def run(key: str) -> HotPrefixWarmer:
        fake = FakeReplicas(tmp_path, tokens, hot_prefixes.keyed_none_hash(key))
        fake.chain = hot_prefixes.keyed_chunk_hashes
        fake.stores.add("http://10.0.0.1:8000")
        return HotPrefixWarmer(keyed, tmp_path, list_pods=lambda: [pod("a")], client=fake, log=lambda _: None,
                               now=lambda: 1000.0, sleep=lambda s: None, chunk_key=lambda: key)

    def names(key: str) -> set[str]:
        return {hash_hex(h) for h in hot_prefixes.keyed_chunk_hashes(tokens, 4, hot_prefixes.keyed_none_hash(key))}

    first = run("old-key")
    first.tick()
    assert first.pinned() == names("old-key")
    second = run("new-key")
    assert second.pinned() == names("old-key")  # loaded from the state file: pinned before any round
    assert second.tick()["prefixes"][0]["result"] == "stored"
    assert second.pinned() == names("new-key") and second.names_ok is True
    assert run("new-key").pinned() == names("new-key")  # and saved


def test_chain_start_is_what_a_pod_with_that_env_starts_from() -> None:
    assert hot_prefixes.chain_start("sha256_cbor", 0, "k") == hot_prefixes.keyed_none_hash("k")
    assert hot_prefixes.chain_start("sha256_cbor", 0) == hot_prefixes.keyed_none_hash("0") == KAT["0"][0]
    assert hot_prefixes.chain_start("builtin", 0, "ignored") == seeded_none_hash(0)
    with pytest.raises(ValueError):
        hot_prefixes.chain_start("sha256", 0)
