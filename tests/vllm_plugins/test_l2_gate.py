"""The L2 gate's core (vllm_plugins/l2_gate.py) without vLLM: settings, the state machine, the prober.

The connector class itself needs vLLM and LMCache, which this venv does not have; it is tested in
the serving tier (tests_serving/test_l2_gate.py, tests_serving/test_hung_l2.py). Here: that the
module imports without them, that the state machine opens and closes on the documented reports, and
that the prober never blocks and never runs more than one probe, on real threads with a probe that
hangs until told, and on a real directory.
"""

from __future__ import annotations

import errno
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_plugins import l2_gate
from vllm_plugins.l2_gate import GateProber, GateSettings, L2Gate, l2_path_from_remote_url, stat_fresh_name


class Clock:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _gate(clock: Clock, changes: list) -> L2Gate:
    return L2Gate(open_after_s=0.05, close_after_s=0.5, lookup_slow_s=0.1, clock=clock,
                  on_change=lambda is_open, reason, now: changes.append((is_open, reason, now)))


def test_the_module_imports_without_vllm() -> None:
    assert "vllm" not in sys.modules
    with pytest.raises(AttributeError):
        l2_gate.NoSuchThing  # noqa: B018 - the module __getattr__ refuses other names


def test_remote_url_to_path() -> None:
    assert l2_path_from_remote_url("fs://localhost:0/mnt/curvine/l2cache/m/") == "/mnt/curvine/l2cache/m/"
    assert l2_path_from_remote_url("redis://h:6379") is None
    assert l2_path_from_remote_url(None) is None


def test_settings_from_env() -> None:
    s = GateSettings.from_env({"LMCACHE_REMOTE_URL": "fs://localhost:0/l2/x"})
    assert s == GateSettings(enabled=True, path="/l2/x", probe_interval_s=0.05, open_after_s=0.05,
                             close_after_s=0.5, lookup_slow_s=0.1)
    s = GateSettings.from_env({"LMCACHE_REMOTE_URL": "fs://localhost:0/l2/x", "KVCACHE_L2_GATE_PATH": "/other",
                               "KVCACHE_L2_GATE_OPEN_AFTER_MS": "80", "KVCACHE_L2_GATE_CLOSE_AFTER_MS": "1000",
                               "KVCACHE_L2_GATE_ENABLED": "false"})
    assert (s.enabled, s.path, s.open_after_s, s.close_after_s) == (False, "/other", 0.08, 1.0)
    with pytest.raises(ValueError, match="KVCACHE_L2_GATE_PROBE_INTERVAL_MS"):
        GateSettings.from_env({"KVCACHE_L2_GATE_PROBE_INTERVAL_MS": "0"})


def test_no_fs_l2_or_disabled_starts_nothing() -> None:
    assert l2_gate.start_gate(GateSettings(path=None), metrics=False) is None
    assert l2_gate.start_gate(GateSettings(enabled=False, path="/x"), metrics=False) is None


def test_opens_on_a_stuck_probe_and_closes_after_the_hold() -> None:
    clock, changes = Clock(), []
    gate = _gate(clock, changes)
    gate.probe_done(0.002)
    gate.probe_outstanding(0.04)  # younger than open_after: nothing yet
    assert not gate.is_open
    clock.now += 0.06
    gate.probe_outstanding(0.06)
    assert gate.is_open and changes[-1][0] is True and "outstanding 60 ms" in changes[-1][1]
    clock.now += 1.0
    gate.probe_done(1.0)  # the stuck probe returns late: still unhealthy
    assert gate.is_open
    for _ in range(10):  # 0.45 s of healthy probes: not yet
        clock.now += 0.05
        gate.probe_done(0.001)
    assert gate.is_open
    clock.now += 0.06
    gate.probe_done(0.001)
    assert not gate.is_open and changes[-1][0] is False
    assert [c[0] for c in changes] == [True, False]


