"""Build every chart of the project: the one code path of the CDK app and ``make manifests``.

The CDK stacks call :func:`build_curvine_chart` / :func:`build_line_chart` with CDK tokens for
the volume ID (and a plain zone); ``scripts/manifests.py`` and the operator tools call
:func:`render_manifests` with real values. Both construct the very same chart classes.
"""

from __future__ import annotations

from typing import Final, Mapping

import cdk8s

from k8s import names
from k8s.curvine_chart import CurvineChart, check_volume_inputs
from k8s.line_chart import BusinessLineChart, LineScaling
from platform_config import BusinessLineConfig, PlatformConfig, ProjectConfig

#: Name of the Curvine chart (key in :func:`render_manifests`, stem of its dist/ file).
CURVINE_CHART: Final = "curvine"


def build_curvine_chart(app: cdk8s.App, platform: PlatformConfig, *, volume_id: str,
                        availability_zone: str) -> CurvineChart:
    """The Curvine chart in ``app`` (see :class:`k8s.curvine_chart.CurvineChart`)."""
    return CurvineChart(app, CURVINE_CHART, platform=platform, volume_id=volume_id,
                        availability_zone=availability_zone)


def build_line_chart(app: cdk8s.App, platform: PlatformConfig, line: BusinessLineConfig,
                     scaling: LineScaling | None = None) -> BusinessLineChart:
    """The chart of one business line in ``app`` (see :class:`k8s.line_chart.BusinessLineChart`);
    ``scaling``: an autoscaling line's triggers and server address (:mod:`observability.autoscaling`)."""
    return BusinessLineChart(app, names.line_chart_name(line), platform=platform, line=line, scaling=scaling)


def build_charts(app: cdk8s.App, project: ProjectConfig, *, volume_id: str, availability_zone: str,
                 scaling: Mapping[str, LineScaling] | None = None) -> dict[str, cdk8s.Chart]:
    """Every chart: ``curvine`` (when ``curvine.enabled``) and ``line-<name>`` per business line;
    ``scaling``: line name -> :class:`~k8s.line_chart.LineScaling` of each autoscaling line.

    Raises:
        ValueError: malformed volume ID or zone, L2 on while Curvine is off, or an autoscaling line
            missing from ``scaling``.
    """
    scaling = scaling or {}
    charts: dict[str, cdk8s.Chart] = {}
    if project.platform.curvine.enabled:
        charts[CURVINE_CHART] = build_curvine_chart(app, project.platform, volume_id=volume_id,
                                                    availability_zone=availability_zone)
    for line in project.business_lines:
        charts[names.line_chart_name(line)] = build_line_chart(app, project.platform, line, scaling.get(line.name))
    return charts


def render_manifests(project: ProjectConfig, *, volume_id: str, availability_zone: str,
                     scaling: Mapping[str, LineScaling] | None = None) -> dict[str, list[dict]]:
    """Every chart's objects as plain dicts, keyed by chart name, in apply order.

    Args:
        project: the validated project (``platform_config.load_project``).
        volume_id: EBS volume ID of the Curvine Primary, ``vol-`` + 8-17 hex digits.
        availability_zone: that volume's zone name, e.g. ``us-west-2a``.
        scaling: each autoscaling line's triggers and workspace
            (:func:`observability.autoscaling.project_scaling`); required when a line autoscales.

    Returns:
        ``{"curvine": [...], "line-rag-assistant": [...], ...}``; each list is what
        ``kubectl apply -f`` of that chart's YAML would create, in order.

    Raises:
        ValueError: malformed volume ID or zone (checked before anything is built).
    """
    check_volume_inputs(volume_id, availability_zone)
    app = cdk8s.App()
    charts = build_charts(app, project, volume_id=volume_id, availability_zone=availability_zone, scaling=scaling)
    return {name: list(chart.to_json()) for name, chart in charts.items()}

