"""What the objects of the three in-cluster agents share (:mod:`k8s.janitor`, :mod:`k8s.mount_watchdog`,
:mod:`k8s.canary`): each runs a standard-library script from its ConfigMap on the pinned ``python``
image, with ``agent_core.py`` (:mod:`cluster_agents.agent_core`), which every script imports, beside it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import cdk8s
from constructs import Construct

from k8s.kube import k8s
from cluster_agents import agent_core

SCRIPTS_DIR = Path(agent_core.__file__).parent
CORE_FILE = "agent_core.py"
VOLUME = "config"


@functools.cache
def source(file: str) -> str:
    """The text of ``cluster_agents/<file>``, read once per process (every line ships two agents)."""
    return (SCRIPTS_DIR / file).read_text(encoding="utf-8")


def config_hash(data: dict[str, str]) -> str:
    """SHA-256 (hex) of a ConfigMap's data, keys sorted: the pod-template annotation."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()


#: API group of Roles, ClusterRoles and their bindings.
RBAC_API_GROUP = "rbac.authorization.k8s.io"


class ScriptAgent(Construct):
    """An agent's ConfigMap (construct ``Config``) and ServiceAccount (``ServiceAccount``), both
    named ``name`` in ``namespace`` with ``labels``; subclasses add the RBAC and the workload.

    Args:
        script: the script's file name in ``cluster_agents/``.
        config_file, config: the JSON config's file name and content (written indented, keys sorted).
        config_dir: where the container mounts the ConfigMap.
        hash_annotation: the pod-template annotation that gets :func:`config_hash` of the data.
        extra_files: more files of the ConfigMap, file name -> text (a module the script imports, texts).

    Attributes:
        metadata, labels: of every object of the agent (``labels`` also of its Pods).
        data: the ConfigMap's data, file name -> text: ``config_file``, ``script``, ``agent_core.py``
            and ``extra_files``.
        config_map, service_account: the two objects.
        command: ``python3 <config_dir>/<script> --config <config_dir>/<config_file>``; the agent
            appends its flags.
        volume, volume_mount: the ConfigMap as volume ``config``, mounted read-only at ``config_dir``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, name: str, namespace: str, labels: dict[str, str],
                 script: str, config_file: str, config: dict[str, Any], config_dir: str, hash_annotation: str,
                 extra_files: dict[str, str] | None = None) -> None:
        super().__init__(scope, construct_id)
        self.labels = labels
        self.metadata = k8s.ObjectMeta(name=name, namespace=namespace, labels=labels)
        self.data = {config_file: json.dumps(config, indent=2, sort_keys=True) + "\n",
                     script: source(script), CORE_FILE: source(CORE_FILE), **(extra_files or {})}
        self.config_map = k8s.KubeConfigMap(self, "Config", metadata=self.metadata, data=self.data)
        self.service_account = k8s.KubeServiceAccount(self, "ServiceAccount", metadata=self.metadata)
        self.command = ["python3", f"{config_dir}/{script}", "--config", f"{config_dir}/{config_file}"]
        self.volume = k8s.Volume(name=VOLUME, config_map=k8s.ConfigMapVolumeSource(name=name))
        self.volume_mount = k8s.VolumeMount(name=VOLUME, mount_path=config_dir, read_only=True)
        self._hash_annotation = hash_annotation

    def own_role(self, rules: list[k8s.PolicyRule]) -> tuple[k8s.KubeRole, k8s.KubeRoleBinding]:
        """A Role of ``rules`` in the agent's namespace, named as the agent (constructs ``Role``,
        ``RoleBinding``), bound to its ServiceAccount; the binding depends on both."""
        role = k8s.KubeRole(self, "Role", metadata=self.metadata, rules=rules)
        binding = k8s.KubeRoleBinding(
            self, "RoleBinding", metadata=self.metadata,
            role_ref=k8s.RoleRef(api_group=RBAC_API_GROUP, kind="Role", name=self.metadata.name),
            subjects=[self._subject()])
        binding.add_dependency(role, self.service_account)
        return role, binding

    def own_cluster_role(self, name: str, rules: list[k8s.PolicyRule]) -> tuple[k8s.KubeClusterRole,
                                                                              k8s.KubeClusterRoleBinding]:
        """A ClusterRole ``name`` of ``rules`` (constructs ``ClusterRole``, ``ClusterRoleBinding``) bound
        to the agent's ServiceAccount; the binding depends on both."""
        meta = k8s.ObjectMeta(name=name, labels=self.labels)
        role = k8s.KubeClusterRole(self, "ClusterRole", metadata=meta, rules=rules)
        binding = k8s.KubeClusterRoleBinding(
            self, "ClusterRoleBinding", metadata=k8s.ObjectMeta(name=name, labels=self.labels),
            role_ref=k8s.RoleRef(api_group=RBAC_API_GROUP, kind="ClusterRole", name=name),
            subjects=[self._subject()])
        binding.add_dependency(role, self.service_account)
        return role, binding

    def _subject(self) -> k8s.Subject:
        return k8s.Subject(kind="ServiceAccount", name=self.metadata.name, namespace=self.metadata.namespace)

    def pod_template(self, spec: k8s.PodSpec) -> k8s.PodTemplateSpec:
        """The pod template: :attr:`labels` and the hash annotation."""
        return k8s.PodTemplateSpec(spec=spec, metadata=k8s.ObjectMeta(
            labels=self.labels, annotations={self._hash_annotation: config_hash(self.data)}))


