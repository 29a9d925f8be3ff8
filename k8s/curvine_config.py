"""``curvine-cluster.toml`` generated from the typed platform config.

Key names follow Curvine's ``ClusterConf`` (``curvine-common/src/conf/*.rs``) as shown by the
sample ``curvine/curvine-cluster.toml`` of CurvineIO/curvine at bff4e7dc (``format_master``,
``format_worker``, ``[master] meta_dir``, ``[journal] journal_addrs / journal_dir``,
``[worker] data_dir``, ``log`` tables) and by curvine-doc's configuration reference (``rpc_port``,
``web_port``, ``[client] master_addrs / ttl_ms / ttl_action``, ``[master] enable_quota_eviction /
quota_eviction_mode / quota_eviction_policy / quota_eviction_high_rate / quota_eviction_low_rate``).

Value forms were checked against the sources (CurvineIO/curvine, ``curvine-common/src/conf``
and ``crates/common/curvine-config/src``): ``[client] ttl_ms`` deserializes into the *string*
``ttl_ms_str`` and is parsed by orpc's ``DurationUnit::from_str`` (units ``ms``, ``s``, ``m``,
``h``, ``d``; a bare number is milliseconds). A TOML integer there is a serde type error, which
stops every process that reads the file. ``ttl_action`` is ``none|delete|free`` (older
releases: ``none|move|ufs|delete``; ``delete`` is valid in both).

Every port is written explicitly: Curvine's defaults moved between releases (web ports were
9000/9001 in older docs and charts, 9001/9002/9003 in the code, docs/sources.md §4), and the
Service, probes, NetworkPolicies and clients must agree with the servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import tomli_w

from k8s import names
from platform_config import PlatformConfig

#: Curvine ports (docs/sources.md §4, crates/common/curvine-config/src/cluster_conf.rs).
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
#: Written by the Primary's init container once the metadata directory holds data; from then on
#: an empty metadata directory means a wrong or wiped volume and the pod refuses to start.
INIT_MARKER: Final = f"{PRIMARY_ROOT}/.kvcache-initialized"

#: Raft id of the single Primary.
JOURNAL_ID: Final = 1

#: emptyDir shared by the Primary's init container and master container. On a truly first
#: start (empty metadata and journal directories, no marker) the init container writes a copy
#: of the config with ``format_master = true`` here; the master container renames it before
#: starting, so it is used exactly once (never again after a container restart).
FIRST_START_DIR: Final = "/run/curvine-first-start"
FIRST_START_CONF: Final = f"{FIRST_START_DIR}/curvine-cluster.toml"

#: Milliseconds per unit of orpc's ``DurationUnit`` (``orpc/src/common/duration_unit.rs``).
_DURATION_UNITS: Final = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))


def curvine_duration(ms: int) -> str:
    """A duration in the form Curvine's ``DurationUnit`` prints and parses: ``1d``, ``36h``, ``90m``.

    The largest unit that divides ``ms`` exactly, else ``<ms>ms`` (``0`` -> ``0ms``), as in
    ``impl Display for DurationUnit`` (orpc ``duration_unit.rs``), whose ``from_str`` accepts
    ``ms``, ``s``, ``m``, ``h`` and ``d``.

    Raises:
        ValueError: negative ``ms``.
    """
    if ms < 0:
        raise ValueError(f"duration must be >= 0 ms, got {ms}")
    for unit, size in _DURATION_UNITS:
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def client_ttl(platform: PlatformConfig) -> dict[str, str]:
    """``{"ttl_ms": "1d", "ttl_action": "delete"}``: the client TTL every written file gets.

    From ``curvine.eviction.ttl_hours`` (rounded to whole milliseconds) and ``ttl_action``;
    ``ttl_hours: 0`` gives ``0ms`` / ``none`` (Curvine's default: no TTL).
    """
    ev = platform.curvine.eviction
    ms = int(round(ev.ttl_hours * 3_600_000))
    return {"ttl_ms": curvine_duration(ms), "ttl_action": ev.ttl_action if ms else "none"}


def fuse_ttl_parameters(platform: PlatformConfig) -> dict[str, str]:
    """StorageClass parameters that give the FUSE client (the writer) the TTL.

    The CSI node plugin starts ``curvine-fuse --master-addrs .. --fs-path .. --mnt-path ..`` in
    standalone pods that do not mount our ConfigMap, and forwards every non-reserved
    StorageClass parameter ``k`` as ``--k <value>`` (``CollectPassthroughParams`` /
    ``BuildFuseExecArgs``, ``curvine-csi/pkg/csi/fuse_cli.go``). ``curvine-fuse`` accepts
    ``ClientConf`` overrides as ``--client.<field>`` in kebab case with the ``_str`` suffix
    stripped (``ClientConfCliOverrides``; e.g. ``--client.block-size``), so the TTL keys are
    ``client.ttl-ms`` and ``client.ttl-action``. Passthrough and ``--client.*`` arrived with
    CurvineIO/curvine #865 (June 2026): an older curvine-csi drops unknown keys (whitelist),
    an older curvine-fuse rejects them as unknown flags; docs/l2-cache.md says what to check
    on a cluster. Empty when ``ttl_hours`` is 0.
    """
    ttl = client_ttl(platform)
    if ttl["ttl_action"] == "none":
        return {}
    return {"client.ttl-ms": ttl["ttl_ms"], "client.ttl-action": ttl["ttl_action"]}


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

    Eviction (``curvine.eviction``): LMCache's fs connector never deletes, so every file the
    FUSE client writes gets a TTL and the master runs quota eviction between the watermarks,
    which acts only on files carrying a TTL (docs/sources.md §4). The TTL is written here
    (``[client] ttl_ms`` / ``ttl_action``, read by the CSI controller's ``validate-config`` and
    any ``cv`` client) *and* passed to the FUSE pods as StorageClass parameters
    (:func:`fuse_ttl_parameters`), because those pods never read this file.
    """
    c = platform.curvine
    ev = c.eviction
    host = names.cluster_domain_host(platform)
    stdout_log = {"level": "info", "log_dir": "stdout"}
    return {
        # Formatting wipes metadata/data; never on here. A truly first start formats through a
        # one-time copy made by the Primary's init container (FIRST_START_CONF).
        "format_master": False,
        "format_worker": False,
        "cluster_id": platform.project,
        "master": {
            "hostname": host,
            "rpc_port": MASTER_RPC_PORT,
            "web_port": MASTER_WEB_PORT,
            "meta_dir": META_DIR,
            "enable_quota_eviction": ev.quota_eviction,
            "quota_eviction_mode": ev.ttl_action,
            "quota_eviction_policy": ev.policy,
            "quota_eviction_high_rate": ev.high_watermark,
            "quota_eviction_low_rate": ev.low_watermark,
            "log": {**stdout_log, "file_name": "master.log"},
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
            "log": {**stdout_log, "file_name": "worker.log"},
        },
        "client": {
            "master_addrs": [{"hostname": host, "port": MASTER_RPC_PORT}],
            **client_ttl(platform),
        },
        "fuse": {"web_port": FUSE_WEB_PORT},
        "log": {**stdout_log, "file_name": "curvine.log"},
        "cli": {"log": {"level": "warn", "log_dir": "stdout", "file_name": "cli.log"}},
    }


def render_cluster_toml(platform: PlatformConfig) -> str:
    """``curvine-cluster.toml`` text for the ConfigMap shared by Primary, Workers and CSI."""
    header = ("# Generated by k8s/curvine_config.py from config/platform.yaml (curvine.*). Do not edit.\n"
              "# format_* stay false: Curvine's defaults are true and would wipe metadata on restart.\n")
    return header + tomli_w.dumps(cluster_conf(platform))


def master_addrs(platform: PlatformConfig) -> str:
    """``host:port`` of the Primary's RPC endpoint, for the StorageClass ``master-addrs``."""
    return f"{names.cluster_domain_host(platform)}:{MASTER_RPC_PORT}"
