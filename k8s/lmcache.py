"""LMCache settings of a business line's vLLM pods: the typed allow-list and the env to set.

LMCache (0.5.6, the version in the ``lmcache/vllm-openai`` images the example lines pin) reads
every config key ``k`` from the environment variable ``LMCACHE_<K>`` and silently ignores any
other ``LMCACHE_*`` name (docs/sources.md §5). A misspelled variable therefore does nothing and
nobody notices; :data:`LMCACHE_CONFIG_KEYS` is the list of names LMCache really reads, and
:func:`lmcache_env` refuses to emit anything else.

This module is the one source of truth for the env a line's inference pods must end up with.
Both the Kyverno policy (:mod:`k8s.kyverno`) and the RFC 6902 fallback patch
(:mod:`k8s.patch`) are built from it.
"""

from __future__ import annotations

import json
from typing import Final

from platform_config import BusinessLineConfig, PlatformConfig

#: Keys of ``_CONFIG_DEFINITIONS`` in ``lmcache/v1/config.py`` of lmcache 0.5.6 (PyPI wheel
#: lmcache-0.5.6-cp311, read 2026-11), in source order. ``LMCACHE_<KEY upper>`` is the env name.
LMCACHE_CONFIG_KEYS: Final[frozenset[str]] = frozenset((
    "chunk_size", "local_cpu", "max_local_cpu_size", "local_cpu_use_hugepages",
    "reserve_local_cpu_size", "local_disk", "local_disk_path_sharding", "max_local_disk_size",
    "remote_url", "remote_serde", "use_layerwise", "save_decode_cache",
    "pre_caching_hash_algorithm", "enable_blending", "blend_recompute_ratios", "blend_thresholds",
    "blend_check_layers", "blend_min_tokens", "blend_special_str", "retrieve_locations",
    "store_location", "enable_p2p", "p2p_host", "p2p_init_ports", "p2p_lookup_ports", "mp_host",
    "mp_port", "enable_controller", "lmcache_instance_id", "controller_pull_url",
    "controller_reply_url", "lmcache_worker_ports", "lmcache_worker_ids",
    "lmcache_worker_heartbeat_delay_time", "lmcache_worker_heartbeat_time", "enable_pd", "pd_role",
    "pd_buffer_size", "pd_buffer_device", "pd_peer_host", "pd_peer_init_port",
    "pd_peer_alloc_port", "pd_peer_query_port", "pd_proxy_host", "pd_proxy_port",
    "pd_allocation_timeout_sec", "pd_shutdown_timeout_sec", "pd_condition_poll_interval_sec",
    "pd_max_prefill_len", "pd_backend_mode", "pd_skip_proxy_notification", "pd_bidirectional",
    "transfer_channel", "nixl_backends", "nixl_buffer_size", "nixl_buffer_device", "gds_path",
    "gds_path_sharding", "gds_buffer_size", "maru_path", "maru_pool_size", "use_gds",
    "gds_backend", "audit_actual_remote_url", "internal_api_server_host", "extra_config",
    "save_unfull_chunk", "blocking_timeout_secs", "external_lookup_client", "py_enable_gc",
    "cache_policy", "numa_mode", "enable_async_loading", "internal_api_server_enabled",
    "internal_api_server_port_start", "priority_limit", "internal_api_server_include_index_list",
    "internal_api_server_socket_path_prefix", "runtime_plugin_locations", "storage_plugins",
    "remote_storage_plugins", "lookup_timeout_ms", "min_retrieve_tokens", "hit_miss_ratio",
    "lookup_server_worker_ids", "enable_scheduler_bypass_lookup", "script_allowed_imports",
    "run_script_api_enabled", "enable_lazy_memory_allocator", "lazy_memory_initial_ratio",
    "lazy_memory_expand_trigger_ratio", "lazy_memory_step_ratio", "lazy_memory_safe_size",
    "enable_chunk_statistics", "chunk_statistics_auto_start_statistics",
    "chunk_statistics_auto_exit_timeout_hours", "chunk_statistics_auto_exit_target_unique_chunks",
    "chunk_statistics_strategy", "enable_kv_events", "use_gpu_connector_v3", "pin_timeout_sec",
    "pin_check_interval_sec", "remote_config_url", "app_id", "enable_hidden_state_cache",
    "max_hidden_state_cpu_size", "hidden_state_layers", "hidden_states_retrieve_mode",
))