class LineAgent(ScriptAgent):
    """A :class:`ScriptAgent` in a line's namespace with Role and RoleBinding (constructs ``Role``,
    ``RoleBinding``) that let its ServiceAccount ``list`` the Pods there, nothing else. The subclass
    calls :meth:`deploy` with its pod spec.

    Attributes:
        role, role_binding: the RBAC objects; ``deployment``: the Deployment (after :meth:`deploy`);
        objects: every ApiObject, for dependency wiring.
    """

    def __init__(self, scope: Construct, construct_id: str, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.role, self.role_binding = self.own_role([k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])])

    def deploy(self, spec: k8s.PodSpec) -> None:
        """The Deployment (construct ``Deployment``) of ``spec``: one replica, strategy ``Recreate``
        (the old Pod is gone before the new one starts: never two at once), 3 old ReplicaSets kept."""
        self.deployment = k8s.KubeDeployment(self, "Deployment", metadata=self.metadata, spec=k8s.DeploymentSpec(
            replicas=1, strategy=k8s.DeploymentStrategy(type="Recreate"), revision_history_limit=3,
            selector=k8s.LabelSelector(match_labels=self.labels), template=self.pod_template(spec)))
        self.deployment.add_dependency(self.config_map, self.role_binding)
        self.objects: list[cdk8s.ApiObject] = [self.config_map, self.service_account, self.role, self.role_binding,
                                               self.deployment]


def python_env() -> list[k8s.EnvVar]:
    """No ``.pyc`` files (read-only root file system) and every log line out at once."""
    return [k8s.EnvVar(name="PYTHONDONTWRITEBYTECODE", value="1"), k8s.EnvVar(name="PYTHONUNBUFFERED", value="1")]


def http_probe(path: str, port_name: str, *, period_s: int, failures: int, timeout_s: int = 5) -> k8s.Probe:
    """``GET path`` on the named container port every ``period_s`` seconds; fails after ``failures``
    in a row, each answer awaited ``timeout_s`` seconds."""
    return k8s.Probe(http_get=k8s.HttpGetAction(path=path, port=k8s.IntOrString.from_string(port_name)),
                     period_seconds=period_s, failure_threshold=failures, timeout_seconds=timeout_s)


def resources(spec: dict[str, dict[str, str]]) -> k8s.ResourceRequirements:
    """Requests and limits from ``{"requests": {...}, "limits": {...}}`` (quantity strings)."""
    return k8s.ResourceRequirements(**{kind: {k: k8s.Quantity.from_string(v) for k, v in spec[kind].items()}
                                       for kind in ("requests", "limits")})
