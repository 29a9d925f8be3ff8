"""EKS add-ons: storage CSI drivers, metrics-server, cert-manager and the HyperPod inference operator."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from kv_constructs import IrsaRole, SecureBucket, nag, prefixed_bucket_name
from kv_constructs.load_balancer_scheme import deny_internet_facing_statement
from kv_constructs.teardown_wait import LoadBalancerTeardownWaiter
from platform_config import BusinessLineConfig, PlatformConfig
from platform_config.addon_configuration import INFERENCE_ADDON, inference_addon_configuration
from platform_config.line_models import S3ModelSource

#: The inference operator's namespace and service accounts (aws/sagemaker-hyperpod-cli,
#: helm_chart/.../inference-operator/migration/helm_to_addon.sh; docs/sources.md §1).
INFERENCE_NAMESPACE = "hyperpod-inference-system"
INFERENCE_CONTROLLER_SA = "hyperpod-inference-controller-manager"
INFERENCE_ALB_SA = "aws-load-balancer-controller"
INFERENCE_KEDA_SA = "keda-operator"

#: AWS Load Balancer Controller IAM policy v3.2.2, the file aws-cdk-lib 2.275.0 ships for
#: ``aws_eks_v2.AlbController`` (origin: kubernetes-sigs/aws-load-balancer-controller
#: docs/install/iam_policy.json, Apache-2.0). Loaded as data; region and account are pinned below.
ALB_POLICY_FILE = Path(__file__).resolve().parent.parent / "kv_constructs" / "policies" / "aws-load-balancer-controller-v3.2.2.json"

#: The EBS CSI driver's AWS managed policy: V2 scopes every mutating volume and snapshot action to
#: resources tagged ``ebs.csi.aws.com/cluster=true`` (AWS managed policy reference,
#: "AmazonEBSCSIDriverPolicyV2", v1 of 2026-04-16; its ARN has no ``service-role/`` path, unlike V1's).
EBS_CSI_POLICY = "AmazonEBSCSIDriverPolicyV2"

#: What the inference operator tags its ACM certificates and TLS objects with, and what
#: ``AmazonSageMakerHyperPodInferenceAccess`` (v3) conditions ``acm:DeleteCertificate`` on
#: (``aws:ResourceTag/CreatedBy``); docs/sources.md §11.
OPERATOR_TAG_KEY = "CreatedBy"
OPERATOR_TAG_VALUE = "HyperPodInference"

#: Add-ons the inference operator depends on, with the minimum versions of docs/sources.md §1.
INFERENCE_DEPENDENCIES = ("aws-mountpoint-s3-csi-driver", "aws-fsx-csi-driver", "metrics-server", "cert-manager")

#: Installed as an EKS add-on, the operator refuses an execution role whose *name* does not start
#: with this (aws/sagemaker-hyperpod-cli, ``charts/inference-operator/templates/
#: _validateRequiredValues.tpl`` at 011ca927: "for the managed policy restrictions";
#: docs/sources.md §11), so the role gets a fixed name instead of a generated one.
INFERENCE_EXECUTION_ROLE_PREFIX = "SageMakerHyperPodInference"
#: AWS managed policy of the inference gateway's role (add-on v2.0.0-eksbuild.2; docs/sources.md §31).
INFERENCE_GATEWAY_POLICY = "AmazonSageMakerHyperPodInferenceGatewayAccess"
#: IAM role names are at most 64 characters.
IAM_ROLE_NAME_MAX = 64


def inference_execution_role_name(platform: PlatformConfig) -> str:
    """``SageMakerHyperPodInference-<project>-<region>``, shortened with a hash to fit 64 characters.

    IAM names are global to the account, so the region is part of the name; the prefix is what the
    add-on demands (:data:`INFERENCE_EXECUTION_ROLE_PREFIX`).
    """
    name = f"{INFERENCE_EXECUTION_ROLE_PREFIX}-{platform.project}-{platform.region}"
    if len(name) <= IAM_ROLE_NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:IAM_ROLE_NAME_MAX - len(digest) - 1]}-{digest}"


def tls_bucket_name(platform: PlatformConfig) -> str:
    """TLS-certificate bucket of the inference operator, ``hyperpod-tls-<project>-<account>-<region>``.

    The name must start with ``hyperpod-tls-`` (docs/sources.md §1), so CloudFormation cannot
    generate it. See :func:`kv_constructs.prefixed_bucket_name`.
    """
    return prefixed_bucket_name(f"hyperpod-tls-{platform.project}", account=platform.account, region=platform.region)


def alb_controller_policy_document(stack: Stack, *, scheme: str = "internal") -> iam.PolicyDocument:
    """The Load Balancer Controller policy, with ``arn:aws:<svc>:*:*:`` narrowed to this partition/region/account.

    With ``scheme`` ``internal`` (``inference_operator.load_balancer_scheme``, the default) the document
    also denies creating internet-facing load balancers (:func:`deny_internet_facing_statement`);
    with ``internet-facing``, configured on purpose, it does not.
    """
    text = ALB_POLICY_FILE.read_text(encoding="utf-8")
    for service in ("ec2", "elasticloadbalancing"):
        text = text.replace(
            f"arn:aws:{service}:*:*:", f"arn:{stack.partition}:{service}:{stack.region}:{stack.account}:"
        )
    document = iam.PolicyDocument.from_json(json.loads(text))
    if scheme == "internal":
        document.add_statements(deny_internet_facing_statement())
    return document


class AddonsStack(Stack):
    """Managed add-ons at pinned versions and the IAM they need.

    - ``aws-ebs-csi-driver`` with an IRSA role (the blog prefers IRSA over Pod Identity):
      managed ``AmazonEBSCSIDriverPolicyV2`` (volumes tagged ``ebs.csi.aws.com/cluster=true`` only), plus ``sagemaker:AttachClusterNodeVolume`` /
      ``DetachClusterNodeVolume`` on this HyperPod cluster and ``eks:Describe*`` on this EKS
      cluster; without them an EBS attach to a HyperPod node returns ValidationException.
    - ``aws-mountpoint-s3-csi-driver`` with an IRSA role that can only read the S3 model
      prefixes of the business lines (none if no line loads from S3).
    - ``aws-fsx-csi-driver``, ``metrics-server``, ``cert-manager`` (no AWS permissions: FSx
      volumes are statically provisioned from existing file systems).
    - ``amazon-sagemaker-hyperpod-inference`` with the configuration of
      :func:`platform_config.addon_configuration.inference_addon_configuration` (every key and
      why: :data:`platform_config.addon_configuration.INFERENCE_ADDON_KEYS`); it depends on the
      four add-ons above, so ``cdk deploy --all`` creates them first. Its execution role is named
      ``SageMakerHyperPodInference-*`` (:func:`inference_execution_role_name`) and may also tag
      the endpoints' ACM certificates and TLS objects (Inference v3.0 release notes). With
      ``inference_operator.gateway.enabled`` an IRSA role with
      ``AmazonSageMakerHyperPodInferenceGatewayAccess`` is created first for the gateway.

    Attributes:
        addons: add-on name -> ``eks_v2.Addon``.
        inference_operator: the ``amazon-sagemaker-hyperpod-inference`` add-on (it installs the
            InferenceEndpointConfig CRD, so business-line manifests depend on it).
        tls_bucket: :class:`kv_constructs.SecureBucket` for the operator's TLS certificates;
            deleted (emptied first) with the stack, its access logs retained.
        teardown_waiter: :class:`kv_constructs.teardown_wait.LoadBalancerTeardownWaiter`, whose
            ``service_token`` each line stack's ``Custom::LoadBalancersGone`` names.
        inference_execution_role, alb_role, keda_role, ebs_csi_role: :class:`kv_constructs.IrsaRole`.
        s3_csi_role, gateway_role: :class:`kv_constructs.IrsaRole` or ``None``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        platform: PlatformConfig,
        business_lines: tuple[BusinessLineConfig, ...],
        cluster: eks.ICluster,
        hyperpod_cluster_arn: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        versions = platform.versions.addons
        eks_cluster_arn = self.format_arn(service="eks", resource="cluster", resource_name=platform.eks.cluster_name)
        self.addons: dict[str, eks.Addon] = {}

        # --- EBS CSI driver (Curvine Primary volume) ------------------------------------------
        self.ebs_csi_role = IrsaRole(self, "EbsCsiRole", cluster=cluster, namespace="kube-system",
                                     service_account="ebs-csi-controller-sa",
                                     description="EBS CSI controller: EBS volumes, attach to HyperPod nodes")
        role = self.ebs_csi_role.role
        role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name(EBS_CSI_POLICY))
        role.add_to_policy(iam.PolicyStatement(
            sid="AttachVolumesToHyperPodNodes",
            actions=["sagemaker:AttachClusterNodeVolume", "sagemaker:DetachClusterNodeVolume"],
            resources=[hyperpod_cluster_arn],
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="DescribeThisEksCluster", actions=["eks:Describe*"], resources=[eks_cluster_arn]))
        nag.acknowledge_managed_policies(
            role, [EBS_CSI_POLICY],
            "AmazonEBSCSIDriverPolicyV2, the EBS CSI driver's tag-scoped AWS managed policy: its volume and "
            "snapshot actions (create, attach, detach, modify, delete) apply only to EBS volumes and snapshots "
            "tagged ebs.csi.aws.com/cluster=true (or created by the in-tree plugin); the Curvine Primary's "
            "volume carries that tag (kv_constructs/curvine_volume.py). Describe* stays on '*' (no "
            "resource-level permissions). Not scoped to this cluster: any volume of the account with that tag.")
        nag.acknowledge_wildcards(
            role, actions=["eks:Describe*"],
            reason="HyperPod's EBS CSI integration needs eks:Describe* (SageMaker HyperPod EBS CSI setup; "
            "docs/sources.md §1); the wildcard is on the action only and the resource is this cluster.")
        self._addon("aws-ebs-csi-driver", cluster, versions.aws_ebs_csi_driver, role=self.ebs_csi_role)

        # --- Mountpoint for S3 CSI driver (model weights) -------------------------------------
        self.s3_csi_role: IrsaRole | None = None
        s3_sources = sorted({(l.model.source.bucket, l.model.source.location.strip("/"))
                             for l in business_lines if isinstance(l.model.source, S3ModelSource)})
        if s3_sources:
            self.s3_csi_role = IrsaRole(self, "S3CsiRole", cluster=cluster, namespace="kube-system",
                                        service_account="s3-csi-driver-sa",
                                        description="Mountpoint for S3 CSI driver: read model weights")
            buckets = sorted({b for b, _ in s3_sources})
            objects = [f"arn:{self.partition}:s3:::{b}/{loc}/*" for b, loc in s3_sources]
            self.s3_csi_role.role.add_to_policy(iam.PolicyStatement(
                sid="ListModelBuckets", actions=["s3:ListBucket"],
                resources=[f"arn:{self.partition}:s3:::{b}" for b in buckets]))
            self.s3_csi_role.role.add_to_policy(iam.PolicyStatement(
                sid="ReadModelWeights", actions=["s3:GetObject"], resources=objects))
            nag.acknowledge_wildcards(
                self.s3_csi_role.role, resources=objects,
                reason="Read-only access to the model prefixes named in config/business-lines/*.yaml; "
                "the weight files under a prefix are not known at synth time.")
        self._addon("aws-mountpoint-s3-csi-driver", cluster, versions.aws_mountpoint_s3_csi_driver,
                    role=self.s3_csi_role)

        # --- Add-ons without AWS permissions ---------------------------------------------------
        self._addon("aws-fsx-csi-driver", cluster, versions.aws_fsx_csi_driver)
        self._addon("metrics-server", cluster, versions.metrics_server)
        self._addon("cert-manager", cluster, versions.cert_manager)

        # --- HyperPod inference operator ---------------------------------------------------------
        # The operator writes a certificate here for each endpoint it creates, so nothing in it
        # outlives the endpoints; the bucket goes with the stack (after the line stacks and
        # their endpoints): a retained bucket of this fixed name would make the next deploy fail.
        self.tls_bucket = SecureBucket(
            self, "TlsCertificates", bucket_name=tls_bucket_name(platform),
            removal_policy=RemovalPolicy.DESTROY, auto_delete_objects=True)
        self.inference_execution_role = IrsaRole(
            self, "InferenceExecutionRole", cluster=cluster, namespace=INFERENCE_NAMESPACE,
            service_account=INFERENCE_CONTROLLER_SA, extra_service_principals=["sagemaker.amazonaws.com"],
            description="HyperPod inference operator execution role", role_name=inference_execution_role_name(platform))
        execution = self.inference_execution_role.role
        execution.add_managed_policy(
            iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSageMakerHyperPodInferenceAccess"))
        certificates = self.tls_bucket.bucket.arn_for_objects("*")
        same_account = {"StringEquals": {"aws:ResourceAccount": self.account}}
        execution.add_to_policy(iam.PolicyStatement(
            sid="TlsCertificatesReadWrite",
            actions=["s3:GetObject", "s3:PutObject", "s3:PutObjectTagging", "s3:DeleteObject"],
            resources=[certificates], conditions=same_account))
        nag.acknowledge_managed_policies(
            execution, ["AmazonSageMakerHyperPodInferenceAccess"],
            "The AWS managed policy the HyperPod inference operator requires (docs/sources.md §1; "
            "SageMaker HyperPod model deployment setup).")
        # Inference v3.0 release notes (2026-02-23): the operator tags the ACM certificates it
        # imports for endpoints (and the TLS objects, s3:PutObjectTagging above). The notes grant
        # arn:aws:acm:*:*:certificate/*; narrowed here to this account and region.
        # Unconditioned, that grant would let the role put CreatedBy=HyperPodInference on any certificate
        # of the account and region and then delete it (the managed policy allows acm:DeleteCertificate
        # on that tag). So: only that one tag, and never on a certificate that already carries another
        # CreatedBy value; a certificate tagged by the operator stays taggable (issue 25 item 6).
        acm_certificates = self.format_arn(service="acm", resource="certificate", resource_name="*")
        execution.add_to_policy(iam.PolicyStatement(
            sid="TagEndpointCertificates", actions=["acm:AddTagsToCertificate"], resources=[acm_certificates],
            conditions=acm_tagging_conditions()))
        nag.acknowledge_wildcards(
            execution, resources=[certificates, acm_certificates],
            reason="The operator writes one certificate object per endpoint into its own TLS bucket and tags "
            "the ACM certificate it imports per endpoint; object keys and certificate IDs are generated at "
            "run time (helm_to_addon.sh policy; HyperPod Inference v3.0 release notes). ACM is limited to "
            "this account and region, to the one tag CreatedBy=HyperPodInference, and to certificates "
            "without a CreatedBy tag of another value.")

        self.alb_role = IrsaRole(self, "InferenceAlbRole", cluster=cluster, namespace=INFERENCE_NAMESPACE,
                                 service_account=INFERENCE_ALB_SA,
                                 description="AWS Load Balancer Controller of the HyperPod inference operator")
        alb_document = alb_controller_policy_document(
            self, scheme=platform.inference_operator.load_balancer_scheme)
        alb_policy = iam.Policy(self, "InferenceAlbPolicy", document=alb_document, roles=[self.alb_role.role])
        _acknowledge_document_wildcards(
            alb_policy, alb_document,
            "Official AWS Load Balancer Controller policy (v3.2.2, as shipped by aws-cdk-lib), narrowed to "
            "this region and account: Describe/Get actions have no resource-level permissions, and the "
            "mutating ones are conditioned on the elbv2.k8s.aws/cluster tags the controller sets. With "
            "load_balancer_scheme internal an explicit Deny refuses internet-facing load balancers.")

        # Trusted by the keda-operator service account only (sub and aud), as AWS's add-on setup guide
        # creates it ("Create the KEDA operator role"). AWS's helm_to_addon.sh also trusts
        # sagemaker.amazonaws.com, which no AWS page asks for and nothing here needs: KEDA reads metrics
        # from inside the cluster. docs/sources.md §15.
        self.keda_role = IrsaRole(self, "InferenceKedaRole", cluster=cluster, namespace=INFERENCE_NAMESPACE,
                                  service_account=INFERENCE_KEDA_SA,
                                  description="KEDA operator of the HyperPod inference operator (autoscaling)")
        # Prometheus: the observability stack grants aps:QueryMetrics on its own workspace to this
        # role (that workspace does not exist when this stack deploys); no workspace wildcard here.
        self.keda_role.role.add_to_policy(iam.PolicyStatement(
            sid="ReadCloudWatchMetrics",
            actions=["cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics", "cloudwatch:ListMetrics"],
            resources=["*"]))
        nag.acknowledge_wildcards(
            self.keda_role.role, resources=["*"],
            reason="KEDA's CloudWatch scaler reads metrics only, and CloudWatch metric reads have no "
            "resource-level permissions (Service Authorization Reference, Amazon CloudWatch).")

        # --- Inference gateway (add-on v2): off, or a role created before the add-on ------------
        self.gateway_role: IrsaRole | None = None
        gateway = platform.inference_operator.gateway
        if gateway.enabled:
            self.gateway_role = IrsaRole(
                self, "InferenceGatewayRole", cluster=cluster, namespace=INFERENCE_NAMESPACE,
                service_account=gateway.service_account,
                description="Inference gateway of the HyperPod inference add-on")
            self.gateway_role.role.add_managed_policy(
                iam.ManagedPolicy.from_aws_managed_policy_name(INFERENCE_GATEWAY_POLICY))
            nag.acknowledge_managed_policies(
                self.gateway_role.role, [INFERENCE_GATEWAY_POLICY],
                "The AWS managed policy the add-on's inference gateway requires (HyperPod inference add-on "
                "v2.0.0-eksbuild.2; docs/sources.md §31); AWS keeps it in step with the gateway.")

        inference = self._addon(
            INFERENCE_ADDON,
            cluster,
            versions.amazon_sagemaker_hyperpod_inference,
            configuration=inference_addon_configuration(
                platform,
                execution_role_arn=execution.role_arn,
                tls_bucket=self.tls_bucket.bucket.bucket_name,
                hyperpod_cluster_arn=hyperpod_cluster_arn,
                alb_role_arn=self.alb_role.role_arn,
                keda_role_arn=self.keda_role.role_arn,
                gateway_role_arn=self.gateway_role.role_arn if self.gateway_role else None,
            ),
        )
        self.inference_operator = inference
        for name in INFERENCE_DEPENDENCIES:
            inference.node.add_dependency(self.addons[name])
        # The operator's permissions must exist before it starts reconciling (the roles and the
        # bucket are already ordered by the references in the configuration values).
        inference.node.add_dependency(alb_policy)
        for role in (self.inference_execution_role, self.keda_role):
            if role.policy is not None:
                inference.node.add_dependency(role.policy)

        # The lines' teardown waits (kv_constructs/teardown_wait.py): here, because this stack outlives
        # every line stack and holds the add-on whose load balancer controller the waits are for.
        self.teardown_waiter = LoadBalancerTeardownWaiter(self, "LoadBalancerTeardownWaiter")

        CfnOutput(self, "TlsCertificateBucket", value=self.tls_bucket.bucket.bucket_name,
                  description="S3 bucket of the inference endpoints' TLS certificates")
        CfnOutput(self, "InferenceExecutionRoleArn", value=execution.role_arn,
                  description="Execution role of the HyperPod inference operator")

    def _addon(self, name: str, cluster: eks.ICluster, version: str, *, role: IrsaRole | None = None,
               configuration: dict[str, Any] | None = None) -> eks.Addon:
        addon = eks.Addon(self, f"Addon-{name}", cluster=cluster, addon_name=name, addon_version=version,
                          preserve_on_delete=False, configuration_values=configuration)
        cfn = addon.node.default_child
        assert isinstance(cfn, eks.CfnAddon)
        cfn.resolve_conflicts = "OVERWRITE"
        if role is not None:
            cfn.service_account_role_arn = role.role_arn
            if role.policy is not None:
                addon.node.add_dependency(role.policy)
        self.addons[name] = addon
        return addon


def acm_tagging_conditions() -> dict[str, Any]:
    """Conditions of the execution role's ``acm:AddTagsToCertificate``: the request adds exactly
    ``CreatedBy=HyperPodInference`` (what the operator tags with), and the certificate has no
    ``CreatedBy`` tag or that one (``StringEqualsIfExists``: a certificate being imported has no tags yet).

    What it cannot tell apart: a certificate of the account and region with no ``CreatedBy`` tag at all
    from one being imported; ACM refuses to delete a certificate a load balancer uses (docs/security.md).
    """
    return {
        "StringEquals": {f"aws:RequestTag/{OPERATOR_TAG_KEY}": OPERATOR_TAG_VALUE},
        "ForAllValues:StringEquals": {"aws:TagKeys": [OPERATOR_TAG_KEY]},
        "StringEqualsIfExists": {f"aws:ResourceTag/{OPERATOR_TAG_KEY}": OPERATOR_TAG_VALUE},
    }


def _acknowledge_document_wildcards(scope: Construct, document: iam.PolicyDocument, reason: str) -> None:
    """Acknowledge every wildcard action/resource of ``document`` (IAM5) on ``scope``."""
    resolved = Stack.of(scope).resolve(document.to_json())
    actions: set[str] = set()
    resources: list[Any] = []
    for statement in resolved.get("Statement", []):
        if statement.get("Effect") != "Allow":
            continue
        for key, sink in (("Action", actions), ("Resource", None)):
            values = statement.get(key, [])
            values = values if isinstance(values, list) else [values]
            for value in values:
                flat = nag.flatten_resolved(value)  # already resolved with the document
                if "*" not in flat:
                    continue
                if sink is not None:
                    sink.add(flat)
                elif value not in resources:
                    resources.append(value)
    nag.acknowledge_wildcards(scope, actions=sorted(actions), resources=resources, reason=reason)
