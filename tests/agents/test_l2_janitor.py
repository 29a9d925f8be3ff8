"""The per-line L2 janitor (cluster_agents/l2_janitor.py) on a real directory tree, and its chart objects.

File names follow lmcache 0.5.5's fs connector (the pinned release): ``<model path with '/' as -SEP->@<world size>@
<worker id>@<chunk hash hex>@<dtype>.data`` in the base directory, temp files in
``<base>/<fs_connector_relative_tmp_dir>/`` (FSConnector._get_file_name / _get_file_and_tmp_path).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from k8s import janitor as janitor_chart
from k8s import names
from k8s.lmcache import l2_cache_dir
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from cluster_agents import l2_directories, l2_janitor
from cluster_agents.l2_directories import live_pods_from_objects
from cluster_agents.l2_janitor import JanitorConfig, config_from_dict, prometheus_text, run
from platform_config import load_project
from tests.example_config import FIXTURE_CONFIG

NOW = time.time()  # the CLI test runs with the real clock
MIB = 2**20
LIVE = "qwen2-7b-instruct-0123456789ab"
MOUNT = "/mnt/curvine/l2cache"


def chunk_name(i: int) -> str:
    return f"-SEP-opt-SEP-ml-SEP-model@1@0@{i:016x}@bfloat16.data"


def config(**kw) -> JanitorConfig:
    base = dict(line="rag-assistant", namespace="rag-assistant", live_dir=LIVE, capacity_bytes=100 * MIB,
                high_watermark=0.8, low_watermark=0.6, max_age_s=24 * 3600.0, min_delete_age_s=600.0,
                mount_path=MOUNT)
    return JanitorConfig(**{**base, **kw})


def put(root: Path, rel: str, size: int, age_s: float) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def age_dir(root: Path, rel: str, age_s: float) -> None:
    os.utime(root / rel, (NOW - age_s, NOW - age_s))


def seed_state(root: Path, configured: list[tuple[str, float]], in_use: dict[str, float] | None = None) -> None:
    """A state file as earlier passes would have left it (ages in seconds before NOW)."""
    root.mkdir(parents=True, exist_ok=True)
    l2_directories.write_state(root, l2_directories.DirHistory([(d, NOW - age) for d, age in configured],
                                                       {d: NOW - age for d, age in (in_use or {}).items()}))


def vllm_pod(name: str, base: str, tmp: str, phase: str = "Running") -> dict:
    return {"metadata": {"name": name}, "status": {"phase": phase},
            "spec": {"containers": [{"name": "vllm", "env": [
                {"name": "LMCACHE_REMOTE_URL", "value": f"fs://localhost:0{MOUNT}/{base}/" if base else f"fs://localhost:0{MOUNT}/"},
                {"name": "LMCACHE_EXTRA_CONFIG", "value": json.dumps({"fs_connector_relative_tmp_dir": tmp})},
                {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]},
                {"name": "sidecar", "env": [{"name": "LMCACHE_REMOTE_URL", "value": "untouched-sidecar"}]}]}}


def run_settled(cfg: JanitorConfig, root: Path, *, now: float = NOW, **kwargs) -> l2_janitor.RunSummary:
    """A pass, then the pass ``retire_grace_s`` later that deletes what the first retired; returns
    the first pass's summary (the files are as the second left them)."""
    first = run(cfg, root, now=now, **kwargs)
    run(cfg, root, now=now + cfg.retire_grace_s, **kwargs)
    return first


def test_evicts_oldest_chunks_from_high_down_to_low_watermark_retired_first_deleted_a_grace_later(tmp_path):
    # 90 MiB of 100: above the 80 MiB high watermark; must end at or below 60 MiB.
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600 + (90 - i) * 60)  # chunk 0 oldest
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert (s.used_bytes_before, s.used_bytes_after) == (90 * MIB, 60 * MIB)
    assert s.evicted_chunks_deleted == 30 and s.exit_code == 0
    # The 30 oldest left lookups (the retiring list every replica's connector reads) but not the disk.
    assert l2_janitor.read_retiring(tmp_path / LIVE) == {f"{i:016x}": NOW for i in range(30)}
    assert (s.retiring_chunks, s.retiring_bytes, s.bytes_freed) == (30, 30 * MIB, 0)
    assert len([p for p in (tmp_path / LIVE).iterdir() if p.name.endswith(".data")]) == 90
    # A pass before the grace is over deletes nothing and evicts nothing more.
    early = run(config(), tmp_path, list_pods=lambda: [], now=NOW + l2_janitor.RETIRE_GRACE_S - 1)
    assert (early.retired_files_deleted, early.evicted_chunks_deleted, early.retiring_chunks) == (0, 0, 30)
    # The first pass after the grace deletes them and empties the list.
    later = run(config(), tmp_path, list_pods=lambda: [], now=NOW + l2_janitor.RETIRE_GRACE_S)
    assert (later.retired_files_deleted, later.bytes_freed, later.retiring_chunks) == (30, 30 * MIB, 0)
    left = sorted(p.name for p in (tmp_path / LIVE).iterdir())
    assert left == sorted(chunk_name(i) for i in range(30, 90)), "the 30 oldest went, and the list with them"


def test_without_a_retire_grace_evicted_chunks_are_deleted_at_once(tmp_path):
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600 + (90 - i) * 60)
    s = run(config(retire_grace_s=0), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.evicted_chunks_deleted == 30 and s.bytes_freed == 30 * MIB and s.retiring_chunks == 0
    assert sorted(p.name for p in (tmp_path / LIVE).iterdir()) == sorted(chunk_name(i) for i in range(30, 90))


def test_a_retiring_list_the_janitor_did_not_write_stops_eviction_in_its_directory(tmp_path):
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600 + (90 - i) * 60)
    (tmp_path / LIVE / l2_janitor.RETIRING_FILE).write_text("not json")
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.evicted_chunks_deleted == 0 and s.exit_code == 2
    assert "retiring list of " + LIVE in s.errors[0] and "nothing of" in s.errors[0]
    assert (tmp_path / LIVE / l2_janitor.RETIRING_FILE).read_text() == "not json"


def test_a_chunk_declared_hot_after_its_retirement_is_kept(tmp_path):
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600 + (90 - i) * 60)
    run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert f"{0:016x}" in l2_janitor.read_retiring(tmp_path / LIVE)
    run(config(), tmp_path, list_pods=lambda: [], now=NOW + l2_janitor.RETIRE_GRACE_S, pinned=frozenset({f"{0:016x}"}))
    assert (tmp_path / LIVE / chunk_name(0)).exists() and not (tmp_path / LIVE / chunk_name(1)).exists()


