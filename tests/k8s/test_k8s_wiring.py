"""CDK wiring: the charts applied through the kubectl provider, in dependency order.

Uses the root conftest's session fixtures (``platform``, ``templates``: the example platform
synthesized once). Resources are found by what they contain, never by hashed logical IDs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

MANIFEST = "Custom::AWSCDK-EKS-KubernetesResource"
HELM = "Custom::AWSCDK-EKS-HelmChart"


def _manifests(template) -> dict[str, dict[str, Any]]:
    return template.find_resources(MANIFEST)


def _kinds(resource: dict[str, Any], substitute: str = "vol-0123456789abcdef0") -> list[str]:
    """Kinds in a manifest resource; Fn::Join parts (tokens) are replaced by ``substitute``."""
    manifest = resource["Properties"]["Manifest"]
    if isinstance(manifest, dict):
        parts = manifest["Fn::Join"][1]
        manifest = "".join(p if isinstance(p, str) else substitute for p in parts)
    return [o["kind"] for o in json.loads(manifest)]


def _by_kind(manifests: dict[str, dict], kind: str) -> str:
    (logical_id,) = [lid for lid, r in manifests.items() if kind in _kinds(r)]
    return logical_id


@pytest.fixture(scope="module")
def l2(templates, project):
    return templates[f"{project.platform.project}-l2-cache"]


def test_kyverno_chart_is_pinned_from_config(l2, project):
    pin = project.platform.versions.charts.kyverno
    charts = l2.find_resources(HELM)
    (chart,) = charts.values()
    props = chart["Properties"]
    assert (props["Chart"], props["Repository"], props["Version"]) == (pin.chart, pin.repository, pin.version)
    assert props["Namespace"] == "kyverno" and props["Wait"] is True
    assert props.get("CreateNamespace") in (None, False)  # the platform's Namespace, with its labels
    values = json.loads(props["Values"])
    assert values["config"]["excludeGroups"] == ["system:nodes"]
    assert values["config"]["excludeUsernames"] == []
    expressions = values["config"]["webhooks"]["namespaceSelector"]["matchExpressions"]
    assert {"key": "kvcache.io/business-line", "operator": "Exists"} in expressions
    (excluded,) = [e["values"] for e in expressions if e["operator"] == "NotIn"]
    assert set(excluded) == {"kube-system", "kyverno"}
    for line in project.business_lines:
        assert line.namespace not in excluded


def test_curvine_chart_gets_the_real_volume_id(l2, platform):
    manifests = _manifests(l2)
    curvine = manifests[_by_kind(manifests, "StatefulSet")]
    parts = curvine["Properties"]["Manifest"]["Fn::Join"][1]
    tokens = [p for p in parts if not isinstance(p, str)]
    assert len(tokens) == 1, "only the volume ID is a deploy-time value"
    (imported,) = tokens
    assert "Fn::ImportValue" in imported and "CurvinePrimaryVolume" in imported["Fn::ImportValue"]
    text = "".join(p if isinstance(p, str) else "vol-0feedfacecafe0000" for p in parts)
    (pv,) = [o for o in json.loads(text) if o["kind"] == "PersistentVolume"]
    assert pv["spec"]["csi"]["volumeHandle"] == "vol-0feedfacecafe0000"
    zone = platform.hyperpod.curvine_volume.availability_zone
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [zone]


def _namespace_manifest(manifests: dict[str, dict], name: str) -> str:
    (logical_id,) = [lid for lid, r in manifests.items() if _kinds(r) == ["Namespace"]
                     and json.loads(r["Properties"]["Manifest"])[0]["metadata"]["name"] == name]
    return logical_id


def test_curvine_objects_after_their_namespace(l2):
    manifests = _manifests(l2)
    ns = _namespace_manifest(manifests, "curvine")
    curvine = _by_kind(manifests, "StatefulSet")
    assert ns in manifests[curvine].get("DependsOn", [])


def test_the_kyverno_namespace_is_ours_restricted_and_before_the_chart(l2, project):
    """Issue 25 (low): every namespace the platform creates carries Pod Security labels at the strictest
    level its pods pass; Kyverno's pods (chart 3.5.2) all pass restricted (k8s/kyverno.py)."""
    from aws_cdk.assertions import Match

    version = f"v{project.platform.eks.version}"
    manifests = _manifests(l2)
    ns_id = _namespace_manifest(manifests, "kyverno")
    (labels,) = [o["metadata"]["labels"] for o in json.loads(manifests[ns_id]["Properties"]["Manifest"])]
    labels = {k: v for k, v in labels.items() if k.startswith("pod-security.kubernetes.io/")}  # not aws-cdk's prune label
    assert labels == {f"pod-security.kubernetes.io/{mode}{suffix}": value
                      for mode in ("enforce", "warn", "audit")
                      for suffix, value in (("", "restricted"), ("-version", version))}
    l2.has_resource(HELM, {"Properties": Match.object_like({"Namespace": "kyverno"}),
                           "DependsOn": Match.array_with([ns_id])})
