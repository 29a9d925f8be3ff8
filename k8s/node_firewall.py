"""The node-level filter of Curvine's host-network ports (issue 25, item 1, node side).

Why. The Workers (RPC 8997, web 9002) and the CSI driver's FUSE pods (web 9003) run on the host
network. No NetworkPolicy selects a host-network listener, and the VPC CNI's network policy agent
always allows a pod's traffic to and from its own node's IP (aws-network-policy-agent PR #65), so a
pod's egress policy cannot keep it off its own node's Worker. With the VPC CNI, pod IPs come from the
same subnets as node IPs: no CIDR tells them apart. What does: the node list. This filter admits
Curvine's ports only from loopback (the node's own processes: the FUSE client to its local Worker,
the kubelet's probes), from a set of *peers* (the InternalIPs of the cluster's Nodes, and the pod IPs
of Curvine's own pod-network pods, the Primary and the CSI controller), and the web (metrics) ports
also from the *scrapers* (the AMP collector's ENIs: the VPC CIDR, since their addresses are not known
in advance); every other source gets a TCP reset: pods of any namespace, on this node or another.

The ruleset is one ``nft -f`` transaction that replaces the table ``inet kvcache_curvine`` whole
(create-if-missing, delete, create), so a reload never leaves the ports open in between and touches
no other table (kube-proxy's, the VPC CNI's). Hook ``input`` at priority ``filter - 10``: before any
``filter``-priority chain of other owners that might accept first; traffic to pod IPs (forwarded) is
not touched.

Rendered here, tested for real in network namespaces (tests/k8s/test_node_firewall_netns.py): a node
with a listener, a peer node, a pod. Applying it on every GPU node (a hostNetwork DaemonSet with
``NET_ADMIN`` that re-renders on every Node change) is not built yet: docs/security.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from typing import Final, Iterable, Sequence

from k8s.curvine_config import (FUSE_WEB_PORT, JOURNAL_PORT, MASTER_RPC_PORT, MASTER_WEB_PORT, WORKER_RPC_PORT,
                                WORKER_WEB_PORT)

TABLE: Final = "kvcache_curvine"
#: Ports only peers may open (the master's too, in case a Primary ever runs on the host network).
RPC_PORTS: Final = (MASTER_RPC_PORT, JOURNAL_PORT, WORKER_RPC_PORT)
#: Web ports: Prometheus text at ``/metrics`` (and ``/healthz`` on FUSE): peers and scrapers.
WEB_PORTS: Final = (MASTER_WEB_PORT, WORKER_WEB_PORT, FUSE_WEB_PORT)


def _elements(addresses: Iterable[str], what: str) -> str:
    nets = sorted({ipaddress.ip_network(a, strict=False) for a in addresses},
                  key=lambda n: (n.network_address, n.prefixlen))
    if any(n.version != 4 for n in nets):
        raise ValueError(f"{what}: IPv4 addresses or CIDRs only (the cluster is IPv4)")
    # An interval set refuses overlapping elements: keep only the outermost networks.
    kept = [n for n in nets if not any(o != n and n.subnet_of(o) for o in nets)]
    return ", ".join(str(n.network_address) if n.prefixlen == 32 else str(n) for n in kept)


def _set(name: str, addresses: Sequence[str]) -> list[str]:
    lines = [f"\tset {name} {{", "\t\ttype ipv4_addr", "\t\tflags interval"]
    if addresses:
        lines.append(f"\t\telements = {{ {_elements(addresses, name)} }}")
    return lines + ["\t}"]


def _ports(ports: Iterable[int]) -> str:
    return "{ " + ", ".join(str(p) for p in sorted(ports)) + " }"


def render_ruleset(*, peers: Sequence[str], scrapers: Sequence[str] = ()) -> str:
    """The complete ``nft -f`` input: replaces table ``inet kvcache_curvine``.

    Args:
        peers: node InternalIPs and Curvine's own pod IPs (addresses or CIDRs); may be empty (then
            only loopback reaches the RPC ports).
        scrapers: sources that may also open the web ports (the VPC CIDR for the AMP collector).
    """
    all_ports = _ports((*RPC_PORTS, *WEB_PORTS))
    return "\n".join([
        f"table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        *_set("peers", peers),
        *_set("scrapers", scrapers),
        "\tchain input {",
        "\t\ttype filter hook input priority filter - 10; policy accept;",
        '\t\tiifname "lo" accept',
        f"\t\ttcp dport {all_ports} ip saddr @peers accept",
        f"\t\ttcp dport {_ports(WEB_PORTS)} ip saddr @scrapers accept",
        f"\t\ttcp dport {all_ports} counter reject with tcp reset",
        "\t}",
        "}",
        "",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m k8s.node_firewall --peer 10.0.1.5 --peer 10.0.2.0/28 --scraper 10.192.0.0/16``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", action="append", default=[], help="node InternalIP or Curvine pod IP (repeat)")
    parser.add_argument("--scraper", action="append", default=[], help="source allowed on the web ports (repeat)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(render_ruleset(peers=args.peer, scrapers=args.scraper))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
