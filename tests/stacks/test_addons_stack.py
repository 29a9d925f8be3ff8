"""Add-ons stack: versions, the inference operator's configuration, IAM trust and actions, TLS bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from platform_config.addon_configuration import (
    INFERENCE_ADDON_KEYS,
    inference_addon_configuration,
    inference_addon_key_table,
)
from stacks.addons_stack import inference_execution_role_name, tls_bucket_name
from tests.stacks.bucket_assertions import assert_secure_bucket

ADDONS = "kvcache-addons"
HYPERPOD = "kvcache-hyperpod"


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
    # Only keys an AWS source shows in the add-on's configuration: no unverified key by default, and
    # the gateway turned off explicitly (AWS's gateway guide, docs/sources.md §31).
    assert set(config) == {"executionRoleArn", "tlsCertificateS3Bucket", "hyperpodClusterArn", "alb", "keda",
                           "inferenceGateway"}
    assert config["inferenceGateway"] == {"enabled": False}
    from aws_cdk.assertions import Match

    templates[ADDONS].has_resource_properties("AWS::EKS::Addon", {
        "AddonName": "amazon-sagemaker-hyperpod-inference",
        "ConfigurationValues": {"Fn::Join": ["", Match.array_with([
            Match.string_like_regexp(r'"inferenceGateway":\{"enabled":false\}\}$')])]}})
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
    assert "jumpstartGatedModelDownloadRoleArn" not in config


def with_operator(platform, *, scheme_in_addon: bool = False, gateway: bool = False, gateway_in_addon: bool = True):
    """``platform`` with the inference operator's switches set (defaults: the model's own)."""
    operator = platform.inference_operator
    return platform.model_copy(update={"inference_operator": operator.model_copy(update={
        "set_scheme_in_addon": scheme_in_addon,
        "gateway": operator.gateway.model_copy(update={"enabled": gateway, "set_in_addon": gateway_in_addon})})})


def configuration_of(platform) -> dict:
    return inference_addon_configuration(platform, execution_role_arn="e", tls_bucket="b", hyperpod_cluster_arn="h",
                                         alb_role_arn="a", keda_role_arn="k",
                                         gateway_role_arn="g" if platform.inference_operator.gateway.enabled else None)


def test_the_default_configuration_sends_only_verified_keys_and_turns_the_gateway_off(project) -> None:
    """By default only verified keys are sent (an unverified one could fail CreateAddon after the
    network, eks and hyperpod stacks are deployed), and the gateway is turned off explicitly: AWS's
    gateway guide documents ``inferenceGateway.enabled`` for the pinned add-on, whose gateway is
    available once installed (docs/sources.md §31). The scenario config keeps the defaults."""
    defaults = type(project.platform.inference_operator)()
    assert (defaults.set_scheme_in_addon, defaults.gateway.enabled, defaults.gateway.set_in_addon) == (
        False, False, True)
    assert defaults.gateway.service_account == "inference-gateway-controller"
    assert project.platform.inference_operator == defaults.model_copy(
        update={"load_balancer_scheme": project.platform.inference_operator.load_balancer_scheme})
    config = configuration_of(project.platform)
    assert config["inferenceGateway"] == {"enabled": False}
    assert leaf_keys(config) == {
        k.path for k in INFERENCE_ADDON_KEYS if k.verified and not k.never_sent and not k.when} | {
        "inferenceGateway.enabled"}
    assert {k.path: k.verified for k in INFERENCE_ADDON_KEYS if k.path.startswith("inferenceGateway.")} == {
        "inferenceGateway.enabled": True, "inferenceGateway.serviceAccount.roleArn": True}
    assert all("§31" in k.source for k in INFERENCE_ADDON_KEYS if k.path.startswith("inferenceGateway."))
    assert not any(k.verified for k in INFERENCE_ADDON_KEYS if k.path == "alb.ingressClassParams.spec.scheme")


@pytest.mark.parametrize("switches, sent", [
    ({"scheme_in_addon": True}, {"alb": {"ingressClassParams": {"spec": {"scheme": "internal"}}}}),
    ({"gateway_in_addon": True}, {"inferenceGateway": {"enabled": False}}),
    ({"gateway": True}, {"inferenceGateway": {"enabled": True, "serviceAccount": {"roleArn": "g"}}}),
])
def test_each_conditional_key_is_sent_only_when_its_switch_is_on(project, switches, sent) -> None:
    base = configuration_of(with_operator(project.platform, gateway_in_addon=False))
    config = configuration_of(with_operator(project.platform, **{"gateway_in_addon": False, **switches}))
    added = leaf_keys(config) - leaf_keys(base)
    assert added == leaf_keys(sent)
    # Only the scheme is unverified; the gateway keys are sent conditionally, on AWS's word (§31).
    assert {k.path for k in INFERENCE_ADDON_KEYS if k.path in added and not k.verified} == (
        {"alb.ingressClassParams.spec.scheme"} & added)
    if "alb" in sent:
        assert config["alb"] == {**base["alb"], **sent["alb"]}
    else:
        assert config["inferenceGateway"] == sent["inferenceGateway"]


def test_an_enabled_gateway_ignores_set_in_addon(project) -> None:
    for in_addon in (True, False):
        assert configuration_of(with_operator(project.platform, gateway=True, gateway_in_addon=in_addon))[
            "inferenceGateway"] == {"enabled": True, "serviceAccount": {"roleArn": "g"}}


def leaf_keys(config: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in config.items():
        path = f"{prefix}{key}"
        keys |= leaf_keys(value, f"{path}.") if isinstance(value, dict) else {path}
    return keys


@pytest.mark.parametrize("gateway", [False, True])
@pytest.mark.parametrize("gateway_in_addon", [False, True])
@pytest.mark.parametrize("in_addon", [True, False])
def test_every_inference_addon_key_is_documented(project, gateway: bool, gateway_in_addon: bool,
                                                 in_addon: bool) -> None:
    """Every key the platform sets has a recorded reason and source (INFERENCE_ADDON_KEYS, and the
    table of docs/deploy.md generated from it)."""
    platform = with_operator(project.platform, scheme_in_addon=in_addon, gateway=gateway,
                             gateway_in_addon=gateway_in_addon)
    keys = leaf_keys(configuration_of(platform))
    assert keys <= {k.path for k in INFERENCE_ADDON_KEYS if not k.never_sent}
    assert ("inferenceGateway.serviceAccount.roleArn" in keys) is gateway
    assert ("inferenceGateway.enabled" in keys) is (gateway or gateway_in_addon)
    # The table says when: "unless ... set_in_addon: false" for the explicit off, "only with" for the role.
    sent_when = {k.path: k.sent for k in INFERENCE_ADDON_KEYS}
    assert sent_when["inferenceGateway.enabled"].startswith("unless")
    assert sent_when["inferenceGateway.serviceAccount.roleArn"] == "only with `inference_operator.gateway.enabled`"
    assert ("alb.ingressClassParams.spec.scheme" in keys) is in_addon
    assert all(key.source and key.value for key in INFERENCE_ADDON_KEYS)
    deploy_doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    assert inference_addon_key_table() in deploy_doc
    if gateway:
        with pytest.raises(ValueError, match="gateway_role_arn is required"):
            inference_addon_configuration(platform, execution_role_arn="e", tls_bucket="b", hyperpod_cluster_arn="h",
                                          alb_role_arn="a", keda_role_arn="k")


def test_ebs_csi_driver_uses_irsa_with_hyperpod_attach_permissions(templates, addons) -> None:
    role_id, role = role_by_subject(templates, "system:serviceaccount:kube-system:ebs-csi-controller-sa")
    assert addons["aws-ebs-csi-driver"]["Properties"]["ServiceAccountRoleArn"] == {"Fn::GetAtt": [role_id, "Arn"]}
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
    assert by_action["sts:AssumeRole"]["Condition"] == {"StringEquals": {"aws:SourceAccount": "111122223333"}}
    assert "sts:AssumeRoleWithWebIdentity" in by_action
    assert role["Properties"]["ManagedPolicyArns"][0]["Fn::Join"][1][-1] == (
        ":iam::aws:policy/AmazonSageMakerHyperPodInferenceAccess")
    (tls,) = [s for s in statements_of(templates, role_id) if s["Sid"] == "TlsCertificatesReadWrite"]
    assert sorted(tls["Action"]) == ["s3:DeleteObject", "s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"]
    assert tls["Condition"] == {"StringEquals": {"aws:ResourceAccount": "111122223333"}}


def test_inference_execution_role_may_tag_its_certificates_in_this_account_only(templates) -> None:
    """Inference v3.0 release notes: acm:AddTagsToCertificate and s3:PutObjectTagging on the TLS bucket."""
    role_id, _ = role_by_subject(
        templates, "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager")
    statements = {s["Sid"]: s for s in statements_of(templates, role_id)}
    assert statements["TagEndpointCertificates"]["Resource"] == "arn:aws:acm:us-west-2:111122223333:certificate/*"
    tls = statements["TlsCertificatesReadWrite"]
    assert "s3:PutObjectTagging" in tls["Action"]
    assert tls["Resource"]["Fn::Join"][1][-1] == "/*"  # objects of the TLS bucket only
    acm_actions = [a for s in statements.values() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
                   if a.startswith("acm:")]
    assert acm_actions == ["acm:AddTagsToCertificate"]


def test_inference_execution_role_name_has_the_prefix_the_addon_demands(templates, project) -> None:
    role_id, role = role_by_subject(
        templates, "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager")
    assert role["Properties"]["RoleName"] == "SageMakerHyperPodInference-kvcache-us-west-2"
    assert role["Properties"]["RoleName"] == inference_execution_role_name(project.platform)
    long_project = project.platform.model_copy(update={"project": "a" * 63})
    name = inference_execution_role_name(long_project)
    assert name.startswith("SageMakerHyperPodInference-aaaa") and len(name) == 64
    assert name != inference_execution_role_name(long_project.model_copy(update={"region": "eu-west-1"}))


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


def test_keda_role_is_trusted_by_its_service_account_only(templates) -> None:
    """Issue 19: AWS's add-on setup guide trusts only the cluster's OIDC provider for keda-operator (sub and
    aud); the migration script's extra sagemaker.amazonaws.com principal is left out (docs/sources.md §15)."""
    _, role = role_by_subject(templates, "system:serviceaccount:hyperpod-inference-system:keda-operator")
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity" and "Federated" in statement["Principal"]
    assert "sagemaker.amazonaws.com" not in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])
    (condition,) = [r for r in templates[ADDONS].find_resources("Custom::AWSCDKCfnJson").values()
                    if "keda-operator" in json.dumps(r["Properties"]["Value"])]
    keys = json.dumps(condition["Properties"]["Value"])
    assert ":sub" in keys
    assert ":aud" in keys and "sts.amazonaws.com" in keys


