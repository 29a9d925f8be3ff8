"""Autoscaling triggers as code: the KEDA Prometheus triggers of each autoscaling business line.

A line with ``autoscaling`` (:class:`platform_config.line_models.AutoscalingConfig`) gets an
``autoScalingSpec`` in its InferenceEndpointConfig (:func:`k8s.line_chart.autoscaling_spec`); the
inference operator turns it into a KEDA ``ScaledObject`` and KEDA into a HorizontalPodAutoscaler,
which takes the largest replica count any trigger asks for, within ``min_replicas``..``max_replicas``.
The triggers read the platform's own Amazon Managed Prometheus workspace, the one the managed scraper
fills and the alerts read (:mod:`observability.targets`), with the PromQL of
:mod:`observability.queries` (the TTFT one is the SLO alert's, the canary's requests left out):

==================  ===========================================  ============  =========================
trigger             query (one element, 0 when nothing scraped)  metric type   target
==================  ===========================================  ============  =========================
waiting-requests    requests waiting, summed over the line       ``Average``   ``waiting_requests_per_replica``
kv-cache-usage      GPU KV-cache usage, mean over the replicas   ``Value``     ``kv_cache_usage``
ttft-p90            TTFT p90 of user requests, seconds           ``Value``     ``ttft_p90_slo_fraction`` x SLO
==================  ===========================================  ============  =========================

How KEDA reads the workspace (docs/observability.md, "Autoscaling"; docs/sources.md §26): the
operator's CRD takes only ``serverAddress`` (the workspace's query URL, its pattern), ``query``,
``targetValue`` and ``metricType`` per trigger; the KEDA the inference add-on installs signs each
query with SigV4 as its own IRSA role (add-on key ``keda.auth.aws.irsa.roleArn``), which the
observability stack lets query exactly this workspace (``aps:QueryMetrics``).

Every query here is evaluated by the real Prometheus in ``tests/observability/test_autoscaling.py``
(``promtool test rules``, ``promql_expr_test``) on recorded series.
"""

from __future__ import annotations

from typing import Final

from k8s.line_chart import LineScaling, ScalingTrigger
from observability import queries
from platform_config import BusinessLineConfig, PlatformConfig, ProjectConfig

#: Trigger names (unique in a line; KEDA names each metric after its trigger's index, not its name).
WAITING_REQUESTS: Final = "waiting-requests"
KV_CACHE_USAGE: Final = "kv-cache-usage"
TTFT_P90: Final = "ttft-p90"
#: A workspace ID that names no workspace, for manifests rendered before the workspace exists
#: (``make manifests`` without ``--prometheus-workspace-id``) and for tests; of the form AMP's IDs have.
PLACEHOLDER_WORKSPACE_ID: Final = "ws-00000000-0000-0000-0000-000000000000"


def workspace_query_url(region: str, workspace_id: str) -> str:
    """The query URL of workspace ``workspace_id`` in ``region``, as the operator's CRD wants it:
    ``https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>`` (no trailing slash; KEDA appends
    ``/api/v1/query``). ``workspace_id`` may be a CDK token (the observability stack's workspace)."""
    return f"https://aps-workspaces.{region}.amazonaws.com/workspaces/{workspace_id}"


def triggers(line: BusinessLineConfig) -> tuple[ScalingTrigger, ...]:
    """The line's triggers (the module table), those its ``autoscaling.triggers`` leave on, in that order.

    Raises:
        ValueError: the line does not autoscale.
    """
    if line.autoscaling is None:
        raise ValueError(f"business line {line.name!r} does not autoscale")
    t = line.autoscaling.triggers
    out: list[ScalingTrigger] = []
    if t.waiting_requests_per_replica is not None:
        out.append(ScalingTrigger(WAITING_REQUESTS, queries.autoscale_waiting_requests(line),
                                  t.waiting_requests_per_replica, "Average"))
    if t.kv_cache_usage is not None:
        out.append(ScalingTrigger(KV_CACHE_USAGE, queries.autoscale_kv_cache_usage(line), t.kv_cache_usage, "Value"))
    if t.ttft_p90_slo_fraction is not None:
        out.append(ScalingTrigger(TTFT_P90, queries.autoscale_ttft_p90_seconds(line),
                                  round(t.ttft_p90_slo_fraction * line.slo.ttft_p90_ms / 1000, 6), "Value"))
    return tuple(out)


def line_scaling(line: BusinessLineConfig, server_address: str) -> LineScaling | None:
    """What the line's chart needs to autoscale (None for a fixed line)."""
    return LineScaling(server_address, triggers(line)) if line.autoscaling is not None else None


def project_scaling(project: ProjectConfig, workspace_id: str = PLACEHOLDER_WORKSPACE_ID) -> dict[str, LineScaling]:
    """Line name -> :class:`~k8s.line_chart.LineScaling` of every autoscaling line of ``project``,
    reading workspace ``workspace_id`` of the platform's region (the argument of
    :func:`k8s.render.render_manifests`)."""
    return scaling_of(project.platform, project.business_lines, workspace_id)


def scaling_of(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...],
               workspace_id: str = PLACEHOLDER_WORKSPACE_ID) -> dict[str, LineScaling]:
    """:func:`project_scaling` of ``lines`` on ``platform``."""
    address = workspace_query_url(platform.region, workspace_id)
    return {line.name: LineScaling(address, triggers(line)) for line in lines if line.autoscaling is not None}
