"""Network reach to the L2 and to the line endpoints (issue 25, items 1 and 4).

Curvine has no client authentication: whoever opens its RPC ports can read, overwrite and delete
every line's KV. Three controls, each for what the others cannot see:

1. **Egress, in every namespace but Curvine's and kube-system** (:func:`block_curvine_ports_spec`,
   the NetworkPolicy ``block-curvine-ports``): pods may connect anywhere except to Curvine's ports.
   The line charts render it in their namespaces; :func:`curvine_egress_generator` (a Kyverno
   ``ClusterPolicy``, ``generate`` with ``synchronize`` and ``generateExisting``) puts it into every
   other namespace, those that exist when it is applied and those created later; Kyverno's own
   namespace, which Kyverno filters out of its own processing, gets a rendered copy from the Curvine
   chart. :func:`curvine_egress_required` (a ValidatingAdmissionPolicy, native, fail-closed) refuses
   any pod-network Pod in a namespace that lacks it, so a namespace Kyverno missed is deny-by-default
   (its pods do not start), never open. Why egress and not only ingress: the VPC CNI gives pods
   addresses from the nodes' own subnets, so an ingress ``ipBlock`` that admits the host-network
   Workers and FUSE pods (node IPs) admits every pod too.
2. **Ingress of the Primary** (:class:`k8s.curvine_chart.CurvineChart`, ``curvine-master-ingress``):
   the journal port from Curvine's namespace only; RPC and web from Curvine's namespace and the VPC
   (node IPs of Workers and FUSE pods, the AMP scraper's ENIs on the web port).
3. **Host-network ports** (Workers, FUSE pods): no NetworkPolicy applies to them, and the VPC CNI's
   agent always allows a pod's traffic to and from its own node's IP (aws-network-policy-agent #65),
   so the node-level filter :mod:`k8s.node_firewall` is the control there.

Line endpoints (item 4): :func:`endpoint_ingress_spec`, ingress of a line's model pods from the
line's own namespace (the operator's router and the canary run there) on any port, and on the model
port from the VPC (the ALB with target type ``ip`` and the AMP scraper, whose ENIs are in the private
subnets). The InferenceEndpointConfig CRD has no authentication field (only ``tlsConfig``: a server
certificate for the ALB); docs/security.md says what that leaves open.
"""

from __future__ import annotations

from typing import Any, Final

import cdk8s
from constructs import Construct

from platform_config import PlatformConfig
from platform_config.platform_models import ExistingVpcConfig
# The label the line charts put on their namespaces: those render block-curvine-ports themselves,
# so the generator leaves them alone (no two owners of one object).
from k8s.kyverno import BUSINESS_LINE_NAMESPACE_LABEL
from k8s.curvine_config import CURVINE_PORTS, JOURNAL_PORT, MASTER_RPC_PORT, MASTER_WEB_PORT

#: Name of the egress NetworkPolicy in every namespace but Curvine's and kube-system.
BLOCK_CURVINE_PORTS: Final = "block-curvine-ports"
#: The Kyverno ClusterPolicy that generates it, and the admission policy (and binding) that requires it.
EGRESS_GENERATOR: Final = "kvcache-block-curvine-ports"
EGRESS_REQUIRED: Final = "kvcache-curvine-egress-required"
#: Ingress NetworkPolicy of a line's model pods.
ENDPOINT_INGRESS: Final = "endpoint-ingress"
#: Namespaces where no copy is generated or required: Curvine's own (its pods are the L2) and
#: kube-system (the CNI, kube-proxy, CoreDNS: cluster-admin territory; Kyverno filters it out anyway).
KUBE_SYSTEM: Final = "kube-system"
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
#: Primary ports by who needs them: the journal (Raft) only between masters, RPC from every client
#: (Workers, FUSE pods, the CSI controller), the web port also from the AMP scraper.
PRIMARY_JOURNAL_PORTS: Final = (JOURNAL_PORT,)
PRIMARY_CLIENT_PORTS: Final = (MASTER_RPC_PORT, MASTER_WEB_PORT)


def api_object(scope: Construct, construct_id: str, manifest: dict[str, Any]) -> cdk8s.ApiObject:
    """An ApiObject from a plain manifest (``spec`` added as a JSON patch: ApiObject takes no ``spec=``)."""
    obj = cdk8s.ApiObject(scope, construct_id, api_version=manifest["apiVersion"], kind=manifest["kind"],
                          metadata=manifest["metadata"])
    obj.add_json_patch(cdk8s.JsonPatch.add("/spec", manifest["spec"]))
    return obj