def test_keda_role_can_only_read_metrics(templates) -> None:
    """CloudWatch reads here; no Prometheus workspace wildcard: the observability stack grants
    aps:QueryMetrics on its own workspace (issue 26; tests/observability/test_autoscaling.py)."""
    role_id, _ = role_by_subject(templates, "system:serviceaccount:hyperpod-inference-system:keda-operator")
    actions = {a for s in statements_of(templates, role_id) for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == {"cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics", "cloudwatch:ListMetrics"}
    assert "aps:" not in json.dumps(statements_of(templates, role_id))


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


@pytest.fixture(scope="module")
def gateway_addons(project, tmp_path_factory):
    """The add-ons stack alone with the inference gateway on and an internet-facing scheme.

    The cluster is imported (name and OIDC provider ARN), so only this stack is synthesized.
    """
    import aws_cdk as cdk
    from aws_cdk import aws_eks_v2 as eks
    from aws_cdk import aws_iam as iam
    from aws_cdk.assertions import Template

    import stacks
    from stacks.addons_stack import AddonsStack

    operator = project.platform.inference_operator.model_copy(update={
        "load_balancer_scheme": "internet-facing",
        "set_scheme_in_addon": True,
        "gateway": project.platform.inference_operator.gateway.model_copy(
            update={"enabled": True})})  # service_account: the default, inference-gateway-controller
    platform = project.platform.model_copy(update={"inference_operator": operator})
    env = cdk.Environment(account=platform.account, region=platform.region)
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("gateway")))
    base = cdk.Stack(app, "base", env=env)  # holds only the imports below
    cdk.Validations.of(base).acknowledge(cdk.Acknowledgment(
        id="CloudFormation-Validate::F0001", reason="test scaffold: imported cluster only, never deployed"))
    provider = iam.OpenIdConnectProvider.from_open_id_connect_provider_arn(
        base, "Oidc", "arn:aws:iam::111122223333:oidc-provider/oidc.eks.us-west-2.amazonaws.com/id/EXAMPLE")
    cluster = eks.Cluster.from_cluster_attributes(base, "Cluster", cluster_name=platform.eks.cluster_name,
                                                  open_id_connect_provider=provider)
    stack = AddonsStack(app, "gateway-addons", platform=platform, business_lines=project.business_lines,
                        cluster=cluster, hyperpod_cluster_arn="arn:aws:sagemaker:us-west-2:111122223333:cluster/x",
                        env=env)
    return Template.from_stack(stack)


