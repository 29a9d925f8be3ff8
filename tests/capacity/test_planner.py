"""Planner: the reference deployment's figures, model facts, fit, tiers, timing, cost, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.tools.script_loader import load_script
from capacity.model_specs import MODELS, count_params, load_hf_config, lookup_model, normalize_model_name
from operator_tools import cli
from capacity.gpu_memory import GPU_MEMORY, usable_gpu_memory_gib
from capacity.fit import PlanInputs, inputs_from_line, kv_bytes_per_token_per_gpu, parse_vllm_args
from capacity.latency import DEFAULT_CALIBRATION, timing
from capacity.planner import plan, recommend
from capacity.prices import load_prices
from platform_config import INSTANCE_TYPES, ConfigError, get_instance_type, load_project
from platform_config.loader import l2_pool_gib
from tests.example_config import FIXTURE_CONFIG, copy_line_file, set_fixed

REPO = Path(__file__).resolve().parents[2]
PROJECT = load_project(FIXTURE_CONFIG)
#: The scenario's price table (a fork edits config/prices.yaml; these tests must not move with it).
FIXTURE_PRICES = FIXTURE_CONFIG / "prices.yaml"
PRICES = load_prices(FIXTURE_PRICES)
QWEN7 = lookup_model("Qwen2-7B")
L40S = get_instance_type("ml.g6e.12xlarge")
P5 = get_instance_type("ml.p5.48xlarge")


# --- the reference deployment's figures (docs/sources.md §1 and §5) ---------------------------

def test_qwen2_7b_weights_are_about_14_gib_in_bf16() -> None:
    p = plan(PlanInputs(model=QWEN7, instance_type="ml.g6e.12xlarge"))
    # 7,615,616,512 params x 2 B = 15.23 GB = 14.18 GiB.
    assert QWEN7.params == 7_615_616_512
    assert p.weights_gib == pytest.approx(14.185, abs=0.001)
    assert p.weights_gb == pytest.approx(15.231, abs=0.001)
    assert p.fit.fits and p.fit.tp == 1


def test_qwen2_7b_kv_per_token_and_the_1925_token_read() -> None:
    p = plan(PlanInputs(model=QWEN7, instance_type="ml.g6e.12xlarge", tokens=1925, l2_read_gibps=1.84))
    d = p.to_dict()
    assert d["kv_bytes_per_token"] == 57_344 == 2 * 28 * 4 * 128 * 2
    assert d["kv_gib"] == pytest.approx(0.1028, abs=0.00005)
    # The blog measured 55.75 ms; 110,387,200 B at 1.84 GiB/s is 55.87 ms.
    assert d["l2_read_ms"] == pytest.approx(55.87, abs=0.05)


def test_a_32b_model_does_not_fit_one_48_gb_gpu() -> None:
    model = lookup_model("Qwen2.5-32B")
    one_gpu = plan(PlanInputs(model=model, instance_type="ml.g6e.xlarge"))
    assert one_gpu.weights_gb == pytest.approx(65.53, abs=0.01)
    assert not one_gpu.fit.fits and one_gpu.min_tp is None
    assert "exceed" in one_gpu.fit.reason
    forced = plan(PlanInputs(model=model, instance_type="ml.g6e.12xlarge", tp=1))
    assert not forced.fit.fits and forced.min_tp == 2
    auto = plan(PlanInputs(model=model, instance_type="ml.g6e.12xlarge"))
    assert auto.fit.fits and auto.fit.tp == 2


def test_calibration_reproduces_the_reference_ttft() -> None:
    t = timing(QWEN7, L40S, 1, "float16", tokens=2500)
    assert t.cold_ttft_ms == pytest.approx(774.0, abs=0.01)
    assert t.warm_ttft_ms == pytest.approx(287.0, abs=0.01)
    assert t.ttft_ratio == pytest.approx(2.70, abs=0.01)
    assert DEFAULT_CALIBRATION.l2_overhead_ms == pytest.approx(214.4, abs=0.1)
    assert DEFAULT_CALIBRATION.efficiency == pytest.approx(0.1404, abs=0.0005)


def test_break_even_lands_between_the_references_neutral_and_paying_points() -> None:
    # Blog: ~1.0x at 500 tokens, 1.7x at 1,000, "below ~1,000 tokens L2 does not pay".
    t = timing(QWEN7, L40S, 1, "bfloat16", tokens=2500)
    assert 500 < t.break_even_tokens < 1000
    assert t.break_even_tokens == pytest.approx(783, abs=2)
    below = timing(QWEN7, L40S, 1, "bfloat16", tokens=500)
    above = timing(QWEN7, L40S, 1, "bfloat16", tokens=1000)
    assert not below.l2_pays and above.l2_pays


def test_prefill_scales_with_gpu_peak_and_tp() -> None:
    on_p5 = timing(QWEN7, P5, 1, "bfloat16", tokens=2500)
    assert on_p5.cold_ttft_ms == pytest.approx(774.0 * 362.05 / 989.4, rel=1e-6)
    tp2 = timing(QWEN7, L40S, 2, "bfloat16", tokens=2500)
    assert tp2.cold_ttft_ms == pytest.approx(387.0, abs=0.01)


def test_partial_hits_read_whole_chunks_and_prefill_the_rest() -> None:
    t = timing(QWEN7, L40S, 1, "bfloat16", tokens=2500, hit_ratio=0.5, chunk_tokens=256)
    assert t.cached_tokens == 1024  # 1,250 rounded down to whole 256-token chunks
    full = timing(QWEN7, L40S, 1, "bfloat16", tokens=2500)
    assert full.warm_ttft_ms < t.warm_ttft_ms < full.cold_ttft_ms


# --- model facts -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_param_formula_reproduces_the_published_counts(name: str) -> None:
    m = MODELS[name]
    assert count_params(layers=m.layers, hidden_size=m.hidden_size, attention_heads=m.attention_heads,
                        kv_heads=m.kv_heads, head_dim=m.head_dim, intermediate_size=m.intermediate_size,
                        vocab_size=m.vocab_size, tie_word_embeddings=m.tie_word_embeddings,
                        qkv_bias=m.qkv_bias) == m.params
    assert m.source.startswith("https://huggingface.co/") and m.source.endswith("/config.json")


@pytest.mark.parametrize("given, expected", [
    ("Qwen2-7B-Instruct", "Qwen2-7B"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
    ("Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
    ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "DeepSeek-R1-Distill-Llama-70B"),
    ("DeepSeek-R1-Distill-Qwen-32B", "DeepSeek-R1-Distill-Qwen-32B"),
    ("qwen2.5-32b-instruct", "Qwen2.5-32B"),
])
def test_model_names_are_matched_normalized(given: str, expected: str) -> None:
    assert lookup_model(given).name == expected


def test_unknown_model_points_to_hf_config() -> None:
    with pytest.raises(KeyError, match="--hf-config"):
        lookup_model("Mistral-7B-v0.3")
    assert normalize_model_name("Qwen2-7B-Instruct") == "qwen2-7b"


def _llama8b_config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def test_hf_config_file_gives_the_same_facts_as_the_table(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_llama8b_config()))
    spec = load_hf_config(tmp_path, name="my-llama")
    table = lookup_model("Llama-3.1-8B")
    assert (spec.params, spec.kv_bytes_per_token("bfloat16"), spec.head_dim) == (
        table.params, table.kv_bytes_per_token("bfloat16"), 128)
    assert spec.kv_bytes_per_token("bfloat16") == 131_072 and spec.name == "my-llama"


def test_hf_config_rejects_moe_and_missing_fields(tmp_path: Path) -> None:
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**_llama8b_config(), "num_local_experts": 8}))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        load_hf_config(moe)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({k: v for k, v in _llama8b_config().items() if k != "num_hidden_layers"}))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_hf_config(broken)


# --- tiers -------------------------------------------------------------------------------------

def test_l0_l1_l2_capacities() -> None:
    p = plan(PlanInputs(model=QWEN7, instance_type="ml.g6e.12xlarge", replicas=2, l2_nodes=2,
                        l2_node_capacity_gib=2000))
    # L0: the 44.53 GiB CUDA reports for an L40S (not its marketed 48 GB) x 0.90
    # - 14.185 GiB weights - 2 GiB reserve = 23.89 GiB per GPU.
    assert p.fit.kv_free_per_gpu_gib == pytest.approx(44.53 * 0.9 - 14.185 - 2.0, abs=0.001)
    assert p.fit.l0_tokens_per_replica == int(p.fit.kv_free_per_gpu_gib * 2**30 // 57_344)
    # L1 without a line: LMCache's default 5 GiB per TP rank, x the 2 replicas on the node (not Tiered Storage).
    assert p.l1_gib_per_node == 2 * 5.0
    assert p.to_dict()["l2"]["gib"] == 4000.0
    assert p.cost.nodes == 1  # two one-GPU replicas pack onto one 4-GPU node


def test_tp_splits_kv_heads_across_gpus() -> None:
    llama70 = lookup_model("Llama-3.1-70B")
    assert kv_bytes_per_token_per_gpu(llama70, 8, "bfloat16") * 8 == llama70.kv_bytes_per_token("bfloat16")
    # TP above the KV head count replicates heads: never less than one head per GPU.
    qwen_heads = kv_bytes_per_token_per_gpu(QWEN7, 4, "bfloat16")
    assert qwen_heads == 2 * 28 * 1 * 128 * 2


def test_fp8_weights_keep_a_bf16_kv_cache_unless_asked() -> None:
    inputs = PlanInputs(model=QWEN7, instance_type="ml.g6e.xlarge", dtype="fp8")
    assert plan(inputs).weights_gb == pytest.approx(7.616, abs=0.001)
    assert plan(inputs).kv_bytes_per_token == 57_344
    assert plan(replace(inputs, kv_dtype="fp8")).kv_bytes_per_token == 28_672


def test_invalid_inputs_are_rejected_with_the_allowed_range() -> None:
    with pytest.raises(ValueError, match="allowed: 1..1"):
        PlanInputs(model=QWEN7, instance_type="ml.g6e.xlarge", tp=2)
    with pytest.raises(ValueError, match="hit ratio"):
        PlanInputs(model=QWEN7, instance_type="ml.g6e.xlarge", hit_ratio=1.5)


# --- business lines, prices, recommendation ---------------------------------------------------

def test_inputs_from_the_example_lines() -> None:
    rag = inputs_from_line(PROJECT.business_line("rag-assistant"), PROJECT.platform)
    assert (rag.model.name, rag.instance_type, rag.tp, rag.replicas, rag.max_model_len) == (
        "Qwen2-7B", "ml.g6e.12xlarge", 1, 2, 8192)
    # The pool is the config check's (l2_pool_gib): 3 Workers x 2,000 GiB x (1 - 0.1 reserve).
    assert (rag.l1_gib_per_replica, rag.l2_nodes, rag.l2_pool_gib, rag.l2_size_gib, rag.region) == (
        16, 3, 5400.0, 500.0, "us-west-2")
    research = inputs_from_line(PROJECT.business_line("research-reasoning"), PROJECT.platform)
    assert (research.model.name, research.tp, research.max_model_len) == (
        "DeepSeek-R1-Distill-Llama-70B", 8, 32768)
    assert plan(research).fit.fits


def test_the_planner_and_the_config_check_use_one_l2_pool() -> None:
    """plan.py printed 6,000 GiB ('3 node(s) x 2,000 GiB NVMe') where the config check said 5,400."""
    workers, pool = l2_pool_gib(PROJECT.platform)
    rag = plan(inputs_from_line(PROJECT.business_line("rag-assistant"), PROJECT.platform))
    assert (workers, pool) == (3, 5400.0) and (rag.l2_nodes, rag.l2_pool_gib) == (3, 5400.0)
    # A Worker bound larger than the node's NVMe counts only the NVMe (the config check refuses it too).
    only_g6e = PROJECT.platform.model_copy(update={"curvine": PROJECT.platform.curvine.model_copy(
        update={"worker_instance_groups": ("g6e-inference",), "worker_capacity_gib": 100_000})})
    nodes, gib = l2_pool_gib(only_g6e)
    assert nodes == 2 and gib == pytest.approx(2 * 3800e9 / 2**30 * 0.9)


def test_the_lines_own_l2_size_is_shown_in_gib_and_tokens() -> None:
    rag = plan(inputs_from_line(PROJECT.business_line("rag-assistant"), PROJECT.platform))
    l2 = rag.to_dict()["l2"]
    # 500 GiB / 57,344 B per token of Qwen2-7B; the pool 5,400 GiB likewise.
    assert (l2["line_gib"], l2["line_tokens"]) == (500.0, 500 * 2**30 // 57_344) == (500.0, 9_362_285)
    assert (l2["gib"], l2["tokens"], l2["janitor_high_watermark"]) == (5400.0, 5400 * 2**30 // 57_344, 0.8)
    triage = inputs_from_line(PROJECT.business_line("ticket-triage"), PROJECT.platform)
    assert triage.l1_gib_per_replica == 0.0 and triage.l2_size_gib == 200.0  # L1 off, L2 200Gi
    legal = inputs_from_line(PROJECT.business_line("legal-search"), PROJECT.platform)
    assert (legal.l2_size_gib, legal.l2_pool_gib, legal.l1_gib_per_replica) == (None, 0.0, None)
    assert plan(legal).l1_gib_per_replica == 2 * 5.0  # LMCache's default per rank, TP 2


def test_price_table_has_dated_sourced_prices_for_g6e_and_p5() -> None:
    prices = PRICES.regions["us-west-2"]
    assert {"ml.g6e.xlarge", "ml.g6e.12xlarge", "ml.g6e.48xlarge", "ml.p5.48xlarge"} <= set(prices)
    assert all(p.source.startswith("https://") and p.as_of.year >= 2025 for p in prices.values())


def test_invalid_price_table_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "prices.yaml"
    bad.write_text("regions:\n  us-west-2:\n    ml.g6e.xlarge: {usd_per_hour: -1, as_of: 2026-01-01, "
                   "source: 'https://example.com/p'}\n    ml.x9.huge: {usd_per_hour: 1, as_of: 2026-01-01, "
                   "source: 'https://example.com/p'}\n")
    with pytest.raises(ConfigError) as err:
        load_prices(bad)
    text = str(err.value)
    assert str(bad) in text and "usd_per_hour" in text and "ml.x9.huge" in text


def test_recommendation_prefers_g6e_with_l2_over_p5_for_the_rag_line() -> None:
    inputs = inputs_from_line(PROJECT.business_line("rag-assistant"), PROJECT.platform)
    rec = recommend(inputs, ["ml.g6e.12xlarge", "ml.p5.48xlarge"], prices=PRICES)
    assert (rec.instance_type, rec.tp, rec.use_l2) == ("ml.g6e.12xlarge", 1, True)
    assert "$13.12/endpoint-hour" in rec.reason
    p5 = next(o for o in rec.options if o.instance.name == "ml.p5.48xlarge")
    assert rec.cost_ratio(p5) == pytest.approx(68.80 / 13.12) and rec.to_dict()["options"][1]["cost_ratio"] == 5.24


def test_recommendation_honours_a_ttft_target() -> None:
    inputs = PlanInputs(model=QWEN7, instance_type="ml.g6e.12xlarge", tokens=600, replicas=2)
    # At 600 tokens L2 does not pay; G6e prefills in ~181 ms, only P5 (~66 ms) meets 100 ms.
    rec = recommend(inputs, ["ml.g6e.12xlarge", "ml.p5.48xlarge"], prices=PRICES, ttft_slo_ms=100)
    assert rec.instance_type == "ml.p5.48xlarge" and not rec.use_l2
    cheap = recommend(inputs, ["ml.g6e.12xlarge", "ml.p5.48xlarge"], prices=PRICES, ttft_slo_ms=200)
    assert cheap.instance_type == "ml.g6e.12xlarge" and not cheap.use_l2
    missed = recommend(inputs, ["ml.g6e.12xlarge", "ml.p5.48xlarge"], prices=PRICES, ttft_slo_ms=10)
    assert missed.reason.startswith("no option meets the 10 ms TTFT target")


def test_vllm_args_are_parsed() -> None:
    assert parse_vllm_args(["/opt/ml/model", "--max-model-len", "8192", "--enable-prefix-caching",
                            "--kv-cache-dtype=fp8"]) == {
        "--max-model-len": "8192", "--enable-prefix-caching": "", "--kv-cache-dtype": "fp8"}


# --- command line --------------------------------------------------------------------------------

def test_cli_json_has_the_documented_keys(capsys) -> None:
    rc = load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge",
                                   "--tokens", "1925", "--l2-read-gibps", "1.84", "--json",
                                   "--prices", str(FIXTURE_PRICES)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["weights_gib"] == pytest.approx(14.185, abs=0.001)
    assert out["kv_bytes_per_token"] == 57_344 and out["kv_gib"] == 0.1028
    assert out["l2_read_ms"] == pytest.approx(55.87, abs=0.05) and out["fits"] is True
    assert out["calibration"]["l2_overhead_ms"] == pytest.approx(214.4, abs=0.1)
    assert out["recommendation"]["instance_type"].startswith("ml.g6e")


def test_cli_business_line_report(capsys) -> None:
    rc = load_script("plan").main(["--business-line", str(FIXTURE_CONFIG / "business-lines/rag-assistant.yaml"),
                                   "--config", str(FIXTURE_CONFIG), "--prices", str(FIXTURE_PRICES)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Qwen2-7B (bfloat16) on ml.g6e.12xlarge" in out
    assert "KV per token  57,344 B" in out and "cold / warm       2.70 x" in out
    assert "recommendation: ml.g6e.12xlarge TP 1 with L2" in out
    # The recommendation is a table, not one long line: a row per candidate, * on the choice.
    rows = out[out.index("recommendation:"):out.index("warning:")].splitlines()
    assert max(len(r) for r in rows) <= 100
    assert any(r.startswith("* ml.g6e.12xlarge") and r.split()[-2:] == ["13.12", "1.0x"] for r in rows)
    assert any(r.startswith("  ml.p5.48xlarge") and r.split()[-2:] == ["68.80", "5.2x"] for r in rows)


def test_cli_calibration_overrides(capsys) -> None:
    plan_cli = load_script("plan")
    assert plan_cli.main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge", "--json",
                          "--l2-overhead-ms", "100", "--prefill-efficiency", "0.2807"]) == 0
    out = json.loads(capsys.readouterr().out)
    # Twice the reference efficiency halves the cold TTFT; the warm one is 100 ms + the 72.6 ms read.
    assert out["cold_ttft_ms"] == pytest.approx(387.0, abs=0.5)
    assert out["warm_ttft_ms"] == pytest.approx(172.6, abs=0.1)
    assert out["calibration"]["l2_overhead_ms"] == 100.0
    with pytest.raises(SystemExit) as exc:
        plan_cli.main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge", "--prefill-efficiency", "2"])
    assert exc.value.code == 2
    assert "argument --prefill-efficiency:" in capsys.readouterr().err


def test_cli_exit_codes(capsys, tmp_path: Path) -> None:
    plan_cli = load_script("plan")
    assert plan_cli.main(["--model", "Qwen2.5-32B", "--instance-type", "ml.g6e.xlarge"]) == 1
    assert plan_cli.main(["--model", "Mistral-7B", "--instance-type", "ml.g6e.xlarge"]) == 2
    bad_line = tmp_path / "bad.yaml"
    bad_line.write_text("namespace: bad\ninstance_type: ml.g6e.99xlarge\n")
    assert plan_cli.main(["--business-line", str(bad_line)]) == 2
    err = capsys.readouterr().err
    assert "--hf-config" in err and "bad.yaml: instance_type" in err


def test_cli_business_line_is_checked_against_the_platform(tmp_path, capsys) -> None:
    """A line synthesis would refuse (type of no instance group) is not planned as if fine."""
    source = FIXTURE_CONFIG / "business-lines/rag-assistant.yaml"
    line = copy_line_file(source, tmp_path / "rag-assistant.yaml", source.read_text()
                          .replace("instance_type: ml.g6e.12xlarge", "instance_type: ml.g6e.48xlarge"))
    rc = load_script("plan").main(["--business-line", str(line), "--config", str(FIXTURE_CONFIG)])
    assert rc == 2
    assert "instance_type: no HyperPod instance group has this type" in capsys.readouterr().err


def test_l1_from_the_lines_lmcache_buffer(capsys) -> None:
    """With cache.l1_cpu_gib set (rag-assistant: 16 GiB), L1 per node = 16 GiB x the 2 replicas
    that share a 4-GPU node (not HyperPod's Tiered Storage share, which is not L1)."""
    rc = load_script("plan").main(["--business-line", str(FIXTURE_CONFIG / "business-lines/rag-assistant.yaml"),
                                   "--config", str(FIXTURE_CONFIG), "--json"])
    l1 = json.loads(capsys.readouterr().out)["l1"] if rc == 0 else None
    assert l1 is not None and l1["gib_per_replica"] == 16 and l1["gib_per_node"] == 32.0


# --- usable GPU memory, report title, warnings, plot (issue 10 item 14, issue 11 item 5) -------------

def test_every_gpu_has_a_sourced_usable_memory_below_its_marketed_size() -> None:
    for gpu in {t.gpu_model for t in INSTANCE_TYPES.values()}:
        mem = GPU_MEMORY[gpu]
        assert mem.cuda_total_gib < mem.datasheet_gb, gpu  # even read as GiB, the datasheet figure is not usable
        assert "vllm-project/vllm#" in mem.source and "datasheet" in mem.source
    # An L40S sold as 48 GB exposes about 44.5 GiB to CUDA (and 46,068 MiB to nvidia-smi).
    assert usable_gpu_memory_gib("NVIDIA L40S") == 44.53 and GPU_MEMORY["NVIDIA L40S"].nvidia_smi_mib == 46068
    with pytest.raises(KeyError, match="capacity/gpu_memory.py"):
        usable_gpu_memory_gib("NVIDIA B200")


def test_fit_budget_is_the_usable_memory_not_the_marketed_one() -> None:
    """Llama-3.1-8B with a 120k context fits 48 GiB x 0.9 but not the 44.53 GiB an L40S has."""
    llama8 = lookup_model("Llama-3.1-8B")
    p = plan(PlanInputs(model=llama8, instance_type="ml.g6e.xlarge", max_model_len=120_000))
    # weights 14.96 GiB; KV 131,072 B/token -> 120k tokens = 14.65 GiB; 40.08 - 14.96 - 2 = 23.1 GiB left: fits.
    assert p.fit.fits
    tight = plan(PlanInputs(model=llama8, instance_type="ml.g6e.xlarge", max_model_len=190_000))
    # 23.1 GiB holds 189,600 tokens: one 190k sequence does not fit (with 48 GiB it would: 26.3 GiB).
    assert not tight.fit.fits and "below one 190,000-token sequence" in tight.fit.reason
    assert plan(PlanInputs(model=lookup_model("Qwen2.5-32B"), instance_type="ml.g6e.xlarge")).fit.reason.endswith(
        "exceed 90% of 44.53 GiB usable (NVIDIA L40S)")


def test_report_title_names_the_model_not_the_hf_config_folder(tmp_path: Path, capsys) -> None:
    snapshot = tmp_path / "4e20de362430cd3b72f300e6b0f18e50e7166e08"
    snapshot.mkdir()
    (snapshot / "config.json").write_text(json.dumps(_llama8b_config()))
    plan_cli = load_script("plan")
    assert plan_cli.main(["--hf-config", str(snapshot), "--instance-type", "ml.g6e.xlarge"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title.startswith("Llama-3.1-8B architecture (bfloat16) on ml.g6e.xlarge") and "4e20de" not in title
    hub = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "abc123"
    hub.mkdir(parents=True)
    (hub / "config.json").write_text(json.dumps(_llama8b_config()))
    assert load_hf_config(hub).name == "meta-llama/Llama-3.1-8B-Instruct"
    assert load_hf_config(hub, name="our-llama").name == "our-llama"
    other = tmp_path / "mistral"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**_llama8b_config(), "architectures": ["MistralForCausalLM"],
                                                   "vocab_size": 32768}))
    assert load_hf_config(other).name == "MistralForCausalLM, 7.25B params"


