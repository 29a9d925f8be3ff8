"""One simulated inference pod: a real ``LMCacheEngine`` built only from this process's environment.

Run as ``python -m tests_lmcache.pod <spec.json>`` by :mod:`tests_lmcache.conftest` and
:mod:`tests_lmcache.bench_fs`, with an environment that holds nothing but the env the line's
admission policy gave the vLLM container (plus PATH and a private HOME, and the two test
overrides the caller documents: the L2 mount re-pointed at a temporary directory and a small L1
buffer, because LMCache really allocates it).

The configuration is read exactly as the vLLM integration reads it,
``lmcache.integration.vllm.utils.lmcache_get_or_create_config()``. What vLLM would add, the
engine metadata (model path, world size, dtype, KV shape) and the GPU KV cache, comes from the
spec: vLLM is not installable here, so :class:`CPUConnector` stands in for LMCache's GPU
connector (its mock connector copies nothing). It copies between a CPU tensor shaped like
LMCache's ``KV_2LTD`` memory objects ``[2, layers, tokens, kv_heads * head_dim]`` and those
objects, which is all the fs:// path needs. The KV values of every chunk are a deterministic
function of the token prefix that ends the chunk, so another process can regenerate and compare.

Spec (JSON): ``geometry`` {layers, kv_heads, head_dim}; ``engine`` {model_name, world_size,
dtype}; ``result`` (path of the JSON result); ``actions``: list of
``{"op": "store"|"lookup"|"retrieve"|"files"|"flush_metrics"|"metrics_state",
"prompt": [[seed, tokens], ...]}`` (``store`` takes ``"fsync_evict": true`` to push the files out
of the page cache afterwards; ``flush_metrics`` and ``metrics_state``: see :func:`flush_metrics`). Each action
appends a record (with ``seconds``) to the result. With ``"read_back": true`` instead, no engine
is built: :func:`read_back` reports the loaded config. ``"rename_barrier"`` {``dir``, ``pod``,
``peers``} lines concurrent pods up at LMCache's rename: see :func:`install_rename_barrier`.

The fault tier (``tests_faults``) keeps a pod up across faults (``"serve_replies_fd"``: see
:func:`serve`) and uses four more ops (:meth:`Pod.act`): ``lookup_rpc`` (a lookup through
LMCache's lookup client and server, as vLLM's scheduler makes it, with ``lookup_timeout_ms``),
``retrieve`` with ``"req_id"`` (the id of that lookup, as vLLM's worker passes it; a lookup
with ``"unpin": true`` releases its pins at once, as for a request that retrieves nothing),
``store_drain`` (the store call, then its L2 writes until they end, ``"files_dir"`` where to
count the files) and ``counters`` / ``clear_l1`` (the remote backend's failure counters; empty
the L1 buffer so the next retrieve reads L2).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import torch

from lmcache.integration.vllm.utils import lmcache_get_or_create_config
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector import parse_remote_url

from tests_lmcache.pagecache import evict_from_page_cache

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
INSTANCE = "tier-pod"
#: How long a store may take to appear on disk (LMCache writes remote chunks asynchronously).
STORE_TIMEOUT_S = 120.0


class CPUConnector(GPUConnectorInterface):
    """LMCache's GPU-connector interface over a CPU tensor ``kvcaches`` [2, L, tokens, H*D]."""

    def __init__(self, layers: int, hidden: int):
        self.layers, self.hidden = layers, hidden

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.layers, num_tokens, self.hidden])

    def from_gpu(self, memory_obj, start: int, end: int, **kwargs) -> None:
        memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end])

    def to_gpu(self, memory_obj, start: int, end: int, **kwargs) -> None:
        kwargs["kvcaches"][:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs) -> None:
        for obj, start, end in zip(memory_objs, starts, ends):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs) -> None:
        for obj, start, end in zip(memory_objs, starts, ends):
            self.to_gpu(obj, start, end, **kwargs)


def prompt_tokens(prompt: list[list[int]]) -> torch.Tensor:
    """Token ids of a prompt given as segments ``[[seed, n_tokens], ...]`` (ids < 150,000)."""
    parts = [torch.randint(0, 150_000, (n,), generator=torch.Generator().manual_seed(seed)) for seed, n in prompt]
    return torch.cat(parts)


def expected_kv(tokens: torch.Tensor, chunk: int, shape: tuple[int, int, int], dtype: torch.dtype) -> torch.Tensor:
    """KV [2, L, tokens, hidden]; each chunk seeded by the CRC of the token prefix it ends."""
    layers, hidden = shape[0], shape[1] * shape[2]
    kv = torch.empty(2, layers, len(tokens), hidden, dtype=dtype)
    for start in range(0, len(tokens), chunk):
        end = min(start + chunk, len(tokens))
        gen = torch.Generator().manual_seed(zlib.crc32(tokens[:end].numpy().tobytes()))
        kv[:, :, start:end] = torch.randn(2, layers, end - start, hidden, generator=gen).to(dtype)
    return kv


