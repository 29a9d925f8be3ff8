"""A model of Curvine CSI's standalone node service on one node, of the kubelet that calls it and
of the API server that admits its pod deletions, to replay volume churn.

The driver is Go and cannot run here, so its node service is restated from the source:
CurvineIO/curvine tag ``v0.3.2-alpha`` (commit f40ca6ff), ``curvine-csi/pkg/csi/`` files
``node_standalone.go`` (**NS**) and ``standalone_manager.go`` (**SM**), both unchanged at
``v0.4.1`` and on ``main`` (bff4e7dc); ``volume_handle.go`` (**VH**) and ``fuse_cli.go`` (**FC**)
for the keys. Every method names the lines it restates, in the source's order of calls; where the
Go code returns an error, the model raises :class:`CsiError` / :class:`ApiError` at the same point.

Around it:

* :class:`ApiServer`: the FUSE pods and state ConfigMaps of the Curvine namespace, the Curvine
  PVs, and the admission of pod DELETEs (the rendered ValidatingAdmissionPolicy, evaluated by
  :mod:`tests.k8s.vap_eval`; none for the control).
* :class:`FuseRuntime`: what the kubelet does with a FUSE pod (``buildStandalone``, SM l.423-566:
  ``RestartPolicy: Always``, probes grepping ``/proc/mounts``, ``preStop`` ``fusermount -u``): it
  starts the container, restarts it in place after a crash (a new FUSE session), evicts it, ends
  the session when the pod is deleted. A FUSE *session* is one run of curvine-fuse: a bind mount
  made from it lives exactly as long as it (a new session of the same pod does not revive old bind
  mounts: the FUSE connection they hold is gone, hence ENOTCONN).
* :class:`Kubelet`: the CSI calls of the kubelet's volume manager for a driver with
  ``STAGE_UNSTAGE_VOLUME`` (NS l.519-531): NodeStageVolume once per volume and node before the
  first publish, NodePublishVolume per pod, NodeUnpublishVolume when a pod's containers have
  stopped, NodeUnstageVolume once no pod on the node uses the volume any more; a failed call is
  retried at the next reconcile.
* :class:`Node`: one node with a clock, the node plugin (which can restart: a new process reads
  its state back from the ConfigMap), the PV watcher and the garbage collector's ticks (first
  2 minutes after the plugin starts, then every 10 minutes, NS l.637-661).

Left out, because they do not change which FUSE pod is deleted or which mount is bound to which
session: request IDs, logging, ``ValidateFuseParameters`` of static volumes (NS l.146-153; the
platform's volumes are dynamic), the sub-path and target directory handling of NodePublishVolume
(NS l.337-377) and NodeUnpublishVolume's early return for a target path that does not exist
(NS l.417-421; the kubelet's target directory exists when it unpublishes), ``ensureCleanMountPath`` (SM l.1025-1088: cleans a stale host mount point before a
pod is re-created), the grace period of a deletion (a deleted FUSE pod is gone at once; its
``preStop`` unmounts FUSE, so its session ends at once either way), the real durations of the
waits (``WaitForStandaloneReady`` polls for 60 s: here the pod is Ready at once when FUSE can
mount, and the wait times out otherwise), ConfigMap write failures, concurrent gRPC calls (the
kubelet serialises operations per volume; the model runs calls one at a time), and the kubelet's
own restart (volume reconstruction).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

#: SM l.32-61: names, labels, paths and timeouts of the standalone manager.
STANDALONE_NAME_PREFIX = "curvine-csi-standalone-"
STANDALONE_LABEL_APP = ("app", "curvine-standalone")
STANDALONE_LABEL_CLUSTER_ID = "curvine.io/cluster-id"
STANDALONE_LABEL_NODE = "curvine.io/node"
HOST_MOUNT_BASE_DIR = "/var/lib/kubelet/plugins/curvine"
STATE_CONFIGMAP_PREFIX = "curvine-standalone-state-"
#: NS l.640-646: the garbage collector's first run and its period, seconds.
GC_FIRST_RUN_S = 120
GC_PERIOD_S = 600
#: SM l.398-404: the options of ``deleteStandaloneAndWait`` (every self-heal delete);
#: ``DeleteStandalone`` sends ``DeleteOptions{}`` (l.644).
SELF_HEAL_DELETE_OPTIONS = {"gracePeriodSeconds": 0, "propagationPolicy": "Foreground"}
#: VH l.51.
MOUNT_KEY_NAMESPACE = b"curvine-mount-key-namespace-v1"
#: FC l.31-52: keys never passed to curvine-fuse (so not part of the mount key).
RESERVED_KEYS = {"master-addrs", "fs-path", "path-type", "curvine-path", "author", "volume-handle"}
REJECTED_KEYS = {"mnt-path"}
DRIVER_NAME = "curvine"
FUSE_CONTAINER = "curvine-fuse"


class CsiError(Exception):
    """A gRPC status the node service returns to the kubelet (``codes.Internal``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ApiError(Exception):
    """An API server answer the driver sees as an error: ``NotFound``, ``AlreadyExists``,
    ``Forbidden`` (an admission refusal)."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


# --- keys and names (VH, FC, SM) -------------------------------------------------------------

def generate_cluster_id(master_addrs: str) -> str:
    """VH l.42-47: the first 8 hex digits of sha256(master-addrs)."""
    return hashlib.sha256(master_addrs.encode()).hexdigest()[:8]


def collect_passthrough_params(volume_context: dict[str, str]) -> dict[str, str]:
    """FC l.115-128 (``MergeVolumeParameters`` l.97-110 with an empty publish context): every
    non-empty key but the reserved, rejected and Kubernetes-injected ones."""
    return {k: v for k, v in volume_context.items()
            if v and k not in RESERVED_KEYS and k not in REJECTED_KEYS
            and not k.startswith(("csi.storage.k8s.io/", "storage.kubernetes.io/"))}


def generate_mount_key(master_addrs: str, fs_path: str, fuse_params: dict[str, str]) -> str:
    """VH l.57-71 and l.83-116: sha1 (no parameters) or sha256 of the namespace and
    ``addrs|fs-path[|k=v;...]``, 32 hex digits."""
    if not fuse_params:
        return hashlib.sha1(MOUNT_KEY_NAMESPACE + f"{master_addrs}|{fs_path}".encode()).hexdigest()[:32]
    params = "".join(f"{k}={fuse_params[k]};" for k in sorted(fuse_params))
    return hashlib.sha256(MOUNT_KEY_NAMESPACE + f"{master_addrs}|{fs_path}|{params}".encode()).hexdigest()[:32]


def generate_volume_handle(master_addrs: str, fs_path: str, pv_name: str) -> str:
    """VH l.120-126: ``<cluster-id>@<fs-path>@<pv-name>``."""
    return f"{generate_cluster_id(master_addrs)}@{fs_path}@{pv_name}"


def curvine_path(fs_path: str, pv_name: str) -> str:
    """VH l.154-162 (``GetCurvinePath``)."""
    base = fs_path if fs_path == "/" or fs_path.endswith("/") else fs_path + "/"
    return base + pv_name


def volume_context(storage_class_parameters: dict[str, str], pv_name: str) -> dict[str, str]:
    """The volume context the controller's CreateVolume returns (controller.go l.156-167): the
    StorageClass parameters plus ``author``, ``master-addrs``, ``fs-path``, ``curvine-path``."""
    ctx = dict(storage_class_parameters)
    ctx.update({"author": "curvine.io", "curvine-path": curvine_path(ctx["fs-path"], pv_name)})
    return ctx


def hash_string(value: str) -> int:
    """SM l.264-270: ``h = h*31 + rune`` in uint32."""
    h = 0
    for c in value:
        h = (h * 31 + ord(c)) & 0xFFFFFFFF
    return h


def standalone_name(mount_key: str, node_name: str) -> str:
    """SM l.240-261: ``curvine-csi-standalone-<mountKey[:8]>-<hash(node)[:5]>``."""
    short = mount_key[:8] if len(mount_key) >= 8 else f"{hash_string(mount_key):08x}"
    return f"{STANDALONE_NAME_PREFIX}{short}-{f'{hash_string(node_name):08x}'[:5]}"


def host_mount_path(mount_key: str) -> str:
    """SM l.233-235."""
    return f"{HOST_MOUNT_BASE_DIR}/{mount_key}/fuse-mount"


# --- pod status, as the driver reads it --------------------------------------------------------

def is_pod_ready(pod: dict) -> bool:
    """SM l.709-716: the ``Ready`` condition is ``True``."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def needs_recreation(pod: dict) -> tuple[bool, str]:
    """SM l.362-392: phase Failed; deletionTimestamp set; per container status: waiting in
    CrashLoopBackOff, RestartCount > 5, terminated with a non-zero exit code."""
    status = pod.get("status", {})
    if status.get("phase") == "Failed":
        return True, "pod is in Failed phase"
    if pod["metadata"].get("deletionTimestamp"):
        return True, "pod is being deleted"
    for cs in status.get("containerStatuses", []):
        state = cs.get("state", {})
        if state.get("waiting", {}).get("reason") == "CrashLoopBackOff":
            return True, "CrashLoopBackOff"
        if cs.get("restartCount", 0) > 5:
            return True, f"too many restarts ({cs['restartCount']})"
        if "terminated" in state and state["terminated"].get("exitCode", 0) != 0:
            return True, "terminated with a non-zero exit code"
    return False, ""


def build_resource_requirements(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """SM l.569-618: requests and limits only from ``STANDALONE_{CPU,MEMORY}_{REQUEST,LIMIT}``
    (an unparsable value is skipped with a warning; the rendered values are checked elsewhere)."""
    out: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    for kind, resource in (("CPU", "cpu"), ("MEMORY", "memory")):
        for side, key in (("REQUEST", "requests"), ("LIMIT", "limits")):
            value = env.get(f"STANDALONE_{kind}_{side}", "")
            if value:
                out[key][resource] = value
    return out


# --- the API server ----------------------------------------------------------------------------

@dataclass
class DeleteRecord:
    """One DELETE of a FUSE pod: who asked, whether it was admitted, and whether the pod was
    healthy by the driver's own definition (not ``needsRecreation`` and Ready) at that moment."""

    name: str
    user: str
    caller: str
    allowed: bool
    healthy: bool
    message: str = ""
    #: its FUSE session was still serving binds (alive, whatever the pod's status said).
    serving: bool = False
    #: the client's ``DeleteOptions`` (``propagationPolicy``, ``gracePeriodSeconds``).
    options: dict = field(default_factory=dict)


AdmitDelete = Callable[[dict, dict], Any]  # (request, stored pod) -> an object with .allowed and .message


class ApiServer:
    """The objects of the Curvine namespace the node service touches, the Curvine PVs, and the
    admission of pod DELETEs.

    Args:
        namespace: the Curvine namespace.
        admit_delete: called with (request, stored pod) for every pod DELETE; returns an object
            with ``allowed`` and ``message``. None: no admission policy (the control).
    """

    def __init__(self, *, namespace: str, admit_delete: AdmitDelete | None) -> None:
        self.namespace = namespace
        self.admit_delete = admit_delete
        self.pods: dict[str, dict] = {}
        self.config_maps: dict[str, dict] = {}
        self.pvs: dict[str, str] = {}  # volume handle -> PV name, driver "curvine"
        self.deletes: list[DeleteRecord] = []
        self.on_pod_created: Callable[[dict], None] = lambda pod: None
        self.on_pod_deleted: Callable[[dict], None] = lambda pod: None
        #: Called when a wait for a FUSE pod times out: lets a test make the pod Ready just after
        #: the driver gave up on it (the race of EnsureStandalone's "not ready after waiting").
        self.on_wait_timeout: Callable[[str], None] | None = None
        #: Whether a FUSE pod's session still serves binds (set by the node to its runtime's view).
        self.session_alive: Callable[[str], bool] = lambda name: False

    def get_pod(self, name: str) -> dict:
        if name not in self.pods:
            raise ApiError("NotFound", f"pods {name!r} not found")
        return copy.deepcopy(self.pods[name])

    def list_pods(self, label: tuple[str, str], node_name: str) -> list[dict]:
        """NS l.669-674: label selector and ``spec.nodeName`` field selector."""
        return [copy.deepcopy(p) for p in self.pods.values()
                if p["metadata"]["labels"].get(label[0]) == label[1] and p["spec"]["nodeName"] == node_name]

    def create_pod(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        if name in self.pods:
            raise ApiError("AlreadyExists", name)
        self.pods[name] = copy.deepcopy(pod)
        self.on_pod_created(self.pods[name])

    def delete_pod(self, name: str, *, user: str, caller: str, options: dict | None = None) -> None:
        """A DELETE through admission; the pod is gone at once when admitted (grace periods left out).

        ``options``: the client's ``DeleteOptions`` fields; the request carries them as
        ``request.options`` (kind ``DeleteOptions``), as the API server hands them to CEL."""
        if name not in self.pods:
            raise ApiError("NotFound", name)
        stored = self.pods[name]
        healthy = is_pod_ready(stored) and not needs_recreation(stored)[0]
        serving = self.session_alive(name)
        options = dict(options or {})
        allowed, message = True, ""
        if self.admit_delete is not None:
            request = {"operation": "DELETE", "namespace": self.namespace, "name": name,
                       "userInfo": {"username": user}, "subResource": "",
                       "resource": {"group": "", "version": "v1", "resource": "pods"},
                       "options": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", **options}}
            decision = self.admit_delete(request, copy.deepcopy(stored))
            allowed, message = decision.allowed, decision.message
        self.deletes.append(DeleteRecord(name, user, caller, allowed, healthy, message, serving, options))
        if not allowed:
            raise ApiError("Forbidden", message)
        pod = self.pods.pop(name)
        self.on_pod_deleted(pod)

    def get_config_map(self, name: str) -> dict:
        if name not in self.config_maps:
            raise ApiError("NotFound", name)
        return copy.deepcopy(self.config_maps[name])

    def put_config_map(self, name: str, data: dict[str, str]) -> None:
        """SM l.876-881: Update, or Create when NotFound."""
        self.config_maps[name] = {"data": dict(data)}


# --- the FUSE pods at run time -----------------------------------------------------------------

@dataclass
class Session:
    """One run of curvine-fuse in a FUSE pod, and how it ended (None: still serving)."""

    id: int
    pod: str
    ended_by: str | None = None


class FuseRuntime:
    """The kubelet's side of the FUSE pods of one node: container starts, crashes, evictions.

    ``can_mount`` False stands for a curvine-fuse that cannot mount (e.g. no Primary at its first
    start): its container runs but the readiness probe (``grep ... /proc/mounts``, SM l.948-955)
    fails, so the pod is not Ready and serves no session.
    """

    def __init__(self) -> None:
        self.can_mount = True
        self.sessions: dict[int, Session] = {}
        self.current: dict[str, int | None] = {}  # pod name -> serving session
        self._ids = itertools.count(1)
        self.pods: dict[str, dict] = {}  # the API server's objects, updated in place

    # status helpers
    @staticmethod
    def _set_status(pod: dict, *, phase: str, ready: bool, state: dict, restarts: int, reason: str = "") -> None:
        pod["status"] = {"phase": phase,
                         "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                         "containerStatuses": [{"name": FUSE_CONTAINER, "ready": ready, "restartCount": restarts,
                                                "state": state}]}
        if reason:
            pod["status"]["reason"] = reason

    def _restarts(self, name: str) -> int:
        return self.pods[name]["status"]["containerStatuses"][0]["restartCount"]

    def _start_session(self, name: str) -> int | None:
        if not self.can_mount:
            self.current[name] = None
            return None
        sid = next(self._ids)
        self.sessions[sid] = Session(sid, name)
        self.current[name] = sid
        return sid

    def _end_session(self, name: str, cause: str) -> None:
        sid = self.current.get(name)
        if sid is not None:
            self.sessions[sid].ended_by = cause
        self.current[name] = None

    # events
    def created(self, pod: dict) -> None:
        """The kubelet starts the pod's container (the pod has ``nodeName`` set: no scheduler)."""
        name = pod["metadata"]["name"]
        self.pods[name] = pod
        sid = self._start_session(name)
        self._set_status(pod, phase="Running", ready=sid is not None, state={"running": {}}, restarts=0)

    def deleted(self, pod: dict, cause: str) -> None:
        """The pod is deleted: ``preStop`` ``fusermount -u`` (SM l.477-497), then the container stops."""
        name = pod["metadata"]["name"]
        self._end_session(name, cause)
        self.pods.pop(name, None)

    def mount_becomes_possible(self) -> None:
        """FUSE can mount now (the Primary is back): a running, not-Ready FUSE pod mounts, its
        probes pass and it turns Ready."""
        self.can_mount = True
        for name, pod in self.pods.items():
            if self.current.get(name) is None and "running" in pod["status"]["containerStatuses"][0]["state"]:
                sid = self._start_session(name)
                self._set_status(pod, phase="Running", ready=True, state={"running": {}},
                                 restarts=self._restarts(name))
                assert sid is not None

    def crash(self, name: str, exit_code: int = 1) -> None:
        """The container exits (a crash, or an OOM kill at its own limit: 137) and the kubelet
        restarts it in place (``RestartPolicy: Always``): a new FUSE session, ``restartCount`` + 1;
        bind mounts of the old session are dead."""
        self._end_session(name, "container-restart")
        restarts = self._restarts(name) + 1
        sid = self._start_session(name)
        self._set_status(self.pods[name], phase="Running", ready=sid is not None, state={"running": {}},
                         restarts=restarts)
        self.pods[name]["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": exit_code}}

    def probes_time_out(self, name: str) -> None:
        """The readiness probe (``grep`` of ``/proc/mounts``, 3 s timeout, SM l.511-523) times out
        three times on a node that throttles the FUSE pod: not Ready, while curvine-fuse keeps
        serving every bind (the session lives on)."""
        pod = self.pods[name]
        self._set_status(pod, phase="Running", ready=False, state={"running": {}}, restarts=self._restarts(name))

    def probes_pass(self, name: str) -> None:
        """The probe answers again: Ready."""
        pod = self.pods[name]
        self._set_status(pod, phase="Running", ready=self.current.get(name) is not None, state={"running": {}},
                         restarts=self._restarts(name))

    def crash_loop(self, name: str) -> None:
        """The container keeps failing: waiting in CrashLoopBackOff, not Ready, no session."""
        self._end_session(name, "container-restart")
        self._set_status(self.pods[name], phase="Running", ready=False, restarts=self._restarts(name) + 1,
                         state={"waiting": {"reason": "CrashLoopBackOff"}})

    def evict(self, name: str) -> None:
        """Node-pressure eviction by the kubelet: the pod is killed and marked Failed (it is not
        deleted; the driver's self-heal deletes it)."""
        self._end_session(name, "evicted")
        self._set_status(self.pods[name], phase="Failed", ready=False, restarts=self._restarts(name),
                         state={"terminated": {"exitCode": 137}}, reason="Evicted")

    def session_at(self, pod_name: str) -> int | None:
        return self.current.get(pod_name)


# --- the standalone manager (SM) ----------------------------------------------------------------

@dataclass
class StandaloneOptions:
    """SM l.87-96."""

    cluster_id: str
    mount_key: str
    master_addrs: str
    fs_path: str
    node_name: str
    namespace: str
    fuse_params: dict[str, str]


class StandaloneManager:
    """``standaloneMountManagerImpl`` (SM l.164-173), its state (SM l.116-126) persisted in the
    ConfigMap ``curvine-standalone-state-<node>``."""

    def __init__(self, api: ApiServer, *, node_name: str, plugin_env: dict[str, str], user: str) -> None:
        self.api = api
        self.node_name = node_name
        self.env = plugin_env
        self.user = user  # the node plugin's service account (in-cluster config)
        self.state: dict[str, dict] = {}  # mountKey -> {"pod-name", "ref-count", "volumes"}
        self.caller = ""  # which node-service path is running (for the delete records)

    # -- ConfigMap --
    def _save_state(self) -> None:
        """SM l.848-888."""
        self.api.put_config_map(STATE_CONFIGMAP_PREFIX + self.node_name,
                                {"state.json": json.dumps({"mounts": self.state}, sort_keys=True)})

    def get_host_mount_path(self, mount_key: str) -> str:
        return host_mount_path(mount_key)

    def get_standalone_name(self, mount_key: str) -> str:
        return standalone_name(mount_key, self.node_name)

    # -- EnsureStandalone --
    def ensure_standalone(self, opts: StandaloneOptions) -> str:
        """SM l.274-358. Raises ApiError/RuntimeError where the Go code returns an error."""
        pod_name = self.get_standalone_name(opts.mount_key)
        path = self.get_host_mount_path(opts.mount_key)
        try:
            existing = self.api.get_pod(pod_name)  # l.281
        except ApiError as err:
            if err.reason != "NotFound":  # l.310-312
                raise
            existing = None
        if existing is not None:
            recreate, reason = needs_recreation(existing)  # l.287
            if recreate:
                # l.288-294: delete (grace 0, foreground) and wait; an error is returned as is.
                self.delete_standalone_and_wait(pod_name, why=f"self-heal: {reason}")
            elif existing["status"].get("phase") == "Running" and is_pod_ready(existing):
                return path  # l.295-296
            else:
                try:
                    self.wait_for_standalone_ready(opts.mount_key)  # l.299
                except RuntimeError:
                    # l.300-305: not ready after waiting: delete and re-create.
                    self.delete_standalone_and_wait(pod_name, why="self-heal: not ready after waiting")
                else:
                    return path  # l.306-307
        # l.314-322 (ensureCleanMountPath, MkdirAll) left out; l.324-335: create, AlreadyExists is a race.
        try:
            self.api.create_pod(self.build_standalone(opts, pod_name, path))
        except ApiError as err:
            if err.reason != "AlreadyExists":
                raise
        self.wait_for_standalone_ready(opts.mount_key)  # l.338-340: an error is returned
        # l.342-350: the entry of this mount key is *reset*: no volumes.
        self.state[opts.mount_key] = {"pod-name": pod_name, "ref-count": 0, "volumes": []}
        self._save_state()  # l.352-354
        return path

    def wait_for_standalone_ready(self, mount_key: str) -> None:
        """SM l.683-706 (60 s in the source; here at once): NotFound keeps waiting, Failed is an
        error, Ready ends the wait; a pod that is not Ready now times out."""
        name = self.get_standalone_name(mount_key)
        pod = self.api.pods.get(name)
        if pod is not None and pod["status"].get("phase") == "Failed":
            raise RuntimeError(f"Standalone {name} failed")
        if pod is None or not is_pod_ready(pod):
            if self.api.on_wait_timeout is not None:
                self.api.on_wait_timeout(name)
            raise RuntimeError(f"Standalone {name} not ready: timed out")

    def delete_standalone_and_wait(self, pod_name: str, *, why: str) -> None:
        """SM l.395-420: DELETE with grace 0 and ``propagationPolicy: Foreground`` (l.399-404);
        NotFound is fine; any other error is returned."""
        try:
            self.api.delete_pod(pod_name, user=self.user, caller=f"{self.caller} ({why})",
                                options=SELF_HEAL_DELETE_OPTIONS)
        except ApiError as err:
            if err.reason != "NotFound":
                raise RuntimeError(f"failed to delete Standalone {pod_name}: {err}") from err

    def build_standalone(self, opts: StandaloneOptions, pod_name: str, path: str) -> dict:
        """SM l.423-566, the fields the admission policy, the QoS and the runtime read."""
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": self.api.namespace,
                         "labels": {STANDALONE_LABEL_APP[0]: STANDALONE_LABEL_APP[1],
                                    STANDALONE_LABEL_CLUSTER_ID: opts.cluster_id,
                                    STANDALONE_LABEL_NODE: self.node_name}},
            "spec": {"hostNetwork": True, "hostPID": True, "nodeName": self.node_name, "restartPolicy": "Always",
                     "serviceAccountName": self.env.get("STANDALONE_SERVICE_ACCOUNT", ""),
                     "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": FUSE_CONTAINER, "image": self.env.get("STANDALONE_IMAGE", ""),
                                     "resources": build_resource_requirements(self.env),
                                     "securityContext": {"privileged": True}}],
                     "volumes": [{"name": "fuse-mount", "hostPath": {"path": path, "type": "DirectoryOrCreate"}},
                                 {"name": "fuse-device", "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}}],
                     "tolerations": [{"operator": "Exists"}]},
            "status": {},
        }

    # -- DeleteStandalone --
    def delete_standalone(self, mount_key: str) -> None:
        """SM l.640-660: DELETE with default options; an error other than NotFound is returned
        *before* the state entry is removed."""
        name = self.get_standalone_name(mount_key)
        try:
            self.api.delete_pod(name, user=self.user, caller=self.caller, options={})  # l.644
        except ApiError as err:
            if err.reason != "NotFound":
                raise RuntimeError(f"failed to delete Standalone {name}: {err}") from err
        self.state.pop(mount_key, None)  # l.650-652
        self._save_state()

    # -- refs --
    def add_volume_ref(self, mount_key: str, volume_id: str) -> None:
        """SM l.719-749: creates the entry if missing; a volume already in the set is a no-op."""
        entry = self.state.setdefault(mount_key, {"pod-name": self.get_standalone_name(mount_key),
                                                  "ref-count": 0, "volumes": []})
        if volume_id in entry["volumes"]:
            return
        entry["volumes"].append(volume_id)
        entry["ref-count"] = len(entry["volumes"])
        self._save_state()

    def remove_volume_ref(self, mount_key: str, volume_id: str) -> bool:
        """SM l.752-779: no entry -> False; else remove the volume (absent or not) and return
        ``RefCount == 0``."""
        entry = self.state.get(mount_key)
        if entry is None:
            return False
        entry["volumes"] = [v for v in entry["volumes"] if v != volume_id]
        entry["ref-count"] = len(entry["volumes"])
        self._save_state()
        return entry["ref-count"] == 0

    def find_mount_key_by_volume_id(self, volume_id: str) -> str | None:
        """SM l.907-921."""
        for key, entry in self.state.items():
            if volume_id in entry["volumes"]:
                return key
        return None

    def recover_state(self) -> None:
        """SM l.783-845: load the ConfigMap's state; delete every FUSE pod that needs re-creation
        (an error is only logged)."""
        try:
            cm = self.api.get_config_map(STATE_CONFIGMAP_PREFIX + self.node_name)
        except ApiError:
            return
        if "state.json" not in cm["data"]:
            return
        self.state = json.loads(cm["data"]["state.json"])["mounts"]
        for key in list(self.state):
            name = self.get_standalone_name(key)
            pod = self.api.pods.get(name)
            if pod is None:
                continue  # l.817-823
            recreate, reason = needs_recreation(pod)
            if recreate:
                try:
                    self.delete_standalone_and_wait(name, why=f"recover: {reason}")
                except RuntimeError:
                    pass  # l.833-834: logged


