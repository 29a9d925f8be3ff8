"""A real router in front of the line's real vLLM replicas sharing one L2 (issue 29; docs/routing.md).

PyPI's ``vllm-router`` (:mod:`tests_serving.routers`: its policies against the CRD's strategies) routes
prompts that all start with one shared prefix of three chunks (a system prompt) followed by a question
of their own, over servers ``a`` and ``b`` and, once scaled out, ``c`` (admitted Pod 3, started for
this module). vLLM's counters on each replica say where every prompt token came from: computed
(prefill), its own prefix cache (L0) or the KV connector (L1/L2).

What the shared L2 promises whatever the router does, each a test:

* **hot spot**: ``cache_aware`` (``prefixaware``) sends every request to one replica, which the
  hot-spot alert's rule flags; ``round_robin`` splits them evenly; in both the shared prefix is
  computed once in the whole line;
* **scale-out**: a replica that joins computes none of a prefix the line already holds: its first
  request reads it from L2;
* **router restart**: the restarted router knows nothing, and no prefix is computed again;
* **replica failure**: a prompt only the failed replica ever computed is read from L2 by the
  survivors, their completion the failed replica's.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests_serving.conftest import REPORT
from tests_serving.routers import POLICY_OF_STRATEGY, Served, hot_spots, read, served, shares, start_router
from tests_serving.servers import Server, wait_for, wait_ready
from tests_serving.tiny_model import prompt
from tests_serving.workload import (CHUNK, FULL_HIT, L2_WRITE_TIMEOUT_S, PROMPT_TOKENS, chunk_hashes_of,
                                    chunk_prompt, store)
from cluster_agents import hot_prefixes

#: The prefix every request of the line shares (a system prompt): three whole chunks, <s> included.
SHARED_CHUNKS = 3
SHARED_TOKENS = SHARED_CHUNKS * CHUNK
#: The tokens after it (a question of its own): one chunk and a tail, so a prompt is PROMPT_TOKENS.
OWN_TOKENS = PROMPT_TOKENS - SHARED_TOKENS
#: Requests per measured batch.
BATCH = 8
#: The admitted Pod the added replica ``c`` is started from (0-2 are the rig's servers).
POD_OF_C = 3

_ROWS: list[tuple[str, ...]] = []


def _report(case: str, policy: str, by: dict[str, Served], failed: int = 0) -> None:
    share = shares(by)
    _ROWS.append((case, policy, " ".join(f"{name}:{s.requests}" for name, s in by.items()),
                  " ".join(f"{name}:{share[name]:.0%}" for name in by),
                  str(sum(s.computed for s in by.values())), str(sum(s.external_hits for s in by.values())),
                  str(sum(s.l0_hits for s in by.values())), str(failed)))
    head = ("case", "vllm-router policy", "requests per replica", "prompt-token share", "computed",
            "from L1/L2", "from L0", "failed")
    rows = [head, *_ROWS]
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    REPORT["routing"] = ("A real router (PyPI vllm-router) over the line's replicas sharing one L2 (prompt tokens)",
                         "\n".join("  ".join(col.ljust(w) for col, w in zip(r, widths)) for r in rows))


def shared_prefix(seed: int) -> str:
    """A prefix of :data:`SHARED_TOKENS` tokens (<s> + words) no other seed shares a chunk with."""
    return prompt(seed, SHARED_TOKENS - 1)


def prompts(prefix: str, first_question: int, n: int) -> list[str]:
    """``n`` prompts of :data:`PROMPT_TOKENS` tokens: ``prefix``, then a question of each one's own."""
    return [f"{prefix} {prompt(first_question + k, OWN_TOKENS)}" for k in range(n)]


