"""Prompt-overlap analysis: what share of prompt tokens could a perfect cross-pod prefix cache
have served for a request log?

Input: JSON Lines, one OpenAI request per line: chat (``{"messages": [...]}``), completion
(``{"prompt": "..." | [...] | [ids]}``), or either wrapped as a Batch API line
(``{"custom_id": ..., "body": {...}}``). Each prompt is rendered (chat messages with a
ChatML-style template), tokenized, and cut into whole ``chunk_tokens`` chunks as LMCache does
(default 256; the trailing partial chunk is never stored, ``save_unfull_chunk: false``).

**Perfect prefix cache**, simulated in log order: chunk k of a prompt is keyed by a rolling
hash of chunks 0..k (``blake2b(key of chunk k-1 + tokens of chunk k)``, 8 bytes), so a key
names the whole prefix, as LMCache's chunk hashes do. A chunk is served when its key was
stored by any earlier request and every earlier chunk of the same prompt was served too
(lookups stop at the first miss). Each key is stored once, shared by all pods: "cross-pod".
The first request with a prefix always pays for it.

**Constant memory**: the key set is an LRU bounded at ``max_cached_chunks`` keys (default
2^20, about 100 MB; it equals ``max_cached_chunks x chunk_tokens`` tokens of KV, 268M tokens
at the defaults, 14 TiB for Qwen2-7B: larger than any L2 pool here, so the bound does not
bite on realistic logs). When it does, ``evictions`` says so and the share is a lower bound.
Per-system-prompt groups are bounded at ``max_groups`` (the rest pooled); the length
distribution is a counter of distinct lengths (bounded by the longest context). The log is
read line by line and tokenized in batches of ``batch_size`` lines.

Tokenizer: a ``tokenizer.json`` via the ``tokenizers`` package (exact for that model), or an
approximation of 4 characters per token (OpenAI's rule of thumb for English text), labelled
as such in every output.
"""

from __future__ import annotations

import gzip
import zlib
import hashlib
import io
import json
import math
import sys
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator, Sequence

#: Adoption rule of thumb from the reference deployment (docs/sources.md §1): the tiered cache
#: is worth it when more than about 40% of leading tokens are shared.
ADOPTION_THRESHOLD = 0.40
DEFAULT_CHUNK_TOKENS = 256
DEFAULT_MAX_CACHED_CHUNKS = 1 << 20
DEFAULT_MAX_GROUPS = 1000
APPROX_CHARS_PER_TOKEN = 4
#: Characters of the first chunk of production-stack's prefix trie (``HashTrie(chunk_size=128)``): requests
#: whose texts share them follow one path from the root, so under ``prefixaware`` they go where the first
#: of them went (capacity/routing_sim.py, docs/sources.md §27).
ROUTER_CHUNK_CHARS = 128
#: A prefix the router's first chunk shares among at least this share of requests sends at least this share
#: of the traffic to one replica under ``prefixaware``: a hot spot on any line of two or more replicas.
HOT_SPOT_SHARE = 0.5
#: A chunk served to at least this share of all requests counts as "one prefix shared by all" (a system
#: prompt, tool schemas), not as per-document reuse.
COMMON_CHUNK_SHARE = 0.5
NO_SYSTEM = "(no system prompt)"
COMPLETION = "(completion prompt)"
OTHER = "(other system prompts)"


class Tokens:
    """A tokenized prompt: its length and the bytes of each whole chunk."""

    def __init__(self, length: int, chunk: Any) -> None:
        self.length = length
        self._chunk = chunk

    def chunk_bytes(self, index: int, size: int) -> bytes:
        return self._chunk(index, size)


def _ids_tokens(ids: Sequence[int]) -> Tokens:
    packed = array("I", ids)
    return Tokens(len(packed), lambda k, c: packed[k * c:(k + 1) * c].tobytes())


class HFTokenizer:
    """Exact token counts from a ``tokenizer.json`` (Hugging Face ``tokenizers``)."""

    exact = True

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.path = str(path)
        self.name = f"{path} (exact)"
        self._tok = Tokenizer.from_file(self.path)

    def encode_batch(self, texts: list[str]) -> list[Tokens]:
        # encode_batch_fast skips character offsets, which we do not need: ~3x faster.
        encodings = self._tok.encode_batch_fast(texts, add_special_tokens=False)
        return [_ids_tokens(e.ids) for e in encodings]