# --- the node service (NS) -----------------------------------------------------------------------

class NodeServiceStandalone:
    """``nodeServiceStandalone`` (NS l.30-36). Construction is the node plugin's start (NS l.41-91):
    a new manager, ``RecoverState``, the PV watcher and the garbage collector."""

    def __init__(self, api: ApiServer, runtime: FuseRuntime, *, node_name: str, plugin_env: dict[str, str],
                 user: str, now: int) -> None:
        self.api = api
        self.runtime = runtime
        self.node_name = node_name
        self.manager = StandaloneManager(api, node_name=node_name, plugin_env=plugin_env, user=user)
        self.manager.caller = "RecoverState"
        self.manager.recover_state()  # NS l.68-72
        self.next_gc = now + GC_FIRST_RUN_S  # NS l.640-646
        self.binds: dict[str, tuple[str, int | None]] = {}  # target -> (FUSE pod, session): kernel state, kept by Node

    def _opts(self, ctx: dict[str, str]) -> StandaloneOptions:
        """NS l.119-169 / l.280-329: master-addrs (required), fs-path (default "/"), the mount key."""
        if not ctx.get("master-addrs"):
            raise CsiError("InvalidArgument", "master-addrs parameter is required")
        fs_path = ctx.get("fs-path") or "/"
        params = collect_passthrough_params(ctx)
        return StandaloneOptions(cluster_id=generate_cluster_id(ctx["master-addrs"]),
                                 mount_key=generate_mount_key(ctx["master-addrs"], fs_path, params),
                                 master_addrs=ctx["master-addrs"], fs_path=fs_path, node_name=self.node_name,
                                 namespace=self.api.namespace, fuse_params=params)

    def node_stage_volume(self, volume_id: str, ctx: dict[str, str]) -> None:
        """NS l.94-191: EnsureStandalone, then AddVolumeRef *even if it failed* (l.173-180), then
        return the EnsureStandalone error, if any, as Internal."""
        self.manager.caller = "NodeStageVolume"
        opts = self._opts(ctx)
        ensure_error: Exception | None = None
        try:
            self.manager.ensure_standalone(opts)  # l.171
        except (ApiError, RuntimeError) as err:
            ensure_error = err
        self.manager.add_volume_ref(opts.mount_key, volume_id)  # l.176
        if ensure_error is not None:
            raise CsiError("Internal", f"Failed to ensure Standalone: {ensure_error}")  # l.183-187

    def node_unstage_volume(self, volume_id: str) -> None:
        """NS l.194-247: find the mount key by volume (not found: success), RemoveVolumeRef,
        DeleteStandalone when it says so; every error is logged and the call succeeds."""
        self.manager.caller = "NodeUnstageVolume"
        key = self.manager.find_mount_key_by_volume_id(volume_id)  # l.206-229 (both branches)
        if key is None:
            return
        should_delete = self.manager.remove_volume_ref(key, volume_id)  # l.232
        if should_delete:
            try:
                self.manager.delete_standalone(key)  # l.238-243
            except RuntimeError:
                pass  # logged (l.241)

    def node_publish_volume(self, volume_id: str, ctx: dict[str, str], target: str) -> None:
        """NS l.250-400: EnsureStandalone (may re-create the FUSE pod and reset its entry), then
        bind-mount the host sub-path onto the target; *no* volume ref (l.395-396)."""
        self.manager.caller = "NodePublishVolume"
        opts = self._opts(ctx)
        if not ctx.get("curvine-path"):
            raise CsiError("InvalidArgument", "curvine-path parameter is required")  # l.288-294
        try:
            self.manager.ensure_standalone(opts)  # l.331
        except (ApiError, RuntimeError) as err:
            raise CsiError("Internal", f"Failed to ensure Standalone: {err}") from err  # l.332-335
        if target in self.binds:
            return  # l.379-384: already mounted
        pod = self.manager.get_standalone_name(opts.mount_key)
        self.binds[target] = (pod, self.runtime.session_at(pod))  # l.386-393: mount --bind

    def node_unpublish_volume(self, volume_id: str, target: str) -> None:
        """NS l.403-506: unmount the target, then (whatever the volume handle's form, l.444-487)
        find the mount key by volume, RemoveVolumeRef and DeleteStandalone when it says so;
        errors are logged and the call succeeds."""
        self.manager.caller = "NodeUnpublishVolume"
        self.binds.pop(target, None)  # l.417-442
        key = self.manager.find_mount_key_by_volume_id(volume_id)
        if key is None:
            return  # l.461-462 etc.
        should_delete = self.manager.remove_volume_ref(key, volume_id)  # l.490
        if should_delete:
            try:
                self.manager.delete_standalone(key)  # l.496-500
            except RuntimeError:
                pass  # logged (l.499)

    def handle_pv_deletion(self, volume_handle: str) -> None:
        """NS l.590-633 (the informer's DeleteFunc for PVs of driver ``curvine``, l.553-575)."""
        self.manager.caller = "PV watcher"
        key = self.manager.find_mount_key_by_volume_id(volume_handle)
        if key is None:
            return
        if self.manager.remove_volume_ref(key, volume_handle):
            try:
                self.manager.delete_standalone(key)
            except RuntimeError:
                pass  # logged (l.626)

    def cleanup_orphaned_standalone_pods(self) -> None:
        """NS l.664-743: for every state entry whose pod exists on this node: no volumes -> delete;
        none of its volumes has a PV any more -> delete. Errors are logged."""
        self.manager.caller = "GC"
        pods = {p["metadata"]["name"] for p in self.api.list_pods(STANDALONE_LABEL_APP, self.node_name)}
        existing = set(self.api.pvs)  # l.683-695: PVs of driver "curvine"
        for key, entry in copy.deepcopy(self.manager.state).items():  # GetState is a copy (l.924-946)
            if entry["pod-name"] not in pods:
                continue  # l.711-714
            if not entry["volumes"] or not any(v in existing for v in entry["volumes"]):
                try:
                    self.manager.delete_standalone(key)  # l.717-722, l.734-739
                except RuntimeError:
                    pass


