"""Memory fit of one model on one HyperPod instance type: the planner's inputs and what a replica needs.

* weights: ``params x bytes per element`` in GiB (2^30 B); whether they fit with a tensor-parallel
  (TP) degree, and the smallest TP that fits (:func:`choose_tp`);
* KV cache bytes per token per GPU: ``2 x layers x KV heads x head_dim x bytes`` (docs/sources.md §5);
* tier capacities in tokens: L0 = usable GPU memory (what CUDA reports, :mod:`capacity.gpu_memory`) x
  ``gpu_memory_utilization`` - weights/TP - runtime reserve; L1 = LMCache's CPU buffer in each vLLM pod;
* node room: what a node of an instance type leaves for the lines' pods (CPU, memory), the config
  check's node budget (:func:`node_room_for`), and so replicas per node;
* :class:`PlanInputs` from flags or from a business line (:func:`inputs_from_line`), each bad value
  naming the line's config key (:data:`LINE_CONFIG_FIELDS`).

The config checks every command runs use this module (:mod:`capacity.project_checks`); the plan, its
cost and its report are :mod:`capacity.planner`; the times :mod:`capacity.latency`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from capacity.gpu_memory import usable_gpu_memory_gib
from capacity.latency import DEFAULT_CHUNK_TOKENS, GIB, REFERENCE_RUN
from capacity.model_specs import ModelSpec, dtype_bytes, lookup_model
from platform_config import (
    INSTANCE_TYPES,
    BusinessLineConfig,
    InstanceType,
    PlatformConfig,
    get_instance_type,
    node_fit,
    vllm_args,
)
from platform_config.fields import quantity_bytes
from platform_config.loader import l2_pool_gib
from platform_config.platform_models import InstanceGroupConfig

#: vLLM's default ``--gpu-memory-utilization`` (vllm/engine/arg_utils.py): the share of GPU
#: memory vLLM may use for weights, activations and the KV cache.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90

#: GiB per GPU kept for activations at the default batch size, the CUDA context and CUDA
#: graphs. A planning figure; read the real one from vLLM's start-up log ("Available KV
#: cache memory") and pass ``--runtime-reserve-gib``.
DEFAULT_RUNTIME_RESERVE_GIB = 2.0

#: Share of each node's NVMe kept out of the L2 pool (model weight copies, logs, images).
DEFAULT_NVME_RESERVE_FRACTION = 0.10

#: TP degrees vLLM is normally run with on one node.
TP_CHOICES = (1, 2, 4, 8)

#: LMCache's default ``max_local_cpu_size`` (0.5.5: 5.0, read as GiB), per TP rank: the L1 buffer of
#: a pod whose line leaves ``cache.l1_cpu_gib`` unset and whose operator sets nothing else
#: (docs/sources.md §5, §8).
LMCACHE_DEFAULT_L1_GIB_PER_RANK = 5.0


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
    # vLLM's share applies to the memory CUDA reports, not the marketed GB (capacity/gpu_memory.py).
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
    length = vllm_args.max_model_len(line.vllm.args)  # validated by the config loader
    if length is not None:
        if spec.max_position_embeddings and length > spec.max_position_embeddings:
            raise PlanInputError([InputProblem(
                "max_model_len", f"--max-model-len {vargs['--max-model-len']} = {length} tokens exceeds "
                f"{spec.name}'s context of {spec.max_position_embeddings} tokens (max_position_embeddings), which "
                f"vLLM refuses at start; allowed: at most {spec.max_position_embeddings}")])
        values["max_model_len"] = length
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