def test_enabled_gateway_gets_its_role_before_the_addon(gateway_addons) -> None:
    from aws_cdk.assertions import Match

    templates = {ADDONS: gateway_addons}
    ((addon_id, addon),) = [(lid, r) for lid, r in gateway_addons.find_resources("AWS::EKS::Addon").items()
                            if r["Properties"]["AddonName"] == "amazon-sagemaker-hyperpod-inference"]
    config = configuration_values(addon)
    role_id, role = role_by_subject(
        templates, "system:serviceaccount:hyperpod-inference-system:inference-gateway-controller")
    assert config["inferenceGateway"] == {"enabled": True, "serviceAccount": {"roleArn": {"Fn::GetAtt": [role_id, "Arn"]}}}
    # The role is referenced by the add-on's configuration, so CloudFormation creates it first (AWS's
    # gateway guide: the controller reads it when it starts).
    gateway_addons.has_resource_properties("AWS::EKS::Addon", {
        "AddonName": "amazon-sagemaker-hyperpod-inference",
        "ConfigurationValues": {"Fn::Join": ["", Match.array_with([
            Match.string_like_regexp(r'"inferenceGateway":\{"enabled":true,"serviceAccount":\{"roleArn":"$'),
            {"Fn::GetAtt": [role_id, "Arn"]}])]}})
    assert role["Properties"]["ManagedPolicyArns"][0]["Fn::Join"][1][-1] == (
        ":iam::aws:policy/AmazonSageMakerHyperPodInferenceGatewayAccess")
    assert not statements_of(templates, role_id)  # the managed policy only
    # The scheme reaches the controller's IngressClass.
    assert config["alb"]["ingressClassParams"] == {"spec": {"scheme": "internet-facing"}}