# --- the kubelet's volume manager ------------------------------------------------------------------

@dataclass
class PodVolume:
    """One pod of the node and the volume it mounts: ``phase`` pending (waiting for stage/publish),
    running (published: its containers use the mount), stopping (containers stopped, not yet
    unpublished)."""

    uid: str
    volume_id: str
    context: dict[str, str]
    phase: str = "pending"

    @property
    def target(self) -> str:
        return f"/var/lib/kubelet/pods/{self.uid}/volumes/kubernetes.io~csi/{self.volume_id}/mount"


class Kubelet:
    """The CSI calls of the kubelet's volume manager on one node (module docstring)."""

    def __init__(self, node: "Node") -> None:
        self.node = node
        self.pods: dict[str, PodVolume] = {}
        self.staged: set[str] = set()
        self.errors: list[tuple[str, str, str]] = []  # (call, uid or volume, message)

    def reconcile(self) -> None:
        plugin = self.node.plugin
        for pod in list(self.pods.values()):
            if pod.phase != "stopping":
                continue
            if plugin is None:
                continue  # the call fails while the plugin is down; retried
            plugin.node_unpublish_volume(pod.volume_id, pod.target)
            del self.pods[pod.uid]
        for pod in list(self.pods.values()):
            if pod.phase != "pending" or plugin is None:
                continue
            try:
                if pod.volume_id not in self.staged:
                    plugin.node_stage_volume(pod.volume_id, pod.context)
                    self.staged.add(pod.volume_id)
                plugin.node_publish_volume(pod.volume_id, pod.context, pod.target)
                pod.phase = "running"
            except CsiError as err:
                self.errors.append(("stage/publish", pod.uid, str(err)))
        used = {p.volume_id for p in self.pods.values()}
        for volume in sorted(self.staged - used):
            if plugin is None:
                break
            plugin.node_unstage_volume(volume)
            self.staged.discard(volume)


