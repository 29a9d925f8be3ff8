"""The in-cluster side of the collection path: the DCGM exporter's namespace, Helm values and counters.

The AMP managed scraper needs no object of ours in the cluster: on a cluster whose
authentication mode is ``API`` or ``API_AND_CONFIG_MAP`` (ours, ``stacks.cluster_stack``), AMP
creates the scraper's EKS access entry, with its access policy, when the scraper is created
(AMP user guide, "Set up managed collectors for Amazon EKS"; docs/sources.md §13).

The DCGM exporter (chart ``dcgm-exporter`` 4.8.2, image 4.5.3-4.8.2; NVIDIA/dcgm-exporter at tag
``4.5.3-4.8.2``, docs/sources.md §13) runs with less than the chart gives it:

* **root, without any capability.** The chart's default is root with ``SYS_ADMIN`` added,
  which its own values.yaml and Dockerfile say is needed only for the profiling fields
  (``DCGM_FI_PROF_*``); this platform reads only ``DCGM_FI_DEV_*`` fields, so ``SYS_ADMIN`` is
  dropped with everything else. The image also runs as uid 1000 for those fields (same files),
  but then it loses the pod attribution our per-line GPU panel needs: the exporter maps GPUs to
  pods through the kubelet's pod-resources socket (``/var/lib/kubelet/pod-resources/kubelet.sock``,
  ``internal/pkg/transformation/kubernetes.go``), and the kubelet creates that directory ``0750``
  root-owned (kubernetes ``pkg/kubelet/kubelet.go``, ``setupDataDirs``), so any other uid is refused
  and the exporter silently drops the ``namespace``/``pod`` labels ("Failed to get pod mappings").
  uid 0 needs no capability to open a root-owned ``0750`` directory (owner bits apply).
* **only the fields the dashboards and alerts use**: the counters CSV (the chart's
  ``customMetrics`` value, which it writes into its ConfigMap ``exporter-metrics-config-map`` and
  mounts at ``/etc/dcgm-exporter/default-counters.csv``, the file ``-f`` names) lists exactly the
  DCGM metrics of :data:`observability.metrics.METRICS`, instead of the chart's ~40 fields.
* its namespace admits it under Pod Security ``privileged`` (labelled explicitly, not left to the
  cluster default): the chart mounts the pod-resources directory read-only as a ``hostPath``
  volume, which the ``baseline`` level forbids; nothing else of the pod needs more than baseline
  (tests/observability/test_dcgm_exporter.py checks the pod against the baseline checks).
"""

from __future__ import annotations

import csv
import io
from typing import Any, Final

from k8s.nodes import hyperpod_node_requirements, instance_group_tolerations
from observability import metrics
from platform_config import PlatformConfig
from platform_config import pod_resources

#: Helm release name of the DCGM exporter.
DCGM_RELEASE: Final = "dcgm-exporter"
#: Where the chart mounts its counters ConfigMap in the container (values.yaml ``extraVolumeMounts``).
DCGM_COUNTERS_PATH: Final = "/etc/dcgm-exporter/default-counters.csv"
#: Pod Security level of the exporter's namespace (hostPath to the kubelet's pod-resources).
DCGM_NAMESPACE_POD_SECURITY: Final = "privileged"


def dcgm_counters() -> tuple[metrics.Metric, ...]:
    """The DCGM fields the platform reads: every metric of :data:`metrics.METRICS` sourced to the DCGM exporter."""
    return tuple(m for m in metrics.METRICS.values() if m.source is metrics.DCGM)


def dcgm_counters_csv() -> str:
    """The exporter's counters file: ``field,prometheus type,help`` per line, as its parser wants.

    The exporter reads it with Go's ``encoding/csv`` (``#`` comments) and refuses a record that is
    not exactly 3 fields (``internal/pkg/counters/counter_config.go``, ``ExtractCounters``); the
    ``csv`` module quotes a help text with a comma the same way Go reads it back.
    """
    out = io.StringIO()
    out.write("# DCGM field, Prometheus type, help: only the fields this platform's dashboards and alerts use\n")
    writer = csv.writer(out, lineterminator="\n")
    for metric in dcgm_counters():
        writer.writerow([metric.name, metric.kind, f"{metric.meaning} ({metric.unit})"])
    return out.getvalue()


def dcgm_security_context() -> dict[str, Any]:
    """The exporter container's security context: uid 0, no capability, no privilege escalation (see module doc).

    Helm merges these values *into* the chart's defaults, key by key: a list replaces a list, but
    a key left out keeps the default. So ``capabilities.add`` is set to an empty list; without it
    the chart's ``add: [SYS_ADMIN]`` would survive (checked with ``helm template`` of chart 4.8.2).
    """
    return {
        "runAsNonRoot": False, "runAsUser": 0, "privileged": False, "allowPrivilegeEscalation": False,
        "capabilities": {"add": [], "drop": ["ALL"]},
    }


def monitoring_namespace(platform: PlatformConfig) -> dict[str, Any]:
    """The exporter's Namespace with its Pod Security labels (the level enforced, and the version it is read at)."""
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": platform.observability.namespace, "labels": {
            "app.kubernetes.io/part-of": "kvcache",
            "pod-security.kubernetes.io/enforce": DCGM_NAMESPACE_POD_SECURITY,
            "pod-security.kubernetes.io/enforce-version": f"v{platform.eks.version}"}},
    }


def dcgm_exporter_values(platform: PlatformConfig) -> dict[str, Any]:
    """Helm values of the dcgm-exporter chart (4.8.2), set where a default does not fit.

    * ``serviceMonitor.enabled: false``: the chart's default creates a Prometheus-operator
      ``ServiceMonitor``, a kind this cluster does not have (the install would fail); the AMP
      scraper finds the pods itself (:mod:`observability.targets`).
    * Runs only on HyperPod nodes (the GPUs), tolerating every taint of the instance groups.
    * ``securityContext``: :func:`dcgm_security_context` (the chart's adds ``SYS_ADMIN``).
    * ``arguments`` / ``customMetrics``: the counters file is :func:`dcgm_counters_csv`.
    * ``resources`` only when :data:`platform_config.pod_resources.DCGM_EXPORTER_VALUES_RESOURCES` sets
      some (today none: the chart's requests apply), the same fact the node budget counts.
    """
    tolerations = instance_group_tolerations(platform)
    given = pod_resources.DCGM_EXPORTER_VALUES_RESOURCES
    resources = {"resources": given} if given else {}
    return {
        "serviceMonitor": {"enabled": False},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": hyperpod_node_requirements()}]}}},
        "tolerations": tolerations,
        "securityContext": dcgm_security_context(),
        "arguments": ["-f", DCGM_COUNTERS_PATH],
        "customMetrics": dcgm_counters_csv(),
        **resources,
    }
