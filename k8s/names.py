"""Object names shared by the charts, the policy, the patch script and the post-deploy checks.

Derived, never repeated: a business line ``rag-assistant`` gets an InferenceEndpointConfig
``rag-assistant`` (whose pods the operator labels ``app: rag-assistant``), a PVC
``rag-assistant-l2-cache`` and a Kyverno Policy ``rag-assistant-l2-cache`` in its namespace.
"""

from __future__ import annotations

from typing import Final

from platform_config import BusinessLineConfig, PlatformConfig

#: Curvine Primary StatefulSet and its headless Service (same name, so pod 0 resolves as
#: ``curvine-master-0.curvine-master.<ns>.svc.cluster.local``).
CURVINE_MASTER: Final = "curvine-master"
CURVINE_WORKER: Final = "curvine-worker"
CURVINE_CONFIG_MAP: Final = "curvine-config"
CURVINE_CONFIG_FILE: Final = "curvine-cluster.toml"
#: Absolute path of the config inside every Curvine container (passed via CURVINE_CONF_FILE).
CURVINE_CONFIG_DIR: Final = "/etc/curvine"
CURVINE_PRIMARY_PV: Final = "curvine-primary-meta"
CSI_DRIVER_NAME: Final = "curvine"
CSI_CONTROLLER: Final = "curvine-csi-controller"
CSI_NODE: Final = "curvine-csi-node"

#: Label the operator puts on the pods of an InferenceEndpointConfig: ``app=<metadata.name>``.
#: Source: the reference deployment's procedure (``kubectl get pods -l app=<endpoint>``,
#: docs/sources.md §1 blog); the CRD itself documents no pod labels.
OPERATOR_POD_LABEL: Final = "app"

#: Pod-level volume name of the line's L2 PVC in the inference pods.
L2_VOLUME_NAME: Final = "curvine-l2-cache"
#: Pod-level volume name of the ``emptyDir`` that holds Prometheus' multiprocess files in the
#: inference pods (``PROMETHEUS_MULTIPROC_DIR``, :data:`k8s.lmcache.PROMETHEUS_MULTIPROC_DIR_ENV`).
METRICS_VOLUME_NAME: Final = "prometheus-multiproc"


def cluster_domain_host(platform: PlatformConfig) -> str:
    """FQDN of the Curvine Primary pod (StatefulSet pod 0 behind the headless Service)."""
    ns = platform.curvine.namespace
    return f"{CURVINE_MASTER}-0.{CURVINE_MASTER}.{ns}.svc.cluster.local"


def endpoint_name(line: BusinessLineConfig) -> str:
    """``metadata.name`` of the line's InferenceEndpointConfig (and of its Deployment)."""
    return line.name


def pvc_name(line: BusinessLineConfig) -> str:
    """The line's RWX PVC on the Curvine StorageClass (its own L2 directory)."""
    return f"{line.name}-l2-cache"


#: Prefix of a line's chunk-key Secret (docs/security.md, "Chunk keys"); the generation follows.
CHUNK_KEY_SECRET_PREFIX: Final = "kvcache-l2-key-"


def chunk_key_secret_name(line: BusinessLineConfig) -> str:
    """The line's chunk-key Secret: ``kvcache-l2-key-<cache.chunk_key_generation>`` in its namespace,
    created by its L2 janitor (:class:`cluster_agents.l2_janitor.ChunkKey`), never by a template."""
    return f"{CHUNK_KEY_SECRET_PREFIX}{line.cache.chunk_key_generation}"


def policy_name(line: BusinessLineConfig) -> str:
    """The line's Kyverno Policy."""
    return f"{line.name}-l2-cache"


def gateway_name(line: BusinessLineConfig) -> str:
    """The ``InferenceGatewayConfig`` a gateway line's endpoint attaches to (``spec.inferenceGateway.name``),
    in the line's namespace: the operator creates it and writes the line's scheduler entry into it
    (docs/routing.md, "Routing a line by the HyperPod Inference Gateway"). Named, so an operator finds it;
    left empty, the operator would generate ``inf-igw-<uuid>`` (docs/sources.md §31)."""
    return f"{line.name}-gateway"


