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
  (:data:`FUSE_SERVICE_ACCOUNT`: no RBAC, no token; curvine-fuse never calls the API server) and
  not asking for a token (``automountServiceAccountToken`` absent or false), every container and
  init container on the pinned CSI image (``STANDALONE_IMAGE`` is exactly the node plugin's image),
  no ephemeral container, only the two ``hostPath`` volumes ``buildStandalone`` makes (l.539-558:
  ``/dev/fuse`` and a directory under :data:`HOST_MOUNT_BASE_DIR`, no ``..``), and bound to the
  requesting pod's node: ``authentication.kubernetes.io/node-name`` in the bound token's user info
  (feature gate ``ServiceAccountTokenPodNodeInfo``, beta and on by default from Kubernetes 1.30,
  docs/sources.md §30). With ``require_node_name`` (``eks.version`` 1.30 or later) a request
  without that claim is refused: a node's plugin can place FUSE pods on its own node only. On
  1.28 and 1.29 the claim is absent and the node is not checked (docs/security.md, residual);
* **delete a Pod**: only a FUSE pod (``app=curvine-standalone``; which of those it may delete is
  :mod:`k8s.fuse_pod_guard`'s decision);
* **ConfigMaps**: only the driver's state ConfigMaps, ``curvine-standalone-state-<node>``.

Not restricted (the driver's ``buildStandalone`` is read, not run here): the FUSE pods' security
context, host namespaces and command, which are the driver's own and which a compromised identity
could still ask for on its own node with the pinned image (a privileged container of the CSI image
on a node it already owns); docs/security.md states the residue.
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
#: Kubernetes release from which the API server puts :data:`NODE_NAME_EXTRA` in a pod-bound token's
#: user info by default (``ServiceAccountTokenPodNodeInfo`` beta, default on; docs/sources.md §30).
NODE_NAME_EXTRA_SINCE: Final = (1, 30)
#: The FUSE pods' host directories: ``HostMountBaseDir`` (standalone_manager.go l.48); each pod's
#: ``fuse-mount`` is ``<base>/<mount key>/fuse-mount`` (``GetHostMountPath`` l.233-235).
HOST_MOUNT_BASE_DIR: Final = "/var/lib/kubelet/plugins/curvine"
#: The FUSE device, the pods' other ``hostPath`` (``fuse-device``, l.549-557).
FUSE_DEVICE: Final = "/dev/fuse"


def node_name_claim_available(eks_version: str) -> bool:
    """Whether the API server of ``eks_version`` (``"1.34"``) names the requesting pod's node in a
    bound token's user info (:data:`NODE_NAME_EXTRA_SINCE`)."""
    major, minor = (int(part) for part in eks_version.split(".")[:2])
    return (major, minor) >= NODE_NAME_EXTRA_SINCE


def _fuse_pod_create(image: str, *, require_node_name: bool) -> str:
    label, value = STANDALONE_LABEL
    images = f"c.image == '{image}'"
    claimed = (f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra"
               f" && size(request.userInfo.extra['{NODE_NAME_EXTRA}']) == 1")
    own_node = f"has(object.spec.nodeName) && object.spec.nodeName == request.userInfo.extra['{NODE_NAME_EXTRA}'][0]"
    node = f"({claimed} && {own_node})" if require_node_name else f"(!({claimed}) || ({own_node}))"
    volume = (f"has(v.hostPath) && (v.hostPath.path == '{FUSE_DEVICE}'"
              f" || (v.hostPath.path.startsWith('{HOST_MOUNT_BASE_DIR}/') && !v.hostPath.path.contains('..')))")
    return (
        "request.resource.resource != 'pods' || request.operation != 'CREATE' || ("
        f"has(object.metadata.labels) && '{label}' in object.metadata.labels"
        f" && object.metadata.labels['{label}'] == '{value}'"
        f" && has(object.spec.serviceAccountName) && object.spec.serviceAccountName == '{FUSE_SERVICE_ACCOUNT}'"
        " && (!has(object.spec.automountServiceAccountToken) || object.spec.automountServiceAccountToken == false)"
        f" && object.spec.containers.all(c, {images})"
        f" && (!has(object.spec.initContainers) || object.spec.initContainers.all(c, {images}))"
        " && !has(object.spec.ephemeralContainers)"
        f" && (!has(object.spec.volumes) || object.spec.volumes.all(v, {volume}))"
        f" && {node})")


def _fuse_pod_delete() -> str:
    label, value = STANDALONE_LABEL
    return ("request.resource.resource != 'pods' || request.operation != 'DELETE' || ("
            f"has(oldObject.metadata.labels) && '{label}' in oldObject.metadata.labels"
            f" && oldObject.metadata.labels['{label}'] == '{value}')")


def _state_config_maps() -> str:
    return f"request.resource.resource != 'configmaps' || request.name.startsWith('{STATE_CONFIG_MAP_PREFIX}')"


def csi_node_limits(scope: Construct, *, namespace: str, node_service_account: str, csi_image: str,
                    require_node_name: bool, labels: dict[str, str] | None = None
                    ) -> tuple[k8s.KubeValidatingAdmissionPolicy, k8s.KubeValidatingAdmissionPolicyBinding]:
    """The policy that confines the node plugin's identity, and its binding (``validationActions: [Deny]``).

    Args:
        scope: the chart.
        namespace: the Curvine namespace (where the node plugin's Role grants its rights).
        node_service_account: the node plugin's service account (``names.CSI_NODE``).
        csi_image: the pinned CSI image (``versions.images.curvine_csi``), the FUSE pods' only image.
        require_node_name: refuse a pod CREATE whose token does not name the requesting pod's node
            (:func:`node_name_claim_available` of ``eks.version``).
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
                k8s.Validation(expression=_fuse_pod_create(csi_image, require_node_name=require_node_name), reason="Forbidden", message=(
                    f"the Curvine CSI node plugin may create only FUSE pods: label {'='.join(STANDALONE_LABEL)}, "
                    f"service account {FUSE_SERVICE_ACCOUNT} without a token, image {csi_image}, volumes {FUSE_DEVICE} "
                    f"and {HOST_MOUNT_BASE_DIR}/..., on its own node")),
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