def chunk_files(engine, tokens: torch.Tensor) -> list[str]:
    """File names LMCache's fs connector uses for the full chunks of ``tokens``, in order.

    ``FSConnector._get_file_name``: ``key.to_string()`` with ``/`` replaced by ``-SEP-``, plus
    ``.data`` (lmcache/v1/storage_backend/connector/fs_connector.py).
    """
    return [key.to_string().replace("/", "-SEP-") + ".data"
            for _, _, key in engine.token_database.process_tokens(tokens=tokens)]


def wait_for_remote_puts(engine, timeout_s: float = STORE_TIMEOUT_S) -> None:
    """Block until no remote put is in flight (``RemoteBackend.put_tasks`` empty).

    LMCache writes L2 chunks from its event-loop thread after ``store`` returns; a file appears
    at the rename, before the put task releases its memory object. Tearing the engine down in
    between frees the L1 buffer under the writer (seen here as a segfault in ``destroy`` when two
    pods stored at once), so a pod waits for its puts before it exits.
    """
    backends = [b for b in engine.storage_manager.storage_backends.values() if hasattr(b, "put_tasks")]
    deadline = time.monotonic() + timeout_s
    while any(b.put_tasks for b in backends) and time.monotonic() < deadline:
        time.sleep(0.005)


def flush_metrics() -> None:
    """Log LMCache's statistics to its Prometheus metrics now, as its stats thread does.

    ``LMCacheEngineBuilder.get_or_create`` starts one ``LMCacheStatsLogger`` per engine
    (``lmcache/v1/cache_engine.py``, ``log_interval=10`` s, no config switch); its thread runs
    ``prometheus_logger.log_prometheus(monitor.get_stats_and_clear())`` and then sleeps
    (``LMCacheStatsLogger.log_worker``, ``lmcache/observability.py``, lmcache 0.5.5). This runs
    that same step once, so a pod need not wait for the next interval (the stats of the last
    interval are dropped at shutdown: ``shutdown`` stops the thread without a last log). The
    usage-telemetry step of the loop is left out (off in every rendered env).
    """
    for stat_logger in LMCacheEngineBuilder._stat_loggers.values():
        stat_logger.prometheus_logger.log_prometheus(stat_logger.monitor.get_stats_and_clear())


def metrics_state() -> dict[str, Any]:
    """Where this process's metrics go: ``PROMETHEUS_MULTIPROC_DIR`` as the process sees it now
    (LMCache sets a fallback of its own when it is unset), and the value class
    ``prometheus_client`` chose when it was imported (``MmapedValue``: multiprocess files;
    ``MutexValue``: process memory only)."""
    from prometheus_client import values

    return {"env": os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "value_class": values.ValueClass.__name__,
            "pid": os.getpid()}


def install_rename_barrier(barrier_dir: Path, pod: int, peers: list[int],
                           timeout_s: float = STORE_TIMEOUT_S / 2) -> dict[str, int]:
    """Make concurrent writers of one chunk meet at LMCache's rename, every time.

    ``FSConnector.put`` writes a chunk to its temp path, then publishes it with
    ``aiofiles.os.replace(temp_path, final_path)`` (lmcache/v1/storage_backend/connector/
    fs_connector.py, lmcache 0.5.5). Wrapped here, each pod announces that it has written chunk
    ``X`` (a marker ``<pod>-<X>`` in ``barrier_dir``) and renames only once every peer has too,
    yielding to LMCache's event loop while it waits. So two pods storing the same prefix always
    both finish writing before either renames: the interleaving a shared temp name cannot survive
    (LMCache #2517), made deterministic instead of left to the scheduler. Returns the counters the
    store record reports (``timed_out``: renames that went ahead without every peer).
    """
    import aiofiles.os

    real_replace = aiofiles.os.replace
    counters = {"renames": 0, "timed_out": 0}

    async def replace(src, dst, *args, **kwargs):
        name = Path(dst).name
        (barrier_dir / f"{pod}-{name}").touch()
        deadline = time.monotonic() + timeout_s
        while not all((barrier_dir / f"{peer}-{name}").exists() for peer in peers):
            if time.monotonic() > deadline:
                counters["timed_out"] += 1
                break
            await asyncio.sleep(0.002)
        counters["renames"] += 1
        return await real_replace(src, dst, *args, **kwargs)

    aiofiles.os.replace = replace
    return counters


