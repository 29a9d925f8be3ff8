"""Load and cross-validate ``config/platform.yaml`` and ``config/business-lines/*.yaml``.

All reading happens here, before any construct is built, so that bad input stops the run
before a single file is written (no half-synthesized ``cdk.out/`` or ``dist/``).
"""

from __future__ import annotations

import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import BaseModel, ValidationError

from platform_config import fields, line_models, node_fit, platform_models
from platform_config import hyperpod_rules as hp_rules
from platform_config.fields import CRD_ROUTING_STRATEGIES, GATEWAY_ROUTING
from platform_config.instances import INSTANCE_TYPES
from platform_config.line_models import BusinessLineConfig
from platform_config.platform_models import PlatformConfig
from platform_config.problems import ConfigError, ConfigProblem, FieldError
from platform_config.yaml_source import YAML_SUFFIXES, Scalar, YamlDocument, path_problem, read_text, read_yaml_document

PLATFORM_FILE = "platform.yaml"

#: Human words for the regular expressions of the config models, shown before the pattern itself.
PATTERN_DESCRIPTIONS = {
    fields.DNS_LABEL_PATTERN: "a DNS-1123 label (lowercase letters, digits, '-'; at most 63)",
    fields.HYPERPOD_NAME_PATTERN: "letters, digits and inner '-' (HyperPod names)",
    fields.QUANTITY_PATTERN: "a Kubernetes quantity such as 500Gi or 2Ti",
    fields.CPU_QUANTITY_PATTERN: ("a Kubernetes quantity of CPU: cores such as 8 or 0.5, or millicores such as "
                                  "500m, without a byte suffix"),
    fields.PINNED_VERSION_PATTERN: "an exact version such as v1.18.2-eksbuild.2",
    fields.AWS_ACCOUNT_PATTERN: "a 12-digit account ID",
    fields.AWS_REGION_PATTERN: "a region name such as us-west-2",
    fields.AZ_NAME_PATTERN: "a zone name such as us-west-2a",
    hp_rules.KUBERNETES_KEY_PATTERN: "a Kubernetes label/taint key: [prefix/]name, e.g. kvcache.io/tier",
    hp_rules.KUBERNETES_VALUE_PATTERN: "a Kubernetes label value (letters, digits, '-', '_', '.')",
    hp_rules.TRAINING_PLAN_ARN_PATTERN: "a training plan ARN (arn:aws:sagemaker:<region>:<account>:training-plan/<name>)",
    platform_models.WORKER_DATA_DIR_PATTERN: "a directory below /opt/dlami/nvme or /opt/sagemaker",
    platform_models.EMAIL_PATTERN: "an email address such as oncall@example.com",
    platform_models.CHART_NAME_PATTERN: "a Helm chart name: letters, digits, '.', '_' and '-', such as kyverno",
    platform_models.CHART_DIGEST_PATTERN: ("a chart archive's SHA-256, sha256:<64 lowercase hex digits> (scripts/"
                                           "vendor_chart.py prints it)"),
    line_models.HTTPS_URL_PATTERN: "an https:// URL without spaces, such as https://idp.example.com/realms/rag",
    line_models.HOT_PREFIX_FILE_PATTERN: ("a path relative to the line's file: letters, digits, '.', '_', '-' and '/' "
                                          "(e.g. rag-assistant.system-prompt.md)"),
    # The models' inline patterns (tests/config/test_config.py holds every pattern of the models to this table).
    r"^(https|oci)://\S+$": "an https:// or oci:// URL without spaces",
    r"^/[A-Za-z0-9._/-]*$": "an absolute path of letters, digits, '.', '_', '-' and '/', such as /kvcache",
    r"^/[A-Za-z0-9._/-]+$": "an absolute path of letters, digits, '.', '_', '-' and '/', such as /opt/ml/model",
    r"^1\.[0-9]+\.[0-9]+-[0-9]{8}$": "an EKS-optimized AMI release such as 1.34.2-20261118",
    r"^[0-9a-f]{40}$": "a full 40-character commit hash (lowercase hexadecimal)",
    r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$": "a Hugging Face model id <owner>/<name>, such as Qwen/Qwen2-7B-Instruct",
    r"^[A-Za-z0-9._/-]+$": "a URL path without a leading '/', such as v1/chat/completions",
    r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$": ("letters, digits, '.', '_' and '-', starting and ending with a "
                                                    "letter or digit, such as Qwen2-7B-Instruct"),
    r"^[a-z0-9]+\.[a-z0-9]+$": "an EC2 instance type such as m7i.xlarge",
    r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$": "an S3 bucket name (3-63 lowercase letters, digits, '.', '-')",
    r"^arn:aws[a-z-]*:(iam|sts)::[0-9]{12}:[A-Za-z0-9+=,.@_/-]+$": (
        "an IAM role or user ARN such as arn:aws:iam::111122223333:role/admin"),
    r"^fs-[0-9a-f]{8,17}$": "an FSx file system ID such as fs-0123456789abcdef0",
    r"^ml\.[a-z0-9]+\.[a-z0-9]+$": "a SageMaker instance type such as ml.g6e.12xlarge",
    r"^sg-[0-9a-f]{8,17}$": "a security group ID such as sg-0123456789abcdef0",
    r"^subnet-[0-9a-f]{8,17}$": "a subnet ID such as subnet-0123456789abcdef0",
    r"^vpc-[0-9a-f]{8,17}$": "a VPC ID such as vpc-0123456789abcdef0",
    r"^pl-[0-9a-f]{8,17}$": "a managed prefix list ID such as pl-0123456789abcdef0",
}
BUSINESS_LINES_DIR = "business-lines"


