"""The janitor's evictions against real vLLM servers reading the same L2 (issue 24 item 2).

LMCache opens a chunk file after its lookup found it, so a file deleted in between fails the load
(a failed get; ``test_l2_reads.py`` shows what that costs). The janitor therefore retires an evicted
chunk first (the directory's retiring list, ``cluster_agents/l2_janitor.py``) and deletes its files
only ``retire_grace_s`` later, and every replica's connector (``vllm_plugins/l2_gate.py``, the
rendered ``GatedLMCacheConnectorV1``) shortens a hit to the chunks before the first retiring one.
Here, with the rendered connector and the real janitor:

* a retired chunk whose file vanishes at its next open is never opened: the reader loads the chunks
  before it, computes the rest, 0 failed loads, the writer's completion;
* a real janitor pass under read load (the reader reading prompts while the pass retires the oldest
  chunks, then the pass after the grace deleting them): 0 failed loads, every completion the
  writer's; how many reads were shortened is printed.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from cluster_agents import l2_janitor
from tests_serving.conftest import REPORT
from tests_serving.servers import LINE, Server
from tests_serving.workload import CHUNK, CHUNKS, EXTERNAL_HITS, chunk_prompt, delta, store

#: The connector's gauge of the retiring list it holds (vllm_plugins/l2_gate.py ``_Metrics``).
RETIRING_GAUGE = "kvcache_l2_retiring_chunks"
CAPPED_LOOKUPS = "kvcache_l2_retiring_capped_lookups_total"
#: How long a replica may take to see a new retiring list: its 1 s poll, plus a loaded machine.
SEE_LIST_TIMEOUT_S = 30.0
#: The grace of the measured janitor (seconds): longer than the connector's poll (1 s) and the
#: FUSE mount's attribute cache; the rendered one is 60 s (a pass every 10 min deletes them).
TEST_RETIRE_GRACE_S = 4.0
#: Prompts the writer stores for the measurement; the pass retires the oldest half of them.
PROMPTS = 6


def failed_loads(server: Server) -> int:
    """Loads from L2 that failed after a hit, as LMCache logs each (``vllm_v1_adapter``: "failed to
    load N tokens"): the counter LMCache's health monitor trips on has no multiprocess series."""
    return sum("failed to load" in line for line in server.log().splitlines())


def wait_list_seen(server: Server, entries: int) -> None:
    deadline = time.monotonic() + SEE_LIST_TIMEOUT_S
    while server.counters().get(RETIRING_GAUGE, -1) != entries:
        if time.monotonic() > deadline:
            raise AssertionError(f"{server.name} did not see a retiring list of {entries} chunks in "
                                 f"{SEE_LIST_TIMEOUT_S} s:\n" + "\n".join(
                                     line for line in server.log().splitlines() if "L2RETIRING" in line)[-2000:])
        time.sleep(0.2)


@pytest.fixture
def retiring(rig):
    """The line directory's retiring list, emptied (and the mount healthy) after the test."""
    yield rig.line_dir()
    l2_janitor.write_retiring(rig.line_dir(), {})
    rig.mount.switch("ok")
    wait_list_seen(rig.b, 0)


def test_a_retired_chunk_is_a_lookup_miss_and_its_file_never_opened(rig, retiring):
    a, b = rig.a, rig.b
    text = chunk_prompt(3001)
    cold, files = store(a, text, rig.chunk_files)
    retired = files[1]  # the second chunk: the reader may load the first only
    l2_janitor.write_retiring(retiring, {l2_janitor.chunk_hash_of(retired): time.time()})
    rig.mount.switch("ok", vanish=[retired])  # its deletion, racing any load of it
    wait_list_seen(b, 1)
    b.wait_gate_closed()
    b0, failed0 = b.counters(), failed_loads(b)
    reply = b.complete(text)
    b1 = b.counters()
    assert reply.ok and reply.text == cold.text, (reply, cold)
    assert delta(b1, b0, EXTERNAL_HITS) == CHUNK  # chunk 0 from L2; 1-3 computed
    assert delta(b1, b0, CAPPED_LOOKUPS) == 1
    assert failed_loads(b) == failed0, "a retired chunk's file was opened"


def test_a_janitor_pass_under_read_load_fails_no_read(rig, retiring):
    a, b = rig.a, rig.b
    texts = [chunk_prompt(3100 + k) for k in range(PROMPTS)]
    refs = [store(a, text, rig.chunk_files)[0] for text in texts]
    # A janitor whose watermarks keep only the newest half of the prompts: everything older
    # (earlier tests' chunks and the first half) is evicted, oldest first.
    line_dir: Path = retiring
    sizes = sorted(((p.stat().st_mtime, p.stat().st_size) for p in line_dir.glob("*.data")), reverse=True)
    keep = sum(size for _, size in sizes[:PROMPTS // 2 * CHUNKS])
    rendered = rig.exported["lines"][LINE]["janitor_config"]
    capacity = math.ceil(keep / rendered["low_watermark"])
    config = l2_janitor.config_from_dict({**rendered, "mount_path": str(rig.mount.mount), "capacity_bytes": capacity,
                                          "min_delete_age_s": 0, "retire_grace_s": TEST_RETIRE_GRACE_S})
    b.wait_gate_closed()
    b0, failed0 = b.counters(), failed_loads(b)
    replies: list = []
    reader = threading.Thread(target=lambda: replies.extend(b.complete(t) for t in texts))
    reader.start()
    t0 = time.time()
    retired = l2_janitor.run(config, rig.mount.mount, list_pods=None, now=t0)
    time.sleep(TEST_RETIRE_GRACE_S)
    deleted = l2_janitor.run(config, rig.mount.mount, list_pods=None, now=t0 + TEST_RETIRE_GRACE_S)
    reader.join(timeout=300)
    b1 = b.counters()
    assert retired.evicted_chunks_deleted >= PROMPTS // 2 * CHUNKS and not retired.errors, retired
    assert deleted.retired_files_deleted == retired.evicted_chunks_deleted and not deleted.errors, deleted
    assert len(replies) == PROMPTS and all(r.ok for r in replies), replies
    assert [r.text for r in replies] == [r.text for r in refs]
    assert failed_loads(b) == failed0, "a read failed: a chunk file went between a lookup and its load"
    capped, hits = delta(b1, b0, CAPPED_LOOKUPS), delta(b1, b0, EXTERNAL_HITS)
    REPORT["evictions"] = (
        "A janitor pass under read load (reader b, the rendered connector)",
        f"{PROMPTS} prompts read while the pass retired {retired.evicted_chunks_deleted} chunk files and the pass "
        f"{TEST_RETIRE_GRACE_S:.0f} s later deleted {deleted.retired_files_deleted}: 0 failed loads, "
        f"{int(capped)} lookups shortened before a retiring chunk, {int(hits)} tokens loaded from L2")
