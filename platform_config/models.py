"""Typed, validated configuration: ``config/platform.yaml`` and ``config/business-lines/*.yaml``.

Every model forbids unknown keys, so a misspelled field is an error rather than a silently
ignored setting. Field-level rules live on the fields; rules that span files (a business
line's instance type must be one of the platform's instance groups, ...) live in
:func:`platform_config.loader.load_project`.

Units are in the field names: ``*_gib`` is GiB (2^30 bytes), ``*_gb`` decimal GB where AWS
defines the unit that way (EBS ``VolumeSizeInGB`` is GiB in practice but named GB by the API;
we keep the API's name), ``*_mibps`` MiB/s.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from platform_config import hyperpod_rules as hp_rules
from platform_config import kubernetes_versions as k8s_versions
from platform_config import vllm_args as vllm_flags
from platform_config.instances import INSTANCE_TYPES
from platform_config.problems import FieldError

# --- reusable constrained types -------------------------------------------------------------

#: RFC 1123 label: Kubernetes namespaces, object names, and (being a subset) CloudFormation-safe.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=63)]

#: HyperPod ``InstanceGroupName`` / ``ClusterName`` pattern (docs/sources.md §2).
HYPERPOD_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"
HyperPodName = Annotated[str, StringConstraints(pattern=HYPERPOD_NAME_PATTERN, max_length=63)]

#: SageMaker instance type; the CRD demands ``^ml\\..*`` and we additionally require a known type.
MlInstanceType = Annotated[str, StringConstraints(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")]

def _check_known_instance_type(value: str) -> str:
    if value not in INSTANCE_TYPES:
        raise ValueError(f"unknown instance type; allowed: {', '.join(sorted(INSTANCE_TYPES))}")
    return value


#: An ``ml.*`` type listed in :data:`platform_config.instances.INSTANCE_TYPES`.
KnownInstanceType = Annotated[MlInstanceType, AfterValidator(_check_known_instance_type)]

#: Kubernetes resource quantity (``resource.Quantity`` grammar, decimal and binary suffixes).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"


def _quantity_from_number(value: Any) -> Any:
    """A YAML number written where a quantity goes (``cpu: 10``, ``l2_size: 0``) as its decimal
    string (``"10"``, ``"0"``; ``0.5`` -> ``"0.5"``, never exponent notation), as Kubernetes
    accepts an unquoted number in a quantity field; the pattern and the above-zero rule then judge
    it like the quoted string. Anything else (a string, a boolean) passes unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "nan": refused by the pattern, naming the value
    text = format(Decimal(repr(value)), "f") if isinstance(value, float) else str(value)
    return text.rstrip("0").rstrip(".") if "." in text else text


Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN), BeforeValidator(_quantity_from_number)]

_QUANTITY_SUFFIXES = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                      "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(quantity: str) -> float:
    """Value of a Kubernetes quantity (``QUANTITY_PATTERN``) in base units: ``"80Gi"`` -> 85899345920.0.

    Raises:
        ValueError: not a quantity.
    """
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)", quantity)
    if not match or match.group(2) not in _QUANTITY_SUFFIXES:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    return float(match.group(1)) * _QUANTITY_SUFFIXES[match.group(2)]


def _check_positive_quantity(value: str) -> str:
    """Reject zero sizes (``0Gi`` would render a 0-byte PVC); negatives fail the pattern already."""
    if quantity_bytes(value) <= 0:
        raise ValueError("must be above zero; allowed: a quantity above 0 such as 500Gi, 8 or 500m")
    return value


#: A :data:`Quantity` above zero (sizes, CPU and memory requests).
PositiveQuantity = Annotated[Quantity, AfterValidator(_check_positive_quantity)]

#: A CPU quantity: cores (``8``, ``0.5``) or millicores (``500m``); a YAML number is read as its
#: decimal string, as for :data:`Quantity`. The Kubernetes grammar would also take ``8Gi`` or ``8k``
#: (8,589,934,592 or 8,000 cores): a byte or decimal suffix on a CPU request is a unit mistake, so
#: the pattern admits none; its description (``loader.PATTERN_DESCRIPTIONS``) gives CPU examples.
CPU_QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?m?$"
CpuQuantity = Annotated[str, StringConstraints(pattern=CPU_QUANTITY_PATTERN), BeforeValidator(_quantity_from_number),
                        AfterValidator(_check_positive_quantity)]

#: The smallest pod memory request and L2 PVC size accepted, bytes (1 GiB). A vLLM pod holds GiBs
#: of host memory (the L1 buffer alone is GiBs) and one KV chunk of a 7B model is 14 MiB, so less
#: is a unit mistake: ``80`` without a suffix is 80 bytes, ``500m`` half a byte.
MIN_BYTES_QUANTITY = 2**30