def test_gateway_service_account_defaults_to_the_guides(tmp_path) -> None:
    """``gateway.enabled: true`` alone is enough: the ServiceAccount defaults to the one AWS's gateway
    guide trusts (``inference-gateway-controller``, docs/sources.md §31); a bad name is refused naming
    the field."""
    from platform_config import ConfigError, load_project
    from tests.example_config import copy_example_config, edit_yaml

    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda d: d["inference_operator"]["gateway"].update(enabled=True))
    assert load_project(config).platform.inference_operator.gateway.service_account == "inference-gateway-controller"
    edit_yaml(config / "platform.yaml",
              lambda d: d["inference_operator"]["gateway"].update(service_account="Inference_Gateway"))
    with pytest.raises(ConfigError) as info:
        load_project(config)
    (problem,) = info.value.problems
    assert problem.field == "inference_operator.gateway.service_account"


# --- Issue 25 items 5 and 6: what the add-on roles may do, asserted with Template/Match/Capture ---

ALB_SUBJECT = "system:serviceaccount:hyperpod-inference-system:aws-load-balancer-controller"
EXECUTION_SUBJECT = "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager"


def _deny_internet_facing() -> dict:
    from aws_cdk.assertions import Match

    return Match.object_like({
        "Effect": "Deny", "Action": "elasticloadbalancing:CreateLoadBalancer", "Resource": "*",
        "Condition": {"StringEquals": {"elasticloadbalancing:Scheme": "internet-facing"}}})


def test_the_load_balancer_controller_may_not_create_an_internet_facing_load_balancer(templates) -> None:
    """Issue 25 item 5: with load_balancer_scheme internal (the fixture's) the controller's own policy
    refuses an internet-facing CreateLoadBalancer, whatever an Ingress or Service asks for."""
    from aws_cdk.assertions import Capture, Match

    role_id, _ = role_by_subject(templates, ALB_SUBJECT)
    roles = Capture()
    templates[ADDONS].has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": Match.array_with([_deny_internet_facing()])},
        "Roles": roles})
    assert roles.as_array() == [{"Ref": role_id}]
    # The Allow it overrides is still there (the controller creates internal load balancers).
    templates[ADDONS].has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Allow", "Action": Match.array_with(["elasticloadbalancing:CreateLoadBalancer"])})])},
        "Roles": [{"Ref": role_id}]})


