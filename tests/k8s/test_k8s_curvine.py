"""The Curvine chart: Primary on the static EBS PV, Workers on NVMe, config, CSI, StorageClass."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from tests.k8s.conftest import CURVINE_SAMPLE, VOLUME_ID, ZONE, find, needs_reference

from k8s import curvine_config, names
from k8s.curvine_chart import CURVINE_ENTRYPOINT, FIRST_START_MARKER_WAIT_S, _config_check_script, _master_start_script
from k8s.curvine_config import client_ttl, curvine_duration, fuse_ttl_parameters


@pytest.fixture(scope="module")
def curvine(manifests):
    return manifests["curvine"]


@pytest.fixture(scope="module")
def toml_conf(curvine):
    cm = find(curvine, "ConfigMap", names.CURVINE_CONFIG_MAP)
    return tomllib.loads(cm["data"][names.CURVINE_CONFIG_FILE])


def _pod(obj):
    return obj["spec"]["template"]["spec"]


def _container(obj, name):
    (c,) = [c for c in _pod(obj)["containers"] if c["name"] == name]
    return c


def curvine_duration_ms(text: str) -> int:
    """Port of orpc's ``DurationUnit::from_str`` (CurvineIO/curvine ``orpc/src/common/duration_unit.rs``).

    Lower-cases and trims; the number is the leading run of digits, ``.``, ``e``, ``+``, ``-``;
    units ``ms`` (or none), ``s``/``second``, ``m``/``minute``, ``h``/``hour``, ``d``/``day``;
    a bare integer is milliseconds. Raises ValueError where Curvine returns an error.
    """
    text = text.strip().lower()
    size = re.match(r"[0-9.eE+-]*", text).group(0)
    unit = text[len(size):].strip()
    if unit in ("ms", "") and size.isdigit():
        return int(size)
    scale = {"ms": 1, "": 1, "s": 1_000, "second": 1_000, "m": 60_000, "minute": 60_000,
             "h": 3_600_000, "hour": 3_600_000, "d": 86_400_000, "day": 86_400_000}
    if unit not in scale:
        raise ValueError(f"valid duration {text}, only d, h, m, s, ms are supported")
    return int(float(size) * scale[unit])


def test_namespace_is_applied_first(curvine):
    assert curvine[0]["kind"] == "Namespace" and curvine[0]["metadata"]["name"] == "curvine"
    namespaced = [o for o in curvine[1:] if "namespace" in o["metadata"]]
    assert namespaced and all(o["metadata"]["namespace"] == "curvine" for o in namespaced)


def test_primary_pv_is_the_cdk_volume_in_its_zone(curvine):
    pv = find(curvine, "PersistentVolume", names.CURVINE_PRIMARY_PV)["spec"]
    assert pv["csi"] == {"driver": "ebs.csi.aws.com", "volumeHandle": VOLUME_ID, "fsType": "ext4"}
    assert pv["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["storageClassName"] == ""
    assert pv["capacity"] == {"storage": "100Gi"}
    (term,) = pv["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]}]
    assert pv["claimRef"] == {"kind": "PersistentVolumeClaim", "namespace": "curvine", "name": names.CURVINE_PRIMARY_PV}


def test_primary_pvc_binds_the_pv_by_name(curvine):
    pvc = find(curvine, "PersistentVolumeClaim", names.CURVINE_PRIMARY_PV)["spec"]
    assert pvc["volumeName"] == names.CURVINE_PRIMARY_PV
    assert pvc["storageClassName"] == "" and pvc["accessModes"] == ["ReadWriteOnce"]


def test_primary_statefulset(curvine, k8s_project):
    sts = find(curvine, "StatefulSet", names.CURVINE_MASTER)
    assert sts["spec"]["serviceName"] == names.CURVINE_MASTER and sts["spec"]["replicas"] == 1
    pod = _pod(sts)
    master = _container(sts, "master")
    assert master["image"] == k8s_project.platform.versions.images.curvine
    env = {e["name"]: e.get("value") for e in master["env"]}
    assert env["CURVINE_CONF_FILE"] == "/etc/curvine/curvine-cluster.toml"
    assert Path(env["CURVINE_CONF_FILE"]).is_absolute()
    mounts = {m["mountPath"]: m["name"] for m in master["volumeMounts"]}
    assert mounts == {"/etc/curvine": "config", "/data": "primary", curvine_config.FIRST_START_DIR: "first-start"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert master[probe]["tcpSocket"]["port"] == 8995
    assert master["startupProbe"]["periodSeconds"] * master["startupProbe"]["failureThreshold"] == 300
    assert master["resources"]["requests"]["memory"] and master["resources"]["limits"]["memory"]
    # The wrapper chooses the config, then runs the image's entrypoint exactly as before.
    assert master["command"] == ["/bin/sh", "-c"] and "args" in master
    assert master["args"][0].rstrip().endswith(f"exec {CURVINE_ENTRYPOINT} master start")
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["claimName"] == names.CURVINE_PRIMARY_PV
    (first_start,) = [v for v in pod["volumes"] if v["name"] == "first-start"]
    assert "emptyDir" in first_start, "a first-start config must never outlive its pod"
    (init,) = pod["initContainers"]
    assert init["name"] == "check-config-and-dirs"
    assert {m["mountPath"] for m in init["volumeMounts"]} == set(mounts)


def test_headless_service_and_pdb(curvine):
    svc = find(curvine, "Service", names.CURVINE_MASTER)["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in svc["ports"]} == {"rpc": 8995, "journal": 8996, "web": 9001}
    pdb = find(curvine, "PodDisruptionBudget", names.CURVINE_MASTER)["spec"]
    sts = find(curvine, "StatefulSet", names.CURVINE_MASTER)
    assert pdb["minAvailable"] == 1
    assert pdb["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_generated_toml(toml_conf):
    c = toml_conf
    host = "curvine-master-0.curvine-master.curvine.svc.cluster.local"
    assert c["format_master"] is False and c["format_worker"] is False
    assert (c["master"]["rpc_port"], c["master"]["web_port"]) == (8995, 9001)
    assert c["journal"]["rpc_port"] == 8996
    assert (c["worker"]["rpc_port"], c["worker"]["web_port"]) == (8997, 9002)
    assert c["fuse"]["web_port"] == 9003
    assert c["journal"]["journal_addrs"] == [{"id": 1, "hostname": host, "port": 8996}]
    assert c["master"]["hostname"] == host
    assert c["client"]["master_addrs"] == [{"hostname": host, "port": 8995}]
    # Directories below the EBS mount root /data (whose root holds lost+found).
    assert c["master"]["meta_dir"] == "/data/curvine/meta" and c["journal"]["journal_dir"] == "/data/curvine/journal"
    assert c["worker"]["data_dir"] == ["[SSD:2000GB]/opt/dlami/nvme/curvine-data"]


def test_eviction_from_config(toml_conf, k8s_project):
    ev = k8s_project.platform.curvine.eviction
    # A string: Curvine deserializes ttl_ms into a String and parses it as a duration; a TOML
    # integer is a serde type error that stops the Primary, the Workers and validate-config.
    assert toml_conf["client"]["ttl_ms"] == "1d"
    assert curvine_duration_ms(toml_conf["client"]["ttl_ms"]) == 24 * 3_600_000 == int(ev.ttl_hours * 3_600_000)
    assert toml_conf["client"]["ttl_action"] == "delete"
    m = toml_conf["master"]
    assert m["enable_quota_eviction"] is True and m["quota_eviction_policy"] == "lru"
    assert (m["quota_eviction_high_rate"], m["quota_eviction_low_rate"]) == (0.8, 0.6)
    assert m["quota_eviction_mode"] == "delete"


#: Keys we write that the reference sample does not show, each checked against the struct that
#: deserializes it (CurvineIO/curvine, curvine-common/src/conf/*.rs and
#: crates/common/curvine-config/src/client_conf.rs; structs are #[serde(default)] without
#: deny_unknown_fields, so a misspelled key would be silently ignored, not rejected).
SOURCE_ONLY_KEYS = {
    "": {"cluster_id"},  # ClusterConf
    "master": {"hostname", "rpc_port", "web_port", "enable_quota_eviction", "quota_eviction_mode",
               "quota_eviction_policy", "quota_eviction_high_rate", "quota_eviction_low_rate"},  # MasterConf
    "journal": {"hostname", "rpc_port"},  # JournalConf
    "worker": {"rpc_port", "web_port"},  # WorkerConf
    "client": {"master_addrs", "ttl_ms", "ttl_action"},  # ClientConf (ttl_*: serde aliases of ttl_*_str)
    "fuse": {"web_port"},  # FuseConf (curvine-fuse serves its web port from conf.fuse.web_port)
}


def sample_mismatches(ours: dict, theirs: dict, where: str = "") -> list[str]:
    """Keys of ``ours`` neither in Curvine's sample ``theirs`` nor in :data:`SOURCE_ONLY_KEYS`,
    and values whose type differs from the sample's (recursing into tables)."""
    problems = []
    for key, value in ours.items():
        path = f"{where}.{key}" if where else key
        if key not in theirs:
            if key not in SOURCE_ONLY_KEYS.get(where, set()):
                problems.append(f"{path}: neither in the sample nor checked in source")
        elif isinstance(value, dict) and isinstance(theirs[key], dict):
            problems += sample_mismatches(value, theirs[key], path)
        elif type(value) is not type(theirs[key]):
            problems.append(f"{path}: {type(value).__name__}, the sample has {type(theirs[key]).__name__}")
    return problems


