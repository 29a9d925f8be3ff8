"""No L2 read or write is node-local, so the planner reads L2 at the cross-node figure (issue 15, item 5).

Curvine v0.3.2-alpha treats a Worker as local to a client when the Worker's registered hostname
equals the client's (``WorkerAddress::is_local``): the master's choice of a Worker for a new block
and the client's read order and short-circuit depend on it. The Workers register the node IP
(``CURVINE_WORKER_HOSTNAME`` from ``status.hostIP``); the CSI driver's standalone FUSE pods get no
environment and the same StorageClass parameters on every node, so their client keeps Curvine's
default hostname, the literal ``localhost`` (docs/sources.md §19). The identities are derived
here from the rendered objects, on a model of two nodes.
"""

from __future__ import annotations

import pytest
from tests.k8s.conftest import find

from k8s import curvine_config, names
from capacity import fit, latency

NODE_IPS = {"gpu-a": "10.192.1.10", "gpu-b": "10.192.1.11"}
#: The reference deployment's figures (docs/sources.md §1): read across nodes 1.84 GiB/s, store on
#: the node-local NVMe 9.60 GiB/s.
CROSS_NODE_READ_GIBPS = 1.84
NODE_LOCAL_STORE_GIBPS = 9.60


def _worker_hostnames(curvine) -> dict[str, str]:
    """Each node's Worker hostname, from the rendered DaemonSet's env (a fieldRef resolved per node)."""
    (worker,) = [c for c in find(curvine, "DaemonSet", names.CURVINE_WORKER)["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "worker"]
    (env,) = [e for e in worker["env"] if e["name"] == "CURVINE_WORKER_HOSTNAME"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    return dict(NODE_IPS)  # status.hostIP of a host-network Pod: its node's IP


def _client_hostnames(curvine) -> dict[str, str]:
    """Each node's FUSE client hostname: the StorageClass's parameters are the same on every node."""
    params = find(curvine, "StorageClass", "curvine-sc")["parameters"]
    return {node: curvine_config.fuse_client_hostname(params) for node in NODE_IPS}


def test_no_client_and_worker_identities_match_so_the_planner_reads_across_nodes(manifests):
    curvine = manifests["curvine"]
    clients = _client_hostnames(curvine)
    assert set(clients.values()) == {"localhost"}
    assert curvine_config.local_worker_pairs(_worker_hostnames(curvine), clients) == set()
    # Hence every L2 read crosses the network: the planner times it at the cross-node figure.
    assert latency.REFERENCE_RUN.l2_read_gibps == fit.PlanInputs.l2_read_gibps == CROSS_NODE_READ_GIBPS
    assert latency.REFERENCE_RUN.l2_read_gibps != NODE_LOCAL_STORE_GIBPS


def test_a_static_client_hostname_would_make_one_workers_blocks_everyones(manifests):
    """Why the StorageClass must not set ``client.hostname``: a parameter is the same on every
    node, so every node's client would call one node's Worker local (the master would put every
    node's new blocks there, and other nodes' clients would open its block files by path)."""
    curvine = manifests["curvine"]
    params = find(curvine, "StorageClass", "curvine-sc")["parameters"]
    assert curvine_config.FUSE_CLIENT_HOSTNAME_PARAMETER not in params
    static = {**params, curvine_config.FUSE_CLIENT_HOSTNAME_PARAMETER: NODE_IPS["gpu-a"]}
    clients = {node: curvine_config.fuse_client_hostname(static) for node in NODE_IPS}
    assert curvine_config.local_worker_pairs(_worker_hostnames(curvine), clients) == {
        ("gpu-a", "gpu-a"), ("gpu-b", "gpu-a")}


@pytest.mark.parametrize("clients, node_local", [
    ({"gpu-a": "10.192.1.10", "gpu-b": "10.192.1.11"}, True),  # what a per-node CURVINE_CLIENT_HOSTNAME would give
    ({"gpu-a": "localhost", "gpu-b": "localhost"}, False),
])
def test_the_locality_model_can_say_yes(clients, node_local):
    pairs = curvine_config.local_worker_pairs(NODE_IPS, clients)
    assert (pairs == {(n, n) for n in NODE_IPS}) is node_local
