"""Business-line charts, the LMCache env contract, and the fallback Deployment patch."""

from __future__ import annotations

import json
import re

import jsonpatch
import pytest

from k8s import names
from k8s.kv_transfer import effective_settings
from k8s.kyverno import policy_manifest
from k8s.lmcache import LMCACHE_CONFIG_KEYS, POD_NAME_ENV, env_name, is_lmcache_env, l2_cache_dir, owned_env_names
from k8s.patch import L2_MOUNT_PATH, L2_REMOTE_URL, endpoint_json_patch, line_cache_env, line_remote_url
from k8s.patch import main as patch_main
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from platform_config import ConfigError, load_project
from tests.example_config import FIXTURE_CONFIG, edit_yaml
from tests.k8s.conftest import find
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.operator_render import OPERATOR_URL, deployment, pod


def test_each_line_gets_its_own_namespace_pvc_and_endpoint(manifests, k8s_project):
    seen = {"ns": set(), "pvc": set(), "endpoint": set()}
    for line in k8s_project.business_lines:
        objs = manifests[names.line_chart_name(line)]
        kinds = [o["kind"] for o in objs]
        if line.cache.l2_enabled:
            assert kinds[0] == "Namespace" and kinds[-1] == "InferenceEndpointConfig"
            assert sorted(kinds[1:-1]) == sorted(2 * ["NetworkPolicy"] + ["PodDisruptionBudget", "PersistentVolumeClaim", "Policy"] + 2 * [
                "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Deployment"]  # janitor and canary
                + ["Role", "RoleBinding"]  # the mount watchdog's rights
                + ["ConfigMap"])  # the vLLM plugins (the L2 gate)
            # What the endpoint's pods need exists before it: the mutation and the gate's ConfigMap.
            plugins = next(i for i, o in enumerate(objs) if o["metadata"]["name"] == names.VLLM_PLUGINS)
            assert kinds.index("Policy") < kinds.index("InferenceEndpointConfig") and plugins < len(objs) - 1
            assert kinds.index("PersistentVolumeClaim") < kinds.index("Deployment")
        else:  # no L2: no PVC, no mutation, no janitor
            assert kinds == ["Namespace", "NetworkPolicy", "PodDisruptionBudget", "NetworkPolicy", "InferenceEndpointConfig"]
        # One replica at a time, across the cluster, without ever blocking a drain (k8s/line_chart.py).
        (pdb,) = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
        assert pdb["spec"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                               "selector": {"matchLabels": {"app": names.endpoint_name(line)}}}
        assert objs[0]["metadata"]["name"] == line.namespace
        assert all(o["metadata"]["namespace"] == line.namespace for o in objs[1:])
        ep = find(objs, "InferenceEndpointConfig")
        seen["ns"].add(line.namespace)
        seen["endpoint"].add((line.namespace, ep["metadata"]["name"]))
        if line.cache.l2_enabled:
            seen["pvc"].add((line.namespace, find(objs, "PersistentVolumeClaim")["metadata"]["name"]))
    with_l2 = [l for l in k8s_project.business_lines if l.cache.l2_enabled]
    assert len(seen["ns"]) == len(seen["endpoint"]) == len(k8s_project.business_lines) > len(with_l2) >= 2
    assert len(seen["pvc"]) == len(with_l2)


def test_pvc_is_rwx_on_the_curvine_storage_class(manifests, k8s_project):
    for line in k8s_project.business_lines:
        if not line.cache.l2_enabled:
            assert not [o for o in manifests[names.line_chart_name(line)] if o["kind"] == "PersistentVolumeClaim"]
            continue
        claim = find(manifests[names.line_chart_name(line)], "PersistentVolumeClaim", names.pvc_name(line))
        pvc = claim["spec"]
        assert pvc["accessModes"] == ["ReadWriteMany"]
        assert pvc["storageClassName"] == k8s_project.platform.curvine.storage_class_name == "curvine-sc"
        # Nominal request, l2_size for humans (the janitor enforces it): test_k8s_immutable_fields.
        assert pvc["resources"]["requests"]["storage"] == "1Gi"
        assert claim["metadata"]["annotations"] == {"kvcache.io/l2-size": line.cache.l2_size}
    sizes = {line.name: line.cache.l2_size for line in k8s_project.business_lines}
    assert sizes["rag-assistant"] == "500Gi" and sizes["research-reasoning"] == "2Ti"


