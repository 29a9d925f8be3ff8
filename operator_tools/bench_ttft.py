"""TTFT benchmark against any OpenAI-compatible streaming endpoint (vLLM, the HyperPod router).

Workload, the way the reference deployment measured cross-pod reuse (docs/sources.md §1):

1. **cold phase** (writes): ``cold`` requests, each with a *new* shared-prefix document of
   ``prefix_tokens`` tokens (a run id and the request's index come first, so no earlier run
   or request can have cached it) plus a unique suffix, sent to ``base_url`` (pod A);
2. **warm phase** (reads): ``warm`` requests that reuse one of the cold prefixes (round robin)
   with a new unique suffix, sent to ``read_base_url`` (pod B) if given, else ``base_url``.
   With two URLs, a warm hit can only come from the shared L2 tier (pod B never saw the
   prefix); with one URL it may come from pod A's own L0/L1.

``reuse_share`` is the share of requests in the warm phase. TTFT is the time from sending the
request to the first streamed chunk carrying content (a role-only first chunk does not
count); end-to-end latency runs to the end of the stream. Requests are bounded in count and
by ``duration_s`` (nothing new starts after it; in-flight requests finish or time out).

HTTP is the standard library's ``http.client`` (one keep-alive connection per worker thread),
so the benchmark needs no HTTP package.

Prompt lengths: with a ``tokenizer.json`` the prefix is cut to ``prefix_tokens`` tokens of
that tokenizer (re-encoding may differ by one token at the cut); without one, the text is built from common English words that
BPE vocabularies (Qwen, Llama) encode as one token each with their leading space, so the
count is close (the server's ``usage`` is the authority).
"""

from __future__ import annotations

import http.client
import json
import math
import random
import ssl
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

#: Short, frequent English words: one token each (with the leading space) in the Qwen2 and
#: Llama 3 BPE vocabularies.
WORDS = ("the of and to in is that for it as with was on be by at this from or have an are "
         "not but had his they you which one all were her she there would their we him been has "
         "when who will more no if out so said what up its about into than them can only other "
         "new some could time these two may then do first any my now such like our over man me "
         "even most made after also did many before must through back years where much your way "
         "well down should because each just those people how too little state good very make "
         "world still own see men work long get here between both life being under never day "
         "same another know while last might us great old year off come since against go came "
         "right used take three").split()


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run.

    Attributes:
        base_url: e.g. ``http://127.0.0.1:8000`` or the OpenAI-style ``http://127.0.0.1:8000/v1``
            (both call ``/v1/chat/completions``, see :func:`endpoint_url`); pod A.
        model: ``model`` field of the requests.
        read_base_url: pod B for the warm phase (two-URL mode), or None.
        api_key: sent as ``Authorization: Bearer``; None sends none.
        endpoint: ``chat`` (``/v1/chat/completions``) or ``completions`` (``/v1/completions``).
        requests: total requests (cold + warm), >= 1.
        reuse_share: share of requests that reuse a prefix (warm phase), 0..1.
        prefix_tokens: length of each shared prefix, tokens.
        suffix_tokens: length of each request's unique suffix, tokens.
        concurrency: requests in flight at once.
        max_tokens: output tokens per request.
        duration_s: no request starts after this many seconds.
        timeout_s: per-request socket timeout, seconds.
        seed: seed of the word sequence (the run id still makes prefixes unique per run).
    """

    base_url: str
    model: str
    read_base_url: str | None = None
    api_key: str | None = None
    endpoint: str = "chat"
    requests: int = 20
    reuse_share: float = 0.5
    prefix_tokens: int = 2000
    suffix_tokens: int = 32
    concurrency: int = 1
    max_tokens: int = 16
    duration_s: float = 300.0
    timeout_s: float = 120.0
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        for url in filter(None, (self.base_url, self.read_base_url)):
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
                problems.append(f"base URL {url!r} must be http(s)://host[:port]")
        if self.endpoint not in ("chat", "completions"):
            problems.append(f"endpoint {self.endpoint!r}; allowed: chat, completions")
        if self.requests < 1 or self.concurrency < 1 or self.max_tokens < 1:
            problems.append("requests, concurrency and max_tokens must be >= 1")
        if not 0.0 <= self.reuse_share <= 1.0:
            problems.append(f"reuse share must be within 0..1 (got {self.reuse_share})")
        if self.prefix_tokens < 1 or self.suffix_tokens < 0:
            problems.append("prefix tokens must be >= 1 and suffix tokens >= 0")
        if self.duration_s <= 0 or self.timeout_s <= 0:
            problems.append("duration and timeout must be > 0 s")
        if not problems and self.split[1] == 0:
            problems.append(f"requests={self.requests} with reuse_share={self.reuse_share:g} plans no warm request, "
                            "so cold vs warm cannot be compared; raise --requests (>= 2) or --reuse-share (> 0)")
        if problems:
            raise ValueError("; ".join(problems))

    def base(self, kind: str) -> str:
        """The base URL of the ``kind`` (``cold``/``warm``) phase: ``read_base_url`` for warm, when set."""
        return self.base_url if kind == "cold" or not self.read_base_url else self.read_base_url

    def url(self, kind: str) -> str:
        """The full URL the ``kind`` (``cold``/``warm``) phase posts to."""
        return endpoint_url(self.base(kind), self.endpoint)

    @property
    def split(self) -> tuple[int, int]:
        """(cold, warm) request counts; at least one cold request when any is warm."""
        warm = round(self.requests * self.reuse_share)
        cold = max(1, self.requests - warm)
        return cold, self.requests - cold


def endpoint_url(base_url: str, endpoint: str = "chat") -> str:
    """``base_url`` + ``/v1/chat/completions`` (or ``/v1/completions``), accepting a base with
    or without the OpenAI-style ``/v1`` suffix: ``http://h:8000`` and ``http://h:8000/v1/`` both
    give ``http://h:8000/v1/chat/completions``; a path prefix (a router's ``/llm``) is kept."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    suffix = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    return parts._replace(path=path + suffix, query="", fragment="").geturl()


