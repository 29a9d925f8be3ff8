"""vLLM's ``--kv-transfer-config`` on every vLLM pod of an L2 line: the operator's value completed.

Why. vLLM 0.29.0 (the vLLM of ``lmcache/vllm-openai:v0.5.5``) defaults
``KVTransferConfig.kv_load_failure_policy`` to ``"fail"`` (``vllm/config/kv_transfer.py``): when a
KV connector reports blocks it could not load, the scheduler finishes the request with
``FINISHED_ERROR`` (``vllm/v1/core/sched/scheduler.py``, ``_handle_invalid_blocks``). LMCache 0.5.5
reports every short retrieve that way (``vllm_v1_adapter.py``, ``record_failed_blocks`` /
``get_block_ids_with_load_errors``). So an L2 read that fails after a lookup hit (EIO, ENOTCONN, a
chunk the janitor unlinked on another node, a slow read past the blocking timeout) would end the
user's request in an error: HTTP 500, or an HTTP 200 stream with no token. With ``"recompute"``
the scheduler drops the blocks it could not load and prefills them again (docs/sources.md §22,
measured by the serving tier, ``make test-serving``).

How. The operator passes the connector as two items of the vLLM container's ``args``:
``--kv-transfer-config`` and ``{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`` (a
rendered Deployment quoted in LMCache PR #2732; FACTS.md §5). vLLM parses the value as one JSON
object and, for a repeated flag, keeps only the last one (argparse): a second
``--kv-transfer-config`` carrying only the policy would drop the connector. So the value the
operator wrote is **rewritten**, merged with :data:`PLATFORM_SETTINGS` (ours win; every other key
the operator set is kept), in every form vLLM reads: ``--kv-transfer-config VALUE`` and
``--kv-transfer-config=VALUE``. A vLLM container without the flag gets both items appended.

Two places apply it, built from this module so they cannot disagree: the Kyverno Policy
(:func:`kyverno_rule`, reconcile-proof: every new Pod is admitted through it) and the Deployment
patch of clusters without Kyverno (:func:`completed_args`, used by :mod:`k8s.patch`); ``verify.py``
checks live pods with :func:`effective_settings`. ``vllm.args`` may not set the flag itself
(:data:`platform_config.vllm_args.OWNED_VLLM_FLAGS`).
"""

from __future__ import annotations

import json
from typing import Any, Final, Iterable

from k8s import vllm_plugins
from platform_config.vllm_args import KV_TRANSFER_FLAG

#: Keys of vLLM's ``KVTransferConfig`` the platform sets on every vLLM pod of an L2 line, merged
#: over the operator's value. ``kv_connector`` / ``kv_connector_module_path``: the L2 gate, LMCache's
#: connector that stops asking a hung L2 (:mod:`k8s.vllm_plugins`); ``kv_role``: storing and
#: loading (the operator's own value, FACTS.md §5); ``kv_load_failure_policy: "recompute"``: a
#: failed L2 read is prefilled again instead of failing the request (module docstring).
PLATFORM_SETTINGS: Final[dict[str, str]] = {
    **vllm_plugins.KV_TRANSFER_SETTINGS,
    "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute",
}
#: The ``--flag=value`` form of the flag.
KV_TRANSFER_FLAG_EQUALS: Final = f"{KV_TRANSFER_FLAG}="
#: Name of the Kyverno rule that completes the value (:func:`kyverno_rule`).
KYVERNO_RULE_NAME: Final = "complete-kv-transfer-config"

__all__ = [
    "KV_TRANSFER_FLAG",
    "KYVERNO_RULE_NAME",
    "PLATFORM_SETTINGS",
    "completed_args",
    "completed_value",
    "effective_settings",
    "kyverno_rule",
    "settings_json",
]


