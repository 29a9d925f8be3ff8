"""``curvine-cluster.toml`` generated from the typed platform config.

Key names follow Curvine's ``ClusterConf`` (``curvine-common/src/conf/*.rs``) as shown by the
sample ``curvine/curvine-cluster.toml`` of CurvineIO/curvine at bff4e7dc (``format_master``,
``format_worker``, ``[master] meta_dir``, ``[journal] journal_addrs / journal_dir``,
``[worker] data_dir``, ``log`` tables) and by curvine-doc's configuration reference (``rpc_port``,
``web_port``, ``[client] master_addrs / ttl_ms / ttl_action``, ``[master] enable_quota_eviction``).

No TTL anywhere in Curvine (docs/sources.md §9, Curvine v0.3.2-alpha). This file is read by
the CSI controller (``CURVINE_CONF_FILE``), whose ``CreateVolume`` creates ``fs_path`` and every
PV directory with ``curvine-cli fs mkdir -p``; ``mkdir`` copies the client ``ttl_ms`` /
``ttl_action`` into the new directory's storage policy (``MkdirOptsBuilder::with_conf``), expiry
is by mtime and the TTL executor deletes recursively: a client TTL here deleted ``/kvcache`` and
every line's directory about a day after their last change. The FUSE client's ``mkdir`` does
the same with *its* client TTL (``curvine-fuse`` ``curvine_file_system.rs``), so a TTL passed to
the FUSE pods would also stamp the directories LMCache creates through the mount (the model
directory, the per-pod ``.tmp-*`` directory) and delete them, with every chunk, once a line is
idle for one TTL. Curvine's quota eviction, the other consumer of a TTL, is a no-op in v0.3.2
and is rendered off (:data:`ENABLE_QUOTA_EVICTION`). So the age bound
(``curvine.eviction.ttl_hours``) and the capacity bound of each line are enforced on chunk
*files* only, by the line's L2 janitor (:mod:`cluster_agents.l2_janitor`), the only thing that deletes.

Every port is written explicitly: Curvine's defaults moved between releases (v0.3.2-alpha:
master web 9000, worker web 9001, FUSE web 9002; later code: 9001/9002/9003), and the Service,
probes, NetworkPolicies and clients must agree with the servers. The standalone FUSE pods never
read this file, so their web port also travels as a StorageClass parameter
(:func:`fuse_mount_parameters`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Mapping

import tomli_w

from cluster_agents.node_firewall import METRICS_PORT as NODE_FIREWALL_METRICS_PORT
from k8s import names
from platform_config import PlatformConfig

#: Curvine ports, all set explicitly (defaults: docs/sources.md §4 and §9, ``cluster_conf.rs``).
#: Worker and FUSE pods share the node's network namespace (hostNetwork), so every listener of
#: both must be distinct on a node: :func:`node_host_listeners` lists them.
MASTER_RPC_PORT: Final = 8995
JOURNAL_PORT: Final = 8996
WORKER_RPC_PORT: Final = 8997
MASTER_WEB_PORT: Final = 9001
WORKER_WEB_PORT: Final = 9002
FUSE_WEB_PORT: Final = 9003
CURVINE_PORTS: Final = (MASTER_RPC_PORT, JOURNAL_PORT, WORKER_RPC_PORT, MASTER_WEB_PORT, WORKER_WEB_PORT,
                        FUSE_WEB_PORT)

#: Mount point of the Primary's EBS volume inside the master container. Curvine's directories
#: live *below* it: an ext4 root holds ``lost+found``, and a master refuses a non-empty
#: directory that is not its own.
PRIMARY_MOUNT: Final = "/data"
PRIMARY_ROOT: Final = f"{PRIMARY_MOUNT}/curvine"
META_DIR: Final = f"{PRIMARY_ROOT}/meta"
JOURNAL_DIR: Final = f"{PRIMARY_ROOT}/journal"
#: Written once the metadata directory holds a RocksDB store; from then on an empty metadata
#: directory means a wrong or wiped volume and the Primary refuses to start.
INIT_MARKER: Final = f"{PRIMARY_ROOT}/.kvcache-initialized"
#: Sub-directory of ``meta_dir`` / ``journal_dir`` where Curvine keeps the RocksDB files
#: (``DBConf::set_dir``: ``<dir>/data``, ``DBConf::DATA_DIR``; checkpoints in ``<dir>/checkpoint``).
ROCKSDB_DATA_SUBDIR: Final = "data"

#: Raft id of the single Primary.
JOURNAL_ID: Final = 1

#: ``[master] enable_quota_eviction``, written explicitly although it is Curvine's default
#: (``false`` in ``MasterConf::default``, curvine-common ``src/conf/master_conf.rs`` at
#: v0.3.2-alpha; ``QuotaManager::is_eviction_enabled`` reads it, ``quota_manager.rs``): each
#: line's L2 janitor is the one thing that deletes chunks. In v0.3.2 quota eviction deletes only
#: files whose TTL expired, and no file carries a TTL (docs/sources.md §9); a later Curvine whose
#: quota eviction works would otherwise delete files beside the janitor, by a policy of its own
#: and with watermarks over the whole pool rather than per line. Off also keeps the master's
#: eviction LRU (``quota_eviction_capacity``, 5 million entries) empty (``evictor.rs``
#: ``on_access`` returns early).
ENABLE_QUOTA_EVICTION: Final = False


#: Log level of the Primary's master (``[master] log.level``). Curvine sets one level per process
#: (orpc ``common/logger.rs``: ``Level::from_str(level)``, a bad value silently INFO; ``targets``
#: only routes modules to files, it sets no level). The master's only per-request INFO line is
#: its audit line (``rpc_context.rs`` ``audit_log``, one per metadata RPC), which
#: :data:`MASTER_AUDIT_LOGGING` turns off; its other INFO lines are events (start, restore, Worker
#: registered or unregistered, snapshots), so INFO stays bounded and keeps them.
MASTER_LOG_LEVEL: Final = "info"
#: ``[master] audit_logging_enabled`` (``MasterConf`` default ``true``, ``master_conf.rs``).
MASTER_AUDIT_LOGGING: Final = False
#: Log level of the Workers (``[worker] log.level``). A Worker logs two INFO lines for every block
#: it reads and two for every block it writes (``read_handler.rs`` ``open``/``complete``,
#: ``write_handler.rs`` ``open``/``complete``): for the L2 tier, four lines per chunk file stored
#: and read back, about 400 bytes (:mod:`k8s.curvine_logs`). WARN keeps what a Worker says about
#: faults (slow disk I/O, failed reads and writes, errors) and drops those.
WORKER_LOG_LEVEL: Final = "warn"
#: ``log_dir`` of every server log: Curvine writes to stdout for ``"stdout"`` (or ``""``),
#: anything else is a directory of rolling files (``Logger::create_writer_named``), which would sit
#: in the container's writable layer. The container runtime keeps stdout in files the kubelet
#: rotates (``containerLogMaxSize`` 10 Mi x ``containerLogMaxFiles`` 5 by default).
LOG_TO_STDOUT: Final = "stdout"


#: StorageClass parameter key that becomes the FUSE pods' ``--web-port`` flag (``FuseMountArgs``
#: ``web_port`` in curvine-fuse ``cli/mount_args.rs``; the CSI forwards every non-reserved key
#: ``k`` as ``--k <value>``, curvine-csi ``pkg/csi/fuse_cli.go``). Without it a FUSE pod binds
#: ``DEFAULT_FUSE_WEB_PORT`` (9002 in v0.3.2-alpha), the Workers' web port on the same host.
FUSE_WEB_PORT_PARAMETER: Final = "web-port"
#: StorageClass parameter that becomes ``--client.audit-logging-enabled false`` on the FUSE pods
#: (``ClientConf`` field with ``#[client_cli]``, curvine-common ``conf/client_conf.rs``; the flag's
#: spelling is in ``tests/client_conf_cli_test.rs``). Curvine's default is ``true``: the FUSE
#: client logs one INFO audit line per file-system call (``unified_filesystem.rs`` ``audit``), and
#: the FUSE pods log at Curvine's default INFO (no flag sets their level). The kubelet rotates
#: those logs, so this bounds their churn, not their disk use.
FUSE_CLIENT_AUDIT_PARAMETER: Final = "client.audit-logging-enabled"


@dataclass(frozen=True)
class ClientTimeouts:
    """The Curvine client's timeouts and RPC retry window, in ms (``[client]`` of ``ClientConf``,
    curvine-common ``src/conf/client_conf.rs`` at v0.3.2-alpha; docs/sources.md §18).

    Meaning, from orpc at the same tag: ``conn_timeout_ms`` bounds one TCP connect
    (``RawClient::conn``); ``rpc_timeout_ms`` one request to the Primary and ``data_timeout_ms``
    one to a Worker (``ClusterConnector``, ``BlockClient``); a failed request to the Primary is
    retried with sleeps from ``rpc_retry_min_sleep_ms`` doubling up to ``rpc_retry_max_sleep_ms``
    until ``rpc_retry_max_duration_ms`` has passed (``TimeBondedRetry``, ``io_retry_*`` in orpc's
    ``ClientConf``); ``conn_retry_max_duration_ms`` bounds ``RawClient::conn_retry``, which
    nothing calls at this tag (set all the same, so a Curvine that starts using it keeps the
    bound). The FUSE client then answers the operation with ``EIO`` (``FuseError::from``,
    ``curvine-fuse/src/fuse_error.rs``); curvine-fuse has no timeout of its own, and the kernel's
    FUSE request has none either, so these settings are what ends a wait on an absent Primary.
    """

    conn_timeout_ms: int
    rpc_timeout_ms: int
    data_timeout_ms: int
    rpc_retry_max_duration_ms: int
    rpc_retry_min_sleep_ms: int
    rpc_retry_max_sleep_ms: int
    conn_retry_max_duration_ms: int

    def parameters(self) -> dict[str, str]:
        """StorageClass parameters, one per field: ``client.<field with '-' for '_'>`` -> ms.

        curvine-fuse v0.3.2-alpha takes every ``#[client_cli]`` field of ``ClientConf`` as the
        flag ``--client.<kebab name>`` (``ClientCliArgs``, curvine-common ``macros/src/
        client_cli.rs`` ``cli_long_name``: prefix ``client``, ``_`` -> ``-``), flattened into its
        mount arguments (``FuseRuntimeArgs``, ``curvine-fuse/src/cli/mount_args.rs``), and the CSI
        passes the parameter ``k`` as ``--k <value>``.
        """
        return {f"client.{name.replace('_', '-')}": str(getattr(self, name)) for name in self.__dataclass_fields__}

    def master_op_bound_ms(self) -> int:
        """The longest one FUSE operation waits on an unreachable Primary, in ms.

        ``ClusterConnector::rpc`` (orpc ``src/client/cluster_connector.rs``) first tries the
        known leader once, then retries every Primary until the retry window closes; each attempt
        connects (at most ``conn_timeout_ms``) and waits for the answer (at most
        ``rpc_timeout_ms``), and the last attempt may start just before the window closes
        (``TimeBondedRetry::attempt`` sleeps at most until the window's end, then lets one more
        attempt run). So: leader attempt + window + last attempt. A Primary that refuses
        connections fails each attempt at once (about ``rpc_retry_max_duration_ms``); a
        black-holed one costs ``conn_timeout_ms`` per attempt; a hung one ``rpc_timeout_ms``.
        """
        attempt = self.conn_timeout_ms + self.rpc_timeout_ms
        return attempt + self.rpc_retry_max_duration_ms + attempt


#: Curvine v0.3.2-alpha's defaults (``ClientConf::default``, client_conf.rs), for comparison: an
#: operation could wait 150 s + 120 s + 150 s = 420 s on an absent Primary.
CURVINE_DEFAULT_CLIENT_TIMEOUTS: Final = ClientTimeouts(
    conn_timeout_ms=30_000, rpc_timeout_ms=120_000, data_timeout_ms=120_000, rpc_retry_max_duration_ms=120_000,
    rpc_retry_min_sleep_ms=100, rpc_retry_max_sleep_ms=10_000, conn_retry_max_duration_ms=60_000)

#: What the FUSE pods run with. A connect inside the VPC takes well under a millisecond, so 250 ms
#: only gives up on a Primary that is not there (a lost SYN is left to the retry); 1,000 ms per
#: request leaves room for the Primary's slowest legitimate answers (a janitor listing a large
#: directory, a burst of creates), not measured against a real Primary here; 500 ms of retries
#: rides out a connection reset without waiting for a Primary that is being rescheduled (a drain
#: takes about a minute, docs/l2-cache.md). Bound: 1,250 + 500 + 1,250 = 3,000 ms per operation
#: (:meth:`ClientTimeouts.master_op_bound_ms`), the ``hang`` the fault tier models. A request
#: does not wait that long: LMCache's own timeouts end its wait first (``platform.lmcache``);
#: this bound is how long a stuck LMCache thread, and a janitor pass, stay stuck.
FUSE_CLIENT_TIMEOUTS: Final = ClientTimeouts(
    conn_timeout_ms=250, rpc_timeout_ms=1_000, data_timeout_ms=1_000, rpc_retry_max_duration_ms=500,
    rpc_retry_min_sleep_ms=50, rpc_retry_max_sleep_ms=200, conn_retry_max_duration_ms=500)


def fuse_master_op_bound_ms() -> int:
    """:meth:`ClientTimeouts.master_op_bound_ms` of :data:`FUSE_CLIENT_TIMEOUTS`: 3,000 ms."""
    return FUSE_CLIENT_TIMEOUTS.master_op_bound_ms()


def fuse_mount_parameters(platform: PlatformConfig) -> dict[str, str]:
    """StorageClass parameters the CSI passes to ``curvine-fuse`` as flags:
    ``{"web-port": "9003", "client.audit-logging-enabled": "false"}`` and the client timeouts
    (:data:`FUSE_CLIENT_TIMEOUTS`, ``client.conn-timeout-ms`` ...).

    The node plugin starts ``curvine-fuse --master-addrs .. --fs-path .. --mnt-path ..`` in
    standalone pods that do not mount our ConfigMap (no ``--conf``: ``buildFuseArgs`` in
    curvine-csi ``standalone_manager.go``; curvine-fuse then reads the CSI image's own
    ``conf/curvine-cluster.toml``, whose ``[client]`` and ``[fuse]`` are empty, so Curvine's
    defaults apply), plus ``--<key> <value>`` for every StorageClass parameter other than the
    reserved ones (``CollectPassthroughParams``). Deliberately *no*
    ``client.ttl-*`` keys: the FUSE client copies its TTL into every directory it creates
    (module docstring).
    """
    del platform  # one StorageClass, one FUSE pod per node and mount key: one port suffices
    return {FUSE_WEB_PORT_PARAMETER: str(FUSE_WEB_PORT), FUSE_CLIENT_AUDIT_PARAMETER: "false",
            **FUSE_CLIENT_TIMEOUTS.parameters()}


#: Where a Worker's identity comes from: ``CURVINE_WORKER_HOSTNAME`` from the Pod's ``status.hostIP``
#: (the node's IP; the Worker uses the host network). A Worker registers with ``hostname`` and
#: ``ip_addr`` both set to it (``worker_server.rs`` ``WorkerAddress``), and clients connect to
#: ``ip_addr`` (``WorkerAddress::inet_addr``), so it must be an address every node can reach.
WORKER_IDENTITY_FIELD: Final = "status.hostIP"
#: The identity a FUSE client presents when nothing sets one: ``ClientConf::default`` hostname is
#: ``ClusterConf::DEFAULT_HOSTNAME``, the literal ``"localhost"`` (``client_conf.rs``,
#: ``cluster_conf.rs``); nothing resolves it to the machine's name. ``CURVINE_CLIENT_HOSTNAME``
#: would set it, but the CSI driver's standalone FUSE pods get no environment
#: (``standalone_manager.go`` ``buildStandalone``).
FUSE_CLIENT_DEFAULT_HOSTNAME: Final = "localhost"
#: The one other way to set it: a ``--client.hostname`` flag, i.e. a StorageClass parameter, the same
#: for every node (the CSI passes the PV's parameters unchanged, ``fuse_cli.go``
#: ``CollectPassthroughParams``). The chart never sets it (:func:`local_worker_pairs`).
FUSE_CLIENT_HOSTNAME_PARAMETER: Final = "client.hostname"


def fuse_client_hostname(parameters: Mapping[str, str]) -> str:
    """The hostname a standalone FUSE pod's client presents for a StorageClass's ``parameters``:
    the ``client.hostname`` parameter if set (``--client.*`` flags override the config file,
    ``FuseRuntimeArgs::get_conf``), else :data:`FUSE_CLIENT_DEFAULT_HOSTNAME`. The same on
    every node."""
    return parameters.get(FUSE_CLIENT_HOSTNAME_PARAMETER, FUSE_CLIENT_DEFAULT_HOSTNAME)


def local_worker_pairs(worker_hostnames: Mapping[str, str], client_hostnames: Mapping[str, str]) -> set[tuple[str, str]]:
    """Which (client node, Worker node) pairs Curvine treats as local, from each node's Worker
    and FUSE client hostname: ``WorkerAddress::is_local`` compares the two strings, and both the
    master's choice of a Worker for a new block (``LocalWorkerPolicy``) and the client's read
    order and short-circuit (``BlockReader::sort_locs``, ``FsContext::is_local_worker``) use it.

    Node-local I/O needs exactly ``{(n, n) for every node n}``. A pair ``(a, b)`` with ``a != b``
    is worse than none: the master would put node ``a``'s new blocks on node ``b``'s Worker, and
    ``a``'s client would try to open ``b``'s block files by path (short-circuit, on by default).
    """
    return {(client_node, worker_node) for client_node, client in client_hostnames.items()
            for worker_node, worker in worker_hostnames.items() if worker == client}


@dataclass(frozen=True)
class HostListener:
    """One TCP port a host-network process binds on a GPU node."""

    owner: str
    listener: str
    port: int
    source: str


#: Node-level listeners on every EKS/HyperPod node that are not ours: the kubelet API and
#: kube-proxy's health check (Kubernetes "Ports and Protocols"), and the HyperPod ai-toolkit
#: endpoint of Tiered Storage (``sagemaker-hyperpod://$(NODE_IP):9200``, docs/sources.md §1).
NODE_LISTENERS: Final = (
    HostListener("kubelet", "api", 10250, "Kubernetes Ports and Protocols"),
    HostListener("kube-proxy", "healthz", 10256, "Kubernetes Ports and Protocols"),
)
AI_TOOLKIT_LISTENER: Final = HostListener("ai-toolkit", "tiered-storage", 9200, "docs/sources.md §1 (blog)")
#: Service NodePorts are opened by kube-proxy on every node (default range 30000-32767).
NODE_PORT_RANGE: Final = (30000, 32767)


def node_host_listeners(platform: PlatformConfig) -> list[HostListener]:
    """Every listener of every host-network process on a GPU node, ours and the node's own.

    Ours: the Curvine Worker (``worker.rpc_port``, ``worker.web_port``: ``worker_server.rs``
    starts exactly an RPC and a web server) and the CSI's standalone FUSE pod (only its web
    server, ``mount_run.rs``; one pod per node and mount key, so one port per StorageClass) and the
    node filter's agent (its metrics, when ``curvine.node_firewall.enabled``). Theirs: :data:`NODE_LISTENERS`, and :data:`AI_TOOLKIT_LISTENER` when Tiered Storage is on.
    The Curvine Primary and the CSI pods use the pod network and are not listed.
    """
    listeners = [
        HostListener(names.CURVINE_WORKER, "rpc", WORKER_RPC_PORT, "[worker] rpc_port"),
        HostListener(names.CURVINE_WORKER, "web", WORKER_WEB_PORT, "[worker] web_port"),
        HostListener("curvine-fuse (standalone)", "web",
                     int(fuse_mount_parameters(platform)[FUSE_WEB_PORT_PARAMETER]),
                     f"StorageClass parameter {FUSE_WEB_PORT_PARAMETER}"),
        *NODE_LISTENERS,
    ]
    if platform.curvine.node_firewall.enabled:
        listeners.append(HostListener(names.NODE_FIREWALL, "metrics", NODE_FIREWALL_METRICS_PORT,
                                      "cluster_agents/node_firewall.py METRICS_PORT"))
    if platform.hyperpod.tiered_storage.enabled:
        listeners.append(AI_TOOLKIT_LISTENER)
    return listeners


@dataclass(frozen=True)
class WorkerTier:
    """One Worker data directory: storage tier, capacity bound and path on the node."""

    tier: str
    capacity_gib: int
    path: str

    def render(self) -> str:
        """Curvine's ``[TIER:SIZE]path`` form, e.g. ``[SSD:2000GB]/opt/dlami/nvme/curvine-data``.

        Curvine parses sizes with orpc's byte units, which are binary (1 GB = 2^30 bytes), so
        ``capacity_gib`` is written with the ``GB`` suffix unchanged.
        """
        return f"[{self.tier}:{self.capacity_gib}GB]{self.path}"


def worker_tier(platform: PlatformConfig) -> WorkerTier:
    """The Workers' single SSD tier on node-local NVMe, bounded by ``curvine.worker_capacity_gib``."""
    c = platform.curvine
    return WorkerTier("SSD", c.worker_capacity_gib, c.worker_data_dir)


