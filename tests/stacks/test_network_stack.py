"""Network stack: zones from config, subnet tags, endpoints, the shared security group, imported VPCs."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match, Template

NETWORK = "kvcache-network"


def subnets(template: Template) -> dict[str, dict]:
    return template.find_resources("AWS::EC2::Subnet")


def tags(resource: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource["Properties"].get("Tags", [])}


def test_subnets_are_in_the_configured_zones_only(templates, project) -> None:
    zones = sorted(s["Properties"]["AvailabilityZone"] for s in subnets(templates[NETWORK]).values())
    # One public and one private subnet per configured zone, no looked-up or placeholder zone.
    assert zones == sorted(list(project.platform.availability_zones) * 2)


def test_private_subnets_carry_the_load_balancer_tags(templates) -> None:
    private = [s for s in subnets(templates[NETWORK]).values() if tags(s)["aws-cdk:subnet-type"] == "Private"]
    assert len(private) == 2
    for subnet in private:
        assert tags(subnet)["kubernetes.io/role/elb"] == "1"  # required by the inference operator's ALB
        assert tags(subnet)["kubernetes.io/role/internal-elb"] == "1"


def test_public_subnets_are_not_offered_to_load_balancers(templates) -> None:
    public = [s for s in subnets(templates[NETWORK]).values() if tags(s)["aws-cdk:subnet-type"] == "Public"]
    assert len(public) == 2
    for subnet in public:
        assert "kubernetes.io/role/elb" not in tags(subnet)
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False


def test_vpc_cidr_and_nat_count_come_from_config(templates, project) -> None:
    template = templates[NETWORK]
    template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": project.platform.network.cidr})
    template.resource_count_is("AWS::EC2::NatGateway", project.platform.network.nat_gateways)


def test_s3_gateway_and_configured_interface_endpoints(templates, project) -> None:
    template = templates[NETWORK]
    template.has_resource_properties("AWS::EC2::VPCEndpoint", {
        "VpcEndpointType": "Gateway",
        "ServiceName": Match.object_like({"Fn::Join": Match.array_with([Match.array_with([".s3"])])}),
    })
    interface = [r for r in template.find_resources("AWS::EC2::VPCEndpoint").values()
                 if r["Properties"].get("VpcEndpointType") == "Interface"]
    prefix = f"com.amazonaws.{project.platform.region}."
    services = sorted(r["Properties"]["ServiceName"].removeprefix(prefix) for r in interface)
    assert services == sorted(project.platform.network.interface_endpoints)
    assert all(r["Properties"]["PrivateDnsEnabled"] is True for r in interface)


def test_endpoints_accept_https_from_the_vpc_cidr_only(templates, project) -> None:
    template = templates[NETWORK]
    template.has_resource_properties("AWS::EC2::SecurityGroup", {
        "GroupDescription": "Interface VPC endpoints: HTTPS from inside the VPC",
        "SecurityGroupIngress": [Match.object_like({
            "CidrIp": project.platform.network.cidr, "FromPort": 443, "ToPort": 443, "IpProtocol": "tcp"})],
    })


def test_shared_security_group_allows_all_traffic_within_itself_and_egress(templates) -> None:
    template = templates[NETWORK]
    groups = template.find_resources("AWS::EC2::SecurityGroup", {
        "Properties": {"GroupDescription": Match.string_like_regexp("HyperPod nodes")}})
    assert len(groups) == 1
    (group_id, group), = groups.items()
    assert group["Properties"]["SecurityGroupEgress"] == [
        {"CidrIp": "0.0.0.0/0", "Description": "Allow all outbound traffic by default", "IpProtocol": "-1"}]
    template.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "-1",
        "GroupId": {"Fn::GetAtt": [group_id, "GroupId"]},
        "SourceSecurityGroupId": {"Fn::GetAtt": [group_id, "GroupId"]},
    })
    # No rule admits the internet.
    for ingress in template.find_resources("AWS::EC2::SecurityGroupIngress").values():
        assert ingress["Properties"].get("CidrIp") != "0.0.0.0/0"


def test_flow_logs_capture_all_traffic_with_configured_retention(templates, project) -> None:
    template = templates[NETWORK]
    template.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "ALL", "ResourceType": "VPC"})
    template.has_resource_properties("AWS::Logs::LogGroup", {
        "RetentionInDays": project.platform.network.flow_log_retention_days})


def test_hyperpod_subnet_is_the_private_subnet_of_the_gpu_zone(platform, project) -> None:
    network = platform.network
    assert network.hyperpod_subnet.availability_zone == project.platform.gpu_availability_zone
    assert network.hyperpod_subnet in network.private_subnets


def test_outputs(templates) -> None:
    outputs = templates[NETWORK].find_outputs("*")
    assert {"VpcId", "HyperPodSubnetId", "SecurityGroupId"} <= set(outputs)


@pytest.fixture(scope="module")
def existing_vpc_network(project, tmp_path_factory):
    """A network stack for ``network.mode: existing`` (small app, synthesized once for this module)."""
    import stacks
    from platform_config.models import ExistingVpcConfig
    from stacks.network_stack import NetworkStack

    network = ExistingVpcConfig(
        mode="existing", vpc_id="vpc-0123456789abcdef0", vpc_cidr="10.0.0.0/16",
        private_subnet_ids={"us-west-2a": "subnet-0aaaaaaaaaaaaaaa1", "us-west-2b": "subnet-0bbbbbbbbbbbbbbb2"},
        security_group_id="sg-0123456789abcdef0",
    )
    platform = project.platform.model_copy(update={"network": network})
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("existing")))
    import aws_cdk as cdk

    stack = NetworkStack(app, "existing-network", platform=platform,
                         env=cdk.Environment(account=platform.account, region=platform.region))
    return stack, Template.from_stack(stack)


def test_existing_vpc_is_imported_by_id_without_creating_network_resources(existing_vpc_network) -> None:
    stack, template = existing_vpc_network
    for kind in ("AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::NatGateway", "AWS::EC2::SecurityGroup"):
        template.resource_count_is(kind, 0)
    assert stack.resolve(stack.hyperpod_subnet.subnet_id) == "subnet-0aaaaaaaaaaaaaaa1"
    assert stack.resolve(stack.security_group.security_group_id) == "sg-0123456789abcdef0"
    assert stack.resolve(stack.vpc.vpc_id) == "vpc-0123456789abcdef0"
