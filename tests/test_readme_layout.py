"""The README is the front door (issue 18) and stays true: at most 400 lines, the two commands
first, a first-deploy checklist whose fields exist, every relative link and anchor of the README
and the docs resolving, every doc linked from the README; its Layout table names every top-level
folder, the README every script, the diagram every platform stack; the docs' test section every
test folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from platform_config import BusinessLineConfig, PlatformConfig, load_project
from platform_config.stack_names import stack_ids
from tests.example_config import FIXTURE_CONFIG

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = sorted((REPO / "docs").glob("*.md"))
#: Where each section of the 1,522-line README went (issue 18): the heading, still recognisable there.
MOVED = {
    "Deploy": "docs/deploy.md", "Before the first deploy": "docs/deploy.md",
    "HyperPod dependency chart": "docs/deploy.md", "Deploy all, deploy one line, tear down": "docs/deploy.md",
    "Replacing a stateful resource": "docs/deploy.md", "Add a business line": "docs/deploy.md",
    "Lifecycle scripts": "docs/deploy.md",
    "The L2 tier and the patched endpoints": "docs/l2-cache.md",
    "Operator tools": "docs/operator-tools.md",
    "Observability": "docs/observability.md", "The collection path, and why this one": "docs/observability.md",
    "Open the dashboards": "docs/observability.md", "What each panel means": "docs/observability.md",
    "Alerts, and what to do when one fires": "docs/observability.md", "Every metric name is real": "docs/observability.md",
    "Security baseline": "docs/security.md",
    "CI/CD": "docs/ci-and-tests.md", "Tests and benchmarks": "docs/ci-and-tests.md",
    "The real-LMCache tier": "docs/ci-and-tests.md",
    "Configuration reference": "docs/configuration.md",
}


def _section(title: str, text: str = README) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _outside_code(text: str) -> str:
    """``text`` without its fenced code blocks (a ``# comment`` in bash is not a heading)."""
    return re.sub(r"(?ms)^```.*?^```", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped (not ``-`` or ``_``), spaces to ``-``."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown document, duplicates numbered as GitHub does (``-1``, ...)."""
    seen: dict[str, int] = {}
    anchors = set()
    for match in re.finditer(r"(?m)^#{1,6} +(.+?) *#*$", _outside_code(text)):
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


def _links(text: str) -> list[str]:
    """The targets of ``[text](target)`` links outside code (fenced or inline)."""
    return re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]*`", "", _outside_code(text)))


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


# --- the front door ------------------------------------------------------------------------------

def test_the_readme_is_an_entry_point_of_at_most_400_lines() -> None:
    assert len(README.splitlines()) <= 400
    assert README.index("\n## The two commands\n") < README.index("\n## First-deploy checklist\n") \
        < README.index("\n## Documentation\n")


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    """First the main job (synthesis of the example config), then the tests: the commands CI runs."""
    block = _section("The two commands").split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["make synth", "make test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"(?m)^make test$", ci)


def test_every_doc_is_linked_from_the_readme_with_a_line_saying_what_is_in_it() -> None:
    table = _section("Documentation")
    for doc in DOCS:
        rel = doc.relative_to(REPO).as_posix()
        assert re.search(rf"(?m)^\| \[{re.escape(rel)}\]\({re.escape(rel)}\) \| \S", table), rel
    for topic in ("configuration", "deploy", "l2-cache", "operator-tools", "observability", "security",
                  "ci-and-tests", "troubleshooting"):
        assert (REPO / "docs" / f"{topic}.md").is_file(), topic


@pytest.mark.parametrize("document", [REPO / "README.md", *DOCS], ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    broken = []
    for link in _links(text):
        if re.match(r"^[a-z]+:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (document.parent / target).resolve() if target else document
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text(encoding="utf-8")):
            broken.append(link)
    assert not broken, f"{document.name}: {broken}"


def test_the_checklist_names_fields_that_exist() -> None:
    """A renamed key fails here, not in a newcomer's first hour."""
    checklist = _section("First-deploy checklist")
    platform_part = checklist.split("**2. Edit `config/platform.yaml`**", 1)[1].split("**3.", 1)[0]
    lines_part = checklist.split("**3. Edit `config/business-lines/`**", 1)[1].split("**4.", 1)[0]
    for text, model in ((platform_part, PlatformConfig), (lines_part, BusinessLineConfig)):
        names = [n for n in re.findall(r"`([a-z_][a-z0-9_.]*)`", text) if "/" not in n]
        assert names
        for name in names:
            assert _field_exists(model, name), f"{model.__name__} has no field {name}"
    for field in ("account", "region", "availability_zones", "eks.admin_principal_arns", "instance_count",
                  "model.source"):
        assert f"`{field}`" in checklist, field


def _field_exists(model: type, dotted: str) -> bool:
    """``dotted`` is a field path of ``model``, or the field of a nested model or list item reached from it."""
    from typing import get_args

    from pydantic import BaseModel

    def models_in(annotation: object) -> list[type]:
        found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
        for arg in get_args(annotation):
            found += models_in(arg)
        return found

    def walk(current: list[type], parts: list[str]) -> bool:
        if not parts:
            return True
        for m in current:
            info = m.model_fields.get(parts[0]) or next(
                (f for f in m.model_fields.values() if f.alias == parts[0]), None)
            if info is not None and walk(models_in(info.annotation), parts[1:]):
                return True
        return False

    everything: list[type] = []
    stack = [model]
    while stack:  # a bare field name may belong to any model reachable from the root (instance_count)
        m = stack.pop()
        if m not in everything:
            everything.append(m)
            for info in m.model_fields.values():
                stack += models_in(info.annotation)
    parts = dotted.split(".")
    return walk([model], parts) or (len(parts) == 1 and walk(everything, parts)) or walk(everything, parts)


def test_every_section_that_left_the_readme_is_in_its_doc() -> None:
    for heading, doc in MOVED.items():
        text = _outside_code((REPO / doc).read_text(encoding="utf-8"))
        assert re.search(rf"(?m)^#+ {re.escape(heading)}$", text), (heading, doc)
        assert not re.search(rf"(?m)^#+ {re.escape(heading)}$", _outside_code(README)), heading


# --- the map stays true to the tree ------------------------------------------------------------

def test_layout_names_every_top_level_folder() -> None:
    folders = {path.split("/", 1)[0] for path in _tracked() if "/" in path and not path.startswith(".")}
    assert {"observability", "cluster_agents", "capacity", "operator_tools", "k8s", "stacks", "tests"} <= folders  # the listing works
    layout = _section("Layout")
    missing = sorted(f for f in folders if f"`{f}/`" not in layout)
    assert not missing, f"README 'Layout' does not name {missing}"


def test_tests_section_names_every_test_folder() -> None:
    folders = {path.split("/")[1] for path in _tracked()
               if path.startswith("tests/") and path.count("/") >= 2 and re.search(r"/test_[^/]+\.py$", path)}
    assert {"observability", "properties", "tools"} <= folders
    section = _section("Tests and benchmarks", (REPO / "docs" / "ci-and-tests.md").read_text())
    missing = sorted(f for f in folders if f"`tests/{f}`" not in section)
    assert not missing, f"docs/ci-and-tests.md 'Tests and benchmarks' does not name {missing}"


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


def test_the_link_checker_sees_a_broken_anchor() -> None:
    """The anchor rule is GitHub's, duplicates numbered; a wrong one is caught."""
    text = "# Operator tools\n## Operator tools\n## Planner: `scripts/plan.py`\n```\n# not a heading\n```\n"
    assert _anchors(text) == {"operator-tools", "operator-tools-1", "planner-scriptsplanpy"}
