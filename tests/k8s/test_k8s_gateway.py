"""A line routed by the HyperPod Inference Gateway (``routing_strategy: gateway``): its rendered
InferenceEndpointConfig, against the pinned CRD and against the fields AWS's gateway guide documents
(docs/sources.md §31), and the lines that did not opt in, unchanged.

The config is the scenario's with ``inference_operator.gateway.enabled`` and rag-assistant on the gateway;
the same config with rag-assistant on its own strategy is the control, so every difference between the two
renders is the gateway's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aws_cdk.assertions import Template

import stacks
from capacity.fit import inputs_from_line
from capacity.planner import plan
from capacity.routing_sim import line_routing_notes, simulated_strategy
from k8s import names
from k8s.gateway_policy import GATEWAY_CONFIG_API_VERSION, GATEWAY_CONFIG_KIND, gateway_policy_manifest
from k8s.render import render_manifests
from observability.alerts import line_alerts
from observability.autoscaling import project_scaling
from platform_config import ConfigError, ProjectConfig, load_project
from tests.example_config import copy_example_config, edit_yaml
from tests.k8s.conftest import VOLUME_ID, ZONE, find
from tests.k8s.immutable_fields import refused_updates
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.test_k8s_schemas import pruned_fields

LINE = "rag-assistant"

#: ``spec.inferenceGateway`` of InferenceEndpointConfig as AWS's gateway guide documents it ("Integration
#: with the HyperPod Inference Operator": ``enabled``, optional boolean, default false; ``name``, optional
#: string): absent from the pinned CRD (aws/sagemaker-hyperpod-cli 011ca927), which predates the gateway.
DOCUMENTED_GATEWAY_FIELD: dict[str, Any] = {
    "type": "object",
    "properties": {"enabled": {"type": "boolean", "default": False}, "name": {"type": "string"}},
    "additionalProperties": False,
}


def _project(tmp: Path, strategy: str) -> ProjectConfig:
    config = copy_example_config(tmp / "config")
    edit_yaml(config / "platform.yaml", lambda d: d["inference_operator"]["gateway"].update(
        enabled=True, service_account="inference-gateway-controller"))
    edit_yaml(config / "business-lines" / f"{LINE}.yaml", lambda d: d.update(routing_strategy=strategy))
    return load_project(config)


def _render(project: ProjectConfig) -> dict[str, list[dict]]:
    return render_manifests(project, volume_id=VOLUME_ID, availability_zone=ZONE, scaling=project_scaling(project))


@pytest.fixture(scope="module")
def gateway_project(tmp_path_factory) -> ProjectConfig:
    return _project(tmp_path_factory.mktemp("gateway"), "gateway")


@pytest.fixture(scope="module")
def gateway_manifests(gateway_project) -> dict[str, list[dict]]:
    return _render(gateway_project)


@pytest.fixture(scope="module")
def control_project(tmp_path_factory) -> ProjectConfig:
    """The same platform (gateway on), rag-assistant on the operator's router as the scenario has it."""
    return _project(tmp_path_factory.mktemp("control"), "prefixaware")


@pytest.fixture(scope="module")
def control_manifests(control_project) -> dict[str, list[dict]]:
    return _render(control_project)


def _endpoint(manifests: dict[str, list[dict]], line: str = LINE) -> dict:
    return find(manifests[f"line-{line}"], "InferenceEndpointConfig")


def test_a_gateway_line_attaches_to_its_gateway_and_has_no_intelligent_routing(gateway_project,
                                                                               gateway_manifests) -> None:
    endpoint = _endpoint(gateway_manifests)
    spec = endpoint["spec"]
    # Mutually exclusive with intelligentRoutingSpec.enabled (the guide); absent, not disabled: nothing to clash.
    assert "intelligentRoutingSpec" not in spec
    assert spec["inferenceGateway"] == {"enabled": True, "name": f"{LINE}-gateway"}
    assert spec["inferenceGateway"]["name"] == names.gateway_name(gateway_project.business_line(LINE))
    assert (endpoint["apiVersion"], endpoint["kind"]) == ("inference.sagemaker.aws.amazon.com/v1",
                                                          "InferenceEndpointConfig")
    assert endpoint["metadata"]["namespace"] == gateway_project.business_line(LINE).namespace


