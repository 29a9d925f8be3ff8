"""A stand-in vLLM replica: an OpenAI-compatible HTTP server over a real ``LMCacheEngine``.

Run as ``python -m tests_lmcache.replica <spec.json>`` (by :func:`tests_lmcache.conftest.Tier.start_replica`)
with the env the line's rendered policy gives a vLLM container (the tier's two overrides: the L2
mount and the Prometheus multiprocess directory re-pointed at temporary directories). vLLM is not
installable here, so this plays the parts of it the canary and the alerts see, each as vLLM 0.29.0
and LMCache 0.5.5's vLLM adapter do it:

* ``POST /v1/completions`` (``prompt`` a string or a list of token ids, as vLLM's
  ``CompletionRequest.prompt``): a string is tokenized by a fixed word-hash tokenizer (one id per
  whitespace-separated word; no model tokenizer here) after a BOS id, as vLLM adds special tokens to a
  completion prompt; ``POST /v1/chat/completions`` (``messages``) renders the stand-in chat template
  (:func:`render_chat`, with the generation prompt) and goes the same way; ``POST /tokenize`` answers
  as vLLM 0.29.0's (``TokenizeCompletionRequest``: ``prompt``, ``add_special_tokens`` default true;
  ``TokenizeChatRequest``: ``messages``, ``add_generation_prompt`` default true; reply ``count``,
  ``max_model_len``, ``tokens``). Either way LMCache looks the ids up
  (``engine.lookup``, what the adapter's scheduler side asks), retrieves the hit prefix
  (``engine.retrieve`` of ``tokens[:hit]``, what the adapter's ``start_load_kv`` asks), "prefills"
  the rest (the KV of :func:`tests_lmcache.pod.expected_kv`) and stores what it did not find
  (mask ``False`` over the hit chunks, as the adapter's ``skip_leading_tokens``), then answers one
  token. There is no GPU prefix cache (L0): every request goes to LMCache;
* vLLM's metrics of the request: ``vllm:time_to_first_token_seconds`` (vLLM's buckets, labels
  ``model_name``, ``engine``) and ``vllm:prompt_tokens``, recorded before the response as vLLM
  records TTFT at the first token;
* ``GET /metrics``: every process's metrics from ``PROMETHEUS_MULTIPROC_DIR`` through
  ``MultiProcessCollector``, as vLLM's ``/metrics`` serves them (:mod:`tests_lmcache.scrape`).

LMCache's statistics thread logs to the metrics every 10 s; this server logs them once more after
every request, once the request's L2 writes finished (:func:`tests_lmcache.pod.flush_metrics`,
:func:`tests_lmcache.pod.wait_for_remote_puts`), so a reader need not wait for the interval.

Spec (JSON): ``geometry``, ``engine`` (as :mod:`tests_lmcache.pod`), ``port_file`` (written with
the port once the server listens), ``served_model_name``; ``max_model_len`` (what ``/tokenize``
reports, default 8192); ``vllm_none_hash`` true: LMCache starts its chunk keys from vLLM's
``NONE_HASH``, as in a vLLM Pod (:mod:`tests_lmcache.vllm_none_hash`), instead of 0; ``chunk_key``:
then the line's chunk key starts the chain, set as the L2 gate sets it in a vLLM process
(:func:`vllm_plugins.l2_gate.apply_chunk_key`, after the engine built its token database).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

from cluster_agents.kv_canary import TOKEN_ID_RANGE, VLLM_TTFT_BUCKETS
from tests_lmcache.pod import Pod, expected_kv, flush_metrics, wait_for_remote_puts

#: vLLM 0.29.0's labels of its engine metrics (``vllm/v1/metrics/loggers.py``: ``["model_name", "engine"]``).
VLLM_LABELS = ("model_name", "engine")


def tokenize(text: str) -> list[int]:
    """The stand-in's tokenizer: one id per whitespace-separated word (CRC-32 into the canary's id range)."""
    low, high = TOKEN_ID_RANGE
    return [low + zlib.crc32(word.encode()) % (high - low) for word in text.split()]


#: Special token ids of the stand-in (outside the words' range): BOS, a ChatML-like turn start and end,
#: and the newline after a role.
BOS, TURN_START, TURN_END, NEWLINE = 40000, 40001, 40002, 40003


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """The stand-in chat template (ChatML's shape, as Qwen2's): per message ``<turn> role \n content
    <end> \n``; the generation prompt ``<turn> assistant \n``. A prefix of messages renders to a prefix
    of the ids of every longer conversation that starts with them."""
    ids: list[int] = []
    for message in messages:
        ids += [TURN_START, *tokenize(message["role"]), NEWLINE, *tokenize(str(message.get("content") or "")),
                TURN_END, NEWLINE]
    if add_generation_prompt:
        ids += [TURN_START, *tokenize("assistant"), NEWLINE]
    return ids


def tokenize_request(body: dict[str, Any]) -> list[int]:
    """Token ids of a vLLM 0.29.0 ``/tokenize`` body (the defaults of its two request models)."""
    if "messages" in body:
        ids = render_chat(body["messages"], body.get("add_generation_prompt", True))
        return ([BOS] if body.get("add_special_tokens", False) else []) + ids
    return ([BOS] if body.get("add_special_tokens", True) else []) + tokenize(body["prompt"])


class Replica:
    """The engine, its lock (LMCacheEngine is driven by one thread at a time, as vLLM's worker does)
    and vLLM's metrics."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.pod = Pod(spec)  # the tier's engine construction (tests_lmcache.pod)
        self.engine, self.config, self.shape, self.dtype = self.pod.engine, self.pod.config, self.pod.shape, self.pod.dtype
        self.lock = threading.Lock()
        labels = {"model_name": spec["served_model_name"], "engine": "0"}
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              VLLM_LABELS, buckets=VLLM_TTFT_BUCKETS).labels(**labels)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     VLLM_LABELS).labels(**labels)
        self.requests = 0
        self.max_model_len = int(spec.get("max_model_len") or 8192)

    def complete(self, prompt: Any) -> dict[str, Any]:
        arrival = time.monotonic()
        ids = [BOS, *tokenize(prompt)] if isinstance(prompt, str) else [int(t) for t in prompt]
        tokens = torch.tensor(ids, dtype=torch.long)
        chunk = self.config.chunk_size
        with self.lock:
            hit = int(self.engine.lookup(tokens))
            retrieved = 0
            if hit:
                out = torch.zeros(2, self.shape[0], hit, self.shape[1] * self.shape[2], dtype=self.dtype)
                retrieved = int(self.engine.retrieve(tokens[:hit], kvcaches=out).sum())
            kv = expected_kv(tokens, chunk, self.shape, self.dtype)
            skip = hit // chunk * chunk
            if skip < len(tokens):
                mask = torch.ones(len(tokens), dtype=torch.bool)
                mask[:skip] = False
                self.engine.store(tokens, mask=mask, kvcaches=kv)
            wait_for_remote_puts(self.engine)
            flush_metrics()
            self.prompt_tokens.inc(len(ids))
            self.ttft.observe(time.monotonic() - arrival)
            self.requests += 1
        return {"object": "text_completion", "choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1},
                "lmcache": {"lookup_hit_tokens": hit, "retrieved_tokens": retrieved}}


