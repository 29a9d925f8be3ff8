"""The L2 tier with the real LMCache: every pod a process, configured only from the rendered env.

Each pod's env is what the line's rendered Kyverno Policy gives the vLLM container of the Pod
the operator renders (tests_lmcache/export_env.py), with exactly two test overrides: the L2
mount ``/mnt/curvine/l2cache`` re-pointed at a temporary directory, and a 50 MiB L1 buffer.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version

import pytest

from tests_lmcache.conftest import QWEN2_7B, Tier

RAG, RESEARCH, FINE_TUNED = "rag-assistant", "research-reasoning", "rag-assistant@fine-tuned"
LINES = (RAG, RESEARCH, FINE_TUNED)
#: A prompt of four full 256-token chunks and a 100-token tail (never stored: save_unfull_chunk).
PROMPT = [[1, 1124]]
OTHER = [[2, 1124]]
#: Shares the first two chunks (512 tokens) with PROMPT, then differs.
HALF = [[1, 512], [3, 612]]


def _lookup_retrieve(prompt):
    return [{"op": "lookup", "prompt": prompt}, {"op": "retrieve", "prompt": prompt}]


def _chunk_files(tier: Tier, line: str) -> list[str]:
    d = tier.line_dir(line)
    return sorted(f for f in os.listdir(d) if f.endswith(".data")) if d.exists() else []


# --- one LMCache version, its key list, and what its loader makes of our env ---------------------


def test_installed_lmcache_is_the_pinned_release(exported):
    assert version("lmcache") == exported["lmcache_version"]
    assert {line["lmcache_release"] for line in exported["lines"].values()} == {exported["lmcache_version"]}


def test_allow_list_is_the_key_list_of_the_installed_release(exported):
    from lmcache.v1.config import _CONFIG_DEFINITIONS

    installed = sorted(_CONFIG_DEFINITIONS)
    assert exported["config_keys"] == installed, (
        "k8s/lmcache.py LMCACHE_CONFIG_KEYS differs from lmcache/v1/config.py of the installed release; "
        f"in source order it is:\n{tuple(_CONFIG_DEFINITIONS)}")


#: How we mean each variable we set: LMCache's parsed field must equal this reading of our text.
MEANT = {
    "LMCACHE_REMOTE_URL": ("remote_url", str),
    "LMCACHE_CHUNK_SIZE": ("chunk_size", int),
    "LMCACHE_REMOTE_SERDE": ("remote_serde", str),
    "LMCACHE_SAVE_UNFULL_CHUNK": ("save_unfull_chunk", {"false": False}.__getitem__),
    "LMCACHE_PRE_CACHING_HASH_ALGORITHM": ("pre_caching_hash_algorithm", str),
    "LMCACHE_EXTRA_CONFIG": ("extra_config", json.loads),
    "LMCACHE_MAX_LOCAL_CPU_SIZE": ("max_local_cpu_size", float),
    "LMCACHE_LOOKUP_TIMEOUT_MS": ("lookup_timeout_ms", int),
    "LMCACHE_BLOCKING_TIMEOUT_SECS": ("blocking_timeout_secs", int),
    # Set by the operator (tests/k8s/operator_render.py), not by us; read back all the same.
    "LMCACHE_LOCAL_CPU": ("local_cpu", {"True": True}.__getitem__),
}


@pytest.mark.parametrize("line", LINES)
def test_rendered_env_is_read_back_field_by_field(tier, line):
    """LMCache's own loader, on the unmodified rendered env: every value parses to what we meant."""
    _check_read_back(tier, line)


def test_every_other_l2_line_of_the_fixture_reads_back(tier):
    others = sorted(set(tier.doc["lines"]) - set(LINES))
    for line in others:
        _check_read_back(tier, line)