def _check_bytes_quantity(value: str) -> str:
    if quantity_bytes(value) < MIN_BYTES_QUANTITY:
        raise ValueError(
            f"{value!r} is {quantity_bytes(value):,.3g} bytes, below 1Gi (a number without a suffix counts bytes, "
            "'m' thousandths of a byte); allowed: a byte quantity of at least 1Gi such as 80Gi or 2Ti")
    return value


#: A byte quantity of at least 1 GiB (pod memory, PVC sizes): :data:`MIN_BYTES_QUANTITY`.
BytesQuantity = Annotated[PositiveQuantity, AfterValidator(_check_bytes_quantity)]

#: Version strings are pinned exactly: no ``latest``, no ranges.
PINNED_VERSION_PATTERN = r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+.][0-9A-Za-z.-]+)?$"
PinnedVersion = Annotated[str, StringConstraints(pattern=PINNED_VERSION_PATTERN)]


def _check_image_pinned(image: str) -> str:
    """Reject images without an explicit tag or digest, and the mutable ``latest`` tag."""
    name, _, digest = image.partition("@")
    if digest:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise ValueError(f"digest of {image!r} must be sha256:<64 hex>")
        return image
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        raise ValueError(f"image {image!r} has no tag; pin a version tag or a sha256 digest")
    tag = last.rsplit(":", 1)[1]
    if tag == "latest" or not tag:
        raise ValueError(f"image {image!r} uses tag {tag!r}; pin a version tag or a sha256 digest")
    return image


PinnedImage = Annotated[str, AfterValidator(_check_image_pinned)]

#: The one LMCache release this platform is built and checked against: the env allow-list and
#: the table of unsafe defaults in ``k8s/lmcache.py`` are read from its source, and
#: ``make test-lmcache`` installs exactly this version from PyPI and runs it. A business line's
#: image must carry it (:attr:`VllmConfig.lmcache_release`); moving to another release means
#: changing this value, the image tags, and re-running ``make test-lmcache`` (which reports any
#: drift of the key list). Why 0.5.5: docs/l2-cache.md, "Which image and LMCache version".
LMCACHE_VERSION = "0.5.5"

#: Repository of LMCache's own vLLM images; their tag names the LMCache release inside
#: (``v0.5.5``, optionally with a build suffix such as ``v0.5.5-cu129``; docs/sources.md §8).
LMCACHE_IMAGE_REPOSITORY = "lmcache/vllm-openai"
_LMCACHE_IMAGE_TAG = re.compile(r"^v([0-9]+\.[0-9]+\.[0-9]+(?:\.post[0-9]+)?)(?:-[0-9A-Za-z.-]+)?$")


def lmcache_version_of_image(image: str) -> str | None:
    """LMCache release named by the tag of an ``lmcache/vllm-openai`` image, else None.

    ``lmcache/vllm-openai:v0.5.5`` and ``docker.io/lmcache/vllm-openai:v0.5.5-cu129`` -> ``"0.5.5"``;
    any other repository, or a digest-only reference, -> None (the tag is the only evidence).
    """
    name = image.partition("@")[0]
    repo, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        return None
    if repo.removeprefix("docker.io/").removeprefix("index.docker.io/") != LMCACHE_IMAGE_REPOSITORY:
        return None
    match = _LMCACHE_IMAGE_TAG.match(tag)
    return match.group(1) if match else None

AWS_ACCOUNT_PATTERN = r"^[0-9]{12}$"
AWS_REGION_PATTERN = r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$"
AZ_NAME_PATTERN = r"^[a-z]{2}(-gov)?-[a-z]+-[0-9][a-z]$"

ROUTING_STRATEGIES = ("prefixaware", "kvaware", "session", "roundrobin")
RoutingStrategy = Literal["prefixaware", "kvaware", "session", "roundrobin"]


