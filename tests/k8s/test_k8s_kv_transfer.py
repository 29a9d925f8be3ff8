"""vLLM's ``--kv-transfer-config``: every vLLM pod of an L2 line runs with ``kv_load_failure_policy:
recompute`` and LMCache's connector, the operator's value rewritten (never a second flag), by the
Kyverno Policy and by the Deployment patch alike (k8s/kv_transfer.py).
"""

from __future__ import annotations

import json

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k8s import names
from k8s.kv_transfer import (KV_TRANSFER_FLAG, KYVERNO_RULE_NAME, PLATFORM_SETTINGS, completed_args, completed_value,
                             effective_settings, settings_json)
from k8s.patch import endpoint_json_patch
from platform_config import ConfigError, load_project
from platform_config.vllm_args import owned_flags_in
from tests.example_config import copy_example_config, edit_yaml
from tests.k8s.conftest import find
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.operator_render import OPERATOR_KV_TRANSFER, deployment, pod

#: The value every admitted pod must run with: the operator's keys, ours merged over them (the L2
#: gate, LMCache's connector under it, k8s/vllm_plugins.py).
EXPECTED = {"kv_connector": "GatedLMCacheConnectorV1", "kv_connector_module_path": "kvcache_l2_gate",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}


def _l2_lines(project):
    return [line for line in project.business_lines if line.cache.l2_enabled]


@pytest.fixture(scope="module", params=["rag-assistant", "research-reasoning"])
def line(request, k8s_project):
    return k8s_project.business_line(request.param)


@pytest.fixture(scope="module")
def policy(line, manifests):
    return find(manifests[names.line_chart_name(line)], "Policy")


def _vllm_args(p, line):
    (c,) = [c for c in p["spec"]["containers"] if c["name"] == names.endpoint_name(line)]
    return c.get("args")


def test_every_l2_line_renders_the_rule(k8s_project, manifests):
    assert len(_l2_lines(k8s_project)) == 3
    for line in _l2_lines(k8s_project):
        rules = find(manifests[names.line_chart_name(line)], "Policy")["spec"]["rules"]
        assert [r["name"] for r in rules][-1] == KYVERNO_RULE_NAME


@pytest.mark.parametrize("refresh", [True, False], ids=["refresh-context", "stale-context"])
@pytest.mark.parametrize("form", ["separate", "equals", None])
def test_admitted_pod_runs_with_recompute_and_one_flag(policy, line, refresh, form):
    before = pod(line, kv_transfer=form)
    after = apply_policy(policy, before, refresh_context=refresh, seed=3)
    args = _vllm_args(after, line)
    assert effective_settings(args) == EXPECTED
    # One flag, the operator's rewritten in place: the CR's args keep their order before it.
    assert sum(a == KV_TRANSFER_FLAG or a.startswith(KV_TRANSFER_FLAG + "=") for a in args) == 1
    assert args[:len(line.vllm.args)] == list(line.vllm.args)
    # The policy and the Deployment patch write the very same args.
    assert args == completed_args(_vllm_args(before, line))
    # Sidecars are untouched.
    assert [c for c in after["spec"]["containers"] if c["name"] != names.endpoint_name(line)] == [
        c for c in before["spec"]["containers"] if c["name"] != names.endpoint_name(line)]


def test_operator_keys_are_kept_and_ours_win(policy, line):
    before = pod(line)
    operator_value = {"kv_connector": "SomethingElse", "kv_role": "kv_producer",
                      "kv_connector_extra_config": {"discard_partial_chunks": False}, "kv_load_failure_policy": "fail"}
    _vllm_args(before, line)[-1] = json.dumps(operator_value, indent=1)
    args = _vllm_args(apply_policy(policy, before, seed=4), line)
    assert effective_settings(args) == {**operator_value, **EXPECTED}
    assert args[-1] == settings_json({**operator_value, **EXPECTED})


def test_a_container_without_args_gets_both_items(policy, line):
    before = pod(line, kv_transfer=None)
    del before["spec"]["containers"][0]["args"]
    assert _vllm_args(apply_policy(policy, before, seed=5), line) == [KV_TRANSFER_FLAG, settings_json(PLATFORM_SETTINGS)]