def test_below_high_watermark_nothing_is_evicted(tmp_path):
    for i in range(80):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.evicted_chunks_deleted == 0 and s.used_bytes_after == 80 * MIB and s.exit_code == 0


def test_young_chunks_are_never_deleted_and_the_run_reports_it(tmp_path):
    for i in range(95):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=60)  # all younger than 10 minutes
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.evicted_chunks_deleted == 0 and s.above_high_watermark_after and s.exit_code == 1


def test_chunks_older_than_the_ttl_expire_but_directories_stay(tmp_path):
    put(tmp_path, f"{LIVE}/{chunk_name(1)}", MIB, age_s=25 * 3600)
    put(tmp_path, f"{LIVE}/{chunk_name(2)}", MIB, age_s=23 * 3600)
    age_dir(tmp_path, LIVE, 30 * 3600)
    s = run_settled(config(), tmp_path, list_pods=lambda: [])
    assert s.expired_chunks_deleted == 1
    assert (tmp_path / LIVE).is_dir() and [p.name for p in (tmp_path / LIVE).iterdir()] == [chunk_name(2)]


def test_stale_tmp_dirs_and_old_model_dirs_go_live_ones_stay(tmp_path):
    # Earlier passes saw old-model configured three days ago, then rolling-model, then LIVE (the
    # history decides what a rollback needs: test_rollback_* below).
    seed_state(tmp_path, [("old-model-aaaaaaaaaaaa", 3 * 86400), ("rolling-model-bbbbbbbbbbbb", 2 * 86400),
                          (LIVE, 600)])
    put(tmp_path, f"{LIVE}/.tmp-live1/{chunk_name(1)}", MIB, age_s=7200)  # a live pod's temp dir
    (tmp_path / LIVE / ".tmp-deadpod").mkdir()
    age_dir(tmp_path, f"{LIVE}/.tmp-deadpod", 7200)
    (tmp_path / LIVE / ".tmp-justborn").mkdir()  # a pod being created right now: too young
    age_dir(tmp_path, f"{LIVE}/.tmp-justborn", 60)
    put(tmp_path, f"old-model-aaaaaaaaaaaa/{chunk_name(3)}", 5 * MIB, age_s=7200)
    age_dir(tmp_path, "old-model-aaaaaaaaaaaa", 7200)
    put(tmp_path, f"rolling-model-bbbbbbbbbbbb/{chunk_name(4)}", MIB, age_s=7200)  # old pods still use it
    age_dir(tmp_path, "rolling-model-bbbbbbbbbbbb", 7200)
    pods = [vllm_pod("rag-0", LIVE, ".tmp-live1"), vllm_pod("rag-old", "rolling-model-bbbbbbbbbbbb", ".tmp-x"),
            vllm_pod("rag-done", "old-model-aaaaaaaaaaaa", ".tmp-y", phase="Succeeded")]
    s = run(config(), tmp_path, list_pods=lambda: pods, now=NOW)
    assert s.pods_listed and s.live_pods == 2
    assert (s.tmp_dirs_deleted, s.stale_model_dirs_deleted) == (1, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [l2_directories.STATE_FILE, LIVE, "rolling-model-bbbbbbbbbbbb"]
    assert s.protected_dirs == {"rolling-model-bbbbbbbbbbbb": "named by a running or pending Pod"}
    assert sorted(p.name for p in (tmp_path / LIVE).iterdir()) == [".tmp-justborn", ".tmp-live1"]
    assert s.bytes_freed == 5 * MIB


def test_old_flat_layout_at_the_root_is_tolerated(tmp_path):
    """Chunk files and ``.tmp-*`` directly at the PVC root (URL fs://.../l2cache/)."""
    put(tmp_path, chunk_name(1), MIB, age_s=7200)
    put(tmp_path, f".tmp-oldpod/{chunk_name(2)}", MIB, age_s=7200)
    age_dir(tmp_path, ".tmp-oldpod", 7200)
    put(tmp_path, chunk_name(3).replace(".data", ".tmp"), MIB, age_s=7200)  # no temp dir configured
    # While a pod still writes at the root, its chunks are live (evictable, not stale).
    flat_pod = [vllm_pod("rag-0", "", ".tmp-flat")]
    s = run(config(), tmp_path, list_pods=lambda: flat_pod, now=NOW)
    assert (tmp_path / chunk_name(1)).exists() and s.stale_files_deleted == 1  # only the stray .tmp file
    assert s.tmp_dirs_deleted == 1
    # Once every pod uses the model directory, the root's chunks are an old layout: kept for the
    # grace period after a Pod last wrote there (a rollback may need them), removed after it.
    pods = [vllm_pod("rag-0", LIVE, ".tmp-a")]
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: pods, now=NOW + 3600)
    assert (tmp_path / chunk_name(1)).exists() and s.protected_dirs == {"": "in use within the grace period"}
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: pods, now=NOW + l2_janitor.DIR_GRACE_S + 1)
    assert not (tmp_path / chunk_name(1)).exists() and s.stale_files_deleted == 1


def test_without_the_pod_list_nothing_but_chunks_is_touched(tmp_path):
    (tmp_path / LIVE / ".tmp-unknown").mkdir(parents=True)
    age_dir(tmp_path, f"{LIVE}/.tmp-unknown", 7200)
    put(tmp_path, f"other-model-cccccccccccc/{chunk_name(1)}", MIB, age_s=7200)

    def broken():
        raise OSError("403 Forbidden")

    s = run(config(), tmp_path, list_pods=broken, now=NOW)
    assert not s.pods_listed and s.exit_code == l2_janitor.EXIT_ERROR == 2 and "403" in s.errors[0]
    assert (tmp_path / LIVE / ".tmp-unknown").is_dir() and (tmp_path / "other-model-cccccccccccc").is_dir()


def test_dry_run_deletes_nothing(tmp_path):
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=7200)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW, dry_run=True)
    assert s.evicted_chunks_deleted == 30 and len(list((tmp_path / LIVE).iterdir())) == 90


def test_config_is_validated():
    with pytest.raises(ValueError, match="watermarks"):
        config(low_watermark=0.9)
    with pytest.raises(ValueError, match="one path component"):
        config(live_dir="a/b")
    with pytest.raises(ValueError, match="janitor config"):
        config_from_dict({"line": "x"})


