"""The L2 mount watchdog as rendered (k8s/mount_watchdog.py): DaemonSet, ConfigMap, RBAC.

What users depend on: one pod on every HyperPod node, reading the host's mount table and the FUSE
sessions' mount points, never a directory of the kubelet's pods (their service-account tokens;
issue 24 item 5), privileged only when it heals; the script and settings it runs are the
module and ``curvine.mount_watchdog``; a change of either rolls the pods; it may read PVs
cluster-wide but list and evict pods only in the L2 lines' namespaces.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cdk8s
import pytest

from k8s import mount_watchdog as mw
from k8s import names
from k8s.nodes import HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE
from cluster_agents import l2_mount_watchdog
from tests.k8s.conftest import find


@pytest.fixture(scope="module")
def curvine(manifests) -> list[dict]:
    return manifests["curvine"]


@pytest.fixture(scope="module")
def daemon_set(curvine) -> dict:
    return find(curvine, "DaemonSet", names.L2_MOUNT_WATCHDOG)


def test_one_pod_on_every_hyperpod_node_tolerating_every_taint(k8s_project, daemon_set) -> None:
    spec = daemon_set["spec"]["template"]["spec"]
    assert daemon_set["metadata"]["namespace"] == k8s_project.platform.curvine.namespace
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": HYPERPOD_NODE_LABEL, "operator": "In", "values": [HYPERPOD_NODE_VALUE]}]
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["serviceAccountName"] == names.L2_MOUNT_WATCHDOG


POD_DIRS = "/var/lib/kubelet/pods"


def _host_paths(pod_spec: dict) -> list[str]:
    return [v["hostPath"]["path"].rstrip("/") for v in pod_spec["volumes"] if "hostPath" in v]


def _reaches_pod_dirs(path: str) -> bool:
    """A hostPath that is ``/var/lib/kubelet/pods``, one of its ancestors (``/var/lib/kubelet``,
    ``/``) or inside it shows the container other pods' volumes, their tokens included."""
    return path == POD_DIRS or POD_DIRS.startswith(path + "/") or path == "" or path.startswith(POD_DIRS + "/")


def test_no_host_path_reaches_the_kubelets_pod_directories(k8s_project, daemon_set) -> None:
    """Fails on the design before issue 24 item 5 (a hostPath of all of /var/lib/kubelet)."""
    for heal in (True, False):
        spec = daemon_set["spec"]["template"]["spec"] if heal else find(_render_alone(_with_heal(k8s_project, False)),
                                                                        "DaemonSet")["spec"]["template"]["spec"]
        paths = _host_paths(spec)
        assert paths and not [p for p in paths if _reaches_pod_dirs(p)], (heal, paths)
        assert sorted(paths) == ["/proc/1/mountinfo", "/var/lib/kubelet/plugins/curvine"], heal
    assert _reaches_pod_dirs("/var/lib/kubelet") and _reaches_pod_dirs("/var/lib/kubelet/pods")  # the old ones