def test_a_gateway_endpoint_validates_against_the_crd_and_the_documented_field(gateway_manifests,
                                                                               crd_v1_schema) -> None:
    """The pinned CRD's schema accepts the object, and would prune exactly one path: the gateway opt-in, which
    the add-on pinned (v2.0.0-eksbuild.2, the first with the gateway) must know. With the field as the guide
    documents it added to the schema, nothing is pruned and the values have the documented types."""
    endpoint = _endpoint(gateway_manifests)
    jsonschema.validate(endpoint, crd_v1_schema, cls=jsonschema.Draft7Validator)
    body = {k: v for k, v in endpoint.items() if k not in ("apiVersion", "kind", "metadata")}
    assert pruned_fields(body, crd_v1_schema) == [".spec.inferenceGateway"]
    extended = copy.deepcopy(crd_v1_schema)
    assert "inferenceGateway" not in extended["properties"]["spec"]["properties"]  # the gap this test documents
    extended["properties"]["spec"]["properties"]["inferenceGateway"] = DOCUMENTED_GATEWAY_FIELD
    jsonschema.validate(endpoint, extended, cls=jsonschema.Draft7Validator)
    assert pruned_fields(body, extended) == []
    wrong = copy.deepcopy(endpoint)
    wrong["spec"]["inferenceGateway"]["enabled"] = "true"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, extended, cls=jsonschema.Draft7Validator)


def test_the_gateway_changes_nothing_else(gateway_manifests, control_manifests) -> None:
    """Between the gateway render and the control: the routing fields of rag-assistant's endpoint and
    nothing else, in that chart or any other (same objects, same order, same key order)."""
    assert list(gateway_manifests) == list(control_manifests)
    for chart, objects in gateway_manifests.items():
        control = control_manifests[chart]
        assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
            (o["kind"], o["metadata"]["name"]) for o in control], chart
        for got, want in zip(objects, control):
            if chart == f"line-{LINE}" and got["kind"] == "InferenceEndpointConfig":
                assert list(got) == list(want) and got["metadata"] == want["metadata"]
                spec, control_spec = dict(got["spec"]), dict(want["spec"])
                assert spec.pop("inferenceGateway") == {"enabled": True, "name": f"{LINE}-gateway"}
                assert control_spec.pop("intelligentRoutingSpec") == {"enabled": True, "routingStrategy": "prefixaware"}
                assert spec == control_spec and list(spec) == list(control_spec)
            else:
                assert got == want, (chart, got["kind"], got["metadata"]["name"])


def test_lines_that_did_not_opt_in_keep_the_operator_router(gateway_project, gateway_manifests, manifests,
                                                            k8s_project) -> None:
    """The other lines of the gateway config, and every line of the scenario config: intelligentRoutingSpec
    enabled with the line's strategy, no inferenceGateway."""
    for project, rendered in ((gateway_project, gateway_manifests), (k8s_project, manifests)):
        for line in project.business_lines:
            if line.routing_strategy == "gateway":
                continue
            spec = _endpoint(rendered, line.name)["spec"]
            assert spec["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": line.routing_strategy}
            assert "inferenceGateway" not in spec
    assert [l.name for l in gateway_project.business_lines if l.routing_strategy == "gateway"] == [LINE]
    assert not any(l.routing_strategy == "gateway" for l in k8s_project.business_lines)


def _hot_spot(project: ProjectConfig):
    (rule,) = [r for r in line_alerts(project.platform, project.business_lines)
               if r.name == "KvCacheReplicaHotSpot" and r.labels["business_line"] == LINE]
    return rule


