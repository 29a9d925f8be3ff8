"""The users' GitHub Actions workflow: tests before deploys, platform before lines, approval, OIDC,
region from config/, caches, a pull request's `cdk diff`, per-line opt-out, orphan removal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from platform_config import load_project
from platform_config.stack_names import stack_ids
from tests.example_config import FIXTURE_CONFIG, REPO

WORKFLOW = REPO / ".github" / "workflows" / "platform.yml"
AWS_JOBS = ("deploy-platform", "deploy-line", "remove-orphans")
DEPLOY_JOBS = ("deploy-platform", "deploy-line", "remove-orphans")


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def jobs() -> dict:
    return workflow()["jobs"]


def steps_using(job: dict, action: str) -> list[dict]:
    return [s for s in job["steps"] if s.get("uses", "").startswith(action + "@")]


def needs(job: dict) -> list[str]:
    return [job["needs"]] if isinstance(job["needs"], str) else job["needs"]


def test_test_job_runs_make_test_and_make_synth() -> None:
    runs = [step.get("run", "") for step in jobs()["test"]["steps"]]
    assert "make test" in runs and "make synth" in runs
    assert runs.index("make test") < runs.index("make synth")


def test_deploys_need_tests_approval_and_oidc() -> None:
    all_jobs = jobs()
    for name in DEPLOY_JOBS:
        job = all_jobs[name]
        assert "test" in needs(job), name
        assert job["environment"] == "production", name
        assert job["permissions"]["id-token"] == "write", name
        (assume,) = steps_using(job, "aws-actions/configure-aws-credentials")
        assert assume["with"]["role-to-assume"] == "${{ vars.AWS_DEPLOY_ROLE_ARN }}", name
        assert all("aws-secret-access-key" not in s.get("with", {}) for s in job["steps"]), name


def test_region_comes_from_config_not_a_second_variable() -> None:
    assert "AWS_REGION" not in WORKFLOW.read_text()
    all_jobs = jobs()
    for name in AWS_JOBS:
        (assume,) = steps_using(all_jobs[name], "aws-actions/configure-aws-credentials")
        assert assume["with"]["aws-region"] == "${{ needs.test.outputs.region }}", name
    assert all_jobs["test"]["outputs"]["region"] == "${{ steps.plan.outputs.region }}"


def test_header_says_the_deploy_role_must_assume_the_bootstrap_roles() -> None:
    header = WORKFLOW.read_text().split("\nname:", 1)[0]
    assert "sts:AssumeRole on arn:aws:iam::<account>:role/cdk-hnb659fds-*-<account>-<region>" in header
    assert "deploy, file-publishing, image-publishing, lookup" in header


def test_pip_and_npm_are_cached() -> None:
    for name, job in jobs().items():
        for step in steps_using(job, "actions/setup-python"):
            # requirements*: the .txt files and the hash-checked .lock files installed from them.
            assert step["with"]["cache"] == "pip" and step["with"]["cache-dependency-path"] == "requirements*", name
        for step in steps_using(job, "actions/setup-node"):
            assert step["with"]["cache"] == "npm", name
    assert (REPO / "package-lock.json").is_file()  # what the npm cache is keyed on


def test_pull_requests_get_cdk_diff_as_job_summary_without_any_aws_role() -> None:
    """Issue 25 item 8: a pull request's author edits the workflow file its jobs run, so a role a pull
    request may assume is theirs. The diff job gets no OIDC token and no AWS credentials; it compares
    the tested assembly with the base branch's, synthesized offline."""
    diff = jobs()["diff"]
    assert needs(diff) == ["test"] and "environment" not in diff  # a diff changes nothing: no approval
    assert diff["if"] == "github.event_name == 'pull_request'"
    assert diff["permissions"] == {"contents": "read"}  # no id-token: no OIDC federation possible
    assert not steps_using(diff, "aws-actions/configure-aws-credentials")
    text = WORKFLOW.read_text()
    assert "AWS_DIFF_ROLE_ARN }}" not in text and ":pull_request) that may assume" not in text
    base = [s for s in steps_using(diff, "actions/checkout") if s.get("with", {}).get("path") == "base"]
    assert [s["with"]["ref"] for s in base] == ["${{ github.event.pull_request.base.sha }}"]
    (synth,) = [s for s in diff["steps"] if s.get("run") == "make synth"]
    assert synth["working-directory"] == "base"
    (run,) = [s["run"] for s in diff["steps"] if "diff_assemblies.py" in s.get("run", "")]
    assert "python3 scripts/diff_assemblies.py --base base/cdk.out --head cdk.out" in run
    assert '>> "$GITHUB_STEP_SUMMARY"' in run
    assert any(s.get("with", {}).get("name") == "cdk-out" for s in steps_using(diff, "actions/download-artifact"))


