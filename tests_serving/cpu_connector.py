"""TEST-ONLY vLLM KV connector: the production LMCache connector with the KV copy done by torch on CPU.

Why it exists: LMCache 0.5.5 has no copy connector for vLLM's CPU KV cache.
``CreateGPUConnector`` (lmcache/v1/gpu_connector/__init__.py) builds one only for the torch
device types ``cuda``, ``xpu``, ``musa`` and ``hpu``, and raises "No supported cpu connector
found." on CPU; ``LMCacheManager`` (lmcache/v1/manager.py) catches that, logs "System will
operate in degraded mode (recompute)" and leaves the worker without an engine, so vLLM then
waits ``lookup_timeout_ms`` on every request and never reads or writes L2.

What it replaces, and nothing more: the object ``CreateGPUConnector`` returns to
``VllmServiceFactory.get_or_create_lmcache_engine`` (lmcache/integration/vllm/
vllm_service_factory.py), whose ``from_gpu`` / ``to_gpu`` copy the tokens of one chunk between
vLLM's paged KV cache and an LMCache memory object (on a GPU, the CUDA kernels of
``lmcache.c_ops`` / ``device_ops.multi_layer_kv_transfer`` in ``VLLMPagedMemGPUConnectorV2``,
lmcache/v1/gpu_connector/gpu_connectors.py). :class:`CPUPagedKVCopy` does the same copy with
torch indexing over vLLM's CPU layout. The connector class vLLM loads,
:class:`CPUCopyLMCacheConnectorV1`, is the production class itself (``KVCACHE_TEST_CONNECTOR_BASE``)
with one change in ``__init__``: ``CreateGPUConnector`` answers a CPU vLLM worker with
:class:`CPUPagedKVCopy`. Lookup, chunk hashing, L1, the fs:// L2 connector, the lookup and
retrieve paths, metrics and the vLLM side are the released code.

vLLM's CPU KV cache, per attention layer (``CPUAttentionBackendImpl.forward`` and
``do_kv_cache_update``, vllm/v1/attention/backends/cpu_attn.py, vLLM 0.29.0; layout ``LBHNC``):
a tensor ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` that the kernels view as
``[num_blocks, num_kv_heads, 2 * block_size, head_size]`` and split in two along dim 2: each
(block, head) region holds a K half, then a V half, of ``block_size * head_size`` elements. Inside
a half the order is the kernel's own and depends on the ISA ``_get_attn_isa`` picks (with ``vec``,
float32 here: K channel-major, V token-major), so :meth:`CPUPagedKVCopy.positions` learns it from
``cpu_attn_reshape_and_cache`` itself instead of assuming it. Slot ``s`` is token
``s % block_size`` of block ``s // block_size`` (LMCache's slot mapping, ``vllm_v1_adapter``:
``block_id * block_size + offset``).

LMCache's memory object (``MemoryFormat.KV_2LTD``, ``VLLMPagedMemGPUConnectorV2.get_shape``):
``[2, num_layers, num_tokens, num_kv_heads * head_size]``, K first.

vLLM loads this module through ``--kv-transfer-config``::

    {"kv_connector": "CPUCopyLMCacheConnectorV1",
     "kv_connector_module_path": "tests_serving.cpu_connector", ...}

(``KVConnectorFactory``, vllm/distributed/kv_transfer/kv_connector/factory.py: the module path
takes priority over vLLM's registry and the class is looked up by ``kv_connector``.)
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

#: Environment variable naming the production connector class this one subclasses, as
#: ``module:Class`` (e.g. ``kvcache_l2_gate:GatedLMCacheConnectorV1``).
BASE_ENV = "KVCACHE_TEST_CONNECTOR_BASE"
#: vLLM's own LMCache connector, what ``{"kv_connector": "LMCacheConnectorV1"}`` loads from the registry.
DEFAULT_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector:LMCacheConnectorV1"
#: Name vLLM looks up in this module (``kv_connector`` of the test's ``--kv-transfer-config``).
CONNECTOR_NAME = "CPUCopyLMCacheConnectorV1"


def base_class() -> type:
    """The class named by ``$KVCACHE_TEST_CONNECTOR_BASE`` (default :data:`DEFAULT_BASE`)."""
    spec = os.environ.get(BASE_ENV) or DEFAULT_BASE
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{BASE_ENV}={spec!r}: expected 'module:Class'")
    return getattr(importlib.import_module(module), name)


class CPUPagedKVCopy:
    """Copies chunks between vLLM's CPU paged KV cache and LMCache memory objects (module docstring).

    Implements LMCache's ``GPUConnectorInterface`` (lmcache/v1/gpu_connector/gpu_connectors.py)
    for the non-layerwise path the rendered env selects (``use_layerwise`` false, no MLA).
    Keyword arguments as the engine passes them (``LMCacheEngine.store`` / ``retrieve``):
    ``kvcaches`` (one tensor per layer, in vLLM's layer order) and ``slot_mapping`` (one slot per
    token of the whole sequence); ``vllm_cached_tokens`` on load (tokens vLLM already holds:
    never overwritten, as ``skip_prefix_n_tokens`` of the CUDA path).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_size: int) -> None:
        self.num_layers, self.num_kv_heads, self.head_size = num_layers, num_kv_heads, head_size
        self.hidden_dim_size = num_kv_heads * head_size
        self.kvcaches: list[torch.Tensor] | None = None
        self._positions: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_metadata(cls, metadata: Any) -> "CPUPagedKVCopy":
        """From LMCache's ``LMCacheMetadata.kv_shape``: ``(layers, 2, chunk, kv_heads, head_size)``."""
        num_layers, kv, _, num_kv_heads, head_size = metadata.kv_shape
        if kv != 2 or getattr(metadata, "use_mla", False):
            raise NotImplementedError("MLA KV caches are not covered by the test copy connector")
        return cls(num_layers, num_kv_heads, head_size)

    # -- the layout ---------------------------------------------------------------------------

    def positions(self, block_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Where vLLM's kernel puts K and V of (token offset ``o``, channel ``c``) inside one
        (block, head) region: element ``o * head_size + c`` of each returned tensor is an index
        into the region's K half, resp. V half (``block_size * head_size`` elements each).

        Learnt from vLLM itself, once per block size: K and V whose values encode (o, c) are
        written into a one-block cache by ``cpu_attn_reshape_and_cache`` with the ISA the
        backend picks (``_get_attn_isa``), and every code is looked up where it landed. (With
        the ``vec`` ISA, K is stored channel-major, ``[head_size, block_size]``, and V
        token-major; other ISAs pack differently.) float32 only: the codes must be exact.
        """
        key = (block_size, dtype)
        if key in self._positions:
            return self._positions[key]
        if dtype != torch.float32:
            raise NotImplementedError(f"the test copy connector covers float32 KV caches, not {dtype}")
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        n = block_size * self.head_size
        probe = torch.zeros(1, 1, block_size, 2 * self.head_size, dtype=dtype)
        key_cache, value_cache = probe.view(1, 1, 2 * block_size, self.head_size).chunk(2, dim=2)
        codes = torch.arange(1, n + 1, dtype=dtype).view(block_size, 1, self.head_size)
        ops.cpu_attn_reshape_and_cache(codes, -codes, key_cache, value_cache, torch.arange(block_size),
                                       _get_attn_isa(dtype, block_size, self.head_size, "auto"))
        flat = probe.view(2, n)
        found = []
        for half, sign in ((0, 1), (1, -1)):
            landed = (sign * flat[half]).to(torch.long) - 1  # code - 1 = o * head_size + c, at each position
            if sorted(landed.tolist()) != list(range(n)):
                raise RuntimeError("vLLM's CPU KV kernel did not place every element of a block exactly once")
            where = torch.empty(n, dtype=torch.long)
            where[landed] = torch.arange(n)
            found.append(where)
        self._positions[key] = (found[0], found[1])
        return self._positions[key]

    def _indices(self, layer: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat indices into ``layer`` of K and V of the tokens in ``slots``: ``[tokens, heads, head_size]``."""
        if layer.dim() != 4 or layer.shape[1] != self.num_kv_heads or layer.shape[3] != 2 * self.head_size \
                or not layer.is_contiguous():
            raise ValueError(f"unexpected vLLM CPU KV cache layer {tuple(layer.shape)} "
                             f"(expected contiguous [blocks, {self.num_kv_heads}, block_size, {2 * self.head_size}])")
        block_size = layer.shape[2]
        n = block_size * self.head_size
        key_pos, value_pos = self.positions(block_size, layer.dtype)
        slots = slots.to(device="cpu", dtype=torch.long)
        blocks, offsets = slots // block_size, slots % block_size
        heads = torch.arange(self.num_kv_heads)
        channels = torch.arange(self.head_size)
        # region of (block b, head h) starts at (b * heads + h) * 2n; K half first, then V.
        region = (blocks[:, None] * self.num_kv_heads + heads[None, :]) * (2 * n)  # [tokens, heads]
        inner = offsets[:, None] * self.head_size + channels[None, :]  # [tokens, head_size]
        return (region[:, :, None] + key_pos[inner][:, None, :],
                region[:, :, None] + n + value_pos[inner][:, None, :])

    # -- GPUConnectorInterface ----------------------------------------------------------------

    def get_shape(self, num_tokens: int) -> torch.Size:
        """``[2, layers, num_tokens, kv_heads * head_size]`` (KV_2LTD)."""
        return torch.Size([2, self.num_layers, num_tokens, self.hidden_dim_size])

    def initialize_kvcaches_ptr(self, **kwargs: Any) -> None:
        if "kvcaches" in kwargs:
            self.kvcaches = list(kwargs["kvcaches"])

    def _args(self, start: int, end: int, kwargs: dict[str, Any]) -> tuple[list[torch.Tensor], torch.Tensor]:
        self.initialize_kvcaches_ptr(**kwargs)
        if self.kvcaches is None:
            raise ValueError("'kvcaches' should be provided in kwargs or initialized beforehand")
        if "slot_mapping" not in kwargs:
            raise ValueError("'slot_mapping' should be provided in kwargs")
        if len(self.kvcaches) != self.num_layers:
            raise ValueError(f"{len(self.kvcaches)} KV cache layers, expected {self.num_layers}")
        return self.kvcaches, kwargs["slot_mapping"][start:end]

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        """vLLM -> LMCache: tokens ``start:end`` of the sequence into ``memory_obj.tensor``."""
        kvcaches, slots = self._args(start, end, kwargs)
        n = end - start
        out = memory_obj.tensor
        for layer_idx, layer in enumerate(kvcaches):
            key_idx, value_idx = self._indices(layer, slots)
            flat = layer.view(-1)
            out[0, layer_idx, :n].copy_(flat[key_idx].reshape(n, self.hidden_dim_size))
            out[1, layer_idx, :n].copy_(flat[value_idx].reshape(n, self.hidden_dim_size))

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        """LMCache -> vLLM: ``memory_obj.tensor`` into the slots of tokens ``start:end``, except the
        first ``vllm_cached_tokens - start`` of them (vLLM's own, possibly shared, blocks)."""
        kvcaches, slots = self._args(start, end, kwargs)
        skip = min(end - start, max(0, int(kwargs.get("vllm_cached_tokens", 0)) - start))
        slots = slots[skip:]
        n = len(slots)
        if n == 0:
            return
        src = memory_obj.tensor
        for layer_idx, layer in enumerate(kvcaches):
            key_idx, value_idx = self._indices(layer, slots)
            flat = layer.view(-1)
            flat[key_idx] = src[0, layer_idx, skip:skip + n].reshape(n, self.num_kv_heads, self.head_size)
            flat[value_idx] = src[1, layer_idx, skip:skip + n].reshape(n, self.num_kv_heads, self.head_size)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs: Any) -> None:
        for memory_obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(memory_obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs=None, starts=None, ends=None, **kwargs: Any) -> None:
        for memory_obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(memory_obj, start, end, **kwargs)


