"""Network: the VPC the EKS control plane, the system nodes and the HyperPod nodes share."""

from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, CfnOutput, RemovalPolicy, Stack, Tags, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from platform_config import PlatformConfig
from platform_config.platform_models import CreateVpcConfig, ExistingVpcConfig

#: Public subnets hold only the NAT gateways (and an internet-facing load balancer if someone
#: configures one); /26 = 64 addresses per zone is plenty. Private subnets get the largest equal
#: blocks that fit in the rest of the CIDR (a /18 per zone in a /16 with two zones): HyperPod
#: nodes and VPC-CNI pods take one VPC address each, so they need the space.
PUBLIC_SUBNET_MASK = 26

#: Subnet tags the AWS Load Balancer Controller's subnet discovery reads: ``kubernetes.io/role/elb``
#: marks subnets for internet-facing load balancers, ``kubernetes.io/role/internal-elb`` for
#: internal ones (EKS user guide, "Route internet traffic with AWS Load Balancer Controller";
#: docs/sources.md §11).
ELB_TAG = "kubernetes.io/role/elb"
INTERNAL_ELB_TAG = "kubernetes.io/role/internal-elb"
#: Above the default tag priority (100) at which aws_eks_v2 tags public subnets ``elb`` and
#: private subnets ``internal-elb``: this stack's choice wins.
ELB_TAG_PRIORITY = 200
#: Prefix of the cluster tag (``kubernetes.io/cluster/<cluster name>``). A subnet that carries
#: only tags for *other* clusters is not eligible for this cluster's load balancers: the AWS Load
#: Balancer Controller filters it out (``SubnetsClusterTagCheck``, on by default) and the
#: cloud-controller-manager's Service load balancers skip it (docs/sources.md §11).
CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"


def excluded_cluster_tag(cluster_name: str) -> str:
    """The tag that makes public subnets ineligible for load balancers of ``cluster_name``: a cluster
    tag naming a cluster that is not this one (``<cluster name>-no-load-balancers``)."""
    return f"{CLUSTER_TAG_PREFIX}{cluster_name}-no-load-balancers"


def load_balancer_subnet_tags(scheme: str, cluster_name: str) -> dict[str, dict[str, str | None]]:
    """The load-balancer tags each subnet type carries for ``scheme`` (value ``None``: removed).

    Why tags are not enough by themselves: the AWS Load Balancer Controller the inference add-on
    bundles (v2.13.2) looks for subnets with the role tag of the scheme asked for, and when none
    has it, falls back to every subnet whose reachability matches (a route to an internet gateway
    for internet-facing; ``SubnetDiscoveryByReachability``, on by default since v2.12.1). So an
    internal platform that only left ``elb`` off its public subnets would still get an
    internet-facing load balancer there if one were asked for. The cluster tag of another cluster
    (:func:`excluded_cluster_tag`) takes the public subnets out of that fallback (docs/sources.md §11).

    Args:
        scheme: ``inference_operator.load_balancer_scheme``, ``internal`` or ``internet-facing``.
        cluster_name: ``eks.cluster_name``.

    Returns:
        ``{"private": {tag: value or None}, "public": {...}}``: private subnets always carry
        ``internal-elb`` and never ``elb`` (an internet-facing load balancer there would have no
        route from the internet). Internet-facing: public subnets carry ``elb``. Internal: public
        subnets carry no role tag and the excluded cluster tag, so no subnet can take an
        internet-facing load balancer and one asked for is not created.

    Raises:
        ValueError: unknown scheme.
    """
    if scheme not in ("internal", "internet-facing"):
        raise ValueError(f"unknown load balancer scheme {scheme!r}; allowed: internal, internet-facing")
    internal = scheme == "internal"
    return {
        "private": {INTERNAL_ELB_TAG: "1", ELB_TAG: None},
        "public": {ELB_TAG: None if internal else "1", INTERNAL_ELB_TAG: None,
                   excluded_cluster_tag(cluster_name): "shared" if internal else None},
    }


