"""The canary's Kubernetes objects: one per L2 line (switchable), least privilege, pinned image, off the
GPU nodes, scraped by its own job, and its rendered config what the canary reads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from k8s import canary as canary_chart
from k8s import names
from k8s.nodes import HYPERPOD_NODE_LABEL
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from cluster_agents import kv_canary
from observability import targets
from platform_config import load_project
from tests.example_config import copy_example_config, edit_yaml
from tests.k8s.conftest import find


def test_every_l2_line_runs_one_canary_and_the_others_none(manifests, k8s_project) -> None:
    for line in k8s_project.business_lines:
        objects = manifests[names.line_chart_name(line)]
        ours = sorted(o["kind"] for o in objects if o["metadata"]["name"] == names.KV_CANARY)
        assert ours == (["ConfigMap", "Deployment", "Role", "RoleBinding", "ServiceAccount"]
                        if line.cache.l2_enabled else []), line.name


def test_the_canary_may_only_list_pods_in_its_namespace(manifests, k8s_project) -> None:
    for line in (l for l in k8s_project.business_lines if l.runs_canary):
        objects = manifests[names.line_chart_name(line)]
        role = find(objects, "Role", names.KV_CANARY)
        assert role["metadata"]["namespace"] == line.namespace
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
        binding = find(objects, "RoleBinding", names.KV_CANARY)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.KV_CANARY}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": names.KV_CANARY, "namespace": line.namespace}]
        assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_deployment_is_one_pinned_unprivileged_pod_off_the_gpu_nodes(manifests, k8s_project) -> None:
    line = k8s_project.business_line("rag-assistant")
    objects = manifests[names.line_chart_name(line)]
    cm = find(objects, "ConfigMap", names.KV_CANARY)
    deployment = find(objects, "Deployment", names.KV_CANARY)["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}  # never two canaries
    template = deployment["template"]
    digest = hashlib.sha256(json.dumps(cm["data"], sort_keys=True).encode()).hexdigest()
    assert template["metadata"]["annotations"] == {canary_chart.CONFIG_HASH_ANNOTATION: digest}
    assert names.OPERATOR_POD_LABEL not in template["metadata"]["labels"]  # never scraped or mutated as vLLM
    pod = template["spec"]
    (c,) = pod["containers"]
    assert c["image"] == k8s_project.platform.versions.images.l2_janitor and ":" in c["image"]
    assert c["command"] == ["python3", "/opt/kvcache-canary/kv_canary.py", "--config", "/opt/kvcache-canary/canary.json",
                            "--serve", "--port", "9100"]
    assert c["ports"] == [{"name": "metrics", "containerPort": kv_canary.METRICS_PORT, "protocol": "TCP"}]
    security = c["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 65534
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert [v.get("configMap", {}).get("name") for v in pod["volumes"]] == [names.KV_CANARY]  # no L2 mount
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": HYPERPOD_NODE_LABEL, "operator": "NotIn", "values": ["hyperpod"]}]
    assert c["resources"] == {"requests": {"cpu": "20m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}}


def test_its_config_is_the_lines_and_the_scripts_are_the_repositorys(manifests, k8s_project) -> None:
    line = k8s_project.business_line("research-reasoning")
    cm = find(manifests[names.line_chart_name(line)], "ConfigMap", names.KV_CANARY)
    config = kv_canary.config_from_dict(json.loads(cm["data"]["canary.json"]))
    assert config.pod_label == (names.OPERATOR_POD_LABEL, names.endpoint_name(line))
    assert (config.port, config.port_name) == (line.vllm.port, "http")
    assert (config.chunk_size, config.prompt_chunks, config.period_s) == (
        line.cache.chunk_size_tokens, line.canary.prompt_chunks, line.canary.period_minutes * 60)
    assert cm["data"]["kv_canary.py"] == Path(kv_canary.__file__).read_text()
    # The script and the agents' shared core (cluster_agents/agent_core.py), no janitor beside it.
    assert set(cm["data"]) == {"canary.json", "kv_canary.py", "agent_core.py"}
    # The port name it looks for is the one the endpoint's worker declares.
    endpoint = find(manifests[names.line_chart_name(line)], "InferenceEndpointConfig")
    assert endpoint["spec"]["worker"]["modelInvocationPort"] == {"containerPort": line.vllm.port, "name": "http"}


def test_the_config_switch_removes_the_canary_its_scrape_job_and_its_alert(tmp_path) -> None:
    from observability import alerts

    copy = copy_example_config(tmp_path / "config")
    edit_yaml(copy / "business-lines" / "rag-assistant.yaml",
              lambda d: d.update(canary={"enabled": False, "period_minutes": 10}))
    project = load_project(copy)
    rendered = render_manifests(project, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(project))
    assert not [o for o in rendered["line-rag-assistant"] if o["metadata"]["name"] == names.KV_CANARY]
    assert [o for o in rendered["line-research-reasoning"] if o["metadata"]["name"] == names.KV_CANARY]
    job = next(j for j in targets.jobs(project.platform, project.business_lines) if j["job_name"] == targets.JOB_KV_CANARY)
    assert "rag-assistant" not in job["kubernetes_sd_configs"][0]["namespaces"]["names"]
    canary_alerts = [a for a in alerts.all_alerts(project.platform, project.business_lines)
                     if a.name == "KvCacheCrossPodCanaryFailing"]
    assert {a.labels["business_line"] for a in canary_alerts} == {"research-reasoning", "ticket-triage"}


def test_the_alert_waits_for_the_configured_number_of_runs(tmp_path) -> None:
    from observability import alerts

    copy = copy_example_config(tmp_path / "config")
    edit_yaml(copy / "business-lines" / "rag-assistant.yaml", lambda d: d.update(canary={"period_minutes": 10}))
    edit_yaml(copy / "platform.yaml", lambda d: d["observability"]["alerts"].update(
        canary_low_runs=4, canary_min_hit_ratio=0.8))
    project = load_project(copy)
    (alert,) = [a for a in alerts.all_alerts(project.platform, project.business_lines)
                if a.name == "KvCacheCrossPodCanaryFailing" and a.labels["business_line"] == "rag-assistant"]
    assert alert.for_ == "30m" and alert.expr.endswith(" < 0.8")  # 3 periods after the first low run: 4 runs
