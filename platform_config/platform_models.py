"""``config/platform.yaml``: the shared platform (network, EKS, HyperPod, Curvine, versions,
observability, LMCache settings), :class:`PlatformConfig` and the models it is made of.

Every model forbids unknown keys, so a misspelled field is an error rather than a silently
ignored setting. Field-level rules live on the fields; rules that span files (a business
line's instance type must be one of the platform's instance groups, ...) live in
:func:`platform_config.loader.load_project`.

Units are in the field names: ``*_gib`` is GiB (2^30 bytes), ``*_gb`` decimal GB where AWS
defines the unit that way (EBS ``VolumeSizeInGB`` is GiB in practice but named GB by the API;
we keep the API's name), ``*_mibps`` MiB/s.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from platform_config import hyperpod_rules as hp_rules
from platform_config import kubernetes_versions as k8s_versions
from platform_config.fields import (
    AWS_ACCOUNT_PATTERN,
    AWS_REGION_PATTERN,
    AZ_NAME_PATTERN,
    DnsLabel,
    HyperPodName,
    KnownInstanceType,
    PinnedImage,
    PinnedVersion,
    StrictModel,
    ipv4_network,
    is_digest_pinned,
)
from platform_config.instances import INSTANCE_TYPES
from platform_config.problems import FieldError


class CreateVpcConfig(StrictModel):
    """Create a new VPC: one public and one private subnet per configured zone.

    ``nat_gateways`` defaults to one per zone (HA); set 1 to save cost in a single-zone lab.
    """

    mode: Literal["create"] = "create"
    #: IPv4 CIDR of the new VPC, an IPv4 network a.b.c.d/n, /16 to /24, host bits 0.
    cidr: ipv4_network(16, 24) = "10.192.0.0/16"  # type: ignore[valid-type]
    #: NAT gateways; null = one per zone (HA). 1 saves cost in a lab.
    nat_gateways: Annotated[int, Field(ge=1, le=6)] | None = None
    #: Interface endpoints HyperPod nodes use without leaving the VPC (the console's cluster
    #: stack creates the S3 gateway endpoint; these keep ECR/STS/EKS-auth traffic private).
    interface_endpoints: tuple[str, ...] = (
        "ecr.api",
        "ecr.dkr",
        "sts",
        "logs",
        "eks",
        "eks-auth",
        "sagemaker.api",
        "ec2",
    )
    #: Days VPC flow logs (all traffic, to CloudWatch Logs) are kept. Flow logs are the network
    #: audit trail (cdk-nag AwsSolutions-VPC7); 90 days covers a quarterly review. Allowed: the
    #: CloudWatch Logs retention values from 1 day to 10 years.
    flow_log_retention_days: Literal[
        1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653
    ] = 90


class ExistingVpcConfig(StrictModel):
    """Use an existing VPC. Subnets are given per zone name so no lookup is needed at synth."""

    mode: Literal["existing"]
    vpc_id: Annotated[str, StringConstraints(pattern=r"^vpc-[0-9a-f]{8,17}$")]
    #: The VPC's IPv4 CIDR, an IPv4 network a.b.c.d/n (/8 to /28, host bits 0).
    vpc_cidr: ipv4_network(8, 28)  # type: ignore[valid-type]
    #: zone name -> private subnet ID (must cover every ``availability_zones`` entry).
    private_subnet_ids: dict[
        Annotated[str, StringConstraints(pattern=AZ_NAME_PATTERN)],
        Annotated[str, StringConstraints(pattern=r"^subnet-[0-9a-f]{8,17}$")],
    ]
    #: Optional existing security group; else one is created (all traffic within itself).
    security_group_id: Annotated[str, StringConstraints(pattern=r"^sg-[0-9a-f]{8,17}$")] | None = None


NetworkConfig = Annotated[Union[CreateVpcConfig, ExistingVpcConfig], Field(discriminator="mode")]


#: Kubernetes versions HyperPod supports for its EKS cluster (data:
#: :data:`platform_config.kubernetes_versions.HYPERPOD_KUBERNETES_VERSIONS`, docs/sources.md §15).
#: ``eks.version`` must be one of them; ``scripts/preflight.py`` checks the running cluster's
#: version against the same list.
HyperPodKubernetesVersion = Literal[k8s_versions.HYPERPOD_KUBERNETES_VERSIONS]  # type: ignore[valid-type]
HYPERPOD_KUBERNETES_VERSIONS: tuple[str, ...] = k8s_versions.HYPERPOD_KUBERNETES_VERSIONS


def _check_kubernetes_packages(version: str) -> str:
    """``version`` has a row in the version table and its cdk8s-plus / kubectl-layer pair is installed."""
    missing = k8s_versions.missing_packages(version)  # ValueError (no row) becomes the field's error
    if missing:
        raise ValueError(k8s_versions.install_hint(version))
    return version


#: A HyperPod-supported Kubernetes minor version with a row in the version table and its packages installed.
KubernetesVersion = Annotated[HyperPodKubernetesVersion, AfterValidator(_check_kubernetes_packages)]


class EksConfig(StrictModel):
    """The EKS cluster that orchestrates HyperPod.

    ``version`` is the one knob of everything version-coupled: its row in
    :data:`platform_config.kubernetes_versions.KUBERNETES_RELEASES` names the kubectl Lambda layer
    and cdk8s-plus-NN packages (both pinned in requirements.txt; a missing pair is a config error
    that says what to pin) and the kube-proxy, CoreDNS and VPC CNI add-on pins. 1.34 is the newest
    version HyperPod lists (docs/sources.md §15); the in-place upgrade order is in docs/day-two.md.
    """

    #: Name of the EKS cluster (also used in `aws eks update-kubeconfig`).
    cluster_name: DnsLabel = "kvcache-eks"
    #: Kubernetes minor version, one HyperPod supports and platform_config/kubernetes_versions.py
    #: has a row for; selects the kubectl layer and cdk8s-plus-NN packages (requirements.txt) and the
    #: kube-proxy, CoreDNS and VPC CNI pins (docs/day-two.md).
    version: KubernetesVersion = k8s_versions.DEFAULT_KUBERNETES_VERSION
    #: private: API reachable only inside the VPC (default, no public endpoint);
    #: public_and_private: also from ``public_access_cidrs``.
    endpoint_access: Literal["private", "public_and_private"] = "private"
    #: CIDRs allowed to reach a public endpoint, IPv4 networks a.b.c.d/n (/1 to /32); required with
    #: public_and_private. Never the whole internet: 0.0.0.0/0, ::/0 (IPv6 is refused) and CIDRs that
    #: together cover every IPv4 address (0.0.0.0/1 + 128.0.0.0/1) are refused, with no opt-in
    #: (docs/security.md, "The EKS API endpoint").
    public_access_cidrs: tuple[ipv4_network(1, 32), ...] = ()  # type: ignore[valid-type]
    #: IAM principal ARNs granted AmazonEKSClusterAdminPolicy through access entries.
    admin_principal_arns: tuple[
        Annotated[str, StringConstraints(pattern=r"^arn:aws[a-z-]*:(iam|sts)::[0-9]{12}:[A-Za-z0-9+=,.@_/-]+$")],
        ...,
    ] = ()
    control_plane_logging: tuple[
        Literal["api", "audit", "authenticator", "controllerManager", "scheduler"], ...
    ] = ("api", "audit", "authenticator", "controllerManager", "scheduler")
    #: Small managed node group for system pods (CoreDNS, operators, Kyverno, Curvine Primary).
    system_node_instance_type: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]+\.[a-z0-9]+$")] = "m7i.xlarge"
    system_node_count: Annotated[int, Field(ge=1, le=10)] = 2
    #: EKS support policy of the cluster (`UpgradePolicy.SupportType`), set explicitly. EXTENDED: the
    #: control plane stays on `version` after its standard support ends (1.34: 2026-12-02), at the
    #: extended-support price (Amazon EKS pricing: $0.60 instead of $0.10 per cluster-hour) until
    #: you upgrade (docs/day-two.md). STANDARD: at that date EKS upgrades the control plane by itself,
    #: possibly to a version HyperPod does not support yet. `scripts/preflight.py` reports where the
    #: version stands in the EKS calendar.
    support_type: Literal["EXTENDED", "STANDARD"] = "EXTENDED"
    #: EKS-optimized AMI release of the system node group (`1.34.2-20261118`: the node group's
    #: `ReleaseVersion`, as `aws eks describe-nodegroup` or the AL2023 release notes name it), null
    #: for the newest release of `version` when the node group is created or its version changes.
    #: Bump it to roll the system nodes onto a newer AMI of the same Kubernetes version
    #: (docs/day-two.md); its minor version must be `version`.
    system_node_release_version: Annotated[str, StringConstraints(pattern=r"^1\.[0-9]+\.[0-9]+-[0-9]{8}$")] | None = None

    @model_validator(mode="after")
    def _release_of_this_version(self) -> "EksConfig":
        release = self.system_node_release_version
        if release is not None and ".".join(release.split(".")[:2]) != self.version:
            raise FieldError("system_node_release_version",
                             f"system_node_release_version {release!r} is an AMI of Kubernetes "
                             f"{'.'.join(release.split('.')[:2])}, but version is {self.version!r}; allowed: a release "
                             f"{self.version}.<patch>-<YYYYMMDD>, or null (the newest for {self.version})")
        return self

    @model_validator(mode="after")
    def _public_cidrs_only_when_public(self) -> "EksConfig":
        if self.endpoint_access == "private" and self.public_access_cidrs:
            raise FieldError("public_access_cidrs", "public_access_cidrs is set but endpoint_access is 'private'; "
                                                    "allowed: no CIDRs, or endpoint_access public_and_private")
        networks = [ipaddress.IPv4Network(c) for c in self.public_access_cidrs]
        if networks and list(ipaddress.collapse_addresses(networks)) == [ipaddress.IPv4Network("0.0.0.0/0")]:
            raise FieldError("public_access_cidrs",
                             f"public_access_cidrs {', '.join(self.public_access_cidrs)} together cover every IPv4 "
                             "address, the whole internet; allowed: the networks that may reach the API, e.g. "
                             "[203.0.113.0/24]")
        if self.endpoint_access == "public_and_private" and not self.public_access_cidrs:
            raise FieldError("public_access_cidrs", 
                "endpoint_access 'public_and_private' needs public_access_cidrs "
                "(refusing to open the API to 0.0.0.0/0 implicitly); allowed: the CIDRs that may reach it, e.g. "
                "[203.0.113.0/24]"
            )
        return self


def _check_kubernetes_key(key: str) -> str:
    problem = hp_rules.kubernetes_key_problem(key)
    if problem:
        raise ValueError(problem)
    return key


#: Label or taint key of an instance group: Kubernetes key syntax, no reserved prefix
#: (``sagemaker.amazonaws.com/``, ``kubernetes.io/``, ``k8s.io/``); docs/sources.md §10.
KubernetesKey = Annotated[
    str,
    StringConstraints(pattern=hp_rules.KUBERNETES_KEY_PATTERN, min_length=1, max_length=hp_rules.KUBERNETES_KEY_MAX),
    AfterValidator(_check_kubernetes_key),
]
#: Label value: 1-63 characters (the SageMaker API refuses an empty label value).
LabelValue = Annotated[
    str,
    StringConstraints(pattern=hp_rules.KUBERNETES_VALUE_PATTERN, min_length=1, max_length=hp_rules.KUBERNETES_VALUE_MAX),
]
#: Training plan (reserved capacity) ARN, as the CloudFormation schema admits it.
TrainingPlanArn = Annotated[
    str,
    StringConstraints(pattern=hp_rules.TRAINING_PLAN_ARN_PATTERN, min_length=hp_rules.TRAINING_PLAN_ARN_MIN,
                      max_length=hp_rules.TRAINING_PLAN_ARN_MAX),
]


class Taint(StrictModel):
    """A Kubernetes taint put on every node of an instance group (not allowed together with
    deep health checks; docs/sources.md §10)."""

    key: KubernetesKey
    #: Empty: a taint without value.
    value: Annotated[str, StringConstraints(pattern=hp_rules.KUBERNETES_VALUE_PATTERN,
                                            max_length=hp_rules.KUBERNETES_VALUE_MAX)] = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class InstanceGroupConfig(StrictModel):
    """One HyperPod instance group (``AWS::SageMaker::Cluster`` ``InstanceGroups[]``).

    HyperPod's rules checked here (docs/sources.md §10, :mod:`platform_config.hyperpod_rules`):
    no taints together with deep health checks; ``InstanceConnectivity`` only with 2 or more
    instances; deep health checks only on GPU/Trainium types; at most 50 labels and 50 taints,
    keys without a reserved prefix; ``min_instance_count`` <= ``instance_count``.
    """

    #: InstanceGroupName; changing it replaces the group (docs/sources.md §2).
    name: HyperPodName
    #: One of the ml.g6e.* / ml.p5*.48xlarge types in platform_config/instances.py.
    instance_type: KnownInstanceType
    #: InstanceCount: instances HyperPod keeps in the group (0-6758, CloudFormation schema).
    instance_count: Annotated[int, Field(ge=0, le=hp_rules.INSTANCE_COUNT_MAX)]
    #: MinInstanceCount: with Continuous provisioning, the group is InService once this many
    #: instances run and HyperPod keeps adding the rest as capacity appears. null: not sent.
    min_instance_count: Annotated[int, Field(ge=0, le=hp_rules.INSTANCE_COUNT_MAX)] | None = None
    #: Secondary EBS volume per instance, GiB (``InstanceStorageConfigs[0].EbsVolumeConfig``),
    #: mounted at /opt/sagemaker.
    ebs_volume_size_gb: Annotated[int, Field(ge=hp_rules.EBS_VOLUME_SIZE_GB_MIN, le=hp_rules.EBS_VOLUME_SIZE_GB_MAX)] = 500
    threads_per_core: Literal[1, 2] = 1
    #: OnStartDeepHealthChecks, run on every new node before it takes work (AWS: about 2 h per
    #: node; catches bad GPUs). InstanceConnectivity needs 2+ instances; no taints with either.
    deep_health_checks: Annotated[tuple[Literal["InstanceStress", "InstanceConnectivity"], ...],
                                  Field(max_length=len(hp_rules.DEEP_HEALTH_CHECKS))] = ()
    #: Kubernetes labels put on every node of the group (at most 50; no reserved key prefix).
    labels: Annotated[dict[KubernetesKey, LabelValue], Field(max_length=hp_rules.LABELS_MAX)] = Field(
        default_factory=dict)
    #: Kubernetes taints put on every node of the group (at most 50); not with deep health checks.
    taints: Annotated[tuple[Taint, ...], Field(max_length=hp_rules.TAINTS_MAX)] = ()
    #: TrainingPlanArn: run the group on the reserved capacity of a SageMaker training plan (for
    #: scarce types such as P5); null: on-demand capacity.
    training_plan_arn: TrainingPlanArn | None = None

    @model_validator(mode="after")
    def _hyperpod_group_rules(self) -> "InstanceGroupConfig":
        problems = hp_rules.instance_group_problems(
            instance_type=self.instance_type,
            instance_count=self.instance_count,
            deep_health_checks=self.deep_health_checks,
            taints=[(t.key, t.effect) for t in self.taints],
            min_instance_count=self.min_instance_count,
            accelerators=INSTANCE_TYPES[self.instance_type].gpus,
        )
        if problems:
            raise ValueError(f"instance group {self.name}: " + "; ".join(problems))
        return self


class TieredStorageConfig(StrictModel):
    """HyperPod Tiered Storage: a share of every node's host memory reserved for HyperPod's
    ai-toolkit daemon (docs/sources.md §14).

    AWS describes it as a memory management daemon that provides disaggregated memory as a service
    (managed tiered checkpointing), and as the cluster-wide L2 tier of its managed KV cache, which
    LMCache reaches through the ``sagemaker-hyperpod://`` backend. This platform's L2 is Curvine
    through ``fs://`` instead, and its L1 is LMCache's own buffer in the vLLM process (inside the
    pod's ``resources.memory``), so neither uses the share. It stays on by default and in the
    example anyway: the platform is specified with Tiered Storage, the reference deployment ran
    with it, and the inference operator's ``l2CacheBackend: tieredstorage`` placeholder (which the
    L2 mutation relies on) has only been seen working with it; no source says the operator accepts
    the placeholder without it (docs/l2-cache.md). While enabled,
    ``memory_allocation_percentage`` of host memory is counted as unavailable to pods
    (:mod:`platform_config.node_fit`). The blog reports 20-100 accepted and starts at 20
    (docs/sources.md §1); the CloudFormation schema alone admits 0-100; we keep the blog's narrower
    range (docs/sources.md §10).
    """

    #: Mode Enable/Disable of TieredStorageConfig. On, as specified and as the reference deployment
    #: ran; false reclaims the share for pods once you have checked that the inference operator
    #: accepts the tieredstorage placeholder without it (docs/l2-cache.md).
    enabled: bool = True
    #: InstanceMemoryAllocationPercentage: share of host memory reserved for the ai-toolkit
    #: daemon when enabled; the node budget counts it as unavailable to pods.
    memory_allocation_percentage: Annotated[int, Field(ge=20, le=100)] = 20


class HyperPodDependencyChartConfig(StrictModel):
    """The HyperPod dependency Helm chart (aws/sagemaker-hyperpod-cli, ``helm_chart/HyperPodHelmChart``).

    HyperPod on EKS needs it in ``kube-system`` before the HyperPod cluster is created (health
    monitoring agent, deep health checks, GPU/EFA device plugins). It is published only in that
    Git repository, not in a Helm repository, so it cannot be pinned by chart version: check it
    out at ``source_commit`` and vendor its sub-charts into ``path`` (docs/deploy.md, "HyperPod
    dependency chart"). When set, the HyperPod stack installs it through the cluster's kubectl
    handler before creating the HyperPod cluster; when absent, install it by hand first.
    """

    #: Directory holding ``Chart.yaml`` and the vendored ``charts/``; relative paths are
    #: relative to the repository root (where ``cdk.json`` is).
    path: Annotated[str, StringConstraints(min_length=1)]
    #: The aws/sagemaker-hyperpod-cli commit ``path`` was checked out at (40 hex digits).
    source_commit: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
    release: DnsLabel = "dependencies"
    #: Extra chart values, merged over the platform's defaults (which turn off what the EKS
    #: add-ons already provide: cert-manager and the inference operator).
    values: dict[str, Any] = Field(default_factory=dict)


class HyperPodConfig(StrictModel):
    """The ``AWS::SageMaker::Cluster`` orchestrated by the EKS cluster."""

    cluster_name: HyperPodName = "kvcache-hyperpod"
    #: Automatic: HyperPod replaces nodes that fail health checks.
    node_recovery: Literal["Automatic", "None"] = "Automatic"
    #: NodeProvisioningMode. Continuous: CreateCluster succeeds with whatever capacity is there
    #: and HyperPod keeps provisioning the rest (a short P5 group or one node failing its deep
    #: health checks no longer fails the stack). null: omit it, i.e. HyperPod's all-or-nothing
    #: provisioning.
    node_provisioning_mode: Literal["Continuous"] | None = "Continuous"
    tiered_storage: TieredStorageConfig = TieredStorageConfig()
    instance_groups: Annotated[tuple[InstanceGroupConfig, ...], Field(min_length=1, max_length=hp_rules.INSTANCE_GROUPS_MAX)]
    #: Install the HyperPod dependency chart from a vendored checkout (None: install by hand).
    dependency_chart: HyperPodDependencyChartConfig | None = None
    #: true: the dependency chart is installed in kube-system another way (by hand or GitOps,
    #: docs/deploy.md "HyperPod dependency chart") before the hyperpod stack is deployed. Deep health
    #: checks and node_recovery Automatic need the chart; synth refuses them unless
    #: ``dependency_chart`` is set or this is true.
    dependency_chart_preinstalled: bool = False

    @model_validator(mode="after")
    def _unique_group_names(self) -> "HyperPodConfig":
        names = [g.name for g in self.instance_groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise FieldError("instance_groups", f"instance group names must be unique; repeated: {', '.join(dupes)}; "
                                               "allowed: a name no other instance group uses")
        return self

    @model_validator(mode="after")
    def _dependency_chart_for_health_features(self) -> "HyperPodConfig":
        """Deep health checks and automatic node recovery run on the chart's health-monitoring
        agent and deep-health-check resources, which must be in the cluster first."""
        if self.dependency_chart is not None and self.dependency_chart_preinstalled:
            raise FieldError("dependency_chart_preinstalled", 
                "dependency_chart and dependency_chart_preinstalled: true both say how the HyperPod "
                "dependency chart is installed; allowed: one of them")
        if self.dependency_chart is not None or self.dependency_chart_preinstalled:
            return self
        needs = [f"instance group {g.name} has deep_health_checks" for g in self.instance_groups
                 if g.deep_health_checks]
        if self.node_recovery == "Automatic":
            needs.insert(0, "node_recovery is Automatic")
        if needs:
            raise FieldError(
                "dependency_chart", f"{'; '.join(needs)}, which need the HyperPod dependency chart "
                "(health-monitoring agent, deep-health-check) installed before the cluster; allowed: "
                "set dependency_chart (the stack installs a vendored checkout), or "
                "dependency_chart_preinstalled: true (installed by hand, docs/deploy.md \"HyperPod dependency chart\"), "
                "or node_recovery: None and no deep_health_checks")
        return self


class CurvinePrimaryVolumeConfig(StrictModel):
    """The EBS volume holding the Curvine Primary's RocksDB metadata and Raft journal.

    gp3 baseline is 3,000 IOPS and 125 MiB/s; io2 for heavy metadata churn.
    """

    size_gib: Annotated[int, Field(ge=1, le=16384)] = 100
    volume_type: Literal["gp3", "io2"] = "gp3"
    iops: Annotated[int, Field(ge=3000, le=64000)] = 3000
    throughput_mibps: Annotated[int, Field(ge=125, le=1000)] = 125
    #: retain: the volume outlives the stack; snapshot: CloudFormation snapshots then deletes it.
    removal_policy: Literal["retain", "snapshot"] = "retain"

    @model_validator(mode="after")
    def _throughput_only_gp3(self) -> "CurvinePrimaryVolumeConfig":
        if self.volume_type == "io2" and self.throughput_mibps != 125:
            raise FieldError("throughput_mibps", "throughput_mibps applies to gp3 only; allowed for io2: 125 (the default), "
                                                   "or remove the key")
        return self


#: Keys that existed and were removed, by dotted path in platform.yaml: the loader answers with
#: this (what to do) instead of "unknown key". The three eviction keys only filled Curvine's
#: quota-eviction settings, which deleted nothing in v0.3.2-alpha (docs/sources.md §9).
REMOVED_KEYS: dict[str, str] = {
    f"curvine.eviction.{key}": (
        f"removed: it set Curvine's {curvine_key}, which had no effect; Curvine's quota eviction is "
        "now always off and each line's L2 janitor alone deletes chunks (ttl_hours, high_watermark, "
        "low_watermark; docs/l2-cache.md \"Day two\"); allowed: delete this key")
    for key, curvine_key in (("ttl_action", "quota_eviction_mode"), ("quota_eviction", "enable_quota_eviction"),
                             ("policy", "quota_eviction_policy"))
}


class CurvineEvictionConfig(StrictModel):
    """Keeps the L2 pool from filling the NVMe: LMCache's fs connector never deletes files.

    Each L2 line's janitor (k8s/janitor.py) applies ``ttl_hours`` and the watermarks to the line's
    chunk files; it is the only thing that deletes them. No TTL is set inside Curvine:
    v0.3.2-alpha would also stamp it on directories and delete them (docs/l2-cache.md, "Day
    two"), and Curvine's quota eviction is rendered off (``k8s.curvine_config.cluster_conf``), so
    a later Curvine whose quota eviction works cannot delete files beside the janitor with a
    policy of its own. (The fields that only filled Curvine's quota-eviction keys are gone:
    :data:`REMOVED_KEYS`.)
    """

    #: The janitor deletes chunk files stored (mtime) longer ago than this; 0 = no age limit
    #: (the watermarks still bound each line's size).
    ttl_hours: Annotated[float, Field(ge=0, le=24 * 365)] = 24
    #: Share of a line's l2_size above which the janitor deletes the oldest chunk files ...
    high_watermark: Annotated[float, Field(gt=0, le=1)] = 0.8
    #: ... until the line's directory is at most this share of l2_size.
    low_watermark: Annotated[float, Field(gt=0, le=1)] = 0.6

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> "CurvineEvictionConfig":
        if self.low_watermark >= self.high_watermark:
            raise FieldError("low_watermark", 
                f"low_watermark ({self.low_watermark}) must be below high_watermark ({self.high_watermark}); "
                f"allowed: a low_watermark below {self.high_watermark}"
            )
        return self


class MountWatchdogConfig(StrictModel):
    """The L2 mount watchdog (``k8s/mount_watchdog.py``, ``cluster_agents/l2_mount_watchdog.py``): a pod
    per HyperPod node that finds every pod whose Curvine L2 mount is dead (its FUSE session was
    restarted under it) and heals it (docs/l2-cache.md, "Dead L2 mounts").

    Defaults: a dead mount is seen within one ``period_seconds`` (30 s); a FUSE answer slower
    than ``probe_timeout_seconds`` (10 s) marks the mount hung (never healed); one eviction per
    node per ``eviction_interval_seconds`` (60 s), so the up to 8 L2 pods of a node whose FUSE pod
    restarted come back one after another, within about 8 minutes, not all at once.

    A FUSE session hung for ``replace_hung_after_seconds`` (300 s: ten passes in a row, a hundred
    times the 3 s within which the FUSE pods' Curvine client ends any operation,
    ``k8s/curvine_config.py``) is replaced: its FUSE pod is deleted, on at most
    ``max_nodes_replacing`` nodes of the cluster at a time (docs/l2-cache.md, "A wedged FUSE session").

    Raises (at load):
        ValueError: ``probe_timeout_seconds`` not below ``period_seconds``,
            ``eviction_interval_seconds`` below ``period_seconds``, or ``replace_hung_after_seconds``
            neither 0 nor at least ``period_seconds``.
    """

    #: Deploy the watchdog DaemonSet (and its metrics, alert and RBAC).
    enabled: bool = True
    #: Evict pods with a dead mount and unmount the dead binds of terminating pods. False: report
    #: only; the DaemonSet then runs unprivileged and gets no eviction right.
    heal: bool = True
    #: Seconds between the starts of two passes.
    period_seconds: Annotated[int, Field(ge=10, le=300)] = 30
    #: A mount whose ``statvfs`` has not answered after this many seconds is hung.
    probe_timeout_seconds: Annotated[int, Field(ge=1, le=120)] = 10
    #: At most one eviction per node per this many seconds.
    eviction_interval_seconds: Annotated[int, Field(ge=10, le=3600)] = 60
    #: Replace a node's FUSE session (delete its FUSE pod) when it has been hung in every pass for
    #: this many seconds; 0: never. Only with ``heal``.
    replace_hung_after_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    #: At most this many nodes of the cluster replace a hung FUSE session at once, each until its
    #: mounts are all alive again.
    max_nodes_replacing: Annotated[int, Field(ge=1, le=64)] = 1

    @model_validator(mode="after")
    def _bounds_ordered(self) -> "MountWatchdogConfig":
        if self.probe_timeout_seconds >= self.period_seconds:
            raise ValueError(f"probe_timeout_seconds ({self.probe_timeout_seconds}) must be below "
                             f"period_seconds ({self.period_seconds}): a pass must end before the next starts; allowed: "
                             f"at most {self.period_seconds - 1}")
        if self.eviction_interval_seconds < self.period_seconds:
            raise ValueError(f"eviction_interval_seconds ({self.eviction_interval_seconds}) must be at least "
                             f"period_seconds ({self.period_seconds}); allowed: {self.period_seconds} or more")
        if 0 < self.replace_hung_after_seconds < self.period_seconds:
            raise ValueError(f"replace_hung_after_seconds ({self.replace_hung_after_seconds}) must be 0 (never) or "
                             f"at least period_seconds ({self.period_seconds}); allowed: 0, or {self.period_seconds} "
                             "or more")
        return self


class NodeFirewallConfig(StrictModel):
    """The node filter of Curvine's host-network ports (``k8s/node_firewall.py``,
    ``cluster_agents/node_firewall.py``): a pod per HyperPod node that keeps an nftables table
    admitting the Workers' and FUSE pods' ports only from loopback, the cluster's Nodes and Curvine's
    own pods (docs/security.md, docs/l2-cache.md "The node filter").

    Loaded on every change of the Nodes or Curvine's pods (watched) and every ``period_seconds``.
    Nothing is loaded until the agent first lists both; after that, an unreachable API keeps the last
    peer set.
    """

    #: Deploy the DaemonSet (and its RBAC). false: the host-network ports stay open to every pod of
    #: the same node (docs/security.md).
    enabled: bool = True
    #: Seconds between two loads when nothing changes (a table someone removed comes back).
    period_seconds: Annotated[int, Field(ge=5, le=3600)] = 60


#: ``curvine.worker_data_dir``: a directory below /opt/dlami/nvme or /opt/sagemaker
#: (``hyperpod_rules.INSTANCE_STORE_MOUNTS``, where ``lifecycle/on_create.sh`` looks for instance
#: storage; docs/sources.md §10).
WORKER_DATA_DIR_PATTERN = (
    "^(" + "|".join(re.escape(m) for m in hp_rules.INSTANCE_STORE_MOUNTS) + r")(/[A-Za-z0-9_.-]+)+$")


def _check_worker_data_dir(path: str) -> str:
    parts = path.split("/")
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"{path!r}: '.' and '..' are not allowed; give the plain path")
    if path.startswith("/opt/sagemaker/containerd") and path[len("/opt/sagemaker/containerd"):][:1] in ("", "/"):
        raise ValueError(f"{path!r}: /opt/sagemaker/containerd holds containerd's image store "
                         "(lifecycle/on_create.sh); allowed: another directory, e.g. /opt/sagemaker/curvine-data")
    return path


class CurvineConfig(StrictModel):
    """The L2 tier: Curvine Primary on EBS, Workers on each GPU node's NVMe, CSI StorageClass."""

    enabled: bool = True
    namespace: DnsLabel = "curvine"
    primary_volume: CurvinePrimaryVolumeConfig = CurvinePrimaryVolumeConfig()
    #: Where Workers keep KV blocks on each GPU node (the Worker's hostPath). Under one of the
    #: instance-store mounts lifecycle/on_create.sh knows (/opt/dlami/nvme, /opt/sagemaker); the
    #: script puts it on whichever of them is instance storage on the node.
    worker_data_dir: Annotated[str, StringConstraints(pattern=WORKER_DATA_DIR_PATTERN),
                               AfterValidator(_check_worker_data_dir)] = "/opt/dlami/nvme/curvine-data"
    #: Capacity bound per Worker, GiB of NVMe; leave headroom for model weights and logs.
    worker_capacity_gib: Annotated[int, Field(ge=1)] = 1000
    #: Instance groups whose nodes run a Worker (empty: every group).
    worker_instance_groups: tuple[HyperPodName, ...] = ()
    storage_class_name: DnsLabel = "curvine-sc"
    #: Root directory in Curvine under which each PV gets ``<fs_path>/<pv-name>``.
    fs_path: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._/-]*$")] = "/kvcache"
    eviction: CurvineEvictionConfig = CurvineEvictionConfig()
    #: Fraction of the pool (Workers x worker_capacity_gib) kept out of the lines' l2_size sum:
    #: room for what lines write between two janitor runs and for a Worker being replaced.
    l2_pool_reserve_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.1
    #: Detects and heals dead L2 mounts on every HyperPod node (:class:`MountWatchdogConfig`).
    mount_watchdog: MountWatchdogConfig = MountWatchdogConfig()
    #: Closes the Workers' and FUSE pods' host-network ports to everything but Curvine's own peers, on
    #: every HyperPod node (:class:`NodeFirewallConfig`).
    node_firewall: NodeFirewallConfig = NodeFirewallConfig()


