"""Issue 15 item 1 (a pod leaving a node unmounts the L2 under the others) and the QoS part of item 2.

The Curvine CSI node plugin (v0.3.2-alpha .. main) deletes the node's FUSE pod whenever its per-node
set of volume IDs runs empty, and every pod's NodeUnpublishVolume empties it (docs/sources.md §16).
The chart renders ``curvine-fuse-pod-guard`` (:mod:`k8s.fuse_pod_guard`), a ValidatingAdmissionPolicy
that refuses the node plugin's DELETE of a healthy FUSE pod. These tests:

* check the rendered policy and binding (what, where, for whom, in which order);
* evaluate *the rendered policy's CEL* (``tests/k8s/vap_eval.py``) against every pod state the
  driver distinguishes and show it refuses exactly what the driver would not replace itself;
* replay churn on a node with a model of the driver written from its source
  (``tests/k8s/csi_standalone_model.py``): with the policy no live pod is ever left without its
  mount; without it (the control) every scenario kills live mounts, at the step named here;
* check the FUSE pods the node plugin builds from the rendered ``STANDALONE_*`` are Guaranteed.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Callable

import kubernetes_validate
import pytest
from tests.k8s import csi_standalone_model as model
from tests.k8s import vap_eval
from tests.k8s.conftest import find

from k8s import names
from k8s.fuse_pod_guard import (FUSE_POD_DELETES_ADMITTED, FUSE_POD_GUARD, STANDALONE_LABEL, STANDALONE_NAME_PREFIX,
                                 node_plugin_username)
from k8s.kube import KUBERNETES_VERSION
from platform_config.fields import quantity_bytes

NODE = "hyperpod-i-0123456789abcdef0"
LINE_X, LINE_Y = "pvc-rag-assistant", "pvc-research-reasoning"


@pytest.fixture(scope="module")
def curvine(manifests):
    return manifests["curvine"]


@pytest.fixture(scope="module")
def guard(curvine) -> tuple[dict, dict]:
    return (find(curvine, "ValidatingAdmissionPolicy", FUSE_POD_GUARD),
            find(curvine, "ValidatingAdmissionPolicyBinding", FUSE_POD_GUARD))


@pytest.fixture(scope="module")
def counter(curvine) -> tuple[dict, dict]:
    return (find(curvine, "ValidatingAdmissionPolicy", FUSE_POD_DELETES_ADMITTED),
            find(curvine, "ValidatingAdmissionPolicyBinding", FUSE_POD_DELETES_ADMITTED))


@pytest.fixture(scope="module")
def node_plugin(curvine) -> dict:
    return find(curvine, "DaemonSet", names.CSI_NODE)


def _plugin_env(node_plugin: dict) -> dict[str, str]:
    """The csi-plugin container's environment, with the fieldRefs the node plugin reads resolved."""
    (container,) = [c for c in node_plugin["spec"]["template"]["spec"]["containers"] if c["name"] == "csi-plugin"]
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace":
            env[e["name"]] = node_plugin["metadata"]["namespace"]
        elif e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName":
            env[e["name"]] = NODE
    return env


def _plugin_user(node_plugin: dict) -> str:
    sa = node_plugin["spec"]["template"]["spec"]["serviceAccountName"]
    return f"system:serviceaccount:{node_plugin['metadata']['namespace']}:{sa}"


def _namespace_labels(curvine, namespace: str) -> dict[str, str]:
    """What the API server matches ``namespaceSelector`` against: the Namespace's labels plus the
    ``kubernetes.io/metadata.name`` label it sets on every namespace."""
    obj = find(curvine, "Namespace", namespace)
    return {**obj["metadata"].get("labels", {}), "kubernetes.io/metadata.name": namespace}


def _decider(curvine, policy: dict, binding: dict) -> Callable[[dict, dict], vap_eval.Decision]:
    labels = {ns: _namespace_labels(curvine, ns) for ns in ("curvine",)}

    def decide(request: dict, old_object: dict) -> vap_eval.Decision:
        ns_labels = labels.get(request["namespace"], {"kubernetes.io/metadata.name": request["namespace"]})
        return vap_eval.evaluate(policy, [binding], request=request, old_object=old_object, obj=None,
                                 namespace_labels=ns_labels)

    return decide


@pytest.fixture(scope="module")
def admit(guard, curvine) -> Callable[[dict, dict], vap_eval.Decision]:
    """The API server's decision on a pod DELETE under the rendered guard and its binding."""
    return _decider(curvine, *guard)


@pytest.fixture(scope="module")
def count(counter, curvine) -> Callable[[dict, dict], vap_eval.Decision]:
    """The rendered counting policy's decision (a warning: one ``enforcement_action="warn"`` count)."""
    return _decider(curvine, *counter)


