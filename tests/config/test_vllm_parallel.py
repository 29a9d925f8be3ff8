"""``gpus_per_replica`` and the parallel sizes in ``vllm.args`` must agree (issue 10, fit item 2).

vLLM uses tensor x pipeline x data parallel size GPUs, each 1 unless set: a replica given 2 GPUs
without ``--tensor-parallel-size 2`` idles one, and ``--tensor-parallel-size 4`` in a 1-GPU pod
fails at start. Both synthesized before; now the config check refuses them, naming the flag to add.
The flags are read by the one parser of ``vllm.args`` (``platform_config.vllm_args``), the same the
L2 directory digest and the planner use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s.lmcache import kv_relevant_vllm_args
from capacity.fit import parse_vllm_args
from platform_config import load_project
from platform_config.vllm_args import flag_values, parallel_sizes
from tests.config.test_config import only_problem
from tests.example_config import edit_yaml


def _line(config_dir: Path) -> Path:
    return config_dir / "business-lines" / "legal-search.yaml"


def _set(config_dir: Path, gpus: int, args: list[str]) -> Path:
    path = _line(config_dir)
    edit_yaml(path, lambda d: (d.update(gpus_per_replica=gpus), d["vllm"].update(args=args)))
    return path


_only_problem = only_problem


def test_two_gpus_without_the_flag_are_refused_naming_the_flag_to_add(config_dir: Path) -> None:
    path = _set(config_dir, 2, ["/opt/ml/model", "--max-model-len", "16384"])
    assert _only_problem(config_dir) == (
        f"{path}: vllm.args: vllm.args sets no --tensor-parallel-size, so vLLM runs each replica on 1 GPU and leaves 1 "
        'of its gpus_per_replica 2 idle; allowed: add "--tensor-parallel-size", "2" to vllm.args (or set '
        "gpus_per_replica 1)")


def test_a_flag_asking_for_more_gpus_than_the_pod_has_is_refused(config_dir: Path) -> None:
    path = _set(config_dir, 1, ["/opt/ml/model", "--tensor-parallel-size", "4"])
    assert _only_problem(config_dir) == (
        f"{path}: vllm.args: vllm.args asks vLLM for --tensor-parallel-size 4 = 4 GPU(s) per replica, but "
        "gpus_per_replica is 1; allowed: gpus_per_replica 4, or no parallel-size flag in vllm.args")


@pytest.mark.parametrize("args", [
    ["/opt/ml/model", "-tp", "2"],
    ["/opt/ml/model", "--tensor-parallel-size=2"],
    ["/opt/ml/model", "-tp=2"],
    ["--tensor-parallel-size", "2", "/opt/ml/model"],
    ["/opt/ml/model", "--pipeline-parallel-size", "2"],  # TP 1 x PP 2
    ["/opt/ml/model", "-tp", "4", "--tensor-parallel-size", "2"],  # the last one wins, as in argparse
])
def test_every_spelling_of_two_gpus_is_accepted(config_dir: Path, args: list[str]) -> None:
    _set(config_dir, 2, args)
    line = load_project(config_dir).business_line("legal-search")
    assert line.gpus_per_replica == 2
    assert line.tensor_parallel_size == parallel_sizes(args).get("--tensor-parallel-size", 1)


def test_pipeline_and_data_parallel_multiply_with_tensor_parallel(config_dir: Path) -> None:
    path = _set(config_dir, 2, ["/opt/ml/model", "-tp", "2", "-pp", "2"])
    assert _only_problem(config_dir) == (
        f"{path}: vllm.args: vllm.args asks vLLM for --tensor-parallel-size 2 x --pipeline-parallel-size 2 = 4 GPU(s) "
        "per replica, but gpus_per_replica is 2; allowed: gpus_per_replica 4, or vllm.args whose tensor x "
        'pipeline x data parallel sizes multiply to 2 (e.g. "--tensor-parallel-size", "2")')
    # 4 GPUs for TP 2 x DP 2: a whole node (ticket-triage removed to leave the other to rag-assistant).
    _set(config_dir, 4, ["/opt/ml/model", "-tp", "2", "--data-parallel-size", "2"])
    (config_dir / "business-lines" / "ticket-triage.yaml").unlink()
    assert load_project(config_dir).business_line("legal-search").tensor_parallel_size == 2


@pytest.mark.parametrize("value", ["two", "0", "2.5"])
def test_a_parallel_size_that_is_not_a_whole_number_is_refused(config_dir: Path, value: str) -> None:
    path = _set(config_dir, 2, ["/opt/ml/model", "--tensor-parallel-size", value])
    assert _only_problem(config_dir) == (
        f"{path}: vllm.args: --tensor-parallel-size {value!r} is not a whole number; allowed: an integer "
        "of at least 1, e.g. --tensor-parallel-size 2")


def test_one_parser_reads_vllm_args_for_the_check_the_l2_digest_and_the_planner() -> None:
    args = ["/m", "-tp=2", "--max-model-len", "8192", "--enforce-eager", "-pp", "1"]
    assert flag_values(args) == {"--tensor-parallel-size": ["2"], "--max-model-len": ["8192"],
                                 "--enforce-eager": [], "--pipeline-parallel-size": ["1"]}
    assert parse_vllm_args(args) == {"--tensor-parallel-size": "2", "--max-model-len": "8192",
                                     "--enforce-eager": "", "--pipeline-parallel-size": "1"}
    assert parallel_sizes(args) == {"--tensor-parallel-size": 2, "--pipeline-parallel-size": 1}
    assert ["--tensor-parallel-size", "2"] in kv_relevant_vllm_args(args)