#: ``LMCACHE_CONFIG_FILE`` is read by ``create_singleton_config`` in ``lmcache/v1/config_base.py``
#: (a YAML file; env vars override it), not through ``_CONFIG_DEFINITIONS``.
LMCACHE_CONFIG_FILE_ENV: Final = "LMCACHE_CONFIG_FILE"

#: ``extra_config`` keys the fs connector reads (``FSConnector.__init__``,
#: ``lmcache/v1/storage_backend/connector/fs_connector.py``, lmcache 0.5.6).
FS_CONNECTOR_EXTRA_KEYS: Final[frozenset[str]] = frozenset((
    "fs_connector_relative_tmp_dir", "fs_connector_read_ahead_size", "fs_connector_use_odirect",
))

#: Prefix of the per-pod temporary directory (relative to the L2 mount). LMCache 0.5.6 writes a
#: chunk to ``<base>/<relative_tmp_dir>/<chunk file>`` and then renames it into ``<base>``; the
#: temp name is fixed per chunk key, so two pods storing the same chunk at once write the same
#: temp file (LMCache issue #2517). One directory per pod makes each writer's temp file private;
#: the rename stays atomic because source and target are on the same Curvine mount. The
#: connector creates the directory with ``mkdir(parents=False)``, so it must be one level deep.
TMP_DIR_PREFIX: Final = ".tmp-"

#: Hash seed every pod of a line shares: LMCache's chunk keys use Python's ``hash``, so pods
#: with different seeds never hit each other's chunks (docs/sources.md §1).
PYTHONHASHSEED_ENV: Final = "PYTHONHASHSEED"

#: Downward-API variable holding the pod name, used only by the Deployment patch (whose
#: template is shared by all pods, so the per-pod token must be expanded by the kubelet from
#: ``$(KVCACHE_POD_NAME)``). Not an ``LMCACHE_*`` name, so LMCache ignores it.
POD_NAME_ENV: Final = "KVCACHE_POD_NAME"


def env_name(key: str) -> str:
    """``LMCACHE_<KEY>`` for a config key; KeyError if LMCache 0.5.6 does not read ``key``."""
    if key not in LMCACHE_CONFIG_KEYS:
        raise KeyError(f"{key!r} is not an LMCache 0.5.6 config key (lmcache/v1/config.py)")
    return f"LMCACHE_{key.upper()}"


def is_lmcache_env(name: str) -> bool:
    """True when LMCache reads the variable ``name`` (a config key or ``LMCACHE_CONFIG_FILE``)."""
    if name == LMCACHE_CONFIG_FILE_ENV:
        return True
    return name.startswith("LMCACHE_") and name[len("LMCACHE_"):].lower() in LMCACHE_CONFIG_KEYS