@pytest.fixture(scope="module")
def curvine_sample():
    return tomllib.loads(CURVINE_SAMPLE.read_text(encoding="utf-8"))


@needs_reference
def test_toml_keys_exist_in_the_reference_sample(toml_conf, curvine_sample):
    """Every key we write is in Curvine's sample config, or in a short list checked in its source.

    Where the sample has the key, our value has the sample's type (e.g. ``dir_reserved`` is a
    string, the ``log`` tables have the sample's keys).
    """
    sample = curvine_sample
    assert sample_mismatches(toml_conf, sample) == []
    for key in ("format_master", "format_worker"):
        assert key in sample and toml_conf[key] is False
    assert set(sample["journal"]["journal_addrs"][0]) == set(toml_conf["journal"]["journal_addrs"][0])
    # Not in the sample: Curvine reads ttl_ms/ttl_action into Strings (client_conf.rs).
    assert all(isinstance(v, str) for v in (toml_conf["client"]["ttl_ms"], toml_conf["client"]["ttl_action"]))
    # The list of source-checked keys stays minimal: every entry is really written.
    for where, keys in SOURCE_ONLY_KEYS.items():
        assert keys <= set(toml_conf[where] if where else toml_conf), where


@needs_reference
def test_sample_check_can_fail(toml_conf, curvine_sample):
    """An unknown key or a value of the wrong type is reported."""
    bad = {**toml_conf, "worker": {**toml_conf["worker"], "dir_reserved": 0, "data_dirs": []},
           "clusterid": "x", "log": {**toml_conf["log"], "levle": "info"}}
    assert sorted(sample_mismatches(bad, curvine_sample)) == [
        "clusterid: neither in the sample nor checked in source",
        "log.levle: neither in the sample nor checked in source",
        "worker.data_dirs: neither in the sample nor checked in source",
        "worker.dir_reserved: int, the sample has str",
    ]


