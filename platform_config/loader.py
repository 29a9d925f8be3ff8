"""Load and cross-validate ``config/platform.yaml`` and ``config/business-lines/*.yaml``.

All reading happens here, before any construct is built, so that bad input stops the run
before a single file is written (no half-synthesized ``cdk.out/`` or ``dist/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from platform_config import models
from platform_config.instances import INSTANCE_TYPES
from platform_config.models import BusinessLineConfig, PlatformConfig

PLATFORM_FILE = "platform.yaml"

#: Human words for the regular expressions of ``models``, shown before the pattern itself.
PATTERN_DESCRIPTIONS = {
    models.DNS_LABEL_PATTERN: "a DNS-1123 label (lowercase letters, digits, '-'; at most 63)",
    models.HYPERPOD_NAME_PATTERN: "letters, digits and inner '-' (HyperPod names)",
    models.QUANTITY_PATTERN: "a Kubernetes quantity such as 500Gi or 2Ti",
    models.PINNED_VERSION_PATTERN: "an exact version such as v1.18.2-eksbuild.2",
    models.AWS_ACCOUNT_PATTERN: "a 12-digit account ID",
    models.AWS_REGION_PATTERN: "a region name such as us-west-2",
    models.AZ_NAME_PATTERN: "a zone name such as us-west-2a",
    models.EMAIL_PATTERN: "an email address such as oncall@example.com",
}
BUSINESS_LINES_DIR = "business-lines"


@dataclass(frozen=True)
class ConfigProblem:
    """One problem: which file, which field (dotted path), the bad value, and what is allowed."""

    file: str
    field: str
    message: str
    value: Any = None

    def __str__(self) -> str:
        shown = "" if self.value is None else f" (got {self.value!r})"
        return f"{self.file}: {self.field or '<root>'}: {self.message}{shown}"


class ConfigError(Exception):
    """Raised for any invalid configuration; ``problems`` lists every problem found.

    ``str(error)`` is the human-readable report that ``app.py`` prints before exiting 1.
    """

    def __init__(self, problems: Iterable[ConfigProblem]):
        self.problems = tuple(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True)
class ProjectConfig:
    """The validated platform and its business lines (sorted by name)."""

    platform: PlatformConfig
    business_lines: tuple[BusinessLineConfig, ...]
    config_dir: Path

    def business_line(self, name: str) -> BusinessLineConfig:
        """Return the business line called ``name``; KeyError lists the known names."""
        for line in self.business_lines:
            if line.name == name:
                return line
        raise KeyError(f"no business line {name!r}; known: {', '.join(l.name for l in self.business_lines)}")


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; ConfigError (naming the file) if missing, invalid or not a mapping."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(str(path), "", "file not found")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(str(path), "", f"not valid YAML: {exc}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(str(path), "", "must be a YAML mapping", type(data).__name__)])
    return data


def _problems_from_validation(path: Path, exc: ValidationError) -> list[ConfigProblem]:
    problems = []
    for err in exc.errors(include_url=False):
        # Drop pydantic's union/discriminator tags (e.g. "create", "s3") from the path.
        field = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        ctx = err.get("ctx") or {}
        if err["type"] == "literal_error" and "expected" in ctx:
            message = f"not allowed; allowed: {ctx['expected']}"
        elif err["type"] == "string_pattern_mismatch":
            pattern = ctx.get("pattern")
            described = PATTERN_DESCRIPTIONS.get(pattern)
            message = f"not allowed; allowed: {described} (pattern {pattern})" if described \
                else f"not allowed; allowed: strings matching {pattern}"
        elif err["type"] == "extra_forbidden":
            message = "unknown key (typo?); see the config reference in README.md"
        elif err["type"] == "missing":
            message = "required field is missing; see the config reference in README.md"
        elif err["type"] == "union_tag_invalid":
            message = f"unknown type {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}"
        value = err.get("input") if err["type"] != "missing" else None
        if isinstance(value, (dict, list)):
            value = None
        problems.append(ConfigProblem(str(path), field, message, value))
    return problems


def parse_model(model: type[BaseModel], path: Path, data: dict[str, Any]) -> Any:
    """Validate ``data`` (read from ``path``) as ``model``; ConfigError lists every problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_problems_from_validation(path, exc)) from None


