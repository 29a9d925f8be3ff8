"""Numbers the example lines' comments state that the code computes are the code's (issue 27: the
comments said 22.1 CPU where the planner's budget was 20.58, and forgot Tiered Storage's share).

A line file whose comments say a node "has <X> CPU and <Y> GiB" for the lines' pods must give the
node budget :func:`platform_config.node_fit.node_budget` computes for the first instance group the
line schedules on, as ``scripts/plan.py --business-line`` prints it. A file without such a
sentence (a fork's own lines) is not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from platform_config import load_project
from platform_config.node_fit import cpu_text, gib_text, node_budget, schedulable_groups
from tests.example_config import FIXTURE_CONFIG, USER_CONFIG

BUDGET_SENTENCE = re.compile(r"has ([\d,.]+) CPU and ([\d,.]+ GiB)")
LINE_FILES = [(config, path) for config in (USER_CONFIG, FIXTURE_CONFIG)
              for path in sorted((config / "business-lines").glob("*.yaml"))]


def comment_text(path: Path) -> str:
    """The file's comments as one text (wrapped sentences joined)."""
    return " ".join(line.split("#", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines()
                    if "#" in line)


@pytest.mark.parametrize("config, path", LINE_FILES, ids=[f"{c.name}/{p.name}" for c, p in LINE_FILES])
def test_a_node_budget_in_a_comment_is_the_planners(config: Path, path: Path) -> None:
    stated = BUDGET_SENTENCE.findall(comment_text(path))
    if not stated:
        pytest.skip("no node budget stated in its comments")
    project = load_project(config)
    line = project.business_line(path.stem)
    group = schedulable_groups(project.platform, line.instance_type)[0]
    budget = node_budget(project.platform, group, project.business_lines)
    assert stated == [(cpu_text(budget.free_cpu_millicores), gib_text(budget.free_memory_bytes))]


def test_the_sentence_is_found_in_the_examples() -> None:
    """The check above can fail: the fixture's rag-assistant states its budget."""
    assert BUDGET_SENTENCE.findall(comment_text(FIXTURE_CONFIG / "business-lines" / "rag-assistant.yaml"))


@pytest.mark.parametrize("name", ["rag-assistant.yaml", "research-reasoning.yaml"])
def test_each_example_line_says_why_it_routes_as_it_does(name: str) -> None:
    """Issue 29: the comment above ``routing_strategy`` of each example line the repository ships says
    why, and points at docs/routing.md (a fork's own lines are its own business)."""
    path = USER_CONFIG / "business-lines" / name
    if not path.exists():
        pytest.skip(f"{name} is not in this checkout's config (a fork's own lines)")
    lines = path.read_text(encoding="utf-8").splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("routing_strategy:")]
    comment = []
    for line in reversed(lines[:at]):
        if not line.startswith("#"):
            break
        comment.insert(0, line.lstrip("# "))
    text = " ".join(comment)
    assert "docs/routing.md" in text and len(comment) >= 2, path.name


def test_no_example_line_hot_spots_prefixaware() -> None:
    """A line whose requests share a hot prefix sends them all to one replica under prefixaware."""
    project = load_project(USER_CONFIG)
    assert not [line.name for line in project.business_lines
                if line.routing_strategy == "prefixaware" and line.hot_prefixes.active]
    assert any(line.hot_prefixes.active for line in project.business_lines)  # the check has a case to see
