"""Schema checks: built-in objects (kubernetes-validate, strict, at ``eks.version``) and the CRD objects.

An InferenceEndpointConfig must validate against the CRD's v1 openAPIV3Schema *and* hold no
field the API server would silently prune: structural schemas drop unknown fields without an
error, which is how a misspelled ``kvCacheSpec`` key disappears in production.
"""

from __future__ import annotations

from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import pytest
from tests.k8s.conftest import CRD_FILE, CRD_SCHEMA_FILE, REPO, find, needs_reference

from k8s import names
from k8s.kube import KUBERNETES_VERSION
from k8s.kyverno import policy_manifest
from platform_config import load_platform
from tests.example_config import FIXTURE_CONFIG
from tests.k8s.custom_kinds import CUSTOM_KINDS

#: The schemas of the cluster's Kubernetes version (``eks.version`` of the scenario config), which
#: is also the version of the charts' API classes (``k8s.kube``).
K8S_VERSION = load_platform(FIXTURE_CONFIG / "platform.yaml").eks.version


def _builtin_objects(manifests) -> Iterator[tuple[str, dict]]:
    for chart, objects in manifests.items():
        for obj in objects:
            if obj["kind"] not in CUSTOM_KINDS:
                yield f"{chart}/{obj['kind']}/{obj['metadata']['name']}", obj


def test_every_builtin_object_validates_strictly(manifests, k8s_project):
    assert K8S_VERSION == k8s_project.platform.eks.version == KUBERNETES_VERSION
    checked = 0
    for ident, obj in _builtin_objects(manifests):
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:  # pragma: no cover - message for humans
            pytest.fail(f"{ident}: {exc.message} at {list(exc.path)}")
        checked += 1
    assert checked >= 25


