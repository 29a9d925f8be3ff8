"""The L2 mount watchdog (cluster_agents/l2_mount_watchdog.py): classification on injected mountinfo and a
fake kubelet layout, and healing against a fake API server (standard library ``http.server``).

The layouts are the real ones (docs/sources.md §17): the kubelet keeps a pod's CSI volume in
``pods/<uid>/volumes/kubernetes.io~csi/<pv>/`` with ``vol_data.json`` beside the target ``mount``;
Curvine's FUSE pods mount at ``plugins/curvine/<mount key>/fuse-mount``; each FUSE session has its
own anonymous device (``0:<minor>``), and a bind of it keeps that device.
"""

from __future__ import annotations

import errno
import json
import threading
import time
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster_agents import l2_mount_watchdog as wd
from cluster_agents.l2_mount_watchdog import (
    ALIVE, DEAD, ERROR, HUNG, HttpApi, Prober, WatchdogConfig, Watchdog, classify, find_volumes, live_fuse_devices,
    parse_mountinfo, top_mounts,
)
from tests.fake_http import JsonServer

NODE = "hyperpod-i-0abc"
KEY = "5f0c2a9e1d3b4c6a8e7f90123456789a"
UID_A, UID_B, UID_C = ("11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222",
                       "33333333-3333-3333-3333-333333333333")
PV = "pvc-0d6c9f3e-rag"


def layout(tmp_path: Path, pods: dict[str, str], driver: str = "curvine") -> tuple[str, str, dict[str, str]]:
    """A kubelet dir with a Curvine CSI volume per pod UID (uid -> PV name); returns (kubelet dir,
    plugin dir, uid -> target path)."""
    kubelet = tmp_path / "kubelet"
    targets = {}
    for uid, pv in pods.items():
        vol = kubelet / "pods" / uid / "volumes" / "kubernetes.io~csi" / pv
        (vol / "mount").mkdir(parents=True)
        (vol / "vol_data.json").write_text(json.dumps({
            "specVolID": pv, "volumeHandle": f"curvine@/kvcache@{pv}", "driverName": driver,
            "nodeName": NODE, "volumeLifecycleMode": "Persistent"}))
        targets[uid] = str(vol / "mount")
    return str(kubelet), str(kubelet / "plugins" / "curvine"), targets


def mountinfo(plugin: str, targets: dict[str, str], devices: dict[str, str], plugin_devices: list[str],
              source: str = "curvine") -> str:
    """mountinfo text: the plugin mount(s) stacked in order (the last on top), then each target's
    bind with its device (a device None: the target is not mounted); ``source`` of every FUSE mount
    (curvine-fuse's is ``curvinefs``)."""
    lines, mount_id, parent = [], 100, 29
    for dev in plugin_devices:
        lines.append(f"{mount_id} {parent} {dev} / {plugin}/{KEY}/fuse-mount rw,nosuid,nodev,relatime shared:5 - "
                     f"fuse {source} rw,user_id=0,group_id=0,allow_other")
        parent, mount_id = mount_id, mount_id + 1
    for uid, target in targets.items():
        if devices.get(uid):
            lines.append(f"{mount_id} 29 {devices[uid]} /{uid[:4]} {target} rw,relatime - fuse {source} rw,user_id=0")
            mount_id += 1
    lines.append("29 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw")
    return "\n".join(lines) + "\n"


def prober(results: dict[str, Any], timeout_s: float = 0.2) -> Prober:
    """A prober whose statvfs returns, raises the OSError given, or blocks (``"hang"``) per path."""
    release = threading.Event()

    def statvfs(path: str) -> None:
        r = results.get(path)
        if r == "hang":
            release.wait(5)
        elif isinstance(r, OSError):
            raise r

    p = Prober(timeout_s=timeout_s, max_stuck=4, statvfs=statvfs)
    p.release = release  # type: ignore[attr-defined]
    return p


# --- mountinfo and layout ----------------------------------------------------------------------


