"""The Curvine CSI node plugin's identity may create only FUSE pods (its own image, the FUSE pods'
account, its own node), delete only FUSE pods and write only its state ConfigMaps; the FUSE pods
run under an account with no rights and no token (k8s/csi_node_limits.py, issue 25 item 2).

The rendered ValidatingAdmissionPolicy is evaluated with tests/k8s/vap_eval.py on the requests the
driver makes (its FUSE pod as ``buildStandalone`` builds it from the rendered env) and on what a
stolen token of the node plugin would try.
"""

from __future__ import annotations

import copy

import pytest

from k8s import names
import cdk8s

from k8s.csi_node_limits import (CSI_NODE_LIMITS, FUSE_SERVICE_ACCOUNT, NODE_NAME_EXTRA, csi_node_limits,
                                 node_name_claim_available)
from tests.k8s import upstream_facts, vap_eval
from tests.k8s.conftest import find
from tests.k8s.test_k8s_mount_lifetime import _namespace_labels, _plugin_env, _plugin_user

NODE, OTHER_NODE = "hyperpod-i-0a1", "hyperpod-i-0b2"


@pytest.fixture(scope="module")
def curvine(manifests):
    return manifests["curvine"]


@pytest.fixture(scope="module")
def env(curvine) -> dict[str, str]:
    return _plugin_env(find(curvine, "DaemonSet", names.CSI_NODE))


@pytest.fixture(scope="module")
def decide(curvine):
    policy = find(curvine, "ValidatingAdmissionPolicy", CSI_NODE_LIMITS)
    binding = find(curvine, "ValidatingAdmissionPolicyBinding", CSI_NODE_LIMITS)
    user = _plugin_user(find(curvine, "DaemonSet", names.CSI_NODE))
    labels = _namespace_labels(curvine, "curvine")

    def run(operation: str, resource: str, *, obj=None, old=None, name: str = "", node: str | None = NODE,
            username: str = user) -> vap_eval.Decision:
        user_info = {"username": username}
        if node is not None:
            user_info["extra"] = {NODE_NAME_EXTRA: [node]}
        request = {"operation": operation, "namespace": "curvine", "name": name, "userInfo": user_info,
                   "resource": {"group": "", "version": "v1", "resource": resource}, "subResource": ""}
        return vap_eval.evaluate(policy, [binding], request=request, old_object=old, obj=obj, namespace_labels=labels)

    return run


def fuse_pod(env: dict[str, str], node: str = NODE) -> dict:
    """The FUSE pod as curvine-csi's ``buildStandalone`` makes it from the node plugin's env
    (tests/k8s/csi_standalone_model.py)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"curvine-csi-standalone-{node}-1", "namespace": "curvine",
                         "labels": {"app": "curvine-standalone", "curvine.io/node": node}},
            "spec": {"hostNetwork": True, "hostPID": True, "nodeName": node,
                     "serviceAccountName": env["STANDALONE_SERVICE_ACCOUNT"],
                     "containers": [{"name": "curvine-fuse", "image": env["STANDALONE_IMAGE"],
                                     "imagePullPolicy": "Never", "securityContext": {"privileged": True}}],
                     # standalone_manager.go l.539-558 (GetHostMountPath l.233-235: <base>/<key>/fuse-mount)
                     "volumes": [{"name": "fuse-mount", "hostPath": {
                                     "path": "/var/lib/kubelet/plugins/curvine/3f2a9c1d/fuse-mount",
                                     "type": "DirectoryOrCreate"}},
                                 {"name": "fuse-device", "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}}]}}


def test_the_fuse_pods_run_under_an_account_without_rights_or_token(curvine, env):
    assert env["STANDALONE_SERVICE_ACCOUNT"] == FUSE_SERVICE_ACCOUNT
    sa = find(curvine, "ServiceAccount", FUSE_SERVICE_ACCOUNT)
    assert sa["automountServiceAccountToken"] is False
    bound = [s for o in curvine if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o.get("subjects", [])]
    assert all(s["name"] != FUSE_SERVICE_ACCOUNT for s in bound) and bound


def test_the_driver_creates_its_fuse_pod(decide, env):
    decision = decide("CREATE", "pods", obj=fuse_pod(env))
    assert decision.applied and decision.allowed, decision


def test_the_fuse_pod_runs_the_plugins_own_image_which_it_never_pulls(curvine, env):
    """``STANDALONE_IMAGE`` is exactly the node plugin's image reference, byte for byte (a digest
    stays a digest): the FUSE pod's ``imagePullPolicy: Never`` (buildStandalone l.456) finds it on
    the node only because the plugin's own pod pulled that same reference."""
    plugin = find(curvine, "DaemonSet", names.CSI_NODE)["spec"]["template"]["spec"]
    (csi,) = [c for c in plugin["containers"] if c["name"] == "csi-plugin"]
    assert env["STANDALONE_IMAGE"] == csi["image"]


