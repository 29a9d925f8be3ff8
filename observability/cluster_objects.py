"""The in-cluster side of the collection path: the DCGM exporter's Helm values.

The AMP managed scraper needs no object of ours in the cluster: on a cluster whose
authentication mode is ``API`` or ``API_AND_CONFIG_MAP`` (ours, ``stacks.cluster_stack``), AMP
creates the scraper's EKS access entry, with its access policy, when the scraper is created
(AMP user guide, "Set up managed collectors for Amazon EKS"; docs/sources.md §13).
"""

from __future__ import annotations

from typing import Any, Final

from k8s.nodes import HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE, instance_group_tolerations
from platform_config import PlatformConfig

#: Helm release name of the DCGM exporter.
DCGM_RELEASE: Final = "dcgm-exporter"


def dcgm_exporter_values(platform: PlatformConfig) -> dict[str, Any]:
    """Helm values of the dcgm-exporter chart (4.8.2), set where a default does not fit.

    * ``serviceMonitor.enabled: false``: the chart's default creates a Prometheus-operator
      ``ServiceMonitor``, a kind this cluster does not have (the install would fail); the AMP
      scraper finds the pods itself (:mod:`observability.targets`).
    * Runs only on HyperPod nodes (the GPUs), tolerating every taint of the instance groups.
    * ``securityContext`` is the chart's (root, ``SYS_ADMIN`` added for DCGM profiling fields,
      all else dropped, no privilege escalation); no ``privileged``.
    """
    tolerations = instance_group_tolerations(platform)
    return {
        "serviceMonitor": {"enabled": False},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HYPERPOD_NODE_LABEL, "operator": "In", "values": [HYPERPOD_NODE_VALUE]}]}]}}},
        "tolerations": tolerations,
    }