def test_parse_mountinfo_reads_device_root_point_and_type_with_optional_fields_and_escapes() -> None:
    text = ("36 35 98:0 /mnt1 /mnt/parent\\040dir rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue\n"
            "garbage line\n"
            "412 29 0:63 /kvcache/pvc-1 /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pvc-1/mount rw - fuse c rw\n")
    entries = parse_mountinfo(text)
    assert [(e.mount_id, e.parent_id, e.device, e.root, e.mount_point, e.fstype) for e in entries] == [
        (36, 35, "98:0", "/mnt1", "/mnt/parent dir", "ext3"),
        (412, 29, "0:63", "/kvcache/pvc-1", "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pvc-1/mount", "fuse")]
    assert entries[1].is_fuse and not entries[0].is_fuse


def test_the_live_session_is_the_top_of_a_stack_at_the_plugin_path(tmp_path: Path) -> None:
    """A restarted FUSE container mounts its new session over the dead one at the same point."""
    _, plugin, _ = layout(tmp_path, {})
    tops = top_mounts(parse_mountinfo(mountinfo(plugin, {}, {}, ["0:40", "0:41"])))
    assert live_fuse_devices(tops, plugin) == {"0:41": f"{plugin}/{KEY}/fuse-mount"}


def test_find_volumes_keeps_only_curvine_volumes_and_never_needs_the_mount(tmp_path: Path) -> None:
    kubelet, _, targets = layout(tmp_path, {UID_A: PV, UID_B: "pvc-ebs"})
    vol_b = Path(targets[UID_B]).parent
    (vol_b / "vol_data.json").write_text(json.dumps({"specVolID": "pvc-ebs", "driverName": "ebs.csi.aws.com"}))
    (Path(targets[UID_A]).parent.parent / "half-made").mkdir()  # no vol_data.json yet
    assert find_volumes(kubelet) == [wd.PodVolume(UID_A, PV, targets[UID_A])]


# --- classification ------------------------------------------------------------------------------


def test_a_bind_of_an_older_session_is_dead_by_device_without_a_probe(tmp_path: Path) -> None:
    """FUSE pod restarted: its new session 0:41 is at the plugin path, pod A's bind still holds
    0:40 (dead, from mountinfo alone), pod B's bind of 0:41 is probed and alive."""
    kubelet, plugin, targets = layout(tmp_path, {UID_A: PV, UID_B: PV})
    probed = []
    p = Prober(timeout_s=1, statvfs=probed.append)
    states = classify(find_volumes(kubelet), parse_mountinfo(
        mountinfo(plugin, targets, {UID_A: "0:40", UID_B: "0:41"}, ["0:41"])), p, plugin)
    by_uid = {s.volume.pod_uid: s for s in states}
    assert (by_uid[UID_A].state, by_uid[UID_B].state) == (DEAD, ALIVE)
    assert "stale FUSE session 0:40" in by_uid[UID_A].reason
    assert probed == [targets[UID_B]]  # the dead one was never touched


def test_probe_answers_map_to_states_and_an_unmounted_target_is_left_out(tmp_path: Path) -> None:
    uids = {UID_A: PV, UID_B: PV, UID_C: PV, "44444444-4444-4444-4444-444444444444": PV,
            "55555555-5555-5555-5555-555555555555": PV}
    kubelet, plugin, targets = layout(tmp_path, uids)
    u = list(uids)
    devices = {uid: "0:41" for uid in u[:4]}  # the fifth is not mounted (being set up)
    p = prober({targets[u[0]]: None, targets[u[1]]: OSError(errno.ENOTCONN, "x"),
                targets[u[2]]: OSError(errno.EIO, "x"), targets[u[3]]: "hang"})
    started = time.monotonic()
    states = {s.volume.pod_uid: s.state for s in classify(
        find_volumes(kubelet), parse_mountinfo(mountinfo(plugin, targets, devices, ["0:41"])), p, plugin)}
    elapsed = time.monotonic() - started
    p.release.set()
    assert states == {u[0]: ALIVE, u[1]: DEAD, u[2]: ERROR, u[3]: HUNG}
    assert elapsed < 1.0  # the hung probe cost the 0.2 s timeout, not the pass


