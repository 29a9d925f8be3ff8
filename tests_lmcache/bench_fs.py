"""Benchmark: fs:// store and retrieve throughput of the real LMCache for a 7B-shaped prompt.

Prints figures, asserts nothing (speed is measured here, not in timed tests). Each run is three
pod processes configured like the tier's tests (rag-assistant's rendered env, L2 re-pointed at
a temporary directory on this machine's disk, L1 0.25 GiB): pod A stores a 2,048-token prompt
(8 full chunks of Qwen2-7B KV, 28 layers x 4 KV heads x 128, bf16 = 57,344 B/token, 0.109 GiB)
and evicts the files from the page cache; pod B retrieves it cold (from disk); pod C retrieves
it again warm (page cache). Store time runs from ``store()`` until the last chunk file has been
renamed into place. Printed beside the reference deployment's figures (docs/sources.md §1):
read across nodes 1.84 GiB/s, node-local store 9.60 GiB/s (LMCache logs "GB" but divides by
1024**3).

Usage (in the tier's virtualenv)::

    .venv-lmcache/bin/python -m tests_lmcache.bench_fs [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests_lmcache.conftest import QWEN2_7B, Tier, export_env, make_tier

LINE = "rag-assistant"
PROMPT = [[7, 2048]]
BYTES_PER_TOKEN = 2 * QWEN2_7B["layers"] * QWEN2_7B["kv_heads"] * QWEN2_7B["head_dim"] * 2
REFERENCE_READ_GIBPS = 1.84
REFERENCE_STORE_GIBPS = 9.60


def one_run(tier: Tier) -> dict[str, float]:
    def pod(k: int, actions: list[dict]) -> list[dict]:
        return tier.run(LINE, actions, pod=k, geometry=QWEN2_7B, env=tier.pod_env(LINE, k, l1_gib="0.25")).records

    (store,) = pod(0, [{"op": "store", "prompt": PROMPT, "fsync_evict": True}])
    (cold,) = pod(1, [{"op": "retrieve", "prompt": PROMPT}])
    (warm,) = pod(2, [{"op": "retrieve", "prompt": PROMPT}])
    payload = 2048 * BYTES_PER_TOKEN
    if store["stored_files"] != 8 or cold["retrieved_tokens"] != 2048 or warm["retrieved_tokens"] != 2048:
        raise RuntimeError(f"incomplete run: {store}, {cold}, {warm}")
    return {"store": payload / store["seconds"] / 2**30, "cold": payload / cold["seconds"] / 2**30,
            "warm": payload / warm["seconds"] / 2**30}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests_lmcache.bench_fs", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lmcache-bench-") as tmp:
        doc = export_env(Path(tmp) / "env.json")
        runs = []
        for n in range(args.runs):
            base = Path(tmp) / f"run{n}"
            base.mkdir()
            runs.append(one_run(make_tier(doc, base)))
    gib = 2048 * BYTES_PER_TOKEN / 2**30

    def fmt(key: str) -> str:
        values = [r[key] for r in runs]
        return f"{statistics.median(values):6.2f} GiB/s  (runs: {', '.join(f'{v:.2f}' for v in values)})"

    print(f"fs:// L2 throughput, LMCache {doc['lmcache_version']}, {LINE}'s rendered env, Qwen2-7B-shaped KV "
          f"({QWEN2_7B['layers']} layers x {QWEN2_7B['kv_heads']} KV heads x {QWEN2_7B['head_dim']}, bf16): "
          f"2,048 tokens = 8 chunks = {gib:.3f} GiB, local disk under {tempfile.gettempdir()}, median of {args.runs}")
    print(f"  store (L1 copy, write, rename):           {fmt('store')}")
    print(f"  retrieve, cold (evicted from page cache): {fmt('cold')}")
    print(f"  retrieve, warm (page cache):              {fmt('warm')}")
    print(f"  reference, Curvine across nodes (read):   {REFERENCE_READ_GIBPS:6.2f} GiB/s; node-local store "
          f"{REFERENCE_STORE_GIBPS:.2f} GiB/s (docs/sources.md §1)")
    print(f"  ({time.perf_counter() - t0:.0f} s, {3 * args.runs} pod processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