#: The guard as it was before issue 24 item 4: every delete of a not-Ready pod admitted, whatever
#: the driver's path (the control of the not-Ready window).
PREVIOUS_RULE = "variables.needsRecreation || !variables.ready"


@pytest.fixture(scope="module")
def admit_previous(guard, curvine) -> Callable[[dict, dict], vap_eval.Decision]:
    policy = copy.deepcopy(guard[0])
    (validation,) = policy["spec"]["validations"]
    validation["expression"] = PREVIOUS_RULE
    return _decider(curvine, policy, guard[1])


@pytest.fixture
def make_node(curvine, node_plugin, admit) -> Callable[..., model.Node]:
    """A node as the rendered chart sets it up, with the rendered guard (``guarded``) or without."""
    storage_class = find(curvine, "StorageClass")

    def make(*, guarded: bool, admit_delete: Callable[[dict, dict], vap_eval.Decision] | None = None) -> model.Node:
        env = _plugin_env(node_plugin)
        return model.Node(name=NODE, storage_class=storage_class, plugin_env=env,
                          namespace=env["KUBERNETES_NAMESPACE"], user=_plugin_user(node_plugin),
                          admit_delete=(admit_delete or admit) if guarded else None)

    return make


# --- the rendered objects -----------------------------------------------------------------------

def test_the_guard_is_rendered_for_the_node_plugin_and_applied_before_it(curvine, guard, counter, node_plugin,
                                                                          k8s_project):
    policy, binding = guard
    ns = k8s_project.platform.curvine.namespace
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    match = spec["matchConstraints"]
    assert match["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
                                       "resources": ["pods"]}]
    # The FUSE pods live where the node plugin runs (KUBERNETES_NAMESPACE from metadata.namespace,
    # NS l.43) and carry the source's label (SM l.35-36, l.438-442).
    assert node_plugin["metadata"]["namespace"] == ns == _plugin_env(node_plugin)["KUBERNETES_NAMESPACE"]
    assert match["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    assert match["objectSelector"] == {"matchLabels": dict([model.STANDALONE_LABEL_APP])}
    assert STANDALONE_LABEL == model.STANDALONE_LABEL_APP and STANDALONE_NAME_PREFIX == model.STANDALONE_NAME_PREFIX
    # Only the node plugin's own deletes: its service account, as the rendered DaemonSet runs it.
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{_plugin_user(node_plugin)}'"
    assert _plugin_user(node_plugin) == node_plugin_username(ns, names.CSI_NODE)
    assert binding["spec"] == {"policyName": FUSE_POD_GUARD, "validationActions": ["Deny"]}
    # The counting policy matches the very same requests with the same variables, fails open and
    # only warns: it can never refuse a delete.
    count_policy, count_binding = counter
    assert {k: v for k, v in count_policy["spec"].items() if k not in ("failurePolicy", "validations")} == {
        k: v for k, v in spec.items() if k not in ("failurePolicy", "validations")}
    assert count_policy["spec"]["failurePolicy"] == "Ignore"
    assert count_binding["spec"] == {"policyName": FUSE_POD_DELETES_ADMITTED, "validationActions": ["Warn"]}
    (guard_rule,) = spec["validations"]
    (count_rule,) = count_policy["spec"]["validations"]
    assert count_rule["expression"] == f"!({guard_rule['expression']})"
    # Applied in this order: policies, bindings, then the node plugin that deletes FUSE pods.
    order = [(o["kind"], o["metadata"]["name"]) for o in curvine]
    for name in (FUSE_POD_GUARD, FUSE_POD_DELETES_ADMITTED):
        assert (order.index(("ValidatingAdmissionPolicy", name))
                < order.index(("ValidatingAdmissionPolicyBinding", name))
                < order.index(("DaemonSet", names.CSI_NODE)))


def test_the_synthesized_l2_stack_applies_the_guard_before_the_node_plugin(templates, project):
    """``make synth``: the L2 stack's Curvine manifest carries the same two objects, in the same order."""
    import json

    l2 = templates[f"{project.platform.project}-l2-cache"]
    found = []
    for resource in l2.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values():
        manifest = resource["Properties"]["Manifest"]
        if isinstance(manifest, dict):  # Fn::Join around the Primary's volume ID token
            manifest = "".join(p if isinstance(p, str) else "vol-0feedfacecafe0000" for p in manifest["Fn::Join"][1])
        found += [(o["kind"], o["metadata"]["name"]) for o in json.loads(manifest)]
    guard = [("ValidatingAdmissionPolicy", FUSE_POD_GUARD), ("ValidatingAdmissionPolicyBinding", FUSE_POD_GUARD)]
    assert found.index(guard[0]) < found.index(guard[1]) < found.index(("DaemonSet", names.CSI_NODE))


def test_the_guard_objects_validate_strictly(guard, counter):
    for obj in (*guard, *counter):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    broken = copy.deepcopy(guard[0])
    broken["spec"]["validations"][0]["expresion"] = broken["spec"]["validations"][0].pop("expression")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# --- the policy's CEL against the driver's own definition ------------------------------------------

def _fuse_pod(*, status: dict | None, deleting: bool = False, labels: dict | None = None) -> dict:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "curvine-csi-standalone-0a1b2c3d-4e5f6", "namespace": "curvine",
                        "labels": labels if labels is not None else dict([model.STANDALONE_LABEL_APP])},
           "spec": {"nodeName": NODE, "containers": [{"name": model.FUSE_CONTAINER}]}}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-09-01T10:00:00Z"
    if status is not None:
        pod["status"] = status
    return pod