def _check_read_back(tier: Tier, line: str) -> None:
    env = dict(tier.doc["lines"][line]["envs"][0])
    run = tier.run(line, [{"op": "read_back"}], env={"PATH": os.environ["PATH"], "HOME": str(tier.home), **env})
    (record,) = run.records
    lmcache_names = {n for n in env if n.startswith("LMCACHE_")}
    assert lmcache_names - set(MEANT) == {"LMCACHE_TRACK_USAGE"}, "a new variable needs its expectation in MEANT"
    for name, (field, meant) in MEANT.items():
        assert record["fields"][field] == meant(env[name]), (name, env[name], record["fields"][field])
    # Values LMCache would silently replace or drop show up only as warnings: there must be none.
    assert "Failed to convert" not in run.log and "Unknown configuration key" not in run.log
    # The fs connector's base path is the line's model-scoped directory on the L2 mount.
    dir_name = tier.line_dir(line).name
    assert record["url_error"] is None and record["url_path"] == f"/mnt/curvine/l2cache/{dir_name}/"
    assert record["fields"]["chunk_size"] == 256 and record["fields"]["save_unfull_chunk"] is False
    assert record["fields"]["extra_config"]["save_chunk_meta"] is True
    assert record["fields"]["extra_config"]["fs_connector_relative_tmp_dir"].startswith(".tmp-")
    assert record["telemetry"] is False


def test_lmcache_is_silent_about_values_it_cannot_use(tier):
    """Why the read-back matters: a bad value is a warning and a fallback, an fs URL without a
    port is accepted by the loader and only fails when the connector parses it."""
    env = dict(tier.doc["lines"][RAG]["envs"][0])
    env.update(LMCACHE_CHUNK_SIZE="256 tokens", LMCACHE_REMOTE_URL="fs://localhost/mnt/curvine/l2cache/x/")
    run = tier.run(RAG, [{"op": "read_back"}], env={"PATH": os.environ["PATH"], "HOME": str(tier.home), **env})
    (record,) = run.records
    assert record["fields"]["chunk_size"] is None and "Failed to convert value for chunk_size" in run.log
    assert record["fields"]["remote_url"] == "fs://localhost/mnt/curvine/l2cache/x/"
    assert "missing port" in record["url_error"]


# --- cross-pod sharing through fs:// ----------------------------------------------------------------


def test_pod_b_reads_what_pod_a_stored(tier):
    a = tier.run(RAG, [{"op": "store", "prompt": PROMPT}], pod=0)
    assert a.of("store")[0]["stored_files"] == 4
    files = _chunk_files(tier, RAG)
    # Four full chunks; the 100-token tail is not stored (save_unfull_chunk false, LMCache #2206).
    assert len(files) == 4 and all(f.startswith("-SEP-opt-SEP-ml-SEP-model@1@0@") and f.endswith("@bfloat16.data")
                                   for f in files)
    # Each pod wrote through its own temp dir, left empty after the rename.
    tmp_dirs = [d for d in tier.line_dir(RAG).iterdir() if d.is_dir()]
    assert [d.name for d in tmp_dirs] == [json.loads(a.env["LMCACHE_EXTRA_CONFIG"])["fs_connector_relative_tmp_dir"]]
    assert all(list(d.iterdir()) == [] for d in tmp_dirs)

    b = tier.run(RAG, _lookup_retrieve(PROMPT) + _lookup_retrieve(OTHER) + _lookup_retrieve(HALF), pod=1)
    assert a.env["LMCACHE_EXTRA_CONFIG"] != b.env["LMCACHE_EXTRA_CONFIG"]  # two admissions, two temp dirs
    full, other, half = b.of("lookup")
    got_full, got_other, got_half = b.of("retrieve")
    assert full["hit_tokens"] == 1024
    assert got_full["retrieved_tokens"] == 1024 and all(got_full["chunks_identical"])
    assert other["hit_tokens"] == 0 and got_other["retrieved_tokens"] == 0
    assert half["hit_tokens"] == 512
    assert got_half["chunks_retrieved"] == [True, True, False, False]
    assert got_half["chunks_identical"][:2] == [True, True]


def test_the_telemetry_switch_keeps_lmcache_silent(tier):
    tier.run(RAG, [{"op": "store", "prompt": PROMPT}] + _lookup_retrieve(PROMPT))
    assert not (tier.home / ".config" / "lmcache").exists()  # no machine id written under $HOME


