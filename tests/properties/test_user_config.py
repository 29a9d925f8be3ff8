"""Properties of whatever ``config/`` holds: the checks a fork's own business lines must pass.

Scenario tests read the fixture config (``tests/fixtures/config``) and pin exact values; these
tests read the user's ``config/`` and pin nothing about its lines, so a fork that replaces,
renames, adds or removes lines keeps them meaningful:

* the config loads, one line per file (the loader's rules: names, namespaces, GPU capacity, the
  planner's fit rule);
* ``python app.py`` synthesizes it exactly as ``cdk synth`` / ``make synth`` does (cdk-nag as a
  validation plugin: any finding fails), once per session, into a temporary cloud assembly;
* every template is cfn-lint clean; every stack the config implies is there, and no other;
* every manifest a line stack applies is schema-valid (kubernetes-validate strict for built-in
  kinds, the CRD's v1 schema with nothing pruned for InferenceEndpointConfig) and is what
  ``make manifests`` renders for it;
* per line: the endpoint carries the line's model, type, replicas, routing and cache tiers; L2
  on means an RWX PVC of the line's size and the mutation Policy, L2 off means neither; the S3
  CSI driver reads exactly the S3 lines' model prefixes; the planner agrees the model fits.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from aws_cdk.assertions import Template

from k8s import names
from k8s.line_chart import L2_PVC_REQUEST, L2_SIZE_ANNOTATION
from k8s.render import CURVINE_CHART, render_manifests
from observability.autoscaling import PLACEHOLDER_WORKSPACE_ID, project_scaling
from capacity.model_specs import lookup_model
from platform_config import ProjectConfig, load_project
from platform_config.stack_names import stack_ids
from tests.example_config import USER_CONFIG, run_app
from tests.k8s.conftest import CRD_SCHEMA_FILE
from tests.k8s.custom_kinds import CUSTOM_KINDS
from tests.k8s.test_k8s_schemas import K8S_VERSION, pruned_fields
from tests.stacks.cfn_lint import lint_findings
from tests.stacks.test_addons_stack import assert_s3_csi_role_reads_only_model_prefixes
from tests.tools.script_loader import load_script

#: The line files of config/, read at collection so each line is its own test case.
LINE_FILES = sorted((USER_CONFIG / "business-lines").glob("*.y*ml"))
LINES = [p.stem for p in LINE_FILES]
MANIFEST_RESOURCE = "Custom::AWSCDK-EKS-KubernetesResource"
#: Label aws-eks adds to every object it applies (for ``kubectl apply --prune``), not part of the chart.
PRUNE_LABEL = re.compile(r"^aws\.cdk\.eks/prune-")
VOLUME_ID, ZONE_SUFFIX = "vol-0a1b2c3d4e5f60718", "a"


@pytest.fixture(scope="session")
def user_project() -> ProjectConfig:
    return load_project(USER_CONFIG)


@pytest.fixture(scope="session")
def user_synth(tmp_path_factory) -> Path:
    """The cloud assembly of ``python app.py`` over config/ (synthesized once per session)."""
    outdir = tmp_path_factory.mktemp("user-cdk.out")
    result = run_app(USER_CONFIG, outdir)
    assert result.returncode == 0, f"app.py over config/ failed:\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr and "b'" not in result.stderr, result.stderr[-2000:]
    return outdir


@pytest.fixture(scope="session")
def user_templates(user_synth, user_project) -> dict[str, dict]:
    """Stack name -> template (JSON) for every stack of config/."""
    return {name: json.loads((user_synth / f"{name}.template.json").read_text())
            for name in stack_ids(user_project).values()}


@pytest.fixture(scope="session")
def user_manifests(user_project) -> dict[str, list[dict]]:
    platform = user_project.platform
    return render_manifests(user_project, volume_id=VOLUME_ID, availability_zone=platform.gpu_availability_zone, scaling=project_scaling(user_project))


def _with_placeholder_workspace(manifest: dict) -> str:
    """An autoscaling line's manifest (``Fn::Join`` around the observability stack's exported workspace
    ID, the only deploy-time token a line may hold) with the ID ``make manifests`` renders without one."""
    (separator, parts), = manifest.values()
    assert list(manifest) == ["Fn::Join"] and separator == "", manifest
    out = []
    for part in parts:
        if isinstance(part, dict):
            (name,) = part.values()
            assert list(part) == ["Fn::ImportValue"] and "WorkspaceWorkspaceId" in name, part
            part = PLACEHOLDER_WORKSPACE_ID
        out.append(part)
    return "".join(out)


def applied_objects(template: dict) -> list[dict]:
    """The Kubernetes objects a line stack applies, in order, without aws-eks's prune label."""
    objects = []
    for resource in template["Resources"].values():
        if resource["Type"] != MANIFEST_RESOURCE:
            continue
        manifest = resource["Properties"]["Manifest"]
        if isinstance(manifest, dict):  # an autoscaling line: its triggers name the workspace, imported
            manifest = _with_placeholder_workspace(manifest)
        assert isinstance(manifest, str), "a line's manifests hold no deploy-time tokens but the workspace ID"
        for obj in json.loads(manifest):
            labels = obj["metadata"].get("labels", {})
            obj["metadata"]["labels"] = {k: v for k, v in labels.items() if not PRUNE_LABEL.match(k)}
            objects.append(obj)
    return objects


def test_config_loads_one_line_per_file(user_project) -> None:
    assert [l.name for l in user_project.business_lines] == LINES
    assert len({l.namespace for l in user_project.business_lines}) == len(LINES)