def test_the_hot_spot_alert_of_a_gateway_line_points_at_its_scheduler_weights(gateway_project,
                                                                             control_project) -> None:
    """KvCacheReplicaHotSpot still applies to a gateway line (same expression, same hold); what it says the
    cause is and what to do differ: the scheduler's weights, not a re-created endpoint."""
    gateway_alert, control_alert = _hot_spot(gateway_project), _hot_spot(control_project)
    assert (gateway_alert.expr, gateway_alert.for_, gateway_alert.severity) == (
        control_alert.expr, control_alert.for_, control_alert.severity)
    assert f"InferenceGatewayConfig {LINE}-gateway" in gateway_alert.action
    assert "weights.queue" in gateway_alert.action and "re-create" not in gateway_alert.action
    assert "Inference Gateway" in gateway_alert.meaning
    assert "scripts/overlap.py" in control_alert.action and "InferenceGatewayConfig" not in control_alert.action


def test_the_planner_says_who_routes_a_gateway_line(gateway_project) -> None:
    line = gateway_project.business_line(LINE)
    notes = line_routing_notes(line, plan(inputs_from_line(line, gateway_project.platform)))
    (note,) = [n for n in notes if "Inference Gateway" in n]
    assert "not intelligentRoutingSpec" in note and "leastwork" in note
    assert simulated_strategy("gateway") == "leastwork"
    assert simulated_strategy("roundrobin") == "roundrobin"
    with pytest.raises(KeyError):
        simulated_strategy("fastest")


def test_moving_a_line_to_or_from_the_gateway_needs_a_re_created_endpoint(gateway_project, gateway_manifests,
                                                                          control_manifests) -> None:
    """The API server's rule (intelligentRoutingSpec cannot be changed after creation, nor added to an existing
    endpoint) makes the switch a re-creation both ways, and nothing else in the render is refused."""
    ns = gateway_project.business_line(LINE).namespace
    expected = [f"InferenceEndpointConfig {ns}/{LINE}: spec.intelligentRoutingSpec.enabled"]
    assert refused_updates(control_manifests, gateway_manifests) == expected
    assert refused_updates(gateway_manifests, control_manifests) == expected


# --- The line's gateway settings: request authentication and scorer weights (k8s/gateway_policy.py) -----

ISSUER = "https://idp.example.com/realms/rag"
JWKS = "https://idp.example.com/realms/rag/protocol/openid-connect/certs"
SETTINGS: dict[str, Any] = {
    "jwt": {"name": "corp-idp", "issuer": ISSUER, "remote_jwks_uri": JWKS, "audiences": ["rag-assistant"],
            "required_claims": [{"name": "groups", "value_type": "StringArray", "values": ["rag-users"]}]},
    "weights": {"queue": 4, "kv_cache": 2, "prefix": 2, "lru": 1},
}
#: The provider and weights as the CRD spells them (AWS's gateway guide, ``spec.auth``, ``SchedulerSpec``).
PROVIDER = {"name": "corp-idp", "issuer": ISSUER, "remoteJWKS": {"uri": JWKS}, "audiences": ["rag-assistant"],
            "requiredClaims": [{"name": "groups", "valueType": "StringArray", "values": ["rag-users"]}]}
WEIGHTS = {"queue": 4, "kvCache": 2, "prefix": 2, "lru": 1}

