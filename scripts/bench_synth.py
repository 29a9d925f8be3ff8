#!/usr/bin/env python3
"""Synthesis cost per business line: wall time and peak memory of a full synth for 1, 10, 50 lines.

For each size, a temporary config directory gets ``config/platform.yaml`` and N business lines
generated from the examples in ``config/business-lines/`` (round-robin, renamed
``<example>-NN`` with their own namespace), then ``python app.py`` runs in a child process
with ``CDK_OUTDIR`` in a temp dir: the same code path as ``cdk synth``, cdk-nag and the
built-in CloudFormation validation included, minus the CLI's own Node start-up.

Printed JSON (one object on stdout)::

    {"environment": {...},
     "runs": [{"business_lines": 1, "stacks": 6, "wall_s": 7.1, "peak_rss_mib": 420.0,
               "peak_tree_rss_mib": 610.0, "template_kib": 512.3}, ...],
     "marginal_per_line": {"wall_s": 0.09, "peak_tree_rss_mib": 1.8}}

- ``wall_s``: wall-clock seconds of the child (start to exit).
- ``peak_rss_mib``: largest peak RSS of any single process of the run (Python or the jsii
  Node runtime), from ``os.wait4`` (the child's and its waited-for descendants' ``ru_maxrss``).
- ``peak_tree_rss_mib``: peak of the *sum* of RSS over the process tree, sampled from
  ``/proc`` every 50 ms (Linux only; ``null`` elsewhere).
- ``marginal_per_line``: least-squares slope over the sizes, i.e. what one more line costs.

Usage: ``python scripts/bench_synth.py [--sizes 1 10 50]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from platform_config.loader import default_config_dir  # noqa: E402

#: The config the runs are generated from (``make bench CONFIG=dir``): its platform and lines.
EXAMPLES = default_config_dir()
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def make_config(target: Path, lines: int) -> None:
    """Write ``platform.yaml`` and ``lines`` generated business lines under ``target``."""
    (target / "business-lines").mkdir(parents=True)
    examples = sorted((EXAMPLES / "business-lines").glob("*.yaml"))
    if not examples:
        raise SystemExit(f"no example business lines in {EXAMPLES / 'business-lines'}")
    # Each example fits the example instance groups once; N copies need N times the nodes
    # (the loader refuses lines that do not fit their groups' GPUs).
    platform = yaml.safe_load((EXAMPLES / "platform.yaml").read_text())
    copies = -(-lines // len(examples))
    for group in platform["hyperpod"]["instance_groups"]:
        group["instance_count"] *= copies
    (target / "platform.yaml").write_text(yaml.safe_dump(platform, sort_keys=False))
    for i in range(lines):
        source = examples[i % len(examples)]
        data = yaml.safe_load(source.read_text())
        name = f"{source.stem}-{i:02d}"
        data.pop("name", None)
        data["namespace"] = name
        (target / "business-lines" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _tree_rss_kib(root: int) -> int:
    """Sum of RSS (KiB) of ``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * PAGE_KIB  # field 24 of stat: resident pages
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def run_once(config_dir: Path, outdir: Path) -> dict:
    env = {
        **os.environ,
        "KVCACHE_CONFIG_DIR": str(config_dir),
        "CDK_OUTDIR": str(outdir),
    }
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "app.py"], cwd=REPO_ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_tree = 0
    sampling = os.path.isdir("/proc")
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        while not stop.is_set():
            peak_tree = max(peak_tree, _tree_rss_kib(child.pid))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True) if sampling else None
    if sampler:
        sampler.start()
    stderr = child.stderr.read() if child.stderr else b""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    stop.set()
    if sampler:
        sampler.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"synth failed (exit {child.returncode}):\n{stderr.decode(errors='replace')[-4000:]}")
    templates = list(outdir.glob("*.template.json"))
    return {
        "stacks": len(templates),
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        "peak_tree_rss_mib": round(peak_tree / 1024, 1) if sampling else None,
        "template_kib": round(sum(p.stat().st_size for p in templates) / 1024, 1),
    }


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 50], help="business-line counts")
    args = parser.parse_args(argv)

    load_at_start = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    runs = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix=f"bench-{size}-") as tmp:
            config_dir, outdir = Path(tmp) / "config", Path(tmp) / "cdk.out"
            make_config(config_dir, size)
            outdir.mkdir()
            runs.append({"business_lines": size, **run_once(config_dir, outdir)})
    sizes = [r["business_lines"] for r in runs]
    result = {
        "environment": {
            "python": host.python_version(),
            "aws_cdk_lib": _dist_version("aws-cdk-lib"),
            "cdk_nag": _dist_version("cdk-nag"),
            "node": _node_version(),
            "cpus": os.cpu_count(),
            "load_avg_1m_at_start": load_at_start,
            "machine": host.machine(),
        },
        "runs": runs,
        "marginal_per_line": {
            "wall_s": round(slope(sizes, [r["wall_s"] for r in runs]), 3),
            "peak_tree_rss_mib": (round(slope(sizes, [r["peak_tree_rss_mib"] for r in runs]), 2)
                                  if all(r["peak_tree_rss_mib"] is not None for r in runs) else None),
        } if len(runs) > 1 else None,
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _node_version() -> str | None:
    try:
        return subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
