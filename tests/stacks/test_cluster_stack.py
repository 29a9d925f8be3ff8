"""EKS stack: native cluster, auth mode, KMS secrets, logging, endpoint access, access entries, add-ons."""

from __future__ import annotations

import json

from aws_cdk.assertions import Capture, Match

from stacks.cluster_stack import CLUSTER_LOGICAL_ID

EKS = "kvcache-eks"


def cluster(templates) -> dict:
    clusters = templates[EKS].find_resources("AWS::EKS::Cluster")
    assert list(clusters) == [CLUSTER_LOGICAL_ID], "the EKS cluster's logical ID must stay pinned"
    return clusters[CLUSTER_LOGICAL_ID]


def test_cluster_logical_id_is_pinned_to_eks_cluster(templates) -> None:
    assert CLUSTER_LOGICAL_ID == "EksCluster"
    cluster(templates)


def test_cluster_version_name_and_authentication_mode(templates, project) -> None:
    props = cluster(templates)["Properties"]
    assert props["Version"] == "1.33"
    assert props["Name"] == project.platform.eks.cluster_name
    assert props["AccessConfig"] == {
        "AuthenticationMode": "API_AND_CONFIG_MAP",
        "BootstrapClusterCreatorAdminPermissions": False,
    }


def test_secrets_are_encrypted_with_a_rotating_kms_key(templates) -> None:
    template = templates[EKS]
    key = Capture()
    template.has_resource_properties("AWS::EKS::Cluster", {
        "EncryptionConfig": [{"Provider": {"KeyArn": {"Fn::GetAtt": [key, "Arn"]}}, "Resources": ["secrets"]}]})
    keys = template.find_resources("AWS::KMS::Key")
    assert keys[key.as_string()]["Properties"]["EnableKeyRotation"] is True


def test_all_configured_control_plane_logs_are_on(templates, project) -> None:
    enabled = cluster(templates)["Properties"]["Logging"]["ClusterLogging"]["EnabledTypes"]
    assert [t["Type"] for t in enabled] == list(project.platform.eks.control_plane_logging)
    assert len(enabled) == 5


def test_endpoint_is_private_by_default(templates, project) -> None:
    assert project.platform.eks.endpoint_access == "private"
    vpc_config = cluster(templates)["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config["EndpointPublicAccess"] is False
    assert len(vpc_config["SubnetIds"]) == len(project.platform.availability_zones)


def test_admin_principals_get_cluster_admin_access_entries(templates, project) -> None:
    entries = {r["Properties"]["PrincipalArn"]: r["Properties"]
               for r in templates[EKS].find_resources("AWS::EKS::AccessEntry").values()
               if isinstance(r["Properties"]["PrincipalArn"], str)}
    assert set(entries) == set(project.platform.eks.admin_principal_arns)
    for entry in entries.values():
        (policy,) = entry["AccessPolicies"]
        assert policy["AccessScope"] == {"Type": "cluster"}
        assert policy["PolicyArn"]["Fn::Join"][1][-1] == ":eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def test_core_addons_are_pinned_to_config_versions(templates, project) -> None:
    versions = project.platform.versions.addons
    expected = {
        "vpc-cni": versions.vpc_cni,
        "coredns": versions.coredns,
        "kube-proxy": versions.kube_proxy,
        "eks-pod-identity-agent": versions.eks_pod_identity_agent,
    }
    for name, version in expected.items():
        templates[EKS].has_resource_properties("AWS::EKS::Addon", {
            "AddonName": name, "AddonVersion": version, "ResolveConflicts": "OVERWRITE",
            "ClusterName": {"Ref": CLUSTER_LOGICAL_ID}})
    templates[EKS].resource_count_is("AWS::EKS::Addon", len(expected))


def test_vpc_cni_runs_the_network_policy_agent(templates) -> None:
    """Without enableNetworkPolicy the platform's NetworkPolicies are accepted and enforced by nothing."""
    addon = Capture()
    templates[EKS].has_resource_properties("AWS::EKS::Addon", {
        "AddonName": "vpc-cni", "ConfigurationValues": addon})
    assert json.loads(addon.as_string()) == {"enableNetworkPolicy": "true"}  # a string, per the add-on schema
    # The other core add-ons keep their defaults.
    for other in ("coredns", "kube-proxy", "eks-pod-identity-agent"):
        templates[EKS].has_resource_properties("AWS::EKS::Addon", {
            "AddonName": other, "ConfigurationValues": Match.absent()})


def test_system_nodegroup_is_small_al2023_in_the_gpu_zone(templates, project, platform) -> None:
    eks = project.platform.eks
    templates[EKS].has_resource_properties("AWS::EKS::Nodegroup", {
        "AmiType": "AL2023_x86_64_STANDARD",
        "CapacityType": "ON_DEMAND",
        "InstanceTypes": [eks.system_node_instance_type],
        "ScalingConfig": {"MinSize": eks.system_node_count, "DesiredSize": eks.system_node_count,
                          "MaxSize": eks.system_node_count},
        "Labels": {"kvcache.io/node-role": "system"},
        "Subnets": [Match.any_value()],
    })
    subnets = platform.cluster.resolve(platform.cluster.system_nodegroup.node.default_child.subnets)
    assert subnets == [platform.cluster.resolve(platform.network.hyperpod_subnet.subnet_id)]


def test_oidc_provider_is_the_native_resource(templates) -> None:
    templates[EKS].resource_count_is("AWS::IAM::OIDCProvider", 1)
    assert not templates[EKS].find_resources("Custom::AWSCDKOpenIdConnectProvider")


def test_kubectl_handler_exists_for_later_stacks(templates, platform) -> None:
    assert platform.cluster.cluster.kubectl_provider is not None
    templates[EKS].has_resource_properties("AWS::Lambda::LayerVersion", {
        "Description": Match.string_like_regexp("kubectl")})


def test_outputs_include_names_arns_and_kubeconfig_command(templates, project) -> None:
    outputs = templates[EKS].find_outputs("*")
    p = project.platform
    assert outputs["ClusterName"]["Value"] == p.eks.cluster_name
    assert outputs["ClusterArn"]["Value"] == {"Fn::GetAtt": [CLUSTER_LOGICAL_ID, "Arn"]}
    assert outputs["UpdateKubeconfigCommand"]["Value"] == (
        f"aws eks update-kubeconfig --region {p.region} --name {p.eks.cluster_name}")