class ApproxTokenizer:
    """Approximation: one token per 4 characters. Prefix sharing is exact on characters, so a
    shared leading text of L characters shares L // 4 leading "tokens"."""

    exact = False
    name = f"approximation: {APPROX_CHARS_PER_TOKEN} characters per token (no tokenizer given)"

    def encode_batch(self, texts: list[str]) -> list[Tokens]:
        out = []
        for text in texts:
            n = APPROX_CHARS_PER_TOKEN
            out.append(Tokens(math.ceil(len(text) / n),
                              lambda k, c, t=text: t[k * c * n:(k + 1) * c * n].encode("utf-8", "surrogatepass")))
        return out


# --- request parsing ---------------------------------------------------------------------------


class Malformed(ValueError):
    """A log line that is not a usable request; ``reason`` is the counter key."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                if part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
            else:
                raise Malformed("bad message content")
        return "".join(parts)
    raise Malformed("bad message content")


def render_chat(messages: list[dict[str, Any]], template: str = "chatml") -> str:
    """Render chat messages to the prompt text a server would tokenize.

    ``chatml`` (Qwen's template): ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message
    plus ``<|im_start|>assistant\\n``. ``plain``: ``{role}: {content}\\n\\n``. Both render
    earlier messages identically whatever follows, as real chat templates do, so shared
    leading messages give shared leading tokens.
    """
    out = []
    for msg in messages:
        role, text = msg.get("role", ""), _content_text(msg.get("content"))
        if template == "chatml":
            out.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
        else:
            out.append(f"{role}: {text}\n\n")
    if template == "chatml":
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


@dataclass(frozen=True)
class Prompt:
    """One prompt to analyse: text or token ids, its system-prompt group, its session id (the request's
    ``session_key`` field, if any) and the first :data:`ROUTER_CHUNK_CHARS` characters of the text
    production-stack's prefix router keys (None for token ids)."""

    group: str
    text: str | None = None
    ids: tuple[int, ...] | None = None
    session: str | None = None
    router_head: str | None = None


def _router_text(messages: list[dict[str, Any]]) -> str:
    """The text production-stack's ``PrefixAwareRouter`` keys a chat request by: every message's text
    content joined by newlines (routing_logic.py at a6c01db0, docs/sources.md §27)."""
    return "\n".join(_content_text(m.get("content")) for m in messages)


def parse_request(line: str, template: str = "chatml", session_key: str = "user") -> list[Prompt]:
    """The prompts of one JSONL line (a completion ``prompt`` list is a batch: several). The session id is
    the request body's ``session_key`` field (or its ``metadata``'s), a string or a number.

    Raises:
        Malformed: with a short reason (invalid JSON, not an object, no messages or prompt,
            bad messages, bad prompt).
    """
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise Malformed("invalid JSON") from None
    if not isinstance(obj, dict):
        raise Malformed("not a JSON object")
    body = obj["body"] if isinstance(obj.get("body"), dict) else obj
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    raw_session = body.get(session_key, meta.get(session_key))
    session = str(raw_session) if isinstance(raw_session, (str, int)) and not isinstance(raw_session, bool) else None
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise Malformed("bad messages")
        first = messages[0]
        group = NO_SYSTEM
        if first.get("role") in ("system", "developer"):
            group = _content_text(first.get("content"))
        return [Prompt(group=group, text=render_chat(messages, template), session=session,
                       router_head=_router_text(messages)[:ROUTER_CHUNK_CHARS])]
    if "prompt" in body:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            return [Prompt(group=COMPLETION, text=prompt, session=session, router_head=prompt[:ROUTER_CHUNK_CHARS])]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) for p in prompt):
                return [Prompt(group=COMPLETION, text=p, session=session, router_head=p[:ROUTER_CHUNK_CHARS])
                        for p in prompt]
            if all(_token_id(p) for p in prompt):
                return [Prompt(group=COMPLETION, ids=tuple(prompt), session=session)]
            if all(isinstance(p, list) and p and all(_token_id(i) for i in p) for p in prompt):
                return [Prompt(group=COMPLETION, ids=tuple(p), session=session) for p in prompt]
        raise Malformed("bad prompt")
    raise Malformed("no messages or prompt")


# --- the analysis -----------------------------------------------------------------------------


