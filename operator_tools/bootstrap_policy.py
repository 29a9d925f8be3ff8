"""Least-privilege policies for the CDK bootstrap's CloudFormation execution role, from the templates.

``cdk bootstrap`` attaches ``AdministratorAccess`` to the role CloudFormation deploys every stack
with (``cdk-<qualifier>-cfn-exec-role-<account>-<region>``) unless
``--cloudformation-execution-policies`` names other managed policies (issue 25, low item). This
module writes those policies from the synthesized cloud assembly (``make synth``'s ``cdk.out``),
offline:

* **Every resource type** of every stack template (nested stack templates and nested assemblies
  too) is collected. For each, the CloudFormation registry schema that cfn-lint ships for the
  deployment region lists, per handler, the IAM actions the handler calls; the ``create``,
  ``read``, ``update`` and ``delete`` handlers' actions are unioned (:data:`HANDLER_OPERATIONS`;
  ``list`` serves resource listing, which no stack operation calls).
* **Types without handlers** are refused (:class:`UncoveredTypeError`, naming each) unless
  :data:`SPECIAL_TYPES` says what they need: ``AWS::CDK::Metadata`` nothing, a custom resource
  (``AWS::CloudFormation::CustomResource``, ``Custom::*``) ``lambda:InvokeFunction`` on its service
  token's function (CloudFormation invokes it as the execution role), or ``sns:Publish`` when the
  token is a topic of the same template.
* **Regional actions** carry ``aws:RequestedRegion`` equal to the deployment region; the services
  of :data:`GLOBAL_SERVICES` (one endpoint in another region, or a home region of their own) do not.
* **``iam:PassRole``** is never granted on its own: one statement allows it on the account's roles
  only with ``iam:PassedToService`` among the services the templates pass roles to (every
  ``Service`` principal that a role of the templates trusts, and the service of each resource that
  names a role, :data:`PASSED_TO_SERVICE`).
* **Handler gaps**: an action a handler calls that its schema omits goes into
  :data:`EXTRA_PERMISSIONS`, with where it was seen.
* **Parameters** of type ``AWS::SSM::Parameter::Value<...>`` (the CDK's ``BootstrapVersion``) are
  resolved by CloudFormation: ``ssm:GetParameters`` on each one's default name.

The actions are grouped by service into statements, and the statements packed into documents of
at most :data:`MAX_POLICY_CHARS` characters (whitespace not counted, as IAM counts), a service too
large for one document split across two. More than :data:`MAX_POLICIES_PER_ROLE` documents is an
error: the role could not hold them. No action is ``*`` or ``<service>:*``
(:func:`check_no_wildcards`).

Nothing here calls AWS: the schemas are cfn-lint's package data
(:func:`cfnlint.schema.manager.ProviderSchemaManager` over the bundled directories, found with
``importlib.resources``), never its download cache.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from operator_tools.cli import ToolError

#: IAM's limit on a customer-managed policy document, in characters without whitespace
#: (IAM and STS quotas, docs/sources.md §33).
MAX_POLICY_CHARS = 6144
#: Managed policies a role may have attached by default (same page; adjustable by a quota request).
MAX_POLICIES_PER_ROLE = 10
#: The handlers whose permissions a stack operation needs: CloudFormation creates, reads (before an
#: update, for drift, after create), updates and deletes; ``list`` is resource listing only.
HANDLER_OPERATIONS = ("create", "read", "update", "delete")

CUSTOM_RESOURCE = "AWS::CloudFormation::CustomResource"
NESTED_STACK = "AWS::CloudFormation::Stack"

#: Types whose schema has no handlers, and what the execution role needs for each (the reason
#: beside it). Every ``Custom::<name>`` type counts as :data:`CUSTOM_RESOURCE`.
SPECIAL_TYPES: dict[str, tuple[tuple[str, ...], str]] = {
    "AWS::CDK::Metadata": ((), "the CDK's version report: CloudFormation only stores it, no AWS API is called"),
    CUSTOM_RESOURCE: (("lambda:InvokeFunction",),
                      "CloudFormation invokes the service token's Lambda function as the execution role "
                      "(sns:Publish instead when the token is an SNS topic of the same template); the "
                      "function then works with its own role"),
}

#: Actions a type's handler was seen to call that its schema does not list, with where that was seen
#: (an ``AccessDenied`` in a stack's events names the action): added to the schema's. None yet.
EXTRA_PERMISSIONS: dict[str, tuple[tuple[str, ...], str]] = {}

#: Service prefixes whose actions get no ``aws:RequestedRegion`` condition, and why. IAM,
#: CloudFront, Route 53, Support, Organizations: a single endpoint in us-east-1 (IAM User Guide,
#: "Denies access to AWS based on the requested Region", docs/sources.md §33); STS: the global
#: endpoint is us-east-1 too; sso: IAM Identity Center answers in its home region, which need not
#: be the deployment region (Grafana's handler calls it for the workspace's sign-in).
GLOBAL_SERVICES: dict[str, str] = {
    "iam": "one endpoint, in us-east-1",
    "sts": "the global endpoint is in us-east-1",
    "organizations": "one endpoint, in us-east-1",
    "cloudfront": "one endpoint, in us-east-1",
    "route53": "one endpoint, in us-east-1",
    "support": "one endpoint, in us-east-1",
    "sso": "IAM Identity Center answers in its home region, which may differ from the deployment region",
}

#: The service a resource type passes a role to (``iam:PassedToService``), by type or type prefix.
#: Consulted for a resource whose properties name a role and whose handlers call ``iam:PassRole``;
#: such a type missing here is an error (:class:`UncoveredTypeError`) rather than a guess.
PASSED_TO_SERVICE: dict[str, str] = {
    "AWS::EKS::": "eks.amazonaws.com",
    "AWS::Lambda::": "lambda.amazonaws.com",
    "AWS::SageMaker::": "sagemaker.amazonaws.com",
    "AWS::Grafana::": "grafana.amazonaws.com",
    "AWS::EC2::FlowLog": "vpc-flow-logs.amazonaws.com",
    "AWS::CloudFormation::Stack": "cloudformation.amazonaws.com",
}

#: A property name that holds a role (``RoleArn``, ``ExecutionRole``, ``NodeRole``,
#: ``ServiceAccountRoleArn``, the flow log's ``DeliverLogsPermissionArn``, ...).
_ROLE_KEY = re.compile(r"role|DeliverLogsPermissionArn", re.IGNORECASE)
_SSM_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<"
#: An IAM action name: ``service:Action``. A schema's permission list holds the odd entry that is
#: not one (the log group's lists ``s3:REST.PUT.OBJECT``, an S3 access-log operation name); such
#: entries are left out and reported (:attr:`Collected.not_actions`), since no policy can grant them.
IAM_ACTION = re.compile(r"[a-z0-9-]+:[A-Za-z0-9]+")


class UncoveredTypeError(ToolError):
    """Resource types the schemas give no permissions for and no special case covers."""


@dataclass
class Collected:
    """What the templates of one assembly need: types, actions, passed-to services, extras."""

    types: dict[str, int] = field(default_factory=dict)  # type -> resources of it
    actions: set[str] = field(default_factory=set)
    passed_to: set[str] = field(default_factory=set)
    custom_resource_actions: set[str] = field(default_factory=set)
    ssm_parameters: set[str] = field(default_factory=set)
    templates: list[str] = field(default_factory=list)
    not_actions: dict[str, str] = field(default_factory=dict)  # schema entry that is no IAM action -> type


@dataclass(frozen=True)
class PolicyDocument:
    """One managed policy to create: its name, document and non-whitespace size."""

    name: str
    document: dict
    services: tuple[str, ...]

    @property
    def chars(self) -> int:
        return policy_chars(self.document)


def policy_chars(document: dict) -> int:
    """Characters of ``document`` as IAM counts them against its size quota: whitespace not counted."""
    return len(re.sub(r"\s", "", json.dumps(document)))


def partition(region: str) -> str:
    """The ARN partition of ``region``."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


