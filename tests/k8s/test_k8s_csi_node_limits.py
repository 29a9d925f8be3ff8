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
from k8s.csi_node_limits import CSI_NODE_LIMITS, FUSE_SERVICE_ACCOUNT, NODE_NAME_EXTRA
from tests.k8s import vap_eval
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
                                     "securityContext": {"privileged": True}}]}}


def test_the_fuse_pods_run_under_an_account_without_rights_or_token(curvine, env):
    assert env["STANDALONE_SERVICE_ACCOUNT"] == FUSE_SERVICE_ACCOUNT
    sa = find(curvine, "ServiceAccount", FUSE_SERVICE_ACCOUNT)
    assert sa["automountServiceAccountToken"] is False
    bound = [s for o in curvine if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o.get("subjects", [])]
    assert all(s["name"] != FUSE_SERVICE_ACCOUNT for s in bound) and bound


@pytest.mark.parametrize("node_info", [True, False], ids=["bound-token-names-the-node", "older-api-server"])
def test_the_driver_creates_its_fuse_pod(decide, env, node_info):
    decision = decide("CREATE", "pods", obj=fuse_pod(env), node=NODE if node_info else None)
    assert decision.applied and decision.allowed, decision


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


@pytest.mark.parametrize("change", [_other_image, _init_container, _node_plugin_account, _no_label, _other_node])
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


def test_other_identities_are_not_concerned(decide, curvine):
    anything = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "debug", "labels": {}},
                "spec": {"containers": [{"name": "x", "image": "docker.io/library/busybox:1.36"}]}}
    decision = decide("CREATE", "pods", obj=anything, username="arn:aws:sts::111122223333:assumed-role/admin/me")
    assert decision.allowed and not decision.applied
