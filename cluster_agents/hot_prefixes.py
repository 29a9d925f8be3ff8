"""Hot prefixes of an L2 line: warmed into L2 before traffic needs them, pinned against the janitor,
restored after a loss (docs/l2-cache.md, "Hot prefixes").

A line declares its shared leading prompts (``hot_prefixes`` in its config: a system prompt, a RAG
preamble, tool schemas). The line's L2 janitor runs this module in a thread beside its passes
(``l2_janitor.py --hot-prefixes FILE``; the chart ships both files in one ConfigMap). Every
:data:`POLL_S` it lists the line's Pods (the janitor's ``list pods``, nothing more) and keeps the
Running, Ready endpoint Pods whose ``LMCACHE_REMOTE_URL`` is the configured directory
(:func:`ready_replicas`). A *round* (:meth:`HotPrefixWarmer.run_round`) runs when a replica appears
that it has not seen (a rollout, a scale-out, its own start) and every ``warm_period_s``; it takes
each prefix in turn:

1. **Tokens.** ``POST /tokenize`` on a replica (vLLM 0.29.0 ``TokenizeChatRequest`` /
   ``TokenizeCompletionRequest``): chat messages with ``add_generation_prompt`` false (the leading
   tokens every request that starts with these messages shares; the generation prompt belongs to
   the request), raw text as a completion prompt (BOS as vLLM adds it). Once per process: the
   tokenizer is the model's, which the configuration (and so this process) fixes.
2. **Names.** The chain of LMCache 0.5.5's chunk keys (``ChunkedTokenDatabase._prefix_hash``,
   ``TokenDatabase._hash_tokens``): ``h0 = NONE_HASH``, ``h[i+1] = H((h[i], tuple(chunk i),
   ()))`` over the full chunks only (``save_unfull_chunk`` false), ``H`` the line's
   ``hash_algorithm``. **``sha256_cbor``** (what the platform pins, issue 25): ``H`` is SHA-256 of the
   canonical CBOR of the tuple, folded to its first 8 bytes big-endian (vLLM's ``sha256_cbor``,
   LMCache's ``_normalize_hash_to_int``), and ``h0`` is ``H`` of the line's secret string, which the
   L2 gate sets in every vLLM process (``vllm_plugins/l2_gate.py`` ``apply_chunk_key``) and the janitor
   reads from the line's Secret (:class:`l2_janitor.ChunkKey`): :func:`keyed_none_hash`,
   :func:`keyed_chunk_hashes`, with a CBOR encoder of exactly the shapes needed (:func:`cbor`),
   checked byte for byte against LMCache's own token database in ``tests_serving/test_chunk_keys.py``.
   **``builtin``** (before issue 25; anyone who knows the seed computes every name): ``H`` is
   Python's ``hash``. With vLLM present, LMCache sets
   ``NONE_HASH`` through vLLM's ``init_none_hash(hash)`` (builtin ``hash``: vLLM 0.29.0 has no
   ``builtin`` in ``get_hash_fn_by_name``, so LMCache falls back to Python's own), i.e.
   ``hash(os.environ["PYTHONHASHSEED"])``: the hash of a *string*, which CPython salts with
   ``PYTHONHASHSEED`` (SipHash-1-3 since 3.11). :func:`none_hash` computes it in a child
   interpreter started with the line's seed; this process must therefore be a 64-bit CPython >= 3.11
   (:func:`check_hash_family`), as the vLLM image's Python 3.12 is. Tuples of ints are not salted.
   A chunk's file is ``<model>@<world size>@<worker id>@<hash as %x>@<dtype>.data``, one per TP rank
   (``CacheEngineKey.to_string``, ``FSConnector._get_file_name``); only the hash depends on the
   tokens: model path, world size and dtype are the same for every file of the line's directory
   (they are part of its name, ``k8s.lmcache.l2_cache_dir``), so a chunk is matched by its hash and
   counted present when every rank's file exists (:func:`parse_chunk_name`).
3. **Warm.** ``POST /v1/completions`` with the token ids, ``max_tokens`` 1, to one replica (a new one
   first: its CPU buffer is empty, so what L2 lacks it computes and stores), then waits up to
   ``settle_s`` for the chunk files (LMCache writes L2 asynchronously). Chunks still missing (the
   replica served them from its CPU buffer, L1, and so stored nothing) are tried on the next
   replica, each Ready replica at most once a round; at most one request per
   ``min_request_interval_s``.
4. **Self-check.** A request that succeeded but left none of the prefix's chunks in L2 while new
   chunk files appeared in the directory means the names computed here are not LMCache's (wrong
   seed, Python, hash algorithm): the round says ``names_mismatch`` and
   ``kvcache_hot_prefix_names_ok`` turns 0, rather than pinning nothing silently. No new file at
   all is ``not_stored`` (L2 writes fail, or every replica held the prefix in L1).

The janitor never deletes a chunk whose hash is one of :meth:`HotPrefixWarmer.pinned` (in the
configured directory), by age or by size. The hashes are kept in :data:`STATE_FILE` at the PVC root,
so a janitor that restarts pins before its first round, and recomputes them at that round with the
chunk key it read (:meth:`HotPrefixWarmer._rehash`). Between rounds, every
``presence_period_s``, the tokens of each prefix in L2 are counted again (one ``stat`` per chunk
file once the directory's name frame is known), so a chunk lost with a Worker shows within a minute.

Metrics (served by the janitor's ``GET /metrics``, :meth:`HotPrefixWarmer.metrics`), labelled
``line``, ``namespace``, ``prefix``: ``kvcache_hot_prefix_declared_tokens`` (tokens of the prefix as
the replica tokenized it), ``_pinned_tokens`` (of them, those in full chunks: what L2 can hold),
``_l2_tokens`` (leading tokens whose chunks are in L2 for every rank now: what a lookup hits),
``_warmups_total{result}``; per line ``_names_ok`` and ``_last_round_timestamp_seconds``.

Standard library only; imports nothing of the project (it runs from a ConfigMap).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if __package__:  # imported as cluster_agents.hot_prefixes
    from . import agent_core as core
else:  # run from the janitor's ConfigMap, agent_core.py beside it
    import agent_core as core

#: The warmer's record at the PVC root: the token count and chunk hashes of each prefix, for the
#: configured directory and configuration (:func:`config_fingerprint`). Not a chunk file.
STATE_FILE = ".kvcache-hot-prefixes.json"
STATE_VERSION = 1
#: LMCache's chunk file suffix and key separator (``FSConnector._get_file_name``,
#: ``CacheEngineKey.to_string``, lmcache 0.5.5).
CHUNK_SUFFIX = ".data"
KEY_SEPARATOR = "@"
#: LMCache's ``pre_caching_hash_algorithm`` values whose names this module computes. ``sha256_cbor``
#: (what the policy pins since issue 25): SHA-256 of the canonical CBOR of the chain's tuple, folded
#: to its first 8 bytes, from a ``NONE_HASH`` keyed with the line's secret (:func:`keyed_none_hash`,
#: :func:`keyed_chunk_hashes`). ``builtin``: Python's ``hash`` from ``hash(PYTHONHASHSEED)``
#: (:func:`none_hash`, :func:`chunk_hashes`), computable by anyone who knows the seed.
BUILTIN = "builtin"
SHA256_CBOR = "sha256_cbor"
HASH_ALGORITHMS = (BUILTIN, SHA256_CBOR)
#: The default of :attr:`HotPrefixConfig.hash_algorithm` (a config that names none is an old one).
HASH_ALGORITHM = BUILTIN
#: CPython's ``str`` hash of the vLLM image's Python (3.12): SipHash-1-3 since 3.11, 64-bit.
STR_HASH_ALGORITHM = "siphash13"

#: Seconds between two Pod listings (a new Ready replica is warmed within this).
POLL_S = 15.0
#: Seconds between two counts of the prefixes' chunks in L2 outside rounds.
PRESENCE_PERIOD_S = 60.0
#: At most one warm-up request per this many seconds.
MIN_REQUEST_INTERVAL_S = 2.0
#: How long a warm-up waits for the prefix's chunk files after its request returned.
SETTLE_S = 60.0
#: Timeout of one HTTP request to a replica.
REQUEST_TIMEOUT_S = 120.0

METRIC_PREFIX = "kvcache_hot_prefix_"
DECLARED_TOKENS_METRIC = METRIC_PREFIX + "declared_tokens"
PINNED_TOKENS_METRIC = METRIC_PREFIX + "pinned_tokens"
L2_TOKENS_METRIC = METRIC_PREFIX + "l2_tokens"
WARMUPS_METRIC = METRIC_PREFIX + "warmups"
NAMES_OK_METRIC = METRIC_PREFIX + "names_ok"
LAST_ROUND_METRIC = METRIC_PREFIX + "last_round_timestamp_seconds"

#: What one warm-up of a prefix found (label ``result`` of :data:`WARMUPS_METRIC`):
#: ``in_l2`` every chunk was there already; ``stored`` chunks were missing and are there now;
#: ``partial`` some are still missing after every replica was tried; ``not_stored`` none is there
#: and no replica wrote a chunk file; ``names_mismatch`` none is there although replicas wrote chunk
#: files (the names computed here are wrong); ``short`` the prefix holds no full chunk (nothing to
#: keep); ``too_long`` longer than the model's context; ``error`` tokenize or requests failed.
RESULTS = ("in_l2", "stored", "partial", "not_stored", "names_mismatch", "short", "too_long", "error")


# --- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Prefix:
    """One declared prefix: chat ``messages`` ((role, text), ...) or a raw ``text``."""

    name: str
    messages: tuple[tuple[str, str], ...] = ()
    text: str | None = None

    @property
    def kind(self) -> str:
        return "chat" if self.messages else "text"


@dataclass(frozen=True)
class HotPrefixConfig:
    """What the chart renders into ``hot_prefixes.json`` (:func:`load_config` reads it; texts from the
    files beside it).

    Attributes:
        line, namespace: the business line and its namespace (its Pods are listed there).
        live_dir: the line's configured L2 directory under the PVC root (``k8s.lmcache.l2_cache_dir``).
        mount_path: where the vLLM Pods mount the PVC (to read their ``LMCACHE_REMOTE_URL``).
        pod_label: ``(key, value)`` of the endpoint's Pods; port / port_name: vLLM's port.
        chunk_size: LMCache chunk, tokens; world_size: TP x PP ranks (files per chunk).
        python_hash_seed: the line's ``PYTHONHASHSEED``; hash_algorithm: LMCache's
            ``pre_caching_hash_algorithm`` (one of :data:`HASH_ALGORITHMS`).
        key_secret: for ``sha256_cbor``, the name of the line's chunk-key Secret (its value is never
            in this file: the janitor reads it from the API and hands it to the warmer).
        warm_period_s: seconds between two scheduled rounds.
        prefixes: the declared prefixes, in order.
    """

    line: str
    namespace: str
    live_dir: str
    mount_path: str
    pod_label: tuple[str, str]
    port: int
    port_name: str
    chunk_size: int
    world_size: int
    python_hash_seed: int
    warm_period_s: float
    prefixes: tuple[Prefix, ...]
    hash_algorithm: str = HASH_ALGORITHM
    key_secret: str | None = None
    poll_s: float = POLL_S
    presence_period_s: float = PRESENCE_PERIOD_S
    min_request_interval_s: float = MIN_REQUEST_INTERVAL_S
    settle_s: float = SETTLE_S
    request_timeout_s: float = REQUEST_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.hash_algorithm not in HASH_ALGORITHMS:
            raise ValueError(f"hash_algorithm {self.hash_algorithm!r}: chunk names are computed for {HASH_ALGORITHMS} only")
        if (self.hash_algorithm == SHA256_CBOR) != bool(self.key_secret):
            raise ValueError("key_secret (the chunk-key Secret's name) is needed with sha256_cbor and only with it")
        if self.chunk_size <= 0 or self.world_size <= 0 or self.warm_period_s <= 0 or self.poll_s <= 0:
            raise ValueError("chunk_size, world_size, warm_period_s and poll_s must be > 0")
        if len(self.pod_label) != 2 or "/" in self.live_dir or not self.live_dir:
            raise ValueError("pod_label must be [key, value] and live_dir one path component")
        if len({p.name for p in self.prefixes}) != len(self.prefixes):
            raise ValueError("prefix names must be unique")


def load_config(path: Path) -> HotPrefixConfig:
    """:class:`HotPrefixConfig` from ``path``; each prefix's texts from the files it names, relative to
    ``path``'s directory (``{"name", "messages": [{"role", "file"}]}`` or ``{"name", "file"}``).

    Raises:
        ValueError: a missing or bad key; OSError / UnicodeDecodeError: a text file.
    """
    data = json.loads(path.read_text(encoding="utf-8"))

    def text(name: str) -> str:
        return (path.parent / name).read_text(encoding="utf-8")

    try:
        prefixes = tuple(
            Prefix(p["name"], tuple((m["role"], text(m["file"])) for m in p.get("messages") or ()),
                   text(p["file"]) if p.get("file") else None)
            for p in data.pop("prefixes"))
        return HotPrefixConfig(**{**data, "pod_label": tuple(data.get("pod_label") or ()), "prefixes": prefixes})
    except (KeyError, TypeError) as exc:
        raise ValueError(f"hot prefixes config: {exc!r}") from None


def config_fingerprint(config: HotPrefixConfig) -> str:
    """SHA-256 of what the chunk hashes depend on: the directory (model, TP, dtype, seed, image), the
    chunk size, the seed, the hash, the chunk-key Secret's name (not its value, which this process
    may not have yet: :meth:`HotPrefixWarmer._rehash`) and every prefix's text. A state file of
    another fingerprint is not used."""
    body = json.dumps([config.live_dir, config.chunk_size, config.world_size, config.python_hash_seed,
                       config.hash_algorithm, [[p.name, p.messages, p.text] for p in config.prefixes]]
                      + ([config.key_secret] if config.key_secret else []))
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


# --- chunk names -------------------------------------------------------------------------------


def check_hash_family() -> None:
    """Raise RuntimeError unless this is a 64-bit CPython >= 3.11 hashing ``str`` with SipHash-1-3,
    the family of the vLLM image's Python 3.12 (``sys.hash_info``)."""
    info = sys.hash_info
    if sys.implementation.name != "cpython" or info.algorithm != STR_HASH_ALGORITHM or info.width != 64:
        raise RuntimeError(f"this Python ({sys.implementation.name} {sys.version.split()[0]}, str hash "
                           f"{info.algorithm}/{info.width} bit) does not hash like the vLLM image's CPython 3.12 "
                           f"({STR_HASH_ALGORITHM}/64 bit): chunk names would be wrong")


