"""One LMCache version, model-scoped L2 directories, pinned settings and the telemetry switch.

The real LMCache is exercised by ``make test-lmcache`` (tests_lmcache/); these tests check what
the platform renders and refuses, without LMCache installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from k8s.kyverno import policy_manifest
from k8s.lmcache import (
    LMCACHE_VERSION,
    PINNED_SETTINGS,
    kv_relevant_vllm_args,
    l2_cache_dir,
)
from k8s.patch import line_cache_env, line_remote_url
from platform_config import ConfigError, load_project
from platform_config.fields import lmcache_version_of_image
from tests.example_config import copy_example_config, edit_yaml
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.operator_render import pod

RAG = "rag-assistant"


def _dir_after(tmp_path: Path, change: Callable[[dict[str, Any]], None], *, line: str = RAG,
               platform_change: Callable[[dict[str, Any]], None] | None = None) -> str:
    cfg = copy_example_config(tmp_path / "config")
    edit_yaml(cfg / "business-lines" / f"{line}.yaml", change)
    if platform_change is not None:
        edit_yaml(cfg / "platform.yaml", platform_change)
    project = load_project(cfg)
    return l2_cache_dir(project.platform, project.business_line(line))


@pytest.fixture(scope="module")
def base_dirs(k8s_project) -> dict[str, str]:
    return {line.name: l2_cache_dir(k8s_project.platform, line) for line in k8s_project.business_lines}


def test_the_directory_is_one_component_named_after_the_model(base_dirs, k8s_project):
    assert base_dirs[RAG].startswith("qwen2-7b-instruct-") and len(base_dirs[RAG]) == len("qwen2-7b-instruct-") + 12
    assert base_dirs["research-reasoning"].startswith("deepseek-r1-distill-llama-70b-")
    assert len(set(base_dirs.values())) == len(base_dirs) and all("/" not in d for d in base_dirs.values())
    # Same model name, different weights (FSx vs S3 copy): two directories.
    assert base_dirs["legal-search"].startswith("llama-3.1-8b-instruct-")
    assert base_dirs["ticket-triage"].startswith("llama-3.1-8b-instruct-")
    assert base_dirs["legal-search"] != base_dirs["ticket-triage"]
    line = k8s_project.business_line(RAG)
    assert line_remote_url(k8s_project.platform, line) == f"fs://localhost:0/mnt/curvine/l2cache/{base_dirs[RAG]}/"


def test_issue_input_model_change_gets_a_new_directory(tmp_path, base_dirs):
    """The issue's failing input: a fine-tuned model mounted at the same /opt/ml/model path."""
    def fine_tune(d):
        d["model"]["name"] = "Qwen2-7B-Instruct-ft-v2"
        d["model"]["source"]["location"] = "qwen2-7b-instruct-ft-v2"
    new = _dir_after(tmp_path, fine_tune)
    assert new.startswith("qwen2-7b-instruct-ft-v2-") and new != base_dirs[RAG]


KV_INCOMPATIBLE = {
    "model location only": lambda d: d["model"]["source"].update(location="qwen2-7b-instruct-v2"),
    "model bucket": lambda d: d["model"]["source"].update(bucket="other-weights"),
    "dtype": lambda d: d["model"].update(dtype="float16"),
    "kv cache dtype": lambda d: d["vllm"].update(args=d["vllm"]["args"] + ["--kv-cache-dtype", "fp8"]),
    "quantization": lambda d: d["vllm"].update(args=d["vllm"]["args"] + ["--quantization=fp8"]),
    "unknown vllm flag": lambda d: d["vllm"].update(args=d["vllm"]["args"] + ["--hf-overrides", "{}"]),
    "model path": lambda d: d["vllm"].update(args=["/opt/ml/model/v2"] + d["vllm"]["args"][1:]),
    "tensor parallel size": lambda d: (d.update(gpus_per_replica=2), d["vllm"]["args"].extend(["-tp", "2"])),
    "chunk size": lambda d: d["cache"].update(chunk_size_tokens=512),
    "hash seed": lambda d: d.update(python_hash_seed=7),
    "image (same LMCache)": lambda d: d["vllm"].update(image="lmcache/vllm-openai:v0.5.5-cu129"),
}


@pytest.mark.parametrize("change", list(KV_INCOMPATIBLE), ids=list(KV_INCOMPATIBLE))
def test_every_kv_incompatible_change_starts_an_empty_directory(tmp_path, base_dirs, change):
    assert _dir_after(tmp_path, KV_INCOMPATIBLE[change]) != base_dirs[RAG]


def test_hugging_face_revision_changes_the_directory(tmp_path, base_dirs):
    new = _dir_after(tmp_path, lambda d: d["model"]["source"].update(commit_sha="1" * 40), line="research-reasoning")
    assert new != base_dirs["research-reasoning"]


