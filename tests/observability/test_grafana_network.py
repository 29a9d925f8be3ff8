"""Who reaches the Grafana workspace (issue 25, low item "Public Grafana workspace").

Private by default: the workspace's network access control names one interface VPC endpoint
(``com.amazonaws.<region>.grafana-workspace``) in the private subnets, whose group admits HTTPS from
the VPC only, and the provisioning handler runs in those subnets with HTTPS as its only way out.
``network_access: public`` leaves all of that out. References are followed with ``Capture``, never
by hashed logical IDs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk.assertions import Capture, Match, Template

from kv_constructs import grafana_provisioning as construct

REGION = "us-west-2"  # the scenario's region (tests/fixtures/config/platform.yaml)
HANDLER = "handler.on_event"


@pytest.fixture(scope="module")
def private(templates, obs_project) -> Template:
    """The scenario's observability stack: its config says nothing about network access."""
    assert "network_access" not in (Path(__file__).parents[1] / "fixtures/config/platform.yaml").read_text()
    return templates[f"{obs_project.platform.project}-observability"]


def _resource(template: Template, logical_id: str) -> dict:
    return template.to_json()["Resources"][logical_id]


def _handler(template: Template) -> dict:
    (function,) = [f for f in template.find_resources("AWS::Lambda::Function").values()
                   if f["Properties"].get("Handler") == HANDLER]
    return function


def _endpoint_of_the_workspace(template: Template) -> tuple[Capture, dict]:
    """The VPC endpoint the workspace's VpceIds names, followed from the workspace."""
    endpoint_id = Capture()
    template.has_resource_properties("AWS::Grafana::Workspace", {
        "NetworkAccessControl": {"VpceIds": [{"Ref": endpoint_id}], "PrefixListIds": Match.any_value()}})
    return endpoint_id, _resource(template, endpoint_id.as_string())


def _scraper_subnets(template: Template) -> list:
    (scraper,) = template.find_resources("AWS::APS::Scraper").values()
    return scraper["Properties"]["Source"]["EksConfiguration"]["SubnetIds"]


def _build(tmp_path: Path, edit) -> tuple[object, object]:
    """The platform built from an edited copy of the scenario config and synthesized: (built, assembly)."""
    import stacks
    from platform_config import load_project
    from tests.example_config import copy_example_config, edit_yaml

    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", edit)
    app = stacks.new_app(outdir=str(tmp_path / "out"))
    built = stacks.build_platform(app, load_project(config))
    return built, app.synth()


def _nag_and_lint(built, assembly) -> tuple[list[str], tuple[list, list]]:
    from cdk_nag import AwsSolutionsChecks

    from tests.stacks.cfn_lint import lint_findings

    report = AwsSolutionsChecks().validate_scope(built.observability)
    findings = [f"{v.rule_name} at {r.construct_path}" for v in report.violations for r in v.violating_resources]
    stack = assembly.get_stack_by_name(built.observability.stack_name)
    return findings, lint_findings(Path(stack.template_full_path).read_text(), built.observability.region)


# --- private (the default) -------------------------------------------------------------------------

def test_the_workspace_admits_only_its_grafana_workspace_endpoint(private) -> None:
    endpoint_id, endpoint = _endpoint_of_the_workspace(private)
    assert endpoint["Type"] == "AWS::EC2::VPCEndpoint"
    props = endpoint["Properties"]
    # The workspace kind of endpoint (``grafana`` would be the management API, which VpceIds ignores).
    assert props["ServiceName"] == f"com.amazonaws.{REGION}.grafana-workspace"
    assert props["VpcEndpointType"] == "Interface"
    assert props["PrivateDnsEnabled"] is True  # the workspace's own host name resolves to it in the VPC
    assert props["SubnetIds"] == _scraper_subnets(private)  # the platform's private subnets
    # No public range besides: the config names no prefix list.
    private.has_resource_properties("AWS::Grafana::Workspace", {"NetworkAccessControl": {"PrefixListIds": []}})
    assert len(private.find_resources("AWS::EC2::VPCEndpoint")) == 1


def test_the_endpoint_admits_https_from_the_vpc_only(private, obs_project) -> None:
    _, endpoint = _endpoint_of_the_workspace(private)
    ((_, (group_id, attribute)),) = [next(iter(g.items())) for g in endpoint["Properties"]["SecurityGroupIds"]]
    assert attribute == "GroupId"
    group = _resource(private, group_id)["Properties"]
    assert group["SecurityGroupIngress"] == [{
        "CidrIp": obs_project.platform.network.cidr, "Description": "HTTPS to the Grafana workspace from the VPC",
        "FromPort": 443, "IpProtocol": "tcp", "ToPort": 443}]
    # allow_all_outbound=False: CDK's placeholder rule, which matches no traffic, and nothing else.
    assert [r["CidrIp"] for r in group["SecurityGroupEgress"]] == ["255.255.255.255/32"]
    ingress_rules = [r for r in private.find_resources("AWS::EC2::SecurityGroupIngress").values()
                     if r["Properties"].get("GroupId") == {"Fn::GetAtt": [group_id, "GroupId"]}]
    assert ingress_rules == []


