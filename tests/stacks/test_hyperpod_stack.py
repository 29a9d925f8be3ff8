"""HyperPod stack: the SageMaker cluster, its execution role, lifecycle scripts, Curvine Primary volume."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Capture, Match

from kv_constructs import CurvinePrimaryVolume, HyperPodCluster
from stacks.hyperpod_stack import LIFECYCLE_DIR, lifecycle_bucket_name
from tests.stacks.bucket_assertions import assert_secure_bucket

HYPERPOD = "kvcache-hyperpod"
EKS = "kvcache-eks"
NETWORK = "kvcache-network"


@pytest.fixture(scope="module")
def hp(templates) -> dict:
    clusters = templates[HYPERPOD].find_resources("AWS::SageMaker::Cluster")
    assert list(clusters) == [HyperPodCluster.LOGICAL_ID], "the HyperPod cluster's logical ID must stay pinned"
    return clusters[HyperPodCluster.LOGICAL_ID]


def group(hp: dict, name: str) -> dict:
    groups = {g["InstanceGroupName"]: g for g in hp["Properties"]["InstanceGroups"]}
    return groups[name]


def test_logical_ids_of_stateful_resources_are_pinned() -> None:
    assert HyperPodCluster.LOGICAL_ID == "HyperPodCluster"
    assert CurvinePrimaryVolume.LOGICAL_ID == "CurvinePrimaryVolume"


def test_orchestrated_by_the_eks_cluster_in_the_hyperpod_subnet(hp, platform) -> None:
    props = hp["Properties"]
    assert props["ClusterName"] == "kvcache-hyperpod"
    # The EKS cluster's ARN, exported by the EKS stack (GetAtt EksCluster.Arn).
    assert props["Orchestrator"]["Eks"]["ClusterArn"]["Fn::ImportValue"].startswith("kvcache-eks:")
    assert "EksClusterArn" in props["Orchestrator"]["Eks"]["ClusterArn"]["Fn::ImportValue"]
    vpc = props["VpcConfig"]
    assert len(vpc["Subnets"]) == 1 and len(vpc["SecurityGroupIds"]) == 2
    # The subnet is the private subnet of the GPU zone (exported by the network stack).
    subnet_ref = platform.network.resolve(platform.network.hyperpod_subnet.subnet_id)["Ref"]
    assert subnet_ref in vpc["Subnets"][0]["Fn::ImportValue"]


def assert_hyperpod_nodes_in(templates, export_name: str) -> None:
    """The HyperPod cluster's ``VpcConfig.SecurityGroupIds`` imports the group exported as ``export_name``."""
    group_ids = Match.array_with([{"Fn::ImportValue": export_name}])
    templates[HYPERPOD].has_resource_properties("AWS::SageMaker::Cluster", {
        "VpcConfig": Match.object_like({"SecurityGroupIds": group_ids})})


def test_hyperpod_nodes_share_a_security_group_with_the_system_nodes(templates) -> None:
    """Without a common group, pods on HyperPod nodes cannot reach CoreDNS or the Curvine Primary."""
    # The system node group has no launch template, so EKS puts its nodes in the cluster
    # security group of the EKS cluster it belongs to (and in no other group).
    eks_cluster = Capture()
    templates[EKS].has_resource_properties("AWS::EKS::Nodegroup", {
        "Labels": {"kvcache.io/node-role": "system"},
        "ClusterName": {"Ref": eks_cluster},
        "LaunchTemplate": Match.absent(),
    })
    # The EKS stack exports that cluster's ClusterSecurityGroupId ...
    export = Capture()
    templates[EKS].has_output("*", {
        "Value": {"Fn::GetAtt": [eks_cluster.as_string(), "ClusterSecurityGroupId"]},
        "Export": {"Name": export},
    })
    # ... and the HyperPod cluster puts its nodes in it.
    assert_hyperpod_nodes_in(templates, export.as_string())