def _pod_states() -> list[tuple[str, dict]]:
    """Every combination of the fields ``needsRecreation`` and ``isPodReady`` read (SM l.362-392,
    l.709-716), plus pods with no status or no container statuses yet."""
    states = [("no status", _fuse_pod(status=None)),
              ("Pending, no container status", _fuse_pod(status={"phase": "Pending"}))]
    container_states = {"running": {"running": {}}, "crash loop": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "creating": {"waiting": {"reason": "ContainerCreating"}},
                        "exited 0": {"terminated": {"exitCode": 0}}, "OOM-killed": {"terminated": {"exitCode": 137}}}
    for phase, deleting, (cname, cstate), restarts, ready in itertools.product(
            ("Pending", "Running", "Failed"), (False, True), container_states.items(), (0, 5, 6),
            ("True", "False", None)):
        status = {"phase": phase, "containerStatuses": [{"name": model.FUSE_CONTAINER, "restartCount": restarts,
                                                         "ready": ready == "True", "state": cstate}]}
        if ready is not None:
            status["conditions"] = [{"type": "Ready", "status": ready}]
        label = f"{phase}, {'deleting, ' if deleting else ''}{cname}, {restarts} restarts, Ready={ready}"
        states.append((label, _fuse_pod(status=status, deleting=deleting)))
    return states


#: DeleteOptions as the node plugin sends them (SM l.398-404 and l.644), and as the API server may
#: hand a default delete to admission (``BeforeDelete`` fills in the pod's grace period, 30 s).
SELF_HEAL = model.SELF_HEAL_DELETE_OPTIONS
REF_COUNT = {}
REF_COUNT_FILLED = {"gracePeriodSeconds": 30}


def _delete(user: str, namespace: str = "curvine", operation: str = "DELETE", sub: str = "",
            options: dict | None = None) -> dict:
    return {"operation": operation, "namespace": namespace, "name": "curvine-csi-standalone-0a1b2c3d-4e5f6",
            "userInfo": {"username": user}, "subResource": sub,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "options": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1",
                        **(REF_COUNT if options is None else options)}}


def session_gone(pod: dict) -> bool:
    """No curvine-fuse serves binds in ``pod`` now: ``needsRecreation`` without its restart count."""
    status = pod.get("status", {})
    return (status.get("phase") == "Failed" or bool(pod["metadata"].get("deletionTimestamp"))
            or any(cs.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
                   or cs.get("state", {}).get("terminated", {}).get("exitCode", 0) != 0
                   for cs in status.get("containerStatuses", [])))


@pytest.mark.parametrize("options", [SELF_HEAL, REF_COUNT, REF_COUNT_FILLED], ids=["self-heal", "ref count", "ref count, grace filled in"])
def test_the_guard_refuses_exactly_what_neither_the_self_heal_nor_a_gone_session_explains(admit, count, node_plugin,
                                                                                          options):
    """Self-heal deletes (``Foreground``): allowed iff ``needsRecreation`` or not Ready, the
    driver's own reasons. Ref-count, PV-watcher and GC deletes (default options): allowed iff the
    session is gone already; a not-Ready pod whose curvine-fuse still serves is refused (item 4).
    The counting policy warns on exactly the admitted ones and refuses nothing."""
    user = _plugin_user(node_plugin)
    refused = allowed = 0
    for label, pod in _pod_states():
        decision = admit(_delete(user, options=options), pod)
        assert decision.applied, label
        assert decision.reason != "failed", f"{label}: {decision.message}"  # no CEL error on any state
        if options is SELF_HEAL:
            expected = model.needs_recreation(pod)[0] or not model.is_pod_ready(pod)
        else:
            expected = session_gone(pod)
        assert decision.allowed == expected, label
        counted = count(_delete(user, options=options), pod)
        assert counted.allowed and counted.applied and counted.reason != "failed", label
        assert len(counted.warnings) == int(decision.allowed), label
        if decision.allowed:
            allowed += 1
            (warning,) = counted.warnings
            assert warning.startswith(f"FUSE pod {pod['metadata']['name']} deleted by the Curvine CSI node plugin ("), warning
            assert ("self-heal" in warning) == (options is SELF_HEAL), warning
        else:
            refused += 1
            assert decision.reason == "Forbidden" and decision.message.startswith(f"FUSE pod {pod['metadata']['name']}:")
    if options is SELF_HEAL:
        # Refused: phase Pending or Running, not deleting, container running, creating or exited
        # with 0 (needsRecreation ignores a zero exit code), 0 or 5 restarts, Ready: 2 x 3 x 2 = 12.
        assert refused == 12 and allowed == len(_pod_states()) - 12
    else:
        # Allowed only Failed, deleting, crash-looping or non-zero-exited pods; refused: phase
        # Pending or Running, not deleting, running, creating or exited 0, any restarts, any
        # Ready: 2 x 3 x 3 x 3 = 54, plus the two pods without container statuses.
        assert refused == 56 and allowed == len(_pod_states()) - 56


