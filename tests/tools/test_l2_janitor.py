"""The per-line L2 janitor (kv_tools/l2_janitor.py) on a real directory tree, and its chart objects.

File names follow lmcache 0.5.6's fs connector: ``<model path with '/' as -SEP->@<world size>@
<worker id>@<chunk hash hex>@<dtype>.data`` in the base directory, temp files in
``<base>/<fs_connector_relative_tmp_dir>/`` (FSConnector._get_file_name / _get_file_and_tmp_path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k8s import janitor as janitor_chart
from k8s import names
from k8s.lmcache import l2_cache_dir
from k8s.render import render_manifests
from kv_tools import l2_janitor
from kv_tools.l2_janitor import JanitorConfig, config_from_dict, live_pods_from_objects, prometheus_text, run
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


def vllm_pod(name: str, base: str, tmp: str, phase: str = "Running") -> dict:
    return {"metadata": {"name": name}, "status": {"phase": phase},
            "spec": {"containers": [{"name": "vllm", "env": [
                {"name": "LMCACHE_REMOTE_URL", "value": f"fs://localhost:0{MOUNT}/{base}/" if base else f"fs://localhost:0{MOUNT}/"},
                {"name": "LMCACHE_EXTRA_CONFIG", "value": json.dumps({"fs_connector_relative_tmp_dir": tmp})},
                {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]},
                {"name": "sidecar", "env": [{"name": "LMCACHE_REMOTE_URL", "value": "untouched-sidecar"}]}]}}


def test_evicts_oldest_chunks_from_high_down_to_low_watermark(tmp_path):
    # 90 MiB of 100: above the 80 MiB high watermark; must end at or below 60 MiB.
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600 + (90 - i) * 60)  # chunk 0 oldest
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert (s.used_bytes_before, s.used_bytes_after) == (90 * MIB, 60 * MIB)
    assert s.evicted_chunks_deleted == 30 and s.bytes_freed == 30 * MIB and s.exit_code == 0
    left = sorted(p.name for p in (tmp_path / LIVE).iterdir())
    assert left == sorted(chunk_name(i) for i in range(30, 90)), "the 30 oldest went"


def test_below_high_watermark_nothing_is_evicted(tmp_path):
    for i in range(80):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=3600)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.evicted_chunks_deleted == 0 and s.used_bytes_after == 80 * MIB and s.exit_code == 0


def test_young_chunks_are_never_deleted_and_the_run_reports_it(tmp_path):
    for i in range(95):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=60)  # all younger than 10 minutes
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.evicted_chunks_deleted == 0 and s.above_high_watermark_after and s.exit_code == 2


def test_chunks_older_than_the_ttl_expire_but_directories_stay(tmp_path):
    put(tmp_path, f"{LIVE}/{chunk_name(1)}", MIB, age_s=25 * 3600)
    put(tmp_path, f"{LIVE}/{chunk_name(2)}", MIB, age_s=23 * 3600)
    age_dir(tmp_path, LIVE, 30 * 3600)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW)
    assert s.expired_chunks_deleted == 1
    assert (tmp_path / LIVE).is_dir() and [p.name for p in (tmp_path / LIVE).iterdir()] == [chunk_name(2)]


def test_stale_tmp_dirs_and_old_model_dirs_go_live_ones_stay(tmp_path):
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
    assert sorted(p.name for p in tmp_path.iterdir()) == [LIVE, "rolling-model-bbbbbbbbbbbb"]
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
    # Once every pod uses the model directory, the root's chunks are an old layout: removed.
    s = run(config(), tmp_path, list_pods=lambda: [vllm_pod("rag-0", LIVE, ".tmp-a")], now=NOW)
    assert not (tmp_path / chunk_name(1)).exists() and s.stale_files_deleted == 1


def test_without_the_pod_list_nothing_but_chunks_is_touched(tmp_path):
    (tmp_path / LIVE / ".tmp-unknown").mkdir(parents=True)
    age_dir(tmp_path, f"{LIVE}/.tmp-unknown", 7200)
    put(tmp_path, f"other-model-cccccccccccc/{chunk_name(1)}", MIB, age_s=7200)

    def broken():
        raise OSError("403 Forbidden")

    s = run(config(), tmp_path, list_pods=broken, now=NOW)
    assert not s.pods_listed and s.exit_code == 1 and "403" in s.errors[0]
    assert (tmp_path / LIVE / ".tmp-unknown").is_dir() and (tmp_path / "other-model-cccccccccccc").is_dir()


def test_dry_run_deletes_nothing(tmp_path):
    for i in range(90):
        put(tmp_path, f"{LIVE}/{chunk_name(i)}", MIB, age_s=7200)
    s = run(config(), tmp_path, list_pods=lambda: [], now=NOW, dry_run=True)
    assert s.evicted_chunks_deleted == 30 and len(list((tmp_path / LIVE).iterdir())) == 90


def test_live_pods_expand_the_deployment_patch_token():
    pod = vllm_pod("rag-7d9-x", LIVE, ".tmp-$(KVCACHE_POD_NAME)")
    live = live_pods_from_objects([pod], MOUNT)
    assert live.bases == {LIVE} and live.tmp_dirs == {f"{LIVE}/.tmp-rag-7d9-x"}


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
    assert prometheus_text(run(config(), root, list_pods=None, now=NOW)).count("# TYPE") == 13


# --- the chart objects --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def manifests():
    return render_manifests(load_project(FIXTURE_CONFIG), volume_id="vol-0a1b2c3d4e5f60718",
                            availability_zone="us-west-2a")


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
        cm = _one(objs, "ConfigMap")
        conf = config_from_dict(json.loads(cm["data"]["janitor.json"]))
        assert conf.live_dir == l2_cache_dir(project.platform, line), "the live directory comes from the contract"
        assert conf.min_delete_age_s == 600 and conf.mount_path == MOUNT
        assert cm["data"]["l2_janitor.py"] == Path(l2_janitor.__file__).read_text()
        role = _one(objs, "Role")
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
        cron = _one(objs, "CronJob")["spec"]
        assert cron["schedule"] == "*/10 * * * *" and cron["concurrencyPolicy"] == "Forbid"
        pod = cron["jobTemplate"]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["image"] == project.platform.versions.images.l2_janitor and ":" in c["image"]
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == [names.pvc_name(line)]
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {MOUNT}
        # Not the operator's label: the L2 policy must never match the janitor.
        assert names.OPERATOR_POD_LABEL not in cron["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