#: Where every config key is described (generated from the models by ``make docs``).
CONFIG_REFERENCE = "docs/configuration.md"
#: The environment variable naming the config directory of every command (``make ... CONFIG=dir``
#: sets it); a command's ``--config DIR`` wins over it.
CONFIG_DIR_ENV = "KVCACHE_CONFIG_DIR"
#: The repository's own config directory, the default.
REPOSITORY_CONFIG = Path(__file__).resolve().parents[1] / "config"


def default_config_dir() -> Path:
    """The config directory a command uses without ``--config``: ``$KVCACHE_CONFIG_DIR`` when set
    (relative to the current directory), else the repository's ``config/`` (shown relative to the
    current directory when it is below it, so messages name ``config/platform.yaml``)."""
    given = os.environ.get(CONFIG_DIR_ENV)
    if given:
        return Path(given)
    relative = Path(os.path.relpath(REPOSITORY_CONFIG))
    return REPOSITORY_CONFIG if relative.parts[:1] == ("..",) else relative


@dataclass(frozen=True)
class ProjectConfig:
    """The validated platform and its business lines (sorted by name).

    Attributes:
        warnings: what a command should tell the user without stopping: files it ignored
            (dotfiles, files that are not YAML), a Hugging Face model without a pinned commit, checks
            that could not run (a model the planner does not know). Each names its file; ``app.py``
            and the tools print them as ``warning: ...`` on stderr.
    """

    platform: PlatformConfig
    business_lines: tuple[BusinessLineConfig, ...]
    config_dir: Path
    warnings: tuple[str, ...] = ()

    def business_line(self, name: str) -> BusinessLineConfig:
        """Return the business line called ``name``; KeyError lists the known names."""
        for line in self.business_lines:
            if line.name == name:
                return line
        raise KeyError(f"no business line {name!r}; known: {', '.join(l.name for l in self.business_lines)}")


def _normalized_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """``loc`` as the user's keys: pydantic's union and validator tags (``create`` of
    ``network.create.cidr``, ``s3`` of ``model.source.s3.bucket``) dropped by following ``data``."""
    out: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and _is_tag(part, node):
            continue
        else:
            node = None
        out.append(part)
    return tuple(out)


def _is_tag(part: str, node: Any) -> bool:
    """A location element that names a union branch or a validator, not one of the user's keys:
    ``function-after[...]``, or the ``type``/``mode`` value of the mapping it stands in."""
    if "[" in part:
        return True
    return isinstance(node, dict) and part not in node and part in (node.get("type"), node.get("mode"))


def _yaml_hint(scalar: Scalar) -> str:
    """Why a field that wanted text (or a section) got what YAML read from an unquoted scalar."""
    if scalar.tag.endswith(":null"):
        return ("; the value is empty, which YAML reads as null: give a value, or remove the key "
                "to take the default")
    return f"; unquoted, YAML reads {scalar.text} as {scalar.reading()}: write \"{scalar.text}\" in quotes for the text"


#: Error types where the input's YAML type is the problem (a number where text was wanted, ...).
_TYPE_ERRORS = {"string_type", "literal_error", "model_type", "model_attributes_type", "dict_type", "list_type",
                "tuple_type", "union_tag_not_found", "model_class_type", "enum"}


#: pydantic's own wording of a rule ("Input should be greater than 0", "String should have at most 63
#: characters"), which :func:`_with_allowed` turns into the project's "not allowed; allowed: ..." form.
_PYDANTIC_RULE = re.compile(r"^(Input|String|List|Tuple|Dictionary|Set|Value|Decimal) should (?:be|have) ")