def test_a_token_without_its_node_creates_nothing(decide, env, k8s_project):
    """``eks.version`` 1.30 or later: the API server names the requesting pod's node; a request
    without the claim (a token not bound to a pod: TokenRequest without a pod, a legacy Secret) is
    refused."""
    assert node_name_claim_available(k8s_project.platform.eks.version)
    decision = decide("CREATE", "pods", obj=fuse_pod(env), node=None)
    assert decision.applied and not decision.allowed


def test_before_1_30_the_node_is_not_checked(env, curvine):
    """On 1.28 and 1.29 the claim is absent: the policy then admits the driver's pod without it
    (the residual docs/security.md states), but still checks the node when a claim is there."""
    assert [node_name_claim_available(v) for v in ("1.28", "1.29", "1.30", "1.34")] == [False, False, True, True]
    chart = cdk8s.Chart(cdk8s.App(), "old")
    csi_node_limits(chart, namespace="curvine", node_service_account=names.CSI_NODE, csi_image=env["STANDALONE_IMAGE"],
                    require_node_name=False)
    policy, binding = chart.to_json()
    labels = _namespace_labels(curvine, "curvine")
    user = _plugin_user(find(curvine, "DaemonSet", names.CSI_NODE))

    def run(extra):
        user_info = {"username": user, **({"extra": extra} if extra else {})}
        request = {"operation": "CREATE", "namespace": "curvine", "name": "", "userInfo": user_info,
                   "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": ""}
        return vap_eval.evaluate(policy, [binding], request=request, old_object=None, obj=fuse_pod(env),
                                 namespace_labels=labels)

    assert run(None).allowed
    assert run({NODE_NAME_EXTRA: [NODE]}).allowed
    assert not run({NODE_NAME_EXTRA: [OTHER_NODE]}).allowed


def _other_image(pod):
    pod["spec"]["containers"][0]["image"] = "docker.io/library/busybox:1.36"


def _init_container(pod):
    pod["spec"]["initContainers"] = [{"name": "x", "image": "docker.io/library/busybox:1.36"}]


def _node_plugin_account(pod):
    pod["spec"]["serviceAccountName"] = names.CSI_NODE


def _no_label(pod):
    pod["metadata"]["labels"] = {}


def _other_node(pod):
    pod["spec"]["nodeName"] = OTHER_NODE