def test_the_handler_runs_in_the_private_subnets_with_https_out_only(private) -> None:
    handler = _handler(private)["Properties"]
    vpc_config = handler["VpcConfig"]
    assert vpc_config["SubnetIds"] == _scraper_subnets(private)
    ((group_id, attribute),) = [g["Fn::GetAtt"] for g in vpc_config["SecurityGroupIds"]]
    assert attribute == "GroupId"
    group = _resource(private, group_id)["Properties"]
    assert group["SecurityGroupEgress"] == [{
        "CidrIp": "0.0.0.0/0", "Description": "HTTPS: the workspace through its VPC endpoint; the Grafana API and S3",
        "FromPort": construct.HTTPS_PORT, "IpProtocol": "tcp", "ToPort": construct.HTTPS_PORT}]
    assert "SecurityGroupIngress" not in group
    assert not [r for r in private.find_resources("AWS::EC2::SecurityGroupEgress").values()
                if r["Properties"].get("GroupId") == {"Fn::GetAtt": [group_id, "GroupId"]}]
    # Lambda creates the function's network interfaces with its execution role.
    role = _resource(private, handler["Role"]["Fn::GetAtt"][0])["Properties"]
    assert role["ManagedPolicyArns"] == [
        {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":iam::aws:policy/{construct.VPC_ACCESS_POLICY}"]]}]


def test_an_existing_vpc_with_prefix_lists_and_client_networks(tmp_path) -> None:
    """An imported VPC (no lookup): the endpoint admits its configured CIDR and endpoint_client_cidrs; the
    workspace also admits the configured prefix lists; cdk-nag and cfn-lint stay clean."""
    def edit(d: dict) -> None:
        d["network"] = {"mode": "existing", "vpc_id": "vpc-0123456789abcdef0", "vpc_cidr": "10.50.0.0/16",
                        "private_subnet_ids": {z: f"subnet-0{i}23456789abcdef0"
                                               for i, z in enumerate(d["availability_zones"])}}
        d["observability"]["grafana"].update(prefix_list_ids=["pl-0123456789abcdef0"],
                                             endpoint_client_cidrs=["172.16.0.0/12"])

    built, assembly = _build(tmp_path, edit)
    template = Template.from_stack(built.observability)
    template.has_resource_properties("AWS::Grafana::Workspace", {"NetworkAccessControl": {
        "PrefixListIds": ["pl-0123456789abcdef0"], "VpceIds": [{"Ref": Match.any_value()}]}})
    _, endpoint = _endpoint_of_the_workspace(template)
    assert endpoint["Properties"]["SubnetIds"] == ["subnet-0023456789abcdef0", "subnet-0123456789abcdef0"]
    (group_ref,) = endpoint["Properties"]["SecurityGroupIds"]
    group = _resource(template, group_ref["Fn::GetAtt"][0])["Properties"]
    assert sorted((r["CidrIp"], r["FromPort"], r["ToPort"]) for r in group["SecurityGroupIngress"]) == [
        ("10.50.0.0/16", 443, 443), ("172.16.0.0/12", 443, 443)]
    assert _handler(template)["Properties"]["VpcConfig"]["SubnetIds"] == endpoint["Properties"]["SubnetIds"]
    assert _nag_and_lint(built, assembly) == ([], ([], []))


# --- public -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def public(tmp_path_factory) -> tuple[Template, object, object]:
    built, assembly = _build(tmp_path_factory.mktemp("public"),
                             lambda d: d["observability"]["grafana"].update(network_access="public"))
    return Template.from_stack(built.observability), built, assembly


def test_public_has_no_network_access_control_and_no_endpoint(public) -> None:
    template, _, _ = public
    template.has_resource_properties("AWS::Grafana::Workspace", {"NetworkAccessControl": Match.absent()})
    assert template.find_resources("AWS::EC2::VPCEndpoint") == {}
    # The handler reaches the public workspace from outside the VPC, as before.
    handler = _handler(template)["Properties"]
    assert "VpcConfig" not in handler
    role = _resource(template, handler["Role"]["Fn::GetAtt"][0])["Properties"]
    assert "ManagedPolicyArns" not in role
    descriptions = [g["Properties"]["GroupDescription"] for g in template.find_resources("AWS::EC2::SecurityGroup").values()]
    assert not [d for d in descriptions if "Grafana" in d]


def test_public_stays_nag_and_lint_clean(public) -> None:
    _, built, assembly = public
    assert _nag_and_lint(built, assembly) == ([], ([], []))


def test_the_construct_wants_both_vpc_and_subnets_or_neither() -> None:
    from aws_cdk import App, Stack
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_grafana as grafana

    stack = Stack(App(), "S")
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["a"],
                                      private_subnet_ids=["subnet-0123456789abcdef0"])
    workspace = grafana.CfnWorkspace(stack, "W", account_access_type="CURRENT_ACCOUNT",
                                     authentication_providers=["AWS_SSO"], permission_type="CUSTOMER_MANAGED")
    common = dict(workspace=workspace, prometheus_url="https://p", dashboards=[{"uid": "u"}], datasource_uid="d",
                  datasource_name="d", service_account_name="s")
    for network in ({"vpc": vpc}, {"subnets": vpc.private_subnets}, {"vpc": vpc, "subnets": []}):
        with pytest.raises(ValueError, match="both vpc and"):
            construct.GrafanaProvisioning(stack, f"P{len(network)}{bool(network.get('subnets'))}", **common, **network)