def _with_allowed(message: str) -> str:
    """``message`` in the project's form, what was wrong then ``allowed:``: pydantic's "Input should
    be a valid dictionary or instance of CacheConfig" becomes "not allowed; allowed: a mapping (key:
    value lines indented below the key)", without the Python class name a user cannot act on."""
    match = _PYDANTIC_RULE.match(message)
    if match is None or "allowed" in message:
        return message
    rule = re.sub(r" or instance of \w+", "", message[match.end():])
    # "a valid integer, unable to parse string as an integer": the reason repeats the rule.
    rule = re.sub(r", unable to parse string as an? \w+$", "", rule)
    rule = rule.replace("a valid dictionary", "a mapping (key: value lines indented below the key)")
    return f"not allowed; allowed: {rule}"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (through Annotated, unions, lists, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _tags_of(model: type[BaseModel], key: str | None = None) -> set[str]:
    """The values a union member's ``Literal`` fields (or only field ``key``) take: ``s3`` for
    ``type: Literal["s3"]``."""
    return {str(v) for name, f in model.model_fields.items() if key in (None, name)
            and typing.get_origin(f.annotation) is typing.Literal for v in typing.get_args(f.annotation)}


def _models_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[type[BaseModel]]:
    """The models a section at ``loc`` (pydantic's location: list indices and union tags included)
    of ``model`` may be: one, several for a union (``model.source``), none if unknown."""
    candidates = [model] if model is not None else []
    for part in loc:
        if isinstance(part, int) or "[" in part or not candidates:  # a list index, a validator's tag
            continue
        fields = [m.model_fields.get(part) for m in candidates]
        if any(f is not None for f in fields):
            candidates = [m for f in fields if f is not None for m in _models_in(f.annotation)]
        else:  # a union's tag (``s3`` of model.source): the member it names
            candidates = [m for m in candidates if part in _tags_of(m)]
    return candidates


def _keys_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """The keys a user may write at ``loc`` of ``model`` (:func:`_models_at`); empty when the
    location is not one model's section."""
    candidates = _models_at(model, loc)
    return sorted(candidates[0].model_fields) if len(candidates) == 1 else []


def _problems_from_validation(path: Path, exc: ValidationError, document: YamlDocument | None = None,
                              data: Any = None, model: type[BaseModel] | None = None) -> list[ConfigProblem]:
    """One :class:`ConfigProblem` per pydantic error, each on the user's dotted key path, with
    the allowed values in words (:data:`PATTERN_DESCRIPTIONS`), and, where YAML turned an unquoted
    scalar into a number, boolean or null, what it read and how to quote it."""
    data = document.data if document is not None and data is None else data
    problems = []
    for err in exc.errors(include_url=False):
        ctx = err.get("ctx") or {}
        loc = _normalized_loc(tuple(err["loc"]), data) if data is not None else tuple(err["loc"])
        error = ctx.get("error")
        if isinstance(error, FieldError):
            loc = loc + tuple(error.field.split("."))
        field = ".".join(str(p) for p in loc)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "literal_error" and "expected" in ctx:
            message = f"not allowed; allowed: {ctx['expected']}"
        elif err["type"] == "string_pattern_mismatch":
            pattern = ctx.get("pattern")
            described = PATTERN_DESCRIPTIONS.get(pattern)
            message = f"not allowed; allowed: {described} (pattern {pattern})" if described \
                else f"not allowed; allowed: strings matching {pattern}"
        elif err["type"] == "extra_forbidden":
            keys = _keys_at(model, tuple(err["loc"])[:-1])
            allowed = f"the keys of this section, {', '.join(keys)}" if keys else "the keys of this section"
            message = platform_models.REMOVED_KEYS.get(
                field, f"unknown key (typo?); allowed: {allowed} (the config reference, {CONFIG_REFERENCE})")
        elif err["type"] == "missing":
            message = (f"required field is missing; allowed: any value the config reference gives for it "
                       f"({CONFIG_REFERENCE}); add it")
        elif err["type"] == "union_tag_not_found":
            key = str(ctx.get("discriminator", "type")).strip("'")
            kinds = sorted({t for m in _models_at(model, tuple(err["loc"])) for t in _tags_of(m, key)})
            message = (f"the key {key!r}, which says what kind of section this is, is missing; allowed: {key}: "
                       f"{' or '.join(kinds) if kinds else 'a kind the config reference lists'}")
        elif err["type"] == "union_tag_invalid":
            message = f"unknown type {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}"
        message = _with_allowed(message)
        scalar = document.scalars.get(loc) if document is not None else None
        if scalar is not None and err["type"] in _TYPE_ERRORS:
            message += _yaml_hint(scalar)
        value = err.get("input") if err["type"] != "missing" else None
        if isinstance(value, (dict, list)):
            value = None
        problems.append(ConfigProblem(str(path), field, message, value))
    return problems


def parse_model(model: type[BaseModel], path: Path, data: dict[str, Any] | YamlDocument) -> Any:
    """Validate ``data`` (read from ``path``; a :class:`YamlDocument` also explains YAML's readings)
    as ``model``; ConfigError lists every problem."""
    document = data if isinstance(data, YamlDocument) else None
    values = document.data if document is not None else data
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_problems_from_validation(path, exc, document, values, model)) from None