class AddonVersions(StrictModel):
    """Pinned EKS add-on versions, each offered for ``eks.version``
    (``aws eks describe-addon-versions --kubernetes-version <eks.version>``).

    ``vpc-cni``, ``coredns`` and ``kube-proxy`` follow ``eks.version``: left out, they are the pins of
    its row in :data:`platform_config.kubernetes_versions.KUBERNETES_RELEASES` (docs/sources.md §15);
    set one only to override that row. Synthesis is offline, so ``scripts/preflight.py`` confirms
    every pin is offered for the cluster's version before a deploy; ``kube-proxy``'s minor version
    must equal ``eks.version`` (checked here). Minimums for the inference add-on's dependencies come
    from docs/sources.md §1; where each other example pin comes from: docs/sources.md §11.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    #: Default: the row of ``eks.version`` (platform_config/kubernetes_versions.py).
    vpc_cni: PinnedVersion | None = Field(default=None, alias="vpc-cni")
    #: Default: the row of ``eks.version``.
    coredns: PinnedVersion | None = None
    #: Default: the row of ``eks.version``; an override must be ``v<eks.version>.<patch>-eksbuild.<n>``.
    kube_proxy: PinnedVersion | None = Field(default=None, alias="kube-proxy")
    eks_pod_identity_agent: PinnedVersion = Field(alias="eks-pod-identity-agent")
    aws_ebs_csi_driver: PinnedVersion = Field(alias="aws-ebs-csi-driver")
    aws_mountpoint_s3_csi_driver: PinnedVersion = Field(alias="aws-mountpoint-s3-csi-driver")
    aws_fsx_csi_driver: PinnedVersion = Field(alias="aws-fsx-csi-driver")
    metrics_server: PinnedVersion = Field(alias="metrics-server")
    cert_manager: PinnedVersion = Field(alias="cert-manager")
    amazon_sagemaker_hyperpod_inference: PinnedVersion = Field(alias="amazon-sagemaker-hyperpod-inference")


#: The core add-ons whose pins follow ``eks.version``: alias -> field name.
VERSION_COUPLED_ADDONS = {"vpc-cni": "vpc_cni", "coredns": "coredns", "kube-proxy": "kube_proxy"}


#: A chart archive's SHA-256, as a classic Helm repository's ``index.yaml`` lists it (``digest``).
CHART_DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
def repository_path(path: str) -> Path:
    """A path written in the config on disk: absolute as it is, relative from the repository root
    (the HyperPod dependency chart's folder, a Helm chart's archive)."""
    given = Path(path)
    return given if given.is_absolute() else Path(__file__).resolve().parents[1] / given


def chart_digest(archive: bytes) -> str:
    """The ``digest`` of a chart archive's bytes as the config writes it: ``sha256:<64 lowercase hex>``
    (a Helm repository index lists the hex alone: docs/sources.md §34)."""
    return f"sha256:{hashlib.sha256(archive).hexdigest()}"


#: A Helm chart's name: it also names the archive file (``<chart>-<version>.tgz``), so no ``/``.
CHART_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def _check_archive_path(path: str) -> str:
    """A chart archive's path: a ``.tgz`` file, no ``..`` part (the vendoring script writes there)."""
    if not path.endswith(".tgz") or ".." in Path(path).parts:
        raise ValueError(f"archive {path!r}: allowed: a path to a .tgz file without '..' parts, relative to the "
                         "repository root (e.g. charts/kyverno-3.5.2.tgz) or absolute")
    return path