def lmcache_env(platform: PlatformConfig, line: BusinessLineConfig, *, tmp_dir_token: str,
                remote_url: str) -> dict[str, str]:
    """The cache env (name -> value) every inference pod of ``line`` must end up with.

    Args:
        platform: the platform config (reserved for platform-wide LMCache settings).
        line: the business line; gives the chunk size and the hash seed.
        tmp_dir_token: what makes the temp directory unique per pod. The Kyverno policy passes
            a ``random()`` call evaluated at admission, the Deployment patch a ``$(VAR)``
            reference the kubelet expands to the pod name.
        remote_url: the L2 URL (:data:`k8s.patch.L2_REMOTE_URL`).

    Returns:
        Ordered mapping: ``LMCACHE_REMOTE_URL`` (the fs connector on the Curvine mount),
        ``LMCACHE_REMOTE_SERDE=naive`` (cachegen serde breaks under the fs connector,
        docs/sources.md §1), ``LMCACHE_CHUNK_SIZE`` (tokens, from ``cache.chunk_size_tokens``),
        ``LMCACHE_EXTRA_CONFIG`` (JSON; only the per-pod temp dir: the operator's own extra
        config carries ``sagemaker_hyperpod_bucket`` / ``sagemaker_hyperpod_shared_memory_name``,
        which only the ``sagemaker-hyperpod://`` connector reads and which are meaningless once
        the URL is ``fs://``), ``PYTHONHASHSEED``, and, only when ``cache.l1_cpu_gib`` is set,
        ``LMCACHE_MAX_LOCAL_CPU_SIZE`` (:func:`max_local_cpu_size`).

    Raises:
        KeyError: a name that LMCache does not read (a programming error caught by tests).
    """
    del platform  # no platform-wide LMCache setting yet; kept so callers need not change
    extra = {"fs_connector_relative_tmp_dir": f"{TMP_DIR_PREFIX}{tmp_dir_token}"}
    unknown = set(extra) - FS_CONNECTOR_EXTRA_KEYS
    if unknown:
        raise KeyError(f"extra_config keys not read by the fs connector: {sorted(unknown)}")
    env = {
        env_name("remote_url"): remote_url,
        env_name("remote_serde"): "naive",
        env_name("chunk_size"): str(line.cache.chunk_size_tokens),
        env_name("extra_config"): json.dumps(extra, separators=(", ", ": ")),
        PYTHONHASHSEED_ENV: str(line.python_hash_seed),
    }
    l1_size = max_local_cpu_size(line)
    if l1_size is not None:
        env[env_name("max_local_cpu_size")] = l1_size
    return env


def max_local_cpu_size(line: BusinessLineConfig) -> str | None:
    """``LMCACHE_MAX_LOCAL_CPU_SIZE`` for ``cache.l1_cpu_gib``, or None to leave LMCache's default.

    Units: LMCache documents the key as "GB" (default 5.0) but
    ``LMCacheEngineBuilder._Create_memory_allocator`` (``lmcache/v1/cache_engine.py``) allocates
    ``int(max_local_cpu_size * 1024**3)`` bytes, so the value is GiB and needs no conversion.
    Every vLLM worker process (one per TP rank) builds its own engine and buffer (the engine
    metadata carries the rank; ``save_only_first_rank`` sizes rank 0 apart), so the per-pod
    ``l1_cpu_gib`` is divided by ``gpus_per_replica``. Formatted with ``%g`` (``16``, ``2.5``),
    which LMCache's ``float`` converter parses.
    """
    gib = line.cache.l1_cpu_gib
    if gib is None:
        return None
    return f"{gib / line.gpus_per_replica:g}"


def owned_env_names(line: BusinessLineConfig) -> tuple[str, ...]:
    """Env names the L2 patch owns: any existing entry with one of these names is removed first.

    ``LMCACHE_MAX_LOCAL_CPU_SIZE`` is owned only for a ``line`` that sets ``cache.l1_cpu_gib``;
    otherwise the operator's own value (its L1 setting) is left alone.
    """
    names = (env_name("remote_url"), env_name("remote_serde"), env_name("chunk_size"),
             env_name("extra_config"), PYTHONHASHSEED_ENV, POD_NAME_ENV)
    if line.cache.l1_cpu_gib is not None:
        names += (env_name("max_local_cpu_size"),)
    return names


def l2_cache_dir(platform: PlatformConfig, line: BusinessLineConfig) -> str:
    """Name of the line's model-scoped L2 directory, directly under the root of its PVC.

    Contract (first version; issue 7 decides exactly which inputs make KV incompatible): one
    path component, ``<model name, lowercased>-<12 hex digits>``, where the digest covers
    everything that makes stored KV unusable by another configuration, so a change of any of
    them starts a new, empty directory instead of serving the old model's chunks. LMCache
    itself keys chunk files by the model *path*, not the model (docs/sources.md §5).
    """
    import hashlib

    src = line.model.source.model_dump(mode="json")
    src.pop("prefetch", None)
    src.pop("token_secret_name", None)
    identity = {
        "model": line.model.name,
        "source": src,
        "dtype": line.model.dtype,
        "tensor_parallel_size": line.tensor_parallel_size,
        "chunk_size": line.cache.chunk_size_tokens,
        "serde": "naive",
        "image": line.vllm.image,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{line.model.name.lower()}-{digest}"
