"""The Kubernetes side of the L2 mount watchdog (its logic is :mod:`cluster_agents.l2_mount_watchdog`).

Objects in Curvine's namespace (rendered by :class:`k8s.curvine_chart.CurvineChart` when
``curvine.mount_watchdog.enabled``):

* ConfigMap ``l2-mount-watchdog``: ``watchdog.json`` (:func:`watchdog_config`),
  ``l2_mount_watchdog.py`` (the module's source) and ``agent_core.py``, standard library only, run
  by the pinned ``versions.images.l2_janitor`` python image: no image to build
  (:class:`k8s.agent.ScriptAgent`);
* ServiceAccount ``l2-mount-watchdog``; ClusterRole and ClusterRoleBinding
  ``kvcache-l2-mount-watchdog``: ``get persistentvolumes`` only (a PV's ``claimRef`` names the
  namespace of the pod using it). The namespaced rights, ``list pods`` and (healing on) ``create
  pods/eviction``, are a Role and RoleBinding in each L2 line's namespace (:func:`line_rbac`,
  rendered by the line chart): the watchdog can read and evict pods of the L2 lines and of no
  other namespace;
* DaemonSet ``l2-mount-watchdog`` on every HyperPod node (the nodes that run the Curvine CSI node
  plugin; tolerating every taint, like it), running ``l2_mount_watchdog.py --serve``: a pass every
  ``period_seconds``, metrics on the container port :data:`k8s.names.L2_MOUNT_WATCHDOG_METRICS_PORT_NAME`
  (pod label :data:`k8s.names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL`: what the observability stack
  scrapes). **No directory of the kubelet's pods is mounted** (issue 24 item 5: every pod's
  service-account token lives under ``/var/lib/kubelet/pods``). Its two host paths, read-only:

  - ``/proc/1/mountinfo``, one file (``hostPath`` type ``File``) at
    :data:`cluster_agents.l2_mount_watchdog.HOST_MOUNTINFO`: the mount table of the host's init,
    where the kubelet's and the CSI node plugin's binds are. A bind of a procfs file keeps naming
    PID 1's mount namespace in any reader's namespace, and ``mountinfo`` needs no ptrace right;
    the host's PID namespace is not shared for it. The binds' pod UIDs and PV names are in their
    paths, the namespaces of the pods come from the PVs' ``claimRef`` (API);
  - ``/var/lib/kubelet/plugins/curvine`` (``HostToContainer``: a new FUSE session shows up), the
    FUSE pods' mount points: each session is probed there once (a bind of it answers ``statfs``
    from the same daemon).

  With ``heal`` on, the container is **privileged** and shares the **host's PID namespace**: the
  one healing step that needs it is the lazy unmount of a dead bind, done by a short-lived child
  that enters PID 1's mount namespace (``setns``: CAP_SYS_ADMIN and CAP_SYS_CHROOT, and
  ``/proc/1/ns/mnt`` of the host) and unmounts one kubelet CSI target. Privileged with the host's
  PID namespace, it *can* read any file of its node (docs/security.md, residual exposure); it
  mounts none of them. With ``heal`` off it only reads: no host PID namespace, no capability, no
  privilege escalation, read-only root file system. It runs as uid 0 either way: curvine-fuse
  checks permissions for every uid but 0 (the plugin directory's FUSE mounts).

A liveness probe restarts a container whose passes stopped (``GET /healthz``); a pod-template
annotation carries a hash of the ConfigMap, so a new script or setting rolls the DaemonSet.
"""

from __future__ import annotations

from typing import Any, Final

import cdk8s
from constructs import Construct

from k8s import agent, names
from k8s.csi_node_limits import NODE_NAME_EXTRA, node_name_claim_available
from k8s.fuse_pod_guard import NAMESPACE_NAME_LABEL, STANDALONE_LABEL
from k8s.kube import k8s
from k8s.nodes import hyperpod_node_requirements
from cluster_agents import l2_mount_watchdog as watchdog
from platform_config import PlatformConfig, pod_resources