# --- the assembly ------------------------------------------------------------------------------


def read_assembly(assembly: Path) -> tuple[dict[str, dict], str, str]:
    """(template path -> template, account, region) of every stack of ``assembly``, nested ones too.

    Raises:
        ToolError: no readable ``manifest.json``, no stack, or stacks of several or unresolved
            environments (the policies are per account and region).
    """
    templates: dict[str, dict] = {}
    environments: set[str] = set()
    _read_assembly_dir(Path(assembly), templates, environments)
    if not templates:
        raise ToolError(f"{assembly}: no stack templates in the cloud assembly; run `make synth` first")
    if len(environments) != 1:
        raise ToolError(f"{assembly}: stacks of {len(environments)} environments ({', '.join(sorted(environments))}); "
                        "the policies are written for one account and region")
    match = re.fullmatch(r"aws://(\d{12})/([a-z0-9-]+)", environments.pop())
    if not match:
        raise ToolError(f"{assembly}: the stacks' environment is not a concrete account and region")
    return templates, match.group(1), match.group(2)


def _read_assembly_dir(directory: Path, templates: dict[str, dict], environments: set[str]) -> None:
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolError(f"{directory}: not a cloud assembly ({exc}); run `make synth` first") from None
    for artifact in (manifest.get("artifacts") or {}).values():
        props = artifact.get("properties") or {}
        if artifact.get("type") == "aws:cloudformation:stack":
            environments.add(artifact.get("environment", ""))
            _read_template(directory, props["templateFile"], templates)
        elif artifact.get("type") == "cdk:cloud-assembly":  # a Stage
            _read_assembly_dir(directory / props["directoryName"], templates, environments)


