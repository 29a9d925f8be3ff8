"""Layers point one way (issue 18, issue 28): every import between the project's packages goes down.

Layers, bottom first (STYLE, "Layers and the front door", "Agents and tools are different programs")::

    platform_config                     config models, loader, the facts its checks need
    imports                             classes generated from the InferenceEndpointConfig CRD
    cluster_agents                      the in-cluster agents: the L2 janitor (with the hot-prefix warmer),
                                        the L2 mount watchdog, the cross-pod hit canary and their
                                        agent_core.py; standard library only (shipped in ConfigMaps)
    vllm_plugins                        code vLLM loads inside its own process (the L2 gate connector);
                                        shipped in ConfigMaps like the agents, imports nothing of the project
    capacity                            model facts, GPU memory, node fit, TTFT, cost: the planner, and
                                        the config checks that need it (every command loads through them)
    kv_constructs                       our CDK constructs
    k8s                                 cdk8s charts (they ship the agents' source: an import downward)
    observability                       metrics, dashboards, alerts
    operator_tools                      the tools an operator runs from a laptop or CI
    stacks                              the CDK stacks
    app.py, scripts/                    entry points

Every ``import`` counts, at module level, inside a function or under ``TYPE_CHECKING``, and so does
``importlib.import_module("...")`` with a literal name. The agents import nothing of the project but
each other (a ConfigMap ships only standard-library code): ``tests/k8s/test_k8s_agents.py`` checks
the standard-library part on what the ConfigMaps ship.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Unit -> the units it may import. A unit is a top-level package.
ALLOWED: dict[str, set[str]] = {
    "platform_config": set(),
    "imports": set(),
    "cluster_agents": set(),
    "vllm_plugins": set(),
    "capacity": {"platform_config"},
    "kv_constructs": {"platform_config"},
    "k8s": {"platform_config", "imports", "cluster_agents", "vllm_plugins"},
    "observability": {"platform_config", "k8s", "cluster_agents"},
    "operator_tools": {"platform_config", "capacity", "k8s", "observability", "cluster_agents"},
    "stacks": {"platform_config", "imports", "kv_constructs", "k8s", "observability", "cluster_agents"},
}
UNITS = {*ALLOWED, "scripts", "app", "tests", "tests_lmcache"}
TOP = {"app", "scripts"}

#: Imports still to remove, each with who removes it; the test fails once one is gone, so the
#: entry goes with it. None left.
PENDING: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str | None:
    """The unit a dotted module name belongs to, or None for a module outside the project."""
    top = module.split(".")[0]
    return top if top in UNITS else None


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the statement is (functions, ``TYPE_CHECKING``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # "from cluster_agents import l2_janitor" is the agents; "from k8s import names" is k8s.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return found


def _sources() -> dict[str, list[Path]]:
    by_unit: dict[str, list[Path]] = {}
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[0] in (".venv", ".venv-lmcache", "node_modules", "cdk.out", "dist") or "__pycache__" in rel.parts:
            continue
        unit = _unit(".".join(rel.with_suffix("").parts))
        if unit is not None:
            by_unit.setdefault(unit, []).append(path)
    return by_unit


SOURCES = _sources()


def _edges() -> list[tuple[str, str, str]]:
    """(file, its unit, the unit it imports) for every import between two units."""
    edges = []
    for unit, paths in SOURCES.items():
        for path in paths:
            for module in _imports(path):
                target = _unit(module)
                if target is not None and target != unit:
                    edges.append((path.relative_to(REPO).as_posix(), unit, target))
    return edges


EDGES = _edges()


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_each_unit_imports_only_the_layers_below_it(unit: str) -> None:
    assert SOURCES.get(unit), f"no source files found for {unit}"  # the scan sees the package
    wrong = sorted({(path, target) for path, source, target in EDGES
                    if source == unit and target not in ALLOWED[unit] and (path, target) not in PENDING})
    assert not wrong, f"{unit} imports a layer above it or beside it: {wrong}"


def test_the_bottom_layer_imports_nothing_of_the_project() -> None:
    """The issue's own words: nothing under platform_config/ imports k8s, the tools, observability,
    stacks or kv_constructs, not even inside a function."""
    upward = sorted({(path, target) for path, source, target in EDGES if source == "platform_config"})
    assert upward == sorted(PENDING), upward


def test_each_pending_import_is_still_there() -> None:
    """A pending entry whose import is gone must be deleted from :data:`PENDING` (so the rule is whole again)."""
    present = {(path, target) for path, _source, target in EDGES}
    assert not set(PENDING) - present, f"gone, remove from PENDING: {sorted(set(PENDING) - present)}"


def test_the_allowed_imports_form_no_cycle() -> None:
    """The rule itself points one way: following the allowed imports never leads back."""
    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in ALLOWED[start])

    assert [unit for unit in ALLOWED if reaches(unit, unit)] == []


def test_nothing_imports_an_entry_point() -> None:
    below_top = sorted((path, target) for path, source, target in EDGES if target in TOP and source not in TOP | {"tests"})
    assert not below_top


def test_the_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check is not fooled by the import-inside-a-function trick the layers used to need."""
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from k8s import names\n"
                      "def f():\n    from capacity.planner import plan\n    import observability.metrics\n"
                      "    importlib.import_module('stacks')\n")
    assert {"k8s.names", "capacity.planner.plan", "observability.metrics", "stacks"} <= _imports(module)


def test_every_command_loads_the_config_with_every_check() -> None:
    """``platform_config.load_project`` alone leaves the planner's fit out: app.py and every script load
    through ``capacity.project_checks.load_checked_project`` (``operator_tools.cli.load_config``)."""
    commands = [REPO / "app.py", *sorted((REPO / "scripts").glob("*.py")), *sorted((REPO / "scripts").glob("*.sh"))]
    unchecked = [path.name for path in commands if "load_project(" in path.read_text(encoding="utf-8")]
    assert not unchecked, f"load through operator_tools.cli.load_config instead: {unchecked}"
    loading = [path.name for path in commands
               if "load_checked_project" in (text := path.read_text(encoding="utf-8")) or "load_config(" in text]
    assert {"app.py", "manifests.py", "verify.py", "preflight.py", "orphans.py", "stateful_snapshot.py",
            "patch_endpoint.sh"} <= set(loading)