def test_strict_validation_catches_a_typo(manifests):
    """The check above can fail: an unknown field is rejected in strict mode."""
    sts = dict(find(manifests["curvine"], "StatefulSet", names.CURVINE_MASTER))
    sts["spec"] = {**sts["spec"], "replica": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def pruned_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths in ``obj`` that a structural schema does not declare (the API server prunes them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                found += pruned_fields(value, props[key], f"{path}.{key}")
            elif isinstance(additional, dict):
                found += pruned_fields(value, additional, f"{path}.{key}")
            elif additional is True:
                continue
            elif props is not None or schema.get("type") == "object":
                found.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            found += pruned_fields(item, schema["items"], f"{path}[{i}]")
    return found


def _endpoints(manifests) -> list[dict]:
    return [o for objects in manifests.values() for o in objects if o["kind"] == "InferenceEndpointConfig"]


@needs_reference
def test_committed_crd_schema_is_generated_from_the_reference_crd():
    """imports/inferenceendpointconfig-v1.schema.json is what the generator makes of the CRD."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_crd_schema", REPO / "scripts" / "update_crd_schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert CRD_SCHEMA_FILE.read_text(encoding="utf-8") == module.render(CRD_FILE)


def test_endpoints_validate_against_the_crd(manifests, crd_v1_schema, k8s_project):
    endpoints = _endpoints(manifests)
    assert len(endpoints) == len(k8s_project.business_lines) >= 2
    for obj in endpoints:
        assert obj["apiVersion"] == "inference.sagemaker.aws.amazon.com/v1"
        jsonschema.validate(obj, crd_v1_schema, cls=jsonschema.Draft7Validator)


def test_endpoints_hold_no_field_the_api_server_would_prune(manifests, crd_v1_schema):
    for obj in _endpoints(manifests):
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        assert pruned_fields(body, crd_v1_schema) == [], obj["metadata"]["name"]


def test_the_prune_walker_finds_unknown_fields(manifests, crd_v1_schema):
    """The walker can fail: a misspelled key inside kvCacheSpec is reported."""
    obj = _endpoints(manifests)[0]
    spec = {**obj["spec"], "kvCacheSpec": {**obj["spec"]["kvCacheSpec"], "enableL2cache": True}}
    assert pruned_fields({"spec": spec}, crd_v1_schema) == [".spec.kvCacheSpec.enableL2cache"]


def test_endpoint_schema_rejects_a_bad_backend(manifests, crd_v1_schema):
    obj = _endpoints(manifests)[0]
    bad = {**obj, "spec": {**obj["spec"], "kvCacheSpec": {"enableL2Cache": True, "l2CacheSpec": {"l2CacheBackend": "fs"}}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, crd_v1_schema, cls=jsonschema.Draft7Validator)


def test_policy_objects_are_the_generated_ones(manifests, k8s_project):
    """The rendered Policy equals policy_manifest() (cdk8s adds only the chart labels)."""
    for line in (l for l in k8s_project.business_lines if l.cache.l2_enabled):  # no L2, no mutation Policy
        rendered = find(manifests[names.line_chart_name(line)], "Policy", names.policy_name(line))
        expected = policy_manifest(k8s_project.platform, line)
        assert rendered["apiVersion"] == "kyverno.io/v1"
        assert rendered["spec"] == expected["spec"]
        assert rendered["metadata"]["annotations"] == expected["metadata"]["annotations"]
        assert rendered["metadata"]["namespace"] == line.namespace


def test_the_generated_network_policy_validates_strictly(manifests, k8s_project):
    """The Kyverno ClusterPolicy is curvine_egress_generator() and what it generates is a valid,
    strict NetworkPolicy; the line charts render the same but for the instance metadata service,
    which a line's copy leaves out (k8s.network_policies)."""
    from k8s.network_policies import EGRESS_GENERATOR, block_curvine_ports_manifest, curvine_egress_generator

    rendered = find(manifests["curvine"], "ClusterPolicy", EGRESS_GENERATOR)
    expected = curvine_egress_generator(k8s_project.platform.curvine.namespace)
    assert rendered["apiVersion"] == "kyverno.io/v1" and rendered["spec"] == expected["spec"]
    (rule,) = rendered["spec"]["rules"]
    generated = {"apiVersion": rule["generate"]["apiVersion"], "kind": rule["generate"]["kind"],
                 "metadata": {"name": rule["generate"]["name"], "namespace": "tomorrow"}, **rule["generate"]["data"]}
    kubernetes_validate.validate(generated, K8S_VERSION, strict=True)
    assert generated == block_curvine_ports_manifest("tomorrow")
    for line in k8s_project.business_lines:
        line_copy = find(manifests[names.line_chart_name(line)], "NetworkPolicy", "block-curvine-ports")
        kubernetes_validate.validate(line_copy, K8S_VERSION, strict=True)
        (rule,) = line_copy["spec"]["egress"]
        assert rule["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}]
        assert {**line_copy["spec"], "egress": [{k: v for k, v in rule.items() if k != "to"}]} == generated["spec"]


def _declared_paths(node: Any, path: str = "") -> Iterator[str]:
    """Every property path a schema declares (``.spec.kubernetes.volumes[].name``)."""
    if not isinstance(node, dict):
        return
    for key, child in (node.get("properties") or {}).items():
        yield f"{path}.{key}"
        yield from _declared_paths(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _declared_paths(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _declared_paths(node["additionalProperties"], f"{path}{{}}")


#: Fields the operator added after the CRD the bindings come from (v3.2, aws/sagemaker-hyperpod-cli
#: 011ca927): v3.6 (PR #461) and v3.7 (PR #464), as those pull requests describe them; no CRD of
#: either could be read (docs/sources.md §24). Each is a decision to take when the bindings are
#: regenerated from a CRD that has it.
OPERATOR_FIELDS_AFTER_THE_BINDINGS = {
    "lmcache": "render spec.lmcache.mode from cache.lmcache_mode (InProcess) in k8s/line_chart.endpoint_spec, so "
               "the mode is explicit on every endpoint (issue 26)",
    "tolerations": "decide whether lines may run on tainted groups: platform_config/loader.py refuses a line whose "
                   "groups are all tainted because the CRD had no tolerations field",
    "podTemplateAnnotations": "decide whether the L2 mutation should select on a pod-template annotation (docs/l2-cache.md)",
    "priorityClassName": "PR #464 wires it into the operator's own Deployment, not the CR; if the CR has it, decide the "
                         "inference pods' priority class (docs/sources.md §24)",
}


@pytest.mark.parametrize("field", sorted(OPERATOR_FIELDS_AFTER_THE_BINDINGS))
def test_the_bindings_predate_the_operators_new_fields(crd_v1_schema, field):
    """The bindings are of the v3.2 CRD: none of the later fields is declared. This test fails when
    imports/ is regenerated from a CRD that has one, naming what must be decided before it passes."""
    declared = [p for p in _declared_paths(crd_v1_schema["properties"]["spec"], ".spec") if p.rsplit(".", 1)[-1] == field]
    assert not declared, f"the CRD now declares {', '.join(declared)}: {OPERATOR_FIELDS_AFTER_THE_BINDINGS[field]}"


def test_the_field_finder_sees_nested_fields(crd_v1_schema):
    """The finder above can fail: it reaches fields inside lists and nested objects."""
    paths = set(_declared_paths(crd_v1_schema["properties"]["spec"], ".spec"))
    assert ".spec.kvCacheSpec.l2CacheSpec.l2CacheBackend" in paths
    assert ".spec.kubernetes.volumes[].name" in paths