def metrics_text() -> bytes:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)


def make_server(replica: Replica) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?", 1)[0] == "/metrics":
                self._send(200, metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
                self._send(404, b"not found\n", "text/plain")
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                ids = tokenize_request(body)
                reply = {"count": len(ids), "max_model_len": replica.max_model_len, "tokens": ids}
                self._send(200, json.dumps(reply).encode(), "application/json")
                return
            if self.path == "/v1/chat/completions":
                body = {"prompt": render_chat(body.get("messages") or [], True)}
            if body.get("prompt") in (None, "", []):
                self._send(400, b'{"error": "prompt is required"}', "application/json")
                return
            self._send(200, json.dumps(replica.complete(body["prompt"])).encode(), "application/json")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    if spec.get("vllm_none_hash"):
        from tests_lmcache import vllm_none_hash

        vllm_none_hash.install()
    replica = Replica(spec)
    if spec.get("chunk_key"):
        from vllm_plugins import l2_gate

        l2_gate.apply_chunk_key({l2_gate.CHUNK_KEY_ENV: spec["chunk_key"]},
                                algorithm=replica.config.pre_caching_hash_algorithm)
    server = make_server(replica)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    port_file = Path(spec["port_file"])
    port_file.with_suffix(".tmp").write_text(str(server.server_address[1]), encoding="utf-8")
    os.replace(port_file.with_suffix(".tmp"), port_file)
    stop.wait()
    server.shutdown()
    with replica.lock:
        wait_for_remote_puts(replica.engine)
        replica.pod.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