class HelmChartVersion(StrictModel):
    """A Helm chart pinned by repository, chart name and exact version, and optionally by digest.

    By version only, the kubectl handler fetches ``<chart>`` ``<version>`` from ``repository`` at
    deploy time (``helm upgrade --install --version``): whoever controls the repository decides the
    bytes installed, since ``eks.HelmChart`` has no option that checks a digest. With ``digest``, the
    chart is installed from the archive committed at ``archive`` instead (an S3 asset, as the HyperPod
    dependency chart is), and synthesis refuses an archive whose SHA-256 is not ``digest`` or whose
    ``Chart.yaml`` is not this chart and version (kv_constructs/helm_charts.py). ``scripts/vendor_chart.py``
    downloads the archive, checks it against the repository's ``index.yaml`` and prints the digest
    (docs/security.md, "Helm charts by digest").
    """

    repository: Annotated[str, StringConstraints(pattern=r"^(https|oci)://\S+$")]
    #: The chart's name in the repository (Helm: letters, digits, ``-``, ``_``, ``.``; it names the archive).
    chart: Annotated[str, StringConstraints(pattern=CHART_NAME_PATTERN)]
    version: PinnedVersion
    #: ``sha256:<64 lowercase hex>``: the SHA-256 of the chart archive (``.tgz``), the ``digest`` of
    #: this version in the repository's ``index.yaml`` (Helm, "The Chart Repository Guide").
    digest: Annotated[str, StringConstraints(pattern=CHART_DIGEST_PATTERN)] | None = None
    #: Where the archive is, relative to the repository root (or absolute); default
    #: ``charts/<chart>-<version>.tgz``, the name ``helm pull`` and ``scripts/vendor_chart.py`` write.
    #: Read only with ``digest``.
    archive: Annotated[str, StringConstraints(min_length=1), AfterValidator(_check_archive_path)] | None = None

    @property
    def archive_path(self) -> str:
        """``archive`` or its default, ``charts/<chart>-<version>.tgz``, as written in the config."""
        return self.archive or f"charts/{self.chart}-{self.version}.tgz"

    def archive_file(self) -> Path:
        """:attr:`archive_path` on disk (:func:`repository_path`)."""
        return repository_path(self.archive_path)


