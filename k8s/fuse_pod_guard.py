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
plugin's service account* unless the driver's own self-heal would replace the pod. The driver
deletes a FUSE pod through two functions, told apart by the request's ``DeleteOptions``
(``request.options`` in CEL):

* ``deleteStandaloneAndWait`` (standalone_manager.go l.395-420): grace 0, ``propagationPolicy:
  Foreground``; its only callers are the self-heal of EnsureStandalone (l.288-294,
  ``needsRecreation``; l.298-305, "not ready after waiting" 60 s) and RecoverState (l.828-837);
* ``DeleteStandalone`` (l.640-660): default ``DeleteOptions{}``; its callers are the ref count
  (NodeUnpublishVolume, NodeUnstageVolume), the PV watcher and the garbage collector.

The policy allows

* a self-heal delete (``Foreground``) when ``needsRecreation`` (l.362-392: phase ``Failed``; a
  ``deletionTimestamp``; a container waiting in ``CrashLoopBackOff``; a container with
  ``restartCount > 5``; a container terminated with a non-zero exit code) or the pod is not Ready
  (``isPodReady`` l.709-716), exactly the driver's own reasons;
* a ref-count delete (default options) only when the FUSE session is certainly gone already
  (:data:`CEL_SESSION_GONE`: ``needsRecreation`` without the restart count, whose pod may be
  Running and Ready with a live session): phase ``Failed``, being deleted, ``CrashLoopBackOff``, a
  non-zero exit. A ref-count delete of a pod that is merely not Ready is refused: the readiness
  probe (``grep`` of ``/proc/mounts``, 3 s timeout, 3 failures 5 s apart, l.511-523) fails on a
  node busy enough to throttle the FUSE pod's 2 CPUs while curvine-fuse still serves every bind,
  and the driver's ref set stays empty after a refused delete, so the garbage collector's next
  10-minute tick would otherwise delete such a pod under live mounts (issue 24 item 4).

What is left of the window is the driver's own "not ready after waiting" self-heal: a stage or
publish on a node whose FUSE pod stays not Ready for 60 s replaces it, live binds included. It is
counted: a second policy, :data:`FUSE_POD_DELETES_ADMITTED` (``validationActions: [Warn]``,
``failurePolicy: Ignore``, never refusing anything), fails its validation exactly when the guard
admits a delete, so the API server counts every admitted delete in
``apiserver_validating_admission_policy_check_total{policy="curvine-fuse-pod-guard-admitted",
enforcement_action="warn"}`` and every refused one under ``{policy="curvine-fuse-pod-guard",
enforcement_action="deny"}`` (k8s.io/apiserver v0.34.0
``pkg/admission/plugin/policy/validating/dispatcher.go`` l.226-250: a passing validation is not
counted, so the guard alone cannot count admissions; docs/sources.md §16).