_NON_NEGATIVE = {"type": "integer", "minimum": 0}
_HTTPS = {"type": "string", "pattern": "^https://"}
#: The parts of ``InferenceGatewayConfig`` the policy writes, as AWS's gateway guide documents them ("spec
#: fields", ``auth``; "SchedulerSpec fields", ``weights``; "Validation rules"; docs/sources.md §31): closed
#: objects, so a misspelled field fails. No CRD file of the gateway was readable; this is the guide's text.
DOCUMENTED_GATEWAY_CONFIG: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {"spec": {
        "type": "object",
        "required": ["bbr", "schedulers"],
        "properties": {
            "bbr": {"type": "object", "required": ["enabled"], "properties": {"enabled": {"type": "boolean"}}},
            "auth": {"type": "object", "additionalProperties": False, "properties": {"jwt": {
                "type": "object", "additionalProperties": False, "required": ["provider"], "properties": {"provider": {
                    "type": "object", "additionalProperties": False, "required": ["name", "issuer", "remoteJWKS"],
                    "anyOf": [{"required": ["audiences"]}, {"required": ["requiredClaims"]}],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "issuer": _HTTPS,
                        "remoteJWKS": {"type": "object", "additionalProperties": False, "required": ["uri"],
                                       "properties": {"uri": _HTTPS}},
                        "audiences": {"type": "array", "maxItems": 8, "items": {"type": "string"}},
                        "requiredClaims": {"type": "array", "maxItems": 16, "items": {
                            "type": "object", "additionalProperties": False,
                            "required": ["name", "valueType", "values"],
                            "properties": {
                                "name": {"type": "string"},
                                "valueType": {"enum": ["String", "StringArray"]},
                                "values": {"type": "array", "minItems": 1, "maxItems": 128,
                                           "items": {"type": "string", "minLength": 1, "maxLength": 1024}}}}},
                    }}}}}},
            "schedulers": {"type": "array", "minItems": 1, "maxItems": 100, "items": {
                "type": "object", "required": ["name", "modelSelector", "modelName"],
                "not": {"required": ["weights", "configMapRef"]},
                "properties": {
                    "scheduler": {"enum": ["llm-d", "epp"]},
                    "weights": {"type": "object", "additionalProperties": False, "properties": {
                        k: _NON_NEGATIVE for k in ("queue", "kvCache", "prefix", "lru", "loraAffinity",
                                                   "runningRequests", "predictedLatency")}},
                },
                # weights.lru only with the llm-d scheduler (the default).
                "if": {"required": ["weights"], "properties": {"weights": {"required": ["lru"]}}},
                "then": {"properties": {"scheduler": {"const": "llm-d"}}},
            }},
        }}},
}


def _entry(name: str, **extra: Any) -> dict[str, Any]:
    """A scheduler entry as the operator writes it (the guide: name, modelName, targetPort, modelSelector,
    scheduler llm-d), plus ``extra``."""
    return {"name": name, "modelName": f"{name}-model", "modelSelector": {"matchLabels": {"app": name}},
            "targetPort": 8000, "scheduler": "llm-d", **extra}


def _gateway_config(namespace: str, name: str, *entries: dict[str, Any], **spec: Any) -> dict[str, Any]:
    assert (GATEWAY_CONFIG_API_VERSION, GATEWAY_CONFIG_KIND) == (  # the guide's CRD reference
        "inference.sagemaker.aws.amazon.com/v1alpha1", "InferenceGatewayConfig")
    return {"apiVersion": GATEWAY_CONFIG_API_VERSION, "kind": GATEWAY_CONFIG_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"bbr": {"enabled": len(entries) > 1}, "schedulers": list(entries), **spec}}


@pytest.fixture(scope="module")
def settings_project(tmp_path_factory) -> ProjectConfig:
    """The gateway config with rag-assistant's ``gateway`` settings set."""
    config = copy_example_config(tmp_path_factory.mktemp("settings") / "config")
    edit_yaml(config / "platform.yaml", lambda d: d["inference_operator"]["gateway"].update(enabled=True))
    edit_yaml(config / "business-lines" / f"{LINE}.yaml",
              lambda d: d.update(routing_strategy="gateway", gateway=copy.deepcopy(SETTINGS)))
    return load_project(config)


@pytest.fixture(scope="module")
def settings_manifests(settings_project) -> dict[str, list[dict]]:
    return _render(settings_project)


@pytest.fixture(scope="module")
def gateway_policy(settings_project, settings_manifests) -> dict[str, Any]:
    line = settings_project.business_line(LINE)
    rendered = find(settings_manifests[f"line-{LINE}"], "Policy", names.gateway_policy_name(line))
    expected = gateway_policy_manifest(line)
    assert rendered["apiVersion"] == "kyverno.io/v1" and rendered["metadata"]["namespace"] == line.namespace
    assert rendered["spec"] == expected["spec"]
    return rendered


