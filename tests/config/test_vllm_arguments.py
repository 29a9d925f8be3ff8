"""vLLM arguments that would fail or misbehave at pod start are refused at synth, naming the file,
``vllm.args`` and what is allowed (issue 27): a model path the operator does not mount, flags the
platform owns or builds on (``--kv-transfer-config``, ``--no-enable-prefix-caching``), a
``--max-model-len`` vLLM cannot read or longer than the model's context. Lengths are read the way
vLLM 0.29 reads them (``human_readable_int_or_auto``); the serving tier (``make test-serving``) holds
this parser against vLLM's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from platform_config.vllm_args import human_readable_int, max_model_len, model_path
from tests.config.test_broken_inputs import RAG, refused
from tests.example_config import edit_yaml


def _args(config_dir: Path, args: list[str]) -> None:
    edit_yaml(config_dir / RAG, lambda d: d["vllm"].update(args=args))


@pytest.mark.parametrize("args, expected", [
    (["/models/qwen", "--max-model-len", "8192"], "model path '/models/qwen'"),
    (["--max-model-len", "8192"], "no model path"),
    (["/opt/ml/model", "--model", "Qwen/Qwen2-7B-Instruct"], "model path 'Qwen/Qwen2-7B-Instruct'"),
    (["/opt/ml/model", "--no-enable-prefix-caching"], "turns off L0"),
    (["/opt/ml/model", "--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1"}'], "--kv-transfer-config"),
    (["/opt/ml/model", "--max-model-len", "8.5K"], "not a token count vLLM reads"),
    (["/opt/ml/model", "--max-model-len", "lots"], "not a token count vLLM reads"),
    (["/opt/ml/model", "--max-model-len", "1000k"], "exceeds"),
], ids=["other-path", "no-path", "hub-model", "no-prefix-caching", "kv-transfer-config", "binary-decimal",
        "words", "beyond-context"])
def test_refused_with_the_file_the_field_and_what_is_allowed(config_dir: Path, tmp_path: Path, args, expected):
    _args(config_dir, args)
    message = refused(config_dir, tmp_path)
    assert "rag-assistant.yaml" in message and expected in message
    assert "allowed" in message


@pytest.mark.parametrize("args", [
    ["/opt/ml/model", "--max-model-len", "8k"], ["/opt/ml/model/", "--max-model-len=8K"],
    ["--model", "/opt/ml/model/snapshot", "--max-model-len", "auto"], ["/opt/ml/model", "--max-model-len", "-1"],
])
def test_the_forms_vllm_reads_are_accepted(config_dir: Path, args):
    from platform_config import load_project
    _args(config_dir, args)
    assert load_project(config_dir).business_line("rag-assistant").vllm.args == tuple(args)


def test_lengths_as_vllm_reads_them():
    assert [max_model_len(["--max-model-len", v]) for v in ("8192", "8k", "8K", "25.6k", "1m", "auto", "-1")] == [
        8192, 8000, 8192, 25600, 10**6, None, None]
    assert max_model_len([]) is None
    assert model_path(["--enforce-eager", "/opt/ml/model"]) == "/opt/ml/model"
    assert model_path(["/a", "--model", "/b"]) == "/b"


@given(st.integers(min_value=0, max_value=10**7), st.sampled_from(["", "k", "K", "m", "M"]))
def test_whole_numbers_with_any_suffix(number, suffix):
    scale = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20}[suffix]
    assert human_readable_int(f"{number}{suffix}") == number * scale


# --- every other word, against vLLM 0.29's own options (platform_config/vllm_cli.py) -----------------

@pytest.mark.parametrize("args, expected", [
    (["/opt/ml/model", "8192", "--enable-prefix-caching"], "'8192' is an argument vLLM does not recognize"),
    (["/opt/ml/model", "--max-model-lenght", "8192"], "--max-model-lenght is not an option of vLLM 0.29.0's server"),
    (["/opt/ml/model", "--max", "8192"], "--max is ambiguous"),
    (["/opt/ml/model", "--dtype", "bf16"], "--dtype 'bf16' is not one of its choices"),
    (["/opt/ml/model", "--max-num-seqs", "lots"], "--max-num-seqs 'lots' is not a whole number"),
    (["/opt/ml/model", "--enforce-eager=true"], "--enforce-eager takes no value"),
    (["/opt/ml/model", "--served-model-name"], "--served-model-name needs a value"),
    (["/opt/ml/model", "--help"], "prints the help and exits"),
    (["/opt/ml/model", "--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    (["/opt/ml/model", "--lora-modules", "adapter"], "--lora-modules 'adapter' is neither name=path"),
], ids=["second-positional", "typo", "ambiguous", "choice", "type", "flag-value", "no-value", "help", "pair", "lora"])
def test_what_vllm_would_refuse_at_pod_start_is_refused(config_dir: Path, tmp_path: Path, args, expected):
    _args(config_dir, args)
    message = refused(config_dir, tmp_path)
    assert message.startswith(f"{config_dir / RAG}: vllm.args: vLLM 0.29.0 would refuse these arguments at pod start: ")
    assert expected in message and "allowed: the options of vLLM 0.29.0's server" in message


@pytest.mark.parametrize("args", [
    ["/opt/ml/model", "--max_num_seqs", "64"],  # underscores: FlexibleArgumentParser
    ["/opt/ml/model", "--max-num-se", "64"],  # a unique prefix of --max-num-seqs (argparse's allow_abbrev)
    ["/opt/ml/model", "-O3", "--compilation-config.mode", "3"],
    ["/opt/ml/model", "--served-model-name", "qwen", "qwen2", "--enforce-eager"],
    ["/opt/ml/model", "--lora-modules", "a=/opt/ml/model/a", '{"name": "b", "path": "/opt/ml/model/b"}'],
    ["/opt/ml/model", "--max-model-len", "1_000"],
])
def test_what_vllm_reads_is_accepted(args):
    from platform_config.vllm_cli import serve_args_problems
    assert serve_args_problems(args) == []