NAME: Final = names.L2_MOUNT_WATCHDOG
#: Cluster-scoped objects carry the project prefix (they share one name space with everything).
CLUSTER_ROLE: Final = "kvcache-l2-mount-watchdog"
CONFIG_FILE: Final = "watchdog.json"
SCRIPT_FILE: Final = "l2_mount_watchdog.py"
CONFIG_DIR: Final = "/opt/kvcache-mount-watchdog"
#: The host's kubelet directory: only named (the targets in the host's mount table), never mounted.
KUBELET_DIR: Final = watchdog.KUBELET_DIR
#: The host's mount table, one procfs file (``hostPath`` type ``File``), and where the container sees it.
HOST_MOUNTINFO_SOURCE: Final = "/proc/1/mountinfo"
HOST_MOUNTINFO: Final = watchdog.HOST_MOUNTINFO
#: The FUSE pods' mount points on the host (Curvine ``HostMountBaseDir``), mounted at the same path.
PLUGIN_DIR: Final = watchdog.PLUGIN_DIR
#: Pod-template annotation holding the SHA-256 of the ConfigMap's data (rolls the pods on a change).
CONFIG_HASH_ANNOTATION: Final = "kvcache.io/l2-mount-watchdog-config-sha256"
#: Liveness: every 30 s, restart after 3 failures; ``/healthz`` itself fails only after
#: :data:`cluster_agents.l2_mount_watchdog.STALE_PERIODS` periods without a finished pass.
LIVENESS_PERIOD_S: Final = 30
LIVENESS_FAILURES: Final = 3
PROBE_TIMEOUT_S: Final = 5
#: Shared with the per-node budget of the config check (:mod:`platform_config.pod_resources`).
RESOURCES: Final = pod_resources.MOUNT_WATCHDOG_RESOURCES
LABELS: Final = {"app.kubernetes.io/name": NAME,
                 names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL[0]: names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL[1]}


def watchdog_config(platform: PlatformConfig) -> dict[str, Any]:
    """``watchdog.json`` (the fields of :class:`cluster_agents.l2_mount_watchdog.WatchdogConfig`) from
    ``curvine.mount_watchdog``; validated by the module's own loader."""
    c = platform.curvine.mount_watchdog
    config = {"heal": c.heal, "period_s": c.period_seconds, "probe_timeout_s": c.probe_timeout_seconds,
              "eviction_interval_s": c.eviction_interval_seconds, "host_mountinfo": HOST_MOUNTINFO}
    if replaces_sessions(platform):
        config.update(replace_hung_after_s=c.replace_hung_after_seconds, max_nodes_replacing=c.max_nodes_replacing,
                      namespace=platform.curvine.namespace)
    watchdog.config_from_dict(config)
    return config


def replaces_sessions(platform: PlatformConfig) -> bool:
    """The watchdog replaces hung FUSE sessions: ``heal`` on and ``replace_hung_after_seconds`` > 0."""
    c = platform.curvine.mount_watchdog
    return c.heal and c.replace_hung_after_seconds > 0


def slot_names(platform: PlatformConfig) -> list[str]:
    """The replacement Leases (``max_nodes_replacing`` of them, cluster_agents' names)."""
    return [f"{watchdog.REPLACEMENT_LEASE_PREFIX}-{i}" for i in range(platform.curvine.mount_watchdog.max_nodes_replacing)]


def curvine_rules(platform: PlatformConfig) -> list[k8s.PolicyRule]:
    """The watchdog's rights in the Curvine namespace, only when it replaces hung sessions: ``list``
    and ``delete`` pods (its node's FUSE pod; :func:`watchdog_limits` refuses every other delete),
    and the replacement Leases: ``get``/``update`` by name, ``create`` (RBAC cannot name what is
    created: the policy does)."""
    if not replaces_sessions(platform):
        return []
    return [k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["list", "delete"]),
            k8s.PolicyRule(api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["get", "update"],
                           resource_names=slot_names(platform)),
            k8s.PolicyRule(api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["create"])]


#: The policy that confines what the watchdog's identity may delete and create in the Curvine namespace.
WATCHDOG_LIMITS: Final = "kvcache-l2-mount-watchdog-limits"