def test_the_container_reads_the_hosts_mount_table_and_the_fuse_sessions_read_only(k8s_project, daemon_set) -> None:
    """heal is on in the scenario: privileged with the host's PID namespace (the unmount child enters
    PID 1's mount namespace); no Bidirectional mount at all."""
    assert k8s_project.platform.curvine.mount_watchdog.heal
    spec = daemon_set["spec"]["template"]["spec"]
    [c] = spec["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["host-mountinfo"] == {"name": "host-mountinfo", "mountPath": l2_mount_watchdog.HOST_MOUNTINFO,
                                        "readOnly": True}
    assert mounts["fuse-sessions"] == {"name": "fuse-sessions", "mountPath": l2_mount_watchdog.PLUGIN_DIR,
                                       "readOnly": True, "mountPropagation": "HostToContainer"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["host-mountinfo"]["hostPath"] == {"path": "/proc/1/mountinfo", "type": "File"}
    assert volumes["fuse-sessions"]["hostPath"] == {"path": "/var/lib/kubelet/plugins/curvine",
                                                    "type": "DirectoryOrCreate"}
    assert not [m for m in c["volumeMounts"] if m.get("mountPropagation") == "Bidirectional"]
    assert c["securityContext"]["privileged"] is True and spec["hostPID"] is True
    assert "hostNetwork" not in spec and "hostIPC" not in spec
    assert c["image"] == k8s_project.platform.versions.images.l2_janitor


def test_it_runs_the_module_with_the_configured_settings(k8s_project, curvine, daemon_set) -> None:
    config_map = find(curvine, "ConfigMap", names.L2_MOUNT_WATCHDOG)
    script = Path(l2_mount_watchdog.__file__).read_text(encoding="utf-8")
    assert config_map["data"][mw.SCRIPT_FILE] == script
    settings = json.loads(config_map["data"][mw.CONFIG_FILE])
    cfg = k8s_project.platform.curvine.mount_watchdog
    assert settings == {"heal": True, "period_s": cfg.period_seconds, "probe_timeout_s": cfg.probe_timeout_seconds,
                        "eviction_interval_s": cfg.eviction_interval_seconds,
                        "host_mountinfo": l2_mount_watchdog.HOST_MOUNTINFO,
                        "replace_hung_after_s": cfg.replace_hung_after_seconds,
                        "max_nodes_replacing": cfg.max_nodes_replacing,
                        "namespace": k8s_project.platform.curvine.namespace} == {
        "heal": True, "period_s": 30, "probe_timeout_s": 10, "eviction_interval_s": 60,
        "host_mountinfo": "/host/proc/1/mountinfo", "replace_hung_after_s": 300, "max_nodes_replacing": 1,
        "namespace": "curvine"}
    l2_mount_watchdog.config_from_dict(settings)  # what the script will load
    [c] = daemon_set["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python3", f"{mw.CONFIG_DIR}/{mw.SCRIPT_FILE}", "--config", f"{mw.CONFIG_DIR}/{mw.CONFIG_FILE}",
                            "--node", "$(NODE_NAME)", "--serve", "--port", "9101"]
    assert {e["name"]: e.get("valueFrom") for e in c["env"]}["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    annotations = daemon_set["spec"]["template"]["metadata"]["annotations"]
    expected = hashlib.sha256(json.dumps(config_map["data"], sort_keys=True).encode()).hexdigest()
    assert annotations[mw.CONFIG_HASH_ANNOTATION] == expected


def test_metrics_port_liveness_probe_and_resources(daemon_set) -> None:
    template = daemon_set["spec"]["template"]
    [c] = template["spec"]["containers"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9101, "protocol": "TCP"}]
    assert template["metadata"]["labels"][names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL[0]] == names.L2_MOUNT_WATCHDOG
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert (c["livenessProbe"]["periodSeconds"], c["livenessProbe"]["failureThreshold"]) == (30, 3)
    assert c["resources"] == {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def test_cluster_rbac_is_read_pvs_only_and_each_l2_line_grants_list_and_evict(k8s_project, manifests, curvine) -> None:
    role = find(curvine, "ClusterRole", mw.CLUSTER_ROLE)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get"]}]
    binding = find(curvine, "ClusterRoleBinding", mw.CLUSTER_ROLE)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": names.L2_MOUNT_WATCHDOG,
                                    "namespace": k8s_project.platform.curvine.namespace}]
    for line in k8s_project.business_lines:
        objects = manifests[names.line_chart_name(line)]
        roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == names.L2_MOUNT_WATCHDOG]
        if not line.cache.l2_enabled:
            assert roles == [], line.name  # no L2 PVC there: nothing to watch, nothing granted
            continue
        [r] = roles
        assert r["metadata"]["namespace"] == line.namespace
        assert r["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                              {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
        rb = find(objects, "RoleBinding", names.L2_MOUNT_WATCHDOG)
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.L2_MOUNT_WATCHDOG}
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": names.L2_MOUNT_WATCHDOG,
                                   "namespace": k8s_project.platform.curvine.namespace}]


def _render_alone(platform) -> list[dict]:
    app = cdk8s.App()
    chart = cdk8s.Chart(app, "c", disable_resource_name_hashes=True)
    mw.L2MountWatchdog(chart, "w", platform=platform)
    mw.line_rbac(chart, platform=platform, namespace="rag-assistant")
    return chart.to_json()


def _with_heal(k8s_project, heal: bool):
    platform = k8s_project.platform
    return platform.model_copy(update={"curvine": platform.curvine.model_copy(update={
        "mount_watchdog": platform.curvine.mount_watchdog.model_copy(update={"heal": heal})})})


def test_report_only_runs_unprivileged_and_may_not_evict(k8s_project) -> None:
    platform = k8s_project.platform
    objects = _render_alone(_with_heal(k8s_project, False))
    ds = find(objects, "DaemonSet")
    [c] = ds["spec"]["template"]["spec"]["containers"]
    assert c["securityContext"]["privileged"] is False and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert "hostPID" not in ds["spec"]["template"]["spec"]  # no other process of the node is visible
    assert [m["mountPropagation"] for m in c["volumeMounts"] if m["name"] == "fuse-sessions"] == ["HostToContainer"]
    settings = json.loads(find(objects, "ConfigMap")["data"][mw.CONFIG_FILE])
    assert settings["heal"] is False and "replace_hung_after_s" not in settings  # reports hung sessions only
    assert not [o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] == platform.curvine.namespace]
    assert not [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert find(objects, "Role")["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    off = platform.model_copy(update={"curvine": platform.curvine.model_copy(update={
        "mount_watchdog": platform.curvine.mount_watchdog.model_copy(update={"enabled": False})})})
    app = cdk8s.App()
    assert mw.line_rbac(cdk8s.Chart(app, "c"), platform=off, namespace="x") == []


