"""HyperPod: the GPU cluster (G6e/P5 instance groups, Tiered Storage) and the Curvine Primary's volume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_s3_deployment as s3deploy
from constructs import Construct

from kv_constructs import (
    CurvinePrimaryVolume,
    CurvinePrimaryVolumeProps,
    HyperPodCluster,
    InstanceGroupSpec,
    LifecycleScripts,
    SecureBucket,
    TaintSpec,
    TieredStorage,
    nag,
    prefixed_bucket_name,
)
from platform_config import INSTANCE_TYPES, PlatformConfig, hyperpod_rules
from platform_config.platform_models import HyperPodDependencyChartConfig, repository_path
from stacks.cluster_stack import HELM_TIMEOUT


#: The lifecycle scripts kept in this repository.
LIFECYCLE_DIR = Path(__file__).resolve().parent.parent / "lifecycle"
#: Key prefix of the scripts in the lifecycle bucket; each group gets ``<prefix><group>/``.
LIFECYCLE_PREFIX = "lifecycle/"
#: Entry point run by HyperPod on each new node, and the per-group settings file next to it.
LIFECYCLE_ON_CREATE = "on_create.sh"
LIFECYCLE_ENV_FILE = "kvcache.env"
#: Candidate instance-store mounts, shipped in ``kvcache.env`` (see the constant's source).
INSTANCE_STORE_MOUNTS = hyperpod_rules.INSTANCE_STORE_MOUNTS


#: Values the platform gives the HyperPod dependency chart (``values.yaml`` of
#: aws/sagemaker-hyperpod-cli helm_chart/HyperPodHelmChart): cert-manager and the inference
#: operator come as EKS add-ons (AddonsStack), so the chart must not install them again;
#: training operators, MPI and KubeRay serve training jobs; no instance group has Neuron chips.
#: Left on: health-monitoring-agent, deep-health-check, NVIDIA and EFA device plugins, patching.
DEPENDENCY_CHART_DEFAULTS: dict = {
    "cert-manager": {"enabled": False},
    "inferenceOperators": {"enabled": False},
    "trainingOperators": {"enabled": False},
    "mpi-operator": {"enabled": False},
    "kuberay": {"enabled": False},
    "neuron-device-plugin": {"devicePlugin": {"enabled": False}},
}


def dependency_chart_dir(chart: HyperPodDependencyChartConfig) -> Path:
    """The chart directory, relative paths taken from the repository root.

    Raises:
        ValueError: no ``Chart.yaml`` there, or its ``charts/`` (the vendored sub-charts that
            ``helm dependency update`` writes) is missing or empty.
    """
    path = repository_path(chart.path)
    if not (path / "Chart.yaml").is_file():
        raise ValueError(f"path {chart.path!r}: no Chart.yaml in {path}")
    if not (path / "charts").is_dir() or not any((path / "charts").iterdir()):
        raise ValueError(
            f"path {chart.path!r}: {path / 'charts'} is missing or empty; run "
            "'helm dependency update' in the checkout first (docs/deploy.md, HyperPod dependency chart)"
        )
    return path


def dependency_chart_values(platform: PlatformConfig, chart: HyperPodDependencyChartConfig) -> dict:
    """:data:`DEPENDENCY_CHART_DEFAULTS` plus the region, with the config's ``values`` merged over them."""

    def merge(base: dict, over: dict) -> dict:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return merge({"global": {"region": platform.region}, **DEPENDENCY_CHART_DEFAULTS}, chart.values)


def lifecycle_files() -> dict[str, str]:
    """The scripts of ``lifecycle/`` (file name -> text), shipped to every instance group's prefix.

    Raises:
        FileNotFoundError: ``on_create.sh`` is missing.
    """
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted(LIFECYCLE_DIR.glob("*.sh"))}
    if LIFECYCLE_ON_CREATE not in files:
        raise FileNotFoundError(f"{LIFECYCLE_DIR / LIFECYCLE_ON_CREATE} is missing")
    return files


def lifecycle_env(platform: PlatformConfig, group: str) -> str:
    """``kvcache.env`` of one instance group, read by ``lifecycle/on_create.sh``.

    ``KVCACHE_INSTANCE_STORE_MOUNTS``: :data:`INSTANCE_STORE_MOUNTS`, ``:``-separated.
    ``KVCACHE_CURVINE_DATA_DIR`` is empty when the group runs no Curvine Worker (Curvine off,
    or the group not in ``curvine.worker_instance_groups``); the script then tolerates a node
    without instance storage instead of failing it.
    """
    workers = {g.name for g in platform.curvine_worker_groups()}
    data_dir = platform.curvine.worker_data_dir if platform.curvine.enabled and group in workers else ""
    return (
        f"KVCACHE_INSTANCE_GROUP={group}\n"
        f"KVCACHE_INSTANCE_STORE_MOUNTS={':'.join(INSTANCE_STORE_MOUNTS)}\n"
        f"KVCACHE_CURVINE_DATA_DIR={data_dir}\n"
    )