def test_an_internet_facing_scheme_configured_on_purpose_is_not_denied(gateway_addons) -> None:
    """load_balancer_scheme internet-facing (the gateway fixture's) is the explicit opt-in: no Deny."""
    from aws_cdk.assertions import Match

    role_id, _ = role_by_subject({ADDONS: gateway_addons}, ALB_SUBJECT)
    gateway_addons.has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": Match.not_(Match.array_with([_deny_internet_facing()]))},
        "Roles": [{"Ref": role_id}]})


def test_the_ebs_csi_driver_gets_the_tag_scoped_v2_managed_policy(templates) -> None:
    """Issue 25 item 6: AmazonEBSCSIDriverPolicyV2 (no service-role/ path), not V1's untagged attach/modify."""
    role_id, _ = role_by_subject(templates, "system:serviceaccount:kube-system:ebs-csi-controller-sa")
    roles = templates[ADDONS].find_resources("AWS::IAM::Role", {"Properties": {"ManagedPolicyArns": [
        {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::aws:policy/AmazonEBSCSIDriverPolicyV2"]]}]}})
    assert list(roles) == [role_id]
    assert "service-role/AmazonEBSCSIDriverPolicy" not in json.dumps(templates[ADDONS].to_json())  # V1 nowhere


def test_the_operator_may_add_only_its_own_tag_to_certificates_not_anothers(templates) -> None:
    """Issue 25 item 6: acm:AddTagsToCertificate only adds CreatedBy=HyperPodInference, and never to a
    certificate whose CreatedBy says another owner, so the managed policy's DeleteCertificate (on that
    tag) cannot be turned on a certificate the operator did not import by tagging it first."""
    from aws_cdk.assertions import Capture, Match

    role_id, _ = role_by_subject(templates, EXECUTION_SUBJECT)
    condition = Capture()
    templates[ADDONS].has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Sid": "TagEndpointCertificates", "Effect": "Allow", "Action": "acm:AddTagsToCertificate",
            "Condition": condition})])},
        "Roles": [{"Ref": role_id}]})
    assert condition.as_object() == {
        "StringEquals": {"aws:RequestTag/CreatedBy": "HyperPodInference"},
        "ForAllValues:StringEquals": {"aws:TagKeys": ["CreatedBy"]},
        "StringEqualsIfExists": {"aws:ResourceTag/CreatedBy": "HyperPodInference"}}


def test_every_sagemaker_trust_of_the_addons_is_bound_to_this_account(templates) -> None:
    """Issue 25 item 6: a trust of sagemaker.amazonaws.com without aws:SourceAccount lets any account's
    SageMaker resource name the role (confused deputy). Every stack but the hyperpod stack, whose node
    role is HyperPod's as AWS documents it (test_hyperpod_stack.py says why)."""
    from aws_cdk.assertions import Match

    for stack_name, template in templates.items():
        if stack_name == HYPERPOD:
            continue
        for role in template.find_resources("AWS::IAM::Role").values():
            for statement in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]:
                services = statement.get("Principal", {}).get("Service", [])
                if "sagemaker.amazonaws.com" in (services if isinstance(services, list) else [services]):
                    assert statement["Condition"]["StringEquals"]["aws:SourceAccount"] == "111122223333", stack_name
    templates[ADDONS].has_resource_properties("AWS::IAM::Role", {"AssumeRolePolicyDocument": {
        "Statement": Match.array_with([{
            "Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
            "Condition": {"StringEquals": {"aws:SourceAccount": "111122223333"}}}])}})


def test_no_rendered_object_carries_a_load_balancer_annotation(templates) -> None:
    """Issue 25 item 5: the platform accepts no user annotations (config models forbid unknown keys) and
    renders none that pick a scheme or subnets; the controller's subnet discovery and the Deny decide."""
    text = json.dumps({name: t.to_json() for name, t in templates.items()})
    for prefix in ("alb.ingress.kubernetes.io/", "service.beta.kubernetes.io/aws-load-balancer"):
        assert prefix not in text, prefix
