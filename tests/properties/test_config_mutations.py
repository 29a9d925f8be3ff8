"""Every config a user can type (issue 27): mutations of the scenario config, each either refused
well or deployable.

For every mutation (:mod:`tests.properties.mutations`: types, missing, renamed and duplicated keys,
extremes, units, unicode, YAML 1.1 forms, file names, links, prefix paths, values copied across
fields and files) the loader every command uses (:func:`load_checked_project`) either

* refuses it with :class:`ConfigError`, never another exception (a traceback), and every problem
  is one line naming a file of the config, the field or line (or the file itself), what is wrong
  and what is allowed, in words (no raw regular expression, no Python repr); or
* accepts it, and then everything a deploy depends on that can be checked offline holds: the
  rendered manifests are valid Kubernetes objects (strict schemas, names, labels, quantities), the
  endpoint validates against the CRD with no field pruned, and stack names and tags are what
  CloudFormation accepts. What only AWS knows is preflight's.

The loader is driven directly, so hundreds of mutations run in seconds; a sample goes through
``app.py`` exactly as ``make synth`` runs it, whose ``error:`` lines must be the loader's problems.

Examples: ``KVCACHE_MUTATIONS`` (default 400) per session, derandomized so CI is reproducible;
``KVCACHE_MUTATIONS_SEED=random`` explores new ones (what a hypothesis failure prints reproduces it).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes.utils.quantity import parse_quantity

from capacity.project_checks import load_checked_project
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from platform_config import ConfigError, ProjectConfig
from platform_config.stack_names import stack_ids
from tests.example_config import FIXTURE_CONFIG, run_app
from tests.k8s.conftest import CRD_SCHEMA_FILE
from tests.k8s.custom_kinds import CUSTOM_KINDS
from tests.k8s.test_k8s_schemas import pruned_fields
from tests.properties.mutations import Mutation, mutations

EXAMPLES = int(os.environ.get("KVCACHE_MUTATIONS", "400"))
RANDOM = os.environ.get("KVCACHE_MUTATIONS_SEED") == "random"
VOLUME_ID = "vol-0a1b2c3d4e5f60718"

#: RFC 1123 label (namespaces, Services) and subdomain (most other objects), as the API server checks.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_KINDS_NAMED_AS_LABELS = {"Namespace", "Service"}
#: CloudFormation: stack names ``[a-zA-Z][-a-zA-Z0-9]*``, at most 128; tag keys 1-128 and values up
#: to 256 characters, no ``aws:`` prefix (CreateStack, Tag).
STACK_NAME = re.compile(r"^[A-Za-z][-A-Za-z0-9]{0,127}$")
#: What a refusal never shows: a raw regular expression, a Python repr, a traceback's words.
RAW_PATTERN = re.compile(r"\^\[|\]\*|\$'|\\d|\\w|\(\?:|<class '|object at 0x|Traceback|<root>")


def _crd_schema() -> dict:
    return json.loads(Path(CRD_SCHEMA_FILE).read_text())


CRD_SCHEMA = _crd_schema()
#: Built-in objects already validated, by their JSON: most mutations leave most objects as they were.
_VALID: set[str] = set()


def problem_report(problems: tuple, config_dir: Path) -> list[str]:
    """What is wrong with the refusal itself, one entry per bad problem (empty: refused well)."""
    bad = []
    root = str(config_dir)
    seen = set()
    for p in problems:
        text = str(p)
        if text in seen:
            bad.append(f"reported twice: {text}")
        seen.add(text)
        if not p.file.startswith(root):
            bad.append(f"names no file of the config: {text}")
        if "\n" in text or "\r" in text:
            bad.append(f"more than one line: {text!r}")
        if "allowed" not in p.message:
            bad.append(f"says nothing of what is allowed: {text}")
        if RAW_PATTERN.search(re.sub(r"\(pattern \S+\)", "", p.message)):  # words, then the pattern: fine
            bad.append(f"shows a raw pattern or a Python repr: {text}")
        if not p.field and p.line is None and not _names_a_path(p.file):
            bad.append(f"names neither a field, a line nor a file: {text}")
    return bad


def _names_a_path(file: str) -> bool:
    """A problem of a file or directory itself (unreadable, misnamed, no line) names its path."""
    return bool(Path(file).name)


def _quantities(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every value under a ``resources`` ``requests``/``limits`` or a PVC's ``storage`` request."""
    found = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("requests", "limits", "capacity") and isinstance(value, dict):
                found += [(f"{path}.{key}.{k}", v) for k, v in value.items()]
            else:
                found += _quantities(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += _quantities(value, f"{path}[{i}]")
    return found


def object_problems(obj: dict, version: str) -> list[str]:
    """What the API server would refuse in ``obj``: its schema (strict, built-in kinds; the CRD's
    for InferenceEndpointConfig, nothing pruned), names, label keys and values, quantities."""
    meta = obj.get("metadata", {})
    ident = f"{obj.get('kind')}/{meta.get('name')}"
    bad = []
    name = meta.get("name", "")
    name_rule = DNS_LABEL if obj.get("kind") in LABEL_KINDS_NAMED_AS_LABELS else DNS_SUBDOMAIN
    limit = 63 if name_rule is DNS_LABEL else 253
    if not (name_rule.match(name) and len(name) <= limit):
        bad.append(f"{ident}: name {name!r}")
    namespace = meta.get("namespace")
    if namespace is not None and not (DNS_LABEL.match(namespace) and len(namespace) <= 63):
        bad.append(f"{ident}: namespace {namespace!r}")
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label = key.rpartition("/")
        if not (LABEL_NAME.match(label) and len(label) <= 63) or (prefix and not DNS_SUBDOMAIN.match(prefix)):
            bad.append(f"{ident}: label key {key!r}")
        if not isinstance(value, str) or (value and not (LABEL_NAME.match(value) and len(value) <= 63)):
            bad.append(f"{ident}: label {key}={value!r}")
    for where, value in _quantities(obj.get("spec", {})):
        try:
            quantity = parse_quantity(value)
            if quantity < 0:
                bad.append(f"{ident}: negative quantity {where}={value!r}")
        except (ValueError, TypeError):
            bad.append(f"{ident}: quantity {where}={value!r}")
    if obj["kind"] == "InferenceEndpointConfig":
        try:
            jsonschema.validate(obj, CRD_SCHEMA, cls=jsonschema.Draft7Validator)
        except jsonschema.ValidationError as exc:
            bad.append(f"{ident}: CRD schema: {exc.message}")
        pruned = pruned_fields({k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")},
                               CRD_SCHEMA)
        if pruned:
            bad.append(f"{ident}: pruned by the API server: {pruned}")
    elif obj["kind"] not in CUSTOM_KINDS:
        key = json.dumps(obj, sort_keys=True)
        if key not in _VALID:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
                _VALID.add(key)
            except kubernetes_validate.ValidationError as exc:
                bad.append(f"{ident}: {exc.message} at {list(exc.path)}")
    return bad


def deploy_problems(project: ProjectConfig) -> list[str]:
    """What a deploy of an accepted ``project`` would fail on, checkable offline (empty: none)."""
    bad = []
    platform = project.platform
    for role, name in stack_ids(project).items():
        if not STACK_NAME.match(name):
            bad.append(f"stack {role}: name {name!r}")
    for key, value in platform.tags.items():
        if not 1 <= len(key) <= 128 or len(value) > 256 or key.lower().startswith("aws:"):
            bad.append(f"tag {key!r}={value!r}")
    manifests = render_manifests(project, volume_id=VOLUME_ID, availability_zone=platform.gpu_availability_zone, scaling=project_scaling(project))
    for objects in manifests.values():
        for obj in objects:
            bad += object_problems(obj, platform.eks.version)
    for line in project.business_lines:
        for value in (line.replicas, line.gpus_per_replica):
            if not (isinstance(value, int) and value >= 0 and math.isfinite(value)):
                bad.append(f"{line.name}: count {value!r}")
    return bad


def outcome(mutation: Mutation) -> tuple[Path, ProjectConfig | ConfigError]:
    """Apply ``mutation`` to a fresh copy of the scenario config; load it as every command does."""
    work = Path(tempfile.mkdtemp(prefix="mutation."))
    config_dir = work / "config"
    shutil.copytree(FIXTURE_CONFIG, config_dir)
    mutation.apply(config_dir)
    try:
        return config_dir, load_checked_project(config_dir)
    except ConfigError as exc:
        return config_dir, exc


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@SETTINGS
@given(mutation=mutations(FIXTURE_CONFIG))
def test_every_mutation_is_refused_well_or_deployable(mutation: Mutation) -> None:
    config_dir, result = outcome(mutation)
    try:
        if isinstance(result, ConfigError):
            assert result.problems, "a ConfigError without a problem"
            assert problem_report(result.problems, config_dir) == []
        else:
            assert deploy_problems(result) == [], f"accepted, but a deploy would fail ({mutation!r})"
    finally:
        shutil.rmtree(config_dir.parent, ignore_errors=True)


# --- a sample through app.py, as make synth runs it -------------------------------------------------

#: Mutations whose outcome is known, one per outcome: refused by the loader (several problems),
#: refused by the synthesis-time checks, accepted.
SAMPLE = {
    "refused: two problems": lambda d: _replace(d / "business-lines" / "rag-assistant.yaml",
                                                ("replicas: 2", "replicas: -1"), ("port: 8000", "port: 80000")),
    "accepted: units respelled": lambda d: _replace(d / "business-lines" / "rag-assistant.yaml",
                                                    ("l1_cpu_gib: 16", "l1_cpu_gib: 8")),
}


def _replace(path: Path, *pairs: tuple[str, str]) -> None:
    text = path.read_text(encoding="utf-8")
    for old, new in pairs:
        assert old in text, (path, old)
        text = text.replace(old, new, 1)
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_app_prints_the_loaders_problems_one_error_line_each(name: str, tmp_path: Path) -> None:
    config_dir = tmp_path / "config"
    shutil.copytree(FIXTURE_CONFIG, config_dir)
    SAMPLE[name](config_dir)
    try:
        expected = []
        load_checked_project(config_dir)
    except ConfigError as exc:
        expected = [f"error: {p}" for p in exc.problems]
    result = run_app(config_dir, tmp_path / "cdk.out")
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    if name.startswith("refused"):
        assert result.returncode == 2 and len(expected) >= 2
        assert errors == expected
        assert not any((tmp_path / "cdk.out").iterdir())
    else:
        assert result.returncode == 0 and errors == [] and expected == []
        assert list((tmp_path / "cdk.out").glob("*.template.json"))