def tcp_ranges_excluding(ports: tuple[int, ...]) -> list[tuple[int, int]]:
    """Inclusive port ranges covering 1-65535 except ``ports`` (for an allow-list egress rule)."""
    ranges, start = [], 1
    for p in sorted(set(ports)):
        if p > start:
            ranges.append((start, p - 1))
        start = p + 1
    if start <= 65535:
        ranges.append((start, 65535))
    return ranges


#: The EC2 instance metadata service (IPv4) as a pod reaches it through its node.
IMDS_CIDR: Final = "169.254.169.254/32"


def block_curvine_ports_spec(*, deny_imds: bool = False) -> dict[str, Any]:
    """``spec`` of ``block-curvine-ports``: every pod of the namespace may connect anywhere, on every
    TCP port but Curvine's, and on UDP (DNS). Egress only: ingress is each workload's own business.

    ``deny_imds`` (a business line's namespace): anywhere but the instance metadata service
    (:data:`IMDS_CIDR`), whose node role credentials a line's pods never need (the S3 CSI driver
    and EKS Pod Identity, 169.254.170.23, are not it). Not for the generated copies: add-ons there
    (the load balancer controller, for one) may read the VPC and region from it. IPv4 only, as the
    cluster is.
    """
    tcp = [{"protocol": "TCP", "port": lo, **({"endPort": hi} if hi > lo else {})}
           for lo, hi in tcp_ranges_excluding(CURVINE_PORTS)]
    rule: dict[str, Any] = {"ports": [*tcp, {"protocol": "UDP"}]}
    if deny_imds:
        rule = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [IMDS_CIDR]}}], **rule}
    return {"podSelector": {}, "policyTypes": ["Egress"], "egress": [rule]}


