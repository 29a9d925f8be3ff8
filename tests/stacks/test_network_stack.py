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


def subnets_of(template: Template, kind: str) -> list[dict]:
    found = [s for s in subnets(template).values() if tags(s)["aws-cdk:subnet-type"] == kind]
    assert len(found) == 2
    return found


def test_internal_scheme_tags_private_subnets_for_internal_load_balancers_only(templates, project) -> None:
    """The default scheme: the operator's load balancers can only be internal, in private subnets."""
    assert project.platform.inference_operator.load_balancer_scheme == "internal"
    for subnet in subnets_of(templates[NETWORK], "Private"):
        assert tags(subnet)["kubernetes.io/role/internal-elb"] == "1"
        # An internet-facing load balancer here would have no route from the internet.
        assert "kubernetes.io/role/elb" not in tags(subnet)


def test_internal_scheme_offers_no_subnet_to_internet_facing_load_balancers(templates, project) -> None:
    """aws_eks_v2 tags public subnets kubernetes.io/role/elb; the network stack's removal wins. And
    since the bundled controller falls back to every internet-routed subnet when no subnet has the
    role tag, the public subnets carry a cluster tag of another cluster and none of this one's."""
    cluster = project.platform.eks.cluster_name
    for subnet in subnets_of(templates[NETWORK], "Public"):
        assert not {"kubernetes.io/role/elb", "kubernetes.io/role/internal-elb"} & set(tags(subnet))
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
        cluster_tags = {k: v for k, v in tags(subnet).items() if k.startswith("kubernetes.io/cluster/")}
        assert cluster_tags == {f"kubernetes.io/cluster/{cluster}-no-load-balancers": "shared"}
    for subnet in subnets_of(templates[NETWORK], "Private"):
        assert not [k for k in tags(subnet) if k.startswith("kubernetes.io/cluster/")]


# The two subnet filters of the bundled AWS Load Balancer Controller (v2.13.2,
# pkg/networking/subnet_resolver.go: ResolveViaDiscovery, isSubnetContainsEligibleClusterTag),
# restated over tags so the tests can run the discovery on the synthesized subnets; the source
# lines are cited in docs/sources.md §11. Reachability is read from CDK's subnet type (a PUBLIC
# subnet's route table has the internet gateway route, a PRIVATE_WITH_EGRESS one a NAT route).
# Not modelled: the free-IP filter, the one-subnet-per-zone choice, the two-zone minimum, subnet
# tag filters set on an IngressClassParams, and the feature gates other than their defaults.
def lbc_candidates(subnets: list[dict], scheme: str, cluster: str) -> list[dict]:
    """Subnets the controller may use for a load balancer of ``scheme`` with its default feature gates."""
    role = "kubernetes.io/role/elb" if scheme == "internet-facing" else "kubernetes.io/role/internal-elb"
    found = [s for s in subnets if tags(s).get(role) in ("", "1")]
    if not found:  # SubnetDiscoveryByReachability: public = routes to an internet gateway
        found = [s for s in subnets if (tags(s)["aws-cdk:subnet-type"] == "Public") == (scheme == "internet-facing")]

    def eligible(subnet: dict) -> bool:  # SubnetsClusterTagCheck
        keys = [k for k in tags(subnet) if k.startswith("kubernetes.io/cluster")]
        return f"kubernetes.io/cluster/{cluster}" in keys or not keys
    return [s for s in found if eligible(s)]


def test_no_subnet_can_take_a_load_balancer_of_the_other_scheme(templates, internet_facing_network, project) -> None:
    cluster = project.platform.eks.cluster_name
    internal = list(subnets(templates[NETWORK]).values())
    assert lbc_candidates(internal, "internet-facing", cluster) == []  # asked for: not created, not made internal
    assert {tags(s)["aws-cdk:subnet-type"] for s in lbc_candidates(internal, "internal", cluster)} == {"Private"}
    # Control: without the excluded cluster tag the fallback would place it in the public subnets.
    stripped = [{**s, "Properties": {**s["Properties"], "Tags": [
        t for t in s["Properties"]["Tags"] if not t["Key"].startswith("kubernetes.io/cluster/")]}} for s in internal]
    assert {tags(s)["aws-cdk:subnet-type"] for s in lbc_candidates(stripped, "internet-facing", cluster)} == {"Public"}
    public = list(subnets(internet_facing_network).values())
    assert {tags(s)["aws-cdk:subnet-type"] for s in lbc_candidates(public, "internet-facing", cluster)} == {"Public"}


@pytest.fixture(scope="module")
def internet_facing_network(project, tmp_path_factory) -> Template:
    """The network stack alone, for ``inference_operator.load_balancer_scheme: internet-facing``."""
    import aws_cdk as cdk

    import stacks
    from stacks.network_stack import NetworkStack

    operator = project.platform.inference_operator.model_copy(update={"load_balancer_scheme": "internet-facing"})
    platform = project.platform.model_copy(update={"inference_operator": operator})
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("internet-facing")))
    stack = NetworkStack(app, "internet-facing-network", platform=platform,
                         env=cdk.Environment(account=platform.account, region=platform.region))
    return Template.from_stack(stack)


def test_internet_facing_scheme_tags_the_public_subnets(internet_facing_network) -> None:
    for subnet in subnets_of(internet_facing_network, "Public"):
        assert tags(subnet)["kubernetes.io/role/elb"] == "1"
        assert "kubernetes.io/role/internal-elb" not in tags(subnet)
        assert not [k for k in tags(subnet) if k.startswith("kubernetes.io/cluster/")]
    for subnet in subnets_of(internet_facing_network, "Private"):
        assert tags(subnet)["kubernetes.io/role/internal-elb"] == "1"
        assert "kubernetes.io/role/elb" not in tags(subnet)


def test_subnet_tags_per_scheme() -> None:
    from stacks.network_stack import load_balancer_subnet_tags

    assert load_balancer_subnet_tags("internal", "c") == {
        "private": {"kubernetes.io/role/internal-elb": "1", "kubernetes.io/role/elb": None},
        "public": {"kubernetes.io/role/elb": None, "kubernetes.io/role/internal-elb": None,
                   "kubernetes.io/cluster/c-no-load-balancers": "shared"}}
    assert load_balancer_subnet_tags("internet-facing", "c")["public"] == {
        "kubernetes.io/role/elb": "1", "kubernetes.io/role/internal-elb": None,
        "kubernetes.io/cluster/c-no-load-balancers": None}
    with pytest.raises(ValueError, match="allowed: internal, internet-facing"):
        load_balancer_subnet_tags("public", "c")


def test_internet_facing_needs_a_created_vpc(tmp_path) -> None:
    """An existing VPC's public subnets are not the platform's to tag: refused with the field named."""
    from platform_config import ConfigError, load_project
    from tests.example_config import copy_example_config, edit_yaml

    def existing_and_public(data):
        data["network"] = {"mode": "existing", "vpc_id": "vpc-0123456789abcdef0", "vpc_cidr": "10.0.0.0/16",
                           "private_subnet_ids": {"us-west-2a": "subnet-0aaaaaaaaaaaaaaa1",
                                                  "us-west-2b": "subnet-0bbbbbbbbbbbbbbb2"}}
        data["inference_operator"]["load_balancer_scheme"] = "internet-facing"

    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", existing_and_public)
    with pytest.raises(ConfigError) as info:
        load_project(config)
    (problem,) = info.value.problems
    assert problem.file.endswith("platform.yaml")
    assert "load_balancer_scheme 'internet-facing' needs public subnets" in problem.message


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
    from platform_config.platform_models import ExistingVpcConfig
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