def wait_prefix_in_l2(rig, server: Server, prefix: str) -> None:
    """Until the chunk files of ``prefix`` are in the line's L2 directory (LMCache saves after the
    forward pass, so the next request on another replica would otherwise race the write)."""
    wanted = set(chunk_hashes_of(server, prefix))
    assert len(wanted) == SHARED_CHUNKS, wanted

    def stored() -> bool:
        return wanted <= {p[2] for name in rig.chunk_files() if (p := hot_prefixes.parse_chunk_name(name))}

    wait_for(stored, L2_WRITE_TIMEOUT_S, f"the {SHARED_CHUNKS} chunk files of a shared prefix")


def gates_closed(*replicas: Server) -> dict[str, float]:
    """Every replica's L2 gate closed (it looks up and saves); returns each one's count of opens."""
    return {server.name: server.wait_gate_closed() for server in replicas}


def explain(by: dict[str, Served], opens: dict[str, float], *replicas: Server) -> str:
    """Where the prompt tokens came from, and the gates that opened during the batch (an open gate
    skips the L2: a prefix is then computed again, by design)."""
    reopened = [r for r in replicas if (state := r.gate_state()) is not None and state[1] > opens[r.name]]
    return (f"{by}" + "".join(f"\nthe L2 gate of {r.name} opened during the batch:\n{r.gate_log()}" for r in reopened))


@pytest.fixture(scope="module", autouse=True)
def replica_c(rig):
    """Server ``c``, started when the module starts, so it starts while the first tests run (a vLLM
    start takes a minute or more here); ready when a test waits for it."""
    return rig.launch("c", POD_OF_C, 1)


