"""The fault tier's rig and its sequence per fault: real LMCache pods and the real L2 janitor on a
FUSE mount (:mod:`tests_faults.faultfs`) that is switched to a failure mode while in use.

One :class:`Rig` per test module: the FUSE mount over a plain backing directory, standing in for
the line's Curvine PVC; a writer pod and a reader pod (processes of :mod:`tests_lmcache.pod`,
each a real ``LMCacheEngine`` built from the env the line's rendered Policy gives the vLLM
container, kept up across faults); the line's janitor (``cluster_agents/l2_janitor.py``'s
``JanitorService``, one pass at a time, with its metrics), pointed at the mount; and the node's L2
mount watchdog (``cluster_agents/l2_mount_watchdog.py``'s ``Watchdog``, issue 15 item 2, report only:
there is no API server to name or evict pods), which finds the mount where the kubelet keeps a
pod's CSI volume (the mount point is ``<kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount``
under the rig's directory) and publishes ``kvcache_l2_mount_up``, what ``KvCacheL2MountDead``
reads. :func:`run_fault`
takes one mode through the same steps every time (healthy lookups, the fault, lookups, a
retrieve whose lookup succeeded just before it, a store, a janitor pass, the metrics, switch-off,
recovery) and returns what happened; the tests assert on it and the terminal summary prints it.

Everything is sequenced by request and reply (a pod answers one action at a time; the mode
changes by an atomic rename the next FUSE operation reads): no outcome depends on timing. The
latencies are measured and printed, and asserted only against bounds with a wide margin.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cluster_agents import l2_directories, l2_janitor, l2_mount_watchdog
from tests_faults.faultfs import write_control
from tests_lmcache.conftest import REPO, ServedPod, Tier
from tests_lmcache.test_lmcache_metrics import scrape

#: The line the tier runs (rag-assistant: the tightest TTFT SLO, 1,000 ms).
LINE = "rag-assistant"
#: The faults, in the order they run (module docstring of tests_faults.faultfs).
FAULTS = ("hang", "enotconn", "eio", "enospc", "slow_read")
#: Four full 256-token chunks and a 100-token tail (never stored: save_unfull_chunk false).
PROMPT_TOKENS = 1124
FULL_HIT = 1024
CHUNKS = 4
#: Lookups per phase (healthy, faulty): the p50/p99 of the table.
LOOKUPS = 10
#: slow_read: every read waits this long, more than LMCache's 1 s per chunk read, so the retrieve
#: gives up (a read that is slow but within the bound is only slower: the table's GiB/s).
SLOW_READ_MS = 1500
#: Recovery is polled with lookups (each at most the lookup timeout) up to this long; the printed
#: figure is how long it took.
RECOVERY_LIMIT_S = 60.0
#: Series read from the pods' Prometheus multiprocess directories, as vLLM's /metrics serves them.
READER_SERIES = ("lmcache:num_lookup_requests_total", "lmcache:lookup_0_hit_requests_total",
                 "lmcache:num_lookup_hits_total", "lmcache:remote_time_to_get_sync_count",
                 "lmcache:num_remote_read_requests_total", "lmcache:get_blocking_failed_count")
WRITER_SERIES = ("lmcache:num_stored_tokens_total", "lmcache:num_remote_write_requests_total",
                 "lmcache:put_failed_count")
#: Control runs only: a JSON object of env overrides for both pods, e.g. LMCache's default
#: timeouts ``{"LMCACHE_LOOKUP_TIMEOUT_MS": "3000", "LMCACHE_BLOCKING_TIMEOUT_SECS": "10"}``, to
#: see the bound tests fail without the rendered values (docs/l2-cache.md, "The fault tier").
CONTROL_ENV = "KVCACHE_FAULTS_POD_ENV"
#: Janitor fixtures the healthy pass must delete (min_delete_age_s old, no live Pod names them).
STALE_MODEL_DIR = "old-model-000000000000"
ORPHAN_TMP_DIR = ".tmp-gone-pod"
OLD_S = 2 * 24 * 3600


class FaultMount:
    """A :mod:`tests_faults.faultfs` process mounting ``backing`` at ``mount``.

    :meth:`watch_target` names what a mount watchdog (issue 15 item 2, ``kvcache_l2_mount_up``)
    looks at; the rig points the real one at it through a kubelet-like layout (:func:`start_rig`).
    """

    def __init__(self, backing: Path, mount: Path, control: Path, log: Path) -> None:
        self.backing, self.mount, self.control, self.log = backing, mount, control, log
        write_control(control, "ok")
        with log.open("w", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests_faults.faultfs", "--backing", str(backing), "--mount", str(mount),
                 "--control", str(control)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"faultfs did not mount {mount}: {log.read_text(encoding='utf-8')[-2000:]}")
            time.sleep(0.01)

    def switch(self, mode: str, **kwargs: int) -> None:
        """The next operation on the mount runs in ``mode``."""
        write_control(self.control, mode, **kwargs)

    def alive(self) -> bool:
        return self.proc.poll() is None and os.path.ismount(self.mount)

    def watch_target(self) -> dict[str, Any]:
        """Where a mount watchdog would look: the mount point (a stat of it fails with the
        mode's errno), the FUSE daemon's pid and the file system type (``fuse``, name
        ``faultfs``), as ``/proc/self/mountinfo`` lists them."""
        return {"mount": str(self.mount), "pid": self.proc.pid, "fstype": "fuse", "source": "faultfs"}

    def stop(self) -> None:
        self.switch("ok")
        if subprocess.run(["fusermount3", "-u", str(self.mount)], capture_output=True).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], capture_output=True)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@dataclass
class Rig:
    """The mount, the pods and the janitor of one test module."""

    tier: Tier
    mount: FaultMount
    writer: ServedPod
    reader: ServedPod
    janitor: l2_janitor.JanitorService
    watchdog: l2_mount_watchdog.Watchdog
    hang_ms: int
    lookup_timeout_ms: int
    blocking_timeout_s: int

    @property
    def live_dir(self) -> str:
        return self.janitor.config.live_dir

    def backing_line_dir(self) -> Path:
        return self.mount.backing / self.live_dir

    def stop(self) -> list[str]:
        logs = []
        self.mount.switch("ok")
        for pod in (self.writer, self.reader):
            logs.append(pod.stop())
        self.mount.stop()
        return logs


def pod_object(name: str, env: dict[str, str]) -> dict[str, Any]:
    """A running Pod as the API server lists it, with the vLLM container's env (for the janitor)."""
    return {"metadata": {"name": name}, "status": {"phase": "Running"},
            "spec": {"containers": [{"name": "vllm", "env": [{"name": k, "value": v} for k, v in env.items()]}]}}


#: The pod volume the watchdog finds: the kubelet's layout of a CSI volume
#: (``<kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/{vol_data.json,mount}``, docs/sources.md §17).
POD_UID = "7e57f4a1-0000-4000-8000-000000000001"
PV_NAME = "pvc-l2-rag-assistant"
NODE = "fault-tier-node"


def kubelet_volume(kubelet: Path) -> Path:
    """Create the kubelet's directory of one Curvine CSI volume under ``kubelet``; returns its
    ``mount`` directory (the mount point)."""
    volume = kubelet / "pods" / POD_UID / l2_mount_watchdog.CSI_VOLUMES_DIR / PV_NAME
    (volume / l2_mount_watchdog.MOUNT_DIR).mkdir(parents=True)
    (volume / l2_mount_watchdog.VOL_DATA_FILE).write_text(json.dumps({
        "driverName": l2_mount_watchdog.DRIVER_NAME, "specVolID": PV_NAME, "volumeHandle": PV_NAME,
        "nodeName": NODE, "volumeLifecycleMode": "Persistent"}), encoding="utf-8")
    return volume / l2_mount_watchdog.MOUNT_DIR


def start_rig(exported: dict[str, Any], base: Path) -> Rig:
    """Mount the fault file system where the kubelet keeps a pod's CSI volume, make it the tier's L2
    root, and start a writer and a reader pod, the janitor and the watchdog."""
    home, work, backing = base / "home", base / "work", base / "backing"
    for d in (home, work, backing):
        d.mkdir()
    kubelet = base / "kubelet"
    tier = Tier(exported, kubelet_volume(kubelet), home, work)
    mount = FaultMount(backing, tier.root, base / "faultfs.control.json", base / "faultfs.log")
    overrides = json.loads(os.environ.get(CONTROL_ENV, "{}"))
    try:
        writer = tier.serve(LINE, pod=0, env=tier.pod_env(LINE, 0, overrides=overrides))
        reader = tier.serve(LINE, pod=1, env=tier.pod_env(LINE, 1, overrides=overrides))
    except BaseException:
        mount.stop()
        raise
    # The rendered janitor.json, its mount path re-pointed like the pods' URL (the tier's root).
    config = l2_janitor.config_from_dict({**exported["lines"][LINE]["janitor_config"], "mount_path": str(tier.root)})
    pods = [pod_object("writer", writer.env), pod_object("reader", reader.env)]
    janitor = l2_janitor.JanitorService(config, tier.root, list_pods=lambda: pods, log=lambda line: None)
    # The rendered watchdog.json, the host paths re-pointed at the rig's, run as by hand on a node
    # (no host_mountinfo: the rig's kubelet layout and this process's mount table; its plugin
    # directory holds no FUSE session, so the watchdog probes the pod's mount with statvfs).
    (base / "plugins").mkdir()
    watchdog = l2_mount_watchdog.Watchdog(
        NODE, l2_mount_watchdog.config_from_dict({**exported["mount_watchdog_config"], "kubelet_dir": str(kubelet),
                                                  "plugin_dir": str(base / "plugins"), "host_mountinfo": ""}),
        api=None, log=lambda line: None)
    timeouts = exported["lmcache_timeouts"]
    return Rig(tier, mount, writer, reader, janitor, watchdog, exported["fuse_master_op_bound_ms"],
               timeouts["lookup_timeout_ms"], timeouts["blocking_timeout_secs"])


@dataclass
class FaultResult:
    """What one mode did (times in ms unless named _s)."""

    mode: str
    healthy_lookup_ms: list[float]
    lookup_ms: list[float]
    lookup_hits: list[int]
    retrieve: dict[str, Any]
    store: dict[str, Any]
    janitor: dict[str, Any]
    janitor_deleted: list[str]
    janitor_metrics: dict[str, float]
    janitor_ready: bool
    signals: dict[str, float]
    #: The watchdog's pass during the fault: the mount's state and ``kvcache_l2_mount_up``.
    watchdog_state: str
    mount_up: float | None
    recovery_s: float
    recovery_lookups: int
    #: The pods' own failure counters (``RemoteBackend``), beside what /metrics shows of them.
    counters: dict[str, Any] = field(default_factory=dict)
    #: Files left in the writer's temp directory (on the backing disk) after the fault's store.
    temp_files_left: list[str] = field(default_factory=list)
    after: dict[str, Any] = field(default_factory=dict)

    @property
    def added_lookup_ms(self) -> tuple[float, float]:
        """p50 and p99 of the faulty lookups, less the healthy p50."""
        base = statistics.median(self.healthy_lookup_ms)
        return (statistics.median(self.lookup_ms) - base, percentile(self.lookup_ms, 99) - base)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100): of 10 values, p99 is the largest."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _plant_janitor_fixtures(rig: Rig) -> set[str]:
    """A directory of a model no longer configured and an orphan temp directory in the live one,
    both older than the minimum deletable age: what a healthy pass deletes. Returns their paths.

    The janitor's state file says the line has been configured with its live directory since
    :data:`OLD_S` ago and no Pod has named the old model since: without that history a first pass
    keeps every directory for the grace period (``cluster_agents.l2_janitor.DIR_GRACE_S``), and the old
    model's directory is deletable only once it is neither the current nor the previous one."""
    backing = rig.mount.backing
    l2_directories.write_state(backing, l2_directories.DirHistory([(rig.live_dir, time.time() - OLD_S)], {}))
    stale = backing / STALE_MODEL_DIR
    orphan = rig.backing_line_dir() / ORPHAN_TMP_DIR
    for d in (stale, orphan):
        d.mkdir(parents=True, exist_ok=True)
    (stale / "x.data").write_bytes(b"\0" * 64)
    (orphan / "y.data").write_bytes(b"\0" * 64)
    old = time.time() - OLD_S
    for p in (stale / "x.data", orphan / "y.data", stale, orphan):
        os.utime(p, (old, old))
    return {STALE_MODEL_DIR, f"{STALE_MODEL_DIR}/x.data", f"{rig.live_dir}/{ORPHAN_TMP_DIR}",
            f"{rig.live_dir}/{ORPHAN_TMP_DIR}/y.data"}


