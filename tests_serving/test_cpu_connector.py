"""The test copy connector (:mod:`tests_serving.cpu_connector`) against vLLM's own CPU KV kernels.

K and V are written into a paged KV cache by vLLM's ``cpu_attn_reshape_and_cache`` (the op
``CPUAttentionBackendImpl.do_kv_cache_update`` calls, vllm/v1/attention/backends/cpu_attn.py), on
the views the backend itself takes; the copy connector must read back exactly those K and V per
token (vLLM -> LMCache), and write a memory object into other slots so that the backend's views
show it (LMCache -> vLLM): a round trip of KV blocks. No server is started.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests_serving.cpu_connector import CPUPagedKVCopy, base_class

LAYERS, HEADS, HEAD, BLOCK, BLOCKS = 3, 4, 64, 32, 12


def kv_cache_layers() -> list[torch.Tensor]:
    """vLLM's CPU layout per layer: [num_blocks, num_kv_heads, block_size, 2 * head_size]."""
    return [torch.zeros(BLOCKS, HEADS, BLOCK, 2 * HEAD, dtype=torch.float32) for _ in range(LAYERS)]


def vllm_write(layer: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
    """What vLLM's CPU backend does with a forward pass's new K and V ([tokens, heads, head_size])."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    view = layer.view(BLOCKS, HEADS, 2 * BLOCK, HEAD)
    key_cache, value_cache = view.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots,
                                   _get_attn_isa(torch.float32, BLOCK, HEAD, "auto"))


def memory_obj(tokens: int) -> SimpleNamespace:
    return SimpleNamespace(tensor=torch.full((2, LAYERS, tokens, HEADS * HEAD), float("nan")), metadata=None)


@pytest.fixture
def copy() -> CPUPagedKVCopy:
    return CPUPagedKVCopy(LAYERS, HEADS, HEAD)


def test_store_reads_what_vllm_wrote_token_by_token(copy):
    torch.manual_seed(0)
    tokens = 80  # 2.5 blocks, on scattered blocks: the slot mapping of a paged cache
    blocks = torch.tensor([7, 2, 9])
    slots = (blocks[:, None] * BLOCK + torch.arange(BLOCK)).flatten()[:tokens]
    layers = kv_cache_layers()
    keys = [torch.randn(tokens, HEADS, HEAD) for _ in range(LAYERS)]
    values = [torch.randn(tokens, HEADS, HEAD) for _ in range(LAYERS)]
    for layer, k, v in zip(layers, keys, values):
        vllm_write(layer, k, v, slots)
    obj = memory_obj(48)
    copy.from_gpu(obj, 16, 64, kvcaches=layers, slot_mapping=slots)
    for n in range(LAYERS):
        assert torch.equal(obj.tensor[0, n], keys[n][16:64].reshape(48, HEADS * HEAD))
        assert torch.equal(obj.tensor[1, n], values[n][16:64].reshape(48, HEADS * HEAD))
    assert copy.get_shape(256) == torch.Size([2, LAYERS, 256, HEADS * HEAD])


def test_round_trip_of_kv_blocks_through_a_memory_object(copy):
    torch.manual_seed(1)
    tokens = 64
    src_slots = torch.arange(tokens) + 3 * BLOCK  # blocks 3, 4
    dst_slots = torch.cat([torch.arange(BLOCK) + 10 * BLOCK, torch.arange(BLOCK) + 0 * BLOCK])  # blocks 10, 0
    layers = kv_cache_layers()
    for layer in layers:
        vllm_write(layer, torch.randn(tokens, HEADS, HEAD), torch.randn(tokens, HEADS, HEAD), src_slots)
    obj = memory_obj(tokens)
    copy.batched_from_gpu([obj], [0], [tokens], kvcaches=layers, slot_mapping=src_slots)
    other = kv_cache_layers()
    copy.batched_to_gpu([obj], [0], [tokens], kvcaches=other, slot_mapping=dst_slots)
    for src, dst in zip(layers, other):
        s = src.view(BLOCKS, HEADS, 2 * BLOCK, HEAD)
        d = dst.view(BLOCKS, HEADS, 2 * BLOCK, HEAD)
        assert torch.equal(d[10], s[3]) and torch.equal(d[0], s[4])  # K rows and V rows of each block
        assert d[[1, 2, 5, 6, 7, 8, 9, 11]].abs().sum() == 0  # no other block touched


def test_load_never_overwrites_tokens_vllm_already_holds(copy):
    """``vllm_cached_tokens``: a block vLLM shares with another request is left as it is."""
    tokens = 64
    slots = torch.arange(tokens)
    layers = kv_cache_layers()
    obj = SimpleNamespace(tensor=torch.ones(2, LAYERS, tokens, HEADS * HEAD), metadata=None)
    copy.to_gpu(obj, 0, tokens, kvcaches=layers, slot_mapping=slots, vllm_cached_tokens=BLOCK)
    view = layers[0].view(BLOCKS, HEADS, 2 * BLOCK, HEAD)
    assert view[0].abs().sum() == 0 and bool((view[1] == 1).all())


def test_the_base_is_the_class_the_environment_names(monkeypatch):
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

    monkeypatch.delenv("KVCACHE_TEST_CONNECTOR_BASE", raising=False)
    assert base_class() is LMCacheConnectorV1
    monkeypatch.setenv("KVCACHE_TEST_CONNECTOR_BASE", "collections:OrderedDict")
    import collections

    assert base_class() is collections.OrderedDict
    monkeypatch.setenv("KVCACHE_TEST_CONNECTOR_BASE", "no-colon")
    with pytest.raises(ValueError):
        base_class()