def _read_template(directory: Path, name: str, templates: dict[str, dict]) -> None:
    path = directory / name
    try:
        template = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ToolError(f"{path}: unreadable template ({exc})") from None
    templates[str(path)] = template
    for logical_id, resource in (template.get("Resources") or {}).items():
        if resource.get("Type") == NESTED_STACK:
            nested = (resource.get("Metadata") or {}).get("aws:asset:path")
            if not nested:
                raise ToolError(f"{path}: nested stack {logical_id} has no aws:asset:path; its template "
                                "cannot be read offline")
            _read_template(directory, nested, templates)


# --- the schemas -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _schema_manager() -> Any:
    """cfn-lint's schema manager over the schemas bundled in the package (never its download cache)."""
    from importlib.resources import files

    from cfnlint.schema.manager import ProviderSchemaManager

    data = Path(str(files("cfnlint.data.schemas")))
    return ProviderSchemaManager(providers_dir=data / "providers", resources_dir=data / "resources")


def handler_permissions(resource_type: str, region: str) -> set[str] | None:
    """The union of ``resource_type``'s :data:`HANDLER_OPERATIONS` permissions in ``region``'s
    registry schema; None when the schema is missing or has no handlers."""
    from cfnlint.schema import ResourceNotFoundError

    if resource_type.startswith("Custom::"):
        return None
    try:
        schema = _schema_manager().get_resource_schema(region, resource_type).schema
    except ResourceNotFoundError:
        return None
    handlers = schema.get("handlers") or {}
    if not handlers:
        return None
    return {action for operation in HANDLER_OPERATIONS
            for action in (handlers.get(operation) or {}).get("permissions", [])}


def special_case(resource_type: str) -> str | None:
    """The :data:`SPECIAL_TYPES` key covering ``resource_type``, if any."""
    if resource_type.startswith("Custom::"):
        return CUSTOM_RESOURCE
    return resource_type if resource_type in SPECIAL_TYPES else None


def normalize_action(action: str) -> str:
    """``Service:Action`` with the service prefix lower-cased (IAM compares actions case-blind)."""
    service, _, name = action.partition(":")
    return f"{service.strip().lower()}:{name.strip()}"


def check_no_wildcards(actions: Iterable[str], where: str) -> None:
    """Refuse ``*`` and ``<service>:*``: the point is to grant less than everything.

    Raises:
        ToolError: naming the actions and ``where`` they came from.
    """
    bad = sorted(a for a in actions if a.strip() == "*" or a.split(":", 1)[-1].strip() == "*")
    if bad:
        raise ToolError(f"{where}: wildcard action(s) {', '.join(bad)}; list the actions instead")


