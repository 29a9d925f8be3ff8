"""The node filter of Curvine's host-network ports, loaded for real into a Linux network namespace.

Three network namespaces on one bridge, all in one /24 as node and pod IPs are with the VPC CNI (no
CIDR tells them apart): ``node`` (the bridge's address, a listener on every Curvine port: the
host-network Worker and FUSE pod), ``peer`` (another node: its IP is in the ``peers`` set) and ``pod``
(a pod of any namespace). The test loads exactly :func:`k8s.node_firewall.render_ruleset`'s output
with ``nft -f`` in ``node`` and connects from each; the last test has the deployed agent
(:class:`cluster_agents.node_firewall.NodeFirewall`) list a stand-in API and load its own ruleset with
its own ``nft -f -``. Runs in about a second; needs root, ``ip`` and
``nft`` (Debian's iproute2 and nftables, debian-packages.txt), and skips with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from cluster_agents import agent_core
from cluster_agents.node_firewall import FirewallConfig, NodeFirewall
from k8s.node_firewall import RPC_PORTS, TABLE, WEB_PORTS, render_ruleset
from tests.fake_http import JsonServer
from tests.k8s.netpol_eval import nft_input_verdict

SUBNET = "10.77.0.0/24"
NODE_IP, PEER_IP, POD_IP = "10.77.0.1", "10.77.0.2", "10.77.0.3"
PORTS = (*RPC_PORTS, *WEB_PORTS)

LISTENER = textwrap.dedent("""
    import selectors, socket, sys
    sel = selectors.DefaultSelector()
    for port in map(int, sys.argv[1:]):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port)); s.listen(16); s.setblocking(False); sel.register(s, selectors.EVENT_READ)
    print("listening", flush=True)
    while True:
        for key, _ in sel.select():
            conn, _ = key.fileobj.accept(); conn.close()
""")
PROBE = textwrap.dedent("""
    import socket, sys
    host = sys.argv[1]
    for port in map(int, sys.argv[2:]):
        try:
            socket.create_connection((host, port), timeout=2).close(); print(port, "open")
        except ConnectionRefusedError:
            print(port, "refused")
        except OSError as exc:
            print(port, type(exc).__name__)
""")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture
def netns(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"`{tool}` is missing (Debian packages iproute2 and nftables: make system-deps)")
    tag = uuid.uuid4().hex[:6]
    ns = {role: f"kvfw-{role}-{tag}" for role in ("node", "peer", "pod")}
    created: list[str] = []
    listener = None
    try:
        for name in ns.values():
            result = _run("ip", "netns", "add", name, check=False)
            if result.returncode != 0:
                pytest.skip(f"no network namespace support here: {result.stderr.strip()}")
            created.append(name)
        node = ns["node"]

        def in_ns(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            return _run("ip", "netns", "exec", name, *args, check=check)

        in_ns(node, "ip", "link", "add", "br0", "type", "bridge")
        in_ns(node, "ip", "addr", "add", f"{NODE_IP}/24", "dev", "br0")
        for role, ip in (("peer", PEER_IP), ("pod", POD_IP)):
            other = ns[role]
            in_ns(node, "ip", "link", "add", f"v-{role}", "type", "veth", "peer", "name", "eth0", "netns", other)
            in_ns(node, "ip", "link", "set", f"v-{role}", "master", "br0", "up")
            in_ns(other, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
            in_ns(other, "ip", "link", "set", "eth0", "up")
            in_ns(other, "ip", "link", "set", "lo", "up")
        in_ns(node, "ip", "link", "set", "br0", "up")
        in_ns(node, "ip", "link", "set", "lo", "up")
        listener = subprocess.Popen(["ip", "netns", "exec", node, sys.executable, "-c", LISTENER, *map(str, PORTS)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"

        def probe(role: str, host: str = NODE_IP) -> dict[int, str]:
            out = in_ns(ns[role], sys.executable, "-c", PROBE, host, *map(str, PORTS)).stdout
            return {int(p): state for p, state in (line.split() for line in out.splitlines())}

        loaded: list[str] = []

        def load(ruleset: str) -> None:
            path = tmp_path / "ruleset.nft"
            path.write_text(ruleset)
            in_ns(node, "nft", "-f", str(path))
            loaded.append(ruleset)

        def checked_probe(role: str, host: str = NODE_IP) -> dict[int, str]:
            """probe(), and the reach tests' reading of the loaded ruleset must give the same answer."""
            got = probe(role, host)
            if loaded:
                saddr = {"peer": PEER_IP, "pod": POD_IP}.get(role, host)
                modelled = {p: nft_input_verdict(loaded[-1], saddr=saddr, iifname="lo" if role == "node" else "br0",
                                                 dport=p) for p in PORTS}
                assert {p: "open" if v == "accept" else "refused" for p, v in modelled.items()} == got, (role, host)
            return got

        def agent_nft() -> str:
            """An ``nft`` command for the agent's :func:`run_nft` that runs the real nft in ``node`` and
            records what it was given (the reach model then reads the same ruleset)."""
            script = tmp_path / "nft-in-node"
            script.write_text(f"#!/bin/sh\nset -e\ntee {tmp_path}/agent-ruleset.nft | ip netns exec {node} nft \"$@\"\n")
            script.chmod(0o755)
            return str(script)

        def agent_loaded() -> None:
            loaded.append((tmp_path / "agent-ruleset.nft").read_text())

        yield (checked_probe, load, lambda: in_ns(node, "nft", "list", "table", "inet", TABLE).stdout,
               agent_nft, agent_loaded)
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(timeout=10)
        for name in created:
            _run("ip", "netns", "del", name, check=False)