def _register_interface() -> None:
    """Make :class:`CPUPagedKVCopy` a virtual subclass of LMCache's ``GPUConnectorInterface``
    (an ``abc.ABCMeta`` class), for any ``isinstance`` check on the engine's connector."""
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    GPUConnectorInterface.register(CPUPagedKVCopy)


def install_cpu_copy() -> None:
    """Make ``lmcache.v1.gpu_connector.CreateGPUConnector`` answer a vLLM worker on a CPU device
    with :class:`CPUPagedKVCopy`; every other case goes to LMCache's own function. Idempotent.

    ``VllmServiceFactory.get_or_create_lmcache_engine`` imports the function from that module
    when it builds the engine, so the module attribute is what it calls.
    """
    import lmcache.v1.gpu_connector as gpu_connector
    from lmcache.utils import EngineType
    from lmcache import torch_device_type  # as lmcache.v1.gpu_connector imports it

    released = gpu_connector.CreateGPUConnector
    if getattr(released, "_cpu_copy", False):
        return
    _register_interface()

    def create(config, metadata, engine, layout_hints=None):
        if engine == EngineType.VLLM and torch_device_type == "cpu" and not config.use_layerwise:
            return CPUPagedKVCopy.from_metadata(metadata)
        return released(config, metadata, engine, layout_hints=layout_hints)

    create._cpu_copy = True  # type: ignore[attr-defined]
    gpu_connector.CreateGPUConnector = create


class CPUCopyLMCacheConnectorV1(base_class()):  # type: ignore[misc]
    """The production connector (``$KVCACHE_TEST_CONNECTOR_BASE``) with :func:`install_cpu_copy`
    done before its ``__init__`` builds LMCache (module docstring)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        install_cpu_copy()
        super().__init__(vllm_config, role, kv_cache_config)
