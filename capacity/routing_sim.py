"""Routing simulator of one business line: which replica each request goes to, and what that costs in TTFT.

Issue 29 item 1. Deterministic (a seed fixes everything) and small enough for unit tests; the figures of
``scripts/bench_routing.py`` come from here.

**What is modelled.**

* *The trace* (:func:`make_trace`): requests with an arrival time (s), a prompt length (tokens) and the
  prompt as a sequence of KV blocks (``block_tokens`` tokens each; equal block ids = equal content, as in
  the ``hash_ids`` of Mooncake's published traces, which use 512-token blocks: kvcache-ai/Mooncake
  ``FAST25-release/traces/``, docs/sources.md §27). Every request starts with one block every request
  shares (a system prompt); then a run of its *prefix group*'s context (a conversation or a document);
  then blocks of its own. The shapes are fitted to the figures issue 29 quotes from those traces
  (:data:`MOONCAKE_CONVERSATION`, :data:`MOONCAKE_SYNTHETIC`): request count, rate, median input, the
  reuse ceiling (fitted exactly by bisection on the share of the group context each request carries,
  :attr:`Trace.context_fraction`) and the number of prefix groups. Burstiness (gamma inter-arrival times
  of coefficient of variation ``arrival_cv``), the spread of input lengths and how many groups are active
  at once are not published: they are parameters, and the presets' values are choices, said so there.
* *Replicas*: each a FIFO server of prefills (one prefill at a time: prefill is compute-bound, and a
  batch of prefills takes about the sum of their times) with one local prefix cache of L0 (vLLM's GPU
  prefix cache) + L1 (LMCache's CPU buffer), LRU by blocks, of the planner's capacity
  (:attr:`ServiceModel.local_blocks`). A local hit costs nothing here (optimistic for L1: its copy to
  the GPU is not modelled).
* *The shared L2*: every prefill is stored there (LMCache stores each new chunk); oldest first out at the
  line's ``l2_size`` x the janitor's high watermark (the janitor deletes the oldest chunk files; a hit does
  not make a file younger). A request reads from L2 the part of its prefix that follows its local hit.
* *Service time* (:class:`ServiceModel`, the planner's model, :mod:`capacity.latency`): an L2 read costs
  the calibrated fixed overhead plus the bytes at the cross-node bandwidth; prefill costs the FLOPs of the
  uncached tokens at the calibrated rate. TTFT = wait in the replica's queue + its service time. Decode is
  not modelled (the planner has no decode model): TTFT is the prefill queue's, and the share of work is
  prefill and L2-read time. A decode-heavy line queues more than this says.
* *Routing strategies* (:data:`STRATEGIES`) as vLLM production-stack's router implements them
  (``src/vllm_router/routers/routing_logic.py`` and ``src/vllm_router/prefix/hashtrie.py`` at
  a6c01db05f65f556235413ba8dbcfb0c01132fff, docs/sources.md §27), which HyperPod's four strategies match
  by name and mechanism (inferred, issue 29), and one load-dominant blend that no router of the
  operator offers (``leastwork``), the model of a line routed by the HyperPod Inference Gateway
  (``routing_strategy: gateway``: :func:`simulated_strategy`).

Units: times in ms unless named ``_s``; tokens as counts; shares as fractions of the line's total.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Sequence

from capacity.latency import DEFAULT_CALIBRATION, Calibration, l2_read_ms, prefill_flops, prefill_flops_per_s
from capacity.model_specs import ModelSpec
from capacity.planner import Plan

if TYPE_CHECKING:
    from platform_config import BusinessLineConfig

#: Characters of one chunk of production-stack's prefix trie (``HashTrie(chunk_size=128)``, hashtrie.py).
TRIE_CHUNK_CHARS = 128
#: Characters per token of English text, the usual approximation (the repository's overlap tool uses it
#: too without a tokenizer: :mod:`operator_tools.overlap`); only converts trie chunks to tokens for display.
CHARS_PER_TOKEN = 4
#: production-stack's ``KvawareRouter(kv_aware_threshold=2000)``: a replica is chosen for its cached KV
#: only when it holds all but at most this many tokens of the prompt; else the router falls back.
KVAWARE_THRESHOLD_TOKENS = 2000
#: production-stack's ``--request-stats-window`` default, s: the window its QPS fallback counts requests in.
QPS_WINDOW_S = 60.0
#: Points per replica on the session router's consistent-hash ring (a choice; production-stack uses
#: ``uhashring.HashRing`` with its defaults, whose exact point placement is not reproduced here).
RING_POINTS = 160


# --------------------------------------------------------------------------------------------------------
# The trace


@dataclass(frozen=True)
class TraceShape:
    """The shape of a line's traffic, fitted to a public trace (see the presets).

    Attributes:
        name: label in reports.
        requests: number of requests.
        rate_per_s: mean arrival rate, requests/s.
        arrival_cv: coefficient of variation of inter-arrival times (1: Poisson; above 1: bursty); gamma.
        input_p50_tokens: median prompt length, tokens (lognormal).
        input_sigma: sigma of the lognormal prompt length (spread).
        max_input_tokens: longest prompt, tokens (lengths are clipped to it).
        block_tokens: tokens per KV block (the granularity of reuse).
        reuse_ceiling: share of all prompt tokens an infinite shared prefix cache serves (whole blocks of a
            prefix seen before); fitted exactly (:func:`make_trace`).
        groups: number of prefix groups (conversations or documents).
        sessions: True: a group is a conversation and its requests carry its session id (the ``session``
            router's key); False: a group is a document different users ask about (no session id).
        active_groups: how many recently used groups a follow-up request picks from (temporal locality).
        shared_first_block: every request starts with the same block (a system prompt).
    """

    name: str
    requests: int
    rate_per_s: float
    arrival_cv: float
    input_p50_tokens: float
    input_sigma: float
    max_input_tokens: int
    block_tokens: int
    reuse_ceiling: float
    groups: int
    sessions: bool
    active_groups: int
    shared_first_block: bool = True

    def __post_init__(self) -> None:
        if self.requests < 1 or self.groups < 1 or self.groups > self.requests:
            raise ValueError(f"{self.name}: need 1 <= groups ({self.groups}) <= requests ({self.requests})")
        if not 0.0 <= self.reuse_ceiling < 1.0:
            raise ValueError(f"{self.name}: reuse_ceiling must be in [0, 1), got {self.reuse_ceiling}")
        if self.rate_per_s <= 0 or self.arrival_cv <= 0 or self.block_tokens < 1:
            raise ValueError(f"{self.name}: rate_per_s, arrival_cv and block_tokens must be positive")


#: Mooncake's conversation trace as issue 29 quotes it (kvcache-ai/Mooncake ``FAST25-release/traces/
#: conversation_trace.jsonl``, docs/sources.md §27): 12,031 requests at 3.4 req/s, bursty, input p50 about
#: 6.9k tokens, a 37% reuse ceiling, one first block shared by every request; 512-token blocks (the traces'
#: ``hash_ids``). Choices (not published): arrival CV 2, lognormal sigma 0.6, prompts at most 32k tokens,
#: conversations of 4 requests on average, follow-ups among the 64 most recently active conversations.
MOONCAKE_CONVERSATION = TraceShape(
    name="mooncake-conversation", requests=12_031, rate_per_s=3.4, arrival_cv=2.0, input_p50_tokens=6_900,
    input_sigma=0.6, max_input_tokens=32_768, block_tokens=512, reuse_ceiling=0.37, groups=12_031 // 4,
    sessions=True, active_groups=64)

#: Mooncake's synthetic trace as issue 29 quotes it (``FAST25-release/traces/synthetic_trace.jsonl``): a
#: 64% reuse ceiling over 2,211 prefix groups. Everything else is the conversation preset's; groups are
#: documents (no session id), follow-ups among the 256 most recently used.
MOONCAKE_SYNTHETIC = replace(MOONCAKE_CONVERSATION, name="mooncake-synthetic", reuse_ceiling=0.64,
                             groups=2_211, sessions=False, active_groups=256)


@dataclass(frozen=True)
class Request:
    """One request of a trace.

    Attributes:
        arrival_s: arrival time since the first request, s.
        tokens: prompt length, tokens.
        blocks: the prompt's KV blocks in order (equal ids = equal content); the last may be partial.
        group: its prefix group.
        session: its session id (conversations only), the ``session`` router's key.
    """

    arrival_s: float
    tokens: int
    blocks: tuple[int, ...]
    group: int
    session: str | None


@dataclass(frozen=True)
class Trace:
    """A generated trace (:func:`make_trace`).

    Attributes:
        shape: what it was generated from.
        seed: the seed.
        requests: the requests, in arrival order.
        context_fraction: the share of each request's blocks (after the first) taken from its group's
            context, as fitted so that :func:`reuse_ceiling` meets ``shape.reuse_ceiling``.
    """

    shape: TraceShape
    seed: int
    requests: tuple[Request, ...]
    context_fraction: float

    @property
    def input_p50_tokens(self) -> float:
        return statistics.median(r.tokens for r in self.requests)

    @property
    def rate_per_s(self) -> float:
        span = self.requests[-1].arrival_s - self.requests[0].arrival_s
        return (len(self.requests) - 1) / span if span > 0 else math.inf

    @property
    def arrival_cv(self) -> float:
        gaps = [b.arrival_s - a.arrival_s for a, b in zip(self.requests, self.requests[1:])]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    @property
    def reuse_ceiling(self) -> float:
        return reuse_ceiling(self.requests, self.shape.block_tokens)

    def scaled_to(self, rate_per_s: float) -> "Trace":
        """The same trace with its arrival times stretched or compressed to a mean ``rate_per_s``
        (burstiness, lengths and reuse kept): a line's own size instead of Mooncake's cluster's."""
        factor = self.rate_per_s / rate_per_s
        return replace(self, requests=tuple(replace(r, arrival_s=r.arrival_s * factor) for r in self.requests))


def reuse_ceiling(requests: Sequence[Request], block_tokens: int) -> float:
    """Share of all prompt tokens an infinite shared prefix cache would serve: per request, the whole
    blocks of its longest prefix whose every block an earlier request carried (prefix caches match
    prefixes only, as vLLM's and LMCache's chained block keys do)."""
    seen: set[int] = set()
    hit = total = 0
    for r in requests:
        n = 0
        for b in r.blocks:
            if b not in seen:
                break
            n += 1
        hit += min(n * block_tokens, r.tokens)
        total += r.tokens
        seen.update(r.blocks)
    return hit / total if total else 0.0


@dataclass(frozen=True)
class _Skeleton:
    """The random draws of a trace that do not depend on the context fraction."""

    arrivals: tuple[float, ...]
    tokens: tuple[int, ...]
    groups: tuple[int, ...]
    #: Per request, a uniform draw in [0, 1) that rounds its context blocks up or down, so the ceiling
    #: is near-continuous in the context fraction even for prompts of few blocks.
    dither: tuple[float, ...]


def _skeleton(shape: TraceShape, seed: int) -> _Skeleton:
    rng = random.Random(seed)
    k = 1.0 / shape.arrival_cv ** 2  # gamma shape: CV = 1/sqrt(k)
    scale = 1.0 / (shape.rate_per_s * k)
    t, arrivals = 0.0, []
    for i in range(shape.requests):
        arrivals.append(t)
        t += rng.gammavariate(k, scale)
    mu = math.log(shape.input_p50_tokens)
    tokens = [max(1, min(shape.max_input_tokens, round(math.exp(rng.gauss(mu, shape.input_sigma)))))
              for _ in range(shape.requests)]
    p_new = shape.groups / shape.requests
    active: deque[int] = deque(maxlen=shape.active_groups)
    groups, started = [], 0
    for i in range(shape.requests):
        remaining_new = shape.groups - started
        remaining = shape.requests - i
        if started == 0 or (remaining_new > 0 and (rng.random() < p_new or remaining_new >= remaining)):
            g, started = started, started + 1
        else:
            g = rng.choice(active)
            active.remove(g)
        active.append(g)
        groups.append(g)
    dither = tuple(rng.random() for _ in range(shape.requests))
    return _Skeleton(tuple(arrivals), tuple(tokens), tuple(groups), dither)


def _materialize(shape: TraceShape, skeleton: _Skeleton, fraction: float) -> tuple[Request, ...]:
    next_id = 1 if shape.shared_first_block else 0
    context: dict[tuple[int, int], int] = {}
    out = []
    for t, n_tokens, g, u in zip(skeleton.arrivals, skeleton.tokens, skeleton.groups, skeleton.dither):
        n = math.ceil(n_tokens / shape.block_tokens)
        blocks: list[int] = [0] if shape.shared_first_block else []
        rest = n - len(blocks)
        k = min(rest, math.floor(fraction * rest + u))
        for j in range(k):
            if (g, j) not in context:
                context[(g, j)] = next_id
                next_id += 1
            blocks.append(context[(g, j)])
        blocks.extend(range(next_id, next_id + rest - k))
        next_id += rest - k
        out.append(Request(arrival_s=t, tokens=n_tokens, blocks=tuple(blocks), group=g,
                           session=f"s{g}" if shape.sessions else None))
    return tuple(out)


def make_trace(shape: TraceShape = MOONCAKE_CONVERSATION, *, seed: int = 0, tolerance: float = 0.002) -> Trace:
    """A trace of ``shape``, the same for the same ``seed``.

    Arrival times, lengths and group membership are drawn first; then the share of each request's
    blocks taken from its group's context is bisected until :func:`reuse_ceiling` is within
    ``tolerance`` of ``shape.reuse_ceiling``.

    Raises:
        ValueError: the ceiling cannot be reached with these groups (too many groups for the target, or
            the shared first block alone exceeds it).
    """
    skeleton = _skeleton(shape, seed)

    def ceiling(fraction: float) -> tuple[float, tuple[Request, ...]]:
        requests = _materialize(shape, skeleton, fraction)
        return reuse_ceiling(requests, shape.block_tokens), requests

    lo, hi = 0.0, 1.0
    low_ceiling, requests = ceiling(lo)
    high_ceiling, _ = ceiling(hi)
    if not low_ceiling <= shape.reuse_ceiling <= high_ceiling:
        raise ValueError(f"{shape.name}: a reuse ceiling of {shape.reuse_ceiling:.0%} is out of reach; "
                         f"these groups give {low_ceiling:.1%} to {high_ceiling:.1%}")
    fraction, got = lo, low_ceiling
    for _ in range(40):
        fraction = (lo + hi) / 2
        got, requests = ceiling(fraction)
        if abs(got - shape.reuse_ceiling) <= tolerance:
            break
        lo, hi = (fraction, hi) if got < shape.reuse_ceiling else (lo, fraction)
    if abs(got - shape.reuse_ceiling) > tolerance:
        raise ValueError(f"{shape.name}: the reuse ceiling converged to {got:.1%}, not {shape.reuse_ceiling:.1%}")
    return Trace(shape=shape, seed=seed, requests=requests, context_fraction=fraction)


# --------------------------------------------------------------------------------------------------------
# Service times and the caches


@dataclass(frozen=True)
class ServiceModel:
    """Service times of one replica and its caches' sizes, from a :class:`capacity.planner.Plan`.

    Attributes:
        model: the model (its FLOPs and KV bytes per token).
        prefill_flops_per_s: one replica's calibrated prefill rate, FLOP/s
            (:func:`capacity.latency.prefill_flops_per_s`).
        kv_bytes_per_token: KV bytes per token of the whole model.
        l2_read_gibps: one replica's L2 read bandwidth, GiB/s (per-rank figure x TP).
        l2_overhead_ms: fixed cost of a request that reads from L2 (:class:`capacity.latency.Calibration`).
        local_tokens: tokens one replica's L0 + L1 hold (the planner's L0 per replica + L1 per replica).
        l2_tokens: tokens the line's L2 holds before its janitor deletes (``l2_size`` x high watermark;
            the pool's when the line has no ``l2_size``).
    """

    model: ModelSpec
    prefill_flops_per_s: float
    kv_bytes_per_token: int
    l2_read_gibps: float
    l2_overhead_ms: float
    local_tokens: int
    l2_tokens: int

    @classmethod
    def from_plan(cls, p: Plan, calibration: Calibration = DEFAULT_CALIBRATION) -> "ServiceModel":
        i = p.inputs
        l2_gib = i.l2_size_gib * (i.l2_high_watermark or 1.0) if i.l2_size_gib is not None else p.l2_pool_gib
        return cls(model=i.model, prefill_flops_per_s=prefill_flops_per_s(p.instance, p.fit.tp, calibration),
                   kv_bytes_per_token=p.kv_bytes_per_token, l2_read_gibps=i.l2_read_gibps * p.fit.tp,
                   l2_overhead_ms=calibration.l2_overhead_ms,
                   local_tokens=p.fit.l0_tokens_per_replica + p.tokens_in(p.l1_gib_per_replica),
                   l2_tokens=p.tokens_in(l2_gib))

    def prefill_ms(self, tokens: int, cached_tokens: int = 0) -> float:
        """Prefill of ``tokens`` of which the first ``cached_tokens`` are cached, ms."""
        return prefill_flops(self.model, tokens, cached_tokens) / self.prefill_flops_per_s * 1000.0

    def l2_ms(self, tokens: int) -> float:
        """Reading ``tokens`` of KV from L2, ms: nothing for 0 tokens, else overhead + bytes / bandwidth."""
        if tokens <= 0:
            return 0.0
        return self.l2_overhead_ms + l2_read_ms(tokens * self.kv_bytes_per_token, self.l2_read_gibps)

    def service_ms(self, tokens: int, local_tokens: int, l2_tokens: int) -> float:
        """A request's time on its replica: L2 read of ``l2_tokens`` + prefill of what neither cache held."""
        return self.l2_ms(l2_tokens) + self.prefill_ms(tokens, local_tokens + l2_tokens)


class _BlockCache:
    """A cache of KV blocks: LRU (a hit refreshes) or oldest-written first out (``refresh=False``)."""

    def __init__(self, capacity_blocks: int, *, refresh: bool = True) -> None:
        self.capacity = capacity_blocks
        self.refresh = refresh
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def prefix(self, blocks: Sequence[int], start: int = 0) -> int:
        """How many of ``blocks[start:]`` in a row, from ``start``, are held (no refresh)."""
        n = start
        while n < len(blocks) and blocks[n] in self.blocks:
            n += 1
        return n - start

    def store(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if b in self.blocks:
                if self.refresh:
                    self.blocks.move_to_end(b)
            else:
                self.blocks[b] = None
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


def _tokens_of(blocks: int, block_tokens: int, request: Request) -> int:
    return min(blocks * block_tokens, request.tokens)


# --------------------------------------------------------------------------------------------------------
# The line: replicas, queues, the L2; what a router may look at


class Line:
    """The state a router sees and the simulator updates: replicas' queues, local caches, the L2."""

    def __init__(self, replicas: int, service: ServiceModel, block_tokens: int, *, l2: bool) -> None:
        self.names = tuple(f"replica-{i:02d}" for i in range(replicas))
        self.service = service
        self.block_tokens = block_tokens
        self.local = [_BlockCache(max(1, service.local_tokens // block_tokens)) for _ in range(replicas)]
        self.l2 = _BlockCache(max(1, service.l2_tokens // block_tokens), refresh=False) if l2 else None
        self.free_at_ms = [0.0] * replicas
        self.routed_at_s: list[deque[float]] = [deque() for _ in range(replicas)]
        #: The replicas the router may choose now: the first ``active`` (a scale-out raises it).
        self.active = replicas

    @property
    def available(self) -> tuple[str, ...]:
        """Names of the replicas the router may choose now."""
        return self.names[:self.active]

    def outstanding_ms(self, replica: int, now_s: float) -> float:
        """Work queued or running on ``replica`` at ``now_s``, ms."""
        return max(0.0, self.free_at_ms[replica] - now_s * 1000.0)

    def qps(self, replica: int, now_s: float) -> float:
        """Requests routed to ``replica`` in the last :data:`QPS_WINDOW_S` s, per s (production-stack's
        request stats)."""
        q = self.routed_at_s[replica]
        while q and q[0] < now_s - QPS_WINDOW_S:
            q.popleft()
        return len(q) / QPS_WINDOW_S

    def hits(self, replica: int, request: Request) -> tuple[int, int]:
        """(local blocks, L2 blocks) of ``request``'s prefix if it ran on ``replica`` now."""
        local = self.local[replica].prefix(request.blocks)
        l2 = self.l2.prefix(request.blocks, local) if self.l2 is not None else 0
        return local, l2

    def hit_tokens(self, replica: int, request: Request) -> tuple[int, int]:
        """(tokens read locally, tokens read from L2) of ``request`` if it ran on ``replica`` now."""
        local, l2 = self.hits(replica, request)
        local_tokens = _tokens_of(local, self.block_tokens, request)
        return local_tokens, _tokens_of(local + l2, self.block_tokens, request) - local_tokens

    def service_ms(self, replica: int, request: Request) -> float:
        """``request``'s service time if it ran on ``replica`` now, ms."""
        return self.service.service_ms(request.tokens, *self.hit_tokens(replica, request))


# --------------------------------------------------------------------------------------------------------
# Strategies


class Strategy:
    """A router: :meth:`choose` returns the replica index for a request arriving now."""

    name = ""

    def choose(self, line: Line, request: Request) -> int:
        raise NotImplementedError


def _lowest_qps(line: Line, now_s: float) -> int:
    """production-stack ``RoutingInterface._qps_routing``: the first replica with no request stats, else
    the lowest QPS over the window (first in order on a tie)."""
    best, best_qps = 0, math.inf
    for i in range(line.active):
        if not line.routed_at_s[i] and line.free_at_ms[i] == 0.0:
            return i  # never routed to: no stats yet
        q = line.qps(i, now_s)
        if q < best_qps:
            best, best_qps = i, q
    return best


class RoundRobin(Strategy):
    """``roundrobin``: the replicas sorted by name, taken in turn (``RoundRobinRouter``)."""

    name = "roundrobin"

    def __init__(self) -> None:
        self.next: dict[int, int] = {}  # per set of replicas, as production-stack keys its index

    def choose(self, line: Line, request: Request) -> int:
        k = self.next.get(line.active, 0)
        self.next[line.active] = k + 1
        return k % line.active


class _Ring:
    """A consistent-hash ring of md5 points (:data:`RING_POINTS` per replica)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        points = sorted((self._hash(f"{name}-{k}"), i) for i, name in enumerate(names) for k in range(RING_POINTS))
        self.keys = [p for p, _ in points]
        self.nodes = [i for _, i in points]

    @staticmethod
    def _hash(text: str) -> int:
        return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "big")

    def node(self, key: str) -> int:
        return self.nodes[bisect.bisect(self.keys, self._hash(key)) % len(self.nodes)]


class Session(Strategy):
    """``session``: the session id's replica on a consistent-hash ring; a request without one goes to the
    lowest-QPS replica (``SessionRouter``). No load term."""

    name = "session"

    def __init__(self) -> None:
        self.ring: _Ring | None = None

    def choose(self, line: Line, request: Request) -> int:
        if request.session is None:
            return _lowest_qps(line, request.arrival_s)
        if self.ring is None or self.ring.names != line.available:
            self.ring = _Ring(line.available)
        return self.ring.node(request.session)


class _TrieNode:
    __slots__ = ("children", "replicas")

    def __init__(self) -> None:
        self.children: dict[int, _TrieNode] = {}
        self.replicas: set[int] = set()


class PrefixAware(Strategy):
    """``prefixaware``: production-stack's ``PrefixAwareRouter`` over its ``HashTrie``.

    The trie keys 128-character chunks of the prompt text and records at every node each replica a
    request through it was sent to; a request follows its chunks while the replicas recorded there (and
    still available) are not empty, then goes to a random one of the last non-empty set (all replicas
    when not even the first chunk matches), and is inserted along its path. No load term, no eviction
    (the trie grows without bound, production-stack #687), nothing forgotten but by a router restart.
    ``prefix_min_match_length`` is 0 (its default), so its QPS fallback never applies.

    Here the trie keys blocks: a block of ``block_tokens`` tokens is ``block_tokens x`` :data:`CHARS_PER_TOKEN`
    / 128 chunks, and since requests sharing a block share all its chunks, every chunk of a block records
    the same replicas: a trie over blocks takes the same decisions (a prefix shared to the middle of a
    block, which block-level traces cannot express, is not modelled).
    """

    name = "prefixaware"

    def __init__(self, seed: int = 0) -> None:
        self.root = _TrieNode()
        self.rng = random.Random(seed)

    def choose(self, line: Line, request: Request) -> int:
        node, selected = self.root, set(range(line.active))
        for b in request.blocks:
            child = node.children.get(b)
            if child is None or not (child.replicas & selected):
                break
            selected &= child.replicas
            node = child
        choice = self.rng.choice(sorted(selected))
        node = self.root
        node.replicas.add(choice)
        for b in request.blocks:
            node = node.children.setdefault(b, _TrieNode())
            node.replicas.add(choice)
        return choice


class KvAware(Strategy):
    """``kvaware``: production-stack's ``KvawareRouter``. It asks the LMCache controller which instance
    holds the longest prefix of the prompt's tokens, and the controller knows each replica's *local*
    LMCache tiers, never the shared L2. That replica is taken when it holds all but at most
    :data:`KVAWARE_THRESHOLD_TOKENS` of the prompt; otherwise the session id's replica on a hash ring,
    or the lowest-QPS replica without one. No load term. (It tokenizes only ``prompt``: a chat request
    looks up nothing and always falls back, production-stack #1045, #1062; the simulator's requests are
    tokenized, the router's best case.)"""

    name = "kvaware"

    def __init__(self) -> None:
        self.ring: _Ring | None = None

    def choose(self, line: Line, request: Request) -> int:
        local = [line.local[i].prefix(request.blocks) for i in range(line.active)]
        best = max(range(len(local)), key=lambda i: (local[i], -i))
        matched = _tokens_of(local[best], line.block_tokens, request)
        if local[best] > 0 and matched >= max(request.tokens - KVAWARE_THRESHOLD_TOKENS, 0):
            return best
        if request.session is None:
            return _lowest_qps(line, request.arrival_s)
        if self.ring is None or self.ring.names != line.available:
            self.ring = _Ring(line.available)
        return self.ring.node(request.session)


class LeastWork(Strategy):
    """``leastwork``, the load-dominant blend (not one of the operator's strategies): the replica where
    the request would finish first, ``outstanding work + its service time there``. Load dominates; prefix
    affinity only breaks near-ties, by what a local hit saves over the other replicas' reads: with an L2
    that is the L2 read of the prefix (about 0.37x of its recompute at 2,500 tokens, capacity.latency),
    without one the whole recompute. It looks at the replicas' caches and the L2 as the simulator holds
    them (a real router estimates them: the HyperPod Inference Gateway's prefix and load scorers)."""

    name = "leastwork"

    def choose(self, line: Line, request: Request) -> int:
        now = request.arrival_s
        return min(range(line.active),
                   key=lambda i: (line.outstanding_ms(i, now) + line.service_ms(i, request), i))


#: The strategies by name, each a factory taking the seed.
STRATEGIES: dict[str, Callable[[int], Strategy]] = {
    "roundrobin": lambda seed: RoundRobin(),
    "session": lambda seed: Session(),
    "prefixaware": lambda seed: PrefixAware(seed),
    "kvaware": lambda seed: KvAware(),
    "leastwork": lambda seed: LeastWork(),
}


#: A line's ``routing_strategy`` that is no strategy of :data:`STRATEGIES`, and the one that models it: the
#: HyperPod Inference Gateway's Endpoint Picker scores replicas by queue depth, KV-cache utilisation and
#: prefix-cache affinity (default weights 2, 2 and 3: docs/sources.md §31), a load term with affinity, which
#: ``leastwork`` stands for. A model, not the gateway's code (AWS publishes none): docs/routing.md.
MODELLED_BY: dict[str, str] = {"gateway": "leastwork"}


def simulated_strategy(routing_strategy: str) -> str:
    """The :data:`STRATEGIES` entry that simulates a line configured with ``routing_strategy``: itself for the
    operator's four, ``leastwork`` for ``gateway`` (:data:`MODELLED_BY`). Raises KeyError for anything else."""
    name = MODELLED_BY.get(routing_strategy, routing_strategy)
    if name not in STRATEGIES:
        raise KeyError(f"no simulated strategy for routing_strategy {routing_strategy!r}; known: "
                       f"{', '.join([*STRATEGIES, *MODELLED_BY])}")
    return name


# --------------------------------------------------------------------------------------------------------
# The simulation


@dataclass(frozen=True)
class SimResult:
    """What one strategy did to one trace.

    Attributes:
        strategy, l2: the strategy's name; whether the line had the shared L2.
        ttft_p50_ms, ttft_p99_ms, ttft_mean_ms: TTFT (queue wait + service) percentiles, ms.
        miss_ratio: prompt tokens prefilled / all prompt tokens.
        local_hit_ratio, l2_hit_ratio: prompt tokens served from a replica's L0/L1, from the L2.
        request_share: each replica's share of the requests (replica order).
        work_share: each replica's share of the service time (prefill + L2 reads).
        prefill_token_share: each replica's share of the tokens prefilled.
        assignments: the replica of each request, in trace order.
    """

    strategy: str
    l2: bool
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttft_mean_ms: float
    miss_ratio: float
    local_hit_ratio: float
    l2_hit_ratio: float
    request_share: tuple[float, ...]
    work_share: tuple[float, ...]
    prefill_token_share: tuple[float, ...]
    assignments: tuple[int, ...] = field(repr=False)

    @property
    def max_request_share(self) -> float:
        return max(self.request_share)

    @property
    def max_work_share(self) -> float:
        return max(self.work_share)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (q in [0, 1])."""
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def simulate(trace: Trace, service: ServiceModel, strategy: str, *, replicas: int, l2: bool,
             seed: int = 0, scale_out: tuple[float, int] | None = None) -> SimResult:
    """Route every request of ``trace`` with ``strategy`` over ``replicas`` replicas, with or without the
    shared L2, and measure. Pure and deterministic: the same arguments give the same result.

    ``scale_out`` ``(at_s, added)``: ``added`` replicas (empty caches) join at ``at_s`` s; the shares then
    cover ``replicas + added`` replicas.

    A request is looked up when it arrives (local prefix, then L2 after it), queued FIFO on its replica,
    and its blocks are stored in that replica's local cache and in the L2 at that moment (a prompt that
    arrives while an identical one is still queued hits: slightly optimistic under load).
    """
    added = scale_out[1] if scale_out else 0
    line = Line(replicas + added, service, trace.shape.block_tokens, l2=l2)
    line.active = replicas
    router = STRATEGIES[strategy](seed)
    replicas += added
    ttfts: list[float] = []
    assignments: list[int] = []
    n_requests = [0] * replicas
    work = [0.0] * replicas
    prefilled = [0] * replicas
    local_tokens = l2_tokens = total_tokens = 0
    for r in trace.requests:
        if scale_out and r.arrival_s >= scale_out[0]:
            line.active = replicas
        i = router.choose(line, r)
        lt, l2t = line.hit_tokens(i, r)
        service_ms = service.service_ms(r.tokens, lt, l2t)
        now_ms = r.arrival_s * 1000.0
        start = max(now_ms, line.free_at_ms[i])
        line.free_at_ms[i] = start + service_ms
        line.routed_at_s[i].append(r.arrival_s)
        ttfts.append(line.free_at_ms[i] - now_ms)
        line.local[i].store(r.blocks)
        if line.l2 is not None:
            line.l2.store(r.blocks)
        assignments.append(i)
        n_requests[i] += 1
        work[i] += service_ms
        prefilled[i] += r.tokens - lt - l2t
        local_tokens += lt
        l2_tokens += l2t
        total_tokens += r.tokens
    ttfts.sort()
    n = len(trace.requests)
    total_work = sum(work) or 1.0
    total_prefilled = sum(prefilled) or 1
    return SimResult(
        strategy=strategy, l2=l2, ttft_p50_ms=_percentile(ttfts, 0.50), ttft_p99_ms=_percentile(ttfts, 0.99),
        ttft_mean_ms=statistics.fmean(ttfts), miss_ratio=(total_tokens - local_tokens - l2_tokens) / total_tokens,
        local_hit_ratio=local_tokens / total_tokens, l2_hit_ratio=l2_tokens / total_tokens,
        request_share=tuple(c / n for c in n_requests), work_share=tuple(w / total_work for w in work),
        prefill_token_share=tuple(p / total_prefilled for p in prefilled), assignments=tuple(assignments))


def rate_for_load(trace: Trace, service: ServiceModel, *, replicas: int, load: float) -> float:
    """The arrival rate, requests/s, at which ``trace``'s prefills with nothing cached would keep
    ``replicas`` replicas busy ``load`` of the time (cold utilisation; caches lower the real one)."""
    mean_cold_ms = statistics.fmean(service.prefill_ms(r.tokens) for r in trace.requests)
    return load * replicas * 1000.0 / mean_cold_ms


def compare(trace: Trace, service: ServiceModel, *, replicas: int, strategies: Sequence[str] = tuple(STRATEGIES),
            seed: int = 0) -> list[SimResult]:
    """Every strategy in ``strategies``, with and without the L2 (in that order)."""
    return [simulate(trace, service, s, replicas=replicas, l2=l2, seed=seed)
            for s in strategies for l2 in (True, False)]


def format_results(results: Sequence[SimResult]) -> str:
    """The benchmark's table: one row per strategy and L2 setting."""
    def ms(v: float) -> str:
        return f"{v:,.0f}" if v < 1e6 else f"{v / 1000:,.0f}s"

    header = (f"{'strategy':<12} {'L2':<3} {'TTFT p50':>9} {'TTFT p99':>9} {'miss':>5} {'local':>6} {'L2 hit':>6} "
              f"{'max req':>7} {'max work':>8}  work share per replica")
    rows = [header]
    for r in results:
        rows.append(f"{r.strategy:<12} {'on' if r.l2 else 'off':<3} {ms(r.ttft_p50_ms):>9} {ms(r.ttft_p99_ms):>9} "
                    f"{r.miss_ratio:>5.0%} {r.local_hit_ratio:>6.0%} {r.l2_hit_ratio:>6.0%} "
                    f"{r.max_request_share:>7.0%} {r.max_work_share:>8.0%}  "
                    + " ".join(f"{s:.0%}" for s in r.work_share))
    rows.append("(TTFT in ms; miss/local/L2 hit: shares of prompt tokens prefilled, read locally, read from L2; "
                "max req/max work: the busiest replica's share of requests and of prefill + L2-read time)")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------------------
# What a line's config says about its routing (scripts/plan.py --business-line)


def line_routing_notes(line: "BusinessLineConfig", p: Plan) -> list[str]:
    """What the planner can tell about a line's ``routing_strategy`` from its config alone (docs/routing.md;
    ``scripts/overlap.py`` advises from a request log). Each note is one sentence; none: nothing to say.

    * ``prefixaware`` with active ``hot_prefixes``: every request that starts with a hot prefix shares its
      first 128 characters, so production-stack's trie sends them all to one replica (a hot spot).
    * ``kvaware`` on a chat endpoint: production-stack's kvaware router tokenizes only completions' ``prompt``;
      chat requests fall back (#1045, #1062); and it never sees the L2.
    * prompts (the plan's ``tokens``) below the L2 break-even with an affinity strategy: a local hit saves
      little prefill there; round robin.
    * ``gateway``: what routes the line (the HyperPod Inference Gateway, its default scorer weights) and what
      models it here (``leastwork``, :func:`simulated_strategy`).
    * one replica at most: routing changes nothing until the line scales.
    """
    notes = []
    most = line.autoscaling.max_replicas if line.autoscaling else line.replicas
    strategy = line.routing_strategy
    if strategy == "prefixaware" and line.hot_prefixes.active:
        notes.append("prefixaware with hot_prefixes: every request that starts with a hot prefix goes to the replica "
                     "that served the first one (a hot spot); roundrobin (docs/routing.md)")
    if strategy == "kvaware":
        chat = "chat" in line.invocation_endpoint
        notes.append("kvaware sees each replica's local tiers only, never the L2, and has no load term"
                     + ("; this line's chat requests are not tokenized by it and fall back" if chat else ""))
    be = p.timing.break_even_tokens
    if strategy in ("prefixaware", "kvaware", "session") and be is not None and p.inputs.tokens < be:
        notes.append(f"prompts of {p.inputs.tokens:,} tokens are below the L2 break-even (~{be:,.0f}): affinity "
                     "saves little prefill; roundrobin")
    if strategy == "gateway":
        notes.append("the HyperPod Inference Gateway routes the line (not intelligentRoutingSpec): its Endpoint Picker "
                     "scores replicas by queue, KV-cache use and prefix (weights 2, 2, 3 unless set on the line's "
                     f"scheduler entry); scripts/bench_routing.py models it as {simulated_strategy(strategy)}, the "
                     "load-dominant blend (docs/routing.md)")
    if most <= 1:
        notes.append("one replica: routing changes nothing until the line scales")
    return notes
