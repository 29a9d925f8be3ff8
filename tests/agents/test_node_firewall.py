"""The node filter's agent (cluster_agents/node_firewall.py) against a stand-in API server.

What the node depends on: the peer set is every Node's InternalIP and the IPs of Curvine's live pods;
the agent asks the API only what its RBAC grants (list and watch nodes, pods of Curvine's namespace);
it never loads a ruleset before it has seen a complete listing (the API unreachable at start, no
Node, this node missing), keeps and reloads the last peer set when the API goes away, loads again on a
watch event, and says all of it in its metrics. The ruleset it loads is :func:`render_ruleset`'s,
which the chart and the reach tests use too; the netns test loads it into a real kernel.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster_agents import agent_core, node_firewall as fw
from cluster_agents.node_firewall import FirewallConfig, NodeFirewall, peer_set, render_ruleset
from tests.fake_http import JsonServer

NS = "curvine"
SCRAPERS = ["10.192.0.0/16"]


def node(name: str, *addresses: tuple[str, str]) -> dict:
    return {"metadata": {"name": name}, "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}


def pod(name: str, ip: str | None, phase: str = "Running", host: bool = False) -> dict:
    status: dict = {"phase": phase}
    if ip:
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    return {"metadata": {"name": name}, "spec": {"hostNetwork": host}, "status": status}


NODES = [node("gpu-1", ("InternalIP", "10.192.20.10"), ("Hostname", "gpu-1"), ("ExternalIP", "54.1.2.3")),
         node("gpu-2", ("InternalIP", "10.192.20.11"), ("InternalIP", "fd00::11")),
         node("system-1", ("InternalIP", "10.192.10.10"))]
PODS = [pod("curvine-master-0", "10.192.10.50"), pod("curvine-csi-controller-x", "10.192.10.51"),
        pod("curvine-worker-a", "10.192.20.10", host=True), pod("old-fuse", "10.192.20.99", phase="Failed"),
        pod("pending", None, phase="Pending")]
PEERS = ["10.192.10.10", "10.192.10.50", "10.192.10.51", "10.192.20.10", "10.192.20.11"]


class FakeApi:
    """Nodes and Curvine's pods, changeable; ``down`` answers 503; every request path is kept."""

    def __init__(self, nodes: list[dict], pods: list[dict]) -> None:
        self.nodes, self.pods, self.down, self.version = nodes, pods, False, 1
        self.paths: list[str] = []
        self.watch_events: list[dict] = []

    def answer(self, method: str, path: str, body, headers):
        self.paths.append(f"{method} {path}")
        if self.down:
            return 503, {"kind": "Status", "code": 503}
        route = path.split("?", 1)[0]
        if "watch=1" in path:
            return (200, self.watch_events.pop(0)) if self.watch_events else (500, {"kind": "Status", "code": 500})
        items = {"/api/v1/nodes": self.nodes, f"/api/v1/namespaces/{NS}/pods": self.pods}.get(route)
        if method != "GET" or items is None:
            return 403, {"kind": "Status", "code": 403}
        return 200, {"kind": "List", "metadata": {"resourceVersion": str(self.version)}, "items": items}


@pytest.fixture
def api():
    fake = FakeApi(list(NODES), list(PODS))
    with JsonServer(fake.answer) as server:
        yield fake, agent_core.KubeApi(server.url, token="t", timeout_s=5)


class Loads:
    """A stand-in for ``nft -f -``: records each ruleset; ``ok`` decides the answer."""

    def __init__(self) -> None:
        self.rulesets: list[str] = []
        self.ok = True

    def __call__(self, ruleset: str) -> tuple[bool, str]:
        self.rulesets.append(ruleset)
        return self.ok, "" if self.ok else "Error: Could not process rule: Operation not permitted"


def make(kube, node_name: str = "gpu-1", period_s: int = 60) -> tuple[NodeFirewall, Loads]:
    loads = Loads()
    return NodeFirewall(kube, FirewallConfig(namespace=NS, scrapers=SCRAPERS, period_s=period_s), node_name,
                        apply=loads), loads


def test_peers_are_every_nodes_internal_ip_and_curvines_live_pod_ips() -> None:
    assert peer_set(NODES, PODS, "gpu-1") == PEERS  # no ExternalIP, no IPv6, no ended or IP-less pod


def test_a_pass_loads_the_rendered_ruleset_asking_only_what_its_rbac_grants(api) -> None:
    fake, kube = api
    agent, loads = make(kube)
    agent.step()
    assert loads.rulesets == [render_ruleset(peers=PEERS, scrapers=SCRAPERS)]
    assert set(fake.paths) == {"GET /api/v1/nodes", f"GET /api/v1/namespaces/{NS}/pods"}
    assert 'kvcache_node_firewall_loaded 1' in agent.metrics() and "kvcache_node_firewall_peers 5" in agent.metrics()
    # Periodically again, unchanged (a table someone deleted comes back).
    agent.step()
    assert loads.rulesets[1] == loads.rulesets[0]


