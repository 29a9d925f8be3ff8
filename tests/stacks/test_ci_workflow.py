"""The users' GitHub Actions workflow: tests before deploys, platform before lines, approval, OIDC."""

from __future__ import annotations

from pathlib import Path

import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "platform.yml"


def jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def test_test_job_runs_make_test_and_make_synth() -> None:
    runs = [step.get("run", "") for step in jobs()["test"]["steps"]]
    assert "make test" in runs and "make synth" in runs
    assert runs.index("make test") < runs.index("make synth")


def test_deploys_need_tests_approval_and_oidc() -> None:
    all_jobs = jobs()
    for name in ("deploy-platform", "deploy-line"):
        job = all_jobs[name]
        assert "test" in ([job["needs"]] if isinstance(job["needs"], str) else job["needs"]), name
        assert job["environment"] == "production", name
        assert job["permissions"]["id-token"] == "write", name
        assumes = [s for s in job["steps"] if s.get("uses", "").startswith("aws-actions/configure-aws-credentials@")]
        assert assumes and assumes[0]["with"]["role-to-assume"] == "${{ vars.AWS_DEPLOY_ROLE_ARN }}", name
        assert all("aws-secret-access-key" not in s.get("with", {}) for s in job["steps"]), name


def test_lines_deploy_after_the_platform_one_job_per_business_line() -> None:
    line = jobs()["deploy-line"]
    assert "deploy-platform" in line["needs"]
    assert line["strategy"]["matrix"]["line"] == "${{ fromJSON(needs.test.outputs.lines) }}"
    assert line["strategy"]["fail-fast"] is False
    (deploy,) = [s for s in line["steps"] if "cdk deploy" in s.get("run", "")]
    assert "--exclusively" in deploy["run"]


def test_actions_are_pinned_to_exact_versions() -> None:
    for job in jobs().values():
        for step in job["steps"]:
            if "uses" in step:
                ref = step["uses"].split("@", 1)[1]
                assert ref.count(".") == 2, step["uses"]  # vX.Y.Z, never a moving major tag