class Pod:
    """One pod's engine and the actions it runs (:meth:`act`), built from this process's env.

    ``spec`` as in the module docstring. The engine is built exactly as before the fault tier
    existed; the lookup server and client (:meth:`lookup_rpc`) are started only when an action
    needs them.
    """

    def __init__(self, spec: dict[str, Any]):
        geometry, meta = spec["geometry"], spec["engine"]
        self.config = config = lmcache_get_or_create_config()
        self.base = Path(parse_remote_url(config.remote_url).path)
        self.dtype = DTYPES[meta["dtype"]]
        self.shape = (geometry["layers"], geometry["kv_heads"], geometry["head_dim"])
        self.metadata = LMCacheMetadata(
            model_name=meta["model_name"], world_size=meta["world_size"], local_world_size=meta["world_size"],
            worker_id=0, local_worker_id=0, kv_dtype=self.dtype,
            kv_shape=(self.shape[0], 2, config.chunk_size, self.shape[1], self.shape[2]), chunk_size=config.chunk_size,
            engine_id=f"tier-{os.getpid()}")
        self.engine = LMCacheEngineBuilder.get_or_create(
            INSTANCE, config, self.metadata, CPUConnector(self.shape[0], self.shape[1] * self.shape[2]), None, None)
        self.engine.post_init()
        barrier = spec.get("rename_barrier")
        self.rename_counters = (install_rename_barrier(Path(barrier["dir"]), barrier["pod"], barrier["peers"])
                                if barrier else None)
        self._lookups: Any = None
        self._n_lookups = 0

    def close(self) -> None:
        """Stop the lookup server and client (if started) and destroy the engine."""
        if self._lookups is not None:
            server, client = self._lookups
            client.close()
            server.close()
        LMCacheEngineBuilder.destroy(INSTANCE)

    def remote(self):
        """The engine's ``RemoteBackend`` (the fs:// connector's backend)."""
        (backend,) = [b for b in self.engine.storage_manager.storage_backends.values() if hasattr(b, "put_tasks")]
        return backend

    def lookup_rpc(self, tokens: torch.Tensor) -> tuple[int, str]:
        """A lookup the way vLLM's scheduler makes it: LMCache's lookup client sends the chunk
        hashes over ZMQ to the lookup server of the worker, whose one thread runs
        ``engine.lookup(..., pin=True)``; the client waits ``lookup_timeout_ms`` and counts a
        timeout as 0 hit tokens (``LookupClientFactory``, ``LMCacheLookupClient.lookup``,
        ``ZmqReqRepClientTransport.send_and_recv_all``, lmcache 0.5.5). Returns the hit tokens
        and the lookup id (the request id a following retrieve passes as ``req_id``)."""
        if self._lookups is None:
            from lmcache.v1.lookup_client.factory import LookupClientFactory

            server = LookupClientFactory.create_lookup_server(self.engine, self.metadata)
            client = LookupClientFactory.create_lookup_client(self.config, self.metadata)
            self._lookups = (server, client)
        self._n_lookups += 1
        lookup_id = f"req-{self._n_lookups}"
        return int(self._lookups[1].lookup(tokens, lookup_id=lookup_id) or 0), lookup_id

    def act(self, action: dict[str, Any]) -> dict[str, Any]:
        """Run one action and return its record (module docstring)."""
        engine, config, base, shape, dtype = self.engine, self.config, self.base, self.shape, self.dtype
        op = action["op"]
        record: dict[str, Any] = {"op": op}
        if op == "flush_metrics":
            flush_metrics()
            return record
        if op == "metrics_state":
            return {**record, **metrics_state()}
        if op == "counters":
            remote = self.remote()
            return {**record, "put_failed": remote.put_failed_count,
                    "get_blocking_failed": remote.get_blocking_failed_count, "put_tasks": len(remote.put_tasks)}
        if op == "clear_l1":
            record["tokens_cleared"] = int(engine.clear(locations=["LocalCPUBackend"]))
            return record
        tokens = prompt_tokens(action["prompt"])
        # Built only by the ops that use them (a 7B-shaped 4,096-token KV is 224 MiB), before the clock starts.
        kv = (expected_kv(tokens, config.chunk_size, shape, dtype)
              if op in ("store", "store_drain", "retrieve") else None)
        files = chunk_files(engine, tokens) if op in ("store", "store_drain", "files") else None
        t0 = time.perf_counter()
        if op == "store":
            engine.store(tokens, kvcaches=kv)
            deadline = time.monotonic() + STORE_TIMEOUT_S
            while not all((base / f).exists() for f in files) and time.monotonic() < deadline:
                time.sleep(0.001)
            record["seconds"] = time.perf_counter() - t0
            wait_for_remote_puts(engine)
            record["stored_files"] = sum((base / f).exists() for f in files)
            record["bytes"] = sum((base / f).stat().st_size for f in files if (base / f).exists())
            if self.rename_counters is not None:
                record["rename_barrier"] = dict(self.rename_counters)
            if action.get("fsync_evict"):
                for f in files:
                    evict_from_page_cache(base / f)
        elif op == "store_drain":
            # The request path of a store (vLLM calls it after the forward pass), then the
            # asynchronous L2 writes until they end, however they end; files counted in
            # ``files_dir`` (the backing directory when the mount may be failing).
            failed_before = self.remote().put_failed_count
            engine.store(tokens, kvcaches=kv)
            record["seconds"] = time.perf_counter() - t0
            wait_for_remote_puts(engine)
            record["drain_seconds"] = time.perf_counter() - t0
            record["put_failed"] = self.remote().put_failed_count - failed_before
            files_dir = Path(action.get("files_dir") or base)
            record["stored_files"] = sum((files_dir / f).exists() for f in files)
            record["chunks"] = len(files)
        elif op == "lookup":
            record["hit_tokens"] = int(engine.lookup(tokens))
            record["seconds"] = time.perf_counter() - t0
        elif op == "lookup_rpc":
            record["hit_tokens"], record["lookup_id"] = self.lookup_rpc(tokens)
            record["seconds"] = time.perf_counter() - t0
            if action.get("unpin"):  # a request that will not retrieve: vLLM unpins it when it ends
                engine.lookup_unpin(record["lookup_id"])
        elif op == "retrieve":
            out = torch.zeros_like(kv)
            failed_before = self.remote().get_blocking_failed_count
            kwargs = {"req_id": action["req_id"]} if action.get("req_id") else {}
            mask = engine.retrieve(tokens, kvcaches=out, **kwargs)
            record["seconds"] = time.perf_counter() - t0
            if action.get("req_id"):
                engine.lookup_unpin(action["req_id"])
            record["get_blocking_failed"] = self.remote().get_blocking_failed_count - failed_before
            record["retrieved_tokens"] = int(mask.sum())
            chunk = config.chunk_size
            starts = range(0, len(tokens) - len(tokens) % chunk, chunk)
            record["chunks_retrieved"] = [bool(mask[s:s + chunk].all()) for s in starts]
            record["chunks_identical"] = [torch.equal(out[:, :, s:s + chunk], kv[:, :, s:s + chunk]) for s in starts]
            record["bytes"] = int(mask.sum()) * kv[:, :, :1].numel() * kv.element_size()
        elif op == "files":
            record["files"] = files
        else:
            raise ValueError(f"unknown op {op!r}")
        record["tokens"] = len(tokens)
        return record


