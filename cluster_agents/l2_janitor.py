"""The per-line L2 janitor: bounds a business line's Curvine L2 directory by age and by size.

Why it exists (docs/sources.md §9): LMCache's fs connector never deletes a chunk; Curvine
v0.3.2-alpha's quota eviction deletes nothing (``execute_eviction`` counts a file as evicted
after ``execute_by_id`` returned early because its TTL had not expired); ``CreateVolume`` sets
no quota, so a PVC's size bounds nothing; and a Curvine client TTL also lands on directories
(``MkdirOptsBuilder::with_conf``) and deletes them recursively. So each line runs this module
in a single-replica Deployment that mounts the line's PVC and, every :data:`PERIOD_S`, makes one
*pass* (:func:`run`) over it, on chunk *files* only:

1. removes per-pod temp directories (``.tmp-<token>``, LMCache ``fs_connector_relative_tmp_dir``)
   that no live Pod uses, and stray ``*.tmp`` files of the layout without a temp directory;
2. removes the directories of models no longer configured: top-level directories that are not
   *protected* (:mod:`cluster_agents.l2_directories`): not the live one (``live_dir``,
   :func:`k8s.lmcache.l2_cache_dir`), not the one the previous configuration named, not named by
   a running or pending Pod's ``LMCACHE_REMOTE_URL``, and not named by the configuration or a Pod
   within ``dir_grace_s`` (24 h). The configurations and Pods seen are kept in a small state file
   at the PVC root (written atomically before anything is deleted), so a rollback finds its
   directory, whichever janitor runs. Right before a directory goes, the Pods
   are listed and the state read again, and the directory is renamed aside
   (:data:`TRASH_PREFIX`) before it is deleted, so a Pod starting on it finds it whole or not at
   all. Chunk files directly at the root (the old flat layout) count as such a directory;
3. deletes chunk files older than ``max_age_s`` (``curvine.eviction.ttl_hours``);
4. above ``high_watermark`` x ``capacity_bytes`` (the PVC's ``l2_size``), deletes the oldest
   chunk files until usage is at most ``low_watermark`` x ``capacity_bytes``.

Steps 3 and 4 never delete a chunk of ``live_dir`` whose hash is one of the line's hot prefixes'
(``pinned``, computed by :mod:`cluster_agents.hot_prefixes`, which runs as a thread of this process with
``--hot-prefixes``); those bytes still count against the capacity.

Nothing younger than ``min_delete_age_s`` is ever deleted (docs/l2-cache.md explains the value),
and steps 1 and 2 run only when the live Pods could be listed (without that list the janitor
cannot tell a live temp directory or an old model's still-serving directory from garbage); step
2 also only when the state file could be read and written. A pass that finds no state file (the
first one, or after it was lost) records every directory present as in use now: nothing is
removed for ``dir_grace_s``.

Chunk files are ``<model path, '/' as -SEP->@<world size>@<worker id>@<chunk hash>@<dtype>.data``,
with ``@<tag>%<value>`` before ``.data`` for each request tag if any (``FSConnector._get_file_name``
and ``CacheEngineKey.to_string``, lmcache 0.5.5, the pinned release); the janitor relies only on the
``.data`` suffix (and the hash, ``@``-separated, for pinning: :func:`chunk_hash_of`). Curvine updates a file's atime
only on an explicit ``set_attr`` (reads do not; the kernel's FUSE client never does), so "oldest" is by mtime: the
time the chunk was first stored, however often it is hit since (LMCache never rewrites a chunk it hits).

Output of every pass: one JSON line on stdout (``"event": "kvcache_l2_janitor"``, see
:class:`RunSummary`), the same JSON as the container's termination message, and its status as
the exit code of a one-shot run, on the operator tools' convention (``operator_tools/cli.py``: 0 fine,
1 "the answer is no", 2 an error; never 1 for an error): :data:`EXIT_OK` 0 done and usage at or
below the high watermark; :data:`EXIT_ABOVE_HIGH_WATERMARK` 1 still above it (everything left is
younger than the minimum age); :data:`EXIT_ERROR` 2 an error (a deletion failed, the Pods could
not be listed, the PVC is not mounted, a bad ``--config``, a bad flag).

``--serve`` (what the chart runs) keeps the process up: one pass every ``--period-s``, one at a
time, and an HTTP server (standard library ``http.server``, :func:`make_server`) on ``--port``:

* ``GET /metrics``: the last finished pass in the Prometheus text format (:func:`prometheus_text`;
  empty until the first pass finishes), scraped by the observability stack;
* ``GET /healthz`` (liveness): 200 unless the running pass has taken longer than
  ``--pass-deadline-s`` (a pass stuck on the FUSE mount), so the kubelet restarts the container;
* ``GET /readyz`` (readiness): 200 once a pass finished and the last one had no errors (status 0
  or 1), else 503: a failing janitor shows as not ready in ``kubectl get pods``.

Standard library only: the chart ships this file, ``l2_directories.py`` and ``agent_core.py`` (what
the in-cluster agents share) in a ConfigMap and runs it with a pinned ``python`` image, so no image
has to be built. Run locally with ``--dry-run`` to see what one pass would do::

    python cluster_agents/l2_janitor.py --config janitor.json --root /mnt/curvine/l2cache --dry-run
"""

from __future__ import annotations

import argparse
import base64
import errno
import json
import os
import secrets
import shutil
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

if __package__:  # imported as cluster_agents.l2_janitor
    from . import agent_core as core
    from . import l2_directories as dirs
else:  # run from its ConfigMap, agent_core.py and l2_directories.py beside it
    import agent_core as core
    import l2_directories as dirs

