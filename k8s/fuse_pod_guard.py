"""Mount lifetime: the Curvine CSI node plugin may delete a FUSE pod only when it would self-heal it.

With ``MOUNT_MODE=standalone`` the node plugin of Curvine CSI v0.3.2-alpha (unchanged through
v0.4.1 and main) keeps, per node and mount key, a *set* of volume IDs; NodeStageVolume adds the
volume, but NodeUnpublishVolume removes it for every *pod* and deletes the node's FUSE pod when the
set is empty (``RemoveVolumeRef`` returns ``RefCount == 0``; node_standalone.go l.489-501,
standalone_manager.go l.752-779). So the first of two pods of one PVC to leave a node, a rolling
update, a janitor rollout or a GC tick after a FUSE pod was re-created takes the FUSE mount away
from every other pod on the node (ENOTCONN until they restart). docs/l2-cache.md "Mount lifetime"
and docs/sources.md §16 give the whole analysis; ``tests/k8s/csi_standalone_model.py`` replays it.

The fix here keeps standalone mode and takes the decision away from the ref-count: a
ValidatingAdmissionPolicy (``admissionregistration.k8s.io/v1``, GA since Kubernetes 1.30) refuses a
``DELETE`` of a pod labelled ``app=curvine-standalone`` in the Curvine namespace *by the node
plugin's service account* while that pod is healthy, "healthy" being exactly the complement of
the driver's own reasons to replace it:

* ``needsRecreation`` (standalone_manager.go l.362-392): phase ``Failed``; a
  ``deletionTimestamp``; a container waiting in ``CrashLoopBackOff``; a container with
  ``restartCount > 5``; a container terminated with a non-zero exit code;
* not Ready (``isPodReady`` l.709-716), the case of EnsureStandalone's "not ready after waiting"
  path (l.298-305).

So the driver's self-heal (EnsureStandalone l.286-309, RecoverState l.828-837) still replaces a
broken FUSE pod, while DeleteStandalone from NodeUnpublishVolume, NodeUnstageVolume, the PV
watcher and the garbage collector can never remove a healthy one. A refused DeleteStandalone
returns its error before touching the state (l.644-647); every caller logs it and returns success
(node_standalone.go l.240-242, l.498-500, l.625-626, l.719-721, l.736-738), so no publish or stage
fails and nothing loops faster than the GC's 10-minute ticker. Humans, drains (eviction API) and
the kubelet use other identities and are not matched.
"""

from __future__ import annotations

from typing import Final

from constructs import Construct

from k8s.kube import k8s

#: Name of the policy and of its binding (cluster-scoped objects).
FUSE_POD_GUARD: Final = "curvine-fuse-pod-guard"
#: Label the node plugin puts on every standalone FUSE pod: ``StandaloneLabelApp`` /
#: ``StandaloneLabelAppValue`` (standalone_manager.go l.35-36, set in ``buildStandalone`` l.438-442;
#: the GC lists pods with it, node_standalone.go l.670).
STANDALONE_LABEL: Final = ("app", "curvine-standalone")
#: Name prefix of the FUSE pods (``StandaloneNamePrefix``, standalone_manager.go l.32).
STANDALONE_NAME_PREFIX: Final = "curvine-csi-standalone-"
#: ``needsRecreation`` replaces a pod one of whose containers has restarted *more* than this many
#: times (``cs.RestartCount > 5``, standalone_manager.go l.381).
SELF_HEAL_MAX_RESTARTS: Final = 5
#: Waiting reason ``needsRecreation`` treats as a crash loop (standalone_manager.go l.376).
CRASH_LOOP_REASON: Final = "CrashLoopBackOff"
#: The well-known label every namespace carries with its own name (Kubernetes 1.21+).
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"

#: CEL variables of the policy, in evaluation order (later ones read earlier ones). Every optional
#: field is guarded with ``has()``: the API server evaluates against the stored pod, and a missing
#: field is an error in CEL, which ``failurePolicy: Fail`` would turn into a refusal.
CEL_CONTAINER_STATUSES: Final = (
    "has(oldObject.status) && has(oldObject.status.containerStatuses)"
    " ? oldObject.status.containerStatuses : []")