def test_missing_hf_config_names_its_path(tmp_path: Path, capsys) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "config.json")):
        load_hf_config(tmp_path)
    with pytest.raises(SystemExit):
        load_script("plan").main(["--hf-config", str(tmp_path / "nope.json"), "--instance-type", "ml.g6e.xlarge"])
    assert f"argument --hf-config: no such file or directory: {tmp_path / 'nope.json'}" in capsys.readouterr().err


def test_the_recommended_types_unchecked_price_is_warned(tmp_path: Path, capsys) -> None:
    """Planning a P5 whose price is checked used to hide that the recommended G6e's is not."""
    table = tmp_path / "prices.yaml"
    table.write_text("regions:\n  us-west-2:\n"
                     "    ml.p5.48xlarge: {usd_per_hour: 68.8, as_of: 2026-11-29, source: 'https://example.com/p5', "
                     "checked: true}\n"
                     "    ml.g6e.12xlarge: {usd_per_hour: 13.12, as_of: 2026-11-29, source: 'https://example.com/g6e'}\n")
    rc = load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.p5.48xlarge", "--prices", str(table),
                                   "--candidates", "ml.g6e.12xlarge,ml.p5.48xlarge"])
    out = capsys.readouterr().out
    assert rc == 0 and "recommendation: ml.g6e.12xlarge" in out
    warnings = [line for line in out.splitlines() if line.startswith("warning: price")]
    assert warnings == ["warning: price of ml.g6e.12xlarge (13.12 USD/h, as of 2026-11-29) is unchecked; verify at "
                        "https://example.com/g6e"]
    rec = recommend(PlanInputs(model=QWEN7, instance_type="ml.p5.48xlarge"), ["ml.g6e.12xlarge", "ml.p5.48xlarge"],
                    prices=load_prices(table))
    assert rec.to_dict()["warnings"] == [warnings[0].removeprefix("warning: ")]