class ChartVersions(StrictModel):
    """Helm charts the CDK app installs."""

    kyverno: HelmChartVersion
    #: Every Helm chart the platform installs from a repository (``versions.charts.kyverno`` with
    #: Curvine, ``observability.dcgm_exporter.chart`` when installed) must have a ``digest``: a chart
    #: pinned by version only is then a config error, not a deploy that trusts the repository.
    require_digests: bool = False


class ImageVersions(StrictModel):
    """Container images of the platform (business lines pin their own vLLM image)."""

    curvine: PinnedImage
    curvine_csi: PinnedImage
    csi_node_driver_registrar: PinnedImage
    csi_provisioner: PinnedImage
    livenessprobe: PinnedImage
    #: Runs each line's L2 janitor (cluster_agents/l2_janitor.py) and cross-pod hit canary
    #: (cluster_agents/kv_canary.py), both standard library only, shipped in ConfigMaps, and the
    #: privileged L2 mount watchdog in the Curvine namespace: any pinned Python >= 3.10 image.
    l2_janitor: PinnedImage = "python:3.12.8-slim-bookworm"
    #: Runs the node filter's agent (cluster_agents/node_firewall.py): needs ``python3`` (3.10 or later)
    #: and ``nft`` (nftables) in the image, nothing installed at start. nicolaka/netshoot v0.16 has
    #: both (its Dockerfile at that tag: alpine 3.24.1 with ``nftables`` and ``py3-pip``); it is a
    #: large toolbox, so pin a smaller image of your own (python slim + nftables) by digest where
    #: you can (docs/security.md, "The node filter").
    node_firewall: PinnedImage = "nicolaka/netshoot:v0.16"
    #: Every image of this section must be pinned by digest (``<repository>[:<tag>]@sha256:<64 hex>``;
    #: resolve a tag once with ``crane digest <image>`` or ``docker buildx imagetools inspect
    #: <image>``, docs/security.md "Image digests"). Whether or not this is set, when every image
    #: that runs in the Curvine namespace is pinned by digest, an admission policy there admits
    #: only those images (k8s/image_digests.py); this makes a tag an error instead of a policy
    #: silently left out.
    require_digests: bool = False

    @model_validator(mode="after")
    def _digests_when_required(self) -> "ImageVersions":
        if self.require_digests:
            for field in IMAGE_FIELDS:
                image = getattr(self, field)
                if not is_digest_pinned(image):
                    raise FieldError(field, (
                        f"versions.images.require_digests is true, but {field} {image!r} is not pinned by digest; "
                        f"allowed: <repository>[:<tag>]@sha256:<64 lowercase hex digits> (resolve it with "
                        f"`crane digest {image}` or `docker buildx imagetools inspect {image}`), or "
                        f"require_digests: false"))
        return self