class StrictModel(BaseModel):
    """Base for every config model: unknown keys rejected, values immutable after load, no infinite
    or NaN number (YAML's ``.inf`` would pass a ``> 0`` bound). A validator that spans fields raises
    :class:`~platform_config.problems.FieldError` naming the field the user should change."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --- platform.yaml ------------------------------------------------------------------------------


class CreateVpcConfig(StrictModel):
    """Create a new VPC: one public and one private subnet per configured zone.

    ``nat_gateways`` defaults to one per zone (HA); set 1 to save cost in a single-zone lab.
    """

    mode: Literal["create"] = "create"
    #: IPv4 CIDR of the new VPC, /16 to /24.
    cidr: Annotated[str, StringConstraints(pattern=r"^([0-9]{1,3}\.){3}[0-9]{1,3}/(1[6-9]|2[0-4])$")] = (
        "10.192.0.0/16"
    )
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
    vpc_cidr: Annotated[str, StringConstraints(pattern=r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$")]
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
    #: CIDRs allowed to reach a public endpoint; required with public_and_private.
    public_access_cidrs: tuple[str, ...] = ()
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

    @model_validator(mode="after")
    def _public_cidrs_only_when_public(self) -> "EksConfig":
        if self.endpoint_access == "private" and self.public_access_cidrs:
            raise FieldError("public_access_cidrs", "public_access_cidrs is set but endpoint_access is 'private'; "
                                                    "allowed: no CIDRs, or endpoint_access public_and_private")
        if self.endpoint_access == "public_and_private" and not self.public_access_cidrs:
            raise FieldError("public_access_cidrs", 
                "endpoint_access 'public_and_private' needs public_access_cidrs "
                "(refusing to open the API to 0.0.0.0/0 implicitly)"
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
            raise FieldError("instance_groups", f"instance group names must be unique; repeated: {', '.join(dupes)}")
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
            raise FieldError("throughput_mibps", "throughput_mibps applies to gp3 only; leave it at 125 for io2")
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
                f"low_watermark ({self.low_watermark}) must be below high_watermark ({self.high_watermark})"
            )
        return self


class MountWatchdogConfig(StrictModel):
    """The L2 mount watchdog (``k8s/mount_watchdog.py``, ``kv_tools/l2_mount_watchdog.py``): a pod
    per HyperPod node that finds every pod whose Curvine L2 mount is dead (its FUSE session was
    restarted under it) and heals it (docs/l2-cache.md, "Dead L2 mounts").

    Defaults: a dead mount is seen within one ``period_seconds`` (30 s); a FUSE answer slower
    than ``probe_timeout_seconds`` (10 s) marks the mount hung (never healed); one eviction per
    node per ``eviction_interval_seconds`` (60 s), so the up to 8 L2 pods of a node whose FUSE pod
    restarted come back one after another, within about 8 minutes, not all at once.

    Raises (at load):
        ValueError: ``probe_timeout_seconds`` not below ``period_seconds``, or
            ``eviction_interval_seconds`` below ``period_seconds``.
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

    @model_validator(mode="after")
    def _bounds_ordered(self) -> "MountWatchdogConfig":
        if self.probe_timeout_seconds >= self.period_seconds:
            raise ValueError(f"probe_timeout_seconds ({self.probe_timeout_seconds}) must be below "
                             f"period_seconds ({self.period_seconds}): a pass must end before the next starts")
        if self.eviction_interval_seconds < self.period_seconds:
            raise ValueError(f"eviction_interval_seconds ({self.eviction_interval_seconds}) must be at least "
                             f"period_seconds ({self.period_seconds})")
        return self


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


class HelmChartVersion(StrictModel):
    """A Helm chart pinned by repository, chart name and exact version."""

    repository: Annotated[str, StringConstraints(pattern=r"^(https|oci)://\S+$")]
    chart: Annotated[str, StringConstraints(min_length=1)]
    version: PinnedVersion


class ChartVersions(StrictModel):
    """Helm charts the CDK app installs."""

    kyverno: HelmChartVersion


class ImageVersions(StrictModel):
    """Container images of the platform (business lines pin their own vLLM image)."""

    curvine: PinnedImage
    curvine_csi: PinnedImage
    csi_node_driver_registrar: PinnedImage
    csi_provisioner: PinnedImage
    livenessprobe: PinnedImage
    #: Runs each line's L2 janitor (kv_tools/l2_janitor.py) and cross-pod hit canary
    #: (kv_tools/kv_canary.py), both standard library only, shipped in ConfigMaps: any pinned
    #: Python >= 3.10 image.
    l2_janitor: PinnedImage = "python:3.12.8-slim-bookworm"


class VersionsConfig(StrictModel):
    """Every version the platform deploys, pinned in one place."""

    addons: AddonVersions
    charts: ChartVersions
    images: ImageVersions


