"""What the tests send and read: prompts of whole LMCache chunks, a writer that stores a prompt to L2,
counter deltas from vLLM's and LMCache's ``/metrics``, and percentiles for the tables.

Counters: vLLM counts prefix-cache queries and hits per request as it schedules it
(``vllm:external_prefix_cache_queries`` / ``_hits``: tokens asked of / served by the KV connector,
``vllm:prefix_cache_*``: vLLM's own GPU prefix cache, L0; vLLM 0.29.0 vllm/v1/metrics/loggers.py
lines 585-630). LMCache's counters (``lmcache:*``) reach ``/metrics`` through the Prometheus
multiprocess directory only when its stats thread logs them, every 10 s (``LMCacheStatsLogger``,
``log_interval=10``, lmcache/v1/cache_engine.py): :func:`wait_counters` polls for them.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from pathlib import Path
from typing import Callable

from cluster_agents import hot_prefixes
from tests_serving.servers import Reply, Server, wait_for
from tests_serving.tiny_model import prompt

#: LMCACHE_CHUNK_SIZE of the rendered env.
CHUNK = 256
#: Full chunks per test prompt and the tail after them (stored: the chunks only; a tail keeps a
#: full hit from making vLLM recompute the last prompt token).
CHUNKS = 4
TAIL = 99
#: Tokens of a test prompt: <s> + words.
PROMPT_TOKENS = CHUNKS * CHUNK + TAIL + 1
FULL_HIT = CHUNKS * CHUNK
#: LMCache's stats thread interval (``log_interval=10``), and a wait of two intervals and a margin.
LMCACHE_LOG_INTERVAL_S = 10.0
LMCACHE_SETTLE_S = 25.0
L2_WRITE_TIMEOUT_S = 60.0

EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
L0_HITS = "vllm:prefix_cache_hits_total"
REMOTE_READS = "lmcache:num_remote_read_requests_total"
REMOTE_WRITES = "lmcache:num_remote_write_requests_total"
LOOKUPS = "lmcache:num_lookup_requests_total"
LOOKUP_HITS = "lmcache:num_lookup_hits_total"


def chunk_prompt(seed: int) -> str:
    """A prompt of :data:`PROMPT_TOKENS` tokens that shares no chunk with another seed's."""
    return prompt(seed, PROMPT_TOKENS - 1)


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def wait_counters(server: Server, before: dict[str, float], done: Callable[[dict[str, float]], bool],
                  timeout_s: float = LMCACHE_SETTLE_S) -> dict[str, float]:
    """Poll ``server``'s counters until ``done(after)``; the last reading (also on time-out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = server.counters()
        if done(after) or time.monotonic() > deadline:
            return after
        time.sleep(0.5)


def quiet_counters(server: Server, quiet_s: float = LMCACHE_LOG_INTERVAL_S + 1, timeout_s: float = 40.0) -> dict[str, float]:
    """``server``'s counters once its LMCache counters stopped moving for ``quiet_s`` (one stats
    interval: what the server did before has reached ``/metrics``), so that a delta from here
    counts only what follows."""
    deadline = time.monotonic() + timeout_s
    last = server.counters()
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = server.counters()
        if {k: v for k, v in now.items() if k.startswith("lmcache:")} != {k: v for k, v in last.items() if k.startswith("lmcache:")}:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
    return last


@functools.lru_cache(maxsize=None)
def _chain_start(algorithm: str, seed: str, key: str | None) -> int:
    return hot_prefixes.chain_start(algorithm, seed, key)


def chunk_hashes_of(server: Server, text: str) -> list[str]:
    """The chunk hashes (``%x``, as in the file names) under which ``server``'s LMCache stores the full
    chunks of ``text``, in prompt order: the hot-prefix warmer's computation
    (:func:`cluster_agents.hot_prefixes.chain_hashes`, tested against this server's own files in
    ``test_agents.py``) over the server's tokens, its hash algorithm, ``PYTHONHASHSEED`` and chunk key
    (``KVCACHE_L2_KEY``), and :data:`CHUNK`."""
    algorithm = server.env["LMCACHE_PRE_CACHING_HASH_ALGORITHM"]
    first = _chain_start(algorithm, server.env["PYTHONHASHSEED"], server.env.get("KVCACHE_L2_KEY"))
    return [hot_prefixes.hash_hex(h) for h in hot_prefixes.chain_hashes(server.tokenize(text), CHUNK, algorithm, first)]


def _files_by_hash(names: set[str]) -> dict[str, str]:
    return {parsed[2]: name for name in names if (parsed := hot_prefixes.parse_chunk_name(name))}


def store(writer: Server, text: str, chunk_files: Callable[[], set[str]]) -> tuple[Reply, list[str]]:
    """``writer`` computes ``text`` cold (it never saw it) and stores its chunks: returns its reply and
    the names of the :data:`CHUNKS` chunk files of ``text`` in the line directory, in prompt order.

    The files waited for are the prompt's own (names computed, :func:`chunk_hashes_of`), so a late
    write of an earlier request is not counted. The writer's L2 gate is closed first: while it is
    open (after a fault, until its probes have been healthy for its hold) the connector saves
    nothing, by design. AssertionError: a chunk of ``text`` was in L2 already, or its files did not
    all appear within :data:`L2_WRITE_TIMEOUT_S` (the message says whether the gate opened meanwhile).
    """
    opens = writer.wait_gate_closed()
    hashes = chunk_hashes_of(writer, text)
    assert len(hashes) == CHUNKS, hashes
    already = set(hashes) & _files_by_hash(chunk_files()).keys()
    assert not already, f"chunks of a new prompt already in L2: {already}"
    reply = writer.complete(text)
    assert reply.ok, reply

    def written() -> list[str] | None:
        by_hash = _files_by_hash(chunk_files())
        names = [by_hash.get(h) for h in hashes]
        return names if all(names) else None

    try:
        return reply, wait_for(written, L2_WRITE_TIMEOUT_S, f"the {CHUNKS} chunk files of a prompt from {writer.name}")
    except AssertionError as exc:
        state = writer.gate_state()
        if state is not None and state[1] > opens:
            raise AssertionError(f"{exc}: the L2 gate of {writer.name} opened during the store, so it saved "
                                 f"nothing:\n{writer.gate_log()}") from None
        raise


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0-100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def file_size(path: Path) -> int:
    return path.stat().st_size