def test_hyperpod_nodes_keep_the_shared_group_that_allows_all_traffic_within_itself(templates) -> None:
    """HyperPod needs a group open to itself on every port (EFA, NCCL; docs/sources.md §2)."""
    rules = templates[NETWORK].find_resources("AWS::EC2::SecurityGroupIngress", {"Properties": {"IpProtocol": "-1"}})
    (group,) = {r["Properties"]["GroupId"]["Fn::GetAtt"][0] for r in rules.values()
                if r["Properties"]["GroupId"] == r["Properties"].get("SourceSecurityGroupId")}
    export = Capture()
    templates[NETWORK].has_output("*", {"Value": {"Fn::GetAtt": [group, "GroupId"]}, "Export": {"Name": export}})
    assert_hyperpod_nodes_in(templates, export.as_string())


def test_tiered_storage_is_enabled_at_twenty_percent(hp) -> None:
    assert hp["Properties"]["TieredStorageConfig"] == {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}


def test_node_recovery_is_automatic(hp) -> None:
    assert hp["Properties"]["NodeRecovery"] == "Automatic"


def test_nodes_are_provisioned_continuously_by_default(hp, project) -> None:
    """One short group (P5 capacity) or one node failing its checks must not fail CreateCluster."""
    from platform_config.platform_models import HyperPodConfig

    assert HyperPodConfig.model_fields["node_provisioning_mode"].default == "Continuous"
    assert project.platform.hyperpod.node_provisioning_mode == "Continuous"
    assert hp["Properties"]["NodeProvisioningMode"] == "Continuous"


def test_g6e_and_p5_instance_groups_from_config(hp, project) -> None:
    for cfg in project.platform.hyperpod.instance_groups:
        g = group(hp, cfg.name)
        assert g["InstanceType"] == cfg.instance_type
        assert g["InstanceCount"] == cfg.instance_count
        assert g["ThreadsPerCore"] == cfg.threads_per_core
        assert g["InstanceStorageConfigs"] == [{"EbsVolumeConfig": {"VolumeSizeInGB": cfg.ebs_volume_size_gb}}]
        assert g.get("OnStartDeepHealthChecks", []) == list(cfg.deep_health_checks)
        assert g["KubernetesConfig"]["Labels"] == dict(cfg.labels)
        assert "TrainingPlanArn" not in g and "MinInstanceCount" not in g  # on-demand, not set
        assert g["LifeCycleConfig"]["OnCreate"] == "on_create.sh"
        assert g["LifeCycleConfig"]["SourceS3Uri"]["Fn::Join"][1][-1] == f"/lifecycle/{cfg.name}/"
    types = {g["InstanceType"] for g in hp["Properties"]["InstanceGroups"]}
    assert types == {"ml.g6e.12xlarge", "ml.p5.48xlarge"}


def test_p5_group_carries_its_taint(hp) -> None:
    assert group(hp, "p5-inference")["KubernetesConfig"]["Taints"] == [
        {"Key": "kvcache.io/large-model", "Value": "true", "Effect": "PreferNoSchedule"}]
    assert "Taints" not in group(hp, "g6e-inference")["KubernetesConfig"]


def test_no_group_combines_taints_with_deep_health_checks(hp) -> None:
    """HyperPod rejects CreateCluster for a group with both (docs/sources.md §10)."""
    for g in hp["Properties"]["InstanceGroups"]:
        assert not (g.get("OnStartDeepHealthChecks") and g.get("KubernetesConfig", {}).get("Taints")), g
        if "InstanceConnectivity" in g.get("OnStartDeepHealthChecks", []):
            assert g["InstanceCount"] >= 2
    assert group(hp, "g6e-inference")["OnStartDeepHealthChecks"] == ["InstanceStress"]