KV_NEUTRAL = {
    "replicas": lambda d: d.update(replicas=1),  # (more would not fit the scenario's nodes' CPUs)
    "max model len": lambda d: d["vllm"].update(args=["/opt/ml/model", "--max-model-len", "4096",
                                                      "--enable-prefix-caching"]),
    "resources": lambda d: d["resources"].update(memory="100Gi"),
    "l1 size": lambda d: d["cache"].update(l1_cpu_gib=8),
    "routing": lambda d: d.update(routing_strategy="roundrobin"),
    "prefetch": lambda d: d["model"]["source"].update(prefetch=True),
    "pvc size": lambda d: d["cache"].update(l2_size="1Ti"),
}


@pytest.mark.parametrize("change", list(KV_NEUTRAL), ids=list(KV_NEUTRAL))
def test_kv_neutral_changes_keep_the_directory(tmp_path, base_dirs, change):
    assert _dir_after(tmp_path, KV_NEUTRAL[change]) == base_dirs[RAG]


def test_telemetry_switch_is_not_part_of_the_directory(tmp_path, base_dirs):
    assert _dir_after(tmp_path, lambda d: None,
                      platform_change=lambda d: d.update(lmcache={"usage_telemetry": True})) == base_dirs[RAG]


def test_kv_relevant_args_grouping():
    assert kv_relevant_vllm_args(["/m", "--max-model-len", "8192", "--kv-cache-dtype=fp8", "-tp", "2",
                                  "--enable-prefix-caching"]) == [
        ["/m"], ["--kv-cache-dtype", "fp8"], ["--tensor-parallel-size", "2"]]


@pytest.mark.parametrize("args, expected", [
    # A positional after a flag without value is the model path, not the flag's value.
    (["--enforce-eager", "/opt/ml/model/v2"], [["/opt/ml/model/v2"]]),
    (["--enable-prefix-caching", "/opt/ml/model"], [["/opt/ml/model"]]),
    (["--trust-remote-code", "/opt/ml/model"], [["/opt/ml/model"], ["--trust-remote-code"]]),
    # Optional boolean of StoreBoolean flags; the value of a one-value flag; nargs="+".
    (["--enable-chunked-prefill", "false", "/m"], [["/m"]]),
    (["--max-model-len", "8192", "/m"], [["/m"]]),
    (["--served-model-name", "a", "b", "--dtype", "half", "/m"], [["/m"], ["--dtype", "half"]]),
    # A negative number is a value, not a flag; an unknown flag keeps every word up to the next flag.
    (["/m", "--seed", "-1"], [["/m"], ["--seed", "-1"]]),
    (["--some-new-flag", "x", "/m"], [["--some-new-flag", "x", "/m"]]),
])
def test_kv_relevant_args_place_each_word(args, expected):
    assert kv_relevant_vllm_args(args) == expected


def test_kv_relevant_args_ignore_order_but_not_which_value_wins():
    base = ["/opt/ml/model", "--kv-cache-dtype", "fp8", "--tensor-parallel-size", "2", "--max-model-len", "8192"]
    for other in (["--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8", "/opt/ml/model"],
                  ["--max-model-len=8192", "-tp=2", "/opt/ml/model", "--kv-cache-dtype=fp8", "--enforce-eager"]):
        assert kv_relevant_vllm_args(other) == kv_relevant_vllm_args(base)
    # The last of a repeated flag wins in vLLM: the two orders are different settings.
    assert kv_relevant_vllm_args(["/m", "--dtype", "half", "--dtype", "bfloat16"]) != \
        kv_relevant_vllm_args(["/m", "--dtype", "bfloat16", "--dtype", "half"])


def test_a_model_path_after_a_neutral_flag_still_moves_the_directory(tmp_path, base_dirs):
    moved = _dir_after(tmp_path, lambda d: d["vllm"].update(args=["--enforce-eager", "/opt/ml/model/v2"]))
    assert moved != base_dirs[RAG]
    assert _dir_after(tmp_path / "b", lambda d: d["vllm"].update(
        args=["--enable-prefix-caching", "--max-model-len", "8192", "/opt/ml/model"])) == base_dirs[RAG]


# --- one LMCache version ------------------------------------------------------------------------


def test_image_tag_names_the_lmcache_release():
    assert LMCACHE_VERSION == "0.5.5"
    assert lmcache_version_of_image("lmcache/vllm-openai:v0.5.5") == "0.5.5"
    assert lmcache_version_of_image("docker.io/lmcache/vllm-openai:v0.5.5-cu129") == "0.5.5"
    assert lmcache_version_of_image("lmcache/vllm-openai:nightly-2026-11-01") is None
    assert lmcache_version_of_image("vllm/vllm-openai:v0.5.5") is None
    assert lmcache_version_of_image("123456789012.dkr.ecr.us-west-2.amazonaws.com/vllm:1.0") is None