CEL_NEEDS_RECREATION: Final = (
    "(has(oldObject.status) && has(oldObject.status.phase) && oldObject.status.phase == 'Failed')"
    " || has(oldObject.metadata.deletionTimestamp)"
    " || variables.containerStatuses.exists(cs,"
    f" (has(cs.state) && has(cs.state.waiting) && has(cs.state.waiting.reason)"
    f" && cs.state.waiting.reason == '{CRASH_LOOP_REASON}')"
    f" || (has(cs.restartCount) && cs.restartCount > {SELF_HEAL_MAX_RESTARTS})"
    " || (has(cs.state) && has(cs.state.terminated) && has(cs.state.terminated.exitCode)"
    " && cs.state.terminated.exitCode != 0))")
CEL_READY: Final = (
    "has(oldObject.status) && has(oldObject.status.conditions)"
    " && oldObject.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')")
#: Allowed when the driver itself would replace the pod; refused otherwise.
CEL_ALLOWED: Final = "variables.needsRecreation || !variables.ready"
REFUSAL_MESSAGE: Final = (
    "the Curvine CSI node plugin may not delete a Ready FUSE pod that needs no self-heal: live L2 "
    "mounts on its node are bound to it (docs/l2-cache.md, Mount lifetime)")


def node_plugin_username(namespace: str, service_account: str) -> str:
    """The API user of the node plugin (in-cluster config, curvine-csi ``k8s_client.go`` l.46):
    ``system:serviceaccount:<namespace>:<service_account>``."""
    return f"system:serviceaccount:{namespace}:{service_account}"


def fuse_pod_guard(scope: Construct, *, namespace: str, node_service_account: str,
                   labels: dict[str, str] | None = None
                   ) -> tuple[k8s.KubeValidatingAdmissionPolicy, k8s.KubeValidatingAdmissionPolicyBinding]:
    """The policy that keeps healthy FUSE pods alive, and its binding (``validationActions: [Deny]``).

    Args:
        scope: the chart.
        namespace: the Curvine namespace (``curvine.namespace``), where the node plugin creates
            the FUSE pods (``KUBERNETES_NAMESPACE``, node_standalone.go l.43).
        node_service_account: the node plugin's service account (``names.CSI_NODE``).
        labels: labels for both objects.

    Returns:
        (policy, binding); the binding depends on the policy.

    The policy fails closed (``failurePolicy: Fail``): an expression that cannot be evaluated
    refuses the node plugin's delete instead of silently letting the ref-count kill live mounts;
    the expressions guard every optional field, and the tests evaluate them against every pod
    state the driver distinguishes.
    """
    meta = k8s.ObjectMeta(name=FUSE_POD_GUARD, labels=labels)
    policy = k8s.KubeValidatingAdmissionPolicy(
        scope, "FusePodGuard", metadata=meta,
        spec=k8s.ValidatingAdmissionPolicySpec(
            failure_policy="Fail",
            match_constraints=k8s.MatchResources(
                resource_rules=[k8s.NamedRuleWithOperations(
                    api_groups=[""], api_versions=["v1"], operations=["DELETE"], resources=["pods"])],
                namespace_selector=k8s.LabelSelector(match_labels={NAMESPACE_NAME_LABEL: namespace}),
                object_selector=k8s.LabelSelector(match_labels=dict([STANDALONE_LABEL]))),
            match_conditions=[k8s.MatchCondition(
                name="curvine-csi-node-plugin",
                expression=f"request.userInfo.username == '{node_plugin_username(namespace, node_service_account)}'")],
            variables=[k8s.Variable(name="containerStatuses", expression=CEL_CONTAINER_STATUSES),
                       k8s.Variable(name="needsRecreation", expression=CEL_NEEDS_RECREATION),
                       k8s.Variable(name="ready", expression=CEL_READY)],
            validations=[k8s.Validation(
                expression=CEL_ALLOWED, reason="Forbidden", message=REFUSAL_MESSAGE,
                message_expression=f"'FUSE pod ' + oldObject.metadata.name + ': {REFUSAL_MESSAGE}'")]))
    binding = k8s.KubeValidatingAdmissionPolicyBinding(
        scope, "FusePodGuardBinding", metadata=k8s.ObjectMeta(name=FUSE_POD_GUARD, labels=labels),
        spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=FUSE_POD_GUARD, validation_actions=["Deny"]))
    binding.add_dependency(policy)
    return policy, binding
