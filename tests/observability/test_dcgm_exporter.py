"""The DCGM exporter runs with the least it needs: its counters, its security context, its namespace.

The chart itself cannot be rendered here (its repository is not reachable from CI, and its code is
not ours to vendor), so the pod is modelled from the chart's template at 4.8.2 (NVIDIA/dcgm-exporter
tag 4.5.3-4.8.2, ``deployment/templates/daemonset.yaml`` and ``values.yaml``; docs/sources.md §13):
what matters for Pod Security is the ``hostPath`` volume of the kubelet's pod-resources directory
(always there), ``hostPID``/``hostNetwork`` (values, default false) and the container's
``securityContext`` (values, merged by Helm into the chart's default). The model was checked
against ``helm template`` of that chart with these values (Helm 4.1.4 from the kubectl layer):
same security context, same single baseline violation. Not modelled: the rest of the pod
(probes, env, the Service, RBAC), which Pod Security does not look at.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest

from observability import cluster_objects, metrics
from observability.cluster_objects import (
    DCGM_COUNTERS_PATH,
    dcgm_counters_csv,
    dcgm_exporter_values,
    monitoring_namespace,
)
from k8s.network_policies import block_curvine_ports_manifest
from tests.k8s.pod_security import KUBERNETES_VERSION, baseline_violations
from tests.observability.conftest import panel_targets, selectors

#: The chart's default container security context at 4.8.2 (values.yaml: "Required for profiling metrics").
CHART_DEFAULT_SECURITY_CONTEXT = {
    "runAsNonRoot": False, "runAsUser": 0, "allowPrivilegeEscalation": False,
    "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]},
}
#: Prometheus types the exporter's counters parser accepts (internal/pkg/counters/variables.go).
EXPORTER_PROM_TYPES = {"gauge", "counter", "histogram", "summary", "label"}


def helm_merge(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values into chart defaults: maps merge key by key, anything else
    (lists included) replaces, ``null`` removes the key."""
    out = dict(defaults)
    for key, value in values.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = value
    return out


