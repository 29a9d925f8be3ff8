"""The API server's decision on one request under a rendered ValidatingAdmissionPolicy and its bindings.

No API server runs here, so the tests evaluate the policy the chart renders (never a copy of it)
with cel-python, following the admission steps of ``admissionregistration.k8s.io/v1`` as the
Kubernetes documentation ("Validating Admission Policy") and the ``Validation`` /
``MatchResources`` / ``MatchCondition`` API reference describe them (docs/sources.md §16):

1. a binding names the policy (``spec.policyName``), else the policy does not apply;
2. ``matchConstraints``: the request's operation, group, version and resource match a
   ``resourceRules`` entry; the namespace's labels match ``namespaceSelector``; the labels of the
   object *or* of the old object match ``objectSelector`` (for a DELETE the old object is the
   stored one and ``object`` is null);
3. every ``matchConditions`` expression is true, else the policy does not apply;
4. ``variables`` (evaluated here eagerly and in order: every variable the policy declares is used
   by its validation, so eager and lazy evaluation give the same answer);
5. each ``validations`` expression must be true; a false one denies with ``messageExpression``
   (or ``message``) when the binding's ``validationActions`` contain ``Deny``, and adds that
   message as a warning when they contain ``Warn`` (the API server then counts it in
   ``apiserver_validating_admission_policy_check_total`` with ``enforcement_action`` ``deny`` or
   ``warn``: k8s.io/apiserver v0.34.0 ``pkg/admission/plugin/policy/validating/dispatcher.go``
   l.226-250);
6. an expression that fails to evaluate follows ``failurePolicy``: ``Ignore`` admits; ``Fail`` is
   a false validation, enforced by the same ``validationActions`` (the API reference of
   ``ValidatingAdmissionPolicyBinding.validationActions``).

Parameters (for :func:`k8s.network_policies.curvine_egress_required`): the policy's ``paramKind``
and a binding's ``paramRef`` by ``name`` without ``namespace``, looked up in the request's namespace
(for a namespaced request, as the API reference of ``ParamRef.namespace`` says); none found:
``parameterNotFoundAction`` ``Deny`` is a failed validation (enforced by ``validationActions``),
``Allow`` admits; ``params`` in CEL is the object found. A binding's ``matchResources`` is matched
like the policy's constraints (both must match).

Only the constructs :mod:`k8s.fuse_pod_guard` and :mod:`k8s.network_policies` emit are implemented; any other field raises
:class:`UnsupportedPolicy`, so a policy that grows a construct this file does not know fails the
tests instead of being half-simulated. Left out: ``matchPolicy`` (``Equivalent``; the rule names
the one version of pods), ``paramRef`` selectors, ``auditAnnotations``, CEL cost limits and type checking
(cel-python is dynamically typed; it also answers ``has(a.b.c)`` with false where ``a.b`` is
absent, where the API server's CEL errs, so the policy guards every level explicitly).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import celpy

SUPPORTED_POLICY_SPEC = {"failurePolicy", "matchConstraints", "matchConditions", "variables", "validations", "paramKind"}
SUPPORTED_MATCH = {"resourceRules", "namespaceSelector", "objectSelector"}
SUPPORTED_RULE = {"apiGroups", "apiVersions", "operations", "resources"}
SUPPORTED_SELECTOR = {"matchLabels", "matchExpressions"}
SUPPORTED_VALIDATION = {"expression", "message", "messageExpression", "reason"}
SUPPORTED_BINDING_SPEC = {"policyName", "validationActions", "paramRef", "matchResources"}
SUPPORTED_PARAM_REF = {"name", "parameterNotFoundAction"}


class UnsupportedPolicy(ValueError):
    """The policy uses a construct this evaluator does not implement."""


@dataclass(frozen=True)
class Decision:
    """The answer to one request: ``allowed``; ``applied`` (the policy matched and its conditions
    held); ``message`` of a denial; ``reason`` (``Forbidden``, or ``failed`` for an evaluation error);
    ``warnings``: the messages of failed validations a ``Warn`` binding returns to the client."""

    allowed: bool
    applied: bool
    message: str = ""
    reason: str = ""
    warnings: tuple[str, ...] = ()


def _only(obj: dict, allowed: set[str], where: str) -> None:
    unknown = set(obj) - allowed
    if unknown:
        raise UnsupportedPolicy(f"{where}: {sorted(unknown)} not implemented by tests/k8s/vap_eval.py")


@lru_cache(maxsize=None)
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def cel(expression: str, activation: dict[str, Any]) -> Any:
    """Evaluate ``expression`` with JSON-like values (converted with ``celpy.json_to_cel``; values
    already converted pass through). Raises ``celpy.CELEvalError`` on an evaluation error."""
    converted = {k: v if isinstance(v, celpy.celtypes.MapType) else celpy.json_to_cel(v) for k, v in activation.items()}
    return _program(expression).evaluate(converted)


def _cel_map(values: dict[str, Any]) -> Any:
    """``variables`` as a CEL map of already-evaluated CEL values."""
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in values.items()})


def _selector_matches(selector: dict | None, labels: dict[str, str], where: str) -> bool:
    if selector is None:
        return True
    _only(selector, SUPPORTED_SELECTOR, where)
    operators = {"In": lambda key, values: labels.get(key) in values,
                 "NotIn": lambda key, values: labels.get(key) not in values,
                 "Exists": lambda key, values: key in labels,
                 "DoesNotExist": lambda key, values: key not in labels}
    return (all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
            and all(operators[e["operator"]](e["key"], e.get("values", [])) for e in selector.get("matchExpressions", [])))


def _rule_matches(rule: dict, request: dict) -> bool:
    _only(rule, SUPPORTED_RULE, "resourceRules[]")
    resource = request["resource"]
    sub = request.get("subResource") or ""
    name = f"{resource['resource']}/{sub}" if sub else resource["resource"]

    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    return (has(rule["operations"], request["operation"]) and has(rule["apiGroups"], resource["group"])
            and has(rule["apiVersions"], resource["version"]) and has(rule["resources"], name))


def evaluate(policy: dict, bindings: list[dict], *, request: dict, old_object: dict | None,
             obj: dict | None, namespace_labels: dict[str, str],
             params: dict[tuple[str, str], dict] | None = None) -> Decision:
    """The decision of ``policy`` (with those of ``bindings`` that name it) on ``request``.

    Args:
        policy: a rendered ``ValidatingAdmissionPolicy``.
        bindings: rendered ``ValidatingAdmissionPolicyBinding`` objects (any policy's).
        request: the admission request as CEL sees it: ``operation``, ``namespace``, ``name``,
            ``userInfo.username``, ``resource`` (``group``, ``version``, ``resource``),
            ``subResource``.
        old_object / obj: the stored and the incoming object (a DELETE has no ``obj``).
        namespace_labels: the labels of the request's namespace.
        params: the objects of the policy's ``paramKind`` that exist, by (namespace, name).

    Raises:
        UnsupportedPolicy: a construct this evaluator does not implement.
    """
    spec = policy["spec"]
    _only(spec, SUPPORTED_POLICY_SPEC, "ValidatingAdmissionPolicy.spec")
    mine = [b for b in bindings if b["spec"]["policyName"] == policy["metadata"]["name"]]
    for b in mine:
        _only(b["spec"], SUPPORTED_BINDING_SPEC, "ValidatingAdmissionPolicyBinding.spec")
    if not mine:
        return Decision(allowed=True, applied=False)
    match = spec["matchConstraints"]
    _only(match, SUPPORTED_MATCH, "matchConstraints")
    labels_of = [((o or {}).get("metadata") or {}).get("labels") or {} for o in (obj, old_object) if o is not None]
    if not (any(_rule_matches(r, request) for r in match["resourceRules"])
            and _selector_matches(match.get("namespaceSelector"), namespace_labels, "namespaceSelector")
            and any(_selector_matches(match.get("objectSelector"), labels, "objectSelector") for labels in labels_of)):
        return Decision(allowed=True, applied=False)
    for b in mine:
        _only(b["spec"].get("matchResources", {}), {"namespaceSelector"}, "binding matchResources")
    mine = [b for b in mine if _selector_matches(b["spec"].get("matchResources", {}).get("namespaceSelector"),
                                                 namespace_labels, "binding namespaceSelector")]
    if not mine:
        return Decision(allowed=True, applied=False)

    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    activation: dict[str, Any] = {"request": request, "object": obj, "oldObject": old_object}
    deny = any("Deny" in b["spec"]["validationActions"] for b in mine)
    warn = any("Warn" in b["spec"]["validationActions"] for b in mine)

    def failed(what: str, error: Exception) -> Decision:
        message = f"{what}: {error}"
        if not fail_closed:
            return Decision(allowed=True, applied=True, message=message, reason="failed")
        return Decision(allowed=not deny, applied=True, message=message, reason="failed",
                        warnings=(message,) if warn else ())

    for condition in spec.get("matchConditions", []):
        try:
            if not bool(cel(condition["expression"], activation)):
                return Decision(allowed=True, applied=False)
        except celpy.CELEvalError as error:
            return failed(f"matchCondition {condition['name']}", error)
    refs = [b["spec"]["paramRef"] for b in mine if "paramRef" in b["spec"]]
    if refs:
        if "paramKind" not in spec:
            raise UnsupportedPolicy("a binding's paramRef needs the policy's paramKind")
        (ref,) = refs
        _only(ref, SUPPORTED_PARAM_REF, "paramRef")
        found = (params or {}).get((request["namespace"], ref["name"]))
        if found is None:
            if ref.get("parameterNotFoundAction", "Deny") == "Allow":
                return Decision(allowed=True, applied=True)
            message = f"no {spec['paramKind']['kind']} {ref['name']} in namespace {request['namespace']}"
            return Decision(allowed=not deny, applied=True, message=message, reason="ParamNotFound")
        activation["params"] = found
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):
        try:
            variables[variable["name"]] = cel(variable["expression"], {**activation, "variables": _cel_map(variables)})
        except celpy.CELEvalError as error:
            return failed(f"variable {variable['name']}", error)
    activation["variables"] = _cel_map(variables)
    warnings: list[str] = []
    for validation in spec["validations"]:
        _only(validation, SUPPORTED_VALIDATION, "validations[]")
        try:
            ok = bool(cel(validation["expression"], activation))
        except celpy.CELEvalError as error:
            return failed("validation", error)
        if ok:
            continue
        message = validation.get("message", "")
        if "messageExpression" in validation:
            try:
                message = str(cel(validation["messageExpression"], activation))
            except celpy.CELEvalError:
                pass  # the API server falls back to the static message
        if deny:
            return Decision(allowed=False, applied=True, message=message, reason=validation.get("reason", "Invalid"),
                            warnings=tuple(warnings + [message] if warn else warnings))
        if warn:
            warnings.append(message)
    return Decision(allowed=True, applied=True, warnings=tuple(warnings))
