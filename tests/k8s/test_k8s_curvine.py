"""The Curvine chart: Primary on the static EBS PV, Workers on NVMe, config, CSI, StorageClass."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from tests.k8s.conftest import CURVINE_SAMPLE, VOLUME_ID, ZONE, find, needs_reference

from k8s import curvine_config, names
from k8s.curvine_chart import CURVINE_SERVER


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
    # One exception: Kyverno's namespace's copy of block-curvine-ports (k8s.network_policies).
    elsewhere = [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"])
                 for o in namespaced if o["metadata"]["namespace"] != "curvine"]
    assert namespaced and elsewhere == [("NetworkPolicy", "block-curvine-ports", "kyverno")]


def test_primary_pv_is_the_cdk_volume_in_its_zone(curvine):
    pv = find(curvine, "PersistentVolume", names.CURVINE_PRIMARY_PV)["spec"]
    assert pv["csi"] == {"driver": "ebs.csi.aws.com", "volumeHandle": VOLUME_ID, "fsType": "ext4"}
    assert pv["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["storageClassName"] == ""
    assert pv["capacity"] == {"storage": "100Gi"}
    (term,) = pv["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]}]
    assert pv["claimRef"] == {"kind": "PersistentVolumeClaim", "namespace": "curvine", "name": names.CURVINE_PRIMARY_PV}


def test_primary_only_on_a_system_node_in_the_volume_zone(curvine):
    """Required, not preferred: the Primary runs only where its EBS volume is known to attach (an EC2
    system node, the EBS CSI driver's ec2:AttachVolume path) and only in the volume's zone, which is the
    PV's zone (docs/sources.md §15). A HyperPod node never matches: it has no system label."""
    sts = find(curvine, "StatefulSet", names.CURVINE_MASTER)
    affinity = _pod(sts)["affinity"]["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in affinity
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kvcache.io/node-role", "operator": "In", "values": ["system"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]}]
    pv = find(curvine, "PersistentVolume", names.CURVINE_PRIMARY_PV)["spec"]
    (pv_term,) = pv["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert pv_term["matchExpressions"][0]["values"] == term["matchExpressions"][1]["values"]
    hyperpod_node = {"sagemaker.amazonaws.com/compute-type": "hyperpod", "topology.kubernetes.io/zone": ZONE}
    assert not all(hyperpod_node.get(e["key"]) in e["values"] for e in term["matchExpressions"])


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
    assert mounts == {"/etc/curvine": "config", "/data": "primary"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert master[probe]["tcpSocket"]["port"] == 8995
    assert master["startupProbe"]["periodSeconds"] * master["startupProbe"]["failureThreshold"] == 300
    assert master["resources"]["requests"]["memory"] and master["resources"]["limits"]["memory"]
    # The wrapper writes the marker in the background, then becomes the server (tests/k8s/
    # test_k8s_server_processes.py runs it).
    assert master["command"] == ["/bin/sh", "-c"] and "args" in master
    assert master["args"][0].rstrip().endswith(
        f"exec {CURVINE_SERVER} --service master --conf /etc/curvine/curvine-cluster.toml")
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"]["claimName"] == names.CURVINE_PRIMARY_PV
    (init,) = pod["initContainers"]
    assert init["name"] == "check-config-and-dirs"
    assert {m["mountPath"] for m in init["volumeMounts"]} == set(mounts)


def test_headless_service_and_pdb(curvine):
    svc = find(curvine, "Service", names.CURVINE_MASTER)["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in svc["ports"]} == {"rpc": 8995, "journal": 8996, "web": 9001}
    pdb = find(curvine, "PodDisruptionBudget", names.CURVINE_MASTER)["spec"]
    sts = find(curvine, "StatefulSet", names.CURVINE_MASTER)
    # Planned moves are allowed (docs: drains must complete); see test_k8s_day_two for the budget.
    assert pdb["maxUnavailable"] == 1 and "minAvailable" not in pdb
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


def test_curvine_quota_eviction_is_off_and_only_the_janitor_deletes(toml_conf, k8s_project, tmp_path):
    """``enable_quota_eviction = false`` written explicitly (Curvine's default in v0.3.2-alpha
    ``master_conf.rs``, but a later release's working quota eviction would delete files beside the
    janitor with its own policy); no other quota-eviction key; the eviction config (the janitor's)
    does not reach Curvine's file at all."""
    from tests.example_config import copy_example_config, edit_yaml

    m = toml_conf["master"]
    assert m["enable_quota_eviction"] is False and curvine_config.ENABLE_QUOTA_EVICTION is False
    assert not [k for k in m if k.startswith("quota_eviction")]
    cfg = copy_example_config(tmp_path / "cfg")
    edit_yaml(cfg / "platform.yaml", lambda d: d["curvine"]["eviction"].update(
        ttl_hours=1, high_watermark=0.95, low_watermark=0.5))
    from platform_config import load_project

    assert curvine_config.render_cluster_toml(load_project(cfg).platform) == \
        curvine_config.render_cluster_toml(k8s_project.platform)


@pytest.mark.parametrize("key, value", [("ttl_action", "delete"), ("quota_eviction", True), ("policy", "lru")])
def test_removed_eviction_keys_say_what_to_do(tmp_path, key, value):
    """The fields that only filled Curvine's quota eviction are gone; an old platform.yaml gets
    one clear error naming the file, the field and what to do, not "unknown key (typo?)"."""
    from tests.example_config import copy_example_config, edit_yaml
    from platform_config import ConfigError, load_project

    cfg = copy_example_config(tmp_path / "cfg")
    edit_yaml(cfg / "platform.yaml", lambda d: d["curvine"]["eviction"].update({key: value}))
    with pytest.raises(ConfigError) as err:
        load_project(cfg)
    (problem,) = err.value.problems
    assert (problem.file, problem.field) == (str(cfg / "platform.yaml"), f"curvine.eviction.{key}")
    assert problem.message.startswith("removed: it set Curvine's ") and "allowed: delete this key" in problem.message
    assert "typo" not in problem.message


#: Keys we write that the reference sample does not show, each checked against the struct that
#: deserializes it (CurvineIO/curvine, curvine-common/src/conf/*.rs and
#: crates/common/curvine-config/src/client_conf.rs; structs are #[serde(default)] without
#: deny_unknown_fields, so a misspelled key would be silently ignored, not rejected).
SOURCE_ONLY_KEYS = {
    "": {"cluster_id"},  # ClusterConf
    "master": {"hostname", "rpc_port", "web_port", "enable_quota_eviction",
               "audit_logging_enabled"},  # MasterConf (master_conf.rs line 81)
    "journal": {"hostname", "rpc_port"},  # JournalConf
    "worker": {"rpc_port", "web_port"},  # WorkerConf
    "client": {"master_addrs"},  # ClientConf (no TTL: test_k8s_day_two)
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


def test_workers_on_hyperpod_nvme(curvine, k8s_project):
    ds = find(curvine, "DaemonSet", names.CURVINE_WORKER)
    pod = _pod(ds)
    (data,) = [v for v in pod["volumes"] if "hostPath" in v]
    # Directory, not DirectoryOrCreate: never created on the root volume when the NVMe is late.
    assert data["hostPath"] == {"path": "/opt/dlami/nvme/curvine-data", "type": "Directory"}
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


def test_only_the_csi_node_plugin_and_the_healing_mount_watchdog_are_privileged(curvine, k8s_project):
    """Both act on mounts in the host's mount namespace (FUSE binds; the lazy unmount of a dead bind).
    The watchdog only while ``curvine.mount_watchdog.heal`` (tests/k8s/test_k8s_mount_watchdog.py)."""
    assert k8s_project.platform.curvine.mount_watchdog.heal
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
    assert privileged == {(names.CSI_NODE, "csi-plugin"), (names.L2_MOUNT_WATCHDOG, "watchdog")}
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
        # The FUSE pods' web port (--web-port 9003), apart from the Worker's 9002 on the host.
        "web-port": "9003",
        # Curvine client timeouts (--client.*): an absent Primary costs an operation at most 3 s
        # (tests/k8s/test_k8s_l2_faults.py).
        **{f"client.{k}": v for k, v in (("conn-timeout-ms", "250"), ("rpc-timeout-ms", "1000"),
                                         ("data-timeout-ms", "1000"), ("rpc-retry-max-duration-ms", "500"),
                                         ("rpc-retry-min-sleep-ms", "50"), ("rpc-retry-max-sleep-ms", "200"),
                                         ("conn-retry-max-duration-ms", "500"))},
        # No INFO audit line per file-system call in the FUSE pods' logs.
        "client.audit-logging-enabled": "false",
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


def _env_values(container) -> dict[str, str | None]:
    """Plain env values of a container; a ``valueFrom`` entry reads as None (set, value from the API)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_every_csi_plugin_process_starts(curvine):
    """What curvine-csi v0.3.2-alpha's ``NewDriver`` needs to start (driver.go l.57-84, docs/sources.md §9):
    ``MOUNT_MODE`` unset means standalone, which exits without ``STANDALONE_SERVICE_ACCOUNT``. The
    controller runs embedded, as upstream's does (it mounts nothing; standalone would also run a FUSE-pod
    garbage collector there); the node plugin runs standalone under an account of this chart."""
    accounts = {o["metadata"]["name"] for o in curvine if o["kind"] == "ServiceAccount"}
    modes = {}
    for kind, name in (("Deployment", names.CSI_CONTROLLER), ("DaemonSet", names.CSI_NODE)):
        plugin = _container(find(curvine, kind, name), "csi-plugin")
        assert plugin["command"] == ["/opt/curvine/csi"]
        env = _env_values(plugin)
        mode = env.get("MOUNT_MODE") or "standalone"  # NewDriver's default
        assert mode in ("embedded", "standalone"), (name, mode)
        if mode == "standalone":
            assert env.get("STANDALONE_SERVICE_ACCOUNT") in accounts, name
        assert "KUBERNETES_NAMESPACE" in env, name  # else "curvine", whatever curvine.namespace says
        modes[name] = mode
    assert modes == {names.CSI_CONTROLLER: "embedded", names.CSI_NODE: "standalone"}


def test_master_network_policy(curvine, k8s_project):
    """The journal port only from Curvine's namespace; RPC and web also from the VPC (host-network
    Workers and FUSE pods, the scraper). The reach of every namespace: tests/k8s/test_k8s_reach.py."""
    pol = find(curvine, "NetworkPolicy", "curvine-master-ingress")["spec"]
    assert pol["policyTypes"] == ["Ingress"]
    sts = find(curvine, "StatefulSet", names.CURVINE_MASTER)
    assert pol["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
    own = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "curvine"}}}
    journal, clients = pol["ingress"]
    assert [p["port"] for p in journal["ports"]] == [8996] and journal["from"] == [own]
    assert sorted(p["port"] for p in clients["ports"]) == [8995, 9001]
    assert clients["from"] == [own, {"ipBlock": {"cidr": k8s_project.platform.network.cidr}}]




def _host_paths(obj, where: str = ""):
    """Every ``hostPath`` volume source anywhere in a manifest: ``(where, hostPath)``."""
    if isinstance(obj, dict):
        if isinstance(obj.get("hostPath"), dict):
            yield where, obj["hostPath"]
        for key, value in obj.items():
            yield from _host_paths(value, f"{where}/{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _host_paths(value, f"{where}/{i}")


def test_no_host_path_of_ours_is_created_on_a_late_mount(manifests):
    """Every hostPath in every chart: under the instance-store mounts (where lifecycle/on_create.sh
    prepares the directory), type Directory, so a pod started before the mount waits instead of
    creating the directory on the root volume; a creating type only under the kubelet root, which
    stays on the root volume by design (lifecycle/on_create.sh, step 3)."""
    from stacks.hyperpod_stack import INSTANCE_STORE_MOUNTS

    found = [(f"{o['kind']}/{o['metadata']['name']}{w}", hp) for objs in manifests.values() for o in objs
             for w, hp in _host_paths(o)]
    assert any(hp["path"] == "/opt/dlami/nvme/curvine-data" for _, hp in found)  # the check sees the Worker
    for where, hp in found:
        if any(hp["path"] == m or hp["path"].startswith(m + "/") for m in INSTANCE_STORE_MOUNTS):
            assert hp.get("type") == "Directory", (where, hp)
        elif hp.get("type") in (None, "", "DirectoryOrCreate", "FileOrCreate"):
            assert hp["path"].startswith("/var/lib/kubelet/"), (where, hp)


def test_instance_group_tolerations_are_one_rule_for_every_consumer(manifests, k8s_project, tmp_path):
    """k8s.nodes.instance_group_tolerations: each configured taint once (Equal, with its value),
    filtered by group; the Curvine Workers, each line's L2 janitor and the DCGM exporter's Helm
    values all use it (they were three hand-written copies that disagreed)."""
    from k8s import janitor as janitor_chart
    from k8s.nodes import instance_group_tolerations
    from observability.cluster_objects import dcgm_exporter_values
    from platform_config import load_project
    from tests.example_config import copy_example_config, edit_yaml

    cfg = copy_example_config(tmp_path / "cfg")
    taint = {"key": "kvcache.io/large-model", "value": "true", "effect": "PreferNoSchedule"}
    other = {"key": "example.com/gpu", "value": "", "effect": "PreferNoSchedule"}  # a taint without value

    def taint_all(d):
        for group in d["hyperpod"]["instance_groups"]:
            group["taints"] = [taint, other]
            group.pop("deep_health_checks", None)  # HyperPod: no taints with deep health checks

    edit_yaml(cfg / "platform.yaml", taint_all)
    platform = load_project(cfg).platform
    groups = [g.name for g in platform.hyperpod.instance_groups]
    assert len(groups) >= 2
    expected = [{**taint, "operator": "Equal"}, {**other, "operator": "Equal"}]
    assert instance_group_tolerations(platform) == expected  # the same taint on two groups: once
    assert instance_group_tolerations(platform, (groups[0],)) == expected
    assert instance_group_tolerations(platform, ("no-such-group",)) == []
    # Every consumer renders exactly the helper's list (the fixture config: p5's one taint).
    rule = instance_group_tolerations(k8s_project.platform)
    assert rule == [{"key": "kvcache.io/large-model", "operator": "Equal", "value": "true",
                     "effect": "PreferNoSchedule"}]
    workers = _pod(find(manifests["curvine"], "DaemonSet", names.CURVINE_WORKER))["tolerations"]
    assert workers == rule  # worker_instance_groups is empty: every group
    for line in k8s_project.business_lines:
        for obj in manifests[names.line_chart_name(line)]:
            if obj["kind"] == "Deployment" and obj["metadata"]["name"] == janitor_chart.NAME:
                pod = _pod(obj)
                assert pod["tolerations"] == rule
                (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                    "nodeSelectorTerms"]
                assert term["matchExpressions"] == [
                    {"key": "sagemaker.amazonaws.com/compute-type", "operator": "In", "values": ["hyperpod"]}]
    assert dcgm_exporter_values(k8s_project.platform)["tolerations"] == rule
