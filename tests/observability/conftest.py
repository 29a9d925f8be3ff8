"""Fixtures of the observability tests: the scenario config, its dashboard, rules and scrape config."""

from __future__ import annotations

from typing import Any

import promql_parser
import pytest

from observability import alerts, dashboards, targets
from platform_config import ProjectConfig, load_project
from tests.example_config import FIXTURE_CONFIG


@pytest.fixture(scope="session")
def obs_project() -> ProjectConfig:
    """The scenario configuration (tests/fixtures/config)."""
    return load_project(FIXTURE_CONFIG)


@pytest.fixture(scope="session")
def dashboard(obs_project) -> dict[str, Any]:
    """The dashboard JSON model of the scenario."""
    return dashboards.build_dashboard(obs_project.platform, obs_project.business_lines)


@pytest.fixture(scope="session")
def all_alerts(obs_project) -> list[alerts.Alert]:
    """Every alert of the scenario."""
    return alerts.all_alerts(obs_project.platform, obs_project.business_lines)


@pytest.fixture(scope="session")
def scrape_config(obs_project) -> dict[str, Any]:
    """The scraper configuration of the scenario."""
    return targets.scrape_configuration(obs_project.platform, obs_project.business_lines)


def panel_targets(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel of a dashboard model."""
    return [(p["title"], t["expr"]) for p in model["panels"] for t in p.get("targets") or []]


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """Vector selectors of a PromQL expression (parsed by promql-parser): (name, {label: (op, value)})."""
    found: list[tuple[str, dict[str, tuple[str, str]]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, {m.name: (str(m.op).rsplit(".", 1)[-1], m.value)
                                      for m in node.matchers.matchers}))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found