def test_execution_role_trust_and_managed_policies(templates, hp) -> None:
    role_id = hp["Properties"]["InstanceGroups"][0]["ExecutionRole"]["Fn::GetAtt"][0]
    role = templates[HYPERPOD].find_resources("AWS::IAM::Role")[role_id]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"] == [{
        "Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}}]
    managed = sorted(p["Fn::Join"][1][-1] for p in role["ManagedPolicyArns"])
    assert managed == [":iam::aws:policy/AmazonEKS_CNI_Policy", ":iam::aws:policy/AmazonSageMakerClusterInstanceRolePolicy"]


def execution_statements(templates, hp) -> dict[str, dict]:
    role_id = hp["Properties"]["InstanceGroups"][0]["ExecutionRole"]["Fn::GetAtt"][0]
    policies = templates[HYPERPOD].find_resources("AWS::IAM::Policy", {
        "Properties": {"Roles": [{"Ref": role_id}]}})
    (policy,) = policies.values()
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


def test_execution_role_can_manage_enis_pull_images_and_use_pod_identity(templates, hp, project) -> None:
    st = execution_statements(templates, hp)
    assert st["CreateEnisInTheHyperPodSubnets"]["Action"] == "ec2:CreateNetworkInterface"
    assert st["DeleteEnisOfThisVpc"]["Action"] == "ec2:DeleteNetworkInterface"
    assert "ec2:Vpc" in st["DeleteEnisOfThisVpc"]["Condition"]["ArnEquals"]
    # Issue 19: as AWS's HyperPod samples grant them (no source settles the ec2:Vpc key for these two):
    # on "*", with no condition that might silently match nothing (docs/sources.md §15).
    permissions = st["NetworkInterfacePermissionsAsAwsGrantsThem"]
    assert sorted(permissions["Action"]) == ["ec2:CreateNetworkInterfacePermission",
                                             "ec2:DeleteNetworkInterfacePermission"]
    assert permissions["Resource"] == "*" and "Condition" not in permissions
    conditioned = [s for s in st.values() if "Condition" in s
                   for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
                   if a.endswith("NetworkInterfacePermission")]
    assert not conditioned
    assert "ec2:DescribeNetworkInterfaces" in st["DescribeNetwork"]["Action"]
    assert set(st["PullImages"]["Action"]) == {
        "ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"}
    pod_identity = st["PodIdentityOnThisCluster"]
    assert pod_identity["Action"] == "eks-auth:AssumeRoleForPodIdentity"
    p = project.platform
    assert pod_identity["Resource"] == f"arn:aws:eks:{p.region}:{p.account}:cluster/{p.eks.cluster_name}"


def test_execution_role_reads_only_the_lifecycle_prefix(templates, hp) -> None:
    st = execution_statements(templates, hp)
    assert st["ReadLifecycleScripts"]["Action"] == "s3:GetObject"
    assert st["ReadLifecycleScripts"]["Resource"]["Fn::Join"][1][-1] == "/lifecycle/*"
    assert st["ListLifecycleScripts"]["Action"] == "s3:ListBucket"
    assert st["ListLifecycleScripts"]["Condition"] == {"StringLike": {"s3:prefix": ["lifecycle/*"]}}
    writes = [s for s in st.values() if any(a.startswith("s3:Put") or a.startswith("s3:Delete")
                                            for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))]
    assert writes == []


def test_lifecycle_bucket_is_encrypted_ssl_only_private_and_named_for_sagemaker(templates, project) -> None:
    template = templates[HYPERPOD]
    name = lifecycle_bucket_name(project.platform)
    assert name == "sagemaker-kvcache-lifecycle-111122223333-us-west-2"
    assert_secure_bucket(template, name, VersioningConfiguration={"Status": "Enabled"},
                         LoggingConfiguration=Match.object_like({"LogFilePrefix": "access-logs/"}))