def test_unchecked_prices_are_one_line_in_the_report_and_each_in_json(tmp_path: Path, capsys) -> None:
    """Every price of the shipped table is unchecked: the report used to print one warning per
    candidate type (9 lines on every run); now one line with the count and how to check."""
    table = tmp_path / "prices.yaml"
    table.write_text("regions:\n  us-west-2:\n"
                     "    ml.g6e.xlarge: {usd_per_hour: 2.33, as_of: 2026-11-29, source: 'https://example.com/a'}\n"
                     "    ml.g6e.12xlarge: {usd_per_hour: 13.12, as_of: 2026-11-30, source: 'https://example.com/a'}\n"
                     "    ml.g6e.48xlarge: {usd_per_hour: 37.66, as_of: 2026-11-29, source: 'https://example.com/a'}\n"
                     "    ml.p5.48xlarge: {usd_per_hour: 68.8, as_of: 2026-11-29, source: 'https://example.com/p5', "
                     "checked: true}\n")
    args = ["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge", "--prices", str(table)]
    assert load_script("plan").main(args) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: 3 prices used here are unchecked (as of 2026-11-29 to 2026-11-30): compare each "
                        "with https://example.com/a, then set checked: true in the price table (--prices, default "
                        "config/prices.yaml); --json lists each"]
    assert load_script("plan").main([*args, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["recommendation"]["warnings"]
    assert sorted(w.split(" (")[0] for w in listed) == ["price of ml.g6e.12xlarge", "price of ml.g6e.48xlarge",
                                                        "price of ml.g6e.xlarge"]


def test_collapsing_keeps_other_warnings_and_their_order() -> None:
    from capacity.planner import collapse_unchecked_prices, price_warnings
    from capacity.prices import PriceTable

    prices = PriceTable.model_validate({"regions": {"us-west-2": {
        "ml.g6e.xlarge": {"usd_per_hour": 2.33, "as_of": "2026-11-29", "source": "https://example.com/a"},
        "ml.g6e.12xlarge": {"usd_per_hour": 13.12, "as_of": "2026-11-29", "source": "https://example.com/b"}}}})
    plans = [plan(PlanInputs(model=QWEN7, instance_type=t), prices=prices) for t in ("ml.g6e.xlarge", "ml.g6e.12xlarge")]
    detailed = [w for q in plans for w in price_warnings(prices, "us-west-2", q.instance.name)]
    warnings = ["L2 does not pay", detailed[0], "no price for ml.p5.48xlarge", detailed[1]]
    assert collapse_unchecked_prices(warnings, plans) == [
        "L2 does not pay", "2 prices used here are unchecked (as of 2026-11-29): compare each with its source, then "
        "set checked: true in the price table (--prices, default config/prices.yaml); --json lists each",
        "no price for ml.p5.48xlarge"]
    assert collapse_unchecked_prices(warnings[:2], plans) == warnings[:2]  # one is left as it is


def test_cli_chunk_size_zero_names_the_flag(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.xlarge", "--chunk-size", "0"])
    assert exc.value.code == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "argument --chunk-size: must be >= 1 (got 0)" in err and "chunk_tokens" not in err


def test_plot_cold_vs_warm_ttft_with_the_break_even(tmp_path: Path, capsys) -> None:
    from operator_tools.plots import plan_figure

    png = tmp_path / "ttft.png"
    assert load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge",
                                     "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    p = plan(PlanInputs(model=QWEN7, instance_type="ml.g6e.12xlarge"))
    ax = plan_figure(p).axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("prompt length (tokens)", "TTFT (ms)")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"cold TTFT (prefill)", "warm TTFT (L2 hit, 100% of the prompt)",
                          "break-even 783 tokens", "planned prompt 2,500 tokens"}
    assert lines["break-even 783 tokens"].get_xdata()[0] == pytest.approx(p.timing.break_even_tokens)
    cold, warm = lines["cold TTFT (prefill)"], lines["warm TTFT (L2 hit, 100% of the prompt)"]
    # Default range: 1 token to twice the prompt; the curves cross at the break-even.
    xs = list(cold.get_xdata())
    assert xs[0] == 1 and xs[-1] == 5000 and len(xs) == 64
    below = [k for k, x in enumerate(xs) if x < p.timing.break_even_tokens]
    above = [k for k, x in enumerate(xs) if x > p.timing.break_even_tokens]
    assert all(cold.get_ydata()[k] < warm.get_ydata()[k] for k in below)
    assert all(cold.get_ydata()[k] > warm.get_ydata()[k] for k in above)

    # The series are the planner's own figures: through the reference run's calibration point.
    explicit = {line.get_label(): line for line in plan_figure(p, lengths=[500, 1000, 2500]).axes[0].get_lines()}
    expected = [timing(QWEN7, L40S, 1, "bfloat16", tokens=n).cold_ttft_ms for n in (500, 1000)] + [774.0]
    assert list(explicit["cold TTFT (prefill)"].get_ydata()) == pytest.approx(expected, abs=0.01)
    assert explicit["warm TTFT (L2 hit, 100% of the prompt)"].get_ydata()[-1] == pytest.approx(287.0, abs=0.01)


def test_plot_names_the_file_it_wrote_on_stderr(tmp_path: Path, capsys) -> None:
    svg = tmp_path / "ttft.svg"
    assert load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge", "--json",
                                     "--plot", str(svg)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["fits"] is True and err == f"plot: wrote {svg}\n" and svg.is_file()


def test_plot_file_extension_is_checked(tmp_path: Path, capsys) -> None:
    rc = load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge",
                                   "--plot", str(tmp_path / "ttft.gif")])
    assert rc == cli.EXIT_ERROR
    assert "'.gif' not supported; allowed: .png, .svg, .pdf" in capsys.readouterr().err
    assert not (tmp_path / "ttft.gif").exists()


