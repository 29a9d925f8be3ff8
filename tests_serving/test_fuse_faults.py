"""Every fault of the fault tier (:data:`tests_faults.harness.FAULTS`) on the L2 FUSE mount under the
running vLLM servers: 0 failed requests and the same completions as healthy.

Per fault, the same steps (and once with the mount healthy, the baseline of the table):

1. healthy mount: the writer ``a`` computes :data:`READS` new prompts and stores their chunks (the
   reference completions, computed with no L2 read);
2. the mount is switched to the fault (:mod:`tests_faults.faultfs`: ``hang`` waits the rendered
   Curvine operation bound, ``exported["fuse_master_op_bound_ms"]``, then EIO; ``slow_read`` waits
   :data:`tests_faults.harness.SLOW_READ_MS` per read, beyond LMCache's blocking timeout);
3. the reader ``b`` asks for those prompts (a lookup and a load from the failing L2 each), and
   computes a new prompt whose L2 writes meet the fault;
4. the mount is healthy again; the writer computes the reader's new prompt (reference), and one more
   prompt is stored by ``a`` and read by ``b``: the full cross-pod hit is back.

Printed (terminal summary): fault | ok / failed requests | identical | TTFT p50 / p99 | decode tokens/s
against healthy | external hit tokens of the reads | recovered.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import pytest

from tests_faults.harness import FAULTS, SLOW_READ_MS
from tests_serving.conftest import REPORT
from tests_serving.servers import Reply
from tests_serving.workload import (CHUNKS, EXTERNAL_HITS, FULL_HIT, chunk_prompt, delta, ms, percentile, store)

#: Prompts read from L2 by the reader per fault (the p50 / p99 of the table: of 3, p99 is the largest).
READS = 3
#: The healthy baseline, then every fault; hang last (the longest: each hung operation waits the
#: rendered Curvine bound).
MODES = ("healthy", *[f for f in FAULTS if f != "hang"], "hang")
#: Recovery: new prompts tried until one is a full cross-pod hit again (printed: how long it took).
RECOVERY_ATTEMPTS = 10


@dataclass
class FaultRun:
    """What one mode did."""

    mode: str
    replies: list[Reply] = field(default_factory=list)
    identical: list[bool] = field(default_factory=list)
    read_hits: list[float] = field(default_factory=list)
    recovered_hits: float | None = None
    recovery_s: float | None = None

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.replies)

    def decode_tps(self) -> float | None:
        values = [r.decode_tokens_per_s for r in self.replies[:READS] if r.decode_tokens_per_s]
        return statistics.median(values) if values else None


_RUNS: dict[str, FaultRun] = {}


def _table() -> str:
    healthy = _RUNS.get("healthy")
    base_tps = healthy.decode_tps() if healthy else None
    head = ("fault", "ok / failed", "identical", "TTFT p50 ms", "TTFT p99 ms", "decode tok/s", "vs healthy",
            "L2 hit tokens (reads)", "recovered (s)")
    rows = [head]
    for mode in MODES:
        run = _RUNS.get(mode)
        if run is None:
            continue
        ttfts = [r.ttft_s for r in run.replies[:READS]]
        tps = run.decode_tps()
        rows.append((mode, f"{len(run.replies) - run.failed} / {run.failed}",
                     f"{sum(run.identical)}/{len(run.identical)}", ms(percentile(ttfts, 50)), ms(percentile(ttfts, 99)),
                     "-" if tps is None else f"{tps:.1f}",
                     "-" if tps is None or not base_tps else f"{tps / base_tps:.2f}x",
                     " ".join(str(int(h)) for h in run.read_hits),
                     "-" if run.recovered_hits is None
                     else f"{run.recovered_hits == FULL_HIT} ({run.recovery_s:.1f})"))
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def _switch(rig, mode: str) -> None:
    if mode == "healthy":
        rig.mount.switch("ok")
    elif mode == "hang":
        rig.mount.switch("hang", hang_ms=int(rig.exported["fuse_master_op_bound_ms"]))
    elif mode == "slow_read":
        rig.mount.switch("slow_read", read_delay_ms=SLOW_READ_MS)
    else:
        rig.mount.switch(mode)


@pytest.mark.parametrize("mode", MODES)
def test_fault_under_running_servers(rig, mode):
    a, b = rig.a, rig.b
    run = _RUNS[mode] = FaultRun(mode)
    seed = 1000 + 100 * MODES.index(mode)
    refs = [store(a, chunk_prompt(seed + k), rig.chunk_files)[0] for k in range(READS)]
    _switch(rig, mode)
    try:
        for k, ref in enumerate(refs):
            b0 = b.counters()
            reply = b.complete(chunk_prompt(seed + k))
            run.replies.append(reply)
            run.identical.append(reply.text == ref.text)
            run.read_hits.append(delta(b.counters(), b0, EXTERNAL_HITS))
        written = b.complete(chunk_prompt(seed + 50))  # its L2 writes meet the fault
        run.replies.append(written)
    finally:
        rig.mount.switch("ok")
    reference = a.complete(chunk_prompt(seed + 50))
    run.identical.append(written.text == reference.text)
    # Recovery: a new prompt stored by the writer is a full hit on the reader again. The L2 gate
    # (the rendered connector) closes only after healthy probes for its hold, and while open it
    # neither saves nor looks up: store() waits for the writer's, and here the reader's is awaited.
    t0 = time.monotonic()
    for attempt in range(RECOVERY_ATTEMPTS):
        text = chunk_prompt(seed + 60 + attempt)
        store(a, text, rig.chunk_files)
        b.wait_gate_closed()
        b0 = b.counters()
        assert b.complete(text).ok
        run.recovered_hits = delta(b.counters(), b0, EXTERNAL_HITS)
        if run.recovered_hits == FULL_HIT:
            break
    run.recovery_s = time.monotonic() - t0
    REPORT["faults"] = ("L2 faults under running vLLM servers (reader b; FUSE mount switched while in use)", _table())
    assert run.failed == 0, [r for r in run.replies if not r.ok]
    assert all(run.identical), run.identical
    assert run.recovered_hits == FULL_HIT
    if mode == "healthy":
        assert run.read_hits == [FULL_HIT] * READS
    print(f"{mode}: TTFT ms {[ms(r.ttft_s) for r in run.replies]}, L2 hits {run.read_hits}, chunks {CHUNKS}")
