"""Who reaches Curvine's ports and the line endpoints: every namespace the platform creates, plus an
arbitrary new one, against every Curvine and endpoint port (issue 25, items 1 and 4).

The rendered objects decide, evaluated with :mod:`tests.k8s.netpol_eval` (NetworkPolicy as the VPC
CNI enforces it, Kyverno's ``generate`` expanded), :mod:`tests.k8s.vap_eval` (the admission policy
that refuses pods where ``block-curvine-ports`` is missing) and, for the host-network Workers and FUSE
pods, the node filter's behaviour, which tests/k8s/test_node_firewall_netns.py proves on the rendered
nftables ruleset in real network namespaces. What the controls cannot stop is listed in
:data:`KNOWN_GAPS`, each with its reason, and asserted as *allowed*, so a change that closes one
fails here and the list (and docs/security.md) is updated with it.

The cluster: a system node, two GPU nodes; node and pod IPs in the same VPC subnets (VPC CNI). The
probe pod of each namespace runs on the GPU node of the Worker and FUSE pod it probes, the hardest
case: the VPC CNI always lets a pod reach its own node's IP. The node filter's answer is read from
the rendered ruleset itself (:func:`tests.k8s.netpol_eval.nft_input_verdict`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

import pytest

from k8s import names
from k8s.curvine_config import (FUSE_WEB_PORT, JOURNAL_PORT, MASTER_RPC_PORT, MASTER_WEB_PORT, WORKER_RPC_PORT,
                                WORKER_WEB_PORT)
from k8s.kyverno import KYVERNO_NAMESPACE
from k8s.network_policies import (BLOCK_CURVINE_PORTS, EGRESS_GENERATOR, EGRESS_REQUIRED, KUBE_SYSTEM,
                                  NAMESPACE_NAME_LABEL, block_curvine_ports_manifest)
from k8s.node_firewall import WEB_PORTS, render_ruleset
from tests.k8s.conftest import find
from tests.k8s.netpol_eval import Endpoint, connection_allowed, expand_generate, nft_input_verdict
from tests.k8s import vap_eval

SYSTEM_NODE, GPU_NODE_1, GPU_NODE_2 = "10.192.10.10", "10.192.20.10", "10.192.20.11"
NODE_IPS: Final = (SYSTEM_NODE, GPU_NODE_1, GPU_NODE_2)
#: The Primary's and the CSI controller's pod IPs (Curvine's pod-network pods, peers of the node filter).
CURVINE_POD_IPS: Final = ("10.192.10.50", "10.192.10.51")
#: Namespaces other installs create: the inference add-on, cert-manager, HyperPod's ai-toolkit
#: (Tiered Storage), the monitoring namespace (DCGM exporter's release; observability.namespace).
ADDON_NAMESPACES: Final = ("cert-manager", "hyperpod-inference-system", "aws-hyperpod", "default")
NEW_NAMESPACE: Final = "created-tomorrow"
#: A port the model pods do not serve to the world (anything but the model port).
OTHER_POD_PORT: Final = 8001


def _pod(name: str, ns: str, ip: str, node: str, labels: dict[str, str] | None = None,
         ns_labels: dict[str, str] | None = None, host: bool = False) -> Endpoint:
    return Endpoint(name=name, namespace=ns, ip=ip, node_ip=node, labels=labels or {},
                    namespace_labels={NAMESPACE_NAME_LABEL: ns, **(ns_labels or {})}, host_network=host)


@pytest.fixture(scope="module")
def world(manifests, k8s_project):
    platform = k8s_project.platform
    curvine_ns = platform.curvine.namespace
    namespaces: dict[str, dict[str, str]] = {}
    for chart in manifests.values():
        for o in chart:
            if o["kind"] == "Namespace":
                namespaces[o["metadata"]["name"]] = {NAMESPACE_NAME_LABEL: o["metadata"]["name"],
                                                     **o["metadata"].get("labels", {})}
    for ns in (KYVERNO_NAMESPACE, platform.observability.namespace, KUBE_SYSTEM, *ADDON_NAMESPACES, NEW_NAMESPACE):
        namespaces.setdefault(ns, {NAMESPACE_NAME_LABEL: ns})
    # The monitoring namespace's copy comes with its Namespace from the observability stack
    # (stacks/observability_stack.py; tests/observability/test_dcgm_exporter.py checks it is there).
    objects = [o for chart in manifests.values() for o in chart] + [
        block_curvine_ports_manifest(platform.observability.namespace)]
    generator = find(manifests["curvine"], "ClusterPolicy", EGRESS_GENERATOR)
    # Kyverno leaves its own namespace out of its processing (the chart's resource filters), and its
    # webhooks may not see a namespace created after it (the monitoring namespace): no copy is
    # generated there; the Curvine chart and the observability stack render theirs.
    rendered = {o["metadata"]["namespace"] for o in objects
                if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == BLOCK_CURVINE_PORTS}
    generated = expand_generate(generator, {n: l for n, l in namespaces.items() if n not in rendered})
    assert {KYVERNO_NAMESPACE, platform.observability.namespace} <= rendered
    return {"platform": platform, "curvine_ns": curvine_ns, "namespaces": namespaces, "objects": objects,
            "generated": generated, "lines": k8s_project.business_lines}


def _policies(world, *, kyverno_saw_new_namespace: bool = True) -> list[dict]:
    generated = [g for g in world["generated"]
                 if kyverno_saw_new_namespace or g["metadata"]["namespace"] != NEW_NAMESPACE]
    return [o for o in world["objects"] if o["kind"] == "NetworkPolicy"] + generated


def _admitted(world, policies: list[dict], ns: str, *, host_network: bool = False) -> vap_eval.Decision:
    """The admission policy's answer to a Pod CREATE in ``ns`` given the NetworkPolicies that exist."""
    objects = world["objects"]
    policy = find(objects, "ValidatingAdmissionPolicy", EGRESS_REQUIRED)
    binding = find(objects, "ValidatingAdmissionPolicyBinding", EGRESS_REQUIRED)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": ns},
           "spec": {"containers": [{"name": "c", "image": "busybox"}], **({"hostNetwork": True} if host_network else {})}}
    return vap_eval.evaluate(
        policy, [binding], obj=pod, old_object=None, namespace_labels=world["namespaces"].get(ns, {NAMESPACE_NAME_LABEL: ns}),
        request={"operation": "CREATE", "namespace": ns, "name": "probe", "userInfo": {"username": "someone"},
                 "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": ""},
        params={(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in policies})


def _destinations(world) -> list[tuple[str, Endpoint, int]]:
    cv = world["curvine_ns"]
    primary = _pod("primary", cv, "10.192.10.50", SYSTEM_NODE,
                   {"app.kubernetes.io/name": "curvine", "app.kubernetes.io/component": "master"})
    worker = _pod("worker", cv, GPU_NODE_1, GPU_NODE_1, {"app.kubernetes.io/component": "worker"}, host=True)
    fuse = _pod("fuse", cv, GPU_NODE_1, GPU_NODE_1, {"app": "curvine-standalone"}, host=True)
    out = [("primary", primary, p) for p in (MASTER_RPC_PORT, JOURNAL_PORT, MASTER_WEB_PORT)]
    out += [("worker", worker, p) for p in (WORKER_RPC_PORT, WORKER_WEB_PORT)] + [("fuse", fuse, FUSE_WEB_PORT)]
    for i, line in enumerate(world["lines"]):
        model = _pod(f"model-{line.name}", line.namespace, f"10.192.20.{100 + i}", GPU_NODE_2,
                     {names.OPERATOR_POD_LABEL: names.endpoint_name(line)},
                     world["namespaces"][line.namespace])
        out += [(f"endpoint:{line.name}", model, line.vllm.port), (f"endpoint:{line.name}", model, OTHER_POD_PORT)]
    return out


def _node_filter_allows(world, src: Endpoint, dst: Endpoint, port: int) -> bool:
    """The rendered ruleset, with the peers the design gives it (the Nodes' InternalIPs and Curvine's
    pod-network pods: the Primary and the CSI controller) and the VPC as scrapers, on the connection:
    a host-network process of the same node comes through lo."""
    ruleset = render_ruleset(peers=[*NODE_IPS, *CURVINE_POD_IPS], scrapers=[world["platform"].network.cidr])
    local = src.host_network and src.node_ip == dst.node_ip
    return nft_input_verdict(ruleset, saddr=src.ip, iifname="lo" if local else "eth0", dport=port) == "accept"


def reach(world, policies: list[dict], src: Endpoint, dst: Endpoint, port: int) -> bool:
    ok = connection_allowed(policies, src, dst, port)
    if dst.host_network:
        ok = ok and _node_filter_allows(world, src, dst, port)
    return ok


def _expected(world, src_ns: str, target: str, port: int) -> bool:
    """The design: Curvine's ports from Curvine's namespace only; a line's model pods from the line's
    own namespace on every port, from nobody else on other ports; the gaps as listed."""
    if target.startswith("endpoint:"):
        line = next(l for l in world["lines"] if l.name == target.split(":", 1)[1])
        # The model port from any pod: a listed gap (KNOWN_GAPS, "model port from any pod").
        return src_ns == line.namespace or port == line.vllm.port
    if src_ns == world["curvine_ns"]:
        return True
    return (src_ns, target, port) in _curvine_gaps(world)


def _curvine_gaps(world) -> set[tuple[str, str, int]]:
    """Curvine reach the controls leave, by (source namespace, target, port)."""
    gaps = set()
    for ns in world["namespaces"]:
        if ns == world["curvine_ns"]:
            continue
        # The web (metrics) ports of the host-network Workers and FUSE pods: the node filter admits
        # the VPC there (the AMP scraper's ENIs have no known addresses), and the VPC CNI lets a pod
        # reach its own node's IP whatever its egress policy says.
        gaps |= {(ns, "worker", WORKER_WEB_PORT), (ns, "fuse", FUSE_WEB_PORT)}
    # kube-system carries no egress policy (excluded: the CNI, CoreDNS; cluster-admin territory), and
    # the Primary's RPC and web ports admit the VPC (host-network Workers and FUSE pods, the scraper).
    gaps |= {(KUBE_SYSTEM, "primary", MASTER_RPC_PORT), (KUBE_SYSTEM, "primary", MASTER_WEB_PORT)}
    return gaps


#: What the controls cannot stop, and why (docs/security.md, "Threat model").
KNOWN_GAPS: Final = {
    "model port from any pod": "the model pods admit the VPC on the model port (ALB ip targets and the AMP "
                               "scraper have ENIs in the private subnets) and, with the VPC CNI, pod IPs are "
                               "VPC addresses: an ipBlock cannot tell them apart; the operator's CRD has no "
                               "authentication field",
    "Curvine web ports of the node, from its pods": "metrics only (/metrics, FUSE /healthz); the node filter "
                                                    "admits the VPC there for the scraper",
    "Primary RPC and web from kube-system": "kube-system is excluded from the egress policy; the Primary's "
                                            "ingress must admit node IPs, which share subnets with pod IPs",
    "Primary RPC from any VPC address that is no pod": "same ipBlock: EC2 instances, load balancers, "
                                                       "endpoints of the VPC; the security groups are the "
                                                       "control there",
}


def test_reach_matrix_every_namespace_every_port(world):
    """Every namespace (a pod on the pod network, on the probed Worker's node) against every Curvine
    and endpoint port: allowed exactly as designed, the listed gaps included."""
    policies = _policies(world)
    checked, wrong = 0, []
    for ns in world["namespaces"]:
        assert _admitted(world, policies, ns).allowed, ns  # the admission policy lets its pods start
        src = _pod(f"probe-{ns}", ns, "10.192.20.77" if ns != world["curvine_ns"] else "10.192.10.51", GPU_NODE_1,
                   {"app": "probe"}, world["namespaces"][ns])
        for target, dst, port in _destinations(world):
            got, want = reach(world, policies, src, dst, port), _expected(world, ns, target, port)
            checked += 1
            if got != want:
                wrong.append((ns, target, port, "allowed" if got else "denied"))
    assert not wrong, wrong
    assert checked >= len(world["namespaces"]) * 8


def test_a_namespace_kyverno_missed_is_deny_by_default(world):
    """A namespace created later that Kyverno's webhook did not see (its ``namespaceSelector`` is
    matched against the new Namespace's own labels) has no ``block-curvine-ports``: the admission
    policy refuses its pod-network pods, so nothing there reaches the L2; hostNetwork pods are the
    node filter's business and pass."""
    policies = _policies(world, kyverno_saw_new_namespace=False)
    assert not any(p["metadata"]["namespace"] == NEW_NAMESPACE for p in policies)
    refused = _admitted(world, policies, NEW_NAMESPACE)
    assert not refused.allowed and refused.reason == "ParamNotFound"
    assert _admitted(world, policies, NEW_NAMESPACE, host_network=True).allowed
    # And with the generated copy in place, its pods start and are kept off Curvine.
    assert _admitted(world, _policies(world), NEW_NAMESPACE).allowed


@pytest.mark.parametrize("ns", ["curvine", KUBE_SYSTEM])
def test_curvine_and_kube_system_need_no_copy(world, ns):
    assert _admitted(world, [], ns).allowed


def test_a_weakened_copy_refuses_new_pods(world):
    """A ``block-curvine-ports`` that opens a Curvine port (or selects only some pods) is refused as a
    parameter: new pods of that namespace do not start until it is the platform's again."""
    policies = _policies(world)
    ns = "default"
    (mine,) = [p for p in policies if p["metadata"]["namespace"] == ns and p["metadata"]["name"] == BLOCK_CURVINE_PORTS]
    opened = {**mine, "spec": {**mine["spec"], "egress": [{"ports": [{"protocol": "TCP", "port": 1, "endPort": 65535}]}]}}
    narrowed = {**mine, "spec": {**mine["spec"], "podSelector": {"matchLabels": {"app": "x"}}}}
    for weakened in (opened, narrowed):
        others = [p for p in policies if p is not mine]
        assert not _admitted(world, others + [weakened], ns).allowed
    assert _admitted(world, policies, ns).allowed


def test_who_else_reaches_a_line_endpoint(world):
    """Outside the cluster's pods: the ALB and the scraper (VPC ENIs) open the model port only; the
    Workers' and FUSE pods' node IPs likewise; a source outside the VPC (a peered network) nothing."""
    policies = _policies(world)
    for target, dst, port in (d for d in _destinations(world) if d[0].startswith("endpoint:")):
        line = next(l for l in world["lines"] if l.name == target.split(":", 1)[1])
        for src in (_pod("alb", "", "10.192.0.40", "", host=True), _pod("scraper", "", "10.192.1.40", "", host=True)):
            assert reach(world, policies, src, dst, port) is (port == line.vllm.port), (src.name, target, port)
        outside = _pod("peered", "", "172.16.0.9", "", host=True)
        assert not reach(world, policies, outside, dst, port)


def test_curvine_components_reach_each_other(world):
    """The host-network Workers and FUSE pods (node IPs) reach the Primary's RPC port and each other's
    Worker port; the journal port only Curvine's own pods. An address of the VPC that is no pod (the
    scraper's ENI here; any EC2 instance of the VPC) opens the web ports, and the Primary's RPC port:
    a listed gap (its ingress must admit node IPs, and no CIDR tells those apart)."""
    policies = _policies(world)
    dests = {(t, p): d for t, d, p in _destinations(world)}
    worker_g2 = _pod("worker-g2", world["curvine_ns"], GPU_NODE_2, GPU_NODE_2, host=True)
    assert reach(world, policies, worker_g2, dests[("primary", MASTER_RPC_PORT)], MASTER_RPC_PORT)
    assert reach(world, policies, worker_g2, dests[("worker", WORKER_RPC_PORT)], WORKER_RPC_PORT)
    assert not reach(world, policies, worker_g2, dests[("primary", JOURNAL_PORT)], JOURNAL_PORT)
    scraper = _pod("scraper", "", "10.192.1.40", "", host=True)
    for (target, port), dst in dests.items():
        if target in ("primary", "worker", "fuse"):
            want = port in WEB_PORTS or (target, port) == ("primary", MASTER_RPC_PORT)
            assert reach(world, policies, scraper, dst, port) is want, (target, port)


def test_without_the_controls_everything_is_open(world):
    """The matrix can fail: with no policy and no node filter, a pod of any namespace opens every port."""
    src = _pod("probe", "default", "10.192.20.77", GPU_NODE_1, ns_labels={})
    for _, dst, port in _destinations(world):
        assert connection_allowed([], src, dst, port)
    assert connection_allowed([], replace(src, namespace=NEW_NAMESPACE), _destinations(world)[0][1], MASTER_RPC_PORT)


#: The instance metadata service as a pod reaches it (its node answers).
IMDS: Final = "169.254.169.254"


def test_line_pods_do_not_reach_the_instance_metadata_service_and_addons_still_do(world):
    """Issue 25 (low): a business line's pods (vLLM, the janitor, the canary) never need the node
    role's credentials, so their namespace's copy leaves IMDS out; the generated copies in other
    namespaces do not (the load balancer controller may read its VPC and region there). EKS Pod
    Identity's agent (169.254.170.23) stays reachable. The admission policy still admits line pods."""
    policies = _policies(world)
    imds = _pod("imds", "", IMDS, GPU_NODE_2, host=True)
    pod_identity = _pod("eks-pod-identity-agent", "", "169.254.170.23", GPU_NODE_2, host=True)
    for i, line in enumerate(world["lines"]):
        vllm = _pod(f"model-{line.name}", line.namespace, f"10.192.20.{100 + i}", GPU_NODE_2,
                    {names.OPERATOR_POD_LABEL: names.endpoint_name(line)}, world["namespaces"][line.namespace])
        assert not connection_allowed(policies, vllm, imds, 80), line.name
        assert connection_allowed(policies, vllm, pod_identity, 80), line.name
        assert _admitted(world, policies, line.namespace).allowed, line.name
    for ns in (*ADDON_NAMESPACES, NEW_NAMESPACE):
        addon = _pod("addon", ns, "10.192.10.60", SYSTEM_NODE, ns_labels=world["namespaces"][ns])
        assert connection_allowed(policies, addon, imds, 80), ns
