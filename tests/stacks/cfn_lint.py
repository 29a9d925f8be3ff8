"""cfn-lint over a synthesized template, with the project's short list of explained exceptions.

Shared by the scenario suite (``test_compliance.py``, fixture config) and the property suite
(``tests/properties``, whatever ``config/`` holds).
"""

from __future__ import annotations

from cfnlint.api import lint

#: cfn-lint findings ignored, each with its reason:
#: - W3005 ("obsolete DependsOn") on resources aws-cdk-lib generates for its provider
#:   frameworks: CDK adds an explicit DependsOn on the function's role that a GetAtt already
#:   implies. Harmless and not ours to change; the allowlist names the CDK-generated resources.
#:   ``lambda_.Function`` does the same for a function of ours given a role (the Grafana
#:   provisioning handler of the observability stack, the lines' teardown waiter of the addons
#:   stack, and their provider frameworks).
IGNORED_WARNINGS = {
    "W3005": ("AWSCDKCfnUtilsProvider", "ClusterKubectlProvider", "CustomCDKBucketDeployment",
              "CustomS3AutoDeleteObjectsCustomResourceProvider", "CustomVpcRestrictDefaultSG",
              "GrafanaProvisioningHandler", "GrafanaProvisioningProviderframeworkonEvent",
              "LoadBalancerTeardownWaiterHandler", "LoadBalancerTeardownWaiterProviderframeworkonEvent"),
}


def _ignored(match) -> bool:
    prefixes = IGNORED_WARNINGS.get(match.rule.id, ())
    return len(match.path) > 1 and str(match.path[1]).startswith(prefixes)


def lint_findings(template_text: str, region: str) -> tuple[list[str], list[str]]:
    """``(errors, unexplained warnings)`` of cfn-lint (pinned in requirements-dev.txt) for one template."""
    matches = lint(template_text, regions=[region])
    errors = [str(m) for m in matches if m.rule.severity == "error"]
    warnings = [str(m) for m in matches if m.rule.severity != "error" and not _ignored(m)]
    return errors, warnings
