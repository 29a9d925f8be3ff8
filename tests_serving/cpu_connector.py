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
``[num_blocks, num_kv_heads, 2 * block_size, head_size]`` and split in two along dim 2: rows
``0 .. block_size-1`` hold K of the block's tokens, rows ``block_size ..`` hold V. Slot ``s`` is
token ``s % block_size`` of block ``s // block_size`` (LMCache's slot mapping,
``vllm_v1_adapter.RequestTracker``/``ReqMeta``: ``block_id * block_size + offset``).

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

    @classmethod
    def from_metadata(cls, metadata: Any) -> "CPUPagedKVCopy":
        """From LMCache's ``LMCacheMetadata.kv_shape``: ``(layers, 2, chunk, kv_heads, head_size)``."""
        num_layers, kv, _, num_kv_heads, head_size = metadata.kv_shape
        if kv != 2 or getattr(metadata, "use_mla", False):
            raise NotImplementedError("MLA KV caches are not covered by the test copy connector")
        return cls(num_layers, num_kv_heads, head_size)

    # -- the layout ---------------------------------------------------------------------------

    def planes(self, layer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as views ``[num_blocks, num_kv_heads, block_size, head_size]``,
        split the way ``CPUAttentionBackendImpl`` splits them."""
        if layer.dim() != 4 or layer.shape[1] != self.num_kv_heads or layer.shape[3] != 2 * self.head_size:
            raise ValueError(f"unexpected vLLM CPU KV cache layer shape {tuple(layer.shape)} "
                             f"(expected [blocks, {self.num_kv_heads}, block_size, {2 * self.head_size}])")
        num_blocks, heads, block_size, _ = layer.shape
        key, value = layer.view(num_blocks, heads, 2 * block_size, self.head_size).chunk(2, dim=2)
        return key, value

    @staticmethod
    def _where(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        slots = slots.to(device="cpu", dtype=torch.long)
        return slots // block_size, slots % block_size

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
            key, value = self.planes(layer)
            blocks, offsets = self._where(slots, key.shape[2])
            # [n, heads, head_size] -> [n, heads * head_size]
            out[0, layer_idx, :n].copy_(key[blocks, :, offsets].reshape(n, self.hidden_dim_size))
            out[1, layer_idx, :n].copy_(value[blocks, :, offsets].reshape(n, self.hidden_dim_size))

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
            key, value = self.planes(layer)
            blocks, offsets = self._where(slots, key.shape[2])
            key[blocks, :, offsets] = src[0, layer_idx, skip:skip + n].reshape(n, self.num_kv_heads, self.head_size)
            value[blocks, :, offsets] = src[1, layer_idx, skip:skip + n].reshape(n, self.num_kv_heads, self.head_size)

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
    from lmcache.v1.platform._device_detect import torch_device_type

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
