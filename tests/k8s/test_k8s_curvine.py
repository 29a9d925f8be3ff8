"""The Curvine chart: Primary on the static EBS PV, Workers on NVMe, config, CSI, StorageClass."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from tests.k8s.conftest import CURVINE_SAMPLE, VOLUME_ID, ZONE, find, needs_reference

from k8s import curvine_config, names
from k8s.curvine_chart import _config_check_script


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
    assert {m["mountPath"] for m in master["volumeMounts"]} == {"/etc/curvine", "/data"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert master[probe]["tcpSocket"]["port"] == 8995
    assert master["resources"]["requests"]["memory"] and master["resources"]["limits"]["memory"]
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["claimName"] == names.CURVINE_PRIMARY_PV
    assert [c["name"] for c in pod["initContainers"]] == ["check-config-and-dirs"]


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
    assert toml_conf["client"]["ttl_ms"] == 24 * 3600 * 1000 == int(ev.ttl_hours * 3_600_000)
    assert toml_conf["client"]["ttl_action"] == "delete"
    m = toml_conf["master"]
    assert m["enable_quota_eviction"] is True and m["quota_eviction_policy"] == "lru"
    assert (m["quota_eviction_high_rate"], m["quota_eviction_low_rate"]) == (0.8, 0.6)
    assert m["quota_eviction_mode"] == "delete"


@needs_reference
def test_toml_keys_exist_in_the_reference_sample(toml_conf):
    """Keys we share with Curvine's sample config are spelled as in the sample."""
    sample = tomllib.loads(CURVINE_SAMPLE.read_text(encoding="utf-8"))
    for key in ("format_master", "format_worker"):
        assert key in sample and key in toml_conf
    for section, keys in {"master": ["meta_dir", "log"], "journal": ["journal_addrs", "journal_dir"],
                          "worker": ["data_dir", "dir_reserved", "log"]}.items():
        for key in keys:
            assert key in sample[section], f"{section}.{key} not in the sample"
            assert key in toml_conf[section]
    assert set(sample["journal"]["journal_addrs"][0]) == set(toml_conf["journal"]["journal_addrs"][0])
    assert set(toml_conf) <= set(sample) | {"cluster_id", "fuse", "log", "cli", "client"}


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
    }
    svc = find(curvine, "Service", names.CURVINE_MASTER)
    host, port = sc["parameters"]["master-addrs"].split(":")
    assert host.split(".")[1] == svc["metadata"]["name"] and host.split(".")[2] == svc["metadata"]["namespace"]
    assert int(port) in {p["port"] for p in svc["spec"]["ports"]}


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
    assert cluster_resources == {"persistentvolumes", "events"}, "pods/secrets must stay namespaced"
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


# --- the Primary's init script, run for real with /bin/sh ---------------------------------------


def _run_init(tmp_path: Path, conf_text: str | None) -> subprocess.CompletedProcess:
    conf = tmp_path / "curvine-cluster.toml"
    if conf_text is not None:
        conf.write_text(conf_text)
    script = _config_check_script(conf=str(conf), primary=True).replace(
        curvine_config.PRIMARY_ROOT, str(tmp_path / "data" / "curvine"))
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)


GOOD_CONF = "format_master = false\nformat_worker = false\n"


def test_init_refuses_missing_or_formatting_config(tmp_path):
    missing = _run_init(tmp_path, None)
    assert missing.returncode == 1 and "missing or empty" in missing.stderr
    formatting = _run_init(tmp_path, "format_master = true\nformat_worker = false\n")
    assert formatting.returncode == 1 and "format_master = false" in formatting.stderr


def test_init_first_start_then_marker_then_guard(tmp_path):
    root = tmp_path / "data" / "curvine"
    first = _run_init(tmp_path, GOOD_CONF)
    assert first.returncode == 0, first.stderr
    assert root.is_dir() and not (root / ".kvcache-initialized").exists()
    (root / "meta").mkdir()
    (root / "meta" / "CURRENT").write_text("rocksdb")  # what the master leaves behind
    second = _run_init(tmp_path, GOOD_CONF)
    assert second.returncode == 0 and (root / ".kvcache-initialized").exists()
    (root / "meta" / "CURRENT").unlink()  # a wiped or foreign volume
    third = _run_init(tmp_path, GOOD_CONF)
    assert third.returncode == 1 and "wrong or wiped volume" in third.stderr