def exporter_pod_spec(values: dict[str, Any]) -> dict[str, Any]:
    """The DaemonSet's pod spec as chart 4.8.2 renders it (the fields Pod Security reads)."""
    return {
        "hostPID": values.get("hostPID", False),
        **({"hostNetwork": True} if values.get("hostNetwork") else {}),
        **({"securityContext": values["podSecurityContext"]} if values.get("podSecurityContext") else {}),
        "volumes": [{"name": "pod-gpu-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}},
                    {"name": "exporter-metrics-volume", "configMap": {"name": "exporter-metrics-config-map"}}],
        "containers": [{
            "name": "exporter",
            "securityContext": helm_merge(CHART_DEFAULT_SECURITY_CONTEXT, values.get("securityContext", {})),
            "ports": [{"name": "metrics", "containerPort": 9400}],
        }],
    }


@pytest.fixture(scope="module")
def values(obs_project) -> dict[str, Any]:
    return dcgm_exporter_values(obs_project.platform)


def test_exporter_runs_without_sys_admin_or_any_capability(values) -> None:
    """The chart adds SYS_ADMIN for DCGM_FI_PROF_* fields, which the platform does not read; a
    values map without ``add`` would keep it (Helm merges), so the effective context is checked."""
    context = exporter_pod_spec(values)["containers"][0]["securityContext"]
    assert context["capabilities"] == {"add": [], "drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False and context.get("privileged") is False
    # uid 0 for the kubelet's pod-resources socket (0750 root directory): see cluster_objects.
    assert context["runAsUser"] == 0
    # The check itself: dropping only "drop" would leave the chart's SYS_ADMIN in place.
    leaky = helm_merge(CHART_DEFAULT_SECURITY_CONTEXT, {"capabilities": {"drop": ["ALL"]}})
    assert leaky["capabilities"]["add"] == ["SYS_ADMIN"]


def test_namespace_pod_security_admits_the_exporter_and_only_because_of_its_host_path(values, obs_project) -> None:
    """Baseline would refuse the pod for exactly one reason, the read-only hostPath of the kubelet's
    pod-resources directory, so its namespace is labelled privileged (explicitly, pinned version)."""
    spec = exporter_pod_spec(values)
    assert baseline_violations(spec) == ['hostPath volumes (volume "pod-gpu-resources")']
    labels = monitoring_namespace(obs_project.platform)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/enforce-version"] == f"v{KUBERNETES_VERSION}"
    assert monitoring_namespace(obs_project.platform)["metadata"]["name"] == obs_project.platform.observability.namespace
    # The chart's default context would add a second violation.
    assert len(baseline_violations(exporter_pod_spec({}))) == 2


def _records(text: str) -> list[list[str]]:
    """The exporter's reading of the file: Go encoding/csv with '#' comments, fields trimmed."""
    rows = csv.reader(line for line in io.StringIO(text) if not line.startswith("#"))
    return [[field.strip() for field in row] for row in rows if row]


def test_counters_csv_lists_exactly_the_dcgm_fields_the_dashboards_and_alerts_use(dashboard, all_alerts) -> None:
    records = _records(dcgm_counters_csv())
    assert all(len(r) == 3 for r in records)  # ExtractCounters refuses anything else
    assert all(r[1] in EXPORTER_PROM_TYPES for r in records)
    fields = {r[0]: r[1] for r in records}
    # Derived from the PromQL the platform ships, not retyped: every DCGM_* series it selects.
    exprs = [expr for _, expr in panel_targets(dashboard)] + [a.expr for a in all_alerts]
    used = {name for expr in exprs for name, _ in selectors(expr) if name and name.startswith("DCGM_")}
    assert used and set(fields) == used
    for name, kind in fields.items():
        assert metrics.metric(name).kind == kind and metrics.metric(name).source is metrics.DCGM


def test_counters_csv_quotes_a_help_text_with_a_comma(monkeypatch) -> None:
    gpu = metrics.metric("DCGM_FI_DEV_GPU_UTIL")
    monkeypatch.setattr(cluster_objects, "dcgm_counters", lambda: (
        metrics.Metric(name=gpu.name, kind=gpu.kind, unit="percent", labels=(), meaning="busy, or not",
                       source=metrics.DCGM),))
    assert _records(dcgm_counters_csv()) == [["DCGM_FI_DEV_GPU_UTIL", "gauge", "busy, or not (percent)"]]


def test_exporter_reads_the_shipped_counters_file(values) -> None:
    """``-f`` names the file the chart mounts from its ConfigMap, which ``customMetrics`` fills."""
    assert values["arguments"] == ["-f", DCGM_COUNTERS_PATH]
    assert values["customMetrics"] == dcgm_counters_csv()
    assert values["serviceMonitor"] == {"enabled": False}


def test_stack_creates_the_labelled_namespace_before_the_chart(templates, obs_project) -> None:
    template = templates[f"{obs_project.platform.project}-observability"]
    namespaces = template.find_resources("Custom::AWSCDK-EKS-KubernetesResource")
    ((ns_id, ns),) = namespaces.items()
    manifest, *rest = json.loads(ns["Properties"]["Manifest"])
    # And the namespace's block-curvine-ports (k8s.network_policies; the reach tests).
    expected_policy = block_curvine_ports_manifest(obs_project.platform.observability.namespace)
    assert [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"], o["spec"]) for o in rest] == (
        [("NetworkPolicy", "block-curvine-ports", expected_policy["metadata"]["namespace"], expected_policy["spec"])]
        if obs_project.platform.curvine.enabled else [])
    expected = monitoring_namespace(obs_project.platform)
    assert manifest["kind"] == "Namespace" and manifest["metadata"]["name"] == expected["metadata"]["name"]
    assert expected["metadata"]["labels"].items() <= manifest["metadata"]["labels"].items()
    ((_, chart),) = template.find_resources("Custom::AWSCDK-EKS-HelmChart").items()
    assert chart["Properties"].get("CreateNamespace", False) is False  # ours, not Helm's unlabelled one
    assert ns_id in chart["DependsOn"]
