"""cfn-lint and cdk-nag (AwsSolutions) over the synthesized example platform."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from cdk_nag import AwsSolutionsChecks

import stacks
from tests.stacks.cfn_lint import lint_findings


@pytest.fixture(scope="module")
def lint_results(synthesized) -> dict[str, tuple[list[str], list[str]]]:
    """Stack id -> (errors, unexplained warnings) of cfn-lint on its template, in the stack's region."""
    return {stack.stack_name: lint_findings((synthesized.outdir / stack.template_file).read_text(), stack.region)
            for stack in synthesized.stacks.all()}


def test_cfn_lint_finds_no_error_in_any_template(lint_results) -> None:
    assert {name: errors for name, (errors, _) in lint_results.items()} == {name: [] for name in lint_results}


def test_cfn_lint_finds_no_unexplained_warning_in_any_template(lint_results) -> None:
    assert {name: warnings for name, (_, warnings) in lint_results.items()} == {name: [] for name in lint_results}


def test_cdk_nag_aws_solutions_reports_no_unacknowledged_finding(synthesized) -> None:
    report = AwsSolutionsChecks().validate_scope(synthesized.app)
    findings = sorted(f"{v.rule_name} at {r.construct_path}" for v in report.violations for r in v.violating_resources)
    assert findings == []
    assert report.success


def test_cdk_nag_is_wired_to_fail_synthesis_on_a_finding(tmp_path) -> None:
    """``add_nag_checks`` (what app.py calls) must stop synthesis on an unacknowledged finding."""
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Probe", env=cdk.Environment(account="111122223333", region="us-west-2"))
    s3.Bucket(stack, "NotLogged", enforce_ssl=True)  # no server access logs: AwsSolutions-S1
    stacks.add_nag_checks(app)
    with pytest.raises(RuntimeError, match="AwsSolutions-S1"):
        app.synth()
