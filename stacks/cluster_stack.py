"""The EKS cluster that orchestrates HyperPod (``aws_cdk.aws_eks_v2``, native ``AWS::EKS::Cluster``)."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from constructs import Construct

from k8s import kube
from k8s.nodes import SYSTEM_NODE_LABEL, SYSTEM_NODE_VALUE
from kv_constructs import nag
from kv_constructs.load_balancer_scheme import deny_internet_facing_statement
from platform_config import PlatformConfig
from platform_config.addon_configuration import CORE_ADDON_CONFIGURATION

#: The cluster's pinned CloudFormation logical ID (stateful: a changed ID replaces the cluster).
CLUSTER_LOGICAL_ID = "EksCluster"

#: Upper bound of every wait a custom resource runs inside the kubectl handler (Helm's
#: ``--timeout`` with ``wait``/``atomic``, ``KubernetesObjectValue``'s polling). The handler Lambda
#: lives at most 900 s (aws-cdk-lib's kubectl provider); a Helm wait as long as that is killed with
#: the Lambda, before Helm can roll back or report, and the release stays ``pending-install`` /
#: ``pending-upgrade`` (aws-cdk issue 22257, docs/sources.md §11). 10 minutes leaves 5 for the
#: install itself and the response to CloudFormation; tests/stacks/test_cluster_stack.py checks
#: every synthesized template against its handler's timeout.
HELM_TIMEOUT = Duration.minutes(10)

#: HyperPod on EKS accepts authentication mode API or API_AND_CONFIG_MAP (SageMaker HyperPod EKS
#: prerequisites). aws_eks_v2 hard-codes API; API_AND_CONFIG_MAP keeps aws-auth working for
#: tools that still write it, while access entries (below) stay the primary mechanism.
AUTHENTICATION_MODE = "API_AND_CONFIG_MAP"

_LOG_TYPES = {
    "api": eks.ClusterLoggingTypes.API,
    "audit": eks.ClusterLoggingTypes.AUDIT,
    "authenticator": eks.ClusterLoggingTypes.AUTHENTICATOR,
    "controllerManager": eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    "scheduler": eks.ClusterLoggingTypes.SCHEDULER,
}

#: Core add-ons installed as EKS managed add-ons, keyed by add-on name -> config attribute.
CORE_ADDONS = {
    "vpc-cni": "vpc_cni",
    "coredns": "coredns",
    "kube-proxy": "kube_proxy",
    "eks-pod-identity-agent": "eks_pod_identity_agent",
}

# The core add-ons' ``configuration_values`` (JSON-encoded by ``eks_v2.Addon``) are
# :data:`platform_config.addon_configuration.CORE_ADDON_CONFIGURATION`, so scripts/preflight.py
# checks the same keys. Its vpc-cni ``enableNetworkPolicy`` runs the network policy agent
# (container ``aws-eks-nodeagent`` in the ``aws-node`` DaemonSet, VPC CNI >= 1.14); without it the
# platform's NetworkPolicies (Curvine Primary, business-line namespaces) are accepted by the API
# server and enforced by nothing. Caveats, all outside what CDK can check:
# - The agent enforces with eBPF and needs Linux >= 5.10 with the BPF file system mounted at
#   /sys/fs/bpf. EKS AMIs guarantee that; HyperPod nodes run HyperPod's own AMI, so after the
#   first deployment check that ``aws-eks-nodeagent`` is healthy on a HyperPod node
#   (``kubectl -n kube-system logs ds/aws-node -c aws-eks-nodeagent``) before relying on a policy.
# - hostNetwork pods are never subject to NetworkPolicy (the Curvine FUSE pods of the CSI driver).
# - Default (``standard``) enforcing mode: a new pod is allow-all until its policies reconcile,
#   usually within seconds.


class ClusterStack(Stack):
    """EKS control plane, a small system node group, core add-ons and the kubectl handler.

    - Kubernetes ``eks.version``, ``AccessConfig.AuthenticationMode`` ``API_AND_CONFIG_MAP`` (override of
      the L1, see :data:`AUTHENTICATION_MODE`), access entries with
      ``AmazonEKSClusterAdminPolicy`` for each ``eks.admin_principal_arns``. The CloudFormation
      role is *not* made cluster admin (``bootstrap_cluster_creator_admin_permissions=False``):
      admins come from config, deployments go through the kubectl handler's own entry.
    - Secrets envelope-encrypted with a customer-managed KMS key (rotation on).
    - Control-plane log types from config; endpoint private unless configured otherwise.
    - Security groups: the control-plane ENIs are in the cluster security group EKS creates and
      in the shared group of the network stack. The system node group (no launch template) is in
      the cluster security group only; HyperPod nodes get both (see ``HyperPodStack``), so
      system nodes, HyperPod nodes and the control plane all reach each other in both
      directions (CoreDNS, kubelet, Curvine Primary <-> Workers, webhooks).
    - System node group (AL2023, on-demand) in the GPU zone's private subnet: the Curvine
      Primary's EBS volume lives in that zone, so the Primary must be schedulable there, and
      the data plane (HyperPod, the volume) is single-zone anyway.
    - Managed core add-ons at pinned versions: vpc-cni (network policy agent on, see
      :data:`~platform_config.addon_configuration.CORE_ADDON_CONFIGURATION`), coredns, kube-proxy, eks-pod-identity-agent.
    - The cluster's IAM OIDC provider (native ``AWS::IAM::OIDCProvider``) for IRSA.
    - A kubectl/helm handler (the ``KubectlV<NN>Layer`` of ``eks.version``, from
      :func:`k8s.kube.kubectl_layer_class`) so later stacks can apply manifests and charts; their
      waits stay within :data:`HELM_TIMEOUT`.

    Attributes:
        cluster: the ``eks_v2.Cluster``.
        addons: add-on name -> ``eks_v2.Addon`` of the core add-ons.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        platform: PlatformConfig,
        vpc: ec2.IVpc,
        private_subnets: list[ec2.ISubnet],
        system_subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        cfg = platform.eks
        secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"{cfg.cluster_name}: envelope encryption of Kubernetes secrets",
            enable_key_rotation=True,
        )
        if cfg.endpoint_access == "private":
            endpoint = eks.EndpointAccess.PRIVATE
        else:
            endpoint = eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*cfg.public_access_cidrs)

        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cfg.cluster_name,
            version=eks.KubernetesVersion.of(cfg.version),
            vpc=vpc,
            vpc_subnets=[ec2.SubnetSelection(subnets=private_subnets)],
            security_group=security_group,
            endpoint_access=endpoint,
            secrets_encryption_key=secrets_key,
            cluster_logging=[_LOG_TYPES[t] for t in cfg.control_plane_logging],
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            bootstrap_cluster_creator_admin_permissions=False,
            output_config_command=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kube.kubectl_layer_class(cfg.version)(self, "KubectlLayer")),
            tags=dict(platform.tags),
        )
        cfn_cluster = self.cluster.node.default_child
        assert isinstance(cfn_cluster, eks.CfnCluster)
        cfn_cluster.override_logical_id(CLUSTER_LOGICAL_ID)
        cfn_cluster.add_property_override("AccessConfig.AuthenticationMode", AUTHENTICATION_MODE)
        # Explicit: with no UpgradePolicy EKS moves a version past standard support to extended
        # support (and its price) silently; STANDARD would upgrade it by itself (eks.support_type).
        cfn_cluster.add_property_override("UpgradePolicy.SupportType", cfg.support_type)
        # IRSA needs the OIDC provider; create it here, with the cluster (native resource:
        # feature flag @aws-cdk/aws-eks:useNativeOidcProvider in cdk.json).
        self.oidc_provider = self.cluster.open_id_connect_provider

        for i, arn in enumerate(cfg.admin_principal_arns):
            self.cluster.grant_access(
                f"Admin{i}",
                arn,
                [eks.AccessPolicy.from_access_policy_name(
                    "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER)],
            )

        self.system_nodegroup = self.cluster.add_nodegroup_capacity(
            "SystemNodes",
            instance_types=[ec2.InstanceType(cfg.system_node_instance_type)],
            min_size=cfg.system_node_count,
            desired_size=cfg.system_node_count,
            max_size=cfg.system_node_count,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            capacity_type=eks.CapacityType.ON_DEMAND,
            subnets=ec2.SubnetSelection(subnets=[system_subnet]),
            labels={SYSTEM_NODE_LABEL: SYSTEM_NODE_VALUE},
            release_version=cfg.system_node_release_version,
        )
        # The node group's Kubernetes version, explicitly: EKS moves a managed node group only
        # when Version or ReleaseVersion changes, so without it the system nodes (Curvine
        # Primary, Kyverno, CoreDNS) keep their first AMI through every control-plane upgrade.
        # The L2 construct has no `version` option; the CloudFormation property is Version.
        cfn_nodegroup = self.system_nodegroup.node.default_child
        assert isinstance(cfn_nodegroup, eks.CfnNodegroup)
        cfn_nodegroup.add_property_override("Version", cfg.version)
        nag.acknowledge_managed_policies(
            self.system_nodegroup.role,
            ["AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly"],
            "The three AWS managed policies every EKS managed node group role needs (EKS user guide, "
            "'Amazon EKS node IAM role'); AWS keeps them in step with the kubelet and the VPC CNI.",
        )
        # The cloud provider creates load balancers for the Services it handles with this role
        # (AmazonEKSClusterPolicy allows CreateLoadBalancer): the same Deny as the controller's.
        if platform.inference_operator.load_balancer_scheme == "internal":
            self.cluster.role.add_to_principal_policy(deny_internet_facing_statement())
        nag.acknowledge_managed_policies(
            self.cluster.role,
            ["AmazonEKSClusterPolicy"],
            "The AWS managed policy the EKS service role needs (EKS user guide, 'Amazon EKS cluster IAM role').",
        )

        versions = platform.versions.addons
        self.addons: dict[str, eks.Addon] = {}
        for name, attr in CORE_ADDONS.items():
            addon = eks.Addon(
                self,
                f"Addon-{name}",
                cluster=self.cluster,
                addon_name=name,
                addon_version=getattr(versions, attr),
                preserve_on_delete=False,
                configuration_values=CORE_ADDON_CONFIGURATION.get(name),
            )
            # EKS bootstraps self-managed vpc-cni/coredns/kube-proxy; OVERWRITE lets the managed
            # add-on adopt them instead of failing on field conflicts.
            cfn_addon = addon.node.default_child
            assert isinstance(cfn_addon, eks.CfnAddon)
            cfn_addon.resolve_conflicts = "OVERWRITE"
            self.addons[name] = addon

        # cdk-nag findings of the kubectl handler are acknowledged by stacks.build_platform once
        # every stack has added its grants (kv_constructs.nag.suppress_kubectl_provider).

        region = platform.region
        CfnOutput(self, "ClusterName", value=cfg.cluster_name, description="EKS cluster name")
        CfnOutput(self, "ClusterArn", value=self.cluster.cluster_arn, description="EKS cluster ARN")
        CfnOutput(
            self,
            "UpdateKubeconfigCommand",
            value=f"aws eks update-kubeconfig --region {region} --name {cfg.cluster_name}",
            description="Point kubectl at the cluster (caller must be in eks.admin_principal_arns)",
        )
        CfnOutput(self, "OidcProviderArn", value=self.oidc_provider.open_id_connect_provider_arn,
                  description="IAM OIDC provider of the cluster (IRSA)")
