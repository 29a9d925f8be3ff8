"""The node filter as rendered (k8s/node_firewall.py): DaemonSet, ConfigMap, RBAC.

What the nodes depend on: one pod on every HyperPod node (where the Workers and FUSE pods listen), in
the node's network namespace, with CAP_NET_ADMIN and no other capability, no privilege, no host path
and no host PID; the agent it runs is cluster_agents/node_firewall.py with the settings of
``curvine.node_firewall`` and the VPC as scrapers; its identity may list and watch Nodes and the pods of
Curvine's namespace and nothing else; the chart, the reach tests and the agent render one ruleset.
Schema validity: tests/k8s/test_k8s_schemas.py validates every rendered built-in object strictly,
these included (checked below that they are rendered).
"""

from __future__ import annotations

import json

import cdk8s
import kubernetes_validate
import pytest

from cluster_agents import node_firewall as agent_module
from k8s import names
from k8s import node_firewall as nf
from k8s.network_policies import vpc_cidr
from k8s.nodes import HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE
from tests.k8s.conftest import find

K8S_VERSION = "1.34"


@pytest.fixture(scope="module")
def daemon_set(curvine) -> dict:
    return find(curvine, "DaemonSet", names.NODE_FIREWALL)


def test_one_pod_on_every_hyperpod_node_in_the_nodes_network_namespace(k8s_project, daemon_set) -> None:
    spec = daemon_set["spec"]["template"]["spec"]
    assert daemon_set["metadata"]["namespace"] == k8s_project.platform.curvine.namespace
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": HYPERPOD_NODE_LABEL, "operator": "In", "values": [HYPERPOD_NODE_VALUE]}]
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["hostNetwork"] is True and "hostPID" not in spec and "hostIPC" not in spec
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["serviceAccountName"] == names.NODE_FIREWALL


def test_net_admin_is_the_only_capability_and_nothing_of_the_host_is_mounted(daemon_set) -> None:
    spec = daemon_set["spec"]["template"]["spec"]
    [c] = spec["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"] == {"add": ["NET_ADMIN"], "drop": ["ALL"]}
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not [v for v in spec["volumes"] if "hostPath" in v]
    assert [v["configMap"]["name"] for v in spec["volumes"]] == [names.NODE_FIREWALL]
    assert not spec.get("initContainers")


def test_it_runs_the_agent_from_its_configmap_on_the_pinned_image(k8s_project, curvine, daemon_set) -> None:
    platform = k8s_project.platform
    [c] = daemon_set["spec"]["template"]["spec"]["containers"]
    assert c["image"] == platform.versions.images.node_firewall
    assert c["command"] == ["python3", f"{nf.CONFIG_DIR}/node_firewall.py", "--config", f"{nf.CONFIG_DIR}/firewall.json",
                            "--node", "$(NODE_NAME)", "--serve", "--port", str(agent_module.METRICS_PORT)]
    assert c["livenessProbe"]["httpGet"]["path"] == agent_module.LIVENESS_PATH
    data = find(curvine, "ConfigMap", names.NODE_FIREWALL)["data"]
    assert data["node_firewall.py"] == open(agent_module.__file__, encoding="utf-8").read()
    config = agent_module.config_from_dict(json.loads(data["firewall.json"]))
    assert config.namespace == platform.curvine.namespace and config.scrapers == [vpc_cidr(platform)]
    assert config.period_s == platform.curvine.node_firewall.period_seconds
    assert daemon_set["spec"]["template"]["metadata"]["annotations"][nf.CONFIG_HASH_ANNOTATION]


def test_its_identity_may_list_and_watch_nodes_and_curvines_pods_only(k8s_project, curvine) -> None:
    ns = k8s_project.platform.curvine.namespace
    subject = [{"kind": "ServiceAccount", "name": names.NODE_FIREWALL, "namespace": ns}]
    role = find(curvine, "ClusterRole", nf.CLUSTER_ROLE)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    assert find(curvine, "ClusterRoleBinding", nf.CLUSTER_ROLE)["subjects"] == subject
    ns_role = next(o for o in curvine if o["kind"] == "Role" and o["metadata"]["name"] == names.NODE_FIREWALL)
    assert ns_role["metadata"]["namespace"] == ns
    assert ns_role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = next(o for o in curvine if o["kind"] == "RoleBinding" and o["metadata"]["name"] == names.NODE_FIREWALL)
    assert binding["subjects"] == subject and binding["roleRef"]["name"] == names.NODE_FIREWALL
    others = [o for o in curvine if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
              and any(s.get("name") == names.NODE_FIREWALL for s in o.get("subjects", []))]
    assert len(others) == 2  # no other binding names it


def test_the_objects_are_rendered_and_schema_valid(curvine) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in curvine}
    expected = {("DaemonSet", names.NODE_FIREWALL), ("ConfigMap", names.NODE_FIREWALL),
                ("ServiceAccount", names.NODE_FIREWALL), ("Role", names.NODE_FIREWALL),
                ("RoleBinding", names.NODE_FIREWALL), ("ClusterRole", nf.CLUSTER_ROLE),
                ("ClusterRoleBinding", nf.CLUSTER_ROLE)}
    assert expected <= kinds
    for obj in curvine:
        if (obj["kind"], obj["metadata"]["name"]) in expected:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_one_renderer_for_the_chart_the_reach_tests_and_the_agent() -> None:
    assert nf.render_ruleset is agent_module.render_ruleset
    assert (nf.RPC_PORTS, nf.WEB_PORTS, nf.TABLE) == (agent_module.RPC_PORTS, agent_module.WEB_PORTS, agent_module.TABLE)


def test_disabled_renders_nothing(k8s_project) -> None:
    from k8s.curvine_chart import CurvineChart

    platform = k8s_project.platform
    off = platform.model_copy(update={"curvine": platform.curvine.model_copy(
        update={"node_firewall": platform.curvine.node_firewall.model_copy(update={"enabled": False})})})
    chart = CurvineChart(cdk8s.App(), "curvine", platform=off, volume_id="vol-0123456789abcdef0",
                         availability_zone="us-west-2a")
    assert chart.node_firewall is None
    assert not [o for o in chart.to_json() if o["metadata"]["name"] in (names.NODE_FIREWALL, nf.CLUSTER_ROLE)]