class InferenceGatewayConfig(StrictModel):
    """The inference gateway of the ``amazon-sagemaker-hyperpod-inference`` add-on (v2.0.0 and later).

    Issue 9 says the add-on turns the gateway on by default, with TLS certificates auto-issued,
    and then needs ``inferenceGateway.serviceAccount.roleArn``: a role with the AWS managed policy
    ``AmazonSageMakerHyperPodInferenceGatewayAccess`` that exists before the add-on. No AWS source
    read for this project shows the ``inferenceGateway`` key in the add-on's configuration
    (docs/sources.md §11), so by default the platform sends no ``inferenceGateway`` key at all;
    ``scripts/preflight.py`` fails when the pinned version's schema has the key and does not
    default ``enabled`` to false, naming ``set_in_addon``. The platform does not route through the
    gateway (each business line's endpoint has the operator's own load balancer and intelligent
    routing).
    """

    #: false: no gateway. true: the platform creates the gateway's IRSA role and sends
    #: ``inferenceGateway: {enabled: true, serviceAccount: {roleArn}}``.
    enabled: bool = False
    #: With ``enabled: false``: true sends ``inferenceGateway.enabled: false`` explicitly; false
    #: (default) leaves the unverified ``inferenceGateway`` key out of the add-on's configuration.
    #: Set true when scripts/preflight.py reports that the pinned add-on version has the key.
    set_in_addon: bool = False
    #: Kubernetes ServiceAccount of the gateway in ``hyperpod-inference-system``, which the role
    #: trusts. Required when enabled: take it from the add-on's documentation for the pinned
    #: version (not defaulted, because no source read for this project names it).
    service_account: DnsLabel | None = None

    @model_validator(mode="after")
    def _service_account_when_enabled(self) -> "InferenceGatewayConfig":
        if self.enabled and self.service_account is None:
            raise FieldError("service_account", "inference gateway enabled: set service_account (the gateway's ServiceAccount "
                             "in hyperpod-inference-system, which its IAM role trusts)")
        return self


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

    @model_validator(mode="after")
    def _internet_facing_needs_public_subnets(self) -> "PlatformConfig":
        if (self.inference_operator.load_balancer_scheme == "internet-facing"
                and isinstance(self.network, ExistingVpcConfig)):
            raise FieldError("inference_operator.load_balancer_scheme", "inference_operator.load_balancer_scheme 'internet-facing' needs public subnets, "
                             "which this platform creates only with network.mode 'create'; with an existing VPC "
                             "use 'internal' (tag the public subnets kubernetes.io/role/elb yourself to go public)")
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


# --- business-lines/<name>.yaml -----------------------------------------------------------------


class S3ModelSource(StrictModel):
    """Model weights in S3 (mounted by the Mountpoint for S3 CSI driver)."""

    type: Literal["s3"]
    bucket: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")]
    region: Annotated[str, StringConstraints(pattern=AWS_REGION_PATTERN)]
    #: Prefix of the model inside the bucket.
    location: Annotated[str, StringConstraints(min_length=1)]
    prefetch: bool = False


class HuggingFaceModelSource(StrictModel):
    """Model weights downloaded from the Hugging Face Hub at pod start."""

    type: Literal["huggingface"]
    model_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$")]
    #: Commit to pin; recommended so every replica loads identical weights (cache keys match).
    commit_sha: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")] | None = None
    #: Kubernetes Secret holding an HF token (under key `token`) for gated models. The line's
    #: stack creates the namespace: deploy it, then `kubectl -n <namespace> create secret
    #: generic <name> --from-literal=token=hf_...` before the endpoint's pods can load the model.
    token_secret_name: DnsLabel | None = None


class FsxModelSource(StrictModel):
    """Model weights on FSx for Lustre."""

    type: Literal["fsx"]
    file_system_id: Annotated[str, StringConstraints(pattern=r"^fs-[0-9a-f]{8,17}$")]
    dns_name: Annotated[str, StringConstraints(min_length=1)]
    mount_name: Annotated[str, StringConstraints(min_length=1)]
    location: Annotated[str, StringConstraints(min_length=1)]


ModelSource = Annotated[
    Union[S3ModelSource, HuggingFaceModelSource, FsxModelSource], Field(discriminator="type")
]


class ModelConfig(StrictModel):
    """The model a business line serves.

    ``name`` is the ``modelName`` of the InferenceEndpointConfig. LMCache's chunk file names
    carry the model *path* inside the pod (``vllm.model_mount_path``), not this name, so the
    platform puts every line's chunks in a directory derived from the model identity (name,
    source and revision), dtype, TP size, chunk size and the rest of what makes KV incompatible
    (:func:`k8s.lmcache.l2_cache_dir`): any such change starts an empty directory.
    """

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$", max_length=63)]
    source: ModelSource
    dtype: Literal["bfloat16", "float16", "fp8"] = "bfloat16"