def load_platform(path: Path) -> PlatformConfig:
    """Parse ``platform.yaml``. Raises :class:`ConfigError` naming file, field and allowed values."""
    return parse_model(PlatformConfig, path, read_yaml_document(Path(path)))


def load_business_line(path: Path) -> BusinessLineConfig:
    """Parse one business-line file; its ``name`` defaults to the file stem and must equal it.

    Raises:
        ConfigError: invalid file, or a ``name`` that differs from the file stem.
    """
    path = Path(path)
    document = read_yaml_document(path)
    stem = path.stem
    if "name" in document.data and document.data["name"] != stem:
        raise ConfigError([ConfigProblem(str(path), "name", f"must equal the file name {stem!r}; allowed: {stem!r}, "
                                                                 "or no name key",
                                         document.data["name"])])
    document.data.setdefault("name", stem)
    return read_hot_prefix_files(path, parse_model(BusinessLineConfig, path, document))


#: What a prefix file must be, for messages.
_PREFIX_FILE_ALLOWED = "a UTF-8 text file, its path relative to the directory of the line's file"


def read_hot_prefix_files(path: Path, line: BusinessLineConfig) -> BusinessLineConfig:
    """``line`` with the text of every prefix file of ``hot_prefixes`` read (the files are relative to
    ``path``'s directory), then the text of all its prefixes checked: each non-empty and free of
    control characters (:func:`line_models.hot_prefix_text_problem`), together at most
    :data:`line_models.MAX_HOT_PREFIX_BYTES` bytes of UTF-8.

    The files are read here, with the config, so synthesis reads nothing else (and fails on nothing
    else); the returned line holds the text (``content`` / ``text``) beside the file's name.

    Raises:
        ConfigError: one problem per bad file or text, each naming ``path``, the field
            (``hot_prefixes.prefixes.<i>.messages.<j>.file`` or ``...<i>.file``), the prefix file and
            what is allowed: missing, a directory, a link to a file outside the line's directory, not
            readable, not UTF-8 (its line), empty, a control character (its line); and one for the
            total size.
    """
    problems: list[ConfigProblem] = []

    def read(file: str, field: str) -> str | None:
        target = path.parent / file
        home = path.parent.resolve()
        if os.path.lexists(target) and not target.resolve().is_relative_to(home):
            # A link out of the config: its text would land in the line's template and a ConfigMap
            # (issue 25), whatever file of this machine it names.
            problems.append(ConfigProblem(str(path), field, (
                f"{target} is a link to {target.resolve()}, outside {home}; allowed: a file inside the directory of "
                "the line's file (copy it there)")))
            return None
        try:
            text = read_text(target)
        except ConfigError as exc:
            for p in exc.problems:
                where = f" (line {p.line})" if p.line is not None else ""
                message = p.message.replace("allowed: a YAML file", f"allowed: {_PREFIX_FILE_ALLOWED}")
                problems.append(ConfigProblem(str(path), field, f"{target}{where}: {message}"))
            return None
        problem = line_models.hot_prefix_text_problem(text)
        if problem:
            problems.append(ConfigProblem(str(path), field, f"{target}: {problem}"))
            return None
        return text

    prefixes = []
    for i, prefix in enumerate(line.hot_prefixes.prefixes):
        base = f"hot_prefixes.prefixes.{i}"
        if prefix.messages:
            messages = []
            for j, message in enumerate(prefix.messages):
                if message.file is not None:
                    text = read(message.file, f"{base}.messages.{j}.file")
                    message = message.model_copy(update={"content": text})
                messages.append(message)
            prefix = prefix.model_copy(update={"messages": tuple(messages)})
        elif prefix.file is not None:
            prefix = prefix.model_copy(update={"text": read(prefix.file, f"{base}.file")})
        prefixes.append(prefix)
    if problems:
        raise ConfigError(problems)
    total = sum(len(t.encode("utf-8")) for p in prefixes for t in p.texts())
    if total > line_models.MAX_HOT_PREFIX_BYTES:
        sizes = ", ".join(f"{p.name} {sum(len(t.encode('utf-8')) for t in p.texts()):,}" for p in prefixes)
        raise ConfigError([ConfigProblem(
            str(path), "hot_prefixes.prefixes",
            f"the prefixes' text is {total:,} bytes of UTF-8 ({sizes}); allowed: at most "
            f"{line_models.MAX_HOT_PREFIX_BYTES:,} bytes per line (it travels in the line's CloudFormation template, "
            "docs/l2-cache.md 'Hot prefixes'): shorter or fewer prefixes")])
    if not prefixes:
        return line
    return line.model_copy(update={"hot_prefixes": line.hot_prefixes.model_copy(update={"prefixes": tuple(prefixes)})})