def test_only_deploy_jobs_may_ask_for_an_oidc_token() -> None:
    """Every job that can get AWS credentials runs on main behind the production environment."""
    for name, job in jobs().items():
        if (job.get("permissions") or {}).get("id-token") == "write":
            assert name in DEPLOY_JOBS and job["environment"] == "production", name
    assert workflow()["permissions"] == {"contents": "read"}
    header = WORKFLOW.read_text().split("\nname:", 1)[0]
    assert "allow `main` only" in header


def test_every_action_is_pinned_by_commit_sha_with_its_tag_beside_it() -> None:
    """A tag can be moved to other code; a commit cannot (issue 25, low). The comment keeps the
    version readable for updates (Dependabot reads it too)."""
    uses = [line.strip() for line in WORKFLOW.read_text().splitlines() if re.match(r"\s*(- )?uses:", line)]
    assert uses
    for line in uses:
        assert re.fullmatch(r"(- )?uses: [\w.-]+/[\w./-]+@[0-9a-f]{40}  # v\d+(\.\d+)*", line), line


def _assembly(path: Path, stacks: dict[str, dict]) -> Path:
    """A minimal cloud assembly: manifest.json and one template per stack."""
    path.mkdir(parents=True)
    artifacts = {}
    for name, template in stacks.items():
        (path / f"{name}.template.json").write_text(json.dumps(template))
        artifacts[name] = {"type": "aws:cloudformation:stack", "environment": "aws://111122223333/us-west-2",
                           "properties": {"templateFile": f"{name}.template.json"}, "displayName": name}
    (path / "manifest.json").write_text(json.dumps({"version": "36.0.0", "artifacts": artifacts}))
    return path


def _topics(*names: str) -> dict:
    return {"Resources": {n: {"Type": "AWS::SNS::Topic", "Properties": {"DisplayName": n}} for n in names}}


def test_the_offline_diff_runs_the_pinned_cli_with_no_credentials(tmp_path) -> None:
    """scripts/diff_assemblies.py with the real CDK CLI, every AWS variable removed and no config."""
    cli = REPO / "node_modules" / ".bin" / "cdk"
    if not cli.exists():
        pytest.skip("node_modules/.bin/cdk is missing (make setup)")
    base = _assembly(tmp_path / "base", {"kept": _topics("A"), "gone": _topics("B")})
    head = _assembly(tmp_path / "head", {"kept": _topics("A", "C"), "added": _topics("D")})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "diff_assemblies.py"), "--base", str(base),
                             "--head", str(head), "--cdk", str(cli)], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Stack kept" in out and "[+] AWS::SNS::Topic C" in out and "Topic A" not in out
    assert "Stack added\n[+] new stack" in out and "Stack gone\n[-] removed" in out
    missing = subprocess.run([sys.executable, str(REPO / "scripts" / "diff_assemblies.py"), "--base",
                              str(tmp_path / "nothing"), "--head", str(head)], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and missing.stderr.startswith("error:")


def test_lines_deploy_after_the_platform_one_job_per_business_line() -> None:
    line = jobs()["deploy-line"]
    assert "deploy-platform" in line["needs"]
    assert line["strategy"]["matrix"]["line"] == "${{ fromJSON(needs.test.outputs.lines) }}"
    assert line["strategy"]["fail-fast"] is False
    (deploy,) = [s for s in line["steps"] if "cdk deploy" in s.get("run", "")]
    assert "--exclusively" in deploy["run"] and deploy["env"]["STACK"] == "${{ matrix.line.stack }}"


def _plan_script() -> str:
    (step,) = [s for s in jobs()["test"]["steps"] if s.get("id") == "plan"]
    return re.search(r"<<'EOF'[^\n]*\n(.*?)\n\s*EOF\s*$", step["run"], re.S).group(1)


def test_plan_step_deploys_only_lines_with_deploy_true(tmp_path) -> None:
    """Run the workflow's own plan script on the fixture config: ticket-triage has deploy: false."""
    project = load_project(FIXTURE_CONFIG)
    assert [l.name for l in project.business_lines if not l.deploy] == ["ticket-triage"]
    summary = tmp_path / "summary.md"
    result = subprocess.run([sys.executable, "-c", _plan_script()], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "KVCACHE_CONFIG_DIR": str(FIXTURE_CONFIG),
                                 "GITHUB_STEP_SUMMARY": str(summary)}, timeout=120)
    assert result.returncode == 0, result.stderr
    outputs = dict(line.split("=", 1) for line in result.stdout.splitlines())
    ids = stack_ids(project)
    assert outputs["region"] == "us-west-2" and outputs["account"] == "111122223333"
    assert outputs["platform_stacks"].split() == [ids[r] for r in ("network", "eks", "hyperpod", "addons", "l2-cache",
                                                                   "observability")]
    assert json.loads(outputs["lines"]) == [{"name": n, "stack": ids[f"line-{n}"]}
                                            for n in ("legal-search", "rag-assistant", "research-reasoning")]
    assert "Kept out (`deploy: false`): `ticket-triage`" in summary.read_text()
    # What the dependency-chart guard of the platform job reads (the fixture installs the chart by hand).
    assert outputs["hyperpod_stack"] == ids["hyperpod"] and outputs["chart_preinstalled"] == "true"
    assert outputs["stacks_before_hyperpod"].split() == [ids["network"], ids["eks"]]
    assert set(jobs()["test"]["outputs"]) >= {"hyperpod_stack", "stacks_before_hyperpod", "chart_preinstalled"}


