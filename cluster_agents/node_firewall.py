"""The node filter of Curvine's host-network ports: its nftables ruleset and the agent that keeps it
loaded on each GPU node (issue 25, item 1, node side).

Why. The Workers (RPC 8997, web 9002) and the CSI driver's FUSE pods (web 9003) run on the host
network. No NetworkPolicy selects a host-network listener, and the VPC CNI's network policy agent
always allows a pod's traffic to and from its own node's IP (aws-network-policy-agent PR #65), so a
pod's egress policy cannot keep it off its own node's Worker. With the VPC CNI, pod IPs come from the
same subnets as node IPs: no CIDR tells them apart. What does: the node list. The ruleset admits
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

The agent (``--serve``; DaemonSet ``node-firewall`` in Curvine's namespace, :mod:`k8s.node_firewall`) lists the Nodes
and the Pods of Curvine's namespace, watches both (any event: list again), renders the ruleset and
loads it with ``nft -f -`` on every change of the peer set and every ``period_s`` seconds (a table
someone deleted or edited comes back). Fail-safe:

* until the first complete listing (both lists answered, and this node among the Nodes with an
  InternalIP) it loads nothing: a ruleset without Curvine's peers would cut the Workers off each
  other; a table a previous run of the agent loaded stays as it was (the agent never deletes it);
* after that, an API that stops answering keeps the last peer set, reloaded every period;
* a listing with no Node, or without this node, is not believed (the last peer set stays).

Standard library only (``nft`` comes from the image); shipped with ``agent_core.py`` in a ConfigMap.
The chart imports :func:`render_ruleset` from here: one source of truth for the ruleset.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Final, Iterable, Sequence

if __package__:  # imported as cluster_agents.node_firewall
    from . import agent_core as core
else:  # run from its ConfigMap, agent_core.py beside it
    import agent_core as core

TABLE: Final = "kvcache_curvine"
#: Curvine's ports (k8s/curvine_config.py; the chart checks they are the same). Only peers may open
#: the RPC ports (the master's too, in case a Primary ever runs on the host network).
MASTER_RPC_PORT, JOURNAL_PORT, WORKER_RPC_PORT = 8995, 8996, 8997
MASTER_WEB_PORT, WORKER_WEB_PORT, FUSE_WEB_PORT = 9001, 9002, 9003
RPC_PORTS: Final = (MASTER_RPC_PORT, JOURNAL_PORT, WORKER_RPC_PORT)
#: Web ports: Prometheus text at ``/metrics`` (and ``/healthz`` on FUSE): peers and scrapers.
WEB_PORTS: Final = (MASTER_WEB_PORT, WORKER_WEB_PORT, FUSE_WEB_PORT)

METRICS_PORT: Final = 9420
LIVENESS_PATH: Final = "/healthz"
#: /healthz fails after this many periods without a finished pass.
STALE_PERIODS: Final = 3
#: Seconds a watch request stays open (the API server ends it then; the agent opens the next).
WATCH_TIMEOUT_S: Final = 300
#: Seconds before a failed watch is opened again (the periodic pass runs meanwhile).
WATCH_RETRY_S: Final = 5.0
#: Events that come close together (a node joining: Node, then its pods) load once.
SETTLE_S: Final = 1.0


def _elements(addresses: Iterable[str], what: str) -> str:
    nets = sorted({ipaddress.ip_network(a, strict=False) for a in addresses},
                  key=lambda n: (n.version, n.network_address, n.prefixlen))
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

    Raises:
        ValueError: an address that is not IPv4.
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


# --- from the API's objects to the peer set -----------------------------------------------------


def _ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


def node_ips(nodes: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Node name -> its IPv4 ``InternalIP`` addresses (a Node without one maps to [])."""
    out = {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        addresses = ((node.get("status") or {}).get("addresses")) or []
        out[name] = [a["address"] for a in addresses if a.get("type") == "InternalIP" and _ipv4(a.get("address", ""))]
    return out


def pod_ips(pods: Iterable[dict[str, Any]]) -> list[str]:
    """The IPv4 addresses of Curvine's pods that hold one and have not ended (``podIPs``, else ``podIP``)."""
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        ips = [p.get("ip", "") for p in status.get("podIPs") or []] or [status.get("podIP") or ""]
        out += [ip for ip in ips if _ipv4(ip)]
    return out


def peer_set(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], node_name: str) -> list[str]:
    """The sorted peer addresses: every Node's InternalIP and Curvine's pod IPs.

    Raises:
        ValueError: no Node, or ``node_name`` is not among them with an InternalIP (such a listing is
            not believed: loading it would cut this node's Worker off).
    """
    by_node = node_ips(nodes)
    if not by_node:
        raise ValueError("the API listed no Node")
    if not by_node.get(node_name):
        raise ValueError(f"this node {node_name!r} is not listed with an IPv4 InternalIP")
    addresses = {ip for ips in by_node.values() for ip in ips} | set(pod_ips(pods))
    return sorted(addresses, key=ipaddress.ip_address)