def test_a_failure_in_the_hold_restarts_it() -> None:
    clock, changes = Clock(), []
    gate = _gate(clock, changes)
    gate.probe_failed(repr(OSError(errno.ENOTCONN, "Transport endpoint is not connected")))
    assert gate.is_open and "not connected" in changes[-1][1]
    clock.now += 0.4
    gate.probe_done(0.001)
    clock.now += 0.4
    gate.probe_failed("OSError(5)")
    clock.now += 0.4
    gate.probe_done(0.001)
    assert gate.is_open  # 0.4 s healthy since the last failure
    clock.now += 0.5
    gate.probe_done(0.001)
    assert not gate.is_open
    assert [c[0] for c in changes] == [True, False]


def test_a_slow_lookup_opens_a_fast_one_does_not() -> None:
    clock, changes = Clock(), []
    gate = _gate(clock, changes)
    gate.lookup_done(0.05)
    assert not gate.is_open
    gate.lookup_done(0.2)
    assert gate.is_open and "lookup took 200 ms" in changes[-1][1]


class HangingProbe:
    """A probe that blocks while ``hung`` is set (as a hung FUSE operation) and counts concurrent calls."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.released.set()
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        self.calls = 0

    def __call__(self) -> None:
        with self.lock:
            self.running += 1
            self.calls += 1
            self.max_running = max(self.max_running, self.running)
        try:
            self.released.wait()
        finally:
            with self.lock:
                self.running -= 1


def _wait(predicate, timeout_s: float = 5.0) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.002)
    return time.monotonic() - start


def test_the_prober_opens_on_a_hang_within_the_window_and_closes_after_recovery() -> None:
    changes: list = []
    gate = L2Gate(open_after_s=0.05, close_after_s=0.3, lookup_slow_s=0.1,
                  on_change=lambda is_open, reason, now: changes.append((is_open, reason, now)))
    probe = HangingProbe()
    prober = GateProber(gate, probe, interval_s=0.01)
    prober.start()
    try:
        _wait(lambda: probe.calls >= 5)
        assert not gate.is_open
        probe.released.clear()  # the mount hangs
        hang_at = time.monotonic()
        _wait(lambda: gate.is_open)
        opened_after = time.monotonic() - hang_at
        calls = probe.calls
        time.sleep(0.2)
        assert probe.calls == calls, "a second probe started while one was stuck"
        probe.released.set()  # the mount answers again
        back_at = time.monotonic()
        _wait(lambda: not gate.is_open)
        closed_after = time.monotonic() - back_at
    finally:
        prober.stop()
    assert probe.max_running == 1
    # Window: open_after + one interval, with slack for a busy machine; close: the hold + slack.
    assert opened_after < 0.05 + 0.01 + 0.5
    assert 0.3 <= closed_after < 0.3 + 0.5
    assert [c[0] for c in changes] == [True, False]


def test_the_prober_sees_a_failing_probe() -> None:
    gate = L2Gate(open_after_s=0.05, close_after_s=0.3, lookup_slow_s=0.1)
    failing = threading.Event()

    def probe() -> None:
        if failing.is_set():
            raise OSError(errno.EIO, "Input/output error")

    prober = GateProber(gate, probe, interval_s=0.01)
    prober.start()
    try:
        time.sleep(0.05)
        assert not gate.is_open
        failing.set()
        _wait(lambda: gate.is_open, 2.0)
        failing.clear()
        _wait(lambda: not gate.is_open, 2.0)
    finally:
        prober.stop()


def test_stat_fresh_name_on_a_real_directory(tmp_path: Path) -> None:
    probe = stat_fresh_name(str(tmp_path))
    probe()  # a miss is an answer
    probe()
    assert list(tmp_path.iterdir()) == []  # a probe never creates anything
    missing = stat_fresh_name(str(tmp_path / "not-yet"))
    missing()  # a directory LMCache has not created yet is healthy too
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(NotADirectoryError):
        stat_fresh_name(str(blocked))()


def test_skip_saves_marks_only_saving_requests() -> None:
    class Spec:
        def __init__(self, can_save: bool) -> None:
            self.skip_leading_tokens, self.can_save = 0, can_save

    class Req:
        def __init__(self, spec) -> None:
            self.save_spec = spec

    class Meta:
        requests = [Req(Spec(True)), Req(Spec(False)), Req(None)]

    assert l2_gate._skip_saves(Meta) == 1
    assert [r.save_spec and r.save_spec.can_save for r in Meta.requests] == [False, False, None]


def test_a_gate_that_keeps_reopening_holds_longer_and_resets_after_a_quiet_spell() -> None:
    """A dead lookup path on a mount that answers: only slow lookups open the gate, probes close it."""
    clock, changes = Clock(), []
    gate = L2Gate(open_after_s=0.05, close_after_s=0.5, lookup_slow_s=0.1, max_close_after_s=1.5, clock=clock,
                  on_change=lambda is_open, reason, now: changes.append((is_open, reason, now)))

    def healthy_for(seconds: float) -> None:
        end = clock.now + seconds
        while clock.now < end - 1e-9:
            clock.now += 0.05
            gate.probe_done(0.001)

    holds = []
    for _ in range(4):
        gate.lookup_done(0.2)
        holds.append(gate.hold_s)
        healthy_for(holds[-1] + 0.1)
        assert not gate.is_open
        clock.now += 1.0  # the next slow lookup comes soon after the close
    assert holds == [0.5, 1.0, 1.5, 1.5]
    assert "closes after 1000 ms" in changes[2][1]
    clock.now += l2_gate.REOPEN_WINDOW_S  # quiet: the next open starts from close_after again
    gate.lookup_done(0.2)
    assert gate.hold_s == 0.5


def test_the_shipped_file_imports_only_the_standard_library_at_module_level() -> None:
    """The ConfigMap ships this one file: nothing of the project, and vLLM / LMCache / prometheus_client only
    inside the functions that run in vLLM's process (the image has them; this venv has no vLLM)."""
    import ast

    tree = ast.parse(Path(l2_gate.__file__).read_text(encoding="utf-8"))
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top
    nested = {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert nested - set(sys.stdlib_module_names) == {"vllm", "prometheus_client", "lmcache"}


def test_start_gate_probes_a_real_directory_and_publishes_its_state(tmp_path: Path) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    runtime = l2_gate.start_gate(GateSettings(path=str(tmp_path), probe_interval_s=0.01), metrics=True)
    assert runtime is not None
    try:
        _wait(lambda: runtime.prober.probes >= 3)
        assert not runtime.gate.is_open
        registry = prometheus_client.REGISTRY
        assert registry.get_sample_value("kvcache_l2_gate_open") == 0
        runtime.gate.probe_failed("OSError(107)")
        runtime.bypass()
        assert registry.get_sample_value("kvcache_l2_gate_open") == 1
        assert registry.get_sample_value("kvcache_l2_gate_transitions_total", {"to": "open"}) >= 1
        assert registry.get_sample_value("kvcache_l2_gate_bypassed_lookups_total") >= 1
        _wait(lambda: not runtime.gate.is_open)  # the directory answers: closed after the hold
        assert registry.get_sample_value("kvcache_l2_gate_open") == 0
    finally:
        runtime.stop()


# --- the janitor's retiring list (docs/l2-cache.md, "Evictions and readers on other nodes") -------


def test_the_retiring_list_has_one_name_in_the_janitor_and_the_connector() -> None:
    from cluster_agents import l2_janitor

    assert l2_gate.RETIRING_FILE == l2_janitor.RETIRING_FILE


def test_a_hit_stops_before_the_first_retiring_chunk() -> None:
    chunks = [(0, 256, "a"), (256, 512, "b"), (512, 768, "c"), (768, 1024, "d")]
    assert l2_gate.retiring_cap(chunks, 1024, frozenset()) == 1024
    assert l2_gate.retiring_cap(chunks, 1024, frozenset({"c"})) == 512
    assert l2_gate.retiring_cap(chunks, 1024, frozenset({"a", "c"})) == 0
    # A retiring chunk beyond the hit changes nothing.
    assert l2_gate.retiring_cap(chunks, 512, frozenset({"c", "d"})) == 512


def test_the_watcher_reads_what_the_janitor_writes_and_only_when_it_changed(tmp_path: Path, monkeypatch) -> None:
    from cluster_agents import l2_janitor

    seen: list[frozenset[str]] = []
    watcher = l2_gate.RetiringWatcher(str(tmp_path), on_change=seen.append)
    watcher.refresh()
    assert watcher.hashes == frozenset() and seen == []
    l2_janitor.write_retiring(tmp_path, {"1f": 100.0, "-2a": 101.0})
    watcher.refresh()
    assert watcher.hashes == {"1f", "-2a"} and seen == [frozenset({"1f", "-2a"})]
    reads: list[str] = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: reads.append(a[0]) or real_open(*a, **k))
    watcher.refresh()  # unchanged: one stat, no read
    assert reads == []
    monkeypatch.undo()
    l2_janitor.write_retiring(tmp_path, {})  # the janitor deleted them all: the file goes
    watcher.refresh()
    assert watcher.hashes == frozenset() and len(seen) == 2


