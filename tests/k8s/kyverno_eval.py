"""A faithful evaluator of the subset of Kyverno mutate policies that ``k8s.kyverno`` emits.

No Kyverno binary is installable here (not on PyPI/npm), so the tests apply the policy with
this evaluator instead. It implements exactly the constructs our policy uses, with Kyverno's
semantics as documented for kyverno.io/v1 (1.10+), and rejects anything else, so a policy that
grows a construct this file does not know fails the tests rather than being half-simulated:

* ``match.any[].resources``: ``kinds``, ``operations``, ``names`` (Kyverno's wildcards ``*`` and
  ``?``), ``selector.matchLabels``; a namespaced ``Policy`` sees only its own namespace. Any kind,
  not only Pods (the gateway line's Policy mutates an ``InferenceGatewayConfig``).
* rules applied in declaration order, each on the result of the previous one; rule-level
  ``preconditions``.
* ``mutate.patchesJson6902`` (a YAML/JSON string of RFC 6902 ops, applied with ``jsonpatch``).
* ``mutate.foreach[]``: ``list`` (JMESPath), ``order`` (Ascending|Descending),
  ``preconditions``, nested ``foreach``, ``patchesJson6902``; variables ``element``,
  ``elementIndex`` and, per nesting level N, ``elementN`` / ``elementIndexN``.
* preconditions ``any`` / ``all`` (both must hold when both are given) with operators
  ``Equals``, ``NotEquals``, ``AnyIn``, ``AnyNotIn``.
* ``{{ }}`` substitution with JMESPath (``jmespath``), plus Kyverno's ``random(pattern)`` for
  patterns of the form ``[class]{n}``, ``parse_json``, ``trim_prefix``, ``lookup``, ``subtract``
  (numbers only) and go-jmespath's ``to_string`` (Go's ``json.Marshal``: keys sorted, compact).

``refresh_context`` chooses whether ``request.object`` is re-read after each rule and foreach
entry (Kyverno re-reads it; the policy is written so the result is the same either way, and the
tests run both).
"""

from __future__ import annotations

import copy
import json
import random as _random
import re
from typing import Any, Callable

import jmespath
import jsonpatch
import yaml
from jmespath import functions

#: Kyverno's variable regex (one level of nested braces, as in ``random('[a-z]{8}')``).
VARIABLE = re.compile(r"\{\{(\{[^{}]*\}|[^{}])*\}\}")

_RULE_KEYS = {"name", "match", "mutate", "preconditions"}
_MUTATE_KEYS = {"foreach", "patchesJson6902"}
_FOREACH_KEYS = {"list", "order", "preconditions", "foreach", "patchesJson6902"}
_RESOURCE_KEYS = {"kinds", "operations", "names", "selector"}
_SPEC_KEYS = {"background", "admission", "applyRules", "webhookConfiguration", "rules"}
_OPERATORS = {"Equals", "NotEquals", "AnyIn", "AnyNotIn"}


class UnsupportedPolicy(ValueError):
    """The policy uses a construct this evaluator does not implement."""


