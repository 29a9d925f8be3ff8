"""Loading a project as every command does: the config layer's checks, then the planner's.

``platform_config`` is the bottom layer and imports nothing above it (``tests/test_layers.py``), so
a check that needs the planner lives here, in the layer that owns the planner, and is handed to the
config loader as a :data:`platform_config.loader.LineCheck`. ``app.py``, ``scripts/manifests.py``
and every tool load through :func:`load_checked_project`, so ``make synth`` and the tools refuse
the same configs (a test keeps every entry point on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from capacity.model_specs import lookup_model
from capacity.fit import LINE_CONFIG_FIELDS, PlanInputError, choose_tp, inputs_from_line, kv_bytes_per_token_per_gpu
from platform_config import BusinessLineConfig, ConfigProblem, PlatformConfig, ProjectConfig, load_project
from platform_config.fields import quantity_bytes
from platform_config.vllm_args import PIPELINE_PARALLEL_FLAG, parallel_sizes
from platform_config.vllm_args import max_model_len as vllm_max_model_len

#: Tokens a chat template may add around one message (role header, separators, end of turn): Qwen2's
#: ChatML adds 5 (``<|im_start|>``, the role, a newline, ``<|im_end|>``, a newline), Llama 3's 5
#: (``<|start_header_id|>``, the role, ``<|end_header_id|>``, a blank line, ``<|eot_id|>``). An allowance.
TEMPLATE_TOKENS_PER_MESSAGE = 16
#: Tokens a chat template or the tokenizer may add once per prompt: BOS, a date header (Llama 3.1's
#: template puts "Cutting Knowledge Date: ... Today Date: ..." into the system turn, about 20), a
#: default system prompt. An allowance: a template that injects more (long default instructions, tool
#: definitions) exceeds the bound, which the janitor's measured figures then show.
TEMPLATE_TOKENS_PER_PREFIX = 64
#: Header LMCache 0.5.5 writes at the start of each chunk file (``save_chunk_meta``, pinned true): 4
#: bytes x (2 + 5 per KV group), one group for the dense models here (lmcache/v1/protocol.py
#: ``init_remote_metadata_info``).
CHUNK_FILE_HEADER_BYTES = 4 * (2 + 5)


@dataclass(frozen=True)
class HotPrefixBudget:
    """An upper bound of the L2 bytes a line's hot prefixes pin (:func:`hot_prefix_budget`).

    Attributes:
        token_bound: tokens of all prefixes at most: UTF-8 bytes of their text (a byte-level BPE
            token covers at least one byte) plus the template allowances.
        pinned_tokens: of them, the tokens in full chunks (what LMCache stores), summed per prefix.
        kv_bytes_per_token: KV bytes per token of the model over all ranks (TP x PP files).
        files: chunk files (chunks x ranks); pinned_bytes: the bound, headers included.
        l2_size_bytes, share: ``cache.l2_size`` and pinned_bytes / it; max_share: ``max_l2_fraction``.
    """

    token_bound: int
    pinned_tokens: int
    kv_bytes_per_token: int
    files: int
    pinned_bytes: int
    l2_size_bytes: int
    share: float
    max_share: float

    @property
    def fits(self) -> bool:
        return self.share <= self.max_share


def prefix_token_bound(texts: list[str], chat: bool) -> int:
    """Tokens of one prefix at most: its UTF-8 bytes, plus :data:`TEMPLATE_TOKENS_PER_MESSAGE` per chat
    message and :data:`TEMPLATE_TOKENS_PER_PREFIX` (a raw prompt: 1, the BOS vLLM adds)."""
    size = sum(len(t.encode("utf-8")) for t in texts)
    return size + (TEMPLATE_TOKENS_PER_MESSAGE * len(texts) + TEMPLATE_TOKENS_PER_PREFIX if chat else 1)


def hot_prefix_budget(line: BusinessLineConfig) -> HotPrefixBudget:
    """The bound of the KV bytes ``line``'s declared prefixes pin in L2: per prefix its token bound
    (:func:`prefix_token_bound`) rounded down to full ``cache.chunk_size_tokens`` chunks, x the model's
    KV bytes per token over every rank (:func:`capacity.fit.kv_bytes_per_token_per_gpu` x TP, x PP
    stages), plus one header per chunk file. The KV dtype is the planner's (``--kv-cache-dtype``, else
    ``model.dtype``, fp8 weights keeping a 16-bit cache).

    Raises:
        KeyError: the model is not in the planner's table.
    """
    spec = lookup_model(line.model.name)
    inputs = inputs_from_line(line, None, model=spec)
    tp = line.tensor_parallel_size
    pp = parallel_sizes(line.vllm.args).get(PIPELINE_PARALLEL_FLAG, 1)
    per_token = kv_bytes_per_token_per_gpu(spec, tp, inputs.effective_kv_dtype) * tp
    chunk = line.cache.chunk_size_tokens
    bounds = [prefix_token_bound(p.texts(), p.kind == "chat") for p in line.hot_prefixes.prefixes]
    pinned = sum(b // chunk * chunk for b in bounds)
    files = pinned // chunk * tp * pp
    total = pinned * per_token + files * CHUNK_FILE_HEADER_BYTES
    size = int(quantity_bytes(line.cache.l2_size))
    return HotPrefixBudget(sum(bounds), pinned, per_token, files, total, size, total / size,
                           line.hot_prefixes.max_l2_fraction)


def prefix_length_warnings(path: Path, line: BusinessLineConfig) -> list[str]:
    """One warning per hot prefix whose token bound (:func:`prefix_token_bound`) does not leave one
    token (the warm-up's) within ``vllm.args --max-model-len``: it may be longer than the model's
    length, and then vLLM refuses the warm-up and every request that starts with the prefix.

    A warning, not a refusal: the bound counts a token per UTF-8 byte, about 4x the tokens of English
    text under the BPE tokenizers of the planner's models, and the config cannot tokenize (synthesis
    is offline). The janitor tokenizes on a replica and reports a prefix that is too long as
    ``too_long`` (alert ``KvCacheHotPrefixWarmupFailing``, docs/observability.md).
    """
    length = vllm_max_model_len(line.vllm.args)
    if length is None:
        return []
    out = []
    for i, prefix in enumerate(line.hot_prefixes.prefixes):
        bound = prefix_token_bound(prefix.texts(), prefix.kind == "chat")
        if bound + 1 > length:
            out.append(
                f"{path}: hot_prefixes.prefixes.{i} ({prefix.name}) may be longer than vllm.args --max-model-len "
                f"{length}: up to {bound:,} tokens (its UTF-8 bytes plus the chat template's; a bound, as the config "
                "cannot tokenize). A prefix longer than the model's length is never warmed and vLLM refuses every "
                "request that starts with it; the L2 janitor reports it as too_long (KvCacheHotPrefixWarmupFailing). "
                f"Keep each prefix under {length:,} tokens, or raise --max-model-len")
    return out


def hot_prefix_problems(
    platform: PlatformConfig, lines: list[tuple[Path, BusinessLineConfig]]
) -> tuple[list[ConfigProblem], list[str]]:
    """Each line's hot prefixes must pin at most ``hot_prefixes.max_l2_fraction`` of its
    ``cache.l2_size`` (:func:`hot_prefix_budget`, a bound: the config cannot tokenize). A model the
    planner's table does not know is not checked (a warning); the janitor measures pinned bytes anyway.

    Returns:
        ``(problems, warnings)``.
    """
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    for path, line in lines:
        if not (line.cache.l2_enabled and line.hot_prefixes.active):
            continue
        warnings += prefix_length_warnings(path, line)
        try:
            b = hot_prefix_budget(line)
        except PlanInputError:  # a bad planner input: model_fit_problems reports it on its key
            continue
        except KeyError:
            warnings.append(f"{path}: model.name {line.model.name!r} is not in the planner's table "
                            "(capacity/model_specs.py), so the L2 share its hot prefixes pin is not checked; the L2 "
                            "janitor reports it (kvcache_l2_janitor_pinned_bytes)")
            continue
        if b.fits:
            continue
        gib = 2**30
        problems.append(ConfigProblem(
            str(path), "hot_prefixes.prefixes",
            f"the prefixes may pin up to {b.pinned_bytes / gib:,.2f} GiB of L2 ({b.share:.1%} of cache.l2_size "
            f"{line.cache.l2_size}): at most {b.token_bound:,} tokens (their UTF-8 bytes plus the chat template's), "
            f"{b.pinned_tokens:,} of them in full {line.cache.chunk_size_tokens}-token chunks, x {b.kv_bytes_per_token:,} "
            f"B of KV per token of {line.model.name}; allowed: at most hot_prefixes.max_l2_fraction "
            f"{b.max_share:g} of it ({b.max_share * b.l2_size_bytes / gib:,.2f} GiB): shorter prefixes, a larger "
            "max_l2_fraction or a larger l2_size (scripts/plan.py --business-line shows the figures)"))
    return problems, warnings


def model_fit_problems(
    platform: PlatformConfig, lines: list[tuple[Path, BusinessLineConfig]]
) -> tuple[list[ConfigProblem], list[str]]:
    """Each line's model must fit ``gpus_per_replica`` GPUs of its instance type.

    The rule is the planner's, called, not copied: :func:`capacity.fit.choose_tp` over
    :func:`capacity.fit.inputs_from_line`, i.e. exactly what ``scripts/plan.py
    --business-line <file>`` reports with its default flags (weights per GPU plus the runtime
    reserve within vLLM's ``--gpu-memory-utilization`` share, and room left for one sequence of
    ``--max-model-len`` tokens, or of the planner's default prompt). So synthesis refuses what
    the planner says does not fit, and nothing else.

    A model the planner's table (``capacity/model_specs.py``, matched by normalized
    ``model.name``) does not know cannot be sized offline: its fit is skipped and a warning
    names the file and the command that checks it (``plan.py --hf-config``).

    Returns:
        ``(problems, warnings)``.
    """
    problems: list[ConfigProblem] = []
    warnings: list[str] = []
    for path, line in lines:
        try:
            inputs = inputs_from_line(line, platform)
        except KeyError:  # the only KeyError of inputs_from_line: the model is not in the table
            warnings.append(
                f"{path}: model.name {line.model.name!r} is not in the planner's table (capacity/model_specs.py), "
                f"so whether it fits {line.instance_type} with gpus_per_replica {line.gpus_per_replica} is not "
                f"checked; check it with: scripts/plan.py --business-line {path} --hf-config <its config.json>")
            continue
        except PlanInputError as exc:  # each problem names its planner field; report the config key
            problems += [ConfigProblem(str(path), LINE_CONFIG_FIELDS.get(p.field, p.field), p.message)
                         for p in exc.problems]
            continue
        fit, min_tp = choose_tp(inputs)
        if fit.fits:
            continue
        allowed = (f"gpus_per_replica {min_tp} or more" if min_tp is not None
                   else "an instance type with more GPU memory, or a smaller model or dtype")
        problems.append(ConfigProblem(
            str(path), "gpus_per_replica",
            f"{line.model.name} ({line.model.dtype}) does not fit {line.instance_type} at "
            f"gpus_per_replica {line.gpus_per_replica}: {fit.reason}; allowed: {allowed} "
            f"(scripts/plan.py --business-line {path} shows the figures)", line.gpus_per_replica))
    return problems, warnings


def load_checked_project(config_dir: str | Path) -> ProjectConfig:
    """:func:`platform_config.load_project` of ``config_dir`` with the planner's fit
    (:func:`model_fit_problems`) and the hot prefixes' L2 share (:func:`hot_prefix_problems`) as more
    checks: what ``make synth``, ``make manifests`` and every tool load.

    Raises:
        ConfigError: every problem of every file, the planner's included, each naming the file,
            the field or line, and what is allowed.
    """
    return load_project(config_dir, line_checks=(model_fit_problems, hot_prefix_problems))
