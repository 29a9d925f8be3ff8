"""A line routed by the HyperPod Inference Gateway (``routing_strategy: gateway``): its rendered
InferenceEndpointConfig, against the pinned CRD and against the fields AWS's gateway guide documents
(docs/sources.md §31), and the lines that did not opt in, unchanged.

The config is the scenario's with ``inference_operator.gateway.enabled`` and rag-assistant on the gateway;
the same config with rag-assistant on its own strategy is the control, so every difference between the two
renders is the gateway's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from capacity.fit import inputs_from_line
from capacity.planner import plan
from capacity.routing_sim import line_routing_notes, simulated_strategy
from k8s import names
from k8s.render import render_manifests
from observability.alerts import line_alerts
from observability.autoscaling import project_scaling
from platform_config import ProjectConfig, load_project
from tests.example_config import copy_example_config, edit_yaml
from tests.k8s.conftest import VOLUME_ID, ZONE, find
from tests.k8s.immutable_fields import refused_updates
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