# --- collection --------------------------------------------------------------------------------


def _service_principals(principal: Any) -> set[str]:
    """The ``Service`` principals of a trust statement's ``Principal`` (``Fn::Join`` with
    ``AWS::URLSuffix`` resolved to amazonaws.com)."""
    if not isinstance(principal, dict):
        return set()
    services = principal.get("Service")
    out = set()
    for item in services if isinstance(services, list) else [services]:
        if isinstance(item, str):
            out.add(item)
        elif isinstance(item, dict) and "Fn::Join" in item:
            sep, parts = item["Fn::Join"]
            text = [p if isinstance(p, str) else "amazonaws.com" if p == {"Ref": "AWS::URLSuffix"} else None
                    for p in parts]
            if None not in text:
                out.add(sep.join(text))  # type: ignore[arg-type]
    return out


def _names_role(value: Any, roles: set[str], key: str = "") -> bool:
    """Whether a property value (at any depth) names an IAM role: a ``Fn::GetAtt`` of a role of
    the template, or any value under a key that holds a role (:data:`_ROLE_KEY`)."""
    if isinstance(value, dict):
        getatt = value.get("Fn::GetAtt")
        if isinstance(getatt, list) and getatt and getatt[0] in roles:
            return True
        if key and _ROLE_KEY.search(key) and value:
            return True
        return any(_names_role(v, roles, k) for k, v in value.items())
    if isinstance(value, list):
        return any(_names_role(v, roles, key) for v in value)
    if isinstance(value, str):
        return bool(key and _ROLE_KEY.search(key) and value) or ":role/" in value
    return False


def passed_to_service(resource_type: str) -> str | None:
    """:data:`PASSED_TO_SERVICE`'s service for ``resource_type`` (exact type first, then prefix)."""
    if resource_type in PASSED_TO_SERVICE:
        return PASSED_TO_SERVICE[resource_type]
    for prefix, service in PASSED_TO_SERVICE.items():
        if prefix.endswith("::") and resource_type.startswith(prefix):
            return service
    return None


def collect(templates: dict[str, dict], region: str) -> Collected:
    """Every resource type of ``templates``, the handler actions they need and what they pass.

    Raises:
        UncoveredTypeError: one line per type without handlers and without a special case, and per
            type that passes a role to a service :data:`PASSED_TO_SERVICE` does not know.
    """
    out = Collected(templates=sorted(templates))
    uncovered: dict[str, str] = {}
    for path, template in sorted(templates.items()):
        resources = template.get("Resources") or {}
        roles = {lid for lid, r in resources.items() if r.get("Type") == "AWS::IAM::Role"}
        topics = {lid for lid, r in resources.items() if r.get("Type") == "AWS::SNS::Topic"}
        for name, parameter in (template.get("Parameters") or {}).items():
            if str(parameter.get("Type", "")).startswith(_SSM_PARAMETER_TYPE) and parameter.get("Default"):
                out.ssm_parameters.add(str(parameter["Default"]))
        for logical_id, resource in resources.items():
            rtype = resource.get("Type", "")
            out.types[rtype] = out.types.get(rtype, 0) + 1
            props = resource.get("Properties") or {}
            if rtype == "AWS::IAM::Role":
                for statement in (props.get("AssumeRolePolicyDocument") or {}).get("Statement", []):
                    out.passed_to |= _service_principals(statement.get("Principal"))
            permissions = handler_permissions(rtype, region)
            if permissions is None:
                special = special_case(rtype)
                if special is None:
                    uncovered.setdefault(rtype, f"{Path(path).name} {logical_id}")
                elif special == CUSTOM_RESOURCE:
                    token = props.get("ServiceToken")
                    target = token.get("Fn::GetAtt", [None])[0] if isinstance(token, dict) else None
                    by_ref = token.get("Ref") if isinstance(token, dict) else None
                    is_topic = target in topics or by_ref in topics or (
                        isinstance(token, str) and token.startswith("arn:") and ":sns:" in token)
                    out.custom_resource_actions.add("sns:Publish" if is_topic else "lambda:InvokeFunction")
                continue
            permissions = permissions | set(EXTRA_PERMISSIONS.get(rtype, ((), ""))[0])
            check_no_wildcards(permissions, f"the {rtype} schema's handlers")
            for action in map(normalize_action, permissions):
                if IAM_ACTION.fullmatch(action):
                    out.actions.add(action)
                else:
                    out.not_actions.setdefault(action, rtype)
            if "iam:passrole" in {a.lower() for a in permissions} and _names_role(props, roles):
                service = passed_to_service(rtype)
                if service is None:
                    uncovered.setdefault(rtype, f"{Path(path).name} {logical_id} passes a role to a service "
                                                "PASSED_TO_SERVICE does not name")
                else:
                    out.passed_to.add(service)
    if uncovered:
        lines = [f"{rtype} ({where})" for rtype, where in sorted(uncovered.items())]
        raise UncoveredTypeError(
            "no IAM permissions known for resource type(s) " + "; ".join(lines) + ": the cfn-lint schema has no "
            "handlers and operator_tools/bootstrap_policy.py has no special case (SPECIAL_TYPES, "
            "PASSED_TO_SERVICE); add one with its reason, then regenerate the policies")
    return out


