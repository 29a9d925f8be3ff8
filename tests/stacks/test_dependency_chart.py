"""Charts installed from files of this repository, in one synthesis: the optional HyperPod dependency
chart (installed before the HyperPod cluster), and the Helm charts pinned by digest (Kyverno, the DCGM
exporter), installed from their checked archive instead of the repository; or a clear config error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

import stacks
from platform_config import ConfigError, ProjectConfig, load_project
from platform_config.platform_models import HelmChartVersion, HyperPodDependencyChartConfig
from kv_constructs.helm_charts import verified_chart_dir
from stacks.hyperpod_stack import DEPENDENCY_CHART_DEFAULTS
from tests.helm.charts import chart_archive

CHART = Path(__file__).resolve().parent / "fixtures" / "hyperpod-chart"
COMMIT = "1504d53b28a6de4449c0fcdf9d56b8c87f28283f"
HELM = "Custom::AWSCDK-EKS-HelmChart"


def with_chart(project, chart: HyperPodDependencyChartConfig | None = None, *, kyverno: HelmChartVersion | None = None,
               dcgm: HelmChartVersion | None = None) -> ProjectConfig:
    """``project`` with the dependency chart and/or the Kyverno and DCGM exporter pins replaced."""
    platform = project.platform
    hyperpod = platform.hyperpod.model_copy(update={"dependency_chart": chart or platform.hyperpod.dependency_chart})
    charts = platform.versions.charts.model_copy(update={"kyverno": kyverno or platform.versions.charts.kyverno})
    exporter = platform.observability.dcgm_exporter.model_copy(
        update={"chart": dcgm or platform.observability.dcgm_exporter.chart})
    platform = platform.model_copy(update={
        "hyperpod": hyperpod, "versions": platform.versions.model_copy(update={"charts": charts}),
        "observability": platform.observability.model_copy(update={"dcgm_exporter": exporter})})
    return ProjectConfig(platform=platform, business_lines=project.business_lines, config_dir=project.config_dir)


def by_digest(project, folder: Path, chart: str = "kyverno", *, version: str | None = None, **archive) -> HelmChartVersion:
    """The config's pin of ``chart`` (kyverno or dcgm-exporter) with the digest of an archive written
    to ``folder`` (``archive``: :func:`tests.helm.charts.chart_archive` options, ``version`` its Chart.yaml's)."""
    pin = (project.platform.versions.charts.kyverno if chart == "kyverno"
           else project.platform.observability.dcgm_exporter.chart)
    path = folder / f"{pin.chart}-{pin.version}.tgz"
    digest = chart_archive(path, pin.chart, version or pin.version, **archive)
    return pin.model_copy(update={"digest": digest, "archive": str(path)})


@pytest.fixture(scope="module")
def chart_platform(project, tmp_path_factory):
    chart = HyperPodDependencyChartConfig(path=str(CHART), source_commit=COMMIT,
                                          values={"health-monitoring-agent": {"enabled": True}})
    archives = tmp_path_factory.mktemp("archives")
    pinned = with_chart(project, chart, kyverno=by_digest(project, archives),
                        dcgm=by_digest(project, archives, "dcgm-exporter"))
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("chart")))
    built = stacks.build_platform(app, pinned)
    app.synth()
    return app, built, Template.from_stack(built.hyperpod)


def test_chart_is_installed_into_kube_system_with_the_platform_defaults(chart_platform) -> None:
    _, _, template = chart_platform
    (chart,) = template.find_resources(HELM).values()
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
    (chart_id,) = template.find_resources(HELM)
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


def _helm_release(app, built, stack: str, release: str) -> tuple[dict, Path]:
    """The HelmChart resource of ``release`` in ``stack`` and the folder its asset was staged from."""
    (chart,) = [r for r in Template.from_stack(getattr(built, stack)).find_resources(HELM).values()
                if r["Properties"]["Release"] == release]
    url = json.dumps(chart["Properties"].get("ChartAssetURL"))
    (staged,) = [d for d in Path(app.outdir).glob("asset.*") if d.name.removeprefix("asset.") in url]
    return chart["Properties"], staged


@pytest.mark.parametrize(("stack", "release", "chart", "version"), [
    ("l2_cache", "kyverno", "kyverno", "3.5.2"),
    ("observability", "dcgm-exporter", "dcgm-exporter", "4.8.2"),
])
def test_a_chart_pinned_by_digest_is_installed_from_its_checked_archive(chart_platform, stack, release, chart,
                                                                         version) -> None:
    """Not fetched by version: no Repository or Version for the handler, the archive's own chart folder
    as the asset (Chart.yaml at its top, as the handler's `helm upgrade <folder>` needs)."""
    app, built, _ = chart_platform
    props, staged = _helm_release(app, built, stack, release)
    assert "Repository" not in props and "Version" not in props and "Chart" not in props
    assert yaml.safe_load((staged / "Chart.yaml").read_text()) == {"apiVersion": "v2", "name": chart,
                                                                    "version": version}
    assert f"chart: {chart}" in (staged / "templates" / "configmap.yaml").read_text()