class VllmConfig(StrictModel):
    """The vLLM worker container (LMCache-enabled image)."""

    #: LMCache-enabled vLLM image, pinned by tag or digest.
    image: PinnedImage
    #: vLLM arguments (model path first). With kvCacheSpec on, the operator adds LMCache's KV
    #: connector itself (the operator's own L1/L2 sample passes only model and length flags).
    args: tuple[str, ...] = ()
    port: Annotated[int, Field(ge=1024, le=65535)] = 8000
    #: Path the operator mounts model weights at (``worker.modelVolumeMount.mountPath``).
    model_mount_path: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._/-]+$")] = "/opt/ml/model"
    #: LMCache release inside `image`; leave null for `lmcache/vllm-openai:vX.Y.Z` images (the
    #: tag names it), set it for any other image. Must be the release the platform is checked
    #: against (`LMCACHE_VERSION`, 0.5.5): the env allow-list, the unsafe-default table and the
    #: real-library tests (`make test-lmcache`) are all of that version.
    lmcache_version: PinnedVersion | None = None

    @model_validator(mode="after")
    def _one_lmcache_version(self) -> "VllmConfig":
        from_tag = lmcache_version_of_image(self.image)
        if self.lmcache_version is not None and from_tag is not None and self.lmcache_version != from_tag:
            raise FieldError("lmcache_version", 
                f"lmcache_version {self.lmcache_version!r} contradicts image {self.image!r}, whose tag names "
                f"LMCache {from_tag}; remove lmcache_version or fix the image")
        version = self.lmcache_version or from_tag
        if version is None:
            raise FieldError(
                "lmcache_version", f"cannot tell the LMCache release inside image {self.image!r} (not a "
                f"{LMCACHE_IMAGE_REPOSITORY}:vX.Y.Z tag); set vllm.lmcache_version; allowed: {LMCACHE_VERSION}")
        if version != LMCACHE_VERSION:
            raise FieldError(
                "image", f"image {self.image!r} carries LMCache {version}, but the platform's env allow-list, unsafe-default "
                f"table and real-library tests are of LMCache {LMCACHE_VERSION}; allowed: "
                f"{LMCACHE_IMAGE_REPOSITORY}:v{LMCACHE_VERSION} (or an image with lmcache_version: "
                f"{LMCACHE_VERSION}); to move to another release see docs/l2-cache.md")
        return self

    @property
    def lmcache_release(self) -> str:
        """The LMCache release inside ``image`` (validated equal to :data:`LMCACHE_VERSION`)."""
        return self.lmcache_version or lmcache_version_of_image(self.image) or LMCACHE_VERSION


class ResourcesConfig(StrictModel):
    """CPU and memory per replica (GPUs come from ``gpus_per_replica``)."""

    #: CPU request per replica: cores (8, 0.5) or millicores (500m), no byte suffix.
    cpu: CpuQuantity = "6"
    #: Memory request per replica, a byte quantity of at least 1Gi (the L1 buffer lives in it).
    memory: BytesQuantity = "30Gi"


class CacheConfig(StrictModel):
    """Which KV-cache tiers the line uses. L0 (vLLM prefix cache) is always on."""

    l1_enabled: bool = True
    l2_enabled: bool = True
    #: Capacity of the line's L2 directory (its RWX PVC on the Curvine StorageClass), enforced by
    #: the line's L2 janitor (the watermarks are fractions of it). Free to change: the PVC requests
    #: a constant and carries this as an annotation (docs/l2-cache.md, "Pool sizing").
    l2_size: BytesQuantity = "500Gi"
    #: LMCache chunk size in tokens; 256 is LMCache's default and what the reference used.
    chunk_size_tokens: Annotated[int, Field(ge=16, le=4096)] = 256
    #: GiB of host memory LMCache's CPU tier (L1, `local_cpu`) may use per pod, split evenly
    #: across the pod's TP ranks (`LMCACHE_MAX_LOCAL_CPU_SIZE`, which LMCache reads in GiB);
    #: null = LMCache's default, 5 GB per rank. The buffer is pinned memory of the vLLM
    #: process, so it must stay below the pod's `resources.memory`; it is not HyperPod Tiered
    #: Storage, whose share belongs to the ai-toolkit daemon.
    l1_cpu_gib: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _l1_size_needs_l1(self) -> "CacheConfig":
        if self.l1_cpu_gib is not None and not self.l1_enabled:
            raise FieldError("l1_cpu_gib", "l1_cpu_gib sizes the L1 tier; set l1_enabled: true or remove l1_cpu_gib")
        return self


#: Tokens after the full chunks of a canary prompt (``kv_tools.kv_canary.TAIL_TOKENS``, which runs
#: alone from a ConfigMap and so keeps its own copy; a test holds the two equal).
CANARY_TAIL_TOKENS = 16


class CanaryConfig(StrictModel):
    """The line's cross-pod hit canary (docs/observability.md): a small Deployment that every
    ``period_minutes`` sends a fresh prompt of ``prompt_chunks`` chunks to one replica, then to
    another, and exports how much of it the second served from L2. Only lines with L2 run it."""

    #: false: no canary (and no canary alert) for this line.
    enabled: bool = True
    #: Minutes between two runs. Each run sends exactly 2 completion requests of
    #: ``max_tokens`` 1 (one per replica), so the canary adds at most 2 requests per period.
    period_minutes: Annotated[int, Field(ge=1, le=60)] = 5
    #: Full LMCache chunks (``cache.chunk_size_tokens`` each) in the canary prompt, plus 16
    #: tokens; each run writes this many new chunks to L2, which the janitor ages out.
    prompt_chunks: Annotated[int, Field(ge=1, le=16)] = 4