# --- the documents -----------------------------------------------------------------------------


def _sid(service: str, part: int = 0) -> str:
    name = "".join(w.capitalize() for w in re.split(r"[^A-Za-z0-9]+", service) if w)
    return f"{name}{part}" if part else name


def statements(collected: Collected, account: str, region: str) -> list[dict]:
    """The statements of :func:`collect`'s result: one per service (``iam:PassRole`` and the extras
    separately), regional ones conditioned on ``aws:RequestedRegion``."""
    part = partition(region)
    in_region = {"StringEquals": {"aws:RequestedRegion": region}}
    by_service: dict[str, set[str]] = {}
    for action in collected.actions:
        if action.lower() == "iam:passrole":
            continue
        by_service.setdefault(action.split(":", 1)[0], set()).add(action)
    out = []
    for service in sorted(by_service):
        statement: dict[str, Any] = {"Sid": _sid(service), "Effect": "Allow",
                                     "Action": sorted(by_service[service], key=str.lower), "Resource": "*"}
        if service not in GLOBAL_SERVICES:
            statement["Condition"] = in_region
        out.append(statement)
    if collected.passed_to:
        out.append({"Sid": "PassRoleToServices", "Effect": "Allow", "Action": "iam:PassRole",
                    "Resource": f"arn:{part}:iam::{account}:role/*",
                    "Condition": {"StringEquals": {"iam:PassedToService": sorted(collected.passed_to)}}})
    if "lambda:InvokeFunction" in collected.custom_resource_actions:
        out.append({"Sid": "InvokeCustomResourceHandlers", "Effect": "Allow", "Action": "lambda:InvokeFunction",
                    "Resource": f"arn:{part}:lambda:{region}:{account}:function:*", "Condition": in_region})
    if "sns:Publish" in collected.custom_resource_actions:
        out.append({"Sid": "NotifyCustomResourceTopics", "Effect": "Allow", "Action": "sns:Publish",
                    "Resource": f"arn:{part}:sns:{region}:{account}:*", "Condition": in_region})
    if collected.ssm_parameters:
        out.append({"Sid": "ResolveSsmParameters", "Effect": "Allow", "Action": "ssm:GetParameters",
                    "Resource": [f"arn:{part}:ssm:{region}:{account}:parameter/{name.lstrip('/')}"
                                 for name in sorted(collected.ssm_parameters)],
                    "Condition": in_region})
    for statement in out:
        actions = statement["Action"]
        check_no_wildcards([actions] if isinstance(actions, str) else actions, f"statement {statement['Sid']}")
    return out


def _document(statement_list: list[dict]) -> dict:
    return {"Version": "2012-10-17", "Statement": statement_list}