# --- the agent -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirewallConfig:
    """``firewall.json`` (rendered by k8s/node_firewall.py).

    Attributes:
        namespace: Curvine's namespace (its pods are peers).
        scrapers: CIDRs that may open the web ports (the VPC).
        period_s: seconds between two loads when nothing changes.
        nft: the ``nft`` command.
    """

    namespace: str
    scrapers: list[str] = field(default_factory=list)
    period_s: int = 60
    nft: str = "nft"

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or not self.namespace:
            raise ValueError("firewall config: namespace must be a non-empty string")
        if not isinstance(self.period_s, int) or isinstance(self.period_s, bool) or not 5 <= self.period_s <= 3600:
            raise ValueError(f"firewall config: period_s must be an integer of 5 to 3600, got {self.period_s!r}")
        render_ruleset(peers=[], scrapers=self.scrapers)  # raises on a bad CIDR


def config_from_dict(data: dict[str, Any]) -> FirewallConfig:
    """``firewall.json``'s object as :class:`FirewallConfig` (ValueError names the problem)."""
    return core.config_from_dict(FirewallConfig, data, "firewall")


def run_nft(nft: str, ruleset: str, timeout_s: float = 30) -> tuple[bool, str]:
    """``nft -f -`` with ``ruleset`` on stdin: (loaded, nft's error text)."""
    try:
        done = subprocess.run([nft, "-f", "-"], input=ruleset, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return done.returncode == 0, done.stderr.strip()


class NodeFirewall:
    """One node's agent: :meth:`step` lists, renders and loads; :meth:`watch` wakes it on a change.

    Args:
        api: a :class:`agent_core.KubeApi`.
        config: the settings; node_name: this node (``spec.nodeName``).
        apply: loads a ruleset, (ok, error text); default :func:`run_nft` with ``config.nft``.
        clock: wall clock (metrics' timestamps).
    """

    def __init__(self, api: Any, config: FirewallConfig, node_name: str, *,
                 apply: Callable[[str], tuple[bool, str]] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.api, self.config, self.node_name, self.clock = api, config, node_name, clock
        self.apply = apply or (lambda ruleset: run_nft(config.nft, ruleset))
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.peers: list[str] | None = None  # None: no complete listing yet, nothing loaded
        self.loaded: str | None = None  # the last ruleset nft accepted
        self.resource_versions: dict[str, str] = {}
        self.api_up = False
        self.counts = {"loads": 0, "load_failures": 0, "api_failures": 0, "refused_listings": 0, "watch_events": 0}
        self.last_load = 0.0
        self.last_pass = time.monotonic()

    def _paths(self) -> dict[str, str]:
        return {"nodes": "/api/v1/nodes", "pods": f"/api/v1/namespaces/{urllib.parse.quote(self.config.namespace)}/pods"}

    def _list(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        items = {}
        for kind, path in self._paths().items():
            answer = self.api.call("GET", path)
            items[kind] = answer.get("items") or []
            rv = (answer.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_versions[kind] = rv
        return items["nodes"], items["pods"]

    def step(self) -> None:
        """One pass: list (if the API answers), then load the ruleset of the current peer set (if any)."""
        try:
            nodes, pods = self._list()
            self.api_up = True
        except core.ApiError as exc:
            self.api_up = False
            self.counts["api_failures"] += 1
            print(f"warning: API: {exc}; {'keeping the last peer set' if self.peers is not None else 'nothing loaded yet'}",
                  file=sys.stderr)
        except OSError as exc:  # the token file
            self.api_up = False
            self.counts["api_failures"] += 1
            print(f"warning: API: {exc}", file=sys.stderr)
        else:
            try:
                peers = peer_set(nodes, pods, self.node_name)
            except ValueError as exc:
                self.counts["refused_listings"] += 1
                print(f"warning: listing not believed: {exc}", file=sys.stderr)
            else:
                if peers != self.peers:
                    print(f"peers: {len(peers)} addresses ({', '.join(peers)})", file=sys.stderr)
                self.peers = peers
        if self.peers is not None:
            ruleset = render_ruleset(peers=self.peers, scrapers=self.config.scrapers)
            ok, error = self.apply(ruleset)
            with self.lock:
                if ok:
                    self.loaded, self.last_load = ruleset, self.clock()
                    self.counts["loads"] += 1
                else:
                    self.counts["load_failures"] += 1
            if not ok:
                print(f"error: nft -f refused the ruleset: {error}", file=sys.stderr)
        self.last_pass = time.monotonic()

    def watch_once(self, kind: str, stop: threading.Event) -> None:
        """One watch request of ``kind`` (``nodes`` or ``pods``) from the last listing's
        resourceVersion: every event wakes :meth:`run`; returns when the server ends the request.
        Raises ApiError / OSError as :meth:`agent_core.KubeApi.call`."""
        rv = self.resource_versions.get(kind)
        if not rv:
            raise core.ApiError(0, f"no resourceVersion of {kind} yet")
        query = urllib.parse.urlencode({"watch": "1", "resourceVersion": rv, "timeoutSeconds": str(WATCH_TIMEOUT_S),
                                        "allowWatchBookmarks": "false"})
        api = self.api
        token = api.token_file.read_text(encoding="utf-8").strip() if api.token_file else api.token
        request = urllib.request.Request(f"{api.base_url}{self._paths()[kind]}?{query}", headers={
            "Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(request, context=api.context, timeout=WATCH_TIMEOUT_S + 30) as response:
                for line in response:
                    if stop.is_set():
                        return
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    self.counts["watch_events"] += 1
                    rv = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                    if event.get("type") == "ERROR":  # e.g. 410 Gone: the next listing gives a new version
                        self.resource_versions.pop(kind, None)
                    elif rv:
                        self.resource_versions[kind] = rv
                    self.wake.set()
        except urllib.error.HTTPError as exc:
            raise core.ApiError(exc.code, f"watch {kind}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise core.ApiError(0, f"watch {kind}: {exc}") from None

    def watch(self, kind: str, stop: threading.Event) -> None:
        """:meth:`watch_once` until ``stop``; after a failure, wait :data:`WATCH_RETRY_S`."""
        while not stop.is_set():
            try:
                self.watch_once(kind, stop)
            except core.ApiError:
                stop.wait(WATCH_RETRY_S)

    def run(self, stop: threading.Event) -> None:
        """Passes until ``stop``: at once, then on a watch event (after :data:`SETTLE_S`) or every ``period_s``."""
        for kind in ("nodes", "pods"):
            threading.Thread(target=self.watch, args=(kind, stop), name=f"watch-{kind}", daemon=True).start()
        while not stop.is_set():
            self.wake.clear()
            self.step()
            deadline = time.monotonic() + self.config.period_s
            while not stop.is_set() and time.monotonic() < deadline:
                if self.wake.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
                    stop.wait(SETTLE_S)
                    break

    # --- metrics and health -----------------------------------------------------------------

    def metrics(self) -> str:
        """Prometheus text: whether a ruleset is loaded, the peer count, API state, counters."""
        with self.lock:
            c, loaded, last = dict(self.counts), self.loaded is not None, self.last_load
        peers = len(self.peers) if self.peers is not None else 0

        def one(name: str, kind: str, help_text: str, value: str) -> list[str]:
            return [*core.family(name, kind, help_text), f"{name} {value}"]

        lines = [
            *one("kvcache_node_firewall_loaded", "gauge",
                 "1 once this agent loaded the node filter of Curvine's ports, 0 while it waits for a complete listing",
                 "1" if loaded else "0"),
            *one("kvcache_node_firewall_peers", "gauge", "Addresses in the filter's peer set", str(peers)),
            *one("kvcache_node_firewall_api_up", "gauge", "1 if the last listing of Nodes and Curvine's pods answered",
                 "1" if self.api_up else "0"),
            *one("kvcache_node_firewall_last_load_timestamp_seconds", "gauge",
                 "When nft last accepted the ruleset (Unix time, 0: never)", f"{last:.3f}"),
        ]
        for key, help_text in (("loads", "Rulesets nft accepted"), ("load_failures", "Rulesets nft refused"),
                               ("api_failures", "Listings the API did not answer"),
                               ("refused_listings", "Listings not believed (no Node, or not this node)"),
                               ("watch_events", "Watch events of Nodes and Curvine's pods")):
            lines += one(f"kvcache_node_firewall_{key}_total", "counter", help_text, str(c[key]))
        return "\n".join(lines) + "\n"

    def healthy(self) -> tuple[bool, str]:
        age = time.monotonic() - self.last_pass
        if age > STALE_PERIODS * self.config.period_s:
            return False, f"no pass for {age:.0f} s"
        return True, "ok" if self.loaded is not None else "waiting for a complete listing (nothing loaded)"


def main(argv: Sequence[str] | None = None) -> int:
    """``--config firewall.json --node NAME --serve``, or ``--print --peer IP ... --scraper CIDR ...``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="firewall.json")
    parser.add_argument("--node", help="this node's name (spec.nodeName)")
    parser.add_argument("--serve", action="store_true", help="run: passes, watches, metrics on --port")
    parser.add_argument("--port", type=int, default=METRICS_PORT)
    parser.add_argument("--print", action="store_true", help="print the ruleset of --peer/--scraper and exit")
    parser.add_argument("--peer", action="append", default=[], help="node InternalIP or Curvine pod IP (repeat)")
    parser.add_argument("--scraper", action="append", default=[], help="source allowed on the web ports (repeat)")
    args = parser.parse_args(argv)
    if args.print:
        try:
            sys.stdout.write(render_ruleset(peers=args.peer, scrapers=args.scraper))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if not (args.config and args.node and args.serve):
        print("error: --config, --node and --serve (or --print)", file=sys.stderr)
        return 2
    try:
        config = config_from_dict(json.loads(args.config.read_text(encoding="utf-8")))
        api = core.KubeApi.in_cluster()
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    agent = NodeFirewall(api, config, args.node)

    def make(port: int):
        return core.make_server({"/metrics": lambda: (200, agent.metrics(), core.METRICS_TEXT),
                                 LIVENESS_PATH: core.health(agent.healthy)}, port)

    return core.serve(make, args.port, agent.run)


if __name__ == "__main__":
    raise SystemExit(main())
