"""cfn-lint and cdk-nag (AwsSolutions) over the synthesized example platform."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import lint

import stacks

#: cfn-lint findings ignored, each with its reason:
#: - W3005 ("obsolete DependsOn") on resources aws-cdk-lib generates for its provider
#:   frameworks: CDK adds an explicit DependsOn on the function's role that a GetAtt already
#:   implies. Harmless and not ours to change; the allowlist names the CDK-generated resources.
IGNORED_WARNINGS = {
    "W3005": ("AWSCDKCfnUtilsProvider", "ClusterKubectlProvider", "CustomCDKBucketDeployment",
              "CustomS3AutoDeleteObjectsCustomResourceProvider", "CustomVpcRestrictDefaultSG"),
}


@pytest.fixture(scope="module")
def lint_matches(synthesized) -> dict[str, list]:
    """Stack id -> cfn-lint matches of its template (cfn-lint 1.58, the stacks' region)."""
    results = {}
    for stack in synthesized.stacks.all():
        text = (synthesized.outdir / stack.template_file).read_text()
        results[stack.stack_name] = lint(text, regions=[stack.region])
    return results


def test_cfn_lint_finds_no_error_in_any_template(lint_matches) -> None:
    errors = {name: [str(m) for m in matches if m.rule.severity == "error"] for name, matches in lint_matches.items()}
    assert errors == {name: [] for name in lint_matches}


def test_cfn_lint_finds_no_unexplained_warning_in_any_template(lint_matches) -> None:
    def ignored(match) -> bool:
        prefixes = IGNORED_WARNINGS.get(match.rule.id, ())
        return len(match.path) > 1 and str(match.path[1]).startswith(prefixes)

    warnings = {name: [str(m) for m in matches if m.rule.severity != "error" and not ignored(m)]
                for name, matches in lint_matches.items()}
    assert warnings == {name: [] for name in lint_matches}


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