# --- one node ------------------------------------------------------------------------------------

@dataclass
class Violation:
    """A live pod without its mount after ``step``; ``cause`` is how its FUSE session ended."""

    step: str
    uid: str
    cause: str


class Node:
    """One HyperPod node: API objects, FUSE runtime, node plugin, kubelet, clock.

    Args:
        storage_class: the rendered StorageClass (its ``parameters`` become each volume's context).
        plugin_env: the rendered node plugin's environment (``STANDALONE_*``, ``KUBERNETES_NAMESPACE``).
        namespace: the Curvine namespace; ``user``: the node plugin's API user.
        admit_delete: the admission of pod DELETEs (None: no policy).
    """

    def __init__(self, *, name: str, storage_class: dict, plugin_env: dict[str, str], namespace: str, user: str,
                 admit_delete: AdmitDelete | None) -> None:
        self.name = name
        self.now = 0
        self.storage_class = storage_class
        self.plugin_env = plugin_env
        self.user = user
        self.api = ApiServer(namespace=namespace, admit_delete=admit_delete)
        self.runtime = FuseRuntime()
        self.api.on_pod_created = self.runtime.created
        self.api.on_pod_deleted = lambda pod: self.runtime.deleted(pod, self._delete_cause(pod))
        self.api.session_alive = lambda name: self.runtime.session_at(name) is not None
        self.binds: dict[str, tuple[str, int | None]] = {}
        self.plugin: NodeServiceStandalone | None = None
        self.kubelet = Kubelet(self)
        self.violations: list[Violation] = []
        self.step_name = "start"
        self.start_plugin()

    def _delete_cause(self, pod: dict) -> str:
        record = self.api.deletes[-1]
        if record.healthy:
            return "deleted-healthy"
        return "deleted-serving" if record.serving else "deleted-self-heal"

    # --- volumes of the lines ---
    def add_pv(self, pv_name: str) -> str:
        params = self.storage_class["parameters"]
        handle = generate_volume_handle(params["master-addrs"], params["fs-path"], pv_name)
        self.api.pvs[handle] = pv_name
        return handle

    def context(self, pv_name: str) -> dict[str, str]:
        return volume_context(self.storage_class["parameters"], pv_name)

    # --- events ---
    def start_plugin(self) -> None:
        self.plugin = NodeServiceStandalone(self.api, self.runtime, node_name=self.name, plugin_env=self.plugin_env,
                                            user=self.user, now=self.now)
        self.plugin.binds = self.binds  # bind mounts are kernel state: they outlive the plugin process

    def stop_plugin(self) -> None:
        """The node plugin's pod goes away (rollout, crash): its in-memory state and its timers too."""
        self.plugin = None

    def step(self, name: str, action: Callable[[], None] = lambda: None) -> None:
        """Run ``action``, let the kubelet reconcile, then check every live pod's mount."""
        self.step_name = name
        action()
        self.kubelet.reconcile()
        self.check()

    def start_pod(self, uid: str, pv_name: str) -> None:
        handle = self.add_pv(pv_name) if pv_name not in self.api.pvs.values() else next(
            h for h, n in self.api.pvs.items() if n == pv_name)
        self.kubelet.pods[uid] = PodVolume(uid, handle, self.context(pv_name))

    def stop_pod(self, uid: str) -> None:
        pod = self.kubelet.pods[uid]
        if pod.phase == "pending":
            del self.kubelet.pods[uid]  # never published: nothing to unpublish
        else:
            pod.phase = "stopping"

    def delete_pv(self, pv_name: str) -> None:
        """The PV is deleted; the PV watcher sees it only while the plugin runs (a missed event is
        for the GC, NS l.636)."""
        handle = next(h for h, n in self.api.pvs.items() if n == pv_name)
        del self.api.pvs[handle]
        if self.plugin is not None:
            self.plugin.handle_pv_deletion(handle)

    def advance(self, seconds: int) -> None:
        """Move the clock; run the garbage collector's ticks that fall due (while the plugin runs)."""
        end = self.now + seconds
        while self.plugin is not None and self.plugin.next_gc <= end:
            self.now = self.plugin.next_gc
            self.plugin.cleanup_orphaned_standalone_pods()
            self.plugin.next_gc += GC_PERIOD_S
            self.kubelet.reconcile()
            self.check(f"{self.step_name} + GC at {self.now} s")
        self.now = end

    # --- what the tests read ---
    @property
    def fuse_pods(self) -> list[str]:
        return sorted(self.api.pods)

    def mount_alive(self, uid: str) -> bool:
        pod = self.kubelet.pods[uid]
        bind = self.binds.get(pod.target)
        return bind is not None and bind[1] is not None and self.runtime.session_at(bind[0]) == bind[1]

    def dead_mount_cause(self, uid: str) -> str:
        bind = self.binds.get(self.kubelet.pods[uid].target)
        if bind is None or bind[1] is None:
            return "never bound to a session"
        return self.runtime.sessions[bind[1]].ended_by or "?"

    def live_pods(self) -> Iterable[str]:
        return [p.uid for p in self.kubelet.pods.values() if p.phase == "running"]

    def check(self, label: str | None = None) -> None:
        for uid in self.live_pods():
            if not self.mount_alive(uid):
                self.violations.append(Violation(label or self.step_name, uid, self.dead_mount_cause(uid)))