def test_lifecycle_bucket_is_emptied_and_deleted_with_the_stack_but_its_access_logs_stay(templates, project) -> None:
    """A retained bucket of this fixed name would make the deploy after 'cdk destroy' fail."""
    template = templates[HYPERPOD]
    buckets = template.find_resources("AWS::S3::Bucket", {
        "Properties": {"BucketName": lifecycle_bucket_name(project.platform)}})
    ((bucket_id, bucket),) = buckets.items()
    assert bucket["DeletionPolicy"] == "Delete"
    template.has_resource_properties("Custom::S3AutoDeleteObjects", {"BucketName": {"Ref": bucket_id}})
    # The access logs are the audit trail: retained, under a generated name that never collides.
    logs_id = bucket["Properties"]["LoggingConfiguration"]["DestinationBucketName"]["Ref"]
    access_logs = template.find_resources("AWS::S3::Bucket")[logs_id]
    assert access_logs["DeletionPolicy"] == "Retain"
    assert "BucketName" not in access_logs["Properties"]


def test_lifecycle_scripts_are_uploaded_before_the_cluster(templates, hp, project) -> None:
    template = templates[HYPERPOD]
    uploads = template.find_resources("Custom::CDKBucketDeployment")
    assert len(uploads) == 1
    (upload_id, upload), = uploads.items()
    assert upload["Properties"]["DestinationBucketKeyPrefix"] == "lifecycle/"
    # One script copy and one kvcache.env per instance group.
    scripts = sorted(p.name for p in LIFECYCLE_DIR.glob("*.sh"))
    assert len(upload["Properties"]["SourceObjectKeys"]) == len(project.platform.hyperpod.instance_groups) * (
        len(scripts) + 1)
    assert upload_id in hp["DependsOn"]


def test_curvine_volume_is_encrypted_gp3_in_the_gpu_zone_and_retained(templates, project) -> None:
    v = project.platform.curvine.primary_volume
    volumes = templates[HYPERPOD].find_resources("AWS::EC2::Volume")
    assert list(volumes) == [CurvinePrimaryVolume.LOGICAL_ID]
    volume = volumes[CurvinePrimaryVolume.LOGICAL_ID]
    assert volume["DeletionPolicy"] == "Retain"
    assert volume["UpdateReplacePolicy"] == "Retain"
    props = volume["Properties"]
    assert props["Encrypted"] is True
    assert props["VolumeType"] == "gp3"
    assert props["Size"] == v.size_gib == 100
    assert props["Iops"] == v.iops
    assert props["Throughput"] == v.throughput_mibps
    assert props["AvailabilityZone"] == project.platform.gpu_availability_zone


def test_curvine_volume_exposes_typed_attributes(platform, project) -> None:
    volume = platform.hyperpod.curvine_volume
    assert volume.availability_zone == project.platform.gpu_availability_zone
    assert platform.hyperpod.resolve(volume.volume_id) == {"Ref": CurvinePrimaryVolume.LOGICAL_ID}


def test_outputs(templates) -> None:
    outputs = templates[HYPERPOD].find_outputs("*")
    assert outputs["HyperPodClusterName"]["Value"] == "kvcache-hyperpod"
    assert outputs["HyperPodClusterArn"]["Value"] == {"Fn::GetAtt": [HyperPodCluster.LOGICAL_ID, "ClusterArn"]}
    assert outputs["CurvineVolumeId"]["Value"] == {"Ref": CurvinePrimaryVolume.LOGICAL_ID}
    assert outputs["CurvineVolumeAvailabilityZone"]["Value"] == "us-west-2a"