@pytest.mark.parametrize("where", ["a folder", "no such place"])
def test_a_plot_that_cannot_be_written_is_an_error_not_a_traceback(tmp_path: Path, capsys, where: str) -> None:
    """--plot at a folder named like a figure, or where nothing can be created (issue 27): exit 2,
    one error line naming the file, after the report."""
    target = tmp_path / "ttft.png"
    if where == "a folder":
        target.mkdir()
    else:
        target = Path("/proc/no-such-dir-here.png")
    rc = load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge", "--plot", str(target)])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_ERROR and err.startswith(f"error: plot file {target}") and "Traceback" not in err


def test_a_bad_tp_on_the_command_line_reads_as_a_sentence(capsys) -> None:
    rc = load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge", "--tp", "3"])
    assert rc == cli.EXIT_ERROR
    assert capsys.readouterr().err == "error: tp: tp 3 does not divide Qwen2-7B's 28 attention heads / 4 KV heads\n"


def test_bad_inputs_raise_one_typed_error_naming_every_field() -> None:
    from capacity.fit import PlanInputError

    with pytest.raises(PlanInputError) as err:
        PlanInputs(model=QWEN7, instance_type="ml.g6e.12xlarge", tp=3, gpu_memory_utilization=0, dtype="fp64",
                   chunk_tokens=0)
    assert [p.field for p in err.value.problems] == ["chunk_tokens", "gpu_memory_utilization", "tp", "dtype"]
    assert isinstance(err.value, ValueError) and str(err.value) == "; ".join(p.message for p in err.value.problems)
    assert "tp 3 does not divide Qwen2-7B's 28 attention heads" in str(err.value)


