"""The in-cluster side of the collection path: the scraper's RBAC and the DCGM exporter's values.

The AMP managed scraper reaches the EKS API as the Kubernetes user :data:`SCRAPER_USER` (an
access entry maps its service-linked role to it). It only needs to discover pods
(``kubernetes_sd_configs`` role ``pod``) and then scrapes their IPs directly, so its ClusterRole
grants ``get``/``list``/``watch`` on ``pods`` and nothing else: less than the role the AMP user
guide shows ("Configuring your Amazon EKS cluster"), which also reads nodes, services,
endpoints, ingresses and configmaps and the API server's ``/metrics`` for jobs we do not run.
"""

from __future__ import annotations

from typing import Any, Final

import cdk8s
from cdk8s_plus_33 import k8s

from k8s.curvine_chart import HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE
from platform_config import PlatformConfig

#: Kubernetes user name of the scraper (its access entry's ``username``; AMP user guide).
SCRAPER_USER: Final = "aps-collector-user"
SCRAPER_CLUSTER_ROLE: Final = "kvcache-aps-collector"
#: Helm release name of the DCGM exporter.
DCGM_RELEASE: Final = "dcgm-exporter"


def scraper_rbac_chart(app: cdk8s.App) -> cdk8s.Chart:
    """ClusterRole (pods: get/list/watch) and its binding to :data:`SCRAPER_USER`."""
    chart = cdk8s.Chart(app, "observability-rbac", disable_resource_name_hashes=True,
                        labels={"app.kubernetes.io/part-of": "kvcache", "app.kubernetes.io/managed-by": "cdk8s"})
    role = k8s.KubeClusterRole(chart, "ScraperRole", metadata=k8s.ObjectMeta(name=SCRAPER_CLUSTER_ROLE), rules=[
        k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list", "watch"])])
    binding = k8s.KubeClusterRoleBinding(
        chart, "ScraperBinding", metadata=k8s.ObjectMeta(name=SCRAPER_CLUSTER_ROLE),
        role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=SCRAPER_CLUSTER_ROLE),
        subjects=[k8s.Subject(kind="User", name=SCRAPER_USER, api_group="rbac.authorization.k8s.io")])
    binding.add_dependency(role)
    return chart


def dcgm_exporter_values(platform: PlatformConfig) -> dict[str, Any]:
    """Helm values of the dcgm-exporter chart (4.8.2), set where a default does not fit.

    * ``serviceMonitor.enabled: false``: the chart's default creates a Prometheus-operator
      ``ServiceMonitor``, a kind this cluster does not have (the install would fail); the AMP
      scraper finds the pods itself (:mod:`observability.targets`).
    * Runs only on HyperPod nodes (the GPUs), tolerating every taint of the instance groups.
    * ``securityContext`` is the chart's (root, ``SYS_ADMIN`` added for DCGM profiling fields,
      all else dropped, no privilege escalation); no ``privileged``.
    """
    tolerations = []
    for group in platform.hyperpod.instance_groups:
        for taint in group.taints:
            entry = {"key": taint.key, "operator": "Exists", "effect": taint.effect}
            if entry not in tolerations:
                tolerations.append(entry)
    return {
        "serviceMonitor": {"enabled": False},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HYPERPOD_NODE_LABEL, "operator": "In", "values": [HYPERPOD_NODE_VALUE]}]}]}}},
        "tolerations": tolerations,
    }
