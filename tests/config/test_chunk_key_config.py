"""A line's chunk-key settings (issue 25 item 3; docs/security.md, "Chunk keys"): the key generation is
bounded, the prefix-cache hashes that are not collision resistant are refused, each refusal one problem
naming the line's file, the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from capacity.project_checks import load_checked_project
from k8s import names
from k8s.lmcache import l2_cache_dir
from tests.config.test_broken_inputs import RAG
from tests.config.test_config import only_problem
from tests.example_config import edit_yaml


def set_cache(config_dir: Path, **values) -> None:
    edit_yaml(config_dir / RAG, lambda d: d["cache"].update(values))


def set_args(config_dir: Path, *extra: str) -> None:
    edit_yaml(config_dir / RAG, lambda d: d["vllm"].update(args=[*d["vllm"]["args"], *extra]))


def test_the_default_generation_is_1_and_a_new_one_names_a_new_secret_and_directory(config_dir: Path) -> None:
    line = load_checked_project(config_dir).business_line("rag-assistant")
    before = load_checked_project(config_dir)
    assert line.cache.chunk_key_generation == 1 and names.chunk_key_secret_name(line) == "kvcache-l2-key-1"
    set_cache(config_dir, chunk_key_generation=2)
    after = load_checked_project(config_dir)
    rotated = after.business_line("rag-assistant")
    assert names.chunk_key_secret_name(rotated) == "kvcache-l2-key-2"
    # A rotation is a new L2 directory (a cold cache), never new names in the old one.
    assert l2_cache_dir(after.platform, rotated) != l2_cache_dir(before.platform, line)


@pytest.mark.parametrize("value", [0, -1, 1000000, "two", 1.5, True])
def test_a_bad_generation_names_the_file_the_field_and_the_range(config_dir: Path, value) -> None:
    set_cache(config_dir, chunk_key_generation=value)
    problem = only_problem(config_dir)
    assert problem.startswith(f"{config_dir / RAG}: cache.chunk_key_generation: "), problem
    assert "; allowed: " in problem, problem


@pytest.mark.parametrize("args", [("--prefix-caching-hash-algo", "xxhash"), ("--prefix-caching-hash-algo=xxhash_cbor",),
                                  ("--prefix_caching_hash_algo", "xxhash")])
def test_a_prefix_cache_hash_that_is_not_collision_resistant_is_refused(config_dir: Path, args) -> None:
    set_args(config_dir, *args)
    problem = only_problem(config_dir)
    assert problem.startswith(f"{config_dir / RAG}: vllm.args: "), problem
    assert "GHSA-rm76-4mrf-v9r8" in problem and problem.endswith("allowed: sha256 (vLLM's default) or sha256_cbor")


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_a_cryptographic_prefix_cache_hash_is_accepted(config_dir: Path, algo: str) -> None:
    set_args(config_dir, "--prefix-caching-hash-algo", algo)
    load_checked_project(config_dir)
