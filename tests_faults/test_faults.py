"""The L2 tier against faults: real LMCache pods and the real janitor on a FUSE mount that hangs,
fails or slows down while in use (issue 15 item 3; docs/l2-cache.md, "The fault tier").

Each fault runs once (:func:`tests_faults.harness.run_fault`, in the ``results`` fixture); these
tests assert what happened. The bound is the rendered one: every pod runs with the env its Policy
gives it (``LMCACHE_LOOKUP_TIMEOUT_MS`` 200, ``LMCACHE_BLOCKING_TIMEOUT_SECS`` 1), the mount's
``hang`` waits what the StorageClass's Curvine client settings allow one operation (3,000 ms).
Latencies are asserted only against those bounds plus a margin of 1 s that no run here came near,
and which still separates them from what the FUSE layer alone would cost (3 s and more).
"""

from __future__ import annotations

import os

import pytest

from cluster_agents.l2_mount_watchdog import find_volumes
from tests_faults.harness import CHUNKS, FAULTS, FULL_HIT, STALE_MODEL_DIR

#: Slack on every latency bound, for a loaded 2-core machine (ms).
MARGIN_MS = 1000
#: Faults in which the mount answers nothing (every operation fails or hangs).
DOWN = ("hang", "enotconn", "eio")
#: What the L2 mount watchdog (issue 15 item 2) makes of the mount in each fault: its ``statvfs``
#: fails with ENOTCONN (dead), fails otherwise (error; in ``hang`` after the 3 s of the Curvine
#: client, or hung if the watchdog's 10 s probe timeout came first), or answers (alive).
WATCHDOG = {"hang": {"error", "hung"}, "enotconn": {"dead"}, "eio": {"error"}, "enospc": {"alive"},
            "slow_read": {"alive"}}


def test_the_pods_run_the_rendered_bound(rig, exported):
    """No test override of the timeouts: the pods' env is the rendered one (the L2 root, L1 size and
    metrics directory are the tier's only overrides, tests_lmcache/conftest.py)."""
    assert os.environ.get("KVCACHE_FAULTS_POD_ENV") is None, "a control run: the bound tests are expected to fail"
    rendered = exported["lines"]["rag-assistant"]["envs"][0]
    for pod in (rig.reader, rig.writer):
        assert pod.env["LMCACHE_LOOKUP_TIMEOUT_MS"] == rendered["LMCACHE_LOOKUP_TIMEOUT_MS"] == "200"
        assert pod.env["LMCACHE_BLOCKING_TIMEOUT_SECS"] == rendered["LMCACHE_BLOCKING_TIMEOUT_SECS"] == "1"
    assert rig.hang_ms == 3000 and rig.lookup_timeout_ms == 200 and rig.blocking_timeout_s == 1


@pytest.mark.parametrize("mode", FAULTS)
def test_nothing_crashes(rig, results, mode):
    assert results[mode]
    for pod in (rig.reader, rig.writer):
        assert pod.proc.poll() is None, pod.log()[-4000:]
        assert "Fatal Python error" not in pod.log() and "Segmentation fault" not in pod.log()
    assert rig.mount.alive()


@pytest.mark.parametrize("mode", FAULTS)
def test_a_lookup_costs_at_most_the_lookup_timeout(results, rig, mode):
    """vLLM's scheduler waits for a lookup at most ``lookup_timeout_ms`` and then counts a miss; a
    lookup is a full hit or a clean miss, never a wrong count. A hung mount (3 s per operation)
    and a failing one cost the same bounded wait or less."""
    r = results[mode]
    bound = rig.lookup_timeout_ms + MARGIN_MS
    assert max(r.lookup_ms) <= bound < rig.hang_ms, r.lookup_ms
    assert set(r.lookup_hits) <= {0, FULL_HIT}
    if mode in DOWN:
        assert r.lookup_hits == [0] * len(r.lookup_hits)
    if mode == "enospc":  # a full pool refuses writes; reads and lookups go on
        assert FULL_HIT in r.lookup_hits