def hot_prefix_files(path: Path, line: BusinessLineConfig) -> set[Path]:
    """The prefix files ``line`` (read from ``path``) names, as paths beside ``path``."""
    files = set()
    for prefix in line.hot_prefixes.prefixes:
        for file in [m.file for m in prefix.messages] + [prefix.file]:
            if file is not None:
                files.add(path.parent / file)
    return files


def _looks_like_a_line(name: str) -> bool:
    """A name with a YAML suffix in another case or followed by more (``x.YAML``, ``x.yaml.txt``)."""
    parts = name.lower().split(".")[1:]
    return any(f".{part}" in YAML_SUFFIXES for part in parts)


def business_line_files(config_dir: Path, *, referenced: frozenset[Path] = frozenset()
                        ) -> tuple[list[Path], list[str], list[ConfigProblem]]:
    """The business-line files of ``config_dir``: ``business-lines/*.yaml`` and ``*.yml``, sorted.

    Returns:
        ``(files, ignored, problems)``: the files to load; one warning per entry left out, saying
        which and why (a dotfile such as macOS's ``._x.yaml`` or an editor's ``.x.yaml.swp``, or a
        name without a YAML suffix; not for an entry in ``referenced``, or a directory holding one: a
        line's prefix files, :func:`hot_prefix_files`); and one problem per entry that looks like a line but cannot be
        one (a directory named ``x.yaml``, a broken link, a link loop, a FIFO, no permission). A
        missing ``business-lines/`` holds no files (:func:`load_project` decides if that is allowed).
    """
    directory = config_dir / BUSINESS_LINES_DIR
    if not os.path.lexists(directory):
        return [], [], []
    problem = path_problem(directory, directory=True, allowed="a directory of <name>.yaml files, one per line")
    if problem is not None:
        return [], [], [problem]
    files: list[Path] = []
    ignored: list[str] = []
    problems: list[ConfigProblem] = []
    kept = {directory / p.relative_to(directory).parts[0] for p in referenced
            if p.is_relative_to(directory) and p != directory}
    for entry in sorted(directory.iterdir()):
        if entry in kept and entry.suffix not in YAML_SUFFIXES:
            continue
        if entry.name.startswith("."):
            ignored.append(f"ignored {entry}: a dotfile (hidden: macOS '._' metadata, an editor's file); a business "
                           "line's file name starts with a letter or digit")
        elif entry.suffix not in YAML_SUFFIXES and _looks_like_a_line(entry.name):
            # x.YAML, x.yaml.txt, x.yml.bak: meant as (or copied from) a line. Ignored, the line would
            # vanish with exit 0 and its deployed stack become an orphan that orphans.py deletes.
            problems.append(ConfigProblem(
                str(entry), "",
                f"{entry.name!r} looks like a business line's file but does not end in .yaml or .yml (lower case), "
                f"so it would be skipped and its line dropped; allowed: <name>.yaml or <name>.yml; rename it, or "
                f"move it out of {BUSINESS_LINES_DIR}/ if it is a copy"))
        elif entry.suffix not in YAML_SUFFIXES:
            ignored.append(f"ignored {entry}: not a .yaml or .yml file")
        else:
            problem = path_problem(entry, allowed="one YAML file per business line")
            if problem is None:
                files.append(entry)
            else:
                problems.append(problem)
    return files, ignored, problems


#: Longest CloudFormation stack name (CreateStack: "StackName ... 128 characters").
MAX_STACK_NAME = 128