def _host_root(pod):
    pod["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})


def _kubelet_pods(pod):
    pod["spec"]["volumes"][0]["hostPath"]["path"] = "/var/lib/kubelet/plugins/curvine/../../pods"


def _projected_token(pod):
    pod["spec"]["volumes"].append({"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}})


def _secret_volume(pod):
    pod["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "curvine-chunk-key"}})


def _automount(pod):
    pod["spec"]["automountServiceAccountToken"] = True


def _ephemeral(pod):
    pod["spec"]["ephemeralContainers"] = [{"name": "x", "image": "docker.io/library/busybox:1.36"}]


@pytest.mark.parametrize("change", [_other_image, _init_container, _node_plugin_account, _no_label, _other_node,
                                    _host_root, _kubelet_pods, _projected_token, _secret_volume, _automount,
                                    _ephemeral])
def test_a_stolen_token_cannot_start_another_pod(decide, env, change):
    pod = fuse_pod(env)
    change(pod)
    decision = decide("CREATE", "pods", obj=pod)
    assert decision.applied and not decision.allowed
    assert "may create only FUSE pods" in decision.message


def test_it_deletes_fuse_pods_only(decide, curvine, env):
    assert decide("DELETE", "pods", old=fuse_pod(env), name="curvine-csi-standalone-x").allowed
    primary = copy.deepcopy(find(curvine, "StatefulSet", names.CURVINE_MASTER)["spec"]["template"])
    primary = {"apiVersion": "v1", "kind": "Pod", "metadata": {**primary["metadata"], "name": "curvine-master-0"},
               "spec": primary["spec"]}
    decision = decide("DELETE", "pods", old=primary, name="curvine-master-0")
    assert not decision.allowed and "may delete only FUSE pods" in decision.message


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_it_writes_its_state_config_maps_only(decide, curvine, operation):
    state = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"curvine-standalone-state-{NODE}"}}
    assert decide(operation, "configmaps", obj=state, old=state, name=state["metadata"]["name"]).allowed
    # Neither the watchdog's code (privileged) nor the node filter's (NET_ADMIN on every GPU node).
    for name in (names.L2_MOUNT_WATCHDOG, names.NODE_FIREWALL):
        code = find(curvine, "ConfigMap", name)
        decision = decide(operation, "configmaps", obj=code, old=code, name=name)
        assert not decision.allowed and "state ConfigMaps" in decision.message, name


def test_its_role_grants_the_drivers_calls_and_nothing_more(curvine):
    """The namespaced rights are exactly the calls curvine-csi's standalone manager makes
    (tests/k8s/upstream_facts.py, cited line by line): no ConfigMap delete, list or watch, so RBAC
    alone already keeps it from deleting the watchdog's ConfigMap; the policy narrows the rest."""
    role = find(curvine, "Role", names.CSI_NODE)
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    needed = {(call.resource, v) for call in upstream_facts.CSI_STANDALONE_CALLS if not call.cluster_scope
              for v in call.verbs}
    assert granted == needed
    assert ("configmaps", "delete") not in granted and ("configmaps", "list") not in granted


def test_no_config_map_the_chart_ships_is_writable_by_it(decide, curvine):
    """The watchdog's code and settings, Curvine's own configuration: every ConfigMap the chart
    renders in the Curvine namespace is out of the node plugin's reach (RBAC cannot name them: the
    driver's state ConfigMaps are named after nodes, so its Role grants ConfigMap writes by verb;
    this policy is what narrows them)."""
    shipped = [o for o in curvine if o["kind"] == "ConfigMap"]
    assert names.L2_MOUNT_WATCHDOG in {o["metadata"]["name"] for o in shipped}
    for cm in shipped:
        assert not cm["metadata"]["name"].startswith("curvine-standalone-state-")
        for operation in ("CREATE", "UPDATE", "DELETE"):
            decision = decide(operation, "configmaps", obj=cm, old=cm, name=cm["metadata"]["name"])
            assert decision.applied and not decision.allowed, (cm["metadata"]["name"], operation)


def test_other_identities_are_not_concerned(decide, curvine):
    anything = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "debug", "labels": {}},
                "spec": {"containers": [{"name": "x", "image": "docker.io/library/busybox:1.36"}]}}
    decision = decide("CREATE", "pods", obj=anything, username="arn:aws:sts::111122223333:assumed-role/admin/me")
    assert decision.allowed and not decision.applied
