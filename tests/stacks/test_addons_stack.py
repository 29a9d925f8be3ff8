"""Add-ons stack: versions, the inference operator's configuration, IAM trust and actions, TLS bucket."""

from __future__ import annotations

import json

import pytest

from stacks.addons_stack import tls_bucket_name
from tests.stacks.bucket_assertions import assert_secure_bucket

ADDONS = "kvcache-addons"


@pytest.fixture(scope="module")
def addons(templates) -> dict[str, dict]:
    return {r["Properties"]["AddonName"]: r for r in templates[ADDONS].find_resources("AWS::EKS::Addon").values()}


@pytest.fixture(scope="module")
def logical_ids(templates) -> dict[str, str]:
    return {r["Properties"]["AddonName"]: lid for lid, r in templates[ADDONS].find_resources("AWS::EKS::Addon").items()}


def role_by_subject(templates, subject: str, stack: str = ADDONS) -> tuple[str, dict]:
    """The IAM role (logical id, resource) whose trust names ``subject`` via its CfnJson conditions."""
    template = templates[stack]
    conditions = {lid: r for lid, r in template.find_resources("Custom::AWSCDKCfnJson").items()
                  if subject in json.dumps(r["Properties"]["Value"])}
    assert len(conditions) == 1, f"no single trust condition for {subject}"
    (cond_id,) = conditions
    roles = {lid: r for lid, r in template.find_resources("AWS::IAM::Role").items() if cond_id in json.dumps(r)}
    assert len(roles) == 1
    return next(iter(roles.items()))


def statements_of(templates, role_id: str, stack: str = ADDONS) -> list[dict]:
    policies = templates[stack].find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": role_id}]}})
    return [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]


def assert_s3_csi_role_reads_only_model_prefixes(templates, project, stack: str = ADDONS) -> None:
    """The S3 CSI driver's role lists exactly the S3 lines' buckets and reads exactly their
    model prefixes, for any number of S3 lines (none: no such statements at all)."""
    subject = "system:serviceaccount:kube-system:s3-csi-driver-sa"
    sources = [l.model.source for l in project.business_lines if l.model.source.type == "s3"]
    if not sources:  # no S3 line: no role for the driver at all
        assert subject not in json.dumps(templates[stack].to_json())
        return
    role_id, _ = role_by_subject(templates, subject, stack)
    statements = {s.get("Sid"): s for s in statements_of(templates, role_id, stack)}

    def as_list(value) -> list:
        return sorted(value if isinstance(value, list) else [value])

    assert statements["ReadModelWeights"]["Action"] == "s3:GetObject"
    assert as_list(statements["ReadModelWeights"]["Resource"]) == sorted(
        {f"arn:aws:s3:::{src.bucket}/{src.location.strip('/')}/*" for src in sources})
    assert statements["ListModelBuckets"]["Action"] == "s3:ListBucket"
    assert as_list(statements["ListModelBuckets"]["Resource"]) == sorted({f"arn:aws:s3:::{src.bucket}" for src in sources})


def test_addon_names_and_versions_come_from_config(addons, project) -> None:
    v = project.platform.versions.addons
    expected = {
        "aws-ebs-csi-driver": v.aws_ebs_csi_driver,
        "aws-mountpoint-s3-csi-driver": v.aws_mountpoint_s3_csi_driver,
        "aws-fsx-csi-driver": v.aws_fsx_csi_driver,
        "metrics-server": v.metrics_server,
        "cert-manager": v.cert_manager,
        "amazon-sagemaker-hyperpod-inference": v.amazon_sagemaker_hyperpod_inference,
    }
    assert {name: a["Properties"]["AddonVersion"] for name, a in addons.items()} == expected


def test_inference_addon_depends_on_its_dependency_addons(addons, logical_ids) -> None:
    depends = addons["amazon-sagemaker-hyperpod-inference"]["DependsOn"]
    for name in ("aws-mountpoint-s3-csi-driver", "aws-fsx-csi-driver", "metrics-server", "cert-manager"):
        assert logical_ids[name] in depends, name