def test_a_list_that_cannot_be_read_keeps_the_last_one(tmp_path: Path) -> None:
    from cluster_agents import l2_janitor

    watcher = l2_gate.RetiringWatcher(str(tmp_path))
    l2_janitor.write_retiring(tmp_path, {"1f": 100.0})
    watcher.refresh()
    (tmp_path / l2_gate.RETIRING_FILE).write_text("{torn")
    watcher.refresh()
    assert watcher.hashes == {"1f"}


def test_the_watcher_is_off_without_an_fs_l2_or_when_turned_off(tmp_path: Path) -> None:
    assert l2_gate.start_retiring(l2_gate.GateSettings(path=None), env={}) is None
    assert l2_gate.start_retiring(l2_gate.GateSettings(path=str(tmp_path)),
                                  env={l2_gate.RETIRING_ENABLED_ENV: "off"}) is None
    watcher = l2_gate.start_retiring(l2_gate.GateSettings(path=str(tmp_path)), env={})
    try:
        assert watcher is not None and watcher.path == str(tmp_path / l2_gate.RETIRING_FILE)
    finally:
        watcher.stop()
# --- the chunk key ---------------------------------------------------------------------------------


class _TokenDatabase:
    """The two names of ``lmcache.v1.token_database`` that ``apply_chunk_key`` uses (LMCache 0.5.5)."""

    NONE_HASH = 12345

    @staticmethod
    def _normalize_hash_to_int(value):
        return int.from_bytes(value[:8], "big") if isinstance(value, bytes) else value