def test_pythonhashseed_does_not_salt_lmcache_alone(tier):
    """Measured: without vLLM, LMCache's keys hash integer tuples, which no seed salts. The seed
    matters in a pod because vLLM derives the chain's first hash from it (docs/l2-cache.md)."""
    tier.run(RAG, [{"op": "store", "prompt": PROMPT}])
    other_seed = tier.run(RAG, [{"op": "lookup", "prompt": PROMPT}], pod=1, env=tier.pod_env(
        RAG, 1, overrides={"PYTHONHASHSEED": "12345"}))
    no_seed = tier.run(RAG, [{"op": "lookup", "prompt": PROMPT}], pod=2, env=tier.pod_env(
        RAG, 2, overrides={"PYTHONHASHSEED": None}))
    assert other_seed.of("lookup")[0]["hit_tokens"] == no_seed.of("lookup")[0]["hit_tokens"] == 1024


# --- model changes and line isolation --------------------------------------------------------------


def test_a_line_whose_model_changed_misses(tier):
    tier.run(RAG, [{"op": "store", "prompt": PROMPT}])
    engine = tier.doc["lines"][FINE_TUNED]["engine"]
    assert engine == tier.doc["lines"][RAG]["engine"]  # same /opt/ml/model path, TP size and dtype
    changed = tier.run(FINE_TUNED, _lookup_retrieve(PROMPT))
    assert changed.of("lookup")[0]["hit_tokens"] == 0 and changed.of("retrieve")[0]["retrieved_tokens"] == 0
    assert tier.line_dir(FINE_TUNED) != tier.line_dir(RAG) and _chunk_files(tier, FINE_TUNED) == []
    # Control: the same pod pointed at the old directory (the unscoped layout) hits in full,
    # and would load the old model's KV.
    old_dir = tier.pod_env(RAG)["LMCACHE_REMOTE_URL"]
    control = tier.run(FINE_TUNED, [{"op": "lookup", "prompt": PROMPT}], env=tier.pod_env(
        FINE_TUNED, overrides={"LMCACHE_REMOTE_URL": old_dir}))
    assert control.of("lookup")[0]["hit_tokens"] == 1024


def test_two_lines_never_see_each_others_chunks(tier):
    """Both lines on one root (production gives each line its own PVC, a stronger separation) and
    the same engine geometry, so only the rendered env separates them."""
    rag_engine = tier.doc["lines"][RAG]["engine"]
    tier.run(RAG, [{"op": "store", "prompt": PROMPT}])
    rag_files = {f: (tier.line_dir(RAG) / f).read_bytes() for f in _chunk_files(tier, RAG)}
    research = tier.run(RESEARCH, _lookup_retrieve(PROMPT) + [{"op": "store", "prompt": PROMPT},
                                                              {"op": "store", "prompt": OTHER}], engine=rag_engine)
    assert research.of("lookup")[0]["hit_tokens"] == 0 and research.of("retrieve")[0]["retrieved_tokens"] == 0
    rag = tier.run(RAG, [{"op": "lookup", "prompt": OTHER}], pod=1)
    assert rag.of("lookup")[0]["hit_tokens"] == 0
    # Same chunk keys, two directories; the first line's files are untouched.
    assert tier.line_dir(RAG) != tier.line_dir(RESEARCH)
    assert set(rag_files) < set(_chunk_files(tier, RESEARCH)) and len(_chunk_files(tier, RESEARCH)) == 8
    assert {f: (tier.line_dir(RAG) / f).read_bytes() for f in _chunk_files(tier, RAG)} == rag_files


