"""The ``observability`` section and the per-line SLO: defaults, errors naming file and field, the switch."""

from __future__ import annotations

import pytest

from platform_config import ConfigError, load_project
from tests.example_config import copy_example_config, edit_yaml, set_fixed


def test_fixture_turns_observability_on_with_pinned_exporter_and_per_line_slos(obs_project) -> None:
    obs = obs_project.platform.observability
    assert obs.enabled and obs.grafana.create_workspace and obs.grafana.authentication == "AWS_SSO"
    # Private by default (issue 25, low item "Public Grafana workspace"): the fixture does not say so.
    assert obs.grafana.network_access == "private"
    assert (obs.grafana.prefix_list_ids, obs.grafana.endpoint_client_cidrs) == ((), ())
    assert (obs.dcgm_exporter.chart.chart, obs.dcgm_exporter.chart.version) == ("dcgm-exporter", "4.8.2")
    assert {l.name: l.slo.ttft_p90_ms for l in obs_project.business_lines} == {
        "rag-assistant": 1000, "research-reasoning": 3000, "legal-search": 2000, "ticket-triage": 2000}


@pytest.mark.parametrize(("edit", "field", "fragment"), [
    (lambda d: d["observability"]["alerts"].update(pool_usage_threshold=1.5), "observability.alerts.pool_usage_threshold",
     "less than or equal to 1"),
    (lambda d: d["observability"]["alerts"].update(email_subscriptions=["oncall"]),
     "observability.alerts.email_subscriptions.0", "an email address"),
    (lambda d: d["observability"]["grafana"].update(authentication="LDAP"), "observability.grafana.authentication",
     "allowed: 'AWS_SSO' or 'SAML'"),
    (lambda d: d["observability"]["grafana"].update(network_access="open"), "observability.grafana.network_access",
     "allowed: 'private' or 'public'"),
    (lambda d: d["observability"]["grafana"].update(network_access="public", prefix_list_ids=["pl-0123456789abcdef0"]),
     "observability.grafana.prefix_list_ids", "network_access is 'public'"),
    (lambda d: d["observability"]["grafana"].update(network_access="public", endpoint_client_cidrs=["10.0.0.0/8"]),
     "observability.grafana.endpoint_client_cidrs", "network_access is 'public'"),
    (lambda d: d["observability"]["grafana"].update(prefix_list_ids=["sg-0123456789abcdef0"]),
     "observability.grafana.prefix_list_ids.0", "pl-"),
    (lambda d: d["observability"]["grafana"].update(endpoint_client_cidrs=[f"{i}.0.0.0/8" for i in range(256)]),
     "observability.grafana.endpoint_client_cidrs", "cover every IPv4 address"),
    (lambda d: d["observability"]["dcgm_exporter"]["chart"].update(version="latest"),
     "observability.dcgm_exporter.chart.version", "an exact version"),
    (lambda d: d["observability"].update(scrape_intervall=30), "observability.scrape_intervall", "unknown key"),
    (lambda d: d["observability"].update(scrape_interval_seconds=15), "observability.scrape_interval_seconds",
     "greater than or equal to 30"),
])
def test_bad_observability_values_name_the_file_and_field(tmp_path, edit, field, fragment) -> None:
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", edit)
    with pytest.raises(ConfigError) as err:
        load_project(config)
    (problem,) = err.value.problems
    assert problem.file == str(config / "platform.yaml") and problem.field == field
    assert fragment in problem.message


def test_bad_slo_names_the_line_file(tmp_path) -> None:
    config = copy_example_config(tmp_path / "config")
    line = config / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line, lambda d: d["slo"].update(ttft_p90_ms=0))
    with pytest.raises(ConfigError) as err:
        load_project(config)
    (problem,) = err.value.problems
    assert (problem.file, problem.field) == (str(line), "slo.ttft_p90_ms")


def test_a_line_may_not_use_the_monitoring_namespace(tmp_path) -> None:
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "business-lines" / "rag-assistant.yaml", lambda d: d.update(namespace="kvcache-monitoring"))
    with pytest.raises(ConfigError, match="reserved for the platform") as err:
        load_project(config)
    assert err.value.problems[0].field == "namespace"


def test_observability_off_builds_no_observability_stack(tmp_path) -> None:
    """The switch: no stack, so no scraper, exporter, topic or workspace (and app.py writes no dashboard)."""
    import stacks

    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda d: d["observability"].update(enabled=False))
    # An autoscaling line needs the workspace (refused without it: tests/config/test_autoscaling_config.py).
    edit_yaml(config / "business-lines" / "rag-assistant.yaml", lambda d: set_fixed(d, replicas=2))
    app = stacks.new_app(outdir=str(tmp_path / "out"))
    built = stacks.build_platform(app, load_project(config))
    assert built.observability is None
    assert not [s for s in built.all() if s.stack_name.endswith("-observability")]
