"""The L2 gate: a vLLM KV connector that stops asking LMCache while the line's L2 mount does not answer.

Why (issue 23 item 2; docs/l2-cache.md, "When the L2 hangs: the L2 gate"). vLLM 0.29.0's scheduler calls the KV connector's
``get_num_new_matched_tokens`` for every waiting request inside its scheduling step
(``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``), and LMCache 0.5.5 answers it with a
lookup that ends in a ``stat`` of each chunk file on the L2 mount (``LMCacheConnectorV1Impl
.get_num_new_matched_tokens`` in ``lmcache/integration/vllm/vllm_v1_adapter.py`` -> the lookup client
over ZMQ -> ``FSConnector.exists_sync``, ``lmcache/v1/storage_backend/connector/fs_connector.py``).
On a hung FUSE mount every new request therefore freezes the whole engine for
``LMCACHE_LOOKUP_TIMEOUT_MS`` (the lookup client's receive timeout), or, with
``LMCACHE_ENABLE_ASYNC_LOADING``, keeps a request waiting and re-polled every step. Nothing in
LMCache 0.5.5 stops lookups early enough: its health monitor pings every 30 s, and the fs connector
has no ping at all (``RemoteConnector.support_ping`` is False and ``FSConnector`` keeps it), so only
10 failed *reads* trip it, for 300 s (``lmcache/v1/health_monitor/constants.py``,
``checks/remote_backend_check.py`` ``RemoteBackendHealthCheck.check``).

What. :class:`L2Gate` is a small state machine fed by a prober thread (:class:`GateProber`) that
``stat``\\ s a fresh, never existing name in the L2 directory every ``probe_interval_s``, each probe
on a daemon thread of its own and at most one at a time (a hung FUSE operation never returns, so
nobody may wait for it). The gate **opens** (L2 bypassed) when the probe in flight is older than
``open_after_s``, when a probe fails with anything but "no such file" (``EIO``, ``ENOTCONN``...), or
when a real lookup took longer than ``lookup_slow_s``; it **closes** once probes have answered
healthily for ``close_after_s`` without a break (doubled, up to ``max_close_after_s``, each time it
opens again within :data:`REOPEN_WINDOW_S` of closing: a lookup path that is broken while the mount
answers, so that only slow lookups open the gate, then costs one slow lookup per hold, not one per
half second). While it is open,
:class:`GatedLMCacheConnectorV1` answers ``get_num_new_matched_tokens`` with ``(0, False)`` without
calling LMCache, so the request is prefilled as on a replica without L2, and marks the step's
requests as not to be saved, so no new write (each one holding an L1 buffer until the hung
``put`` returns: ``RemoteBackend.submit_put_task``, ``lmcache/v1/storage_backend/remote_backend.py``)
piles up behind the mount.

Why a stat of a fresh name: it is the operation a lookup miss makes (``os.path.exists`` of a chunk
file), it always reaches the FUSE daemon (no cached entry can exist for a name never used; a ``stat``
of the directory itself may be answered from the kernel's attribute cache, which curvine-fuse keeps
1 s), and it costs one metadata call, unlike a listing of a directory of millions of chunk files.

Evicted chunks (docs/l2-cache.md, "Evictions and readers on other nodes"). The line's janitor does
not delete a chunk it evicts: it puts the chunk's hash on the directory's *retiring list*
(:data:`RETIRING_FILE`) and deletes the files a grace later (``cluster_agents/l2_janitor.py``
``RETIRE_GRACE_S``). LMCache opens a chunk file after its lookup found it, so a delete between the
two fails the read (a failed get: 10 in 30 s switch the replica's L1 and L2 off for 300 s). Here a
:class:`RetiringWatcher` thread re-reads the list when it changes (one ``stat`` a second), and
:meth:`GatedLMCacheConnectorV1.get_num_new_matched_tokens` shortens LMCache's hit to the chunks
before the first retiring one (LMCache's own chunk keys, from its token database; the load spec
LMCache recorded is shortened to match), so an evicted chunk is a lookup miss on every replica
long before its file goes. Metrics ``kvcache_l2_retiring_chunks`` and
``kvcache_l2_retiring_capped_lookups`` / ``..._capped_tokens``.

Shipped as one file (ConfigMap key ``kvcache_l2_gate.py`` on the vLLM container's ``PYTHONPATH``)
and loaded by vLLM with ``--kv-transfer-config
'{"kv_connector":"GatedLMCacheConnectorV1","kv_connector_module_path":"kvcache_l2_gate",
"kv_role":"kv_both"}'``. Standard library at module level: vLLM (and LMCache beneath it) is imported
only when vLLM asks this module for :data:`CONNECTOR_CLASS_NAME` (module ``__getattr__``), and
``prometheus_client`` only in the scheduler process, so the project's venv can test the rest.

The chunk key (issue 25 item 3; docs/security.md, "Chunk keys"). The same connector, in every
process vLLM builds it in (scheduler and workers), starts LMCache's chain of chunk keys from the
line's secret ``KVCACHE_L2_KEY`` (:func:`apply_chunk_key`), so no one without the Secret can compute
the name of a prompt's chunk file. This does not depend on ``KVCACHE_L2_GATE_ENABLED``.

Settings (environment, read once per process by :meth:`GateSettings.from_env`; defaults and why in
:class:`GateSettings`): ``KVCACHE_L2_GATE_ENABLED``, ``KVCACHE_L2_GATE_PATH``,
``KVCACHE_L2_GATE_PROBE_INTERVAL_MS``, ``KVCACHE_L2_GATE_OPEN_AFTER_MS``,
``KVCACHE_L2_GATE_CLOSE_AFTER_MS``, ``KVCACHE_L2_GATE_MAX_CLOSE_AFTER_MS``,
``KVCACHE_L2_GATE_LOOKUP_SLOW_MS``. Each transition logs one line
``L2GATE open ...`` / ``L2GATE closed ...`` with its reason and the wall-clock time (logger
``vllm.kvcache_l2_gate``: a child of vLLM's ``vllm`` logger, so the lines come out with vLLM's own
handler and format).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHUNK_KEY_ENV",
    "CONNECTOR_CLASS_NAME",
    "apply_chunk_key",
    "GateProber",
    "GateSettings",
    "L2Gate",
    "RetiringWatcher",
    "l2_path_from_remote_url",
    "retiring_cap",
    "start_gate",
    "stat_fresh_name",
]

#: The class name vLLM's ``--kv-transfer-config`` must give as ``kv_connector``.
CONNECTOR_CLASS_NAME = "GatedLMCacheConnectorV1"
#: Prefix of every setting's environment variable.
ENV_PREFIX = "KVCACHE_L2_GATE_"
#: An open this soon (seconds) after the last close doubles the hold (:class:`L2Gate`). Ten seconds:
#: measured with a dead LMCache lookup server and a healthy mount (every lookup times out at 200 ms,
#: every probe answers), the gate reopened 0.5-2.5 s after each close.
REOPEN_WINDOW_S = 10.0
#: Prefix of the names the probe stats (never created: a probe only looks them up).
PROBE_NAME_PREFIX = ".kvcache-l2-gate-probe-"

#: The janitor's retiring list in the L2 directory (``cluster_agents/l2_janitor.py`` ``RETIRING_FILE``,
#: copied: a test keeps the two equal): ``{"version": 1, "retiring": {"<chunk hash hex>": <epoch s>}}``.
RETIRING_FILE = ".kvcache-retiring.json"
#: Seconds between two looks at the retiring list (a ``stat``; the file is read only when it changed).
RETIRING_POLL_S = 1.0
#: ``KVCACHE_L2_RETIRING_ENABLED``: ``0``/``false``/``no``/``off`` turns the filter off (default on).
RETIRING_ENABLED_ENV = "KVCACHE_L2_RETIRING_ENABLED"

#: A child of vLLM's logger, which vLLM configures (level INFO, its handler) in every process.
logger = logging.getLogger("vllm.kvcache_l2_gate")


def l2_path_from_remote_url(url: str | None) -> str | None:
    """The directory of an ``fs://host:port/path`` URL (``LMCACHE_REMOTE_URL``), or None for any other URL.

    LMCache 0.5.5 takes the fs connector's base path from the URL's path the same way
    (``parse_remote_url`` in ``lmcache/v1/storage_backend/connector/__init__.py``, called by
    ``FSConnectorAdapter.create_connector``); host and port are required there but ignored.
    """
    if not url or not url.startswith("fs://"):
        return None
    path = urllib.parse.urlparse(url).path
    return path or None


def _env_ms(env: Mapping[str, str], name: str, default_ms: float) -> float:
    """Seconds from the millisecond setting ``KVCACHE_L2_GATE_<name>``; ValueError when not a positive number."""
    raw = env.get(ENV_PREFIX + name)
    if raw is None or raw.strip() == "":
        return default_ms / 1000
    value = float(raw)
    if not value > 0:
        raise ValueError(f"{ENV_PREFIX}{name} must be a positive number of milliseconds, not {raw!r}")
    return value / 1000


@dataclass(frozen=True)
class GateSettings:
    """The gate's settings, in seconds (the environment gives milliseconds).

    Attributes:
        enabled: ``KVCACHE_L2_GATE_ENABLED`` (default on; ``0``/``false``/``no``/``off`` turns the
            connector into plain ``LMCacheConnectorV1``).
        path: directory probed: ``KVCACHE_L2_GATE_PATH``, else the path of ``LMCACHE_REMOTE_URL``
            (:func:`l2_path_from_remote_url`); None (no fs:// L2) disables the gate.
        probe_interval_s: ``..._PROBE_INTERVAL_MS``, default 50: the pause between probes and how
            often an outstanding probe's age is checked; one metadata call per interval per replica
            (20 per second) is noise for the Curvine Primary.
        open_after_s: ``..._OPEN_AFTER_MS``, default 50: a probe older than this opens the gate.
            A healthy lookup through the fault tier's FUSE mount took 1.7 ms p50 and 10.6 ms p99
            for 4 chunks (docs/l2-cache.md, "The fault tier"), one stat well under that; 50 ms is
            a quarter of the 200 ms ``LMCACHE_LOOKUP_TIMEOUT_MS`` a request pays when a lookup hangs.
            Detection window: between ``open_after_s`` and ``open_after_s + probe_interval_s``.
        close_after_s: ``..._CLOSE_AFTER_MS``, default 500: healthy probes needed without a break
            before the gate closes (about ten probes), so a flapping mount does not put every
            other request back on it.
        lookup_slow_s: ``..._LOOKUP_SLOW_MS``, default 100: a real LMCache lookup slower than this
            opens the gate too (it catches a fault the probe's one stat did not see, such as a
            lookup server stuck behind slow reads); well above the healthy p99 above.
        max_close_after_s: ``..._MAX_CLOSE_AFTER_MS``, default 30000: the longest the hold grows to
            when the gate keeps reopening (:data:`REOPEN_WINDOW_S`); a fault that only slow lookups
            see then costs one ``LMCACHE_LOOKUP_TIMEOUT_MS`` stall per 30 s.
    """

    enabled: bool = True
    path: str | None = None
    probe_interval_s: float = 0.05
    open_after_s: float = 0.05
    close_after_s: float = 0.5
    lookup_slow_s: float = 0.1
    max_close_after_s: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GateSettings:
        """Settings from ``env`` (default ``os.environ``).

        Raises:
            ValueError: a millisecond setting that is not a positive number.
        """
        env = os.environ if env is None else env
        enabled = env.get(ENV_PREFIX + "ENABLED", "1").strip().lower() not in ("0", "false", "no", "off")
        path = env.get(ENV_PREFIX + "PATH") or l2_path_from_remote_url(env.get("LMCACHE_REMOTE_URL"))
        return cls(enabled=enabled, path=path,
                   probe_interval_s=_env_ms(env, "PROBE_INTERVAL_MS", 50),
                   open_after_s=_env_ms(env, "OPEN_AFTER_MS", 50),
                   close_after_s=_env_ms(env, "CLOSE_AFTER_MS", 500),
                   lookup_slow_s=_env_ms(env, "LOOKUP_SLOW_MS", 100),
                   max_close_after_s=_env_ms(env, "MAX_CLOSE_AFTER_MS", 30000))


class L2Gate:
    """Open/closed state of one process's L2, from probe and lookup reports. Thread-safe; never blocks.

    Closed (L2 used) at start. Every report is timed with ``clock`` (seconds, monotonic);
    ``on_change(is_open, reason, now)`` is called (outside the lock) on each transition.
    Unhealthy reports (:meth:`probe_failed`, :meth:`probe_outstanding` or a probe/lookup over its
    threshold) open the gate and restart the healthy run; the gate closes at the first healthy
    probe that ends a run of healthy probes at least :attr:`hold_s` long. The hold starts at
    ``close_after_s`` and doubles (at most ``max_close_after_s``) on each open that comes less than
    :data:`REOPEN_WINDOW_S` after the last close; an open after a longer quiet resets it.
    """

    def __init__(self, *, open_after_s: float, close_after_s: float, lookup_slow_s: float,
                 max_close_after_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[bool, str, float], None] | None = None) -> None:
        self.open_after_s = open_after_s
        self.close_after_s = close_after_s
        self.max_close_after_s = max(close_after_s, max_close_after_s or close_after_s)
        self.lookup_slow_s = lookup_slow_s
        #: The healthy run (seconds) the gate needs now to close.
        self.hold_s = close_after_s
        self._closed_at: float | None = None
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._open = False
        self._healthy_since: float | None = None
        #: Lookups answered without LMCache while open (count).
        self.bypassed = 0

    @property
    def is_open(self) -> bool:
        """True while L2 is bypassed."""
        return self._open

    def _transition(self, to_open: bool, reason: str, now: float) -> None:
        if self._on_change is not None:
            self._on_change(to_open, reason, now)

    def _unhealthy(self, reason: str) -> None:
        now = self._clock()
        with self._lock:
            self._healthy_since = None
            changed = not self._open
            if changed:
                self._open = True
                soon = self._closed_at is not None and now - self._closed_at < REOPEN_WINDOW_S
                self.hold_s = min(self.hold_s * 2, self.max_close_after_s) if soon else self.close_after_s
                reason = f"{reason}; closes after {self.hold_s * 1000:.0f} ms of healthy probes"
        if changed:
            self._transition(True, reason, now)

    def _healthy(self) -> None:
        now = self._clock()
        with self._lock:
            if self._healthy_since is None:
                self._healthy_since = now
            changed = self._open and now - self._healthy_since >= self.hold_s
            if changed:
                self._open = False
                self._closed_at = now
                reason = f"probes healthy for {(now - self._healthy_since) * 1000:.0f} ms"
        if changed:
            self._transition(False, reason, now)

    def probe_done(self, latency_s: float) -> None:
        """A probe answered (a miss is an answer) after ``latency_s`` seconds."""
        if latency_s > self.open_after_s:
            self._unhealthy(f"probe answered after {latency_s * 1000:.0f} ms (> {self.open_after_s * 1000:.0f} ms)")
        else:
            self._healthy()

    def probe_failed(self, error: str) -> None:
        """A probe failed (``error``: what it raised, e.g. ``OSError(5, 'Input/output error')``)."""
        self._unhealthy(f"probe failed: {error}")

    def probe_outstanding(self, age_s: float) -> None:
        """The probe in flight has not answered for ``age_s`` seconds."""
        if age_s > self.open_after_s:
            self._unhealthy(f"probe outstanding {age_s * 1000:.0f} ms (> {self.open_after_s * 1000:.0f} ms)")

    def lookup_done(self, seconds: float) -> None:
        """A real LMCache lookup took ``seconds``; too slow opens the gate (a fast one proves nothing new)."""
        if seconds > self.lookup_slow_s:
            self._unhealthy(f"lookup took {seconds * 1000:.0f} ms (> {self.lookup_slow_s * 1000:.0f} ms)")


def stat_fresh_name(directory: str) -> Callable[[], None]:
    """A probe of ``directory``: ``os.stat`` of a name never used before; returns when it is absent.

    Returns a function that returns None when the file system answered (``FileNotFoundError``, or,
    improbably, a file of that name) and raises ``OSError`` otherwise (``EIO``, ``ENOTCONN``,
    ``EACCES``...). The name carries the pid and a counter, so no cached entry can answer it.
    """
    counter = itertools.count()
    prefix = os.path.join(directory, f"{PROBE_NAME_PREFIX}{os.getpid()}-")

    def probe() -> None:
        try:
            os.stat(f"{prefix}{next(counter)}")
        except FileNotFoundError:
            return

    return probe


class _Periodic:
    """Calls :meth:`_tick` every ``interval_s`` on a daemon thread of its own (named ``thread_name``)
    from :meth:`start` until :meth:`stop`; an exception of one tick is logged (prefix ``log_prefix``)
    and the loop goes on, so no bug of one tick stops the thread."""

    def __init__(self, interval_s: float, *, thread_name: str, log_prefix: str) -> None:
        self.interval_s = interval_s
        self._thread_name, self._log_prefix = thread_name, log_prefix
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tick(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - the loop must outlive any bug of one tick
                logger.exception("%s %s failed", self._log_prefix, self._thread_name)
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        """Start the loop on a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._thread_name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the loop (waits at most a second for a tick in progress)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)


