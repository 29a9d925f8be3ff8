"""L2 reads between real vLLM servers: cross-pod hits, cold against warm TTFT, identical completions,
and what a chunk lost between lookup and load does under the rendered policy and under vLLM's default.

Every prompt is new to every server (its own seed), so neither vLLM's prefix cache (L0) nor the
reader's LMCache CPU buffer (L1) can hold it: what the reader does not compute came from L2. The
reference completion of a prompt is the writer's, computed cold with 0 external hit tokens, i.e.
what a server without L2 computes (greedy, temperature 0, seed 0, float32).
"""

from __future__ import annotations

import os

import pytest

from tests_serving.conftest import REPORT
from tests_serving.workload import (CHUNK, CHUNKS, EXTERNAL_HITS, EXTERNAL_QUERIES, FULL_HIT, L0_HITS, LOOKUPS,
                                    PROMPT_TOKENS, REMOTE_READS, chunk_prompt, delta, ms, quiet_counters, store,
                                    wait_counters)

_ROWS: list[tuple[str, ...]] = []
_CORRUPT: dict[str, object] = {}


def _report() -> None:
    head = ("case", "server", "HTTP", "tokens", "identical", "external hits", "TTFT ms")
    rows = [head, *_ROWS]
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    REPORT["l2_reads"] = ("L2 reads between real vLLM servers (tiny model, CPU)",
                          "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows))


def _row(case: str, server, reply, reference, hits) -> None:
    _ROWS.append((case, server.name, str(reply.status), str(reply.tokens),
                  "-" if reference is None else str(reply.text == reference.text), str(int(hits)), ms(reply.ttft_s)))
    _report()


def test_a_prefix_one_server_computed_is_read_from_l2_by_another(rig):
    a, b = rig.a, rig.b
    text = chunk_prompt(101)
    assert len(b.tokenize(text)) == PROMPT_TOKENS
    a0 = a.counters()
    cold, files = store(a, text, rig.chunk_files)
    a1 = a.counters()
    assert delta(a1, a0, EXTERNAL_HITS) == 0  # the reference was computed without any L2 read
    _row("cold (writer computes)", a, cold, None, 0)
    b0 = quiet_counters(b)  # earlier tests' LMCache counts have reached /metrics
    warm = b.complete(text)
    b1 = wait_counters(b, b0, lambda s: delta(s, b0, REMOTE_READS) >= CHUNKS and delta(s, b0, LOOKUPS) >= 1)
    assert warm.ok and warm.text == cold.text, (warm, cold)
    # vLLM's own account: the connector served the four chunks, nothing of it from L0.
    assert delta(b1, b0, EXTERNAL_HITS) == FULL_HIT
    assert delta(b1, b0, EXTERNAL_QUERIES) >= PROMPT_TOKENS - 1
    assert delta(b1, b0, L0_HITS) == 0
    # LMCache's account: one lookup, one read per chunk file.
    assert delta(b1, b0, LOOKUPS) == 1 and delta(b1, b0, REMOTE_READS) == CHUNKS
    _row("warm (reader, from L2)", b, warm, cold, delta(b1, b0, EXTERNAL_HITS))
    # Again on the reader: now vLLM's own prefix cache (L0) serves it.
    again = b.complete(text)
    b2 = b.counters()
    assert again.text == cold.text and delta(b2, b1, L0_HITS) >= FULL_HIT
    _row("again (reader, L0)", b, again, cold, delta(b2, b1, EXTERNAL_HITS))
    print(f"TTFT cold {ms(cold.ttft_s)} ms, warm from L2 {ms(warm.ttft_s)} ms, L0 {ms(again.ttft_s)} ms; files {files}")


#: Attempts of a fault case whose lookup must reach L2. Each waits until the server's L2 gate (the
#: rendered base connector) is closed, but the gate can still open during the request (a probe
#: through the FUSE mount slowed past its bound by three servers on 2 cores); such an attempt
#: exercised nothing (0 external hit tokens) and a new prompt is tried. Printed in the table.
LOOKUP_ATTEMPTS = 3


def _attempts(rig, server, seed: int, fault, stream: bool = True):
    """(reply, reference, external hit tokens) of the first attempt whose lookup reached L2: the
    writer stores a new prompt, ``fault(files)`` breaks it, ``server`` asks for it."""
    for attempt in range(LOOKUP_ATTEMPTS):
        text = chunk_prompt(seed + 10_000 * attempt)
        cold, files = store(rig.a, text, rig.chunk_files)
        server.wait_gate_closed()
        before = server.counters()
        fault(files)
        try:
            reply = server.complete(text, stream=stream)
        finally:
            rig.mount.switch("ok")
        hits = delta(server.counters(), before, EXTERNAL_HITS)
        if hits > 0:
            return reply, cold, hits
        _row(f"(attempt {attempt + 1}: L2 skipped, the gate opened)", server, reply, cold, hits)
    lookups = [line for line in server.log().splitlines() if "LMCache hit tokens" in line or "lookup" in line.lower()]
    raise AssertionError(f"no lookup reached L2 in {LOOKUP_ATTEMPTS} attempts on {server.name}; its gate:\n"
                         f"{server.gate_log()}\nits last lookups:\n" + "\n".join(lookups[-12:]))


def _vanish_one(rig, files: list[str]) -> None:
    """The chunk files ``files`` vanish at their next open (lookup still finds them)."""
    rig.mount.switch("ok", vanish=files)


def test_a_chunk_deleted_between_lookup_and_load_is_recomputed(rig):
    """Under the rendered ``kv_load_failure_policy`` (recompute): the lookup finds all four chunks,
    the load of one fails (ENOENT at open), vLLM recomputes: 0 failed requests, identical output,
    streaming and not."""
    for case, seed, stream in (("vanished chunk, stream", 201, True), ("vanished chunk", 202, False)):
        reply, cold, hits = _attempts(rig, rig.b, seed, lambda files: _vanish_one(rig, files[1:2]), stream)
        assert reply.status == 200 and reply.ok, reply
        assert reply.text == cold.text
        # The lookup counted the chunks as hits (the file was there): the load is what failed.
        assert hits >= CHUNK
        _row(case + " (recompute)", rig.b, reply, cold, hits)


def test_a_truncated_chunk_is_recomputed(rig):
    def truncate(files: list[str]) -> None:
        path = rig.line_dir() / files[2]
        os.truncate(path, path.stat().st_size // 2)

    reply, cold, hits = _attempts(rig, rig.b, 203, truncate, stream=False)
    assert reply.ok and reply.text == cold.text, reply
    _row("truncated chunk (recompute)", rig.b, reply, cold, hits)


#: What LMCache logs when its lookup RPC to the worker times out (``zmq_transport.py``).
LOOKUP_TIMEOUT_LOG = "Timeout occurred for rank 0"


def test_vllm_default_policy_fails_such_a_request(rig):
    """The control: the same fault on a server whose ``--kv-transfer-config`` lacks
    ``kv_load_failure_policy`` (vLLM 0.29's default ``fail``): the request ends FINISHED_ERROR,
    HTTP 500 without streaming; a streaming request of the same kind ends HTTP 200 with an empty
    completion. Why the rendered args set ``recompute`` (the cases above). Also accepted for the
    streaming case: its lookup RPC timed out (``LMCACHE_LOOKUP_TIMEOUT_MS``, 2 s here) on an
    overloaded machine, so the request ran without L2 (seen on 2026-12-02 with the rendered 200 ms,
    then on every server at once, failed load or not: servers.py)."""
    c = rig.default_policy
    assert "kv_load_failure_policy" not in c.argv.args[c.argv.args.index("--kv-transfer-config") + 1]
    vanish = lambda files: _vanish_one(rig, files[1:2])  # noqa: E731
    reply, cold, hits = _attempts(rig, c, 204, vanish, stream=False)
    _row("vanished chunk, default policy", c, reply, cold, hits)
    assert reply.status == 500, reply
    mark = len(c.log())
    try:
        reply, cold, hits = _attempts(rig, c, 205, vanish, stream=True)
    except AssertionError:
        after = c.log()[mark:]
        assert LOOKUP_TIMEOUT_LOG in after, after[-3000:]
        REPORT["default_policy"] = ("vLLM's default policy after a failed load",
                                    "the streaming case's lookups timed out (an overloaded machine): not exercised")
    else:
        _row("vanished chunk, default policy, stream", c, reply, cold, hits)
        assert reply.status == 200 and reply.text == "" and reply.tokens == 0, reply
    # The server itself still serves: a healthy request succeeds.
    assert c.complete(chunk_prompt(206), max_tokens=2).ok


def test_a_corrupt_chunk_of_the_same_size_is_loaded(rig):
    """Every chunk file of a prompt replaced by another prompt's chunk of the same size: LMCache
    (no checksum in its fs:// files, ``naive`` serde) loads it as a full hit and vLLM decodes from
    the wrong KV. Compared by the log-probability of every generated token (float32): an intact
    chunk read from L2 gives the writer's values bit for bit, a swapped one other values (measured
    0.0 and 0.90 largest difference; the greedy text of the tiny random model may still agree, so
    it is not the test). Recorded here; the known limit is asserted as a strict xfail below."""
    a, b = rig.a, rig.b
    text, other = chunk_prompt(207), chunk_prompt(208)
    cold, files = store(a, text, rig.chunk_files)
    _, other_files = store(a, other, rig.chunk_files)
    # The writer's own values (its L0 holds both prompts' KV as it computed them).
    reference = a.complete(text, stream=False, logprobs=True)
    other_reference = a.complete(other, stream=False, logprobs=True)
    d = rig.line_dir()
    for mine, theirs in zip(files, other_files):
        assert (d / mine).stat().st_size == (d / theirs).stat().st_size
        (d / mine).write_bytes((d / theirs).read_bytes())
    b.wait_gate_closed()
    b0 = b.counters()
    intact = b.complete(other, stream=False, logprobs=True)
    b1 = b.counters()
    corrupt = b.complete(text, stream=False, logprobs=True)
    b2 = b.counters()
    # Both served from L2 (no error anywhere), the intact one exactly as the writer computed it.
    assert intact.ok and delta(b1, b0, EXTERNAL_HITS) == FULL_HIT
    assert intact.logprobs == other_reference.logprobs, (intact.logprobs, other_reference.logprobs)
    assert corrupt.ok and delta(b2, b1, EXTERNAL_HITS) == FULL_HIT
    _CORRUPT.update(reply=corrupt, reference=reference)
    _row("intact chunks (logprobs)", b, intact, other_reference, delta(b1, b0, EXTERNAL_HITS))
    _row("corrupt chunks, same size", b, corrupt, cold, delta(b2, b1, EXTERNAL_HITS))
    print("largest log-probability difference, corrupt against the writer's: "
          f"{max(abs(x - y) for x, y in zip(corrupt.logprobs, reference.logprobs)):.3f}")


@pytest.mark.xfail(strict=True, reason="LMCache 0.5.5 has no checksum on L2 chunks: a same-size corrupt chunk "
                                       "is loaded and decoding runs over the wrong KV (known limit)")
def test_known_limit_a_corrupt_chunk_yields_the_writers_output(rig):
    if not _CORRUPT:
        pytest.skip("test_a_corrupt_chunk_of_the_same_size_is_loaded did not run")
    assert _CORRUPT["reply"].logprobs == _CORRUPT["reference"].logprobs