def test_the_guard_leaves_every_other_deleter_alone(admit, node_plugin):
    """Humans, the kubelet, the pod GC, other service accounts (h2's watchdog among them), other
    namespaces, other pods and other operations are never matched: only the node plugin's DELETE."""
    healthy = dict(_pod_states())["Running, running, 0 restarts, Ready=True"]
    assert not admit(_delete(_plugin_user(node_plugin)), healthy).allowed
    for user in ("kubernetes-admin", f"system:node:{NODE}", "system:serviceaccount:kube-system:pod-garbage-collector",
                 "system:serviceaccount:curvine:curvine-csi-controller", "system:serviceaccount:other:curvine-csi-node"):
        decision = admit(_delete(user), healthy)
        assert decision.allowed and not decision.applied, user
    assert not admit(_delete(_plugin_user(node_plugin), namespace="rag-assistant"), healthy).applied
    other_pod = _fuse_pod(status=healthy["status"], labels={"app.kubernetes.io/name": "curvine-csi"})
    assert not admit(_delete(_plugin_user(node_plugin)), other_pod).applied
    # A drain evicts through pods/eviction (CREATE), not a DELETE of the pod.
    assert not admit(_delete("kubernetes-admin", operation="CREATE", sub="eviction"), healthy).applied


# --- churn replays ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    """A replay on one node; ``control_breaks_at``: the step where, without the guard, a live pod
    first loses its mount (a healthy FUSE pod deleted by the node plugin)."""

    name: str
    run: Callable[[model.Node], None]
    control_breaks_at: str
    wanted: tuple[str, ...]  # pods that must be running, mounted, at the end


def two_pods_of_one_pvc(n: model.Node) -> None:
    n.step("A and B of line X start", lambda: (n.start_pod("A", LINE_X), n.start_pod("B", LINE_X)))
    n.step("A leaves the node", lambda: n.stop_pod("A"))
    n.advance(15 * 60)
    n.step("A2 arrives", lambda: n.start_pod("A2", LINE_X))


def rolling_update(n: model.Node) -> None:
    n.step("A and B start", lambda: (n.start_pod("A", LINE_X), n.start_pod("B", LINE_X)))
    n.step("surge: A2 starts", lambda: n.start_pod("A2", LINE_X))
    n.step("A stops", lambda: n.stop_pod("A"))
    n.step("surge: B2 starts", lambda: n.start_pod("B2", LINE_X))
    n.step("B stops", lambda: n.stop_pod("B"))
    n.advance(15 * 60)


def rolling_update_delete_first(n: model.Node) -> None:
    """maxSurge 0: each old pod goes before its replacement comes."""
    n.step("A and B start", lambda: (n.start_pod("A", LINE_X), n.start_pod("B", LINE_X)))
    n.step("A stops", lambda: n.stop_pod("A"))
    n.step("A2 starts", lambda: n.start_pod("A2", LINE_X))
    n.step("B stops", lambda: n.stop_pod("B"))
    n.step("B2 starts", lambda: n.start_pod("B2", LINE_X))
    n.advance(15 * 60)


def scale_to_zero_and_back(n: model.Node) -> None:
    n.step("A and B start", lambda: (n.start_pod("A", LINE_X), n.start_pod("B", LINE_X)))
    n.step("scale to 0: A's containers stop first", lambda: n.stop_pod("A"))
    n.step("scale to 0: then B's", lambda: n.stop_pod("B"))
    n.advance(15 * 60)
    n.step("scale to 2: A3 and B3 start", lambda: (n.start_pod("A3", LINE_X), n.start_pod("B3", LINE_X)))
    n.advance(15 * 60)


def janitor_rollout(n: model.Node) -> None:
    """The line's L2 janitor (Deployment, Recreate) mounts the line's PVC on the same node."""
    n.step("vLLM pod A and janitor J start", lambda: (n.start_pod("A", LINE_X), n.start_pod("J", LINE_X)))
    n.step("janitor rollout: J stops", lambda: n.stop_pod("J"))
    n.step("janitor rollout: J2 starts", lambda: n.start_pod("J2", LINE_X))
    n.advance(15 * 60)


def node_plugin_restart(n: model.Node) -> None:
    """The node plugin is replaced (DaemonSet rollout) while a pod of the line leaves the node: the
    kubelet's NodeUnpublishVolume waits for the new plugin, which reads its state back (RecoverState)."""
    n.step("A and B start", lambda: (n.start_pod("A", LINE_X), n.start_pod("B", LINE_X)))
    n.step("node plugin goes away", n.stop_plugin)
    n.step("A stops while the plugin is away", lambda: n.stop_pod("A"))
    n.advance(30)
    n.step("node plugin is back", n.start_plugin)
    n.advance(15 * 60)
    n.step("A2 starts", lambda: n.start_pod("A2", LINE_X))


