"""The hot-prefix warmer's chunk names against LMCache's own, in process (issue 25 item 3; no server).

LMCache 0.5.5's ``ChunkedTokenDatabase`` (``pre_caching_hash_algorithm`` ``sha256_cbor``, vLLM 0.29.0's
``sha256_cbor``), its chain started from a key the way the L2 gate starts it in every vLLM process
(``vllm_plugins.l2_gate.apply_chunk_key``), must give exactly the hashes the janitor's warmer computes
with the standard library (``cluster_agents.hot_prefixes.keyed_none_hash`` / ``keyed_chunk_hashes``,
its own CBOR encoder) for any token list and any key; and a prompt's file name must be one
``parse_chunk_name`` reads back. Random tokens (edge values of every CBOR head size included) and random
keys, a fixed seed per case so a failure is reproducible. Takes about a second.
"""

from __future__ import annotations

import random

import pytest

from cluster_agents import hot_prefixes
from vllm_plugins import l2_gate

CHUNK = 16
EDGES = [0, 1, 23, 24, 255, 256, 65535, 65536, 151643, 2**32 - 1, 2**32]


@pytest.fixture
def token_database():
    """LMCache's module and one ChunkedTokenDatabase as the connector builds it; NONE_HASH restored after."""
    from lmcache.v1 import token_database as module
    from lmcache.v1.config import LMCacheEngineConfig

    saved = module.NONE_HASH
    config = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, pre_caching_hash_algorithm="sha256_cbor",
                                               save_unfull_chunk=False)
    database = module.ChunkedTokenDatabase(config, None)
    yield module, database
    module.NONE_HASH = saved


def _lmcache_hashes(database, tokens: list[int]) -> list[int]:
    return [h for _, _, h in database.process_tokens(tokens=tokens, make_key=False)]


@pytest.mark.parametrize("seed", range(8))
def test_the_warmers_names_are_lmcaches_for_random_tokens_and_keys(token_database, seed: int) -> None:
    module, database = token_database
    rng = random.Random(seed)
    for _ in range(25):
        key = "".join(rng.choice("0123456789abcdef") for _ in range(64)) if rng.random() < 0.8 else \
            rng.choice(["k", "é-ключ-鍵", "x" * 300])
        assert l2_gate.apply_chunk_key({l2_gate.CHUNK_KEY_ENV: key}, algorithm="sha256_cbor") is not None
        assert module.NONE_HASH == hot_prefixes.keyed_none_hash(key)
        tokens = [rng.choice(EDGES) if rng.random() < 0.2 else rng.randrange(0, 200000)
                  for _ in range(rng.randrange(0, 6 * CHUNK))]
        ours = hot_prefixes.keyed_chunk_hashes(tokens, CHUNK, hot_prefixes.keyed_none_hash(key))
        assert _lmcache_hashes(database, tokens) == ours
        assert len(ours) == len(tokens) // CHUNK  # full chunks only (save_unfull_chunk false)


def test_another_key_gives_other_names_and_the_file_name_parses(token_database) -> None:
    module, database = token_database
    tokens = list(range(1000, 1000 + 3 * CHUNK))
    l2_gate.apply_chunk_key({l2_gate.CHUNK_KEY_ENV: "key-a"}, algorithm="sha256_cbor")
    a = _lmcache_hashes(database, tokens)
    l2_gate.apply_chunk_key({l2_gate.CHUNK_KEY_ENV: "key-b"}, algorithm="sha256_cbor")
    b = _lmcache_hashes(database, tokens)
    assert not set(a) & set(b)
    import torch
    from lmcache.utils import CacheEngineKey

    name = CacheEngineKey("/opt/ml/model", 2, 1, b[0], torch.bfloat16, None).to_string().replace("/", "-SEP-") + ".data"
    assert hot_prefixes.parse_chunk_name(name) == (2, 1, hot_prefixes.hash_hex(b[0]))


def test_without_a_key_the_chain_starts_from_pythonhashseed_as_stock_lmcache(token_database, monkeypatch) -> None:
    """An unkeyed pod (no Secret yet, or a test server) keys from the string PYTHONHASHSEED with the same
    hash: the warmer's ``keyed_none_hash(seed)`` names those files too."""
    import os

    module, _ = token_database
    from vllm.v1.core import kv_cache_utils

    seed = os.environ.get("PYTHONHASHSEED") or kv_cache_utils.DEFAULT_NONE_HASH_SEED
    from lmcache.v1.config import LMCacheEngineConfig

    fresh = module.ChunkedTokenDatabase(LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, pre_caching_hash_algorithm="sha256_cbor", save_unfull_chunk=False), None)
    assert l2_gate.apply_chunk_key({}, algorithm="sha256_cbor") is None
    tokens = list(range(2 * CHUNK))
    assert _lmcache_hashes(fresh, tokens) == hot_prefixes.keyed_chunk_hashes(tokens, CHUNK, hot_prefixes.keyed_none_hash(seed))
