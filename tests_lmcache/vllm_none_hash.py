"""The one piece of vLLM that decides LMCache's chunk keys, for the tier's stand-in replicas.

In a vLLM Pod, LMCache 0.5.5's ``TokenDatabase.__init__`` (``lmcache/v1/token_database.py`` lines
90-102) imports ``vllm.v1.core.kv_cache_utils``, calls ``init_none_hash(self.hash_func)`` and starts
every chain of chunk keys from the resulting ``NONE_HASH``; without vLLM (this tier) it uses 0. vLLM is
not installable here, so :func:`install` puts a module of that name in ``sys.modules`` whose
``init_none_hash`` is written from vLLM 0.29.0 ``vllm/v1/core/kv_cache_utils.py`` lines 107-159 (the
wheel, docs/sources.md): the seed is ``PYTHONHASHSEED`` when set, else ``"vllm-none-hash"`` for a hash
function that is not xxhash (LMCache passes Python's builtin ``hash``: vLLM 0.29.0's
``get_hash_fn_by_name`` has no ``builtin``, so LMCache falls back to it, ``_get_vllm_hash_func``), and
``NONE_HASH = hash_fn(seed)``. And ``vllm.utils.hashing`` with the two names LMCache uses,
``get_hash_fn_by_name`` and ``sha256_cbor`` (vLLM 0.29.0 ``vllm/utils/hashing.py`` lines 43-58 and
82-100): ``sha256_cbor`` is SHA-256 of the canonical CBOR, written with the warmer's standard-library
encoder (:func:`cluster_agents.hot_prefixes.cbor`, byte for byte ``cbor2``'s for the chain's shapes:
``tests_serving/test_chunk_keys.py``; ``cbor2`` is not installed here); any other name, ``builtin``
included, raises ValueError as vLLM's does, and ``vllm.utils`` has no ``get_hash_fn_by_name`` (vLLM
0.29.0's has none), so LMCache takes the same fallback to Python's ``hash`` for ``builtin``. LMCache's
own code then runs its vLLM branch unchanged (its log says "Initialized NONE_HASH=... from vLLM").
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sys
import types
from typing import Any, Callable

#: ``DEFAULT_NONE_HASH_SEED`` of vLLM 0.29.0 (kv_cache_utils.py line 109).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package with no submodules on disk: any other vllm import fails
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    return module


def install() -> None:
    """Put ``vllm``, ``vllm.v1``, ``vllm.v1.core``, ``vllm.v1.core.kv_cache_utils``, ``vllm.utils`` and
    ``vllm.utils.hashing`` into ``sys.modules`` (before LMCache builds its token database)."""
    kv = types.ModuleType("vllm.v1.core.kv_cache_utils")
    kv.__spec__ = importlib.machinery.ModuleSpec(kv.__name__, None)
    kv.NONE_HASH = None
    kv.DEFAULT_NONE_HASH_SEED = DEFAULT_NONE_HASH_SEED

    def init_none_hash(hash_fn: Callable[[Any], Any]) -> None:
        # resolve_none_hash_seed: PYTHONHASHSEED wins; builtin hash is not one of the xxhash functions.
        seed = os.getenv("PYTHONHASHSEED")
        kv.NONE_HASH = hash_fn(seed if seed is not None else DEFAULT_NONE_HASH_SEED)

    kv.init_none_hash = init_none_hash
    from cluster_agents.hot_prefixes import cbor

    hashing = types.ModuleType("vllm.utils.hashing")
    hashing.__spec__ = importlib.machinery.ModuleSpec(hashing.__name__, None)

    def sha256_cbor(value: Any) -> bytes:
        return hashlib.sha256(cbor(value)).digest()

    def get_hash_fn_by_name(name: str) -> Callable[[Any], bytes]:
        if name == "sha256_cbor":
            return sha256_cbor
        raise ValueError(f"Unsupported hash function: {name}")

    hashing.sha256_cbor, hashing.get_hash_fn_by_name = sha256_cbor, get_hash_fn_by_name
    vllm, v1, core, utils = _package("vllm"), _package("vllm.v1"), _package("vllm.v1.core"), _package("vllm.utils")
    vllm.v1, v1.core, core.kv_cache_utils, vllm.utils, utils.hashing = v1, core, kv, utils, hashing
    sys.modules.update({"vllm": vllm, "vllm.v1": v1, "vllm.v1.core": core, "vllm.v1.core.kv_cache_utils": kv,
                        "vllm.utils": utils, "vllm.utils.hashing": hashing})
