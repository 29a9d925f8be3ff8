"""The observability stack's resources: encryption, least privilege, wiring to the cluster and to config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from aws_cdk.assertions import Match, Template

from observability import alerts, dashboards


@pytest.fixture(scope="module")
def template(templates, obs_project) -> Template:
    return templates[f"{obs_project.platform.project}-observability"]


def _service(statement: dict) -> str | None:
    principal = statement.get("Principal")
    return principal.get("Service") if isinstance(principal, dict) else None


def _one(template: Template, kind: str) -> tuple[str, dict]:
    found = template.find_resources(kind)
    assert len(found) == 1, f"{kind}: {list(found)}"
    return next(iter(found.items()))


def test_stack_is_part_of_the_platform_after_the_l2_tier(platform, obs_project) -> None:
    """It needs only l2-cache (and what that needs), not the lines: listed and deployable right after it."""
    stack = platform.observability
    assert stack is not None and stack in platform.all()
    assert platform.l2_cache in stack.dependencies
    assert not set(stack.dependencies) & set(platform.business_lines.values())
    order = platform.all()
    assert order.index(stack) == order.index(platform.l2_cache) + 1


def test_workspace_and_topic_are_encrypted_with_a_rotating_key(template, obs_project) -> None:
    """Default (workspace_key: aws-owned): AMP's own key encrypts the workspace (AMP encrypts every
    workspace at rest); the stack's rotating key encrypts the alert topic."""
    assert obs_project.platform.observability.workspace_key == "aws-owned"
    key_id, key = _one(template, "AWS::KMS::Key")
    assert key["Properties"]["EnableKeyRotation"] is True
    template.has_resource_properties("AWS::APS::Workspace", {"KmsKeyArn": Match.absent()})
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [key_id, "Arn"]}})
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    (aps,) = [s for s in statements if _service(s) == "aps.amazonaws.com"]
    assert sorted(aps["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    # Issue 19: the AMP user guide's form, with no condition (no source says AMP's KMS request carries
    # aws:SourceAccount; docs/sources.md §15). The guard against other workspaces is the topic policy's.
    assert "Condition" not in aps and aps["Resource"] == "*"


def test_only_this_workspaces_alert_manager_may_publish_to_the_topic(template) -> None:
    workspace_id, _ = _one(template, "AWS::APS::Workspace")
    _, policy = _one(template, "AWS::SNS::TopicPolicy")
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (publish,) = [s for s in statements if _service(s) == "aps.amazonaws.com"]
    assert sorted(publish["Action"]) == ["sns:GetTopicAttributes", "sns:Publish"]
    assert publish["Condition"] == {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": [workspace_id, "Arn"]}},
                                    "StringEquals": {"aws:SourceAccount": "111122223333"}}
    assert publish["Condition"]["ArnEquals"] == {"aws:SourceArn": {"Fn::GetAtt": [workspace_id, "Arn"]}}
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in statements)


def test_alert_manager_definition_routes_to_the_topic(template) -> None:
    topic_id, _ = _one(template, "AWS::SNS::Topic")
    _, workspace = _one(template, "AWS::APS::Workspace")
    definition = workspace["Properties"]["AlertManagerDefinition"]
    assert "Fn::Join" in definition
    parts = definition["Fn::Join"][1]
    assert {"Ref": topic_id} in parts
    text = "".join(p if isinstance(p, str) else "arn:aws:sns:us-west-2:111122223333:t" for p in parts)
    config = yaml.safe_load(yaml.safe_load(text)["alertmanager_config"])
    assert config["receivers"][0]["sns_configs"][0]["sigv4"] == {"region": "us-west-2"}


def test_rule_groups_are_the_generated_rules(template, obs_project) -> None:
    workspace_id, _ = _one(template, "AWS::APS::Workspace")
    template.has_resource_properties("AWS::APS::RuleGroupsNamespace", {
        "Name": alerts.RULES_NAMESPACE, "Workspace": {"Fn::GetAtt": [workspace_id, "Arn"]},
        "Data": alerts.rule_groups_yaml(obs_project.platform, obs_project.business_lines)})


def test_scraper_sends_to_the_workspace_from_the_private_subnets(template) -> None:
    workspace_id, _ = _one(template, "AWS::APS::Workspace")
    _, scraper = _one(template, "AWS::APS::Scraper")
    props = scraper["Properties"]
    assert props["Destination"] == {"AmpConfiguration": {"WorkspaceArn": {"Fn::GetAtt": [workspace_id, "Arn"]}}}
    eks = props["Source"]["EksConfiguration"]
    assert len(eks["SubnetIds"]) == 2 and len(eks["SecurityGroupIds"]) == 1
    assert "Fn::ImportValue" in json.dumps(eks["ClusterArn"])


def test_no_access_entry_or_rbac_of_our_own_for_the_scraper(template) -> None:
    """AMP creates the scraper's access entry on an API_AND_CONFIG_MAP cluster; a second would fail.
    The only Kubernetes objects of the stack itself are the DCGM exporter's Namespace and, with
    Curvine, its block-curvine-ports (k8s.network_policies)."""
    assert template.find_resources("AWS::EKS::AccessEntry") == {}
    kinds = [obj["kind"] for r in template.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values()
             for obj in json.loads(r["Properties"]["Manifest"])]
    assert kinds == ["Namespace", "NetworkPolicy"]


def test_cluster_lets_amp_create_the_scrapers_access_entry(templates, obs_project) -> None:
    eks = templates[f"{obs_project.platform.project}-eks"]
    eks.has_resource_properties("AWS::EKS::Cluster", {
        "AccessConfig": Match.object_like({"AuthenticationMode": "API_AND_CONFIG_MAP"}),
        "ResourcesVpcConfig": Match.object_like({"EndpointPrivateAccess": True})})


def _flatten(value) -> str:
    """A manifest property: a plain string, or Fn::Join of strings (no tokens in these objects)."""
    if isinstance(value, str):
        return value
    return "".join(p if isinstance(p, str) else "" for p in value["Fn::Join"][1])


def test_dcgm_exporter_chart_is_pinned_and_needs_no_prometheus_operator(template, obs_project) -> None:
    pin = obs_project.platform.observability.dcgm_exporter.chart
    _, chart = _one(template, "Custom::AWSCDK-EKS-HelmChart")
    props = chart["Properties"]
    assert (props["Chart"], props["Repository"], props["Version"]) == (pin.chart, pin.repository, "4.8.2")
    assert props["Namespace"] == obs_project.platform.observability.namespace
    values = json.loads(_flatten(props["Values"]))
    assert values["serviceMonitor"] == {"enabled": False}
    terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "sagemaker.amazonaws.com/compute-type", "operator": "In",
                                            "values": ["hyperpod"]}]}]
    assert values["tolerations"] == [{"key": "kvcache.io/large-model", "operator": "Equal", "value": "true",
                                      "effect": "PreferNoSchedule"}]  # k8s.nodes.instance_group_tolerations


