"""What the Curvine CSI node plugin's identity may create, delete and write: only FUSE pods and their state.

Why. The node plugin (``curvine-csi-node``, a privileged DaemonSet on every GPU node) needs ``create``
and ``delete`` on Pods and write access to ConfigMaps in the Curvine namespace, whose Pod Security
level is ``privileged``: it starts the standalone FUSE pods (privileged, hostNetwork, hostPID) and
keeps its per-node state in a ConfigMap (curvine-csi v0.3.2-alpha ``standalone_manager.go``
``buildStandalone`` l.423-566, ``RecoverState`` l.786, ``saveStateLocked`` l.855-888; docs/sources.md
§16). RBAC cannot narrow ``create`` by name or content, so with RBAC alone whoever holds that
identity (one compromised GPU node: its token is on the node) could start any privileged pod on any
node with any image, delete the Curvine Primary, or rewrite the L2 mount watchdog's code (a
ConfigMap of the same namespace, run by a privileged DaemonSet): the whole cluster (issue 25, item 2).

This ValidatingAdmissionPolicy (``admissionregistration.k8s.io/v1``) refuses every request of that
identity in the Curvine namespace except what the driver does:

* **create a Pod**: labelled ``app=curvine-standalone``, under the FUSE pods' own service account
  (:data:`FUSE_SERVICE_ACCOUNT`: no RBAC, no token; curvine-fuse never calls the API server), every
  container and init container on the pinned CSI image (``STANDALONE_IMAGE`` is exactly the node
  plugin's image), and, where the API server tells the requesting pod's node
  (``authentication.kubernetes.io/node-name`` in the bound token's user info, Kubernetes 1.30+ with
  ``ServiceAccountTokenPodNodeInfo``), bound to that node: a node's plugin can place FUSE pods on
  its own node only;
* **delete a Pod**: only a FUSE pod (``app=curvine-standalone``; which of those it may delete is
  :mod:`k8s.fuse_pod_guard`'s decision);
* **ConfigMaps**: only the driver's state ConfigMaps, ``curvine-standalone-state-<node>``.

Not restricted (the driver's ``buildStandalone`` is read, not run here): the FUSE pods' volumes,
security context and host namespaces, which are the driver's own and which a compromised identity
could still ask for on its own node with the pinned image; docs/security.md states the residue.
"""

from __future__ import annotations

from typing import Final

from constructs import Construct

from k8s.fuse_pod_guard import NAMESPACE_NAME_LABEL, STANDALONE_LABEL, node_plugin_username
from k8s.kube import k8s

#: Name of the policy and of its binding (cluster-scoped objects).
CSI_NODE_LIMITS: Final = "curvine-csi-node-limits"
#: Service account of the standalone FUSE pods (``STANDALONE_SERVICE_ACCOUNT``): no RBAC binding,
#: ``automountServiceAccountToken: false``.
FUSE_SERVICE_ACCOUNT: Final = "curvine-fuse"
#: Name prefix of the driver's state ConfigMaps (``curvine-standalone-state-<node>``,
#: standalone_manager.go ``RecoverState`` l.786).
STATE_CONFIG_MAP_PREFIX: Final = "curvine-standalone-state-"
#: User-info extra of a bound service-account token: the node of the pod the token belongs to.
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"


def _fuse_pod_create(image: str) -> str:
    label, value = STANDALONE_LABEL
    images = f"c.image == '{image}'"
    return (
        "request.resource.resource != 'pods' || request.operation != 'CREATE' || ("
        f"has(object.metadata.labels) && '{label}' in object.metadata.labels"
        f" && object.metadata.labels['{label}'] == '{value}'"
        f" && has(object.spec.serviceAccountName) && object.spec.serviceAccountName == '{FUSE_SERVICE_ACCOUNT}'"
        f" && object.spec.containers.all(c, {images})"
        f" && (!has(object.spec.initContainers) || object.spec.initContainers.all(c, {images}))"
        f" && (!has(request.userInfo.extra) || !('{NODE_NAME_EXTRA}' in request.userInfo.extra)"
        f" || (has(object.spec.nodeName) && object.spec.nodeName == request.userInfo.extra['{NODE_NAME_EXTRA}'][0])))")


