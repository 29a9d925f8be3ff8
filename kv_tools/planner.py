"""Capacity, latency and cost planner for one model on one HyperPod instance type.

What it computes (all per GPU, per replica and per endpoint where it matters):

* weights: ``params x bytes per element`` in GiB (2^30 B) and GB (10^9 B); whether they fit
  with a tensor-parallel (TP) degree, and the smallest TP that fits;
* KV cache bytes per token: ``2 x layers x KV heads x head_dim x bytes`` (docs/sources.md §5);
* tier capacities: L0 = usable GPU memory (what CUDA reports, :mod:`kv_tools.gpu_memory`) x
  ``gpu_memory_utilization`` - weights/TP - runtime reserve, in tokens; L1 = LMCache's CPU buffer
  in each vLLM pod (``cache.l1_cpu_gib``, else LMCache's default 5 GiB per TP rank) x the replicas
  on a node; L2 = the line's ``l2_size`` and the Curvine pool it shares
  (:func:`platform_config.loader.l2_pool_gib`, the config check's figure), or from flags NVMe less a
  reserve x nodes;
* times: reading N tokens of KV from L2 at a bandwidth, prefilling N tokens at a calibrated
  rate, cold vs warm TTFT and their ratio, and the break-even prompt length;
* cost per endpoint-hour from ``config/prices.yaml`` and a recommendation.

**Calibration** (:data:`REFERENCE_RUN`, docs/sources.md §1): the reference deployment measured
Qwen2-7B-Instruct (fp16, TP 1, one L40S) at TTFT 774 ms cold and 287 ms warm from L2 for a
2,500-token prompt, and an L2 read of 1.84 GiB/s. Two constants come from that run:

1. the *prefill efficiency*: prefill FLOPs of those 2,500 tokens divided by 774 ms, as a
   fraction of the L40S dense BF16 peak (362.05 TFLOP/s). Prefill FLOPs of N tokens are
   ``2 x params x N`` (matrix multiplies) ``+ 2 x layers x (heads x head_dim) x N^2`` (causal
   attention: Q.K^T and A.V each ``2 x i x width`` FLOPs for the token at position i, summed
   over i). The cold TTFT is modelled as prefill alone, so the fraction absorbs the fixed
   request overheads (HTTP, tokenisation, scheduling) of the reference run: about 14% of peak.
   Other models and GPUs scale by their FLOPs and by ``peak x TP`` (TP communication is not
   modelled: optimistic for TP > 1);
2. the *L2 fixed overhead*: warm TTFT minus the time to read the prompt's KV at 1.84 GiB/s,
   287 - 72.6 = about 214 ms (chunk lookups, FUSE opens, copy into GPU memory, scheduling).

With these the reference's break-even, where L2 read + overhead = prefill saved, is about 783
tokens. The blog's rule of thumb says "~1,000"; its own measurements (about 1.0x at 500
tokens, 1.7x at 1,000) put the crossing between 500 and 1,000, which is where the model lands.
The model reproduces the calibration point exactly and is pessimistic below 1,000 tokens
(0.66x at 500, 1.25x at 1,000) and optimistic above 2,500 (3.1x at 3,000 vs 2.2x measured).

L2 reads scale with TP: each TP rank runs its own LMCache engine and reads its own chunk
files (the chunk key includes the worker id), so ``--l2-read-gibps`` is per rank and a
replica reads at ``TP x`` that rate. This is an assumption, not a measurement.

L2 reads are timed at the reference's *cross-node* read (1.84 GiB/s), never at its node-local
store (9.60 GiB/s): with the pinned Curvine v0.3.2-alpha and its CSI driver no L2 read or write
is node-local, because the FUSE client's identity (``localhost``) never matches a Worker's (the
node IP) and the driver cannot give the FUSE pods a per-node one (docs/l2-cache.md, "No
node-local reads or writes"; ``k8s.curvine_config.local_worker_pairs``). Every chunk crosses the
network.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable

from kv_tools.gpu_memory import usable_gpu_memory_gib
from kv_tools.model_specs import ModelSpec, dtype_bytes, lookup_model
from kv_tools.prices import Price, PriceTable
from platform_config import INSTANCE_TYPES, BusinessLineConfig, InstanceType, PlatformConfig, get_instance_type, vllm_args
from platform_config import node_fit
from platform_config.loader import l2_pool_gib
from platform_config.models import InstanceGroupConfig, quantity_bytes

GIB = 2**30
GB = 10**9

#: vLLM's default ``--gpu-memory-utilization`` (vllm/engine/arg_utils.py): the share of GPU
#: memory vLLM may use for weights, activations and the KV cache.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
#: GiB per GPU kept for activations at the default batch size, the CUDA context and CUDA
#: graphs. A planning figure; read the real one from vLLM's start-up log ("Available KV
#: cache memory") and pass ``--runtime-reserve-gib``.
DEFAULT_RUNTIME_RESERVE_GIB = 2.0
#: Share of each node's NVMe kept out of the L2 pool (model weight copies, logs, images).
DEFAULT_NVME_RESERVE_FRACTION = 0.10
#: LMCache's default chunk size, tokens (docs/sources.md §5).
DEFAULT_CHUNK_TOKENS = 256
#: TP degrees vLLM is normally run with on one node.
TP_CHOICES = (1, 2, 4, 8)
#: LMCache's default ``max_local_cpu_size`` (0.5.5: 5.0, read as GiB), per TP rank: the L1 buffer of
#: a pod whose line leaves ``cache.l1_cpu_gib`` unset and whose operator sets nothing else
#: (docs/sources.md §5, §8).
LMCACHE_DEFAULT_L1_GIB_PER_RANK = 5.0


@dataclass(frozen=True)
class ReferenceRun:
    """A measured deployment the planner calibrates on (defaults: the AWS blog's run).

    Attributes:
        model: model name in :data:`kv_tools.model_specs.MODELS`.
        gpu_instance_type: an instance type with the GPU it ran on.
        tp: tensor-parallel degree.
        kv_dtype: dtype of the KV cache.
        prompt_tokens: prompt length of the TTFT measurements, tokens.
        cold_ttft_ms: TTFT with nothing cached, ms.
        warm_ttft_ms: TTFT with the whole prompt's KV read from L2 by another pod, ms.
        l2_read_gibps: measured cross-node L2 read bandwidth, GiB/s: what every L2 read gets
            (module docstring: no I/O is node-local).
        source: where the figures come from.
    """

    model: str = "Qwen2-7B"
    gpu_instance_type: str = "ml.g6e.12xlarge"
    tp: int = 1
    kv_dtype: str = "float16"
    prompt_tokens: int = 2500
    cold_ttft_ms: float = 774.0
    warm_ttft_ms: float = 287.0
    l2_read_gibps: float = 1.84
    source: str = ("AWS ML blog 'Tiered KV cache for large LLMs on Amazon SageMaker HyperPod with "
                   "Curvine' (docs/sources.md §1): Qwen2-7B-Instruct fp16, TP 1, L40S")


REFERENCE_RUN = ReferenceRun()


def prefill_flops(model: ModelSpec, tokens: int, cached_tokens: int = 0) -> float:
    """FLOPs to prefill ``tokens`` prompt tokens of which the first ``cached_tokens`` are
    already cached: ``2 x params x new + 2 x layers x width x (tokens^2 - cached^2)``.

    The quadratic term is causal attention: the token at position i costs ``4 x i x width``
    FLOPs per layer (Q.K^T and A.V); summing i over the new tokens gives the difference of
    squares (see the module docstring).
    """
    new = tokens - cached_tokens
    return 2.0 * model.params * new + 2.0 * model.layers * model.attention_width * (
        float(tokens) ** 2 - float(cached_tokens) ** 2)


def l2_read_ms(kv_bytes: float, read_gibps: float) -> float:
    """Milliseconds to read ``kv_bytes`` at ``read_gibps`` GiB/s (1,925 tokens of Qwen2-7B,
    0.1028 GiB, at 1.84 GiB/s: 55.9 ms; the reference measured 55.75 ms)."""
    return kv_bytes / (read_gibps * GIB) * 1000.0


@dataclass(frozen=True)
class Calibration:
    """The two constants derived from a :class:`ReferenceRun` (see the module docstring).

    Attributes:
        efficiency: achieved prefill FLOP/s over the GPU's dense BF16 peak (dimensionless).
        l2_overhead_ms: fixed cost of a warm (L2) request beyond the read itself, ms.
        reference: the run they were derived from.
    """

    efficiency: float
    l2_overhead_ms: float
    reference: ReferenceRun

    @classmethod
    def from_reference(cls, ref: ReferenceRun = REFERENCE_RUN) -> "Calibration":
        """Derive the constants from ``ref``.

        Raises:
            ValueError: the warm TTFT is shorter than the bare L2 read of the prompt, which
                would make the overhead negative.
        """
        model = lookup_model(ref.model)
        peak = get_instance_type(ref.gpu_instance_type).gpu_peak_bf16_tflops * 1e12 * ref.tp
        achieved = prefill_flops(model, ref.prompt_tokens) / (ref.cold_ttft_ms / 1000.0)
        read = l2_read_ms(ref.prompt_tokens * model.kv_bytes_per_token(ref.kv_dtype), ref.l2_read_gibps * ref.tp)
        overhead = ref.warm_ttft_ms - read
        if overhead < 0:
            raise ValueError(f"warm TTFT {ref.warm_ttft_ms} ms is below the L2 read time {read:.1f} ms")
        return cls(efficiency=achieved / peak, l2_overhead_ms=overhead, reference=ref)


DEFAULT_CALIBRATION = Calibration.from_reference()


def valid_tp(model: ModelSpec, tp: int) -> bool:
    """vLLM's rule: query heads divide by TP, and KV heads divide by TP or TP by KV heads."""
    return model.attention_heads % tp == 0 and (model.kv_heads % tp == 0 or tp % model.kv_heads == 0)


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int, kv_dtype: str) -> int:
    """KV bytes per token held by one GPU: its share of the KV heads (at least one head:
    with TP above the KV head count vLLM replicates heads)."""
    heads = max(1, model.kv_heads // tp)
    return 2 * model.layers * heads * model.head_dim * dtype_bytes(kv_dtype)


@dataclass(frozen=True)
class InputProblem:
    """One bad planner input: the :class:`PlanInputs` field at fault and what is wrong."""

    field: str
    message: str


class PlanInputError(ValueError):
    """Bad planner inputs, each naming its :class:`PlanInputs` field (``problems``); the message
    joins the problems' messages. A ``ValueError``, so callers that only print it need not know
    the type; the config loader maps each field to the business-line key it came from
    (:data:`LINE_CONFIG_FIELDS`) instead of guessing from the text."""

    def __init__(self, problems: Iterable[InputProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(p.message for p in self.problems))


#: Business-line config key each :class:`PlanInputs` field comes from in :func:`inputs_from_line`
#: (``vllm.args`` for the flags read from it), so a bad value is reported on the key to change.
LINE_CONFIG_FIELDS: dict[str, str] = {
    "model": "model.name",
    "instance_type": "instance_type",
    "dtype": "model.dtype",
    "kv_dtype": "vllm.args",
    "tp": "gpus_per_replica",
    "replicas": "replicas",
    "max_model_len": "vllm.args",
    "chunk_tokens": "cache.chunk_size_tokens",
    "gpu_memory_utilization": "vllm.args",
    "l1_gib_per_replica": "cache.l1_cpu_gib",
    "l2_size_gib": "cache.l2_size",
}


@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner needs; built from flags or from a business-line file.

    Units: ``*_gib`` GiB, ``*_gibps`` GiB/s, tokens as counts, fractions in [0, 1].
    ``tp`` None means "the smallest TP in (1, 2, 4, 8) that fits". ``kv_dtype`` None means
    "as vLLM's ``--kv-cache-dtype auto``": the model dtype, except bf16 for fp8 weights.
    ``l1_gib_per_replica`` None means LMCache's default (:data:`LMCACHE_DEFAULT_L1_GIB_PER_RANK` per
    TP rank), 0 means L1 off. ``l2_nodes`` None means the nodes the endpoint occupies;
    ``l2_node_capacity_gib`` None means NVMe less the reserve. From a platform,
    ``l2_pool_gib`` is the usable Curvine pool (:func:`platform_config.loader.l2_pool_gib`) and
    replaces nodes x capacity; ``l2_size_gib`` is the line's ``cache.l2_size`` and
    ``l2_high_watermark`` the share of it above which its janitor deletes.
    ``replica_cpu_millicores`` / ``replica_memory_bytes`` are what one replica's pod requests and
    ``node_room`` what a node of an instance type leaves for the lines' pods, ``(millicores, bytes)``
    (the config check's node budget, :func:`node_room_for`); given all three, a replica that does
    not fit a node's CPU or memory does not fit, and replicas per node are bounded by them too.
    """

    model: ModelSpec
    instance_type: str
    dtype: str = "bfloat16"
    kv_dtype: str | None = None
    tp: int | None = None
    replicas: int = 1
    tokens: int = 2500
    max_model_len: int = 0
    hit_ratio: float = 1.0
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    l2_read_gibps: float = REFERENCE_RUN.l2_read_gibps
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    runtime_reserve_gib: float = DEFAULT_RUNTIME_RESERVE_GIB
    #: GiB of LMCache CPU buffer per replica (a line's ``cache.l1_cpu_gib``); L1 per node is this
    #: times the replicas sharing a node. None: LMCache's default per TP rank; 0: L1 off.
    l1_gib_per_replica: float | None = None
    l2_nodes: int | None = None
    l2_node_capacity_gib: float | None = None
    l2_pool_gib: float | None = None
    l2_size_gib: float | None = None
    l2_high_watermark: float | None = None
    nvme_reserve_fraction: float = DEFAULT_NVME_RESERVE_FRACTION
    region: str = "us-west-2"
    replica_cpu_millicores: int | None = None
    replica_memory_bytes: int | None = None
    node_room: Callable[[str], tuple[int, int]] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Raises :class:`PlanInputError` naming every bad field."""
        checks = [
            ("instance_type", self.instance_type in INSTANCE_TYPES,
             f"instance type {self.instance_type!r} unknown; allowed: {', '.join(sorted(INSTANCE_TYPES))}"),
            ("tokens", self.tokens >= 1, f"tokens must be >= 1 (got {self.tokens})"),
            ("replicas", self.replicas >= 1, f"replicas must be >= 1 (got {self.replicas})"),
            ("hit_ratio", 0.0 <= self.hit_ratio <= 1.0, f"hit ratio must be within 0..1 (got {self.hit_ratio})"),
            ("chunk_tokens", self.chunk_tokens >= 1, f"chunk size must be >= 1 (got {self.chunk_tokens})"),
            ("l2_read_gibps", self.l2_read_gibps > 0,
             f"L2 read bandwidth must be > 0 GiB/s (got {self.l2_read_gibps})"),
            ("gpu_memory_utilization", 0.0 < self.gpu_memory_utilization <= 1.0,
             f"gpu memory utilization must be within (0, 1] (got {self.gpu_memory_utilization})"),
            ("runtime_reserve_gib", self.runtime_reserve_gib >= 0,
             f"runtime reserve must be >= 0 GiB (got {self.runtime_reserve_gib})"),
            ("l1_gib_per_replica", self.l1_gib_per_replica is None or self.l1_gib_per_replica >= 0,
             f"L1 GiB per replica must be >= 0 (got {self.l1_gib_per_replica})"),
            ("l2_pool_gib", self.l2_pool_gib is None or self.l2_pool_gib >= 0,
             f"L2 pool must be >= 0 GiB (got {self.l2_pool_gib})"),
            ("l2_size_gib", self.l2_size_gib is None or self.l2_size_gib > 0,
             f"L2 size must be > 0 GiB (got {self.l2_size_gib})"),
            ("nvme_reserve_fraction", 0.0 <= self.nvme_reserve_fraction < 1.0,
             f"NVMe reserve must be within [0, 1) (got {self.nvme_reserve_fraction})"),
        ]
        problems = [InputProblem(name, msg) for name, ok, msg in checks if not ok]
        if self.tp is not None and self.instance_type in INSTANCE_TYPES:
            gpus = INSTANCE_TYPES[self.instance_type].gpus
            if not 1 <= self.tp <= gpus:
                problems.append(InputProblem(
                    "tp", f"tp {self.tp} does not fit {self.instance_type} ({gpus} GPU(s)); allowed: 1..{gpus}"))
            elif not valid_tp(self.model, self.tp):
                problems.append(InputProblem("tp", f"tp {self.tp} does not divide {self.model.name}'s "
                                                   f"{self.model.attention_heads} attention heads / "
                                                   f"{self.model.kv_heads} KV heads"))
        for name in ("dtype", "kv_dtype"):
            value = getattr(self, name)
            if value is not None:
                try:
                    dtype_bytes(value)
                except ValueError as exc:
                    problems.append(InputProblem(name, str(exc)))
        if problems:
            raise PlanInputError(problems)

    @property
    def effective_kv_dtype(self) -> str:
        """The KV cache dtype in use (see the class docstring)."""
        if self.kv_dtype:
            return self.kv_dtype
        return "bfloat16" if self.dtype == "fp8" else self.dtype


@dataclass(frozen=True)
class Fit:
    """Whether the weights and one full-length sequence fit at a TP degree."""

    tp: int
    fits: bool
    weights_per_gpu_gib: float
    kv_free_per_gpu_gib: float
    l0_tokens_per_replica: int
    reason: str


def _fit(inputs: PlanInputs, instance: InstanceType, tp: int) -> Fit:
    model = inputs.model
    weights_gib = model.weights_bytes(inputs.dtype) / GIB
    per_gpu = weights_gib / tp
    # vLLM's share applies to the memory CUDA reports, not the marketed GB (kv_tools/gpu_memory.py).
    usable = usable_gpu_memory_gib(instance.gpu_model)
    budget = usable * inputs.gpu_memory_utilization
    free = budget - per_gpu - inputs.runtime_reserve_gib
    per_token = kv_bytes_per_token_per_gpu(model, tp, inputs.effective_kv_dtype)
    tokens = max(0, int(free * GIB // per_token)) if free > 0 else 0
    need = max(inputs.tokens, inputs.max_model_len)
    room = node_room_problem(inputs, instance)
    if room:
        return Fit(tp, False, per_gpu, max(free, 0.0), tokens, room)
    if free <= 0:
        reason = (f"weights {per_gpu:.1f} GiB/GPU + reserve {inputs.runtime_reserve_gib:.1f} GiB exceed "
                  f"{inputs.gpu_memory_utilization:.0%} of {usable:.2f} GiB usable ({instance.gpu_model})")
    elif tokens < need:
        reason = (f"KV room for {tokens:,} tokens per replica, below one {need:,}-token sequence "
                  "(vLLM refuses to start)")
    else:
        reason = f"{per_gpu:.1f} GiB weights/GPU, {free:.1f} GiB/GPU left for KV ({tokens:,} tokens per replica)"
    return Fit(tp, free > 0 and tokens >= need, per_gpu, max(free, 0.0), tokens, reason)


def node_room_problem(inputs: PlanInputs, instance: InstanceType) -> str | None:
    """Why one replica's CPU or memory request does not fit a node of ``instance`` (the node budget
    of :attr:`PlanInputs.node_room`), or None (also when they are not counted)."""
    if inputs.node_room is None:
        return None
    cpu_room, memory_room = inputs.node_room(instance.name)
    cpu, memory = inputs.replica_cpu_millicores, inputs.replica_memory_bytes
    if memory is not None and memory > memory_room:
        return (f"{node_fit.gib_text(memory)} of memory per replica, more than a {instance.name} node has for the "
                f"lines' pods ({node_fit.gib_text(memory_room)})")
    if cpu is not None and cpu > cpu_room:
        return (f"{node_fit.cpu_text(cpu)} CPU per replica, more than a {instance.name} node has for the lines' "
                f"pods ({node_fit.cpu_text(cpu_room)} CPU)")
    return None


def replicas_per_node(inputs: PlanInputs, instance: InstanceType, tp: int) -> int:
    """Replicas one node holds: its GPUs over TP, and, when counted (:attr:`PlanInputs.node_room`),
    no more than its CPU and memory for the lines' pods allow; at least 1 (a replica that does not
    fit is reported by the fit, not here)."""
    bound = instance.gpus // tp
    if inputs.node_room is not None:
        cpu_room, memory_room = inputs.node_room(instance.name)
        if inputs.replica_cpu_millicores:
            bound = min(bound, cpu_room // inputs.replica_cpu_millicores)
        if inputs.replica_memory_bytes:
            bound = min(bound, memory_room // inputs.replica_memory_bytes)
    return max(1, bound)


def node_room_for(platform: PlatformConfig, lines: Iterable[BusinessLineConfig]) -> Callable[[str], tuple[int, int]]:
    """``instance type -> (millicores, bytes)`` one node leaves for the lines' pods: the config
    check's node budget (:func:`platform_config.node_fit.node_budget`: Tiered Storage, the kubelet's
    reservation, the platform's pods) of the platform's first schedulable group of that type, or, for
    a type the platform has no group of, of a group of it with the model's defaults (one thread per
    core). ``lines``: the cluster's lines (each L2 line's janitor is counted on every node)."""
    every_line = list(lines)
    cache: dict[str, tuple[int, int]] = {}

    def room(instance_type: str) -> tuple[int, int]:
        if instance_type not in cache:
            groups = node_fit.schedulable_groups(platform, instance_type)
            group = groups[0] if groups else InstanceGroupConfig(name="candidate", instance_type=instance_type,
                                                                 instance_count=1)
            budget = node_fit.node_budget(platform, group, every_line)
            cache[instance_type] = (budget.free_cpu_millicores, budget.free_memory_bytes)
        return cache[instance_type]

    return room


def choose_tp(inputs: PlanInputs) -> tuple[Fit, int | None]:
    """The fit at ``inputs.tp`` (or the smallest fitting TP), and the smallest TP that fits.

    Returns ``(fit, min_tp)``; ``min_tp`` is None when no TP on this instance type fits.
    """
    instance = get_instance_type(inputs.instance_type)
    candidates = [tp for tp in TP_CHOICES if tp <= instance.gpus and valid_tp(inputs.model, tp)]
    fits = [_fit(inputs, instance, tp) for tp in candidates]
    min_tp = next((f.tp for f in fits if f.fits), None)
    if inputs.tp is not None:
        return _fit(inputs, instance, inputs.tp), min_tp
    chosen = next((f for f in fits if f.fits), fits[-1] if fits else _fit(inputs, instance, 1))
    return chosen, min_tp


@dataclass(frozen=True)
class Timing:
    """Latency figures for one prompt length (ms, tokens)."""

    tokens: int
    cached_tokens: int
    kv_gib: float
    l2_read_ms: float
    prefill_ms: float
    cold_ttft_ms: float
    warm_ttft_ms: float
    ttft_ratio: float
    break_even_tokens: float | None
    l2_pays: bool


def timing(model: ModelSpec, instance: InstanceType, tp: int, kv_dtype: str, *, tokens: int,
           hit_ratio: float = 1.0, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
           l2_read_gibps: float = REFERENCE_RUN.l2_read_gibps,
           calibration: Calibration = DEFAULT_CALIBRATION) -> Timing:
    """Cold vs warm TTFT of a ``tokens``-long prompt of which ``hit_ratio`` is in L2.

    Cold TTFT = prefill of all tokens. Warm TTFT = L2 fixed overhead + read of the cached
    tokens + prefill of the rest. With ``hit_ratio`` 1 the whole prompt is read (the
    reference's repeated prompt, 1,925 of 1,925 tokens hit); below 1 the cached part is
    rounded down to whole ``chunk_tokens`` chunks, as LMCache stores only full chunks.
    """
    flops_per_s = calibration.efficiency * instance.gpu_peak_bf16_tflops * 1e12 * tp
    bandwidth = l2_read_gibps * tp
    kv_per_token = model.kv_bytes_per_token(kv_dtype)
    cached = tokens if hit_ratio >= 1.0 else int(hit_ratio * tokens) // chunk_tokens * chunk_tokens
    kv_bytes = tokens * kv_per_token
    read = l2_read_ms(cached * kv_per_token, bandwidth)
    prefill = prefill_flops(model, tokens) / flops_per_s * 1000.0
    warm = calibration.l2_overhead_ms + read + prefill_flops(model, tokens, cached) / flops_per_s * 1000.0
    # Break-even (whole prompt cached): a*N^2 + b*N - overhead = 0.
    a = 2.0 * model.layers * model.attention_width / flops_per_s * 1000.0
    b = 2.0 * model.params / flops_per_s * 1000.0 - kv_per_token / (bandwidth * GIB) * 1000.0
    disc = b * b + 4 * a * calibration.l2_overhead_ms
    break_even = (-b + math.sqrt(disc)) / (2 * a) if a > 0 else (
        calibration.l2_overhead_ms / b if b > 0 else None)
    return Timing(tokens=tokens, cached_tokens=cached, kv_gib=kv_bytes / GIB, l2_read_ms=l2_read_ms(kv_bytes, bandwidth),
                  prefill_ms=prefill, cold_ttft_ms=prefill, warm_ttft_ms=warm, ttft_ratio=prefill / warm,
                  break_even_tokens=break_even, l2_pays=warm < prefill)


@dataclass(frozen=True)
class Cost:
    """What the endpoint costs per hour (``None`` figures when the table has no price)."""

    nodes: int
    price: Price | None
    cost_per_endpoint_hour: float | None
    gpu_share_cost_per_hour: float | None


@dataclass(frozen=True)
class Plan:
    """The planner's answer for one model on one instance type (see :func:`plan`)."""

    inputs: PlanInputs
    instance: InstanceType
    fit: Fit
    min_tp: int | None
    kv_bytes_per_token: int
    l2_nodes: int
    l2_gib_per_node: float
    timing: Timing
    cost: Cost
    warnings: tuple[str, ...] = ()
    #: The constants the timing was computed with (for :func:`ttft_curve`).
    calibration: Calibration = DEFAULT_CALIBRATION

    @property
    def weights_gib(self) -> float:
        return self.inputs.model.weights_bytes(self.inputs.dtype) / GIB

    @property
    def weights_gb(self) -> float:
        return self.inputs.model.weights_bytes(self.inputs.dtype) / GB

    @property
    def replicas_per_node(self) -> int:
        """Replicas one node holds (GPUs over TP, and CPU and memory when counted: :func:`replicas_per_node`)."""
        return replicas_per_node(self.inputs, self.instance, self.fit.tp)

    @property
    def l1_gib_per_replica(self) -> float:
        """The L1 buffer of one replica, GiB: the line's ``cache.l1_cpu_gib``, else LMCache's
        default per TP rank x TP (0 with L1 off)."""
        given = self.inputs.l1_gib_per_replica
        return LMCACHE_DEFAULT_L1_GIB_PER_RANK * self.fit.tp if given is None else given

    @property
    def replicas_on_a_node(self) -> int:
        """Replicas one node holds: the line's replicas, at most :attr:`replicas_per_node`."""
        return min(self.inputs.replicas, self.replicas_per_node)

    @property
    def l1_gib_per_node(self) -> float:
        """L1 of one node, GiB: :attr:`l1_gib_per_replica` x :attr:`replicas_on_a_node`."""
        return self.l1_gib_per_replica * self.replicas_on_a_node

    @property
    def l2_pool_gib(self) -> float:
        """The usable L2 pool, GiB: the platform's (:func:`platform_config.loader.l2_pool_gib`),
        else nodes x capacity per node."""
        given = self.inputs.l2_pool_gib
        return self.l2_gib_per_node * self.l2_nodes if given is None else given

    def tokens_in(self, gib: float) -> int:
        """Tokens of this model's KV that ``gib`` GiB hold (whole model, every TP rank's share)."""
        return int(gib * GIB // self.kv_bytes_per_token)

    @property
    def expected_ttft_ms(self) -> float:
        """TTFT this option delivers: warm when L2 pays at this prompt length, else cold
        (where L2 does not pay it should be left off)."""
        return min(self.timing.cold_ttft_ms, self.timing.warm_ttft_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures; units in the key names (``_gib`` GiB, ``_gb`` GB, ``_ms``)."""
        i, t, m = self.inputs, self.timing, self.inputs.model
        kv_per_token = self.kv_bytes_per_token
        price = self.cost.price
        return {
            "model": {"name": m.name, "params": m.params, "layers": m.layers, "hidden_size": m.hidden_size,
                      "attention_heads": m.attention_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
                      "source": m.source},
            "instance_type": self.instance.name,
            "gpu": {"model": self.instance.gpu_model, "count": self.instance.gpus,
                    "memory_gib": self.instance.gpu_memory_gib,
                    "usable_memory_gib": usable_gpu_memory_gib(self.instance.gpu_model)},
            "dtype": i.dtype,
            "kv_dtype": i.effective_kv_dtype,
            "tp": self.fit.tp,
            "min_tp": self.min_tp,
            "replicas": i.replicas,
            "weights_gib": round(self.weights_gib, 3),
            "weights_gb": round(self.weights_gb, 3),
            "weights_per_gpu_gib": round(self.fit.weights_per_gpu_gib, 3),
            "fits": self.fit.fits,
            "fit_reason": self.fit.reason,
            "kv_bytes_per_token": kv_per_token,
            "tokens": i.tokens,
            "kv_gib": round(t.kv_gib, 4),
            "kv_gb": round(t.kv_gib * GIB / GB, 4),
            "l0": {"kv_gib_per_gpu": round(self.fit.kv_free_per_gpu_gib, 2),
                   "tokens_per_replica": self.fit.l0_tokens_per_replica,
                   "tokens_per_endpoint": self.fit.l0_tokens_per_replica * i.replicas},
            "l1": {"gib_per_node": round(self.l1_gib_per_node, 2),
                   "gib_per_replica": round(self.l1_gib_per_replica, 2),
                   "lmcache_default": i.l1_gib_per_replica is None,
                   "tokens_per_node": self.tokens_in(self.l1_gib_per_node)},
            "l2": {"nodes": self.l2_nodes, "gib_per_node": round(self.l2_gib_per_node, 1),
                   "gib": round(self.l2_pool_gib, 1),
                   "tokens": self.tokens_in(self.l2_pool_gib),
                   "line_gib": None if i.l2_size_gib is None else round(i.l2_size_gib, 1),
                   "line_tokens": None if i.l2_size_gib is None else self.tokens_in(i.l2_size_gib),
                   "janitor_high_watermark": i.l2_high_watermark,
                   "read_gibps_per_rank": i.l2_read_gibps},
            "l2_read_ms": round(t.l2_read_ms, 2),
            "prefill_ms": round(t.prefill_ms, 1),
            "cold_ttft_ms": round(t.cold_ttft_ms, 1),
            "warm_ttft_ms": round(t.warm_ttft_ms, 1),
            "ttft_ratio": round(t.ttft_ratio, 2),
            "hit_ratio": i.hit_ratio,
            "cached_tokens": t.cached_tokens,
            "break_even_tokens": None if t.break_even_tokens is None else round(t.break_even_tokens),
            "l2_pays": t.l2_pays,
            "cost": {"nodes": self.cost.nodes,
                     "usd_per_instance_hour": price.usd_per_hour if price else None,
                     "cost_per_endpoint_hour": _round(self.cost.cost_per_endpoint_hour, 2),
                     "gpu_share_cost_per_hour": _round(self.cost.gpu_share_cost_per_hour, 2),
                     "price_as_of": price.as_of.isoformat() if price else None,
                     "price_source": price.source if price else None,
                     "price_checked": price.checked if price else None,
                     "region": i.region},
            "warnings": list(self.warnings),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def plan(inputs: PlanInputs, *, prices: PriceTable | None = None,
         calibration: Calibration = DEFAULT_CALIBRATION) -> Plan:
    """Compute every figure for ``inputs`` (pure: no I/O).

    Raises:
        ValueError: from :class:`PlanInputs` validation (never for a model that does not
            fit: that is reported as ``fit.fits == False``).
    """
    instance = get_instance_type(inputs.instance_type)
    fit, min_tp = choose_tp(inputs)
    kv_dtype = inputs.effective_kv_dtype
    t = timing(inputs.model, instance, fit.tp, kv_dtype, tokens=inputs.tokens, hit_ratio=inputs.hit_ratio,
               chunk_tokens=inputs.chunk_tokens, l2_read_gibps=inputs.l2_read_gibps, calibration=calibration)
    nodes = math.ceil(inputs.replicas / replicas_per_node(inputs, instance, fit.tp))
    nvme_gib = instance.nvme_gb * GB / GIB * (1.0 - inputs.nvme_reserve_fraction)
    l2_per_node = min(nvme_gib, inputs.l2_node_capacity_gib) if inputs.l2_node_capacity_gib else nvme_gib
    price = prices.price(inputs.region, instance.name) if prices else None
    warnings = price_warnings(prices, inputs.region, instance.name) if prices is not None else []
    if not t.l2_pays:
        warnings.append(f"L2 does not pay at {inputs.tokens:,} tokens (break-even about "
                        f"{t.break_even_tokens:,.0f} tokens): warm {t.warm_ttft_ms:.0f} ms vs cold {t.cold_ttft_ms:.0f} ms")
    cost = Cost(
        nodes=nodes, price=price,
        cost_per_endpoint_hour=nodes * price.usd_per_hour if price else None,
        gpu_share_cost_per_hour=inputs.replicas * fit.tp / instance.gpus * price.usd_per_hour if price else None,
    )
    return Plan(inputs=inputs, instance=instance, fit=fit, min_tp=min_tp,
                kv_bytes_per_token=inputs.model.kv_bytes_per_token(kv_dtype),
                l2_nodes=inputs.l2_nodes if inputs.l2_nodes is not None else nodes,
                l2_gib_per_node=l2_per_node, timing=t, cost=cost, warnings=tuple(warnings),
                calibration=calibration)


def price_warnings(prices: PriceTable, region: str, instance_type: str) -> list[str]:
    """The warning the report prints for a price it uses: missing from the table, or not yet
    checked against its source (``checked: false`` in ``config/prices.yaml``)."""
    price = prices.price(region, instance_type)
    if price is None:
        return [f"no price for {instance_type} in {region} in the price table"]
    if not price.checked:
        return [f"price of {instance_type} ({price.usd_per_hour} {prices.currency}/h, as of "
                f"{price.as_of}) is unchecked; verify at {price.source}"]
    return []


def ttft_curve(p: Plan, lengths: Iterable[int]) -> list[Timing]:
    """Cold and warm TTFT of ``p``'s deployment (model, GPU, TP, KV dtype, hit ratio, chunk,
    L2 bandwidth, calibration) at each prompt length in ``lengths`` (tokens >= 1); what
    ``plan.py --plot`` draws."""
    i = p.inputs
    return [timing(i.model, p.instance, p.fit.tp, i.effective_kv_dtype, tokens=n, hit_ratio=i.hit_ratio,
                   chunk_tokens=i.chunk_tokens, l2_read_gibps=i.l2_read_gibps, calibration=p.calibration)
            for n in lengths]


@dataclass(frozen=True)
class Recommendation:
    """The chosen option among candidate instance types, why, and every option considered."""

    instance_type: str | None
    tp: int | None
    use_l2: bool
    reason: str
    options: tuple[Plan, ...] = field(default_factory=tuple)
    #: Price warnings (missing or unchecked) of every option whose price the comparison uses.
    warnings: tuple[str, ...] = ()
    #: Candidates that cannot run the inputs' TP at all, ``(instance type, why)``.
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def chosen(self) -> Plan | None:
        """The option recommended (None when nothing fits with a price)."""
        return next((p for p in self.options if p.instance.name == self.instance_type), None)

    def cost_ratio(self, option: Plan) -> float | None:
        """``option``'s cost per endpoint-hour over the chosen one's (None without both prices)."""
        best = self.chosen
        if best is None or not best.cost.cost_per_endpoint_hour or option.cost.cost_per_endpoint_hour is None:
            return None
        return option.cost.cost_per_endpoint_hour / best.cost.cost_per_endpoint_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type, "tp": self.tp, "use_l2": self.use_l2, "reason": self.reason,
            "options": [{
                "instance_type": p.instance.name, "fits": p.fit.fits, "tp": p.fit.tp, "nodes": p.cost.nodes,
                "cost_per_endpoint_hour": _round(p.cost.cost_per_endpoint_hour, 2),
                "cost_ratio": _round(self.cost_ratio(p), 2),
                "cold_ttft_ms": round(p.timing.cold_ttft_ms, 1), "warm_ttft_ms": round(p.timing.warm_ttft_ms, 1),
                "expected_ttft_ms": round(p.expected_ttft_ms, 1),
                "l2_pays": p.timing.l2_pays, "fit_reason": p.fit.reason,
            } for p in self.options] + [{"instance_type": name, "fits": False, "fit_reason": why}
                                        for name, why in self.refused],
            "warnings": list(self.warnings),
        }


def _money(value: float | None) -> str:
    return "no price" if value is None else f"${value:,.2f}/endpoint-hour"


def recommend(inputs: PlanInputs, candidates: Iterable[str], *, prices: PriceTable,
              ttft_slo_ms: float | None = None, calibration: Calibration = DEFAULT_CALIBRATION) -> Recommendation:
    """Pick the instance type for ``inputs``' model among ``candidates``.

    Each candidate is evaluated at ``inputs.tp`` (a business line's own TP), or, when that is None,
    at its smallest fitting TP; a candidate with fewer GPUs than ``inputs.tp``, or whose heads
    ``inputs.tp`` does not divide, is refused with the reason. With CPU and memory counted
    (:attr:`PlanInputs.node_room`) an option whose replica does not fit a node's CPU or memory
    does not fit, and its node count covers them. Rule:
    among options that fit and have a price, keep those whose expected TTFT (warm with L2
    where L2 pays, else cold) meets ``ttft_slo_ms`` (all, if no SLO), then take the cheapest
    per endpoint-hour, ties to the faster. If no option meets the SLO, the fastest is chosen and
    the reason says the SLO is missed. The reason states the choice in clauses separated by
    ``"; "``; :func:`format_recommendation` tabulates every option beside it.
    ``warnings`` carries the price warnings of every fitting option (the ones the comparison
    prices), so an unchecked price is flagged whichever option it belongs to.
    """
    options_list: list[Plan] = []
    refused: list[tuple[str, str]] = []
    for c in dict.fromkeys(candidates):
        gpus = get_instance_type(c).gpus
        if inputs.tp is not None and inputs.tp > gpus:
            refused.append((c, f"TP {inputs.tp} needs {inputs.tp} GPUs per replica; {c} has {gpus}"))
            continue
        options_list.append(plan(replace(inputs, instance_type=c), prices=prices, calibration=calibration))
    options = tuple(options_list)
    warnings = tuple(dict.fromkeys(w for p in options if p.fit.fits
                                   for w in price_warnings(prices, inputs.region, p.instance.name)))
    usable = [p for p in options if p.fit.fits and p.cost.cost_per_endpoint_hour is not None]
    if not usable:
        why = "; ".join([f"{p.instance.name}: {p.fit.reason if not p.fit.fits else 'no price'}" for p in options]
                        + [f"{name}: {reason}" for name, reason in refused])
        return Recommendation(None, None, False, f"no candidate fits {inputs.model.name} with a price: {why}",
                              options, warnings, tuple(refused))
    meeting = [p for p in usable if ttft_slo_ms is None or p.expected_ttft_ms <= ttft_slo_ms]
    fastest = min(usable, key=lambda p: (p.expected_ttft_ms, p.cost.cost_per_endpoint_hour))
    if meeting:
        best = min(meeting, key=lambda p: (p.cost.cost_per_endpoint_hour, p.expected_ttft_ms))
    else:
        best = fastest
    t = best.timing
    tier = (f"with L2 (warm TTFT {t.warm_ttft_ms:.0f} ms vs {t.cold_ttft_ms:.0f} ms cold, "
            f"{t.ttft_ratio:.1f}x)" if t.l2_pays else
            f"without L2 (TTFT {t.cold_ttft_ms:.0f} ms; L2 pays only above about "
            f"{t.break_even_tokens:,.0f} tokens)")
    reason = (f"{best.instance.name} TP {best.fit.tp} {tier}; {_money(best.cost.cost_per_endpoint_hour)} for "
              f"{best.cost.nodes} node(s), {inputs.replicas} replica(s) of {inputs.tokens:,}-token prompts")
    if ttft_slo_ms is not None and not meeting:
        reason = f"no option meets the {ttft_slo_ms:.0f} ms TTFT target; fastest: " + reason
    elif ttft_slo_ms is not None:
        reason += f"; cheapest option meeting the {ttft_slo_ms:.0f} ms TTFT target"
    else:
        reason += "; the cheapest option that fits"
    return Recommendation(best.instance.name, best.fit.tp, best.timing.l2_pays, reason, options, warnings,
                          tuple(refused))


# --- inputs from config ------------------------------------------------------------------------


def parse_vllm_args(args: Iterable[str]) -> dict[str, str]:
    """The flags of a vLLM command line -> their value (values joined by a space; ``""`` for a
    flag without one), read by the project's one parser of ``vllm.args``
    (:func:`platform_config.vllm_args.flag_values`: ``--flag=value`` and short aliases such as
    ``-tp`` understood, each flag taking its own number of values, the last occurrence winning)."""
    return {flag: " ".join(values) for flag, values in vllm_args.flag_values(args).items()}


def inputs_from_line(line: BusinessLineConfig, platform: PlatformConfig | None, *, model: ModelSpec | None = None,
                     lines: Iterable[BusinessLineConfig] | None = None, **overrides: Any) -> PlanInputs:
    """Planner inputs for a business line: its model (by normalized ``model.name`` unless
    ``model`` is given), ``model.dtype``, TP = the line's ``--tensor-parallel-size`` (which the
    config check holds to ``gpus_per_replica``, with any pipeline/data parallel size), ``replicas``,
    ``cache.chunk_size_tokens``, ``--max-model-len``/``--kv-cache-dtype``/
    ``--gpu-memory-utilization`` from ``vllm.args``, ``cache.l1_cpu_gib`` (0 with L1 off),
    ``cache.l2_size``; and from the platform the region, the Curvine pool
    (:func:`platform_config.loader.l2_pool_gib`: Workers and usable GiB, the config check's figure)
    and the janitor's high watermark. With ``lines`` (the cluster's lines, ``line`` among them) and a
    platform, CPU and memory count too: the line's ``resources`` per replica against the node budget
    (:func:`node_room_for`), as the config check's node fit counts them. ``overrides`` replace any
    field (e.g. ``tokens``).

    Raises:
        KeyError: the model is not in the table (pass ``model``).
        PlanInputError: a bad value; each problem's field maps to the line's config key through
            :data:`LINE_CONFIG_FIELDS`.
    """
    spec = model or lookup_model(line.model.name)
    vargs = parse_vllm_args(line.vllm.args)
    values: dict[str, Any] = dict(
        model=spec, instance_type=line.instance_type, dtype=line.model.dtype, tp=line.tensor_parallel_size,
        replicas=line.replicas, chunk_tokens=line.cache.chunk_size_tokens,
    )
    if vargs.get("--max-model-len", "").isdigit():
        values["max_model_len"] = int(vargs["--max-model-len"])
    if vargs.get("--kv-cache-dtype") in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        values["kv_dtype"] = "fp8"
    if vargs.get("--gpu-memory-utilization"):
        try:
            values["gpu_memory_utilization"] = float(vargs["--gpu-memory-utilization"])
        except ValueError:
            raise PlanInputError([InputProblem(
                "gpu_memory_utilization",
                f"--gpu-memory-utilization {vargs['--gpu-memory-utilization']!r} is not a number; allowed: a "
                "fraction in (0, 1], e.g. 0.9")]) from None
    if platform is not None:
        values["region"] = platform.region
        if platform.curvine.enabled and line.cache.l2_enabled:
            values["l2_nodes"], values["l2_pool_gib"] = l2_pool_gib(platform)
            values["l2_node_capacity_gib"] = float(platform.curvine.worker_capacity_gib)
            values["l2_high_watermark"] = platform.curvine.eviction.high_watermark
        else:
            values["l2_nodes"], values["l2_pool_gib"] = 0, 0.0
    if platform is not None and lines is not None:
        values["replica_cpu_millicores"] = round(quantity_bytes(line.resources.cpu) * 1000)
        values["replica_memory_bytes"] = round(quantity_bytes(line.resources.memory))
        values["node_room"] = node_room_for(platform, lines)
    if line.cache.l2_enabled:
        values["l2_size_gib"] = quantity_bytes(line.cache.l2_size) / GIB
    if not line.cache.l1_enabled:
        values["l1_gib_per_replica"] = 0.0
    elif line.cache.l1_cpu_gib is not None:
        values["l1_gib_per_replica"] = line.cache.l1_cpu_gib
    values.update({k: v for k, v in overrides.items() if v is not None})
    return PlanInputs(**values)


def calibration_dict(calibration: Calibration = DEFAULT_CALIBRATION) -> dict[str, Any]:
    """The calibration constants and the run they come from, for ``--json`` output."""
    return {"prefill_efficiency_of_peak": round(calibration.efficiency, 4),
            "l2_overhead_ms": round(calibration.l2_overhead_ms, 1),
            "reference": asdict(calibration.reference)}


# --- text output ---------------------------------------------------------------------------------


def format_recommendation(rec: Recommendation) -> str:
    """The recommendation as a table: one row per candidate instance type (``*`` marks the
    choice), with TP, nodes, cold/warm/expected TTFT, whether L2 pays, cost per endpoint-hour
    and cost relative to the choice; then why each other candidate does not fit."""
    # One clause of the reason per line, each wrapped at 100 columns.
    lines = [textwrap.fill(("recommendation: " if k == 0 else "  ") + clause, width=100, subsequent_indent="    ",
                           break_on_hyphens=False) for k, clause in enumerate(rec.reason.split("; "))] + [""]
    header = (f"  {'instance type':<18} {'TP':>2} {'nodes':>5} {'fits':>4} {'cold ms':>8} {'warm ms':>8} "
              f"{'L2 pays':>7} {'TTFT ms':>8} {'$/endpoint-h':>12} {'cost':>6}")
    lines.append(header)
    fitting = sorted((p for p in rec.options if p.fit.fits),
                     key=lambda p: (p.cost.cost_per_endpoint_hour is None, p.cost.cost_per_endpoint_hour or 0.0,
                                    p.expected_ttft_ms))
    for p in fitting:
        t, cost, ratio = p.timing, p.cost.cost_per_endpoint_hour, rec.cost_ratio(p)
        mark = "*" if p.instance.name == rec.instance_type else " "
        lines.append(f"{mark} {p.instance.name:<18} {p.fit.tp:>2} {p.cost.nodes:>5} {'yes':>4} {t.cold_ttft_ms:>8,.0f} "
                     f"{t.warm_ttft_ms:>8,.0f} {'yes' if t.l2_pays else 'no':>7} {p.expected_ttft_ms:>8,.0f} "
                     f"{'no price' if cost is None else f'{cost:,.2f}':>12} "
                     f"{'-' if ratio is None else f'{ratio:.1f}x':>6}")
    for p in rec.options:
        if not p.fit.fits:
            lines.append(f"  {p.instance.name:<18} {p.fit.tp:>2} {'-':>5} {'no':>4}  {p.fit.reason}")
    for name, reason in rec.refused:
        lines.append(f"  {name:<18} {'-':>2} {'-':>5} {'no':>4}  {reason}")
    lines.append("  (TTFT ms: warm where L2 pays, else cold; cost: relative to the choice marked *)")
    return "\n".join(lines)


def collapse_unchecked_prices(warnings: list[str], plans: Iterable[Plan]) -> list[str]:
    """``warnings`` with two or more "price of X (...) is unchecked" lines (:func:`price_warnings`)
    replaced, where the first stood, by one line: how many, as of when, and how to check them.

    The report uses it so that a table whose prices are all unchecked (the shipped
    ``config/prices.yaml``) adds one line, not one per candidate type; ``--json`` keeps every
    warning as it is. ``plans`` are the plans whose prices the report uses (their ``cost.price``).
    """
    unchecked = {q.instance.name: q.cost.price for q in plans if q.cost.price is not None and not q.cost.price.checked}
    detailed = {w: name for w in warnings for name in unchecked
                if w.startswith(f"price of {name} (") and w.endswith(f"is unchecked; verify at {unchecked[name].source}")}
    if len(detailed) < 2:
        return warnings
    prices = [unchecked[name] for name in detailed.values()]
    dates = sorted({price.as_of for price in prices})
    sources = list(dict.fromkeys(price.source for price in prices))
    when = f"as of {dates[0]}" if len(dates) == 1 else f"as of {dates[0]} to {dates[-1]}"
    where = sources[0] if len(sources) == 1 else "its source"
    line = (f"{len(detailed)} prices used here are unchecked ({when}): compare each with {where}, then set "
            "checked: true in the price table (--prices, default config/prices.yaml); --json lists each")
    first = warnings.index(next(iter(detailed)))
    kept = [w for w in warnings if w not in detailed]
    return kept[:first] + [line] + kept[first:]


def format_plan(p: Plan, recommendation: Recommendation | None = None, *,
                node_report: Iterable[str] = ()) -> str:
    """The readable report ``scripts/plan.py`` prints (``--json`` prints :meth:`Plan.to_dict`).

    Titled with the model's name (``--model``, the config's ``_name_or_path``, or the Hub
    cache folder it was read from: see :func:`kv_tools.model_specs.load_hf_config`); every
    price it shows that is missing or unchecked is warned about, the recommendation's too.
    ``node_report``: the node budget and placement of a business line's instance type
    (:func:`platform_config.node_fit.format_node_fit` and the config check's verdict), printed
    after the tiers.
    """
    i, t, m, inst = p.inputs, p.timing, p.inputs.model, p.instance
    kv_per_token = p.kv_bytes_per_token
    fit = "fits" if p.fit.fits else "DOES NOT FIT"
    min_tp = f"smallest TP that fits: {p.min_tp}" if p.min_tp else f"no TP on {inst.name} fits"
    per_node = p.replicas_on_a_node
    l1_basis = ("L1 off" if p.l1_gib_per_replica == 0 else
                f"{p.l1_gib_per_replica:g} GiB x {per_node} replicas" if i.l1_gib_per_replica is not None else
                f"LMCache default {LMCACHE_DEFAULT_L1_GIB_PER_RANK:g} GiB x TP {p.fit.tp} x {per_node} replicas")
    pool_basis = (f"Curvine pool, {p.l2_nodes} Workers" if i.l2_pool_gib is not None
                  else f"{p.l2_nodes} node(s) x {p.l2_gib_per_node:,.0f} GiB NVMe")
    l2_rows = []
    if i.l2_size_gib is not None:
        kept = (f" (its janitor deletes above {i.l2_high_watermark:.0%})" if i.l2_high_watermark is not None else "")
        l2_rows.append(f"{'L2':<5} {f'{i.l2_size_gib:,.0f} GiB, the line' + chr(39) + 's l2_size':<40} "
                       f"{p.tokens_in(i.l2_size_gib):,} for this line{kept}")
    l2_rows.append(f"{'' if l2_rows else 'L2':<5} {f'{p.l2_pool_gib:,.0f} GiB {pool_basis}':<40} "
                   f"{p.tokens_in(p.l2_pool_gib):,} " + ("shared by the L2 lines" if l2_rows else "in the pool"))
    usable_gib = usable_gpu_memory_gib(inst.gpu_model)
    lines = [
        f"{m.name} ({i.dtype}) on {inst.name}: {inst.gpus} x {inst.gpu_model} ({inst.gpu_memory_gib:.0f} GB, "
        f"{usable_gib:.2f} GiB usable), TP {p.fit.tp}, {i.replicas} replica(s)",
        f"  model facts: {m.params / 1e9:.2f}B params, {m.layers} layers, {m.kv_heads} KV heads x {m.head_dim} "
        f"head_dim ({m.source})",
        "",
        f"weights       {p.weights_gib:.2f} GiB ({p.weights_gb:.2f} GB), {p.fit.weights_per_gpu_gib:.2f} GiB per GPU "
        f"at TP {p.fit.tp}: {fit}{'' if p.fit.fits else f' ({p.fit.reason})'}; {min_tp}",
        f"KV per token  {kv_per_token:,} B ({i.effective_kv_dtype})",
        f"prompt        {i.tokens:,} tokens = {t.kv_gib:.4f} GiB ({t.kv_gib * GIB / GB:.4f} GB) of KV",
        "",
        f"{'tier':<5} {'capacity':<40} tokens",
        f"{'L0':<5} {f'{p.fit.kv_free_per_gpu_gib:.2f} GiB KV per GPU':<40} "
        f"{p.fit.l0_tokens_per_replica:,} per replica ({p.fit.l0_tokens_per_replica * i.replicas:,} per endpoint)",
        f"{'L1':<5} {f'{p.l1_gib_per_node:.2f} GiB per node ({l1_basis})':<40} "
        f"{p.tokens_in(p.l1_gib_per_node):,} per node",
        *l2_rows,
        *([""] + list(node_report) if node_report else []),
        "",
        f"latency for {i.tokens:,} tokens, {t.cached_tokens:,} of them read from L2",
        f"  L2 read       {t.l2_read_ms:8.1f} ms  all {i.tokens:,} tokens at {i.l2_read_gibps} GiB/s x TP {p.fit.tp}",
        f"  cold TTFT     {t.cold_ttft_ms:8.1f} ms  prefill at the calibrated rate",
        f"  warm TTFT     {t.warm_ttft_ms:8.1f} ms  L2 overhead + read + prefill of uncached tokens",
        f"  cold / warm   {t.ttft_ratio:8.2f} x",
        f"  break-even    {t.break_even_tokens or 0:8,.0f} tokens  (L2 pays above; below, leave it to L0/L1)",
    ]
    if p.cost.price is not None:
        price = p.cost.price
        lines += ["", f"cost          {p.cost.nodes} node(s) x ${price.usd_per_hour:,.2f}/h = "
                      f"${p.cost.cost_per_endpoint_hour:,.2f} per endpoint-hour (GPU share "
                      f"${p.cost.gpu_share_cost_per_hour:,.2f}/h); {i.region} price as of {price.as_of}"
                      f"{'' if price.checked else ' (unchecked)'}"]
    warnings = list(p.warnings)
    if recommendation is not None:
        lines += ["", format_recommendation(recommendation)]
        warnings += recommendation.warnings
    warnings = list(dict.fromkeys(warnings))
    warnings = collapse_unchecked_prices(warnings, [p, *(recommendation.options if recommendation else ())])
    if warnings:
        lines += [""] + [f"warning: {w}" for w in warnings]
    return "\n".join(lines)