def test_platform_deploy_checks_the_account_and_deploys_the_planned_stacks() -> None:
    job = jobs()["deploy-platform"]
    runs = [s.get("run", "") for s in job["steps"]]
    assert any("aws sts get-caller-identity" in r and "$ACCOUNT" in r for r in runs)
    first, rest = [s for s in job["steps"] if "cdk deploy --app cdk.out" in s.get("run", "")]
    assert first["env"]["STACKS"] == "${{ needs.test.outputs.stacks_before_hyperpod }}"
    assert rest["env"]["STACKS"] == "${{ needs.test.outputs.stacks_from_hyperpod }}"
    assert all("--exclusively $STACKS" in s["run"] for s in (first, rest))


def test_orphaned_line_stacks_are_listed_then_destroyed_behind_the_approval() -> None:
    job = jobs()["remove-orphans"]
    assert set(needs(job)) == {"test", "deploy-platform", "deploy-line"}  # after the lines: renames swap safely
    assert "!cancelled()" in job["if"] and "needs.deploy-platform.result == 'success'" in job["if"]
    listing, destroy = [s for s in job["steps"] if "scripts/orphans.py" in s.get("run", "")]
    assert "--destroy" not in listing["run"] and "GITHUB_STEP_SUMMARY" in listing["run"]
    assert destroy["run"].endswith("scripts/orphans.py --destroy --yes")
    assert destroy["if"] == f"steps.{listing['id']}.outputs.found == 'true'"


@pytest.mark.parametrize("rc, found, step_ok", [(0, "false", True), (1, "true", True), (2, "false", False)])
def test_orphan_listing_step_maps_exit_codes(tmp_path, rc, found, step_ok) -> None:
    """The listing step's shell, with orphans.py replaced by a stub exiting ``rc``."""
    job = jobs()["remove-orphans"]
    (listing,) = [s for s in job["steps"] if s.get("id") == "list"]
    stub = tmp_path / "stub.py"
    stub.write_text(f"import sys\nprint('table')\nsys.exit({rc})\n")
    script = listing["run"].replace(".venv/bin/python scripts/orphans.py", f"{sys.executable} {stub}")
    out, summary = tmp_path / "out", tmp_path / "summary"
    result = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)})
    assert (result.returncode == 0) is step_ok
    assert out.read_text().strip() == f"found={found}"
    assert "table" in summary.read_text()