def test_the_gateway_policy_is_rendered_only_for_a_gateway_line_with_settings(
        gateway_policy, settings_project, settings_manifests, gateway_manifests, control_manifests) -> None:
    """rag-assistant with jwt and weights gets the Policy, before its endpoint; without settings (the
    gateway render) or off the gateway (the control) there is none, and no other chart changes."""
    chart = settings_manifests[f"line-{LINE}"]
    kinds = [(o["kind"], o["metadata"]["name"]) for o in chart]
    policy_at = kinds.index(("Policy", names.gateway_policy_name(settings_project.business_line(LINE))))
    assert policy_at < kinds.index(("InferenceEndpointConfig", LINE))
    for rendered in (gateway_manifests, control_manifests):
        assert not [o for o in rendered[f"line-{LINE}"] if o["metadata"]["name"].endswith("-gateway-settings")]
    for name, objects in settings_manifests.items():
        if name != f"line-{LINE}":
            assert objects == gateway_manifests[name], name
    # Only this object, in this namespace: the webhook's own conditions and the rules' match.
    line = settings_project.business_line(LINE)
    conditions = {c["name"]: c["expression"] for c in gateway_policy["spec"]["webhookConfiguration"]["matchConditions"]}
    assert conditions == {"business-line-namespace": f"request.namespace == '{line.namespace}'",
                          "line-gateway": f"request.name == '{LINE}-gateway'"}
    assert gateway_policy["spec"]["webhookConfiguration"]["failurePolicy"] == "Fail"
    assert gateway_policy["spec"]["background"] is False
    for rule in gateway_policy["spec"]["rules"]:
        assert rule["match"] == {"any": [{"resources": {"kinds": ["InferenceGatewayConfig"],
                                                        "operations": ["CREATE", "UPDATE"],
                                                        "names": [f"{LINE}-gateway"]}}]}


@pytest.mark.parametrize("refresh", [True, False])
def test_the_policy_adds_auth_and_weights_only_where_absent(gateway_policy, settings_project, refresh) -> None:
    """Applied (tests/k8s/kyverno_eval.py) to the gateway as the operator writes it: spec.auth.jwt.provider is
    set (an existing one replaced); weights are added to an entry without weights or configMapRef, and to no
    other; lru only where the scheduler is llm-d. The result holds to the guide's documented schema."""
    ns = settings_project.business_line(LINE).namespace
    bare = _entry("rag")
    tuned = _entry("tuned", weights={"queue": 1, "prefix": 5})
    custom = _entry("custom", configMapRef={"name": "picker"})
    epp = _entry("sglang", scheduler="epp", engineType="sglang")
    implicit = {k: v for k, v in _entry("implicit").items() if k != "scheduler"}  # llm-d by default
    before = _gateway_config(ns, f"{LINE}-gateway", bare, tuned, custom, epp, implicit,
                             auth={"jwt": {"provider": {"name": "old", "issuer": "https://old.example.com",
                                                        "remoteJWKS": {"uri": "https://old.example.com/jwks"},
                                                        "audiences": ["old"]}}})
    jsonschema.validate(before, DOCUMENTED_GATEWAY_CONFIG)
    for operation in ("CREATE", "UPDATE"):
        after = apply_policy(gateway_policy, before, operation=operation, refresh_context=refresh)
        jsonschema.validate(after, DOCUMENTED_GATEWAY_CONFIG)
        assert after["spec"]["auth"] == {"jwt": {"provider": PROVIDER}}
        by_name = {e["name"]: e for e in after["spec"]["schedulers"]}
        assert by_name["rag"] == {**bare, "weights": WEIGHTS}
        assert by_name["implicit"] == {**implicit, "weights": WEIGHTS}
        assert by_name["tuned"] == tuned and by_name["custom"] == custom and by_name["sglang"] == epp
        assert {k: v for k, v in after["spec"].items() if k not in ("auth", "schedulers")} == {
            k: v for k, v in before["spec"].items() if k not in ("auth", "schedulers")}
        assert after["metadata"] == before["metadata"]
        # Idempotent: a later update (the operator's reconciliation) changes nothing more.
        assert apply_policy(gateway_policy, after, operation="UPDATE", refresh_context=refresh) == after
    # Without lru, an epp entry gets the weights too.
    line = settings_project.business_line(LINE)
    no_lru = line.model_copy(update={"gateway": line.gateway.model_copy(update={
        "weights": line.gateway.weights.model_copy(update={"lru": None})})})
    after = apply_policy(gateway_policy_manifest(no_lru), _gateway_config(ns, f"{LINE}-gateway", epp))
    assert after["spec"]["schedulers"] == [{**epp, "weights": {"queue": 4, "kvCache": 2, "prefix": 2}}]
    jsonschema.validate(after, DOCUMENTED_GATEWAY_CONFIG)


