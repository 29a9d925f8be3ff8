"""A change of a size or of the janitor's bounds changes no field Kubernetes refuses to update
(issue 15, item 6).

The L2 PVC used to request ``l2_size`` on a StorageClass without expansion: raising it was
refused, lowering it is refused on any class, and Curvine's CSI driver (v0.3.2-alpha) neither
enforces nor expands a PVC's size. The bound is the janitor's; the claims request a constant. Each
case edits the scenario config, renders every chart again and compares the two renderings with
the model of :mod:`tests.k8s.immutable_fields`.
"""

from __future__ import annotations

import json

import pytest
from tests.example_config import edit_yaml
from tests.k8s.conftest import VOLUME_ID, ZONE, find
from tests.k8s.immutable_fields import refused_updates

from k8s import names
from k8s.line_chart import L2_PVC_REQUEST, L2_SIZE_ANNOTATION
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from platform_config import load_project


def _line(name: str):
    return lambda cfg: cfg / "business-lines" / f"{name}.yaml"


#: Day-two changes: (file, edit). Every one must leave every immutable field as it was.
CHANGES = {
    "l2_size grows": (_line("rag-assistant"), lambda d: d["cache"].update(l2_size="1Ti")),
    "l2_size shrinks": (_line("rag-assistant"), lambda d: d["cache"].update(l2_size="100Gi")),
    "l2_size of another line": (_line("research-reasoning"), lambda d: d["cache"].update(l2_size="1536Gi")),
    "janitor watermarks and age": (lambda cfg: cfg / "platform.yaml", lambda d: d["curvine"].update(
        eviction={"ttl_hours": 6, "high_watermark": 0.9, "low_watermark": 0.7})),
    "Worker capacity": (lambda cfg: cfg / "platform.yaml", lambda d: d["curvine"].update(worker_capacity_gib=1900)),
}


def test_the_primary_volume_size_is_the_known_exception(manifests, config_copy):
    """``curvine.primary_volume.size_gib`` is still the request of the Primary's statically bound
    claim, which Kubernetes never lets change: growing the volume needs the claim re-bound and its
    ext4 file system grown, the Primary volume's own day-two work (docs/l2-cache.md, "Pool sizing").
    This test says so, and fails once that changes."""
    cfg = config_copy()
    edit_yaml(cfg / "platform.yaml", lambda d: d["curvine"]["primary_volume"].update(size_gib=200))
    after = render_manifests(load_project(cfg), volume_id=VOLUME_ID, availability_zone=ZONE, scaling=project_scaling(load_project(cfg)))
    assert refused_updates(manifests, after) == [f"PersistentVolumeClaim curvine/{names.CURVINE_PRIMARY_PV}: spec"]


@pytest.mark.parametrize("change", CHANGES)
def test_a_day_two_change_updates_no_immutable_field(change, manifests, config_copy):
    path, edit = CHANGES[change]
    cfg = config_copy()
    edit_yaml(path(cfg), edit)
    after = render_manifests(load_project(cfg), volume_id=VOLUME_ID, availability_zone=ZONE, scaling=project_scaling(load_project(cfg)))
    assert after != manifests, "the change must reach the manifests (else the test proves nothing)"
    assert refused_updates(manifests, after) == []


def test_l2_size_reaches_the_janitor_and_the_claims_annotation_not_the_request(config_copy):
    cfg = config_copy()
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["cache"].update(l2_size="1Ti"))
    project = load_project(cfg)
    line = project.business_line("rag-assistant")
    objs = render_manifests(project, volume_id=VOLUME_ID, availability_zone=ZONE, scaling=project_scaling(project))[names.line_chart_name(line)]
    pvc = find(objs, "PersistentVolumeClaim", names.pvc_name(line))
    assert pvc["spec"]["resources"]["requests"] == {"storage": L2_PVC_REQUEST} == {"storage": "1Gi"}
    assert pvc["metadata"]["annotations"] == {L2_SIZE_ANNOTATION: "1Ti"}
    janitor = json.loads(find(objs, "ConfigMap", "l2-janitor")["data"]["janitor.json"])
    assert janitor["capacity_bytes"] == 2**40


def test_the_check_finds_what_the_old_claims_did(manifests):
    """The model refuses what the API server refused: a claim whose request followed l2_size."""
    after = json.loads(json.dumps(manifests))
    pvc = find(after["line-rag-assistant"], "PersistentVolumeClaim", "rag-assistant-l2-cache")
    pvc["spec"]["resources"]["requests"]["storage"] = "1Ti"
    sc = find(after["curvine"], "StorageClass", "curvine-sc")
    sc["parameters"]["fs-path"] = "/other"
    assert refused_updates(manifests, after) == [
        "PersistentVolumeClaim rag-assistant/rag-assistant-l2-cache: spec",
        "StorageClass /curvine-sc: parameters",
    ]