#: Suffix of LMCache's chunk files and of its temp files without a temp directory
#: (``file_path.with_suffix(".tmp")``), lmcache 0.5.5 ``fs_connector.py``.
CHUNK_SUFFIX = ".data"
LEGACY_TMP_SUFFIX = ".tmp"
#: Prefix of the per-pod temp directories (``k8s.lmcache.TMP_DIR_PREFIX``).
TMP_DIR_PREFIX = ".tmp-"
#: The hot-prefix warmer's record at the PVC root (``cluster_agents.hot_prefixes.STATE_FILE``, copied: a
#: test keeps the two equal). Not a chunk file: never counted, never deleted.
HOT_PREFIX_STATE_FILE = ".kvcache-hot-prefixes.json"
#: Prefix a directory is renamed to right before it is deleted; a pass removes any it finds.
TRASH_PREFIX = ".kvcache-l2-janitor-trash-"
#: A chunk directory's *retiring list*: the chunks the janitor evicted (age or watermark), by hash,
#: with when; every replica's L2 connector reads it and stops loading them (``vllm_plugins/l2_gate.py``
#: ``RETIRING_FILE``, copied: a test keeps the two equal), and a later pass deletes their files.
#: Written whole (:data:`RETIRING_NEW_SUFFIX` file, then renamed over it). Not a chunk file.
RETIRING_FILE = ".kvcache-retiring.json"
RETIRING_NEW_SUFFIX = ".new"
#: Seconds between a chunk's retirement and the deletion of its files (the first pass after, i.e.
#: the next one: :data:`PERIOD_S`). It must outlast how late a replica sees the list (its connector
#: re-reads it every second when it changed, and Curvine's FUSE client caches attributes 1 s) plus
#: how long a request looked up before that may still be loading (a chunk read is bounded by
#: ``LMCACHE_BLOCKING_TIMEOUT_SECS``, 1 s rendered). 0 deletes at once, as before retirement existed.
RETIRE_GRACE_S = 60.0
#: A directory the configuration or a Pod named within this many seconds is kept: long enough for
#: a rollback after a bad rollout, Pods that wait for GPUs or for admission, and a janitor that was
#: down; and it costs no capacity, because the age limit and the watermarks still delete the
#: directory's chunk files (with ``ttl_hours`` 24 an unused directory is empty by then anyway).
DIR_GRACE_S = 24 * 3600

#: Exit codes of a one-shot run and values of the ``status`` gauge, on the convention of the
#: operator tools (``operator_tools.cli.EXIT_CODES``, whose row for this file a test keeps equal to
#: :data:`EXIT_EPILOG`; copied, not imported: operator_tools/cli.py is not in the ConfigMap).
EXIT_OK = 0
EXIT_ABOVE_HIGH_WATERMARK = 1
EXIT_ERROR = 2
EXIT_EPILOG = ("exit status: 0 = the pass finished at or below the high watermark; 1 = still above the "
               "high watermark after the pass (everything left is younger than the minimum age); 2 = an "
               "error: a deletion failed, the Pods could not be listed, the PVC is not mounted, or bad "
               "flags or config.")

#: Seconds from the start of one pass to the start of the next (``--serve``). The pool must
#: absorb what lines write in one period (``curvine.l2_pool_reserve_fraction``); the minimum
#: deletable age (``k8s.janitor.MIN_DELETE_AGE_S``) is at least one period.
PERIOD_S = 600
#: A pass running longer than this fails the liveness check (the container is restarted).
PASS_DEADLINE_S = 1800
#: Port of the HTTP server (``--serve``) and its paths.
METRICS_PORT = 9100
METRICS_PATH = "/metrics"
LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"
#: Gauges the dashboards and alerts read (observability/metrics.py imports these names).
METRIC_PREFIX = "kvcache_l2_janitor_"
USED_BYTES_METRIC = METRIC_PREFIX + "used_bytes"
LAST_RUN_METRIC = METRIC_PREFIX + "last_run_timestamp_seconds"
ERRORS_METRIC = METRIC_PREFIX + "errors"
PINNED_BYTES_METRIC = METRIC_PREFIX + "pinned_bytes"


@dataclass(frozen=True)
class JanitorConfig:
    """What the chart renders into ``janitor.json`` (:func:`config_from_dict` reads it).

    Attributes:
        line: business line name (for the summary).
        namespace: the line's namespace (its Pods are listed there).
        live_dir: the live model directory under the PVC root (one path component).
        capacity_bytes: the PVC's ``l2_size`` in bytes.
        high_watermark, low_watermark: fractions of ``capacity_bytes`` (0 < low < high <= 1).
        max_age_s: chunk files older than this are deleted; None: no age limit.
        min_delete_age_s: nothing younger than this is deleted.
        mount_path: where the vLLM Pods mount the PVC (to read their ``LMCACHE_REMOTE_URL``).
        dir_grace_s: a directory the configuration or a Pod named within this many seconds is
            kept (:data:`DIR_GRACE_S`).
        retire_grace_s: seconds an evicted chunk stays on the retiring list before its files are
            deleted (:data:`RETIRE_GRACE_S`; 0: deleted at once).
        key_secret: the line's chunk-key Secret (:class:`ChunkKey`): the janitor creates it when it
            is missing and never changes it; None: the line's chunk names are not keyed.
    """

    line: str
    namespace: str
    live_dir: str
    capacity_bytes: int
    high_watermark: float
    low_watermark: float
    max_age_s: float | None
    min_delete_age_s: float
    mount_path: str
    dir_grace_s: float = DIR_GRACE_S
    retire_grace_s: float = RETIRE_GRACE_S
    key_secret: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.low_watermark < self.high_watermark <= 1:
            raise ValueError(f"watermarks must satisfy 0 < low < high <= 1, got {self.low_watermark}, "
                             f"{self.high_watermark}")
        if "/" in self.live_dir or self.live_dir in ("", ".", "..") or self.live_dir.startswith(TMP_DIR_PREFIX):
            raise ValueError(f"live_dir must be one path component, got {self.live_dir!r}")
        if self.capacity_bytes <= 0 or self.min_delete_age_s < 0 or self.dir_grace_s < 0 or self.retire_grace_s < 0:
            raise ValueError("capacity_bytes must be > 0, min_delete_age_s, dir_grace_s and retire_grace_s >= 0")


def config_from_dict(data: dict[str, Any]) -> JanitorConfig:
    """:class:`JanitorConfig` from the rendered JSON; ValueError on a missing or bad key."""
    return core.config_from_dict(JanitorConfig, data, "janitor")


