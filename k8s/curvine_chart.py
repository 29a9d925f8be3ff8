"""The Curvine chart: the L2 pool on every GPU node's NVMe, its metadata on durable EBS.

Objects (namespace ``curvine.namespace``, default ``curvine``):

* Primary ("master"): StatefulSet of one on a *static* PersistentVolume for the CDK-created EBS
  volume (``ebs.csi.aws.com``, explicit ext4, reclaim Retain, node affinity to the volume's
  zone), PVC bound to it by name, headless Service, probes, resources, PodDisruptionBudget.
* Workers: DaemonSet on the HyperPod nodes, data on hostPath ``curvine.worker_data_dir`` as one
  SSD tier with a capacity bound.
* ConfigMap ``curvine-cluster.toml`` generated from typed settings (:mod:`k8s.curvine_config`).
* CSI: CSIDriver ``curvine``, controller Deployment (provisioner), node plugin DaemonSet, RBAC,
  and the StorageClass the business lines' RWX PVCs use (its parameters carry the web port to
  the FUSE pods). At run time the node plugin also creates standalone FUSE pods in this
  namespace (privileged, hostNetwork, hostPID); they are not objects of this chart, but their
  resources (Guaranteed QoS) are, through the node plugin's ``STANDALONE_*`` variables.
* Mount lifetime: a ValidatingAdmissionPolicy and its binding that refuse the node plugin's delete
  of a healthy FUSE pod (:mod:`k8s.fuse_pod_guard`).
* NetworkPolicy on the Primary; the egress side in every other namespace: a Kyverno ClusterPolicy
  that generates ``block-curvine-ports``, Kyverno's own namespace's copy, and the admission policy
  that refuses pod-network Pods where it is missing (:mod:`k8s.network_policies`; the business
  lines render theirs, :mod:`k8s.line_chart`).
* The L2 mount watchdog DaemonSet and its ConfigMap and RBAC (:mod:`k8s.mount_watchdog`).
* The node filter of the host-network ports: DaemonSet, ConfigMap and RBAC (:mod:`k8s.node_firewall`).

Plain cdk8s (the Kubernetes L1 classes of :mod:`k8s.kube`); no aws_cdk import, so the same chart renders in
the CDK app (with CDK tokens for the volume ID and zone) and in ``make manifests``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Final

import cdk8s
from k8s.kube import k8s, pod_security_labels
from constructs import Construct

from k8s import names
from platform_config import pod_resources
from k8s.curvine_config import (
    INIT_MARKER, JOURNAL_DIR, JOURNAL_PORT, MASTER_RPC_PORT, MASTER_WEB_PORT, META_DIR, PRIMARY_MOUNT, PRIMARY_ROOT,
    ROCKSDB_DATA_SUBDIR, WORKER_IDENTITY_FIELD, WORKER_RPC_PORT, WORKER_WEB_PORT, fuse_mount_parameters, master_addrs,
    render_cluster_toml,
)
from k8s.fuse_pod_guard import fuse_pod_guard
from k8s.image_digests import curvine_images, image_digests
from k8s.image_digests import enforced as image_digests_enforced
from k8s.csi_node_limits import FUSE_SERVICE_ACCOUNT, csi_node_limits, node_name_claim_available
from k8s.janitor import key_secret_limits
from k8s.kyverno import KYVERNO_NAMESPACE
from k8s.mount_watchdog import L2MountWatchdog
from k8s.node_firewall import NodeFirewall
from k8s.network_policies import (PRIMARY_CLIENT_PORTS, PRIMARY_JOURNAL_PORTS, api_object,
                                  block_curvine_ports_manifest, curvine_egress_generator, curvine_egress_required,
                                  kyverno_generate_rights, vpc_cidr)
from k8s.nodes import (HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE, hyperpod_node_requirements, instance_group_tolerations,
                       system_node_requirements)
from platform_config import PlatformConfig
from platform_config.fields import AZ_NAME_PATTERN

#: Well-known node label of the zone (set by the kubelet on every node, managed node group and
#: HyperPod alike). Chosen over ``topology.ebs.csi.aws.com/zone`` because the scheduler matches
#: a static PV's nodeAffinity against node labels, and the CSI-specific key exists only on nodes
#: where the EBS CSI node plugin has registered, so the PV would fit no node if it had not.
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
#: Filesystem of the Primary's EBS volume; explicit so the CSI driver formats a blank volume
#: the same way every time, and never guesses on an existing one.
PRIMARY_FS_TYPE: Final = "ext4"
#: Kubelet path layout of the Curvine CSI driver (curvine-csi Helm chart, CurvineIO/curvine-helm).
CSI_PLUGIN_DIR: Final = "/var/lib/kubelet/csi-plugins/csi.curvine.io/"
CSI_SOCKET: Final = "/csi/csi.sock"
#: Port of the livenessprobe sidecar's ``/healthz`` (the driver serves no HTTP itself), named
#: ``healthz`` on the plugin container as in upstream's manifests (curvine-csi ``deploy/*.yaml``).
CSI_HEALTH_PORT: Final = 9909
#: ``--timeout`` of csi-provisioner: how long it waits for one ``CreateVolume``/``DeleteVolume``.
#: Curvine's ``CreateVolume`` (curvine-csi v0.3.2-alpha ``controller.go``) runs ``curvine-fuse
#: validate-config`` (30 s bound), then ``curvine-cli fs ls`` and ``fs mkdir -p`` of ``fs-path`` and
#: of the volume; each curvine-cli call is up to four 30 s runs 2 s apart (``ExecuteWithRetry``,
#: ``utils.go``) and ignores the gRPC deadline. With the Primary unreachable it returns its own
#: ``Internal`` error after 30 + 2 x 126 = 282 s; within this timeout the provisioner records that
#: error on the PVC and retries with backoff, instead of a ``DeadlineExceeded`` that it retries while
#: the first call still runs (external-provisioner v5.2.0 ``checkError``). Upstream's
#: ``deploy/deployment.yaml`` uses the same 300 s (docs/sources.md §23).
PROVISIONER_TIMEOUT_S: Final = 300
#: Where the CSI driver and its FUSE client read curvine-cluster.toml (curvine-csi image layout).
CSI_CONF_DIR: Final = "/opt/curvine/conf"
#: Where the curvine image installs Curvine (``CURVINE_HOME``) and its server binary. The image
#: (built from curvine-docker/deploy/Dockerfile_rocky9 by .github/workflows/build-runtime-image.yml)
#: has ENTRYPOINT ``/entrypoint.sh``, which runs ``curvine-server ... 2>&1 | tee
#: $CURVINE_HOME/logs/<service>.out &`` and waits under bash as PID 1 with no trap: SIGTERM never
#: reaches the server (PID 1 ignores signals it has no handler for), and the tee copy grows without
#: bound in the container's writable layer. So our containers run the binary itself
#: (:func:`server_argv`), which handles SIGTERM (docs/sources.md §19).
CURVINE_HOME: Final = "/app/curvine"
CURVINE_SERVER: Final = f"{CURVINE_HOME}/lib/curvine-server"
#: terminationGracePeriodSeconds of the Primary and the Workers. After SIGTERM the server runs its
#: shutdown (orpc ``RpcServer::start0``: stop accepting, shutdown hooks; a Worker's one hook sends
#: ``HeartbeatStatus::End`` so the master drops it at once instead of after its 30 s blacklist
#: interval) and returns from ``main``; that takes well under a second with the Primary reachable.
#: If it is not, the Worker's unregister RPC retries (client ``rpc_retry_max_duration_ms``,
#: 120 s) and the kubelet's SIGKILL ends it here, which loses nothing (the master's heartbeat
#: checker drops a silent Worker anyway). The Kubernetes default (30 s) would do too; 60 s was
#: the chart's value before the servers got SIGTERM, kept.
SERVER_TERMINATION_GRACE_S: Final = 60
#: Seconds the Primary's wrapper waits for the master to create its metadata on a fresh start
#: before giving up on writing the marker (the startup probe allows 5 minutes).
FIRST_START_MARKER_WAIT_S: Final = 300

_TOKEN = re.compile(r"\$\{Token\[[^\]]+\]\}")
_VOLUME_ID = re.compile(r"^vol-[0-9a-f]{8,17}$")
_AZ = re.compile(AZ_NAME_PATTERN)

#: Resources of every container (Primary, Worker, CSI, sidecars, the standalone FUSE pods): one
#: definition shared with the per-node budget of the config check (:mod:`platform_config.pod_resources`).
MASTER_RESOURCES = pod_resources.MASTER_RESOURCES
WORKER_RESOURCES = pod_resources.WORKER_RESOURCES
SIDECAR_RESOURCES = pod_resources.SIDECAR_RESOURCES
CSI_RESOURCES = pod_resources.CSI_RESOURCES
FUSE_POD_RESOURCES = pod_resources.FUSE_POD_RESOURCES


def is_token(value: str) -> bool:
    """True for an unresolved CDK token string (``${Token[...]}``); checked without aws_cdk."""
    return bool(_TOKEN.search(value))


def check_volume_inputs(volume_id: str, availability_zone: str) -> None:
    """Validate the Primary volume's ID and zone (CDK tokens pass; they resolve at deploy).

    Raises:
        ValueError: naming the argument, the bad value and the expected form.
    """
    if not is_token(volume_id) and not _VOLUME_ID.match(volume_id):
        raise ValueError(f"volume_id {volume_id!r} is not an EBS volume ID; expected vol- and 8-17 hex digits")
    if not is_token(availability_zone) and not _AZ.match(availability_zone):
        raise ValueError(f"availability_zone {availability_zone!r} is not a zone name like us-west-2a")


def _q(value: str) -> k8s.Quantity:
    return k8s.Quantity.from_string(value)


def _resources(spec: dict[str, dict[str, str]]) -> k8s.ResourceRequirements:
    return k8s.ResourceRequirements(
        requests={k: _q(v) for k, v in spec.get("requests", {}).items()},
        limits={k: _q(v) for k, v in spec.get("limits", {}).items()},
    )


def _tcp_probe(port: int, *, period: int, failures: int) -> k8s.Probe:
    return k8s.Probe(tcp_socket=k8s.TcpSocketAction(port=k8s.IntOrString.from_number(port)),
                     period_seconds=period, failure_threshold=failures, timeout_seconds=5)


def _tcp_probes(port: int) -> dict[str, k8s.Probe]:
    """Startup, readiness and liveness TCP probes on ``port``, as ``k8s.Container`` keywords.

    Startup allows 5 minutes (60 x 5 s: RocksDB replay of a large namespace, or a Worker
    scanning its blocks); then readiness every 10 s and liveness every 20 s, 3 failures each.
    """
    return {"startup_probe": _tcp_probe(port, period=5, failures=60),
            "readiness_probe": _tcp_probe(port, period=10, failures=3),
            "liveness_probe": _tcp_probe(port, period=20, failures=3)}


def _restricted() -> k8s.SecurityContext:
    """Unprivileged container: no privilege escalation, no Linux capabilities."""
    return k8s.SecurityContext(allow_privilege_escalation=False, privileged=False,
                               capabilities=k8s.Capabilities(drop=["ALL"]),
                               seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault"))


#: Start states of the Primary's volume (below :data:`PRIMARY_ROOT`) and what Curvine
#: v0.3.2-alpha needs in each, with ``format_master = false`` (docs/sources.md §9:
#: ``JournalSystem::require_existing_master_data`` / ``classify_master_data_dir`` in
#: curvine-server ``master/journal/journal_system.rs``). A directory is *empty* when missing, empty,
#: or holding only an empty ``data/``; *rocksdb* when ``data/`` has ``CURRENT`` and a
#: ``MANIFEST-*``; anything else is *invalid*. Keys: (meta, journal, marker present).
PRIMARY_START_STATES: Final = (
    ("rocksdb", "rocksdb", None, "start",
     "normal restart: both RocksDB stores present (writes the marker if missing)"),
    ("empty", "empty", False, "start",
     "fresh volume: Curvine creates both stores itself (no format needed since #953)"),
    ("empty", "empty", True, "refuse",
     "marker present but no metadata: a wiped or foreign volume; starting would silently serve "
     "an empty namespace over Workers that still hold the old blocks"),
    ("rocksdb", "empty", None, "refuse",
     "journal missing: Curvine refuses 'inconsistent or invalid master data directories'"),
    ("empty", "rocksdb", None, "refuse",
     "metadata missing, journal present: Curvine refuses (it does not rebuild meta from the "
     "journal with format_master = false)"),
    ("invalid", None, None, "refuse",
     "non-empty metadata directory that is not a RocksDB store: Curvine refuses"),
    (None, "invalid", None, "refuse",
     "non-empty journal directory that is not a RocksDB store: Curvine refuses"),
)


def _config_check_script(*, conf: str, primary: bool) -> str:
    """Init script: fail loudly on a missing config; on the Primary also classify the volume.

    Curvine falls back to its defaults when it starts without its config file, and those
    defaults format (wipe) the metadata. So the config must exist, be non-empty and keep both
    format flags false, or the pod does not start.

    On the Primary the script classifies the metadata and journal directories exactly as
    Curvine v0.3.2-alpha does (:data:`PRIMARY_START_STATES`) and refuses, with the state and the
    way out in the message, every state Curvine itself would refuse, instead of letting the
    master crash-loop on it. The directories live below the mount root, so the ``lost+found``
    of a fresh ext4 volume (in the root) never makes them look dirty.
    """
    lines = [
        "set -eu",
        f'CONF="{conf}"',
        'if [ ! -s "$CONF" ]; then echo "FATAL: $CONF is missing or empty; refusing to start '
        '(Curvine defaults would format the metadata)" >&2; exit 1; fi',
        "for flag in format_master format_worker; do",
        '  if ! grep -Eq "^${flag}[[:space:]]*=[[:space:]]*false" "$CONF"; then',
        '    echo "FATAL: $CONF must set ${flag} = false (a restart would wipe data)" >&2; exit 1; fi',
        "done",
    ]
    if primary:
        lines += [
            f'ROOT="{PRIMARY_ROOT}"; META="{META_DIR}"; JOURNAL="{JOURNAL_DIR}"; MARK="{INIT_MARKER}"',
            f'DATA="{ROCKSDB_DATA_SUBDIR}"',
            "# Curvine's classify_master_data_dir: rocksdb | empty | invalid.",
            "classify() {",
            '  if [ -f "$1/$DATA/CURRENT" ] && ls "$1/$DATA" 2>/dev/null | grep -q "^MANIFEST-"; then echo rocksdb; return; fi',
            '  if [ ! -e "$1" ]; then echo empty; return; fi',
            '  if [ ! -d "$1" ]; then echo invalid; return; fi',
            '  for e in $(ls -A "$1"); do',
            '    if [ "$e" != "$DATA" ] || [ ! -d "$1/$e" ] || [ -n "$(ls -A "$1/$e")" ]; then echo invalid; return; fi',
            "  done",
            "  echo empty",
            "}",
            'mkdir -p "$ROOT"',
            'm=$(classify "$META"); j=$(classify "$JOURNAL")',
            'echo "start state: meta=$m journal=$j marker=$([ -f "$MARK" ] && echo yes || echo no)"',
            'fix="see docs/l2-cache.md, Recovering the Primary"',
            'case "$m/$j" in',
            "  rocksdb/rocksdb)",
            '    [ -f "$MARK" ] || date -u +%Y-%m-%dT%H:%M:%SZ > "$MARK"',
            '    echo "metadata and journal present: normal start" ;;',
            "  empty/empty)",
            '    if [ -f "$MARK" ]; then',
            '      echo "FATAL: $MARK exists but $META and $JOURNAL are empty: wrong or wiped volume; refusing to start ($fix)" >&2; exit 1',
            "    fi",
            '    echo "fresh volume: the master creates its metadata and journal (format_master stays false)" ;;',
            "  *)",
            '    echo "FATAL: meta=$m journal=$j under $ROOT: Curvine needs both RocksDB stores or both empty; refusing to start ($fix)" >&2',
            "    exit 1 ;;",
            "esac",
        ]
    return "\n".join(lines) + "\n"


def server_argv(service: str, *, conf: str) -> list[str]:
    """The Curvine server's own command line: ``[CURVINE_SERVER, "--service", service, "--conf", conf]``.

    The arguments the image's entrypoint passes (curvine-docker/deploy/entrypoint.sh,
    ``start_service``), without its ``| tee``. ``curvine-server`` (``bin/curvine-server.rs``) takes
    exactly ``--service master|worker`` and ``--conf <file>``; anything else is refused.

    Raises:
        ValueError: ``service`` is neither ``master`` nor ``worker``.
    """
    if service not in ("master", "worker"):
        raise ValueError(f"service {service!r}: allowed values are 'master' and 'worker'")
    return [CURVINE_SERVER, "--service", service, "--conf", conf]


def _master_start_script(*, conf: str) -> str:
    """Command of the Primary's master container: write the marker once, then become the server.

    A background loop writes :data:`INIT_MARKER` as soon as the metadata directory holds a
    RocksDB store (``CURRENT`` in its ``data/``), so a first start that fails before that leaves
    no marker and the next pod is a fresh start again. Then the shell replaces itself (``exec``)
    with :func:`server_argv` ``("master")``: the server takes over the container's PID 1 and
    receives the kubelet's SIGTERM itself (the marker loop, if still running, becomes its child and
    dies with the container).
    """
    return "\n".join([
        "set -eu",
        f'META="{META_DIR}"; MARK="{INIT_MARKER}"',
        'if [ ! -f "$MARK" ]; then',
        "  (",
        "    i=0",
        f"    while [ $i -lt {FIRST_START_MARKER_WAIT_S} ]; do",
        f'      if [ -f "$META/{ROCKSDB_DATA_SUBDIR}/CURRENT" ]; then',
        '        [ -f "$MARK" ] || date -u +%Y-%m-%dT%H:%M:%SZ > "$MARK"; exit 0',
        "      fi",
        "      sleep 1; i=$((i + 1))",
        "    done",
        '    echo "warning: no metadata in $META after start; marker not written" >&2',
        "  ) &",
        "fi",
        f"exec {shlex.join(server_argv('master', conf=conf))}",
    ]) + "\n"


class CurvineChart(cdk8s.Chart):
    """Curvine Primary, Workers, CSI driver, StorageClass, FUSE pod guard and NetworkPolicy.

    Args:
        scope: the cdk8s App (or any construct).
        construct_id: chart id; also the chart name in :func:`k8s.render.render_manifests`.
        platform: validated platform config (``curvine.*``, ``versions.images``, network CIDR).
        volume_id: EBS volume ID of the Primary (``vol-...``) or a CDK token resolving to it.
        availability_zone: zone name of that volume (``us-west-2a``) or a CDK token.

    Raises:
        ValueError: ``curvine.enabled`` is false, or a malformed volume ID or zone.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 volume_id: str, availability_zone: str) -> None:
        if not platform.curvine.enabled:
            raise ValueError("curvine.enabled is false in platform.yaml; the Curvine chart is not built")
        check_volume_inputs(volume_id, availability_zone)
        super().__init__(scope, construct_id, disable_resource_name_hashes=True,
                         labels={"app.kubernetes.io/part-of": "kvcache-l2", "app.kubernetes.io/managed-by": "cdk8s"})
        self.platform = platform
        c = platform.curvine
        self.ns = c.namespace
        self.images = platform.versions.images
        self.namespace_obj = k8s.KubeNamespace(self, "Namespace", metadata=k8s.ObjectMeta(
            name=self.ns,
            # Privileged Pod Security level: the CSI node plugin (FUSE mounts, Bidirectional
            # propagation) and the standalone FUSE pods it creates here (privileged, hostNetwork,
            # hostPID, /dev/fuse) need it, and the Workers run on the host network; every other
            # container in this namespace is restricted. Audit at baseline: the API server's audit log
            # annotates every pod admitted here beyond baseline (the expected ones above).
            labels=pod_security_labels("privileged", f"v{platform.eks.version}", audit="baseline")))
        self._objects: list[cdk8s.ApiObject] = []
        self.config_map = self._add(k8s.KubeConfigMap(self, "Config", metadata=self._meta(names.CURVINE_CONFIG_MAP),
                                                      data={names.CURVINE_CONFIG_FILE: render_cluster_toml(platform)}))
        self._primary(volume_id, availability_zone)
        self._workers()
        self._csi()
        self.storage_class = k8s.KubeStorageClass(
            self, "StorageClass", metadata=k8s.ObjectMeta(name=c.storage_class_name),
            provisioner=names.CSI_DRIVER_NAME,
            # Keys other than master-addrs/fs-path/path-type reach the FUSE pods as curvine-fuse
            # flags (those pods never read our ConfigMap): the FUSE web port, which would
            # otherwise collide with the Worker's on the host network, and the FUSE client's
            # per-call audit log off. No TTL: the FUSE client would copy it into the directories
            # it creates (k8s/curvine_config.py).
            parameters={"master-addrs": master_addrs(platform), "fs-path": c.fs_path, "path-type": "DirectoryOrCreate",
                        **fuse_mount_parameters(platform)},
            # The L2 directory of a deleted line is recomputable cache: delete it with the PVC.
            # No expansion: the driver implements none (ControllerExpandVolume, NodeExpandVolume:
            # Unimplemented) and the claims' requests are nominal and never change
            # (k8s.line_chart.L2_PVC_REQUEST); the janitor enforces each line's l2_size.
            reclaim_policy="Delete", volume_binding_mode="Immediate", allow_volume_expansion=False)
        self._network_policy()
        # Finds and heals dead L2 mounts on every HyperPod node (k8s/mount_watchdog.py).
        self.mount_watchdog: L2MountWatchdog | None = None
        if c.mount_watchdog.enabled:
            self.mount_watchdog = L2MountWatchdog(self, "MountWatchdog", platform=platform)
            self._objects += self.mount_watchdog.objects
        # Closes the host-network Workers' and FUSE pods' ports to all but Curvine's peers (k8s/node_firewall.py).
        self.node_firewall: NodeFirewall | None = None
        if c.node_firewall.enabled:
            self.node_firewall = NodeFirewall(self, "NodeFirewall", platform=platform)
            self._objects += self.node_firewall.objects
        for obj in self._objects:
            obj.add_dependency(self.namespace_obj)

    # --- helpers ------------------------------------------------------------------------------

    def _add(self, obj: cdk8s.ApiObject) -> Any:
        self._objects.append(obj)
        return obj

    def _meta(self, name: str, labels: dict[str, str] | None = None) -> k8s.ObjectMeta:
        return k8s.ObjectMeta(name=name, namespace=self.ns, labels=labels)

    def _config_volume(self) -> k8s.Volume:
        return k8s.Volume(name="config", config_map=k8s.ConfigMapVolumeSource(name=names.CURVINE_CONFIG_MAP))

    def _conf_path(self) -> str:
        return f"{names.CURVINE_CONFIG_DIR}/{names.CURVINE_CONFIG_FILE}"

    def _curvine_env(self, extra: list[k8s.EnvVar]) -> list[k8s.EnvVar]:
        return [k8s.EnvVar(name="CURVINE_CONF_FILE", value=self._conf_path()),
                k8s.EnvVar(name="ORPC_BIND_HOSTNAME", value="0.0.0.0"), *extra]

    def _hyperpod_affinity(self, groups: tuple[str, ...]) -> k8s.Affinity:
        exprs = [k8s.NodeSelectorRequirement(**r) for r in hyperpod_node_requirements(groups)]
        return k8s.Affinity(node_affinity=k8s.NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.NodeSelector(
                node_selector_terms=[k8s.NodeSelectorTerm(match_expressions=exprs)])))

    def _group_tolerations(self, groups: tuple[str, ...]) -> list[k8s.Toleration]:
        return [k8s.Toleration(**t) for t in instance_group_tolerations(self.platform, groups)]

    # --- Primary ------------------------------------------------------------------------------

    def _primary(self, volume_id: str, zone: str) -> None:
        c = self.platform.curvine
        size = _q(f"{c.primary_volume.size_gib}Gi")
        labels = {"app.kubernetes.io/name": "curvine", "app.kubernetes.io/component": "master"}
        self.primary_pv = k8s.KubePersistentVolume(
            self, "PrimaryPv", metadata=k8s.ObjectMeta(name=names.CURVINE_PRIMARY_PV, labels=labels),
            spec=k8s.PersistentVolumeSpec(
                capacity={"storage": size}, access_modes=["ReadWriteOnce"], volume_mode="Filesystem",
                # Retain: deleting the claim must never delete the namespace of the L2 pool.
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",  # static: no provisioner may create or delete it
                csi=k8s.CsiPersistentVolumeSource(driver="ebs.csi.aws.com", volume_handle=volume_id,
                                                  fs_type=PRIMARY_FS_TYPE),
                claim_ref=k8s.ObjectReference(kind="PersistentVolumeClaim", namespace=self.ns,
                                              name=names.CURVINE_PRIMARY_PV),
                node_affinity=k8s.VolumeNodeAffinity(required=k8s.NodeSelector(node_selector_terms=[
                    k8s.NodeSelectorTerm(match_expressions=[
                        k8s.NodeSelectorRequirement(key=ZONE_LABEL, operator="In", values=[zone])])]))))
        self.primary_pvc = self._add(k8s.KubePersistentVolumeClaim(
            self, "PrimaryPvc", metadata=self._meta(names.CURVINE_PRIMARY_PV, labels),
            spec=k8s.PersistentVolumeClaimSpec(
                access_modes=["ReadWriteOnce"], storage_class_name="", volume_name=names.CURVINE_PRIMARY_PV,
                resources=k8s.VolumeResourceRequirements(requests={"storage": size}))))
        self.primary_pvc.add_dependency(self.primary_pv)
        self.service_account = self._add(k8s.KubeServiceAccount(
            self, "ServiceAccount", metadata=self._meta("curvine"), automount_service_account_token=False))
        ports = [("rpc", MASTER_RPC_PORT), ("journal", JOURNAL_PORT), ("web", MASTER_WEB_PORT)]
        self.master_service = self._add(k8s.KubeService(
            self, "MasterService", metadata=self._meta(names.CURVINE_MASTER, labels),
            spec=k8s.ServiceSpec(
                cluster_ip="None", selector=labels,
                # Raft peers and clients resolve the pod before it is Ready.
                publish_not_ready_addresses=True,
                ports=[k8s.ServicePort(name=n, port=p, target_port=k8s.IntOrString.from_number(p), protocol="TCP")
                       for n, p in ports])))
        conf = self._conf_path()
        mounts = [k8s.VolumeMount(name="config", mount_path=names.CURVINE_CONFIG_DIR, read_only=True),
                  k8s.VolumeMount(name="primary", mount_path=PRIMARY_MOUNT)]
        init = k8s.Container(
            name="check-config-and-dirs", image=self.images.curvine, command=["/bin/sh", "-c"],
            args=[_config_check_script(conf=conf, primary=True)], volume_mounts=mounts,
            security_context=_restricted(), resources=_resources(SIDECAR_RESOURCES))
        master = k8s.Container(
            # The wrapper writes the marker once the metadata exists and execs the server, which
            # becomes PID 1 and gets the kubelet's SIGTERM (not the image's entrypoint: CURVINE_HOME).
            name="master", image=self.images.curvine, command=["/bin/sh", "-c"],
            args=[_master_start_script(conf=conf)], working_dir=CURVINE_HOME,
            env=self._curvine_env([k8s.EnvVar(name="CURVINE_MASTER_HOSTNAME",
                                              value=names.cluster_domain_host(self.platform))]),
            ports=[k8s.ContainerPort(name=n, container_port=p, protocol="TCP") for n, p in ports],
            **_tcp_probes(MASTER_RPC_PORT),
            resources=_resources(MASTER_RESOURCES), volume_mounts=mounts, security_context=_restricted())
        self.master = self._add(k8s.KubeStatefulSet(
            self, "Master", metadata=self._meta(names.CURVINE_MASTER, labels),
            spec=k8s.StatefulSetSpec(
                # One Primary: a single EBS volume holds meta + journal. HA needs 3 volumes (odd
                # Raft quorum); FUSE clients stall on failover anyway (Curvine #311).
                replicas=1, service_name=names.CURVINE_MASTER,
                selector=k8s.LabelSelector(match_labels=labels),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels=labels),
                    spec=k8s.PodSpec(
                        service_account_name="curvine", automount_service_account_token=False,
                        # Only where the volume is known to attach: a system node (EC2, the EBS
                        # CSI driver's ec2:AttachVolume) in the volume's zone; never a HyperPod node
                        # (k8s.nodes.system_node_requirements, docs/sources.md §15).
                        affinity=k8s.Affinity(node_affinity=k8s.NodeAffinity(
                            required_during_scheduling_ignored_during_execution=k8s.NodeSelector(
                                node_selector_terms=[k8s.NodeSelectorTerm(match_expressions=[
                                    k8s.NodeSelectorRequirement(**r) for r in system_node_requirements(zone)])]))),
                        # On SIGTERM the master stops accepting RPCs and exits (orpc rpc_server.rs
                        # start0); it has no shutdown hook, so it needs seconds, not 60.
                        termination_grace_period_seconds=SERVER_TERMINATION_GRACE_S,
                        init_containers=[init], containers=[master],
                        volumes=[self._config_volume(),
                                 k8s.Volume(name="primary", persistent_volume_claim=k8s.PersistentVolumeClaimVolumeSource(
                                     claim_name=names.CURVINE_PRIMARY_PV))])))))
        self.master.add_dependency(self.primary_pvc, self.config_map, self.master_service)
        self.master_pdb = self._add(k8s.KubePodDisruptionBudget(
            self, "MasterPdb", metadata=self._meta(names.CURVINE_MASTER, labels),
            # maxUnavailable 1 of 1 replica: planned moves (kubectl drain, node-group and HyperPod
            # updates) may evict the Primary, one disruption at a time. minAvailable 1 of 1 made
            # disruptionsAllowed 0 for ever, so every drain hung. A move costs the L2 tier about a
            # minute (reschedule in the volume's zone, EBS re-attach, RocksDB open): LMCache
            # lookups miss and stores fail meanwhile and requests pay a normal prefill, which is
            # cheaper than a node update that never completes. AlwaysAllow: a Primary that is not
            # Ready (crash loop) never blocks a drain either.
            spec=k8s.PodDisruptionBudgetSpec(max_unavailable=k8s.IntOrString.from_number(1),
                                             unhealthy_pod_eviction_policy="AlwaysAllow",
                                             selector=k8s.LabelSelector(match_labels=labels))))

    # --- Workers ------------------------------------------------------------------------------

    def _workers(self) -> None:
        c = self.platform.curvine
        labels = {"app.kubernetes.io/name": "curvine", "app.kubernetes.io/component": "worker"}
        conf = self._conf_path()
        mounts = [k8s.VolumeMount(name="config", mount_path=names.CURVINE_CONFIG_DIR, read_only=True),
                  k8s.VolumeMount(name="data", mount_path=c.worker_data_dir)]
        init = k8s.Container(
            name="check-config", image=self.images.curvine, command=["/bin/sh", "-c"],
            args=[_config_check_script(conf=conf, primary=False)], volume_mounts=mounts[:1],
            security_context=_restricted(), resources=_resources(SIDECAR_RESOURCES))
        argv = server_argv("worker", conf=conf)
        worker = k8s.Container(
            # The server itself as PID 1 (not the image's entrypoint: CURVINE_HOME): SIGTERM reaches
            # it, and it logs to stdout only (curvine_config.WORKER_LOG_LEVEL).
            name="worker", image=self.images.curvine, command=argv[:1], args=argv[1:], working_dir=CURVINE_HOME,
            env=self._curvine_env([k8s.EnvVar(name="CURVINE_WORKER_HOSTNAME", value_from=k8s.EnvVarSource(
                field_ref=k8s.ObjectFieldSelector(field_path=WORKER_IDENTITY_FIELD)))]),
            ports=[k8s.ContainerPort(name="rpc", container_port=WORKER_RPC_PORT, protocol="TCP"),
                   k8s.ContainerPort(name="web", container_port=WORKER_WEB_PORT, protocol="TCP")],
            **_tcp_probes(WORKER_RPC_PORT),
            resources=_resources(WORKER_RESOURCES), volume_mounts=mounts, security_context=_restricted())
        self.workers = self._add(k8s.KubeDaemonSet(
            self, "Workers", metadata=self._meta(names.CURVINE_WORKER, labels),
            spec=k8s.DaemonSetSpec(
                selector=k8s.LabelSelector(match_labels=labels),
                update_strategy=k8s.DaemonSetUpdateStrategy(type="RollingUpdate", rolling_update=k8s.RollingUpdateDaemonSet(
                    max_unavailable=k8s.IntOrString.from_number(1))),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels=labels),
                    spec=k8s.PodSpec(
                        service_account_name="curvine", automount_service_account_token=False,
                        # Host network: the FUSE pods use it too, and clients connect to the
                        # address a Worker registers (the node IP, CURVINE_WORKER_HOSTNAME). No I/O
                        # is node-local: Curvine matches the client's hostname ("localhost" in the
                        # CSI's FUSE pods, which get no env) against it (curvine_config.local_worker_pairs).
                        host_network=True, dns_policy="ClusterFirstWithHostNet",
                        affinity=self._hyperpod_affinity(c.worker_instance_groups),
                        tolerations=self._group_tolerations(c.worker_instance_groups),
                        # On SIGTERM a Worker unregisters from the master (one RPC) and exits; with
                        # the Primary unreachable that RPC retries past this and the kubelet kills it.
                        termination_grace_period_seconds=SERVER_TERMINATION_GRACE_S,
                        init_containers=[init], containers=[worker],
                        # type Directory, never DirectoryOrCreate: lifecycle/on_create.sh creates
                        # the directory on the instance storage; at a boot where the NVMe mounts
                        # after kubelet, the volume is refused and the Worker waits (FailedMount,
                        # retried) instead of creating the directory on the root volume and
                        # filling it with KV blocks.
                        volumes=[self._config_volume(),
                                 k8s.Volume(name="data", host_path=k8s.HostPathVolumeSource(
                                     path=c.worker_data_dir, type="Directory"))])))))
        self.workers.add_dependency(self.config_map, self.master_service)

    # --- CSI ----------------------------------------------------------------------------------

    def _csi(self) -> None:
        img = self.images
        ctrl_labels = {"app.kubernetes.io/name": "curvine-csi", "app.kubernetes.io/component": "controller"}
        node_labels = {"app.kubernetes.io/name": "curvine-csi", "app.kubernetes.io/component": "node"}
        self.csi_driver = k8s.KubeCsiDriver(
            self, "CsiDriver", metadata=k8s.ObjectMeta(name=names.CSI_DRIVER_NAME),
            spec=k8s.CsiDriverSpec(
                attach_required=False,  # a FUSE file system: nothing to attach, no VolumeAttachment
                pod_info_on_mount=False, volume_lifecycle_modes=["Persistent"],
                fs_group_policy="None"))  # FUSE: no recursive chown of a shared cache on mount
        for sa in (names.CSI_CONTROLLER, names.CSI_NODE):
            self._add(k8s.KubeServiceAccount(self, f"Sa-{sa}", metadata=self._meta(sa)))
        # The FUSE pods' own identity: no binding, no token (curvine-fuse never calls the API
        # server, docs/sources.md §23); upstream runs them under the node plugin's account, whose
        # token can create and delete pods in this privileged namespace.
        self._add(k8s.KubeServiceAccount(self, "Sa-fuse", metadata=self._meta(FUSE_SERVICE_ACCOUNT),
                                         automount_service_account_token=False))
        rule = k8s.PolicyRule
        # Rules of the external-provisioner sidecar (kubernetes-csi/external-provisioner
        # deploy/kubernetes/rbac.yaml, without snapshots and leader election) plus the PV reads
        # of Curvine's controller (DeleteVolume looks up the PV by volume handle).
        ctrl_rules = [
            rule(api_groups=[""], resources=["persistentvolumes"], verbs=["get", "list", "watch", "create", "patch", "delete"]),
            rule(api_groups=[""], resources=["persistentvolumeclaims"], verbs=["get", "list", "watch", "update"]),
            rule(api_groups=["storage.k8s.io"], resources=["storageclasses"], verbs=["get", "list", "watch"]),
            rule(api_groups=[""], resources=["events"], verbs=["list", "watch", "create", "update", "patch"]),
            rule(api_groups=["storage.k8s.io"], resources=["csinodes"], verbs=["get", "list", "watch"]),
            rule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch"]),
            rule(api_groups=["storage.k8s.io"], resources=["volumeattachments"], verbs=["get", "list", "watch"]),
        ]
        # The node plugin reads PVs cluster-wide and emits events; everything it creates (the
        # standalone FUSE pods and their state ConfigMaps) stays in its own namespace, so those
        # rights are a namespaced Role, not cluster-wide as in the upstream chart. No Secrets:
        # the standalone manager (curvine-csi/pkg/csi/standalone_manager.go, node_standalone.go)
        # only gets/lists/creates/deletes Pods and gets/creates/updates its state ConfigMap: those
        # verbs and no others (no watch, no ConfigMap list or delete). RBAC cannot name the state
        # ConfigMaps (one per node: curvine-standalone-state-<node>), so k8s/csi_node_limits.py
        # keeps the writes off every other ConfigMap (the mount watchdog's code among them).
        node_cluster_rules = [
            rule(api_groups=[""], resources=["persistentvolumes"], verbs=["get", "list", "watch"]),
            rule(api_groups=[""], resources=["events"], verbs=["create", "patch"]),
        ]
        node_ns_rules = [
            rule(api_groups=[""], resources=["pods"], verbs=["create", "delete", "get", "list"]),
            rule(api_groups=[""], resources=["configmaps"], verbs=["create", "get", "update"]),
        ]
        for sa, rules in ((names.CSI_CONTROLLER, ctrl_rules), (names.CSI_NODE, node_cluster_rules)):
            role = k8s.KubeClusterRole(self, f"ClusterRole-{sa}", metadata=k8s.ObjectMeta(name=sa), rules=rules)
            binding = k8s.KubeClusterRoleBinding(
                self, f"ClusterRoleBinding-{sa}", metadata=k8s.ObjectMeta(name=sa),
                role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=sa),
                subjects=[k8s.Subject(kind="ServiceAccount", name=sa, namespace=self.ns)])
            binding.add_dependency(role)
        node_role = self._add(k8s.KubeRole(self, "Role-node", metadata=self._meta(names.CSI_NODE), rules=node_ns_rules))
        node_rb = self._add(k8s.KubeRoleBinding(
            self, "RoleBinding-node", metadata=self._meta(names.CSI_NODE),
            role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=names.CSI_NODE),
            subjects=[k8s.Subject(kind="ServiceAccount", name=names.CSI_NODE, namespace=self.ns)]))
        node_rb.add_dependency(node_role)

        socket_env = [k8s.EnvVar(name="ADDRESS", value=CSI_SOCKET)]
        health = k8s.Probe(http_get=k8s.HttpGetAction(path="/healthz", port=k8s.IntOrString.from_string("healthz")),
                           initial_delay_seconds=10, period_seconds=10, timeout_seconds=3, failure_threshold=5)
        conf_env = k8s.EnvVar(name="CURVINE_CONF_FILE", value=f"{CSI_CONF_DIR}/{names.CURVINE_CONFIG_FILE}")
        conf_mount = k8s.VolumeMount(name="config", mount_path=CSI_CONF_DIR, read_only=True)
        node_name_env = k8s.EnvVar(name="NODE_NAME", value_from=k8s.EnvVarSource(
            field_ref=k8s.ObjectFieldSelector(field_path="spec.nodeName")))

        def liveness_sidecar(socket_mount: str) -> k8s.Container:
            return k8s.Container(
                name="liveness-probe", image=img.livenessprobe,
                # --http-endpoint, not --health-port: "(deprecated)" at livenessprobe v2.15.0
                # (cmd/livenessprobe/main.go l.47-49); same listener, all addresses, plus /metrics.
                args=["--csi-address=$(ADDRESS)", f"--http-endpoint=:{CSI_HEALTH_PORT}"], env=socket_env,
                volume_mounts=[k8s.VolumeMount(name=socket_mount, mount_path="/csi")],
                resources=_resources(SIDECAR_RESOURCES), security_context=_restricted())

        namespace_env = k8s.EnvVar(name="KUBERNETES_NAMESPACE", value_from=k8s.EnvVarSource(
            field_ref=k8s.ObjectFieldSelector(field_path="metadata.namespace")))
        controller = k8s.Container(
            name="csi-plugin", image=img.curvine_csi, command=["/opt/curvine/csi"],
            args=["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(NODE_NAME)"],
            # The binary builds a node service in every process, the controller's too, and without
            # MOUNT_MODE it builds the standalone one, which exits (klog.Fatalf) for want of
            # STANDALONE_SERVICE_ACCOUNT: the controller would crash-loop and no PVC would ever be
            # provisioned. Upstream's controller sets "embedded" for this reason (curvine-csi
            # pkg/csi/driver.go NewDriver, deploy/deployment.yaml; docs/sources.md §16).
            env=[k8s.EnvVar(name="CSI_ENDPOINT", value=f"unix://{CSI_SOCKET}"), node_name_env, namespace_env,
                 k8s.EnvVar(name="MOUNT_MODE", value="embedded"), conf_env],
            ports=[k8s.ContainerPort(name="healthz", container_port=CSI_HEALTH_PORT, protocol="TCP")],
            liveness_probe=health, resources=_resources(CSI_RESOURCES),
            volume_mounts=[k8s.VolumeMount(name="socket-dir", mount_path="/csi"), conf_mount],
            # Not privileged: CreateVolume/DeleteVolume only run curvine-cli over RPC (mkdir/rm
            # in Curvine); no mount happens in the controller (upstream chart grants
            # privileged + SYS_ADMIN without needing it).
            security_context=_restricted())
        provisioner = k8s.Container(
            name="csi-provisioner", image=img.csi_provisioner,
            # No --leader-election (default false): the Deployment runs one replica.
            args=["--csi-address=$(ADDRESS)", f"--timeout={PROVISIONER_TIMEOUT_S}s", "--v=2"], env=socket_env,
            volume_mounts=[k8s.VolumeMount(name="socket-dir", mount_path="/csi")],
            resources=_resources(SIDECAR_RESOURCES), security_context=_restricted())
        self.csi_controller = self._add(k8s.KubeDeployment(
            self, "CsiController", metadata=self._meta(names.CSI_CONTROLLER, ctrl_labels),
            spec=k8s.DeploymentSpec(
                replicas=1, selector=k8s.LabelSelector(match_labels=ctrl_labels),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels=ctrl_labels),
                    spec=k8s.PodSpec(
                        service_account_name=names.CSI_CONTROLLER, priority_class_name="system-cluster-critical",
                        affinity=k8s.Affinity(node_affinity=k8s.NodeAffinity(
                            preferred_during_scheduling_ignored_during_execution=[k8s.PreferredSchedulingTerm(
                                weight=100, preference=k8s.NodeSelectorTerm(match_expressions=[
                                    k8s.NodeSelectorRequirement(key=HYPERPOD_NODE_LABEL, operator="NotIn",
                                                                values=[HYPERPOD_NODE_VALUE])]))])),
                        containers=[controller, provisioner, liveness_sidecar("socket-dir")],
                        volumes=[k8s.Volume(name="socket-dir", empty_dir=k8s.EmptyDirVolumeSource()),
                                 k8s.Volume(name="config", config_map=k8s.ConfigMapVolumeSource(
                                     name=names.CURVINE_CONFIG_MAP))])))))
        self.csi_controller.add_dependency(self.config_map)

        fuse = FUSE_POD_RESOURCES
        node_plugin = k8s.Container(
            name="csi-plugin", image=img.curvine_csi, command=["/opt/curvine/csi"],
            args=["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(NODE_NAME)"],
            env=[k8s.EnvVar(name="CSI_ENDPOINT", value=f"unix://{CSI_SOCKET}"), node_name_env, namespace_env,
                 # FUSE runs in standalone pods the plugin creates, so a plugin restart does not
                 # kill the mounts of running inference pods. Those pods are NOT in this chart:
                 # the plugin builds them (standalone_manager.go buildStandalone) as privileged,
                 # hostNetwork, hostPID, with /dev/fuse and a Bidirectional hostPath mount, one
                 # per node and (master-addrs, fs-path), in this namespace, under the
                 # curvine-fuse service account (no rights, no token); hence the namespace's "privileged" Pod
                 # Security level. Their resources come from the STANDALONE_* variables below
                 # (requests = limits: Guaranteed, platform_config/pod_resources.py), and the FUSE pod guard
                 # keeps this plugin from deleting a healthy one (k8s/fuse_pod_guard.py).
                 k8s.EnvVar(name="MOUNT_MODE", value="standalone"),
                 k8s.EnvVar(name="STANDALONE_IMAGE", value=img.curvine_csi),
                 k8s.EnvVar(name="STANDALONE_SERVICE_ACCOUNT", value=FUSE_SERVICE_ACCOUNT),
                 k8s.EnvVar(name="STANDALONE_CPU_REQUEST", value=fuse["cpu_request"]),
                 k8s.EnvVar(name="STANDALONE_CPU_LIMIT", value=fuse["cpu_limit"]),
                 k8s.EnvVar(name="STANDALONE_MEMORY_REQUEST", value=fuse["memory_request"]),
                 k8s.EnvVar(name="STANDALONE_MEMORY_LIMIT", value=fuse["memory_limit"]),
                 conf_env],
            ports=[k8s.ContainerPort(name="healthz", container_port=CSI_HEALTH_PORT, protocol="TCP")],
            liveness_probe=health, resources=_resources(CSI_RESOURCES),
            lifecycle=k8s.Lifecycle(pre_stop=k8s.LifecycleHandler(exec=k8s.ExecAction(
                command=["/bin/sh", "-c", f"rm -f {CSI_SOCKET}"]))),
            volume_mounts=[k8s.VolumeMount(name="plugin-dir", mount_path="/csi"),
                           k8s.VolumeMount(name="kubelet-dir", mount_path="/var/lib/kubelet",
                                           mount_propagation="Bidirectional"),
                           k8s.VolumeMount(name="registration-dir", mount_path="/registration"), conf_mount],
            # Privileged: the only container here that needs it. It performs the FUSE mounts
            # under /var/lib/kubelet that the kubelet then bind-mounts into inference pods, which
            # needs CAP_SYS_ADMIN, /dev/fuse and Bidirectional mount propagation (the API server
            # only accepts Bidirectional for privileged containers).
            security_context=k8s.SecurityContext(privileged=True))
        registrar = k8s.Container(
            name="node-driver-registrar", image=img.csi_node_driver_registrar,
            args=["--csi-address=$(ADDRESS)", "--kubelet-registration-path=$(DRIVER_REG_SOCK_PATH)", "--v=2"],
            env=[*socket_env, k8s.EnvVar(name="DRIVER_REG_SOCK_PATH", value=f"{CSI_PLUGIN_DIR}csi.sock")],
            volume_mounts=[k8s.VolumeMount(name="plugin-dir", mount_path="/csi"),
                           k8s.VolumeMount(name="registration-dir", mount_path="/registration")],
            resources=_resources(SIDECAR_RESOURCES), security_context=_restricted())
        self.csi_node = self._add(k8s.KubeDaemonSet(
            self, "CsiNode", metadata=self._meta(names.CSI_NODE, node_labels),
            spec=k8s.DaemonSetSpec(
                selector=k8s.LabelSelector(match_labels=node_labels),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels=node_labels),
                    spec=k8s.PodSpec(
                        service_account_name=names.CSI_NODE, priority_class_name="system-node-critical",
                        # Every HyperPod node may run an inference pod that mounts the L2 PVC.
                        affinity=self._hyperpod_affinity(()),
                        tolerations=[k8s.Toleration(operator="Exists")],
                        containers=[node_plugin, registrar, liveness_sidecar("plugin-dir")],
                        volumes=[
                            # The driver's own socket directory under the kubelet root (which
                            # stays on the root volume, lifecycle/on_create.sh): created here, as
                            # every CSI node plugin does; the kubelet does not create it.
                            k8s.Volume(name="plugin-dir", host_path=k8s.HostPathVolumeSource(
                                path=CSI_PLUGIN_DIR, type="DirectoryOrCreate")),
                            k8s.Volume(name="kubelet-dir", host_path=k8s.HostPathVolumeSource(
                                path="/var/lib/kubelet", type="Directory")),
                            k8s.Volume(name="registration-dir", host_path=k8s.HostPathVolumeSource(
                                path="/var/lib/kubelet/plugins_registry/", type="Directory")),
                            self._config_volume()])))))
        self.csi_node.add_dependency(self.config_map, self.csi_driver)
        # The guard is in place before the node plugin runs: without it the plugin's first
        # NodeUnpublishVolume may delete the FUSE pod under every other pod of the node.
        # The second policy and binding count what the guard admits (apiserver metrics).
        (self.fuse_pod_guard, self.fuse_pod_guard_binding, self.fuse_pod_guard_admitted,
         self.fuse_pod_guard_admitted_binding) = (
            self._add(obj) for obj in fuse_pod_guard(self, namespace=self.ns, node_service_account=names.CSI_NODE))
        self.csi_node.add_dependency(self.fuse_pod_guard_binding, self.fuse_pod_guard_admitted_binding)
        # And what the plugin's identity may create, delete and write (k8s/csi_node_limits.py).
        self.csi_node_limits, self.csi_node_limits_binding = (
            self._add(obj) for obj in csi_node_limits(self, namespace=self.ns, node_service_account=names.CSI_NODE,
                                                      csi_image=img.curvine_csi,
                                                      require_node_name=node_name_claim_available(self.platform.eks.version)))
        self.csi_node.add_dependency(self.csi_node_limits_binding)
        # Only the platform's images, by digest, in this privileged namespace, once config pins
        # every one of them by digest (k8s/image_digests.py).
        self.image_digests = self.image_digests_binding = None
        if image_digests_enforced(self.platform):
            self.image_digests, self.image_digests_binding = (
                self._add(obj) for obj in image_digests(self, namespace=self.ns,
                                                        images=list(curvine_images(self.platform).values())))
        # What the lines' L2 janitors may create: their chunk-key Secret only (k8s/janitor.py).
        self.janitor_secret_limits, self.janitor_secret_limits_binding = (
            self._add(obj) for obj in key_secret_limits(self))

    # --- NetworkPolicy ------------------------------------------------------------------------

    def _network_policy(self) -> None:
        labels = {"app.kubernetes.io/name": "curvine", "app.kubernetes.io/component": "master"}
        own = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.ns}}}
        tcp = lambda ports: [{"protocol": "TCP", "port": p} for p in ports]  # noqa: E731
        self.master_policy = self._add(api_object(self, "MasterIngress", {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "curvine-master-ingress", "namespace": self.ns},
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"], "ingress": [
                # The journal (Raft) only between masters, all in this namespace.
                {"ports": tcp(PRIMARY_JOURNAL_PORTS), "from": [own]},
                # RPC and web: Curvine's own pods (CSI controller), and the VPC: the host-network
                # Workers and FUSE pods come from node IPs, the AMP scraper (web port) from its ENIs.
                # With the VPC CNI every pod IP is in the VPC too, so this ipBlock cannot keep pods
                # out: the egress policy block-curvine-ports in every other namespace does
                # (k8s.network_policies).
                {"ports": tcp(PRIMARY_CLIENT_PORTS), "from": [own, {"ipBlock": {"cidr": vpc_cidr(self.platform)}}]},
            ]}}))
        # Every other namespace: generated by Kyverno, required at Pod admission; Kyverno's own
        # namespace (which Kyverno leaves out of its own processing) gets its copy here.
        rights = kyverno_generate_rights()
        self.kyverno_generate_rights = self._add(cdk8s.ApiObject(
            self, "KyvernoGenerateRights", api_version=rights["apiVersion"], kind=rights["kind"],
            metadata=rights["metadata"]))
        self.kyverno_generate_rights.add_json_patch(cdk8s.JsonPatch.add("/rules", rights["rules"]))
        self.egress_generator = self._add(api_object(self, "EgressGenerator", curvine_egress_generator(self.ns)))
        self.egress_generator.add_dependency(self.kyverno_generate_rights)
        self.kyverno_egress = self._add(api_object(self, "KyvernoEgress", block_curvine_ports_manifest(KYVERNO_NAMESPACE)))
        policy, binding = curvine_egress_required(self.ns)
        self.egress_required = self._add(api_object(self, "EgressRequired", policy))
        self.egress_required_binding = self._add(api_object(self, "EgressRequiredBinding", binding))
        # The binding last: first the policies it requires exist where the chart can put them.
        self.egress_required_binding.add_dependency(self.egress_required, self.egress_generator, self.kyverno_egress)

