"""The planner for an autoscaling line (issue 26): ``max_replicas`` bounded by the node budget (the
config check's own packing, every other line at its maximum) and the cost at ``min_replicas`` and at
``max_replicas``.

Scenario: ``rag-assistant`` autoscales 1..2 (starts at 2) on two g6e.12xlarge nodes it shares with
legal-search and ticket-triage: 20.52 CPU per node for the lines, so its 10-CPU replicas fit twice.
Prices: the scenario's table, $13.12 per g6e.12xlarge-hour (4 GPUs).
"""

from __future__ import annotations

import json

from capacity.planner import Cost, ScalingPlan, format_scaling
from operator_tools import cli
from platform_config import load_project
from platform_config.node_fit import most_replicas
from tests.capacity.test_planner import FIXTURE_PRICES
from tests.example_config import FIXTURE_CONFIG, copy_example_config, edit_yaml, set_fixed
from tests.tools.script_loader import load_script

RAG = "rag-assistant"


def lines_of(config):
    project = load_project(config)
    return project.platform, [(config / "business-lines" / f"{l.name}.yaml", l) for l in project.business_lines]


def test_the_node_budget_bounds_max_replicas() -> None:
    platform, lines = lines_of(FIXTURE_CONFIG)
    assert most_replicas(platform, lines, RAG) == 2


def test_other_lines_count_at_their_maximum(tmp_path) -> None:
    """With a third node rag-assistant may grow to 4; once ticket-triage may grow to 5 replicas
    (4 CPU each), they take room rag-assistant then cannot have: 3 x 20.52 CPU less legal-search's 16
    and ticket-triage's 5 x 4 leave room for two 10-CPU replicas."""
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda d: d["hyperpod"]["instance_groups"][0].update(instance_count=3))
    platform, lines = lines_of(config)
    assert most_replicas(platform, lines, RAG) == 4
    edit_yaml(config / "business-lines" / "ticket-triage.yaml",
              lambda d: d.update(autoscaling={"min_replicas": 1, "max_replicas": 5}))
    platform, lines = lines_of(config)
    assert most_replicas(platform, lines, RAG) == 2


def test_cli_states_the_bound_and_the_cost_at_min_and_max(capsys) -> None:
    line = FIXTURE_CONFIG / "business-lines" / f"{RAG}.yaml"
    rc = load_script("plan").main(["--business-line", str(line), "--prices", str(FIXTURE_PRICES), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == cli.EXIT_OK
    # One g6e.12xlarge node holds both replicas (2 per node): the endpoint's node costs the same at 1 and
    # 2 replicas; its GPU share is 1/4 and 2/4 of $13.12.
    assert out["autoscaling"] == {
        "min_replicas": 1, "max_replicas": 2, "initial_replicas": 2, "most_replicas_that_fit": 2,
        "max_replicas_fits": True,
        "at_min": {"nodes": 1, "cost_per_endpoint_hour": 13.12, "gpu_share_cost_per_hour": 3.28},
        "at_max": {"nodes": 1, "cost_per_endpoint_hour": 13.12, "gpu_share_cost_per_hour": 6.56}}
    load_script("plan").main(["--business-line", str(line), "--prices", str(FIXTURE_PRICES)])
    text = capsys.readouterr().out
    assert ("autoscaling   1..2 replicas, starts at 2; the ml.g6e.12xlarge nodes hold at most 2 of them next to "
            "the other lines at their maximum") in text
    assert ("scaling cost  at min 1: 1 node(s), $13.12/endpoint-hour (GPU share $3.28/h); at max 2: 1 node(s), "
            "$13.12/endpoint-hour (GPU share $6.56/h)") in text


def test_cli_a_fixed_line_has_no_scaling_block(capsys) -> None:
    line = FIXTURE_CONFIG / "business-lines" / "research-reasoning.yaml"
    load_script("plan").main(["--business-line", str(line), "--prices", str(FIXTURE_PRICES), "--json"])
    assert json.loads(capsys.readouterr().out)["autoscaling"] is None


def test_cli_a_max_above_the_node_budget_answers_no(tmp_path, capsys) -> None:
    """max_replicas 3 does not fit (synthesis refuses it too): the planner says so and exits 1."""
    config = copy_example_config(tmp_path / "config")
    line = config / "business-lines" / f"{RAG}.yaml"
    edit_yaml(line, lambda d: d["autoscaling"].update(max_replicas=3))
    rc = load_script("plan").main(["--business-line", str(line), "--prices", str(FIXTURE_PRICES), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == cli.EXIT_NO
    assert out["autoscaling"]["most_replicas_that_fit"] == 2 and out["autoscaling"]["max_replicas_fits"] is False
    assert out["nodes"]["fits"] is False
    assert "rag-assistant 3 (autoscaling.max_replicas) x (1 GPU, 10 CPU, 80.00 GiB)" in out["nodes"]["problems"][0]
    # The same line fixed at 2 replicas fits and has no scaling block.
    edit_yaml(line, lambda d: set_fixed(d, replicas=2))
    assert load_script("plan").main(["--business-line", str(line), "--prices", str(FIXTURE_PRICES), "--json"]) \
        == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["autoscaling"] is None


def test_the_report_without_a_price_or_a_platform() -> None:
    free = Cost(nodes=2, price=None, cost_per_endpoint_hour=None, gpu_share_cost_per_hour=None)
    s = ScalingPlan(min_replicas=2, max_replicas=4, initial_replicas=2, most_that_fit=None, at_min=free, at_max=free)
    assert s.fits
    assert format_scaling(s, "ml.g6e.12xlarge") == [
        "autoscaling   2..4 replicas, starts at 2",
        "scaling cost  at min 2: 2 node(s), no price; at max 4: 2 node(s), no price"]

