"""LMCache settings of a business line's vLLM pods: the typed allow-list and the env to set.

LMCache (:data:`LMCACHE_VERSION`, the release inside the ``lmcache/vllm-openai`` image every
line must pin; :class:`platform_config.line_models.VllmConfig` refuses any other) reads every config
key ``k`` from the environment variable ``LMCACHE_<K>`` and silently ignores any other
``LMCACHE_*`` name (docs/sources.md §8). A misspelled variable therefore does nothing and nobody
notices; :data:`LMCACHE_CONFIG_KEYS` is the list of names that release really reads, and
:func:`lmcache_env` refuses to emit anything else. ``make test-lmcache`` checks the list
against the installed package and reads what we render back through LMCache's own loader.

This module is the one source of truth for the env a line's inference pods must end up with.
Both the Kyverno policy (:mod:`k8s.kyverno`) and the RFC 6902 fallback patch
(:mod:`k8s.patch`) are built from it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Final

from k8s.vllm_plugins import CHUNK_KEY_ENV, L2_GATE_ENV, PLUGIN_DIR, PYTHONPATH_ENV, l2_gate_env
from k8s.names import chunk_key_secret_name
from platform_config import BusinessLineConfig, PlatformConfig, vllm_args
from platform_config.fields import LMCACHE_VERSION

__all__ = [
    "LMCACHE_CONFIG_KEYS",
    "LMCACHE_VERSION",
    "L2_FAULT_TIMEOUT_KEYS",
    "PINNED_SETTINGS",
    "l2_cache_dir",
    "l2_fault_timeouts",
    "lmcache_env",
    "owned_env_names",
]

#: Keys of ``_CONFIG_DEFINITIONS`` in ``lmcache/v1/config.py`` of lmcache 0.5.5 (PyPI wheel
#: lmcache-0.5.5-cp311, read 2026-11), in source order. ``LMCACHE_<KEY upper>`` is the env name.
#: ``make test-lmcache`` compares it with the installed package and prints the right tuple on
#: drift (0.5.6 adds ``run_script_api_enabled``).
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
    "enable_lazy_memory_allocator", "lazy_memory_initial_ratio",
    "lazy_memory_expand_trigger_ratio", "lazy_memory_step_ratio", "lazy_memory_safe_size",
    "enable_chunk_statistics", "chunk_statistics_auto_start_statistics",
    "chunk_statistics_auto_exit_timeout_hours", "chunk_statistics_auto_exit_target_unique_chunks",
    "chunk_statistics_strategy", "enable_kv_events", "use_gpu_connector_v3", "pin_timeout_sec",
    "pin_check_interval_sec", "remote_config_url", "app_id", "enable_hidden_state_cache",
    "max_hidden_state_cpu_size", "hidden_state_layers", "hidden_states_retrieve_mode",
))

#: ``LMCACHE_CONFIG_FILE`` is read by ``lmcache_get_or_create_config`` in
#: ``lmcache/integration/vllm/utils.py`` (a YAML file; env vars override it), not through
#: ``_CONFIG_DEFINITIONS``.
LMCACHE_CONFIG_FILE_ENV: Final = "LMCACHE_CONFIG_FILE"
#: Usage-telemetry opt-outs, read by ``is_usage_tracking_enabled`` in
#: ``lmcache/usage_telemetry/identity.py`` (0.5.5): tracking is off when ``LMCACHE_TRACK_USAGE``
#: is exactly ``false`` or ``DO_NOT_TRACK`` is ``1``/``true``/``yes``. Neither is a config key.
TRACK_USAGE_ENV: Final = "LMCACHE_TRACK_USAGE"
DO_NOT_TRACK_ENV: Final = "DO_NOT_TRACK"

#: ``extra_config`` keys the fs connector reads: ``FSConnector.__init__``
#: (``lmcache/v1/storage_backend/connector/fs_connector.py``) and ``save_chunk_meta`` in
#: ``RemoteConnector.__init__`` (``.../connector/base_connector.py``), lmcache 0.5.5.
FS_CONNECTOR_EXTRA_KEYS: Final[frozenset[str]] = frozenset((
    "fs_connector_relative_tmp_dir", "fs_connector_read_ahead_size", "fs_connector_use_odirect",
    "save_chunk_meta",
))

#: Prefix of the per-pod temporary directory (relative to the line's L2 directory). LMCache
#: writes a chunk to ``<base>/<relative_tmp_dir>/<chunk file>`` and then renames it into
#: ``<base>``; without the setting the temp name is ``<chunk file>.tmp``, fixed per chunk key,
#: so two pods storing the same chunk at once write the same temp file (LMCache issue #2517).
#: One directory per pod makes each writer's temp file private; the rename stays atomic because
#: source and target are on the same Curvine mount. The connector creates the directory with
#: ``mkdir(parents=False)`` below its base path, so it must be one level deep.
TMP_DIR_PREFIX: Final = ".tmp-"

#: Hash seed every pod of a line shares. vLLM's ``init_none_hash``
#: (``vllm/v1/core/kv_cache_utils.py``) sets the initial prefix hash ``NONE_HASH`` to
#: ``hash_fn(PYTHONHASHSEED)``, or to 32 random bytes per process when the variable is unset,
#: and LMCache 0.5.5 starts every chunk-key chain from vLLM's ``NONE_HASH``
#: (``lmcache/v1/token_database.py``). Pods with different or unset seeds therefore never hit
#: each other's chunks. LMCache on its own hashes ``(prefix hash, token ids, extra keys)``, a
#: tuple of integers that the seed does not salt: measured by ``make test-lmcache``.
PYTHONHASHSEED_ENV: Final = "PYTHONHASHSEED"

#: Prometheus multiprocess directory of the vLLM container. Not an LMCache setting (so not an
#: ``LMCACHE_*`` name and not in :data:`LMCACHE_CONFIG_KEYS`), but part of the env the L2 patch
#: owns: LMCache registers its metrics with ``prometheus_client`` in vLLM's engine-core/worker
#: processes, and vLLM's API server serves them on ``/metrics`` only when this variable names one
#: existing, writable directory for the whole container (vLLM 0.29.0
#: ``vllm/v1/metrics/prometheus.py`` ``get_prometheus_registry``; ``prometheus_client`` picks its
#: multiprocess value class when it is imported, ``values.py``). LMCache 0.5.5's own fallback
#: (``PrometheusLogger._ensure_multiprocess_dir``) sets it inside the worker process only, after
#: ``prometheus_client`` was imported, so it has no effect. docs/sources.md §13.
PROMETHEUS_MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
#: Where the pod's ``emptyDir`` for it is mounted in the vLLM container (:func:`k8s.patch.metrics_volume`).
#: A real directory in every image (``/var/run`` is a symlink in some), private to the container.
METRICS_DIR: Final = "/tmp/prometheus-multiproc"

#: Downward-API variable holding the pod name, used only by the Deployment patch (whose
#: template is shared by all pods, so the per-pod token must be expanded by the kubelet from
#: ``$(KVCACHE_POD_NAME)``). Not an ``LMCACHE_*`` name, so LMCache ignores it.
POD_NAME_ENV: Final = "KVCACHE_POD_NAME"


@dataclass(frozen=True)
class PinnedSetting:
    """An LMCache setting the platform sets explicitly instead of trusting the default.

    Attributes:
        key: config key (``LMCACHE_<KEY>``), or ``extra_config.<name>`` for a key of
            ``LMCACHE_EXTRA_CONFIG``.
        value: what we set (env text; a JSON value for extra_config keys).
        default: the default in :data:`LMCACHE_VERSION` (source text).
        reason: why the shared L2 needs this value.
        source: where the default and the behaviour are (docs/sources.md §8).
    """

    key: str
    value: str
    default: str
    reason: str
    source: str


#: Every LMCache setting whose default is unsafe for a shared L2, or that the meaning of the
#: shared files depends on (so a default change in another release cannot change it silently).
#: ``chunk_size`` and ``remote_url`` come from the line (:func:`lmcache_env`); the telemetry
#: opt-outs are not config keys (:data:`TRACK_USAGE_ENV`). Listed with reasons in
#: docs/l2-cache.md and docs/sources.md §8; ``make test-lmcache`` reads each back.
PINNED_SETTINGS: Final[tuple[PinnedSetting, ...]] = (
    PinnedSetting(
        "remote_serde", "naive", '"naive"',
        "the cachegen serde breaks under the fs connector (reference deployment); naive writes "
        "the raw KV bytes that the tier test compares",
        "lmcache/v1/config.py _CONFIG_DEFINITIONS; docs/sources.md §1"),
    PinnedSetting(
        "save_unfull_chunk", "false", "False (True up to 0.3.x, e.g. in the v0.3.7 image)",
        "a stored partial last chunk that overlaps vLLM's own prefix cache is loaded over it and "
        "corrupts outputs (LMCache issue #2206, fixed by turning the default off in PR #2207); "
        "set so an image with the old default cannot bring it back",
        "lmcache/v1/config.py; lmcache/v1/token_database.py ChunkedTokenDatabase._chunk_tokens"),
    PinnedSetting(
        "pre_caching_hash_algorithm", "sha256_cbor", '"builtin"',
        "the chunk-key hash is part of every file name: SHA-256 of the chain's CBOR (vLLM's sha256_cbor), "
        "started from the line's secret (KVCACHE_L2_KEY, applied by the L2 gate), so no one without the "
        "Secret can compute a prompt's chunk name or craft a colliding one; builtin (Python's hash from "
        "hash(PYTHONHASHSEED)) made every name computable (issue 25, GHSA-rm76-4mrf-v9r8)",
        "lmcache/v1/token_database.py TokenDatabase._get_vllm_hash_func, _normalize_hash_to_int; "
        "vllm/utils/hashing.py sha256_cbor; docs/sources.md §28"),
    PinnedSetting(
        "extra_config.save_chunk_meta", "true", "True (when extra_config lacks the key)",
        "each file starts with a header holding the chunk's shapes; with it a truncated file "
        "fails its read ('Partial read data') instead of being reshaped into fewer tokens",
        "lmcache/v1/storage_backend/connector/base_connector.py RemoteConnector.__init__, "
        "fs_connector.py FSConnector.get"),
)

#: The KV-neutral vLLM flags, shared with every other reader of ``vllm.args``
#: (:mod:`platform_config.vllm_args`): a flag of :data:`KV_NEUTRAL_VLLM_FLAGS` does not change the
#: content or layout of a token sequence's KV, so a change of it keeps the line's L2 directory.
#: Every other argument of ``vllm.args`` (model path, ``--dtype``, ``--kv-cache-dtype``,
#: ``--tensor-parallel-size``, ``--quantization``, ``--revision``, ``--hf-overrides``, anything
#: unknown...) is part of :func:`l2_cache_dir`.
KV_NEUTRAL_VLLM_FLAGS = vllm_args.KV_NEUTRAL_VLLM_FLAGS


def env_name(key: str) -> str:
    """``LMCACHE_<KEY>`` for a config key; KeyError if the pinned LMCache does not read ``key``."""
    if key not in LMCACHE_CONFIG_KEYS:
        raise KeyError(f"{key!r} is not an LMCache {LMCACHE_VERSION} config key (lmcache/v1/config.py)")
    return f"LMCACHE_{key.upper()}"


def is_lmcache_env(name: str) -> bool:
    """True when LMCache reads the ``LMCACHE_*`` variable ``name``.

    A config key, ``LMCACHE_CONFIG_FILE`` or ``LMCACHE_TRACK_USAGE``; any other ``LMCACHE_*``
    name is ignored by LMCache without a word.
    """
    if name in (LMCACHE_CONFIG_FILE_ENV, TRACK_USAGE_ENV):
        return True
    return name.startswith("LMCACHE_") and name[len("LMCACHE_"):].lower() in LMCACHE_CONFIG_KEYS


def extra_config(tmp_dir_token: str) -> dict[str, object]:
    """``LMCACHE_EXTRA_CONFIG`` of a pod: its private temp dir and the pinned extra keys.

    Raises:
        KeyError: a key the fs connector of :data:`LMCACHE_VERSION` does not read.
    """
    extra: dict[str, object] = {"fs_connector_relative_tmp_dir": f"{TMP_DIR_PREFIX}{tmp_dir_token}"}
    for setting in PINNED_SETTINGS:
        if setting.key.startswith("extra_config."):
            extra[setting.key.removeprefix("extra_config.")] = json.loads(setting.value)
    unknown = set(extra) - FS_CONNECTOR_EXTRA_KEYS
    if unknown:
        raise KeyError(f"extra_config keys not read by the fs connector: {sorted(unknown)}")
    return extra


def lmcache_env(platform: PlatformConfig, line: BusinessLineConfig, *, tmp_dir_token: str,
                remote_url: str) -> dict[str, str]:
    """The cache env (name -> value) every inference pod of ``line`` must end up with.

    Args:
        platform: the platform config (``lmcache.usage_telemetry``).
        line: the business line; gives the chunk size, the hash seed and the L1 size.
        tmp_dir_token: what makes the temp directory unique per pod. The Kyverno policy passes
            a ``random()`` call evaluated at admission, the Deployment patch a ``$(VAR)``
            reference the kubelet expands to the pod name.
        remote_url: the line's L2 URL (:func:`k8s.patch.line_remote_url`: the fs connector on
            the line's model-scoped directory, :func:`l2_cache_dir`).

    Returns:
        Ordered mapping: ``LMCACHE_REMOTE_URL``; ``LMCACHE_CHUNK_SIZE`` (tokens, from
        ``cache.chunk_size_tokens``); one ``LMCACHE_<KEY>`` per config key of
        :data:`PINNED_SETTINGS` (``REMOTE_SERDE=naive``, ``SAVE_UNFULL_CHUNK=false``,
        ``PRE_CACHING_HASH_ALGORITHM=builtin``); ``LMCACHE_EXTRA_CONFIG`` (JSON,
        :func:`extra_config`: the per-pod temp dir and ``save_chunk_meta``; the operator's own
        extra config carries ``sagemaker_hyperpod_*`` keys that only the ``sagemaker-hyperpod://``
        connector reads, meaningless once the URL is ``fs://``); ``LMCACHE_LOOKUP_TIMEOUT_MS`` and
        ``LMCACHE_BLOCKING_TIMEOUT_SECS`` (:func:`l2_fault_timeouts`); ``PYTHONHASHSEED``; unless
        ``lmcache.usage_telemetry`` is on, ``LMCACHE_TRACK_USAGE=false`` and ``DO_NOT_TRACK=1``;
        ``PROMETHEUS_MULTIPROC_DIR`` = :data:`METRICS_DIR` (so LMCache's metrics reach vLLM's
        ``/metrics``; the patch mounts an ``emptyDir`` there); ``PYTHONPATH`` =
        :data:`k8s.vllm_plugins.PLUGIN_DIR` (vLLM imports the L2 gate from there; the image sets no
        ``PYTHONPATH`` of its own) and the gate's settings (:func:`k8s.vllm_plugins.l2_gate_env`); and, only when
        ``cache.l1_cpu_gib`` is set, ``LMCACHE_MAX_LOCAL_CPU_SIZE`` (:func:`max_local_cpu_size`).

    Raises:
        KeyError: a name that LMCache does not read (a programming error caught by tests).
    """
    env = {
        env_name("remote_url"): remote_url,
        env_name("chunk_size"): str(line.cache.chunk_size_tokens),
    }
    for setting in PINNED_SETTINGS:
        if not setting.key.startswith("extra_config."):
            env[env_name(setting.key)] = setting.value
    env[env_name("extra_config")] = json.dumps(extra_config(tmp_dir_token), separators=(", ", ": "))
    for key, value in l2_fault_timeouts(platform).items():
        env[env_name(key)] = str(value)
    env[PYTHONHASHSEED_ENV] = str(line.python_hash_seed)
    if not platform.lmcache.usage_telemetry:
        env[TRACK_USAGE_ENV] = "false"
        env[DO_NOT_TRACK_ENV] = "1"
    env[PROMETHEUS_MULTIPROC_DIR_ENV] = METRICS_DIR
    env[PYTHONPATH_ENV] = PLUGIN_DIR
    env.update(l2_gate_env(platform))
    l1_size = max_local_cpu_size(line)
    if l1_size is not None:
        env[env_name("max_local_cpu_size")] = l1_size
    return env


#: LMCache keys that bound what an unhealthy L2 costs a request (docs/l2-cache.md, "When the
#: Curvine Primary is down"), set from ``platform.lmcache`` (:func:`l2_fault_timeouts`). Read in
#: lmcache 0.5.5 by ``LookupClientFactory._create_zmq_client_transport`` (the scheduler's ZMQ
#: receive timeout, ``v1/lookup_client/factory.py``) and ``RemoteBackend.get_blocking`` /
#: ``batched_get_blocking`` (``future.result(blocking_timeout_secs)``,
#: ``v1/storage_backend/remote_backend.py``); docs/sources.md §18. Not part of
#: :func:`l2_cache_dir`: they do not change what the files mean.
L2_FAULT_TIMEOUT_KEYS: Final = ("lookup_timeout_ms", "blocking_timeout_secs")


def l2_fault_timeouts(platform: PlatformConfig) -> dict[str, int]:
    """``{"lookup_timeout_ms": ms, "blocking_timeout_secs": s}`` from ``platform.lmcache``.

    ``lookup_timeout_ms`` bounds a lookup (vLLM's scheduler counts a timeout as 0 hit tokens);
    ``blocking_timeout_secs`` (whole seconds: LMCache converts it with ``int()``) bounds each
    chunk read of a retrieve. Units as the keys say; defaults and their reasons in
    :class:`platform_config.platform_models.LMCacheSettings`.
    """
    return {key: getattr(platform.lmcache, key) for key in L2_FAULT_TIMEOUT_KEYS}


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

    Every name :func:`lmcache_env` can emit, plus :data:`POD_NAME_ENV` (a test holds the two
    together). ``PROMETHEUS_MULTIPROC_DIR`` is owned, so a value from the CR or the operator that
    names a missing directory (vLLM's API server would fail to start: ``MultiProcessCollector``
    refuses it) is replaced by the mounted one.
    The telemetry opt-outs are always owned, so ``lmcache.usage_telemetry`` alone decides (when
    it is on, neither is set). ``LMCACHE_MAX_LOCAL_CPU_SIZE`` is owned only for a ``line`` that
    sets ``cache.l1_cpu_gib``; otherwise the operator's own value (its L1 setting) is left alone.
    """
    names = (env_name("remote_url"), env_name("chunk_size"),
             *(env_name(s.key) for s in PINNED_SETTINGS if not s.key.startswith("extra_config.")),
             env_name("extra_config"), *(env_name(k) for k in L2_FAULT_TIMEOUT_KEYS), PYTHONHASHSEED_ENV, TRACK_USAGE_ENV, DO_NOT_TRACK_ENV,
             PROMETHEUS_MULTIPROC_DIR_ENV, PYTHONPATH_ENV, *L2_GATE_ENV, POD_NAME_ENV, CHUNK_KEY_ENV)
    if line.cache.l1_cpu_gib is not None:
        names += (env_name("max_local_cpu_size"),)
    return names


def kv_relevant_vllm_args(args: tuple[str, ...] | list[str]) -> list[list[str]]:
    """``vllm.args`` without the flags of :data:`KV_NEUTRAL_VLLM_FLAGS`, in a canonical order.

    Each group is a positional argument (the model path) or a flag with its values
    (``["--kv-cache-dtype", "fp8"]``), as :func:`platform_config.vllm_args.group_vllm_args` reads
    them (``--flag=value`` split, a short alias made its long flag, each flag taking its own
    number of values, so a word after a flag without value stays a positional; an unknown flag
    takes every word up to the next flag: when in doubt, a change starts a new L2 directory rather
    than reuse old KV).

    Returns:
        The positionals first, in their order, then the flag groups ordered by flag name (a
        stable sort: a repeated flag keeps its occurrences in order, since the last one wins), so
        reordering the arguments keeps the directory.
    """
    groups = vllm_args.group_vllm_args(args)
    positionals = [g for g in groups if not vllm_args.is_flag(g[0])]
    flags = [g for g in groups if vllm_args.is_flag(g[0]) and g[0] not in KV_NEUTRAL_VLLM_FLAGS]
    return positionals + sorted(flags, key=lambda g: g[0])


def l2_cache_dir(platform: PlatformConfig, line: BusinessLineConfig) -> str:
    """Name of the line's model-scoped L2 directory, directly under the root of its PVC.

    LMCache names a chunk file ``<model path>@<world size>@<worker id>@<chunk hash>@<dtype>.data``
    (``CacheEngineKey.to_string``, ``lmcache/utils.py``; ``/`` becomes ``-SEP-``): the model
    *path* inside the pod, not the model. A new model (or revision, or quantization) mounted at
    the same path would get full lookup hits on the old model's files and silently load its KV.
    So every line's URL points at this directory, whose name changes with anything that makes
    stored KV unusable, and a change starts an empty directory instead.

    Returns:
        One path component, ``<model name, lowercased>-<12 hex digits>``: the first 12 hex
        digits of the SHA-256 of a JSON document holding the model name; its source (bucket,
        region and location; Hugging Face id and commit; FSx file system and location; without
        ``prefetch`` and the token secret, which do not change the weights); the model mount
        path; ``model.dtype``; the KV-relevant ``vllm.args`` (:func:`kv_relevant_vllm_args`:
        model path, ``--kv-cache-dtype``, ``--quantization``, ...); the tensor-parallel size;
        the chunk size; the image and its LMCache release; the values of
        :data:`PINNED_SETTINGS` (serde, ``save_unfull_chunk``, hash algorithm, file header); and
        ``python_hash_seed`` (a new seed re-keys every chunk, so the old directory is garbage); and
        the chunk-key Secret's name (:func:`k8s.names.chunk_key_secret_name`: a new key generation
        re-keys every chunk too; the key itself is not known at synthesis, and never changes under
        one name).
        Replicas, resources, routing, L1 size and KV-neutral flags do not enter it.

    Contract: the L2 janitor treats this directory as the line's live one and everything else
    under the PVC root (older model directories) as deletable. Adding an input to the digest
    moves every line to a new, empty directory once (a cold L2, never a wrong one).
    """
    del platform  # no platform-wide input yet; part of the signature other code relies on
    src = line.model.source.model_dump(mode="json")
    src.pop("prefetch", None)
    src.pop("token_secret_name", None)
    identity = {
        "model": line.model.name,
        "source": src,
        "model_path": line.vllm.model_mount_path,
        "dtype": line.model.dtype,
        "vllm_args": kv_relevant_vllm_args(line.vllm.args),
        "tensor_parallel_size": line.tensor_parallel_size,
        "chunk_size": line.cache.chunk_size_tokens,
        "image": line.vllm.image,
        "lmcache_version": line.vllm.lmcache_release,
        "settings": {s.key: s.value for s in PINNED_SETTINGS},
        "python_hash_seed": line.python_hash_seed,
        "chunk_key_secret": chunk_key_secret_name(line),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{line.model.name.lower()}-{digest}"
