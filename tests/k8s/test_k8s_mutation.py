"""The Kyverno policy applied to pods as the operator renders them: exactly one of each setting.

Evaluated with ``kyverno_eval`` (a strict evaluator of the policy subset we emit, JSON patches
applied with the ``jsonpatch`` library); see that module for the semantics simulated.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import kubernetes_validate
import pytest
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.operator_render import OPERATOR_URL, deployment, pod, pod_from_deployment

from k8s import names
from k8s.kube import KUBERNETES_VERSION
from k8s.vllm_plugins import PLUGIN_DIR
from k8s.lmcache import METRICS_DIR, TMP_DIR_PREFIX, owned_env_names
from k8s.patch import L2_MOUNT_PATH, endpoint_json_patch, line_cache_env, line_remote_url, pod_env_entries
import jsonpatch


def _vllm(p, line):
    (c,) = [c for c in p["spec"]["containers"] if c["name"] == names.endpoint_name(line)]
    return c


def _check_end_state(p, line, k8s_project):
    c = _vllm(p, line)
    counts = Counter(e["name"] for e in c["env"])
    for name in owned_env_names(line):
        if name == "KVCACHE_POD_NAME":
            continue
        assert counts[name] == 1, (name, counts[name])
    env = {e["name"]: e.get("value") for e in c["env"]}
    expected = line_cache_env(k8s_project.platform, line, tmp_dir_token="X")
    # L1 size: the line's value per TP rank replaces the operator's (operator_render: "20").
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == expected["LMCACHE_MAX_LOCAL_CPU_SIZE"] == {
        "rag-assistant": "16", "research-reasoning": "20"}[line.name]
    assert float(env["LMCACHE_MAX_LOCAL_CPU_SIZE"]) * line.gpus_per_replica == line.cache.l1_cpu_gib
    assert env["LMCACHE_REMOTE_URL"] == line_remote_url(k8s_project.platform, line) == expected["LMCACHE_REMOTE_URL"]
    assert env["LMCACHE_REMOTE_URL"].startswith("fs://localhost:0/mnt/curvine/l2cache/")
    assert env["LMCACHE_REMOTE_SERDE"] == "naive" and env["LMCACHE_SAVE_UNFULL_CHUNK"] == "false"
    assert env["LMCACHE_TRACK_USAGE"] == "false" and env["DO_NOT_TRACK"] == "1"
    assert env["LMCACHE_CHUNK_SIZE"] == str(line.cache.chunk_size_tokens) == expected["LMCACHE_CHUNK_SIZE"]
    assert env["PYTHONHASHSEED"] == str(line.python_hash_seed)
    # The chunk key: a reference to the line's Secret, never a value (docs/security.md, "Chunk keys").
    assert env["LMCACHE_PRE_CACHING_HASH_ALGORITHM"] == "sha256_cbor"
    assert [e for e in c["env"] if e["name"] == "KVCACHE_L2_KEY"] == [{"name": "KVCACHE_L2_KEY", "valueFrom": {
        "secretKeyRef": {"name": f"kvcache-l2-key-{line.cache.chunk_key_generation}", "key": "key"}}}]
    extra = json.loads(env["LMCACHE_EXTRA_CONFIG"])
    assert set(extra) == {"fs_connector_relative_tmp_dir", "save_chunk_meta"} and extra["save_chunk_meta"] is True
    assert re.fullmatch(re.escape(TMP_DIR_PREFIX) + r"[a-z0-9]{12}", extra["fs_connector_relative_tmp_dir"])
    # Settings the patch does not own survive (the operator's L1 settings, NODE_IP).
    assert env["LMCACHE_LOCAL_CPU"] == "True" and "NODE_IP" in env
    mounts = [m for m in c["volumeMounts"] if m["mountPath"] == L2_MOUNT_PATH]
    assert mounts == [{"name": names.L2_VOLUME_NAME, "mountPath": L2_MOUNT_PATH}]
    vols = [v for v in p["spec"]["volumes"] if v["name"] == names.L2_VOLUME_NAME]
    assert vols == [{"name": names.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": names.pvc_name(line)}}]
    # PROMETHEUS_MULTIPROC_DIR names the one mount of the one disk-backed emptyDir (exists, writable,
    # private to the vLLM container), so LMCache's worker metrics reach vLLM's /metrics.
    assert env["PROMETHEUS_MULTIPROC_DIR"] == METRICS_DIR
    assert [m for m in c["volumeMounts"] if m["mountPath"] == METRICS_DIR or m["name"] == names.METRICS_VOLUME_NAME] == [
        {"name": names.METRICS_VOLUME_NAME, "mountPath": METRICS_DIR}]
    assert [v for v in p["spec"]["volumes"] if v["name"] == names.METRICS_VOLUME_NAME] == [
        {"name": names.METRICS_VOLUME_NAME, "emptyDir": {"sizeLimit": "64Mi"}}]
    # Sidecars are not touched.
    proxy = [c for c in p["spec"]["containers"] if c["name"] == "reverse-proxy"][0]
    assert proxy["env"] == [{"name": "LMCACHE_REMOTE_URL", "value": "untouched-sidecar"}]
    assert all(m["name"] != names.METRICS_VOLUME_NAME for other in p["spec"]["containers"] if other is not c
               for m in other.get("volumeMounts") or [])
    # The result is still a valid Pod.
    kubernetes_validate.validate({**p, "metadata": {**p["metadata"], "name": "x"}}, KUBERNETES_VERSION, strict=True)
    return extra["fs_connector_relative_tmp_dir"]


@pytest.mark.parametrize("refresh", [True, False], ids=["refresh-context", "stale-context"])
@pytest.mark.parametrize("variant", [
    {}, {"strip_cr_lmcache": True}, {"duplicates": False}, {"strip_cr_lmcache": True, "duplicates": False}],
    ids=["duplicates", "operator-strips-cr", "clean", "stripped-clean"])
def test_operator_pod_ends_with_exactly_one_of_each(policy, line, k8s_project, refresh, variant):
    before = pod(line, **variant)
    assert any(e.get("value") == OPERATOR_URL for e in _vllm(before, line)["env"])
    after = apply_policy(policy, before, refresh_context=refresh, seed=1)
    _check_end_state(after, line, k8s_project)


def test_two_pods_get_different_temp_dirs(policy, line, k8s_project):
    a = _check_end_state(apply_policy(policy, pod(line), seed=1), line, k8s_project)
    b = _check_end_state(apply_policy(policy, pod(line), seed=2), line, k8s_project)
    assert a != b


def test_pod_of_an_already_patched_deployment(policy, line, k8s_project):
    """Policy and fallback patch both active: the Pod still has exactly one of each."""
    dep = deployment(line)
    patched = jsonpatch.apply_patch(dep, endpoint_json_patch(k8s_project.platform, line, deployment=dep))
    after = apply_policy(policy, pod_from_deployment(patched), seed=3)
    _check_end_state(after, line, k8s_project)
    env_names = [e["name"] for e in _vllm(after, line)["env"]]
    assert "KVCACHE_POD_NAME" not in env_names  # the policy owns the temp dir token


def test_container_without_env_or_mounts(policy, line, k8s_project):
    p = pod(line)
    c = _vllm(p, line)
    del c["env"], c["volumeMounts"]
    after = apply_policy(policy, p, seed=4)
    env = {e["name"] for e in _vllm(after, line)["env"]}
    assert env == {"LMCACHE_REMOTE_URL", "LMCACHE_REMOTE_SERDE", "LMCACHE_CHUNK_SIZE", "LMCACHE_EXTRA_CONFIG",
                   "PYTHONHASHSEED", "LMCACHE_MAX_LOCAL_CPU_SIZE", "LMCACHE_SAVE_UNFULL_CHUNK",
                   "LMCACHE_PRE_CACHING_HASH_ALGORITHM", "LMCACHE_TRACK_USAGE", "DO_NOT_TRACK",
                   "PROMETHEUS_MULTIPROC_DIR", "LMCACHE_LOOKUP_TIMEOUT_MS", "LMCACHE_BLOCKING_TIMEOUT_SECS",
                   "PYTHONPATH", "KVCACHE_L2_GATE_ENABLED", "KVCACHE_L2_GATE_OPEN_AFTER_MS",
                   "KVCACHE_L2_GATE_LOOKUP_SLOW_MS", "KVCACHE_L2_GATE_CLOSE_AFTER_MS", "KVCACHE_L2_KEY"}
    assert _vllm(after, line)["volumeMounts"] == [{"name": names.L2_VOLUME_NAME, "mountPath": L2_MOUNT_PATH},
                                                  {"name": names.METRICS_VOLUME_NAME, "mountPath": METRICS_DIR},
                                                  {"name": names.VLLM_PLUGINS, "mountPath": PLUGIN_DIR, "readOnly": True}]


def _with_stale_metrics_dir(spec: dict, line) -> None:
    """A pod spec that already names a metrics directory its own way (a CR env, an older patch): a
    PROMETHEUS_MULTIPROC_DIR to a path nothing mounts, a memory-backed volume of our name mounted
    elsewhere, and another volume mounted at our path."""
    (c,) = [c for c in spec["containers"] if c["name"] == names.endpoint_name(line)]
    c["env"].insert(0, {"name": "PROMETHEUS_MULTIPROC_DIR", "value": "/nonexistent"})
    c["volumeMounts"] += [{"name": names.METRICS_VOLUME_NAME, "mountPath": "/elsewhere"},
                          {"name": "scratch", "mountPath": METRICS_DIR}]
    spec["volumes"] += [{"name": names.METRICS_VOLUME_NAME, "emptyDir": {"medium": "Memory"}},
                        {"name": "scratch", "emptyDir": {}}]


@pytest.mark.parametrize("refresh", [True, False], ids=["refresh-context", "stale-context"])
def test_a_metrics_dir_set_elsewhere_is_replaced(policy, line, k8s_project, refresh):
    before = pod(line)
    _with_stale_metrics_dir(before["spec"], line)
    after = apply_policy(policy, before, refresh_context=refresh, seed=11)
    _check_end_state(after, line, k8s_project)
    # The foreign volume loses only its mount at our path; it stays in the Pod (unmounted is valid).
    assert {"name": "scratch", "emptyDir": {}} in after["spec"]["volumes"]


def test_deployment_patch_replaces_a_metrics_dir_set_elsewhere(policy, line, k8s_project):
    dep = deployment(line)
    _with_stale_metrics_dir(dep["spec"]["template"]["spec"], line)
    patched = jsonpatch.apply_patch(dep, endpoint_json_patch(k8s_project.platform, line, deployment=dep))
    tpl = patched["spec"]["template"]["spec"]
    (c,) = [c for c in tpl["containers"] if c["name"] == names.endpoint_name(line)]
    assert [e for e in c["env"] if e["name"] == "PROMETHEUS_MULTIPROC_DIR"] == [
        e for e in pod_env_entries(k8s_project.platform, line) if e["name"] == "PROMETHEUS_MULTIPROC_DIR"] == [
        {"name": "PROMETHEUS_MULTIPROC_DIR", "value": METRICS_DIR}]
    assert [m for m in c["volumeMounts"] if m["mountPath"] == METRICS_DIR or m["name"] == names.METRICS_VOLUME_NAME] == [
        {"name": names.METRICS_VOLUME_NAME, "mountPath": METRICS_DIR}]
    assert [v for v in tpl["volumes"] if v["name"] == names.METRICS_VOLUME_NAME] == [
        {"name": names.METRICS_VOLUME_NAME, "emptyDir": {"sizeLimit": "64Mi"}}]
    # And the Pods of that Deployment, mutated by the policy as well, still hold one of each.
    _check_end_state(apply_policy(policy, pod_from_deployment(patched), seed=12), line, k8s_project)


def test_policy_ignores_other_pods_and_updates(policy, line, k8s_project):
    other = pod(line)
    other["metadata"]["labels"]["app"] = "someone-else"
    assert apply_policy(policy, other) == other
    elsewhere = pod(line)
    elsewhere["metadata"]["namespace"] = "default"
    assert apply_policy(policy, elsewhere) == elsewhere
    assert apply_policy(policy, pod(line), operation="UPDATE") == pod(line)


def test_policy_does_not_touch_controllers(policy):
    """Auto-generation off and Pods only: the operator's Deployment is never rewritten."""
    assert policy["metadata"]["annotations"]["pod-policies.kyverno.io/autogen-controllers"] == "none"
    for rule in policy["spec"]["rules"]:
        for clause in rule["match"]["any"]:
            assert clause["resources"]["kinds"] == ["Pod"]
            assert clause["resources"]["operations"] == ["CREATE"]
    assert policy["spec"]["background"] is False
    assert policy["spec"]["webhookConfiguration"]["failurePolicy"] == "Fail"


def test_policy_selects_the_operator_pods_of_its_line(policy, line):
    (clause,) = policy["spec"]["rules"][0]["match"]["any"]
    assert clause["resources"]["selector"] == {"matchLabels": {"app": names.endpoint_name(line)}}
    assert policy["kind"] == "Policy" and policy["metadata"]["namespace"] == line.namespace