def test_lifecycle_env_names_the_worker_data_dir_only_on_worker_groups(project) -> None:
    from stacks.hyperpod_stack import lifecycle_env

    platform = project.platform
    assert lifecycle_env(platform, "g6e-inference") == (
        "KVCACHE_INSTANCE_GROUP=g6e-inference\n"
        "KVCACHE_INSTANCE_STORE_MOUNTS=/opt/dlami/nvme:/opt/sagemaker\n"
        f"KVCACHE_CURVINE_DATA_DIR={platform.curvine.worker_data_dir}\n")
    only_g6e = platform.model_copy(update={
        "curvine": platform.curvine.model_copy(update={"worker_instance_groups": ("g6e-inference",)})})
    assert lifecycle_env(only_g6e, "p5-inference").endswith("KVCACHE_CURVINE_DATA_DIR=\n")
    curvine_off = platform.model_copy(update={"curvine": platform.curvine.model_copy(update={"enabled": False})})
    assert lifecycle_env(curvine_off, "g6e-inference").endswith("KVCACHE_CURVINE_DATA_DIR=\n")


@pytest.fixture(scope="module")
def reserved_capacity_template(project, tmp_path_factory):
    """The fixture platform with a training plan and a minimum count on the P5 group, and the
    provisioning mode left out (HyperPod's all-or-nothing mode); only the HyperPod stack."""
    import stacks
    from aws_cdk.assertions import Template
    from platform_config import ProjectConfig
    from platform_config.platform_models import HyperPodConfig

    hp_cfg = project.platform.hyperpod.model_dump()
    hp_cfg["node_provisioning_mode"] = None
    p5 = next(g for g in hp_cfg["instance_groups"] if g["name"] == "p5-inference")
    p5.update(instance_count=2, min_instance_count=1, training_plan_arn=PLAN)
    platform = project.platform.model_copy(update={"hyperpod": HyperPodConfig.model_validate(hp_cfg)})
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("plan")))
    built = stacks.build_platform(app, ProjectConfig(platform, project.business_lines, project.config_dir))
    return Template.from_stack(built.hyperpod)


PLAN = "arn:aws:sagemaker:us-west-2:111122223333:training-plan/p5-inference-plan"


def test_training_plan_and_minimum_count_reach_the_instance_group(reserved_capacity_template) -> None:
    (cluster,) = reserved_capacity_template.find_resources("AWS::SageMaker::Cluster").values()
    p5 = group(cluster, "p5-inference")
    assert p5["TrainingPlanArn"] == PLAN
    assert (p5["InstanceCount"], p5["MinInstanceCount"]) == (2, 1)
    assert "TrainingPlanArn" not in group(cluster, "g6e-inference")
    assert "NodeProvisioningMode" not in cluster["Properties"]  # null: omitted


# --- Issue 25 item 6 ---

def test_the_execution_role_is_the_only_sagemaker_trust_and_carries_no_condition(templates, hp) -> None:
    """HyperPod's node role as AWS documents it (no aws:SourceAccount: a condition HyperPod does not send
    would fail cluster creation; docs/security.md says why that is acceptable), and no other role of the
    stack trusts SageMaker."""
    from aws_cdk.assertions import Match

    role_id = hp["Properties"]["InstanceGroups"][0]["ExecutionRole"]["Fn::GetAtt"][0]
    sagemaker_roles = templates[HYPERPOD].find_resources("AWS::IAM::Role", {"Properties": {
        "AssumeRolePolicyDocument": {"Statement": [Match.object_like({"Principal": {"Service": "sagemaker.amazonaws.com"}})]}}})
    assert list(sagemaker_roles) == [role_id]
    statement = sagemaker_roles[role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]
    assert "Condition" not in statement

def test_the_curvine_volume_carries_the_tag_the_ebs_csi_v2_policy_needs(templates) -> None:
    """AmazonEBSCSIDriverPolicyV2 attaches, detaches and modifies only volumes tagged
    ebs.csi.aws.com/cluster=true; without it the Primary's PV would never attach (issue 25 item 6)."""
    from aws_cdk.assertions import Match

    templates[HYPERPOD].has_resource_properties("AWS::EC2::Volume", {
        "Tags": Match.array_with([{"Key": "ebs.csi.aws.com/cluster", "Value": "true"}])})