def test_without_any_session_at_the_plugin_path_the_probe_decides(tmp_path: Path) -> None:
    """FUSE pod deleted and none started since: no live device to compare; ENOTCONN says dead."""
    kubelet, plugin, targets = layout(tmp_path, {UID_A: PV})
    p = prober({targets[UID_A]: OSError(errno.ENOTCONN, "x")})
    [s] = classify(find_volumes(kubelet), parse_mountinfo(mountinfo(plugin, targets, {UID_A: "0:40"}, [])), p, plugin)
    assert (s.state, s.reason) == (DEAD, "ENOTCONN: its FUSE session is gone")


def test_stuck_probes_are_bounded_and_reused_across_passes() -> None:
    release = threading.Event()
    calls = []

    def statvfs(path: str) -> None:
        calls.append(path)
        release.wait(5)

    p = Prober(timeout_s=0.05, max_stuck=2, statvfs=statvfs)
    first = p.probe_all(["/a", "/b", "/c"])
    second = p.probe_all(["/a", "/b", "/c"])
    release.set()
    assert [s for s, _ in first.values()] == [HUNG, HUNG, HUNG]
    assert "2 probes already stuck" in first["/c"][1] and "2 probes already stuck" in second["/c"][1]
    assert sorted(calls) == ["/a", "/b"]  # two threads in all, the second pass started none
    for _ in range(100):
        if p.stuck == 0:
            break
        time.sleep(0.01)
    assert p.stuck == 0


# --- healing against a fake API server -----------------------------------------------------------