def load_platform(path: Path) -> PlatformConfig:
    """Parse ``platform.yaml``. Raises :class:`ConfigError` naming file, field and allowed values."""
    return parse_model(PlatformConfig, path, read_yaml(path))


def load_business_line(path: Path) -> BusinessLineConfig:
    """Parse one business-line file; its ``name`` defaults to the file stem and must equal it.

    Raises:
        ConfigError: invalid file, or a ``name`` that differs from the file stem.
    """
    data = read_yaml(path)
    stem = path.stem
    if "name" in data and data["name"] != stem:
        raise ConfigError([ConfigProblem(str(path), "name", f"must equal the file name {stem!r}", data["name"])])
    data.setdefault("name", stem)
    return parse_model(BusinessLineConfig, path, data)


def cross_check(
    platform: PlatformConfig, platform_path: Path, lines: list[tuple[Path, BusinessLineConfig]]
) -> list[ConfigProblem]:
    """Rules spanning files: instance types, taints, namespaces, L1/L2 prerequisites, GPU capacity.

    Args:
        lines: (file, parsed line) pairs; one pair checks a single line against the platform
            (what ``scripts/plan.py --business-line`` does), all of them the whole project.
    """
    problems: list[ConfigProblem] = []
    group_types = sorted({g.instance_type for g in platform.hyperpod.instance_groups})
    reserved = {"default", "kube-system", "kube-public", "kube-node-lease", "aws-hyperpod",
                "hyperpod-inference-system", "kyverno", "cert-manager", platform.curvine.namespace,
                platform.observability.namespace}
    seen_ns: dict[str, Path] = {}
    for path, line in lines:
        if line.instance_type not in group_types:
            problems.append(ConfigProblem(
                str(path), "instance_type",
                f"no HyperPod instance group has this type; allowed: {', '.join(group_types)}",
                line.instance_type))
        if line.namespace in reserved:
            problems.append(ConfigProblem(
                str(path), "namespace", f"reserved for the platform; not allowed: {', '.join(sorted(reserved))}",
                line.namespace))
        if line.namespace in seen_ns:
            problems.append(ConfigProblem(
                str(path), "namespace", f"already used by {seen_ns[line.namespace]}; each line needs its own",
                line.namespace))
        seen_ns.setdefault(line.namespace, path)
        if line.cache.l2_enabled and not platform.curvine.enabled:
            problems.append(ConfigProblem(
                str(path), "cache.l2_enabled",
                f"L2 needs Curvine, but curvine.enabled is false in {platform_path}; allowed: false", True))
        if line.cache.l2_enabled and platform.curvine.worker_instance_groups:
            worker_types = {g.instance_type for g in platform.hyperpod.instance_groups
                            if g.name in platform.curvine.worker_instance_groups}
            if line.instance_type not in worker_types:
                problems.append(ConfigProblem(
                    str(path), "instance_type",
                    "L2 is on but no Curvine Worker runs on this instance type "
                    f"(curvine.worker_instance_groups in {platform_path})", line.instance_type))
        serving_groups = [g for g in platform.hyperpod.instance_groups if g.instance_type == line.instance_type]
        if serving_groups and all(any(t.effect != "PreferNoSchedule" for t in g.taints) for g in serving_groups):
            problems.append(ConfigProblem(
                str(path), "instance_type",
                f"every instance group of this type ({', '.join(g.name for g in serving_groups)}) has a "
                f"NoSchedule/NoExecute taint in {platform_path}, and InferenceEndpointConfig has no "
                "tolerations field, so the line's pods could never schedule; allowed: a type with an untainted group",
                line.instance_type))
        if line.cache.l1_enabled and not platform.hyperpod.tiered_storage.enabled:
            problems.append(ConfigProblem(
                str(path), "cache.l1_enabled",
                f"L1 uses HyperPod Tiered Storage, which is disabled in {platform_path}; allowed: false", True))
    problems.extend(_gpu_capacity_problems(platform, platform_path, lines))
    if any(l.cache.l2_enabled for _, l in lines) and platform.curvine.enabled \
            and platform.curvine.eviction.ttl_hours == 0:
        problems.append(ConfigProblem(
            str(platform_path), "curvine.eviction.ttl_hours",
            "0 disables eviction and LMCache never deletes, so L2 would fill the NVMe; allowed: > 0", 0))
    return problems