def block_curvine_ports_manifest(namespace: str, *, deny_imds: bool = False) -> dict[str, Any]:
    """The ``block-curvine-ports`` NetworkPolicy of ``namespace`` (:func:`block_curvine_ports_spec`)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": BLOCK_CURVINE_PORTS, "namespace": namespace},
            "spec": block_curvine_ports_spec(deny_imds=deny_imds)}


def curvine_egress_generator(curvine_namespace: str) -> dict[str, Any]:
    """The Kyverno ``ClusterPolicy`` that keeps ``block-curvine-ports`` in every other namespace.

    ``generateExisting``: the namespaces that exist when the policy is applied (add-on namespaces,
    ``default``, the monitoring namespace) get it from the background controller at once.
    ``synchronize``: a deleted or edited copy is put back. For a namespace created later the trigger
    is its CREATE through Kyverno's webhook; the webhook's ``namespaceSelector``
    (:func:`k8s.kyverno.kyverno_helm_values`) is matched against a Namespace object's own labels, so
    Kyverno may not see an unlabelled one: :func:`curvine_egress_required` is what makes such a
    namespace deny-by-default (its pods are refused) rather than open.
    """
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": EGRESS_GENERATOR, "annotations": {
            "policies.kyverno.io/title": "Curvine ports closed to every namespace but Curvine's",
            "policies.kyverno.io/description": (
                f"Generates the egress NetworkPolicy {BLOCK_CURVINE_PORTS} (all TCP ports but Curvine's "
                f"{', '.join(map(str, CURVINE_PORTS))}, all UDP) in every namespace except "
                f"{curvine_namespace}, {KUBE_SYSTEM} and the business lines' (which render their own).")}},
        "spec": {
            "background": True,
            "generateExisting": True,
            "rules": [{
                "name": "generate-block-curvine-ports",
                "match": {"any": [{"resources": {"kinds": ["Namespace"]}}]},
                "exclude": {"any": [
                    {"resources": {"names": [curvine_namespace, KUBE_SYSTEM]}},
                    {"resources": {"selector": {"matchExpressions": [
                        {"key": BUSINESS_LINE_NAMESPACE_LABEL, "operator": "Exists"}]}}},
                ]},
                "generate": {
                    "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": BLOCK_CURVINE_PORTS,
                    "namespace": "{{ request.object.metadata.name }}", "synchronize": True,
                    "data": {"spec": block_curvine_ports_spec()},
                },
            }],
        },
    }


#: Label by which Kyverno's background controller's ClusterRole aggregates extra rights.
KYVERNO_BACKGROUND_AGGREGATE_LABEL: Final = "rbac.kyverno.io/aggregate-to-background-controller"
KYVERNO_GENERATE_RIGHTS: Final = "kvcache-kyverno-generate-networkpolicies"


def kyverno_generate_rights() -> dict[str, Any]:
    """ClusterRole aggregated into Kyverno's background controller: it may manage NetworkPolicies
    (the ``generate`` rule creates, synchronizes and, with the policy, deletes them) and nothing else."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": KYVERNO_GENERATE_RIGHTS,
                         "labels": {KYVERNO_BACKGROUND_AGGREGATE_LABEL: "true"}},
            "rules": [{"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}


#: CEL: the parameter (the namespace's ``block-curvine-ports``) selects every pod and is the
#: platform's egress allow-list: no TCP port of Curvine's is inside any of its allowed TCP ranges.
_PARAM_IS_THE_BLOCK: Final = (
    "params.spec.policyTypes == ['Egress']"
    " && !has(params.spec.podSelector.matchLabels) && !has(params.spec.podSelector.matchExpressions)"
    " && params.spec.egress.all(r, has(r.ports) && r.ports.all(p, p.protocol != 'TCP' || ("
    "has(p.port) && [" + ", ".join(map(str, CURVINE_PORTS)) + "].all(c, c < int(p.port)"
    " || c > (has(p.endPort) ? p.endPort : int(p.port))))))")


#: The check reads ports only: a rule's ``to`` can only narrow what it allows (a line's copy leaves the
#: instance metadata service out, :func:`block_curvine_ports_spec`), never open a Curvine port.
def curvine_egress_required(curvine_namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding: a pod-network Pod is admitted only in a namespace
    whose NetworkPolicy ``block-curvine-ports`` exists (``paramRef`` by name in the Pod's namespace,
    ``parameterNotFoundAction: Deny``) and is the platform's block. hostNetwork Pods are exempt (no
    NetworkPolicy applies to them; the node filter does), and so are Curvine's namespace and kube-system.
    """
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": EGRESS_REQUIRED},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy"},
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["pods"]}]},
            "matchConditions": [{"name": "pod-network",
                                 "expression": "!has(object.spec.hostNetwork) || !object.spec.hostNetwork"}],
            "validations": [{"expression": _PARAM_IS_THE_BLOCK, "reason": "Forbidden", "message": (
                f"this namespace's NetworkPolicy {BLOCK_CURVINE_PORTS} must select every pod and allow no "
                f"Curvine port ({', '.join(map(str, CURVINE_PORTS))}); see docs/security.md")}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": EGRESS_REQUIRED},
        "spec": {
            "policyName": EGRESS_REQUIRED, "validationActions": ["Deny"],
            "paramRef": {"name": BLOCK_CURVINE_PORTS, "parameterNotFoundAction": "Deny"},
            "matchResources": {"namespaceSelector": {"matchExpressions": [
                {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": [curvine_namespace, KUBE_SYSTEM]}]}},
        },
    }
    return policy, binding


def vpc_cidr(platform: PlatformConfig) -> str:
    """CIDR of the cluster VPC (node IPs of the host-network Workers and FUSE pods, the ALB's and the
    AMP scraper's ENIs, and, with the VPC CNI, every pod IP are in it)."""
    net = platform.network
    return net.vpc_cidr if isinstance(net, ExistingVpcConfig) else net.cidr


def endpoint_ingress_spec(*, namespace: str, pod_labels: dict[str, str], model_port: int,
                          vpc_cidr: str) -> dict[str, Any]:
    """``spec`` of a line's ``endpoint-ingress``: its model pods admit the line's own namespace on any
    port (the operator's router, the canary, the warmer) and the VPC on the model port only (the ALB,
    target type ``ip``, whose ENIs are in the private subnets; the AMP scraper's ENIs likewise)."""
    return {
        "podSelector": {"matchLabels": dict(pod_labels)},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}]},
            {"from": [{"ipBlock": {"cidr": vpc_cidr}}], "ports": [{"protocol": "TCP", "port": model_port}]},
        ],
    }