class NetworkStack(Stack):
    """VPC, subnets, endpoints and the shared security group (or an imported VPC).

    Created VPC (``network.mode: create``): one public and one private subnet in each of
    ``availability_zones`` (given explicitly, so synthesis never looks zones up), NAT gateways
    as configured, an S3 gateway endpoint, the configured interface endpoints in the private
    subnets, VPC flow logs, and the default security group stripped of rules.

    Load-balancer subnet tags follow ``inference_operator.load_balancer_scheme``
    (:func:`load_balancer_subnet_tags`): ``kubernetes.io/role/internal-elb=1`` on the private
    subnets; ``kubernetes.io/role/elb=1`` on the public subnets only for ``internet-facing``;
    with ``internal`` the public subnets carry :func:`excluded_cluster_tag` instead. With the
    default ``internal`` no subnet is eligible for an internet-facing load balancer, neither
    through the role tag nor through the controller's fallback to reachable subnets, so one asked
    for is not created (the "no public endpoints unless configured" rule). The tags do not decide
    the scheme a load balancer is asked with.

    Imported VPC (``network.mode: existing``): ``ec2.Vpc.from_vpc_attributes`` with the given
    IDs (no lookup). Endpoints, flow logs and subnet tags are then the VPC owner's job; the
    docs/deploy.md lists what HyperPod needs.

    Attributes:
        vpc: the VPC (``ec2.IVpc``).
        security_group: the group of the EKS control-plane ENIs and the HyperPod nodes (the
            ``VpcConfig`` of both); allows all traffic within itself (EFA needs it) and egress
            anywhere. The system node group is *not* in it: EKS puts managed node groups in the
            cluster security group it creates, and the HyperPod stack adds that group to the
            HyperPod nodes as well, so every node shares one group with every other node.
        hyperpod_subnet: the private subnet in ``gpu_availability_zone``.
        private_subnets: the private subnets, one per zone, in ``availability_zones`` order.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig, **kwargs: Any) -> None:
        # Set before the Stack exists: ``availability_zones`` below is read during construction.
        self._configured_zones = list(platform.availability_zones)
        super().__init__(scope, construct_id, **kwargs)
        network = platform.network
        zones = list(platform.availability_zones)
        if isinstance(network, CreateVpcConfig):
            self.vpc = self._create_vpc(network, zones, platform.inference_operator.load_balancer_scheme,
                                        platform.eks.cluster_name)
            private = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets
        else:
            self.vpc = self._import_vpc(network, zones)
            private = self.vpc.private_subnets
        by_zone = {s.availability_zone: s for s in private}
        self.private_subnets = [by_zone[z] for z in zones]
        self.hyperpod_subnet = by_zone[platform.gpu_availability_zone]
        self.security_group = self._security_group(platform, network)

        CfnOutput(self, "VpcId", value=self.vpc.vpc_id, description="VPC of the platform")
        CfnOutput(
            self,
            "HyperPodSubnetId",
            value=self.hyperpod_subnet.subnet_id,
            description=f"Private subnet of the HyperPod nodes ({platform.gpu_availability_zone})",
        )
        CfnOutput(self, "SecurityGroupId", value=self.security_group.security_group_id,
                  description="Shared security group (EKS control-plane ENIs and HyperPod nodes)")

    @property
    def availability_zones(self) -> list[str]:
        """The configured zones, never a lookup.

        ``ec2.Vpc(availability_zones=...)`` still checks the zones against
        ``Stack.availability_zones``, which for a stack with an explicit account and region is a
        context lookup (the CLI then needs credentials; plain Python gets "dummy1a"). The CDK
        documents overriding this property to choose zones differently; we return the config's.
        """
        return list(self._configured_zones)

    def _create_vpc(self, network: CreateVpcConfig, zones: list[str], scheme: str, cluster_name: str) -> ec2.Vpc:
        flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            retention=_retention(network.flow_log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(network.cidr),
            availability_zones=zones,
            nat_gateways=network.nat_gateways if network.nat_gateways is not None else len(zones),
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC,
                                        cidr_mask=PUBLIC_SUBNET_MASK, map_public_ip_on_launch=False),
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            ],
            gateway_endpoints={
                # HyperPod nodes pull lifecycle scripts and model weights from S3 (docs/sources.md §1).
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
            },
            flow_logs={
                "AllTraffic": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
            restrict_default_security_group=True,
        )
        # CloudFormation's linter warns on literal zones; here they are explicit on purpose.
        Validations.of(vpc).acknowledge(Acknowledgment(
            id="CloudFormation-Validate::W3010",
            reason="Zones come from config/platform.yaml on purpose: synthesis must not look them up, "
            "and the GPU capacity exists only in the configured zone.",
        ))
        private_selection = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        # One group for all interface endpoints: HTTPS from inside the VPC only (the CIDR from
        # config, a literal, so the rule is reviewable in the template).
        endpoint_group = ec2.SecurityGroup(
            self, "EndpointSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="Interface VPC endpoints: HTTPS from inside the VPC",
        )
        endpoint_group.add_ingress_rule(ec2.Peer.ipv4(network.cidr), ec2.Port.tcp(443), "HTTPS from the VPC")
        for service in network.interface_endpoints:
            vpc.add_interface_endpoint(
                f"Endpoint-{service.replace('.', '-')}",
                service=ec2.InterfaceVpcEndpointAwsService(service),
                subnets=private_selection,
                private_dns_enabled=True,
                security_groups=[endpoint_group],
                open=False,
            )
        # aws_eks_v2.Cluster tags subnets too (priority 100); these win at ELB_TAG_PRIORITY.
        wanted = load_balancer_subnet_tags(scheme, cluster_name)
        for kind, subnets in (("private", vpc.private_subnets), ("public", vpc.public_subnets)):
            for subnet in subnets:
                for tag, value in wanted[kind].items():
                    if value is not None:
                        Tags.of(subnet).add(tag, value, priority=ELB_TAG_PRIORITY)
                    else:
                        Tags.of(subnet).remove(tag, priority=ELB_TAG_PRIORITY)
        return vpc

    def _import_vpc(self, network: ExistingVpcConfig, zones: list[str]) -> ec2.IVpc:
        vpc = ec2.Vpc.from_vpc_attributes(
            self,
            "Vpc",
            vpc_id=network.vpc_id,
            vpc_cidr_block=network.vpc_cidr,
            availability_zones=zones,
            private_subnet_ids=[network.private_subnet_ids[z] for z in zones],
        )
        Validations.of(vpc).acknowledge(Acknowledgment(
            id="Annotation::@aws-cdk/aws-ec2:noSubnetRouteTableId",
            reason="Nothing here reads the imported subnets' route tables (no gateway endpoint is "
            "created in an existing VPC; its owner provides the endpoints).",
        ))
        # With an existing security group too, this stack holds only outputs; 'cdk deploy'
        # skips a stack without resources, and the other stacks get the IDs as literals.
        Validations.of(self).acknowledge(Acknowledgment(
            id="CloudFormation-Validate::F0001",
            reason="An imported VPC and security group leave no resources to create; 'cdk deploy' "
            "skips the empty stack and consumers receive the IDs as literals, not exports.",
        ))
        return vpc

    def _security_group(self, platform: PlatformConfig, network: Any) -> ec2.ISecurityGroup:
        if isinstance(network, ExistingVpcConfig) and network.security_group_id:
            return ec2.SecurityGroup.from_security_group_id(
                self, "SharedSecurityGroup", network.security_group_id, mutable=False
            )
        group = ec2.SecurityGroup(
            self,
            "SharedSecurityGroup",
            vpc=self.vpc,
            description=f"{platform.project}: EKS control-plane ENIs and HyperPod nodes (all traffic within, EFA)",
            allow_all_outbound=True,
        )
        # EFA and NCCL use arbitrary ports between GPU nodes; HyperPod requires the group to
        # allow all traffic from itself (docs/sources.md §2).
        group.add_ingress_rule(group, ec2.Port.all_traffic(), "All traffic within the group (EFA, NCCL, kubelet)")
        return group


#: CloudWatch Logs retention periods in days -> ``logs.RetentionDays`` (same order as the enum).
_RETENTION_DAYS = dict(zip(
    (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653),
    [m for m in logs.RetentionDays if m is not logs.RetentionDays.INFINITE],
))


def _retention(days: int) -> logs.RetentionDays:
    """Map a day count to ``logs.RetentionDays``; ValueError for a period CloudWatch does not offer."""
    try:
        return _RETENTION_DAYS[days]
    except KeyError:
        raise ValueError(f"{days} is not a CloudWatch Logs retention period; allowed: {sorted(_RETENTION_DAYS)}") from None