def _store_pair_at_once(tier: Tier, prompt: list[list[int]], overrides: dict[str, str] | None = None) -> list:
    """Two pods (two admissions, two temp dirs) storing the same prefix, lined up at LMCache's
    rename of every chunk: each has written its temp file before either publishes it."""
    barrier = tier.work / "rename-barrier"
    barrier.mkdir(exist_ok=True)
    started = [tier.start(RAG, [{"op": "store", "prompt": prompt}], pod=k, geometry=QWEN2_7B,
                          env=tier.pod_env(RAG, k, l1_gib="0.5", overrides=overrides),
                          rename_barrier={"dir": str(barrier), "pod": k, "peers": [0, 1]})
               for k in (0, 1)]
    runs = [Tier.finish(s) for s in started]
    for run in runs:
        assert run.of("store")[0]["rename_barrier"] == {"renames": 16, "timed_out": 0}, "the pods did not meet"
    return runs


def test_two_pods_storing_the_same_prefix_at_once_both_succeed(tier):
    """LMCache #2517: with its default temp name (``<chunk file>.tmp``) two writers of one chunk
    share a temp file; each admitted pod has its own temp dir, so both stores succeed even when
    both have written every chunk before either renames it."""
    prompt = [[50, 4096]]  # 16 chunks of a 7B model, 224 MiB per pod
    for run in _store_pair_at_once(tier, prompt):
        assert run.of("store")[0]["stored_files"] == 16
        assert "Failed to write" not in run.log and "Traceback" not in run.log
    files = _chunk_files(tier, RAG)
    assert len(files) == 16 and len({os.path.getsize(tier.line_dir(RAG) / f) for f in files}) == 1
    reader = tier.run(RAG, _lookup_retrieve(prompt), pod=2, geometry=QWEN2_7B, env=tier.pod_env(RAG, 2, l1_gib="0.5"))
    assert reader.of("lookup")[0]["hit_tokens"] == 4096
    assert all(reader.of("retrieve")[0]["chunks_identical"])


def test_control_without_private_temp_dirs_concurrent_writers_fail(tier):
    """Control, recording LMCache 0.5.5's behaviour: the same pair with LMCache's default temp
    name (extra_config without ``fs_connector_relative_tmp_dir``) shares ``<chunk file>.tmp``;
    the first rename publishes it and the second finds nothing to rename, so one pod's write of
    every chunk fails (LMCache #2517; docs/l2-cache.md). Without the barrier the same race also
    publishes short files, when one writer truncates the temp file the other is about to rename."""
    runs = _store_pair_at_once(tier, [[60, 4096]], overrides={"LMCACHE_EXTRA_CONFIG": '{"save_chunk_meta": true}'})
    assert sum(run.log.count("Failed to write file") for run in runs) == 16  # one per chunk, in whichever pod renamed second


def test_a_truncated_chunk_is_not_served(tier):
    """Recorded behaviour of LMCache 0.5.5 (docs/l2-cache.md): lookup only checks that the file
    exists, so it still reports the full prefix; the read fails on the file's header ('Partial
    read data'), and retrieve returns only the chunks before the damaged one."""
    a = tier.run(RAG, [{"op": "store", "prompt": PROMPT}, {"op": "files", "prompt": PROMPT}])
    files = a.of("files")[0]["files"]
    damaged = tier.line_dir(RAG) / files[1]
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    b = tier.run(RAG, _lookup_retrieve(PROMPT), pod=1)
    assert b.of("lookup")[0]["hit_tokens"] == 1024  # existence only: the file is still there
    got = b.of("retrieve")[0]
    assert got["retrieved_tokens"] == 256 and got["chunks_retrieved"] == [True, False, False, False]
    assert got["chunks_identical"][0] is True
    assert "Partial read data" in b.log


def test_a_missing_chunk_ends_the_hit(tier):
    a = tier.run(RAG, [{"op": "store", "prompt": PROMPT}, {"op": "files", "prompt": PROMPT}])
    (tier.line_dir(RAG) / a.of("files")[0]["files"][2]).unlink()  # e.g. deleted by the L2 janitor, or lost with a Worker
    b = tier.run(RAG, _lookup_retrieve(PROMPT), pod=1)
    assert b.of("lookup")[0]["hit_tokens"] == 512
    assert b.of("retrieve")[0]["chunks_retrieved"] == [True, True, False, False]