def gateway_policy_name(line: BusinessLineConfig) -> str:
    """The line's Kyverno Policy that adds its ``gateway.jwt`` and ``gateway.weights`` to
    :func:`gateway_name` (:mod:`k8s.gateway_policy`)."""
    return f"{line.name}-gateway-settings"


def line_chart_name(line: BusinessLineConfig) -> str:
    """Key of the line's chart in :func:`k8s.render.render_manifests` and its dist/ file stem."""
    return f"line-{line.name}"


#: Pod label the line's Kyverno Policy sets on every inference Pod it mutated onto the L2 tier
#: (value :data:`L2_MUTATED_VALUE`). verify.py and the "pod without the L2 mutation" alert look
#: for pods of a line that lack it.
#: ConfigMap (and pod volume) of the vLLM plugin files every vLLM pod of an L2 line loads: the L2
#: gate (:mod:`k8s.vllm_plugins`).
VLLM_PLUGINS: Final = "kvcache-vllm-plugins"
L2_MUTATED_LABEL: Final = "kvcache.io/l2-cache"
L2_MUTATED_VALUE: Final = "curvine"
#: :data:`L2_MUTATED_LABEL` as one JSON Pointer token (RFC 6901: ``~`` -> ``~0``, ``/`` -> ``~1``),
#: for the JSON patches that add it under ``.../metadata/labels/``.
L2_MUTATED_LABEL_POINTER: Final = L2_MUTATED_LABEL.replace("~", "~0").replace("/", "~1")

#: The per-line L2 janitor (k8s/janitor.py): object name, the pod label the observability stack's
#: scrape job selects on (observability/targets.py) and the name of its container port serving
#: ``/metrics`` (the port number is :data:`cluster_agents.l2_janitor.METRICS_PORT`).
L2_JANITOR: Final = "l2-janitor"
L2_JANITOR_COMPONENT_LABEL: Final = ("app.kubernetes.io/component", L2_JANITOR)
L2_JANITOR_METRICS_PORT_NAME: Final = "metrics"

#: The L2 mount watchdog (k8s/mount_watchdog.py, a DaemonSet in Curvine's namespace): object name
#: (also its ServiceAccount, which each L2 line's RoleBinding names), the pod label the scrape job
#: selects on and the name of its container port serving ``/metrics`` (the number is
#: :data:`cluster_agents.l2_mount_watchdog.METRICS_PORT`).
L2_MOUNT_WATCHDOG: Final = "l2-mount-watchdog"
L2_MOUNT_WATCHDOG_COMPONENT_LABEL: Final = ("app.kubernetes.io/component", L2_MOUNT_WATCHDOG)
L2_MOUNT_WATCHDOG_METRICS_PORT_NAME: Final = "metrics"
#: The node filter of Curvine's host-network ports (k8s/node_firewall.py, a DaemonSet in Curvine's
#: namespace): object name, pod label, metrics port name (the number is
#: :data:`cluster_agents.node_firewall.METRICS_PORT`, on the host network).
NODE_FIREWALL: Final = "node-firewall"
NODE_FIREWALL_COMPONENT_LABEL: Final = ("app.kubernetes.io/component", NODE_FIREWALL)
NODE_FIREWALL_METRICS_PORT_NAME: Final = "metrics"
#: The per-line cross-pod hit canary (k8s/canary.py): object name, the pod label the observability
#: stack's scrape job selects on (observability/targets.py) and its metrics port's name (its number
#: is :data:`cluster_agents.kv_canary.METRICS_PORT`, the janitor's 9100: one scraper port for both).
KV_CANARY: Final = "kv-canary"
KV_CANARY_COMPONENT_LABEL: Final = ("app.kubernetes.io/component", KV_CANARY)
KV_CANARY_METRICS_PORT_NAME: Final = "metrics"
#: Name of vLLM's container port in the operator-rendered Pods (``modelInvocationPort.name``,
#: k8s/line_chart.py), which the canary sends its requests to.
VLLM_PORT_NAME: Final = "http"
