"""A real router in front of the tier's vLLM servers: PyPI's ``vllm-router`` (vLLM project's Rust router,
a fork of SGLang's model gateway), and what each replica behind it did.

AWS publishes no source for the HyperPod operator's router (docs/routing.md); ``vllm-router`` is the
router of the same ecosystem that runs here without Kubernetes. Its policies against the CRD's
``routingStrategy`` (:data:`POLICY_OF_STRATEGY`):

* ``prefixaware`` -> ``cache_aware``: an approximate radix tree of each worker's request texts; a
  request goes to the worker with the longest match when the match exceeds ``--cache-threshold``
  (0.3 of the text), else to the worker with the smallest tree; only when the loads are imbalanced
  (max - min > ``--balance-abs-threshold`` 64 requests and max > 1.5 x min) to the least loaded one
  (``src/policies/cache_aware.rs``). The same affinity as production-stack's trie, with a load
  bound that few lines ever reach.
* ``roundrobin`` -> ``round_robin``.
* ``session`` -> ``consistent_hash`` (a session header or body field).
* ``kvaware``: none. vllm-router's ``kv_aware`` reads vLLM's KV events, not an LMCache controller.

Everything is the router's default but the ports and how often it checks, at start, that its workers
are up (``--worker-startup-check-interval`` 1 s instead of 30 s: the servers are up already).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from tests_serving import servers
from tests_serving.servers import Reply, Server, free_port
from tests_serving.workload import EXTERNAL_HITS, L0_HITS, delta

#: The pinned router (requirements-serving.txt), for the report.
ROUTER_DIST = "vllm-router"
#: The CRD's ``intelligentRoutingSpec.routingStrategy`` -> the vllm-router policy closest to it.
POLICY_OF_STRATEGY: Mapping[str, str] = {"prefixaware": "cache_aware", "roundrobin": "round_robin",
                                         "session": "consistent_hash"}
START_TIMEOUT_S = 60.0
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUESTS = "vllm:request_success_total"


@dataclass
class Router:
    """One running ``vllm-router`` process."""

    policy: str
    proc: subprocess.Popen
    port: int
    metrics_port: int
    model: str
    log_path: Path

    def _request(self, method: str, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def complete(self, prompt: str) -> Reply:
        """A streamed greedy completion through the router (:func:`tests_serving.servers.complete`)."""
        return servers.complete(self.port, self.model, prompt)

    def workers(self) -> list[str]:
        status, body = self._request("GET", "/list_workers")
        assert status == 200, body
        return json.loads(body)["urls"]

    def add_worker(self, server: Server) -> None:
        """The router's own API for a worker that joins (``POST /add_worker?url=``): what a scale-out
        does to it."""
        status, body = self._request("POST", f"/add_worker?url={server.url}")
        assert status == 200, body

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def failed_sends(self, url: str) -> int:
        """Requests the router sent to ``url`` and could not (each then retried on another worker or
        answered with an error), as its log records them ("Failed to send ... worker_url=")."""
        return sum("Failed to send" in line and f"worker_url={url} " in line for line in self.log().splitlines())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def start_router(policy: str, workers: Iterable[Server], work: Path, name: str, port: int | None = None) -> Router:
    """``vllm-router`` with ``policy`` over ``workers`` (ready: it answers ``/health``); ``port``: a
    restart's (the same address, as a Service gives a restarted router). AssertionError with its log
    if it exits or is not ready in :data:`START_TIMEOUT_S`."""
    workers = list(workers)
    port = port or free_port()
    metrics_port = free_port()
    log_path = work / f"router-{name}.log"
    router_bin = Path(sys.executable).with_name("vllm-router")
    argv = [str(router_bin), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-urls", *[w.url for w in workers], "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port), "--worker-startup-check-interval", "1"]
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "NO_COLOR": "1"})
    router = Router(policy, proc, port, metrics_port, workers[0].model, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"vllm-router exited ({proc.returncode}):\n{router.log()[-4000:]}")
        try:
            if router._request("GET", "/health")[0] == 200:
                return router
        except OSError:
            pass
        if time.monotonic() > deadline:
            router.stop()
            raise AssertionError(f"vllm-router not ready after {START_TIMEOUT_S} s:\n{router.log()[-4000:]}")
        time.sleep(0.2)


@dataclass(frozen=True)
class Served:
    """What one replica did between two readings of its ``/metrics`` (vLLM's counters): requests
    finished, prompt tokens, tokens its own prefix cache served (L0), tokens the KV connector served
    (L1 or L2), and so the prompt tokens it computed (prefill)."""

    requests: int
    prompt_tokens: int
    l0_hits: int
    external_hits: int

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.l0_hits - self.external_hits


def read(replicas: Iterable[Server]) -> dict[str, dict[str, float]]:
    """Every replica's counters, by name."""
    return {server.name: server.counters() for server in replicas}


def served(replicas: Iterable[Server], before: Mapping[str, Mapping[str, float]]) -> dict[str, Served]:
    """Each replica's :class:`Served` since ``before`` (:func:`read`)."""
    out = {}
    for server in replicas:
        after, b = server.counters(), dict(before.get(server.name, {}))
        out[server.name] = Served(*(int(delta(after, b, name)) for name in (REQUESTS, PROMPT_TOKENS, L0_HITS,
                                                                             EXTERNAL_HITS)))
    return out


def shares(by_replica: Mapping[str, Served]) -> dict[str, float]:
    """Each replica's share of the prompt tokens: what ``KvCacheReplicaHotSpot`` and
    ``scripts/verify.py`` compare with the fair share (observability/queries.py ``replica_share``)."""
    total = sum(s.prompt_tokens for s in by_replica.values())
    return {name: (s.prompt_tokens / total if total else 0.0) for name, s in by_replica.items()}


def hot_spots(by_replica: Mapping[str, Served], factor: float) -> list[str]:
    """The replicas above ``factor`` x their fair share (1 / replicas) of the prompt tokens: the hot-spot
    alert's rule (``observability.alerts.HOT_SPOT_FACTOR``, exported)."""
    fair = 1 / len(by_replica)
    return sorted(name for name, share in shares(by_replica).items() if share > factor * fair)
