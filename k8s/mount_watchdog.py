"""The Kubernetes side of the L2 mount watchdog (its logic is :mod:`kv_tools.l2_mount_watchdog`).

Objects in Curvine's namespace (rendered by :class:`k8s.curvine_chart.CurvineChart` when
``curvine.mount_watchdog.enabled``):

* ConfigMap ``l2-mount-watchdog``: ``watchdog.json`` (:func:`watchdog_config`) and
  ``l2_mount_watchdog.py`` (the module's source, standard library only, run by the pinned
  ``versions.images.l2_janitor`` python image: no image to build);
* ServiceAccount ``l2-mount-watchdog``; ClusterRole and ClusterRoleBinding
  ``kvcache-l2-mount-watchdog``: ``get persistentvolumes`` only (a PV's ``claimRef`` names the
  namespace of the pod using it). The namespaced rights, ``list pods`` and (healing on) ``create
  pods/eviction``, are a Role and RoleBinding in each L2 line's namespace (:func:`line_rbac`,
  rendered by the line chart): the watchdog can read and evict pods of the L2 lines and of no
  other namespace;
* DaemonSet ``l2-mount-watchdog`` on every HyperPod node (the nodes that run the Curvine CSI node
  plugin; tolerating every taint, like it). Its container mounts the host's ``/var/lib/kubelet``
  read-only and runs ``l2_mount_watchdog.py --serve``: a pass every ``period_seconds``, metrics on
  the container port :data:`k8s.names.L2_MOUNT_WATCHDOG_METRICS_PORT_NAME` (pod label
  :data:`k8s.names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL`: what the observability stack scrapes).
  With ``heal`` on, the container is **privileged** with ``Bidirectional`` propagation: the one
  healing step that needs it is the lazy unmount of a dead bind in the host's mount namespace
  (CAP_SYS_ADMIN, and the API server admits Bidirectional only for privileged containers). With
  ``heal`` off it only reads: ``HostToContainer`` propagation (new mounts still show up), no
  capability, no privilege escalation, read-only root file system. It runs as uid 0 either way:
  the kubelet's pod directories are ``root:root 0750``.

A liveness probe restarts a container whose passes stopped (``GET /healthz``); a pod-template
annotation carries a hash of the ConfigMap, so a new script or setting rolls the DaemonSet.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

import cdk8s
from constructs import Construct

from k8s import names
from k8s.kube import k8s
from k8s.nodes import hyperpod_node_requirements
from kv_tools import l2_mount_watchdog as watchdog
from platform_config import PlatformConfig, pod_resources

NAME: Final = names.L2_MOUNT_WATCHDOG
#: Cluster-scoped objects carry the project prefix (they share one name space with everything).
CLUSTER_ROLE: Final = "kvcache-l2-mount-watchdog"
CONFIG_FILE: Final = "watchdog.json"
SCRIPT_FILE: Final = "l2_mount_watchdog.py"
CONFIG_DIR: Final = "/opt/kvcache-mount-watchdog"
#: The host's kubelet directory, mounted at the same path (mountinfo shows the host's paths).
KUBELET_DIR: Final = watchdog.KUBELET_DIR
#: Pod-template annotation holding the SHA-256 of the ConfigMap's data (rolls the pods on a change).
CONFIG_HASH_ANNOTATION: Final = "kvcache.io/l2-mount-watchdog-config-sha256"
#: Liveness: every 30 s, restart after 3 failures; ``/healthz`` itself fails only after
#: :data:`kv_tools.l2_mount_watchdog.STALE_PERIODS` periods without a finished pass.
LIVENESS_PERIOD_S: Final = 30
LIVENESS_FAILURES: Final = 3
PROBE_TIMEOUT_S: Final = 5
#: Shared with the per-node budget of the config check (:mod:`platform_config.pod_resources`).
RESOURCES: Final = pod_resources.MOUNT_WATCHDOG_RESOURCES
LABELS: Final = {"app.kubernetes.io/name": NAME,
                 names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL[0]: names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL[1]}


def watchdog_config(platform: PlatformConfig) -> dict[str, Any]:
    """``watchdog.json`` (the fields of :class:`kv_tools.l2_mount_watchdog.WatchdogConfig`) from
    ``curvine.mount_watchdog``; validated by the module's own loader."""
    c = platform.curvine.mount_watchdog
    config = {"heal": c.heal, "period_s": c.period_seconds, "probe_timeout_s": c.probe_timeout_seconds,
              "eviction_interval_s": c.eviction_interval_seconds}
    watchdog.config_from_dict(config)
    return config