#: The image fields of :class:`ImageVersions`, in declaration order.
IMAGE_FIELDS: tuple[str, ...] = ("curvine", "curvine_csi", "csi_node_driver_registrar", "csi_provisioner",
                                 "livenessprobe", "l2_janitor", "node_firewall")


class VersionsConfig(StrictModel):
    """Every version the platform deploys, pinned in one place."""

    addons: AddonVersions
    charts: ChartVersions
    images: ImageVersions


class InferenceGatewayConfig(StrictModel):
    """The inference gateway of the ``amazon-sagemaker-hyperpod-inference`` add-on (v2.0.0-eksbuild.2 and later).

    AWS's gateway guide (docs/sources.md §31, "Prerequisites and deployment") documents the add-on keys
    ``inferenceGateway.enabled`` and ``inferenceGateway.serviceAccount.roleArn`` for the version pinned:
    the role has the AWS managed policy ``AmazonSageMakerHyperPodInferenceGatewayAccess``, is trusted by
    ``system:serviceaccount:hyperpod-inference-system:inference-gateway-controller`` and must exist
    before the add-on. Installing the add-on "makes the gateway available" and TLS auto-issue "is
    enabled by default", so with the gateway off the platform sends ``inferenceGateway.enabled: false``
    explicitly (``set_in_addon``, default true) rather than rely on the add-on's own default.
    A business line with ``routing_strategy: gateway`` is routed by the gateway and needs
    ``enabled: true``; every other line keeps the operator's own load balancer and intelligent routing
    (docs/routing.md).
    """

    #: false: no gateway. true: the platform creates the gateway's IRSA role and sends
    #: ``inferenceGateway: {enabled: true, serviceAccount: {roleArn}}``.
    enabled: bool = False
    #: With ``enabled: false``: true (default) sends ``inferenceGateway.enabled: false`` explicitly,
    #: the key AWS's gateway guide documents for the pinned add-on (docs/sources.md §31), so the add-on
    #: runs no gateway nobody configured; false leaves the key out, only for an add-on version whose
    #: configuration schema lacks it (scripts/preflight.py reports which, and fails when a schema that
    #: has the key does not default it off while it is left out). Ignored with ``enabled: true``.
    set_in_addon: bool = True
    #: Kubernetes ServiceAccount of the gateway controller in ``hyperpod-inference-system``, which the
    #: gateway's IAM role trusts. Default ``inference-gateway-controller``: the name AWS's gateway guide
    #: gives in the role's trust policy and its RBAC section (docs/sources.md §31).
    service_account: DnsLabel = "inference-gateway-controller"


