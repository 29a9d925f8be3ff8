"""The L2 mount watchdog: finds every pod on its node whose Curvine L2 mount is dead, and heals it.

Why it exists (docs/l2-cache.md, "Dead L2 mounts"; sources in docs/sources.md §17). The Curvine CSI
driver (v0.3.2-alpha, ``MOUNT_MODE=standalone``) runs curvine-fuse in a *FUSE pod* per node and
mount key, mounted at ``/var/lib/kubelet/plugins/curvine/<mount key>/fuse-mount`` on the host
(``standalone_manager.go`` ``GetHostMountPath``); ``NodePublishVolume`` bind-mounts a directory of
that mount onto the kubelet's target path of each pod (``node_standalone.go``). A new FUSE session
(the FUSE container restarted after an OOM kill, the pod evicted, deleted by hand or by the driver's
own self-heal or ref count) is mounted afresh at the plugin path; every existing bind keeps the old
session, whose daemon is gone: the kernel answers ``ENOTCONN`` for it, forever. Only a *new pod*
gets a fresh bind (a container restart does not re-publish volumes).

One process per node (a DaemonSet). Each *pass* (every :data:`PERIOD_S`):

1. reads the host's mount table: ``/proc/1/mountinfo``, the one host file the DaemonSet mounts
   for it (at :data:`HOST_MOUNTINFO`; ``config.host_mountinfo``), and lists the Curvine binds at
   kubelet CSI targets, ``<kubelet>/pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount``, by
   their path and their source ``curvinefs`` (:func:`volumes_from_mountinfo`). No directory of
   the kubelet is read or mounted: the pods' service-account tokens live beside those targets
   (issue 24 item 5). Run by hand on a node (``host_mountinfo`` empty), it reads the kubelet's
   layout instead (``vol_data.json`` with ``driverName`` :data:`DRIVER_NAME`, :func:`find_volumes`)
   and its own ``/proc/self/mountinfo``;
2. classifies each bind by the FUSE session it holds (:func:`classify_by_session`): **dead** when
   its device differs from every FUSE session mounted at a plugin path now (mountinfo only, never
   blocks), else the answer of one ``statvfs`` of that session at the plugin path (the plugin
   directory is mounted read-only with ``HostToContainer`` propagation, so a new session shows up):
   ``ENOTCONN`` dead; no answer within ``probe_timeout_s`` **hung**; another error **error**
   (curvine-fuse answers ``EIO``/``ETIMEDOUT`` when its Primary is unreachable, ``fuse_error.rs``);
   an answer **alive**. A bind answers ``statfs`` from its session's daemon like the session's own
   mount, so one probe per session stands for all its binds (by hand: one per bind,
   :func:`classify`). ``statvfs`` because FUSE always forwards it to the daemon (``STATFS``), where
   ``stat`` may be served from the kernel's attribute cache. Probes run in threads, at most one per
   path and at most ``max_stuck_probes`` stuck at once, so the pass itself never blocks
   (:class:`Prober`);
3. maps each pod UID to its namespace and name through the API: the PV's ``claimRef`` gives the
   namespace, then the Pods of that namespace on this node (``fieldSelector=spec.nodeName``);
4. heals (when ``heal`` is on), never a hung or error mount (an unreachable Primary is not cured
   by restarting pods) and never a pod without a controller: it *evicts* (Eviction API, so
   PodDisruptionBudgets hold: each line's ``maxUnavailable: 1`` bounds evictions across nodes) at
   most one pod with a dead mount per ``eviction_interval_s``, never the last Ready pod of its
   controller (a one-replica line keeps serving, without L2, until someone acts); its
   controller creates a replacement, which gets a fresh bind. And it *lazily unmounts* the dead bind
   of a pod that is terminating (whoever deleted it) or whose pod no longer exists: the driver's
   ``NodeUnpublishVolume`` skips the unmount of a target ``mountpoint -q`` cannot stat, and the
   kubelet's teardown then fails on the same ``stat`` (``removeMountDir``), so without it such a pod
   stays ``Terminating`` with its GPUs reserved. The unmount runs in the host's mount namespace,
   entered by a child process through ``/proc/1/ns/mnt`` (:func:`unmount_in_host_namespace`).
   Nothing but a kubelet CSI target found dead is ever unmounted;
5. publishes the pass: ``GET /metrics`` (Prometheus text, :func:`prometheus_text`), ``GET /mounts``
   (JSON, read by ``scripts/verify.py``), ``GET /healthz`` (503 when no pass finished for
   :data:`STALE_PERIODS` periods).

Standard library only (like ``l2_janitor.py``): the Curvine chart ships this file and
``agent_core.py`` in a ConfigMap and runs it with the pinned ``python`` image. By hand, one
report-only pass on a node::

    python3 l2_mount_watchdog.py --node "$(hostname)" --once --no-api
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import errno
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

if __package__:  # imported as cluster_agents.l2_mount_watchdog
    from . import agent_core as core
else:  # run from its ConfigMap, agent_core.py beside it
    import agent_core as core

#: The kubelet's root directory (EKS and HyperPod nodes: the default ``--root-dir``).
KUBELET_DIR = "/var/lib/kubelet"
#: Kubelet layout of a pod's CSI volume: ``pods/<uid>/volumes/kubernetes.io~csi/<spec volume>/``
#: holding ``vol_data.json`` and the target ``mount`` (kubernetes ``pkg/volume/csi/csi_mounter.go``
#: ``getTargetPath``, ``GetCSIMounterPath``, ``saveVolumeData``; docs/sources.md §17).
CSI_VOLUMES_DIR = "volumes/kubernetes.io~csi"
VOL_DATA_FILE = "vol_data.json"
MOUNT_DIR = "mount"
#: The Curvine CSI driver's name (``k8s.names.CSI_DRIVER_NAME``; copied: this file runs alone).
DRIVER_NAME = "curvine"
#: Where the FUSE pods mount curvine-fuse on the host: ``<PLUGIN_DIR>/<mount key>/fuse-mount``
#: (Curvine v0.3.2-alpha ``standalone_manager.go``: ``HostMountBaseDir``, ``GetHostMountPath``).
PLUGIN_DIR = "/var/lib/kubelet/plugins/curvine"
FUSE_MOUNT_NAME = "fuse-mount"
#: How curvine-fuse mounts: source ``curvinefs``, type ``fuse`` (v0.3.2-alpha
#: ``curvine-fuse/src/raw/fuse_pure.rs`` l.141-153) or ``fuse.curvinefs`` (v0.4.1 adds
#: ``subtype=curvinefs``, l.148-159); a bind keeps both. docs/sources.md §17.
CURVINE_FUSE_SOURCE = "curvinefs"
CURVINE_FUSE_TYPES = ("fuse", "fuse.curvinefs")
#: Where the DaemonSet mounts the host's ``/proc/1/mountinfo`` (a ``hostPath`` of that one file:
#: the mount table of the host's init, i.e. of the kubelet, without the host's PID namespace).
HOST_MOUNTINFO = "/host/proc/1/mountinfo"
#: The host's init, whose mount namespace the kubelet's binds live in (``setns`` target of a heal).
HOST_MOUNT_NAMESPACE = "/proc/1/ns/mnt"
#: ``setns`` flag of a mount namespace (``<sched.h>``).
CLONE_NEWNS = 0x00020000
#: Seconds the host-namespace unmount helper may take (a lazy unmount returns at once).
UNMOUNT_HELPER_TIMEOUT_S = 10

#: Seconds between the starts of two passes. A dead mount is seen within one period.
PERIOD_S = 30
#: A ``statvfs`` that has not answered after this is *hung*. Below the period, so a pass ends
#: before the next starts.
PROBE_TIMEOUT_S = 10
#: At most one eviction per node in this many seconds: a FUSE restart kills every mount of its
#: node at once, and the replacements must not all restart together.
EVICTION_INTERVAL_S = 60
#: Probe threads stuck in the kernel at most (a hung FUSE request cannot be cancelled); beyond,
#: mounts are reported hung without a new probe.
MAX_STUCK_PROBES = 16
#: ``/healthz`` fails when no pass finished for this many periods (the loop itself is stuck).
STALE_PERIODS = 3
#: HTTP port and paths (``--serve``).
METRICS_PORT = 9101
METRICS_PATH = "/metrics"
MOUNTS_PATH = "/mounts"
LIVENESS_PATH = "/healthz"

#: Classification of one mount.
ALIVE, DEAD, HUNG, ERROR = "alive", "dead", "hung", "error"
STATES = (ALIVE, DEAD, HUNG, ERROR)
#: Metric names (observability/metrics.py imports these).
METRIC_PREFIX = "kvcache_l2_mount_"
UP_METRIC = METRIC_PREFIX + "up"
STATE_METRIC = METRIC_PREFIX + "state"
EVICTIONS_METRIC = METRIC_PREFIX + "evictions_total"
UNMOUNTS_METRIC = METRIC_PREFIX + "unmounts_total"
PROBES_STUCK_METRIC = METRIC_PREFIX + "probes_stuck"
LAST_PASS_METRIC = METRIC_PREFIX + "watchdog_last_pass_timestamp_seconds"
API_ERRORS_METRIC = METRIC_PREFIX + "watchdog_api_errors"
#: Replacements of a hung FUSE session (its FUSE pod deleted): done, failed.
REPLACEMENT_RESULTS = ("replaced", "failed")
REPLACEMENTS_METRIC = METRIC_PREFIX + "fuse_replacements_total"
#: The FUSE pods' label (Curvine ``StandaloneLabelApp``, ``standalone_manager.go`` l.35-36) and
#: the name of the volume that mounts the session's plugin path into them (``buildStandalone``).
FUSE_POD_LABEL = ("app", "curvine-standalone")
#: Leases (coordination.k8s.io/v1) that bound how many nodes replace a FUSE session at once:
#: ``<prefix>-0`` .. ``<prefix>-<max_nodes_replacing - 1>`` in the Curvine namespace.
REPLACEMENT_LEASE_PREFIX = "l2-fuse-replacement"
#: A replacement slot is held while its node still has a mount that is not alive, renewed every
#: pass; it lapses this many periods after its holder stopped renewing it (a watchdog gone).
LEASE_PERIODS = 3
#: Results of an eviction: accepted, refused by a PodDisruptionBudget (HTTP 429), failed otherwise.
EVICTION_RESULTS = ("evicted", "refused", "failed")
UNMOUNT_RESULTS = ("unmounted", "failed")
#: ``umount2`` flag: detach now, clean up when no longer busy (``<sys/mount.h>``).
MNT_DETACH = 2


# --- mountinfo -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/<pid>/mountinfo`` (proc(5)): ids, ``major:minor``, root, mount point."""

    mount_id: int
    parent_id: int
    device: str
    root: str
    mount_point: str
    fstype: str
    #: The mount source (the field after the type; ``curvinefs`` for curvine-fuse and its binds).
    source: str = ""

    @property
    def is_fuse(self) -> bool:
        """A FUSE mount (``fuse`` or ``fuse.<subtype>``)."""
        return self.fstype == "fuse" or self.fstype.startswith("fuse.")

    @property
    def is_curvine(self) -> bool:
        """A curvine-fuse session or a bind of one: source :data:`CURVINE_FUSE_SOURCE` and a type of
        :data:`CURVINE_FUSE_TYPES` (a FUSE mount of another driver, e.g. the S3 CSI driver's
        mountpoint-s3, has its own source)."""
        return self.source == CURVINE_FUSE_SOURCE and self.fstype in CURVINE_FUSE_TYPES