#: Most UTF-8 bytes of declared prefix text per business line, all its prefixes together (128 KiB,
#: about 30,000 tokens of English). The text travels to the cluster in the line's L2 janitor ConfigMap,
#: inside the line's CloudFormation template, where JSON escapes it twice: a quote or backslash takes 4
#: bytes there, so 128 KiB stays below 512 KiB of the template's 1,000,000 bytes whatever the text
#: (control characters, which would take 7, are refused); the line's other manifests take about 110 KB.
MAX_HOT_PREFIX_BYTES = 128 * 1024
#: Declared prefixes per line (each a label value of the janitor's metrics and a warm-up request).
MAX_HOT_PREFIXES = 16
#: Path of a prefix file relative to the directory of the line's YAML file: letters, digits, ``._-``
#: and ``/`` for subdirectories; not absolute, and (checked beside the pattern) no ``.`` or ``..`` component.
HOT_PREFIX_FILE_PATTERN = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
#: Control characters refused in prefix text (tab, newline and carriage return are text).
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def hot_prefix_text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a declared prefix's text (empty, or a control character), else None."""
    if not text.strip():
        return "is empty; allowed: the prefix's text (a system prompt, a RAG preamble, tool schemas)"
    bad = _CONTROL_CHARS.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        return (f"holds the control character U+{ord(bad.group()):04X} on line {line}; allowed: text whose only "
                "control characters are tab, newline and carriage return")
    return None


def _check_prefix_text(value: str | None) -> str | None:
    if value is not None:
        problem = hot_prefix_text_problem(value)
        if problem:
            raise ValueError(problem)
    return value


PrefixText = Annotated[str, AfterValidator(_check_prefix_text)]
def _check_prefix_file(value: str) -> str:
    if any(part in (".", "..") for part in value.split("/")):
        raise ValueError("must stay inside the directory of the line's file; allowed: a relative path without "
                         "'.' or '..' components, e.g. rag-assistant.system-prompt.md")
    return value


PrefixFile = Annotated[str, StringConstraints(pattern=HOT_PREFIX_FILE_PATTERN, max_length=255),
                       AfterValidator(_check_prefix_file)]


class HotPrefixMessage(StrictModel):
    """One chat message of a declared prefix, rendered by the model's chat template on a replica."""

    #: OpenAI chat role: `system` (a system prompt), `developer`, `user` or `assistant`.
    role: Literal["system", "developer", "user", "assistant"]
    #: The message's text, inline. Give `content` or `file`, not both.
    content: PrefixText | None = None
    #: A UTF-8 text file holding the message's text, relative to the directory of the line's YAML
    #: file (e.g. `rag-assistant.system-prompt.md` beside it); read when the config is loaded.
    file: PrefixFile | None = None

    @model_validator(mode="after")
    def _content_or_file(self) -> "HotPrefixMessage":
        if (self.content is None) == (self.file is None):
            raise FieldError("content", "give the message's text in content or name its file in file, not both "
                                        "and not neither")
        return self

    @property
    def text(self) -> str:
        """The message's text (``content``, or the file's text once the loader has read it)."""
        if self.content is None:
            raise ValueError(f"prefix file {self.file!r} was not read (load the line with the config loader)")
        return self.content


class HotPrefix(StrictModel):
    """A shared leading prompt of the line: chat `messages` (what user requests start with), or raw
    `text` / a `file` of raw text (the start of /v1/completions prompts). Give exactly one of the three."""

    #: Name of the prefix: a DNS-1123 label, unique in the line (a label of the janitor's metrics).
    name: DnsLabel
    #: The leading chat messages every user request of this prefix starts with, in order (e.g. one
    #: `system` message). Rendered with the model's chat template, without the generation prompt.
    messages: Annotated[tuple[HotPrefixMessage, ...], Field(max_length=16)] = ()
    #: Raw prompt text, inline (tokenized as vLLM tokenizes a /v1/completions prompt, BOS included).
    text: PrefixText | None = None
    #: A UTF-8 file of raw prompt text, relative to the directory of the line's YAML file.
    file: PrefixFile | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "HotPrefix":
        given = [k for k, v in (("messages", self.messages), ("text", self.text), ("file", self.file)) if v]
        if len(given) != 1:
            raise FieldError("messages", f"a prefix takes exactly one of messages, text or file (got "
                                         f"{', '.join(given) or 'none'})")
        return self

    @property
    def kind(self) -> Literal["chat", "text"]:
        """``chat`` (messages, tokenized with the chat template) or ``text`` (a raw prompt)."""
        return "chat" if self.messages else "text"

    @property
    def raw_text(self) -> str:
        """The raw prompt of a ``text`` prefix (``text``, or the file's text once the loader has read it)."""
        if self.text is None:
            raise ValueError(f"prefix {self.name!r}: no raw text (a chat prefix, or its file was not read)")
        return self.text

    def texts(self) -> list[str]:
        """Every text of the prefix, in order (message texts, or the raw text)."""
        return [m.text for m in self.messages] if self.messages else [self.raw_text]