def none_hash(seed: int | str, python: str = sys.executable) -> int:
    """vLLM's ``NONE_HASH`` as LMCache 0.5.5 sets it in a Pod with ``PYTHONHASHSEED=<seed>``: Python's
    builtin ``hash`` of the seed *string* (vLLM 0.29.0 ``init_none_hash``: ``hash_fn(PYTHONHASHSEED)``),
    computed by ``python`` started with that seed (this process's own ``str`` hash has another salt).

    Raises:
        RuntimeError: the child failed; subprocess.TimeoutExpired.
    """
    seed = str(seed)
    done = subprocess.run([python, "-c", "import sys; print(hash(sys.argv[1]))", seed],
                          env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"computing NONE_HASH failed: {done.stderr.strip()[-300:]}")
    return int(done.stdout.strip())


def chunk_hashes(tokens: list[int], chunk_size: int, first: int) -> list[int]:
    """LMCache 0.5.5's key of every *full* chunk of ``tokens`` (``ChunkedTokenDatabase``, builtin hash):
    ``h = hash((h, tuple(chunk), ()))`` from ``h = first`` (``NONE_HASH``). Ints and tuples of ints
    hash the same in every 64-bit CPython >= 3.8, whatever the seed."""
    out: list[int] = []
    h = first
    for start in range(0, len(tokens) - len(tokens) % chunk_size, chunk_size):
        h = hash((h, tuple(int(t) for t in tokens[start:start + chunk_size]), ()))
        out.append(h)
    return out