class GateProber(_Periodic):
    """Runs ``probe`` every ``interval_s`` on a daemon thread of its own, at most one at a time, reporting to ``gate``.

    ``step()`` is one tick of the loop (public so tests can drive it): with no probe in flight it
    starts one; with one in flight it reports the probe's age (:meth:`L2Gate.probe_outstanding`).
    A probe that never returns keeps its thread forever and stops further probes, so the gate stays
    open (the replica serves without L2) until that operation returns: one stuck thread at most.
    """

    def __init__(self, gate: L2Gate, probe: Callable[[], None], *, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(interval_s, thread_name="l2-gate-prober", log_prefix="L2GATE")
        self.gate = gate
        self.probe = probe
        self._clock = clock
        self._lock = threading.Lock()
        self._started_at: float | None = None
        #: Probes started (count).
        self.probes = 0

    def _run_probe(self, started_at: float) -> None:
        error: str | None = None
        try:
            self.probe()
        except Exception as exc:  # noqa: BLE001 - any failure of the mount is a failed probe
            error = repr(exc)
        latency = self._clock() - started_at
        with self._lock:
            self._started_at = None
        if error is None:
            self.gate.probe_done(latency)
        else:
            self.gate.probe_failed(error)

    def step(self) -> None:
        """Start a probe, or report the age of the one in flight."""
        now = self._clock()
        with self._lock:
            started_at = self._started_at
            if started_at is None:
                self._started_at = now
                self.probes += 1
        if started_at is not None:
            self.gate.probe_outstanding(now - started_at)
            return
        threading.Thread(target=self._run_probe, args=(now,), name="l2-gate-probe", daemon=True).start()

    def _tick(self) -> None:
        self.step()  # a probe in flight is left to its own daemon thread when the loop stops


def retiring_cap(chunks: Any, hit_end: int, retiring: frozenset[str]) -> int:
    """Where a hit of ``hit_end`` tokens must stop so that no retiring chunk is loaded.

    Args:
        chunks: ``(start, end, chunk hash hex)`` of the request's chunks in token order (LMCache's
            ``process_tokens``), at least those that start before ``hit_end``.
        hit_end: the tokens LMCache's lookup found (from the first token).
        retiring: hashes on the retiring list.

    Returns:
        The start of the first retiring chunk before ``hit_end``, else ``hit_end``.
    """
    for start, _end, chunk_hash in chunks:
        if start >= hit_end:
            break
        if chunk_hash in retiring:
            return start
    return hit_end


class RetiringWatcher(_Periodic):
    """The hashes on the janitor's retiring list of ``directory``, kept current by a daemon thread.

    Every ``interval_s`` the thread ``stat``\ s :data:`RETIRING_FILE` and reads it only when its
    (inode, size, mtime) changed; no file is an empty list. A list it cannot read or parse keeps
    the last one (logged once per change); a hung mount keeps this one thread waiting, nothing else.
    :attr:`hashes` never blocks.
    """

    def __init__(self, directory: str, *, interval_s: float = RETIRING_POLL_S,
                 on_change: Callable[[frozenset[str]], None] | None = None) -> None:
        super().__init__(interval_s, thread_name="l2-retiring", log_prefix="L2RETIRING")
        self.path = os.path.join(directory, RETIRING_FILE)
        self.hashes: frozenset[str] = frozenset()
        self._stamp: tuple[int, int, int] | None = None
        self._on_change = on_change

    def refresh(self) -> None:
        """One look at the list (what the thread does every ``interval_s``)."""
        import json

        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            stamp, hashes = None, frozenset()
        except OSError as exc:
            logger.warning("L2RETIRING cannot stat %s: %r; keeping %d hashes", self.path, exc, len(self.hashes))
            return
        else:
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp == self._stamp:
                return
            try:
                with open(self.path, encoding="utf-8") as f:
                    hashes = frozenset(str(h) for h in json.load(f)["retiring"])
            except FileNotFoundError:
                stamp, hashes = None, frozenset()
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("L2RETIRING cannot read %s: %r; keeping %d hashes", self.path, exc, len(self.hashes))
                self._stamp = stamp
                return
        if stamp == self._stamp and hashes == self.hashes:
            return
        self._stamp = stamp
        if hashes != self.hashes:
            self.hashes = hashes
            if self._on_change is not None:
                self._on_change(hashes)

    def _tick(self) -> None:
        self.refresh()


def start_retiring(settings: GateSettings, env: Mapping[str, str] | None = None) -> RetiringWatcher | None:
    """A started :class:`RetiringWatcher` of ``settings.path``; None without an fs:// L2 or when
    ``KVCACHE_L2_RETIRING_ENABLED`` turns it off."""
    env = os.environ if env is None else env
    if not settings.path or env.get(RETIRING_ENABLED_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        logger.info("L2RETIRING off (path=%r)", settings.path)
        return None
    registry = _Metrics.get()

    def on_change(hashes: frozenset[str]) -> None:
        logger.info("L2RETIRING %d chunks on the retiring list of %s", len(hashes), settings.path)
        if registry is not None:
            registry.retiring.set(len(hashes))

    watcher = RetiringWatcher(settings.path, on_change=on_change)
    watcher.start()
    return watcher


class _Metrics:
    """The gate's Prometheus metrics, when ``prometheus_client`` is importable (it is in vLLM's image).

    vLLM serves every process's metrics from ``PROMETHEUS_MULTIPROC_DIR`` (the L2 patch sets it:
    ``k8s/lmcache.py`` ``PROMETHEUS_MULTIPROC_DIR_ENV``), so plain ``Gauge``/``Counter`` objects of
    the scheduler process reach ``/metrics``; the gauge uses ``multiprocess_mode="livemax"`` (only
    live processes, the highest value). Created once per process (a second registration of a name
    is refused by ``prometheus_client``).
    """

    _instance: _Metrics | None = None

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.open = Gauge("kvcache_l2_gate_open", "1 while the L2 gate bypasses LMCache lookups and saves",
                          multiprocess_mode="livemax")
        self.bypassed = Counter("kvcache_l2_gate_bypassed_lookups",
                                "Lookups answered with 0 hit tokens without asking LMCache (gate open)")
        self.transitions = Counter("kvcache_l2_gate_transitions", "L2 gate transitions", ["to"])
        self.retiring = Gauge("kvcache_l2_retiring_chunks", "Chunks on the janitor's retiring list (never loaded)",
                              multiprocess_mode="livemax")
        self.capped = Counter("kvcache_l2_retiring_capped_lookups",
                              "Lookups whose L2 hit was shortened before a retiring chunk")
        self.capped_tokens = Counter("kvcache_l2_retiring_capped_tokens",
                                     "Hit tokens not loaded because a chunk before them is retiring")

    @classmethod
    def get(cls) -> _Metrics | None:
        """The process's metrics, or None when ``prometheus_client`` cannot be used."""
        if cls._instance is None:
            try:
                cls._instance = cls()
            except Exception as exc:  # noqa: BLE001 - metrics are optional; the gate is not
                logger.warning("L2GATE metrics disabled: %r", exc)
                return None
        return cls._instance


@dataclass
class GateRuntime:
    """A running gate of one process: the state machine, its prober and its metrics (or None)."""

    settings: GateSettings
    gate: L2Gate
    prober: GateProber
    metrics: _Metrics | None

    def bypass(self) -> None:
        """Count one lookup answered without LMCache."""
        self.gate.bypassed += 1
        if self.metrics is not None:
            self.metrics.bypassed.inc()

    def stop(self) -> None:
        """Stop probing."""
        self.prober.stop()


def start_gate(settings: GateSettings, *, probe: Callable[[], None] | None = None,
               clock: Callable[[], float] = time.monotonic, metrics: bool = True) -> GateRuntime | None:
    """Start a gate and its prober for ``settings``; None when disabled or there is no fs:// directory.

    ``probe`` defaults to :func:`stat_fresh_name` of ``settings.path``. Logs the settings once and
    one ``L2GATE open|closed`` line per transition.
    """
    if not settings.enabled or not settings.path:
        logger.info("L2GATE off (enabled=%s, path=%r)", settings.enabled, settings.path)
        return None
    registry = _Metrics.get() if metrics else None

    def on_change(is_open: bool, reason: str, now: float) -> None:
        logger.warning("L2GATE %s wall=%.3f: %s", "open" if is_open else "closed", time.time(), reason)
        if registry is not None:
            registry.open.set(1 if is_open else 0)
            registry.transitions.labels(to="open" if is_open else "closed").inc()

    gate = L2Gate(open_after_s=settings.open_after_s, close_after_s=settings.close_after_s,
                  lookup_slow_s=settings.lookup_slow_s, max_close_after_s=settings.max_close_after_s,
                  clock=clock, on_change=on_change)
    if registry is not None:
        registry.open.set(0)
    prober = GateProber(gate, probe or stat_fresh_name(settings.path), interval_s=settings.probe_interval_s,
                        clock=clock)
    prober.start()
    logger.info("L2GATE on: probing %s every %.0f ms, open after %.0f ms, close after %.0f ms healthy, "
                "lookups slower than %.0f ms open it", settings.path, settings.probe_interval_s * 1000,
                settings.open_after_s * 1000, settings.close_after_s * 1000, settings.lookup_slow_s * 1000)
    return GateRuntime(settings, gate, prober, registry)


#: The line's chunk-key secret (``secretKeyRef`` to the line's Secret, docs/security.md "Chunk keys").
CHUNK_KEY_ENV = "KVCACHE_L2_KEY"
#: The only ``pre_caching_hash_algorithm`` a key is applied with: a cryptographic hash of a CBOR
#: encoding (vLLM 0.29.0 ``vllm/utils/hashing.py`` ``sha256_cbor``). With ``builtin`` the chain is
#: Python's tuple hash, whose collisions do not depend on where the chain starts, so a key would
#: hide nothing: the connector refuses to start.
KEYED_HASH_ALGORITHM = "sha256_cbor"


def apply_chunk_key(env: Mapping[str, str] | None = None, *, algorithm: str | None = None,
                    token_database: Any = None, hash_fn: Callable[[Any], bytes] | None = None) -> str | None:
    """Start LMCache's chunk-key chain of this process from the line's secret; the secret's fingerprint,
    or None when ``KVCACHE_L2_KEY`` is unset or empty (names stay LMCache's stock ones, from
    ``PYTHONHASHSEED``).

    Why here. LMCache 0.5.5 starts every chain from its module global ``NONE_HASH``
    (``lmcache/v1/token_database.py``: ``ChunkedTokenDatabase._get_init_hash``), which each
    ``TokenDatabase.__init__`` sets from vLLM's ``init_none_hash(hash_fn)``, i.e. ``hash_fn`` of the
    string ``PYTHONHASHSEED`` (vLLM 0.29.0 ``vllm/v1/core/kv_cache_utils.py``
    ``resolve_none_hash_seed``). That string could carry a secret only if CPython accepted it, and
    CPython refuses to start unless it is ``random`` or an integer up to 4294967295 (32 bits:
    ``Python/initconfig.c`` ``config_init_hash_seed``). No other setting of either enters the key:
    LMCache's ``extra_keys`` are always empty for a chunk chain, and vLLM's per-request
    ``cache_salt`` reaches vLLM's own block hashes only. So the connector, built by vLLM in every
    process that keys chunks (scheduler and workers), sets ``NONE_HASH`` to
    ``_normalize_hash_to_int(sha256_cbor(secret))`` after LMCache's connector has built its token
    databases: what ``init_none_hash`` would give with ``PYTHONHASHSEED`` set to the secret. The
    hot-prefix warmer computes the same start (``cluster_agents.hot_prefixes.keyed_none_hash``).

    ``algorithm``, ``token_database`` and ``hash_fn`` default to LMCache's configured
    ``pre_caching_hash_algorithm``, ``lmcache.v1.token_database`` and vLLM's ``sha256_cbor`` (tests
    pass their own).

    Raises:
        RuntimeError: a key is set but LMCache hashes chunks with another algorithm than
            :data:`KEYED_HASH_ALGORITHM` (the key would protect nothing; the pod fails to start).
    """
    env = os.environ if env is None else env
    secret = env.get(CHUNK_KEY_ENV) or ""
    if not secret.strip():
        logger.warning("L2KEYS unkeyed: %s is not set, so chunk names follow from PYTHONHASHSEED alone", CHUNK_KEY_ENV)
        return None
    if algorithm is None:
        from lmcache.integration.vllm.utils import lmcache_get_or_create_config

        algorithm = lmcache_get_or_create_config().pre_caching_hash_algorithm
    if algorithm != KEYED_HASH_ALGORITHM:
        raise RuntimeError(f"{CHUNK_KEY_ENV} is set but LMCache's pre_caching_hash_algorithm is {algorithm!r}: a "
                           f"chunk key needs {KEYED_HASH_ALGORITHM!r}")
    if token_database is None:
        from lmcache.v1 import token_database as lmcache_token_database

        token_database = lmcache_token_database
    if hash_fn is None:
        from vllm.utils.hashing import sha256_cbor

        hash_fn = sha256_cbor
    token_database.NONE_HASH = token_database._normalize_hash_to_int(hash_fn(secret))
    fingerprint = hashlib.sha256(secret.encode("utf-8")).hexdigest()[:8]
    logger.info("L2KEYS keyed: chunk names start from %s (%s, key fingerprint %s)", CHUNK_KEY_ENV,
                algorithm, fingerprint)
    return fingerprint


def _skip_saves(metadata: Any) -> int:
    """Mark every request of an LMCache connector metadata as not to be saved; returns how many were.

    ``LMCacheConnectorMetadata.requests`` holds ``ReqMeta`` objects whose ``save_spec``
    (``SaveSpec(skip_leading_tokens, can_save)``) the worker reads in ``save_kv_layer`` and
    ``wait_for_save``: ``can_save`` False skips the store, the path LMCache itself takes for a
    request in decode (``lmcache/integration/vllm/vllm_v1_adapter.py``, 0.5.5). ``wait_for_save``
    still releases the request's lookup pins (``lookup_unpin`` comes before its ``can_save`` test),
    so a request looked up before the gate opened leaves nothing pinned in L1. The request's
    tracker has already counted those tokens as saved, so they are not stored later either.
    """
    skipped = 0
    for request in getattr(metadata, "requests", ()) or ():
        spec = getattr(request, "save_spec", None)
        if spec is not None and getattr(spec, "can_save", False):
            spec.can_save = False
            skipped += 1
    return skipped


def _build_connector_class() -> type:
    """``GatedLMCacheConnectorV1``: vLLM's ``LMCacheConnectorV1`` with the gate in its scheduler-side calls
    and the line's chunk key in every process (:func:`apply_chunk_key`).

    vLLM 0.29.0 (``vllm/distributed/kv_transfer/kv_connector/v1/lmcache_connector.py``) builds the
    connector twice: with ``KVConnectorRole.SCHEDULER`` in the engine core's scheduler and with
    ``KVConnectorRole.WORKER`` in each worker. Only the scheduler's instance starts a gate; every
    instance applies the line's chunk key (:func:`apply_chunk_key`).
    """
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

    class GatedLMCacheConnectorV1(LMCacheConnectorV1):  # type: ignore[misc, valid-type]
        """LMCacheConnectorV1 whose scheduler side skips LMCache while the L2 gate is open (module docstring)."""

        _l2_gate: GateRuntime | None = None
        _l2_retiring: RetiringWatcher | None = None

        # The parent's signature, spelled out: vLLM 0.29.0's KVConnectorFactory.get_connector_class
        # refuses an external connector whose constructor lacks ``kv_cache_config`` (supports_kw).
        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            super().__init__(vllm_config, role, kv_cache_config)
            # After LMCache built its token databases (each one resets NONE_HASH): apply_chunk_key.
            apply_chunk_key()
            if role == KVConnectorRole.SCHEDULER:
                settings = GateSettings.from_env()
                self._l2_gate = start_gate(settings)
                self._l2_retiring = start_retiring(settings)

        def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
            runtime = self._l2_gate
            if runtime is None:
                return self._without_retiring(request, num_computed_tokens,
                                              super().get_num_new_matched_tokens(request, num_computed_tokens))
            if runtime.gate.is_open:
                # As a replica without L2: nothing to load, nothing to wait for. A request whose
                # async lookup was in flight is cleaned up by update_state_after_alloc, which
                # vLLM still calls (LMCache's clears the lookup client's status there).
                runtime.bypass()
                return 0, False
            started = time.monotonic()
            try:
                found = super().get_num_new_matched_tokens(request, num_computed_tokens)
            finally:
                runtime.gate.lookup_done(time.monotonic() - started)
            return self._without_retiring(request, num_computed_tokens, found)

        def _without_retiring(self, request: Any, num_computed_tokens: int,
                              found: tuple[int | None, bool]) -> tuple[int | None, bool]:
            """``found`` (LMCache's answer) shortened to end before the first retiring chunk, with the
            load spec LMCache recorded for the request shortened to match (module docstring)."""
            need, load_async = found
            watcher = self._l2_retiring
            retiring = watcher.hashes if watcher is not None else frozenset()
            if not need or not retiring:
                return found
            impl = self._lmcache_engine
            spec = getattr(impl, "load_specs", {}).get(request.request_id)
            database = getattr(getattr(impl, "lookup_client", None), "token_database", None)
            if spec is None or database is None:
                return found
            hit_end = spec.lmcache_cached_tokens
            keys = database.process_tokens(list(request.all_token_ids)[:hit_end], make_key=True)
            cap = retiring_cap(((start, end, key.chunk_hash_hex) for start, end, key in keys), hit_end, retiring)
            if cap >= hit_end:
                return found
            # LMCache asserts, when vLLM allocates, that it loads lmcache_cached - vllm_cached tokens
            # (update_state_after_alloc); a cap below what vLLM holds itself loads nothing.
            spec.lmcache_cached_tokens = max(cap, num_computed_tokens)
            metrics = _Metrics.get()
            if metrics is not None:
                metrics.capped.inc()
                metrics.capped_tokens.inc(hit_end - spec.lmcache_cached_tokens)
            return max(cap - num_computed_tokens, 0), load_async

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            metadata = super().build_connector_meta(scheduler_output)
            runtime = self._l2_gate
            if runtime is not None and runtime.gate.is_open:
                _skip_saves(metadata)
            return metadata

        def shutdown(self) -> Any:
            if self._l2_gate is not None:
                self._l2_gate.stop()
            if self._l2_retiring is not None:
                self._l2_retiring.stop()
            parent = getattr(super(), "shutdown", None)
            return parent() if callable(parent) else None

    GatedLMCacheConnectorV1.__module__ = __name__
    GatedLMCacheConnectorV1.__qualname__ = CONNECTOR_CLASS_NAME
    return GatedLMCacheConnectorV1


_connector_class: type | None = None


def __getattr__(name: str) -> Any:
    """Module attribute ``GatedLMCacheConnectorV1``, built (importing vLLM) on first access.

    vLLM's ``KVConnectorFactory`` imports ``kv_connector_module_path`` and takes the class with
    ``getattr``, which lands here (PEP 562), so importing this module needs no vLLM.
    """
    global _connector_class
    if name == CONNECTOR_CLASS_NAME:
        if _connector_class is None:
            _connector_class = _build_connector_class()
        return _connector_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