class InferenceOperatorConfig(StrictModel):
    """Settings of the HyperPod inference operator add-on beyond its pinned version.

    ``load_balancer_scheme`` decides who can reach the business lines' endpoints: ``internal``
    (default) puts the operator's load balancers in the private subnets only, reachable inside the
    VPC (and peered networks); ``internet-facing`` puts them in the public subnets. The network
    stack tags subnets to match (``kubernetes.io/role/internal-elb`` on private subnets;
    ``kubernetes.io/role/elb`` on public subnets only when internet-facing; with ``internal`` the
    public subnets also carry a cluster tag of another cluster, which takes them out of the load
    balancer controllers' subnet discovery). So with ``internal`` no subnet can take an
    internet-facing load balancer: one asked for is not created (it does not become internal).
    The tags do not choose the scheme of what is asked for (docs/deploy.md "Load-balancer scheme";
    docs/sources.md §11). With ``set_scheme_in_addon`` the scheme is also forced on the
    controller's IngressClass.
    """

    #: internal: endpoints reachable only from inside the VPC (no public endpoint);
    #: internet-facing: load balancers in the public subnets (needs network.mode create).
    load_balancer_scheme: Literal["internal", "internet-facing"] = "internal"
    #: Also pass the scheme as ``alb.ingressClassParams.spec.scheme`` in the add-on's
    #: configuration (forces it on every Ingress of the controller's class). Off by default: no
    #: AWS source shows that key in the add-on's configuration (only in the bundled controller
    #: chart's values). Set true once scripts/preflight.py shows the pinned version's schema has it.
    set_scheme_in_addon: bool = False
    gateway: InferenceGatewayConfig = InferenceGatewayConfig()


class GrafanaWorkspaceConfig(StrictModel):
    """The Amazon Managed Grafana workspace that shows the generated dashboards (docs/observability.md).

    A workspace needs a sign-in method: ``AWS_SSO`` (IAM Identity Center enabled in the account or
    its organization) or ``SAML`` (configure the identity provider in the console afterwards).
    """

    #: true: the observability stack creates a workspace that reads only this platform's
    #: Prometheus workspace and provisions the data source and the dashboards into it at deploy;
    #: false: use a Grafana of your own and import the dashboard JSON.
    create_workspace: bool = True
    #: Sign-in method of the workspace.
    authentication: Literal["AWS_SSO", "SAML"] = "AWS_SSO"
    #: Grafana version of the workspace (versions Amazon Managed Grafana offers).
    version: Literal["9.4", "10.4"] = "10.4"
    #: Who can reach the workspace's URL (its network access control; Grafana sign-in is required
    #: either way). private (default): only through an interface VPC endpoint
    #: (`com.amazonaws.<region>.grafana-workspace`) the observability stack creates in the platform
    #: VPC's private subnets, and from the public IPv4 ranges of `prefix_list_ids`; the provisioning
    #: Lambda then runs in those subnets. public: from anywhere on the internet (Amazon Managed
    #: Grafana's own default). docs/observability.md, "Reaching a private workspace".
    network_access: Literal["private", "public"] = "private"
    #: With private: IDs of customer-managed prefix lists (pl-...) of public IPv4 ranges that may
    #: also reach the workspace over the internet (an office's egress addresses). Amazon Managed
    #: Grafana accepts only public IPv4 addresses here; private ranges arrive through the endpoint.
    prefix_list_ids: tuple[Annotated[str, StringConstraints(pattern=r"^pl-[0-9a-f]{8,17}$")], ...] = ()
    #: With private: IPv4 networks besides the VPC's own CIDR whose HTTPS the endpoint admits (a/n,
    #: /8 to /32): on-premises networks over VPN or Direct Connect, a peered VPC. Never the whole
    #: internet: networks that together cover every IPv4 address are refused.
    endpoint_client_cidrs: tuple[ipv4_network(8, 32), ...] = ()  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _allow_lists_only_when_private(self) -> "GrafanaWorkspaceConfig":
        if self.network_access == "public":
            for field in ("prefix_list_ids", "endpoint_client_cidrs"):
                if getattr(self, field):
                    raise FieldError(field, f"{field} is set but network_access is 'public' (the workspace is then "
                                            "open to every address, and the list would narrow nothing); allowed: "
                                            f"no {field}, or network_access private")
        networks = [ipaddress.IPv4Network(c) for c in self.endpoint_client_cidrs]
        if networks and list(ipaddress.collapse_addresses(networks)) == [ipaddress.IPv4Network("0.0.0.0/0")]:
            raise FieldError("endpoint_client_cidrs",
                             f"endpoint_client_cidrs {', '.join(self.endpoint_client_cidrs)} together cover every "
                             "IPv4 address; allowed: the networks that reach the VPC privately, e.g. [10.0.0.0/8]")
        return self


