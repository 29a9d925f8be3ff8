"""The Kyverno ``Policy`` that adds a gateway line's request authentication and scorer weights to the
``InferenceGatewayConfig`` the operator creates for it (``routing_strategy: gateway``; docs/routing.md).

Why a policy, not the object. The operator creates ``<line>-gateway`` (:func:`k8s.names.gateway_name`) in
the line's namespace and owns its scheduler entry: it writes ``name``, ``modelName``, ``targetPort`` and
``modelSelector``, values the platform cannot know, and merges the entry into ``spec.schedulers`` on every
reconciliation (AWS's gateway guide, docs/sources.md §31). A second author of the object or of that list
would fight it. A mutating admission policy instead amends the object each time it is created or updated,
whoever writes it, and leaves everything else as the writer sent it.

Two rules, only those the line configures (``gateway.jwt``, ``gateway.weights`` of
:class:`platform_config.line_models.LineGatewayConfig`):

1. ``set-request-auth``: ``spec.auth`` becomes ``{jwt: {provider: ...}}`` on every CREATE and UPDATE. The
   guide names no operator write to ``spec.auth``, so the platform owns it: the config is the truth, and a
   hand edit lasts only until the object's next update.
2. ``add-scheduler-weights``: a ``foreach`` over ``spec.schedulers`` adds ``weights`` to each entry that has
   neither ``weights`` nor ``configMapRef`` (the CRD refuses both on one entry) and, when ``lru`` is among
   them, whose ``scheduler`` is ``llm-d`` or unset (the CRD allows ``lru`` with ``llm-d`` only; ``llm-d`` is
   the default). Weights already on an entry are kept, and the operator preserves ``weights`` on its later
   reconciliations (the guide), so a hand-tuned entry stays hand-tuned. The gateway is the line's own
   (named after it, in its namespace), so every entry of it is the line's.

Written as ``foreach`` with ``patchesJson6902`` and preconditions, the constructs of the line's L2 policy
(:mod:`k8s.kyverno`), rather than a strategic-merge patch with an add-if-not-present anchor ``+(weights)``:
the list-element match of a strategic merge on a custom resource (no ``patchMergeKey`` in its schema)
depends on Kyverno's merge library, while a JSON patch at the iterated index does not, and
tests/k8s/kyverno_eval.py applies it offline.

Fail closed (``failurePolicy: Fail``), scoped by ``matchConditions`` to this one object: were Kyverno down,
admitting the gateway without its ``spec.auth`` would open it to any caller; instead only writes of
``<line>-gateway`` wait for Kyverno. ``background: false``: admission only (an object created before the
policy is amended at its next update; ``kubectl annotate`` it to force one).
"""

from __future__ import annotations

import json
from typing import Any, Final

from k8s import names
from k8s.kyverno import KYVERNO_API_VERSION, fail_closed_admission_spec
from platform_config import BusinessLineConfig

#: The ``InferenceGatewayConfig`` CRD (AWS's gateway guide, "InferenceGatewayConfig CRD reference").
GATEWAY_CONFIG_KIND: Final = "InferenceGatewayConfig"
GATEWAY_CONFIG_API_VERSION: Final = "inference.sagemaker.aws.amazon.com/v1alpha1"
GATEWAY_CONFIG_PLURAL: Final = "inferencegatewayconfigs"
#: ``weights.lru`` is valid only with this scheduler type, also the default (the guide's validation rules).
LRU_SCHEDULER: Final = "llm-d"


def _patch(ops: list[dict[str, Any]]) -> str:
    """A patchesJson6902 string (JSON is valid YAML and keeps ``{{ }}`` verbatim)."""
    return json.dumps(ops, indent=2) + "\n"


def _match(line: BusinessLineConfig) -> dict[str, Any]:
    return {"any": [{"resources": {
        "kinds": [GATEWAY_CONFIG_KIND],
        "operations": ["CREATE", "UPDATE"],
        # No "namespaces": a namespaced Policy only ever sees its own namespace.
        "names": [names.gateway_name(line)],
    }}]}


def match_conditions(line: BusinessLineConfig) -> list[dict[str, str]]:
    """CEL ``matchConditions`` of the policy's own webhook: only ``<line>-gateway`` in the line's namespace
    (a Kyverno outage then holds up writes of that object, nothing else). Total on CREATE and UPDATE."""
    return [
        {"name": "business-line-namespace", "expression": f"request.namespace == '{line.namespace}'"},
        {"name": "line-gateway", "expression": f"request.name == '{names.gateway_name(line)}'"},
    ]


def gateway_policy_spec(line: BusinessLineConfig) -> dict[str, Any] | None:
    """``spec`` of the line's gateway Policy; None when the line sets neither ``gateway.jwt`` nor
    ``gateway.weights`` (or is not a gateway line)."""
    settings = line.gateway
    rules: list[dict[str, Any]] = []
    if settings.jwt is not None:
        rules.append({
            "name": "set-request-auth",
            "match": _match(line),
            # "add" replaces an existing spec.auth (RFC 6902); spec itself is required by the CRD.
            "mutate": {"patchesJson6902": _patch([
                {"op": "add", "path": "/spec/auth", "value": {"jwt": {"provider": settings.jwt.manifest()}}}])},
        })
    if settings.weights is not None:
        weights = settings.weights.manifest()
        conditions = [{"key": "{{ contains(keys(element), 'weights') || contains(keys(element), 'configMapRef') }}",
                       "operator": "Equals", "value": False}]
        if "lru" in weights:
            conditions.append({"key": f"{{{{ element.scheduler || '{LRU_SCHEDULER}' }}}}", "operator": "Equals",
                               "value": LRU_SCHEDULER})
        rules.append({
            "name": "add-scheduler-weights",
            "match": _match(line),
            "mutate": {"foreach": [{
                "list": "request.object.spec.schedulers || `[]`",
                "preconditions": {"all": conditions},
                "patchesJson6902": _patch([
                    {"op": "add", "path": "/spec/schedulers/{{ elementIndex }}/weights", "value": weights}]),
            }]},
        })
    if not rules:
        return None
    return fail_closed_admission_spec(match_conditions(line), rules)


def gateway_policy_manifest(line: BusinessLineConfig) -> dict[str, Any] | None:
    """The line's gateway ``Policy`` (namespaced: it can only touch its own namespace), or None."""
    spec = gateway_policy_spec(line)
    if spec is None:
        return None
    what = [w for w, on in (("request authentication (spec.auth.jwt)", line.gateway.jwt is not None),
                            ("scheduler weights where absent", line.gateway.weights is not None)) if on]
    return {
        "apiVersion": KYVERNO_API_VERSION,
        "kind": "Policy",
        "metadata": {
            "name": names.gateway_policy_name(line),
            "namespace": line.namespace,
            "annotations": {
                "policies.kyverno.io/title": "Gateway settings of this business line",
                "policies.kyverno.io/description": (
                    f"Adds {' and '.join(what)} to the InferenceGatewayConfig {names.gateway_name(line)} the "
                    "operator creates for this line, at each CREATE and UPDATE."),
            },
        },
        "spec": spec,
    }