def lifecycle_bucket_name(platform: PlatformConfig) -> str:
    """Name of the lifecycle-script bucket, ``sagemaker-<project>-lifecycle-<account>-<region>``.

    It must start with ``sagemaker-``: HyperPod's ``SourceS3Uri`` docs ask for that prefix (the
    managed ``AmazonSageMakerClusterInstanceRolePolicy`` reads only ``sagemaker-*`` buckets), so
    CloudFormation cannot generate the name. See :func:`kv_constructs.prefixed_bucket_name`.
    """
    return prefixed_bucket_name(f"sagemaker-{platform.project}-lifecycle",
                                account=platform.account, region=platform.region)


def curvine_volume_props(platform: PlatformConfig) -> CurvinePrimaryVolumeProps:
    """The Curvine Primary volume's props from config.

    Raises:
        ValueError: the configured size/IOPS/throughput break the EBS limits
            (``stacks.build_platform`` turns this into a ``ConfigError`` naming the field).
    """
    v = platform.curvine.primary_volume
    return CurvinePrimaryVolumeProps(
        availability_zone=platform.gpu_availability_zone,
        size_gib=v.size_gib,
        volume_type=v.volume_type,
        iops=v.iops,
        throughput_mibps=v.throughput_mibps,
        removal_policy=v.removal_policy,
    )


