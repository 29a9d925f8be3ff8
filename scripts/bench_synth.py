#!/usr/bin/env python3
"""Synthesis cost, side by side with a bare CDK app: wall time and peak memory of a full synth of
the config directory and of 1, 10 and 50 generated business lines (``make bench``).

Each synth is ``python app.py`` in a child process with ``KVCACHE_CONFIG_DIR`` and ``CDK_OUTDIR`` in
a temporary directory: the code path of ``cdk synth``, cdk-nag and CloudFormation validation
included, minus the CLI's own Node start-up. The yardstick is a **bare one-stack CDK app** (one
``Stack`` with one SNS topic, ``cdk.App()`` with no feature flags of ours, ``app.synth()``) in the
same virtualenv. Each measurement runs the synth and the bare app in turn, A B A B ..., after one
warm-up of each, and the ratio is taken pair by pair, so a machine whose speed drifts (shared
cores) moves both sides of a pair alike; the figures are medians. Both run with Python's bytecode
cache on (in a temporary ``PYTHONPYCACHEPREFIX``, even where ``PYTHONDONTWRITEBYTECODE`` is set), as
a user's second ``make synth`` does.

Configs: the config directory (``--config``, else ``$KVCACHE_CONFIG_DIR``, else ``config/``: what
``make synth`` reads), and for each ``--sizes`` N a directory with its ``platform.yaml`` (instance
counts scaled to fit) and N lines generated from its examples (round-robin, renamed
``<example>-NN``, each with its own namespace).

Printed JSON (one object on stdout)::

    {"environment": {...},
     "bare": {"wall_s": 2.4, "peak_rss_mib": 435.0},
     "runs": [{"config": "config", "business_lines": 2, "stacks": 8, "wall_s": 4.6, "ratio_to_bare": 1.9,
               "wall_s_each": [...], "peak_rss_mib": 580.0, "peak_tree_rss_mib": 800.0, "template_kib": 300.1},
              {"config": "generated", "business_lines": 1, ...}, ...],
     "marginal_per_line": {"wall_s": 0.09, "peak_tree_rss_mib": 1.8}}

- ``wall_s``: median wall-clock seconds of the child (start to exit); ``wall_s_each`` every run.
- ``ratio_to_bare``: median over the pairs of (this synth's wall) / (the bare app's wall next to it).
- ``peak_rss_mib``: largest peak RSS of any single process of a run (Python or the jsii Node
  runtime), from ``os.wait4`` (the child's and its waited-for descendants' ``ru_maxrss``); the
  largest over the runs.
- ``peak_tree_rss_mib``: peak of the *sum* of RSS over the process tree, sampled from ``/proc``
  every 50 ms (Linux only; ``null`` elsewhere).
- ``marginal_per_line``: least-squares slope over the generated sizes: what one more line costs.

Usage: ``python scripts/bench_synth.py [--config DIR] [--sizes 1 10 50] [--runs 3]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host
import shutil
import statistics
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

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4
#: The yardstick: the smallest CDK app that synthesizes a template (issue 18: within 2x of it).
BARE_APP = '''import aws_cdk as cdk
from aws_cdk import aws_sns as sns

app = cdk.App()
stack = cdk.Stack(app, "Bare", env=cdk.Environment(account="111122223333", region="us-west-2"))
sns.Topic(stack, "Topic")
app.synth()
'''


def make_config(target: Path, lines: int, examples: Path | None = None) -> None:
    """Write ``platform.yaml`` and ``lines`` generated business lines under ``target``, from the
    platform and the lines of ``examples`` (default: the config directory in use)."""
    examples = examples or default_config_dir()
    (target / "business-lines").mkdir(parents=True)
    sources = sorted((examples / "business-lines").glob("*.yaml"))
    if not sources:
        raise SystemExit(f"no example business lines in {examples / 'business-lines'}")
    # Each example fits the example instance groups once; N copies need N times the nodes
    # (the loader refuses lines that do not fit their groups' GPUs).
    platform = yaml.safe_load((examples / "platform.yaml").read_text())
    copies = -(-lines // len(sources))
    for group in platform["hyperpod"]["instance_groups"]:
        group["instance_count"] *= copies
    (target / "platform.yaml").write_text(yaml.safe_dump(platform, sort_keys=False))
    # The files the example lines name beside them (hot_prefixes), so every copy finds them.
    for extra in sorted((examples / "business-lines").iterdir()):
        if extra.suffix not in (".yaml", ".yml") and not extra.name.startswith("."):
            if extra.is_dir():
                shutil.copytree(extra, target / "business-lines" / extra.name)
            else:
                shutil.copy2(extra, target / "business-lines" / extra.name)
    for i in range(lines):
        source = sources[i % len(sources)]
        data = yaml.safe_load(source.read_text())
        name = f"{source.stem}-{i:02d}"
        data.pop("name", None)
        data["namespace"] = name
        # Fixed at the floor: N copies of an autoscaling line at their maximum need more than N
        # times the nodes (each line adds its own pods to every node's budget).
        scaling = data.pop("autoscaling", None)
        if scaling:
            data["replicas"] = scaling.get("min_replicas", 1)
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


def run_once(command: list[str], env: dict[str, str], outdir: Path) -> dict:
    """One child run: wall seconds, peak RSS of its largest process and of its process tree, and
    what it wrote (stacks, template KiB). Raises SystemExit when the child fails."""
    outdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    child = subprocess.Popen(command, cwd=REPO_ROOT, env={**env, "CDK_OUTDIR": str(outdir)},
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
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr.decode(errors='replace')[-4000:]}")
    templates = list(outdir.glob("*.template.json"))
    return {
        "stacks": len(templates),
        "wall_s": wall,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux reports KiB
        "peak_tree_rss_mib": peak_tree / 1024 if sampling else None,
        "template_kib": sum(p.stat().st_size for p in templates) / 1024,
    }


def child_env(pycache: Path) -> dict[str, str]:
    """The children's environment: this one, with Python's bytecode cache on and kept in ``pycache``
    (a user's second ``make synth`` reads the bytecode its first wrote; an environment with
    ``PYTHONDONTWRITEBYTECODE`` set would compile every module of the project on every run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def side_by_side(config_dir: Path, bare_app: Path, work: Path, runs: int) -> tuple[dict, list[dict]]:
    """``runs`` pairs (synth of ``config_dir``, bare app), after one warm-up of each: the synth's
    figures, and the bare app's runs."""
    env = child_env(work.parent / "pycache")
    synth, bare = [sys.executable, "app.py"], [sys.executable, str(bare_app)]
    ours, theirs = [], []
    for i in range(runs + 1):  # run 0 warms both up (Python bytecode, jsii's package cache)
        a = run_once(synth, {**env, "KVCACHE_CONFIG_DIR": str(config_dir)}, work / f"synth-{i}")
        b = run_once(bare, env, work / f"bare-{i}")
        if i:
            ours.append(a)
            theirs.append(b)
    trees = [r["peak_tree_rss_mib"] for r in ours]
    return {
        "stacks": ours[-1]["stacks"],
        "wall_s": round(statistics.median(r["wall_s"] for r in ours), 2),
        "ratio_to_bare": round(statistics.median(a["wall_s"] / b["wall_s"] for a, b in zip(ours, theirs)), 2),
        "wall_s_each": [round(r["wall_s"], 2) for r in ours],
        "peak_rss_mib": round(max(r["peak_rss_mib"] for r in ours), 1),
        "peak_tree_rss_mib": round(max(trees), 1) if None not in trees else None,
        "template_kib": round(ours[-1]["template_kib"], 1),
    }, theirs


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--config", type=Path, help="config directory (default: $KVCACHE_CONFIG_DIR, else config/)")
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 10, 50],
                        help="business-line counts to generate (none: only the config directory)")
    parser.add_argument("--runs", type=int, default=3, help="measured pairs per config, after one warm-up")
    args = parser.parse_args(argv)
    config_dir = (args.config or default_config_dir()).resolve()

    load_at_start = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    runs: list[dict] = []
    bare_runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        bare_app = work / "bare_app.py"
        bare_app.write_text(BARE_APP)
        figures, bare = side_by_side(config_dir, bare_app, work / "config", args.runs)
        lines = len(list((config_dir / "business-lines").glob("*.y*ml")))
        runs.append({"config": str(args.config or default_config_dir()), "business_lines": lines, **figures})
        bare_runs += bare
        for size in args.sizes:
            generated = work / f"lines-{size}"
            make_config(generated, size, config_dir)
            figures, bare = side_by_side(generated, bare_app, work / f"out-{size}", args.runs)
            runs.append({"config": "generated", "business_lines": size, **figures})
            bare_runs += bare
    generated_runs = [r for r in runs if r["config"] == "generated"]
    sizes = [r["business_lines"] for r in generated_runs]
    result = {
        "environment": {
            "python": host.python_version(),
            "aws_cdk_lib": _dist_version("aws-cdk-lib"),
            "cdk_nag": _dist_version("cdk-nag"),
            "node": _node_version(),
            "cpus": os.cpu_count(),
            "load_avg_1m_at_start": load_at_start,
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "machine": host.machine(),
            "runs_per_config": args.runs,
        },
        "bare": {"wall_s": round(statistics.median(r["wall_s"] for r in bare_runs), 2),
                 "peak_rss_mib": round(max(r["peak_rss_mib"] for r in bare_runs), 1)},
        "runs": runs,
        "marginal_per_line": {
            "wall_s": round(slope(sizes, [r["wall_s"] for r in generated_runs]), 3),
            "peak_tree_rss_mib": (round(slope(sizes, [r["peak_tree_rss_mib"] for r in generated_runs]), 2)
                                  if all(r["peak_tree_rss_mib"] is not None for r in generated_runs) else None),
        } if len(generated_runs) > 1 else None,
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
