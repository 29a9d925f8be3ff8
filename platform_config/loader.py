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

from platform_config import models, node_fit
from platform_config.instances import INSTANCE_TYPES
from platform_config.models import BusinessLineConfig, PlatformConfig

PLATFORM_FILE = "platform.yaml"

#: Human words for the regular expressions of ``models``, shown before the pattern itself.
PATTERN_DESCRIPTIONS = {
    models.DNS_LABEL_PATTERN: "a DNS-1123 label (lowercase letters, digits, '-'; at most 63)",
    models.HYPERPOD_NAME_PATTERN: "letters, digits and inner '-' (HyperPod names)",
    models.QUANTITY_PATTERN: "a Kubernetes quantity such as 500Gi or 2Ti",
    models.CPU_QUANTITY_PATTERN: ("a Kubernetes quantity of CPU: cores such as 8 or 0.5, or millicores such as "
                                  "500m, without a byte suffix"),
    models.PINNED_VERSION_PATTERN: "an exact version such as v1.18.2-eksbuild.2",
    models.AWS_ACCOUNT_PATTERN: "a 12-digit account ID",
    models.AWS_REGION_PATTERN: "a region name such as us-west-2",
    models.AZ_NAME_PATTERN: "a zone name such as us-west-2a",
    models.hp_rules.KUBERNETES_KEY_PATTERN: "a Kubernetes label/taint key: [prefix/]name, e.g. kvcache.io/tier",
    models.hp_rules.KUBERNETES_VALUE_PATTERN: "a Kubernetes label value (letters, digits, '-', '_', '.')",
    models.hp_rules.TRAINING_PLAN_ARN_PATTERN: "a training plan ARN (arn:aws:sagemaker:<region>:<account>:training-plan/<name>)",
    models.WORKER_DATA_DIR_PATTERN: "a directory below /opt/dlami/nvme or /opt/sagemaker",
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
    #: Checks that could not run, each naming its file (today: the fit of a model that is not
    #: in the planner's table, see :func:`model_fit_problems`). ``app.py`` prints them.
    warnings: tuple[str, ...] = ()

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
            message = models.REMOVED_KEYS.get(field, "unknown key (typo?); see the config reference in README.md")
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
    platform: PlatformConfig, platform_path: Path, lines: list[tuple[Path, BusinessLineConfig]],
    *, check_node_fit: bool = True,
) -> list[ConfigProblem]:
    """Rules spanning files: instance types, taints, namespaces, L2 prerequisites (an L2 line's
    TTFT SLO above ``lmcache.lookup_timeout_ms``, what an unhealthy L2 adds to each request), the L2 pool, and
    whether the lines' pods fit the nodes (GPUs, CPU and memory: :func:`node_fit_problems`).

    Args:
        lines: (file, parsed line) pairs; one pair checks a single line against the platform
            (what ``scripts/plan.py --business-line`` does), all of them the whole project.
        check_node_fit: False leaves the node fit out (``scripts/plan.py`` reports it itself, with the
            config's other lines, through :func:`node_fit_problems`).
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
        timeout = platform.lmcache.lookup_timeout_ms
        if line.cache.l2_enabled and line.slo.ttft_p90_ms <= timeout:
            problems.append(ConfigProblem(
                str(path), "slo.ttft_p90_ms",
                f"an unhealthy L2 adds up to lmcache.lookup_timeout_ms ({timeout} ms, {platform_path}) to every "
                f"request's lookup, which leaves no room for the prefill under this SLO; allowed: more than "
                f"{timeout} (or lower lmcache.lookup_timeout_ms)", line.slo.ttft_p90_ms))
        if line.cache.l2_enabled and platform.curvine.worker_instance_groups:
            worker_types = {g.instance_type for g in platform.curvine_worker_groups()}
            if line.instance_type not in worker_types:
                problems.append(ConfigProblem(
                    str(path), "instance_type",
                    "L2 is on but no Curvine Worker runs on this instance type "
                    f"(curvine.worker_instance_groups in {platform_path})", line.instance_type))
        serving_groups = [g for g in platform.hyperpod.instance_groups if g.instance_type == line.instance_type]
        if serving_groups and not node_fit.schedulable_groups(platform, line.instance_type):
            problems.append(ConfigProblem(
                str(path), "instance_type",
                f"every instance group of this type ({', '.join(g.name for g in serving_groups)}) has a "
                f"NoSchedule/NoExecute taint in {platform_path}, and InferenceEndpointConfig has no "
                "tolerations field, so the line's pods could never schedule; allowed: a type with an untainted group",
                line.instance_type))
        # No rule ties L1 to Tiered Storage: L1 is LMCache's own buffer in the vLLM process's memory
        # (inside resources.memory); Tiered Storage's share belongs to the ai-toolkit daemon, whose
        # sagemaker-hyperpod:// L2 this platform replaces with Curvine (docs/l2-cache.md, "L1 is not Tiered Storage").
    if check_node_fit:
        problems.extend(node_fit_problems(platform, platform_path, lines))
    problems.extend(_l2_pool_problems(platform, platform_path, lines))
    return problems


def node_fit_problems(
    platform: PlatformConfig, platform_path: Path, lines: list[tuple[Path, BusinessLineConfig]]
) -> list[ConfigProblem]:
    """All lines on one instance type must fit, together, on its nodes: GPUs, CPU and memory of each
    node at once (:func:`platform_config.node_fit.fit_lines`, the function the planner reports).

    A line whose single replica exceeds what a whole node has for the lines' pods is reported on its
    own file and field (``resources.memory`` / ``resources.cpu``); otherwise a packing that leaves
    replicas out is reported on the business-lines directory, with each node's budget.
    """
    problems: list[ConfigProblem] = []
    for fit in node_fit.fit_lines(platform, lines).values():
        budgets = fit.budgets()
        budget_text = " | ".join(
            (f"group {b.group}: " if len(budgets) > 1 else "") + b.describe() for b in budgets)
        for path, line, field, message, allowed in fit.too_big:
            value = line.resources.memory if field == "resources.memory" else line.resources.cpu
            problems.append(ConfigProblem(
                str(path), field, f"{message} (a node in {platform_path}: {budget_text}); allowed: {allowed}", value))
        if fit.unplaced:
            first = fit.unplaced[0]
            replicas = {l.name: l.replicas for _, l in fit.lines}
            wanted = ", ".join(f"{l.name} {l.replicas} x ({node_fit.replica_of(l).describe()})" for _, l in fit.lines)
            free = "; ".join(f"node {i + 1}: {text}" for i, text in enumerate(first.free_then[:4]))
            if len(first.free_then) > 4:
                free += f"; ... ({len(first.free_then) - 4} more)"
            names = ", ".join(dict.fromkeys(u.replica.line for u in fit.unplaced))
            problems.append(ConfigProblem(
                str(fit.lines[0][0].parent), "replicas",
                f"the lines on {fit.instance_type} ({wanted}) do not fit on its {len(fit.nodes)} node(s) in "
                f"{platform_path}: a node has {budget_text}; first that does not fit: {first.replica.line} "
                f"replica {first.replica.index} of {replicas[first.replica.line]} ({first.replica.describe()}), "
                f"when the nodes had free {free}; lines left out: {names}; allowed: raise instance_count, or "
                "lower replicas, resources.cpu or resources.memory (scripts/plan.py --business-line shows "
                "each node's budget and placement)"))
    return problems


def nvme_gib(instance_type: str) -> float:
    """Local NVMe of ``instance_type`` in GiB (the table's ``nvme_gb`` is decimal GB)."""
    return INSTANCE_TYPES[instance_type].nvme_gb * 10**9 / 2**30


def l2_pool_gib(platform: PlatformConfig) -> tuple[int, float]:
    """(Worker count, usable L2 pool in GiB): the Workers' tiers x (1 - ``l2_pool_reserve_fraction``).

    A Worker runs on every node of ``platform.curvine_worker_groups()``; its tier is ``worker_capacity_gib``, and
    never more than the node's NVMe (a larger bound is refused by :func:`_l2_pool_problems`).
    Curvine keeps one replica of each block (docs/sources.md §4), so the pool is the sum of the
    Workers' tiers. The one pool figure: the config check compares the lines' ``l2_size`` with it
    and ``scripts/plan.py`` prints it. Example: 3 Workers x 2,000 GiB x 0.9 = 5,400 GiB.
    """
    c = platform.curvine
    groups = platform.curvine_worker_groups()
    tiers = sum(g.instance_count * min(c.worker_capacity_gib, nvme_gib(g.instance_type)) for g in groups)
    return sum(g.instance_count for g in groups), tiers * (1 - c.l2_pool_reserve_fraction)


def _l2_pool_problems(
    platform: PlatformConfig, platform_path: Path, lines: list[tuple[Path, BusinessLineConfig]]
) -> list[ConfigProblem]:
    """The lines' ``cache.l2_size`` together must fit the usable pool (:func:`l2_pool_gib`).

    Curvine v0.3.2 enforces no per-PVC quota (``CreateVolume`` sets none) and its quota eviction
    deletes nothing, so each line's janitor keeps the line below its ``l2_size``; the sizes only
    bound the pool if they add up to no more than it.
    """
    if not platform.curvine.enabled:
        return []
    problems = [ConfigProblem(
        str(platform_path), "curvine.worker_capacity_gib",
        f"{platform.curvine.worker_capacity_gib} GiB per Worker is more than the {nvme_gib(g.instance_type):,.0f} GiB "
        f"of NVMe of {g.instance_type} (instance group {g.name}), so Curvine would accept blocks the disk cannot "
        f"hold; allowed: at most {int(nvme_gib(g.instance_type))}, less what model weights and logs need there",
        platform.curvine.worker_capacity_gib)
        for g in platform.curvine_worker_groups() if platform.curvine.worker_capacity_gib > nvme_gib(g.instance_type)]
    l2_lines = [(p, l) for p, l in lines if l.cache.l2_enabled]
    if problems or not l2_lines:
        return problems
    workers, pool = l2_pool_gib(platform)
    total = sum(models.quantity_bytes(l.cache.l2_size) for _, l in l2_lines) / 2**30
    if total <= pool + 1e-9:
        return []
    sizes = ", ".join(f"{l.name} {l.cache.l2_size}" for _, l in l2_lines)
    return [ConfigProblem(
        str(l2_lines[0][0].parent), "cache.l2_size",
        f"the lines' L2 sizes ({sizes}) add up to {total:,.0f} GiB, more than the Curvine pool of "
        f"{pool:,.0f} GiB ({workers} Worker(s) x curvine.worker_capacity_gib "
        f"{platform.curvine.worker_capacity_gib} x (1 - curvine.l2_pool_reserve_fraction "
        f"{platform.curvine.l2_pool_reserve_fraction:g}) in {platform_path}); allowed: a total of at most "
        f"{pool:,.0f} GiB (lower l2_size, or raise worker_capacity_gib or instance_count)")]


def config_dir_of(line_file: Path, default: Path = Path("config")) -> Path:
    """The config directory a business-line file belongs to: ``<dir>`` for
    ``<dir>/business-lines/<name>.yaml`` when ``<dir>/platform.yaml`` exists, else ``default``.

    Lets ``scripts/plan.py --business-line FILE`` run from any working directory.
    """
    parent = Path(line_file).resolve().parent
    if parent.name == BUSINESS_LINES_DIR and (parent.parent / PLATFORM_FILE).is_file():
        return parent.parent
    return default


def duplicate_line_problems(line_files: list[Path]) -> list[ConfigProblem]:
    """Two files that name the same line (``a.yaml`` beside ``a.yml``): one problem naming both.

    A line's name is its file stem, and the stem names its stack, namespace objects and
    charts, so two such files would otherwise collide deep inside synthesis.
    """
    by_stem: dict[str, list[Path]] = {}
    for path in line_files:
        by_stem.setdefault(path.stem, []).append(path)
    return [ConfigProblem(str(paths[0]), "name",
                          f"business line {stem!r} is defined by {len(paths)} files "
                          f"({', '.join(str(p) for p in paths)}); allowed: one file per line, remove the others")
            for stem, paths in sorted(by_stem.items()) if len(paths) > 1]


def model_fit_problems(
    platform: PlatformConfig, lines: list[tuple[Path, BusinessLineConfig]]
) -> tuple[list[ConfigProblem], list[str]]:
    """Each line's model must fit ``gpus_per_replica`` GPUs of its instance type.

    The rule is the planner's, called, not copied: :func:`kv_tools.planner.choose_tp` over
    :func:`kv_tools.planner.inputs_from_line`, i.e. exactly what ``scripts/plan.py
    --business-line <file>`` reports with its default flags (weights per GPU plus the runtime
    reserve within vLLM's ``--gpu-memory-utilization`` share, and room left for one sequence of
    ``--max-model-len`` tokens, or of the planner's default prompt). So synthesis refuses what
    the planner says does not fit, and nothing else.

    A model the planner's table (``kv_tools/model_specs.py``, matched by normalized
    ``model.name``) does not know cannot be sized offline: its fit is skipped and a warning
    names the file and the command that checks it (``plan.py --hf-config``).

    Returns:
        ``(problems, warnings)``.
    """
    # Imported here: kv_tools imports platform_config, so a module-level import would be circular.
    from kv_tools.planner import LINE_CONFIG_FIELDS, PlanInputError, choose_tp, inputs_from_line

    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    for path, line in lines:
        try:
            inputs = inputs_from_line(line, platform)
        except KeyError:  # the only KeyError of inputs_from_line: the model is not in the table
            warnings.append(
                f"{path}: model.name {line.model.name!r} is not in the planner's table (kv_tools/model_specs.py), "
                f"so whether it fits {line.instance_type} with gpus_per_replica {line.gpus_per_replica} is not "
                f"checked; check it with: scripts/plan.py --business-line {path} --hf-config <its config.json>")
            continue
        except PlanInputError as exc:  # each problem names its planner field; report the config key
            problems += [ConfigProblem(str(path), LINE_CONFIG_FIELDS.get(p.field, p.field), p.message)
                         for p in exc.problems]
            continue
        fit, min_tp = choose_tp(inputs)
        if fit.fits:
            continue
        allowed = (f"gpus_per_replica {min_tp} or more" if min_tp is not None
                   else "an instance type with more GPU memory, or a smaller model or dtype")
        problems.append(ConfigProblem(
            str(path), "gpus_per_replica",
            f"{line.model.name} ({line.model.dtype}) does not fit {line.instance_type} at "
            f"gpus_per_replica {line.gpus_per_replica}: {fit.reason}; allowed: {allowed} "
            f"(scripts/plan.py --business-line {path} shows the figures)", line.gpus_per_replica))
    return problems, warnings


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
    duplicates = duplicate_line_problems(line_files)
    problems.extend(duplicates)
    for path in line_files:
        try:
            lines.append((path, load_business_line(path)))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if duplicates:  # the files collide with each other; cross-checking them repeats that problem
        colliding = {Path(d.file).stem for d in duplicates}
        lines = [(p, l) for p, l in lines if p.stem not in colliding]
    warnings: list[str] = []
    if platform is not None:
        problems.extend(cross_check(platform, platform_path, lines))
        # Size only the lines without other problems (e.g. an instance type the platform lacks).
        named = {p.file for p in problems}
        fit_problems, warnings = model_fit_problems(platform, [(p, l) for p, l in lines if str(p) not in named])
        problems.extend(fit_problems)
    if problems:
        raise ConfigError(problems)
    assert platform is not None
    return ProjectConfig(
        platform=platform,
        business_lines=tuple(sorted((l for _, l in lines), key=lambda l: l.name)),
        config_dir=config_dir,
        warnings=tuple(warnings),
    )
