"""Whether one TCP connection is allowed under rendered NetworkPolicies, as the VPC CNI enforces them.

No cluster runs here, so the reach tests evaluate the rendered policies (never copies) with the
semantics of ``networking.k8s.io/v1`` NetworkPolicy as the Kubernetes documentation ("Network
Policies") and API reference state them, plus what the Amazon VPC CNI's network policy agent does
where the API leaves it to the implementation (docs/security.md cites each):

1. A pod is *isolated* for a direction when a policy of its namespace selects it (``podSelector``)
   and lists that direction in ``policyTypes``; an isolated pod's connection is allowed when any
   rule of any such policy matches (policies add up; no deny rules). A connection needs the
   source's egress *and* the destination's ingress.
2. A rule with no ``from``/``to`` matches every peer; with no ``ports``, every port. A peer with
   ``podSelector`` only: pods of the policy's namespace; ``namespaceSelector`` only: every pod of
   the selected namespaces; both: those pods of those namespaces; ``ipBlock``: addresses in ``cidr``
   and not in any ``except``. Ports: ``protocol`` (TCP when absent), ``port``, ``endPort``.
3. VPC CNI: an ``ipBlock`` matches pod IPs too (pods take addresses from the VPC's subnets).
4. VPC CNI (aws-network-policy-agent PR #65): traffic between a pod and its own node's IP is always
   allowed, whatever the policies say.
5. hostNetwork endpoints are the node: no policy selects them and no policy's egress constrains
   them; as peers they are their node's IP (only an ``ipBlock`` matches them).

The node filter's verdict (:func:`nft_input_verdict`) is read from the rendered nftables ruleset;
test_node_firewall_netns.py checks it against the real nft on every probe it makes.

Kyverno ``generate`` (:func:`expand_generate`) is expanded into the NetworkPolicies it would create;
only the constructs :func:`k8s.network_policies.curvine_egress_generator` uses are implemented, and
any other raises :class:`Unsupported`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any


class Unsupported(ValueError):
    """A construct this evaluator does not implement."""


@dataclass(frozen=True)
class Endpoint:
    """A pod (or a host-network process) with its namespace's labels and its node's IP."""

    name: str
    namespace: str
    ip: str
    node_ip: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    host_network: bool = False


def _selector(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise Unsupported(f"label selector keys {sorted(unknown)}")
    ops = {"In": lambda k, v: labels.get(k) in v, "NotIn": lambda k, v: labels.get(k) not in v,
           "Exists": lambda k, v: k in labels, "DoesNotExist": lambda k, v: k not in labels}
    return (all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
            and all(ops[e["operator"]](e["key"], e.get("values", [])) for e in selector.get("matchExpressions", [])))


def _in_block(ip: str, block: dict[str, Any]) -> bool:
    address = ipaddress.ip_address(ip)
    return (address in ipaddress.ip_network(block["cidr"])
            and not any(address in ipaddress.ip_network(e) for e in block.get("except", [])))


def _peer(peer: dict[str, Any], policy_namespace: str, other: Endpoint) -> bool:
    unknown = set(peer) - {"podSelector", "namespaceSelector", "ipBlock"}
    if unknown:
        raise Unsupported(f"peer keys {sorted(unknown)}")
    if "ipBlock" in peer:
        return _in_block(other.ip, peer["ipBlock"])
    if other.host_network:  # the node's IP: no pod or namespace selector resolves to it
        return False
    if "namespaceSelector" in peer:
        if not _selector(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return _selector(peer.get("podSelector"), other.labels)


def _port(ports: list[dict[str, Any]] | None, port: int) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        if "port" not in p:
            return True
        if isinstance(p["port"], str):
            raise Unsupported("named ports")
        if p["port"] <= port <= p.get("endPort", p["port"]):
            return True
    return False


def _allowed(policies: list[dict], subject: Endpoint, other: Endpoint, port: int, direction: str) -> bool:
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies if p["metadata"]["namespace"] == subject.namespace
                 and direction in p["spec"].get("policyTypes", ["Ingress"])
                 and _selector(p["spec"]["podSelector"], subject.labels)]
    if not selecting:
        return True
    return any(_port(rule.get("ports"), port)
               and (not rule.get(peers_key) or any(_peer(peer, p["metadata"]["namespace"], other)
                                                   for peer in rule[peers_key]))
               for p in selecting for rule in p["spec"].get(key, []))


def connection_allowed(policies: list[dict], src: Endpoint, dst: Endpoint, port: int) -> bool:
    """Whether the NetworkPolicies (and the VPC CNI's rules 3-5 above) allow ``src`` to open
    ``dst:port``. Host-network destinations answer True here: NetworkPolicy has no say over them
    (the node filter does: tests/k8s/test_k8s_reach.py)."""
    policies = [p for p in policies if p["kind"] == "NetworkPolicy"]
    if not src.host_network:
        if dst.ip == src.node_ip:  # rule 4
            return True
        if not _allowed(policies, src, dst, port, "Egress"):
            return False
    if dst.host_network:
        return True
    if src.ip == dst.node_ip:  # rule 4, from the node
        return True
    return _allowed(policies, dst, src, port, "Ingress")


def expand_generate(cluster_policy: dict, namespaces: dict[str, dict[str, str]]) -> list[dict]:
    """The objects a Kyverno ``ClusterPolicy`` of ``generate`` rules on Namespaces creates, one per
    matching namespace (``namespaces``: name -> labels); ``{{ request.object.metadata.name }}`` in
    the target namespace is the namespace's name."""
    out = []
    for rule in cluster_policy["spec"]["rules"]:
        unknown = set(rule) - {"name", "match", "exclude", "generate"}
        if unknown:
            raise Unsupported(f"rule keys {sorted(unknown)}")
        if [r["resources"] for r in rule["match"]["any"]] != [{"kinds": ["Namespace"]}]:
            raise Unsupported("match other than any Namespace")
        gen = rule["generate"]
        if gen["namespace"] != "{{ request.object.metadata.name }}" or set(gen) - {
                "apiVersion", "kind", "name", "namespace", "synchronize", "data"}:
            raise Unsupported("generate form")
        for ns, labels in namespaces.items():
            excluded = False
            for entry in rule.get("exclude", {}).get("any", []):
                res = entry["resources"]
                if set(res) - {"names", "selector"}:
                    raise Unsupported(f"exclude keys {sorted(res)}")
                if ("names" not in res or ns in res["names"]) and ("selector" not in res or _selector(
                        res["selector"], labels)):
                    excluded = True
            if not excluded:
                out.append({"apiVersion": gen["apiVersion"], "kind": gen["kind"],
                            "metadata": {"name": gen["name"], "namespace": ns}, **gen["data"]})
    return out


def nft_input_verdict(ruleset: str, *, saddr: str, iifname: str, dport: int) -> str:
    """The verdict of the rendered ruleset's input chain on one new TCP connection, read from the
    ruleset text (the few rule forms :func:`k8s.node_firewall.render_ruleset` writes; anything else
    fails): ``accept`` or ``reject``. The real nft answers the same: test_node_firewall_netns.py."""
    sets: dict[str, list] = {}
    for name, body in re.findall(r"set (\w+) \{(.*?)\n\t\}", ruleset, re.S):
        elements = re.search(r"elements = \{ (.*) \}", body)
        sets[name] = [ipaddress.ip_network(e.strip()) for e in elements.group(1).split(",")] if elements else []
    (chain,) = re.findall(r"chain input \{\n(.*?)\n\t\}", ruleset, re.S)
    for rule in (line.strip() for line in chain.splitlines()[1:]):
        if rule == 'iifname "lo" accept':
            if iifname == "lo":
                return "accept"
            continue
        m = re.fullmatch(r"tcp dport \{ ([\d, ]+) \}(?: ip saddr @(\w+))?(?: counter)? (accept|reject with tcp reset)", rule)
        assert m, f"rule form not modelled: {rule}"
        ports, set_name, verdict = {int(p) for p in m.group(1).split(",")}, m.group(2), m.group(3)
        if dport in ports and (set_name is None or any(ipaddress.ip_address(saddr) in n for n in sets[set_name])):
            return verdict.split()[0]
    return "accept"  # policy accept
