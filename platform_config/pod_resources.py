"""Resource requests and limits of the platform's own pods: one definition for the charts that render
them and for the per-node budget that counts them (:mod:`platform_config.node_fit`).

Data only, in the bottom layer: the config check (node fit) needs these facts and must not import
the layers above it (``tests/test_layers.py``). The charts (:mod:`k8s.curvine_chart`,
:mod:`k8s.janitor`) build their containers' resources from the dicts below, and the DCGM exporter's
Helm values (:func:`observability.cluster_objects.dcgm_exporter_values`) send
:data:`DCGM_EXPORTER_VALUES_RESOURCES`; the :class:`PodResources` constants say which containers
each pod on a HyperPod node runs, and a test renders the charts and compares
(``tests/k8s/test_k8s_node_fit.py``), so a container added to a chart without its line here fails.

A pod's request is what the scheduler counts: the sum of its containers' requests, or the largest
init container's request when that is more (Kubernetes "Resource sharing within containers").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: A container's ``resources``: ``{"requests": {"cpu": ..., "memory": ...}, "limits": {...}}``.
Resources = dict[str, dict[str, str]]

#: Curvine Primary: RocksDB metadata of a KV cache (one file per 256-token chunk) stays in the
#: low millions of inodes; 1 CPU / 4 GiB request and an 8 GiB limit leave room for RocksDB's
#: block cache. Not measured on HyperPod; adjust with the inode count. Preferably on the system
#: nodes, so it is not counted on a HyperPod node.
MASTER_RESOURCES: Final[Resources] = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
#: Curvine Worker: the data path is mostly sendfile/short-circuit from NVMe.
WORKER_RESOURCES: Final[Resources] = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}
#: Sidecars and init containers (CSI provisioner, registrar, liveness probe, config checks):
#: upstream defaults are unset.
SIDECAR_RESOURCES: Final[Resources] = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
#: The Curvine CSI plugin container (controller and node plugin).
CSI_RESOURCES: Final[Resources] = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
#: Resources of the standalone FUSE pods the node plugin starts, passed to it as its
#: ``STANDALONE_*`` variables (curvine-csi ``buildResourceRequirements``, standalone_manager.go
#: l.569-618: the pod's only resources; the driver sets no priorityClassName and has no variable
#: for one). Requests equal limits, so the pods are Guaranteed: the kubelet's memory-pressure
#: eviction ranks a pod within its requests behind every pod above them, and the kernel's OOM
#: killer sees ``oom_score_adj`` -997 instead of a Burstable ~999 (docs/l2-cache.md "Mount
#: lifetime", docs/sources.md §16). The requests were *raised to the former limits* (2 CPUs,
#: 2 GiB; before: 500m / 512Mi requests), so no FUSE pod is throttled or OOM-killed earlier than
#: before. 2 GiB against curvine-fuse's own buffers at v0.3.2-alpha with the defaults the FUSE pods
#: run (no ``--conf``; only ``--web-port`` is passed): 32 FUSE channels (``mnt_per_task`` =
#: ``io_threads`` 32, fuse_conf.rs) of one 1 MiB + 4 KiB receive buffer each (``get_fuse_buf_size``:
#: 256 pages + header) plus their pipes, about 100 MiB; the inode cache (``node_cache_size``
#: 200,000 entries), tens of MiB; per file open at once, a writer holds ``write_chunk_size``
#: 128 KiB x (``write_chunk_num`` 8 + 1) = 1.1 MiB and a reader ``read_chunk_size`` 128 KiB x
#: ``read_chunk_num`` 8 = 1 MiB (one reader per file below ``large_file_size`` 10GB;
#: client_conf.rs). That leaves room for about 1,700 chunk files open at once on a node, e.g. 8 TP
#: ranks with about 200 stores or loads in flight each (LMCache's remote backend does not bound
#: its put tasks). Not measured on HyperPod; the CPU figure keeps the former limit (the FUSE data
#: path copies every byte through user space) and is not measured either.
FUSE_POD_RESOURCES: Final = {"cpu_request": "2", "cpu_limit": "2", "memory_request": "2Gi",
                             "memory_limit": "2Gi"}
#: A line's L2 janitor (one pass every 10 minutes, standard library only).
JANITOR_RESOURCES: Final[Resources] = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
#: The L2 mount watchdog (k8s/mount_watchdog.py), one per HyperPod node: a pass every 30 s reads
#: mountinfo and a few JSON files and makes one statvfs per L2 mount; 64 MiB of Python is ample.
MOUNT_WATCHDOG_RESOURCES: Final[Resources] = {"requests": {"cpu": "20m", "memory": "64Mi"},
                                              "limits": {"memory": "256Mi"}}
#: The node filter (k8s/node_firewall.py), one per HyperPod node: one listing and one ``nft -f`` a
#: minute and on changes, two watch connections; Python plus a short-lived nft.
NODE_FIREWALL_RESOURCES: Final[Resources] = {"requests": {"cpu": "10m", "memory": "48Mi"},
                                             "limits": {"memory": "192Mi"}}
#: The DCGM exporter's requests when its Helm values set none: chart ``dcgm-exporter`` 4.8.2,
#: ``deployment/values.yaml`` ``resources`` (NVIDIA/dcgm-exporter tag 4.5.3-4.8.2; docs/sources.md
#: §13).
DCGM_EXPORTER_CHART_RESOURCES: Final[Resources] = {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                   "limits": {"cpu": "200m", "memory": "512Mi"}}
#: ``resources`` the platform's Helm values give the DCGM exporter (sent only when not empty). Empty:
#: the chart's defaults apply. Helm merges values into the chart's, key by key, so a request set
#: here replaces only that key of :data:`DCGM_EXPORTER_CHART_RESOURCES` (:func:`dcgm_exporter_pod`).
DCGM_EXPORTER_VALUES_RESOURCES: Final[Resources] = {}


@dataclass(frozen=True)
class PodResources:
    """The containers of one pod, for its scheduling request.

    Attributes:
        name: what the pod is, as the budget prints it.
        containers: each container's :data:`Resources`.
        init_containers: each init container's :data:`Resources`.
    """

    name: str
    containers: tuple[Resources, ...]
    init_containers: tuple[Resources, ...] = ()


#: The Curvine chart's pods on a HyperPod node, container by container as the chart renders them.
CURVINE_WORKER_POD: Final = PodResources("Curvine Worker", (WORKER_RESOURCES,), (SIDECAR_RESOURCES,))
CSI_NODE_POD: Final = PodResources(
    "Curvine CSI node plugin", (CSI_RESOURCES, SIDECAR_RESOURCES, SIDECAR_RESOURCES))
FUSE_POD: Final = PodResources(
    "Curvine FUSE pod", ({"requests": {"cpu": FUSE_POD_RESOURCES["cpu_request"],
                                       "memory": FUSE_POD_RESOURCES["memory_request"]},
                          "limits": {"cpu": FUSE_POD_RESOURCES["cpu_limit"],
                                     "memory": FUSE_POD_RESOURCES["memory_limit"]}},))
JANITOR_POD: Final = PodResources("L2 janitor", (JANITOR_RESOURCES,))
MOUNT_WATCHDOG_POD: Final = PodResources("L2 mount watchdog", (MOUNT_WATCHDOG_RESOURCES,))
NODE_FIREWALL_POD: Final = PodResources("Curvine node filter", (NODE_FIREWALL_RESOURCES,))


def dcgm_exporter_pod(values_resources: Resources | None = None) -> PodResources:
    """The DCGM exporter's pod as the scheduler sees it: the chart's requests with the values'
    requests merged over them key by key, as Helm merges values (``values_resources`` defaults to
    :data:`DCGM_EXPORTER_VALUES_RESOURCES`)."""
    values = DCGM_EXPORTER_VALUES_RESOURCES if values_resources is None else values_resources
    requests = {**DCGM_EXPORTER_CHART_RESOURCES["requests"], **values.get("requests", {})}
    return PodResources("DCGM exporter", ({"requests": requests},))