@pytest.mark.parametrize("ms,text", [(0, "0ms"), (1, "1ms"), (1_500, "1500ms"), (60_000, "1m"), (5_400_000, "90m"),
                                     (86_400_000, "1d"), (129_600_000, "36h"), (7 * 86_400_000, "7d")])
def test_curvine_duration_round_trips_through_curvines_parser(ms, text):
    assert curvine_duration(ms) == text
    assert curvine_duration_ms(text) == ms


def test_client_ttl_follows_config(k8s_project):
    platform = k8s_project.platform
    ev = platform.curvine.eviction

    def with_eviction(**update):
        curvine = platform.curvine.model_copy(update={"eviction": ev.model_copy(update=update)})
        return platform.model_copy(update={"curvine": curvine})

    assert client_ttl(with_eviction(ttl_hours=1.5, ttl_action="free")) == {"ttl_ms": "90m", "ttl_action": "free"}
    assert fuse_ttl_parameters(with_eviction(ttl_hours=1.5, ttl_action="free")) == {
        "client.ttl-ms": "90m", "client.ttl-action": "free"}
    assert client_ttl(with_eviction(ttl_hours=0)) == {"ttl_ms": "0ms", "ttl_action": "none"}
    assert fuse_ttl_parameters(with_eviction(ttl_hours=0)) == {}