def test_cli_business_line_report_shows_the_node_budget_and_the_l2_sizes(capsys) -> None:
    rc = load_script("plan").main(["--business-line", str(FIXTURE_CONFIG / "business-lines/rag-assistant.yaml"),
                                   "--prices", str(FIXTURE_PRICES)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "L2    500 GiB, the line's l2_size              9,362,285 for this line (its janitor deletes above 80%)" in out
    assert "      5,400 GiB Curvine pool, 3 Workers        101,112,685 shared by the L2 lines" in out
    assert "nodes         ml.g6e.12xlarge: 2 node(s) of g6e-inference, each 4 GPU, 24 CPU, 384.00 GiB" in out
    assert "  - Tiered Storage 20%                -    76.80 GiB  of host memory, reserved for HyperPod's" in out
    assert "  = for the lines             20.52 CPU   298.92 GiB  per node" in out
    # Packed with the config's other lines on the type, by the config check's own function.
    assert "  node 2: rag-assistant x2; free 2 GPU, 0.52 CPU, 138.92 GiB" in out
    assert "placed by first-fit decreasing with legal-search, ticket-triage: every replica fits" in out


def test_cli_business_line_that_does_not_fit_its_nodes_answers_no(tmp_path, capsys) -> None:
    """What synthesis refuses, the planner reports with the same words, and exits 1 (the answer is no)."""
    from tests.example_config import copy_example_config, edit_yaml

    config = copy_example_config(tmp_path / "config")
    line = config / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line, lambda d: set_fixed(d, replicas=3))
    with pytest.raises(ConfigError) as refused:
        load_project(config)
    rc = load_script("plan").main(["--business-line", str(line), "--prices", str(FIXTURE_PRICES), "--json"])
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert rc == cli.EXIT_NO and nodes["fits"] is False
    assert nodes["problems"] == [str(p) for p in refused.value.problems]
    assert nodes["budgets"][0]["free_cpu_millicores"] == 20_520 and nodes["budgets"][0]["free_memory_gib"] == 298.92