def config_hash(data: dict[str, str]) -> str:
    """SHA-256 (hex) of the ConfigMap's data, keys sorted: the pod-template annotation."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()


def line_rules(platform: PlatformConfig) -> list[k8s.PolicyRule]:
    """The watchdog's rights in one L2 line's namespace: ``list pods`` (the pods on its node, by
    ``fieldSelector``) and, with ``heal`` on, ``create pods/eviction``; nothing else."""
    rules = [k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])]
    if platform.curvine.mount_watchdog.heal:
        rules.append(k8s.PolicyRule(api_groups=[""], resources=["pods/eviction"], verbs=["create"]))
    return rules


def line_rbac(scope: Construct, *, platform: PlatformConfig, namespace: str) -> list[cdk8s.ApiObject]:
    """Role and RoleBinding ``l2-mount-watchdog`` in an L2 line's namespace for the watchdog's
    ServiceAccount in Curvine's namespace (:func:`line_rules`). Empty when the watchdog is off."""
    if not (platform.curvine.enabled and platform.curvine.mount_watchdog.enabled):
        return []
    meta = k8s.ObjectMeta(name=NAME, namespace=namespace, labels={"app.kubernetes.io/name": NAME})
    role = k8s.KubeRole(scope, "MountWatchdogRole", metadata=meta, rules=line_rules(platform))
    binding = k8s.KubeRoleBinding(
        scope, "MountWatchdogRoleBinding", metadata=meta,
        role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=NAME),
        subjects=[k8s.Subject(kind="ServiceAccount", name=NAME, namespace=platform.curvine.namespace)])
    binding.add_dependency(role)
    return [role, binding]


def _q(value: str) -> k8s.Quantity:
    return k8s.Quantity.from_string(value)