def test_actions_are_pinned_to_exact_versions() -> None:
    """By commit, and the tag in the comment names an exact release (vX.Y.Z), never a moving major."""
    tags = re.findall(r"uses: \S+@[0-9a-f]{40}  # (\S+)", WORKFLOW.read_text())
    steps = [step for job in jobs().values() for step in job["steps"] if "uses" in step]
    assert len(tags) == len(steps)
    for step, tag in zip(steps, tags):
        assert re.fullmatch(r"[0-9a-f]{40}", step["uses"].split("@", 1)[1]), step["uses"]
        assert tag.count(".") == 2, step["uses"]


def test_ci_uses_the_documented_node_version() -> None:
    """README: Node.js 22 LTS or newer (jsii no longer supports 20)."""
    assert "**Node.js 22 LTS or newer**" in (REPO / "README.md").read_text()
    versions = {s["with"]["node-version"] for job in jobs().values() for s in steps_using(job, "actions/setup-node")}
    assert versions and all(int(v) >= 22 and int(v) % 2 == 0 for v in versions)  # even majors are the LTS lines


def _step_index(job: dict, text: str) -> int:
    (index,) = [i for i, s in enumerate(job["steps"]) if text in s.get("run", "")]
    return index


#: The full preflight of the platform job (the "hyperpod update" check alone runs again later).
PREFLIGHT = "scripts/preflight.py --config config --cloud-assembly cdk.out | tee preflight.txt"


def _first_deploy(job: dict) -> int:
    return min(i for i, s in enumerate(job["steps"]) if "cdk deploy --app cdk.out" in s.get("run", ""))


def test_platform_deploy_runs_the_preflight_before_any_stack_changes() -> None:
    """A key the add-on does not know (or any failed check) stops the pipeline before `cdk deploy`,
    not at CreateAddon after the network, eks and hyperpod stacks are up."""
    job = jobs()["deploy-platform"]
    preflight = _step_index(job, PREFLIGHT)
    step = job["steps"][preflight]
    assert ".venv/bin/python scripts/preflight.py --config config --cloud-assembly cdk.out" in step["run"]
    assert "continue-on-error" not in step and "if" not in step
    assert _step_index(job, "aws sts get-caller-identity") < preflight < _first_deploy(job)
    assert _step_index(job, "pip install --quiet --require-hashes -r requirements.lock") < preflight
    # The line jobs and the orphan removal come after the platform job, so they are stopped too.
    assert "deploy-platform" in needs(jobs()["deploy-line"]) and "deploy-platform" in needs(jobs()["remove-orphans"])


def run_with_stub_preflight(step: dict, tmp_path: Path, output: str,
                            rc: int) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``step``'s shell as the runner does (bash -eo pipefail) with ``scripts/preflight.py``
    replaced by a stub that prints ``output`` and exits ``rc``; (the result, the job summary it wrote)."""
    stub = tmp_path / "stub.py"
    stub.write_text(f"import sys\nprint({output!r})\nsys.exit({rc})\n")
    script = step["run"].replace(".venv/bin/python scripts/preflight.py", f"{sys.executable} {stub}")
    summary = tmp_path / "summary"
    result = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)})
    return result, summary.read_text()


@pytest.mark.parametrize("rc, step_ok", [(0, True), (1, False), (2, False)])
def test_preflight_step_fails_on_any_failed_check_and_shows_the_table(tmp_path, rc, step_ok) -> None:
    """The step's shell, with preflight.py replaced by a stub exiting ``rc``."""
    step = jobs()["deploy-platform"]["steps"][_step_index(jobs()["deploy-platform"], PREFLIGHT)]
    result, summary = run_with_stub_preflight(step, tmp_path, "FAIL  add-on x configuration  schema lacks y", rc)
    assert (result.returncode == 0) is step_ok
    assert "schema lacks y" in summary


def test_header_names_the_permissions_the_preflight_needs() -> None:
    """The deploy role runs the preflight: the header lists the calls docs/operator-tools.md lists
    for it (which tests/tools/test_cli.py records from the code)."""
    header = " ".join(WORKFLOW.read_text().split("\nname:", 1)[0].replace("#", " ").split())
    doc = (REPO / "docs" / "operator-tools.md").read_text()
    (row,) = [line for line in doc.splitlines() if line.startswith("| `scripts/preflight.py` | `sts:")]
    actions = set(re.findall(r"`([a-z0-9]+:[A-Za-z]+)`", row)) - {"sts:GetCallerIdentity"}  # allowed to all
    assert actions and all(action in header for action in actions), actions