def test_endpoint_spec(manifests, k8s_project):
    rag = find(manifests["line-rag-assistant"], "InferenceEndpointConfig")["spec"]
    assert rag["modelName"] == "Qwen2-7B-Instruct" and rag["instanceType"] == "ml.g6e.12xlarge"
    assert rag["replicas"] == 2
    assert rag["modelSourceConfig"] == {"modelSourceType": "s3", "modelLocation": "qwen2-7b-instruct",
                                        "prefetchEnabled": False,
                                        "s3Storage": {"bucketName": "example-model-weights", "region": "us-west-2"}}
    w = rag["worker"]
    assert w["image"] == "lmcache/vllm-openai:v0.5.5"
    assert w["modelInvocationPort"] == {"containerPort": 8000, "name": "http"}
    assert w["modelVolumeMount"] == {"name": "model-weights", "mountPath": "/opt/ml/model"}
    assert w["resources"] == {"limits": {"nvidia.com/gpu": 1},
                              "requests": {"cpu": "10", "memory": "80Gi", "nvidia.com/gpu": 1}}
    assert w["environmentVariables"] == [{"name": "LMCACHE_REMOTE_SERDE", "value": "naive"},
                                         {"name": "PYTHONHASHSEED", "value": "0"}]
    assert not any(e["name"] == "LMCACHE_REMOTE_URL" for e in w["environmentVariables"])
    assert rag["kvCacheSpec"] == {"enableL1Cache": True, "enableL2Cache": True,
                                  "l2CacheSpec": {"l2CacheBackend": "tieredstorage"}}
    assert rag["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "prefixaware"}
    assert rag["metrics"]["enabled"] is True and rag["metrics"]["modelMetrics"]["port"] == 8000
    rr = find(manifests["line-research-reasoning"], "InferenceEndpointConfig")["spec"]
    assert rr["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "kvaware"}
    assert rr["modelSourceConfig"]["huggingFaceModel"] == {
        "modelId": "deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "commitSHA": "0d6d11a6ea1187363aa7b78543f824fc02e06b14"}
    assert rr["worker"]["resources"]["limits"] == {"nvidia.com/gpu": 8}


def test_egress_policy_blocks_exactly_the_curvine_ports(manifests):
    pol = find(manifests["line-rag-assistant"], "NetworkPolicy", "block-curvine-ports")["spec"]
    assert pol["podSelector"] == {} and pol["policyTypes"] == ["Egress"]
    allowed = set()
    for p in pol["egress"][0]["ports"]:
        if p["protocol"] == "TCP":
            allowed |= set(range(p["port"], p.get("endPort", p["port"]) + 1))
    blocked = set(range(1, 65536)) - allowed
    assert blocked == {8995, 8996, 8997, 9001, 9002, 9003}
    assert {"protocol": "UDP"} in pol["egress"][0]["ports"]  # DNS keeps working


def test_network_policies_let_the_janitor_reach_the_api_server_and_be_scraped(manifests, k8s_project):
    """The janitor lists Pods through the API server (TCP 443) and is scraped on its ``metrics``
    port by the AMP collector, which runs outside the cluster: the one ingress policy of a line
    namespace selects only the model pods (``app=<endpoint>``), and every egress policy allows 443."""
    for line in k8s_project.business_lines:
        policies = [o["spec"] for o in manifests[names.line_chart_name(line)] if o["kind"] == "NetworkPolicy"]
        ingress = [p for p in policies if "Ingress" in p["policyTypes"]]
        assert [p["podSelector"] for p in ingress] == [{"matchLabels": {"app": names.endpoint_name(line)}}]
        for p in (p for p in policies if "Egress" in p["policyTypes"]):
            tcp = [(q["port"], q.get("endPort", q["port"])) for rule in p["egress"] for q in rule["ports"]
                   if q["protocol"] == "TCP"]
            assert any(lo <= 443 <= hi for lo, hi in tcp)


def test_every_lmcache_variable_is_one_lmcache_reads(manifests, k8s_project):
    """Policy, CR env and Deployment patch set only variables LMCache 0.5.5 reads."""
    names_set = set()
    for line in k8s_project.business_lines:
        for obj in manifests[names.line_chart_name(line)]:
            text = json.dumps(obj)
            names_set |= set(re.findall(r'"name": "(LMCACHE_[A-Z0-9_]+)"', text))
        names_set |= {op["value"]["name"] for op in endpoint_json_patch(k8s_project.platform, line)
                      if op["path"].endswith("/env/-")}
    lmcache = {n for n in names_set if n.startswith("LMCACHE_")}
    assert lmcache == {"LMCACHE_REMOTE_URL", "LMCACHE_REMOTE_SERDE", "LMCACHE_CHUNK_SIZE", "LMCACHE_EXTRA_CONFIG",
                       "LMCACHE_MAX_LOCAL_CPU_SIZE", "LMCACHE_SAVE_UNFULL_CHUNK",
                       "LMCACHE_PRE_CACHING_HASH_ALGORITHM", "LMCACHE_TRACK_USAGE", "LMCACHE_LOOKUP_TIMEOUT_MS",
                       "LMCACHE_BLOCKING_TIMEOUT_SECS"}
    assert all(is_lmcache_env(n) for n in lmcache)
    assert not is_lmcache_env("LMCACHE_USE_EXPERIMENTAL")  # removed from LMCache (docs/sources.md §5)
    assert not is_lmcache_env("LMCACHE_RUN_SCRIPT_API_ENABLED")  # a 0.5.6 key, not read by 0.5.5
    assert not is_lmcache_env("LMCACHE_MAX_LOCAL_CPU_SIZE_GB")  # a plausible typo LMCache would ignore
    assert {"chunk_size", "remote_url", "remote_serde", "extra_config", "max_local_cpu_size"} <= LMCACHE_CONFIG_KEYS


def test_owned_env_is_exactly_what_the_patch_sets(k8s_project, config_copy):
    """One source of truth: every name the policy or patch appends is owned (removed first), and
    nothing else is, for every L2 line, with telemetry on and off and with or without an L1 size."""
    cfg = config_copy()
    edit_yaml(cfg / "platform.yaml", lambda d: d.setdefault("lmcache", {}).update(usage_telemetry=True))
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["cache"].pop("l1_cpu_gib"))
    edited = load_project(cfg)
    assert edited.platform.lmcache.usage_telemetry and edited.business_line("rag-assistant").cache.l1_cpu_gib is None
    for project in (k8s_project, edited):
        for line in project.business_lines:
            if not line.cache.l2_enabled:
                continue
            emitted = set(line_cache_env(project.platform, line))
            assert "PROMETHEUS_MULTIPROC_DIR" in emitted
            owned = set(owned_env_names(line))
            # The telemetry opt-outs stay owned when telemetry is on, so turning it on removes them.
            # The chunk key is a secretKeyRef entry of the patch (pod_env_entries), not a value of the cache env.
            assert owned - emitted <= {POD_NAME_ENV, "LMCACHE_TRACK_USAGE", "DO_NOT_TRACK", "KVCACHE_L2_KEY"}
            assert emitted <= owned
    # Not an LMCache setting: outside the LMCACHE_* allow-list.
    assert not is_lmcache_env("PROMETHEUS_MULTIPROC_DIR")


def test_cache_env_values(k8s_project):
    line = k8s_project.business_line("rag-assistant")
    env = line_cache_env(k8s_project.platform, line)
    assert env == {
        # The line's model-scoped directory under the PVC root (k8s.lmcache.l2_cache_dir).
        "LMCACHE_REMOTE_URL": f"fs://localhost:0/mnt/curvine/l2cache/{l2_cache_dir(k8s_project.platform, line)}/",
        "LMCACHE_CHUNK_SIZE": "256",
        "LMCACHE_REMOTE_SERDE": "naive",
        "LMCACHE_SAVE_UNFULL_CHUNK": "false",  # LMCache #2206 / PR #2207
        "LMCACHE_PRE_CACHING_HASH_ALGORITHM": "sha256_cbor",  # keyed by KVCACHE_L2_KEY (issue 25)
        "LMCACHE_EXTRA_CONFIG": '{"fs_connector_relative_tmp_dir": ".tmp-$(KVCACHE_POD_NAME)", "save_chunk_meta": true}',
        # What an unhealthy L2 may add to a request (platform.lmcache, docs/l2-cache.md): 200 ms to
        # its lookup, 1 s to each chunk read of its retrieve (LMCache's defaults: 3,000 ms, 10 s).
        "LMCACHE_LOOKUP_TIMEOUT_MS": "200",
        "LMCACHE_BLOCKING_TIMEOUT_SECS": "1",
        "PYTHONHASHSEED": "0",
        "LMCACHE_TRACK_USAGE": "false",  # lmcache.usage_telemetry off by default
        "DO_NOT_TRACK": "1",
        # Not LMCache's: where prometheus_client's multiprocess files go (the mounted emptyDir).
        "PROMETHEUS_MULTIPROC_DIR": "/tmp/prometheus-multiproc",
        # Not LMCache's: where vLLM imports the L2 gate from (the mounted plugin ConfigMap).
        "PYTHONPATH": "/opt/kvcache/vllm-plugins",
        # Not LMCache's: the L2 gate's settings (lmcache.l2_gate, docs/l2-cache.md "When the L2 hangs").
        "KVCACHE_L2_GATE_ENABLED": "1", "KVCACHE_L2_GATE_OPEN_AFTER_MS": "50",
        "KVCACHE_L2_GATE_LOOKUP_SLOW_MS": "100", "KVCACHE_L2_GATE_CLOSE_AFTER_MS": "500",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": "16",  # cache.l1_cpu_gib 16, one TP rank; LMCache reads GiB
    }
    assert re.fullmatch(r"qwen2-7b-instruct-[0-9a-f]{12}", l2_cache_dir(k8s_project.platform, line))
    assert L2_REMOTE_URL.startswith("fs://") and L2_REMOTE_URL.removeprefix("fs://localhost:0").rstrip("/") == L2_MOUNT_PATH
    with pytest.raises(KeyError, match="not an LMCache 0.5.5 config key"):
        env_name("use_experimental")


# --- fallback Deployment patch ------------------------------------------------------------------


def _kubelet_env(env: list[dict], pod_name: str) -> dict[str, str]:
    """Resolve env like the kubelet: later duplicates win, $(VAR) expands from earlier vars."""
    out: dict[str, str] = {}
    for e in env:
        if "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            value = f"<secret {ref['name']}/{ref['key']}>"
        elif "valueFrom" in e:
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            value = {"metadata.name": pod_name, "status.hostIP": "10.1.2.3"}[field]
        else:
            value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: out.get(m.group(1), m.group(0)), e["value"])
        out[e["name"]] = value
    return out


@pytest.mark.parametrize("variant,removed", [({}, 9), ({"strip_cr_lmcache": True}, 7)], ids=["duplicates", "stripped"])
def test_live_patch_leaves_exactly_one_of_each(k8s_project, variant, removed):
    line = k8s_project.business_line("rag-assistant")
    dep = deployment(line, **variant)
    ops = endpoint_json_patch(k8s_project.platform, line, deployment=dep)
    removes = [k for k, op in enumerate(ops) if op["op"] == "remove"]
    # URL(s), EXTRA_CONFIG, MAX_LOCAL_CPU_SIZE, SERDE, PYTHONHASHSEED(s), the host-shm volume and its mount
    assert len(removes) == removed
    assert all(ops[k - 1]["op"] == "test" and ops[k - 1]["path"] == ops[k]["path"] + "/name" for k in removes)
    patched = jsonpatch.apply_patch(dep, ops)
    c = patched["spec"]["template"]["spec"]["containers"][0]
    counts = {n: sum(e["name"] == n for e in c["env"]) for n in line_cache_env(k8s_project.platform, line)}
    assert set(counts.values()) == {1}
    env = _kubelet_env(c["env"], "rag-assistant-5d8f7c9b4-abcde")
    assert json.loads(env["LMCACHE_EXTRA_CONFIG"]) == {"fs_connector_relative_tmp_dir": ".tmp-rag-assistant-5d8f7c9b4-abcde",
                                                       "save_chunk_meta": True}
    assert env["LMCACHE_REMOTE_URL"] == line_remote_url(k8s_project.platform, line) and env["LMCACHE_LOCAL_CPU"] == "True"
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "16"  # ours, not the operator's "20"
    assert [m for m in c["volumeMounts"] if m["mountPath"] == L2_MOUNT_PATH] == [
        {"name": names.L2_VOLUME_NAME, "mountPath": L2_MOUNT_PATH}]
    vols = [v for v in patched["spec"]["template"]["spec"]["volumes"] if v["name"] == names.L2_VOLUME_NAME]
    assert vols == [{"name": names.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": "rag-assistant-l2-cache"}}]
    # Idempotent: patching the patched Deployment again changes nothing but order-free duplicates.
    again = jsonpatch.apply_patch(patched, endpoint_json_patch(k8s_project.platform, line, deployment=patched))
    assert again == patched


def test_live_patch_fails_instead_of_removing_the_wrong_entry(k8s_project):
    line = k8s_project.business_line("rag-assistant")
    dep = deployment(line)
    ops = endpoint_json_patch(k8s_project.platform, line, deployment=dep)
    dep["spec"]["template"]["spec"]["containers"][0]["env"].insert(0, {"name": "INSERTED", "value": "1"})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(dep, ops)


def test_static_patch_matches_the_reference_layout(k8s_project):
    line = k8s_project.business_line("rag-assistant")
    ops = endpoint_json_patch(k8s_project.platform, line)
    assert ops[0] == {"op": "add", "path": "/spec/template/spec/volumes/-",
                      "value": {"name": "curvine-l2-cache", "persistentVolumeClaim": {"claimName": "rag-assistant-l2-cache"}}}
    assert ops[1] == {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
                      "value": {"name": "curvine-l2-cache", "mountPath": "/mnt/curvine/l2cache"}}
    assert ops[2] == {"op": "add", "path": "/spec/template/spec/volumes/-",
                      "value": {"name": "prometheus-multiproc", "emptyDir": {"sizeLimit": "64Mi"}}}
    assert ops[3] == {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
                      "value": {"name": "prometheus-multiproc", "mountPath": "/tmp/prometheus-multiproc"}}
    assert ops[4] == {"op": "add", "path": "/spec/template/spec/volumes/-",
                      "value": {"name": "kvcache-vllm-plugins",
                                "configMap": {"name": "kvcache-vllm-plugins", "defaultMode": 0o444}}}
    assert ops[5] == {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
                      "value": {"name": "kvcache-vllm-plugins", "mountPath": "/opt/kvcache/vllm-plugins", "readOnly": True}}
    env_ops, args_ops = ops[6:-2], ops[-2:]
    assert args_ops == [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--kv-transfer-config"},
                        {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
                         "value": '{"kv_connector":"GatedLMCacheConnectorV1","kv_connector_module_path":'
                                  '"kvcache_l2_gate","kv_load_failure_policy":"recompute","kv_role":"kv_both"}'}]
    assert [op["value"]["name"] for op in env_ops] == [
        "KVCACHE_POD_NAME", "LMCACHE_REMOTE_URL", "LMCACHE_CHUNK_SIZE", "LMCACHE_REMOTE_SERDE",
        "LMCACHE_SAVE_UNFULL_CHUNK", "LMCACHE_PRE_CACHING_HASH_ALGORITHM", "LMCACHE_EXTRA_CONFIG",
        "LMCACHE_LOOKUP_TIMEOUT_MS", "LMCACHE_BLOCKING_TIMEOUT_SECS", "PYTHONHASHSEED",
        "LMCACHE_TRACK_USAGE", "DO_NOT_TRACK", "PROMETHEUS_MULTIPROC_DIR", "PYTHONPATH", "KVCACHE_L2_GATE_ENABLED",
        "KVCACHE_L2_GATE_OPEN_AFTER_MS", "KVCACHE_L2_GATE_LOOKUP_SLOW_MS", "KVCACHE_L2_GATE_CLOSE_AFTER_MS",
        "LMCACHE_MAX_LOCAL_CPU_SIZE", "KVCACHE_L2_KEY"]
    patched = jsonpatch.apply_patch(deployment(line), ops)
    env_list = patched["spec"]["template"]["spec"]["containers"][0]["env"]
    env = _kubelet_env(env_list, "p-1")
    assert env["LMCACHE_REMOTE_URL"] == line_remote_url(k8s_project.platform, line)  # last duplicate wins
    # ...but the operator's entry is still there: why dist/ marks this variant reference-only.
    assert [e.get("value") for e in env_list if e["name"] == "LMCACHE_REMOTE_URL"][0] == OPERATOR_URL
    # vLLM keeps the last --kv-transfer-config: the appended, complete one.
    args = patched["spec"]["template"]["spec"]["containers"][0]["args"]
    assert effective_settings(args)["kv_load_failure_policy"] == "recompute"
    assert args.count("--kv-transfer-config") == 2


def test_patch_cli(tmp_path, capsys, k8s_project):
    line = k8s_project.business_line("rag-assistant")
    dep_file = tmp_path / "deploy.json"
    dep_file.write_text(json.dumps(deployment(line)))
    config = str(k8s_project.config_dir)  # the scenario config, never the user's config/
    assert patch_main(["--config", config, "--line", "rag-assistant", "--deployment", str(dep_file)]) == 0
    ops = json.loads(capsys.readouterr().out)
    assert ops == endpoint_json_patch(k8s_project.platform, line, deployment=deployment(line))
    assert patch_main(["--config", config, "--line", "no-such-line"]) == 2
    assert "no business line" in capsys.readouterr().err


def test_line_without_l2(config_copy):
    cfg = config_copy()
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["cache"].update(l2_enabled=False))
    project = load_project(cfg)
    objs = render_manifests(project, volume_id="vol-0123456789abcdef0", availability_zone="us-west-2a", scaling=project_scaling(project))["line-rag-assistant"]
    assert [o["kind"] for o in objs] == ["Namespace", "NetworkPolicy", "PodDisruptionBudget", "NetworkPolicy",
                                         "InferenceEndpointConfig"]
    spec = objs[-1]["spec"]["kvCacheSpec"]
    assert spec == {"enableL1Cache": True, "enableL2Cache": False}


def test_policy_for_a_custom_port_and_seed(config_copy):
    cfg = config_copy()

    def edit(d):
        d["vllm"]["port"] = 8080
        d["python_hash_seed"] = 42
        d["cache"]["chunk_size_tokens"] = 512
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", edit)
    project = load_project(cfg)
    line = project.business_line("rag-assistant")
    p = pod(line)
    p["spec"]["containers"][0]["name"] = "renamed-by-a-newer-operator"  # selected by port alone
    after = apply_policy(policy_manifest(project.platform, line), p, seed=5)
    env = {e["name"]: e.get("value") for e in after["spec"]["containers"][0]["env"]}
    assert env["PYTHONHASHSEED"] == "42" and env["LMCACHE_CHUNK_SIZE"] == "512"
    assert env["LMCACHE_REMOTE_URL"] == line_remote_url(project.platform, line)
    # Chunk size and seed are part of the L2 directory: the edited line starts an empty one.
    assert line_remote_url(project.platform, line) != line_remote_url(
        load_project(FIXTURE_CONFIG).platform, load_project(FIXTURE_CONFIG).business_line("rag-assistant"))


def test_without_l1_size_the_operators_value_is_kept(config_copy):
    """cache.l1_cpu_gib unset: neither the policy nor the patch touches LMCACHE_MAX_LOCAL_CPU_SIZE."""
    cfg = config_copy()
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["cache"].pop("l1_cpu_gib"))
    project = load_project(cfg)
    line = project.business_line("rag-assistant")
    assert "LMCACHE_MAX_LOCAL_CPU_SIZE" not in line_cache_env(project.platform, line)
    after = apply_policy(policy_manifest(project.platform, line), pod(line), seed=6)
    env = [e for e in after["spec"]["containers"][0]["env"] if e["name"] == "LMCACHE_MAX_LOCAL_CPU_SIZE"]
    assert env == [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "20"}]  # operator_render's value
    dep = deployment(line)
    ops = endpoint_json_patch(project.platform, line, deployment=dep)
    patched = jsonpatch.apply_patch(dep, ops)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in patched if e["name"] == "LMCACHE_MAX_LOCAL_CPU_SIZE"] == ["20"]


def test_l1_size_is_split_across_tp_ranks_and_validated(config_copy):
    cfg = config_copy()
    path = cfg / "business-lines" / "research-reasoning.yaml"
    edit_yaml(path, lambda d: d["cache"].update(l1_cpu_gib=100))
    project = load_project(cfg)
    line = project.business_line("research-reasoning")
    assert line.gpus_per_replica == 8
    assert line_cache_env(project.platform, line)["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "12.5"  # GiB per rank
    for bad, message in ((0, "greater than 0"), (-4, "greater than 0")):
        edit_yaml(path, lambda d, bad=bad: d["cache"].update(l1_cpu_gib=bad))
        with pytest.raises(ConfigError) as exc:
            load_project(cfg)
        assert "cache.l1_cpu_gib" in str(exc.value) and message in str(exc.value)
    edit_yaml(path, lambda d: d["cache"].update(l1_cpu_gib=10, l1_enabled=False))
    with pytest.raises(ConfigError) as exc:
        load_project(cfg)
    assert "l1_cpu_gib sizes the L1 tier" in str(exc.value)