def cbor(value: int | str | tuple[Any, ...] | list[Any]) -> bytes:
    """The CBOR encoding (RFC 8949) of ``value`` as ``cbor2.dumps(value, canonical=True)`` writes it, for
    the shapes LMCache's chain hashes: unsigned ints below 2**64 (major type 0, shortest head), text
    strings (major type 3, UTF-8) and tuples or lists of these (major type 4). Anything else (a bool,
    a negative int, a float, a map) raises ValueError: the chain never holds one."""
    if isinstance(value, bool):
        raise ValueError("CBOR of a bool is not needed here")
    if isinstance(value, int):
        if not 0 <= value < 1 << 64:
            raise ValueError(f"only unsigned 64-bit ints are encoded, not {value}")
        return _cbor_head(0, value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return _cbor_head(3, len(data)) + data
    if isinstance(value, (tuple, list)):
        return _cbor_head(4, len(value)) + b"".join(cbor(item) for item in value)
    raise ValueError(f"CBOR of {type(value).__name__} is not needed here")


def _cbor_head(major: int, argument: int) -> bytes:
    """A CBOR item head: major type and argument in the shortest form (RFC 8949 section 3)."""
    if argument < 24:
        return bytes([major << 5 | argument])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if argument < 1 << (8 * size):
            return bytes([major << 5 | info]) + argument.to_bytes(size, "big")
    raise ValueError(f"CBOR argument {argument} does not fit 8 bytes")


def sha256_cbor_int(value: int | str | tuple[Any, ...]) -> int:
    """vLLM 0.29.0's ``sha256_cbor`` (SHA-256 of ``cbor2.dumps(value, canonical=True)``,
    ``vllm/utils/hashing.py``) folded as LMCache 0.5.5 folds a digest (``_normalize_hash_to_int``: the
    first 8 bytes, big-endian)."""
    return int.from_bytes(hashlib.sha256(cbor(value)).digest()[:8], "big")


def keyed_none_hash(secret: str) -> int:
    """Where the chain of a ``sha256_cbor`` line starts: :func:`sha256_cbor_int` of the line's secret
    *string*, i.e. what vLLM's ``init_none_hash(sha256_cbor)`` would give with ``PYTHONHASHSEED`` set
    to it (CPython refuses such a seed at start, so the L2 gate sets it in each vLLM process:
    ``vllm_plugins/l2_gate.py`` ``apply_chunk_key``)."""
    if not secret:
        raise ValueError("an empty chunk-key secret")
    return sha256_cbor_int(secret)


def keyed_chunk_hashes(tokens: list[int], chunk_size: int, first: int) -> list[int]:
    """LMCache 0.5.5's key of every *full* chunk of ``tokens`` with ``pre_caching_hash_algorithm``
    ``sha256_cbor``: ``h = sha256_cbor_int((h, tuple(chunk), ()))`` from ``h = first``
    (:func:`keyed_none_hash`); ``TokenDatabase._hash_tokens``, ``ChunkedTokenDatabase._prefix_hash``."""
    out: list[int] = []
    h = first
    for start in range(0, len(tokens) - len(tokens) % chunk_size, chunk_size):
        h = sha256_cbor_int((h, tuple(int(t) for t in tokens[start:start + chunk_size]), ()))
        out.append(h)
    return out


def chain_hashes(tokens: list[int], chunk_size: int, hash_algorithm: str, first: int) -> list[int]:
    """The chain of ``hash_algorithm`` (:data:`HASH_ALGORITHMS`) over the full chunks of ``tokens``
    from ``first`` (:func:`none_hash` for ``builtin``, :func:`keyed_none_hash` for ``sha256_cbor``)."""
    if hash_algorithm == SHA256_CBOR:
        return keyed_chunk_hashes(tokens, chunk_size, first)
    if hash_algorithm == BUILTIN:
        return chunk_hashes(tokens, chunk_size, first)
    raise ValueError(f"hash_algorithm {hash_algorithm!r}: one of {HASH_ALGORITHMS}")


def chain_start(hash_algorithm: str, seed: int | str, key: str | None = None, python: str = sys.executable) -> int:
    """Where a pod's chain starts: ``sha256_cbor`` with ``key`` (its ``KVCACHE_L2_KEY``) is
    :func:`keyed_none_hash` of the key; without one (a pod outside the platform, a test server), of the
    seed string, as LMCache's own ``init_none_hash(sha256_cbor)`` gives; ``builtin`` is
    :func:`none_hash` of the seed (the key plays no part). For callers that hold a pod's env."""
    if hash_algorithm == SHA256_CBOR:
        return keyed_none_hash(key if key else str(seed))
    if hash_algorithm == BUILTIN:
        return none_hash(seed, python)
    raise ValueError(f"hash_algorithm {hash_algorithm!r}: one of {HASH_ALGORITHMS}")


def hash_hex(value: int) -> str:
    """A chunk hash as LMCache writes it in a file name (``CacheEngineKey.chunk_hash_hex``: ``%x``, a
    negative hash with its ``-``)."""
    return f"{value:x}"


def parse_chunk_name(name: str) -> tuple[int, int, str] | None:
    """``(world size, worker id, chunk hash hex)`` of an LMCache chunk file name, else None. Split on
    ``@`` as ``CacheEngineKey.from_string`` does (model path, world size, worker id, hash, dtype[, tags])."""
    if not name.endswith(CHUNK_SUFFIX):
        return None
    parts = name[:-len(CHUNK_SUFFIX)].split(KEY_SEPARATOR)
    if len(parts) < 5:
        return None
    try:
        return int(parts[1]), int(parts[2]), parts[3]
    except ValueError:
        return None


# --- replicas ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    """A Running, Ready endpoint Pod on the configured directory: name, uid, ``http://<pod IP>:<port>``."""

    name: str
    uid: str
    url: str


def ready_replicas(pods: list[dict[str, Any]], config: HotPrefixConfig) -> list[Replica]:
    """The Running, Ready, not deleting Pods with the endpoint's label, vLLM's port and an
    ``LMCACHE_REMOTE_URL`` naming ``config.live_dir`` (replicas of another model, as during a model
    change, write elsewhere), sorted by creation time then name (newest last)."""
    pods_on_dir = [p for p in core.endpoint_pods(pods, config.pod_label, config.port_name, config.port)
                   if core.l2_dir_of(p.remote_url, config.mount_path) == config.live_dir]
    return [Replica(p.name, p.uid, p.url) for p in sorted(pods_on_dir, key=lambda p: (p.created, p.name))]


class ReplicaClient:
    """JSON over HTTP to one replica (:func:`agent_core.replica_request`): ``/tokenize`` and ``/v1/completions``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def post(self, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON; the JSON reply. OSError on a failed request or a status other than 200."""
        status, reply = core.replica_request(url, "POST", path, json.dumps(body).encode("utf-8"), self.timeout_s)
        if status != 200:
            raise OSError(f"POST {url}{path}: HTTP {status}: {reply[:200]!r}")
        try:
            return json.loads(reply)
        except ValueError as exc:
            raise OSError(f"POST {url}{path}: not JSON ({exc})") from None

    def tokenize(self, url: str, prefix: Prefix) -> tuple[list[int], int | None]:
        """Token ids of ``prefix`` as the replica's tokenizer and chat template make them, and the
        replica's ``max_model_len``: vLLM 0.29.0 ``POST /tokenize`` (``messages`` with
        ``add_generation_prompt`` false, or ``prompt`` with ``add_special_tokens`` true)."""
        if prefix.messages:
            body: dict[str, Any] = {"messages": [{"role": r, "content": t} for r, t in prefix.messages],
                                    "add_generation_prompt": False, "continue_final_message": False}
        else:
            body = {"prompt": prefix.text, "add_special_tokens": True}
        reply = self.post(url, "/tokenize", body)
        tokens = reply.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise OSError(f"POST {url}/tokenize: no token ids in the reply")
        limit = reply.get("max_model_len")
        return tokens, limit if isinstance(limit, int) else None

    def complete(self, url: str, tokens: list[int]) -> dict[str, Any]:
        """One completion of ``tokens`` (a token-id prompt, vLLM's ``CompletionRequest.prompt``),
        ``max_tokens`` 1: the replica looks the prefix up in LMCache, computes what is missing and stores it."""
        return self.post(url, "/v1/completions", {"prompt": tokens, "max_tokens": 1, "temperature": 0})


# --- the warmer --------------------------------------------------------------------------------


@dataclass
class PrefixState:
    """What is known of one prefix (tokens and hashes once tokenized; L2 presence as last counted)."""

    name: str
    tokens: list[int] | None = None
    max_model_len: int | None = None
    hashes: list[str] = field(default_factory=list)
    #: Leading chunks present for every rank, and chunks present in all, at the last count.
    leading_chunks: int = 0
    chunks_present: int = 0
    last_result: str | None = None
    results: dict[str, int] = field(default_factory=lambda: {r: 0 for r in RESULTS})
    #: Whether ``hashes`` were computed by this process (with the key it read), not loaded from the
    #: state file: a key recreated under the same Secret name re-keys the names (:meth:`HotPrefixWarmer.warm`).
    hashed_here: bool = False


class HotPrefixWarmer:
    """Warm-up rounds and the pinned chunk hashes of one line (module docstring).

    Args:
        config: the rendered configuration.
        root: the line's PVC mount point.
        list_pods: the namespace's Pods as the API lists them (the janitor's lister).
        client: the replicas' HTTP client (tests pass their own).
        log: where each round's JSON line goes (stdout).
        now, sleep: clocks (tests pass their own).
        python: the interpreter that computes ``NONE_HASH`` (:func:`none_hash`, ``builtin`` only).
        chunk_key: returns the line's chunk-key secret (``sha256_cbor``: the janitor's read of the
            Secret ``config.key_secret``); raises while it cannot be had (the prefix's warm-up is an
            ``error`` and is tried again next round).
    """

    def __init__(self, config: HotPrefixConfig, root: Path, *, list_pods: Callable[[], list[dict[str, Any]]],
                 client: ReplicaClient | None = None, log: Callable[[str], None] | None = None,
                 now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 python: str = sys.executable, chunk_key: Callable[[], str] | None = None) -> None:
        self.config, self.root, self.list_pods = config, root, list_pods
        self.chunk_key = chunk_key
        self.client = client or ReplicaClient(config.request_timeout_s)
        self.log = log or (lambda line: print(line, flush=True))
        self.now, self.sleep, self.python = now, sleep, python
        self.fingerprint = config_fingerprint(config)
        self._lock = threading.Lock()
        self.states = {p.name: PrefixState(p.name) for p in config.prefixes}
        self._none_hash: int | None = None
        self._seen: set[tuple[str, str]] = set()
        self._last_round: float | None = None
        self._last_presence: float | None = None
        self._last_request: float | None = None
        self._rotation = 0
        self._frame: tuple[str, str] | None = None  # (model part, dtype part) of the directory's names
        #: None until a self-check ran; then whether the last one found the computed names.
        self.names_ok: bool | None = None
        self.errors: list[str] = []
        self._load_state()

    # -- state ---------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self.root / self.config.live_dir

    def _load_state(self) -> None:
        """Tokens and hashes of the last process on this configuration, if :data:`STATE_FILE` has them."""
        try:
            data = json.loads((self.root / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION or data.get("fingerprint") != self.fingerprint:
            return
        for name, saved in (data.get("prefixes") or {}).items():
            state = self.states.get(name)
            if state is not None and isinstance(saved, dict) and isinstance(saved.get("tokens"), list):
                state.tokens, state.hashes = saved["tokens"], [str(h) for h in saved.get("hashes") or []]
                state.max_model_len = saved.get("max_model_len")

    def _save_state(self) -> None:
        """Write :data:`STATE_FILE` atomically (temp file, flush, rename); errors are recorded, not raised."""
        data = {"version": STATE_VERSION, "fingerprint": self.fingerprint, "live_dir": self.config.live_dir,
                "prefixes": {s.name: {"tokens": s.tokens, "hashes": s.hashes, "max_model_len": s.max_model_len}
                             for s in self.states.values() if s.tokens is not None}}
        tmp = self.root / f"{STATE_FILE}.{os.getpid()}.tmp"  # a leftover goes with the janitor's stray temp files
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(data, sort_keys=True))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.root / STATE_FILE)
        except OSError as exc:
            self.errors.append(f"writing {STATE_FILE}: {exc}")
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass

    def pinned(self) -> frozenset[str]:
        """Hashes (hex, as in the file names) of every declared prefix's chunks: the janitor keeps
        every file of its configured directory whose hash is one of them."""
        with self._lock:
            return frozenset(h for s in self.states.values() for h in s.hashes)

    # -- names and presence ----------------------------------------------------------------------

    def _hashes(self, tokens: list[int]) -> list[str]:
        if self._none_hash is None:
            if self.config.hash_algorithm == SHA256_CBOR:
                if self.chunk_key is None:
                    raise RuntimeError(f"no chunk key: the line's names need the Secret {self.config.key_secret}")
                self._none_hash = keyed_none_hash(self.chunk_key())
            else:
                check_hash_family()
                self._none_hash = none_hash(self.config.python_hash_seed, self.python)
        return [hash_hex(h) for h in chain_hashes(tokens, self.config.chunk_size, self.config.hash_algorithm,
                                                  self._none_hash)]

    def _listing(self) -> dict[str, set[int]]:
        """Chunk hash -> worker ids of the files of the configured directory (one ``listdir``); learns
        the directory's name frame (model path and dtype parts) from a file of this world size."""
        present: dict[str, set[int]] = {}
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return present
        for name in names:
            parsed = parse_chunk_name(name)
            if parsed is None or parsed[0] != self.config.world_size:
                continue
            present.setdefault(parsed[2], set()).add(parsed[1])
            parts = name[:-len(CHUNK_SUFFIX)].split(KEY_SEPARATOR)
            if self._frame is None and len(parts) == 5:
                self._frame = (parts[0], parts[4])
        return present

    def _file_name(self, worker: int, chunk_hash: str) -> str:
        assert self._frame is not None
        model, dtype = self._frame
        return KEY_SEPARATOR.join((model, str(self.config.world_size), str(worker), chunk_hash, dtype)) + CHUNK_SUFFIX

    def _present(self, state: PrefixState) -> list[bool]:
        """For each chunk of ``state``: whether every rank's file is in L2 (``stat`` of each once the
        name frame is known, else one directory listing)."""
        ranks = range(self.config.world_size)
        if self._frame is None:
            listing = self._listing()
            return [listing.get(h, set()) >= set(ranks) for h in state.hashes]
        return [all((self.directory / self._file_name(w, h)).exists() for w in ranks) for h in state.hashes]

    def _count(self, state: PrefixState, present: list[bool]) -> None:
        leading = next((i for i, p in enumerate(present) if not p), len(present))
        with self._lock:
            state.leading_chunks, state.chunks_present = leading, sum(present)

    def refresh_presence(self) -> None:
        """Count every tokenized prefix's chunks in L2 now (:data:`L2_TOKENS_METRIC`)."""
        for state in self.states.values():
            if state.hashes:
                try:
                    self._count(state, self._present(state))
                except OSError as exc:
                    self.errors.append(f"counting {state.name} in L2: {exc}")
        self._last_presence = self.now()

    def _new_chunk_files_since(self, since: float) -> int:
        """Chunk files of this world size in the directory modified at or after ``since``."""
        count = 0
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    parsed = parse_chunk_name(entry.name)
                    if parsed and parsed[0] == self.config.world_size and entry.stat().st_mtime >= since:
                        count += 1
        except OSError:
            return 0
        return count

    # -- rounds --------------------------------------------------------------------------------

    def _pace(self) -> None:
        """Keep requests at least ``min_request_interval_s`` apart."""
        if self._last_request is not None:
            wait = self.config.min_request_interval_s - (self.now() - self._last_request)
            if wait > 0:
                self.sleep(wait)
        self._last_request = self.now()

    def _wait_present(self, state: PrefixState) -> list[bool]:
        deadline = self.now() + self.config.settle_s
        while True:
            present = self._present(state)
            if all(present) or self.now() >= deadline:
                return present
            self.sleep(min(1.0, self.config.settle_s / 10))

    def _tokenize(self, prefix: Prefix, state: PrefixState, replica: Replica) -> None:
        tokens, limit = self.client.tokenize(replica.url, prefix)
        hashes = self._hashes(tokens)
        with self._lock:
            state.tokens, state.max_model_len, state.hashes, state.hashed_here = tokens, limit, hashes, True
        self._save_state()

    def _rehash(self, state: PrefixState) -> None:
        """Recompute the names of tokens loaded from :data:`STATE_FILE` with this process's start (its
        key), once: the file's names stay pinned until then."""
        hashes = self._hashes(state.tokens or [])
        with self._lock:
            changed, state.hashes, state.hashed_here = hashes != state.hashes, hashes, True
        if changed:
            self._save_state()

    def warm(self, prefix: Prefix, order: list[Replica]) -> dict[str, Any]:
        """One warm-up of ``prefix`` over ``order`` (module docstring, steps 1-4); its report."""
        state = self.states[prefix.name]
        report: dict[str, Any] = {"prefix": prefix.name, "replicas_tried": [], "errors": []}
        result = "error"
        try:
            if state.tokens is None:
                self._tokenize(prefix, state, order[0])
            elif not state.hashed_here:
                self._rehash(state)
            report["tokens"] = len(state.tokens or [])
            report["pinned_tokens"] = len(state.hashes) * self.config.chunk_size
            if state.max_model_len is not None and len(state.tokens or []) + 1 > state.max_model_len:
                result = "too_long"
            elif not state.hashes:
                result = "short"
            else:
                before = self._present(state)
                present, wrote, ok = before, 0, False
                for replica in order:
                    if all(present):
                        break
                    self._pace()
                    started = self.now()
                    report["replicas_tried"].append(replica.name)
                    try:
                        self.client.complete(replica.url, state.tokens or [])
                    except OSError as exc:
                        report["errors"].append(f"{replica.name}: {exc}")
                        continue
                    ok = True
                    present = self._wait_present(state)
                    if not any(present):
                        wrote += self._new_chunk_files_since(started - 1)
                self._count(state, present)
                if all(present):
                    result = "in_l2" if all(before) else "stored"
                elif not ok:
                    result = "error"
                elif any(present):
                    result = "partial"
                else:
                    result = "names_mismatch" if wrote else "not_stored"
                if any(present):  # a file of a computed name exists: the names are LMCache's
                    self.names_ok = True
                elif result == "names_mismatch":
                    self.names_ok = False
                report["chunks_missing_before"] = before.count(False)
                report["chunks_missing_after"] = present.count(False)
                if result == "names_mismatch":
                    report["errors"].append(
                        f"{wrote} chunk file(s) appeared in {self.config.live_dir} but none of the {len(state.hashes)} "
                        f"computed for {prefix.name} (first {state.hashes[0]}): the names computed here are not "
                        "LMCache's (chunk key, PYTHONHASHSEED, Python or hash algorithm differ from the vLLM Pods')")
        except Exception as exc:  # a failing replica or child must not stop the janitor's thread
            report["errors"].append(f"{type(exc).__name__}: {exc}")
            result = "error"
        with self._lock:
            state.last_result = result
            state.results[result] += 1
        report["result"] = result
        report["l2_tokens"] = state.leading_chunks * self.config.chunk_size
        return report

    def run_round(self, replicas: list[Replica], first: list[Replica], reason: str) -> dict[str, Any]:
        """Every prefix warmed (:meth:`warm`), on ``first`` (new replicas) then the others in rotation;
        the round's JSON line is logged and returned."""
        others = [r for r in replicas if r not in first]
        if others:
            k = self._rotation % len(others)
            others = others[k:] + others[:k]
            self._rotation += 1
        order = [*first, *others]
        started = self.now()
        reports = [self.warm(prefix, order) for prefix in self.config.prefixes]
        self._last_round = self._last_presence = self.now()
        summary = {"event": "kvcache_hot_prefixes", "line": self.config.line, "namespace": self.config.namespace,
                   "reason": reason, "replicas": [r.name for r in replicas], "new_replicas": [r.name for r in first],
                   "prefixes": reports, "names_ok": self.names_ok, "errors": self.errors[-5:],
                   "started_at": round(started, 3), "finished_at": round(self._last_round, 3)}
        self.errors = []
        self.log(json.dumps(summary, separators=(",", ":")))
        return summary

    def tick(self) -> dict[str, Any] | None:
        """One poll: list the Pods; run a round if a replica is new or the period is over, else count
        the prefixes in L2 if that is due. Returns the round's summary, if one ran. Never raises."""
        try:
            replicas = ready_replicas(self.list_pods(), self.config)
        except Exception as exc:  # the API server or the token: try again at the next poll
            self.errors.append(f"listing Pods in {self.config.namespace}: {type(exc).__name__}: {exc}")
            return None
        keys = {(r.name, r.uid) for r in replicas}
        new = [r for r in reversed(replicas) if (r.name, r.uid) not in self._seen]  # newest first
        due = self._last_round is None or self.now() - self._last_round >= self.config.warm_period_s
        try:
            if replicas and (new or due):
                self._seen = keys
                reason = "start" if self._last_round is None else "new_replica" if new else "schedule"
                return self.run_round(replicas, new, reason)
            self._seen = keys
            if self._last_presence is None or self.now() - self._last_presence >= self.config.presence_period_s:
                self.refresh_presence()
        except Exception as exc:  # never let the thread die
            self.errors.append(f"{type(exc).__name__}: {exc}")
        return None

    def loop(self, stop: threading.Event) -> None:
        """Poll after poll until ``stop`` is set."""
        while not stop.is_set():
            self.tick()
            stop.wait(self.config.poll_s)

    # -- metrics -------------------------------------------------------------------------------

    def metrics(self) -> str:
        """The warmer's metrics in the Prometheus text format (module docstring); per-prefix token
        gauges only once the prefix was tokenized."""
        base = {"line": self.config.line, "namespace": self.config.namespace}
        out: list[str] = []
        with self._lock:
            states = list(self.states.values())
            names_ok, last_round = self.names_ok, self._last_round
        gauges = ((DECLARED_TOKENS_METRIC, "tokens of the declared prefix as a replica tokenized it",
                   lambda s: len(s.tokens or [])),
                  (PINNED_TOKENS_METRIC, "of them, the tokens in full chunks: what L2 holds and the janitor keeps",
                   lambda s: len(s.hashes) * self.config.chunk_size),
                  (L2_TOKENS_METRIC, "leading tokens of the prefix whose chunks are in L2 for every rank now",
                   lambda s: s.leading_chunks * self.config.chunk_size))
        for name, text, value in gauges:
            rows = [({**base, "prefix": s.name}, str(value(s))) for s in states if s.tokens is not None]
            if rows:
                out += core.family(name, "gauge", text, rows)
        out += core.family(f"{WARMUPS_METRIC}_total", "counter", "warm-ups of each prefix by result",
                           [({**base, "prefix": s.name, "result": r}, str(s.results[r]))
                            for s in states for r in RESULTS])
        if names_ok is not None:
            out += core.family(NAMES_OK_METRIC, "gauge", "1 if the last self-check found the computed chunk names in "
                               "L2, 0 if replicas wrote chunks under other names", [(base, str(int(names_ok)))])
        if last_round is not None:
            out += core.family(LAST_ROUND_METRIC, "gauge", "when the last warm-up round finished (seconds since the "
                               "epoch)", [(base, repr(last_round))])
        return "\n".join(out) + "\n"
