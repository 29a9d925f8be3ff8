"""The Kubernetes side of a line's cross-pod hit canary (its logic is :mod:`kv_tools.kv_canary`).

Objects, all in the line's namespace (docs/observability.md, "The cross-pod hit canary"):

* ConfigMap ``kv-canary``: ``canary.json`` (:func:`canary_config`) and ``kv_canary.py``, standard
  library only, so the janitor's pinned Python image runs it with no build step;
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

import json
from pathlib import Path
from typing import Any, Final

import cdk8s
from constructs import Construct

from k8s import names
from k8s.janitor import config_hash
from k8s.kube import k8s
from k8s.nodes import HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE
from kv_tools import kv_canary
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
    """``canary.json`` of the line (the fields of :class:`kv_tools.kv_canary.CanaryConfig`):
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


def _q(value: str) -> k8s.Quantity:
    return k8s.Quantity.from_string(value)


class KvCanary(Construct):
    """The canary's ConfigMap, RBAC and Deployment for one line (see the module docstring).

    Attributes:
        objects: every ApiObject, for dependency wiring; ``deployment``: the Deployment.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 line: BusinessLineConfig) -> None:
        super().__init__(scope, construct_id)
        ns = line.namespace
        meta = k8s.ObjectMeta(name=NAME, namespace=ns, labels=LABELS)
        data = {CONFIG_FILE: json.dumps(canary_config(line), indent=2, sort_keys=True) + "\n",
                SCRIPT_FILE: Path(kv_canary.__file__).read_text(encoding="utf-8")}
        self.config_map = k8s.KubeConfigMap(self, "Config", metadata=meta, data=data)
        self.service_account = k8s.KubeServiceAccount(self, "ServiceAccount", metadata=meta)
        self.role = k8s.KubeRole(self, "Role", metadata=meta, rules=[
            k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])])
        self.role_binding = k8s.KubeRoleBinding(
            self, "RoleBinding", metadata=meta,
            role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=NAME),
            subjects=[k8s.Subject(kind="ServiceAccount", name=NAME, namespace=ns)])
        self.role_binding.add_dependency(self.role, self.service_account)
        container = k8s.Container(
            name="canary", image=platform.versions.images.l2_janitor,
            command=["python3", f"{CONFIG_DIR}/{SCRIPT_FILE}", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}",
                     "--serve", "--port", str(kv_canary.METRICS_PORT)],
            env=[k8s.EnvVar(name="PYTHONDONTWRITEBYTECODE", value="1"),
                 k8s.EnvVar(name="PYTHONUNBUFFERED", value="1")],
            ports=[k8s.ContainerPort(name=names.KV_CANARY_METRICS_PORT_NAME,
                                     container_port=kv_canary.METRICS_PORT, protocol="TCP")],
            liveness_probe=k8s.Probe(
                http_get=k8s.HttpGetAction(path=kv_canary.LIVENESS_PATH,
                                           port=k8s.IntOrString.from_string(names.KV_CANARY_METRICS_PORT_NAME)),
                period_seconds=LIVENESS_PERIOD_S, failure_threshold=3, timeout_seconds=5),
            resources=k8s.ResourceRequirements(
                requests={k: _q(v) for k, v in RESOURCES["requests"].items()},
                limits={k: _q(v) for k, v in RESOURCES["limits"].items()}),
            volume_mounts=[k8s.VolumeMount(name="config", mount_path=CONFIG_DIR, read_only=True)],
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
            volumes=[k8s.Volume(name="config", config_map=k8s.ConfigMapVolumeSource(name=NAME))])
        self.deployment = k8s.KubeDeployment(self, "Deployment", metadata=meta, spec=k8s.DeploymentSpec(
            replicas=1, strategy=k8s.DeploymentStrategy(type="Recreate"), revision_history_limit=3,
            selector=k8s.LabelSelector(match_labels=LABELS),
            template=k8s.PodTemplateSpec(
                metadata=k8s.ObjectMeta(labels=LABELS, annotations={CONFIG_HASH_ANNOTATION: config_hash(data)}),
                spec=pod_spec)))
        self.deployment.add_dependency(self.config_map, self.role_binding)
        self.objects: list[cdk8s.ApiObject] = [self.config_map, self.service_account, self.role, self.role_binding,
                                               self.deployment]