def test_the_policy_touches_no_other_object(gateway_policy, settings_project) -> None:
    """Another InferenceGatewayConfig of the namespace, the same name in another namespace, a DELETE: unchanged."""
    ns = settings_project.business_line(LINE).namespace
    for obj, operation in ((_gateway_config(ns, "another-gateway", _entry("x")), "CREATE"),
                           (_gateway_config("someone-else", f"{LINE}-gateway", _entry("x")), "CREATE"),
                           (_gateway_config(ns, f"{LINE}-gateway", _entry("x")), "DELETE")):
        assert apply_policy(gateway_policy, obj, operation=operation) == obj


def test_a_weights_change_reaches_the_entry_once_its_weights_are_removed(gateway_policy, settings_project) -> None:
    """The documented way to apply a new gateway.weights (docs/routing.md): remove the entry's weights; the
    same update gets the policy's (new) weights."""
    ns = settings_project.business_line(LINE).namespace
    old = _gateway_config(ns, f"{LINE}-gateway", _entry("rag", weights={"queue": 2, "kvCache": 2, "prefix": 3}))
    removed = copy.deepcopy(old)
    del removed["spec"]["schedulers"][0]["weights"]
    assert apply_policy(gateway_policy, old, operation="UPDATE")["spec"]["schedulers"][0]["weights"] == {
        "queue": 2, "kvCache": 2, "prefix": 3}
    assert apply_policy(gateway_policy, removed, operation="UPDATE")["spec"]["schedulers"][0]["weights"] == WEIGHTS


def test_only_what_the_line_sets_is_written(settings_project) -> None:
    line = settings_project.business_line(LINE)
    auth_only = line.model_copy(update={"gateway": line.gateway.model_copy(update={"weights": None})})
    weights_only = line.model_copy(update={"gateway": line.gateway.model_copy(update={"jwt": None})})
    neither = line.model_copy(update={"gateway": type(line.gateway)()})
    assert [r["name"] for r in gateway_policy_manifest(auth_only)["spec"]["rules"]] == ["set-request-auth"]
    assert [r["name"] for r in gateway_policy_manifest(weights_only)["spec"]["rules"]] == ["add-scheduler-weights"]
    assert gateway_policy_manifest(neither) is None


@pytest.mark.parametrize("edit, field, says", [
    (lambda g: g["weights"].update(queue=-1), "gateway.weights.queue", "greater than or equal to 0"),
    (lambda g: g["weights"].update(kvcache=1), "gateway.weights.kvcache", "unknown key (typo?); allowed: the keys of this section, kv_cache, lora_affinity, lru"),
    (lambda g: g.update(weights={}), "gateway.weights", "kv_cache, prefix"),
    (lambda g: g["jwt"].update(issuer="http://idp.example.com"), "gateway.jwt.issuer", "https"),
    (lambda g: g["jwt"].update(audiences=[], required_claims=[]), "gateway.jwt", "audiences or required_claims"),
    (lambda g: g["jwt"]["required_claims"][0].update(value_type="List"), "gateway.jwt.required_claims.0.value_type",
     "String"),
    (lambda g: g["jwt"].update(audiences=[f"a{i}" for i in range(9)]), "gateway.jwt.audiences", "8"),
])
def test_bad_gateway_settings_are_refused_naming_file_and_field(tmp_path, edit, field, says) -> None:
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda d: d["inference_operator"]["gateway"].update(enabled=True))
    settings = copy.deepcopy(SETTINGS)
    edit(settings)
    edit_yaml(config / "business-lines" / f"{LINE}.yaml",
              lambda d: d.update(routing_strategy="gateway", gateway=settings))
    with pytest.raises(ConfigError) as info:
        load_project(config)
    (problem,) = info.value.problems
    assert problem.field == field and says in problem.message, problem
    assert problem.file.endswith(f"business-lines/{LINE}.yaml"), problem


