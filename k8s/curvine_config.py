"""``curvine-cluster.toml`` generated from the typed platform config.

Key names follow Curvine's ``ClusterConf`` (``curvine-common/src/conf/*.rs``) as shown by the
sample ``curvine/curvine-cluster.toml`` of CurvineIO/curvine at bff4e7dc (``format_master``,
``format_worker``, ``[master] meta_dir``, ``[journal] journal_addrs / journal_dir``,
``[worker] data_dir``, ``log`` tables) and by curvine-doc's configuration reference (``rpc_port``,
``web_port``, ``[client] master_addrs / ttl_ms / ttl_action``, ``[master] enable_quota_eviction /
quota_eviction_mode / quota_eviction_policy / quota_eviction_high_rate / quota_eviction_low_rate``).

Every port is written explicitly: Curvine's defaults moved between releases (web ports were
9000/9001 in older docs and charts, 9001/9002/9003 in the code, FACTS.md section 4), and the
Service, probes, NetworkPolicies and clients must agree with the servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import tomli_w

from k8s import names
from platform_config import PlatformConfig

#: Curvine ports (FACTS.md section 4, crates/common/curvine-config/src/cluster_conf.rs).
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
    FUSE client writes gets a TTL (``[client] ttl_ms`` / ``ttl_action``) and the master runs
    quota eviction between the watermarks, which acts only on files carrying a TTL
    (FACTS.md section 4).
    """
    c = platform.curvine
    ev = c.eviction
    host = names.cluster_domain_host(platform)
    ttl_ms = int(round(ev.ttl_hours * 3600 * 1000))
    stdout_log = {"level": "info", "log_dir": "stdout"}
    return {
        # Formatting wipes metadata/data; never on (see the Primary's init container).
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
            "ttl_ms": ttl_ms,
            "ttl_action": ev.ttl_action if ttl_ms else "none",
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