def two_lines_on_one_node(n: model.Node) -> None:
    n.step("A (line X) and C (line Y) start", lambda: (n.start_pod("A", LINE_X), n.start_pod("C", LINE_Y)))
    n.step("line X rolls: A2 starts", lambda: n.start_pod("A2", LINE_X))
    n.step("line X rolls: A stops", lambda: n.stop_pod("A"))
    n.step("line Y leaves the node: C stops", lambda: n.stop_pod("C"))
    n.advance(15 * 60)


def _failed_stage_leaves_a_ref(n: model.Node) -> None:
    """NodeStageVolume adds the volume ref even when EnsureStandalone fails (NS l.173-180): line X's
    first pod arrives while FUSE cannot mount, and the line is gone before a stage succeeded, so the
    kubelet never unstages it and the ref stays (as its comment intends, for the PV watcher)."""
    n.runtime.can_mount = False
    n.step("line X's pod A arrives; FUSE cannot mount", lambda: n.start_pod("A", LINE_X))
    n.step("line X deleted before A ever started", lambda: n.stop_pod("A"))
    n.step("FUSE can mount again", n.runtime.mount_becomes_possible)
    n.step("C (line Y) starts", lambda: n.start_pod("C", LINE_Y))
    n.step("line Y rolls: C2 starts", lambda: n.start_pod("C2", LINE_Y))
    n.step("line Y rolls: C stops", lambda: n.stop_pod("C"))


def a_lines_pv_deleted(n: model.Node) -> None:
    _failed_stage_leaves_a_ref(n)
    n.step("line X's PV deleted: the PV watcher", lambda: n.delete_pv(LINE_X))
    n.advance(15 * 60)


def a_lines_pv_deleted_while_the_plugin_is_away(n: model.Node) -> None:
    """The PV watcher misses the deletion; the garbage collector's first run after the restart finds
    an entry none of whose volumes has a PV (NS l.725-739)."""
    _failed_stage_leaves_a_ref(n)
    n.step("node plugin goes away", n.stop_plugin)
    n.step("line X's PV deleted", lambda: n.delete_pv(LINE_X))
    n.step("node plugin is back", n.start_plugin)
    n.advance(15 * 60)


def fuse_pod_self_heal(n: model.Node) -> None:
    """The FUSE container crashes six times (restarted in place each time); the next publish makes
    EnsureStandalone replace the pod (RestartCount > 5), which resets its state entry to no volumes
    (SM l.342-350); the garbage collector then finds an entry without volumes (NS l.716-723)."""
    n.step("A starts", lambda: n.start_pod("A", LINE_X))
    fuse = n.fuse_pods[0]
    for i in range(6):
        n.step(f"FUSE container crash {i + 1}", lambda: n.runtime.crash(fuse))
    n.step("B starts: self-heal replaces the FUSE pod", lambda: n.start_pod("B", LINE_X))
    n.step("A restarted by its owner (h2's healer)", lambda: (n.stop_pod("A"), n.start_pod("A2", LINE_X)))
    n.advance(15 * 60)
    n.step("C starts", lambda: n.start_pod("C", LINE_X))