@dataclass
class RequestResult:
    """One request: its phase, target, TTFT and end-to-end latency (ms), or its error."""

    kind: str
    url: str
    prefix_id: int
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    chunks: int = 0
    error: str | None = None
    #: The error was a transport failure (refused, reset, timed out), not an HTTP answer.
    unreachable: bool = False


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default method), q in 0..100; None if empty."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _stats(values: list[float]) -> dict[str, float | None]:
    r = lambda v: None if v is None else round(v, 2)  # noqa: E731
    return {"p50": r(percentile(values, 50)), "p90": r(percentile(values, 90)), "p99": r(percentile(values, 99)),
            "mean": r(sum(values) / len(values)) if values else None}


class TextMaker:
    """Builds texts of a given token length (exact with a tokenizer, else one word per token)."""

    def __init__(self, tokenizer_path: str | None = None) -> None:
        """Raises:
            FileNotFoundError: no file at ``tokenizer_path`` (the message names it).
            ValueError: the file is not a ``tokenizer.json`` the ``tokenizers`` package reads.
        """
        self._tok = None
        if tokenizer_path:
            from tokenizers import Tokenizer

            if not Path(tokenizer_path).is_file():
                raise FileNotFoundError(f"no such tokenizer file: {tokenizer_path}")
            try:
                self._tok = Tokenizer.from_file(str(tokenizer_path))
            except Exception as exc:  # the tokenizers package raises a bare Exception
                raise ValueError(f"{tokenizer_path}: not a readable tokenizer.json ({exc})") from None

    def count(self, text: str) -> int:
        if self._tok is None:
            return len(text.split())
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def make(self, head: str, n_tokens: int, rng: random.Random) -> str:
        """``head`` then random words, about ``n_tokens`` long in all (``head`` counted)."""
        words = head.split()
        if self._tok is None:
            return " ".join(words + [rng.choice(WORDS) for _ in range(max(0, n_tokens - len(words)))])
        # Enough words to reach n_tokens, then cut the ids (re-encoding the decoded text may
        # differ by a token at the cut for BPE vocabularies).
        words += [rng.choice(WORDS) for _ in range(max(0, n_tokens))]
        ids = self._tok.encode(" ".join(words), add_special_tokens=False).ids
        while len(ids) < n_tokens:
            words += [rng.choice(WORDS) for _ in range(n_tokens - len(ids))]
            ids = self._tok.encode(" ".join(words), add_special_tokens=False).ids
        return self._tok.decode(ids[:n_tokens])