def _refused(project, tmp_path, pin: HelmChartVersion, field: str = "versions.charts.kyverno.digest"):
    """The ConfigError ``build_platform`` raises for ``pin`` as Kyverno's (or the exporter's) pin."""
    kwargs = {"kyverno": pin} if field.startswith("versions") else {"dcgm": pin}
    with pytest.raises(ConfigError) as info:
        stacks.build_platform(stacks.new_app(outdir=str(tmp_path / "out")), with_chart(project, **kwargs))
    (problem,) = info.value.problems
    assert (problem.field, problem.value) == (field, pin.digest)
    assert problem.file.endswith("platform.yaml")
    return problem.message


def test_an_archive_that_is_not_the_digest_is_a_config_error(project, tmp_path) -> None:
    pin = by_digest(project, tmp_path)
    (tmp_path / "kyverno-3.5.2.tgz").write_bytes(b"\x1f\x8b another archive")
    message = _refused(project, tmp_path, pin)
    assert "kyverno-3.5.2.tgz has SHA-256 sha256:" in message and f"not the configured {pin.digest}" in message


def test_the_archive_is_hashed_again_on_every_check(project, tmp_path) -> None:
    """Once extracted, a changed archive under the same path and digest is still refused (only the
    extraction is cached)."""
    pin = by_digest(project, tmp_path)
    verified_chart_dir(pin)
    Path(pin.archive).write_bytes(Path(pin.archive).read_bytes() + b"\0")
    with pytest.raises(ValueError, match="not the configured " + pin.digest):
        verified_chart_dir(pin)


def test_a_missing_archive_names_the_script_that_writes_it(project, tmp_path) -> None:
    pin = by_digest(project, tmp_path, "dcgm-exporter")
    Path(pin.archive).unlink()
    message = _refused(project, tmp_path, pin, "observability.dcgm_exporter.chart.digest")
    assert message.startswith(f"no chart archive at {pin.archive}; write it with scripts/vendor_chart.py")


@pytest.mark.parametrize(("archive", "message"), [
    ({"version": "3.5.1"}, "its Chart.yaml is kyverno 3.5.1; allowed: kyverno 3.5.2"),
    ({"top": "policy-reporter"}, "holds policy-reporter at its top; allowed: one folder kyverno/"),
    ({"extra": {"../outside.yaml": b"x"}}, "refused as a chart archive (a gzipped tar of one folder): "),
    ({"links": {"kyverno/templates/link.yaml": "../Chart.yaml"}},
     "member 'kyverno/templates/link.yaml' is a link or special file; allowed: files and folders"),
    # tarfile's data filter makes an absolute member relative: it lands in the folder, beside the chart.
    ({"extra": {"/etc/kvcache-chart.yaml": b"x"}}, "holds etc, kyverno at its top; allowed: one folder kyverno/"),
])
def test_an_archive_of_another_chart_or_escaping_its_folder_is_refused(project, tmp_path, archive, message) -> None:
    """Its digest is the configured one, yet it is not this chart and version, or a member would be
    written outside the folder (Python's tarfile `data` filter)."""
    assert message in _refused(project, tmp_path, by_digest(project, tmp_path, **archive))
    assert not Path("/etc/kvcache-chart.yaml").exists()


@pytest.mark.parametrize(("field", "value", "says"), [
    ("archive", "../outside/kyverno.tgz", "a path to a .tgz file without '..' parts"),
    ("archive", "charts/kyverno.zip", "a path to a .tgz file"),
    ("chart", "../kyverno", "a Helm chart name"),
])
def test_a_chart_pin_cannot_name_a_file_outside_its_place(config_dir, field, value, says) -> None:
    """The vendoring script writes the archive there: no `..`, and a chart name is no path."""
    path = config_dir / "platform.yaml"
    platform = yaml.safe_load(path.read_text())
    platform["versions"]["charts"]["kyverno"][field] = value
    path.write_text(yaml.safe_dump(platform))
    with pytest.raises(ConfigError) as info:
        load_project(config_dir)
    (problem,) = info.value.problems
    assert problem.field == f"versions.charts.kyverno.{field}" and says in problem.message, problem


def test_require_digests_refuses_a_chart_pinned_by_version_only(config_dir) -> None:
    path = config_dir / "platform.yaml"
    platform = yaml.safe_load(path.read_text())
    platform["versions"]["charts"]["require_digests"] = True
    platform["versions"]["charts"]["kyverno"]["digest"] = "sha256:" + "c" * 64
    path.write_text(yaml.safe_dump(platform))
    with pytest.raises(ConfigError) as info:
        load_project(config_dir)
    (problem,) = info.value.problems
    assert problem.field == "observability.dcgm_exporter.chart.digest"
    assert problem.file.endswith("platform.yaml")
    assert ("has no digest; allowed: sha256:<64 lowercase hex digits>, its archive committed at "
            "charts/dcgm-exporter-4.8.2.tgz (scripts/vendor_chart.py writes both)") in problem.message