def watchdog_limits(scope: Construct, *, platform: PlatformConfig) -> list[cdk8s.ApiObject]:
    """ValidatingAdmissionPolicy and binding (``Deny``, fail closed) for the watchdog's service account
    in the Curvine namespace: a pod DELETE only of a FUSE pod (``app=curvine-standalone``) on the
    node the bound token names (``authentication.kubernetes.io/node-name``; from Kubernetes 1.30, a
    token without it is refused; on 1.28 and 1.29 the node is not checked); a Lease CREATE or UPDATE only of the replacement slots.
    So a stolen watchdog token cannot delete the Curvine Primary, a Worker or the CSI pods, nor
    another node's FUSE pod. Empty when the watchdog replaces no session."""
    if not replaces_sessions(platform):
        return []
    ns = platform.curvine.namespace
    label, value = STANDALONE_LABEL
    slots = ", ".join(f"'{n}'" for n in slot_names(platform))
    claimed = (f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra"
               f" && size(request.userInfo.extra['{NODE_NAME_EXTRA}']) == 1")
    own_node = f"has(oldObject.spec.nodeName) && oldObject.spec.nodeName == request.userInfo.extra['{NODE_NAME_EXTRA}'][0]"
    # From Kubernetes 1.30 every pod-bound token names its node: a token without it is refused.
    node = (f"({claimed} && {own_node})" if node_name_claim_available(platform.eks.version)
            else f"(!({claimed}) || ({own_node}))")
    delete = ("request.resource.resource != 'pods' || ("
              f"has(oldObject.metadata.labels) && '{label}' in oldObject.metadata.labels"
              f" && oldObject.metadata.labels['{label}'] == '{value}'"
              f" && {node})")
    leases = ("request.resource.resource != 'leases' || "
              f"(request.operation == 'CREATE' ? object.metadata.name : request.name) in [{slots}]")
    rule = k8s.NamedRuleWithOperations
    policy = k8s.KubeValidatingAdmissionPolicy(
        scope, "WatchdogLimits", metadata=k8s.ObjectMeta(name=WATCHDOG_LIMITS, labels=LABELS),
        spec=k8s.ValidatingAdmissionPolicySpec(
            failure_policy="Fail",
            match_constraints=k8s.MatchResources(
                resource_rules=[
                    rule(api_groups=[""], api_versions=["v1"], operations=["DELETE"], resources=["pods"]),
                    rule(api_groups=["coordination.k8s.io"], api_versions=["v1"], operations=["CREATE", "UPDATE"],
                         resources=["leases"])],
                namespace_selector=k8s.LabelSelector(match_labels={NAMESPACE_NAME_LABEL: ns})),
            match_conditions=[k8s.MatchCondition(
                name="l2-mount-watchdog", expression=f"request.userInfo.username == 'system:serviceaccount:{ns}:{NAME}'")],
            validations=[
                k8s.Validation(expression=delete, reason="Forbidden", message=(
                    f"the L2 mount watchdog may delete only a FUSE pod ({label}={value}) of its own node")),
                k8s.Validation(expression=leases, reason="Forbidden", message=(
                    f"the L2 mount watchdog may write only its replacement Leases ({watchdog.REPLACEMENT_LEASE_PREFIX}-<i>)")),
            ]))
    binding = k8s.KubeValidatingAdmissionPolicyBinding(
        scope, "WatchdogLimitsBinding", metadata=k8s.ObjectMeta(name=WATCHDOG_LIMITS, labels=LABELS),
        spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=WATCHDOG_LIMITS, validation_actions=["Deny"]))
    binding.add_dependency(policy)
    return [policy, binding]


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