def cross_check(
    platform: PlatformConfig, platform_path: Path, lines: list[tuple[Path, BusinessLineConfig]],
    *, check_node_fit: bool = True,
) -> list[ConfigProblem]:
    """Rules spanning files: instance types, taints, namespaces, autoscaling's Prometheus workspace
    (``observability.enabled``), a line on the gateway (``routing_strategy: gateway``) needs
    ``inference_operator.gateway.enabled``, L2 prerequisites (an L2 line's
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
        stack = f"{platform.project}-line-{line.name}"  # platform_config.stack_names.line_stack_prefix
        if len(stack) > MAX_STACK_NAME:
            problems.append(ConfigProblem(
                str(path), "name",
                f"the line's stack name {stack!r} is {len(stack)} characters; CloudFormation allows "
                f"{MAX_STACK_NAME}; allowed: a line name of at most {MAX_STACK_NAME - len(platform.project) - 6} "
                f"characters with project {platform.project!r} (or a shorter project)", line.name))
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
                str(path), "namespace", f"already used by {seen_ns[line.namespace]}; allowed: a namespace no other line uses",
                line.namespace))
        seen_ns.setdefault(line.namespace, path)
        if line.autoscaling is not None and not platform.observability.enabled:
            problems.append(ConfigProblem(
                str(path), "autoscaling",
                f"the autoscaling triggers read the line's metrics from the platform's Prometheus workspace, but "
                f"observability.enabled is false in {platform_path}, so there is none; allowed: observability.enabled "
                "true, or no autoscaling (a fixed replicas)"))
        if line.routing_strategy == GATEWAY_ROUTING and not platform.inference_operator.gateway.enabled:
            problems.append(ConfigProblem(
                str(path), "routing_strategy",
                f"the HyperPod Inference Gateway routes this line, but inference_operator.gateway.enabled is false "
                f"in {platform_path}, so the add-on runs no gateway; allowed: inference_operator.gateway.enabled "
                f"true in {platform_path}, or one of the operator's strategies ({', '.join(CRD_ROUTING_STRATEGIES)})",
                line.routing_strategy))
        if line.gateway != line_models.LineGatewayConfig() and not platform.curvine.enabled:
            problems.append(ConfigProblem(
                str(path), "gateway",
                f"a Kyverno policy writes gateway.jwt and gateway.weights into the line's InferenceGatewayConfig, "
                f"and the platform installs Kyverno with Curvine, but curvine.enabled is false in {platform_path}; "
                f"allowed: curvine.enabled true in {platform_path}, or no gateway section"))
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
                    f"(curvine.worker_instance_groups in {platform_path}); allowed: an instance type whose group "
                    "runs Workers, or cache.l2_enabled: false", line.instance_type))
        serving_groups = [g for g in platform.hyperpod.instance_groups if g.instance_type == line.instance_type]
        if serving_groups and not node_fit.schedulable_groups(platform, line.instance_type):
            problems.append(ConfigProblem(
                str(path), "instance_type",
                f"every instance group of this type ({', '.join(g.name for g in serving_groups)}) has a "
                f"NoSchedule/NoExecute taint in {platform_path}, and InferenceEndpointConfig has no "
                "tolerations field, so the line's pods could never schedule; allowed: a type with an untainted group",
                line.instance_type))
        schedulable = node_fit.schedulable_groups(platform, line.instance_type)
        if schedulable and not any(g.instance_count for g in schedulable):
            names = ", ".join(g.name for g in schedulable)
            with_nodes = sorted({g.instance_type for g in platform.hyperpod.instance_groups if g.instance_count}
                                - {line.instance_type})
            problems.append(ConfigProblem(
                str(path), "instance_type",
                f"the instance group(s) of this type the line's pods can use ({names}) have instance_count 0 in "
                f"{platform_path}, so its {line.replicas} replica(s) would have no node; allowed: instance_count 1 "
                f"or more on {names}" + (f", or a type with nodes ({', '.join(with_nodes)})" if with_nodes else ""),
                line.instance_type))
        problems.extend(hot_prefix_platform_problems(platform, platform_path, path, line))
        # No rule ties L1 to Tiered Storage: L1 is LMCache's own buffer in the vLLM process's memory
        # (inside resources.memory); Tiered Storage's share belongs to the ai-toolkit daemon, whose
        # sagemaker-hyperpod:// L2 this platform replaces with Curvine (docs/l2-cache.md, "L1 is not Tiered Storage").
    if check_node_fit:
        problems.extend(node_fit_problems(platform, platform_path, lines))
    problems.extend(_l2_pool_problems(platform, platform_path, lines))
    return problems


#: Oldest Python of the L2 janitor's image that names hot-prefix chunks as the vLLM image does: the
#: chain of chunk keys starts from ``hash(str(PYTHONHASHSEED))``, and CPython hashes ``str`` with
#: SipHash-1-3 since 3.11 (SipHash-2-4 before); the pinned vLLM image runs Python 3.12
#: (docs/l2-cache.md, "Hot prefixes"; docs/sources.md).
HOT_PREFIX_MIN_PYTHON = (3, 11)


def hot_prefix_platform_problems(platform: PlatformConfig, platform_path: Path, path: Path,
                                 line: BusinessLineConfig) -> list[ConfigProblem]:
    """Rules between a line's ``hot_prefixes`` and the platform: the pinned share must stay below
    ``curvine.eviction.low_watermark`` (or eviction could never reach it), and the janitor's image,
    which names the chunks, must be a Python of the vLLM image's hash family (>= 3.11) when its tag
    says which Python it is (``python:<major>.<minor>...``)."""
    if not line.hot_prefixes.active or not line.cache.l2_enabled:
        return []
    problems = []
    low = platform.curvine.eviction.low_watermark
    if line.hot_prefixes.max_l2_fraction >= low:
        problems.append(ConfigProblem(
            str(path), "hot_prefixes.max_l2_fraction",
            f"pinned chunks are never evicted, so pinning {line.hot_prefixes.max_l2_fraction:g} of l2_size would leave "
            f"the janitor unable to reach curvine.eviction.low_watermark {low:g} ({platform_path}); allowed: "
            f"below {low:g}", line.hot_prefixes.max_l2_fraction))
    image = platform.versions.images.l2_janitor
    match = re.match(r"^(?:docker\.io/)?(?:library/)?python:(\d+)\.(\d+)", image)
    if match and (int(match.group(1)), int(match.group(2))) < HOT_PREFIX_MIN_PYTHON:
        problems.append(ConfigProblem(
            str(platform_path), "versions.images.l2_janitor",
            f"business line {line.name} declares hot prefixes, whose chunk names the janitor computes with "
            f"Python's own str hash, which changed in 3.11; allowed: a python image of 3.11 or later (the vLLM "
            f"image runs 3.12)", image))
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
        if not fit.nodes:  # every group of the type has instance_count 0: cross_check names the lines
            continue
        budgets = fit.budgets()
        budget_text = " | ".join(
            (f"group {b.group}: " if len(budgets) > 1 else "") + b.describe() for b in budgets)
        for path, line, field, message, allowed in fit.too_big:
            value = line.resources.memory if field == "resources.memory" else line.resources.cpu
            problems.append(ConfigProblem(
                str(path), field, f"{message} (a node in {platform_path}: {budget_text}); allowed: {allowed}", value))
        if fit.unplaced:
            first = fit.unplaced[0]
            replicas = {l.name: l.max_replica_count for _, l in fit.lines}
            wanted = ", ".join(f"{l.name} {l.max_replica_count}{' (autoscaling.max_replicas)' if l.autoscaling else ''} "
                               f"x ({node_fit.replica_of(l).describe()})" for _, l in fit.lines)
            free = "; ".join(f"node {i + 1}: {text}" for i, text in enumerate(first.free_then[:4]))
            if len(first.free_then) > 4:
                free += f"; ... ({len(first.free_then) - 4} more)"
            names = ", ".join(dict.fromkeys(u.replica.line for u in fit.unplaced))
            lower_max = (" or autoscaling.max_replicas" if any(l.autoscaling for _, l in fit.lines) else "")
            problems.append(ConfigProblem(
                str(fit.lines[0][0].parent), "replicas",
                f"the lines on {fit.instance_type} ({wanted}) do not fit on its {len(fit.nodes)} node(s) in "
                f"{platform_path}: a node has {budget_text}; first that does not fit: {first.replica.line} "
                f"replica {first.replica.index} of {replicas[first.replica.line]} ({first.replica.describe()}), "
                f"when the nodes had free {free}; lines left out: {names}; allowed: raise instance_count, or "
                f"lower replicas{lower_max}, resources.cpu or resources.memory (scripts/plan.py --business-line shows "
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
    total = sum(fields.quantity_bytes(l.cache.l2_size) for _, l in l2_lines) / 2**30
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
    parent = Path(line_file).parent
    if parent.resolve().name == BUSINESS_LINES_DIR and (parent / ".." / PLATFORM_FILE).is_file():
        return parent.parent if parent.name == BUSINESS_LINES_DIR else parent.resolve().parent
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


#: A check above the config layer that ``load_project`` runs on the lines without other problems:
#: ``(platform, [(file, line), ...]) -> (problems, warnings)``. The planner's fit
#: (:func:`capacity.project_checks.model_fit_problems`) is one; the config layer knows only this shape.
LineCheck = Callable[[PlatformConfig, list[tuple[Path, BusinessLineConfig]]], tuple[list[ConfigProblem], list[str]]]


def source_warnings(path: Path, line: BusinessLineConfig) -> list[str]:
    """What a valid line should still be told: a Hugging Face model without ``commit_sha``; hot
    prefixes declared on a line without L2 (nothing warms or keeps them); a line routed by the
    Inference Gateway without ``gateway.jwt`` (the gateway then accepts any request that reaches it:
    AWS's gateway guide, docs/sources.md §31)."""
    unauthenticated = [] if line.routing_strategy != GATEWAY_ROUTING or line.gateway.jwt is not None else [
        f"{path}: routing_strategy is gateway without gateway.jwt, so the gateway accepts any request that reaches "
        "it; set gateway.jwt (issuer, remote_jwks_uri, audiences) to require a token (docs/routing.md)"]
    return unauthenticated + _model_warnings(path, line)


def _model_warnings(path: Path, line: BusinessLineConfig) -> list[str]:
    warnings = []
    if line.hot_prefixes.active and not line.cache.l2_enabled:
        warnings.append(f"{path}: hot_prefixes declares {len(line.hot_prefixes.prefixes)} prefix(es), but "
                        "cache.l2_enabled is false: they are kept in L2, so nothing warms or keeps them until L2 is on")
    source = line.model.source
    if isinstance(source, line_models.HuggingFaceModelSource) and source.commit_sha is None:
        warnings.append(
            f"{path}: model.source.commit_sha is not set, so each pod downloads whatever revision of "
            f"{source.model_id} the Hub serves when it starts: after the repository changes, replicas serve "
            "different weights, and new pods read the old weights' KV from the line's L2 directory (its name "
            "covers the commit, not the weights) as cache hits; pin the 40-hex commit to rule this out")
    return warnings


def load_project(config_dir: str | Path = "config", *, line_checks: Sequence[LineCheck] = ()) -> ProjectConfig:
    """Load, validate and cross-check every config file under ``config_dir``.

    Layout: ``<config_dir>/platform.yaml`` and ``<config_dir>/business-lines/*.yaml`` (or ``.yml``;
    dotfiles and other names are left out with a warning, :func:`business_line_files`). A config
    without any business line is refused unless ``allow_no_business_lines: true`` says it is meant
    (``scripts/orphans.py --destroy`` would otherwise delete every deployed line stack).

    Args:
        line_checks: checks of a layer above (:data:`LineCheck`), run on the lines without other
            problems; every command loads through :func:`capacity.project_checks.load_checked_project`,
            which passes the planner's fit.

    Raises:
        ConfigError: every problem found across all files (not only the first), each naming the
            file, the field (or line), the bad value and the allowed values.
    """
    config_dir = Path(config_dir)
    dir_problem = path_problem(config_dir, directory=True,
                               allowed=f"a config directory holding {PLATFORM_FILE} and {BUSINESS_LINES_DIR}/")
    if dir_problem is not None:
        raise ConfigError([dir_problem])
    platform_path = config_dir / PLATFORM_FILE
    problems: list[ConfigProblem] = []
    platform: PlatformConfig | None = None
    other_spelling = platform_path.with_suffix(".yml")
    if not os.path.lexists(platform_path) and other_spelling.is_file():
        problems.append(ConfigProblem(str(platform_path), "", f"no such file, but {other_spelling.name} is there; "
                                                              f"allowed: the name {PLATFORM_FILE} (rename it)"))
    else:
        try:
            platform = load_platform(platform_path)
        except ConfigError as exc:
            problems.extend(exc.problems)

    lines: list[tuple[Path, BusinessLineConfig]] = []
    line_files, warnings, listing_problems = business_line_files(config_dir)
    problems.extend(listing_problems)
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
    if not line_files and not listing_problems and platform is not None and not platform.allow_no_business_lines:
        problems.append(ConfigProblem(
            str(config_dir / BUSINESS_LINES_DIR), "",
            "no business line (no <name>.yaml file); allowed: at least one, or allow_no_business_lines: true in "
            f"{platform_path} when the platform is meant to run without lines (scripts/orphans.py --destroy then "
            "deletes every deployed line stack)"))
    if lines:  # the line's prefix files sit beside it: no "ignored" warning for them
        referenced = frozenset(f for path, line in lines for f in hot_prefix_files(path, line))
        warnings = business_line_files(config_dir, referenced=referenced)[1] if referenced else warnings
    for path, line in lines:
        warnings.extend(source_warnings(path, line))
    if platform is not None:
        problems.extend(cross_check(platform, platform_path, lines))
        # Only the lines without other problems (e.g. an instance type the platform lacks).
        named = {p.file for p in problems}
        clean = [(p, l) for p, l in lines if str(p) not in named]
        for check in line_checks:
            check_problems, check_warnings = check(platform, clean)
            problems.extend(check_problems)
            warnings.extend(check_warnings)
    if problems:
        raise ConfigError(problems)
    assert platform is not None
    return ProjectConfig(
        platform=platform,
        business_lines=tuple(sorted((l for _, l in lines), key=lambda l: l.name)),
        config_dir=config_dir,
        warnings=tuple(warnings),
    )