class L2MountWatchdog(Construct):
    """The watchdog's ConfigMap, ServiceAccount, cluster RBAC and DaemonSet (module docstring).

    Attributes:
        objects: every namespaced ApiObject (the chart makes them depend on the namespace);
        daemon_set: the DaemonSet.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig) -> None:
        super().__init__(scope, construct_id)
        ns = platform.curvine.namespace
        heal = platform.curvine.mount_watchdog.heal
        meta = k8s.ObjectMeta(name=NAME, namespace=ns, labels=LABELS)
        data = {CONFIG_FILE: json.dumps(watchdog_config(platform), indent=2, sort_keys=True) + "\n",
                SCRIPT_FILE: Path(watchdog.__file__).read_text(encoding="utf-8")}
        self.config_map = k8s.KubeConfigMap(self, "Config", metadata=meta, data=data)
        self.service_account = k8s.KubeServiceAccount(self, "ServiceAccount", metadata=meta)
        self.cluster_role = k8s.KubeClusterRole(
            self, "ClusterRole", metadata=k8s.ObjectMeta(name=CLUSTER_ROLE, labels=LABELS),
            rules=[k8s.PolicyRule(api_groups=[""], resources=["persistentvolumes"], verbs=["get"])])
        binding = k8s.KubeClusterRoleBinding(
            self, "ClusterRoleBinding", metadata=k8s.ObjectMeta(name=CLUSTER_ROLE, labels=LABELS),
            role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=CLUSTER_ROLE),
            subjects=[k8s.Subject(kind="ServiceAccount", name=NAME, namespace=ns)])
        binding.add_dependency(self.cluster_role, self.service_account)
        port = k8s.IntOrString.from_string(names.L2_MOUNT_WATCHDOG_METRICS_PORT_NAME)
        if heal:
            # The lazy unmount of a dead bind must reach the host's mount namespace: CAP_SYS_ADMIN
            # and Bidirectional propagation, which the API server admits only for privileged
            # containers (docs/l2-cache.md, "Security: privileged pods").
            security = k8s.SecurityContext(privileged=True, run_as_user=0, read_only_root_filesystem=True)
            propagation = "Bidirectional"
        else:
            security = k8s.SecurityContext(
                run_as_user=0, run_as_non_root=False, allow_privilege_escalation=False, privileged=False,
                read_only_root_filesystem=True, capabilities=k8s.Capabilities(drop=["ALL"]),
                seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault"))
            propagation = "HostToContainer"
        container = k8s.Container(
            name="watchdog", image=platform.versions.images.l2_janitor,
            command=["python3", f"{CONFIG_DIR}/{SCRIPT_FILE}", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}",
                     "--node", "$(NODE_NAME)", "--serve", "--port", str(watchdog.METRICS_PORT)],
            env=[k8s.EnvVar(name="NODE_NAME", value_from=k8s.EnvVarSource(
                     field_ref=k8s.ObjectFieldSelector(field_path="spec.nodeName"))),
                 k8s.EnvVar(name="PYTHONDONTWRITEBYTECODE", value="1"),
                 k8s.EnvVar(name="PYTHONUNBUFFERED", value="1")],
            ports=[k8s.ContainerPort(name=names.L2_MOUNT_WATCHDOG_METRICS_PORT_NAME,
                                     container_port=watchdog.METRICS_PORT, protocol="TCP")],
            liveness_probe=k8s.Probe(
                http_get=k8s.HttpGetAction(path=watchdog.LIVENESS_PATH, port=port),
                period_seconds=LIVENESS_PERIOD_S, failure_threshold=LIVENESS_FAILURES,
                timeout_seconds=PROBE_TIMEOUT_S),
            resources=k8s.ResourceRequirements(
                requests={k: _q(v) for k, v in RESOURCES["requests"].items()},
                limits={k: _q(v) for k, v in RESOURCES["limits"].items()}),
            volume_mounts=[k8s.VolumeMount(name="config", mount_path=CONFIG_DIR, read_only=True),
                           k8s.VolumeMount(name="kubelet-dir", mount_path=KUBELET_DIR, read_only=True,
                                           mount_propagation=propagation)],
            security_context=security)
        self.daemon_set = k8s.KubeDaemonSet(self, "DaemonSet", metadata=meta, spec=k8s.DaemonSetSpec(
            selector=k8s.LabelSelector(match_labels=LABELS),
            update_strategy=k8s.DaemonSetUpdateStrategy(type="RollingUpdate", rolling_update=k8s.RollingUpdateDaemonSet(
                max_unavailable=k8s.IntOrString.from_number(1))),
            template=k8s.PodTemplateSpec(
                metadata=k8s.ObjectMeta(labels=LABELS, annotations={CONFIG_HASH_ANNOTATION: config_hash(data)}),
                spec=k8s.PodSpec(
                    service_account_name=NAME,
                    # Node-level like the CSI node plugin whose mounts it watches: not preempted
                    # or evicted before the pods it heals.
                    priority_class_name="system-node-critical",
                    # Every HyperPod node may run a pod that mounts an L2 PVC (as the CSI node plugin).
                    affinity=k8s.Affinity(node_affinity=k8s.NodeAffinity(
                        required_during_scheduling_ignored_during_execution=k8s.NodeSelector(node_selector_terms=[
                            k8s.NodeSelectorTerm(match_expressions=[
                                k8s.NodeSelectorRequirement(**r) for r in hyperpod_node_requirements(())])]))),
                    tolerations=[k8s.Toleration(operator="Exists")],
                    termination_grace_period_seconds=10,
                    containers=[container],
                    volumes=[k8s.Volume(name="config", config_map=k8s.ConfigMapVolumeSource(name=NAME)),
                             k8s.Volume(name="kubelet-dir", host_path=k8s.HostPathVolumeSource(
                                 path=KUBELET_DIR, type="Directory"))]))))
        self.daemon_set.add_dependency(self.config_map, binding)
        self.objects: list[cdk8s.ApiObject] = [self.config_map, self.service_account, self.daemon_set]