@pytest.mark.parametrize("strategy", ["prefixaware", "roundrobin"])
def test_a_prefix_every_request_shares(rig, strategy):
    a, b = rig.a, rig.b
    opens = gates_closed(a, b)
    seed = 5000 + 100 * ["prefixaware", "roundrobin"].index(strategy)
    prefix = shared_prefix(seed)
    batch = prompts(prefix, seed + 1, BATCH)
    router = start_router(POLICY_OF_STRATEGY[strategy], [a, b], rig.work, f"hot-spot-{strategy}")
    try:
        before = read([a, b])
        replies = [router.complete(batch[0])]
        wait_prefix_in_l2(rig, a, prefix)
        replies += [router.complete(text) for text in batch[1:]]
        by = served([a, b], before)
    finally:
        router.stop()
    _report(f"one shared prefix, {BATCH} requests", router.policy, by)
    assert all(r.ok for r in replies), replies
    assert sum(s.requests for s in by.values()) == BATCH, by
    # The shared prefix is computed once in the whole line, wherever the requests went.
    assert sum(s.computed for s in by.values()) == SHARED_TOKENS + BATCH * OWN_TOKENS, explain(by, opens, a, b)
    hot = hot_spots(by, rig.exported["hot_spot_factor"])
    if strategy == "prefixaware":
        # Affinity to the replica that served the first request; the alert's rule flags it.
        assert len(hot) == 1 and by[hot[0]].requests == BATCH, by
    else:
        assert not hot and all(s.requests == BATCH // 2 for s in by.values()), by
        # The replica that did not serve the first request read the prefix from L2 once, then from L0.
        assert sorted(s.external_hits for s in by.values()) == [0, SHARED_TOKENS], by


@pytest.mark.parametrize("strategy", ["roundrobin", "prefixaware"])
def test_a_replica_added_by_a_scale_out_computes_no_known_prefix(rig, replica_c, strategy):
    a, b, c = rig.a, rig.b, replica_c
    seed = 6000 + 100 * ["roundrobin", "prefixaware"].index(strategy)
    prefix = shared_prefix(seed)
    router = start_router(POLICY_OF_STRATEGY[strategy], [a, b], rig.work, f"scale-out-{strategy}")
    try:
        gates_closed(a, b)
        warm = [router.complete(text) for text in prompts(prefix, seed + 1, 2)]
        wait_prefix_in_l2(rig, a, prefix)
        wait_ready([c])
        opens = gates_closed(a, b, c)
        router.add_worker(c)
        assert c.url in router.workers()
        before = read([a, b, c])
        replies = [router.complete(text) for text in prompts(prefix, seed + 10, BATCH)]
        by = served([a, b, c], before)
    finally:
        router.stop()
    _report(f"scale-out 2 -> 3, {BATCH} requests", router.policy, by)
    assert all(r.ok for r in warm + replies), warm + replies
    # Nobody computes the known prefix again, the new replica included.
    assert sum(s.computed for s in by.values()) == BATCH * OWN_TOKENS, explain(by, opens, a, b, c)
    if strategy == "roundrobin":
        # Its share at once, the first request's prefix read from L2.
        assert by["c"].requests >= BATCH // 3 and by["c"].external_hits == SHARED_TOKENS, by
    # cache_aware (vllm-router 0.1.17) rebuilds its tree when a worker is added, so the batch may go
    # anywhere (measured: to the new replica); what it computed is asserted above, where it went printed.


def test_a_router_restart_costs_no_prefill(rig):
    a, b = rig.a, rig.b
    prefix = shared_prefix(7000)
    router = start_router(POLICY_OF_STRATEGY["prefixaware"], [a, b], rig.work, "restart")
    port = router.port
    try:
        gates_closed(a, b)
        warm = [router.complete(text) for text in prompts(prefix, 7001, 3)]
        wait_prefix_in_l2(rig, a, prefix)
    finally:
        router.stop()
    router = start_router(POLICY_OF_STRATEGY["prefixaware"], [a, b], rig.work, "restart", port=port)
    try:
        opens = gates_closed(a, b)
        before = read([a, b])
        replies = [router.complete(text) for text in prompts(prefix, 7010, BATCH)]
        by = served([a, b], before)
    finally:
        router.stop()
    _report(f"after a router restart, {BATCH} requests", router.policy, by)
    assert all(r.ok for r in warm + replies), warm + replies
    assert sum(s.computed for s in by.values()) == BATCH * OWN_TOKENS, explain(by, opens, a, b)


def test_a_failed_replica_loses_no_prefill(rig, replica_c):
    a, b, c = rig.a, rig.b, replica_c
    wait_ready([c])
    text = chunk_prompt(8000)
    cold, _ = store(c, text, rig.chunk_files)  # only c ever computed it
    router = start_router(POLICY_OF_STRATEGY["roundrobin"], [a, b, c], rig.work, "replica-failure")
    try:
        os.killpg(c.proc.pid, signal.SIGKILL)  # the replica's pod dies
        c.proc.wait(timeout=30)
        opens = gates_closed(a, b)
        before = read([a, b])
        replies = [router.complete(text) for _ in range(BATCH)]
        by = served([a, b], before)
        sent_to_dead = router.failed_sends(c.url)
    finally:
        router.stop()
    failed = [r for r in replies if not r.ok]
    _report(f"c killed, its prompt {BATCH} times ({sent_to_dead} sent to c, retried)", router.policy, by,
            failed=len(failed))
    assert sent_to_dead >= 1, "the router never tried the dead replica: the failure was not exercised"
    ok = [r for r in replies if r.ok]
    assert ok and all(r.text == cold.text for r in ok), (cold, replies)
    assert sum(s.requests for s in by.values()) == len(ok), by
    # The survivors computed only the tail after the prompt's whole chunks: the rest came from L2
    # (each survivor's first read) or L0.
    assert sum(s.computed for s in by.values()) == len(ok) * (PROMPT_TOKENS - FULL_HIT), explain(by, opens, a, b)
    # vllm-router retries a failed send on another worker (3 retries by default), so no client saw the
    # failure (measured: 3 sends to c, 0 failed replies); the operator's router is not known to.
    print(f"replies failed after c died: {len(failed)} of {BATCH}: {[(r.status, r.body[:200]) for r in failed]}")