def _unescape(field_: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Every mount of a ``mountinfo`` text, in file order; malformed lines are skipped.

    Format (proc(5)): ``id parent major:minor root mount-point options [optional...] - fstype
    source super-options``.
    """
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or not tail:
            continue
        try:
            out.append(MountEntry(int(fields[0]), int(fields[1]), fields[2], _unescape(fields[3]),
                                  _unescape(fields[4]), tail[0], _unescape(tail[1]) if len(tail) > 1 else ""))
        except ValueError:
            continue
    return out


def top_mounts(entries: Iterable[MountEntry]) -> dict[str, MountEntry]:
    """Mount point -> the mount visible there: of mounts stacked on one point (a restarted FUSE
    container mounts over the dead session), the one no other mount at that point sits on."""
    by_point: dict[str, list[MountEntry]] = {}
    for e in entries:
        by_point.setdefault(e.mount_point, []).append(e)
    out = {}
    for point, stack in by_point.items():
        parents = {e.parent_id for e in stack}
        tops = [e for e in stack if e.mount_id not in parents]
        out[point] = (tops or stack)[-1]
    return out


def live_fuse_devices(tops: dict[str, MountEntry], plugin_dir: str = PLUGIN_DIR) -> dict[str, str]:
    """``major:minor`` -> plugin mount point of every FUSE session mounted at a plugin path now."""
    prefix = plugin_dir.rstrip("/") + "/"
    out = {}
    for point, e in tops.items():
        if point.startswith(prefix) and point.endswith("/" + FUSE_MOUNT_NAME) and e.is_fuse:
            if point[len(prefix):-len(FUSE_MOUNT_NAME) - 1].count("/") == 0:
                out[e.device] = point
    return out


# --- the kubelet's CSI volumes -------------------------------------------------------------------


@dataclass(frozen=True)
class PodVolume:
    """A Curvine CSI volume of a pod on this node.

    Attributes:
        pod_uid: the pod's UID (its directory under ``<kubelet>/pods``).
        volume: the spec volume name, the PV's name for a PVC (``vol_data.json`` ``specVolID``).
        target: the bind mount's path (``.../<volume>/mount``), as this process sees it.
    """

    pod_uid: str
    volume: str
    target: str


def find_volumes(kubelet_dir: str = KUBELET_DIR, driver: str = DRIVER_NAME) -> list[PodVolume]:
    """Every CSI volume of ``driver`` under ``<kubelet_dir>/pods``, sorted by pod UID and volume.

    Reads only directories and ``vol_data.json`` on the node's own disk; never the mount itself
    (a stat of a hung FUSE mount would block). A volume whose ``vol_data.json`` is missing or
    unreadable (being set up or torn down) is left out.
    """
    pods_dir = os.path.join(kubelet_dir, "pods")
    out = []
    try:
        uids = sorted(os.listdir(pods_dir))
    except OSError:
        return []
    for uid in uids:
        csi_dir = os.path.join(pods_dir, uid, CSI_VOLUMES_DIR)
        try:
            names = sorted(os.listdir(csi_dir))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(csi_dir, name, VOL_DATA_FILE), encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and data.get("driverName") == driver:
                out.append(PodVolume(uid, str(data.get("specVolID") or name), os.path.join(csi_dir, name, MOUNT_DIR)))
    return out


_CSI_TARGET = re.compile(r"^(?P<uid>[0-9a-f][0-9a-f-]{7,63})/" + re.escape(CSI_VOLUMES_DIR)
                         + r"/(?P<volume>[^/]+)/" + re.escape(MOUNT_DIR) + r"$")


def csi_target(path: str, kubelet_dir: str = KUBELET_DIR) -> tuple[str, str] | None:
    """(pod UID, volume) when ``path`` is a kubelet CSI target,
    ``<kubelet_dir>/pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount``; else None."""
    prefix = os.path.join(kubelet_dir, "pods") + "/"
    if not path.startswith(prefix):
        return None
    m = _CSI_TARGET.match(path[len(prefix):])
    return (m["uid"], m["volume"]) if m else None


def volumes_from_mountinfo(entries: Iterable[MountEntry], kubelet_dir: str = KUBELET_DIR) -> list[PodVolume]:
    """Every Curvine bind at a kubelet CSI target (:func:`csi_target`, :attr:`MountEntry.is_curvine`),
    from the host's mount table alone: no directory of the kubelet is read (and none is mounted
    into the DaemonSet: the pods' service-account tokens live beside these targets). Sorted by pod
    UID and volume; ``target`` is the host path. The volume is the kubelet's spec volume name, the
    PV's name for a PVC (``getTargetPath``, docs/sources.md §17)."""
    out = {}
    for point, e in top_mounts(entries).items():
        found = csi_target(point, kubelet_dir)
        if found is not None and e.is_curvine:
            out[found] = PodVolume(found[0], found[1], point)
    return [out[k] for k in sorted(out)]


# --- probes --------------------------------------------------------------------------------------


class Prober:
    """``statvfs`` probes in threads, each waited for at most ``timeout_s``.

    A probe stuck in the kernel cannot be cancelled, so its thread stays until the FUSE request
    returns; a later probe of the same path reuses it instead of starting another, and no new
    thread starts while ``max_stuck`` are running.

    Args:
        timeout_s: seconds to wait for all probes of one :meth:`probe_all` call.
        max_stuck: most probe threads alive at once.
        statvfs: the probe (``os.statvfs``; tests inject one).
    """

    def __init__(self, timeout_s: float = PROBE_TIMEOUT_S, max_stuck: int = MAX_STUCK_PROBES,
                 statvfs: Callable[[str], Any] = os.statvfs) -> None:
        if timeout_s <= 0 or max_stuck < 1:
            raise ValueError("timeout_s must be > 0 and max_stuck >= 1")
        self.timeout_s, self.max_stuck, self._statvfs = timeout_s, max_stuck, statvfs
        self._lock = threading.Lock()
        self._running: dict[str, tuple[threading.Event, list[OSError | None]]] = {}

    @property
    def stuck(self) -> int:
        """Probe threads still waiting for the kernel."""
        with self._lock:
            return len(self._running)

    def _start(self, path: str) -> tuple[threading.Event, list[OSError | None]] | None:
        with self._lock:
            if path in self._running:
                return self._running[path]
            if len(self._running) >= self.max_stuck:
                return None
            done, result = threading.Event(), []
            self._running[path] = (done, result)

        def run() -> None:
            try:
                self._statvfs(path)
                result.append(None)
            except OSError as exc:
                result.append(exc)
            finally:
                with self._lock:
                    self._running.pop(path, None)
                done.set()

        threading.Thread(target=run, name=f"probe {path}", daemon=True).start()
        return done, result

    def probe_all(self, paths: Iterable[str]) -> dict[str, tuple[str, str]]:
        """Path -> (state, reason) with state :data:`ALIVE`, :data:`DEAD` (``ENOTCONN``),
        :data:`ERROR` (any other errno) or :data:`HUNG` (no answer within ``timeout_s``, or no
        thread left to probe it). All paths are probed in parallel against one deadline."""
        started = {p: self._start(p) for p in dict.fromkeys(paths)}
        deadline = time.monotonic() + self.timeout_s
        out = {}
        for path, probe in started.items():
            if probe is None:
                out[path] = (HUNG, f"not probed: {self.max_stuck} probes already stuck")
                continue
            done, result = probe
            if not done.wait(max(0.0, deadline - time.monotonic())) or not result:
                out[path] = (HUNG, f"statvfs did not answer within {self.timeout_s:g} s")
            elif result[0] is None:
                out[path] = (ALIVE, "statvfs answered")
            elif result[0].errno == errno.ENOTCONN:
                out[path] = (DEAD, "ENOTCONN: its FUSE session is gone")
            else:
                out[path] = (ERROR, f"statvfs failed: {errno.errorcode.get(result[0].errno, result[0].errno)}")
        return out


@dataclass(frozen=True)
class MountState:
    """One pod volume's classification (``reason`` says why, for logs and ``verify.py``)."""

    volume: PodVolume
    state: str
    reason: str
    device: str


def classify(volumes: list[PodVolume], mountinfo: list[MountEntry], prober: Prober,
             plugin_dir: str = PLUGIN_DIR) -> list[MountState]:
    """Classify every volume of ``volumes`` that is mounted (see the module docstring, step 2).

    A volume with no mount at its target (being set up or torn down) is left out. Dead by
    device needs no probe; every other FUSE mount is probed once.
    """
    tops = top_mounts(mountinfo)
    live = live_fuse_devices(tops, plugin_dir)
    mounted, to_probe = [], []
    for v in volumes:
        entry = tops.get(v.target)
        if entry is None:
            continue
        mounted.append((v, entry))
        if entry.is_fuse and not (live and entry.device not in live):
            to_probe.append(v.target)
    probed = prober.probe_all(to_probe)
    out = []
    for v, entry in mounted:
        if not entry.is_fuse:
            out.append(MountState(v, ERROR, f"not a FUSE mount ({entry.fstype})", entry.device))
        elif live and entry.device not in live:
            out.append(MountState(v, DEAD, f"stale FUSE session {entry.device}; the node's session(s): "
                                           f"{', '.join(sorted(live))}", entry.device))
        else:
            state, reason = probed[v.target]
            out.append(MountState(v, state, reason, entry.device))
    return out


def classify_by_session(volumes: list[PodVolume], mountinfo: list[MountEntry], prober: Prober,
                        plugin_dir: str = PLUGIN_DIR) -> list[MountState]:
    """Classify ``volumes`` (host paths, not reachable here) by the FUSE session each bind holds.

    A bind is a bind of its session's superblock: every ``statvfs`` of it is answered by the same
    curvine-fuse as one of the session's mount at the plugin path (``STATFS`` goes to the
    connection's daemon). So each live session is probed once, at ``<plugin_dir>/<mount key>/
    fuse-mount`` (the plugin directory is the DaemonSet's only host directory), and its answer is
    every bind's on it. A bind whose device is no session mounted at a plugin path now is
    **dead** without a probe: its FUSE pod restarted (a new session is on top) or is gone (the
    driver's ``preStop`` unmounted it, or nothing has mounted since), and its daemon with it.

    Returns one :class:`MountState` per volume mounted at its target (the others are being set up
    or torn down), in the order of ``volumes``.
    """
    tops = top_mounts(mountinfo)
    live = live_fuse_devices(tops, plugin_dir)
    mounted = [(v, tops[v.target]) for v in volumes if v.target in tops]
    wanted = sorted({live[e.device] for _, e in mounted if e.device in live})
    probed = prober.probe_all(wanted)
    out = []
    for v, entry in mounted:
        if entry.device in live:
            state, reason = probed[live[entry.device]]
            out.append(MountState(v, state, f"its session {entry.device} at the plugin path: {reason}", entry.device))
        elif live:
            out.append(MountState(v, DEAD, f"stale FUSE session {entry.device}; the node's session(s): "
                                           f"{', '.join(sorted(live))}", entry.device))
        else:
            out.append(MountState(v, DEAD, f"stale FUSE session {entry.device}; no session is mounted at "
                                           f"{plugin_dir}", entry.device))
    return out


# --- the API server ------------------------------------------------------------------------------


ApiError = core.ApiError


class Api(Protocol):
    """What a pass needs from the API server (:class:`InClusterApi`; tests use a fake server)."""

    def pv_namespace(self, pv: str) -> str | None: ...
    def pods_on_node(self, namespace: str, node: str) -> list[dict[str, Any]]: ...
    def pods_in(self, namespace: str) -> list[dict[str, Any]]: ...
    def evict(self, namespace: str, name: str, uid: str) -> str: ...
    def fuse_pods_on_node(self, namespace: str, node: str) -> list[dict[str, Any]]: ...
    def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...
    def acquire_slot(self, namespace: str, holder: str, slots: int, duration_s: int, now: float) -> str | None: ...
    def release_slot(self, namespace: str, name: str, holder: str) -> None: ...


class HttpApi(core.KubeApi):
    """The few API calls of a pass (:class:`agent_core.KubeApi`, whose arguments it takes).

    Needs: ``get persistentvolumes`` (cluster); ``list pods`` and ``create pods/eviction`` in the
    L2 lines' namespaces.
    """

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._pv_namespaces: dict[str, str | None] = {}

    def pv_namespace(self, pv: str) -> str | None:
        """Namespace of the claim bound to PV ``pv`` (cached: a binding never moves); None if unbound."""
        if pv not in self._pv_namespaces:
            obj = self.call("GET", f"/api/v1/persistentvolumes/{urllib.parse.quote(pv)}")
            self._pv_namespaces[pv] = ((obj.get("spec") or {}).get("claimRef") or {}).get("namespace")
        return self._pv_namespaces[pv]

    def pods_on_node(self, namespace: str, node: str) -> list[dict[str, Any]]:
        """The Pods of ``namespace`` scheduled to ``node``."""
        return self.list_pods(namespace, f"spec.nodeName={node}")

    def pods_in(self, namespace: str) -> list[dict[str, Any]]:
        """Every Pod of ``namespace`` (to count a pod's Ready siblings before evicting it)."""
        return self.list_pods(namespace)

    def evict(self, namespace: str, name: str, uid: str) -> str:
        """Evict one Pod (policy/v1 Eviction, precondition: this UID). Returns ``evicted``, or
        ``refused`` when a PodDisruptionBudget does not allow it now (HTTP 429); a Pod already gone
        (404, or 409 for another UID) counts as evicted. Raises :class:`ApiError` otherwise."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}/eviction"
        try:
            self.call("POST", path, body)
        except ApiError as exc:
            if exc.status == 429:
                return "refused"
            if exc.status in (404, 409):
                return "evicted"
            raise
        return "evicted"

    def fuse_pods_on_node(self, namespace: str, node: str) -> list[dict[str, Any]]:
        """The FUSE pods (:data:`FUSE_POD_LABEL`) of ``namespace`` on ``node``."""
        query = urllib.parse.urlencode({"labelSelector": "=".join(FUSE_POD_LABEL), "fieldSelector": f"spec.nodeName={node}"})
        return self.call("GET", f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods?{query}").get("items") or []

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """DELETE one Pod (precondition: this UID; default grace period, so the FUSE pod's ``preStop``
        unmounts its plugin path). A pod already gone is fine. Raises :class:`ApiError` otherwise."""
        path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}"
        try:
            self.call("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def _lease_path(self, namespace: str, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{urllib.parse.quote(namespace)}/leases"
        return f"{base}/{urllib.parse.quote(name)}" if name else base

    def acquire_slot(self, namespace: str, holder: str, slots: int, duration_s: int, now: float) -> str | None:
        """One of ``slots`` Leases ``<REPLACEMENT_LEASE_PREFIX>-<i>`` for ``holder`` (a node), or None
        when every one is held by another node and renewed within its ``leaseDurationSeconds``.

        A slot this holder has is renewed; a free one is created; an expired one (or one released,
        no holder) is taken with its ``resourceVersion``, so of two nodes racing for it one gets HTTP
        409 and tries the next (optimistic concurrency: the API server's, not a clock race).
        ``now``: seconds since the epoch (the nodes' clocks, NTP-synchronised on EKS).
        """
        stamp = _micro_time(now)
        spec = {"holderIdentity": holder, "leaseDurationSeconds": int(duration_s), "renewTime": stamp}
        for i in range(slots):
            name = f"{REPLACEMENT_LEASE_PREFIX}-{i}"
            try:
                lease = self.call("GET", self._lease_path(namespace, name))
            except ApiError as exc:
                if exc.status != 404:
                    raise
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": name, "namespace": namespace}, "spec": {**spec, "acquireTime": stamp}}
                try:
                    self.call("POST", self._lease_path(namespace), body)
                except ApiError as err:
                    if err.status == 409:
                        continue
                    raise
                return name
            current = lease.get("spec") or {}
            mine = current.get("holderIdentity") == holder
            free = not current.get("holderIdentity") or _lease_expired(current, now)
            if not (mine or free):
                continue
            lease["spec"] = {**current, **spec, **({} if mine else {"acquireTime": stamp})}
            try:
                self.call("PUT", self._lease_path(namespace, name), lease)
            except ApiError as err:
                if err.status == 409:
                    continue
                raise
            return name
        return None

    def release_slot(self, namespace: str, name: str, holder: str) -> None:
        """Give slot ``name`` back (no holder), if ``holder`` still has it."""
        lease = self.call("GET", self._lease_path(namespace, name))
        if (lease.get("spec") or {}).get("holderIdentity") != holder:
            return
        lease["spec"] = {**lease["spec"], "holderIdentity": ""}
        try:
            self.call("PUT", self._lease_path(namespace, name), lease)
        except ApiError as exc:
            if exc.status != 409:
                raise


def _micro_time(epoch_s: float) -> str:
    """A ``metav1.MicroTime``: RFC 3339 with microseconds, UTC."""
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lease_expired(spec: dict[str, Any], now: float) -> bool:
    """The Lease was last renewed more than its ``leaseDurationSeconds`` before ``now`` (or never)."""
    renew = spec.get("renewTime") or spec.get("acquireTime")
    if not renew:
        return True
    try:
        when = datetime.datetime.fromisoformat(renew.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return True
    return now - when > float(spec.get("leaseDurationSeconds") or 0)


def unmount_detach(path: str) -> None:
    """``umount2(path, MNT_DETACH)`` in this process's own mount namespace: detach a dead bind now
    (a run by hand on the node, as root; the DaemonSet uses :func:`unmount_in_host_namespace`).
    Raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


#: The child that unmounts in the host's mount namespace: ``setns`` changes the mount namespace of
#: a single-threaded process only (setns(2): EINVAL for a multithreaded caller), and this process
#: runs probe and HTTP threads, so a fresh interpreter does it (standard library, ctypes).
_HOST_UNMOUNT_CHILD = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
ns, flag, target, detach = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
fd = os.open(ns, os.O_RDONLY)
if libc.setns(fd, flag) != 0 or libc.umount2(os.fsencode(target), detach) != 0:
    err = ctypes.get_errno()
    sys.stderr.write(f"{err} {os.strerror(err)}")
    sys.exit(1)
"""


def unmount_in_host_namespace(path: str, *, kubelet_dir: str = KUBELET_DIR, namespace: str = HOST_MOUNT_NAMESPACE,
                              python: str = sys.executable) -> None:
    """``umount2(path, MNT_DETACH)`` in the mount namespace of the host's init (``namespace``):
    where the kubelet and the CSI node plugin's binds live, reached through the host's PID
    namespace (``hostPID``) and CAP_SYS_ADMIN + CAP_SYS_CHROOT (privileged), so no kubelet
    directory is mounted into the container. Only a kubelet CSI target (:func:`csi_target`) is
    ever unmounted.

    Raises:
        ValueError: ``path`` is not a kubelet CSI target.
        OSError: the child failed (its errno and message), or did not finish within
            :data:`UNMOUNT_HELPER_TIMEOUT_S`.
    """
    if csi_target(path, kubelet_dir) is None:
        raise ValueError(f"not a kubelet CSI target: {path}")
    try:
        done = subprocess.run([python, "-c", _HOST_UNMOUNT_CHILD, namespace, str(CLONE_NEWNS), path, str(MNT_DETACH)],
                              capture_output=True, text=True, timeout=UNMOUNT_HELPER_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OSError(errno.ETIMEDOUT, f"unmount helper took over {UNMOUNT_HELPER_TIMEOUT_S} s", path) from exc
    if done.returncode != 0:
        code, _, message = done.stderr.strip().partition(" ")
        raise OSError(int(code) if code.isdigit() else errno.EIO, message or done.stderr.strip(), path)


# --- one pass ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchdogConfig:
    """What the chart renders into ``watchdog.json`` (:func:`config_from_dict` reads it).

    Attributes:
        heal: evict pods with a dead mount and unmount dead binds of terminating pods; False:
            report only (``curvine.mount_watchdog.heal``).
        period_s: seconds between the starts of two passes.
        probe_timeout_s: a ``statvfs`` slower than this is hung (below ``period_s``).
        eviction_interval_s: at most one eviction per node per this many seconds.
        max_stuck_probes: probe threads stuck at most.
        kubelet_dir, plugin_dir: the host paths (``kubelet_dir`` as the host names it; the
            plugin directory as this process sees it: the DaemonSet mounts it at the same path).
        replace_hung_after_s: replace a FUSE session hung in every pass for this long (seconds; 0:
            never): its FUSE pod is deleted (the driver starts a new one at the next mount) and
            the binds, dead then, are healed like any dead bind. Only with ``heal`` and the API.
        max_nodes_replacing: at most this many nodes of the cluster replace a session at once
            (Leases :data:`REPLACEMENT_LEASE_PREFIX`), each until all its mounts are alive again.
        namespace: the Curvine namespace (the FUSE pods and the Leases); needed to replace.
        host_mountinfo: the host's mount table, as the DaemonSet mounts it
            (:data:`HOST_MOUNTINFO`): then the pass reads nothing of ``kubelet_dir`` (volumes
            from that table, :func:`volumes_from_mountinfo`), probes each session at the plugin
            path (:func:`classify_by_session`) and unmounts in the host's mount namespace
            (:func:`unmount_in_host_namespace`). Empty (a run by hand on the node itself): the
            kubelet's layout under ``kubelet_dir`` (:func:`find_volumes`), this process's own
            ``/proc/self/mountinfo``, a probe of every bind (:func:`classify`) and a direct unmount.
    """

    heal: bool = True
    period_s: float = PERIOD_S
    probe_timeout_s: float = PROBE_TIMEOUT_S
    eviction_interval_s: float = EVICTION_INTERVAL_S
    max_stuck_probes: int = MAX_STUCK_PROBES
    kubelet_dir: str = KUBELET_DIR
    plugin_dir: str = PLUGIN_DIR
    host_mountinfo: str = ""
    replace_hung_after_s: float = 0
    max_nodes_replacing: int = 1
    namespace: str = ""

    def __post_init__(self) -> None:
        if self.replace_hung_after_s and (self.replace_hung_after_s < self.period_s or not self.namespace):
            raise ValueError("replace_hung_after_s must be 0 or at least period_s, with the Curvine namespace set")
        if self.max_nodes_replacing < 1:
            raise ValueError("max_nodes_replacing must be at least 1")
        if not 0 < self.probe_timeout_s < self.period_s:
            raise ValueError(f"probe_timeout_s must be > 0 and below period_s, got {self.probe_timeout_s}, "
                             f"{self.period_s}")
        if self.eviction_interval_s < self.period_s or self.max_stuck_probes < 1:
            raise ValueError("eviction_interval_s must be >= period_s and max_stuck_probes >= 1")


def config_from_dict(data: dict[str, Any]) -> WatchdogConfig:
    """:class:`WatchdogConfig` from the rendered JSON; ValueError on a missing, unknown or bad key."""
    return core.config_from_dict(WatchdogConfig, data, "watchdog")


@dataclass
class MountReport:
    """One mount in a pass's report (``/mounts`` and the metrics)."""

    namespace: str
    pod: str
    pod_uid: str
    volume: str
    state: str
    reason: str
    action: str = ""


@dataclass
class PassReport:
    """What one pass saw and did."""

    node: str
    mounts: list[MountReport] = field(default_factory=list)
    api_errors: list[str] = field(default_factory=list)
    probes_stuck: int = 0
    finished_at: float = 0.0
    duration_s: float = 0.0


def _is_ready(pod: dict[str, Any]) -> bool:
    """A Pod that serves: condition ``Ready`` True and not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _host_paths(pod: dict[str, Any]) -> set[str]:
    """The ``hostPath`` paths of a pod's volumes (a FUSE pod mounts its session's plugin path)."""
    return {((v.get("hostPath") or {}).get("path") or "").rstrip("/") for v in (pod.get("spec") or {}).get("volumes") or []
            if v.get("hostPath")}


def _controller(pod: dict[str, Any]) -> dict[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


class Watchdog:
    """Passes and the counters across them for one node.

    Args:
        node: this node's name (``spec.nodeName`` of the pods listed).
        config: the rendered configuration.
        api: the API server, or None (no names, no healing: report by pod UID only).
        prober: the probe pool (a default :class:`Prober` from ``config``).
        read_mountinfo: returns the mountinfo text (default: ``config.host_mountinfo``, else
            ``/proc/self/mountinfo``; tests inject one).
        unmount: detaches a dead bind (default: :func:`unmount_in_host_namespace` with
            ``config.host_mountinfo``, else :func:`unmount_detach`).
        clock: ``time.monotonic`` (tests inject one).
        log: where each event's JSON line goes (stdout).
    """

    def __init__(self, node: str, config: WatchdogConfig, *, api: Api | None,
                 prober: Prober | None = None,
                 read_mountinfo: Callable[[], str] | None = None,
                 unmount: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None) -> None:
        self.node, self.config, self.api = node, config, api
        self.prober = prober or Prober(config.probe_timeout_s, config.max_stuck_probes)
        host = config.host_mountinfo
        if read_mountinfo is None:
            read_mountinfo = lambda: Path(host or "/proc/self/mountinfo").read_text()  # noqa: E731
        if unmount is None:
            unmount = (lambda path: unmount_in_host_namespace(path, kubelet_dir=config.kubelet_dir)) if host \
                else unmount_detach
        self.read_mountinfo, self.unmount, self.clock = read_mountinfo, unmount, clock
        self.log = log or (lambda line: print(line, flush=True))
        self.evictions = {r: 0 for r in EVICTION_RESULTS}
        self.unmounts = {r: 0 for r in UNMOUNT_RESULTS}
        self.replacements = {r: 0 for r in REPLACEMENT_RESULTS}
        self._hung_since: dict[str, float] = {}  # plugin mount point of a hung session -> first seen hung
        self._slot: str | None = None  # the replacement Lease this node holds
        self._last_eviction: float | None = None
        self._evicted: set[str] = set()  # UIDs evicted: never again, whatever the listing says
        self._lock = threading.Lock()
        self._last: PassReport | None = None
        self._last_finished_monotonic: float | None = None

    @property
    def last(self) -> PassReport | None:
        """The last finished pass (None before the first)."""
        with self._lock:
            return self._last

    def _event(self, **fields: Any) -> None:
        self.log(json.dumps({"event": "kvcache_l2_mount_watchdog", "node": self.node, **fields},
                            separators=(",", ":"), sort_keys=True))

    def run_pass(self) -> PassReport:
        """One pass (module docstring); never raises for a mount or API problem."""
        started = time.monotonic()
        report = PassReport(node=self.node)
        try:
            mountinfo = parse_mountinfo(self.read_mountinfo())
        except OSError as exc:
            report.api_errors.append(f"mountinfo: {exc}")
            mountinfo = []
        if self.config.host_mountinfo:
            volumes = volumes_from_mountinfo(mountinfo, self.config.kubelet_dir)
            states = classify_by_session(volumes, mountinfo, self.prober, self.config.plugin_dir)
        else:
            volumes = find_volumes(self.config.kubelet_dir)
            states = classify(volumes, mountinfo, self.prober, self.config.plugin_dir)
        pods, known = self._pods(states, report)
        evict_candidates = []
        hung: list[tuple[MountReport, MountState]] = []
        for s in states:
            ns, pod = known.get(s.volume.pod_uid, (None, None))
            m = MountReport(namespace=ns or "", pod=((pod or {}).get("metadata") or {}).get("name", ""),
                            pod_uid=s.volume.pod_uid, volume=s.volume.volume, state=s.state, reason=s.reason)
            report.mounts.append(m)
            if s.state == HUNG:
                hung.append((m, s))
            if s.state != DEAD:
                continue
            listed = ns is not None and ns in pods
            terminating = pod is not None and bool((pod.get("metadata") or {}).get("deletionTimestamp")
                                                   or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
            orphan = listed and pod is None
            if terminating or orphan:
                m.action = self._unmount(s, m, "pod terminating or finished" if terminating else "pod no longer exists")
            elif pod is None:
                m.action = "not healed: its pod could not be looked up"
            elif _controller(pod) is None:
                m.action = "not healed: the pod has no controller to replace it (delete it by hand)"
            else:
                evict_candidates.append((m, pod))
        for m, pod in sorted(evict_candidates, key=lambda c: (c[0].namespace, c[0].pod)):
            m.action = self._evict(m, pod)
        self._replace_hung(hung, live_fuse_devices(top_mounts(mountinfo), self.config.plugin_dir), report)
        report.probes_stuck = self.prober.stuck
        report.duration_s = round(time.monotonic() - started, 3)
        report.finished_at = round(time.time(), 3)
        with self._lock:
            self._last, self._last_finished_monotonic = report, self.clock()
        bad = [asdict(m) for m in report.mounts if m.state != ALIVE]
        self._event(mounts=len(report.mounts), not_alive=bad, api_errors=report.api_errors,
                    probes_stuck=report.probes_stuck, duration_s=report.duration_s)
        return report

    def _pods(self, states: list[MountState], report: PassReport
              ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, tuple[str, dict[str, Any] | None]]]:
        """(namespace -> its Pods on this node, listed ones only; pod UID -> (namespace, Pod or None))."""
        pods: dict[str, list[dict[str, Any]]] = {}
        known: dict[str, tuple[str, dict[str, Any] | None]] = {}
        if self.api is None:
            return pods, known
        for s in states:
            uid = s.volume.pod_uid
            if uid in known:
                continue
            try:
                ns = self.api.pv_namespace(s.volume.volume)
            except ApiError as exc:
                report.api_errors.append(str(exc))
                continue
            if ns is None:
                continue
            if ns not in pods:
                try:
                    pods[ns] = self.api.pods_on_node(ns, self.node)
                except ApiError as exc:
                    report.api_errors.append(str(exc))
                    known[uid] = (ns, None)
                    continue
            match = [p for p in pods[ns] if (p.get("metadata") or {}).get("uid") == uid]
            known[uid] = (ns, match[0] if match else None)
        return pods, known

    def _unmount(self, s: MountState, m: MountReport, why: str) -> str:
        if not self.config.heal:
            return f"report only: would unmount ({why})"
        try:
            self.unmount(s.volume.target)
        except OSError as exc:
            self.unmounts["failed"] += 1
            self._event(action="unmount", result="failed", target=s.volume.target, error=str(exc))
            return f"unmount failed: {exc}"
        self.unmounts["unmounted"] += 1
        self._event(action="unmount", result="unmounted", target=s.volume.target, why=why,
                    namespace=m.namespace, pod=m.pod)
        return f"unmounted ({why})"

    def _replace_hung(self, hung: list[tuple[MountReport, MountState]], live: dict[str, str], report: PassReport) -> None:
        """Replace the FUSE session of a bind hung in every pass for ``replace_hung_after_s``.

        A hang that long is curvine-fuse itself stuck, not an absent Primary: with the FUSE pods'
        client timeouts every Curvine operation ends within 3 s (``k8s/curvine_config.py``,
        ``fuse_master_op_bound_ms``), with ``EIO`` (state ``error``, never replaced) when the
        Primary is unreachable. The node first takes one of ``max_nodes_replacing`` cluster-wide
        slots (Leases), holds it until every mount of the node is alive again (the binds die with
        the session and are healed like any dead bind: evicted one per interval, through each
        line's PodDisruptionBudget, never the last Ready replica), then deletes the session's FUSE
        pod; the driver starts a new one at the next mount. Without a slot it waits.
        """
        now = self.clock()
        points = {live[s.device] for _, s in hung if s.device in live}
        self._hung_since = {p: t for p, t in self._hung_since.items() if p in points}
        for point in points:
            self._hung_since.setdefault(point, now)
        after = self.config.replace_hung_after_s
        able = bool(after and self.config.heal and self.api is not None and self.config.namespace)
        assert self.api is not None or not able
        duration = int(LEASE_PERIODS * self.config.period_s)
        if self._slot is not None and able:
            try:
                if all(m.state == ALIVE for m in report.mounts):
                    self.api.release_slot(self.config.namespace, self._slot, self.node)
                    self._event(action="release_slot", slot=self._slot)
                    self._slot = None
                else:
                    self._slot = self.api.acquire_slot(self.config.namespace, self.node, self.config.max_nodes_replacing,
                                                       duration, time.time())
            except ApiError as exc:
                report.api_errors.append(str(exc))
        for m, s in hung:
            point = live.get(s.device)
            since = self._hung_since.get(point, now) if point else now
            if not able:
                m.action = "not healed: replacing a hung FUSE session is off"
            else:
                m.action = f"hung for {now - since:.0f} s; its FUSE session is replaced after {after:g} s"
        due = sorted(p for p, t in self._hung_since.items() if able and now - t >= after)
        for point in due:
            action = self._replace(point, now - self._hung_since[point], report)
            for m, s in hung:
                if live.get(s.device) == point:
                    m.action = action

    def _replace(self, point: str, hung_s: float, report: PassReport) -> str:
        """Take a slot, then delete the FUSE pod whose plugin mount is ``point``; the action text."""
        assert self.api is not None
        ns = self.config.namespace
        try:
            if self._slot is None:
                self._slot = self.api.acquire_slot(ns, self.node, self.config.max_nodes_replacing,
                                                   int(LEASE_PERIODS * self.config.period_s), time.time())
            if self._slot is None:
                return (f"hung for {hung_s:.0f} s; replacement waits: {self.config.max_nodes_replacing} node(s) "
                        "already replace their FUSE session (max_nodes_replacing)")
            pods = [p for p in self.api.fuse_pods_on_node(ns, self.node) if point in _host_paths(p)]
        except ApiError as exc:
            report.api_errors.append(str(exc))
            return f"hung for {hung_s:.0f} s; not replaced: {exc}"
        if not pods:
            return f"hung for {hung_s:.0f} s; not replaced: no FUSE pod on this node mounts {point}"
        meta = pods[0].get("metadata") or {}
        try:
            self.api.delete_pod(ns, meta.get("name", ""), meta.get("uid", ""))
        except ApiError as exc:
            self.replacements["failed"] += 1
            self._event(action="replace_fuse_session", result="failed", point=point, pod=meta.get("name"), error=str(exc))
            return f"hung for {hung_s:.0f} s; replacing its FUSE pod failed: {exc}"
        self.replacements["replaced"] += 1
        self._hung_since.pop(point, None)
        self._event(action="replace_fuse_session", result="replaced", point=point, pod=meta.get("name"),
                    hung_s=round(hung_s), slot=self._slot)
        return f"its FUSE session, hung for {hung_s:.0f} s, replaced: FUSE pod {meta.get('name')} deleted"

    def _last_ready_replica(self, m: MountReport, pod: dict[str, Any]) -> bool:
        """True when ``pod`` is Ready and no other Ready pod of its controller is left: evicting it would
        take the last serving replica (of a one-replica line, or of one whose others are down). The
        line's PodDisruptionBudget (``maxUnavailable: 1``, k8s/line_chart.py) cannot say so without
        blocking every drain of a one-replica line; it bounds concurrent evictions across nodes."""
        if not _is_ready(pod):
            return False
        owner = _controller(pod)
        assert self.api is not None and owner is not None
        siblings = [p for p in self.api.pods_in(m.namespace)
                    if (p.get("metadata") or {}).get("uid") != m.pod_uid and _is_ready(p)
                    and (_controller(p) or {}).get("name") == owner.get("name")
                    and (_controller(p) or {}).get("kind") == owner.get("kind")]
        return not siblings

    def _evict(self, m: MountReport, pod: dict[str, Any]) -> str:
        if not self.config.heal:
            return "report only: would evict"
        if m.pod_uid in self._evicted:
            return "evicted; waiting for it to terminate"
        try:
            last = self._last_ready_replica(m, pod)
        except ApiError as exc:
            return f"not healed: its siblings could not be listed ({exc})"
        if last:
            return ("kept: the last Ready replica of its controller (it serves without L2 through the L2 gate); "
                    "delete it by hand when a new one may start, or add replicas")
        now = self.clock()
        if self._last_eviction is not None and now - self._last_eviction < self.config.eviction_interval_s:
            return (f"eviction waits: one per {self.config.eviction_interval_s:g} s on this node, the last "
                    f"{now - self._last_eviction:.0f} s ago")
        assert self.api is not None  # a pod was found, so there is an API
        try:
            result = self.api.evict(m.namespace, m.pod, m.pod_uid)
        except ApiError as exc:
            result, detail = "failed", str(exc)
        else:
            detail = ""
        self.evictions[result] += 1
        self._event(action="evict", result=result, namespace=m.namespace, pod=m.pod, volume=m.volume,
                    reason=m.reason, error=detail)
        if result == "evicted":
            self._last_eviction = now
            self._evicted.add(m.pod_uid)
            return "evicted"
        return ("eviction refused by a PodDisruptionBudget; retried next pass" if result == "refused"
                else f"eviction failed: {detail}")

    def healthy(self) -> tuple[bool, str]:
        """False when no pass finished for :data:`STALE_PERIODS` periods (after the first one)."""
        with self._lock:
            last = self._last_finished_monotonic
        if last is not None and self.clock() - last > STALE_PERIODS * self.config.period_s:
            return False, f"no pass finished for {self.clock() - last:.0f} s"
        return True, "ok"

    def loop(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set (a bug in a pass is logged, not fatal)."""
        core.every(self.config.period_s, self._guarded_pass, stop)

    def _guarded_pass(self) -> None:
        try:
            self.run_pass()
        except Exception as exc:  # keep watching: one bad pass must not end the DaemonSet pod
            self._event(error=f"unexpected {type(exc).__name__}: {exc}")

    def metrics(self) -> str:
        """:func:`prometheus_text` of the last pass and the counters ("" before the first pass)."""
        last = self.last
        return "" if last is None else prometheus_text(last, self.evictions, self.unmounts, self.replacements)


def prometheus_text(report: PassReport, evictions: dict[str, int], unmounts: dict[str, int],
                    replacements: dict[str, int] | None = None) -> str:
    """The pass in the Prometheus text format.

    * :data:`UP_METRIC` ``{namespace,pod,node,volume}``: 1 alive, 0 dead, hung or error;
    * :data:`STATE_METRIC` ``{namespace,pod,node,volume,state}``: 1 for the mount's state, 0 for
      the three others (all four always present, so a change of state is no new series);
    * :data:`EVICTIONS_METRIC` ``{node,result}``, :data:`UNMOUNTS_METRIC` ``{node,result}``,
      :data:`REPLACEMENTS_METRIC` ``{node,result}``: counters since the process started;
    * :data:`PROBES_STUCK_METRIC`, :data:`API_ERRORS_METRIC`, :data:`LAST_PASS_METRIC` ``{node}``.

    ``namespace`` and ``pod`` are empty when the API could not name the pod (``pod_uid`` label).
    """
    node = report.node
    rows = sorted(report.mounts, key=lambda m: (m.namespace, m.pod, m.pod_uid, m.volume))

    def mount_labels(m: MountState, **extra: str) -> dict[str, str]:
        return {"namespace": m.namespace, "pod": m.pod, "node": node, "volume": m.volume, "pod_uid": m.pod_uid,
                **extra}

    out = core.family(UP_METRIC, "gauge", "1 if the pod's Curvine L2 mount answered in the last pass, 0 if dead, "
                      "hung or failing", [(mount_labels(m), str(int(m.state == ALIVE))) for m in rows])
    out += core.family(STATE_METRIC, "gauge", "1 for the mount's state in the last pass (alive, dead, hung, error)",
                       [(mount_labels(m, state=state), str(int(m.state == state))) for m in rows for state in STATES])
    for metric, text, counts in ((EVICTIONS_METRIC, "evictions of pods with a dead L2 mount, by result", evictions),
                                 (UNMOUNTS_METRIC, "lazy unmounts of dead L2 binds, by result", unmounts),
                                 (REPLACEMENTS_METRIC, "hung FUSE sessions replaced (FUSE pod deleted), by result",
                                  replacements or {r: 0 for r in REPLACEMENT_RESULTS})):
        out += core.family(metric, "counter", text, [({"node": node, "result": r}, str(n)) for r, n in counts.items()])
    for metric, text, value in (
            (PROBES_STUCK_METRIC, "statvfs probes still waiting for a FUSE answer", str(report.probes_stuck)),
            (API_ERRORS_METRIC, "API calls of the last pass that failed", str(len(report.api_errors))),
            (LAST_PASS_METRIC, "when the last pass finished (seconds since the epoch)", repr(report.finished_at))):
        out += core.family(metric, "gauge", text, [({"node": node}, value)])
    return "\n".join(out) + "\n"


def make_server(watchdog: Watchdog, port: int, host: str = "") -> ThreadingHTTPServer:
    """HTTP server (:func:`agent_core.make_server`): :data:`METRICS_PATH`, :data:`MOUNTS_PATH` (the
    last pass as JSON, ``null`` before the first), :data:`LIVENESS_PATH`."""

    def mounts() -> tuple[int, str, str]:
        last = watchdog.last
        return 200, json.dumps(None if last is None else asdict(last)), "application/json"

    return core.make_server({METRICS_PATH: lambda: (200, watchdog.metrics(), core.METRICS_TEXT), MOUNTS_PATH: mounts,
                             LIVENESS_PATH: core.health(watchdog.healthy)}, port, host)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--node NAME [--config FILE] [--no-api] [--report-only]`` and ``--once`` (one
    pass, its report as JSON on stdout, exit 0 if every mount is alive, else 1) or ``--serve
    [--port N]`` (passes until SIGTERM). Exit 2 on a bad flag or config."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--node", required=True, help="this node's name (the pod's spec.nodeName)")
    parser.add_argument("--config", type=Path, help="watchdog.json rendered by the Curvine chart")
    parser.add_argument("--no-api", action="store_true", help="do not call the API server (no names, no healing)")
    parser.add_argument("--report-only", action="store_true", help="heal nothing, whatever the config says")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="one pass, its report on stdout")
    mode.add_argument("--serve", action="store_true", help="a pass every period; metrics over HTTP on --port")
    parser.add_argument("--port", type=int, default=METRICS_PORT, help="--serve: HTTP port (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.config.read_text(encoding="utf-8")) if args.config else {}
        if args.report_only:
            data["heal"] = False
        config = config_from_dict(data)
    except (OSError, ValueError) as exc:
        print(f"error: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        api = None if args.no_api else HttpApi.in_cluster()
    except (KeyError, OSError) as exc:
        print(f"error: no in-cluster API access ({exc}); use --no-api", file=sys.stderr)
        return 2
    watchdog = Watchdog(args.node, config, api=api, log=(lambda line: None) if args.once else None)
    if args.once:
        report = watchdog.run_pass()
        print(json.dumps(asdict(report), indent=2))
        return 0 if all(m.state == ALIVE for m in report.mounts) else 1
    return core.serve(lambda port: make_server(watchdog, port), args.port, watchdog.loop)


if __name__ == "__main__":
    sys.exit(main())