def test_gateway_settings_on_a_line_off_the_gateway_are_refused(tmp_path) -> None:
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "business-lines" / f"{LINE}.yaml", lambda d: d.update(gateway=copy.deepcopy(SETTINGS)))
    with pytest.raises(ConfigError) as info:
        load_project(config)
    (problem,) = info.value.problems
    assert problem.field == "gateway" and "allowed: routing_strategy: gateway" in problem.message, problem


def test_a_gateway_line_without_jwt_is_warned_that_its_gateway_is_open(gateway_project, settings_project,
                                                                     control_project) -> None:
    """Valid, but told: without `gateway.jwt` the gateway accepts any request that reaches it (AWS's guide)."""
    (warning,) = [w for w in gateway_project.warnings if "gateway.jwt" in w]
    assert warning.endswith(f"{LINE}.yaml: routing_strategy is gateway without gateway.jwt, so the gateway "
                            "accepts any request that reaches it; set gateway.jwt (issuer, remote_jwks_uri, "
                            "audiences) to require a token (docs/routing.md)")
    for told in (settings_project, control_project):  # with jwt; off the gateway
        assert not [w for w in told.warnings if "gateway.jwt" in w]


def test_the_endpoint_waits_until_kyverno_reports_the_gateway_policy_ready(settings_project, tmp_path_factory) -> None:
    """Kyverno registers a Policy's webhook asynchronously: were the endpoint applied at once, the operator
    could create `<line>-gateway` before the webhook exists, and its first version would have no spec.auth."""
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("settings-synth")))
    built = stacks.build_platform(app, settings_project)
    resources = Template.from_stack(built.business_lines[LINE]).to_json()["Resources"]
    values = {r["Properties"]["ObjectName"]: (lid, r) for lid, r in resources.items()
              if r["Type"] == "Custom::AWSCDK-EKS-KubernetesObjectValue"}
    line = settings_project.business_line(LINE)
    lid, ready = values[names.gateway_policy_name(line)]
    assert ready["Properties"]["ObjectType"] == "policies.kyverno.io"
    assert ready["Properties"]["ObjectNamespace"] == line.namespace
    assert ready["Properties"]["JsonPath"] == '.status.conditions[?(@.status=="True")].type'
    (endpoint,) = [r for r in resources.values() if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
                   and "InferenceEndpointConfig" in json.dumps(r["Properties"]["Manifest"])]
    assert lid in endpoint["DependsOn"]
    assert built.l2_cache in built.business_lines[LINE].dependencies  # Kyverno's chart, before the Policy


def test_gateway_settings_need_the_kyverno_the_platform_installs_with_curvine(tmp_path) -> None:
    """Without Curvine no Kyverno is installed, so the line's Policy could not be applied: a config error."""
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "platform.yaml", lambda d: (d["inference_operator"]["gateway"].update(enabled=True),
                                                   d["curvine"].update(enabled=False)))
    for path in (config / "business-lines").glob("*.yaml"):
        edit_yaml(path, lambda d: d["cache"].update(l2_enabled=False))
    edit_yaml(config / "business-lines" / f"{LINE}.yaml",
              lambda d: d.update(routing_strategy="gateway", gateway=copy.deepcopy(SETTINGS)))
    with pytest.raises(ConfigError) as info:
        load_project(config)
    (problem,) = [p for p in info.value.problems if p.field == "gateway"]
    assert problem.file == str(config / "business-lines" / f"{LINE}.yaml")
    assert problem.message == (
        "a Kyverno policy writes gateway.jwt and gateway.weights into the line's InferenceGatewayConfig, and the "
        f"platform installs Kyverno with Curvine, but curvine.enabled is false in {config / 'platform.yaml'}; "
        f"allowed: curvine.enabled true in {config / 'platform.yaml'}, or no gateway section")