def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    pod = Pod(spec)
    try:
        return [pod.act(action) for action in spec["actions"]]
    finally:
        pod.close()


def serve(spec: dict[str, Any], replies: int) -> None:
    """A pod that stays up: one action per line of stdin (JSON), one record per line written to
    the file descriptor ``replies``; ``{"op": "exit"}`` or the end of stdin stops it. The first
    line written is ``{"op": "ready"}``, once the engine is built."""
    pod = Pod(spec)
    with os.fdopen(replies, "w", encoding="utf-8") as out:
        try:
            out.write(json.dumps({"op": "ready", "pid": os.getpid()}) + "\n")
            out.flush()
            for line in sys.stdin:
                action = json.loads(line)
                if action["op"] == "exit":
                    break
                out.write(json.dumps(pod.act(action)) + "\n")
                out.flush()
        finally:
            wait_for_remote_puts(pod.engine)
            pod.close()


def read_back() -> list[dict[str, Any]]:
    """What LMCache's own loader made of this process's env, field by field (no engine built).

    Every config field (``str()`` of values that are not JSON), the fs path that
    ``parse_remote_url`` extracts from the remote URL (or its error), and whether usage telemetry
    is enabled (``lmcache/usage_telemetry/identity.py``).
    """
    from lmcache.usage_telemetry.identity import is_usage_tracking_enabled
    from lmcache.v1.config import _CONFIG_DEFINITIONS

    config = lmcache_get_or_create_config()
    fields = {}
    for key in _CONFIG_DEFINITIONS:
        value = getattr(config, key, None)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = str(value)
        fields[key] = value
    try:
        url_path: str | None = parse_remote_url(config.remote_url).path if config.remote_url else None
        url_error = None
    except (AssertionError, ValueError) as exc:
        url_path, url_error = None, str(exc)
    return [{"op": "read_back", "fields": fields, "url_path": url_path, "url_error": url_error,
             "telemetry": is_usage_tracking_enabled()}]


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    if spec.get("serve_replies_fd") is not None:
        serve(spec, spec["serve_replies_fd"])
        return 0
    records = read_back() if spec.get("read_back") else run(spec)
    Path(spec["result"]).write_text(json.dumps(records), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