A refused DeleteStandalone returns its error before touching the state (l.644-647); every caller
logs it and returns success (node_standalone.go l.240-242, l.498-500, l.625-626, l.719-721,
l.736-738), so no publish or stage fails and nothing loops faster than the GC's 10-minute ticker.
Humans, drains (eviction API) and the kubelet use other identities and are not matched.
"""

from __future__ import annotations

from typing import Final

import cdk8s
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
#: The FUSE container serves no session now: phase ``Failed``, being deleted, waiting in
#: ``CrashLoopBackOff`` or terminated with a non-zero exit code (``needsRecreation`` without its
#: restart count). Deleting such a pod kills no live bind.
CEL_SESSION_GONE: Final = (
    "(has(oldObject.status) && has(oldObject.status.phase) && oldObject.status.phase == 'Failed')"
    " || has(oldObject.metadata.deletionTimestamp)"
    " || variables.containerStatuses.exists(cs,"
    f" (has(cs.state) && has(cs.state.waiting) && has(cs.state.waiting.reason)"
    f" && cs.state.waiting.reason == '{CRASH_LOOP_REASON}')"
    " || (has(cs.state) && has(cs.state.terminated) && has(cs.state.terminated.exitCode)"
    " && cs.state.terminated.exitCode != 0))")
#: ``needsRecreation`` (standalone_manager.go l.362-392): the above, or a container restarted more
#: than :data:`SELF_HEAL_MAX_RESTARTS` times.
CEL_NEEDS_RECREATION: Final = (
    "variables.sessionGone || variables.containerStatuses.exists(cs,"
    f" has(cs.restartCount) && cs.restartCount > {SELF_HEAL_MAX_RESTARTS})")
CEL_READY: Final = (
    "has(oldObject.status) && has(oldObject.status.conditions)"
    " && oldObject.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')")
#: ``propagationPolicy`` of ``deleteStandaloneAndWait`` (standalone_manager.go l.399-404), the
#: driver's self-heal; ``DeleteStandalone`` sends none (l.644). The API server hands the request's
#: ``DeleteOptions`` to CEL as ``request.options`` (k8s.io/apiserver v0.34.0
#: ``pkg/admission/plugin/cel/condition.go`` ``CreateAdmissionRequest``) and only reads this field
#: (``pkg/registry/generic/registry/store.go``); ``gracePeriodSeconds`` is not used: ``BeforeDelete``
#: fills it in when the client sent none (``pkg/registry/rest/delete.go`` l.150-160).
SELF_HEAL_PROPAGATION: Final = "Foreground"
CEL_SELF_HEAL_DELETE: Final = (
    "has(request.options) && has(request.options.propagationPolicy)"
    f" && request.options.propagationPolicy == '{SELF_HEAL_PROPAGATION}'")
#: Allowed when the driver's self-heal asks and would replace the pod itself, or when a ref-count
#: delete finds the session gone already; refused otherwise.
CEL_ALLOWED: Final = ("variables.selfHeal ? (variables.needsRecreation || !variables.ready)"
                      " : variables.sessionGone")
#: The CEL variables both policies declare, in evaluation order (later ones read earlier ones).
CEL_VARIABLES: Final = (("containerStatuses", CEL_CONTAINER_STATUSES), ("sessionGone", CEL_SESSION_GONE),
                        ("needsRecreation", CEL_NEEDS_RECREATION), ("ready", CEL_READY),
                        ("selfHeal", CEL_SELF_HEAL_DELETE))
REFUSAL_MESSAGE: Final = (
    "the Curvine CSI node plugin may delete a FUSE pod only to self-heal it, or when its FUSE session "
    "is gone: live L2 mounts on its node are bound to it (docs/l2-cache.md, Mount lifetime)")
#: The counting policy: its validation fails exactly when the guard admits a delete, and its
#: binding only warns, so every admitted delete is one ``enforcement_action="warn"`` count.
FUSE_POD_DELETES_ADMITTED: Final = "curvine-fuse-pod-guard-admitted"
ADMITTED_MESSAGE: Final = "admitted: the Curvine CSI node plugin deletes this FUSE pod; binds to its session on the node die"
#: ``messageExpression`` of the counting policy: the pod and which of the driver's paths asked.
ADMITTED_MESSAGE_EXPRESSION: Final = (
    "'FUSE pod ' + oldObject.metadata.name + ' deleted by the Curvine CSI node plugin ('"
    " + (variables.selfHeal ? (variables.needsRecreation ? 'self-heal: needsRecreation'"
    " : 'self-heal: not Ready after 60 s') : 'ref count or GC: session gone') + ')'")


def node_plugin_username(namespace: str, service_account: str) -> str:
    """The API user of the node plugin (in-cluster config, curvine-csi ``k8s_client.go`` l.46):
    ``system:serviceaccount:<namespace>:<service_account>``."""
    return f"system:serviceaccount:{namespace}:{service_account}"


def _spec(*, namespace: str, node_service_account: str, failure_policy: str,
          validation: k8s.Validation) -> k8s.ValidatingAdmissionPolicySpec:
    """What both policies match (the node plugin's DELETE of a FUSE pod), their variables and ``validation``."""
    return k8s.ValidatingAdmissionPolicySpec(
        failure_policy=failure_policy,
        match_constraints=k8s.MatchResources(
            resource_rules=[k8s.NamedRuleWithOperations(
                api_groups=[""], api_versions=["v1"], operations=["DELETE"], resources=["pods"])],
            namespace_selector=k8s.LabelSelector(match_labels={NAMESPACE_NAME_LABEL: namespace}),
            object_selector=k8s.LabelSelector(match_labels=dict([STANDALONE_LABEL]))),
        match_conditions=[k8s.MatchCondition(
            name="curvine-csi-node-plugin",
            expression=f"request.userInfo.username == '{node_plugin_username(namespace, node_service_account)}'")],
        variables=[k8s.Variable(name=name, expression=expression) for name, expression in CEL_VARIABLES],
        validations=[validation])


def fuse_pod_guard(scope: Construct, *, namespace: str, node_service_account: str,
                   labels: dict[str, str] | None = None) -> list[cdk8s.ApiObject]:
    """The policy that keeps FUSE pods with live mounts alive, and the policy that counts what it admits.

    Args:
        scope: the chart.
        namespace: the Curvine namespace (``curvine.namespace``), where the node plugin creates
            the FUSE pods (``KUBERNETES_NAMESPACE``, node_standalone.go l.43).
        node_service_account: the node plugin's service account (``names.CSI_NODE``).
        labels: labels for every object.

    Returns:
        [guard policy, its binding (``validationActions: [Deny]``), counting policy, its binding
        (``[Warn]``)], each binding depending on its policy, in the order to apply them.

    The guard fails closed (``failurePolicy: Fail``): an expression that cannot be evaluated
    refuses the node plugin's delete instead of silently letting the ref-count kill live mounts;
    the expressions guard every optional field, and the tests evaluate them against every pod
    state the driver distinguishes. The counting policy fails open (``Ignore``) and only warns:
    it can never refuse a delete (an evaluation error is counted with ``enforcement_action="allow"``
    and an ``error_type`` other than ``no_error``, dispatcher.go l.228-232).
    """
    guard = k8s.KubeValidatingAdmissionPolicy(
        scope, "FusePodGuard", metadata=k8s.ObjectMeta(name=FUSE_POD_GUARD, labels=labels),
        spec=_spec(namespace=namespace, node_service_account=node_service_account, failure_policy="Fail",
                   validation=k8s.Validation(
                       expression=CEL_ALLOWED, reason="Forbidden", message=REFUSAL_MESSAGE,
                       message_expression=f"'FUSE pod ' + oldObject.metadata.name + ': {REFUSAL_MESSAGE}'")))
    guard_binding = k8s.KubeValidatingAdmissionPolicyBinding(
        scope, "FusePodGuardBinding", metadata=k8s.ObjectMeta(name=FUSE_POD_GUARD, labels=labels),
        spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=FUSE_POD_GUARD, validation_actions=["Deny"]))
    guard_binding.add_dependency(guard)
    counter = k8s.KubeValidatingAdmissionPolicy(
        scope, "FusePodGuardAdmitted", metadata=k8s.ObjectMeta(name=FUSE_POD_DELETES_ADMITTED, labels=labels),
        spec=_spec(namespace=namespace, node_service_account=node_service_account, failure_policy="Ignore",
                   validation=k8s.Validation(expression=f"!({CEL_ALLOWED})", message=ADMITTED_MESSAGE,
                                             message_expression=ADMITTED_MESSAGE_EXPRESSION)))
    counter_binding = k8s.KubeValidatingAdmissionPolicyBinding(
        scope, "FusePodGuardAdmittedBinding", metadata=k8s.ObjectMeta(name=FUSE_POD_DELETES_ADMITTED, labels=labels),
        spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=FUSE_POD_DELETES_ADMITTED,
                                                      validation_actions=["Warn"]))
    counter_binding.add_dependency(counter)
    return [guard, guard_binding, counter, counter_binding]