def test_grafana_reads_only_this_prometheus_workspace(template) -> None:
    workspace_id, _ = _one(template, "AWS::APS::Workspace")
    _, workspace = _one(template, "AWS::Grafana::Workspace")
    role_id, attribute = workspace["Properties"]["RoleArn"]["Fn::GetAtt"]  # follow the reference
    assert attribute == "Arn"
    role = template.to_json()["Resources"][role_id]
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "grafana.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": "111122223333"}}
    (policy,) = [p for p in template.find_resources("AWS::IAM::Policy").values()
                 if {"Ref": role_id} in p["Properties"]["Roles"]]
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Resource"] == {"Fn::GetAtt": [workspace_id, "Arn"]}
    assert all(a.startswith("aps:") and "*" not in a for a in statement["Action"])
    template.has_resource_properties("AWS::Grafana::Workspace", {
        "AccountAccessType": "CURRENT_ACCOUNT", "AuthenticationProviders": ["AWS_SSO"],
        "PermissionType": "CUSTOMER_MANAGED", "RoleArn": {"Fn::GetAtt": [role_id, "Arn"]}, "GrafanaVersion": "10.4"})


def test_outputs_tell_where_to_look(template) -> None:
    outputs = template.to_json()["Outputs"]
    for key in ("GrafanaUrl", "DashboardUrl", "PrometheusWorkspaceId", "PrometheusEndpoint", "AlertTopicArn",
                "ScraperId"):
        assert key in outputs


def test_stack_holds_the_dashboard_app_py_writes(platform, obs_project) -> None:
    assert platform.observability.dashboards == [
        dashboards.build_dashboard(obs_project.platform, obs_project.business_lines)]


def test_a_customer_managed_workspace_key_is_the_stacks_key_and_passes_the_checks(tmp_path) -> None:
    """workspace_key: customer-managed puts the stack's rotating key on the workspace too; the
    stack stays cdk-nag (AwsSolutions) and cfn-lint clean, as with the default."""
    from cdk_nag import AwsSolutionsChecks

    import stacks
    from platform_config import load_project
    from tests.example_config import copy_example_config, edit_yaml
    from tests.stacks.cfn_lint import lint_findings

    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda d: d["observability"].update(workspace_key="customer-managed"))
    app = stacks.new_app(outdir=str(tmp_path / "out"))
    built = stacks.build_platform(app, load_project(config))
    assembly = app.synth()
    cmk = Template.from_stack(built.observability)
    key_id, key = _one(cmk, "AWS::KMS::Key")
    assert key["Properties"]["EnableKeyRotation"] is True
    assert "Prometheus workspace" in key["Properties"]["Description"]
    cmk.has_resource_properties("AWS::APS::Workspace", {"KmsKeyArn": {"Fn::GetAtt": [key_id, "Arn"]}})
    cmk.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [key_id, "Arn"]}})
    report = AwsSolutionsChecks().validate_scope(built.observability)
    assert [f"{v.rule_name} at {r.construct_path}" for v in report.violations for r in v.violating_resources] == []
    stack = assembly.get_stack_by_name(built.observability.stack_name)
    errors, warnings = lint_findings(Path(stack.template_full_path).read_text(), built.observability.region)
    assert (errors, warnings) == ([], [])