def cluster_conf(platform: PlatformConfig) -> dict[str, Any]:
    """The configuration as a dict (the shape of ``curvine-cluster.toml``).

    ``[client]`` carries no ``ttl_ms`` / ``ttl_action`` (Curvine's defaults ``0`` / ``none``):
    the CSI controller and ``curvine-cli`` read this file and would copy a TTL into the
    directories they create (module docstring). ``[master] enable_quota_eviction`` is
    :data:`ENABLE_QUOTA_EVICTION` (false) and no other quota-eviction key is written: the line's
    L2 janitor bounds capacity and age (``curvine.eviction``). Every log goes to stdout; the
    master at :data:`MASTER_LOG_LEVEL` without audit lines, the Workers at
    :data:`WORKER_LOG_LEVEL` (no per-block lines).
    """
    host = names.cluster_domain_host(platform)
    stdout_log = {"level": "info", "log_dir": LOG_TO_STDOUT}
    return {
        # Formatting wipes metadata/data; never on. v0.3.2-alpha bootstraps missing or clean-empty
        # meta and journal directories without it (journal_system.rs, Curvine #953).
        "format_master": False,
        "format_worker": False,
        "cluster_id": platform.project,
        "master": {
            "hostname": host,
            "rpc_port": MASTER_RPC_PORT,
            "web_port": MASTER_WEB_PORT,
            "meta_dir": META_DIR,
            # Off, explicitly: only the janitor deletes (ENABLE_QUOTA_EVICTION, master_conf.rs).
            "enable_quota_eviction": ENABLE_QUOTA_EVICTION,
            "audit_logging_enabled": MASTER_AUDIT_LOGGING,
            "log": {**stdout_log, "level": MASTER_LOG_LEVEL, "file_name": "master.log"},
        },
        "journal": {
            "hostname": host,
            "rpc_port": JOURNAL_PORT,
            "journal_addrs": [{"id": JOURNAL_ID, "hostname": host, "port": JOURNAL_PORT}],
            "journal_dir": JOURNAL_DIR,
        },
        "worker": {
            "rpc_port": WORKER_RPC_PORT,
            "web_port": WORKER_WEB_PORT,
            "dir_reserved": "0",
            "data_dir": [worker_tier(platform).render()],
            "log": {**stdout_log, "level": WORKER_LOG_LEVEL, "file_name": "worker.log"},
        },
        "client": {
            "master_addrs": [{"hostname": host, "port": MASTER_RPC_PORT}],
        },
        "fuse": {"web_port": FUSE_WEB_PORT},
        "log": {**stdout_log, "file_name": "curvine.log"},
        "cli": {"log": {"level": "warn", "log_dir": LOG_TO_STDOUT, "file_name": "cli.log"}},
    }


def render_cluster_toml(platform: PlatformConfig) -> str:
    """``curvine-cluster.toml`` text for the ConfigMap shared by Primary, Workers and CSI."""
    header = ("# Generated by k8s/curvine_config.py from config/platform.yaml (curvine.*). Do not edit.\n"
              "# format_* stay false: Curvine's defaults are true and would wipe metadata on restart.\n")
    return header + tomli_w.dumps(cluster_conf(platform))


def master_addrs(platform: PlatformConfig) -> str:
    """``host:port`` of the Primary's RPC endpoint, for the StorageClass ``master-addrs``."""
    return f"{names.cluster_domain_host(platform)}:{MASTER_RPC_PORT}"
