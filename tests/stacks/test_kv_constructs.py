"""Prop validation of the reusable constructs, and HyperPodCluster options the example does not use."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template

from kv_constructs import (
    CurvinePrimaryVolume,
    CurvinePrimaryVolumeProps,
    HyperPodCluster,
    InstanceGroupSpec,
    IrsaRole,
    LifecycleScripts,
    SecureBucket,
    TaintSpec,
    TieredStorage,
    nag,
    prefixed_bucket_name,
)

LIFECYCLE = LifecycleScripts(source_s3_uri="s3://sagemaker-x/lifecycle/g/")


def group(**overrides) -> InstanceGroupSpec:
    values = dict(name="g6e", instance_type="ml.g6e.12xlarge", instance_count=1, lifecycle=LIFECYCLE)
    values.update(overrides)
    return InstanceGroupSpec(**values)


@pytest.mark.parametrize("overrides, message", [
    ({"name": "bad_name"}, "instance group name 'bad_name' must match"),
    ({"name": "x" * 64}, "at most 63 characters"),
    ({"instance_type": "g6e.12xlarge"}, "must match ^ml"),
    ({"instance_count": -1}, "instance_count must be >= 0"),
    ({"ebs_volume_size_gb": 0}, "ebs_volume_size_gb must be 1-16384"),
    ({"threads_per_core": 4}, "threads_per_core must be 1 or 2"),
    ({"deep_health_checks": ("InstanceStress", "GpuBurn")}, "GpuBurn not allowed; allowed: InstanceStress, InstanceConnectivity"),
    ({"instance_count": 6759}, "instance_count must be >= 0 and <= 6758"),
    # HyperPod's own rules (docs/sources.md §10), shared with the config models.
    ({"deep_health_checks": ("InstanceStress",), "taints": (TaintSpec(key="kvcache.io/gpu", effect="NoSchedule"),)},
     "taints: HyperPod rejects custom taints on an instance group with deep health checks"),
    ({"instance_count": 1, "deep_health_checks": ("InstanceConnectivity",)}, "needs at least 2 instances"),
    ({"deep_health_checks": ("InstanceStress",), "accelerators": 0}, "on GPU and Trainium instances only"),
    ({"labels": {"sagemaker.amazonaws.com/fault-type": "x"}}, "reserved prefix sagemaker.amazonaws.com/"),
    ({"labels": {"kvcache.io/tier": ""}}, "label kvcache.io/tier='' not allowed"),
    ({"labels": {f"l{i}": "x" for i in range(51)}}, "at most 50 labels and 50 taints"),
    ({"min_instance_count": 2}, "min_instance_count: 2 exceeds instance_count 1"),
    ({"training_plan_arn": "arn:aws:sagemaker:us-west-2:111122223333:p5"}, "training_plan_arn .* not allowed"),
])
def test_instance_group_spec_rejects_values_outside_the_cloudformation_limits(overrides, message) -> None:
    with pytest.raises(ValueError, match=message.replace("^", r"\^").replace("(", r"\(")):
        group(**overrides)


def test_taint_and_lifecycle_validation() -> None:
    with pytest.raises(ValueError, match="taint effect 'Evict' not allowed"):
        TaintSpec(key="k", effect="Evict")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved prefix kubernetes.io/"):
        TaintSpec(key="node.kubernetes.io/gpu", effect="NoSchedule")
    with pytest.raises(ValueError, match="taint value 'a b' not allowed"):
        TaintSpec(key="k", value="a b", effect="NoSchedule")
    with pytest.raises(ValueError, match="at most 128"):
        LifecycleScripts(source_s3_uri="s3://b/p/", on_create="x" * 129 + ".sh")
    with pytest.raises(ValueError, match="must start with s3://"):
        LifecycleScripts(source_s3_uri="https://bucket/lifecycle/")
    with pytest.raises(ValueError, match="must be a file name"):
        LifecycleScripts(source_s3_uri="s3://b/p/", on_create="scripts/on_create.sh")


@pytest.mark.parametrize("percent", [19, 101])
def test_tiered_storage_percentage_must_be_20_to_100(percent) -> None:
    with pytest.raises(ValueError, match="allowed: 20-100"):
        TieredStorage(memory_allocation_percentage=percent)
    TieredStorage(memory_allocation_percentage=20)
    TieredStorage(memory_allocation_percentage=100)


@pytest.mark.parametrize("overrides, message", [
    ({"size_gib": 0}, "size_gib 0 out of range for gp3: 1-16384"),
    ({"iops": 20000}, "iops 20000 out of range for gp3: 3000-16000"),
    ({"size_gib": 5, "iops": 3000}, "exceeds 500 IOPS per GiB"),
    ({"throughput_mibps": 1001}, "throughput_mibps 1001 out of range for gp3: 125-1000"),
    ({"throughput_mibps": 1000}, "exceeds 0.25 MiB/s per provisioned IOPS"),
    ({"volume_type": "io2", "throughput_mibps": 500}, "applies to gp3 only"),
    ({"removal_policy": "destroy"}, "removal_policy 'destroy' not allowed; allowed: retain, snapshot"),
    ({"availability_zone": "usw2-az1"}, "not a zone name"),
])
def test_curvine_volume_props_enforce_ebs_limits(overrides, message) -> None:
    values = dict(availability_zone="us-west-2a", size_gib=100)
    values.update(overrides)
    with pytest.raises(ValueError, match=message):
        CurvinePrimaryVolumeProps(**values)


def test_secure_bucket_rejects_invalid_names() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="not a valid S3 bucket name"):
        SecureBucket(stack, "B", bucket_name="Hyperpod_TLS")


def test_secure_bucket_auto_delete_needs_removal_policy_destroy() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="auto_delete_objects=True needs removal_policy=RemovalPolicy.DESTROY"):
        SecureBucket(stack, "B", auto_delete_objects=True)


@pytest.mark.parametrize("head, region, expected", [
    ("sagemaker-kvcache-lifecycle", "us-west-2", "sagemaker-kvcache-lifecycle-111122223333-us-west-2"),
    # Cut at the end of the head (its trailing '-' dropped), never into the required prefix.
    ("hyperpod-tls-" + "a-" * 30, "ap-southeast-4",
     "hyperpod-tls-a-a-a-a-a-a-a-a-a-a-a-111122223333-ap-southeast-4"),
])
def test_prefixed_bucket_name_fits_63_characters_and_keeps_the_prefix(head, region, expected) -> None:
    name = prefixed_bucket_name(head, account="111122223333", region=region)
    assert name == expected
    assert len(name) <= 63
    assert name.startswith(head.split("-")[0])


def test_prefixed_bucket_name_rejects_invalid_names() -> None:
    with pytest.raises(ValueError, match="not a valid S3 bucket name"):
        prefixed_bucket_name("SageMaker-Scripts", account="111122223333", region="us-west-2")


def test_construct_limits_are_the_config_schemas() -> None:
    """One source for the HyperPod name pattern, the Tiered Storage range and zone names."""
    from kv_constructs import curvine_volume, hyperpod_cluster
    from platform_config import fields, platform_models
    from platform_config import hyperpod_rules as rules

    assert hyperpod_cluster.NAME_PATTERN.pattern == fields.HYPERPOD_NAME_PATTERN
    assert hyperpod_cluster.TIERED_STORAGE_PERCENT_RANGE == (20, 100)
    assert hyperpod_cluster.DEEP_HEALTH_CHECKS == rules.DEEP_HEALTH_CHECKS
    count = hyperpod_cluster._int_bounds(platform_models.InstanceGroupConfig, "instance_count")
    assert count == (0, rules.INSTANCE_COUNT_MAX)
    assert hyperpod_cluster._int_bounds(platform_models.InstanceGroupConfig, "ebs_volume_size_gb") == (
        rules.EBS_VOLUME_SIZE_GB_MIN, rules.EBS_VOLUME_SIZE_GB_MAX)
    assert curvine_volume._AZ_NAME.pattern == fields.AZ_NAME_PATTERN
    with pytest.raises(ValueError):
        platform_models.TieredStorageConfig(memory_allocation_percentage=101)


def test_irsa_role_rejects_invalid_service_account_names() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="service_account 'Bad_SA' is not a valid Kubernetes name"):
        IrsaRole(stack, "R", cluster=None, namespace="kube-system", service_account="Bad_SA")  # type: ignore[arg-type]


def test_nag_acknowledgment_needs_a_real_reason() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="needs a reason"):
        nag.acknowledge(stack, "S1", "ok")


def test_flatten_reference_matches_cdk_nag_finding_ids() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    bucket = s3.CfnBucket(stack, "Bucket")
    bucket.override_logical_id("Logs")
    assert nag.flatten_reference(stack, f"{bucket.attr_arn}/lifecycle/*") == "<Logs.Arn>/lifecycle/*"
    assert nag.flatten_reference(stack, bucket.ref) == "<Logs>"
    assert nag.flatten_reference(stack, "*") == "*"


@pytest.fixture(scope="module")
def small_cluster_template() -> Template:
    """A HyperPodCluster with Tiered Storage off, node recovery off and no labels (one small stack)."""
    app = cdk.App()
    stack = cdk.Stack(app, "Small", env=cdk.Environment(account="111122223333", region="us-west-2"))
    HyperPodCluster(
        stack, "HP", cluster_name="small", eks_cluster_arn="arn:aws:eks:us-west-2:111122223333:cluster/e",
        eks_cluster_name="e", subnet_ids=["subnet-1"], security_group_ids=["sg-1"], vpc_id="vpc-1",
        instance_groups=[group(threads_per_core=2)], lifecycle_bucket_arn="arn:aws:s3:::sagemaker-x",
        lifecycle_key_prefix="lifecycle/", tiered_storage=TieredStorage(enabled=False), node_recovery="None",
    )
    CurvinePrimaryVolume(stack, "Vol", props=CurvinePrimaryVolumeProps(
        availability_zone="us-west-2a", size_gib=200, volume_type="io2", iops=8000, removal_policy="snapshot"))
    return Template.from_stack(stack)


def test_tiered_storage_can_be_disabled_and_node_recovery_turned_off(small_cluster_template) -> None:
    (cluster,) = small_cluster_template.find_resources("AWS::SageMaker::Cluster").values()
    props = cluster["Properties"]
    assert props["TieredStorageConfig"] == {"Mode": "Disable"}
    assert props["NodeRecovery"] == "None"
    (g,) = props["InstanceGroups"]
    assert g["ThreadsPerCore"] == 2
    assert "KubernetesConfig" not in g and "OnStartDeepHealthChecks" not in g


def test_io2_volume_with_snapshot_removal_policy(small_cluster_template) -> None:
    volume = small_cluster_template.find_resources("AWS::EC2::Volume")["CurvinePrimaryVolume"]
    assert volume["DeletionPolicy"] == "Snapshot"
    assert volume["UpdateReplacePolicy"] == "Snapshot"
    assert volume["Properties"]["VolumeType"] == "io2"
    assert volume["Properties"]["Iops"] == 8000
    assert "Throughput" not in volume["Properties"]
    assert volume["Properties"]["Encrypted"] is True


def test_node_provisioning_mode_is_continuous_unless_told(small_cluster_template) -> None:
    (cluster,) = small_cluster_template.find_resources("AWS::SageMaker::Cluster").values()
    assert cluster["Properties"]["NodeProvisioningMode"] == "Continuous"
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="node_provisioning_mode 'Standard' not allowed; allowed: Continuous or None"):
        HyperPodCluster(
            stack, "HP", cluster_name="c", eks_cluster_arn="arn", eks_cluster_name="e", subnet_ids=["s"],
            security_group_ids=["sg"], vpc_id="vpc-1", instance_groups=[group()],
            lifecycle_bucket_arn="arn:aws:s3:::b", lifecycle_key_prefix="lifecycle/",
            node_provisioning_mode="Standard",  # type: ignore[arg-type]
        )


def _cfn_schema(type_name: str) -> dict:
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    return PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-west-2", type_name).schema


def test_hyperpod_limits_are_the_cloudformation_schemas() -> None:
    """The limits in platform_config/hyperpod_rules.py are those of the AWS::SageMaker::Cluster schema
    that cfn-lint ships (docs/sources.md §10); a cfn-lint bump that changes one fails here."""
    from importlib.metadata import version

    from platform_config import hyperpod_rules as rules

    schema = _cfn_schema("AWS::SageMaker::Cluster")
    d, props = schema["definitions"], schema["definitions"]["ClusterInstanceGroup"]["properties"]
    assert version("cfn-lint") == "1.58.0"  # the version docs/sources.md §10 cites
    assert d["ClusterInstanceGroupsList"]["maxItems"] == rules.INSTANCE_GROUPS_MAX
    assert props["InstanceCount"]["maximum"] == props["MinInstanceCount"]["maximum"] == rules.INSTANCE_COUNT_MAX
    ebs = d["ClusterEbsVolumeConfig"]["properties"]["VolumeSizeInGB"]
    assert (ebs["minimum"], ebs["maximum"]) == (rules.EBS_VOLUME_SIZE_GB_MIN, rules.EBS_VOLUME_SIZE_GB_MAX)
    assert tuple(d["DeepHealthCheckType"]["enum"]) == rules.DEEP_HEALTH_CHECKS
    lifecycle = d["ClusterLifeCycleConfig"]["properties"]
    assert lifecycle["OnCreate"]["maxLength"] == rules.ON_CREATE_MAX
    assert lifecycle["SourceS3Uri"]["maxLength"] == rules.SOURCE_S3_URI_MAX
    plan = props["TrainingPlanArn"]
    assert (plan["pattern"], plan["minLength"], plan["maxLength"]) == (
        rules.TRAINING_PLAN_ARN_PATTERN, rules.TRAINING_PLAN_ARN_MIN, rules.TRAINING_PLAN_ARN_MAX)
    assert tuple(schema["properties"]["NodeProvisioningMode"]["enum"]) == rules.NODE_PROVISIONING_MODES
    taint = d["ClusterKubernetesTaint"]["properties"]
    assert (taint["Key"]["pattern"], taint["Key"]["maxLength"]) == (rules.KUBERNETES_KEY_PATTERN, rules.KUBERNETES_KEY_MAX)
    assert (taint["Value"]["pattern"], taint["Value"]["maxLength"]) == (
        rules.KUBERNETES_VALUE_PATTERN, rules.KUBERNETES_VALUE_MAX)
    assert d["ClusterKubernetesTaints"]["maxItems"] == rules.TAINTS_MAX


def test_hyperpod_cluster_rejects_duplicate_group_names() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    with pytest.raises(ValueError, match="repeated: g6e"):
        HyperPodCluster(
            stack, "HP", cluster_name="c", eks_cluster_arn="arn", eks_cluster_name="e", subnet_ids=["s"],
            security_group_ids=["sg"], vpc_id="vpc-1", instance_groups=[group(), group()],
            lifecycle_bucket_arn="arn:aws:s3:::b", lifecycle_key_prefix="lifecycle/",
        )


def test_the_cni_policy_acknowledgments_say_it_is_not_scoped(tmp_path) -> None:
    """Issue 25 item 6: the cdk-nag reasons shipped in the template (written by the same plugin app.py
    registers) must not claim a scope for AmazonEKS_CNI_Policy, which AWS lists as required and which
    allows ENI actions on '*'; the scoped ENI statements' reason must say the policy cancels them."""
    import stacks as platform_stacks

    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Nag", env=cdk.Environment(account="111122223333", region="us-west-2"))
    HyperPodCluster(
        stack, "HP", cluster_name="small", eks_cluster_arn="arn:aws:eks:us-west-2:111122223333:cluster/e",
        eks_cluster_name="e", subnet_ids=["subnet-1"], security_group_ids=["sg-1"], vpc_id="vpc-1",
        instance_groups=[group()], lifecycle_bucket_arn="arn:aws:s3:::sagemaker-x", lifecycle_key_prefix="lifecycle/")
    platform_stacks.add_nag_checks(app)
    template = Template.from_json(app.synth().get_stack_by_name("Nag").template)
    reasons: dict[str, str] = {}
    for resource in list(template.find_resources("AWS::IAM::Role").values()) + list(
            template.find_resources("AWS::IAM::Policy").values()):
        for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
            reasons[rule["id"]] = rule["reason"]
    cni = reasons["AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKS_CNI_Policy]"]
    assert "NOT scoped" in cni and "'*'" in cni and "required" in cni
    instance = reasons["AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                       "AmazonSageMakerClusterInstanceRolePolicy]"]
    assert "VPC CNI" not in instance and "ENI" not in instance  # that claim moved to the CNI policy's reason
    eni = [r for rule_id, r in reasons.items() if "network-interface/*" in rule_id]
    assert eni and all("AmazonEKS_CNI_Policy" in r and "rather than limit" in r for r in eni), eni