def _snapshot_step() -> dict:
    job = jobs()["test"]
    return job["steps"][_step_index(job, "scripts/stateful_snapshot.py")]


def test_test_job_checks_your_config_against_your_committed_snapshot() -> None:
    """`make test` guards the fixture config; the pipeline also guards config/ with the committed
    stateful-resources.json, the script's own defaults, before any deploy job (they need `test`)."""
    from tests.tools.script_loader import load_script

    script = load_script("stateful_snapshot")
    defaults = script.build_parser().parse_args([])
    run = _snapshot_step()["run"]
    assert defaults.config is None  # then $KVCACHE_CONFIG_DIR, else DEFAULT_CONFIG, like every command
    assert f"scripts/stateful_snapshot.py --config {script.DEFAULT_CONFIG} --snapshot {defaults.snapshot}" in run
    assert f"[ ! -f {defaults.snapshot} ]" in run
    job = jobs()["test"]
    assert _step_index(job, "make test") < _step_index(job, "scripts/stateful_snapshot.py")
    assert all("test" in needs(jobs()[name]) for name in DEPLOY_JOBS)


@pytest.mark.parametrize("committed, rc, step_ok", [(False, None, True), (True, 0, True), (True, 1, False),
                                                    (True, 2, False)])
def test_snapshot_step_runs_whenever_the_snapshot_is_committed(tmp_path, committed, rc, step_ok) -> None:
    """The step's shell, with the script replaced by a stub exiting ``rc``."""
    stub = tmp_path / "stub.py"
    stub.write_text(f"import sys\nprint('EKS cluster kvcache-eks/EksCluster: Name changes')\nsys.exit({rc})\n")
    if committed:
        (tmp_path / "stateful-resources.json").write_text("{}")
    script = _snapshot_step()["run"].replace(".venv/bin/python scripts/stateful_snapshot.py --config",
                                             f"{sys.executable} {stub} --config")
    summary = tmp_path / "summary"
    result = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)})
    assert (result.returncode == 0) is step_ok
    text = summary.read_text()
    if committed:
        assert "Name changes" in text
    else:  # said out loud: the job summary and a warning annotation name the command that records it
        assert "not committed" in text and "scripts/stateful_snapshot.py --write" in text
        assert result.stdout.startswith("::warning::")


# --- The real-LMCache tier in the fork's pipeline ------------------------------------------------


def _relevant_pattern() -> str:
    job = jobs()["lmcache"]
    (step,) = [s for s in job["steps"] if s.get("id") == "changes"]
    return re.search(r"relevant='([^']+)'", step["run"]).group(1)


def _first_party_closure(start: list) -> set[str]:
    """Repository files (posix, relative) that ``start``'s modules import, transitively (AST, no import)."""
    import ast

    seen: set[str] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        rel = path.relative_to(REPO).as_posix()
        if rel in seen:
            continue
        seen.add(rel)
        package = path.parent.relative_to(REPO).parts
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = list(package[:len(package) - node.level + 1]) if node.level else []
                module = base + (node.module.split(".") if node.module else [])
                names = [".".join(module)] + [".".join(module + [alias.name]) for alias in node.names]
            else:
                continue
            for name in filter(None, names):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = REPO.joinpath(*parts[:i])
                    for candidate in (target / "__init__.py", target.with_suffix(".py")):
                        if candidate.is_file():
                            todo.append(candidate)
    return seen


