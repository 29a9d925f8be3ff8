"""The L2 patch: constants, the env a line's pods need, and the RFC 6902 Deployment patch.

Two ways put a business line's vLLM pods on the Curvine L2 tier, built from the same data:

* the Kyverno Policy of :mod:`k8s.kyverno` mutates every inference Pod at creation (the
  production path: reconcile-proof, because the operator re-rendering its Deployment creates
  new Pods, which are mutated again);
* :func:`endpoint_json_patch` patches the operator-rendered Deployment, for clusters without the
  policy engine; ``scripts/patch_endpoint.sh`` applies it with the safe sequence (pause the
  operator, scale to 0, patch, scale up, wait Ready, restore the operator). The operator
  overwrites it on its next re-render (CRD edit, operator upgrade, Deployment deletion), so the
  script must be re-run after each.

Command line (used by ``scripts/patch_endpoint.sh``)::

    python -m k8s.patch --config config --line rag-assistant [--deployment deploy.json]

prints the JSON patch; with ``--deployment`` (the live Deployment as JSON) it also removes every
entry the patch owns first, so the result holds exactly one of each, and what only the replaced
HyperPod Tiered Storage backend needed (its shared-memory ``hostPath`` volume and the mounts of
it, see :func:`is_hyperpod_shm_volume`), so the Pods pass the line namespace's Pod Security
``baseline``. Without ``--deployment`` the output is the append-only reference variant, not
meant to be applied.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from cluster_agents import l2_janitor
from k8s import kv_transfer, names, vllm_plugins
from k8s.vllm_plugins import CHUNK_KEY_ENV
from k8s.lmcache import METRICS_DIR, POD_NAME_ENV, l2_cache_dir, lmcache_env, owned_env_names
from platform_config import BusinessLineConfig, ConfigError, PlatformConfig, load_project
from platform_config.loader import default_config_dir

#: Where the line's RWX PVC is mounted in the vLLM container (docs/sources.md §1).
L2_MOUNT_PATH: Final = "/mnt/curvine/l2cache"
#: LMCache remote URL of the fs connector at the root of that mount. Host and port are required
#: by LMCache's URL parser (``parse_remote_url`` asserts both) but ignored by the fs connector;
#: ``fs:///path`` and ``fs://localhost/path`` fail, and the failure only logs and disables L2
#: (docs/sources.md §8). Each line's pods use :func:`line_remote_url`, one directory below.
L2_REMOTE_URL: Final = "fs://localhost:0/mnt/curvine/l2cache/"

#: Host directory of the HyperPod Tiered Storage shared memory. With ``l2CacheBackend:
#: tieredstorage`` the operator gives the vLLM Pod a ``hostPath`` volume of ``/dev/shm``
#: (named ``host-shm``, mounted at ``/dev/shm/ai_toolkit_cache`` with ``subPath:
#: ai_toolkit_cache``); other renderings mount ``/dev/shm/ai_toolkit_cache`` itself as
#: ``type: File`` (docs/sources.md §9, HyperPod shared memory). Only the replaced
#: ``sagemaker-hyperpod://`` backend reads it, and Pod Security ``baseline`` forbids every
#: ``hostPath`` volume, so the L2 patch removes it.
HYPERPOD_SHM_HOST_PATH: Final = "/dev/shm"

#: ``sizeLimit`` of the vLLM container's Prometheus multiprocess ``emptyDir``
#: (:func:`metrics_volume`). ``prometheus_client`` keeps one mmap file per process and kind
#: (``counter_<pid>.db``, ``histogram_<pid>.db``, ``gauge_<mode>_<pid>.db``), each created at
#: 64 KiB and doubled when full (``mmap_dict.py``, prometheus_client 0.24.1); a pod runs the API
#: server, the engine core and one worker per TP rank (up to 10 processes at TP 8). One LMCache
#: pod process left 256 KiB (four 64 KiB files; ``make test-lmcache`` holds it under 1 MiB), so
#: 64 MiB leaves room for the files of processes that died in container restarts (the directory
#: outlives them, see docs/l2-cache.md). Disk-backed on purpose: exceeding the limit makes the
#: kubelet evict the Pod (its replacement starts with an empty directory), whereas a full
#: memory-backed ``emptyDir`` (a tmpfs capped at ``sizeLimit``) would fail ``prometheus_client``'s
#: file growth inside vLLM's and LMCache's metric updates (docs/sources.md §13).
METRICS_DIR_SIZE_LIMIT: Final = "64Mi"

#: Per-pod token of the Deployment patch: the kubelet expands ``$(KVCACHE_POD_NAME)`` in env
#: values to the pod's name (the variable is defined earlier in the same env list).
DEPLOYMENT_TMP_TOKEN: Final = f"$({POD_NAME_ENV})"

__all__ = [
    "DEPLOYMENT_TMP_TOKEN",
    "HYPERPOD_SHM_HOST_PATH",
    "L2_MOUNT_PATH",
    "L2_REMOTE_URL",
    "endpoint_json_patch",
    "find_vllm_container",
    "is_hyperpod_shm_volume",
    "line_cache_env",
    "line_remote_url",
    "metrics_volume",
    "metrics_volume_mount",
    "owned_volumes",
    "pod_env_entries",
]


def line_remote_url(platform: PlatformConfig, line: BusinessLineConfig) -> str:
    """The line's ``LMCACHE_REMOTE_URL``: ``fs://localhost:0/mnt/curvine/l2cache/<l2_cache_dir>/``.

    Chunks live in the line's model-scoped directory (:func:`k8s.lmcache.l2_cache_dir`) under
    the root of its PVC, so a model, dtype, TP-size, chunk-size, serde or LMCache change starts
    an empty directory. LMCache's fs connector creates the directory on start
    (``path.mkdir(parents=True, exist_ok=True)`` in ``FSConnector.__init__``).
    """
    return f"{L2_REMOTE_URL}{l2_cache_dir(platform, line)}/"


def line_cache_env(platform: PlatformConfig, line: BusinessLineConfig, *,
                   tmp_dir_token: str = DEPLOYMENT_TMP_TOKEN) -> dict[str, str]:
    """The cache env (name -> value) a line's inference pods must end up with.

    One source of truth for the Kyverno policy and the JSON patch; see
    :func:`k8s.lmcache.lmcache_env` for every value and why. ``tmp_dir_token`` makes the temp
    directory unique per pod (default: the kubelet-expanded pod name of the Deployment patch).
    """
    return lmcache_env(platform, line, tmp_dir_token=tmp_dir_token, remote_url=line_remote_url(platform, line))


def pod_env_entries(platform: PlatformConfig, line: BusinessLineConfig, *,
                    tmp_dir_token: str = DEPLOYMENT_TMP_TOKEN) -> list[dict[str, Any]]:
    """The env entries to append to the vLLM container, in order (Kubernetes ``EnvVar`` dicts).

    With the default token the downward-API entry ``KVCACHE_POD_NAME`` comes first, because the
    kubelet expands ``$(VAR)`` only from variables defined earlier in the list; the chunk key's
    ``secretKeyRef`` (:func:`chunk_key_env_entry`) comes last.
    """
    entries: list[dict[str, Any]] = []
    if POD_NAME_ENV in tmp_dir_token:
        entries.append({"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    entries += [{"name": k, "value": v} for k, v in line_cache_env(platform, line, tmp_dir_token=tmp_dir_token).items()]
    entries.append(chunk_key_env_entry(line))
    return entries


def chunk_key_env_entry(line: BusinessLineConfig) -> dict[str, Any]:
    """``KVCACHE_L2_KEY`` from the line's chunk-key Secret (:func:`k8s.names.chunk_key_secret_name`, data
    key :data:`cluster_agents.l2_janitor.KEY_SECRET_DATA_KEY`): a reference, never the value. Not
    optional: a Pod created before the janitor made the Secret waits (``CreateContainerConfigError``,
    retried by the kubelet) instead of writing L2 under unkeyed names (docs/security.md, "Chunk keys")."""
    return {"name": CHUNK_KEY_ENV, "valueFrom": {"secretKeyRef": {
        "name": names.chunk_key_secret_name(line), "key": l2_janitor.KEY_SECRET_DATA_KEY}}}


def l2_volume(line: BusinessLineConfig) -> dict[str, Any]:
    """The pod volume of the line's RWX PVC."""
    return {"name": names.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": names.pvc_name(line)}}


def l2_volume_mount() -> dict[str, Any]:
    """The mount of that volume in the vLLM container."""
    return {"name": names.L2_VOLUME_NAME, "mountPath": L2_MOUNT_PATH}


def metrics_volume() -> dict[str, Any]:
    """The pod volume of ``PROMETHEUS_MULTIPROC_DIR``: an ``emptyDir`` (disk-backed, at most
    :data:`METRICS_DIR_SIZE_LIMIT`), allowed by every Pod Security level."""
    return {"name": names.METRICS_VOLUME_NAME, "emptyDir": {"sizeLimit": METRICS_DIR_SIZE_LIMIT}}


def metrics_volume_mount() -> dict[str, Any]:
    """Its mount in the vLLM container, at :data:`k8s.lmcache.METRICS_DIR` (the env's value)."""
    return {"name": names.METRICS_VOLUME_NAME, "mountPath": METRICS_DIR}


def owned_volumes(line: BusinessLineConfig) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (pod volume, vLLM container mount) pair the L2 patch owns, in the order it adds them.

    The line's L2 PVC at :data:`L2_MOUNT_PATH`, the ``emptyDir`` of ``PROMETHEUS_MULTIPROC_DIR``,
    and the vLLM plugin ConfigMap (the L2 gate, read-only at :data:`k8s.vllm_plugins.PLUGIN_DIR`).
    The Kyverno policy and :func:`endpoint_json_patch` both remove
    any volume with one of these names, and any vLLM mount of one of these names or at one of
    these paths, before adding exactly one of each.
    """
    return [(l2_volume(line), l2_volume_mount()), (metrics_volume(), metrics_volume_mount()),
            (vllm_plugins.volume(), vllm_plugins.volume_mount())]


def is_hyperpod_shm_volume(volume: dict[str, Any]) -> bool:
    """True for a pod volume that is a ``hostPath`` of :data:`HYPERPOD_SHM_HOST_PATH` or of a path
    under it (``/dev/shm``, ``/dev/shm/``, ``/dev/shm/ai_toolkit_cache``), whatever its name.

    The same test as the Kyverno policy's JMESPath (:func:`k8s.kyverno.shm_volume_jmespath`).
    """
    path = (volume.get("hostPath") or {}).get("path")
    if not isinstance(path, str):
        return False
    return path == HYPERPOD_SHM_HOST_PATH or path.startswith(HYPERPOD_SHM_HOST_PATH + "/")


def find_vllm_container(pod_spec: dict[str, Any], line: BusinessLineConfig) -> int:
    """Index of the vLLM container in a pod spec rendered by the operator.

    The vLLM container is the one exposing ``worker.modelInvocationPort`` (the CRD: "the port
    at which the model server will listen"), or else the one named after the endpoint (the
    operator names its model container after the InferenceEndpointConfig).

    Raises:
        ValueError: no container matches (not an inference pod of this line).
    """
    containers = pod_spec.get("containers") or []
    for i, c in enumerate(containers):
        if any(p.get("containerPort") == line.vllm.port for p in c.get("ports") or []):
            return i
    for i, c in enumerate(containers):
        if c.get("name") == names.endpoint_name(line):
            return i
    raise ValueError(
        f"no container exposes port {line.vllm.port} or is named {names.endpoint_name(line)!r}; "
        f"containers: {[c.get('name') for c in containers]}")


def _removals(base: str, items: list[dict[str, Any]], key: str, doomed) -> list[dict[str, Any]]:
    """test+remove ops for every item with ``doomed(item)``, highest index first (indices stay valid)."""
    ops: list[dict[str, Any]] = []
    for i in reversed(range(len(items))):
        if doomed(items[i]):
            ops.append({"op": "test", "path": f"{base}/{i}/{key}", "value": items[i][key]})
            ops.append({"op": "remove", "path": f"{base}/{i}"})
    return ops


def endpoint_json_patch(platform: PlatformConfig, line: BusinessLineConfig, *,
                        deployment: dict[str, Any] | None = None) -> list[dict]:
    """RFC 6902 operations that put the operator-rendered Deployment of ``line`` on the L2 tier.

    Args:
        platform: the platform config.
        line: the business line (its Deployment is named :func:`k8s.names.endpoint_name`).
        deployment: the live Deployment (``kubectl get deploy -o json``). When given, the patch
            first removes every volume of :func:`owned_volumes` (by name: ``curvine-l2-cache``,
            ``prometheus-multiproc``), every vLLM mount of one of them or at one of their paths,
            and every env entry the patch owns
            (:func:`k8s.lmcache.owned_env_names`: the operator may inject its own
            ``LMCACHE_REMOTE_URL`` / ``LMCACHE_EXTRA_CONFIG`` / ``LMCACHE_MAX_LOCAL_CPU_SIZE``,
            the CR adds ``LMCACHE_REMOTE_SERDE`` / ``PYTHONHASHSEED``), and every HyperPod
            shared-memory ``hostPath`` volume (:func:`is_hyperpod_shm_volume`) with every mount
            of it in any container or init container, each guarded by a ``test`` op so a
            concurrent change fails the patch instead of removing the wrong entry; the result
            holds exactly one of each and no shared-memory ``hostPath`` (Pod Security
            ``baseline`` would refuse the Pods). It also replaces the vLLM container's ``args``
            with :func:`k8s.kv_transfer.completed_args` of them (the operator's
            ``--kv-transfer-config`` value completed with ``kv_load_failure_policy: recompute``),
            behind a ``test`` of the live list. Without it, the result is only a
            *reference* (``dist/patches/<line>.reference.json``): it assumes vLLM is container 0
            and only appends, so the operator's entries stay beside ours (the kubelet uses the
            last of duplicate names; vLLM the last ``--kv-transfer-config``, which the reference
            appends complete). ``scripts/patch_endpoint.sh`` always passes the live Deployment.

    Returns:
        The operations, in order (a JSON-serialisable list of dicts).

    Raises:
        ValueError: ``deployment`` has no vLLM container (see :func:`find_vllm_container`), or its
            ``--kv-transfer-config`` has no value or one that is not a JSON object.
    """
    spec_path = "/spec/template/spec"
    ops: list[dict[str, Any]] = []
    if deployment is None:
        idx = 0
        has = {"volumes": True, "volumeMounts": True, "env": True}
    else:
        pod_spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
        idx = find_vllm_container(pod_spec, line)
        container = pod_spec["containers"][idx]
        cpath = f"{spec_path}/containers/{idx}"
        volumes = pod_spec.get("volumes") or []
        mounts = container.get("volumeMounts") or []
        env = container.get("env") or []
        owned = set(owned_env_names(line))
        owned_volume_names = {v["name"] for v, _ in owned_volumes(line)}
        owned_paths = {m["mountPath"] for _, m in owned_volumes(line)}
        # Only the replaced Tiered Storage backend used the shared-memory hostPath: drop it and
        # every mount of it (a mount of a missing volume would make the Pod invalid).
        shm_names = {v.get("name") for v in volumes if is_hyperpod_shm_volume(v)}
        ops += _removals(f"{spec_path}/volumes", volumes, "name",
                         lambda v: v.get("name") in owned_volume_names or is_hyperpod_shm_volume(v))
        ops += _removals(f"{cpath}/volumeMounts", mounts, "name",
                         lambda m: m.get("name") in owned_volume_names or m.get("mountPath") in owned_paths
                         or m.get("name") in shm_names)
        for kind in ("containers", "initContainers"):
            for i, other in enumerate(pod_spec.get(kind) or []):
                if kind == "containers" and i == idx:
                    continue
                ops += _removals(f"{spec_path}/{kind}/{i}/volumeMounts", other.get("volumeMounts") or [], "name",
                                 lambda m: m.get("name") in shm_names)
        ops += _removals(f"{cpath}/env", env, "name", lambda e: e.get("name") in owned)
        live_args = container.get("args")
        args = kv_transfer.completed_args(live_args or [])
        if live_args != args:
            if live_args is not None:
                ops.append({"op": "test", "path": f"{cpath}/args", "value": list(live_args)})
            ops.append({"op": "replace" if live_args is not None else "add", "path": f"{cpath}/args", "value": args})
        has = {"volumes": "volumes" in pod_spec, "volumeMounts": "volumeMounts" in container, "env": "env" in container}
    cpath = f"{spec_path}/containers/{idx}"
    for key, path in (("volumes", f"{spec_path}/volumes"), ("volumeMounts", f"{cpath}/volumeMounts"),
                      ("env", f"{cpath}/env")):
        if not has[key]:
            ops.append({"op": "add", "path": path, "value": []})
    if deployment is not None:
        # The label of the L2 mutation, as the Kyverno policy sets it (verify.py checks it).
        ops.append({"op": "add", "path": f"/spec/template/metadata/labels/{names.L2_MUTATED_LABEL_POINTER}",
                    "value": names.L2_MUTATED_VALUE})
    for volume, mount in owned_volumes(line):
        ops.append({"op": "add", "path": f"{spec_path}/volumes/-", "value": volume})
        ops.append({"op": "add", "path": f"{cpath}/volumeMounts/-", "value": mount})
    for entry in pod_env_entries(platform, line):
        ops.append({"op": "add", "path": f"{cpath}/env/-", "value": entry})
    if deployment is None:
        ops += [{"op": "add", "path": f"{cpath}/args/-", "value": item}
                for item in (kv_transfer.KV_TRANSFER_FLAG, kv_transfer.settings_json(kv_transfer.PLATFORM_SETTINGS))]
    return ops


def main(argv: list[str] | None = None) -> int:
    """CLI: print the JSON patch of one line; exit 2 with the config problems on bad input."""
    parser = argparse.ArgumentParser(prog="python -m k8s.patch", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None,
                        help="config directory (default: $KVCACHE_CONFIG_DIR, else the repository's config/)")
    parser.add_argument("--line", required=True, help="business line name (file stem in business-lines/)")
    parser.add_argument("--deployment", type=Path, help="live Deployment as JSON (kubectl get deploy -o json)")
    args = parser.parse_args(argv)
    try:
        project = load_project(args.config if args.config is not None else default_config_dir())
        line = project.business_line(args.line)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if not line.cache.l2_enabled:
        print(f"error: business line {line.name!r} has cache.l2_enabled: false; nothing to patch", file=sys.stderr)
        return 2
    deployment = None
    if args.deployment is not None:
        try:
            deployment = json.loads(args.deployment.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"error: cannot read {args.deployment}: {exc}", file=sys.stderr)
            return 2
    try:
        ops = endpoint_json_patch(project.platform, line, deployment=deployment)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json.dump(ops, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