class DcgmExporterConfig(StrictModel):
    """NVIDIA DCGM exporter (GPU metrics), installed on the HyperPod nodes from its Helm chart."""

    #: false: a DCGM exporter already runs on the GPU nodes (say, from the GPU operator) and is
    #: scraped by its pod label ``app.kubernetes.io/name=dcgm-exporter``; nothing is installed.
    install: bool = True
    chart: HelmChartVersion = HelmChartVersion(
        repository="https://nvidia.github.io/dcgm-exporter/helm-charts", chart="dcgm-exporter", version="4.8.2")


#: An email address (the SNS email protocol's endpoint).
EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"


class AlertsConfig(StrictModel):
    """Alert thresholds and who is notified (the SNS topic of the observability stack)."""

    #: Email addresses subscribed to the alert topic; each must confirm the subscription mail.
    email_subscriptions: tuple[Annotated[str, StringConstraints(pattern=EMAIL_PATTERN)], ...] = ()

    @field_validator("email_subscriptions")
    @classmethod
    def _each_address_once(cls, addresses: tuple[str, ...]) -> tuple[str, ...]:
        seen: set[str] = set()
        twice = sorted({a for a in addresses if a.lower() in seen or seen.add(a.lower())})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once (e-mail addresses are compared without "
                             "case); allowed: each address once")
        return addresses
    #: Fire when the Curvine pool (all Workers) is fuller than this share of its capacity.
    pool_usage_threshold: Annotated[float, Field(gt=0, le=1)] = 0.85
    #: L2 hit rate "collapses" when the last 15 minutes reach less than this share of the
    #: line's L2 hit rate over the 6 hours before (a model change or a wiped directory).
    l2_hit_rate_collapse_ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5
    #: ... and only for lines whose 6-hour L2 hit rate (L2 tokens / prompt tokens) was at least this.
    l2_hit_rate_baseline_min: Annotated[float, Field(gt=0, lt=1)] = 0.05
    #: The cross-pod hit canary's alert fires when its ratio (L2-served share of the canary
    #: prompt on the second replica; 1 when L2 works) is below this in ``canary_low_runs`` runs
    #: in a row. 0.5: a working L2 serves every full chunk of the fresh prompt.
    canary_min_hit_ratio: Annotated[float, Field(gt=0, le=1)] = 0.5
    #: Runs in a row (each ``canary.period_minutes`` apart) the ratio must stay low; at least 2,
    #: so one failed run (a replica restarting) does not page.
    canary_low_runs: Annotated[int, Field(ge=2, le=12)] = 3


class ObservabilityConfig(StrictModel):
    """Metrics, dashboards and alerts (docs/observability.md).

    Collection: an Amazon Managed Service for Prometheus workspace fed by an AMP managed scraper
    (agentless, runs outside the cluster); dashboards for Amazon Managed Grafana generated from
    config; alert rules and an alert manager in the workspace notifying an encrypted SNS topic.
    """

    #: false: no observability stack, no exporter, no dashboards.
    enabled: bool = True
    #: Namespace of the DCGM exporter.
    namespace: DnsLabel = "kvcache-monitoring"
    #: Seconds between two scrapes of every target; AMP managed collectors accept 30 s and more.
    scrape_interval_seconds: Annotated[int, Field(ge=30, le=300)] = 30
    grafana: GrafanaWorkspaceConfig = GrafanaWorkspaceConfig()
    dcgm_exporter: DcgmExporterConfig = DcgmExporterConfig()
    alerts: AlertsConfig = AlertsConfig()
    #: Key that encrypts the Prometheus workspace at rest (AMP encrypts every workspace).
    #: aws-owned (default): AMP's own key. customer-managed: the stack's KMS key (rotation on,
    #: which also encrypts the alert topic either way), for audit and control of the key; but an
    #: older copy of the AMP user guide said workspaces created with customer managed keys cannot
    #: use AWS managed collectors, the scraper this stack uses (newer copies omit the sentence;
    #: unresolved, docs/sources.md §13): check the scraper becomes ACTIVE on the first deploy.
    #: Fixed at creation: a change replaces the workspace (its metrics, rules and alert manager).
    workspace_key: Literal["aws-owned", "customer-managed"] = "aws-owned"


class L2GateSettings(StrictModel):
    """The L2 gate every vLLM pod of an L2 line loads (``vllm_plugins/l2_gate.py``; docs/l2-cache.md,
    "When the L2 hangs: the L2 gate"), rendered as its ``KVCACHE_L2_GATE_*`` environment. Defaults
    and their reasons are the gate's own (:class:`vllm_plugins.l2_gate.GateSettings`)."""

    #: Off: the pods run LMCache's connector as if there were no gate (`KVCACHE_L2_GATE_ENABLED=0`),
    #: so every request arriving while the L2 hangs holds the whole engine for `lookup_timeout_ms`.
    enabled: bool = True
    #: A probe of the L2 mount (a `stat`) outstanding longer than this opens the gate, in ms. Raise it
    #: when `kvcache_l2_gate_transitions_total` counts opens while the mount is fine (a loaded
    #: Primary, busy nodes); the detection window grows with it.
    open_after_ms: Annotated[int, Field(ge=10, le=10000)] = 50
    #: A real LMCache lookup slower than this opens the gate too, in ms; below `lookup_timeout_ms`.
    lookup_slow_ms: Annotated[int, Field(ge=10, le=10000)] = 100
    #: How long probes must answer without a break before the gate closes, in ms.
    close_after_ms: Annotated[int, Field(ge=50, le=60000)] = 500


class LMCacheSettings(StrictModel):
    """Platform-wide LMCache settings of every inference pod."""

    #: LMCache's anonymous usage telemetry. LMCache reports usage to its maintainers' server and
    #: writes a machine id under `$HOME/.config/lmcache` unless `LMCACHE_TRACK_USAGE=false` or
    #: `DO_NOT_TRACK=1` (lmcache/usage_telemetry/identity.py, docs/sources.md §8). Off (both
    #: set) unless this is true; a private inference cluster should not phone home.
    usage_telemetry: bool = False
    #: How long vLLM's scheduler waits for an LMCache lookup, in ms, before it counts the
    #: request as a miss (`LMCACHE_LOOKUP_TIMEOUT_MS`; LMCache 0.5.5's default is 3,000). The
    #: most an unhealthy L2 (an absent Curvine Primary, a hung FUSE mount) adds to a request's
    #: lookup, and the time it holds the scheduler meanwhile; a healthy lookup slower than this
    #: (very long prompts on a slow file system) loses its hit. Must be below every L2 line's
    #: `slo.ttft_p90_ms`. 200 ms: rag-assistant's cold prefill of about 774 ms (docs/sources.md
    #: §1) plus 200 ms stays under its 1,000 ms SLO; measured by `make test-faults`
    #: (docs/l2-cache.md, "The fault tier").
    lookup_timeout_ms: Annotated[int, Field(ge=20, le=3000)] = 200
    #: How long an LMCache retrieve waits for each chunk read from L2, in whole seconds, before
    #: it gives up and the rest is recomputed (`LMCACHE_BLOCKING_TIMEOUT_SECS`; LMCache 0.5.5
    #: reads it with `int()`, default 10). 1 is the smallest that LMCache can express; it bounds
    #: what a failing L2 adds to a request whose lookup found its prefix just before the fault.
    blocking_timeout_secs: Annotated[int, Field(ge=1, le=10)] = 1
    #: The L2 gate in front of LMCache's lookups (docs/l2-cache.md, "When the L2 hangs").
    l2_gate: L2GateSettings = L2GateSettings()

    @model_validator(mode="after")
    def _slow_lookup_below_the_timeout(self) -> "LMCacheSettings":
        if self.l2_gate.lookup_slow_ms >= self.lookup_timeout_ms:
            raise FieldError("l2_gate.lookup_slow_ms",
                             f"l2_gate.lookup_slow_ms {self.l2_gate.lookup_slow_ms} is not below lookup_timeout_ms "
                             f"{self.lookup_timeout_ms}: a lookup ends at the timeout, so a slow one would never "
                             f"open the gate; allowed: 10 to {self.lookup_timeout_ms - 1}")
        return self