def _problem(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> str:
    cfg = copy_example_config(tmp_path / "config")
    path = cfg / "business-lines" / f"{RAG}.yaml"
    edit_yaml(path, change)
    with pytest.raises(ConfigError) as info:
        load_project(cfg)
    (problem,) = [str(p) for p in info.value.problems]
    assert problem.startswith(f"{path}: vllm")
    return problem


def test_an_image_with_another_lmcache_release_is_refused(tmp_path):
    """AWS's sample image carries LMCache 0.3.7, whose defaults and keys differ from what is checked."""
    message = _problem(tmp_path, lambda d: d["vllm"].update(image="lmcache/vllm-openai:v0.3.7"))
    assert "carries LMCache 0.3.7" in message and "allowed: lmcache/vllm-openai:v0.5.5" in message


def test_a_custom_image_must_declare_its_lmcache_release(tmp_path):
    custom = "123456789012.dkr.ecr.us-west-2.amazonaws.com/vllm-lmcache:2026.11"
    message = _problem(tmp_path / "a", lambda d: d["vllm"].update(image=custom))
    assert "set vllm.lmcache_version" in message and "allowed: 0.5.5" in message
    message = _problem(tmp_path / "b", lambda d: d["vllm"].update(image=custom, lmcache_version="0.5.6"))
    assert "carries LMCache 0.5.6" in message
    cfg = copy_example_config(tmp_path / "ok")
    edit_yaml(cfg / "business-lines" / f"{RAG}.yaml", lambda d: d["vllm"].update(image=custom, lmcache_version="0.5.5"))
    assert load_project(cfg).business_line(RAG).vllm.lmcache_release == "0.5.5"


def test_lmcache_version_cannot_contradict_the_tag(tmp_path):
    message = _problem(tmp_path, lambda d: d["vllm"].update(lmcache_version="0.5.6"))
    assert "contradicts image 'lmcache/vllm-openai:v0.5.5'" in message


# --- pinned settings and telemetry --------------------------------------------------------------


def test_every_pinned_setting_reaches_the_pod(k8s_project):
    for line in k8s_project.business_lines:
        after = apply_policy(policy_manifest(k8s_project.platform, line), pod(line), seed=11)
        env = {e["name"]: e.get("value") for e in after["spec"]["containers"][0]["env"]}
        for s in PINNED_SETTINGS:
            if s.key.startswith("extra_config."):
                assert f'"{s.key.removeprefix("extra_config.")}": {s.value}' in env["LMCACHE_EXTRA_CONFIG"]
            else:
                assert env[f"LMCACHE_{s.key.upper()}"] == s.value, s.key
            assert s.reason and s.source


def test_telemetry_is_off_unless_switched_on(tmp_path, k8s_project):
    line = k8s_project.business_line(RAG)
    env = line_cache_env(k8s_project.platform, line)
    assert env["LMCACHE_TRACK_USAGE"] == "false" and env["DO_NOT_TRACK"] == "1"
    cfg = copy_example_config(tmp_path / "config")
    edit_yaml(cfg / "platform.yaml", lambda d: d.update(lmcache={"usage_telemetry": True}))
    project = load_project(cfg)
    on = project.business_line(RAG)
    assert not {"LMCACHE_TRACK_USAGE", "DO_NOT_TRACK"} & set(line_cache_env(project.platform, on))
    # The switch decides: an opt-out someone else put on the pod is removed when telemetry is on.
    p = pod(on)
    p["spec"]["containers"][0]["env"].append({"name": "DO_NOT_TRACK", "value": "1"})
    after = apply_policy(policy_manifest(project.platform, on), p, seed=12)
    assert "DO_NOT_TRACK" not in {e["name"] for e in after["spec"]["containers"][0]["env"]}


def test_the_real_library_tier_installs_the_pinned_release():
    """`make test-lmcache` installs what the platform is checked against (requirements-lmcache.txt)."""
    repo = Path(__file__).resolve().parents[2]
    pins = [ln.strip() for ln in (repo / "requirements-lmcache.txt").read_text(encoding="utf-8").splitlines()]
    assert f"lmcache=={LMCACHE_VERSION}" in pins and "torch==2.13.0" in pins
    constraints = (repo / "constraints-lmcache.txt").read_text(encoding="utf-8").splitlines()
    assert f"lmcache=={LMCACHE_VERSION}" in constraints
    assert not any(c.startswith("torch==") for c in constraints)  # the CPU build's local label stays out
