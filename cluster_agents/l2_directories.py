"""Which directories of a line's L2 a janitor pass must keep (:mod:`cluster_agents.l2_janitor`, step 2).

A top-level directory of the PVC is one model's KV (``k8s.lmcache.l2_cache_dir``). It is kept while
the configuration names it, a running or pending Pod names it (:func:`live_pods_from_objects`: the
``LMCACHE_REMOTE_URL`` and temp directory of every container), the previous configuration named it
(a rollback finds it, however late), or either named it within the grace period
(:func:`protected_dirs`). What the configuration and the Pods named survives janitor restarts in a
small state file at the PVC root (:data:`STATE_FILE`, :class:`DirHistory`), written atomically
before anything is deleted, so whichever janitor runs next knows it.

Standard library only, shipped beside the janitor in its ConfigMap.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

if __package__:  # imported as cluster_agents.l2_directories
    from . import agent_core as core
else:  # run from its ConfigMap, agent_core.py beside it
    import agent_core as core

REMOTE_URL_ENV = core.REMOTE_URL_ENV
EXTRA_CONFIG_ENV = "LMCACHE_EXTRA_CONFIG"
TMP_DIR_KEY = "fs_connector_relative_tmp_dir"
#: The janitor's record, at the PVC root, of the directories its configuration named and the Pods
#: used (:class:`DirHistory`). Not a chunk file: never counted, never deleted.
STATE_FILE = ".kvcache-l2-janitor-state.json"
STATE_VERSION = 1
#: Configured directories remembered, newest last (the previous one is what protects a rollback).
STATE_HISTORY = 32
#: The Deployment patch names the temp directory after the pod (``$(KVCACHE_POD_NAME)``,
#: expanded by the kubelet); the janitor expands it the same way.
POD_NAME_REFERENCE = "$(KVCACHE_POD_NAME)"


@dataclass(frozen=True)
class LivePods:
    """What the live Pods use: base directories and temp directories, relative to the PVC root."""

    bases: frozenset[str]
    tmp_dirs: frozenset[str]
    count: int


def live_pods_from_objects(pods: Iterable[dict[str, Any]], mount_path: str) -> LivePods:
    """Base and temp directories named by the env of running or pending Pods.

    A Pod counts unless its phase is ``Succeeded`` or ``Failed``. For every container with an
    ``fs://`` ``LMCACHE_REMOTE_URL`` under ``mount_path``: its directory, and the temp directory
    of its ``LMCACHE_EXTRA_CONFIG`` (``fs_connector_relative_tmp_dir``, relative to that
    directory), ``$(KVCACHE_POD_NAME)`` expanded to the Pod's name.
    """
    bases: set[str] = set()
    tmps: set[str] = set()
    count = 0
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        count += 1
        pod_name = (pod.get("metadata") or {}).get("name", "")
        for container in (pod.get("spec") or {}).get("containers") or []:
            env = {e.get("name"): e.get("value") for e in container.get("env") or [] if e.get("value") is not None}
            base = core.l2_dir_of(env.get(REMOTE_URL_ENV) or "", mount_path)
            if base is None:
                continue
            bases.add(base)
            try:
                extra = json.loads(env.get(EXTRA_CONFIG_ENV) or "{}")
            except json.JSONDecodeError:
                continue
            tmp = extra.get(TMP_DIR_KEY) if isinstance(extra, dict) else None
            if isinstance(tmp, str) and tmp:
                tmp = tmp.replace(POD_NAME_REFERENCE, pod_name).strip("/")
                tmps.add(f"{base}/{tmp}" if base else tmp)
    return LivePods(frozenset(bases), frozenset(tmps), count)


@dataclass
class DirHistory:
    """What :data:`STATE_FILE` holds: the directories the configuration named and Pods used.

    Attributes:
        configured: ``(directory, last seen)`` for each directory the janitor's configuration
            named (``live_dir``), ordered by when it last became the configured one, newest
            last; ``last seen`` is the end of the last pass with it configured (s since the epoch).
        in_use: directory -> when a running or pending Pod last named it (or a first pass found
            it: the state was missing).
    """

    configured: list[tuple[str, float]] = field(default_factory=list)
    in_use: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        """The file's text: ``{"version": 1, "configured": [{"dir", "last_seen"}, ...], "in_use": {dir: s}}``."""
        return json.dumps({"version": STATE_VERSION, "configured": [{"dir": d, "last_seen": t} for d, t in self.configured],
                           "in_use": self.in_use}, sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "DirHistory":
        """Raises ValueError unless ``text`` is a state of :data:`STATE_VERSION`."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"not a version {STATE_VERSION} janitor state")
        configured = [(e["dir"], float(e["last_seen"])) for e in data["configured"]]
        in_use = {str(k): float(v) for k, v in data["in_use"].items()}
        if not all(isinstance(d, str) for d, _ in configured):
            raise ValueError("configured: directory names must be strings")
        return cls(configured, in_use)


def read_state(root: Path) -> DirHistory | None:
    """The state at ``root``, or None when there is none (a first pass).

    Raises:
        ValueError: the file exists but cannot be read or parsed.
    """
    try:
        text = (root / STATE_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {STATE_FILE}: {exc}") from None
    try:
        return DirHistory.from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{STATE_FILE} is not a janitor state ({exc})") from None


def update_state(state: DirHistory | None, *, live_dir: str, pod_dirs: Iterable[str], now: float, grace_s: float,
                 found_dirs: Iterable[str] = ()) -> DirHistory:
    """``state`` after a pass at ``now`` with ``live_dir`` configured and Pods naming ``pod_dirs``
    (a new object). ``found_dirs`` (the directories present) are recorded as in use when there is
    no ``state``: a first pass cannot know which of them a configuration or Pod still needs.
    ``in_use`` entries older than ``grace_s`` are dropped; ``configured`` keeps its last
    :data:`STATE_HISTORY` entries."""
    configured = [(d, t) for d, t in (state.configured if state else []) if d != live_dir]
    configured = (configured + [(live_dir, now)])[-STATE_HISTORY:]
    in_use = {d: t for d, t in (state.in_use if state else {}).items() if now - t < grace_s}
    for d in [*pod_dirs, *(() if state else found_dirs)]:
        in_use[d] = max(now, in_use.get(d, now))
    return DirHistory(configured, in_use)


def write_state(root: Path, state: DirHistory) -> None:
    """Write ``state`` atomically: a temp file of this process, flushed to disk, renamed over
    :data:`STATE_FILE` (a reader sees the old or the new file, never part of one). Raises OSError."""
    tmp = root / f"{STATE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(state.to_json())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, root / STATE_FILE)
    finally:
        tmp.unlink(missing_ok=True)


def protected_dirs(state: DirHistory, *, live_dir: str, pod_dirs: Iterable[str], now: float,
                   grace_s: float) -> dict[str, str]:
    """Directories no pass may delete, each with why (the first reason that applies):

    * ``configured``: ``live_dir``;
    * ``named by a running or pending Pod``: in ``pod_dirs``;
    * ``previous configuration``: the newest configured directory other than ``live_dir``, for
      as long as the configuration does not change again (a rollback finds it, however late);
    * ``configured within the grace period`` / ``in use within the grace period``: the
      configuration or a Pod named it less than ``grace_s`` ago (a Pod may still start on it).
    """
    reasons = {live_dir: "configured"}
    for d in pod_dirs:
        reasons.setdefault(d, "named by a running or pending Pod")
    previous = [d for d, _ in state.configured if d != live_dir]
    if previous:
        reasons.setdefault(previous[-1], "previous configuration")
    for d, seen in state.configured:
        if now - seen < grace_s:
            reasons.setdefault(d, "configured within the grace period")
    for d, seen in state.in_use.items():
        if now - seen < grace_s:
            reasons.setdefault(d, "in use within the grace period")
    return reasons