def test_json_summary_and_prometheus_text(tmp_path):
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=7200)
    (tmp_path / "janitor.json").write_text(json.dumps(config().__dict__))
    root = tmp_path / "pvc"
    (tmp_path / LIVE).rename(root / LIVE) if root.mkdir() is None else None
    out = subprocess.run([sys.executable, l2_janitor.__file__, "--config", str(tmp_path / "janitor.json"), "--root",
                          str(root), "--no-pods", "--metrics-file", str(tmp_path / "m.prom"), "--termination-log",
                          str(tmp_path / "term")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["event"] == "kvcache_l2_janitor" and summary["evicted_chunks_deleted"] == 30
    assert summary["used_bytes_after"] == 60 * MIB and summary["high_watermark_bytes"] == int(0.8 * 100 * MIB)
    assert json.loads((tmp_path / "term").read_text()) == summary
    text = (tmp_path / "m.prom").read_text()
    assert 'kvcache_l2_janitor_used_bytes{line="rag-assistant",namespace="rag-assistant"} 62914560' in text
    again = run(config(), root, list_pods=None, now=NOW)
    assert prometheus_text(again).count("# TYPE") == 21
    # The timestamp is when the pass finished, not when the text was made.
    assert f'kvcache_l2_janitor_last_run_timestamp_seconds{{line="rag-assistant",namespace="rag-assistant"}} ' \
           f'{again.finished_at!r}' in prometheus_text(again)
    assert NOW - 1 < again.finished_at < NOW + 60


def test_an_unmounted_pvc_is_an_error_not_an_empty_directory(tmp_path):
    s = run(config(), tmp_path / "not-mounted", list_pods=lambda: [], now=NOW)
    assert s.exit_code == 2 and s.errors == [f"{tmp_path / 'not-mounted'} is not a directory (PVC not mounted?)"]
    assert abs(s.finished_at - NOW) < 1


# --- directories a configuration or Pod may still need (issue 15 item 7) -------------------------

MODEL_A = "qwen2-7b-instruct-aaaaaaaaaaaa"
MODEL_B = "qwen2-7b-instruct-bbbbbbbbbbbb"
MODEL_C = "qwen2-7b-instruct-cccccccccccc"
DAY = 86400


def model_dir(root: Path, name: str, age_s: float = 3 * DAY) -> None:
    """A model directory whose chunks (and itself) were last written ``age_s`` ago: a line that
    only reads its cache writes nothing, so an old mtime says nothing about use."""
    put(root, f"{name}/{chunk_name(1)}", MIB, age_s=age_s)
    age_dir(root, name, age_s)


def names_at(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != l2_directories.STATE_FILE)


def test_rollback_finds_its_directory_whichever_janitor_runs(tmp_path):
    """A, then B, then back to A. The pass of B's janitor that runs after B's Pods went and before
    the rolled-back Pods of A exist must not delete A, however long ago A was configured; the
    janitor of A, rolled back itself, keeps B the same way."""
    for name in (MODEL_A, MODEL_B):
        model_dir(tmp_path, name, age_s=10 * DAY)
    pod_a, pod_b = vllm_pod("rag-a", MODEL_A, ".tmp-a"), vllm_pod("rag-b", MODEL_B, ".tmp-b")
    run(config(live_dir=MODEL_A, max_age_s=None), tmp_path, list_pods=lambda: [pod_a], now=NOW - 9 * DAY)
    run(config(live_dir=MODEL_B, max_age_s=None), tmp_path, list_pods=lambda: [pod_b], now=NOW - 8 * DAY)
    # Days later the rollback starts: B's Pods are gone, A's do not exist yet, B's janitor runs.
    s = run(config(live_dir=MODEL_B, max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.errors == [] and s.stale_model_dirs_deleted == 0
    assert names_at(tmp_path) == [MODEL_A, MODEL_B] and s.protected_dirs == {MODEL_A: "previous configuration"}
    # A's janitor (the rolled-back configuration) keeps B, now the previous one.
    s = run(config(live_dir=MODEL_A, max_age_s=None), tmp_path, list_pods=lambda: [pod_a], now=NOW + 600)
    assert names_at(tmp_path) == [MODEL_A, MODEL_B] and s.protected_dirs == {MODEL_B: "previous configuration"}
    # A third model: A is the previous configuration; B, configured 8 days ago, goes.
    model_dir(tmp_path, MODEL_C, age_s=0)
    s = run(config(live_dir=MODEL_C, max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW + 2 * DAY)
    assert names_at(tmp_path) == [MODEL_A, MODEL_C] and s.stale_model_dirs_deleted == 1
    assert s.protected_dirs == {MODEL_A: "previous configuration"}


def test_a_pod_created_during_the_pass_keeps_its_directory(tmp_path):
    """The Pods are listed again right before a directory goes: a Pod created after the pass's
    first listing (the operator re-rendering, a rollout) keeps the directory it names."""
    seed_state(tmp_path, [(MODEL_A, 9 * DAY), (MODEL_B, 8 * DAY), (LIVE, 600)])
    model_dir(tmp_path, MODEL_A)
    calls = []

    def pods_appear():
        calls.append(1)
        return [] if len(calls) == 1 else [vllm_pod("rag-new", MODEL_A, ".tmp-n", phase="Pending")]

    s = run(config(), tmp_path, list_pods=pods_appear, now=NOW)
    assert len(calls) == 2 and names_at(tmp_path) == [MODEL_A] and s.stale_model_dirs_deleted == 0
    assert s.protected_dirs == {MODEL_A: "named by a running or pending Pod"} and s.errors == []


def test_a_pending_pod_keeps_its_directory(tmp_path):
    """A Pod that waits for a GPU or an image has no container yet, but its env names the
    directory (the policy mutates it at admission)."""
    seed_state(tmp_path, [(MODEL_A, 9 * DAY), (MODEL_B, 8 * DAY), (LIVE, 600)])
    model_dir(tmp_path, MODEL_A)
    pending = vllm_pod("rag-p", MODEL_A, ".tmp-p", phase="Pending")
    pending["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
    s = run(config(), tmp_path, list_pods=lambda: [pending], now=NOW)
    assert names_at(tmp_path) == [MODEL_A] and s.protected_dirs == {MODEL_A: "named by a running or pending Pod"}


def test_a_directory_a_pod_used_is_kept_for_the_grace_period(tmp_path):
    """Pods that went (scaled to 0, refused at admission while Kyverno is down, evicted) may come
    back on their directory: it is kept for dir_grace_s after a Pod last named it."""
    seed_state(tmp_path, [(MODEL_A, 9 * DAY), (MODEL_B, 8 * DAY), (LIVE, 600)])
    model_dir(tmp_path, MODEL_A)
    run(config(max_age_s=None), tmp_path, list_pods=lambda: [vllm_pod("rag-old", MODEL_A, ".tmp-o")], now=NOW)
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW + l2_janitor.DIR_GRACE_S - 60)
    assert names_at(tmp_path) == [MODEL_A] and s.protected_dirs == {MODEL_A: "in use within the grace period"}
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW + l2_janitor.DIR_GRACE_S + 60)
    assert names_at(tmp_path) == [] and s.stale_model_dirs_deleted == 1


def test_two_janitors_overlapping_keep_each_others_directory(tmp_path):
    """Two janitors with different configurations (a Pod deleted by hand is replaced while it
    terminates, during a rollout or a rollback) pass in turn, long after the grace period: each
    keeps the other's directory, through the shared state."""
    for name in (MODEL_A, MODEL_B):
        model_dir(tmp_path, name, age_s=10 * DAY)
    seed_state(tmp_path, [(MODEL_A, 10 * DAY)])
    for i, live in enumerate([MODEL_B, MODEL_A, MODEL_B, MODEL_A, MODEL_B]):
        s = run(config(live_dir=live, max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW + 2 * DAY + i * 300)
        assert s.errors == [] and names_at(tmp_path) == [MODEL_A, MODEL_B], i
        other = MODEL_A if live == MODEL_B else MODEL_B
        assert s.protected_dirs == {other: "previous configuration"}


def test_a_first_pass_without_state_keeps_every_directory_for_the_grace_period(tmp_path):
    """The first pass after this janitor is installed (or after its state was lost) cannot know
    which directory a rollback needs: it keeps them all for dir_grace_s."""
    for name in (MODEL_A, MODEL_B):
        model_dir(tmp_path, name)
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW)
    assert names_at(tmp_path) == [MODEL_A, MODEL_B] and s.errors == []
    assert s.protected_dirs == {MODEL_A: "in use within the grace period", MODEL_B: "in use within the grace period"}
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW + l2_janitor.DIR_GRACE_S + 60)
    assert names_at(tmp_path) == [] and s.stale_model_dirs_deleted == 2


def test_an_unreadable_state_deletes_no_directory_and_is_rebuilt(tmp_path):
    seed_state(tmp_path, [(MODEL_A, 9 * DAY), (LIVE, 600)])
    model_dir(tmp_path, MODEL_A)
    (tmp_path / l2_directories.STATE_FILE).write_text('{"version": 1, "configured": [{"dir"')  # torn by hand
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.exit_code == 2 and "janitor state" in s.errors[0] and names_at(tmp_path) == [MODEL_A]
    assert l2_directories.read_state(tmp_path).in_use == {MODEL_A: NOW}  # rebuilt as a first pass
    assert run(config(), tmp_path, list_pods=lambda: [], now=NOW + 60).errors == []


def test_the_state_is_replaced_atomically_and_written_before_any_deletion(tmp_path, monkeypatch):
    """A write that fails leaves the previous state whole and deletes no directory."""
    seed_state(tmp_path, [(MODEL_A, 9 * DAY), (MODEL_B, 8 * DAY), (LIVE, 600)])
    before = (tmp_path / l2_directories.STATE_FILE).read_text()
    model_dir(tmp_path, MODEL_A)

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(l2_janitor.os, "replace", no_rename)
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.exit_code == 2 and "writing" in s.errors[0] and names_at(tmp_path) == [MODEL_A]
    assert (tmp_path / l2_directories.STATE_FILE).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []  # no temp file left
    monkeypatch.undo()
    s = run(config(max_age_s=None), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.errors == [] and names_at(tmp_path) == [] and json.loads((tmp_path / l2_directories.STATE_FILE).read_text())


def test_a_directory_is_renamed_aside_before_it_is_deleted(tmp_path, monkeypatch):
    """A Pod starting on a directory while it is deleted finds it whole or not at all: the pass
    renames it in one step, then deletes the renamed tree; a pass that dies in between leaves
    only the renamed tree, which the next pass removes."""
    seed_state(tmp_path, [(MODEL_A, 9 * DAY), (MODEL_B, 8 * DAY), (LIVE, 600)])
    model_dir(tmp_path, MODEL_A)
    real_rmtree = shutil.rmtree

    def dies(path, *args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(l2_janitor.shutil, "rmtree", dies)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    (trash,) = names_at(tmp_path)
    assert trash.startswith(l2_janitor.TRASH_PREFIX + MODEL_A) and s.exit_code == 2
    monkeypatch.setattr(l2_janitor.shutil, "rmtree", real_rmtree)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW + 600)
    assert names_at(tmp_path) == [] and s.errors == [] and s.used_bytes_before == 0


def test_a_dry_run_writes_no_state(tmp_path):
    model_dir(tmp_path, MODEL_A)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW, dry_run=True)
    assert not (tmp_path / l2_directories.STATE_FILE).exists() and s.protected_dirs == {
        MODEL_A: "in use within the grace period"}


# --- the long-lived service (--serve) ----------------------------------------------------------

def quiet_service(root: Path, **kw) -> l2_janitor.JanitorService:
    return l2_janitor.JanitorService(config(), root, log=lambda line: None, **{"list_pods": lambda: [], **kw})


def test_readiness_shows_a_failing_janitor_and_recovers(tmp_path):
    pods: list = []

    def list_pods():
        if not pods:
            raise OSError("403 Forbidden: pods is forbidden")
        return []

    service = quiet_service(tmp_path, list_pods=list_pods)
    assert service.readiness() == (False, "no pass has finished yet") and service.metrics() == ""
    assert service.run_pass().exit_code == 2  # an error: 2, as for every tool (operator_tools/cli.py)
    ready, why = service.readiness()
    assert not ready and "403 Forbidden" in why and service.liveness() == (True, "ok")
    assert 'kvcache_l2_janitor_errors{line="rag-assistant",namespace="rag-assistant"} 1' in service.metrics()
    assert 'kvcache_l2_janitor_status{line="rag-assistant",namespace="rag-assistant"} 2' in service.metrics()
    pods.append("fixed")
    service.run_pass()
    assert service.readiness() == (True, "ok")
    assert 'kvcache_l2_janitor_errors{line="rag-assistant",namespace="rag-assistant"} 0' in service.metrics()


def test_above_the_high_watermark_is_ready_but_reported(tmp_path):
    for i in range(95):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=60)  # all too young to delete
    service = quiet_service(tmp_path)
    assert service.run_pass().exit_code == l2_janitor.EXIT_ABOVE_HIGH_WATERMARK == 1  # "the answer is no"
    assert service.readiness() == (True, "ok (still above the high watermark)")
    assert 'kvcache_l2_janitor_status{line="rag-assistant",namespace="rag-assistant"} 1' in service.metrics()


def test_liveness_fails_only_while_a_pass_runs_past_its_deadline(tmp_path):
    release = threading.Event()
    entered = threading.Event()

    def stuck_listing():  # stands in for a pass stuck on the FUSE mount
        entered.set()
        release.wait(10)
        return []

    service = quiet_service(tmp_path, list_pods=stuck_listing, pass_deadline_s=1.0)
    worker = threading.Thread(target=service.run_pass)
    worker.start()
    assert entered.wait(5)
    assert service.liveness() == (True, "ok")  # running, within the deadline
    time.sleep(1.2)
    alive, why = service.liveness()
    assert not alive and "longer than 1 s" in why
    release.set()
    worker.join(5)
    assert service.liveness() == (True, "ok") and service.passes == 1


def test_an_unexpected_exception_is_a_failed_pass_and_the_service_goes_on(tmp_path, monkeypatch):
    service = quiet_service(tmp_path)

    def boom(*args, **kwargs):
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(l2_janitor, "run", boom)
    s = service.run_pass()
    assert s.errors == ["unexpected ZeroDivisionError: bug"] and s.exit_code == 2 and s.finished_at > 0
    assert not service.readiness()[0]
    monkeypatch.undo()
    assert service.run_pass().exit_code == 0 and service.readiness()[0]


def test_the_loop_runs_one_pass_at_a_time_every_period(tmp_path):
    active, most, starts = [0], [0], []
    lock = threading.Lock()

    def list_pods():
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            starts.append(time.monotonic())
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return []

    stop = threading.Event()

    def list_pods_then_stop_after_four():  # counted, not timed: a loaded machine only lengthens gaps
        pods = list_pods()
        if len(starts) == 4:
            stop.set()
        return pods

    service = quiet_service(tmp_path, list_pods=list_pods_then_stop_after_four, period_s=0.2)
    loop = threading.Thread(target=service.loop, args=(stop,))
    loop.start()
    loop.join(10)
    assert not loop.is_alive() and most[0] == 1
    assert service.passes == 4  # stop is checked between passes: none starts after it is set
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(g >= 0.19 for g in gaps), gaps  # a period from start to start, not back to back


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_runs_passes_and_serves_metrics_and_health_until_sigterm(tmp_path):
    """The command the Deployment runs, as a process: HTTP on its port, a pass every period,
    exit 0 on SIGTERM (the kubelet's stop)."""
    for i in range(90):
        put(tmp_path / "pvc", f"{LIVE}/{chunk_name(i)}", MIB, age_s=7200)
    (tmp_path / "janitor.json").write_text(json.dumps(config().__dict__))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, l2_janitor.__file__, "--config", str(tmp_path / "janitor.json"),
                             "--root", str(tmp_path / "pvc"), "--no-pods", "--serve", "--port", str(port),
                             "--period-s", "1", "--termination-log", str(tmp_path / "term")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _ = _get(base + "/readyz")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        status, text = _get(base + "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert status == 200 and families["kvcache_l2_janitor_used_bytes"].samples[0].value == 60 * MIB
        first = families["kvcache_l2_janitor_last_run_timestamp_seconds"].samples[0].value
        assert abs(first - time.time()) < 30
        assert _get(base + "/healthz") == (200, "ok\n") and _get(base + "/nothing")[0] == 404
        time.sleep(2.5)  # two more periods: two more passes
        _, text = _get(base + "/metrics")
        later = {f.name: f for f in text_string_to_metric_families(text)}
        assert later["kvcache_l2_janitor_last_run_timestamp_seconds"].samples[0].value >= first + 1
        assert later["kvcache_l2_janitor_deleted_evicted_chunks"].samples[0].value == 0  # nothing left to evict
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    passes = [json.loads(line) for line in out.splitlines()]
    assert len(passes) >= 3 and passes[0]["evicted_chunks_deleted"] == 30 and passes[0]["used_bytes_after"] == 60 * MIB
    assert json.loads((tmp_path / "term").read_text()) == passes[-1]


# --- the chart objects --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def manifests():
    return render_manifests(load_project(FIXTURE_CONFIG), volume_id="vol-0a1b2c3d4e5f60718",
                            availability_zone="us-west-2a", scaling=project_scaling(load_project(FIXTURE_CONFIG)))


def _one(objects, kind):
    (hit,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == janitor_chart.NAME]
    return hit


def test_janitor_chart_objects(manifests):
    project = load_project(FIXTURE_CONFIG)
    for line in project.business_lines:
        objs = manifests[names.line_chart_name(line)]
        if not line.cache.l2_enabled:  # nothing to bound: no janitor
            assert not [o for o in objs if o["metadata"]["name"] == janitor_chart.NAME]
            continue
        assert not [o for o in objs if o["kind"] in ("CronJob", "Job")], "one long-lived janitor, no CronJob"
        cm = _one(objs, "ConfigMap")
        conf = config_from_dict(json.loads(cm["data"]["janitor.json"]))
        assert conf.live_dir == l2_cache_dir(project.platform, line), "the live directory comes from the contract"
        assert conf.min_delete_age_s == 600 and conf.mount_path == MOUNT and conf.dir_grace_s == 24 * 3600
        assert cm["data"]["l2_janitor.py"] == Path(l2_janitor.__file__).read_text()
        role = _one(objs, "Role")
        # List Pods; for the chunk key (docs/security.md, "Chunk keys") create Secrets and get the line's one only.
        secret = f"kvcache-l2-key-{line.cache.chunk_key_generation}"
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [secret]}]
        assert conf.key_secret == secret
        deployment = _one(objs, "Deployment")["spec"]
        assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}
        template = deployment["template"]
        assert deployment["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "l2-janitor"
        # A new script or config rolls the Pod: the template carries the ConfigMap's hash.
        digest = hashlib.sha256(json.dumps(cm["data"], sort_keys=True).encode()).hexdigest()
        assert template["metadata"]["annotations"] == {"kvcache.io/l2-janitor-config-sha256": digest}
        pod = template["spec"]
        assert pod.get("restartPolicy", "Always") == "Always"
        (c,) = pod["containers"]
        assert c["image"] == project.platform.versions.images.l2_janitor and ":" in c["image"]
        command = c["command"]
        assert command[:2] == ["python3", "/opt/kvcache-janitor/l2_janitor.py"] and "--serve" in command
        flags = dict(zip(command[2::1], command[3::1]))
        assert (flags["--port"], flags["--period-s"], flags["--pass-deadline-s"]) == ("9100", "600", "1800")
        assert c["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
        assert c["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 60,
                                      "failureThreshold": 3, "timeoutSeconds": 5}
        assert c["readinessProbe"] == {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 30,
                                       "failureThreshold": 1, "timeoutSeconds": 5}
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == [names.pvc_name(line)]
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {MOUNT}
        # Not the operator's label: the L2 policy must never match the janitor.
        assert names.OPERATOR_POD_LABEL not in template["metadata"]["labels"]


def test_the_minimum_age_covers_a_period_and_a_stuck_pass_is_restarted():
    """Every file is seen by one pass before a later pass may delete it; a pass stuck past its
    deadline fails liveness 3 times (a minute apart) and the container restarts."""
    assert janitor_chart.MIN_DELETE_AGE_S >= janitor_chart.PERIOD_S == l2_janitor.PERIOD_S == 600
    assert janitor_chart.PASS_DEADLINE_S == 1800 > janitor_chart.PERIOD_S
    assert janitor_chart.LIVENESS_PERIOD_S * janitor_chart.LIVENESS_FAILURES == 180


# --- exit codes of a run by hand (docs/l2-cache.md): the operator tools' convention --------------

def _one_shot(tmp_path: Path, *args: str, cfg: dict | None = None) -> subprocess.CompletedProcess:
    conf = tmp_path / "janitor.json"
    conf.write_text(json.dumps(cfg if cfg is not None else config().__dict__))
    return subprocess.run([sys.executable, l2_janitor.__file__, "--config", str(conf), *args],
                          capture_output=True, text=True, timeout=60)


def test_one_shot_exit_codes_follow_the_tools_convention(tmp_path):
    """0 fine, 1 "the answer is no" (still above the high watermark), 2 an error: never 1 for an
    error (operator_tools/cli.py), whether the pass, the config, a flag or the metrics file fails."""
    from operator_tools import cli

    root = tmp_path / "pvc"
    for i in range(95):
        put(root, f"{LIVE}/{chunk_name(i)}", MIB, age_s=60)  # all younger than the minimum age
    assert _one_shot(tmp_path, "--root", str(root), "--no-pods").returncode == cli.EXIT_NO == 1
    assert _one_shot(tmp_path, "--root", str(tmp_path / "missing"), "--no-pods").returncode == cli.EXIT_ERROR
    assert _one_shot(tmp_path, "--root", str(root), cfg={"line": "x"}).returncode == cli.EXIT_ERROR
    assert _one_shot(tmp_path, "--root", str(root), "--frobnicate").returncode == cli.EXIT_ERROR
    unwritable = _one_shot(tmp_path, "--root", str(root), "--no-pods", "--metrics-file", str(tmp_path / "no" / "m"))
    assert unwritable.returncode == cli.EXIT_ERROR and "Traceback" not in unwritable.stderr
    assert "error: cannot write" in unwritable.stderr


def test_help_states_the_exit_codes_of_the_readme_table():
    from operator_tools import cli

    assert l2_janitor.EXIT_EPILOG == cli.exit_epilog("cluster_agents/l2_janitor.py")
    assert (l2_janitor.EXIT_OK, l2_janitor.EXIT_ABOVE_HIGH_WATERMARK, l2_janitor.EXIT_ERROR) == (
        cli.EXIT_OK, cli.EXIT_NO, cli.EXIT_ERROR)
    out = subprocess.run([sys.executable, l2_janitor.__file__, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and l2_janitor.EXIT_EPILOG in " ".join(out.stdout.split())


# --- the contract with the charts: copied names (the janitor runs alone), checked here ----------

def test_copied_names_equal_the_charts():
    """l2_janitor.py is standard-library only (it ships in a ConfigMap), so it repeats a few names
    of k8s/lmcache.py and k8s/patch.py; each copy must equal its source."""
    from k8s import janitor as janitor_chart
    from k8s.lmcache import FS_CONNECTOR_EXTRA_KEYS, TMP_DIR_PREFIX, env_name, extra_config
    from k8s.patch import DEPLOYMENT_TMP_TOKEN, L2_MOUNT_PATH

    assert l2_janitor.TMP_DIR_PREFIX == TMP_DIR_PREFIX
    assert l2_directories.REMOTE_URL_ENV == env_name("remote_url")
    assert l2_directories.EXTRA_CONFIG_ENV == env_name("extra_config")
    # The key k8s.lmcache.extra_config puts the per-pod temp directory under, and the fs
    # connector reads.
    assert extra_config("tok")[l2_directories.TMP_DIR_KEY] == f"{TMP_DIR_PREFIX}tok"
    assert l2_directories.TMP_DIR_KEY in FS_CONNECTOR_EXTRA_KEYS
    assert l2_directories.POD_NAME_REFERENCE == DEPLOYMENT_TMP_TOKEN
    assert janitor_chart.PERIOD_S == l2_janitor.PERIOD_S and MOUNT == L2_MOUNT_PATH


def _running(pod: dict, name: str) -> dict:
    pod = json.loads(json.dumps(pod))
    pod["metadata"]["name"] = name
    pod["status"] = {"phase": "Running"}
    return pod


def _l2_lines():
    project = load_project(FIXTURE_CONFIG)
    return [pytest.param(project, line, id=line.name) for line in project.business_lines if line.cache.l2_enabled]


@pytest.mark.parametrize("project, line", _l2_lines())
def test_live_pods_of_the_rendered_policy(project, line, tmp_path):
    """Pods mutated by the real rendered Kyverno policy (tests.k8s.kyverno_eval on the operator's
    pods, tests.k8s.operator_render): the janitor finds the line's live directory and each pod's
    random temp directory, and a pass keeps those while it removes a stale one."""
    from k8s.kyverno import policy_manifest
    from k8s.patch import line_cache_env
    from tests.k8s import operator_render
    from tests.k8s.kyverno_eval import apply_policy

    policy = policy_manifest(project.platform, line)
    pods = [_running(apply_policy(policy, operator_render.pod(line), seed=i), f"{line.name}-5d8f7c9b4-{i}")
            for i in range(3)]
    conf = config_from_dict(janitor_chart.janitor_config(project.platform, line))
    live = live_pods_from_objects(pods, conf.mount_path)
    tokens = sorted(json.loads(e["value"])[l2_directories.TMP_DIR_KEY] for p in pods for c in p["spec"]["containers"]
                    for e in c.get("env") or [] if e["name"] == "LMCACHE_EXTRA_CONFIG")
    assert len(set(tokens)) == 3 and all(t.startswith(".tmp-") for t in tokens)
    assert live.count == 3 and live.bases == {conf.live_dir}
    assert live.tmp_dirs == {f"{conf.live_dir}/{t}" for t in tokens}
    # The directory the janitor protects is the one in the pods' URL.
    assert line_cache_env(project.platform, line)["LMCACHE_REMOTE_URL"].endswith(f"/{conf.live_dir}/")
    # A pass keeps the live temp directories and removes the one no pod uses.
    for t in [*tokens, ".tmp-gone"]:
        put(tmp_path, f"{conf.live_dir}/{t}/{chunk_name(1)}", MIB, age_s=7200)
        age_dir(tmp_path, f"{conf.live_dir}/{t}", 7200)
    s = run(conf, tmp_path, list_pods=lambda: pods, now=NOW)
    assert s.errors == [] and s.tmp_dirs_deleted == 1
    assert sorted(p.name for p in (tmp_path / conf.live_dir).iterdir()) == tokens


@pytest.mark.parametrize("project, line", _l2_lines())
def test_live_pods_of_the_deployment_patch(project, line):
    """Pods of the operator's Deployment patched by k8s.patch.endpoint_json_patch: the temp
    directory is ``.tmp-$(KVCACHE_POD_NAME)``, which the janitor expands to each pod's name."""
    import jsonpatch

    from k8s.patch import endpoint_json_patch
    from tests.k8s import operator_render

    dep = operator_render.deployment(line)
    patched = jsonpatch.apply_patch(dep, endpoint_json_patch(project.platform, line, deployment=dep))
    names_ = [f"{line.name}-5d8f7c9b4-{s}" for s in ("abcde", "fghij")]
    pods = [_running(operator_render.pod_from_deployment(patched), n) for n in names_]
    pods.append({**_running(operator_render.pod_from_deployment(patched), f"{line.name}-old"),
                 "status": {"phase": "Succeeded"}})  # a finished pod protects nothing
    conf = config_from_dict(janitor_chart.janitor_config(project.platform, line))
    live = live_pods_from_objects(pods, conf.mount_path)
    assert live.count == 2 and live.bases == {conf.live_dir}
    assert live.tmp_dirs == {f"{conf.live_dir}/.tmp-{n}" for n in names_}


# --- hot prefixes (issue 17): pinned chunks are never deleted, the rest goes oldest first -------------


def ranked_chunk(i: int, worker: int, world: int = 2) -> str:
    return f"-SEP-opt-SEP-ml-SEP-model@{world}@{worker}@{i:016x}@bfloat16.data"


def test_pinned_chunks_survive_the_age_limit_and_the_watermarks_the_rest_goes_oldest_first(tmp_path):
    """Twenty 5 MiB chunks of two TP ranks, all past the 24 h age limit except the ten newest; the
    four chunks of a hot prefix (eight files) are the oldest. The age limit deletes every other old
    chunk; the watermarks then evict the newest chunks oldest first, down to 60 MiB; the pinned files
    stay, counted in the use."""
    root = tmp_path / "l2"
    pinned = {f"{i:016x}" for i in range(4)}
    for i in range(20):
        for w in range(2):
            put(root, f"{LIVE}/{ranked_chunk(i, w)}", 5 * MIB, age_s=100 * 3600 - i * 3600 if i < 10 else 3600 * (20 - i))
    s = run_settled(config(), root, list_pods=lambda: [], pinned=frozenset(pinned))
    left = sorted(os.listdir(root / LIVE))
    kept_hashes = {name.split("@")[3] for name in left}
    assert pinned <= kept_hashes  # every pinned chunk, both ranks
    assert all((root / LIVE / ranked_chunk(i, w)).exists() for i in range(4) for w in range(2))
    # Chunks 4-9 were past the age limit: gone. Of 10-19 (100 MiB, plus 40 MiB pinned: above 80 MiB),
    # the oldest go until 60 MiB are left: 40 MiB pinned + 20 MiB = the two newest chunks (18, 19).
    assert kept_hashes == pinned | {f"{i:016x}" for i in (18, 19)}
    assert s.expired_chunks_deleted == 12 and s.evicted_chunks_deleted == 16
    assert s.pinned_chunk_files == 8 and s.pinned_bytes == 40 * MIB and s.used_bytes_after == 60 * MIB
    assert s.pinned_chunks_kept == 8  # every pinned file was past the age limit
    assert f'kvcache_l2_janitor_pinned_bytes{{line="rag-assistant",namespace="rag-assistant"}} {40 * MIB}' \
        in prometheus_text(s)


def test_control_without_pins_the_hot_prefix_goes_first(tmp_path):
    """The same directory without pins: the prefix's chunks, hit but never rewritten, are the oldest
    files and the first the janitor deletes (the issue's complaint)."""
    root = tmp_path / "l2"
    for i in range(20):
        for w in range(2):
            put(root, f"{LIVE}/{ranked_chunk(i, w)}", 5 * MIB, age_s=100 * 3600 - i * 3600 if i < 10 else 3600 * (20 - i))
    s = run_settled(config(), root, list_pods=lambda: [])
    assert not any((root / LIVE / ranked_chunk(i, 0)).exists() for i in range(4))
    assert s.pinned_chunk_files == 0 and s.pinned_chunks_kept == 0


def test_pins_protect_only_the_configured_directory_and_never_young_chunks_anyway(tmp_path):
    """A hash pinned in the live directory does not protect a file of the same hash in another
    directory (the previous model's, kept for a rollback, ages out as before)."""
    root = tmp_path / "l2"
    seed_state(root, [("old-model-000000000000", 3600), (LIVE, 0)])
    put(root, f"old-model-000000000000/{chunk_name(1)}", MIB, age_s=48 * 3600)
    put(root, f"{LIVE}/{chunk_name(1)}", MIB, age_s=48 * 3600)
    s = run_settled(config(), root, list_pods=lambda: [], pinned=frozenset({f"{1:016x}"}))
    assert (root / LIVE / chunk_name(1)).exists()
    assert not (root / "old-model-000000000000" / chunk_name(1)).exists()
    assert s.expired_chunks_deleted == 1 and s.pinned_chunks_kept == 1


def test_the_warmers_state_file_is_not_l2_content(tmp_path):
    from cluster_agents import hot_prefixes

    assert l2_janitor.HOT_PREFIX_STATE_FILE == hot_prefixes.STATE_FILE
    root = tmp_path / "l2"
    put(root, hot_prefixes.STATE_FILE, 1000, age_s=48 * 3600)
    s = run(config(), root, list_pods=lambda: [], now=NOW)
    assert (root / hot_prefixes.STATE_FILE).exists() and s.files_before == 0


def test_on_a_full_pool_evictions_are_deleted_at_once(tmp_path, monkeypatch):
    """The retiring list cannot be written on a full pool (ENOSPC): room comes first, so the pass
    deletes its evictions at once (deleting needs no space) and says so."""
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600 + (90 - i) * 60)

    def full(directory, entries):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(l2_janitor, "write_retiring", full)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.evicted_chunks_deleted == 30 and s.bytes_freed == 30 * MIB and s.retiring_bytes == 0
    assert sorted(p.name for p in (tmp_path / LIVE).iterdir()) == sorted(chunk_name(i) for i in range(30, 90))
    assert s.exit_code == 2 and "30 evicted chunk files deleted at once" in s.errors[0]
# --- the chunk-key Secret ------------------------------------------------------------------------


class FakeSecrets:
    """The API server's Secrets of one namespace, as the janitor's Role sees them: ``create`` anything
    (409 when the name exists), ``get`` the one named Secret; every call recorded."""

    def __init__(self, allowed: str, existing: dict[str, dict] | None = None, fail: int = 0) -> None:
        self.allowed, self.objects, self.fail = allowed, dict(existing or {}), fail
        self.calls: list[tuple[str, str]] = []

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        self.calls.append((method, path))
        if self.fail:
            self.fail -= 1
            raise l2_janitor.core.ApiError(0, f"{method} {path}: connection refused")
        base = "/api/v1/namespaces/rag-assistant/secrets"
        if method == "POST" and path == base:
            name = body["metadata"]["name"]
            if name in self.objects:
                raise l2_janitor.core.ApiError(409, "AlreadyExists")
            self.objects[name] = json.loads(json.dumps(body))
            return body
        if method == "GET" and path.startswith(base + "/"):
            name = path.rsplit("/", 1)[1]
            if name != self.allowed:
                raise l2_janitor.core.ApiError(403, "Forbidden")
            if name not in self.objects:
                raise l2_janitor.core.ApiError(404, "NotFound")
            return self.objects[name]
        raise l2_janitor.core.ApiError(403, f"Forbidden: {method} {path}")


def _secret_value(obj: dict) -> str:
    import base64

    return base64.b64decode(obj["data"]["key"]).decode()


def test_the_janitor_creates_the_chunk_key_once_and_never_overwrites_it() -> None:
    api = FakeSecrets("kvcache-l2-key-1")
    key = l2_janitor.ChunkKey("rag-assistant", "kvcache-l2-key-1", api)
    value = key()
    created = api.objects["kvcache-l2-key-1"]
    assert key.created and value == _secret_value(created) and key() == value
    assert len(value) == 64 and int(value, 16) >= 0  # 256 random bits, hex
    assert created["type"] == "Opaque" and created["immutable"] is True  # the API server refuses any change
    assert [m for m, _ in api.calls] == ["GET", "POST", "GET"]  # read, create when missing, read back
    # A second janitor (a restart, a new Pod) reads the same key and creates nothing.
    api2 = FakeSecrets("kvcache-l2-key-1", existing=api.objects)
    again = l2_janitor.ChunkKey("rag-assistant", "kvcache-l2-key-1", api2)
    assert again() == value and not again.created and [m for m, _ in api2.calls] == ["GET"]
    # Two janitors racing: the loser's create is refused (409) and it reads the winner's key.
    class Racing(FakeSecrets):
        def call(self, method, path, body=None):
            if method == "GET" and not any(m == "POST" for m, _ in self.calls):
                self.calls.append((method, path))
                raise l2_janitor.core.ApiError(404, "NotFound")
            return super().call(method, path, body)
    racing = Racing("kvcache-l2-key-1", existing=api.objects)
    loser = l2_janitor.ChunkKey("rag-assistant", "kvcache-l2-key-1", racing)
    assert loser() == value and not loser.created and racing.objects == api.objects


def test_two_lines_or_generations_get_different_keys() -> None:
    a = l2_janitor.ChunkKey("rag-assistant", "kvcache-l2-key-1", FakeSecrets("kvcache-l2-key-1"))()
    b = l2_janitor.ChunkKey("rag-assistant", "kvcache-l2-key-2", FakeSecrets("kvcache-l2-key-2"))()
    assert a != b


def test_the_janitor_keeps_trying_while_the_api_does_not_answer_and_logs_no_key() -> None:
    api = FakeSecrets("kvcache-l2-key-1", fail=2)
    key = l2_janitor.ChunkKey("rag-assistant", "kvcache-l2-key-1", api)
    logs: list[str] = []
    stop = threading.Event()
    original = l2_janitor.KEY_RETRY_S
    l2_janitor.KEY_RETRY_S = 0.01
    try:
        key.keep_trying(stop, logs.append)
    finally:
        l2_janitor.KEY_RETRY_S = original
    events = [json.loads(line) for line in logs]
    assert [bool(e.get("errors")) for e in events] == [True, True, False] and events[-1]["created"] is True
    assert not any(key() in line for line in logs)  # the key itself is never logged
    # A Secret of another name, or a Secret without the key, is an error, not an empty key.
    with pytest.raises(l2_janitor.core.ApiError):
        l2_janitor.ChunkKey("rag-assistant", "kvcache-l2-key-1", FakeSecrets(
            "kvcache-l2-key-1", existing={"kvcache-l2-key-1": {"data": {}}}))()


def test_the_warmer_of_a_keyed_line_must_name_the_janitors_secret(tmp_path: Path) -> None:
    hot = {"line": "rag-assistant", "namespace": "rag-assistant", "live_dir": "m-0123456789ab", "mount_path": MOUNT,
           "pod_label": ["app", "rag-assistant"], "port": 8000, "port_name": "http", "chunk_size": 4, "world_size": 1,
           "python_hash_seed": 0, "warm_period_s": 60, "hash_algorithm": "sha256_cbor",
           "key_secret": "kvcache-l2-key-2", "prefixes": []}
    (tmp_path / "hot.json").write_text(json.dumps(hot))
    janitor = JanitorConfig(line="rag-assistant", namespace="rag-assistant", live_dir="m-0123456789ab",
                            capacity_bytes=1 << 30, high_watermark=0.9, low_watermark=0.8, max_age_s=None,
                            min_delete_age_s=600, mount_path=MOUNT, key_secret="kvcache-l2-key-1")
    with pytest.raises(ValueError, match="kvcache-l2-key-2"):
        l2_janitor.hot_prefix_warmer(tmp_path / "hot.json", tmp_path, janitor)
    (tmp_path / "hot.json").write_text(json.dumps({**hot, "key_secret": "kvcache-l2-key-1"}))
    warmer = l2_janitor.hot_prefix_warmer(tmp_path / "hot.json", tmp_path, janitor, chunk_key=lambda: "k")
    assert warmer.chunk_key() == "k"