class PlatformConfig(StrictModel):
    """``config/platform.yaml``: everything shared by all business lines."""

    project: DnsLabel = "kvcache"
    account: Annotated[str, StringConstraints(pattern=AWS_ACCOUNT_PATTERN)]
    region: Annotated[str, StringConstraints(pattern=AWS_REGION_PATTERN)]
    #: Zone *names* (e.g. us-west-2a), given explicitly so synth never looks them up. The
    #: EKS control plane needs subnets in at least two zones.
    availability_zones: Annotated[
        tuple[Annotated[str, StringConstraints(pattern=AZ_NAME_PATTERN)], ...], Field(min_length=2, max_length=6)
    ]
    #: The zone where the GPU capacity (and so the HyperPod subnet and the Curvine Primary's
    #: EBS volume) is; must be one of ``availability_zones``.
    gpu_availability_zone: Annotated[str, StringConstraints(pattern=AZ_NAME_PATTERN)]
    network: NetworkConfig = CreateVpcConfig()
    eks: EksConfig = EksConfig()
    hyperpod: HyperPodConfig
    curvine: CurvineConfig = CurvineConfig()
    versions: VersionsConfig
    #: The inference operator add-on: load-balancer scheme, inference gateway.
    inference_operator: InferenceOperatorConfig = InferenceOperatorConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    tags: dict[str, str] = Field(default_factory=dict)
    lmcache: LMCacheSettings = LMCacheSettings()
    #: true: a config without any business line is meant (the platform alone). false (default): an
    #: empty or missing business-lines/ is an error, since scripts/orphans.py --destroy would then
    #: delete every deployed line stack.
    allow_no_business_lines: bool = False

    def curvine_worker_groups(self) -> list[InstanceGroupConfig]:
        """The instance groups whose nodes run a Curvine Worker: ``curvine.worker_instance_groups``,
        every group when that is empty (whether Curvine is enabled is the caller's question)."""
        names = self.curvine.worker_instance_groups
        return [g for g in self.hyperpod.instance_groups if not names or g.name in names]

    @model_validator(mode="before")
    @classmethod
    def _core_addons_follow_kubernetes(cls, data: Any) -> Any:
        """Fill the left-out ``vpc-cni``/``coredns``/``kube-proxy`` pins from ``eks.version``'s row.

        A version without a row is left alone: the ``eks.version`` field reports it.
        """
        if not isinstance(data, dict):
            return data
        eks = data.get("eks", {})
        version = eks.get("version", k8s_versions.DEFAULT_KUBERNETES_VERSION) if isinstance(eks, dict) else \
            getattr(eks, "version", None)
        row = k8s_versions.KUBERNETES_RELEASES.get(str(version))
        versions = data.get("versions")
        if row is None or not isinstance(versions, dict) or not isinstance(versions.get("addons"), dict):
            return data
        addons = dict(versions["addons"])
        for alias, field in VERSION_COUPLED_ADDONS.items():
            if addons.get(alias) is None and addons.get(field) is None:
                addons.pop(field, None)
                addons[alias] = row.addon_pins[alias]
        return {**data, "versions": {**versions, "addons": addons}}

    @model_validator(mode="after")
    def _kube_proxy_matches_kubernetes(self) -> "PlatformConfig":
        # kube-proxy is built per Kubernetes minor version (v1.33.x-eksbuild.N for 1.33; EKS
        # user guide, "Manage kube-proxy"); another minor is refused by EKS or skews the nodes.
        kube_proxy = self.versions.addons.kube_proxy
        if not kube_proxy.startswith(f"v{self.eks.version}."):
            raise FieldError("versions.addons.kube-proxy", f"versions.addons.kube-proxy {kube_proxy} does not match eks.version "
                             f"{self.eks.version}; allowed: v{self.eks.version}.<patch>-eksbuild.<n>")
        return self

    def helm_chart_pins(self) -> dict[str, HelmChartVersion]:
        """The Helm charts this platform installs from a repository, by config field (dotted path):
        ``versions.charts.kyverno`` with Curvine, ``observability.dcgm_exporter.chart`` when installed."""
        pins: dict[str, HelmChartVersion] = {}
        if self.curvine.enabled:
            pins["versions.charts.kyverno"] = self.versions.charts.kyverno
        if self.observability.enabled and self.observability.dcgm_exporter.install:
            pins["observability.dcgm_exporter.chart"] = self.observability.dcgm_exporter.chart
        return pins

    @model_validator(mode="after")
    def _charts_by_digest_when_required(self) -> "PlatformConfig":
        if not self.versions.charts.require_digests:
            return self
        for field, pin in self.helm_chart_pins().items():
            if pin.digest is None:
                raise FieldError(f"{field}.digest", (
                    f"versions.charts.require_digests is true, but {field} ({pin.chart} {pin.version}) has no "
                    f"digest; allowed: sha256:<64 lowercase hex digits>, its archive committed at {pin.archive_path} "
                    f"(scripts/vendor_chart.py writes both), or require_digests: false"))
        return self

    @model_validator(mode="after")
    def _internet_facing_needs_public_subnets(self) -> "PlatformConfig":
        if (self.inference_operator.load_balancer_scheme == "internet-facing"
                and isinstance(self.network, ExistingVpcConfig)):
            raise FieldError("inference_operator.load_balancer_scheme", "inference_operator.load_balancer_scheme 'internet-facing' needs public subnets, "
                             "which this platform creates only with network.mode 'create'; with an existing VPC "
                             "use 'internal' (tag the public subnets kubernetes.io/role/elb yourself to go public); "
                             "allowed: internal, or network.mode create")
        return self

    @model_validator(mode="after")
    def _zones_consistent(self) -> "PlatformConfig":
        zones = self.availability_zones
        repeated = sorted({z for z in zones if zones.count(z) > 1})
        if repeated:
            raise FieldError("availability_zones", f"repeats {', '.join(repeated)}; allowed: each zone once")
        # A zone name is its region's name plus one letter (us-west-2a); the pattern checked the shape.
        outside = [z for z in zones if z[:-1] != self.region]
        if outside:
            raise FieldError("availability_zones", f"{', '.join(outside)} {'is' if len(outside) == 1 else 'are'} not in "
                                                   f"region {self.region}; allowed: zones of {self.region}, such as "
                                                   f"{self.region}a and {self.region}b")
        if self.gpu_availability_zone not in zones:
            where = ("" if self.gpu_availability_zone[:-1] == self.region
                     else f", and it is not in region {self.region}")
            raise FieldError(
                "gpu_availability_zone",
                f"{self.gpu_availability_zone} is not one of availability_zones{where}; allowed: {', '.join(zones)}")
        if isinstance(self.network, ExistingVpcConfig):
            missing = [z for z in zones if z not in self.network.private_subnet_ids]
            if missing:
                raise FieldError("network.private_subnet_ids",
                                 f"no subnet for zone(s) {', '.join(missing)}; allowed: a private subnet ID for "
                                 "every zone of availability_zones")
        groups = {g.name for g in self.hyperpod.instance_groups}
        unknown = [g for g in self.curvine.worker_instance_groups if g not in groups]
        if unknown:
            raise FieldError("curvine.worker_instance_groups", 
                f"curvine.worker_instance_groups names unknown group(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(groups))}"
            )
        return self