SCENARIOS = [
    Scenario("two pods of one PVC", two_pods_of_one_pvc, "A leaves the node", ("B", "A2")),
    Scenario("rolling update (surge)", rolling_update, "A stops", ("A2", "B2")),
    Scenario("rolling update (delete first)", rolling_update_delete_first, "A stops", ("A2", "B2")),
    Scenario("scale to zero and back", scale_to_zero_and_back, "scale to 0: A's containers stop first", ("A3", "B3")),
    Scenario("janitor rollout", janitor_rollout, "janitor rollout: J stops", ("A", "J2")),
    Scenario("node-plugin restart", node_plugin_restart, "node plugin is back", ("B", "A2")),
    Scenario("two lines on one node", two_lines_on_one_node, "line Y leaves the node: C stops", ("A2",)),
    Scenario("a line's PV deleted", a_lines_pv_deleted, "line X's PV deleted: the PV watcher", ("C2",)),
    Scenario("a line's PV deleted while the plugin is away", a_lines_pv_deleted_while_the_plugin_is_away,
             "node plugin is back + GC at 120 s", ("C2",)),
    Scenario("FUSE pod self-heal", fuse_pod_self_heal, "A restarted by its owner (h2's healer) + GC at 120 s",
             ("B", "A2", "C")),
]


def _mount_faults(node: model.Node) -> list[model.Violation]:
    """Live pods that lost their mount through the driver deleting a healthy FUSE pod (the fault of
    item 1), as opposed to a FUSE session that died by itself (a crash: item 2, h2's healer)."""
    return [v for v in node.violations if v.cause in ("deleted-healthy", "deleted-serving")]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_with_the_guard_no_live_pod_is_left_without_its_mount(make_node, scenario):
    node = make_node(guarded=True)
    scenario.run(node)
    assert _mount_faults(node) == []
    if scenario.name != "FUSE pod self-heal":  # there the crashes themselves kill A's mount (item 2)
        assert node.violations == []
    # The node plugin never removed a healthy FUSE pod, and no stage or publish failed for it.
    assert [d for d in node.api.deletes if d.allowed and d.healthy] == []
    # ... and refused only deletes of a pod whose curvine-fuse still served.
    assert [d for d in node.api.deletes if not d.allowed and not d.serving] == []
    # No stage or publish failed, but the one the PV scenarios set up (A's, while FUSE could not mount).
    assert {uid for _, uid, _ in node.kubelet.errors} <= ({"A"} if scenario.name.startswith("a line's PV") else set())
    for uid in scenario.wanted:
        assert node.kubelet.pods[uid].phase == "running" and node.mount_alive(uid), uid
    # What the refusals cost: at most one refused DELETE per unpublish/unstage/PV event and GC tick.
    refused = [d for d in node.api.deletes if not d.allowed]
    assert all(d.caller in {"NodeUnpublishVolume", "NodeUnstageVolume", "PV watcher", "GC"} for d in refused)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_without_the_guard_the_same_churn_kills_live_mounts(make_node, scenario):
    """The control: the driver as it is deletes a healthy FUSE pod under live pods."""
    node = make_node(guarded=False)
    scenario.run(node)
    faults = _mount_faults(node)
    assert faults, "the control did not break: the replay would not show the fault"
    assert faults[0].step == scenario.control_breaks_at
    assert any(d.allowed and d.healthy for d in node.api.deletes)


def test_a_refused_delete_costs_one_api_call_per_event_and_gc_tick_not_a_loop(make_node):
    """DeleteStandalone returns the refusal before touching the state (SM l.644-647) and its callers
    only log it (NS l.498-500, l.719-721): one refused call for the unpublish, then one per GC tick
    (2 min after the plugin starts, then every 10 minutes) while the entry stays empty."""
    node = make_node(guarded=True)
    two_pods_of_one_pvc(node)
    assert [(d.caller, d.allowed) for d in node.api.deletes] == [
        ("NodeUnpublishVolume", False), ("GC", False), ("GC", False)]  # ticks at 120 s and 720 s
    node.advance(60 * 60)  # one more hour: six more ticks, nothing else
    assert [d.caller for d in node.api.deletes[3:]] == ["GC"] * 6
    assert node.kubelet.errors == [] and node.fuse_pods == [node.api.deletes[0].name]


@pytest.mark.parametrize("fault", ["six restarts", "crash loop", "evicted", "OOM-killed, not restarted"])
def test_the_guard_never_blocks_the_drivers_self_heal(make_node, fault):
    """A broken FUSE pod is replaced at the next stage or publish (EnsureStandalone l.286-309) and
    the new pod serves new mounts; the replaced pod's old mounts are dead either way (item 2: h2)."""
    node = make_node(guarded=True)
    node.step("A starts", lambda: node.start_pod("A", LINE_X))
    (fuse,) = node.fuse_pods
    if fault == "six restarts":
        for _ in range(6):
            node.runtime.crash(fuse)
    elif fault == "crash loop":
        node.runtime.crash_loop(fuse)
    elif fault == "evicted":
        node.runtime.evict(fuse)
    else:  # the container ended with 137 and is not running again yet
        node.runtime._set_status(node.runtime.pods[fuse], phase="Running", ready=False, restarts=0,
                                 state={"terminated": {"exitCode": 137}})
        node.runtime._end_session(fuse, "container-restart")
    node.step("B starts", lambda: node.start_pod("B", LINE_X))
    (heal,) = node.api.deletes
    assert heal.allowed and not heal.healthy and heal.caller.startswith("NodePublishVolume (self-heal")
    assert node.kubelet.errors == [] and node.mount_alive("B") and not node.mount_alive("A")
    assert node.dead_mount_cause("A") in {"container-restart", "evicted", "deleted-self-heal"}


