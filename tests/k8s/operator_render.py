"""What the HyperPod inference operator renders for a line, as far as the L2 patch cares.

Modelled on the reference deployment (docs/sources.md §1): pods labelled ``app=<endpoint>``,
three containers (vLLM first, named after the endpoint, then reverse-proxy and otel-collector),
the operator's own ``LMCACHE_REMOTE_URL=sagemaker-hyperpod://$(NODE_IP):9200`` and
``LMCACHE_EXTRA_CONFIG`` (the HyperPod shared-memory setting), plus whatever the CR carried.

The Tiered Storage shared memory (docs/sources.md §9, HyperPod shared memory): a third-party
troubleshooting report of an operator-rendered L2 Pod (``l2CacheBackend: tieredstorage``) shows
``volumes: [{name: host-shm, hostPath: {path: /dev/shm}}]`` and, in the vLLM container,
``{name: host-shm, mountPath: /dev/shm/ai_toolkit_cache, subPath: ai_toolkit_cache}``; the
SageMaker guide's Ray Serve page asks for the same volume and mount by hand. That is the default
here (``shm="directory"``). ``shm="file"`` is the other reported shape: a ``hostPath`` of
``/dev/shm/ai_toolkit_cache`` itself, ``type: File``, mounted at the same path.

Not modelled, because no public source shows them: the operator's real sidecar names, images,
ports and security contexts (the report only counts "model + sidecar + otel", 3/3), its probes,
resources, node affinity, service account, the ``lmcache-config`` volume the same report saw
mounted, the model volume's real type (an ``emptyDir`` here, the S3/FSx PVC in reality), and
any field the operator might set on the Pod that Pod Security ``baseline`` restricts
(``hostNetwork``/``hostPID``/``hostIPC``, ``privileged``, added capabilities, ``hostPort``,
seccomp, SELinux, AppArmor, ``procMount``, sysctls): none is reported, so none is rendered.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from k8s import names
from platform_config import BusinessLineConfig

OPERATOR_URL = "sagemaker-hyperpod://$(NODE_IP):9200"
#: The ai-toolkit shared-memory segment and the operator's volume for it (see the docstring).
SHM_NAME = "ai_toolkit_cache"
SHM_VOLUME = "host-shm"
OPERATOR_EXTRA = json.dumps({"sagemaker_hyperpod_bucket": "lmcache",
                             "sagemaker_hyperpod_shared_memory_name": "ai_toolkit_cache"})
#: The KV connector the operator adds to the vLLM args, two items (a rendered Deployment quoted in
#: LMCache PR #2732; FACTS.md §5), with the spacing of a Python ``json.dumps`` so a test can tell
#: the rewritten value (Go's compact JSON) from it.
OPERATOR_KV_TRANSFER = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})


def operator_args(line: BusinessLineConfig, kv_transfer: str | None = "separate") -> list[str]:
    """The vLLM container's args: the CR's ``worker.args`` (``vllm.args``), then the operator's KV
    connector. ``kv_transfer``: ``"separate"`` (``--kv-transfer-config``, VALUE: the reported
    shape), ``"equals"`` (``--kv-transfer-config=VALUE``), or None (no connector flag)."""
    args = list(line.vllm.args)
    if kv_transfer == "separate":
        return args + ["--kv-transfer-config", OPERATOR_KV_TRANSFER]
    if kv_transfer == "equals":
        return args + [f"--kv-transfer-config={OPERATOR_KV_TRANSFER}"]
    if kv_transfer is None:
        return args
    raise ValueError(f"kv_transfer: {kv_transfer!r}")


def vllm_env(line: BusinessLineConfig, *, strip_cr_lmcache: bool = False, duplicates: bool = True) -> list[dict]:
    """The vLLM container's env as the operator renders it.

    ``strip_cr_lmcache``: the operator versions that drop every LMCACHE_* of the CR.
    ``duplicates``: a CR that also declared LMCACHE_REMOTE_URL (a second entry).
    """
    env: list[dict[str, Any]] = [
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "LMCACHE_REMOTE_URL", "value": OPERATOR_URL},
        {"name": "LMCACHE_EXTRA_CONFIG", "value": OPERATOR_EXTRA},
        {"name": "LMCACHE_LOCAL_CPU", "value": "True"},
        {"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "20"},
    ]
    if not strip_cr_lmcache:
        env.append({"name": "LMCACHE_REMOTE_SERDE", "value": "naive"})
        if duplicates:
            env.append({"name": "LMCACHE_REMOTE_URL", "value": "fs://localhost:0/somewhere/else/"})
    env.append({"name": "PYTHONHASHSEED", "value": str(line.python_hash_seed)})
    if duplicates:
        env.append({"name": "PYTHONHASHSEED", "value": "12345"})
    return env


def shm_volume_and_mount(shm: str | None) -> tuple[list[dict], list[dict]]:
    """The shared-memory ``hostPath`` volume and the vLLM container's mount of it.

    ``shm``: ``"directory"`` (``/dev/shm`` with a ``subPath``, the operator's reported shape),
    ``"file"`` (``/dev/shm/ai_toolkit_cache``, ``type: File``), or None (no L2 backend volume).
    """
    mount_path = f"/dev/shm/{SHM_NAME}"
    if shm is None:
        return [], []
    if shm == "directory":
        return ([{"name": SHM_VOLUME, "hostPath": {"path": "/dev/shm"}}],
                [{"name": SHM_VOLUME, "mountPath": mount_path, "subPath": SHM_NAME}])
    if shm == "file":
        return ([{"name": SHM_VOLUME, "hostPath": {"path": mount_path, "type": "File"}}],
                [{"name": SHM_VOLUME, "mountPath": mount_path}])
    raise ValueError(f"shm: {shm!r}")


def pod_spec(line: BusinessLineConfig, *, shm: str | None = "auto", kv_transfer: str | None = "separate",
             **env_kwargs: Any) -> dict[str, Any]:
    """The pod template spec of the operator's Deployment (``shm``: see :func:`shm_volume_and_mount`;
    ``kv_transfer``: see :func:`operator_args`).

    ``shm="auto"``: the reported ``"directory"`` shape for a line with L2 on (the reports show it
    for ``l2CacheBackend: tieredstorage``), none for a line with L2 off (not modelled otherwise:
    nothing public shows the operator's L1-only pod).
    """
    name = names.endpoint_name(line)
    if shm == "auto":
        shm = "directory" if line.cache.l2_enabled else None
    shm_volumes, shm_mounts = shm_volume_and_mount(shm)
    return {
        "containers": [
            {
                "name": name,
                "image": line.vllm.image,
                "args": operator_args(line, kv_transfer),
                "ports": [{"containerPort": line.vllm.port, "name": "http", "protocol": "TCP"}],
                "env": vllm_env(line, **env_kwargs),
                "volumeMounts": [{"name": "model-weights", "mountPath": line.vllm.model_mount_path}, *shm_mounts],
            },
            {
                "name": "reverse-proxy",
                "image": "public.ecr.aws/example/reverse-proxy:1.0.0",
                "ports": [{"containerPort": 8081, "name": "proxy", "protocol": "TCP"}],
                "env": [{"name": "LMCACHE_REMOTE_URL", "value": "untouched-sidecar"}],
            },
            {
                "name": "otel-collector",
                "image": "public.ecr.aws/example/otel-collector:1.0.0",
                "volumeMounts": [{"name": "otel-config", "mountPath": "/etc/otel"}],
            },
        ],
        "volumes": [
            {"name": "model-weights", "emptyDir": {}},
            {"name": "otel-config", "emptyDir": {}},
            *shm_volumes,
        ],
    }


def pod(line: BusinessLineConfig, **kwargs: Any) -> dict[str, Any]:
    """A Pod of the operator's Deployment, as the ReplicaSet controller submits it (``kwargs``:
    those of :func:`pod_spec`)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": f"{names.endpoint_name(line)}-5d8f7c9b4-", "namespace": line.namespace,
                     "labels": {names.OPERATOR_POD_LABEL: names.endpoint_name(line), "pod-template-hash": "5d8f7c9b4"}},
        "spec": pod_spec(line, **kwargs),
    }


def deployment(line: BusinessLineConfig, **kwargs: Any) -> dict[str, Any]:
    """The operator-rendered Deployment."""
    name = names.endpoint_name(line)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": line.namespace},
        "spec": {
            "replicas": line.replicas,
            "selector": {"matchLabels": {names.OPERATOR_POD_LABEL: name}},
            "template": {"metadata": {"labels": {names.OPERATOR_POD_LABEL: name}},
                         "spec": pod_spec(line, **kwargs)},
        },
    }


def pod_from_deployment(dep: dict[str, Any]) -> dict[str, Any]:
    """The Pod the ReplicaSet controller creates from a Deployment's template."""
    tpl = copy.deepcopy(dep["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**tpl["metadata"], "namespace": dep["metadata"]["namespace"],
                         "generateName": f"{dep['metadata']['name']}-5d8f7c9b4-"},
            "spec": tpl["spec"]}