@dataclass
class RunSummary:
    """What one run measured and did (the JSON line; bytes are bytes, ages seconds)."""

    event: str = "kvcache_l2_janitor"
    line: str = ""
    namespace: str = ""
    live_dir: str = ""
    dry_run: bool = False
    capacity_bytes: int = 0
    high_watermark_bytes: int = 0
    low_watermark_bytes: int = 0
    used_bytes_before: int = 0
    used_bytes_after: int = 0
    files_before: int = 0
    chunk_files_after: int = 0
    oldest_chunk_age_s_after: float | None = None
    pods_listed: bool = False
    live_pods: int = 0
    tmp_dirs_deleted: int = 0
    stale_model_dirs_deleted: int = 0
    stale_files_deleted: int = 0
    #: Chunk files the age limit and the watermarks evicted this pass: put on the retiring list
    #: (deleted at once when ``retire_grace_s`` is 0, or in the old flat layout).
    expired_chunks_deleted: int = 0
    evicted_chunks_deleted: int = 0
    #: Chunk files deleted this pass because their retirement is ``retire_grace_s`` old.
    retired_files_deleted: int = 0
    #: Chunks (hashes) on the retiring lists after the pass, and the bytes of their files still on disk.
    retiring_chunks: int = 0
    retiring_bytes: int = 0
    bytes_freed: int = 0
    #: Directories at the root kept although no longer configured, each with why
    #: (:func:`cluster_agents.l2_directories.protected_dirs`; ``""`` is the old flat layout at the root).
    protected_dirs: dict[str, str] = field(default_factory=dict)
    above_high_watermark_after: bool = False
    #: Chunk files of the configured directory whose chunk is a declared hot prefix's (never deleted),
    #: their bytes (counted in ``used_bytes_after``), and how many of them the age limit or the
    #: watermarks would have deleted this pass (:func:`run`, ``pinned``).
    pinned_chunk_files: int = 0
    pinned_bytes: int = 0
    pinned_chunks_kept: int = 0
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    #: When the pass finished, seconds since the epoch.
    finished_at: float = 0.0

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_OK` 0 ok, :data:`EXIT_ABOVE_HIGH_WATERMARK` 1 still above the high
        watermark, :data:`EXIT_ERROR` 2 errors (errors win)."""
        if self.errors:
            return EXIT_ERROR
        return EXIT_ABOVE_HIGH_WATERMARK if self.above_high_watermark_after else EXIT_OK


@dataclass(frozen=True)
class _File:
    rel: str
    size: int
    mtime: float
















def _scan(root: Path) -> list[_File]:
    files: list[_File] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if name in (dirs.STATE_FILE, HOT_PREFIX_STATE_FILE) and Path(dirpath) == root:
                continue  # the janitor's own records, not L2 content
            if name in (RETIRING_FILE, RETIRING_FILE + RETIRING_NEW_SUFFIX):
                continue
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue  # removed meanwhile (a rename by LMCache, another janitor run)
            files.append(_File(path.relative_to(root).as_posix(), st.st_size, st.st_mtime))
    return files


def _newest_mtime(root: Path, rel: str, files: list[_File]) -> float:
    prefix = rel + "/"
    mtimes = [f.mtime for f in files if f.rel.startswith(prefix)]
    try:
        mtimes.append((root / rel).stat().st_mtime)
    except FileNotFoundError:
        pass
    return max(mtimes, default=0.0)


def chunk_hash_of(name: str) -> str | None:
    """The chunk hash (hex) in an LMCache chunk file name, ``<model>@<world size>@<worker id>@<hash>@<dtype>
    [@tags].data`` split on ``@`` as ``CacheEngineKey.from_string`` splits it; None for another name."""
    if not name.endswith(CHUNK_SUFFIX):
        return None
    parts = name[:-len(CHUNK_SUFFIX)].split("@")
    return parts[3] if len(parts) >= 5 else None


def _top(rel: str) -> str:
    return rel.split("/", 1)[0]


def read_retiring(directory: Path) -> dict[str, float]:
    """The retiring list of a chunk directory: chunk hash (hex) -> when it was retired (seconds since
    the epoch); empty when there is none.

    Raises:
        ValueError: the file is not a list this module wrote (so it is never overwritten blindly).
        OSError: it cannot be read (a failing mount).
    """
    try:
        text = (directory / RETIRING_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(text)
        entries = doc["retiring"]
        return {str(h): float(t) for h, t in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{directory / RETIRING_FILE} is not a retiring list: {exc!r}") from None


def write_retiring(directory: Path, entries: dict[str, float]) -> None:
    """Replace the retiring list of ``directory`` in one rename (a reader sees the old list or the new
    one, never a part); remove it when ``entries`` is empty. Raises OSError."""
    path = directory / RETIRING_FILE
    if not entries:
        path.unlink(missing_ok=True)
        return
    new = directory / (RETIRING_FILE + RETIRING_NEW_SUFFIX)
    new.write_text(json.dumps({"version": 1, "retiring": dict(sorted(entries.items()))}, separators=(",", ":")),
                   encoding="utf-8")
    os.replace(new, path)


def run(config: JanitorConfig, root: Path, *, list_pods: Callable[[], list[dict[str, Any]]] | None,
        now: float | None = None, dry_run: bool = False, pinned: frozenset[str] | None = None) -> RunSummary:
    """One janitor run over the PVC mounted at ``root`` (see the module docstring).

    Args:
        config: the rendered configuration.
        root: the line's PVC mount point.
        list_pods: returns the Pods of the line's namespace (as the API returns them), or None to
            skip everything that needs them; an exception is recorded as an error.
        now: the current time (seconds since the epoch), for tests.
        dry_run: measure and report, delete nothing.
        pinned: chunk hashes (hex, :func:`chunk_hash_of`) of the line's hot prefixes
            (``cluster_agents.hot_prefixes``): a chunk file of ``live_dir`` with one of them is never
            deleted, neither by the age limit nor by the watermarks; its bytes still count.

    Returns:
        The :class:`RunSummary` (never raises for a filesystem or API problem: those are in
        ``errors``).
    """
    started = time.monotonic()
    now = time.time() if now is None else now
    s = RunSummary(line=config.line, namespace=config.namespace, live_dir=config.live_dir, dry_run=dry_run,
                   capacity_bytes=config.capacity_bytes,
                   high_watermark_bytes=int(config.high_watermark * config.capacity_bytes),
                   low_watermark_bytes=int(config.low_watermark * config.capacity_bytes))
    if not root.is_dir():
        s.errors.append(f"{root} is not a directory (PVC not mounted?)")
        s.finished_at = round(now + time.monotonic() - started, 3)
        return s
    # Directories an earlier pass renamed aside but did not finish deleting (already counted).
    try:
        trash = sorted(p.name for p in root.iterdir() if p.name.startswith(TRASH_PREFIX))
    except OSError as exc:
        s.errors.append(f"listing {root}: {exc}")
        trash = []
    for name in trash if not dry_run else []:
        try:
            shutil.rmtree(root / name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            s.errors.append(f"rmtree {name}: {exc}")
    files = [f for f in _scan(root) if not f.rel.startswith(TRASH_PREFIX)]
    s.files_before = len(files)
    s.used_bytes_before = sum(f.size for f in files)
    gone: set[str] = set()

    def old_enough(mtime: float) -> bool:
        return now - mtime >= config.min_delete_age_s

    def delete_file(f: _File) -> bool:
        if not dry_run:
            try:
                (root / f.rel).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                s.errors.append(f"unlink {f.rel}: {exc}")
                return False
        gone.add(f.rel)
        s.bytes_freed += f.size
        return True

    def delete_tree(rel: str, *, aside: bool = False) -> bool:
        """Delete the directory ``rel``; with ``aside``, first rename it to a trash name (one
        atomic step: a Pod starting on ``rel`` from then on creates it anew)."""
        inside = [f for f in files if f.rel.startswith(rel + "/") and f.rel not in gone]
        if not dry_run:
            target = rel
            try:
                if aside:
                    target = f"{TRASH_PREFIX}{rel}-{int(now)}"
                    os.rename(root / rel, root / target)
                shutil.rmtree(root / target)
            except FileNotFoundError:
                pass
            except OSError as exc:
                s.errors.append(f"{'rename and ' if aside else ''}rmtree {rel}: {exc}")
                return False
        for f in inside:
            gone.add(f.rel)
            s.bytes_freed += f.size
        return True

    def fresh_pods() -> dirs.LivePods | None:
        """The Pods listed again (right before a deletion); None (an error) if they cannot be."""
        try:
            return dirs.live_pods_from_objects(list_pods(), config.mount_path) if list_pods else None
        except Exception as exc:  # any API or parse failure: delete nothing that needs the Pods
            s.errors.append(f"listing Pods in {config.namespace}: {exc}")
            return None

    live: dirs.LivePods | None = None
    if list_pods is not None:
        try:
            live = dirs.live_pods_from_objects(list_pods(), config.mount_path)
            s.pods_listed, s.live_pods = True, live.count
        except Exception as exc:  # any API or parse failure: skip what needs the Pods
            s.errors.append(f"listing Pods in {config.namespace}: {exc}")

    # Directories under the root: top-level ones, and temp directories one level down.
    try:
        top_dirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(TRASH_PREFIX))
    except OSError as exc:
        s.errors.append(f"listing {root}: {exc}")
        top_dirs = []
    tmp_dirs = [d for d in top_dirs if d.startswith(TMP_DIR_PREFIX)]
    model_dirs = [d for d in top_dirs if not d.startswith(TMP_DIR_PREFIX)]
    for d in model_dirs:
        try:
            tmp_dirs += sorted(f"{d}/{p.name}" for p in (root / d).iterdir()
                               if p.is_dir() and p.name.startswith(TMP_DIR_PREFIX))
        except OSError:
            continue
    flat_chunks = [f for f in files if "/" not in f.rel and f.rel.endswith(CHUNK_SUFFIX)]
    found = [*model_dirs, *([""] if flat_chunks else [])]

    # The history of configured and used directories: read, updated with this pass and written
    # atomically before anything is deleted; read again before each deletion, so what another
    # janitor wrote meanwhile counts too.
    grace = config.dir_grace_s
    pod_dirs = live.bases if live else frozenset()
    history_ok = True
    try:
        state = dirs.update_state(dirs.read_state(root), live_dir=config.live_dir, pod_dirs=pod_dirs, now=now, grace_s=grace,
                             found_dirs=found)
    except ValueError as exc:  # unreadable: start over as a first pass, delete no directory now
        s.errors.append(f"janitor state: {exc}; every directory kept for this pass")
        history_ok = False
        state = dirs.update_state(None, live_dir=config.live_dir, pod_dirs=pod_dirs, now=now, grace_s=grace,
                             found_dirs=found)
    if not dry_run:
        try:
            dirs.write_state(root, state)
        except OSError as exc:
            s.errors.append(f"writing {dirs.STATE_FILE}: {exc}; no directory deleted")
            history_ok = False
    protected = dirs.protected_dirs(state, live_dir=config.live_dir, pod_dirs=pod_dirs, now=now, grace_s=grace)
    s.protected_dirs = {d: protected[d] for d in found if d in protected and d != config.live_dir}

    def still_unprotected(d: str) -> bool:
        """Right before ``d`` goes: the Pods listed and the state read again."""
        pods = fresh_pods()
        if pods is None:
            return False
        try:
            fresh = dirs.update_state(dirs.read_state(root) or state, live_dir=config.live_dir, pod_dirs=pods.bases, now=now,
                                 grace_s=grace)
        except ValueError as exc:
            s.errors.append(f"janitor state: {exc}")
            return False
        reason = dirs.protected_dirs(fresh, live_dir=config.live_dir, pod_dirs=pods.bases, now=now, grace_s=grace).get(d)
        if reason:
            s.protected_dirs[d] = reason
        return reason is None

    if live is not None:
        # 1. Temp directories no live Pod uses (a new Pod's is named by it, or too young).
        for rel in tmp_dirs:
            if rel not in live.tmp_dirs and old_enough(_newest_mtime(root, rel, files)):
                again = fresh_pods()
                if again is not None and rel not in again.tmp_dirs and delete_tree(rel):
                    s.tmp_dirs_deleted += 1
    if live is not None and history_ok:
        # 2. Directories of models no longer configured, and the old flat layout's chunks.
        for d in model_dirs:
            if d not in protected and old_enough(_newest_mtime(root, d, files)) and still_unprotected(d):
                if delete_tree(d, aside=True):
                    s.stale_model_dirs_deleted += 1
        if "" not in protected and any(old_enough(f.mtime) for f in flat_chunks) and still_unprotected(""):
            for f in flat_chunks:
                if old_enough(f.mtime) and delete_file(f):
                    s.stale_files_deleted += 1
    # Stray temp files of the layout without a temp directory: a write never takes this long.
    for f in files:
        if f.rel not in gone and f.rel.endswith(LEGACY_TMP_SUFFIX) and old_enough(f.mtime):
            if delete_file(f):
                s.stale_files_deleted += 1

    # 3. and 4.: chunk files of the directories in use (and of the flat root while it is in use
    # or unknown); temp directories are never touched here.
    def evictable(f: _File) -> bool:
        parts = f.rel.split("/")
        if f.rel in gone or not f.rel.endswith(CHUNK_SUFFIX) or any(p.startswith(TMP_DIR_PREFIX) for p in parts):
            return False
        return len(parts) == 1 or len(parts) == 2

    def is_pinned(f: _File) -> bool:
        top, _, name = f.rel.partition("/")
        return bool(pinned) and top == config.live_dir and chunk_hash_of(name) in pinned

    chunks = sorted((f for f in files if evictable(f)), key=lambda f: (f.mtime, f.rel))
    pins = {f.rel for f in chunks if is_pinned(f)}
    kept: set[str] = set()

    # Retirement: an evicted chunk of a directory goes on that directory's retiring list first, so
    # every replica's connector stops loading it, and its files are deleted only once the entry is
    # retire_grace_s old: a replica that looked the chunk up before it saw the list finds the file
    # still there (docs/l2-cache.md, "Evictions and readers on other nodes").
    retiring: dict[str, dict[str, float]] = {}
    unreadable: set[str] = set()
    changed: set[str] = set()
    for d in sorted({_top(f.rel) for f in chunks if "/" in f.rel}):
        try:
            retiring[d] = read_retiring(root / d)
        except (OSError, ValueError) as exc:
            s.errors.append(f"retiring list of {d}: {exc}; nothing of {d} evicted this pass")
            unreadable.add(d)
            continue
        if d == config.live_dir and pinned and pinned & retiring[d].keys():  # declared hot since: kept
            retiring[d] = {h: t for h, t in retiring[d].items() if h not in pinned}
            changed.add(d)

    def retire_key(name: str) -> str:
        return chunk_hash_of(name) or name

    def retiring_since(f: _File) -> float | None:
        top, _, name = f.rel.partition("/")
        return retiring.get(top, {}).get(retire_key(name)) if name else None

    # Files whose retirement is old enough go now; an entry leaves the list once all its files are gone.
    failed: set[tuple[str, str]] = set()
    for f in chunks:
        since = retiring_since(f)
        if since is not None and now - since >= config.retire_grace_s:
            if delete_file(f):
                s.retired_files_deleted += 1
            else:
                failed.add((_top(f.rel), retire_key(f.rel.partition("/")[2])))
    for d, entries in retiring.items():
        due = {h for h, t in entries.items() if now - t >= config.retire_grace_s and (d, h) not in failed}
        if due:
            retiring[d] = {h: t for h, t in entries.items() if h not in due}
            changed.add(d)

    leaving: set[str] = set()  # files that left lookups this pass or earlier (their bytes go soon)
    retired_now: dict[str, list[_File]] = {}
    for f in chunks:
        if f.rel not in gone and retiring_since(f) is not None:
            leaving.add(f.rel)

    def evict(f: _File) -> bool:
        """Retire ``f``'s chunk (or delete ``f`` at once: no grace, or the old flat layout)."""
        top, _, name = f.rel.partition("/")
        if not name or config.retire_grace_s == 0:
            return delete_file(f)
        if top in unreadable or f.rel in leaving:
            return False
        retiring.setdefault(top, {}).setdefault(retire_key(name), now)
        changed.add(top)
        leaving.add(f.rel)
        retired_now.setdefault(top, []).append(f)
        return True

    if config.max_age_s is not None:
        for f in chunks:
            if f.rel in gone or f.rel in leaving:
                continue
            if now - f.mtime > config.max_age_s and old_enough(f.mtime):
                if f.rel in pins:
                    kept.add(f.rel)
                elif evict(f):
                    s.expired_chunks_deleted += 1
    on_disk = {f.rel: f.size for f in files if f.rel not in gone}
    used = sum(size for rel, size in on_disk.items() if rel not in leaving)
    if used > s.high_watermark_bytes:
        for f in chunks:
            if used <= s.low_watermark_bytes:
                break
            if f.rel in gone or f.rel in leaving or not old_enough(f.mtime):
                continue
            if f.rel in pins:
                kept.add(f.rel)
            elif evict(f):
                s.evicted_chunks_deleted += 1
                used -= f.size
    if not dry_run:
        for d in sorted(changed):
            try:
                write_retiring(root / d, retiring[d])
            except OSError as exc:
                now_deleted = 0
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    # A full pool: room comes first, so this pass's evictions are deleted at once,
                    # as before retirement existed (the read race is back for them, nothing worse).
                    for f in retired_now.get(d, []):
                        leaving.discard(f.rel)
                        now_deleted += delete_file(f)
                s.errors.append(f"writing the retiring list of {d}: {exc}"
                                + (f"; its {now_deleted} evicted chunk files deleted at once" if now_deleted else ""))
    s.retiring_chunks = sum(len(entries) for entries in retiring.values())
    s.retiring_bytes = sum(on_disk.get(rel, 0) for rel in leaving)
    s.pinned_chunk_files = len(pins)
    s.pinned_bytes = sum(f.size for f in chunks if f.rel in pins)
    s.pinned_chunks_kept = len(kept)
    left = [f for f in chunks if f.rel not in gone and f.rel not in leaving]
    s.used_bytes_after = used  # retiring files apart: they are gone by the next pass
    s.chunk_files_after = len(left)
    s.oldest_chunk_age_s_after = round(now - left[0].mtime, 1) if left else None
    s.above_high_watermark_after = used > s.high_watermark_bytes
    s.duration_s = round(time.monotonic() - started, 3)
    s.finished_at = round(now + s.duration_s, 3)
    return s


#: Gauges of :func:`prometheus_text`: name (after :data:`METRIC_PREFIX`), help text, value.
_GAUGES: tuple[tuple[str, str, Callable[[RunSummary], float]], ...] = (
    ("capacity_bytes", "the line's l2_size in bytes", lambda s: s.capacity_bytes),
    ("high_watermark_bytes", "high watermark in bytes", lambda s: s.high_watermark_bytes),
    ("used_bytes", "bytes in the line's L2 directory after the last pass, retiring files apart (retiring_bytes)",
     lambda s: s.used_bytes_after),
    ("bytes_freed", "bytes the last pass deleted", lambda s: s.bytes_freed),
    ("chunk_files", "chunk files left after the last pass", lambda s: s.chunk_files_after),
    ("deleted_tmp_dirs", "temp directories the last pass deleted", lambda s: s.tmp_dirs_deleted),
    ("deleted_stale_model_dirs", "directories of unconfigured models the last pass deleted",
     lambda s: s.stale_model_dirs_deleted),
    ("deleted_expired_chunks", "chunk files past the age limit the last pass evicted (put on the retiring list; "
     "deleted retire_grace_s later)", lambda s: s.expired_chunks_deleted),
    ("deleted_evicted_chunks", "oldest chunk files the last pass evicted above the high watermark (put on the "
     "retiring list; deleted retire_grace_s later)", lambda s: s.evicted_chunks_deleted),
    ("deleted_retired_chunk_files", "chunk files the last pass deleted because their retirement was old enough",
     lambda s: s.retired_files_deleted),
    ("retiring_chunks", "chunks on the retiring lists after the last pass (no replica loads them)",
     lambda s: s.retiring_chunks),
    ("retiring_bytes", "bytes of the retiring chunks' files, still on disk until retire_grace_s has passed",
     lambda s: s.retiring_bytes),
    ("above_high_watermark", "1 if still above the high watermark after the last pass",
     lambda s: int(s.above_high_watermark_after)),
    ("pinned_bytes", "bytes of the hot prefixes' chunk files (never deleted; counted in used_bytes)",
     lambda s: s.pinned_bytes),
    ("pinned_chunk_files", "chunk files of the hot prefixes in the configured directory", lambda s: s.pinned_chunk_files),
    ("pinned_chunks_kept", "hot-prefix chunk files the last pass kept that the age limit or the watermarks would "
     "have deleted", lambda s: s.pinned_chunks_kept),
    ("errors", "errors of the last pass (deletions that failed, Pods not listed, PVC not mounted)",
     lambda s: len(s.errors)),
    ("pods_listed", "1 if the last pass could list the line's Pods", lambda s: int(s.pods_listed)),
    ("status", "status of the last pass (its exit code): 0 ok, 1 still above the high watermark, 2 errors",
     lambda s: s.exit_code),
    ("duration_seconds", "how long the last pass took", lambda s: s.duration_s),
    ("last_run_timestamp_seconds", "when the last pass finished (seconds since the epoch)",
     lambda s: s.finished_at),
)


def prometheus_text(s: RunSummary) -> str:
    """The pass ``s`` in the Prometheus text format: one gauge per :data:`_GAUGES` entry, labelled
    ``line`` and ``namespace``. ``last_run_timestamp_seconds`` is when the pass finished, so a
    server that keeps serving an old pass shows its age."""
    labels = {"line": s.line, "namespace": s.namespace}
    out = []
    for name, text, value in _GAUGES:
        number = value(s)
        shown = str(number) if isinstance(number, int) else repr(float(number))  # no rounding of bytes
        out += core.family(METRIC_PREFIX + name, "gauge", text, [(labels, shown)])
    return "\n".join(out) + "\n"


def _failed_pass(config: JanitorConfig, message: str, started_at: float) -> RunSummary:
    """A summary for a pass that raised (a bug, not a filesystem or API problem)."""
    return RunSummary(line=config.line, namespace=config.namespace, live_dir=config.live_dir,
                      capacity_bytes=config.capacity_bytes, errors=[message],
                      duration_s=round(time.time() - started_at, 3), finished_at=round(time.time(), 3))


class JanitorService:
    """Passes every ``period_s``, one at a time, and what the HTTP endpoints report about them.

    Args:
        config: the rendered configuration.
        root: the line's PVC mount point.
        list_pods: as for :func:`run`.
        period_s: seconds from the start of one pass to the start of the next (a pass longer than
            that is followed at once by the next).
        pass_deadline_s: a pass running longer than this makes :meth:`liveness` fail.
        dry_run: passes delete nothing.
        termination_log: file that gets each pass's JSON (the container's termination message).
        log: where each pass's JSON line goes (stdout).
        pinned: returns the chunk hashes each pass keeps (:func:`run`; the hot-prefix warmer's).
        extra_metrics: returns more Prometheus text for ``/metrics`` (the hot-prefix warmer's).
    """

    def __init__(self, config: JanitorConfig, root: Path, *, list_pods: Callable[[], list[dict[str, Any]]] | None,
                 period_s: float = PERIOD_S, pass_deadline_s: float = PASS_DEADLINE_S, dry_run: bool = False,
                 termination_log: Path | None = None, log: Callable[[str], None] | None = None,
                 pinned: Callable[[], frozenset[str]] | None = None,
                 extra_metrics: Callable[[], str] | None = None) -> None:
        if period_s <= 0 or pass_deadline_s <= 0:
            raise ValueError("period_s and pass_deadline_s must be > 0")
        self.config, self.root, self.list_pods = config, root, list_pods
        self.period_s, self.pass_deadline_s, self.dry_run = period_s, pass_deadline_s, dry_run
        self.termination_log = termination_log
        self.log = log or (lambda line: print(line, flush=True))
        self.pinned, self.extra_metrics = pinned, extra_metrics
        self._lock = threading.Lock()
        self._last: RunSummary | None = None
        self._running_since: float | None = None  # time.monotonic() at the start of the running pass
        self.passes = 0

    @property
    def last(self) -> RunSummary | None:
        """The last finished pass (None before the first)."""
        with self._lock:
            return self._last

    def run_pass(self) -> RunSummary:
        """One pass; never raises (an unexpected exception becomes a pass with that error)."""
        started_at = time.time()
        with self._lock:
            self._running_since = time.monotonic()
        try:
            summary = run(self.config, self.root, list_pods=self.list_pods, dry_run=self.dry_run,
                          pinned=self.pinned() if self.pinned else None)
        except Exception as exc:  # a bug must not stop the service: report it as a failed pass
            summary = _failed_pass(self.config, f"unexpected {type(exc).__name__}: {exc}", started_at)
        with self._lock:
            self._running_since = None
            self._last = summary
            self.passes += 1
        line = json.dumps(asdict(summary), separators=(",", ":"))
        self.log(line)
        if self.termination_log is not None:
            try:
                self.termination_log.write_text(line[:4000], encoding="utf-8")
            except OSError:
                pass
        return summary

    def loop(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set (checked between passes)."""
        core.every(self.period_s, self.run_pass, stop)

    def liveness(self) -> tuple[bool, str]:
        """False while the running pass is older than ``pass_deadline_s`` (stuck), else True."""
        with self._lock:
            since = self._running_since
        if since is not None and time.monotonic() - since > self.pass_deadline_s:
            return False, (f"a pass has been running for {time.monotonic() - since:.0f} s, longer than "
                           f"{self.pass_deadline_s:g} s")
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """True once a pass finished and the last one had no errors."""
        last = self.last
        if last is None:
            return False, "no pass has finished yet"
        if last.errors:
            return False, f"the last pass failed: {'; '.join(last.errors)[:500]}"
        return True, "ok" + (" (still above the high watermark)" if last.above_high_watermark_after else "")

    def metrics(self) -> str:
        """:func:`prometheus_text` of the last finished pass ("" before the first)."""
        last = self.last
        text = "" if last is None else prometheus_text(last)
        return text + (self.extra_metrics() if self.extra_metrics else "")


def make_server(service: JanitorService, port: int, host: str = "") -> ThreadingHTTPServer:
    """An HTTP server for ``service`` (:func:`agent_core.make_server`): :data:`METRICS_PATH`,
    :data:`LIVENESS_PATH`, :data:`READINESS_PATH`."""
    return core.make_server({METRICS_PATH: lambda: (200, service.metrics(), core.METRICS_TEXT),
                             LIVENESS_PATH: core.health(service.liveness),
                             READINESS_PATH: core.health(service.readiness)}, port, host)


def hot_prefix_warmer(path: Path, root: Path, config: JanitorConfig, chunk_key: Callable[[], str] | None = None) -> Any:
    """The hot-prefix warmer of ``path`` (``cluster_agents.hot_prefixes.HotPrefixWarmer``; it lists the Pods
    of ``config.namespace``). Its module is this file's neighbour: ``cluster_agents.hot_prefixes`` in the
    repository, ``hot_prefixes.py`` beside this file in the ConfigMap. Raises OSError / ValueError."""
    if __package__:
        from . import hot_prefixes
    else:  # run from the ConfigMap: the module sits beside this file
        import hot_prefixes  # type: ignore[no-redef]
    hot = hot_prefixes.load_config(path)
    if (hot.line, hot.namespace, hot.live_dir, hot.mount_path) != (config.line, config.namespace, config.live_dir,
                                                                    config.mount_path):
        raise ValueError(f"{path} is not of the janitor's line and directory ({config.line}, {config.live_dir})")
    if hot.key_secret != config.key_secret:
        raise ValueError(f"{path} names the chunk-key Secret {hot.key_secret!r}, the janitor {config.key_secret!r}")
    return hot_prefixes.HotPrefixWarmer(hot, root, list_pods=lambda: list_pods(config.namespace), chunk_key=chunk_key)


#: The data key of the chunk-key Secret, and the bytes of randomness in a new key (hex: 64 characters).
KEY_SECRET_DATA_KEY = "key"
KEY_BYTES = 32
#: Seconds between two attempts to create or read the chunk-key Secret while the API does not answer.
KEY_RETRY_S = 10.0


class ChunkKey:
    """The line's chunk-key Secret (docs/security.md, "Chunk keys"): created here, in the line's
    namespace, on the janitor's first start (``secrets.token_hex(32)``: 256 random bits), and only read
    afterwards. A Secret that exists is never overwritten (create answers 409 and the value is read),
    so every vLLM Pod (``KVCACHE_L2_KEY`` from a ``secretKeyRef``) and this process agree. A rotation
    is a new Secret name (``cache.chunk_key_generation``), hence a new L2 directory and a cold cache.

    Rights: ``create`` on Secrets in the namespace (RBAC cannot name the object of a create) and
    ``get`` on this one Secret (``resourceNames``); nothing else on Secrets.
    """

    def __init__(self, namespace: str, name: str, api: Any = None) -> None:
        self.namespace, self.name, self._api = namespace, name, api
        self._value: str | None = None
        self._lock = threading.Lock()
        self.error: str | None = None
        self.created = False

    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = core.KubeApi.in_cluster(timeout_s=20)
        return self._api

    def _path(self, name: str = "") -> str:
        base = f"/api/v1/namespaces/{urllib.parse.quote(self.namespace)}/secrets"
        return f"{base}/{urllib.parse.quote(name)}" if name else base

    def _read(self) -> str:
        data = (self.api.call("GET", self._path(self.name)).get("data") or {}).get(KEY_SECRET_DATA_KEY)
        value = base64.b64decode(data or "").decode("ascii", "strict").strip() if data else ""
        if not value:
            raise core.ApiError(0, f"Secret {self.namespace}/{self.name} has no {KEY_SECRET_DATA_KEY!r}")
        return value

    def secret_object(self, value: str) -> dict[str, Any]:
        """The Secret this janitor creates for ``value``: ``Opaque``, ``immutable`` (the API server refuses
        any change of its data), ``key`` = the value; what ``kvcache-l2-key-limits-<line>`` admits
        (:func:`k8s.janitor.key_secret_limits`)."""
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "l2-janitor"}},
                "immutable": True,
                "data": {KEY_SECRET_DATA_KEY: base64.b64encode(value.encode("ascii")).decode("ascii")}}

    def ensure(self) -> str:
        """The key: read the Secret, create it when missing (404), read it again when another janitor
        created it first (409). Raises :class:`agent_core.ApiError`."""
        with self._lock:
            if self._value is not None:
                return self._value
            try:
                self._value = self._read()
            except core.ApiError as exc:
                if exc.status != 404:
                    raise
                try:
                    self.api.call("POST", self._path(), self.secret_object(secrets.token_hex(KEY_BYTES)))
                    self.created = True
                except core.ApiError as create_exc:
                    if create_exc.status != 409:
                        raise
                self._value = self._read()
            self.error = None
            return self._value

    def __call__(self) -> str:
        return self.ensure()

    def keep_trying(self, stop: threading.Event, log: Callable[[str], None] = print) -> None:
        """:meth:`ensure` until it succeeds (every :data:`KEY_RETRY_S`) or ``stop``; one JSON line each
        time it fails and once when the key is there (never the key)."""
        while not stop.is_set():
            try:
                self.ensure()
                log(json.dumps({"event": "kvcache_l2_chunk_key", "secret": f"{self.namespace}/{self.name}",
                                "created": self.created}))
                return
            except (core.ApiError, OSError, ValueError) as exc:
                self.error = str(exc)
                log(json.dumps({"event": "kvcache_l2_chunk_key", "secret": f"{self.namespace}/{self.name}",
                                "errors": [self.error]}))
            stop.wait(KEY_RETRY_S)


def list_pods(namespace: str) -> list[dict[str, Any]]:
    """The Pods of ``namespace`` through the in-cluster API (the janitor's Role: ``list pods``, nothing
    else). Raises :class:`agent_core.ApiError`."""
    return core.KubeApi.in_cluster(timeout_s=20).list_pods(namespace)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE --root DIR [--dry-run] [--no-pods] [--termination-log F]`` and
    either one pass (exit status :attr:`RunSummary.exit_code`; ``--metrics-file F`` also writes
    the Prometheus text) or ``--serve [--port N] [--period-s S] [--pass-deadline-s S]`` (passes
    until SIGTERM, then exit 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], epilog=EXIT_EPILOG)
    parser.add_argument("--config", required=True, type=Path, help="janitor.json rendered by the line chart")
    parser.add_argument("--root", required=True, type=Path, help="mount point of the line's L2 PVC")
    parser.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    parser.add_argument("--no-pods", action="store_true",
                        help="do not list Pods (skips temp-directory and stale-directory cleanup)")
    parser.add_argument("--metrics-file", type=Path, help="one pass: also write the Prometheus text format here")
    parser.add_argument("--termination-log", type=Path, default=None,
                        help="also write each pass's JSON summary here (the container's termination message)")
    parser.add_argument("--serve", action="store_true",
                        help="stay up: a pass every --period-s, metrics and health checks over HTTP on --port")
    parser.add_argument("--port", type=int, default=METRICS_PORT, help="--serve: HTTP port (default: %(default)s)")
    parser.add_argument("--period-s", type=float, default=PERIOD_S,
                        help="--serve: seconds between the starts of two passes (default: %(default)s)")
    parser.add_argument("--pass-deadline-s", type=float, default=PASS_DEADLINE_S,
                        help="--serve: a longer pass fails the liveness check (default: %(default)s)")
    parser.add_argument("--hot-prefixes", type=Path, metavar="FILE",
                        help="hot_prefixes.json rendered by the line chart: keep the line's declared prefixes' "
                             "chunks; with --serve also warm them (cluster_agents/hot_prefixes.py)")
    args = parser.parse_args(argv)
    try:
        config = config_from_dict(json.loads(args.config.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        print(json.dumps({"event": "kvcache_l2_janitor", "errors": [f"config: {exc}"]}))
        return EXIT_ERROR
    lister = None if args.no_pods else (lambda: list_pods(config.namespace))
    chunk_key = ChunkKey(config.namespace, config.key_secret) if config.key_secret and lister else None
    warmer = None
    if args.hot_prefixes is not None:
        try:
            warmer = hot_prefix_warmer(args.hot_prefixes, args.root, config, chunk_key)
        except (OSError, ValueError) as exc:
            print(json.dumps({"event": "kvcache_l2_janitor", "errors": [f"hot prefixes config: {exc}"]}))
            return EXIT_ERROR
    service = JanitorService(config, args.root, list_pods=lister, period_s=args.period_s,
                             pass_deadline_s=args.pass_deadline_s, dry_run=args.dry_run,
                             termination_log=args.termination_log,
                             pinned=warmer.pinned if warmer else None, extra_metrics=warmer.metrics if warmer else None)
    if not args.serve:
        summary = service.run_pass()
        if args.metrics_file is not None:
            try:
                args.metrics_file.write_text(prometheus_text(summary), encoding="utf-8")
            except OSError as exc:  # an uncaught exception would exit 1, "still above the watermark"
                print(f"error: cannot write {args.metrics_file}: {exc}", file=sys.stderr)
                return EXIT_ERROR
        return summary.exit_code

    def loop(stop: threading.Event) -> None:
        if chunk_key is not None:  # the vLLM Pods wait for the Secret (secretKeyRef): create it first
            threading.Thread(target=chunk_key.keep_trying, args=(stop,), name="chunk-key", daemon=True).start()
        if warmer is not None and lister is not None:
            threading.Thread(target=warmer.loop, args=(stop,), name="hot-prefixes", daemon=True).start()
        service.loop(stop)

    return core.serve(lambda port: make_server(service, port), args.port, loop)


if __name__ == "__main__":
    sys.exit(main())