def _gpu_capacity_problems(
    platform: PlatformConfig, platform_path: Path, lines: list[tuple[Path, BusinessLineConfig]]
) -> list[ConfigProblem]:
    """All lines on one instance type must fit, together, on the GPUs of its instance groups.

    A replica spans ``gpus_per_replica`` GPUs of one node, so capacity is counted per node:
    ``sum(instance_count) * (gpus per instance // gpus_per_replica)`` replicas of each shape.
    """
    problems: list[ConfigProblem] = []
    for instance_type in sorted({l.instance_type for _, l in lines}):
        nodes = sum(g.instance_count for g in platform.hyperpod.instance_groups
                    if g.instance_type == instance_type)
        on_type = [(p, l) for p, l in lines if l.instance_type == instance_type]
        gpus_per_node = INSTANCE_TYPES[instance_type].gpus
        # Pack the widest replicas first: a node's leftover GPUs serve narrower replicas.
        free = [gpus_per_node] * nodes
        unplaced: list[str] = []
        for path, line in sorted(on_type, key=lambda pl: -pl[1].gpus_per_replica):
            for _ in range(line.replicas):
                slot = next((i for i, f in enumerate(free) if f >= line.gpus_per_replica), None)
                if slot is None:
                    unplaced.append(line.name)
                    break
                free[slot] -= line.gpus_per_replica
        if unplaced and nodes:
            wanted = ", ".join(f"{l.name} {l.replicas}x{l.gpus_per_replica} GPU" for _, l in on_type)
            problems.append(ConfigProblem(
                str(on_type[0][0].parent), "replicas",
                f"the lines on {instance_type} ({wanted}) do not fit on its {nodes} node(s) x "
                f"{gpus_per_node} GPU(s) in {platform_path}; allowed: raise instance_count or lower replicas "
                f"(first that does not fit: {', '.join(dict.fromkeys(unplaced))})"))
    return problems


def load_project(config_dir: str | Path = "config") -> ProjectConfig:
    """Load, validate and cross-check every config file under ``config_dir``.

    Layout: ``<config_dir>/platform.yaml`` and ``<config_dir>/business-lines/*.yaml``.

    Raises:
        ConfigError: every problem found across all files (not only the first), each naming the
            file, the field, the bad value and the allowed values.
    """
    config_dir = Path(config_dir)
    platform_path = config_dir / PLATFORM_FILE
    problems: list[ConfigProblem] = []
    platform: PlatformConfig | None = None
    try:
        platform = load_platform(platform_path)
    except ConfigError as exc:
        problems.extend(exc.problems)

    lines: list[tuple[Path, BusinessLineConfig]] = []
    line_files = sorted((config_dir / BUSINESS_LINES_DIR).glob("*.y*ml"))
    for path in line_files:
        try:
            lines.append((path, load_business_line(path)))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if platform is not None:
        problems.extend(cross_check(platform, platform_path, lines))
    if problems:
        raise ConfigError(problems)
    assert platform is not None
    return ProjectConfig(
        platform=platform,
        business_lines=tuple(sorted((l for _, l in lines), key=lambda l: l.name)),
        config_dir=config_dir,
    )