@dataclass
class GroupStats:
    """Per system prompt: requests, prompt tokens, tokens a perfect cache serves."""

    label: str
    requests: int = 0
    prompt_tokens: int = 0
    served_tokens: int = 0

    @property
    def share(self) -> float:
        return self.served_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _percentile(counts: Counter, q: float) -> int:
    """Nearest-rank percentile (q in 0..100) of a length -> count histogram."""
    total = sum(counts.values())
    if not total:
        return 0
    rank = max(1, math.ceil(q / 100.0 * total))
    seen = 0
    for length in sorted(counts):
        seen += counts[length]
        if seen >= rank:
            return length
    return max(counts)


def _label(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


@dataclass
class OverlapReport:
    """Everything :func:`analyse` measured (see :meth:`to_dict` for the JSON shape)."""

    tokenizer: str
    exact: bool
    chunk_tokens: int
    max_cached_chunks: int
    threshold: float
    lines: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    served_tokens: int = 0
    whole_chunk_tokens: int = 0
    requests_with_hit: int = 0
    evictions: int = 0
    cached_chunks: int = 0
    malformed: Counter = field(default_factory=Counter)
    malformed_lines: list[int] = field(default_factory=list)
    lengths: Counter = field(default_factory=Counter)
    #: Requests per shared-prefix length (served tokens: whole chunks, bounded by the context).
    shared_lengths: Counter = field(default_factory=Counter)
    #: Requests per whole percent (0..100) of their prompt served: at most 101 keys.
    shared_percent: Counter = field(default_factory=Counter)
    groups: dict[str, GroupStats] = field(default_factory=dict)
    #: The request field read as the session id (:func:`parse_request`).
    session_key: str = "user"
    #: Prompt length below which an L2 read does not pay, tokens (scripts/plan.py's break-even).
    break_even_tokens: float = 0.0
    requests_with_session: int = 0
    #: Served tokens whose chunk the same session stored first / another session (or none) stored first.
    same_session_tokens: int = 0
    cross_session_tokens: int = 0
    #: Served tokens, of the cross-session ones, in chunks served to at least :data:`COMMON_CHUNK_SHARE` of
    #: the requests: one prefix shared by (nearly) all.
    common_tokens: int = 0
    #: Requests per first router chunk (8-byte hash of its :data:`ROUTER_CHUNK_CHARS` characters), bounded
    #: at ``max_groups`` distinct chunks (the rest uncounted); and how many requests had text to key.
    router_heads: Counter = field(default_factory=Counter)
    requests_with_head: int = 0
    #: Requests shorter than ``break_even_tokens``.
    short_requests: int = 0
    #: Whether the line has the shared L2 (:func:`recommend_routing`).
    l2: bool = True
    #: Whether the platform runs the HyperPod Inference Gateway (``inference_operator.gateway.enabled``), so
    #: ``routing_strategy: gateway`` is open to the line (:func:`recommend_routing`).
    gateway: bool = False

    @property
    def router_head_share(self) -> float:
        """The largest share of requests whose first 128 characters are the same (0 without text)."""
        return max(self.router_heads.values()) / self.requests_with_head if self.router_heads else 0.0

    @property
    def document_tokens(self) -> int:
        """Served tokens neither of the same session nor of the prefix shared by all: per-document reuse."""
        return max(0, self.cross_session_tokens - self.common_tokens)

    @property
    def routing(self) -> "RoutingAdvice":
        return recommend_routing(self)

    @property
    def share(self) -> float:
        """Served prompt tokens / all prompt tokens (0 for an empty log)."""
        return self.served_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def verdict(self) -> str:
        """What the share implies, against the ~40% adoption threshold."""
        pct = f"{self.share:.1%}"
        if not self.requests:
            return "no requests: nothing to judge"
        if self.share >= self.threshold:
            text = (f"{pct} is above the ~{format_share(self.threshold)} adoption threshold: shared prefixes are common "
                    "enough for the L2 tier to pay off where prompts are longer than the break-even of "
                    "scripts/plan.py (~780 tokens for Qwen2-7B on an L40S)")
        else:
            text = (f"{pct} is below the ~{format_share(self.threshold)} adoption threshold: the L2 tier is unlikely to pay "
                    "off; vLLM's L0 prefix cache with prefix-aware routing may be enough")
        if self.evictions:
            text += (f"; the analysis evicted {self.evictions:,} chunk keys (bound {self.max_cached_chunks:,}), "
                     "so the share is a lower bound")
        if not self.exact:
            text += "; token counts are approximate (no tokenizer given)"
        return text

    def top_groups(self, n: int = 10) -> list[GroupStats]:
        return sorted(self.groups.values(), key=lambda g: (-g.prompt_tokens, g.label))[:n]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        total = sum(self.lengths.values())
        mean = sum(k * v for k, v in self.lengths.items()) / total if total else 0.0
        return {
            "tokenizer": self.tokenizer, "exact_tokens": self.exact, "chunk_tokens": self.chunk_tokens,
            "lines": self.lines, "requests": self.requests, "prompt_tokens": self.prompt_tokens,
            "served_tokens": self.served_tokens, "share": round(self.share, 4),
            "whole_chunk_tokens": self.whole_chunk_tokens, "requests_with_hit": self.requests_with_hit,
            "threshold": self.threshold, "above_threshold": self.share >= self.threshold and self.requests > 0,
            "verdict": self.verdict,
            "malformed": {"count": sum(self.malformed.values()), "by_reason": dict(self.malformed),
                          "first_lines": self.malformed_lines},
            "prompt_length": {"p50": _percentile(self.lengths, 50), "p90": _percentile(self.lengths, 90),
                              "p99": _percentile(self.lengths, 99), "max": max(self.lengths, default=0),
                              "mean": round(mean, 1), "histogram": self.histogram()},
            "cache": {"max_chunks": self.max_cached_chunks, "chunks": self.cached_chunks,
                      "evictions": self.evictions},
            "groups": [{"system_prompt": g.label, "requests": g.requests, "prompt_tokens": g.prompt_tokens,
                        "served_tokens": g.served_tokens, "share": round(g.share, 4)} for g in self.top_groups(top)],
            "routing": self.routing.to_dict(),
        }

    def histogram(self) -> list[dict[str, Any]]:
        """Request counts per prompt-length bucket: [0, 256), [256, 512), ... doubling."""
        buckets: Counter = Counter()
        for length, count in self.lengths.items():
            upper = 256
            while length >= upper:
                upper *= 2
            buckets[upper] += count
        return [{"min": 0 if u == 256 else u // 2, "max": u - 1, "requests": buckets[u]} for u in sorted(buckets)]


def reference_break_even_tokens() -> float:
    """The planner's L2 break-even for the reference deployment (Qwen2-7B, fp16, one L40S), tokens: about
    783 (capacity/latency.py). ``scripts/plan.py`` prints a line's own; pass it as ``--break-even-tokens``."""
    from capacity.latency import REFERENCE_RUN, timing
    from capacity.model_specs import lookup_model
    from platform_config import get_instance_type

    ref = REFERENCE_RUN
    t = timing(lookup_model(ref.model), get_instance_type(ref.gpu_instance_type), ref.tp, ref.kv_dtype,
               tokens=ref.prompt_tokens)
    return float(t.break_even_tokens or 0.0)


@dataclass(frozen=True)
class RoutingAdvice:
    """Which routing a line's request log calls for (:func:`recommend_routing`).

    Attributes:
        strategy: the line's ``routing_strategy`` to configure: one of the strategies the InferenceEndpointConfig
            CRD allows (``intelligentRoutingSpec.routingStrategy``: prefixaware, kvaware, session, roundrobin),
            or ``gateway`` (the HyperPod Inference Gateway) when the report says the platform runs it.
        ideal: what the traffic wants, whether or not the operator's router offers it: ``load only``,
            ``session affinity``, ``prefix affinity with a load bound``.
        hot_spot: ``prefixaware`` would send at least :data:`HOT_SPOT_SHARE` of the requests to one replica.
        reasons: why, one clause each, with the log's figures.
    """

    strategy: str
    ideal: str
    hot_spot: bool
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "ideal": self.ideal, "hot_spot": self.hot_spot,
                "reasons": list(self.reasons)}


def recommend_routing(report: OverlapReport) -> RoutingAdvice:
    """The routing ``report``'s log calls for. Rules, in order (issue 29 item 2; the figures behind them:
    scripts/bench_routing.py, capacity/routing_sim.py):

    1. A first 128 characters shared by at least :data:`HOT_SPOT_SHARE` of the requests: never
       ``prefixaware`` (its trie sends them all to the replica that served the first, production-stack
       #957).
    2. A median prompt shorter than the L2 break-even, or under 10% of prompt tokens reusable: load only
       (``roundrobin``): an L2 read does not pay and a local hit saves little prefill.
    3. At least half of the reuse within a session (the ``session_key`` field, on at least half the
       requests): ``session``: a conversation's KV stays on its replica.
    4. At least a quarter of the reuse per document (served across sessions, by chunks fewer than
       :data:`COMMON_CHUNK_SHARE` of the requests share): prefix affinity with a load bound, which no CRD
       strategy has (prefixaware and kvaware have no load term). With the L2 the affinity is worth only an
       L2 read (about 0.37x of a recompute at 2,500 tokens), so ``roundrobin``; without it, ``prefixaware``
       unless rule 1 forbids it. The HyperPod Inference Gateway (prefix and load scorers) is the ideal: with
       ``report.gateway`` (the platform runs it), ``gateway``, L2 or not.
    5. Otherwise the reuse is one prefix shared by all: every replica holds it after its first request (and
       the L2 as a hot prefix), so load only (``roundrobin``).

    ``kvaware`` is never advised: it sees the replicas' local tiers only, never the L2, has no load term,
    and does not tokenize chat requests (production-stack #1045, #1062), so they fall back.
    """
    if not report.requests:
        return RoutingAdvice("roundrobin", "load only", False, ("no requests: nothing to route by",))
    hot = report.router_head_share >= HOT_SPOT_SHARE and report.requests_with_head > 1
    reasons: list[str] = []
    if hot:
        reasons.append(f"{report.router_head_share:.0%} of the requests share their first {ROUTER_CHUNK_CHARS} "
                       "characters: prefixaware would send them all to one replica (a hot spot)")
    p50 = _percentile(report.lengths, 50)
    served = report.served_tokens
    if p50 < report.break_even_tokens:
        return RoutingAdvice("roundrobin", "load only", hot, (*reasons, (
            f"the median prompt ({p50:,} tokens) is shorter than the L2 break-even (~{report.break_even_tokens:,.0f} "
            "tokens): a read from L2 does not pay and a local hit saves little prefill; route by load")))
    if report.share < 0.10:
        return RoutingAdvice("roundrobin", "load only", hot, (*reasons, (
            f"only {report.share:.0%} of prompt tokens are reusable: nothing for affinity to keep; route by load")))
    same = report.same_session_tokens / served
    documents = report.document_tokens / served
    common = min(report.common_tokens, report.cross_session_tokens) / served
    if report.requests_with_session >= 0.5 * report.requests and same >= 0.5:
        return RoutingAdvice("session", "session affinity", hot, (*reasons, (
            f"{same:.0%} of the reuse is within a session (field {report.session_key!r}): session keeps a "
            "conversation on the replica that holds its KV locally")))
    if documents >= 0.25:
        if report.gateway:
            return RoutingAdvice("gateway", "prefix affinity with a load bound", hot, (*reasons, (
                f"{documents:.0%} of the reuse is per document, across sessions: it wants prefix affinity with a "
                "load bound, which the HyperPod Inference Gateway's prefix and load scorers give (the platform "
                "runs it: inference_operator.gateway.enabled); no CRD strategy has both")))
        if report.l2:
            return RoutingAdvice("roundrobin", "prefix affinity with a load bound", hot, (*reasons, (
                f"{documents:.0%} of the reuse is per document, across sessions: it wants prefix affinity with a "
                "load bound (the HyperPod Inference Gateway's prefix and load scorers), which no CRD strategy "
                "has; with the L2 every replica reads a document another computed, so affinity is worth only an "
                "L2 read: roundrobin")))
        if not hot:
            return RoutingAdvice("prefixaware", "prefix affinity with a load bound", hot, (
                f"{documents:.0%} of the reuse is per document and the line has no L2: affinity saves the whole "
                "recompute, and no first prefix is shared by most requests, so prefixaware spreads the documents "
                "(it has no load bound: watch the hot-spot alert)",))
        return RoutingAdvice("roundrobin", "prefix affinity with a load bound", hot, (*reasons, (
            f"{documents:.0%} of the reuse is per document, but prefixaware would hot-spot and kvaware has no load "
            "term: roundrobin, or the HyperPod Inference Gateway for affinity with a load bound")))
    return RoutingAdvice("roundrobin", "load only", hot, (*reasons, (
        f"{common:.0%} of the reuse is one prefix shared by (nearly) all requests: every replica holds it after "
        "its first request (and the L2 as a hot prefix), so affinity buys nothing; route by load")))


def format_share(share: float) -> str:
    """A share as a percentage without spurious digits: 0.4 -> ``40%``, 0.425 -> ``42.5%``."""
    return f"{share * 100:.4g}%"


class _CountingReader(io.RawIOBase):
    """A binary file that reports every byte read to ``on_read`` (a progress bar's update),
    so a ``.gz`` log's progress is measured in compressed bytes of the file on disk."""

    def __init__(self, raw: IO[bytes], on_read: Callable[[int], Any]) -> None:
        self._raw, self._on_read = raw, on_read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        self._on_read(len(data))
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open(path: str | Path, on_read: Callable[[int], Any] | None = None) -> IO[str]:
    """Text lines of ``path`` (``-`` stdin, ``.gz`` decompressed); ``on_read`` gets the bytes
    read from the file itself.

    Raises:
        FileNotFoundError / IsADirectoryError: naming the path.
    """
    if str(path) == "-":
        raw: IO[bytes] = sys.stdin.buffer
    else:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a directory, not a request log")
        raw = open(path, "rb")
    binary: IO[bytes] = io.BufferedReader(_CountingReader(raw, on_read)) if on_read else raw
    if not str(path).endswith(".gz"):
        return io.TextIOWrapper(binary, encoding="utf-8", errors="replace")
    return _GzipLines(gzip.GzipFile(fileobj=binary, mode="rb"), binary)


class _GzipLines(io.TextIOWrapper):
    """Text of a ``GzipFile`` opened on a file object, closing that file object too
    (``GzipFile`` leaves a file object it was given open)."""

    def __init__(self, gz: gzip.GzipFile, underlying: IO[bytes]) -> None:
        super().__init__(gz, encoding="utf-8", errors="replace")
        self._underlying = underlying

    def close(self) -> None:
        super().close()
        if self._underlying is not getattr(sys.stdin, "buffer", None):
            self._underlying.close()


def _batches(lines: Iterable[str], size: int) -> Iterator[list[tuple[int, str]]]:
    batch: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        batch.append((number, line))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def analyse(lines: Iterable[str], *, tokenizer: HFTokenizer | ApproxTokenizer | None = None,
            chunk_tokens: int = DEFAULT_CHUNK_TOKENS, max_cached_chunks: int = DEFAULT_MAX_CACHED_CHUNKS,
            max_groups: int = DEFAULT_MAX_GROUPS, template: str = "chatml", threshold: float = ADOPTION_THRESHOLD,
            batch_size: int = 256, max_malformed_lines: int = 10, session_key: str = "user",
            break_even_tokens: float | None = None, l2: bool = True, gateway: bool = False) -> OverlapReport:
    """Simulate a perfect cross-pod prefix cache over ``lines`` (JSONL requests, in log order).

    For the routing advice (:func:`recommend_routing`) it also counts, per served chunk, whether the same
    session stored it first (the request's ``session_key`` field), how many requests it served (a prefix
    shared by all vs per-document reuse), the requests per first 128 characters of the router's text, and
    the requests shorter than ``break_even_tokens`` (default: :func:`reference_break_even_tokens`);
    ``l2``: whether the line has the shared L2 (the advice differs); ``gateway``: whether the platform runs the
    HyperPod Inference Gateway (``gateway`` may then be advised).

    Memory is bounded by ``max_cached_chunks`` (LRU of 8-byte keys), ``max_groups`` and
    ``batch_size``, not by the log's length. Malformed lines are counted by reason (the
    first ``max_malformed_lines`` line numbers kept), never raised.

    Raises:
        ValueError: ``chunk_tokens``, ``max_cached_chunks``, ``max_groups`` or ``batch_size``
            below 1, an unknown ``template``, or a ``threshold`` outside 0..1 (a share, not a
            percentage: 0.4, not 40).
    """
    small = {k: v for k, v in (("chunk_tokens", chunk_tokens), ("max_cached_chunks", max_cached_chunks),
                               ("max_groups", max_groups), ("batch_size", batch_size)) if v < 1}
    if small:
        raise ValueError(", ".join(f"{k} must be >= 1 (got {v})" for k, v in small.items()))
    if template not in ("chatml", "plain"):
        raise ValueError(f"unknown template {template!r}; allowed: chatml, plain")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold {threshold!r} is outside 0..1; it is a share (0.4 for 40%)")
    tok = tokenizer or ApproxTokenizer()
    report = OverlapReport(tokenizer=tok.name, exact=tok.exact, chunk_tokens=chunk_tokens,
                           max_cached_chunks=max_cached_chunks, threshold=threshold, session_key=session_key,
                           break_even_tokens=(reference_break_even_tokens() if break_even_tokens is None
                                              else break_even_tokens), l2=l2, gateway=gateway)
    # key -> [hash of the session that stored it (b"" for none), requests of other sessions it served]
    seen: OrderedDict[bytes, list[Any]] = OrderedDict()
    group_ids: dict[bytes, str] = {}

    for batch in _batches(lines, batch_size):
        prompts: list[Prompt] = []
        for number, line in batch:
            report.lines += 1
            if not line.strip():
                continue
            try:
                prompts.extend(parse_request(line, template, session_key))
            except Malformed as exc:
                report.malformed[exc.reason] += 1
                if len(report.malformed_lines) < max_malformed_lines:
                    report.malformed_lines.append(number)
        texts = [p.text for p in prompts if p.text is not None]
        encoded = iter(tok.encode_batch(texts)) if texts else iter(())
        for prompt in prompts:
            tokens = next(encoded) if prompt.text is not None else _ids_tokens(prompt.ids or ())
            served = 0
            matching = True
            prev = b""
            whole = tokens.length // chunk_tokens
            session = (hashlib.blake2b(prompt.session.encode("utf-8", "surrogatepass"), digest_size=8).digest()
                       if prompt.session is not None else b"")
            for k in range(whole):
                key = hashlib.blake2b(prev + tokens.chunk_bytes(k, chunk_tokens), digest_size=8).digest()
                if matching and key in seen:
                    served += chunk_tokens
                    seen.move_to_end(key)
                    entry = seen[key]
                    if session and entry[0] == session:
                        report.same_session_tokens += chunk_tokens
                    else:
                        report.cross_session_tokens += chunk_tokens
                        entry[1] += 1
                else:
                    matching = False
                    seen[key] = [session, 0]
                    if len(seen) > max_cached_chunks:
                        seen.popitem(last=False)
                        report.evictions += 1
                prev = key
            report.requests += 1
            report.prompt_tokens += tokens.length
            report.served_tokens += served
            report.whole_chunk_tokens += whole * chunk_tokens
            report.requests_with_hit += served > 0
            report.lengths[tokens.length] += 1
            report.requests_with_session += prompt.session is not None
            report.short_requests += tokens.length < report.break_even_tokens
            if prompt.router_head is not None:
                report.requests_with_head += 1
                head = hashlib.blake2b(prompt.router_head.encode("utf-8", "surrogatepass"), digest_size=8).digest()
                if head in report.router_heads or len(report.router_heads) < max_groups:
                    report.router_heads[head] += 1
            report.shared_lengths[served] += 1
            report.shared_percent[served * 100 // tokens.length if tokens.length else 0] += 1
            gid = hashlib.blake2b(prompt.group.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            label = group_ids.get(gid)
            if label is None:
                if len(group_ids) < max_groups:
                    label = group_ids[gid] = _label(prompt.group) if prompt.group else "(empty system prompt)"
                else:
                    label = OTHER
            stats = report.groups.setdefault(label, GroupStats(label))
            stats.requests += 1
            stats.prompt_tokens += tokens.length
            stats.served_tokens += served
    report.cached_chunks = len(seen)
    report.common_tokens = chunk_tokens * sum(
        hits for _, hits in seen.values() if hits and hits >= COMMON_CHUNK_SHARE * report.requests)
    return report


def analyse_file(path: str | Path, *, progress: bool = False, progress_delay_s: float = 1.0,
                 **kwargs: Any) -> OverlapReport:
    """:func:`analyse` over a file (``.gz`` is decompressed on the fly; ``-`` is stdin).

    ``progress`` draws a tqdm bar on stderr, in bytes of the file (compressed bytes for
    ``.gz``; lines for stdin), shown once the run has lasted ``progress_delay_s``.

    Raises:
        FileNotFoundError / IsADirectoryError: the path (named in the message); ValueError:
        from :func:`analyse`, or a ``.gz`` that is not gzip or ends early (truncated, or still being
        written), naming the file: an answer from part of a log would be a wrong answer.
    """
    try:
        return _analyse_file(path, progress=progress, progress_delay_s=progress_delay_s, **kwargs)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        what = ("ends before the end of its gzip stream (truncated, or still being written)"
                if isinstance(exc, EOFError) else f"is not a readable gzip file ({exc})")
        raise ValueError(f"{path} {what}; allowed: a complete .gz file, or the uncompressed log") from None


def _analyse_file(path: str | Path, *, progress: bool, progress_delay_s: float, **kwargs: Any) -> OverlapReport:
    if not progress:
        with _open(path) as handle:
            return analyse(handle, **kwargs)
    from tqdm import tqdm

    size = None if str(path) == "-" else Path(path).stat().st_size if Path(path).is_file() else None
    if size is None:
        with _open(path) as handle, tqdm(handle, unit=" lines", file=sys.stderr, delay=progress_delay_s,
                                         desc="overlap") as lines:
            return analyse(lines, **kwargs)
    with tqdm(total=size, unit="B", unit_scale=True, file=sys.stderr, delay=progress_delay_s, desc="overlap") as bar, \
            _open(path, on_read=bar.update) as handle:
        return analyse(handle, **kwargs)


def format_report(report: OverlapReport, top: int = 10) -> str:
    """The readable report ``scripts/overlap.py`` prints."""
    d = report.to_dict(top)
    bad = d["malformed"]
    lines = [f"tokenizer     {report.tokenizer}",
             f"requests      {report.requests:,} from {report.lines:,} lines"]
    if bad["count"]:
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(report.malformed.items(), key=lambda x: -x[1]))
        lines.append(f"malformed     {bad['count']:,} lines skipped ({reasons}); first at line(s) "
                     f"{', '.join(map(str, bad['first_lines']))}")
    lines += [
        f"prompt tokens {report.prompt_tokens:,}",
        f"served        {report.served_tokens:,} = {report.share:.1%} by a perfect cross-pod prefix cache "
        f"({report.chunk_tokens}-token chunks; {report.requests_with_hit:,} requests with a hit)",
        f"verdict       {report.verdict}",
        "",
        "prompt length (tokens): " + "  ".join(f"{k} {d['prompt_length'][k]:,}" for k in ("p50", "p90", "p99", "max"))
        + f"  mean {d['prompt_length']['mean']:,}",
    ]
    for bucket in d["prompt_length"]["histogram"]:
        lines.append(f"  {bucket['min']:>7,} - {bucket['max']:<7,} {bucket['requests']:>9,} requests")
    lines += ["", f"{'system prompt':<62} {'requests':>9} {'tokens':>12} {'served':>12} {'share':>7}"]
    for g in d["groups"]:
        lines.append(f"{g['system_prompt']:<62} {g['requests']:>9,} {g['prompt_tokens']:>12,} "
                     f"{g['served_tokens']:>12,} {g['share']:>7.1%}")
    advice = report.routing
    served = report.served_tokens or 1
    lines += ["", f"routing       {advice.strategy} (the traffic wants {advice.ideal}"
                  f"{'; prefixaware would hot-spot' if advice.hot_spot else ''})",
              f"  reuse       within a session {report.same_session_tokens / served:.0%}, one prefix shared by all "
              f"{min(report.common_tokens, report.cross_session_tokens) / served:.0%}, per document "
              f"{report.document_tokens / served:.0%}; {report.requests_with_session:,} requests with a session id "
              f"(field {report.session_key!r}); largest share of one first {ROUTER_CHUNK_CHARS} characters "
              f"{report.router_head_share:.0%}; {report.short_requests:,} requests below the L2 break-even "
              f"(~{report.break_even_tokens:,.0f} tokens)"]
    lines += [f"  why         {reason}" for reason in advice.reasons]
    if report.evictions:
        lines.append(f"\nnote: {report.evictions:,} chunk keys evicted (bound {report.max_cached_chunks:,}); "
                     "the share is a lower bound")
    return "\n".join(lines)