def _split(statement: dict, limit: int) -> list[dict]:
    """``statement`` as one or more statements, each fitting a document of ``limit`` characters alone."""
    if policy_chars(_document([statement])) <= limit or isinstance(statement["Action"], str):
        return [statement]
    actions, parts, current = statement["Action"], [], []
    for action in actions:
        trial = {**statement, "Sid": f"{statement['Sid']}99", "Action": current + [action]}  # room for the suffix
        if current and policy_chars(_document([trial])) > limit:
            parts.append(current)
            current = []
        current.append(action)
    parts.append(current)
    return [{**statement, "Sid": f"{statement['Sid']}{i}", "Action": chunk} for i, chunk in enumerate(parts, 1)]


def pack(statement_list: list[dict], name_prefix: str, limit: int = MAX_POLICY_CHARS) -> list[PolicyDocument]:
    """Statements packed into as few documents of at most ``limit`` characters as first-fit
    (largest first) finds, named ``<name_prefix>-1``, ``-2``, ... ."""
    pieces = [piece for s in statement_list for piece in _split(s, limit)]
    pieces.sort(key=lambda s: (-policy_chars(_document([s])), s["Sid"]))
    bins: list[list[dict]] = []
    for piece in pieces:
        for chosen in bins:
            if policy_chars(_document(chosen + [piece])) <= limit:
                chosen.append(piece)
                break
        else:
            if policy_chars(_document([piece])) > limit:
                raise ToolError(f"statement {piece['Sid']} alone exceeds {limit} characters")
            bins.append([piece])
    documents = []
    for index, chosen in enumerate(sorted(bins, key=lambda b: min(s["Sid"] for s in b)), 1):
        chosen.sort(key=lambda s: s["Sid"])
        services = sorted({(a if isinstance(a, str) else a).split(":", 1)[0]
                           for s in chosen for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])})
        documents.append(PolicyDocument(f"{name_prefix}-{index}", _document(chosen), tuple(services)))
    return documents


@dataclass(frozen=True)
class Result:
    """What :func:`generate` produced for one assembly."""

    account: str
    region: str
    collected: Collected
    documents: list[PolicyDocument]

    @property
    def action_count(self) -> int:
        """Distinct actions granted, over every document."""
        found = set()
        for doc in self.documents:
            for s in doc.document["Statement"]:
                found |= {s["Action"]} if isinstance(s["Action"], str) else set(s["Action"])
        return len(found)


def generate(assembly: Path, name_prefix: str) -> Result:
    """The policy documents for the stacks of ``assembly`` (module docstring).

    Raises:
        ToolError: an unreadable assembly, an uncovered type, a wildcard, or more documents than
            a role may hold.
    """
    templates, account, region = read_assembly(assembly)
    return generate_from_templates(templates, account, region, name_prefix)


def generate_from_templates(templates: dict[str, dict], account: str, region: str, name_prefix: str) -> Result:
    """:func:`generate` for templates already read (tests pass the session's synthesized ones)."""
    collected = collect(templates, region)
    documents = pack(statements(collected, account, region), name_prefix)
    if len(documents) > MAX_POLICIES_PER_ROLE:
        raise ToolError(f"{len(documents)} policy documents needed, but a role holds at most "
                        f"{MAX_POLICIES_PER_ROLE} managed policies by default")
    return Result(account, region, collected, documents)


def policy_arn(result: Result, document: PolicyDocument) -> str:
    """The ARN ``aws iam create-policy`` gives ``document`` (no path)."""
    return f"arn:{partition(result.region)}:iam::{result.account}:policy/{document.name}"


def commands(result: Result, files: dict[str, Path], cdk: str = "node_modules/.bin/cdk") -> tuple[list[str], list[str]]:
    """(first time: ``aws iam create-policy`` per document then ``cdk bootstrap``; after a change:
    ``aws iam create-policy-version`` per document) for the documents written to ``files``."""
    create = [f"aws iam create-policy --policy-name {d.name} --policy-document file://{files[d.name]}"
              for d in result.documents]
    arns = ",".join(policy_arn(result, d) for d in result.documents)
    create.append(f"{cdk} bootstrap aws://{result.account}/{result.region} "
                  f"--cloudformation-execution-policies \"{arns}\"")
    update = [f"aws iam create-policy-version --policy-arn {policy_arn(result, d)} "
              f"--policy-document file://{files[d.name]} --set-as-default" for d in result.documents]
    return create, update
