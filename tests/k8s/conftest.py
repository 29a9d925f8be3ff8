"""Session fixtures of the chart tests: config loaded and charts rendered once per session."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Callable

import pytest

from k8s import names
from k8s.kyverno import policy_manifest
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from platform_config import ProjectConfig, load_project
from tests.example_config import FIXTURE_CONFIG, copy_example_config

REPO = Path(__file__).resolve().parents[2]
#: The CRD's v1 schema, generated from the operator's CRD by scripts/update_crd_schema.py and
#: committed beside the `cdk8s import` classes, so these tests run on any fresh clone.
CRD_SCHEMA_FILE = REPO / "imports" / "inferenceendpointconfig-v1.schema.json"
#: The reference files themselves (never copied into the repository) sit in shared/ beside
#: the checkout for contributors and CI; tests that compare against them skip elsewhere.
REFERENCE = REPO.parent / "shared" / "reference"
CRD_FILE = REFERENCE / "crds" / "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"
CURVINE_SAMPLE = REFERENCE / "curvine" / "curvine-cluster.toml"
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"reference files not beside the checkout ({REFERENCE})")

VOLUME_ID = "vol-0a1b2c3d4e5f60718"
ZONE = "us-west-2a"


@pytest.fixture(scope="session")
def k8s_project() -> ProjectConfig:
    """The scenario configuration (tests/fixtures/config), independent of other suites' fixtures."""
    return load_project(FIXTURE_CONFIG)


@pytest.fixture(scope="session")
def manifests(k8s_project: ProjectConfig) -> dict[str, list[dict]]:
    """Every chart rendered once with a real-looking volume ID and zone."""
    return render_manifests(k8s_project, volume_id=VOLUME_ID, availability_zone=ZONE, scaling=project_scaling(k8s_project))


@pytest.fixture(scope="session")
def curvine(manifests: dict[str, list[dict]]) -> list[dict]:
    """The Curvine chart's objects."""
    return manifests["curvine"]


@pytest.fixture(scope="session")
def toml_conf(curvine: list[dict]) -> dict[str, Any]:
    """``curvine-cluster.toml`` of the Curvine ConfigMap, parsed."""
    return tomllib.loads(find(curvine, "ConfigMap", names.CURVINE_CONFIG_MAP)["data"][names.CURVINE_CONFIG_FILE])


@pytest.fixture(scope="session")
def crd_v1_schema() -> dict[str, Any]:
    """openAPIV3Schema of the InferenceEndpointConfig CRD's v1 (storage) version."""
    schema = json.loads(CRD_SCHEMA_FILE.read_text(encoding="utf-8"))
    schema.pop("$comment")
    return schema


@pytest.fixture(scope="module", params=["rag-assistant", "research-reasoning"])
def line(request, k8s_project: ProjectConfig):
    """Each business line of the scenario configuration, in turn."""
    return k8s_project.business_line(request.param)


@pytest.fixture(scope="module")
def policy(k8s_project: ProjectConfig, line) -> dict:
    """The Kyverno Policy of :func:`line`."""
    return policy_manifest(k8s_project.platform, line)


def find(objects: list[dict], kind: str, name: str | None = None) -> dict:
    """The single object of ``kind`` (and ``name``) in a chart's objects."""
    hits = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


@pytest.fixture
def config_copy(tmp_path: Path) -> Callable[[], Path]:
    """Copy the example config into a temp dir so a test can edit a file and load the result."""

    def make() -> Path:
        return copy_example_config(tmp_path / "config")

    return make