def test_workers_on_hyperpod_nvme(curvine, k8s_project):
    ds = find(curvine, "DaemonSet", names.CURVINE_WORKER)
    pod = _pod(ds)
    (data,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert data["hostPath"] == {"path": "/opt/dlami/nvme/curvine-data", "type": "DirectoryOrCreate"}
    worker = _container(ds, "worker")
    assert {"name": "data", "mountPath": "/opt/dlami/nvme/curvine-data"} in worker["volumeMounts"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "sagemaker.amazonaws.com/compute-type", "operator": "In", "values": ["hyperpod"]}]
    # worker_instance_groups is empty: Workers run on every group, so they tolerate p5's taint.
    assert {"key": "kvcache.io/large-model", "operator": "Equal", "value": "true", "effect": "PreferNoSchedule"} \
        in pod["tolerations"]
    env = {e["name"]: e for e in worker["env"]}
    assert env["CURVINE_WORKER_HOSTNAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"


def test_only_the_csi_node_plugin_is_privileged(curvine):
    privileged = set()
    for obj in curvine:
        if obj["kind"] not in ("StatefulSet", "DaemonSet", "Deployment"):
            continue
        pod = _pod(obj)
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c.get("securityContext") or {}
            if sc.get("privileged"):
                privileged.add((obj["metadata"]["name"], c["name"]))
            else:
                assert sc.get("allowPrivilegeEscalation") is False, (obj["metadata"]["name"], c["name"])
                assert sc["capabilities"]["drop"] == ["ALL"]
    assert privileged == {(names.CSI_NODE, "csi-plugin")}
    node = _container(find(curvine, "DaemonSet", names.CSI_NODE), "csi-plugin")
    assert {"name": "kubelet-dir", "mountPath": "/var/lib/kubelet", "mountPropagation": "Bidirectional"} \
        in node["volumeMounts"]


def test_csi_driver_and_storage_class(curvine, k8s_project):
    drv = find(curvine, "CSIDriver", "curvine")["spec"]
    assert drv["attachRequired"] is False and drv["volumeLifecycleModes"] == ["Persistent"]
    sc = find(curvine, "StorageClass", "curvine-sc")
    assert sc["provisioner"] == "curvine"
    assert sc["parameters"] == {
        "master-addrs": "curvine-master-0.curvine-master.curvine.svc.cluster.local:8995",
        "fs-path": k8s_project.platform.curvine.fs_path,
        "path-type": "DirectoryOrCreate",
        # The writer's TTL: the CSI passes these to the FUSE pods as --client.ttl-ms 1d
        # --client.ttl-action delete; those pods never read the ConfigMap.
        "client.ttl-ms": "1d",
        "client.ttl-action": "delete",
    }
    svc = find(curvine, "Service", names.CURVINE_MASTER)
    host, port = sc["parameters"]["master-addrs"].split(":")
    assert host.split(".")[1] == svc["metadata"]["name"] and host.split(".")[2] == svc["metadata"]["namespace"]
    assert int(port) in {p["port"] for p in svc["spec"]["ports"]}


def test_storage_class_ttl_matches_the_configmap(curvine, toml_conf):
    """One TTL: what the FUSE pods get as flags is what the shared config file says."""
    params = find(curvine, "StorageClass", "curvine-sc")["parameters"]
    assert curvine_duration_ms(params["client.ttl-ms"]) == curvine_duration_ms(toml_conf["client"]["ttl_ms"]) > 0
    assert params["client.ttl-action"] == toml_conf["client"]["ttl_action"]
    # Flag names follow curvine-fuse's --client.<field> form: kebab case, no _str suffix.
    assert all(re.fullmatch(r"client\.[a-z]+(-[a-z]+)*", k) for k in params if k.startswith("client."))


def test_every_image_is_pinned_from_config(curvine, k8s_project):
    pinned = set(k8s_project.platform.versions.images.model_dump().values())
    for obj in curvine:
        if obj["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
            pod = _pod(obj)
            for c in pod.get("initContainers", []) + pod["containers"]:
                assert c["image"] in pinned, (obj["metadata"]["name"], c["name"], c["image"])
                assert not c["image"].endswith(":latest")


def test_csi_rbac_is_scoped(curvine):
    role = find(curvine, "Role", names.CSI_NODE)
    assert role["metadata"]["namespace"] == "curvine"
    cluster_node = find(curvine, "ClusterRole", names.CSI_NODE)
    cluster_resources = {r for rule in cluster_node["rules"] for r in rule["resources"]}
    assert cluster_resources == {"persistentvolumes", "events"}, "pods/configmaps must stay namespaced"
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"pods", "configmaps"}
    # Nothing in Curvine's CSI reads or writes Secrets (standalone_manager.go, node_standalone.go).
    for obj in curvine:
        if obj["kind"] in ("ClusterRole", "Role"):
            assert not any("secrets" in rule["resources"] for rule in obj["rules"]), obj["metadata"]["name"]
    for obj in curvine:
        if obj["kind"] in ("ClusterRole", "Role"):
            for rule in obj["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"]


def test_master_network_policy(curvine, k8s_project):
    pol = find(curvine, "NetworkPolicy", "curvine-master-ingress")["spec"]
    assert pol["policyTypes"] == ["Ingress"]
    sts = find(curvine, "StatefulSet", names.CURVINE_MASTER)
    assert pol["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    (rule,) = pol["ingress"]
    assert sorted(p["port"] for p in rule["ports"]) == [8995, 8996, 9001]
    peers = rule["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "curvine"}}} in peers
    assert {"ipBlock": {"cidr": k8s_project.platform.network.cidr}} in peers


# --- the Primary's init script and start wrapper, run for real with /bin/sh ----------------------

#: Stand-in for the image's /entrypoint.sh: prints the config it got; "formats" (fresh metadata
#: and journal, one line in formats.log) when that config says format_master = true; like older
#: masters (#906, #953) refuses empty metadata otherwise; FAKE_FAIL=1 dies before writing anything.
FAKE_ENTRYPOINT = """#!/bin/sh
echo "conf=$CURVINE_CONF_FILE args=$*"
[ "${FAKE_FAIL:-0}" = 1 ] && { echo "master failed at start" >&2; exit 1; }
if grep -Eq '^format_master = true' "$CURVINE_CONF_FILE"; then
  rm -rf "$ROOT/meta" "$ROOT/journal"; mkdir -p "$ROOT/meta" "$ROOT/journal"
  echo rocksdb > "$ROOT/meta/CURRENT"; echo raft > "$ROOT/journal/LOG"; echo x >> "$ROOT/../formats.log"
elif [ -z "$(ls -A "$ROOT/meta" 2>/dev/null)" ] && [ -z "$(ls -A "$ROOT/journal" 2>/dev/null)" ]; then
  echo "refusing empty meta_dir with format_master = false" >&2; exit 1
fi
"""


class PrimaryPod:
    """The Primary's init container and master container on a temp dir, run with /bin/sh.

    ``new_pod()`` gives a fresh emptyDir (as Kubernetes does per pod) and runs the init script;
    ``start_master()`` runs the master container's wrapper (again, without the init script, for
    a container restart in the same pod).
    """

    def __init__(self, tmp_path: Path, conf_text: str | None) -> None:
        self.tmp = tmp_path
        self.root = tmp_path / "data" / "curvine"
        self.conf = tmp_path / "curvine-cluster.toml"
        if conf_text is not None:
            self.conf.write_text(conf_text)
        self.entrypoint = tmp_path / "entrypoint.sh"
        self.entrypoint.write_text(FAKE_ENTRYPOINT)
        self.entrypoint.chmod(0o755)
        self.pod = 0

    @property
    def first_start_dir(self) -> Path:
        return self.tmp / f"pod-{self.pod}-first-start"

    @property
    def marker(self) -> Path:
        return self.root / ".kvcache-initialized"

    def formats(self) -> int:
        log = self.tmp / "data" / "formats.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def _localize(self, script: str) -> str:
        return (script.replace(curvine_config.PRIMARY_ROOT, str(self.root))
                .replace(curvine_config.FIRST_START_DIR, str(self.first_start_dir))
                .replace(f"exec {CURVINE_ENTRYPOINT} ", f"exec {self.entrypoint} ")
                .replace(f"-lt {FIRST_START_MARKER_WAIT_S} ", "-lt 2 "))

    def _run(self, script: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", "-c", self._localize(script)], capture_output=True, text=True,
                              timeout=60, env={"PATH": "/usr/bin:/bin", "ROOT": str(self.root), **env})

    def new_pod(self) -> subprocess.CompletedProcess:
        self.pod += 1
        self.first_start_dir.mkdir()
        return self._run(_config_check_script(conf=str(self.conf), primary=True))

    def start_master(self, **env: str) -> subprocess.CompletedProcess:
        return self._run(_master_start_script(conf=str(self.conf)), **env)


@pytest.fixture(scope="module")
def real_conf(k8s_project) -> str:
    return curvine_config.render_cluster_toml(k8s_project.platform)


def test_init_refuses_missing_or_formatting_config(tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    missing = PrimaryPod(tmp_path / "a", None).new_pod()
    assert missing.returncode == 1 and "missing or empty" in missing.stderr
    formatting = PrimaryPod(tmp_path / "b", "format_master = true\nformat_worker = false\n").new_pod()
    assert formatting.returncode == 1 and "format_master = false" in formatting.stderr


def test_truly_first_start_formats_exactly_once(tmp_path, real_conf):
    pod = PrimaryPod(tmp_path, real_conf)
    init = pod.new_pod()
    assert init.returncode == 0, init.stderr
    first = pod.first_start_dir / "curvine-cluster.toml"
    # The one-time copy differs from the ConfigMap in the format_master line only.
    diff = [(a, b) for a, b in zip(real_conf.splitlines(), first.read_text().splitlines()) if a != b]
    assert diff == [("format_master = false", "format_master = true")]
    assert len(first.read_text().splitlines()) == len(real_conf.splitlines())
    assert not pod.marker.exists(), "no marker before the master has created anything"

    started = pod.start_master()
    assert started.returncode == 0, started.stderr
    assert f"conf={first}.used args=master start" in started.stdout
    assert pod.formats() == 1 and pod.marker.exists() and not first.exists()

    # Container restart in the same pod: the init container does not run again.
    restarted = pod.start_master()
    assert restarted.returncode == 0 and f"conf={pod.conf} " in restarted.stdout
    assert pod.formats() == 1

    # A new pod: metadata present, normal start with the ConfigMap.
    again = pod.new_pod()
    assert again.returncode == 0 and "metadata present" in again.stdout
    assert not any(pod.first_start_dir.iterdir())
    assert f"conf={pod.conf} " in pod.start_master().stdout and pod.formats() == 1

    # Marker present, metadata gone: a wiped or foreign volume is refused, never formatted.
    for f in (pod.root / "meta").iterdir():
        f.unlink()
    refused = pod.new_pod()
    assert refused.returncode == 1 and "wrong or wiped volume" in refused.stderr
    assert pod.formats() == 1


def test_first_start_that_fails_early_formats_again_in_the_next_pod(tmp_path, real_conf):
    pod = PrimaryPod(tmp_path, real_conf)
    assert pod.new_pod().returncode == 0
    failed = pod.start_master(FAKE_FAIL="1")
    assert failed.returncode == 1 and not pod.marker.exists() and pod.formats() == 0
    assert "marker not written" in failed.stderr
    # The master container restarts in the same pod: ConfigMap config, an older master refuses.
    assert pod.start_master().returncode == 1 and pod.formats() == 0
    # The next pod is a first start again, with no manual step.
    assert pod.new_pod().returncode == 0
    assert pod.start_master().returncode == 0 and pod.formats() == 1 and pod.marker.exists()


def test_journal_without_metadata_starts_without_formatting(tmp_path, real_conf):
    pod = PrimaryPod(tmp_path, real_conf)
    (pod.root / "journal").mkdir(parents=True)
    (pod.root / "journal" / "snapshot").write_text("raft")
    init = pod.new_pod()
    assert init.returncode == 0 and "journal present" in init.stdout
    assert not any(pod.first_start_dir.iterdir()) and not pod.marker.exists()
