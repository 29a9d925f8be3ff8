"""Latency model of the planner: TTFT cold (prefill) and warm (an L2 read), calibrated on the reference run.

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
from dataclasses import asdict, dataclass
from typing import Any

from capacity.model_specs import ModelSpec, lookup_model
from platform_config import (
    InstanceType,
    get_instance_type,
)

GIB = 2**30

#: LMCache's default chunk size, tokens (docs/sources.md §5).
DEFAULT_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class ReferenceRun:
    """A measured deployment the planner calibrates on (defaults: the AWS blog's run).

    Attributes:
        model: model name in :data:`capacity.model_specs.MODELS`.
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


def prefill_flops_per_s(instance: InstanceType, tp: int, calibration: Calibration = DEFAULT_CALIBRATION) -> float:
    """Prefill rate of one replica, FLOP/s: the calibrated share of peak (:class:`Calibration`) x the
    GPU's dense BF16 peak x ``tp`` (TP communication not modelled: optimistic for TP > 1)."""
    return calibration.efficiency * instance.gpu_peak_bf16_tflops * 1e12 * tp


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
    flops_per_s = prefill_flops_per_s(instance, tp, calibration)
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


def calibration_dict(calibration: Calibration = DEFAULT_CALIBRATION) -> dict[str, Any]:
    """The calibration constants and the run they come from, for ``--json`` output."""
    return {"prefill_efficiency_of_peak": round(calibration.efficiency, 4),
            "l2_overhead_ms": round(calibration.l2_overhead_ms, 1),
            "reference": asdict(calibration.reference)}