class L2MountWatchdog(agent.ScriptAgent):
    """The watchdog's ConfigMap, ServiceAccount, cluster RBAC and DaemonSet (module docstring).

    Attributes:
        objects: every namespaced ApiObject (the chart makes them depend on the namespace);
        daemon_set: the DaemonSet.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig) -> None:
        ns = platform.curvine.namespace
        heal = platform.curvine.mount_watchdog.heal
        super().__init__(scope, construct_id, name=NAME, namespace=ns, labels=LABELS, script=SCRIPT_FILE,
                         config_file=CONFIG_FILE, config=watchdog_config(platform), config_dir=CONFIG_DIR,
                         hash_annotation=CONFIG_HASH_ANNOTATION)
        self.cluster_role, binding = self.own_cluster_role(
            CLUSTER_ROLE, [k8s.PolicyRule(api_groups=[""], resources=["persistentvolumes"], verbs=["get"])])
        # Replacing hung FUSE sessions: rights in the Curvine namespace, fenced by a policy that is
        # in place before the Role (and the DaemonSet) exist.
        self.limits = watchdog_limits(self, platform=platform)
        self.curvine_role: list[cdk8s.ApiObject] = []
        rules = curvine_rules(platform)
        if rules:
            role_meta = k8s.ObjectMeta(name=NAME, namespace=ns, labels=LABELS)
            role = k8s.KubeRole(self, "CurvineRole", metadata=role_meta, rules=rules)
            role_binding = k8s.KubeRoleBinding(
                self, "CurvineRoleBinding", metadata=role_meta,
                role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=NAME),
                subjects=[k8s.Subject(kind="ServiceAccount", name=NAME, namespace=ns)])
            role.add_dependency(self.limits[1])
            role_binding.add_dependency(role, self.service_account)
            self.curvine_role = [role, role_binding]
        port = names.L2_MOUNT_WATCHDOG_METRICS_PORT_NAME
        if heal:
            # The lazy unmount of a dead bind happens in the host's mount namespace, entered by a
            # child through /proc/1/ns/mnt: the host's PID namespace, CAP_SYS_ADMIN and
            # CAP_SYS_CHROOT (docs/l2-cache.md, "Security: privileged pods").
            security = k8s.SecurityContext(privileged=True, run_as_user=0, read_only_root_filesystem=True)
        else:
            security = k8s.SecurityContext(
                run_as_user=0, run_as_non_root=False, allow_privilege_escalation=False, privileged=False,
                read_only_root_filesystem=True, capabilities=k8s.Capabilities(drop=["ALL"]),
                seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault"))
        container = k8s.Container(
            name="watchdog", image=platform.versions.images.l2_janitor,
            command=[*self.command, "--node", "$(NODE_NAME)", "--serve", "--port", str(watchdog.METRICS_PORT)],
            env=[k8s.EnvVar(name="NODE_NAME", value_from=k8s.EnvVarSource(
                     field_ref=k8s.ObjectFieldSelector(field_path="spec.nodeName"))), *agent.python_env()],
            ports=[k8s.ContainerPort(name=port, container_port=watchdog.METRICS_PORT, protocol="TCP")],
            liveness_probe=agent.http_probe(watchdog.LIVENESS_PATH, port, period_s=LIVENESS_PERIOD_S,
                                            failures=LIVENESS_FAILURES, timeout_s=PROBE_TIMEOUT_S),
            resources=agent.resources(RESOURCES),
            volume_mounts=[self.volume_mount,
                           k8s.VolumeMount(name="host-mountinfo", mount_path=HOST_MOUNTINFO, read_only=True),
                           k8s.VolumeMount(name="fuse-sessions", mount_path=PLUGIN_DIR, read_only=True,
                                           mount_propagation="HostToContainer")],
            security_context=security)
        self.daemon_set = k8s.KubeDaemonSet(self, "DaemonSet", metadata=self.metadata, spec=k8s.DaemonSetSpec(
            selector=k8s.LabelSelector(match_labels=LABELS),
            update_strategy=k8s.DaemonSetUpdateStrategy(type="RollingUpdate", rolling_update=k8s.RollingUpdateDaemonSet(
                max_unavailable=k8s.IntOrString.from_number(1))),
            template=self.pod_template(k8s.PodSpec(
                service_account_name=NAME,
                # The heal's unmount child enters PID 1's mount namespace; report-only needs no host PID.
                host_pid=True if heal else None,
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
                volumes=[self.volume,
                         k8s.Volume(name="host-mountinfo", host_path=k8s.HostPathVolumeSource(
                             path=HOST_MOUNTINFO_SOURCE, type="File")),
                         k8s.Volume(name="fuse-sessions", host_path=k8s.HostPathVolumeSource(
                             path=PLUGIN_DIR, type="DirectoryOrCreate"))]))))
        self.daemon_set.add_dependency(self.config_map, binding, *self.curvine_role)
        self.objects: list[cdk8s.ApiObject] = [self.config_map, self.service_account, *self.curvine_role, self.daemon_set]