def test_nothing_is_loaded_while_the_api_is_unreachable_at_start(api) -> None:
    fake, kube = api
    fake.down = True
    agent, loads = make(kube)
    agent.step()
    dead = NodeFirewall(agent_core.KubeApi("http://127.0.0.1:9", timeout_s=1), agent.config, "gpu-1", apply=loads)
    dead.step()
    assert loads.rulesets == []
    assert "kvcache_node_firewall_loaded 0" in agent.metrics() and "kvcache_node_firewall_api_up 0" in agent.metrics()
    assert "kvcache_node_firewall_api_failures_total 1" in dead.metrics()
    assert agent.healthy() == (True, "waiting for a complete listing (nothing loaded)")
    fake.down = False
    agent.step()
    assert loads.rulesets == [render_ruleset(peers=PEERS, scrapers=SCRAPERS)]


def test_a_listing_without_any_node_or_without_this_node_is_not_believed(api) -> None:
    fake, kube = api
    agent, loads = make(kube, node_name="gpu-9")  # not (yet) among the Nodes
    agent.step()
    assert loads.rulesets == [] and "kvcache_node_firewall_refused_listings_total 1" in agent.metrics()
    fake.nodes.append(node("gpu-9", ("InternalIP", "10.192.20.12")))
    agent.step()
    first = loads.rulesets[-1]
    assert "10.192.20.12" in first
    fake.nodes = []  # a broken or filtered answer: keep the last peer set
    agent.step()
    assert loads.rulesets[-1] == first


def test_the_last_peer_set_stays_and_is_reloaded_while_the_api_is_away(api) -> None:
    fake, kube = api
    agent, loads = make(kube)
    agent.step()
    fake.down = True
    agent.step()
    assert loads.rulesets == [loads.rulesets[0]] * 2
    assert "kvcache_node_firewall_api_up 0" in agent.metrics()


def test_a_refused_ruleset_is_counted_and_not_taken_for_loaded(api) -> None:
    _, kube = api
    agent, loads = make(kube)
    loads.ok = False
    agent.step()
    assert agent.loaded is None and "kvcache_node_firewall_load_failures_total 1" in agent.metrics()


def test_a_watch_event_wakes_the_agent_and_a_410_forgets_the_version(api) -> None:
    fake, kube = api
    agent, _ = make(kube)
    agent.step()
    fake.watch_events = [{"type": "ADDED", "object": {"metadata": {"name": "gpu-3", "resourceVersion": "7"}}},
                         {"type": "ERROR", "object": {"kind": "Status", "code": 410}}]
    stop = threading.Event()
    agent.watch_once("nodes", stop)
    assert agent.wake.is_set() and agent.resource_versions["nodes"] == "7"
    assert any(p.startswith("GET /api/v1/nodes?watch=1&resourceVersion=1&") for p in fake.paths)
    agent.wake.clear()
    agent.watch_once("nodes", stop)
    assert agent.wake.is_set() and "nodes" not in agent.resource_versions
    with pytest.raises(agent_core.ApiError):
        agent.watch_once("nodes", stop)  # no version until the next listing


def test_a_new_node_is_loaded_on_its_watch_event_not_a_period_later(api, monkeypatch) -> None:
    fake, kube = api
    monkeypatch.setattr(fw, "WATCH_RETRY_S", 0.2)
    monkeypatch.setattr(fw, "SETTLE_S", 0.1)
    agent, loads = make(kube, period_s=3600)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while not loads.rulesets and time.monotonic() < deadline:
            time.sleep(0.05)
        fake.nodes = [*NODES, node("gpu-3", ("InternalIP", "10.192.20.13"))]
        fake.watch_events = [{"type": "ADDED", "object": {"metadata": {"name": "gpu-3", "resourceVersion": "2"}}}]
        while not any("10.192.20.13" in r for r in loads.rulesets) and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert any("10.192.20.13" in r for r in loads.rulesets)
    finally:
        stop.set()
        runner.join(timeout=10)


def test_metrics_parse_and_health_turns_stale(api) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    _, kube = api
    agent, _ = make(kube, period_s=5)
    agent.step()
    families = {f.name: f.type for f in text_string_to_metric_families(agent.metrics())}
    assert families["kvcache_node_firewall_loaded"] == "gauge" and families["kvcache_node_firewall_loads"] == "counter"
    assert agent.healthy() == (True, "ok")
    agent.last_pass -= 16
    assert agent.healthy()[0] is False


def test_run_nft_feeds_the_ruleset_on_stdin(tmp_path: Path) -> None:
    fake_nft = tmp_path / "nft"
    fake_nft.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat > {tmp_path}/stdin\n")
    fake_nft.chmod(0o755)
    assert fw.run_nft(str(fake_nft), "table inet x\n") == (True, "")
    assert (tmp_path / "args").read_text() == "-f -\n" and (tmp_path / "stdin").read_text() == "table inet x\n"
    ok, error = fw.run_nft(str(tmp_path / "missing"), "")
    assert not ok and "missing" in error


def test_config_is_validated_and_the_print_mode_renders(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="period_s"):
        fw.config_from_dict({"namespace": NS, "period_s": 1})
    with pytest.raises(ValueError, match="IPv4"):
        fw.config_from_dict({"namespace": NS, "scrapers": ["fd00::/8"]})
    with pytest.raises(ValueError, match="firewall config"):
        fw.config_from_dict({"namespace": NS, "extra": 1})
    out = subprocess.run([sys.executable, str(Path(fw.__file__)), "--print", "--peer", "10.0.0.1", "--scraper",
                          "10.0.0.0/16"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == render_ruleset(peers=["10.0.0.1"], scrapers=["10.0.0.0/16"])
    bad = subprocess.run([sys.executable, str(Path(fw.__file__)), "--serve"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error:")
