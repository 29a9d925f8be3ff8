"""The Kubernetes side of a line's cross-pod hit canary (its logic is :mod:`cluster_agents.kv_canary`).

Objects, all in the line's namespace (docs/observability.md, "The cross-pod hit canary"):

* ConfigMap ``kv-canary``: ``canary.json`` (:func:`canary_config`), ``kv_canary.py`` and
  ``agent_core.py``, standard library only, so the janitor's pinned Python image runs it with no
  build step (:class:`k8s.agent.LineAgent`);
* ServiceAccount, Role and RoleBinding ``kv-canary``: ``list`` on ``pods`` in this namespace,
  nothing else (the canary finds the replicas' Pod IPs and L2 directories there);
* Deployment ``kv-canary``: one replica, ``Recreate`` (never two canaries at once: the request
  rate stays 2 per period), ``kv_canary.py --serve``, metrics on container port ``metrics``
  (9100, Pod label ``app.kubernetes.io/component=kv-canary``, what the observability stack
  scrapes). It mounts no volume but its ConfigMap and runs as an unprivileged user with a
  read-only root file system (Pod Security ``restricted``); it is kept off the HyperPod nodes
  (node affinity), so it takes nothing from the GPU nodes' budget.

With ``canary.enabled: false`` (or L2 off) none of these is rendered.
"""

from __future__ import annotations

from typing import Any, Final

from constructs import Construct

from k8s import agent, names
from k8s.kube import k8s
from k8s.nodes import HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE
from cluster_agents import kv_canary
from platform_config import BusinessLineConfig, PlatformConfig

NAME: Final = names.KV_CANARY
CONFIG_FILE: Final = "canary.json"
SCRIPT_FILE: Final = "kv_canary.py"
CONFIG_DIR: Final = "/opt/kvcache-canary"
#: Pod-template annotation holding the SHA-256 of the ConfigMap's data (rolls the Pod on a change).
CONFIG_HASH_ANNOTATION: Final = "kvcache.io/kv-canary-config-sha256"
#: Unprivileged uid/gid of the canary (``nobody``): it reads its ConfigMap and opens sockets only.
RUN_AS_USER: Final = 65534
#: Requests and limits: one run every few minutes, two HTTP requests and a few /metrics reads.
RESOURCES: Final = {"requests": {"cpu": "20m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}}
#: Liveness probe on ``/healthz`` every 60 s, 3 failures.
LIVENESS_PERIOD_S: Final = 60
#: Pod labels; deliberately not the operator's ``app=<line>`` (the vLLM scrape job's selector).
LABELS: Final = {"app.kubernetes.io/name": NAME, names.KV_CANARY_COMPONENT_LABEL[0]: names.KV_CANARY_COMPONENT_LABEL[1]}


def enabled(platform: PlatformConfig, line: BusinessLineConfig) -> bool:
    """Whether the line runs a canary: L2 on (and Curvine on) and ``canary.enabled``."""
    return platform.curvine.enabled and line.runs_canary


def canary_config(line: BusinessLineConfig) -> dict[str, Any]:
    """``canary.json`` of the line (the fields of :class:`cluster_agents.kv_canary.CanaryConfig`):
    the endpoint Pods' label, vLLM's port and its name, the chunk size, ``canary.prompt_chunks``
    and ``canary.period_minutes`` in seconds."""
    config = {
        "line": line.name,
        "namespace": line.namespace,
        "pod_label": [names.OPERATOR_POD_LABEL, names.endpoint_name(line)],
        "port": line.vllm.port,
        "port_name": names.VLLM_PORT_NAME,
        "chunk_size": line.cache.chunk_size_tokens,
        "prompt_chunks": line.canary.prompt_chunks,
        "period_s": line.canary.period_minutes * 60,
    }
    kv_canary.config_from_dict(config)  # the same validation the canary applies at run time
    return config


class KvCanary(agent.LineAgent):
    """The canary's ConfigMap, RBAC and Deployment for one line (see the module docstring and
    :class:`k8s.agent.LineAgent` for the attributes)."""

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 line: BusinessLineConfig) -> None:
        super().__init__(scope, construct_id, name=NAME, namespace=line.namespace, labels=LABELS, script=SCRIPT_FILE,
                         config_file=CONFIG_FILE, config=canary_config(line), config_dir=CONFIG_DIR,
                         hash_annotation=CONFIG_HASH_ANNOTATION)
        container = k8s.Container(
            name="canary", image=platform.versions.images.l2_janitor,
            command=[*self.command, "--serve", "--port", str(kv_canary.METRICS_PORT)],
            env=agent.python_env(),
            ports=[k8s.ContainerPort(name=names.KV_CANARY_METRICS_PORT_NAME,
                                     container_port=kv_canary.METRICS_PORT, protocol="TCP")],
            liveness_probe=agent.http_probe(kv_canary.LIVENESS_PATH, names.KV_CANARY_METRICS_PORT_NAME,
                                            period_s=LIVENESS_PERIOD_S, failures=3),
            resources=agent.resources(RESOURCES),
            volume_mounts=[self.volume_mount],
            security_context=k8s.SecurityContext(
                run_as_user=RUN_AS_USER, run_as_group=RUN_AS_USER, run_as_non_root=True,
                allow_privilege_escalation=False, privileged=False, read_only_root_filesystem=True,
                capabilities=k8s.Capabilities(drop=["ALL"]), seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault")),
            termination_message_policy="FallbackToLogsOnError")
        pod_spec = k8s.PodSpec(
            service_account_name=NAME, containers=[container], automount_service_account_token=True,
            # Off the HyperPod nodes: it needs no GPU and no L2 mount.
            affinity=k8s.Affinity(node_affinity=k8s.NodeAffinity(
                required_during_scheduling_ignored_during_execution=k8s.NodeSelector(node_selector_terms=[
                    k8s.NodeSelectorTerm(match_expressions=[k8s.NodeSelectorRequirement(
                        key=HYPERPOD_NODE_LABEL, operator="NotIn", values=[HYPERPOD_NODE_VALUE])])]))),
            volumes=[self.volume])
        self.deploy(pod_spec)