def _series(families: dict[str, Any], names: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for name in names:
        out[name] = sum(s.value for f in families.values() for s in f.samples if s.name == name)
    return out


def _metrics(rig: Rig) -> dict[str, float]:
    for pod in (rig.reader, rig.writer):
        pod.act({"op": "flush_metrics"})
    reader = _series(scrape(rig.tier.metrics_dir(LINE, 1)), READER_SERIES)
    writer = _series(scrape(rig.tier.metrics_dir(LINE, 0)), WRITER_SERIES)
    return {**{f"reader {k}": v for k, v in reader.items()}, **{f"writer {k}": v for k, v in writer.items()}}


def _prompt(seed: int) -> list[list[int]]:
    return [[seed, PROMPT_TOKENS]]


def run_fault(rig: Rig, mode: str, index: int) -> FaultResult:
    """Take ``mode`` through the steps of the module docstring; returns what happened."""
    seed = 1000 + 10 * index
    looked_up, retrieved, stored, stored_after, retrieved_after = (_prompt(seed + k) for k in range(5))
    files_dir = str(rig.backing_line_dir())
    for prompt in (looked_up, retrieved, retrieved_after):
        setup = rig.writer.act({"op": "store_drain", "prompt": prompt, "files_dir": files_dir})
        assert setup["stored_files"] == CHUNKS, setup
    healthy = [rig.reader.act({"op": "lookup_rpc", "prompt": looked_up, "unpin": True}) for _ in range(LOOKUPS)]
    # A full hit each, unless a loaded machine held one past the 200 ms timeout (a clean miss).
    hits = [r["hit_tokens"] for r in healthy]
    assert FULL_HIT in hits and set(hits) <= {0, FULL_HIT}, healthy
    before_retrieve = rig.reader.act({"op": "lookup_rpc", "prompt": retrieved})
    assert before_retrieve["hit_tokens"] == FULL_HIT
    planted = _plant_janitor_fixtures(rig)
    files_before = _snapshot(rig.mount.backing)
    metrics_before = _metrics(rig)

    rig.mount.switch(mode, hang_ms=rig.hang_ms, read_delay_ms=SLOW_READ_MS)
    retrieve = rig.reader.act({"op": "retrieve", "prompt": retrieved, "req_id": before_retrieve["lookup_id"]})
    lookups = [rig.reader.act({"op": "lookup_rpc", "prompt": looked_up, "unpin": True}) for _ in range(LOOKUPS)]
    store = rig.writer.act({"op": "store_drain", "prompt": stored, "files_dir": files_dir})
    summary = rig.janitor.run_pass()
    janitor_ready = rig.janitor.readiness()[0]
    janitor_metrics = {line.split("{")[0]: float(line.rsplit(" ", 1)[1])
                       for line in rig.janitor.metrics().splitlines() if line and not line.startswith("#")}
    deleted = sorted(files_before - _snapshot(rig.mount.backing))
    watched = rig.watchdog.run_pass()
    (watched_mount,) = watched.mounts
    up = [float(line.rsplit(" ", 1)[1]) for line in rig.watchdog.metrics().splitlines()
          if line.startswith(l2_mount_watchdog.UP_METRIC + "{")]
    metrics_after = _metrics(rig)
    counters = {"reader": rig.reader.act({"op": "counters"}), "writer": rig.writer.act({"op": "counters"})}
    writer_tmp = rig.backing_line_dir() / json.loads(rig.writer.env["LMCACHE_EXTRA_CONFIG"])["fs_connector_relative_tmp_dir"]
    temp_files_left = sorted(p.name for p in writer_tmp.iterdir())

    rig.mount.switch("ok")
    t0 = time.monotonic()
    n = 0
    while True:
        n += 1
        again = rig.reader.act({"op": "lookup_rpc", "prompt": looked_up, "unpin": True})
        if again["hit_tokens"] == FULL_HIT or time.monotonic() - t0 > RECOVERY_LIMIT_S:
            break
    recovery_s = time.monotonic() - t0
    after_store = rig.writer.act({"op": "store_drain", "prompt": stored_after, "files_dir": files_dir})
    after_lookup = rig.reader.act({"op": "lookup_rpc", "prompt": retrieved_after})
    after_retrieve = rig.reader.act({"op": "retrieve", "prompt": retrieved_after, "req_id": after_lookup["lookup_id"]})
    after_janitor = rig.janitor.run_pass()
    (after_watch,) = rig.watchdog.run_pass().mounts
    # Leave no janitor fixture behind for the next mode.
    shutil.rmtree(rig.mount.backing / STALE_MODEL_DIR, ignore_errors=True)
    shutil.rmtree(rig.backing_line_dir() / ORPHAN_TMP_DIR, ignore_errors=True)
    return FaultResult(
        mode=mode,
        healthy_lookup_ms=[r["seconds"] * 1000 for r in healthy],
        lookup_ms=[r["seconds"] * 1000 for r in lookups],
        lookup_hits=[r["hit_tokens"] for r in lookups],
        retrieve=retrieve, store=store,
        janitor={**asdict(summary), "exit_code": summary.exit_code, "planted": sorted(planted)},
        janitor_deleted=deleted, janitor_metrics=janitor_metrics, janitor_ready=janitor_ready,
        signals={k: metrics_after[k] - metrics_before[k] for k in metrics_after},
        watchdog_state=watched_mount.state, mount_up=up[0] if len(up) == 1 else None,
        recovery_s=recovery_s, recovery_lookups=n, counters=counters,
        temp_files_left=temp_files_left,
        after={"lookup": again, "store": after_store, "retrieve": after_retrieve,
               "retrieve_lookup": after_lookup, "janitor_exit": after_janitor.exit_code,
               "watchdog_state": after_watch.state,
               "janitor_ready": rig.janitor.readiness()[0]})


# --- what the table says ---------------------------------------------------------------------------


def store_outcome(r: FaultResult) -> str:
    s = r.store
    if s["put_failed"] == 0 and s["stored_files"] == s["chunks"]:
        return f"stored {s['stored_files']}/{s['chunks']}"
    return f"{s['put_failed']}/{s['chunks']} writes failed, {s['stored_files']} published"


def retrieve_outcome(r: FaultResult) -> str:
    t = r.retrieve
    return f"{t['retrieved_tokens']}/{FULL_HIT} tokens in {t['seconds'] * 1000:,.0f} ms"


def janitor_action(r: FaultResult) -> str:
    j = r.janitor
    deleted = j["tmp_dirs_deleted"] + j["stale_model_dirs_deleted"] + j["stale_files_deleted"] + \
        j["expired_chunks_deleted"] + j["evicted_chunks_deleted"]
    state = "ready" if r.janitor_ready else "not ready"
    return f"status {j['exit_code']}, {len(j['errors'])} error(s), {deleted} deleted ({state})"


SIGNAL_NAMES = {
    "reader lmcache:lookup_0_hit_requests_total": "lookup_0_hit",
    "reader lmcache:remote_time_to_get_sync_count": "L2 reads tried",
    "reader lmcache:num_remote_read_requests_total": "L2 reads ok",
    "writer lmcache:num_stored_tokens_total": "stored tokens",
    "writer lmcache:num_remote_write_requests_total": "L2 writes ok",
}


def signals_text(r: FaultResult) -> str:
    parts = [f"{short} +{r.signals[key]:g}" for key, short in SIGNAL_NAMES.items() if r.signals.get(key)]
    parts.append(f"janitor errors {r.janitor_metrics.get('kvcache_l2_janitor_errors', 0):g}")
    parts.append(f"kvcache_l2_mount_up {r.mount_up:g} ({r.watchdog_state})")
    return "; ".join(parts)


def table(results: list[FaultResult], rig_info: dict[str, Any]) -> str:
    """The fault tier's table (Markdown), one row per mode."""
    rows = ["| mode | added lookup ms p50 / p99 | retrieve (lookup hit before the fault) | store | janitor pass "
            "| what the metrics show | seconds to recover |", "|---|---|---|---|---|---|---|"]
    for r in results:
        p50, p99 = r.added_lookup_ms
        rows.append(f"| {r.mode} | {p50:,.0f} / {p99:,.0f} | {retrieve_outcome(r)} | {store_outcome(r)}, store call "
                    f"{r.store['seconds'] * 1000:,.1f} ms | {janitor_action(r)} | {signals_text(r)} "
                    f"| {r.recovery_s:.2f} |")
    healthy = [ms for r in results for ms in r.healthy_lookup_ms]
    rows.append("")
    rows.append(f"Healthy lookup through the mount: p50 {statistics.median(healthy):.1f} ms, p99 "
                f"{percentile(healthy, 99):.1f} ms ({len(healthy)} lookups of {CHUNKS} chunks). Bounds: lookup "
                f"{rig_info['lookup_timeout_ms']} ms (LMCACHE_LOOKUP_TIMEOUT_MS), each chunk read "
                f"{rig_info['blocking_timeout_s'] * 1000} ms (LMCACHE_BLOCKING_TIMEOUT_SECS); hang = "
                f"{rig_info['hang_ms']} ms per FUSE operation (the StorageClass's Curvine client settings); "
                f"slow_read = {SLOW_READ_MS} ms per read.")
    return "\n".join(rows)


def dump(results: list[FaultResult], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in results], indent=1, default=str), encoding="utf-8")
