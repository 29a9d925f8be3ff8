"""Store and retrieve throughput of the real LMCache through the fault tier's FUSE layer, beside
the plain directory under it (printed by the tier's summary; figures, never asserted as timings).

Each side is a writer pod and a reader pod configured like the tier's (the line's rendered env,
L2 re-pointed at the side's root, L1 0.25 GiB) with a Qwen2-7B-shaped KV (28 layers x 4 KV heads
x 128, bf16 = 57,344 B/token; docs/sources.md §5): the writer stores a 2,048-token prompt (8
chunks, 0.109 GiB) and its L2 writes drain; the files are flushed and dropped from the page cache
of the disk under both sides; the reader looks the prompt up and retrieves it (the lookup's id
passed as vLLM's worker does). Store: from ``store()`` until the last write ended; retrieve: the
``retrieve()`` call. What the FUSE side adds is this machine's Python FUSE daemon (``mfusepy``
over libfuse3, one read of at most 128 KiB per request), not Curvine's.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from tests_faults.harness import LINE, FaultMount
from tests_lmcache.conftest import QWEN2_7B, make_tier
from tests_lmcache.pagecache import evict_from_page_cache

TOKENS = 2048
PAYLOAD = TOKENS * 2 * QWEN2_7B["layers"] * QWEN2_7B["kv_heads"] * QWEN2_7B["head_dim"] * 2
L1_GIB = "0.25"


def _drop_cache(directory: Path) -> None:
    for path in directory.rglob("*.data"):
        evict_from_page_cache(path)


def _side(exported: dict[str, Any], base: Path, *, fuse: bool, runs: int) -> dict[str, list[float]]:
    base.mkdir()
    tier = make_tier(exported, base)
    mount = None
    if fuse:
        backing = base / "backing"
        backing.mkdir()
        mount = FaultMount(backing, tier.root, base / "control.json", base / "faultfs.log")
    disk = mount.backing if mount else tier.root
    out: dict[str, list[float]] = {"store": [], "retrieve": []}
    pods = []
    try:
        writer = tier.serve(LINE, pod=0, geometry=QWEN2_7B, env=tier.pod_env(LINE, 0, l1_gib=L1_GIB))
        pods.append(writer)
        reader = tier.serve(LINE, pod=1, geometry=QWEN2_7B, env=tier.pod_env(LINE, 1, l1_gib=L1_GIB))
        pods.append(reader)
        for n in range(runs):
            prompt = [[7000 + n, TOKENS]]
            store = writer.act({"op": "store_drain", "prompt": prompt,
                                "files_dir": str(disk / tier.line_dir(LINE).relative_to(tier.root))})
            if store["stored_files"] != TOKENS // 256:
                raise RuntimeError(f"incomplete store: {store}")
            _drop_cache(disk)
            lookup = reader.act({"op": "lookup_rpc", "prompt": prompt})
            got = reader.act({"op": "retrieve", "prompt": prompt, "req_id": lookup["lookup_id"]})
            if got["retrieved_tokens"] != TOKENS or not all(got["chunks_identical"]):
                raise RuntimeError(f"incomplete retrieve: {got}")
            out["store"].append(PAYLOAD / store["drain_seconds"] / 2**30)
            out["retrieve"].append(PAYLOAD / got["seconds"] / 2**30)
    finally:
        for pod in pods:
            pod.stop()
        if mount:
            mount.stop()
    return out


def measure(exported: dict[str, Any], base: Path, runs: int = 3) -> dict[str, dict[str, list[float]]]:
    """GiB/s of ``runs`` store and retrieve rounds on the plain directory and through FUSE.

    Raises:
        RuntimeError: a round did not store or retrieve the whole prompt bit for bit.
    """
    return {"plain directory": _side(exported, base / "plain", fuse=False, runs=runs),
            "through FUSE (faultfs, mode ok)": _side(exported, base / "fuse", fuse=True, runs=runs)}


def report(figures: dict[str, dict[str, list[float]]]) -> str:
    lines = [f"fs:// throughput, LMCache, {LINE}'s rendered env, Qwen2-7B-shaped KV: {TOKENS:,} tokens = "
             f"{TOKENS // 256} chunks = {PAYLOAD / 2**30:.3f} GiB, files dropped from the page cache before each "
             f"retrieve; median GiB/s (runs)"]
    for side, values in figures.items():
        cells = [f"{op} {statistics.median(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})" for op, v in values.items()]
        lines.append(f"  {side:<34} " + "; ".join(cells))
    return "\n".join(lines)