@pytest.mark.parametrize("mode", FAULTS)
def test_a_retrieve_costs_at_most_the_blocking_timeout(results, rig, mode):
    """A request whose lookup found its prefix just before the fault: its retrieve waits at most
    ``blocking_timeout_secs`` for the first chunk that does not come, keeps only the chunks
    before it (the rest is recomputed), and nothing it keeps differs from what was stored."""
    t = results[mode].retrieve
    assert t["seconds"] * 1000 <= rig.blocking_timeout_s * 1000 + MARGIN_MS < 2 * rig.hang_ms, t
    kept = [ok for ok, retrieved in zip(t["chunks_identical"], t["chunks_retrieved"]) if retrieved]
    assert all(kept)
    assert t["chunks_retrieved"] == sorted(t["chunks_retrieved"], reverse=True)  # a prefix
    if mode in DOWN or mode == "slow_read":  # slow_read: 1.5 s per read, past the 1 s bound
        assert t["retrieved_tokens"] == 0 and t["get_blocking_failed"] == 1
    else:
        assert t["retrieved_tokens"] == FULL_HIT


@pytest.mark.parametrize("mode", FAULTS)
def test_a_store_fails_cleanly_and_off_the_request_path(results, rig, mode):
    """vLLM's ``store`` only queues the L2 writes; a write that fails publishes no file (LMCache
    renames a chunk into place only once it is whole) and leaves no temp file behind."""
    r = results[mode]
    s = r.store
    assert s["seconds"] * 1000 <= MARGIN_MS < rig.hang_ms, s
    assert r.temp_files_left == []
    if mode == "slow_read":
        assert (s["put_failed"], s["stored_files"]) == (0, CHUNKS)
    else:
        assert (s["put_failed"], s["stored_files"]) == (CHUNKS, 0)


@pytest.mark.parametrize("mode", FAULTS)
def test_the_janitor_deletes_nothing_it_should_not(results, mode):
    """The janitor deletes only what a healthy pass deletes (a directory of a model no longer
    configured and an orphan temp directory, planted old); on a mount that answers nothing it
    deletes nothing, reports the error (status 2, not ready: ``KvCacheL2JanitorFailing`` reads
    its ``errors`` gauge) and keeps every live chunk. On a full pool it frees what it can (the old
    chunk files, the orphan temp directory) but cannot write its state file, so it deletes no
    model directory in that pass and says so (status 2); a pass with room deletes it once the
    directory has been unchanged for the minimum deletable age (deleting its chunk files changed
    its mtime)."""
    r = results[mode]
    planted = set(r.janitor["planted"])
    assert set(r.janitor_deleted) <= planted, r.janitor_deleted
    if mode in DOWN:
        assert r.janitor_deleted == [] and r.janitor["exit_code"] == 2 and not r.janitor_ready
        assert r.janitor_metrics["kvcache_l2_janitor_errors"] >= 1
    elif mode == "enospc":
        assert set(r.janitor_deleted) == planted - {STALE_MODEL_DIR}
        assert r.janitor["exit_code"] == 2 and not r.janitor_ready
        assert any("no directory deleted" in e for e in r.janitor["errors"]), r.janitor["errors"]
    else:
        assert set(r.janitor_deleted) == planted and r.janitor["exit_code"] == 0 and r.janitor_ready
        assert r.janitor_metrics["kvcache_l2_janitor_errors"] == 0