def test_a_value_that_is_not_a_json_object_refuses_the_pod(policy, line):
    """Kyverno's parse_json/merge fail, the rule fails, the Pod is refused (fail closed), as vLLM
    would refuse to start; the Deployment patch raises the same way."""
    before = pod(line)
    _vllm_args(before, line)[-1] = "kv_connector=LMCacheConnectorV1"
    with pytest.raises(json.JSONDecodeError):
        apply_policy(policy, before, seed=6)
    with pytest.raises(ValueError, match="is not JSON"):
        completed_args(_vllm_args(before, line))
    with pytest.raises(ValueError, match="no value"):
        completed_args(["/opt/ml/model", KV_TRANSFER_FLAG])


def test_deployment_patch_rewrites_the_live_args(k8s_project, line):
    live = deployment(line)
    patched = jsonpatch.apply_patch(live, endpoint_json_patch(k8s_project.platform, line, deployment=live))
    args = patched["spec"]["template"]["spec"]["containers"][0]["args"]
    assert effective_settings(args) == EXPECTED and args.count(KV_TRANSFER_FLAG) == 1
    again = endpoint_json_patch(k8s_project.platform, line, deployment=patched)
    assert not [op for op in again if op["path"].endswith("/args")]  # already complete: no args op
    # A concurrent change of the args fails the patch instead of overwriting it.
    ops = endpoint_json_patch(k8s_project.platform, line, deployment=live)
    live["spec"]["template"]["spec"]["containers"][0]["args"].append("--max-num-seqs=8")
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(live, ops)


def test_the_operator_value_is_what_lmcache_documents():
    assert json.loads(OPERATOR_KV_TRANSFER) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    assert json.loads(completed_value(OPERATOR_KV_TRANSFER)) == EXPECTED


_WORDS = st.sampled_from(["/opt/ml/model", "--max-model-len", "8192", "--enforce-eager", "-tp", "2", "x"])
_VALUES = st.dictionaries(st.sampled_from(["kv_connector", "kv_role", "kv_load_failure_policy", "kv_buffer_size", "a"]),
                          st.one_of(st.text(max_size=5), st.integers(), st.booleans()), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_WORDS, _VALUES.map(lambda v: ("sep", v)), _VALUES.map(lambda v: ("eq", v))), max_size=8))
def test_completed_args_whatever_the_operator_wrote(parts):
    """Any mix of words and flag forms: the last value vLLM reads carries ours; every value keeps
    the operator's other keys; completing twice changes nothing."""
    args: list[str] = []
    for part in parts:
        if isinstance(part, tuple):
            form, value = part
            args += [KV_TRANSFER_FLAG, json.dumps(value)] if form == "sep" else [f"{KV_TRANSFER_FLAG}={json.dumps(value)}"]
        else:
            args.append(part)
    done = completed_args(args)
    last = effective_settings(done)
    operator_last = effective_settings(args)
    assert last == {**(operator_last or {}), **PLATFORM_SETTINGS}
    assert completed_args(done) == done
    assert len(done) == len(args) + (0 if operator_last is not None else 2)


@pytest.mark.parametrize("arg", ["--kv-transfer-config", "--kv-transfer-config={}", "--kv_transfer_config",
                                 "--kv-transfer-config.kv_load_failure_policy"])
def test_vllm_args_may_not_set_the_flag(tmp_path, arg):
    cfg = copy_example_config(tmp_path / "config")
    path = cfg / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["vllm"]["args"].extend([arg, "{}"]))
    with pytest.raises(ConfigError) as exc:
        load_project(cfg)
    message = "\n".join(str(p) for p in exc.value.problems)
    assert "rag-assistant.yaml" in message and "vllm.args" in message and "--kv-transfer-config" in message
    assert "the platform owns" in message


def test_owned_flags_are_recognised_in_every_spelling():
    assert owned_flags_in(["/opt/ml/model", "--kv-transfer-configx", "--max-model-len", "4096"]) == []
    assert owned_flags_in(["--kv_transfer_config={}", "--kv-transfer-config"]) == [
        "--kv_transfer_config={}", "--kv-transfer-config"]
