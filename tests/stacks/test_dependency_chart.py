"""The optional HyperPod dependency chart: installed before the HyperPod cluster, or a clear config error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

import stacks
from platform_config import ConfigError, ProjectConfig
from platform_config.platform_models import HyperPodDependencyChartConfig
from stacks.hyperpod_stack import DEPENDENCY_CHART_DEFAULTS

CHART = Path(__file__).resolve().parent / "fixtures" / "hyperpod-chart"
COMMIT = "1504d53b28a6de4449c0fcdf9d56b8c87f28283f"


def with_chart(project, chart: HyperPodDependencyChartConfig) -> ProjectConfig:
    hyperpod = project.platform.hyperpod.model_copy(update={"dependency_chart": chart})
    platform = project.platform.model_copy(update={"hyperpod": hyperpod})
    return ProjectConfig(platform=platform, business_lines=project.business_lines, config_dir=project.config_dir)


@pytest.fixture(scope="module")
def chart_platform(project, tmp_path_factory):
    chart = HyperPodDependencyChartConfig(path=str(CHART), source_commit=COMMIT,
                                          values={"health-monitoring-agent": {"enabled": True}})
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("chart")))
    built = stacks.build_platform(app, with_chart(project, chart))
    app.synth()
    return app, built, Template.from_stack(built.hyperpod)


def test_chart_is_installed_into_kube_system_with_the_platform_defaults(chart_platform) -> None:
    _, _, template = chart_platform
    (chart,) = template.find_resources("Custom::AWSCDK-EKS-HelmChart").values()
    props = chart["Properties"]
    assert props["Release"] == "dependencies"
    assert props["Namespace"] == "kube-system"
    assert props["Wait"] is True
    values = json.loads(props["Values"]) if isinstance(props["Values"], str) else props["Values"]
    for key, value in DEPENDENCY_CHART_DEFAULTS.items():
        assert values[key] == value, key
    assert values["cert-manager"] == {"enabled": False}  # the EKS add-on provides cert-manager
    assert values["inferenceOperators"] == {"enabled": False}  # ... and the inference operator
    assert values["global"] == {"region": "us-west-2"}
    assert values["health-monitoring-agent"] == {"enabled": True}  # config values merged on top


def test_hyperpod_cluster_waits_for_the_chart(chart_platform) -> None:
    _, _, template = chart_platform
    (chart_id,) = template.find_resources("Custom::AWSCDK-EKS-HelmChart")
    cluster = template.find_resources("AWS::SageMaker::Cluster")["HyperPodCluster"]
    assert chart_id in cluster["DependsOn"]
    assert template.find_outputs("DependencyChartSourceCommit")["DependencyChartSourceCommit"]["Value"] == COMMIT


def test_reading_the_chart_asset_is_acknowledged_for_cdk_nag(chart_platform) -> None:
    app, _, _ = chart_platform
    report = AwsSolutionsChecks().validate_scope(app)
    assert [v.rule_name for v in report.violations] == []


def test_chart_without_vendored_subcharts_is_a_config_error(project, tmp_path) -> None:
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: x\nversion: 0.1.0\n")
    chart = HyperPodDependencyChartConfig(path=str(tmp_path), source_commit=COMMIT)
    with pytest.raises(ConfigError) as info:
        stacks.build_platform(stacks.new_app(outdir=str(tmp_path / "out")), with_chart(project, chart))
    (problem,) = info.value.problems
    assert problem.field == "hyperpod.dependency_chart.path"
    assert "helm dependency update" in problem.message
    assert problem.file.endswith("platform.yaml")