def build_requests(cfg: BenchConfig, maker: TextMaker | None = None, run_id: str | None = None
                   ) -> list[tuple[str, int, str]]:
    """The planned requests as ``(kind, prefix_id, prompt)``: all cold ones, then all warm ones.

    Cold request i has prefix i (unique: it starts with the run id and i); warm request j
    reuses prefix ``j mod cold`` with its own suffix.
    """
    maker = maker or TextMaker()
    run_id = run_id or uuid.uuid4().hex[:12]
    rng = random.Random(cfg.seed)
    cold, warm = cfg.split
    prefixes = [maker.make(f"[run {run_id} document {i}]", cfg.prefix_tokens, rng) for i in range(cold)]

    def suffix(n: int) -> str:
        return "\n\nQuestion " + str(n) + ": " + maker.make("", cfg.suffix_tokens, rng).strip() if cfg.suffix_tokens else ""

    plan = [("cold", i, prefixes[i] + suffix(i)) for i in range(cold)]
    plan += [("warm", j % cold, prefixes[j % cold] + suffix(cold + j)) for j in range(warm)]
    return plan


class _Client:
    """Keep-alive HTTP(S) connections, one per (thread, host)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._local = threading.local()

    def conn(self, url: str) -> http.client.HTTPConnection:
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname, parts.port)
        pool = self._local.__dict__.setdefault("pool", {})
        if key not in pool:
            if parts.scheme == "https":
                pool[key] = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=self.timeout_s,
                                                        context=ssl.create_default_context())
            else:
                pool[key] = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=self.timeout_s)
        return pool[key]

    def drop(self, url: str) -> None:
        parts = urlsplit(url)
        conn = self._local.__dict__.get("pool", {}).pop((parts.scheme, parts.hostname, parts.port), None)
        if conn is not None:
            conn.close()


def _content(event: dict[str, Any], endpoint: str) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if endpoint == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def send_streaming(client: _Client, cfg: BenchConfig, base_url: str, prompt: str, result: RequestResult) -> None:
    """Send one streamed request and fill ``result`` (TTFT, end-to-end, chunk count or error).

    Every error names the URL it called (``HTTP 404 from POST http://...``), so a wrong base
    URL shows at once.
    """
    url = endpoint_url(base_url, cfg.endpoint)
    path = urlsplit(url).path
    if cfg.endpoint == "chat":
        body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}]}
    else:
        body = {"model": cfg.model, "prompt": prompt}
    body.update({"stream": True, "max_tokens": cfg.max_tokens, "temperature": 0})
    payload = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    conn = client.conn(base_url)
    started = time.perf_counter()
    try:
        conn.request("POST", path, body=payload, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read(300).decode("utf-8", "replace").strip()
            result.error = f"HTTP {resp.status} from POST {url}: {detail or resp.reason}"
            client.drop(base_url)
            return
        while True:
            raw = resp.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("error"):
                result.error = f"stream error from POST {url}: {event['error']}"
                break
            if isinstance(event, dict) and _content(event, cfg.endpoint):
                if result.ttft_ms is None:
                    result.ttft_ms = (time.perf_counter() - started) * 1000.0
                result.chunks += 1
        resp.read()  # drain the terminating chunk so the connection can be reused
        result.e2e_ms = (time.perf_counter() - started) * 1000.0
        if result.ttft_ms is None and result.error is None:
            result.error = f"stream from POST {url} ended without content"
    except (OSError, http.client.HTTPException) as exc:
        result.error = f"cannot reach POST {url}: {type(exc).__name__}: {exc}"
        result.unreachable = True
        client.drop(base_url)


def duration_bound_reason(duration_s: float) -> str:
    """The reason recorded (:meth:`BenchReport.skip`) for requests the duration bound kept from starting."""
    return f"the duration bound of {duration_s:g} s had passed"


@dataclass
class BenchReport:
    """The run's results and summary (see :meth:`to_dict`)."""

    config: BenchConfig
    results: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0
    #: Requests not started, per phase and reason (the duration bound; no cold success).
    skipped_by: dict[str, Counter] = field(default_factory=lambda: {"cold": Counter(), "warm": Counter()})

    def skip(self, kind: str, reason: str, n: int = 1) -> None:
        """Count ``n`` ``kind`` requests not started for ``reason``."""
        self.skipped_by[kind][reason] += n

    @property
    def skipped(self) -> int:
        """Requests not started, over both phases and every reason."""
        return sum(sum(reasons.values()) for reasons in self.skipped_by.values())

    @property
    def unanswered(self) -> str | None:
        """Why cold vs warm was not measured (a phase without one successful request), or None.

        The message gives, per empty phase, how many requests failed (the first error, with
        its URL) and how many never started and why.
        """
        if self.ttft("cold") and self.ttft("warm"):
            return None
        planned = dict(zip(("cold", "warm"), self.config.split))
        phases = []
        for kind in ("cold", "warm"):
            if self.ttft(kind):
                continue
            failed = [r for r in self.results if r.kind == kind and r.error]
            parts = [f"{kind} phase: 0 of {planned[kind]} request(s) measured"]
            if failed:
                parts.append(f"{len(failed)} failed (first: {failed[0].error})")
            parts += [f"{n} not started ({why})" for why, n in self.skipped_by[kind].items()]
            phases.append("; ".join(parts))
        return "cold vs warm TTFT not measured: " + ". ".join(phases)

    def stopped_by_duration(self, kind: str) -> bool:
        """Some ``kind`` requests never started because the duration bound had passed."""
        return duration_bound_reason(self.config.duration_s) in self.skipped_by[kind]

    @property
    def all_unreachable(self) -> bool:
        """Every request that ran failed at the transport level (nothing answered at all)."""
        return bool(self.results) and all(r.unreachable for r in self.results)

    def _ok(self, kind: str | None = None) -> list[RequestResult]:
        return [r for r in self.results if r.error is None and (kind is None or r.kind == kind)]

    @property
    def errors(self) -> list[RequestResult]:
        return [r for r in self.results if r.error is not None]

    def ttft(self, kind: str | None = None) -> list[float]:
        return [r.ttft_ms for r in self._ok(kind) if r.ttft_ms is not None]

    @property
    def cold_warm_ratio(self) -> float | None:
        """Cold p50 TTFT / warm p50 TTFT (None without both)."""
        cold, warm = percentile(self.ttft("cold"), 50), percentile(self.ttft("warm"), 50)
        return None if not cold or not warm else cold / warm

    def to_dict(self) -> dict[str, Any]:
        cfg = self.config
        cold, warm = cfg.split
        ratio, unanswered = self.cold_warm_ratio, self.unanswered
        by_kind = {kind: {"requests": len(self._ok(kind)), "ttft_ms": _stats(self.ttft(kind)),
                          "e2e_ms": _stats([r.e2e_ms for r in self._ok(kind) if r.e2e_ms is not None])}
                   for kind in ("cold", "warm")}
        return {
            "answered": unanswered is None,
            "unanswered_reason": unanswered,
            "urls": {"cold": cfg.url("cold"), "warm": cfg.url("warm")},
            "ttft_ms": _stats(self.ttft()),
            "e2e_ms": _stats([r.e2e_ms for r in self._ok() if r.e2e_ms is not None]),
            "cold": by_kind["cold"], "warm": by_kind["warm"],
            "cold_warm_ratio": None if ratio is None else round(ratio, 3),
            "requests": {"planned": cfg.requests, "cold": cold, "warm": warm, "completed": len(self._ok()),
                         "errors": len(self.errors), "skipped": self.skipped},
            "errors": sorted({r.error for r in self.errors if r.error})[:5],
            "wall_s": round(self.wall_s, 3),
            "config": {k: v for k, v in asdict(cfg).items() if k != "api_key"},
        }


def run(cfg: BenchConfig, *, tokenizer_path: str | None = None, progress: bool = False,
        progress_delay_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> BenchReport:
    """Run the benchmark: cold phase to ``base_url``, then warm phase to the read URL.

    Returns a :class:`BenchReport`; network errors are recorded per request, never raised.
    If no cold request succeeds, the warm phase is not run (nothing was stored for it to
    reuse): its requests are counted as skipped. ``progress`` draws a tqdm bar on stderr,
    shown once the run has lasted ``progress_delay_s`` (so short runs stay quiet).
    """
    plan = build_requests(cfg, TextMaker(tokenizer_path))
    report = BenchReport(cfg)
    client = _Client(cfg.timeout_s)
    started = clock()
    deadline = started + cfg.duration_s
    lock = threading.Lock()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(plan), unit="req", file=sys.stderr, desc="ttft", delay=progress_delay_s)

    def one(kind: str, prefix_id: int, prompt: str) -> None:
        url = cfg.base(kind)
        if clock() >= deadline:
            with lock:
                report.skip(kind, duration_bound_reason(cfg.duration_s))
                if bar is not None:
                    bar.update(1)
            return
        result = RequestResult(kind=kind, url=url, prefix_id=prefix_id)
        send_streaming(client, cfg, url, prompt, result)
        with lock:
            report.results.append(result)
            if bar is not None:
                bar.update(1)

    with ThreadPoolExecutor(max_workers=cfg.concurrency) as pool:
        for phase in ("cold", "warm"):
            items = [item for item in plan if item[0] == phase]
            if phase == "warm" and not report.ttft("cold"):
                report.skip("warm", "no cold request succeeded, so there was no prefix to reuse", len(items))
                if bar is not None:
                    bar.update(len(items))
                continue
            futures = [pool.submit(one, *item) for item in items]
            for f in futures:
                f.result()
    if bar is not None:
        bar.close()
    report.wall_s = clock() - started
    return report


def format_report(report: BenchReport) -> str:
    """The readable summary ``scripts/bench_ttft.py`` prints."""
    d = report.to_dict()
    cfg = report.config
    target = (f"cold -> {cfg.url('cold')}, warm -> {cfg.url('warm')} (pod B)" if cfg.read_base_url
              else cfg.url("cold"))
    rows = [f"target   {target}, model {cfg.model}",
            f"workload {cfg.requests} requests ({d['requests']['cold']} cold, {d['requests']['warm']} warm reusing "
            f"a prefix), prefix {cfg.prefix_tokens} + suffix {cfg.suffix_tokens} tokens, concurrency "
            f"{cfg.concurrency}, max_tokens {cfg.max_tokens}",
            "",
            f"{'':<6} {'n':>5} {'TTFT p50':>10} {'p90':>10} {'p99':>10} {'e2e p50':>10} {'p90':>10} {'p99':>10}  (ms)"]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    for label, sect, n in (("cold", d["cold"], d["cold"]["requests"]), ("warm", d["warm"], d["warm"]["requests"]),
                           ("all", d, d["requests"]["completed"])):
        t, e = sect["ttft_ms"], sect["e2e_ms"]
        rows.append(f"{label:<6} {n:>5} {fmt(t['p50']):>10} {fmt(t['p90']):>10} {fmt(t['p99']):>10} "
                    f"{fmt(e['p50']):>10} {fmt(e['p90']):>10} {fmt(e['p99']):>10}")
    ratio = d["cold_warm_ratio"]
    rows += ["", f"cold/warm TTFT (p50) {'-' if ratio is None else f'{ratio:.2f}x'}; "
                 f"{d['requests']['errors']} error(s), {d['requests']['skipped']} not started; "
                 f"{d['wall_s']:.1f} s"]
    # "failed", not "error:": the one `error:` line of the convention is the tool's, on stderr.
    rows += [f"failed   {e}" for e in d["errors"]]
    if d["unanswered_reason"] is None and ratio is not None:  # else the tool prints why on stderr
        rows.append(f"answer   warm p50 is {ratio:.2f}x faster than cold" if ratio > 1 else
                    f"answer   warm p50 is NOT faster than cold ({ratio:.2f}x): the prefixes were not reused")
    return "\n".join(rows)
