"""The cross-pod hit canary of an L2 line: does a prefix one replica computed reach another through L2?

Why it exists: the failure users of shared KV caches report most is cross-pod hits that are
silently zero (chunk keys that differ per process: LMCache issues #1139 and #1842, a
``PYTHONHASHSEED`` mismatch; a pod writing to another directory; a dead mount). The line's L2 hit
rate cannot tell that from a change of traffic. So each L2 line runs this module in a small
Deployment (:mod:`k8s.canary`) that, every ``period_s``, makes one *run* (:meth:`Canary.run_once`):

1. lists the line's Pods (``list pods`` in its namespace, nothing else) and keeps the Running,
   Ready endpoint Pods; groups them by the ``LMCACHE_REMOTE_URL`` of their vLLM container (the
   model-scoped L2 directory, :func:`k8s.lmcache.l2_cache_dir`: Pods of two models, as during a
   model change, never share KV) and takes the largest group. Fewer than two comparable replicas:
   the run is reported (``result`` ``one_replica`` or ``no_pair``) and no ratio is exported, so
   nothing alarms;
2. picks a pair (writer A, reader B), rotating through the group run after run;
3. builds a prompt of ``prompt_chunks`` full LMCache chunks plus a short tail, as token ids
   (:func:`canary_prompt`): vLLM's ``/v1/completions`` takes ``prompt`` as a list of token ids
   (vLLM 0.29.0 ``CompletionRequest.prompt``), so the canary needs no tokenizer and knows the
   exact chunk count. Its seed is the line, the UTC date, the run number and a random nonce, so
   every run's prompt is new to every replica: neither vLLM's GPU prefix cache (L0) nor B's
   LMCache CPU buffer (L1) can hold it, and whatever B's LMCache serves of it came from L2;
4. sends it to A directly (Pod IP and port, not the router), ``max_tokens`` 1, and waits until A's
   LMCache counted the chunk writes (``lmcache:num_remote_write_requests``, TP rank 0);
5. sends it to B directly, then reads B's LMCache counters again: the chunks B read from L2
   (``lmcache:num_remote_read_requests``, rank 0) x ``chunk_size`` / the prompt's full-chunk
   tokens is the **cross-pod hit ratio** (0-1).

Reading B's counters before and after is exact only if no other request reached B meanwhile,
which B's lookup counter tells (``lmcache:num_lookup_requests`` rose by exactly 1: the canary's).
When other requests were looked up too, B's reads are an upper bound of the canary's: fewer reads
than the prompt's chunks still prove a shortfall (exported as that upper bound); as many or more
prove nothing, and the run is ``busy`` (no ratio). So a low ratio is never a false alarm caused
by other traffic.

Its own requests are kept out of the line's TTFT SLO: vLLM's TTFT histogram has no per-request
label (``model_name`` is the server's first served name, ``engine`` its engine index: vLLM 0.29.0
``vllm/v1/metrics/loggers.py``), so the canary exports a histogram of its requests with vLLM's
bucket bounds (:data:`VLLM_TTFT_BUCKETS`), which the SLO query subtracts bucket by bucket
(:func:`observability.queries.ttft_quantile`). Each request goes into the bucket vLLM itself put
it in when the replica's TTFT count rose by exactly one during the request (read before and
after, as above); otherwise into the bucket of the canary's own measurement (from sending the
request to the end of its one-token response), which is never below vLLM's (vLLM measures from
the request's arrival in its engine), so the subtraction never removes a user request from a
slower bucket (docs/observability.md).

Output of every run: one JSON line on stdout (``"event": "kvcache_kv_canary"``) and, with
``--serve``, ``GET /metrics`` (:func:`prometheus_text`) and ``GET /healthz`` on ``--port``.

Standard library only: the chart ships this file and ``agent_core.py`` (what the in-cluster agents
share) in a ConfigMap run by the pinned Python image of the janitor::

    python kv_canary.py --config canary.json --once
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any, Callable

if __package__:  # imported as cluster_agents.kv_canary
    from . import agent_core as core
else:  # run from its ConfigMap, agent_core.py beside it
    import agent_core as core

#: Upper bounds (seconds) of vLLM's ``vllm:time_to_first_token_seconds`` buckets, vLLM 0.29.0
#: ``vllm/v1/metrics/loggers.py`` lines 796-824 (docs/sources.md §20); ``+Inf`` is implied.
VLLM_TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                        2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
#: Token ids of canary prompts are drawn from [low, high): below the vocabulary of every model the
#: platform serves (Llama 3 128,256 ids, Qwen2 151,936, Mistral 32,768), above the special tokens.
TOKEN_ID_RANGE: tuple[int, int] = (1000, 30000)
#: Tokens after the full chunks: LMCache stores full chunks only (``save_unfull_chunk`` false), and
#: a prompt that is all full chunks would make vLLM recompute its last token on a full hit.
TAIL_TOKENS = 16
#: LMCache logs its statistics to its Prometheus metrics every 10 s (``LMCacheStatsLogger``,
#: ``log_interval=10`` in ``LMCacheEngineBuilder.get_or_create``, lmcache 0.5.5): a reader of the
#: counters waits at least this long, plus a margin, for a request to show.
LMCACHE_LOG_INTERVAL_S = 10.0

METRIC_PREFIX = "kvcache_canary_"
RATIO_METRIC = METRIC_PREFIX + "cross_pod_hit_ratio"
TTFT_METRIC = METRIC_PREFIX + "ttft_seconds"
REPLICAS_METRIC = METRIC_PREFIX + "replicas"
LAST_RUN_METRIC = METRIC_PREFIX + "last_run_timestamp_seconds"
RUNS_METRIC = METRIC_PREFIX + "runs"
REQUEST_TTFT_METRIC = METRIC_PREFIX + "request_ttft_seconds"
METRICS_PORT = 9100
METRICS_PATH = "/metrics"
LIVENESS_PATH = "/healthz"

#: Results of a run (label ``result`` of :data:`RUNS_METRIC`). Only ``measured`` exports a ratio.
RESULTS = ("measured", "busy", "one_replica", "no_pair", "error")

# LMCache and vLLM series the canary reads on a replica's /metrics (lmcache 0.5.5, vLLM 0.29.0).
LOOKUPS = "lmcache:num_lookup_requests_total"
REMOTE_READS = "lmcache:num_remote_read_requests_total"
REMOTE_WRITES = "lmcache:num_remote_write_requests_total"
VLLM_TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
VLLM_TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
#: LMCache's counters of one tensor-parallel rank (every rank reads its shard of each chunk).
RANK0 = {"worker_id": "0"}


@dataclass(frozen=True)
class CanaryConfig:
    """What the chart renders into ``canary.json`` (:func:`config_from_dict` reads it).

    Attributes:
        line, namespace: the business line and its namespace (Pods are listed there).
        pod_label: ``[key, value]`` of the endpoint's Pods (the operator's ``app=<endpoint>``).
        port: vLLM's port (``vllm.port``); a container port named ``port_name`` wins when a Pod has one.
        port_name: name of vLLM's container port (the operator's ``modelInvocationPort.name``).
        chunk_size: LMCache chunk size in tokens (``cache.chunk_size_tokens``).
        prompt_chunks: full chunks per canary prompt (``canary.prompt_chunks``).
        period_s: seconds from the start of one run to the start of the next (``canary.period_minutes``).
        settle_s: seconds to wait for a replica's LMCache counters after a request (at least one
            LMCache log interval, :data:`LMCACHE_LOG_INTERVAL_S`).
        request_timeout_s: timeout of one completion request.
    """

    line: str
    namespace: str
    pod_label: tuple[str, str]
    port: int
    port_name: str
    chunk_size: int
    prompt_chunks: int
    period_s: float
    settle_s: float = 2 * LMCACHE_LOG_INTERVAL_S + 5
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.chunk_size <= 0 or self.prompt_chunks < 1 or self.period_s <= 0 or self.settle_s <= 0:
            raise ValueError("chunk_size, prompt_chunks, period_s and settle_s must be > 0")
        if len(self.pod_label) != 2:
            raise ValueError(f"pod_label must be [key, value], got {self.pod_label!r}")


def config_from_dict(data: dict[str, Any]) -> CanaryConfig:
    """:class:`CanaryConfig` from the rendered JSON; ValueError on a missing or bad key."""
    return core.config_from_dict(CanaryConfig, {**data, "pod_label": tuple(data.get("pod_label") or ())}, "canary")


@dataclass(frozen=True)
class Replica:
    """One endpoint Pod: name, base URL (``http://<pod IP>:<port>``) and its L2 directory URL."""

    name: str
    url: str
    l2_url: str


def comparable_replicas(pods: list[dict[str, Any]], config: CanaryConfig) -> tuple[list[Replica], int]:
    """(the largest group of Running, Ready endpoint Pods sharing one ``LMCACHE_REMOTE_URL``, sorted by
    name; how many endpoint Pods were Running and Ready in all)."""
    ready = core.endpoint_pods(pods, config.pod_label, config.port_name, config.port)
    groups: dict[str, list[Replica]] = {}
    for pod in ready:
        groups.setdefault(pod.remote_url, []).append(Replica(pod.name, pod.url, pod.remote_url))
    if not groups:
        return [], 0
    best = max(sorted(groups), key=lambda url: len(groups[url]))
    return sorted(groups[best], key=lambda r: r.name), len(ready)


def canary_prompt(config: CanaryConfig, run: int, nonce: str, today: dt.date) -> list[int]:
    """Token ids of run ``run``'s prompt: ``prompt_chunks`` x ``chunk_size`` + :data:`TAIL_TOKENS`
    ids in :data:`TOKEN_ID_RANGE`, seeded by line, date, run and ``nonce`` (new every run)."""
    seed = hashlib.sha256(f"{config.line}/{today.isoformat()}/{run}/{nonce}".encode()).digest()
    rng = random.Random(seed)
    low, high = TOKEN_ID_RANGE
    return [rng.randrange(low, high) for _ in range(config.prompt_chunks * config.chunk_size + TAIL_TOKENS)]


# --- reading a replica's /metrics ---------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (series name, labels, value); comments skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(match.group(2) or "")}
        try:
            out.append((match.group(1), labels, float(match.group(3))))
        except ValueError:
            continue
    return out


def total(samples: list[tuple[str, dict[str, str], float]], series: str, **labels: str) -> float:
    """Sum of every sample of ``series`` whose labels include ``labels`` (0 when there is none)."""
    return sum(v for name, ls, v in samples if name == series and labels.items() <= ls.items())


@dataclass(frozen=True)
class Snapshot:
    """The counters of one replica the canary compares before and after a request."""

    lookups: float
    reads: float
    writes: float
    ttft_count: float
    ttft_buckets: dict[str, float]

    @classmethod
    def of(cls, samples: list[tuple[str, dict[str, str], float]]) -> "Snapshot":
        buckets: dict[str, float] = {}
        for name, labels, value in samples:
            if name == VLLM_TTFT_BUCKET and "le" in labels:
                buckets[labels["le"]] = buckets.get(labels["le"], 0.0) + value
        return cls(lookups=total(samples, LOOKUPS, **RANK0), reads=total(samples, REMOTE_READS, **RANK0),
                   writes=total(samples, REMOTE_WRITES, **RANK0), ttft_count=total(samples, VLLM_TTFT_COUNT),
                   ttft_buckets=buckets)


def format_le(bound: float) -> str:
    """A bucket bound as Python's ``prometheus_client`` writes it (``floatToGoString``): ``1.0``,
    ``0.25``, ``+Inf``; vLLM's buckets are written so, and the SLO query matches ``le`` by value."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def bucket_of(seconds: float) -> str:
    """``le`` of the smallest :data:`VLLM_TTFT_BUCKETS` bound >= ``seconds`` (else ``+Inf``)."""
    return format_le(next((b for b in VLLM_TTFT_BUCKETS if seconds <= b), float("inf")))


def vllm_bucket(before: Snapshot, after: Snapshot) -> str | None:
    """The ``le`` vLLM put the one request between ``before`` and ``after`` in, or None when its
    TTFT count did not rise by exactly one (another request was counted too, or none yet)."""
    if after.ttft_count - before.ttft_count != 1:
        return None
    rose = [le for le, v in after.ttft_buckets.items() if v - before.ttft_buckets.get(le, 0.0) >= 1]
    bounds = sorted(rose, key=lambda le: float(le))
    return format_le(float(bounds[0])) if bounds else None


# --- the run ------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One run (the JSON line). ``ratio`` only with ``result`` ``measured``; TTFTs in seconds."""

    event: str = "kvcache_kv_canary"
    line: str = ""
    namespace: str = ""
    run: int = 0
    result: str = "error"
    replicas: int = 0
    ready_pods: int = 0
    writer: str | None = None
    reader: str | None = None
    prompt_tokens: int = 0
    expected_l2_tokens: int = 0
    writer_chunks_written: float | None = None
    reader_lookups: float | None = None
    reader_l2_tokens: float | None = None
    ratio: float | None = None
    exact: bool = False
    ttft_cold_s: float | None = None
    ttft_warm_s: float | None = None
    errors: list[str] = field(default_factory=list)
    finished_at: float = 0.0


class ReplicaClient:
    """HTTP to one replica: ``/metrics`` and ``/v1/completions`` (:func:`agent_core.replica_request`)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def _request(self, url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        return core.replica_request(url, method, path, body, self.timeout_s)

    def metrics(self, url: str) -> list[tuple[str, dict[str, str], float]]:
        status, body = self._request(url, "GET", METRICS_PATH)
        if status != 200:
            raise OSError(f"GET {url}{METRICS_PATH}: HTTP {status}")
        return parse_metrics(body.decode("utf-8", "replace"))

    def complete(self, url: str, prompt: list[int]) -> float:
        """POST one completion of ``prompt`` (token ids), ``max_tokens`` 1; seconds until its
        response ended, i.e. until the first (and only) token. OSError on a failed request."""
        body = json.dumps({"prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
        start = time.monotonic()
        status, reply = self._request(url, "POST", "/v1/completions", body)
        elapsed = time.monotonic() - start
        if status != 200:
            raise OSError(f"POST {url}/v1/completions: HTTP {status}: {reply[:200]!r}")
        return elapsed


class Canary:
    """Runs every ``period_s`` (one at a time) and what ``/metrics`` reports about them.

    Args:
        config: the rendered configuration.
        list_pods: returns the namespace's Pod objects (the Kubernetes API's ``items``).
        client: the HTTP client of the replicas (tests pass their own).
        log: where each run's JSON line goes (stdout).
        sleep, now, today: clocks (tests pass their own).
    """

    def __init__(self, config: CanaryConfig, *, list_pods: Callable[[], list[dict[str, Any]]],
                 client: ReplicaClient | None = None, log: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, now: Callable[[], float] = time.time,
                 today: Callable[[], dt.date] = lambda: dt.datetime.now(dt.timezone.utc).date()) -> None:
        self.config, self.list_pods = config, list_pods
        self.client = client or ReplicaClient(config.request_timeout_s)
        self.log = log or (lambda line: print(line, flush=True))
        self.sleep, self.now, self.today = sleep, now, today
        self._lock = threading.Lock()
        self.runs = 0
        self.last: RunResult | None = None
        self.results = {r: 0 for r in RESULTS}
        #: le -> count of the canary's requests (cumulative on output); sum of their TTFTs.
        self.ttft_counts: dict[str, int] = {}
        self.ttft_sum = 0.0

    def _settled(self, replica: Replica, before: Snapshot, done: Callable[[Snapshot], bool]) -> Snapshot:
        """Poll ``replica``'s counters until ``done`` holds and once more one LMCache log interval
        later (the lookup and the retrieve of one request may be logged in two intervals), or until
        ``settle_s`` passed; the last snapshot."""
        deadline = self.now() + self.config.settle_s
        seen_at: float | None = None
        snapshot = before
        while True:
            snapshot = Snapshot.of(self.client.metrics(replica.url))
            if seen_at is None and done(snapshot):
                seen_at = self.now()
            t = self.now()
            if t >= deadline or (seen_at is not None and t - seen_at >= min(LMCACHE_LOG_INTERVAL_S, self.config.settle_s / 2)):
                return snapshot
            self.sleep(min(1.0, self.config.settle_s / 10))

    def _count_ttft(self, seconds: float, exact_le: str | None) -> None:
        le = exact_le or bucket_of(seconds)
        with self._lock:
            self.ttft_counts[le] = self.ttft_counts.get(le, 0) + 1
            self.ttft_sum += seconds

    def run_once(self) -> RunResult:
        """One run (module docstring); never raises: a failure is a run with ``result`` ``error``."""
        cfg = self.config
        self.runs += 1
        r = RunResult(line=cfg.line, namespace=cfg.namespace, run=self.runs)
        try:
            replicas, r.ready_pods = comparable_replicas(self.list_pods(), cfg)
            r.replicas = len(replicas)
            if len(replicas) < 2:
                r.result = "one_replica" if r.ready_pods <= 1 else "no_pair"
            else:
                self._measure(r, replicas)
        except Exception as exc:  # a failing cluster or replica must not stop the canary
            r.result = "error"
            r.errors.append(f"{type(exc).__name__}: {exc}")
        r.finished_at = round(self.now(), 3)
        with self._lock:
            self.last = r
            self.results[r.result] += 1
        self.log(json.dumps(asdict(r), separators=(",", ":")))
        return r

    def _measure(self, r: RunResult, replicas: list[Replica]) -> None:
        cfg = self.config
        writer = replicas[(self.runs - 1) % len(replicas)]
        reader = replicas[self.runs % len(replicas)]
        r.writer, r.reader = writer.name, reader.name
        prompt = canary_prompt(cfg, self.runs, os.urandom(8).hex(), self.today())
        r.prompt_tokens = len(prompt)
        r.expected_l2_tokens = cfg.prompt_chunks * cfg.chunk_size
        # Writer: computes the prompt (cold) and stores its chunks to L2.
        a0 = Snapshot.of(self.client.metrics(writer.url))
        r.ttft_cold_s = round(self.client.complete(writer.url, prompt), 4)
        a1 = self._settled(writer, a0, lambda s: s.writes - a0.writes >= cfg.prompt_chunks
                           and s.ttft_count > a0.ttft_count)
        r.writer_chunks_written = a1.writes - a0.writes
        self._count_ttft(r.ttft_cold_s, vllm_bucket(a0, a1))
        # Reader: must find the chunks in L2 (it never saw this prompt).
        b0 = Snapshot.of(self.client.metrics(reader.url))
        r.ttft_warm_s = round(self.client.complete(reader.url, prompt), 4)
        b1 = self._settled(reader, b0, lambda s: s.lookups > b0.lookups and s.ttft_count > b0.ttft_count)
        self._count_ttft(r.ttft_warm_s, vllm_bucket(b0, b1))
        r.reader_lookups = b1.lookups - b0.lookups
        r.reader_l2_tokens = (b1.reads - b0.reads) * cfg.chunk_size
        if r.reader_lookups == 1:
            r.exact = True
        elif r.reader_l2_tokens >= r.expected_l2_tokens:
            r.result = "busy"  # other requests' reads can account for all of it: proves nothing
            return
        r.ratio = round(min(1.0, r.reader_l2_tokens / r.expected_l2_tokens), 4)
        r.result = "measured"

    def loop(self, stop: threading.Event) -> None:
        """Run after run until ``stop`` is set (checked between runs), one every ``period_s``."""
        core.every(self.config.period_s, self.run_once, stop)

    def metrics(self) -> str:
        """:func:`prometheus_text` of the runs so far."""
        with self._lock:
            return prometheus_text(self.config, self.last, dict(self.results), dict(self.ttft_counts), self.ttft_sum)


def prometheus_text(config: CanaryConfig, last: RunResult | None, results: dict[str, int],
                    ttft_counts: dict[str, int], ttft_sum: float) -> str:
    """The canary's metrics in the Prometheus text format, labelled ``line`` and ``namespace``.

    * ``kvcache_canary_cross_pod_hit_ratio`` (0-1) and ``kvcache_canary_ttft_seconds{phase=cold|warm}``:
      of the last run, only when it was ``measured`` (absent otherwise, so one replica, a model
      change or a busy reader never alarm);
    * ``kvcache_canary_replicas``: comparable replicas the last run found;
    * ``kvcache_canary_last_run_timestamp_seconds``; ``kvcache_canary_runs_total{result}`` (counter);
    * ``kvcache_canary_request_ttft_seconds`` (histogram, vLLM's TTFT buckets): the canary's own
      requests, which the line's TTFT SLO queries subtract.
    """
    labels = {"line": config.line, "namespace": config.namespace}
    out: list[str] = []

    def gauge(name: str, text: str, rows: list[tuple[dict[str, str], float]]) -> None:
        out.extend(core.family(name, "gauge", text, [({**labels, **extra}, repr(value)) for extra, value in rows]))

    if last is not None:
        if last.result == "measured" and last.ratio is not None:
            gauge(RATIO_METRIC, "L2-served share of the canary prompt's full-chunk tokens on the second replica "
                  "(last run)", [({}, float(last.ratio))])
            gauge(TTFT_METRIC, "TTFT of the last run's canary requests: cold (writer) and warm (reader)",
                  [({"phase": "cold"}, float(last.ttft_cold_s or 0.0)),
                   ({"phase": "warm"}, float(last.ttft_warm_s or 0.0))])
        gauge(REPLICAS_METRIC, "comparable replicas (Running, Ready, one L2 directory) of the last run",
              [({}, float(last.replicas))])
        gauge(LAST_RUN_METRIC, "when the last run finished (seconds since the epoch)", [({}, float(last.finished_at))])
    out.extend(core.family(f"{RUNS_METRIC}_total", "counter", "canary runs by result",
                           [({**labels, "result": res}, repr(float(results.get(res, 0)))) for res in RESULTS]))
    name = REQUEST_TTFT_METRIC
    out.extend(core.family(name, "histogram", "TTFT of the canary's own requests, in vLLM's buckets (subtracted "
                           "from the SLO)"))
    cumulative = 0
    for bound in (*VLLM_TTFT_BUCKETS, float("inf")):
        le = format_le(bound)
        cumulative += ttft_counts.get(le, 0)
        out.append(core.sample(f"{name}_bucket", {**labels, "le": le}, repr(float(cumulative))))
    out.append(core.sample(f"{name}_sum", labels, repr(float(ttft_sum))))
    out.append(core.sample(f"{name}_count", labels, repr(float(cumulative))))
    return "\n".join(out) + "\n"


def make_server(canary: Canary, port: int, host: str = "") -> ThreadingHTTPServer:
    """HTTP server (:func:`agent_core.make_server`): ``GET /metrics`` (:meth:`Canary.metrics`) and
    ``GET /healthz`` (200 once serving)."""
    return core.make_server({METRICS_PATH: lambda: (200, canary.metrics(), core.METRICS_TEXT),
                             LIVENESS_PATH: core.health(lambda: (True, "ok"))}, port, host)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and ``--once`` (one run; exit 0 if it ran, 2 on an error) or
    ``--serve [--port N]`` (runs every ``period_s`` until SIGTERM, then exit 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", required=True, help="canary.json rendered by the line chart")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="one run, its JSON line on stdout")
    mode.add_argument("--serve", action="store_true", help="a run every period_s; /metrics and /healthz on --port")
    parser.add_argument("--port", type=int, default=METRICS_PORT, help="--serve: HTTP port (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        with open(args.config, encoding="utf-8") as f:
            config = config_from_dict(json.load(f))
    except (OSError, ValueError) as exc:
        print(json.dumps({"event": "kvcache_kv_canary", "errors": [f"config: {exc}"]}))
        return 2
    canary = Canary(config, list_pods=lambda: core.KubeApi.in_cluster(timeout_s=20).list_pods(config.namespace))
    if args.once:
        return 2 if canary.run_once().result == "error" else 0
    return core.serve(lambda port: make_server(canary, port), args.port, canary.loop)


if __name__ == "__main__":
    sys.exit(main())