@pytest.mark.parametrize("mode", FAULTS)
def test_the_failure_shows_in_the_metrics(results, mode):
    """What /metrics shows (the pods' Prometheus multiprocess files, read as vLLM's API server
    reads them; the janitor's /metrics): L2 reads tried that did not succeed, stored tokens with
    no L2 write, lookups with no hit, janitor errors; and the L2 mount watchdog's
    ``kvcache_l2_mount_up``, which ``KvCacheL2MountDead`` reads (0 while the mount does not answer)."""
    r = results[mode]
    sig = r.signals
    tried, ok = sig["reader lmcache:remote_time_to_get_sync_count"], sig["reader lmcache:num_remote_read_requests_total"]
    assert tried == 1
    assert ok == (CHUNKS if mode == "enospc" else 0)
    stored, written = sig["writer lmcache:num_stored_tokens_total"], sig["writer lmcache:num_remote_write_requests_total"]
    assert stored > 0 and written == (CHUNKS if mode == "slow_read" else 0)
    if mode in ("eio", "enotconn"):
        assert sig["reader lmcache:lookup_0_hit_requests_total"] >= 1
    assert r.watchdog_state in WATCHDOG[mode]
    assert r.mount_up == (0 if mode in DOWN else 1)


def test_lmcache_failure_gauges_do_not_reach_metrics(results):
    """Recorded behaviour of LMCache 0.5.5: ``lmcache:put_failed_count`` and
    ``lmcache:get_blocking_failed_count`` are ``set_function`` gauges
    (``PrometheusLogger._dynamic_metrics``, ``RemoteBackend._setup_metrics``), which
    ``prometheus_client`` evaluates only in the process's own registry: through the multiprocess
    files vLLM's /metrics serves they stay 0 while the backend counts every failure. Alerts on L2
    failures must read the counters above instead (docs/l2-cache.md, "The fault tier")."""
    r = results["eio"]
    assert r.counters["writer"]["put_failed"] >= CHUNKS and r.counters["reader"]["get_blocking_failed"] >= 1
    assert r.signals["writer lmcache:put_failed_count"] == 0
    assert r.signals["reader lmcache:get_blocking_failed_count"] == 0


@pytest.mark.parametrize("mode", FAULTS)
def test_service_recovers_by_itself(results, mode):
    """Switched off, with nothing restarted: the next lookups hit in full again, a store writes
    every chunk, a retrieve reads back what was stored, and the janitor's next pass is clean."""
    r = results[mode]
    a = r.after
    assert a["lookup"]["hit_tokens"] == FULL_HIT, (r.recovery_s, a["lookup"])
    assert (a["store"]["put_failed"], a["store"]["stored_files"]) == (0, CHUNKS)
    assert a["retrieve_lookup"]["hit_tokens"] == FULL_HIT
    assert a["retrieve"]["retrieved_tokens"] == FULL_HIT and all(a["retrieve"]["chunks_identical"])
    assert a["janitor_exit"] == 0 and a["janitor_ready"]
    assert a["watchdog_state"] == "alive"


def test_the_watchdog_finds_the_mount_where_the_kubelet_keeps_it(rig):
    """The watchdog is pointed at the mount the way it finds mounts on a node: the kubelet's
    directory of the pod's Curvine CSI volume (``vol_data.json``), the mount point listed in
    /proc/self/mountinfo as a FUSE mount of the fault file system's daemon."""
    target = rig.mount.watch_target()
    (volume,) = find_volumes(rig.watchdog.config.kubelet_dir)
    assert volume.target == target["mount"] == str(rig.tier.root)
    mounts = [line.split() for line in open("/proc/self/mountinfo", encoding="utf-8")]
    (entry,) = [m for m in mounts if m[4] == target["mount"]]
    sep = entry.index("-")
    assert entry[sep + 1] == target["fstype"] and entry[sep + 2] == target["source"]
    assert os.path.exists(f"/proc/{target['pid']}")


def test_throughput_through_fuse_beside_the_plain_directory(throughput):
    """Every round stored and read back the whole prompt bit for bit on both sides (the figures
    are printed in the summary, not asserted)."""
    assert set(throughput) == {"plain directory", "through FUSE (faultfs, mode ok)"}
    for side in throughput.values():
        assert len(side["store"]) == len(side["retrieve"]) == 3