def test_only_peers_and_loopback_reach_the_rpc_ports(netns):
    probe, load, listing, *_ = netns
    start = time.monotonic()
    # Without the filter the pod opens every port: the check below can fail.
    assert probe("pod") == {p: "open" for p in PORTS}
    load(render_ruleset(peers=[PEER_IP]))
    assert probe("peer") == {p: "open" for p in PORTS}
    assert probe("pod") == {p: "refused" for p in PORTS}  # a TCP reset, not a hang
    assert probe("node", "127.0.0.1") == {p: "open" for p in PORTS}  # the node's own processes
    assert probe("node", NODE_IP) == {p: "open" for p in PORTS}  # to its own IP: through lo
    assert "elements = { 10.77.0.2 }" in listing()
    # A reload with another peer set replaces the table whole, in one transaction.
    load(render_ruleset(peers=[POD_IP]))
    assert probe("peer") == {p: "refused" for p in PORTS}
    assert probe("pod") == {p: "open" for p in PORTS}
    assert time.monotonic() - start < 20


def test_scrapers_reach_only_the_web_ports(netns):
    """The AMP collector's ENIs are somewhere in the VPC: with the scrapers set at the subnet, any
    address of it (a pod's too: the residue docs/security.md states) opens the metrics ports, and
    still none of the RPC ports."""
    probe, load, *_ = netns
    load(render_ruleset(peers=[PEER_IP], scrapers=[SUBNET]))
    assert probe("pod") == {**{p: "refused" for p in RPC_PORTS}, **{p: "open" for p in WEB_PORTS}}
    assert probe("peer") == {p: "open" for p in PORTS}


def test_the_ruleset_touches_only_its_own_table():
    rules = render_ruleset(peers=["10.0.1.5", "10.0.0.0/16", "10.0.3.7/32"], scrapers=[])
    assert [line.removesuffix(" {") for line in rules.splitlines() if line.startswith(("table", "delete"))] == [
        f"table inet {TABLE}", f"delete table inet {TABLE}", f"table inet {TABLE}"]
    assert "elements = { 10.0.0.0/16 }" in rules  # 10.0.1.5 and 10.0.3.7 are inside it: one interval
    assert "set scrapers" in rules and rules.count("elements") == 1
    with pytest.raises(ValueError, match="IPv4"):
        render_ruleset(peers=["fd00::1"])


def test_the_agent_loads_its_ruleset_from_the_api_and_follows_a_change(netns):
    """The deployed path: the agent (cluster_agents/node_firewall.py) lists a stand-in API's Nodes and
    Curvine's pods, renders, and loads with its own ``nft -f -`` into the node's namespace; a pod that
    becomes one of Curvine's is admitted at the next pass, and the peer that left is reset."""
    probe, _, listing, agent_nft, agent_loaded = netns
    state = {"nodes": [{"metadata": {"name": "node"}, "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}},
                       {"metadata": {"name": "peer"}, "status": {"addresses": [{"type": "InternalIP", "address": PEER_IP}]}}],
             "pods": []}

    def answer(method, path, body, headers):
        route = path.split("?", 1)[0]
        items = {"/api/v1/nodes": state["nodes"], "/api/v1/namespaces/curvine/pods": state["pods"]}.get(route)
        return (200, {"metadata": {"resourceVersion": "1"}, "items": items}) if items is not None else (404, {})

    with JsonServer(answer) as server:
        agent = NodeFirewall(agent_core.KubeApi(server.url, timeout_s=5),
                             FirewallConfig(namespace="curvine", nft=agent_nft()), "node")
        agent.step()
        assert agent.loaded is not None and agent.counts["load_failures"] == 0
        agent_loaded()
        assert probe("peer") == {p: "open" for p in PORTS}
        assert probe("pod") == {p: "refused" for p in PORTS}
        assert probe("node", "127.0.0.1") == {p: "open" for p in PORTS}
        assert f"elements = {{ {NODE_IP}, {PEER_IP} }}" in listing()
        state["nodes"] = state["nodes"][:1]
        state["pods"] = [{"metadata": {"name": "curvine-master-0"}, "status": {"phase": "Running", "podIP": POD_IP}}]
        agent.step()
        agent_loaded()
        assert probe("pod") == {p: "open" for p in PORTS}
        assert probe("peer") == {p: "refused" for p in PORTS}