def settings_json(settings: dict[str, Any]) -> str:
    """``settings`` as the Kyverno policy writes it: JMESPath ``to_string``, which is Go's
    ``json.Marshal`` (keys sorted, no spaces, ``<`` ``>`` ``&`` escaped), so the Deployment patch and
    the policy put the very same string in the args."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _json_object(value: str) -> dict[str, Any]:
    """``value`` parsed as vLLM parses ``--kv-transfer-config``: one JSON object.

    Raises:
        ValueError: not JSON, or JSON that is not an object (vLLM would refuse it too).
    """
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{KV_TRANSFER_FLAG} {value!r} is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{KV_TRANSFER_FLAG} {value!r} is not a JSON object")
    return parsed


def completed_value(operator_value: str) -> str:
    """The operator's ``--kv-transfer-config`` JSON with :data:`PLATFORM_SETTINGS` merged over it.

    Raises:
        ValueError: ``operator_value`` is not a JSON object (vLLM would refuse it too).
    """
    return settings_json({**_json_object(operator_value), **PLATFORM_SETTINGS})


def completed_args(args: Iterable[str]) -> list[str]:
    """The vLLM container's ``args`` with every ``--kv-transfer-config`` value completed
    (:func:`completed_value`), or, without the flag, with ``--kv-transfer-config`` and
    :data:`PLATFORM_SETTINGS` appended. Idempotent.

    Raises:
        ValueError: the flag is the last word (no value), or its value is not a JSON object.
    """
    items = list(args)
    out: list[str] = []
    found = False
    i = 0
    while i < len(items):
        arg = items[i]
        if arg == KV_TRANSFER_FLAG:
            if i + 1 >= len(items):
                raise ValueError(f"{KV_TRANSFER_FLAG} is the last argument: it has no value")
            out += [arg, completed_value(items[i + 1])]
            found = True
            i += 2
            continue
        if arg.startswith(KV_TRANSFER_FLAG_EQUALS):
            out.append(KV_TRANSFER_FLAG_EQUALS + completed_value(arg[len(KV_TRANSFER_FLAG_EQUALS):]))
            found = True
        else:
            out.append(arg)
        i += 1
    if not found:
        out += [KV_TRANSFER_FLAG, settings_json(PLATFORM_SETTINGS)]
    return out


def effective_settings(args: Iterable[str]) -> dict[str, Any] | None:
    """The ``KVTransferConfig`` vLLM will run with: the JSON object of the *last*
    ``--kv-transfer-config`` of ``args`` (argparse keeps the last one), or None without the flag.

    Raises:
        ValueError: the last value is missing or not a JSON object.
    """
    value: str | None = None
    items = list(args)
    for i, arg in enumerate(items):
        if arg == KV_TRANSFER_FLAG:
            if i + 1 >= len(items):
                raise ValueError(f"{KV_TRANSFER_FLAG} is the last argument: it has no value")
            value = items[i + 1]
        elif arg.startswith(KV_TRANSFER_FLAG_EQUALS):
            value = arg[len(KV_TRANSFER_FLAG_EQUALS):]
    if value is None:
        return None
    return _json_object(value)


def _yaml_replace(path: str, value_template: str) -> str:
    """A one-op ``patchesJson6902`` in YAML whose value is a literal block: Kyverno substitutes the
    ``{{ }}`` inside it as text, and a JSON value full of quotes stays one verbatim string."""
    return f"- op: replace\n  path: {path}\n  value: |-\n    {value_template}\n"


def kyverno_rule(match: dict[str, Any], preconditions: dict[str, Any],
                 vllm_preconditions: dict[str, Any]) -> dict[str, Any]:
    """The Kyverno rule ``complete-kv-transfer-config`` of a line's Policy (:mod:`k8s.kyverno`).

    Args:
        match: the rule's ``match`` (the line's vLLM Pods at CREATE).
        preconditions: rule preconditions (the Pod has a vLLM container).
        vllm_preconditions: ``foreach`` preconditions selecting the vLLM container.

    Three ``foreach`` entries over the vLLM container, in order: (1) ``args`` added when the
    container has none; (2) both items appended when no argument starts with
    ``--kv-transfer-config``; (3) over its ``args``, every value of the flag rewritten, as
    :func:`completed_args` does: the item after a ``--kv-transfer-config`` item
    (``lookup(element0.args, subtract(elementIndex1, 1))``; Kyverno's ``lookup`` gives null for
    index -1) becomes ``to_string(merge(parse_json(value), settings))``, and a
    ``--kv-transfer-config=VALUE`` item the same behind its prefix. ``merge`` lets the second
    object win (JMESPath), so every other key of the operator stays. A value that is not a JSON
    object makes ``parse_json`` or ``merge`` fail, so the rule fails and the Pod is refused (the
    policy fails closed), as vLLM would refuse to start with it. Kyverno's functions as read at
    v1.15.2 (``pkg/engine/jmespath/functions.go``: ``jpLookup``, ``jpParseJson``,
    ``jpfTrimPrefix``; ``arithmetic.go``: ``jpSubtract``), emulated by ``tests/k8s/kyverno_eval.py``.
    """
    settings = "`" + settings_json(PLATFORM_SETTINGS) + "`"
    container = "/spec/containers/{{ elementIndex0 }}"
    has_flag = (f"length(element.args[?starts_with(@, '{KV_TRANSFER_FLAG}')] || `[]`)")
    follows_flag = f"lookup(element0.args, subtract(elementIndex1, `1`)) == '{KV_TRANSFER_FLAG}'"
    return {
        "name": KYVERNO_RULE_NAME,
        "match": match,
        "preconditions": preconditions,
        "mutate": {"foreach": [
            {
                "list": "request.object.spec.containers",
                "preconditions": {**vllm_preconditions, "all": [
                    {"key": "{{ length(element.args || `[]`) }}", "operator": "Equals", "value": 0}]},
                "patchesJson6902": "- op: add\n  path: /spec/containers/{{ elementIndex }}/args\n  value: []\n",
            },
            {
                "list": "request.object.spec.containers",
                "preconditions": {**vllm_preconditions, "all": [
                    {"key": f"{{{{ {has_flag} }}}}", "operator": "Equals", "value": 0}]},
                "patchesJson6902": (
                    f"- op: add\n  path: /spec/containers/{{{{ elementIndex }}}}/args/-\n  value: {KV_TRANSFER_FLAG}\n"
                    f"- op: add\n  path: /spec/containers/{{{{ elementIndex }}}}/args/-\n  value: |-\n"
                    f"    {settings_json(PLATFORM_SETTINGS)}\n"),
            },
            {
                "list": "request.object.spec.containers",
                "preconditions": vllm_preconditions,
                "foreach": [
                    {
                        "list": "element.args || `[]`",
                        "preconditions": {"all": [
                            {"key": f"{{{{ {follows_flag} }}}}", "operator": "Equals", "value": True}]},
                        "patchesJson6902": _yaml_replace(
                            f"{container}/args/{{{{ elementIndex1 }}}}",
                            f"{{{{ to_string(merge(parse_json(element), {settings})) }}}}"),
                    },
                    {
                        "list": "element.args || `[]`",
                        "preconditions": {"all": [
                            {"key": f"{{{{ starts_with(element, '{KV_TRANSFER_FLAG_EQUALS}') }}}}",
                             "operator": "Equals", "value": True}]},
                        "patchesJson6902": _yaml_replace(
                            f"{container}/args/{{{{ elementIndex1 }}}}",
                            f"{KV_TRANSFER_FLAG_EQUALS}{{{{ to_string(merge(parse_json("
                            f"trim_prefix(element, '{KV_TRANSFER_FLAG_EQUALS}')), {settings})) }}}}"),
                    },
                ],
            },
        ]},
    }