class HotPrefixesConfig(StrictModel):
    """The line's shared prefixes, kept in L2 (docs/l2-cache.md, "Hot prefixes"): the line's L2 janitor
    sends each once through a replica before traffic needs it (after a new replica turns Ready and
    every `warm_period_minutes`), never evicts its chunks, and restores those that went missing."""

    #: false: declared prefixes are validated but not warmed or pinned.
    enabled: bool = True
    #: Minutes between two scheduled warm-ups (each sends every prefix once; a prefix already in
    #: L2 is a full hit). A new Ready replica triggers one at once.
    warm_period_minutes: Annotated[int, Field(ge=5, le=1440)] = 60
    #: Largest share of `cache.l2_size` the prefixes may pin, checked at synthesis against a bound of
    #: their KV bytes (docs/l2-cache.md); must stay below `curvine.eviction.low_watermark`.
    max_l2_fraction: Annotated[float, Field(gt=0, le=0.5)] = 0.1
    #: The prefixes (at most 16; their text at most 128 KiB of UTF-8 together).
    prefixes: Annotated[tuple[HotPrefix, ...], Field(max_length=MAX_HOT_PREFIXES)] = ()

    @model_validator(mode="after")
    def _unique_names(self) -> "HotPrefixesConfig":
        seen: set[str] = set()
        for i, prefix in enumerate(self.prefixes):
            if prefix.name in seen:
                raise FieldError(f"prefixes.{i}.name", f"prefix name {prefix.name!r} is used twice; allowed: a "
                                                       "name unique in the line")
            seen.add(prefix.name)
        return self

    @property
    def active(self) -> bool:
        """Whether prefixes are warmed and pinned: ``enabled`` and at least one prefix."""
        return self.enabled and bool(self.prefixes)


class SloConfig(StrictModel):
    """Service-level objectives of a line, drawn on its dashboard row and alerted on."""

    #: Time to first token, 90th percentile, in ms. The alert fires when the line's p90 over
    #: 5 minutes stays above it for 10 minutes. Default 2,000 ms: the reference deployment's cold
    #: TTFT was 774 ms at 2,500 tokens for a 7B model on L40S (docs/sources.md §1), so 2 s leaves
    #: room for queueing; set each line's own.
    ttft_p90_ms: Annotated[int, Field(ge=1, le=600000)] = 2000