def _fuse_pod_delete() -> str:
    label, value = STANDALONE_LABEL
    return ("request.resource.resource != 'pods' || request.operation != 'DELETE' || ("
            f"has(oldObject.metadata.labels) && '{label}' in oldObject.metadata.labels"
            f" && oldObject.metadata.labels['{label}'] == '{value}')")


def _state_config_maps() -> str:
    return f"request.resource.resource != 'configmaps' || request.name.startsWith('{STATE_CONFIG_MAP_PREFIX}')"


def csi_node_limits(scope: Construct, *, namespace: str, node_service_account: str, csi_image: str,
                    labels: dict[str, str] | None = None
                    ) -> tuple[k8s.KubeValidatingAdmissionPolicy, k8s.KubeValidatingAdmissionPolicyBinding]:
    """The policy that confines the node plugin's identity, and its binding (``validationActions: [Deny]``).

    Args:
        scope: the chart.
        namespace: the Curvine namespace (where the node plugin's Role grants its rights).
        node_service_account: the node plugin's service account (``names.CSI_NODE``).
        csi_image: the pinned CSI image (``versions.images.curvine_csi``), the FUSE pods' only image.
        labels: labels for both objects.

    Returns:
        (policy, binding); the binding depends on the policy.

    Fails closed (``failurePolicy: Fail``); every optional field is guarded, and the tests evaluate
    the rendered expressions on the requests the driver makes and on the ones it must not.
    """
    meta = k8s.ObjectMeta(name=CSI_NODE_LIMITS, labels=labels)
    rule = k8s.NamedRuleWithOperations
    policy = k8s.KubeValidatingAdmissionPolicy(
        scope, "CsiNodeLimits", metadata=meta,
        spec=k8s.ValidatingAdmissionPolicySpec(
            failure_policy="Fail",
            match_constraints=k8s.MatchResources(
                resource_rules=[
                    rule(api_groups=[""], api_versions=["v1"], operations=["CREATE", "DELETE"], resources=["pods"]),
                    rule(api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE", "DELETE"],
                         resources=["configmaps"])],
                namespace_selector=k8s.LabelSelector(match_labels={NAMESPACE_NAME_LABEL: namespace})),
            match_conditions=[k8s.MatchCondition(
                name="curvine-csi-node-plugin",
                expression=f"request.userInfo.username == '{node_plugin_username(namespace, node_service_account)}'")],
            validations=[
                k8s.Validation(expression=_fuse_pod_create(csi_image), reason="Forbidden", message=(
                    f"the Curvine CSI node plugin may create only FUSE pods: label {'='.join(STANDALONE_LABEL)}, "
                    f"service account {FUSE_SERVICE_ACCOUNT}, image {csi_image}, on its own node")),
                k8s.Validation(expression=_fuse_pod_delete(), reason="Forbidden", message=(
                    f"the Curvine CSI node plugin may delete only FUSE pods ({'='.join(STANDALONE_LABEL)})")),
                k8s.Validation(expression=_state_config_maps(), reason="Forbidden", message=(
                    f"the Curvine CSI node plugin may write only its state ConfigMaps ({STATE_CONFIG_MAP_PREFIX}<node>)")),
            ]))
    binding = k8s.KubeValidatingAdmissionPolicyBinding(
        scope, "CsiNodeLimitsBinding", metadata=k8s.ObjectMeta(name=CSI_NODE_LIMITS, labels=labels),
        spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=CSI_NODE_LIMITS, validation_actions=["Deny"]))
    binding.add_dependency(policy)
    return policy, binding