def _wildcard_match(name: str, pattern: str) -> bool:
    """Kyverno's name wildcards: ``*`` any run, ``?`` one character, everything else literal (its
    ``wildcard.Match``; fnmatch would also read ``[...]`` as a class)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, flags=re.DOTALL) is not None


def _strict(obj: dict, allowed: set[str], where: str) -> None:
    unknown = set(obj) - allowed
    if unknown:
        raise UnsupportedPolicy(f"{where}: unsupported keys {sorted(unknown)}")


def _random_from_pattern(pattern: str, rng: _random.Random) -> str:
    m = re.fullmatch(r"\[([^\]]+)\]\{(\d+)\}", pattern)
    if not m:
        raise UnsupportedPolicy(f"random({pattern!r}): only [class]{{n}} patterns are simulated")
    chars = []
    spec = m.group(1)
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            chars += [chr(c) for c in range(ord(spec[i]), ord(spec[i + 2]) + 1)]
            i += 3
        else:
            chars.append(spec[i])
            i += 1
    return "".join(rng.choice(chars) for _ in range(int(m.group(2))))


def _functions(rng: _random.Random) -> functions.Functions:
    class KyvernoFunctions(functions.Functions):
        @functions.signature({"types": ["string"]})
        def _func_random(self, pattern: str) -> str:
            return _random_from_pattern(pattern, rng)

        # Kyverno v1.15.2 pkg/engine/jmespath/functions.go: jpParseJson is Go's json.Unmarshal.
        @functions.signature({"types": ["string"]})
        def _func_parse_json(self, text: str) -> Any:
            return json.loads(text)

        # jpfTrimPrefix: strings.TrimPrefix.
        @functions.signature({"types": ["string"]}, {"types": ["string"]})
        def _func_trim_prefix(self, text: str, prefix: str) -> str:
            return text[len(prefix):] if text.startswith(prefix) else text

        # jpLookup: a key of an object, or an index of an array (a whole number; null when out of range).
        @functions.signature({"types": ["object", "array"]}, {"types": ["string", "number"]})
        def _func_lookup(self, obj: Any, key: Any) -> Any:
            if isinstance(obj, dict):
                if not isinstance(key, str):
                    raise UnsupportedPolicy("lookup: an object needs a string key")
                return obj.get(key)
            if isinstance(key, str) or isinstance(key, bool) or float(key) != int(key):
                raise UnsupportedPolicy("lookup: an array needs a whole-number index")
            index = int(key)
            return obj[index] if 0 <= index < len(obj) else None

        # arithmetic.go jpSubtract, numbers only (quantities and durations are not simulated).
        @functions.signature({"types": ["number"]}, {"types": ["number"]})
        def _func_subtract(self, a: float, b: float) -> float:
            return float(a) - float(b)

        # go-jmespath's to_string: a string as is, anything else Go's json.Marshal (object keys
        # sorted, no spaces, <, > and & escaped as \u003c, \u003e, \u0026).
        @functions.signature({"types": []})
        def _func_to_string(self, value: Any) -> str:
            if isinstance(value, str):
                return value
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")

    return KyvernoFunctions()


class _Context:
    def __init__(self, rng: _random.Random):
        self.options = jmespath.Options(custom_functions=_functions(rng))
        self.vars: dict[str, Any] = {}

    def search(self, expr: str) -> Any:
        return jmespath.search(expr, self.vars, options=self.options)

    def substitute(self, text: str) -> Any:
        """Kyverno substitution: a lone variable keeps its JSON type; embedded ones become text."""
        stripped = text.strip()
        m = VARIABLE.fullmatch(stripped)
        if m:
            return self.search(stripped[2:-2].strip())

        def repl(match: re.Match) -> str:
            value = self.search(match.group(0)[2:-2].strip())
            if value is None:
                raise UnsupportedPolicy(f"variable {match.group(0)} resolved to null")
            return value if isinstance(value, str) else json.dumps(value)
        return VARIABLE.sub(repl, text)


def _equals(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _condition(ctx: _Context, cond: dict) -> bool:
    _strict(cond, {"key", "operator", "value"}, "condition")
    op = cond["operator"]
    if op not in _OPERATORS:
        raise UnsupportedPolicy(f"operator {op}")
    key = ctx.substitute(cond["key"]) if isinstance(cond["key"], str) else cond["key"]
    value = cond["value"]
    if op == "Equals":
        return _equals(key, value)
    if op == "NotEquals":
        return not _equals(key, value)
    keys = key if isinstance(key, list) else [key]
    values = value if isinstance(value, list) else [value]
    hit = any(any(_equals(k, v) for v in values) for k in keys)
    return hit if op == "AnyIn" else any(not any(_equals(k, v) for v in values) for k in keys)


def _preconditions(ctx: _Context, pre: dict | None) -> bool:
    if not pre:
        return True
    _strict(pre, {"any", "all"}, "preconditions")
    ok = True
    if "any" in pre:
        ok = ok and any(_condition(ctx, c) for c in pre["any"])
    if "all" in pre:
        ok = ok and all(_condition(ctx, c) for c in pre["all"])
    return ok


def _apply_patch(ctx: _Context, doc: dict, patch_text: str) -> dict:
    ops = yaml.safe_load(ctx.substitute(patch_text))
    return jsonpatch.apply_patch(doc, ops)


def _matches(policy: dict, rule: dict, pod: dict, operation: str) -> bool:
    if policy["kind"] == "Policy" and pod["metadata"].get("namespace") != policy["metadata"]["namespace"]:
        return False
    match = rule["match"]
    _strict(match, {"any"}, "match")
    for entry in match["any"]:
        _strict(entry, {"resources"}, "match.any[]")
        res = entry["resources"]
        _strict(res, _RESOURCE_KEYS, "match.any[].resources")
        if pod["kind"] not in res["kinds"] or operation not in res.get("operations", [operation]):
            continue
        if "names" in res and not any(_wildcard_match(pod["metadata"].get("name", ""), n) for n in res["names"]):
            continue
        labels = pod["metadata"].get("labels") or {}
        selector = res.get("selector") or {}
        _strict(selector, {"matchLabels"}, "selector")
        if all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
            return True
    return False


def apply_policy(policy: dict, pod: dict, *, operation: str = "CREATE", refresh_context: bool = True,
                 seed: int | None = None) -> dict:
    """Return ``pod`` as Kyverno would admit it under ``policy`` (the input is not modified).

    Raises:
        UnsupportedPolicy: a construct outside the simulated subset.
        jsonpatch.JsonPatchException / jsonpointer.JsonPointerException: a patch that Kyverno
            would also fail to apply (Kyverno then rejects the Pod, failurePolicy Fail).
    """
    _strict(policy["spec"], _SPEC_KEYS, "spec")
    rng = _random.Random(seed)
    original = copy.deepcopy(pod)
    doc = copy.deepcopy(pod)
    for rule in policy["spec"]["rules"]:
        _strict(rule, _RULE_KEYS, f"rule {rule.get('name')}")
        if not _matches(policy, rule, doc, operation):
            continue
        ctx = _Context(rng)
        ctx.vars = {"request": {"object": doc if refresh_context else original, "operation": operation}}
        if not _preconditions(ctx, rule.get("preconditions")):
            continue
        mutate = rule["mutate"]
        _strict(mutate, _MUTATE_KEYS, "mutate")
        if "patchesJson6902" in mutate:
            doc = _apply_patch(ctx, doc, mutate["patchesJson6902"])
        for entry in mutate.get("foreach", []):
            if refresh_context:
                ctx.vars["request"]["object"] = doc
            doc = _foreach(ctx, entry, doc, depth=0)
    return doc


def _foreach(ctx: _Context, entry: dict, doc: dict, *, depth: int) -> dict:
    _strict(entry, _FOREACH_KEYS, "foreach")
    items = ctx.search(entry["list"])
    if items is None:
        items = []
    if not isinstance(items, list):
        raise UnsupportedPolicy(f"foreach list {entry['list']!r} is not a list")
    order = entry.get("order", "Ascending")
    indices: Callable = reversed if order == "Descending" else (lambda r: r)
    saved = dict(ctx.vars)
    for i in indices(range(len(items))):
        ctx.vars = {**saved, "element": items[i], "elementIndex": i, f"element{depth}": items[i],
                    f"elementIndex{depth}": i}
        if not _preconditions(ctx, entry.get("preconditions")):
            continue
        if "foreach" in entry:
            for nested in entry["foreach"]:
                doc = _foreach(ctx, nested, doc, depth=depth + 1)
                ctx.vars = {**saved, "element": items[i], "elementIndex": i, f"element{depth}": items[i],
                            f"elementIndex{depth}": i}
        if "patchesJson6902" in entry:
            doc = _apply_patch(ctx, doc, entry["patchesJson6902"])
    ctx.vars = saved
    return doc