def test_the_egress_admission_policy_is_bound_after_kyverno_generated_the_copies(l2):
    """The binding of kvcache-curvine-egress-required is its own manifest, applied only once the
    generated block-curvine-ports exists in `default` (a KubernetesObjectValue read after the chart)."""
    manifests = _manifests(l2)
    curvine = _by_kind(manifests, "StatefulSet")

    def objects(lid: str) -> list[dict]:
        manifest = manifests[lid]["Properties"]["Manifest"]
        if isinstance(manifest, dict):
            manifest = "".join(p if isinstance(p, str) else "vol-0123456789abcdef0" for p in manifest["Fn::Join"][1])
        return json.loads(manifest)

    holders = [lid for lid in manifests if any(
        (o["kind"], o["metadata"]["name"]) == ("ValidatingAdmissionPolicyBinding", "kvcache-curvine-egress-required")
        for o in objects(lid))]
    assert len(holders) == 1 and holders[0] != curvine
    (binding,) = holders
    assert len(objects(binding)) == 1 and "ClusterPolicy" in _kinds(manifests[curvine])
    values = l2.find_resources("Custom::AWSCDK-EKS-KubernetesObjectValue")
    ((value_id, value),) = [(k, v) for k, v in values.items()
                            if v["Properties"]["ObjectType"] == "networkpolicies.networking.k8s.io"]
    assert (value["Properties"]["ObjectName"], value["Properties"]["ObjectNamespace"]) == ("block-curvine-ports", "default")
    assert curvine in value["DependsOn"] and value_id in manifests[binding]["DependsOn"]
    # The aggregated rights of Kyverno's background controller come first, on their own.
    (rights,) = [lid for lid in manifests if [(o["kind"], o["metadata"]["name"]) for o in objects(lid)] == [
        ("ClusterRole", "kvcache-kyverno-generate-networkpolicies")]]
    assert rights in manifests[curvine]["DependsOn"]


def test_make_manifests_reads_the_volume_outputs_the_hyperpod_stack_writes(templates, project):
    """`scripts/manifests.py --outputs-file` looks up keys that a deploy really writes."""
    from tests.tools.script_loader import load_script

    manifests_script = load_script("manifests")
    outputs = templates[f"{project.platform.project}-hyperpod"].to_json()["Outputs"]
    assert outputs[manifests_script.VOLUME_ID_OUTPUT]["Value"]["Ref"]
    assert outputs[manifests_script.ZONE_OUTPUT]["Value"] == project.platform.gpu_availability_zone


@pytest.mark.parametrize("name", ["rag-assistant", "research-reasoning"])
def test_line_objects_in_dependency_order(templates, project, name):
    t = templates[f"{project.platform.project}-line-{name}"]
    manifests = _manifests(t)
    ns = _by_kind(manifests, "Namespace")
    storage = _by_kind(manifests, "Policy")
    endpoint = _by_kind(manifests, "InferenceEndpointConfig")
    assert _kinds(manifests[ns]) == ["Namespace"]
    # Janitor and canary: a ConfigMap, Deployment, Role, RoleBinding and ServiceAccount each; a Role
    # and RoleBinding more: the L2 mount watchdog's (k8s/mount_watchdog.py); a ConfigMap more: the
    # vLLM plugins (the L2 gate, k8s/vllm_plugins.py), before the endpoint whose pods mount it.
    assert sorted(_kinds(manifests[storage])) == sorted(2 * ["NetworkPolicy"] + ["PodDisruptionBudget", "PersistentVolumeClaim", "Policy"] + 2 * [
        "ConfigMap", "Deployment", "Role", "RoleBinding", "ServiceAccount"] + ["Role", "RoleBinding", "ConfigMap"])
    assert _kinds(manifests[endpoint]) == ["InferenceEndpointConfig"]
    # Objects dropped from a manifest are deleted on update (kubectl apply --prune with this label;
    # aws-cdk-lib aws_eks_v2 "Resource Pruning", on by default).
    assert manifests[storage]["Properties"]["PruneLabel"].startswith("aws.cdk.eks/prune-")
    assert ns in manifests[storage]["DependsOn"]
    assert {ns, storage} <= set(manifests[endpoint]["DependsOn"])
    # The endpoint also waits for Kyverno to report the Policy Ready (issue 8, case 4).
    (ready_id,) = [k for k, r in t.to_json()["Resources"].items()
                   if r["Type"] == "Custom::AWSCDK-EKS-KubernetesObjectValue"]
    ready = t.to_json()["Resources"][ready_id]["Properties"]
    assert ready["ObjectType"] == "policies.kyverno.io" and ready["ObjectName"] == f"{name}-l2-cache"
    assert ready["JsonPath"] == '.status.conditions[?(@.status=="True")].type'
    assert storage in t.to_json()["Resources"][ready_id]["DependsOn"]
    assert ready_id in manifests[endpoint]["DependsOn"]


def test_line_stacks_after_kyverno_and_the_operator(platform):
    for stack in platform.business_lines.values():
        deps = set(stack.dependencies)
        assert platform.l2_cache in deps, "the Policy kind comes from the Kyverno chart"
        assert platform.addons in deps, "the InferenceEndpointConfig kind comes from the inference add-on"
    assert platform.addons in set(platform.l2_cache.dependencies), "EBS CSI driver before the static PV"