def configuration_values(addon: dict) -> dict:
    """Parse an add-on's ``ConfigurationValues`` (a ``Fn::Join``), tokens restored as their intrinsics."""
    tokens: dict[str, object] = {}
    text = ""
    for part in addon["Properties"]["ConfigurationValues"]["Fn::Join"][1]:
        if isinstance(part, str):
            text += part
        else:
            key = f"@@token{len(tokens)}@@"
            tokens[key] = part
            text += key

    def restore(node):
        if isinstance(node, dict):
            return {k: restore(v) for k, v in node.items()}
        return tokens.get(node, node) if isinstance(node, str) else node

    return restore(json.loads(text))


def test_inference_addon_configuration_values(templates, addons, project) -> None:
    config = configuration_values(addons["amazon-sagemaker-hyperpod-inference"])
    assert set(config) == {"executionRoleArn", "tlsCertificateS3Bucket", "hyperpodClusterArn", "alb", "keda"}
    execution_id, _ = role_by_subject(
        templates, "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager")
    alb_id, _ = role_by_subject(templates, "system:serviceaccount:hyperpod-inference-system:aws-load-balancer-controller")
    keda_id, _ = role_by_subject(templates, "system:serviceaccount:hyperpod-inference-system:keda-operator")
    assert config["executionRoleArn"] == {"Fn::GetAtt": [execution_id, "Arn"]}
    tls_bucket_id = next(iter(templates[ADDONS].find_resources(
        "AWS::S3::Bucket", {"Properties": {"BucketName": tls_bucket_name(project.platform)}})))
    assert config["tlsCertificateS3Bucket"] == {"Ref": tls_bucket_id}
    # The HyperPod cluster's real ARN (cluster/<id>), imported from the HyperPod stack.
    assert "HyperPodClusterClusterArn" in config["hyperpodClusterArn"]["Fn::ImportValue"]
    assert config["alb"] == {"enabled": True, "serviceAccount": {"create": True, "roleArn": {"Fn::GetAtt": [alb_id, "Arn"]}}}
    assert config["keda"] == {"enabled": True, "auth": {"aws": {"irsa": {
        "enabled": True, "roleArn": {"Fn::GetAtt": [keda_id, "Arn"]}}}}}


def test_ebs_csi_driver_uses_irsa_with_hyperpod_attach_permissions(templates, addons) -> None:
    role_id, role = role_by_subject(templates, "system:serviceaccount:kube-system:ebs-csi-controller-sa")
    assert addons["aws-ebs-csi-driver"]["Properties"]["ServiceAccountRoleArn"] == {"Fn::GetAtt": [role_id, "Arn"]}
    assert role["Properties"]["ManagedPolicyArns"][0]["Fn::Join"][1][-1] == (
        ":iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy")
    statements = {s["Sid"]: s for s in statements_of(templates, role_id)}
    attach = statements["AttachVolumesToHyperPodNodes"]
    assert sorted(attach["Action"]) == ["sagemaker:AttachClusterNodeVolume", "sagemaker:DetachClusterNodeVolume"]
    assert "HyperPodClusterClusterArn" in attach["Resource"]["Fn::ImportValue"]  # this cluster only
    describe = statements["DescribeThisEksCluster"]
    assert describe["Action"] == "eks:Describe*"
    assert describe["Resource"] == "arn:aws:eks:us-west-2:111122223333:cluster/kvcache-eks"


def test_irsa_trust_is_web_identity_from_the_cluster_oidc_provider(templates) -> None:
    _, role = role_by_subject(templates, "system:serviceaccount:kube-system:ebs-csi-controller-sa")
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert "OidcProvider" in statement["Principal"]["Federated"]["Fn::ImportValue"]
    assert list(statement["Condition"]) == ["StringEquals"]


