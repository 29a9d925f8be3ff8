"""Issue 24 item 3: the L2 mount watchdog replaces a wedged (hung) FUSE session, bounded.

How long: a session whose ``statvfs`` has not answered in any pass for ``replace_hung_after_s``
(a hang that long is curvine-fuse itself stuck: every Curvine operation of the FUSE pods ends
within 3 s, with EIO when the Primary is away). How many nodes at once: ``max_nodes_replacing``
cluster-wide slots (Leases), each held until its node's mounts are all alive again. Then the binds,
dead with the old session, are healed like any dead bind: evicted one per interval through each
line's PodDisruptionBudget, never the last Ready replica (tests/agents/test_l2_mount_watchdog.py).

The pass runs on the host's mount table as the DaemonSet does (``host_mountinfo``); the API is an
in-memory fake for the pass, and a fake HTTP server for the Lease protocol of :class:`HttpApi`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from cluster_agents import l2_mount_watchdog as wd
from cluster_agents.l2_mount_watchdog import ALIVE, DEAD, HUNG, HttpApi, Prober, Watchdog, WatchdogConfig
from tests.fake_http import JsonServer

NODE, OTHER = "hyperpod-i-0abc", "hyperpod-i-0def"
NS = "curvine"
KEY = "5f0c2a9e1d3b4c6a8e7f90123456789a"
KUBELET = "/var/lib/kubelet"
PLUGIN = "/var/lib/kubelet/plugins/curvine"
POINT = f"{PLUGIN}/{KEY}/fuse-mount"
PV = "pvc-0d6c9f3e-rag"
UID_A, UID_B = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


def table(session: str, binds: dict[str, str]) -> str:
    """The host's mountinfo: ``session`` at the plugin path, each pod's bind with its device."""
    lines = [f"100 29 {session} / {POINT} rw shared:5 - fuse curvinefs rw,user_id=0,allow_other"]
    for i, (uid, dev) in enumerate(binds.items()):
        lines.append(f"{200 + i} 29 {dev} /kvcache/{PV} {KUBELET}/pods/{uid}/volumes/kubernetes.io~csi/{PV}/mount "
                     "rw - fuse curvinefs rw,user_id=0")
    return "\n".join(lines) + "\n"


def fuse_pod(name: str, node: str, point: str = POINT) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "namespace": NS, "labels": {"app": "curvine-standalone"}},
            "spec": {"nodeName": node, "volumes": [{"name": "fuse-mount", "hostPath": {"path": point}},
                                                    {"name": "fuse-device", "hostPath": {"path": "/dev/fuse"}}]}}


def line_pod(uid: str, name: str, *, ready: bool = True, replicaset: str = "rag-5d9") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": name, "namespace": "rag-assistant",
                         "ownerReferences": [{"kind": "ReplicaSet", "name": replicaset, "controller": True}]},
            "spec": {"nodeName": NODE},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class MemoryApi:
    """The API calls of a pass, in memory: line pods, FUSE pods, replacement slots (holder per slot)."""

    def __init__(self, pods: list[dict[str, Any]], fuse_pods: list[dict[str, Any]],
                 slots: dict[str, str] | None = None) -> None:
        self.pods, self.fuse_pods = pods, fuse_pods
        self.slots = dict(slots or {})
        self.deleted: list[tuple[str, str, str]] = []
        self.evicted: list[str] = []

    def pv_namespace(self, pv: str) -> str | None:
        return "rag-assistant"

    def pods_on_node(self, namespace: str, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    def pods_in(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.pods)

    def evict(self, namespace: str, name: str, uid: str) -> str:
        self.evicted.append(name)
        return "evicted"

    def fuse_pods_on_node(self, namespace: str, node: str) -> list[dict[str, Any]]:
        assert namespace == NS
        return [p for p in self.fuse_pods if p["spec"]["nodeName"] == node]

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append((namespace, name, uid))

    def acquire_slot(self, namespace: str, holder: str, slots: int, duration_s: int, now: float) -> str | None:
        for i in range(slots):
            name = f"{wd.REPLACEMENT_LEASE_PREFIX}-{i}"
            if self.slots.get(name) in (None, "", holder):
                self.slots[name] = holder
                return name
        return None

    def release_slot(self, namespace: str, name: str, holder: str) -> None:
        if self.slots.get(name) == holder:
            self.slots[name] = ""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Host:
    """The node as a pass sees it: its mount table, and what statvfs of the session answers."""

    def __init__(self, tmp_path: Path, session: str, binds: dict[str, str], answer: Any = None) -> None:
        self.mountinfo = tmp_path / "mountinfo"
        self.set(session, binds)
        self.answer = answer  # None: answers; "hang"; an OSError
        self.release = threading.Event()

    def set(self, session: str, binds: dict[str, str]) -> None:
        self.mountinfo.write_text(table(session, binds))

    def statvfs(self, path: str) -> None:
        assert path == POINT, path  # only ever the session, never a pod's target
        if self.answer == "hang":
            self.release.wait(5)
        elif isinstance(self.answer, OSError):
            raise self.answer

    def now_answers(self, answer: Any, w: Watchdog) -> None:
        """The session answers ``answer`` from now on; a stuck request returns first (a daemon
        that comes back answers its queue), so the next pass probes afresh."""
        if self.answer == "hang" and answer != "hang":
            self.release.set()
            deadline = time.monotonic() + 5
            while w.prober.stuck and time.monotonic() < deadline:
                time.sleep(0.01)
            self.release = threading.Event()
        self.answer = answer


def make(host: Host, api: MemoryApi | None, *, heal: bool = True, after_s: float = 300, slots: int = 1):
    config = WatchdogConfig(heal=heal, period_s=30, probe_timeout_s=0.1, eviction_interval_s=60,
                            kubelet_dir=KUBELET, plugin_dir=PLUGIN, host_mountinfo=str(host.mountinfo),
                            replace_hung_after_s=after_s, max_nodes_replacing=slots, namespace=NS)
    clock = Clock()
    w = Watchdog(NODE, config, api=api, prober=Prober(timeout_s=0.1, max_stuck=8, statvfs=host.statvfs),
                 unmount=lambda path: None, clock=clock, log=lambda line: None)
    return w, clock


@pytest.fixture
def host(tmp_path: Path):
    h = Host(tmp_path, "0:41", {UID_A: "0:41", UID_B: "0:41"}, answer="hang")
    yield h
    h.release.set()


def test_a_session_hung_for_the_bound_is_replaced_once_and_only_its_own_fuse_pod(host) -> None:
    api = MemoryApi([line_pod(UID_A, "rag-a"), line_pod(UID_B, "rag-b")],
                    [fuse_pod("curvine-csi-standalone-aa-1", NODE), fuse_pod("curvine-csi-standalone-aa-2", OTHER),
                     fuse_pod("curvine-csi-standalone-bb-1", NODE, f"{PLUGIN}/otherkey/fuse-mount")])
    w, clock = make(host, api)
    for _ in range(10):  # 9 passes 30 s apart: hung for 0 .. 270 s
        report = w.run_pass()
        assert {m.state for m in report.mounts} == {HUNG} and api.deleted == []
        clock.t += 30
    assert report.mounts[0].action == "hung for 270 s; its FUSE session is replaced after 300 s"
    report = w.run_pass()  # 300 s
    assert api.deleted == [(NS, "curvine-csi-standalone-aa-1", "uid-curvine-csi-standalone-aa-1")]
    assert all(m.action.startswith("its FUSE session, hung for 300 s, replaced: FUSE pod curvine-csi-standalone-aa-1")
               for m in report.mounts)
    assert w.replacements == {"replaced": 1, "failed": 0} and api.slots == {"l2-fuse-replacement-0": NODE}
    assert 'kvcache_l2_mount_fuse_replacements_total{node="hyperpod-i-0abc",result="replaced"} 1' in w.metrics()
    clock.t += 30
    w.run_pass()  # still hung (the pod is terminating): the timer starts again, no second delete
    assert len(api.deleted) == 1


def test_after_the_replacement_the_dead_binds_heal_through_the_budget_and_the_slot_is_released(host) -> None:
    api = MemoryApi([line_pod(UID_A, "rag-a"), line_pod(UID_B, "rag-b")], [fuse_pod("curvine-csi-standalone-aa-1", NODE)])
    w, clock = make(host, api, after_s=60)
    for _ in range(3):
        w.run_pass()
        clock.t += 30
    assert len(api.deleted) == 1 and api.slots["l2-fuse-replacement-0"] == NODE
    # The FUSE pod's container is killed: its stuck requests end, the probe thread with them; the
    # new FUSE pod's session 0:42 answers, and both binds hold the old 0:41: dead, evicted one per
    # interval.
    host.now_answers(None, w)
    host.set("0:42", {UID_A: "0:41", UID_B: "0:41"})
    report = w.run_pass()
    assert {m.state for m in report.mounts} == {DEAD} and api.evicted == ["rag-a"]
    assert api.slots["l2-fuse-replacement-0"] == NODE  # held while the node heals
    clock.t += 60
    w.run_pass()
    assert api.evicted == ["rag-a", "rag-b"]
    host.set("0:42", {UID_A: "0:42", UID_B: "0:42"})  # the replacements mounted the new session
    clock.t += 30
    assert {m.state for m in w.run_pass().mounts} == {ALIVE}
    assert api.slots["l2-fuse-replacement-0"] == ""  # released: another node may replace now


def test_no_slot_free_means_the_node_waits(host) -> None:
    api = MemoryApi([line_pod(UID_A, "rag-a")], [fuse_pod("curvine-csi-standalone-aa-1", NODE)],
                    slots={"l2-fuse-replacement-0": OTHER})
    w, clock = make(host, api, after_s=60)
    for _ in range(4):
        report = w.run_pass()
        clock.t += 30
    assert api.deleted == []
    assert "replacement waits: 1 node(s) already replace their FUSE session" in report.mounts[0].action
    api.slots["l2-fuse-replacement-0"] = ""  # the other node healed
    w.run_pass()
    assert len(api.deleted) == 1
    # With two slots, the second node would not have waited.
    api2 = MemoryApi([line_pod(UID_A, "rag-a")], [fuse_pod("curvine-csi-standalone-aa-1", NODE)],
                     slots={"l2-fuse-replacement-0": OTHER})
    w2, clock2 = make(host, api2, after_s=60, slots=2)
    for _ in range(3):
        w2.run_pass()
        clock2.t += 30
    assert len(api2.deleted) == 1 and api2.slots["l2-fuse-replacement-1"] == NODE


def test_an_answer_restarts_the_clock_and_error_or_dead_sessions_are_never_replaced(host) -> None:
    api = MemoryApi([line_pod(UID_A, "rag-a")], [fuse_pod("curvine-csi-standalone-aa-1", NODE)])
    w, clock = make(host, api, after_s=120)
    for answer in ("hang", "hang", "hang", None, "hang", "hang", "hang"):  # never 4 hung passes in a row
        host.now_answers(answer, w)
        w.run_pass()
        clock.t += 30
    assert api.deleted == []
    host.now_answers(OSError(5, "EIO"), w)  # the Primary away: error, a Primary restart cures it, not a new session
    for _ in range(10):
        assert {m.state for m in w.run_pass().mounts} == {wd.ERROR}
        clock.t += 30
    assert api.deleted == []


@pytest.mark.parametrize(("heal", "after_s", "api"), [(False, 60, True), (True, 0, True), (True, 60, False)])
def test_report_only_off_or_without_the_api_nothing_is_replaced(host, heal, after_s, api) -> None:
    memory = MemoryApi([line_pod(UID_A, "rag-a")], [fuse_pod("curvine-csi-standalone-aa-1", NODE)])
    w, clock = make(host, memory if api else None, heal=heal, after_s=after_s)
    for _ in range(6):
        report = w.run_pass()
        clock.t += 30
    assert memory.deleted == [] and report.mounts[0].action == "not healed: replacing a hung FUSE session is off"


def test_config_bounds() -> None:
    with pytest.raises(ValueError, match="replace_hung_after_s"):
        wd.config_from_dict({"replace_hung_after_s": 10, "namespace": NS})  # below the period
    with pytest.raises(ValueError, match="replace_hung_after_s"):
        wd.config_from_dict({"replace_hung_after_s": 300})  # no namespace
    with pytest.raises(ValueError, match="max_nodes_replacing"):
        wd.config_from_dict({"max_nodes_replacing": 0})


# --- the Lease protocol against a fake API server -------------------------------------------------


class LeaseServer:
    """Leases of one namespace with resourceVersions (409 on a stale PUT or a second POST), and the
    pod calls :class:`HttpApi` makes for a replacement (recorded)."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[tuple[str, str, Any]] = []
        self.http = JsonServer(self.answer)
        self.client = HttpApi(self.http.url, token="t")

    def answer(self, method: str, path: str, body: Any, headers: Any) -> tuple[int, Any]:
        self.calls.append((method, path, body))
        parts = urllib.parse.urlparse(path).path.strip("/").split("/")
        name = parts[6] if len(parts) > 6 and parts[5] == "leases" else None
        if method == "GET":
            if name is not None:
                return (200, self.leases[name]) if name in self.leases else (404, {})
            return 200, {"items": [fuse_pod("curvine-csi-standalone-aa-1", NODE)]}
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.leases:
                return 409, {"reason": "AlreadyExists"}
            return 201, self._store(name, body)
        if method == "PUT":
            if self.leases[name]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
                return 409, {"reason": "Conflict"}
            return 200, self._store(name, body)
        return 200, {}  # DELETE

    def _store(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.leases[name] = body
        return body


@pytest.fixture
def leases():
    server = LeaseServer()
    yield server
    server.http.close()


def test_slots_are_created_renewed_refused_taken_when_expired_and_released(leases) -> None:
    api, now = leases.client, 1_800_000_000.0
    assert api.acquire_slot(NS, NODE, 1, 90, now) == "l2-fuse-replacement-0"
    lease = leases.leases["l2-fuse-replacement-0"]
    assert lease["spec"]["holderIdentity"] == NODE and lease["spec"]["leaseDurationSeconds"] == 90
    assert lease["spec"]["renewTime"] == "2027-01-15T08:00:00.000000Z"
    assert api.acquire_slot(NS, OTHER, 1, 90, now + 30) is None  # held and fresh
    assert api.acquire_slot(NS, OTHER, 2, 90, now + 30) == "l2-fuse-replacement-1"
    assert api.acquire_slot(NS, NODE, 1, 90, now + 60) == "l2-fuse-replacement-0"  # renewed by its holder
    assert leases.leases["l2-fuse-replacement-0"]["spec"]["renewTime"] == "2027-01-15T08:01:00.000000Z"
    assert api.acquire_slot(NS, OTHER, 1, 90, now + 151) == "l2-fuse-replacement-0"  # lapsed: taken over
    api.release_slot(NS, "l2-fuse-replacement-0", NODE)  # no longer NODE's: untouched
    assert leases.leases["l2-fuse-replacement-0"]["spec"]["holderIdentity"] == OTHER
    api.release_slot(NS, "l2-fuse-replacement-0", OTHER)
    assert leases.leases["l2-fuse-replacement-0"]["spec"]["holderIdentity"] == ""
    assert api.acquire_slot(NS, NODE, 1, 90, now + 152) == "l2-fuse-replacement-0"  # free again


def test_a_lost_race_for_a_slot_moves_on(leases, monkeypatch) -> None:
    """Two nodes read the same expired Lease; the second PUT carries a stale resourceVersion (409)."""
    api, now = leases.client, 1_800_000_000.0
    assert api.acquire_slot(NS, OTHER, 1, 90, now) == "l2-fuse-replacement-0"
    stale = json.loads(json.dumps(leases.leases["l2-fuse-replacement-0"]))
    leases.version += 1
    leases.leases["l2-fuse-replacement-0"]["metadata"]["resourceVersion"] = str(leases.version)  # someone renewed
    real_call = api.call

    def call(method: str, path: str, body: Any = None) -> Any:
        if method == "GET" and path.endswith("/l2-fuse-replacement-0"):
            return json.loads(json.dumps(stale))  # what this node read before the other's renewal
        return real_call(method, path, body)

    monkeypatch.setattr(api, "call", call)
    assert api.acquire_slot(NS, NODE, 1, 90, now + 200) is None  # expired as read, but the PUT lost: 409
    assert leases.leases["l2-fuse-replacement-0"]["spec"]["holderIdentity"] == OTHER


def test_the_fuse_pod_is_listed_by_label_and_node_and_deleted_with_its_uid(leases) -> None:
    api = leases.client
    [pod] = api.fuse_pods_on_node(NS, NODE)
    method, path, _ = leases.calls[-1]
    query = urllib.parse.parse_qs(urllib.parse.urlparse(path).query)
    assert method == "GET" and query == {"labelSelector": ["app=curvine-standalone"], "fieldSelector": [f"spec.nodeName={NODE}"]}
    api.delete_pod(NS, pod["metadata"]["name"], pod["metadata"]["uid"])
    assert leases.calls[-1] == ("DELETE", f"/api/v1/namespaces/{NS}/pods/curvine-csi-standalone-aa-1",
                                {"apiVersion": "v1", "kind": "DeleteOptions",
                                 "preconditions": {"uid": "uid-curvine-csi-standalone-aa-1"}})