class FakeApi:
    """A fake API server: PVs, pods per namespace, evictions recorded; ``refuse`` -> HTTP 429."""

    def __init__(self, pods: list[dict[str, Any]], pv_namespace: dict[str, str], refuse: bool = False) -> None:
        self.pods, self.pv_namespace, self.refuse = pods, pv_namespace, refuse
        self.evictions: list[tuple[str, str, dict[str, Any]]] = []
        self.requests: list[str] = []
        self.server = JsonServer(self.answer)
        self.client = HttpApi(self.server.url, token="t")

    def answer(self, method: str, path: str, body: Any, headers: Any) -> tuple[int, Any]:
        self.requests.append(f"{method} {path}")
        url = urllib.parse.urlparse(path)
        parts = url.path.strip("/").split("/")
        if method == "GET" and parts[:3] == ["api", "v1", "persistentvolumes"]:
            ns = self.pv_namespace.get(parts[3])
            if ns is None:
                return 404, {}
            return 200, {"spec": {"claimRef": {"namespace": ns, "name": "claim"}}}
        if method == "GET" and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            selector = urllib.parse.parse_qs(url.query).get("fieldSelector")
            node = selector[0].split("=", 1)[1] if selector else None
            return 200, {"items": [p for p in self.pods if p["metadata"]["namespace"] == parts[3]
                                   and node in (None, p["spec"]["nodeName"])]}
        if method == "POST":
            if self.refuse:
                return 429, {"reason": "TooManyRequests"}
            self.evictions.append((parts[3], parts[5], body))
            for p in self.pods:  # the API server deletes an evicted pod: it terminates
                if p["metadata"]["name"] == parts[5]:
                    p["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
            return 201, {}
        return 404, {}

    def close(self) -> None:
        self.server.close()


def pod(uid: str, name: str, *, controller: bool = True, deleting: bool = False, ns: str = "rag-assistant",
        node: str = NODE, ready: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "name": name, "namespace": ns}
    if controller:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rag-assistant-5d9", "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    status: dict[str, Any] = {"phase": "Running"}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


@pytest.fixture
def fake_api():
    apis = []

    def make(*args, **kwargs) -> FakeApi:
        apis.append(FakeApi(*args, **kwargs))
        return apis[-1]

    yield make
    for api in apis:
        api.close()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watchdog(tmp_path: Path, api: FakeApi | None, states: dict[str, Any], devices: dict[str, str],
             *, heal: bool = True, plugin_devices: tuple[str, ...] = ("0:41",), uids: dict[str, str] | None = None):
    kubelet, plugin, targets = layout(tmp_path, uids or {u: PV for u in devices})
    unmounted: list[str] = []
    clock = Clock()
    config = WatchdogConfig(heal=heal, period_s=30, probe_timeout_s=0.2, eviction_interval_s=60,
                            kubelet_dir=kubelet, plugin_dir=plugin)
    w = Watchdog(NODE, config, api=None if api is None else api.client,
                 prober=prober({targets[u]: r for u, r in states.items()}),
                 read_mountinfo=lambda: mountinfo(plugin, targets, devices, list(plugin_devices)),
                 unmount=unmounted.append, clock=clock, log=lambda line: None)
    return w, targets, unmounted, clock


def test_dead_mounts_are_evicted_one_per_interval_through_the_eviction_api(tmp_path: Path, fake_api) -> None:
    """Three pods lost their session at once: one eviction per pass until the interval has passed,
    with the pod's UID as precondition; the alive pod is never touched."""
    api = fake_api([pod(UID_A, "rag-a"), pod(UID_B, "rag-b"), pod(UID_C, "rag-c")], {PV: "rag-assistant"})
    w, targets, unmounted, clock = watchdog(tmp_path, api, {}, {UID_A: "0:40", UID_B: "0:40", UID_C: "0:41"})
    first = {m.pod: m for m in w.run_pass().mounts}
    assert [(ns, name) for ns, name, _ in api.evictions] == [("rag-assistant", "rag-a")]
    assert api.evictions[0][2] == {"apiVersion": "policy/v1", "kind": "Eviction",
                                   "metadata": {"name": "rag-a", "namespace": "rag-assistant"},
                                   "deleteOptions": {"preconditions": {"uid": UID_A}}}
    assert first["rag-a"].action == "evicted" and first["rag-b"].action.startswith("eviction waits")
    assert first["rag-c"].state == ALIVE and first["rag-c"].action == ""
    clock.t += 59
    w.run_pass()
    assert len(api.evictions) == 1  # 59 s later: still waiting
    clock.t += 1
    w.run_pass()
    assert [name for _, name, _ in api.evictions] == ["rag-a", "rag-b"]
    # rag-a now terminates: its dead bind is unmounted so the kubelet's teardown can finish.
    assert w.evictions == {"evicted": 2, "refused": 0, "failed": 0} and set(unmounted) == {targets[UID_A]}
    assert any(r.startswith("GET /api/v1/namespaces/rag-assistant/pods?fieldSelector=spec.nodeName%3D" + NODE)
               for r in api.requests)


def test_hung_and_failing_mounts_and_pods_without_a_controller_are_never_evicted(tmp_path: Path, fake_api) -> None:
    uids = {UID_A: PV, UID_B: PV, UID_C: PV}
    api = fake_api([pod(UID_A, "hung"), pod(UID_B, "failing"), pod(UID_C, "bare", controller=False)],
                   {PV: "rag-assistant"})
    w, targets, unmounted, _ = watchdog(
        tmp_path, api, {UID_A: "hang", UID_B: OSError(errno.EIO, "x")},
        {UID_A: "0:41", UID_B: "0:41", UID_C: "0:40"}, uids=uids)
    report = {m.pod: m for m in w.run_pass().mounts}
    assert {n: m.state for n, m in report.items()} == {"hung": HUNG, "failing": ERROR, "bare": DEAD}
    assert report["bare"].action.startswith("not healed: the pod has no controller")
    assert api.evictions == [] and unmounted == []


def test_a_refused_eviction_is_retried_next_pass_without_waiting_for_the_interval(tmp_path: Path, fake_api) -> None:
    api = fake_api([pod(UID_A, "rag-a")], {PV: "rag-assistant"}, refuse=True)
    w, _, _, _ = watchdog(tmp_path, api, {}, {UID_A: "0:40"})
    [m] = w.run_pass().mounts
    assert m.action.startswith("eviction refused by a PodDisruptionBudget")
    api.refuse = False
    w.run_pass()
    assert [name for _, name, _ in api.evictions] == ["rag-a"]
    assert w.evictions == {"evicted": 1, "refused": 1, "failed": 0}


def test_the_last_ready_replica_is_kept_until_another_is_ready(tmp_path: Path, fake_api) -> None:
    """A one-replica line (or one whose other replicas are down) keeps serving, without L2, rather
    than lose its last Ready replica to a heal; once a sibling of the same controller is Ready on
    another node, the pod is evicted. A pod that is not Ready is evicted at once (it serves nobody)."""
    api = fake_api([pod(UID_A, "rag-a", ready=True), pod(UID_B, "rag-b", ready=False, node="node-2")],
                   {PV: "rag-assistant"})
    w, _, _, clock = watchdog(tmp_path, api, {}, {UID_A: "0:40"}, uids={UID_A: PV})
    [m] = w.run_pass().mounts
    assert m.state == DEAD and m.action.startswith("kept: the last Ready replica of its controller")
    assert api.evictions == [] and w.evictions == {"evicted": 0, "refused": 0, "failed": 0}
    assert any(r == "GET /api/v1/namespaces/rag-assistant/pods" for r in api.requests)
    api.pods[1]["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    clock.t += 10
    w.run_pass()
    assert [name for _, name, _ in api.evictions] == ["rag-a"]


def test_dead_binds_of_terminating_or_vanished_pods_are_unmounted_never_alive_ones(tmp_path: Path, fake_api) -> None:
    """Pod A terminates with a dead mount (the kubelet's teardown would fail on it), pod B's UID is
    no longer in the API (force-deleted), pod C terminates with an alive mount."""
    uids = {UID_A: PV, UID_B: PV, UID_C: PV}
    api = fake_api([pod(UID_A, "rag-a", deleting=True), pod(UID_C, "rag-c", deleting=True)], {PV: "rag-assistant"})
    w, targets, unmounted, _ = watchdog(tmp_path, api, {}, {UID_A: "0:40", UID_B: "0:40", UID_C: "0:41"}, uids=uids)
    report = {m.pod_uid: m for m in w.run_pass().mounts}
    assert sorted(unmounted) == sorted([targets[UID_A], targets[UID_B]])
    assert report[UID_A].action == "unmounted (pod terminating or finished)"
    assert report[UID_B].action == "unmounted (pod no longer exists)" and report[UID_B].pod == ""
    assert api.evictions == [] and w.unmounts["unmounted"] == 2


def test_report_only_heals_nothing_and_without_the_api_nothing_is_named(tmp_path: Path, fake_api) -> None:
    api = fake_api([pod(UID_A, "rag-a"), pod(UID_B, "rag-b", deleting=True)], {PV: "rag-assistant"})
    w, _, unmounted, _ = watchdog(tmp_path, api, {}, {UID_A: "0:40", UID_B: "0:40"}, heal=False)
    actions = sorted(m.action for m in w.run_pass().mounts)
    assert actions == ["report only: would evict", "report only: would unmount (pod terminating or finished)"]
    assert api.evictions == [] and unmounted == []
    w2, _, unmounted2, _ = watchdog(tmp_path / "no-api", None, {}, {UID_A: "0:40"})
    [m] = w2.run_pass().mounts
    assert (m.state, m.namespace, m.pod, m.action) == (DEAD, "", "", "not healed: its pod could not be looked up")
    assert unmounted2 == []


def test_an_api_that_cannot_list_pods_heals_nothing_and_counts_the_error(tmp_path: Path, fake_api) -> None:
    """Pods of a namespace the watchdog may not list (no RoleBinding there: not an L2 line)."""
    api = fake_api([], {PV: "other-team"})
    api.pods = None  # type: ignore[assignment]  -> the handler fails (HTTP 500 from http.server)
    w, _, unmounted, _ = watchdog(tmp_path, api, {}, {UID_A: "0:40"})
    report = w.run_pass()
    assert report.mounts[0].namespace == "other-team" and report.mounts[0].action.startswith("not healed")
    assert len(report.api_errors) == 1 and unmounted == [] and api.evictions == []


def test_metrics_text_parses_and_carries_up_state_and_counters(tmp_path: Path, fake_api) -> None:
    api = fake_api([pod(UID_A, "rag-a"), pod(UID_B, "rag-b")], {PV: "rag-assistant"})
    w, _, _, _ = watchdog(tmp_path, api, {}, {UID_A: "0:40", UID_B: "0:41"})
    w.run_pass()
    families = {f.name: f for f in text_string_to_metric_families(w.metrics())}
    up = {s.labels["pod"]: s.value for s in families["kvcache_l2_mount_up"].samples}
    assert up == {"rag-a": 0.0, "rag-b": 1.0}
    sample = families["kvcache_l2_mount_up"].samples[0]
    assert {k: sample.labels[k] for k in ("namespace", "node", "volume")} == {
        "namespace": "rag-assistant", "node": NODE, "volume": PV}
    states = {(s.labels["pod"], s.labels["state"]): s.value for s in families["kvcache_l2_mount_state"].samples}
    assert states[("rag-a", DEAD)] == 1 and states[("rag-a", ALIVE)] == 0 and len(states) == 8
    evictions = {s.labels["result"]: s.value for s in families["kvcache_l2_mount_evictions"].samples
                 if s.name.endswith("_total")}
    assert evictions == {"evicted": 1.0, "refused": 0.0, "failed": 0.0}
    assert families["kvcache_l2_mount_evictions"].type == "counter"


def test_config_rejects_a_probe_timeout_not_below_the_period() -> None:
    with pytest.raises(ValueError, match="probe_timeout_s must be > 0 and below period_s"):
        wd.config_from_dict({"period_s": 10, "probe_timeout_s": 10})
    with pytest.raises(ValueError, match="unexpected keyword"):
        wd.config_from_dict({"heal": True, "evict": True})


def test_http_server_serves_the_metric_table_the_report_and_health(tmp_path: Path, fake_api) -> None:
    """What the scrape job, verify.py and the liveness probe read from a running watchdog; every
    watchdog metric of observability/metrics.py with its labels (so dashboards and alerts match)."""
    import urllib.request

    from observability import metrics

    api = fake_api([pod(UID_A, "rag-a")], {PV: "rag-assistant"})
    w, _, _, clock = watchdog(tmp_path, api, {}, {UID_A: "0:40"})
    server = wd.make_server(w, 0, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert urllib.request.urlopen(base + wd.MOUNTS_PATH).read() == b"null"  # before the first pass
        w.run_pass()
        text = urllib.request.urlopen(base + wd.METRICS_PATH).read().decode()
        report = json.loads(urllib.request.urlopen(base + wd.MOUNTS_PATH).read())
        assert urllib.request.urlopen(base + wd.LIVENESS_PATH).status == 200
        clock.t += 3 * 30 + 1  # three periods without a pass
        with pytest.raises(urllib.error.HTTPError) as stale:
            urllib.request.urlopen(base + wd.LIVENESS_PATH)
        assert stale.value.code == 503
    finally:
        server.shutdown()
    assert [(m["namespace"], m["pod"], m["state"], m["action"]) for m in report["mounts"]] == [
        ("rag-assistant", "rag-a", DEAD, "evicted")]
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    table = [m for m in metrics.METRICS.values() if m.source is metrics.L2_MOUNT_WATCHDOG]
    assert {m.name for m in table} == {wd.UP_METRIC, wd.STATE_METRIC, wd.EVICTIONS_METRIC, wd.UNMOUNTS_METRIC,
                                       wd.LAST_PASS_METRIC}
    for m in table:
        [series] = m.series()
        assert set(samples[series].labels) == set(m.labels), m.name


# --- from the host's mount table alone (the DaemonSet: no kubelet directory mounted) ---------------

HOST_KUBELET = "/var/lib/kubelet"
HOST_PLUGIN = "/var/lib/kubelet/plugins/curvine"


def host_targets(pods: dict[str, str]) -> dict[str, str]:
    """uid -> the host path of its CSI target (never created: the DaemonSet cannot see it)."""
    return {uid: f"{HOST_KUBELET}/pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount" for uid, pv in pods.items()}


def test_the_host_mount_table_alone_names_every_curvine_bind_and_nothing_else() -> None:
    """Curvine binds at kubelet CSI targets only: not an S3 CSI (mountpoint-s3) FUSE bind at a CSI
    target, not the session at the plugin path, not a curvinefs bind elsewhere, not a projected
    service-account token volume (tmpfs)."""
    targets = host_targets({UID_A: PV, UID_B: "pvc-s3-model"})
    text = mountinfo(HOST_PLUGIN, {UID_A: targets[UID_A]}, {UID_A: "0:41"}, ["0:41"], source="curvinefs")
    text += (f"300 29 0:77 / {targets[UID_B]} rw - fuse mountpoint-s3 rw,user_id=0\n"
             f"301 29 0:41 /x /mnt/elsewhere rw - fuse curvinefs rw\n"
             f"302 29 0:90 / {HOST_KUBELET}/pods/{UID_A}/volumes/kubernetes.io~projected/kube-api-access-x rw - tmpfs tmpfs rw\n"
             f"303 29 0:42 /y {HOST_KUBELET}/pods/{UID_C}/volumes/kubernetes.io~csi/{PV}/mount rw - fuse.curvinefs curvinefs rw\n")
    found = wd.volumes_from_mountinfo(parse_mountinfo(text), HOST_KUBELET)
    assert found == [wd.PodVolume(UID_A, PV, targets[UID_A]),  # v0.3.2-alpha: type fuse
                     wd.PodVolume(UID_C, PV, f"{HOST_KUBELET}/pods/{UID_C}/volumes/kubernetes.io~csi/{PV}/mount")]  # v0.4.1
    assert wd.csi_target(targets[UID_A], HOST_KUBELET) == (UID_A, PV)
    assert wd.csi_target(f"{HOST_KUBELET}/pods/{UID_A}/volumes/kubernetes.io~csi/{PV}/mount/../../../x", HOST_KUBELET) is None
    assert wd.csi_target("/etc/mount", HOST_KUBELET) is None


def test_each_session_is_probed_once_at_the_plugin_path_and_a_bind_off_every_session_is_dead() -> None:
    targets = host_targets({UID_A: PV, UID_B: PV, UID_C: PV})
    entries = parse_mountinfo(mountinfo(HOST_PLUGIN, targets, {UID_A: "0:40", UID_B: "0:41", UID_C: "0:41"},
                                        ["0:40", "0:41"], source="curvinefs"))
    probed: list[str] = []
    states = wd.classify_by_session(wd.volumes_from_mountinfo(entries, HOST_KUBELET), entries,
                                    Prober(timeout_s=1, statvfs=probed.append), HOST_PLUGIN)
    assert {s.volume.pod_uid: s.state for s in states} == {UID_A: DEAD, UID_B: ALIVE, UID_C: ALIVE}
    assert probed == [f"{HOST_PLUGIN}/{KEY}/fuse-mount"]  # one probe for the session, never a target
    # The session hangs or fails: every bind of it says so; no session mounted at all: dead.
    for answer, state in (("hang", HUNG), (OSError(errno.EIO, "x"), ERROR), (OSError(errno.ENOTCONN, "x"), DEAD)):
        p = prober({f"{HOST_PLUGIN}/{KEY}/fuse-mount": answer})
        got = {s.volume.pod_uid: s.state for s in wd.classify_by_session(
            wd.volumes_from_mountinfo(entries, HOST_KUBELET), entries, p, HOST_PLUGIN)}
        p.release.set()
        assert got == {UID_A: DEAD, UID_B: state, UID_C: state}
    none = parse_mountinfo(mountinfo(HOST_PLUGIN, targets, {UID_A: "0:40"}, [], source="curvinefs"))
    [s] = wd.classify_by_session(wd.volumes_from_mountinfo(none, HOST_KUBELET), none, prober({}), HOST_PLUGIN)
    assert s.state == DEAD and "no session is mounted" in s.reason


def test_a_pass_from_the_host_mount_table_heals_without_any_kubelet_directory(tmp_path: Path, fake_api,
                                                                             monkeypatch) -> None:
    """The DaemonSet's configuration: nothing under the kubelet directory is read (the layout
    reader fails the test if called); the dead bind of a running pod is evicted, the dead bind of a
    terminating one unmounted by its host path, the alive one left alone."""

    def no_kubelet_dir(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the kubelet directory was read")

    monkeypatch.setattr(wd, "find_volumes", no_kubelet_dir)
    targets = host_targets({UID_A: PV, UID_B: PV, UID_C: PV})
    api = fake_api([pod(UID_A, "rag-a"), pod(UID_B, "rag-b", deleting=True), pod(UID_C, "rag-c")], {PV: "rag-assistant"})
    host_mountinfo = tmp_path / "mountinfo"
    host_mountinfo.write_text(mountinfo(HOST_PLUGIN, targets, {UID_A: "0:40", UID_B: "0:40", UID_C: "0:41"},
                                        ["0:41"], source="curvinefs"))
    unmounted: list[str] = []
    probed: list[str] = []
    config = WatchdogConfig(heal=True, period_s=30, probe_timeout_s=0.2, eviction_interval_s=60,
                            kubelet_dir=HOST_KUBELET, plugin_dir=HOST_PLUGIN, host_mountinfo=str(host_mountinfo))
    w = Watchdog(NODE, config, api=api.client, prober=Prober(timeout_s=0.2, statvfs=probed.append),
                 unmount=unmounted.append, clock=Clock(), log=lambda line: None)
    report = {m.pod: m for m in w.run_pass().mounts}
    assert (report["rag-a"].state, report["rag-a"].action) == (DEAD, "evicted")
    assert report["rag-b"].state == DEAD and report["rag-b"].action.startswith("unmounted")
    assert (report["rag-c"].state, report["rag-c"].action) == (ALIVE, "")
    assert unmounted == [targets[UID_B]] and [n for _, n, _ in api.evictions] == ["rag-a"]
    assert probed == [f"{HOST_PLUGIN}/{KEY}/fuse-mount"]


def test_the_host_namespace_unmount_refuses_anything_but_a_csi_target() -> None:
    for path in ("/", "/var/lib/kubelet/pods/x/volumes/kubernetes.io~projected/kube-api-access-1/token",
                 "/var/lib/kubelet/plugins/curvine/k/fuse-mount"):
        with pytest.raises(ValueError, match="not a kubelet CSI target"):
            wd.unmount_in_host_namespace(path)


def test_the_rendered_config_of_the_daemon_set_reads_the_host_table() -> None:
    """The chart renders host_mountinfo (k8s/mount_watchdog.py); the loader accepts it."""
    config = wd.config_from_dict({"heal": True, "host_mountinfo": wd.HOST_MOUNTINFO})
    assert config.host_mountinfo == "/host/proc/1/mountinfo" and config.kubelet_dir == "/var/lib/kubelet"
