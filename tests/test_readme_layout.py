"""The README's map of the repository stays true to the tree: its Layout table names every
top-level folder, "Tests and benchmarks" every test folder, the README every script, and the
diagram every platform stack."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from platform_config import load_project
from platform_config.stack_names import stack_ids
from tests.example_config import FIXTURE_CONFIG

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


#: Folders of a working copy that are not the project's (set-up, build output, caches).
_NOT_OURS = {".venv", "node_modules", "cdk.out", "dist", "__pycache__", ".pytest_cache"}


def _tracked() -> list[str]:
    """The repository's files: ``git ls-files``, or outside a git checkout every file but set-up and output."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return [p.relative_to(REPO).as_posix() for p in REPO.rglob("*")
                if p.is_file() and not _NOT_OURS.intersection(p.relative_to(REPO).parts)]


def test_layout_names_every_top_level_folder() -> None:
    folders = {path.split("/", 1)[0] for path in _tracked() if "/" in path and not path.startswith(".")}
    assert {"observability", "kv_tools", "k8s", "stacks", "tests"} <= folders  # the listing works
    layout = _section("Layout")
    missing = sorted(f for f in folders if f"`{f}/`" not in layout)
    assert not missing, f"README 'Layout' does not name {missing}"


def test_tests_section_names_every_test_folder() -> None:
    folders = {path.split("/")[1] for path in _tracked()
               if path.startswith("tests/") and path.count("/") >= 2 and re.search(r"/test_[^/]+\.py$", path)}
    assert {"observability", "properties", "tools"} <= folders
    section = _section("Tests and benchmarks")
    missing = sorted(f for f in folders if f"`tests/{f}`" not in section)
    assert not missing, f"README 'Tests and benchmarks' does not name {missing}"


def test_every_script_is_named_in_the_readme() -> None:
    scripts = sorted(Path(p).name for p in _tracked() if p.startswith("scripts/") and p.count("/") == 1)
    assert "orphans.py" in scripts and "stateful_snapshot.py" in scripts
    missing = [s for s in scripts if s not in README]
    assert not missing, f"README does not name {missing}"


def test_the_diagram_shows_every_platform_stack() -> None:
    diagram = README[README.index("```mermaid"):]
    diagram = diagram[:diagram.index("```", 3)]
    project = load_project(FIXTURE_CONFIG)
    platform_stacks = [name for role, name in stack_ids(project).items() if not role.startswith("line-")]
    assert f"{project.platform.project}-observability" in platform_stacks
    assert [s for s in platform_stacks if s not in diagram] == []


def test_terms_are_explained_near_the_top_and_primary_is_tied_to_its_kubernetes_names() -> None:
    """A newcomer meets "Primary", IRSA, KEDA, DCGM, AMP, serde and the ai-toolkit DaemonSet early;
    each has a one-entry explanation with a link, and the Primary entry gives the names kubectl
    commands and alerts use (taken from the code, so a rename fails here)."""
    from k8s.names import CURVINE_MASTER
    from observability.targets import JOB_CURVINE_MASTER

    assert README.index("\n## Terms used here\n") < README.index("\n## Layout\n")
    entries = [e for e in _section("Terms used here").split("\n- ")[1:]]
    by_term = {re.match(r"\*\*([^*]+)\*\*", e).group(1): " ".join(e.split()) for e in entries}
    for term in ("Curvine Primary", "IRSA", "KEDA", "DCGM", "AMP", "serde"):
        assert term in by_term and re.search(r"\]\((https://|docs/)", by_term[term]), term
    assert any("`ai-toolkit` DaemonSet" in e and "https://" in e for e in by_term.values())
    primary = by_term["Curvine Primary"]
    assert f"`{CURVINE_MASTER}`" in primary and f"`{JOB_CURVINE_MASTER}`" in primary
    assert "`app.kubernetes.io/component=master`" in primary and "KvCacheCurvinePrimaryDown" in primary
