"""A line's optional autoscaling (issue 26, "Replicas are fixed"): ``autoscaling.min_replicas`` /
``max_replicas`` and the triggers, how ``replicas`` relates to them, and the checks a user meets
when a value is wrong: each refused with the file, the field and what is allowed.

The scenario's ``rag-assistant`` autoscales 1..2 and starts at 2; its g6e.12xlarge nodes hold no
third replica next to legal-search and ticket-triage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capacity.project_checks import load_checked_project
from platform_config.line_models import AutoscalingTriggers
from tests.config.test_config import only_problem
from tests.example_config import FIXTURE_CONFIG, edit_yaml

RAG = "rag-assistant"


def line_file(config_dir: Path) -> Path:
    return config_dir / "business-lines" / f"{RAG}.yaml"


def set_autoscaling(config_dir: Path, *, replicas: int | None = None, **scaling) -> None:
    """Replace the line's ``autoscaling`` with ``scaling`` (and ``replicas``, dropped when None)."""
    def change(d):
        d.pop("replicas", None)
        if replicas is not None:
            d["replicas"] = replicas
        d["autoscaling"] = scaling
    edit_yaml(line_file(config_dir), change)


def test_the_scenario_line_autoscales_from_one_to_two_and_starts_at_two() -> None:
    line = load_checked_project(FIXTURE_CONFIG).business_line(RAG)
    assert (line.min_replica_count, line.replicas, line.max_replica_count) == (1, 2, 2)
    assert line.autoscaling.triggers == AutoscalingTriggers()  # the documented defaults
    assert (line.autoscaling.triggers.waiting_requests_per_replica, line.autoscaling.triggers.kv_cache_usage,
            line.autoscaling.triggers.ttft_p90_slo_fraction) == (4, 0.8, 0.8)


def test_a_fixed_line_keeps_its_replicas_as_min_and_max() -> None:
    line = load_checked_project(FIXTURE_CONFIG).business_line("research-reasoning")
    assert line.autoscaling is None
    assert line.min_replica_count == line.replicas == line.max_replica_count == 1


def test_without_replicas_an_autoscaling_line_starts_at_min(config_dir: Path) -> None:
    set_autoscaling(config_dir, min_replicas=1, max_replicas=2)
    line = load_checked_project(config_dir).business_line(RAG)
    assert line.replicas == 1 and line.autoscaling.max_replicas == 2


def test_min_above_max_is_refused(config_dir: Path) -> None:
    set_autoscaling(config_dir, min_replicas=3, max_replicas=2)
    assert only_problem(config_dir) == (
        f"{line_file(config_dir)}: autoscaling.min_replicas: min_replicas 3 is above max_replicas 2; allowed: "
        "min_replicas 1..2 (or a larger max_replicas)")


@pytest.mark.parametrize("replicas", [3, 1])
def test_replicas_outside_min_and_max_is_refused(config_dir: Path, replicas: int) -> None:
    set_autoscaling(config_dir, replicas=replicas, min_replicas=2, max_replicas=2)
    assert only_problem(config_dir) == (
        f"{line_file(config_dir)}: replicas: replicas {replicas} is the count an autoscaling line starts with, outside "
        "autoscaling.min_replicas 2..max_replicas 2; allowed: 2..2, or no replicas (it starts at min_replicas)")


def test_scaling_to_zero_is_refused(config_dir: Path) -> None:
    set_autoscaling(config_dir, min_replicas=0, max_replicas=2)
    assert only_problem(config_dir) == (
        f"{line_file(config_dir)}: autoscaling.min_replicas: not allowed; allowed: greater than or equal to 1 (got 0)")


def test_a_line_with_every_trigger_off_is_refused(config_dir: Path) -> None:
    set_autoscaling(config_dir, min_replicas=1, max_replicas=2, triggers={
        "waiting_requests_per_replica": None, "kv_cache_usage": None, "ttft_p90_slo_fraction": None})
    assert only_problem(config_dir).startswith(
        f"{line_file(config_dir)}: autoscaling.triggers.waiting_requests_per_replica: every trigger is null, so "
        "nothing would ever scale the line; allowed: at least one of")


def test_kv_cache_usage_is_a_fraction(config_dir: Path) -> None:
    set_autoscaling(config_dir, min_replicas=1, max_replicas=2, triggers={"kv_cache_usage": 80})
    assert only_problem(config_dir) == (
        f"{line_file(config_dir)}: autoscaling.triggers.kv_cache_usage: not allowed; allowed: less than or equal to 1 "
        "(got 80)")


def test_a_misspelled_key_names_the_section_keys(config_dir: Path) -> None:
    set_autoscaling(config_dir, min_replicas=1, max_replicas=2, max_replica=3)
    assert "autoscaling.max_replica: unknown key (typo?); allowed: the keys of this section, max_replicas, " \
           "min_replicas" in only_problem(config_dir)


def test_autoscaling_needs_the_prometheus_workspace(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["observability"].update(enabled=False))
    assert only_problem(config_dir) == (
        f"{line_file(config_dir)}: autoscaling: the autoscaling triggers read the line's metrics from the platform's "
        f"Prometheus workspace, but observability.enabled is false in {config_dir / 'platform.yaml'}, so there is "
        "none; allowed: observability.enabled true, or no autoscaling (a fixed replicas)")


def test_autoscaling_needs_the_line_metrics(config_dir: Path) -> None:
    edit_yaml(line_file(config_dir), lambda d: d.update(metrics_enabled=False))
    assert only_problem(config_dir) == (
        f"{line_file(config_dir)}: metrics_enabled: metrics_enabled false leaves the autoscaling triggers without the "
        "line's vLLM metrics; allowed: metrics_enabled true, or no autoscaling")


def test_max_replicas_must_fit_the_nodes_though_min_does(config_dir: Path) -> None:
    """The node check places the most replicas a line may reach: max 3 is refused even though the
    line starts at 1, naming autoscaling.max_replicas."""
    set_autoscaling(config_dir, min_replicas=1, max_replicas=3)
    problem = only_problem(config_dir)
    assert problem.startswith(f"{config_dir / 'business-lines'}: replicas: the lines on ml.g6e.12xlarge (legal-search 1 "
                              "x (2 GPU, 16 CPU, 120.00 GiB), rag-assistant 3 (autoscaling.max_replicas) x (1 GPU, 10 CPU, "
                              "80.00 GiB), ticket-triage 1 x")
    assert "first that does not fit: rag-assistant replica 3 of 3" in problem
    assert "allowed: raise instance_count, or lower replicas or autoscaling.max_replicas, resources.cpu" in problem
    edit_yaml(config_dir / "platform.yaml",
              lambda d: d["hyperpod"]["instance_groups"][0].update(instance_count=3))
    assert load_checked_project(config_dir).business_line(RAG).max_replica_count == 3