class HyperPodStack(Stack):
    """The HyperPod cluster on the EKS cluster, its lifecycle scripts, and the Curvine Primary volume.

    Security groups of the HyperPod nodes: the shared group of the network stack and the EKS
    cluster security group (that of the system node group), so every node reaches every other.

    Lifecycle scripts: one ``BucketDeployment`` copies the scripts of ``lifecycle/`` to
    ``s3://<bucket>/lifecycle/<group>/`` for every instance group, each with a generated
    ``kvcache.env`` (the group's name, NVMe mount and Curvine Worker data directory, empty when
    the group runs no Worker); ``OnCreate`` is ``on_create.sh``. The cluster depends on the
    upload, so no node boots before its scripts are in S3.

    HyperPod dependency chart: installed here through the cluster's kubectl handler when
    ``hyperpod.dependency_chart`` is configured (a vendored checkout of the chart; see
    :data:`DEPENDENCY_CHART_DEFAULTS`), and the HyperPod cluster waits for it. With
    ``hyperpod.dependency_chart_preinstalled`` it must already be in the cluster (the config
    refuses deep health checks and automatic node recovery with neither).

    Attributes:
        hyperpod_cluster: :class:`kv_constructs.HyperPodCluster`.
        dependency_chart: the ``eks_v2.HelmChart`` or ``None`` (chart installed by hand).
        curvine_volume: :class:`kv_constructs.CurvinePrimaryVolume` (``None`` if Curvine is off).
        lifecycle_bucket: :class:`kv_constructs.SecureBucket` holding the scripts; deleted
            (emptied first) with the stack, its access logs retained.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        platform: PlatformConfig,
        cluster: eks.ICluster,
        vpc: ec2.IVpc,
        hyperpod_subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        hp = platform.hyperpod
        # The scripts are rebuilt from lifecycle/ on every deploy, so the bucket goes with the
        # stack: a retained bucket of this fixed name would make the next deploy fail.
        self.lifecycle_bucket = SecureBucket(
            self, "LifecycleScripts", bucket_name=lifecycle_bucket_name(platform),
            removal_policy=RemovalPolicy.DESTROY, auto_delete_objects=True)
        bucket = self.lifecycle_bucket.bucket

        scripts = lifecycle_files()
        sources = []
        specs = []
        for group in hp.instance_groups:
            sources += [s3deploy.Source.data(f"{group.name}/{name}", text) for name, text in scripts.items()]
            sources.append(s3deploy.Source.data(f"{group.name}/{LIFECYCLE_ENV_FILE}", lifecycle_env(platform, group.name)))
            specs.append(InstanceGroupSpec(
                name=group.name,
                instance_type=group.instance_type,
                instance_count=group.instance_count,
                lifecycle=LifecycleScripts(
                    source_s3_uri=f"s3://{bucket.bucket_name}/{LIFECYCLE_PREFIX}{group.name}/",
                    on_create=LIFECYCLE_ON_CREATE,
                ),
                ebs_volume_size_gb=group.ebs_volume_size_gb,
                threads_per_core=group.threads_per_core,
                deep_health_checks=tuple(group.deep_health_checks),
                labels=dict(group.labels),
                taints=tuple(TaintSpec(key=t.key, value=t.value, effect=t.effect) for t in group.taints),
                min_instance_count=group.min_instance_count,
                training_plan_arn=group.training_plan_arn,
                accelerators=INSTANCE_TYPES[group.instance_type].gpus,
            ))
        upload = s3deploy.BucketDeployment(
            self,
            "LifecycleUpload",
            destination_bucket=bucket,
            destination_key_prefix=LIFECYCLE_PREFIX,
            sources=sources,
            prune=True,
            retain_on_delete=False,
        )
        nag.acknowledge_cdk_managed(
            upload.handler_role.node.scope,
            owner="aws-cdk-lib BucketDeployment handler (uploads the lifecycle scripts)",
        )

        self.hyperpod_cluster = HyperPodCluster(
            self,
            "HyperPod",
            cluster_name=hp.cluster_name,
            eks_cluster_arn=cluster.cluster_arn,
            eks_cluster_name=platform.eks.cluster_name,
            subnet_ids=[hyperpod_subnet.subnet_id],
            # The shared group (all traffic within itself: EFA, control-plane ENIs) and the EKS
            # cluster security group, the only group of the managed system node group. Without
            # the second, system nodes and HyperPod nodes could not reach each other (CoreDNS,
            # Curvine Primary <-> Workers/FUSE, Kyverno and operator webhooks). AWS's console
            # stack does the same when it reuses an existing EKS cluster: HyperPod nodes join
            # that cluster's security group (creation_template.yaml, SecurityGroupId).
            security_group_ids=[security_group.security_group_id, cluster.cluster_security_group_id],
            vpc_id=vpc.vpc_id,
            instance_groups=specs,
            lifecycle_bucket_arn=bucket.bucket_arn,
            lifecycle_key_prefix=LIFECYCLE_PREFIX,
            tiered_storage=TieredStorage(
                enabled=hp.tiered_storage.enabled,
                memory_allocation_percentage=hp.tiered_storage.memory_allocation_percentage,
            ),
            node_recovery=hp.node_recovery,
            node_provisioning_mode=hp.node_provisioning_mode,
        )
        # The scripts must be in S3 before HyperPod runs them on the first node.
        self.hyperpod_cluster.cfn.node.add_dependency(upload)

        self.dependency_chart: eks.HelmChart | None = None
        if hp.dependency_chart is not None:
            chart = hp.dependency_chart
            self.dependency_chart = eks.HelmChart(
                self,
                "HyperPodDependencies",
                cluster=cluster,
                chart_asset=s3_assets.Asset(self, "HyperPodDependencyChart", path=str(dependency_chart_dir(chart))),
                release=chart.release,
                namespace="kube-system",
                create_namespace=False,
                values=dependency_chart_values(platform, chart),
                wait=True,
                timeout=HELM_TIMEOUT,  # well inside the kubectl handler's 900 s (aws-cdk issue 22257)
            )
            # HyperPod requires the chart in the cluster before the HyperPod cluster exists.
            self.hyperpod_cluster.cfn.node.add_dependency(self.dependency_chart)
            CfnOutput(self, "DependencyChartSourceCommit", value=chart.source_commit,
                      description="aws/sagemaker-hyperpod-cli commit of the installed dependency chart")

        self.curvine_volume: CurvinePrimaryVolume | None = None
        if platform.curvine.enabled:
            self.curvine_volume = CurvinePrimaryVolume(
                self, "CurvinePrimary", props=curvine_volume_props(platform), name=f"{platform.project}-curvine-primary"
            )
            CfnOutput(self, "CurvineVolumeId", value=self.curvine_volume.volume_id,
                      description="EBS volume of the Curvine Primary (metadata + journal)")
            CfnOutput(self, "CurvineVolumeAvailabilityZone", value=self.curvine_volume.availability_zone,
                      description="Zone of the Curvine Primary volume (schedule the Primary there)")

        CfnOutput(self, "HyperPodClusterName", value=hp.cluster_name, description="HyperPod cluster name")
        CfnOutput(self, "HyperPodClusterArn", value=self.hyperpod_cluster.cluster_arn, description="HyperPod cluster ARN")
        CfnOutput(self, "HyperPodExecutionRoleArn", value=self.hyperpod_cluster.execution_role.role_arn,
                  description="Execution role of the HyperPod instance groups")
        CfnOutput(self, "LifecycleScriptsUri", value=f"s3://{bucket.bucket_name}/{LIFECYCLE_PREFIX}",
                  description="Lifecycle scripts (one prefix per instance group)")