def test_a_pod_that_turns_ready_during_the_self_heal_is_kept_and_the_stage_retried(make_node):
    """EnsureStandalone deletes a FUSE pod still not Ready after its wait (l.298-305); if it turned
    Ready in between, the guard refuses, the stage fails once and the kubelet's retry finds it Ready."""
    node = make_node(guarded=True)
    node.runtime.can_mount = False
    node.step("A arrives; FUSE cannot mount yet", lambda: node.start_pod("A", LINE_X))
    assert [uid for _, uid, _ in node.kubelet.errors] == ["A"] and node.api.deletes == []
    node.api.on_wait_timeout = lambda name: node.runtime.mount_becomes_possible()
    node.step("kubelet retries; the pod turns Ready just after the wait")
    (refused,) = node.api.deletes
    assert not refused.allowed and refused.healthy and "not ready after waiting" in refused.caller
    assert [uid for _, uid, _ in node.kubelet.errors] == ["A", "A"]
    node.api.on_wait_timeout = None
    node.step("kubelet retries again")
    assert node.mount_alive("A") and len(node.kubelet.errors) == 2 and len(node.api.deletes) == 1


@pytest.mark.parametrize("guarded", [True, False])
def test_a_plugin_restart_keeps_a_healthy_fuse_pod_and_replaces_a_broken_one(make_node, guarded):
    """RecoverState (SM l.783-845) deletes only pods that need re-creation; standalone FUSE pods
    outlive the node plugin's own restarts (why standalone mode, not embedded, is kept)."""
    node = make_node(guarded=guarded)
    node.step("A starts", lambda: node.start_pod("A", LINE_X))
    node.step("plugin restarts", lambda: (node.stop_plugin(), node.start_plugin()))
    assert node.api.deletes == [] and node.mount_alive("A")
    (fuse,) = node.fuse_pods
    for _ in range(6):
        node.runtime.crash(fuse)
    node.step("plugin restarts", lambda: (node.stop_plugin(), node.start_plugin()))
    (recover,) = node.api.deletes
    assert recover.allowed and not recover.healthy and recover.caller.startswith("RecoverState")
    assert node.fuse_pods == []


# --- QoS of the FUSE pods ---------------------------------------------------------------------------

def qos_class(pod: dict) -> str:
    """Kubernetes ``GetPodQOS`` (pkg/apis/core/v1/helper/qos/qos.go) for CPU and memory: BestEffort
    without any request or limit; Guaranteed when every container has CPU and memory limits and its
    requests (defaulted to the limits when absent) equal them; else Burstable."""
    containers = pod["spec"]["containers"]
    if not any(c.get("resources", {}).get(k) for c in containers for k in ("requests", "limits")):
        return "BestEffort"
    for c in containers:
        limits = c["resources"].get("limits", {})
        requests = {**limits, **c["resources"].get("requests", {})}
        for resource in ("cpu", "memory"):
            if resource not in limits or quantity_bytes(requests[resource]) != quantity_bytes(limits[resource]):
                return "Burstable"
    return "Guaranteed"