def test_inference_execution_role_trusts_sagemaker_and_the_controller_service_account(templates) -> None:
    subject = "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager"
    role_id, role = role_by_subject(templates, subject)
    statements = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    by_action = {s["Action"]: s for s in statements}
    assert by_action["sts:AssumeRole"]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert "sts:AssumeRoleWithWebIdentity" in by_action
    assert role["Properties"]["ManagedPolicyArns"][0]["Fn::Join"][1][-1] == (
        ":iam::aws:policy/AmazonSageMakerHyperPodInferenceAccess")
    (tls,) = [s for s in statements_of(templates, role_id) if s["Sid"] == "TlsCertificatesReadWrite"]
    assert sorted(tls["Action"]) == ["s3:DeleteObject", "s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"]
    assert tls["Condition"] == {"StringEquals": {"aws:ResourceAccount": "111122223333"}}


def test_alb_and_keda_roles_are_bound_to_their_service_accounts(templates, addons) -> None:
    join = json.dumps(addons["amazon-sagemaker-hyperpod-inference"]["Properties"]["ConfigurationValues"])
    for subject in ("system:serviceaccount:hyperpod-inference-system:aws-load-balancer-controller",
                    "system:serviceaccount:hyperpod-inference-system:keda-operator"):
        role_id, _ = role_by_subject(templates, subject)
        assert role_id in join, subject


def test_alb_policy_is_narrowed_to_this_region_and_account(templates) -> None:
    role_id, _ = role_by_subject(templates, "system:serviceaccount:hyperpod-inference-system:aws-load-balancer-controller")
    resources = json.dumps([s.get("Resource") for s in statements_of(templates, role_id)])
    assert "elasticloadbalancing:us-west-2:111122223333:" in resources
    assert ":*:*:" not in resources


def test_keda_role_can_only_read_metrics(templates) -> None:
    role_id, _ = role_by_subject(templates, "system:serviceaccount:hyperpod-inference-system:keda-operator")
    actions = {a for s in statements_of(templates, role_id) for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == {"cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics", "cloudwatch:ListMetrics",
                       "aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels", "aps:GetMetricMetadata"}


def test_s3_csi_role_reads_only_the_configured_model_prefixes(templates, addons, project) -> None:
    role_id, _ = role_by_subject(templates, "system:serviceaccount:kube-system:s3-csi-driver-sa")
    assert addons["aws-mountpoint-s3-csi-driver"]["Properties"]["ServiceAccountRoleArn"] == {"Fn::GetAtt": [role_id, "Arn"]}
    buckets = {l.model.source.bucket for l in project.business_lines if l.model.source.type == "s3"}
    assert len(buckets) >= 2, "the fixture has S3 lines in two buckets"
    assert_s3_csi_role_reads_only_model_prefixes(templates, project)


def test_tls_bucket_is_named_encrypted_ssl_only_and_private(templates, project) -> None:
    name = tls_bucket_name(project.platform)
    assert name.startswith("hyperpod-tls-") and len(name) <= 63
    assert_secure_bucket(templates[ADDONS], name)


def test_tls_bucket_is_emptied_and_deleted_with_the_stack_but_its_access_logs_stay(templates, project) -> None:
    """A retained bucket of this fixed name would make the deploy after 'cdk destroy' fail."""
    template = templates[ADDONS]
    assert tls_bucket_name(project.platform) == "hyperpod-tls-kvcache-111122223333-us-west-2"
    ((bucket_id, bucket),) = template.find_resources("AWS::S3::Bucket", {
        "Properties": {"BucketName": tls_bucket_name(project.platform)}}).items()
    assert bucket["DeletionPolicy"] == "Delete"
    template.has_resource_properties("Custom::S3AutoDeleteObjects", {"BucketName": {"Ref": bucket_id}})
    logs_id = bucket["Properties"]["LoggingConfiguration"]["DestinationBucketName"]["Ref"]
    access_logs = template.find_resources("AWS::S3::Bucket")[logs_id]
    assert access_logs["DeletionPolicy"] == "Retain"
    assert "BucketName" not in access_logs["Properties"]