# --- issue 24 item 3: replacing a hung FUSE session ----------------------------------------------

from tests.k8s import vap_eval  # noqa: E402
from k8s.csi_node_limits import NODE_NAME_EXTRA  # noqa: E402

NODE = "hyperpod-i-0abc"


def test_replacing_sessions_grants_fuse_pod_deletes_and_the_slots_in_curvine_only(k8s_project, curvine) -> None:
    ns = k8s_project.platform.curvine.namespace
    role = next(o for o in curvine if o["kind"] == "Role" and o["metadata"]["name"] == names.L2_MOUNT_WATCHDOG
                and o["metadata"]["namespace"] == ns)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"],
         "resourceNames": ["l2-fuse-replacement-0"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    binding = next(o for o in curvine if o["kind"] == "RoleBinding" and o["metadata"]["name"] == names.L2_MOUNT_WATCHDOG
                   and o["metadata"]["namespace"] == ns)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": names.L2_MOUNT_WATCHDOG, "namespace": ns}]
    order = [(o["kind"], o["metadata"]["name"]) for o in curvine]
    assert (order.index(("ValidatingAdmissionPolicyBinding", mw.WATCHDOG_LIMITS)) < order.index(("Role", names.L2_MOUNT_WATCHDOG))
            < order.index(("DaemonSet", names.L2_MOUNT_WATCHDOG)))


@pytest.fixture(scope="module")
def limits(k8s_project, curvine):
    policy = find(curvine, "ValidatingAdmissionPolicy", mw.WATCHDOG_LIMITS)
    binding = find(curvine, "ValidatingAdmissionPolicyBinding", mw.WATCHDOG_LIMITS)
    ns = k8s_project.platform.curvine.namespace
    user = f"system:serviceaccount:{ns}:{names.L2_MOUNT_WATCHDOG}"

    def decide(operation: str, resource: str, *, old: dict | None = None, obj: dict | None = None, name: str = "",
               node: str | None = NODE, username: str = user) -> vap_eval.Decision:
        group = "coordination.k8s.io" if resource == "leases" else ""
        request = {"operation": operation, "namespace": ns, "name": name, "subResource": "",
                   "userInfo": {"username": username, **({"extra": {NODE_NAME_EXTRA: [node]}} if node else {})},
                   "resource": {"group": group, "version": "v1", "resource": resource}}
        return vap_eval.evaluate(policy, [binding], request=request, old_object=old, obj=obj,
                                 namespace_labels={"kubernetes.io/metadata.name": ns})

    return decide


def _pod(name: str, labels: dict[str, str], node: str = NODE) -> dict:
    return {"metadata": {"name": name, "namespace": "curvine", "labels": labels}, "spec": {"nodeName": node}}


def test_a_stolen_watchdog_token_deletes_only_its_nodes_fuse_pods_and_writes_only_the_slots(limits) -> None:
    fuse = {"app": "curvine-standalone"}
    assert limits("DELETE", "pods", old=_pod("curvine-csi-standalone-aa-1", fuse)).allowed
    for old, node in ((_pod("curvine-master-0", {"app.kubernetes.io/component": "master"}), NODE),
                      (_pod("curvine-csi-node-x", {"app.kubernetes.io/name": "curvine-csi"}), NODE),
                      (_pod("curvine-csi-standalone-aa-2", fuse, node="hyperpod-i-0def"), NODE)):
        decision = limits("DELETE", "pods", old=old, node=node)
        assert decision.applied and not decision.allowed and decision.reason != "failed", old["metadata"]["name"]
    # A token without the node claim (not bound to a pod; eks.version >= 1.30 always names it): refused.
    decision = limits("DELETE", "pods", old=_pod("curvine-csi-standalone-aa-1", fuse), node=None)
    assert decision.applied and not decision.allowed
    lease = {"metadata": {"name": "l2-fuse-replacement-0"}}
    assert limits("CREATE", "leases", obj=lease).allowed
    assert limits("UPDATE", "leases", obj=lease, old=lease, name="l2-fuse-replacement-0").allowed
    other = {"metadata": {"name": "kube-scheduler"}}
    assert not limits("CREATE", "leases", obj=other).allowed
    assert not limits("UPDATE", "leases", obj=other, old=other, name="kube-scheduler").allowed
    # Nobody else is matched.
    assert not limits("DELETE", "pods", old=_pod("curvine-master-0", {}), username="kubernetes-admin").applied