def oom_score_adj(pod: dict, node_memory_bytes: int) -> int:
    """Kubelet ``GetContainerOOMScoreAdjust`` (pkg/kubelet/qos/policy.go) for a pod that is not
    node-critical: Guaranteed -997, BestEffort 1000, else 1000 - 1000 x memory request / node memory
    clamped to 3..999 (a Burstable pod is always killed before a Guaranteed one)."""
    qos = qos_class(pod)
    if qos == "Guaranteed":
        return -997
    if qos == "BestEffort":
        return 1000
    request = quantity_bytes(pod["spec"]["containers"][0]["resources"]["requests"]["memory"])
    return min(max(1000 - (1000 * request) // node_memory_bytes, 3), 999)


def _fuse_pod_from(env: dict[str, str]) -> dict:
    manager = model.StandaloneManager(model.ApiServer(namespace="curvine", admit_delete=None), node_name=NODE,
                                      plugin_env=env, user="")
    opts = model.StandaloneOptions(cluster_id="0e2246a3", mount_key="4b0cbd87" * 4, master_addrs="m:8995",
                                   fs_path="/kvcache", node_name=NODE, namespace="curvine", fuse_params={})
    return manager.build_standalone(opts, "curvine-csi-standalone-4b0cbd87-7fe5f", model.host_mount_path(opts.mount_key))


def test_the_fuse_pods_the_node_plugin_builds_are_guaranteed(node_plugin):
    """buildStandalone takes the FUSE pod's only resources from the STANDALONE_* variables
    (SM l.569-618) and sets no priorityClassName: the rendered values make it Guaranteed, with the
    lowest OOM score a pod that is not node-critical gets; the former values (500m/2, 512Mi/2Gi)
    made it Burstable, killed before the Guaranteed and the larger Burstable pods of the node."""
    env = _plugin_env(node_plugin)
    pod = _fuse_pod_from(env)
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    assert "priorityClassName" not in pod["spec"]
    node_memory = 384 * 2**30  # ml.g6e.12xlarge
    assert qos_class(pod) == "Guaranteed" and oom_score_adj(pod, node_memory) == -997
    before = _fuse_pod_from({**env, "STANDALONE_CPU_REQUEST": "500m", "STANDALONE_MEMORY_REQUEST": "512Mi"})
    assert qos_class(before) == "Burstable" and oom_score_adj(before, node_memory) == 999


# --- issue 24 item 4: a FUSE pod that is not Ready at a GC tick ------------------------------------

def fuse_pod_not_ready_at_a_gc_tick(n: model.Node) -> None:
    """A leaves (the ref-count delete is refused, the set stays empty); then the FUSE pod's readiness
    probe times out on a throttled node while curvine-fuse keeps serving B; the GC ticks."""
    n.step("A and B of line X start", lambda: (n.start_pod("A", LINE_X), n.start_pod("B", LINE_X)))
    n.step("A leaves the node", lambda: n.stop_pod("A"))
    (fuse,) = n.fuse_pods
    n.step("the FUSE pod's readiness probe times out", lambda: n.runtime.probes_time_out(fuse))
    n.advance(15 * 60)
    n.step("the probe answers again", lambda: n.runtime.probes_pass(fuse) if fuse in n.fuse_pods else None)


def test_a_fuse_pod_not_ready_at_a_gc_tick_keeps_its_live_mounts(make_node):
    node = make_node(guarded=True)
    fuse_pod_not_ready_at_a_gc_tick(node)
    assert node.violations == [] and node.mount_alive("B")
    gc = [d for d in node.api.deletes if d.caller == "GC"]
    assert len(gc) == 2 and not any(d.allowed for d in gc)  # ticks at 120 s and 720 s, refused
    assert all(d.serving and not d.healthy for d in gc)  # not Ready, but serving


def test_the_previous_guard_deleted_a_not_ready_fuse_pod_under_live_mounts(make_node, admit_previous):
    """The control: the rule before item 4 admitted every delete of a not-Ready pod."""
    node = make_node(guarded=True, admit_delete=admit_previous)
    fuse_pod_not_ready_at_a_gc_tick(node)
    faults = _mount_faults(node)
    assert faults[0] == model.Violation("the FUSE pod's readiness probe times out + GC at 120 s", "B", "deleted-serving")
    assert {(v.uid, v.cause) for v in faults} == {("B", "deleted-serving")}


def test_what_is_left_is_the_drivers_own_not_ready_self_heal_and_it_is_counted(make_node, admit, count):
    """A publish on a node whose FUSE pod stays not Ready through EnsureStandalone's 60 s wait
    replaces it (SM l.298-305), live binds included: the driver's self-heal, admitted on purpose
    (a wedged curvine-fuse is not Ready either). The counting policy warns on it, so it shows in
    the API server's metrics (KvCacheFusePodReplaced)."""
    warnings: list[tuple[str, ...]] = []

    def admit_and_count(request: dict, pod: dict) -> vap_eval.Decision:
        warnings.append(count(request, pod).warnings)
        return admit(request, pod)

    node = make_node(guarded=True, admit_delete=admit_and_count)
    node.step("A starts", lambda: node.start_pod("A", LINE_X))
    (fuse,) = node.fuse_pods
    node.step("the FUSE pod's readiness probe times out", lambda: node.runtime.probes_time_out(fuse))
    node.step("B arrives: EnsureStandalone waits, then self-heals", lambda: node.start_pod("B", LINE_X))
    (heal,) = node.api.deletes
    assert heal.allowed and heal.serving and "not ready after waiting" in heal.caller
    assert heal.options == model.SELF_HEAL_DELETE_OPTIONS
    assert node.dead_mount_cause("A") == "deleted-serving" and node.mount_alive("B")
    (counted,) = warnings
    assert counted == (f"FUSE pod {fuse} deleted by the Curvine CSI node plugin (self-heal: not Ready after 60 s)",)