class BusinessLineConfig(StrictModel):
    """``config/business-lines/<name>.yaml``: one team's endpoint; ``name`` is the file stem."""

    #: Defaults to the file name; must equal it.
    name: DnsLabel
    #: Kubernetes namespace of the line's endpoint and PVC; unique per line.
    namespace: DnsLabel
    model: ModelConfig
    #: Must be the type of one of the platform's HyperPod instance groups.
    instance_type: KnownInstanceType
    replicas: Annotated[int, Field(ge=1, le=100)] = 2
    #: GPUs per replica = tensor-parallel size; must fit the instance type.
    gpus_per_replica: Annotated[int, Field(ge=1, le=8)] = 1
    #: Router strategy; prefixaware for shared system prompts and multi-turn, kvaware for long
    #: documents, session for sticky users, roundrobin for stateless load. Fixed after creation.
    routing_strategy: RoutingStrategy = "prefixaware"
    cache: CacheConfig = CacheConfig()
    vllm: VllmConfig
    resources: ResourcesConfig = ResourcesConfig()
    slo: SloConfig = SloConfig()
    canary: CanaryConfig = CanaryConfig()
    #: Shared leading prompts kept in L2: warmed before traffic, never evicted, restored after loss.
    hot_prefixes: HotPrefixesConfig = HotPrefixesConfig()
    #: PYTHONHASHSEED shared by every pod of the line. vLLM derives from it the initial prefix
    #: hash (`NONE_HASH`, random per process when unset) from which LMCache chains its chunk
    #: keys, so pods with different or unset seeds never hit each other's chunks. LMCache alone
    #: hashes tuples of integers, which the seed does not salt (docs/sources.md §8).
    python_hash_seed: Annotated[int, Field(ge=0, le=4294967295)] = 0
    metrics_enabled: bool = True
    invocation_endpoint: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/-]+$")] = "v1/chat/completions"
    #: false: the CI pipeline (.github/workflows/platform.yml) does not deploy this line, e.g. the
    #: examples in a fork; it is still validated, synthesized and tested, and is not an orphan.
    #: A hand-run `cdk deploy --all` deploys every line: deploy by hand with --exclusively.
    deploy: bool = True

    @model_validator(mode="after")
    def _gpus_fit(self) -> "BusinessLineConfig":
        gpus = INSTANCE_TYPES[self.instance_type].gpus
        if self.gpus_per_replica > gpus:
            raise FieldError("gpus_per_replica", 
                f"gpus_per_replica {self.gpus_per_replica} does not fit {self.instance_type} "
                f"({gpus} GPU(s)); allowed: 1..{gpus}"
            )
        return self

    @field_validator("vllm")
    @classmethod
    def _parallel_sizes_use_every_gpu(cls, vllm: VllmConfig, info: ValidationInfo) -> VllmConfig:
        """vLLM uses tensor x pipeline x data parallel size GPUs (each 1 unless set in ``vllm.args``),
        whatever the pod was given: fewer leave GPUs idle, more fail at start. So the flags are
        required to say what ``gpus_per_replica`` says. Refused rather than injected: ``vllm.args``
        is the command the operator runs and part of the L2 directory digest, so it stays exactly
        what the config says (``-tp N``, ``--tensor-parallel-size=N`` and the pipeline/data forms
        are read by :mod:`platform_config.vllm_args`, the parser the digest uses)."""
        gpus = info.data.get("gpus_per_replica")
        if gpus is None:  # gpus_per_replica is itself invalid: reported on its own
            return vllm
        try:
            sizes = vllm_flags.parallel_sizes(vllm.args)
        except ValueError as exc:
            raise FieldError("args", str(exc)) from None
        used = math.prod(sizes.values())
        if used == gpus:
            return vllm
        if not sizes:
            raise FieldError(
                "args", f"vllm.args sets no {vllm_flags.TENSOR_PARALLEL_FLAG}, so vLLM runs each replica on 1 GPU and "
                f"leaves {gpus - 1} of its gpus_per_replica {gpus} idle; allowed: add "
                f'"{vllm_flags.TENSOR_PARALLEL_FLAG}", "{gpus}" to vllm.args (or set gpus_per_replica 1)')
        product = " x ".join(f"{flag} {sizes.get(flag, 1)}" for flag in vllm_flags.PARALLEL_FLAGS
                             if flag in sizes or flag == vllm_flags.TENSOR_PARALLEL_FLAG)
        flags_fix = ("no parallel-size flag in vllm.args" if gpus == 1 else
                     f"vllm.args whose tensor x pipeline x data parallel sizes multiply to {gpus} "
                     f'(e.g. "{vllm_flags.TENSOR_PARALLEL_FLAG}", "{gpus}")')
        raise FieldError(
            "args", f"vllm.args asks vLLM for {product} = {used} GPU(s) per replica, but gpus_per_replica is {gpus}; "
            f"allowed: gpus_per_replica {used}, or {flags_fix}")

    @model_validator(mode="after")
    def _l1_fits_pod_memory(self) -> "BusinessLineConfig":
        l1 = self.cache.l1_cpu_gib
        memory_gib = quantity_bytes(self.resources.memory) / 2**30
        if l1 is not None and l1 >= memory_gib:
            raise FieldError("cache.l1_cpu_gib", 
                f"cache.l1_cpu_gib {l1:g} GiB must be below resources.memory {self.resources.memory} "
                f"({memory_gib:g} GiB): the L1 buffer lives in the pod's memory"
            )
        return self

    @model_validator(mode="after")
    def _canary_prompt_fits_the_model_length(self) -> "BusinessLineConfig":
        """The canary's prompt (and its one generated token) must fit ``--max-model-len`` when
        ``vllm.args`` sets it, or vLLM refuses every canary request."""
        if not self.runs_canary:
            return self
        value = " ".join(vllm_flags.flag_values(self.vllm.args).get("--max-model-len") or [])
        if not value.isdigit():  # not set (the model's own limit), or a form vLLM parses itself
            return self
        chunk = self.cache.chunk_size_tokens
        needed = self.canary.prompt_chunks * chunk + CANARY_TAIL_TOKENS + 1
        if needed > int(value):
            raise ValueError(
                f"canary.prompt_chunks {self.canary.prompt_chunks} x cache.chunk_size_tokens {chunk} + "
                f"{CANARY_TAIL_TOKENS + 1} = {needed} tokens exceed vllm.args --max-model-len {value}; allowed: "
                f"canary.prompt_chunks 1..{(int(value) - CANARY_TAIL_TOKENS - 1) // chunk} (or canary.enabled: false)")
        return self

    @property
    def runs_canary(self) -> bool:
        """Whether the line runs the cross-pod hit canary: L2 on and ``canary.enabled`` (L2 on
        already requires ``curvine.enabled``, checked by the loader)."""
        return self.cache.l2_enabled and self.canary.enabled

    @property
    def tensor_parallel_size(self) -> int:
        """TP degree: ``--tensor-parallel-size`` of ``vllm.args`` (1 when unset). Equals
        ``gpus_per_replica`` unless pipeline or data parallelism share the replica's GPUs
        (validated: their product is ``gpus_per_replica``)."""
        return vllm_flags.parallel_sizes(self.vllm.args).get(vllm_flags.TENSOR_PARALLEL_FLAG, 1)