def test_lmcache_tier_runs_on_pull_requests_that_touch_what_it_reads() -> None:
    """Every repository file the tier's modules import (transitively), and its non-Python inputs,
    match the workflow's pattern: a pull request that changes any of them runs the tier."""
    pattern = re.compile(_relevant_pattern())
    closure = _first_party_closure(sorted((REPO / "tests_lmcache").glob("*.py")))
    assert {"k8s/render.py", "platform_config/line_models.py", "tests/k8s/kyverno_eval.py"} <= closure  # the walk works
    # scripts/jsii_node.sh: the Node.js command jsii runs for the charts (platform_config/runtime.py).
    inputs = {"requirements-lmcache.txt", "constraints-lmcache.txt", "requirements.txt", "requirements-dev.lock",
              "Makefile",
              "scripts/jsii_node.sh",
              "package-lock.json", "tests/fixtures/config/platform.yaml",
              "tests/fixtures/config/business-lines/rag-assistant.yaml"}
    missed = sorted(path for path in closure | inputs if not pattern.match(path))
    assert not missed, f"a change to these would not run the real-LMCache tier: {missed}"
    assert not pattern.match("README.md") and not pattern.match("stacks/network_stack.py")


@pytest.mark.parametrize("event, changed, run", [
    ("pull_request", "README.md", "false"),
    ("pull_request", "requirements-lmcache.txt", "true"),
    ("pull_request", "k8s/lmcache.py", "true"),
    ("push", "README.md", "true"),
    ("workflow_dispatch", "README.md", "true"),
])
def test_lmcache_change_detection_step(tmp_path, event, changed, run) -> None:
    """The step's shell in a scratch repository whose last commit changes ``changed``."""
    (step,) = [s for s in jobs()["lmcache"]["steps"] if s.get("id") == "changes"]
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "base.txt").write_text("base")
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    (tmp_path / changed).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / changed).write_text("changed")
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "change"], cwd=tmp_path, check=True)
    out, summary = tmp_path / "out", tmp_path / "summary"
    result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=tmp_path,
                            capture_output=True, text=True,
                            env={**os.environ, "EVENT": event, "GITHUB_OUTPUT": str(out),
                                 "GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 0, result.stderr
    assert out.read_text() == f"run={run}\n"
    assert ("run" if run == "true" else "skipped") in summary.read_text()


def test_lmcache_job_caches_its_venv_and_runs_make_test_lmcache() -> None:
    job = jobs()["lmcache"]
    gated = "steps.changes.outputs.run == 'true'"
    heavy = [s for s in job["steps"] if s.get("id") != "changes" and "actions/checkout" not in s.get("uses", "")]
    assert heavy and all(s.get("if", "").startswith(gated) for s in heavy)
    (cache,) = steps_using(job, "actions/cache")
    assert cache["with"]["path"] == ".venv-lmcache"
    key = cache["with"]["key"]
    assert "hashFiles('requirements-lmcache.txt', 'constraints-lmcache.txt')" in key
    assert "steps.python.outputs.python-version" in key  # a venv's interpreter link is version-exact
    (touch,) = [s for s in job["steps"] if "touch .venv-lmcache/.installed" in s.get("run", "")]
    assert "steps.venv.outputs.cache-hit == 'true'" in touch["if"]
    # The Makefile's marker rule, which the touch satisfies: same target, same prerequisites as the key.
    makefile = (REPO / "Makefile").read_text()
    assert "$(LMCACHE_VENV)/.installed: requirements-lmcache.txt constraints-lmcache.txt" in makefile
    assert job["steps"][-1]["run"] == "make test-lmcache"
    assert "download.pytorch.org/whl/cpu" in job["env"]["TORCH_PIP_ARGS"]
    assert job["steps"][0]["with"]["fetch-depth"] == 2
    # Deploys wait for it: a broken L2 env is not deployed.
    assert "lmcache" in needs(jobs()["deploy-platform"])


# --- The HyperPod dependency chart before the first HyperPod deploy (polish-docs item 2) ----------


def _chart_step() -> dict:
    job = jobs()["deploy-platform"]
    return job["steps"][_step_index(job, "aws cloudformation describe-stacks")]


def test_the_chart_guard_runs_before_any_stack_change_when_the_chart_is_installed_by_hand() -> None:
    job = jobs()["deploy-platform"]
    step = _chart_step()
    assert step["if"] == "needs.test.outputs.chart_preinstalled == 'true'"
    assert step["env"] == {"HYPERPOD_STACK": "${{ needs.test.outputs.hyperpod_stack }}",
                           "FIRST_STACKS": "${{ needs.test.outputs.stacks_before_hyperpod }}"}
    guard = _step_index(job, "aws cloudformation describe-stacks")
    assert _step_index(job, "aws sts get-caller-identity") < guard < _first_deploy(job)
    assert "continue-on-error" not in step
    # Read-only: the only AWS call is DescribeStacks, which the header already grants the role.
    assert re.findall(r"\baws [a-z-]+ [a-z-]+", step["run"]) == ["aws cloudformation describe-stacks"]


#: A stand-in for the AWS CLI: ``aws cloudformation describe-stacks`` answers as told by FAKE_AWS_*.
FAKE_AWS = """#!/usr/bin/env bash
[ "$1 $2" = "cloudformation describe-stacks" ] || { echo "unexpected call: $*" >&2; exit 99; }
echo "$*" >> "$FAKE_AWS_LOG"
if [ -n "${FAKE_AWS_ERROR:-}" ]; then echo "$FAKE_AWS_ERROR" >&2; exit 254; fi
echo "$FAKE_AWS_STATUS"
"""
MISSING = ("An error occurred (ValidationError) when calling the DescribeStacks operation: "
           "Stack with id kvcache-hyperpod does not exist")


@pytest.mark.parametrize("status, error, step_ok, says", [
    ("UPDATE_COMPLETE", "", True, "kvcache-hyperpod exists (UPDATE_COMPLETE)"),
    ("CREATE_COMPLETE", "", True, "kvcache-hyperpod exists (CREATE_COMPLETE)"),
    ("", MISSING, False, "has not been created yet"),
    ("ROLLBACK_COMPLETE", "", False, "has not been created yet (ROLLBACK_COMPLETE)"),
    ("REVIEW_IN_PROGRESS", "", False, "has not been created yet"),
    ("", "An error occurred (AccessDenied) when calling the DescribeStacks operation: no", False,
     "::error::cannot tell whether kvcache-hyperpod exists: An error occurred (AccessDenied)"),
])
def test_chart_guard_step(tmp_path, status, error, step_ok, says) -> None:
    """The step's shell, with `aws` a stub on PATH answering DescribeStacks as a real account would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(FAKE_AWS)
    (bin_dir / "aws").chmod(0o755)
    summary, log = tmp_path / "summary", tmp_path / "aws.log"
    summary.touch()
    result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", _chart_step()["run"]],
                            cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                 "FAKE_AWS_STATUS": status, "FAKE_AWS_ERROR": error, "FAKE_AWS_LOG": str(log),
                                 "HYPERPOD_STACK": "kvcache-hyperpod", "FIRST_STACKS": "kvcache-network kvcache-eks",
                                 "GITHUB_STEP_SUMMARY": str(summary)})
    assert (result.returncode == 0) is step_ok, result.stdout + result.stderr
    assert says in result.stdout
    assert log.read_text().split()[:4] == ["cloudformation", "describe-stacks", "--stack-name", "kvcache-hyperpod"]
    if not step_ok and "cannot tell" not in says:
        text = summary.read_text()
        assert result.stdout.startswith("::error::config/platform.yaml sets hyperpod.dependency_chart_preinstalled")
        # The README's order, with this config's stack names, and the other way out.
        assert ("cdk deploy kvcache-network kvcache-eks; install the chart with helm from a machine inside the "
                "VPC; cdk deploy --all") in text
        assert "\\" not in text and '("HyperPod dependency chart")' in text  # the shell's quotes, unescaped
        assert "set hyperpod.dependency_chart instead" in text


def test_the_order_the_guard_cites_is_the_docs() -> None:
    """The guard names the section of docs/deploy.md and its steps; they must still be there."""
    deploy_doc = (REPO / "docs" / "deploy.md").read_text()
    section = deploy_doc.split("### HyperPod dependency chart", 1)[1].split("\n### ", 1)[0]
    assert "deploy `kvcache-network kvcache-eks`, install the chart with `helm` from a machine inside the VPC, " \
           "then `cdk deploy --all`" in " ".join(section.split())
    assert "CI's platform job stops" in " ".join(section.split())


def test_the_header_tells_the_truth_about_deploy_false() -> None:
    """The examples ship with deploy: true; the header no longer says deploy: false keeps them out."""
    header = " ".join(WORKFLOW.read_text().split("\nname:", 1)[0].replace("#", " ").split())
    assert "keeps e.g. the example lines out" not in header
    assert "the two example lines ship with `deploy: true`" in header
    for example in sorted((REPO / "config" / "business-lines").glob("*.yaml")):
        if example.stem in ("rag-assistant", "research-reasoning"):
            assert yaml.safe_load(example.read_text())["deploy"] is True, example.name


def test_the_readme_gives_ci_s_torch_index_for_machines_without_a_cpu_build() -> None:
    """A newcomer on an ordinary x86_64 machine gets PyPI's CUDA torch unless told: the README
    gives the same TORCH_PIP_ARGS the CI job uses, and one size for the virtualenv."""
    value = jobs()["lmcache"]["env"]["TORCH_PIP_ARGS"]
    readme = (REPO / "README.md").read_text() + (REPO / "docs" / "ci-and-tests.md").read_text()
    tier = re.split(r"\n##+ ", readme.split("### The real-LMCache tier", 1)[1], maxsplit=1)[0]
    assert f'make test-lmcache TORCH_PIP_ARGS="{value}"' in tier
    makefile = (REPO / "Makefile").read_text()
    assert f'make test-lmcache TORCH_PIP_ARGS="{value}"' in makefile
    (size,) = re.findall(r"\.venv-lmcache \(about ([0-9.]+ GB)\)", makefile)
    sizes = set(re.findall(r"([0-9.]+ GB)", tier)) | set(re.findall(r"about ([0-9.]+ GB)", readme))
    assert sizes == {size}, sizes


# --- No HyperPod update while deep health checks run (issue 19) -----------------------------------

GUARD = 'scripts/preflight.py --config config --cloud-assembly cdk.out --only "hyperpod update"'


def test_the_update_guard_runs_right_before_the_hyperpod_stack() -> None:
    """Stacks before hyperpod, then the guard, then hyperpod and the rest: the check is as close to the
    UpdateCluster as the pipeline gets, and it also ran in the full preflight before any stack changed."""
    job = jobs()["deploy-platform"]
    first, rest = [i for i, s in enumerate(job["steps"]) if "cdk deploy --app cdk.out" in s.get("run", "")]
    guard = _step_index(job, GUARD)
    assert _step_index(job, PREFLIGHT) < first < guard < rest
    step = job["steps"][guard]
    assert "continue-on-error" not in step and "if" not in step
    assert any(s.get("with", {}).get("name") == "cdk-out" for s in steps_using(job, "actions/download-artifact"))
    from operator_tools.preflight import HYPERPOD_UPDATE_CHECK
    assert f'--only "{HYPERPOD_UPDATE_CHECK}"' in step["run"]


@pytest.mark.parametrize("rc, step_ok", [(0, True), (1, False), (2, False)])
def test_update_guard_step_stops_the_job_and_names_the_nodes(tmp_path, rc, step_ok) -> None:
    """The step's shell, with preflight.py a stub answering as the check does."""
    job = jobs()["deploy-platform"]
    step = job["steps"][_step_index(job, GUARD)]
    output = ("FAIL  hyperpod update  kvcache-hyperpod changes (HyperPodCluster changes), but deep health checks run "
              "on 1 node(s) of kvcache-hyperpod: i-0bbb (g6e-inference): DeepHealthCheckInProgress")
    result, summary = run_with_stub_preflight(step, tmp_path, output, rc)
    assert (result.returncode == 0) is step_ok
    assert "i-0bbb (g6e-inference): DeepHealthCheckInProgress" in summary


def test_plan_splits_the_platform_stacks_at_the_hyperpod_stack(tmp_path) -> None:
    project = load_project(FIXTURE_CONFIG)
    result = subprocess.run([sys.executable, "-c", _plan_script()], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "KVCACHE_CONFIG_DIR": str(FIXTURE_CONFIG),
                                 "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}, timeout=120)
    assert result.returncode == 0, result.stderr
    outputs = dict(line.split("=", 1) for line in result.stdout.splitlines())
    ids = stack_ids(project)
    before, after = outputs["stacks_before_hyperpod"].split(), outputs["stacks_from_hyperpod"].split()
    assert after == [ids[r] for r in ("hyperpod", "addons", "l2-cache", "observability")]
    assert before + after == outputs["platform_stacks"].split()  # every platform stack, each once, in order
    assert "stacks_from_hyperpod" in jobs()["test"]["outputs"]