def test_price_table_loads_if_present() -> None:
    from capacity.prices import load_prices

    path = USER_CONFIG / "prices.yaml"
    if not path.exists():
        pytest.skip("config/ has no prices.yaml (the planner then needs --prices)")
    table = load_prices(path)
    assert all(p.source for region in table.regions.values() for p in region.values())


def test_every_stack_is_synthesized_and_no_other(user_synth, user_project) -> None:
    manifest = json.loads((user_synth / "manifest.json").read_text())
    stacks = {name for name, a in manifest["artifacts"].items() if a["type"] == "aws:cloudformation:stack"}
    assert stacks == set(stack_ids(user_project).values())


def test_every_template_is_cfn_lint_clean(user_templates, user_project) -> None:
    region = user_project.platform.region
    findings = {name: lint_findings(json.dumps(t), region) for name, t in user_templates.items()}
    assert {n: f for n, f in findings.items() if f != ([], [])} == {}


def test_every_built_in_object_validates_strictly(user_manifests) -> None:
    failures = []
    for chart, objects in user_manifests.items():
        for obj in objects:
            if obj["kind"] in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                failures.append(f"{chart}/{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert failures == []


def test_s3_csi_driver_reads_exactly_the_s3_lines_prefixes(user_templates, user_project) -> None:
    templates = {name: Template.from_json(t) for name, t in user_templates.items()}
    assert_s3_csi_role_reads_only_model_prefixes(templates, user_project, f"{user_project.platform.project}-addons")


def test_curvine_chart_renders_when_enabled(user_manifests, user_project) -> None:
    assert (CURVINE_CHART in user_manifests) is user_project.platform.curvine.enabled


@pytest.mark.parametrize("name", LINES)
def test_line_stack_applies_what_make_manifests_renders(name, user_templates, user_project, user_manifests) -> None:
    line = user_project.business_line(name)
    template = user_templates[stack_ids(user_project)[f"line-{name}"]]
    assert applied_objects(template) == user_manifests[names.line_chart_name(line)]
    assert template["Outputs"]["NamespaceName"]["Value"] == line.namespace
    assert template["Outputs"]["EndpointName"]["Value"] == names.endpoint_name(line)


@pytest.mark.parametrize("name", LINES)
def test_line_endpoint_is_valid_and_carries_the_line(name, user_project, user_manifests) -> None:
    line = user_project.business_line(name)
    objects = user_manifests[names.line_chart_name(line)]
    assert all(o["metadata"].get("namespace", line.namespace) == line.namespace for o in objects)
    (endpoint,) = [o for o in objects if o["kind"] == "InferenceEndpointConfig"]
    schema = json.loads(CRD_SCHEMA_FILE.read_text(encoding="utf-8"))
    schema.pop("$comment")
    jsonschema.validate(endpoint, schema, cls=jsonschema.Draft7Validator)
    body = {k: v for k, v in endpoint.items() if k not in ("apiVersion", "kind", "metadata")}
    spec: dict[str, Any] = endpoint["spec"]
    if line.routing_strategy == "gateway":
        # The gateway opt-in is newer than the pinned CRD (tests/k8s/test_k8s_gateway.py, docs/sources.md §31).
        assert pruned_fields(body, schema) == [".spec.inferenceGateway"]
        assert "intelligentRoutingSpec" not in spec
        assert spec["inferenceGateway"] == {"enabled": True, "name": names.gateway_name(line)}
    else:
        assert pruned_fields(body, schema) == []
        assert spec["intelligentRoutingSpec"]["routingStrategy"] == line.routing_strategy
        assert "inferenceGateway" not in spec
    assert (spec["modelName"], spec["instanceType"], spec["replicas"]) == (
        line.model.name, line.instance_type, line.replicas)
    assert spec["modelSourceConfig"]["modelSourceType"] == line.model.source.type
    assert spec["kvCacheSpec"]["enableL1Cache"] is line.cache.l1_enabled
    assert spec["kvCacheSpec"]["enableL2Cache"] is line.cache.l2_enabled


@pytest.mark.parametrize("name", LINES)
def test_line_l2_means_its_pvc_and_policy_and_nothing_without(name, user_project, user_manifests) -> None:
    line = user_project.business_line(name)
    objects = user_manifests[names.line_chart_name(line)]
    pvcs = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    policies = [o for o in objects if o["kind"] == "Policy"]
    if not line.cache.l2_enabled:
        assert pvcs == [] and policies == []
        return
    (pvc,) = pvcs
    assert pvc["metadata"]["name"] == names.pvc_name(line)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == user_project.platform.curvine.storage_class_name
    # The request is nominal so that l2_size can change (tests/k8s/test_k8s_immutable_fields.py);
    # the size is the annotation's, and the janitor's to enforce.
    assert pvc["spec"]["resources"]["requests"]["storage"] == L2_PVC_REQUEST
    assert pvc["metadata"]["annotations"][L2_SIZE_ANNOTATION] == line.cache.l2_size
    assert [p["metadata"]["name"] for p in policies] == [names.policy_name(line)]


@pytest.mark.parametrize("name", LINES)
def test_line_planner_agrees_it_fits(name, user_project) -> None:
    """Synthesis applies the planner's fit rule; the planner's CLI must then say "fits" (exit 0)."""
    line = user_project.business_line(name)
    try:
        lookup_model(line.model.name)
    except KeyError:
        pytest.skip(f"{line.model.name} is not in the planner's table (app.py warns; plan.py needs --hf-config)")
    path = next(p for p in LINE_FILES if p.stem == name)
    assert load_script("plan").main(["--business-line", str(path), "--json"]) == 0
