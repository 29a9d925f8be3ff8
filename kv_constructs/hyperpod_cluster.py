"""``AWS::SageMaker::Cluster`` orchestrated by EKS, behind typed and validated props.

Field names, allowed values and limits come from the CloudFormation resource reference of
``AWS::SageMaker::Cluster`` (summarised in docs/sources.md §2) and, for Tiered Storage, from the
AWS blog on tiered KV cache with Curvine (docs/sources.md §1). HyperPod's own rules that no
schema shows (taints vs deep health checks, reserved label prefixes, ...) are
:mod:`platform_config.hyperpod_rules` (docs/sources.md §10), shared with the config models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, Literal, Mapping, Sequence

from aws_cdk import Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from kv_constructs import nag
from platform_config import hyperpod_rules as rules
from platform_config.fields import HYPERPOD_NAME_PATTERN
from platform_config.platform_models import TieredStorageConfig

#: ``ClusterName`` / ``InstanceGroupName`` pattern and length (CloudFormation reference); the
#: pattern is the config schema's, so config and construct cannot disagree.
NAME_PATTERN = re.compile(HYPERPOD_NAME_PATTERN)
NAME_MAX = 63
DEEP_HEALTH_CHECKS = rules.DEEP_HEALTH_CHECKS
TRAINING_PLAN_ARN = re.compile(rules.TRAINING_PLAN_ARN_PATTERN)
LABEL_VALUE = re.compile(rules.KUBERNETES_VALUE_PATTERN)
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _int_bounds(model: type, field_name: str) -> tuple[int, int]:
    """``(ge, le)`` of an ``Annotated[int, Field(ge=..., le=...)]`` field of a pydantic model."""
    metadata = model.model_fields[field_name].metadata
    lo = next(m.ge for m in metadata if getattr(m, "ge", None) is not None)
    hi = next(m.le for m in metadata if getattr(m, "le", None) is not None)
    return lo, hi


#: HyperPod Tiered Storage accepts 20-100 % of instance memory (AWS blog; docs/sources.md §1).
#: Read from the config schema's bounds of ``hyperpod.tiered_storage.memory_allocation_percentage``.
TIERED_STORAGE_PERCENT_RANGE = _int_bounds(TieredStorageConfig, "memory_allocation_percentage")


def _check_name(what: str, value: str) -> None:
    if Token.is_unresolved(value):
        return
    if not NAME_PATTERN.match(value) or len(value) > NAME_MAX:
        raise ValueError(
            f"{what} {value!r} must match {NAME_PATTERN.pattern} and be at most {NAME_MAX} characters"
        )


#: ENI permission actions of the execution role, granted on "*" as AWS's HyperPod samples do
#: (docs/sources.md §15).
ENI_PERMISSION_ACTIONS: Final = ("ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterfacePermission")


@dataclass(frozen=True)
class TaintSpec:
    """A Kubernetes taint for every node of an instance group."""

    key: str
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    value: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("taint key must not be empty")
        problem = rules.kubernetes_key_problem(self.key)
        if problem:
            raise ValueError(f"taint {problem}")
        if not LABEL_VALUE.match(self.value) or len(self.value) > rules.KUBERNETES_VALUE_MAX:
            raise ValueError(f"taint value {self.value!r} not allowed; allowed: at most "
                             f"{rules.KUBERNETES_VALUE_MAX} of letters, digits, '-', '_', '.'")
        if self.effect not in TAINT_EFFECTS:
            raise ValueError(f"taint effect {self.effect!r} not allowed; allowed: {', '.join(TAINT_EFFECTS)}")


@dataclass(frozen=True)
class LifecycleScripts:
    """Where a group's lifecycle scripts are (``LifeCycleConfig``).

    Attributes:
        source_s3_uri: ``s3://bucket/prefix/`` holding the scripts (may contain tokens).
        on_create: file name of the entry point under that prefix.
    """

    source_s3_uri: str
    on_create: str = "on_create.sh"

    def __post_init__(self) -> None:
        if not Token.is_unresolved(self.source_s3_uri):
            if not self.source_s3_uri.startswith("s3://"):
                raise ValueError(f"lifecycle source_s3_uri {self.source_s3_uri!r} must start with s3://")
            if len(self.source_s3_uri) > rules.SOURCE_S3_URI_MAX:
                raise ValueError(f"lifecycle source_s3_uri is {len(self.source_s3_uri)} characters; "
                                 f"allowed: at most {rules.SOURCE_S3_URI_MAX}")
        if "/" in self.on_create or not self.on_create:
            raise ValueError(f"lifecycle on_create {self.on_create!r} must be a file name under source_s3_uri")
        if len(self.on_create) > rules.ON_CREATE_MAX:
            raise ValueError(f"lifecycle on_create {self.on_create!r} is {len(self.on_create)} characters; "
                             f"allowed: at most {rules.ON_CREATE_MAX}")


@dataclass(frozen=True)
class InstanceGroupSpec:
    """One instance group (``InstanceGroups[]``).

    Attributes:
        name: ``InstanceGroupName`` (replacement on change).
        instance_type: ``ml.*`` type, e.g. ``ml.g6e.12xlarge`` (replacement on change).
        instance_count: instances, 0-6,758.
        lifecycle: the group's lifecycle scripts.
        ebs_volume_size_gb: secondary EBS volume per instance in GiB (``InstanceStorageConfigs``,
            at most one; the API names the unit GB), 1-16,384; mounted at /opt/sagemaker.
        threads_per_core: 1 (no SMT, the HyperPod default for GPU work) or 2.
        deep_health_checks: ``OnStartDeepHealthChecks`` (InstanceStress, InstanceConnectivity);
            InstanceConnectivity needs 2+ instances; not together with ``taints``.
        labels: Kubernetes node labels (at most 50, no reserved key prefix).
        taints: Kubernetes node taints (at most 50, unique by key and effect).
        min_instance_count: ``MinInstanceCount`` (<= ``instance_count``) or ``None``.
        training_plan_arn: ``TrainingPlanArn`` (reserved capacity) or ``None``.
        accelerators: GPUs/Trainium chips per instance when known (``0``: CPU type, no deep
            health checks possible); ``None`` skips that check.

    Raises:
        ValueError: a CloudFormation limit or a HyperPod rule (docs/sources.md §10) is broken;
            the message names the field and the allowed values.
    """

    name: str
    instance_type: str
    instance_count: int
    lifecycle: LifecycleScripts
    ebs_volume_size_gb: int = 500
    threads_per_core: Literal[1, 2] = 1
    deep_health_checks: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[TaintSpec, ...] = ()
    min_instance_count: int | None = None
    training_plan_arn: str | None = None
    accelerators: int | None = None

    def __post_init__(self) -> None:
        _check_name("instance group name", self.name)
        if not re.match(r"^ml\..+", self.instance_type):
            raise ValueError(f"instance group {self.name}: instance_type {self.instance_type!r} must match ^ml\\..*")
        if not 0 <= self.instance_count <= rules.INSTANCE_COUNT_MAX:
            raise ValueError(f"instance group {self.name}: instance_count must be >= 0 and <= "
                             f"{rules.INSTANCE_COUNT_MAX}, got {self.instance_count}")
        lo, hi = rules.EBS_VOLUME_SIZE_GB_MIN, rules.EBS_VOLUME_SIZE_GB_MAX
        if not lo <= self.ebs_volume_size_gb <= hi:
            raise ValueError(f"instance group {self.name}: ebs_volume_size_gb must be {lo}-{hi}, got {self.ebs_volume_size_gb}")
        if self.threads_per_core not in (1, 2):
            raise ValueError(f"instance group {self.name}: threads_per_core must be 1 or 2, got {self.threads_per_core}")
        bad = [c for c in self.deep_health_checks if c not in DEEP_HEALTH_CHECKS]
        if bad:
            raise ValueError(
                f"instance group {self.name}: deep health check(s) {', '.join(bad)} not allowed; "
                f"allowed: {', '.join(DEEP_HEALTH_CHECKS)}"
            )
        self._check_kubernetes_config()
        if self.training_plan_arn is not None and not Token.is_unresolved(self.training_plan_arn) and (
            not TRAINING_PLAN_ARN.match(self.training_plan_arn)
            or not rules.TRAINING_PLAN_ARN_MIN <= len(self.training_plan_arn) <= rules.TRAINING_PLAN_ARN_MAX
        ):
            raise ValueError(f"instance group {self.name}: training_plan_arn {self.training_plan_arn!r} not allowed; "
                             f"allowed: {rules.TRAINING_PLAN_ARN_PATTERN}")
        problems = rules.instance_group_problems(
            instance_type=self.instance_type,
            instance_count=self.instance_count,
            deep_health_checks=self.deep_health_checks,
            taints=[(t.key, t.effect) for t in self.taints],
            min_instance_count=self.min_instance_count,
            accelerators=self.accelerators,
        )
        if problems:
            raise ValueError(f"instance group {self.name}: " + "; ".join(problems))

    def _check_kubernetes_config(self) -> None:
        if len(self.labels) > rules.LABELS_MAX or len(self.taints) > rules.TAINTS_MAX:
            raise ValueError(f"instance group {self.name}: at most {rules.LABELS_MAX} labels and "
                             f"{rules.TAINTS_MAX} taints, got {len(self.labels)} and {len(self.taints)}")
        for key, value in self.labels.items():
            problem = rules.kubernetes_key_problem(key)
            if problem:
                raise ValueError(f"instance group {self.name}: label {problem}")
            if not value or not LABEL_VALUE.match(value) or len(value) > rules.KUBERNETES_VALUE_MAX:
                raise ValueError(f"instance group {self.name}: label {key}={value!r} not allowed; allowed: "
                                 f"1-{rules.KUBERNETES_VALUE_MAX} of letters, digits, '-', '_', '.'")


@dataclass(frozen=True)
class TieredStorage:
    """Cluster-level HyperPod Tiered Storage: a share of each node's host memory reserved for
    HyperPod's ai-toolkit daemon (its sagemaker-hyperpod:// KV tier, managed tiered checkpointing;
    docs/sources.md §14). Not LMCache's L1, which lives in the vLLM pod's own memory.

    Attributes:
        enabled: ``Mode: Enable`` / ``Disable``.
        memory_allocation_percentage: ``InstanceMemoryAllocationPercentage``, 20-100; 20 is
            where the AWS blog starts (docs/sources.md §1). Sent only when enabled.
    """

    enabled: bool = True
    memory_allocation_percentage: int = 20

    def __post_init__(self) -> None:
        lo, hi = TIERED_STORAGE_PERCENT_RANGE
        if not lo <= self.memory_allocation_percentage <= hi:
            raise ValueError(
                f"tiered storage memory_allocation_percentage {self.memory_allocation_percentage} "
                f"out of range; allowed: {lo}-{hi}"
            )


class HyperPodCluster(Construct):
    """A SageMaker HyperPod cluster on an existing EKS cluster, with its execution role.

    Args:
        cluster_name: ``ClusterName`` (1-63, ``^[a-zA-Z0-9](-*[a-zA-Z0-9])*$``; replacement on change).
        eks_cluster_arn: ``Orchestrator.Eks.ClusterArn`` (replacement on change).
        eks_cluster_name: name of that EKS cluster (scopes ``eks-auth:AssumeRoleForPodIdentity``).
        subnet_ids: ``VpcConfig.Subnets`` (1-16): private subnets in the GPU zone.
        security_group_ids: ``VpcConfig.SecurityGroupIds`` (1-5): one that allows all traffic
            within itself (EFA), plus a group the cluster's other nodes are in (for EKS
            orchestration, the EKS cluster security group of the managed node groups).
        vpc_id: the VPC of those subnets (scopes the ENI permissions of the execution role).
        instance_groups: the groups, names unique (1-20 in CloudFormation).
        lifecycle_bucket_arn: bucket holding the lifecycle scripts (read access is granted).
        lifecycle_key_prefix: key prefix of the scripts in that bucket, e.g. ``lifecycle/``.
        tiered_storage: ``TieredStorageConfig``.
        node_recovery: ``NodeRecovery``: ``Automatic`` (replace unhealthy nodes) or ``None``.
        node_provisioning_mode: ``NodeProvisioningMode``: ``Continuous`` (default; create with the
            capacity available and keep provisioning the rest) or ``None`` (omitted: HyperPod's
            all-or-nothing provisioning, where one short group fails CreateCluster).

    Attributes:
        cfn: the ``CfnCluster`` (logical ID pinned to :attr:`LOGICAL_ID`).
        execution_role: the instance groups' ``ExecutionRole``.
        cluster_arn: ``ClusterArn`` attribute (``arn:...:cluster/<12-char id>``, not the name).
        cluster_name: the name given.

    Raises:
        ValueError: a value violates the limits above (message names the field and the range).
    """

    #: Pinned CloudFormation logical ID of the HyperPod cluster (stateful: never let it drift).
    LOGICAL_ID = "HyperPodCluster"

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        eks_cluster_arn: str,
        eks_cluster_name: str,
        subnet_ids: Sequence[str],
        security_group_ids: Sequence[str],
        vpc_id: str,
        instance_groups: Sequence[InstanceGroupSpec],
        lifecycle_bucket_arn: str,
        lifecycle_key_prefix: str,
        tiered_storage: TieredStorage = TieredStorage(),
        node_recovery: Literal["Automatic", "None"] = "Automatic",
        node_provisioning_mode: Literal["Continuous"] | None = "Continuous",
    ) -> None:
        super().__init__(scope, construct_id)
        _check_name("cluster_name", cluster_name)
        if not 1 <= len(subnet_ids) <= 16:
            raise ValueError(f"subnet_ids needs 1-16 subnets, got {len(subnet_ids)}")
        if not 1 <= len(security_group_ids) <= 5:
            raise ValueError(f"security_group_ids needs 1-5 security groups, got {len(security_group_ids)}")
        if not 1 <= len(instance_groups) <= rules.INSTANCE_GROUPS_MAX:
            raise ValueError(f"instance_groups needs 1-{rules.INSTANCE_GROUPS_MAX} groups, got {len(instance_groups)}")
        if node_provisioning_mode is not None and node_provisioning_mode not in rules.NODE_PROVISIONING_MODES:
            raise ValueError(f"node_provisioning_mode {node_provisioning_mode!r} not allowed; allowed: "
                             f"{', '.join(rules.NODE_PROVISIONING_MODES)} or None")
        names = [g.name for g in instance_groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"instance group names must be unique; repeated: {', '.join(dupes)}")
        if node_recovery not in ("Automatic", "None"):
            raise ValueError(f"node_recovery {node_recovery!r} not allowed; allowed: Automatic, None")
        if not lifecycle_key_prefix.endswith("/"):
            raise ValueError(f"lifecycle_key_prefix {lifecycle_key_prefix!r} must end with '/'")

        self.cluster_name = cluster_name
        self.execution_role = self._execution_role(
            eks_cluster_name=eks_cluster_name,
            subnet_ids=subnet_ids,
            security_group_ids=security_group_ids,
            vpc_id=vpc_id,
            lifecycle_bucket_arn=lifecycle_bucket_arn,
            lifecycle_key_prefix=lifecycle_key_prefix,
        )

        self.cfn = sagemaker.CfnCluster(
            self,
            "Resource",
            cluster_name=cluster_name,
            orchestrator=sagemaker.CfnCluster.OrchestratorProperty(
                eks=sagemaker.CfnCluster.ClusterOrchestratorEksConfigProperty(cluster_arn=eks_cluster_arn)
            ),
            vpc_config=sagemaker.CfnCluster.VpcConfigProperty(
                security_group_ids=list(security_group_ids), subnets=list(subnet_ids)
            ),
            node_recovery=node_recovery,
            node_provisioning_mode=node_provisioning_mode,
            tiered_storage_config=sagemaker.CfnCluster.TieredStorageConfigProperty(
                mode="Enable" if tiered_storage.enabled else "Disable",
                instance_memory_allocation_percentage=(
                    tiered_storage.memory_allocation_percentage if tiered_storage.enabled else None
                ),
            ),
            instance_groups=[self._group(g) for g in instance_groups],
        )
        self.cfn.override_logical_id(self.LOGICAL_ID)
        # The role's inline policy must exist before HyperPod provisions nodes with it (the
        # role itself is already ordered by the ExecutionRole GetAtt).
        self.cfn.node.add_dependency(self.execution_role.node.find_child("DefaultPolicy"))

    @property
    def cluster_arn(self) -> str:
        """``ClusterArn`` of the HyperPod cluster (token)."""
        return self.cfn.attr_cluster_arn

    def _group(self, g: InstanceGroupSpec) -> sagemaker.CfnCluster.ClusterInstanceGroupProperty:
        kubernetes = None
        if g.labels or g.taints:
            kubernetes = sagemaker.CfnCluster.ClusterKubernetesConfigProperty(
                labels=dict(g.labels) or None,
                taints=[
                    sagemaker.CfnCluster.ClusterKubernetesTaintProperty(key=t.key, value=t.value or None, effect=t.effect)
                    for t in g.taints
                ]
                or None,
            )
        return sagemaker.CfnCluster.ClusterInstanceGroupProperty(
            instance_group_name=g.name,
            instance_type=g.instance_type,
            instance_count=g.instance_count,
            execution_role=self.execution_role.role_arn,
            life_cycle_config=sagemaker.CfnCluster.ClusterLifeCycleConfigProperty(
                source_s3_uri=g.lifecycle.source_s3_uri, on_create=g.lifecycle.on_create
            ),
            threads_per_core=g.threads_per_core,
            instance_storage_configs=[
                sagemaker.CfnCluster.ClusterInstanceStorageConfigProperty(
                    ebs_volume_config=sagemaker.CfnCluster.ClusterEbsVolumeConfigProperty(
                        volume_size_in_gb=g.ebs_volume_size_gb
                    )
                )
            ],
            on_start_deep_health_checks=list(g.deep_health_checks) or None,
            kubernetes_config=kubernetes,
            min_instance_count=g.min_instance_count,
            training_plan_arn=g.training_plan_arn,
        )

    def _execution_role(
        self,
        *,
        eks_cluster_name: str,
        subnet_ids: Sequence[str],
        security_group_ids: Sequence[str],
        vpc_id: str,
        lifecycle_bucket_arn: str,
        lifecycle_key_prefix: str,
    ) -> iam.Role:
        """The instance groups' execution role, as docs/sources.md §2 lists it.

        Trusted by ``sagemaker.amazonaws.com`` without a condition, as AWS's HyperPod pages show it:
        HyperPod is not among the features SageMaker documents ``aws:SourceAccount`` for, a condition
        HyperPod does not send would fail cluster creation (nodes without credentials), and no other
        account can hand this role to SageMaker (``iam:PassRole`` does not cross accounts): docs/security.md,
        "SageMaker service-principal trusts". Managed ``AmazonSageMakerClusterInstanceRolePolicy`` and
        ``AmazonEKS_CNI_Policy``; ENI create/delete/describe in this VPC; ECR pull;
        ``eks-auth:AssumeRoleForPodIdentity`` on this EKS cluster; read of the lifecycle scripts.

        ``AmazonEKS_CNI_Policy`` is what AWS lists for a HyperPod EKS execution role (the VPC CNI on
        the nodes runs with it). It grants ``ec2:CreateNetworkInterface``, ``DeleteNetworkInterface``,
        ``AttachNetworkInterface``, ``DetachNetworkInterface``, ``ModifyNetworkInterfaceAttribute``,
        ``AssignPrivateIpAddresses``/``UnassignPrivateIpAddresses`` and more on ``*``, so the scoped ENI
        statements below narrow nothing while it is attached: they say what HyperPod itself needs.
        """
        stack = Stack.of(self)
        role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="HyperPod instance groups: node identity (ENIs, image pulls, pod identity, lifecycle scripts)",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSageMakerClusterInstanceRolePolicy"),
                iam.ManagedPolicy.from_aws_managed_policy_name("AmazonEKS_CNI_Policy"),
            ],
        )
        nag.acknowledge_managed_policies(
            role,
            ["AmazonSageMakerClusterInstanceRolePolicy"],
            "Required by HyperPod on EKS (SageMaker HyperPod EKS prerequisites; docs/sources.md §2): node "
            "CloudWatch logs and metrics under /aws/sagemaker/Clusters, lifecycle scripts from sagemaker-* "
            "buckets of this account, SSM sessions; AWS maintains it.",
        )
        nag.acknowledge_managed_policies(
            role,
            ["AmazonEKS_CNI_Policy"],
            "Listed by AWS as required on a HyperPod EKS execution role (SageMaker HyperPod EKS prerequisites; "
            "docs/sources.md §2): the VPC CNI on the nodes manages pod ENIs and IPs with it. It is NOT scoped: "
            "it allows ENI create/delete/attach/detach/modify and private-IP assignment on every ENI, subnet "
            "and security group of the account ('*'), which makes this role's subnet- and VPC-scoped ENI "
            "statements no narrower in effect (docs/security.md, 'HyperPod node role').",
        )
        arn = lambda resource: stack.format_arn(service="ec2", resource=resource)  # noqa: E731
        vpc_arn = arn(f"vpc/{vpc_id}")
        network_interfaces = arn("network-interface/*")
        role.add_to_policy(
            iam.PolicyStatement(
                sid="CreateEnisInTheHyperPodSubnets",
                actions=["ec2:CreateNetworkInterface"],
                resources=[network_interfaces]
                + [arn(f"subnet/{s}") for s in subnet_ids]
                + [arn(f"security-group/{g}") for g in security_group_ids],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="DeleteEnisOfThisVpc",
                actions=["ec2:DeleteNetworkInterface"],
                resources=[network_interfaces],
                conditions={"ArnEquals": {"ec2:Vpc": vpc_arn}},
            )
        )
        # As AWS's HyperPod IAM prerequisites and samples grant them: on "*", no condition. Whether
        # these two actions take a network-interface resource and the ec2:Vpc key is not settled by
        # a source read for this project (the IAM datasets derived from the Service Authorization
        # Reference disagree for DeleteNetworkInterfacePermission, docs/sources.md §15); a
        # condition that does not apply makes the statement match nothing, and HyperPod's ENI
        # handling would fail at run time, where no test here can see it.
        role.add_to_policy(
            iam.PolicyStatement(
                sid="NetworkInterfacePermissionsAsAwsGrantsThem",
                actions=list(ENI_PERMISSION_ACTIONS),
                resources=["*"],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="DescribeNetwork",
                actions=[
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeVpcs",
                    "ec2:DescribeDhcpOptions",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups",
                ],
                resources=["*"],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="PullImages",
                actions=[
                    "ecr:GetAuthorizationToken",
                    "ecr:BatchCheckLayerAvailability",
                    "ecr:BatchGetImage",
                    "ecr:GetDownloadUrlForLayer",
                ],
                resources=["*"],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="PodIdentityOnThisCluster",
                actions=["eks-auth:AssumeRoleForPodIdentity"],
                resources=[stack.format_arn(service="eks", resource="cluster", resource_name=eks_cluster_name)],
            )
        )
        scripts = f"{lifecycle_bucket_arn}/{lifecycle_key_prefix}*"
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ListLifecycleScripts",
                actions=["s3:ListBucket"],
                resources=[lifecycle_bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{lifecycle_key_prefix}*"]}},
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(sid="ReadLifecycleScripts", actions=["s3:GetObject"], resources=[scripts])
        )
        nag.acknowledge_wildcards(
            role,
            resources=["*"],
            reason="EC2 Describe* (ENI bookkeeping of the VPC CNI) and ecr:GetAuthorizationToken have no "
            "resource-level permissions; image pulls come from AWS-owned ECR registries in other "
            "accounts (EKS add-ons, HyperPod agents) whose repository ARNs are not ours to enumerate; "
            "ec2:Create/DeleteNetworkInterfacePermission are granted on '*' as AWS's HyperPod IAM "
            "prerequisites and samples grant them: no source read here settles that they take the ec2:Vpc "
            "condition (docs/sources.md §15), and a condition that does not apply would deny HyperPod's ENI "
            "handling at run time; they only grant or revoke attach rights on ENIs.",
        )
        nag.acknowledge_wildcards(
            role,
            resources=[network_interfaces],
            reason="ENIs are created by the nodes at run time, so their IDs are unknown; these statements "
            "bind creation to the HyperPod subnets/security group and deletion to this VPC (ec2:Vpc condition), "
            "but AmazonEKS_CNI_Policy on the same role allows both on any ENI, so they document HyperPod's "
            "need rather than limit the role.",
        )

        nag.acknowledge_wildcards(
            role,
            resources=[scripts],
            reason="Read-only access to the lifecycle-script prefix of this cluster's own bucket; the "
            "script files are chosen by the repository and may change without a role update.",
        )
        return role