def _sha256_cbor(value):  # vLLM 0.29.0's sha256_cbor, for a string (the standard-library encoder)
    import hashlib as _hashlib

    from cluster_agents import hot_prefixes

    return _hashlib.sha256(hot_prefixes.cbor(value)).digest()


def test_the_chunk_key_starts_lmcaches_chain_from_the_secret_in_every_process() -> None:
    db = type("TokenDatabase", (_TokenDatabase,), {})
    fingerprint = l2_gate.apply_chunk_key({l2_gate.CHUNK_KEY_ENV: "line-secret"}, algorithm="sha256_cbor",
                                          token_database=db, hash_fn=_sha256_cbor)
    from cluster_agents import hot_prefixes

    assert db.NONE_HASH == hot_prefixes.keyed_none_hash("line-secret")  # the warmer's start, by construction
    assert fingerprint and "line-secret" not in fingerprint and len(fingerprint) == 8


@pytest.mark.parametrize("env", [{}, {l2_gate.CHUNK_KEY_ENV: ""}, {l2_gate.CHUNK_KEY_ENV: "  "}])
def test_without_a_chunk_key_lmcaches_names_are_left_alone(env) -> None:
    db = type("TokenDatabase", (_TokenDatabase,), {})
    assert l2_gate.apply_chunk_key(env, algorithm="sha256_cbor", token_database=db, hash_fn=_sha256_cbor) is None
    assert db.NONE_HASH == 12345


@pytest.mark.parametrize("algorithm", ["builtin", "sha256", "xxhash"])
def test_a_chunk_key_with_a_weak_or_other_hash_stops_the_pod(algorithm: str) -> None:
    db = type("TokenDatabase", (_TokenDatabase,), {})
    with pytest.raises(RuntimeError, match="sha256_cbor"):
        l2_gate.apply_chunk_key({l2_gate.CHUNK_KEY_ENV: "k"}, algorithm=algorithm, token_database=db, hash_fn=_sha256_cbor)
    assert db.NONE_HASH == 12345
