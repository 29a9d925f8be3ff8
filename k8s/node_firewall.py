"""The node filter of Curvine's host-network ports, deployed (issue 25, item 1, node side).

The ruleset and the agent that keeps it loaded are :mod:`cluster_agents.node_firewall` (why the filter
exists, what it admits, how it fails safe); this module re-exports the renderer (one source of truth:
the chart, the reach tests and the agent render with the same function) and builds the objects, in
Curvine's namespace, rendered by :class:`k8s.curvine_chart.CurvineChart` when
``curvine.node_firewall.enabled``:

* ConfigMap ``node-firewall``: ``firewall.json`` (namespace, the VPC CIDR as scrapers, period),
  ``node_firewall.py`` and ``agent_core.py``, run by the pinned ``versions.images.node_firewall``
  (an image with ``python3`` and ``nft``: nothing is installed at start; :class:`k8s.agent.ScriptAgent`);
* ServiceAccount ``node-firewall``; ClusterRole and ClusterRoleBinding ``kvcache-node-firewall``:
  ``list``/``watch`` nodes (their InternalIPs); Role and RoleBinding ``node-firewall`` in Curvine's
  namespace: ``list``/``watch`` pods (their IPs). Nothing else: no ``get`` of any object, no write;
* DaemonSet ``node-firewall`` on every HyperPod node (where the Workers and the FUSE pods listen),
  tolerating every taint, ``system-node-critical``, on the **host network** (the table must be in the
  node's network namespace), with capability **NET_ADMIN only** (every other one dropped, no
  privilege escalation, read-only root file system, RuntimeDefault seccomp): ``nft`` needs
  CAP_NET_ADMIN in the host's network namespace and nothing else; not privileged, no host path, no
  host PID. It runs as uid 0 because a capability added to a non-root container is not effective
  (no ambient capabilities in the runtime's default). Metrics and ``/healthz`` on
  :data:`cluster_agents.node_firewall.METRICS_PORT` of the node (host network).

``python -m k8s.node_firewall --peer 10.0.1.5 --scraper 10.192.0.0/16`` prints a ruleset.
"""

from __future__ import annotations

import sys
from typing import Any, Final, Sequence

import cdk8s
from constructs import Construct

from cluster_agents import node_firewall as agent_module
from cluster_agents.node_firewall import RPC_PORTS, TABLE, WEB_PORTS, render_ruleset
from k8s import agent, curvine_config, names
from k8s.kube import k8s
from k8s.network_policies import vpc_cidr
from k8s.nodes import hyperpod_node_requirements
from platform_config import PlatformConfig, pod_resources

__all__ = ["RPC_PORTS", "TABLE", "WEB_PORTS", "render_ruleset", "NodeFirewall", "firewall_config", "main"]

# The agent cannot import k8s/: its port list must be Curvine's (checked at import, so a port change in
# curvine_config fails every synthesis until the agent follows).
_CURVINE_PORTS = {"rpc": (curvine_config.MASTER_RPC_PORT, curvine_config.JOURNAL_PORT, curvine_config.WORKER_RPC_PORT),
                  "web": (curvine_config.MASTER_WEB_PORT, curvine_config.WORKER_WEB_PORT, curvine_config.FUSE_WEB_PORT)}
if _CURVINE_PORTS != {"rpc": RPC_PORTS, "web": WEB_PORTS}:  # pragma: no cover - guards a future edit
    raise ImportError(f"cluster_agents/node_firewall.py ports {RPC_PORTS}, {WEB_PORTS} differ from "
                      f"k8s/curvine_config.py's {_CURVINE_PORTS}")

NAME: Final = names.NODE_FIREWALL
CLUSTER_ROLE: Final = "kvcache-node-firewall"
CONFIG_FILE: Final = "firewall.json"
SCRIPT_FILE: Final = "node_firewall.py"
CONFIG_DIR: Final = "/opt/kvcache-node-firewall"
CONFIG_HASH_ANNOTATION: Final = "kvcache.io/node-firewall-config-sha256"
LIVENESS_PERIOD_S: Final = 30
LIVENESS_FAILURES: Final = 3
RESOURCES: Final = pod_resources.NODE_FIREWALL_RESOURCES
LABELS: Final = {"app.kubernetes.io/name": NAME,
                 names.NODE_FIREWALL_COMPONENT_LABEL[0]: names.NODE_FIREWALL_COMPONENT_LABEL[1]}


def firewall_config(platform: PlatformConfig) -> dict[str, Any]:
    """``firewall.json`` (the fields of :class:`cluster_agents.node_firewall.FirewallConfig`), validated
    by the agent's own loader: Curvine's namespace, the VPC CIDR as the web ports' scrapers (the AMP
    collector's ENIs), the period."""
    config = {"namespace": platform.curvine.namespace, "scrapers": [vpc_cidr(platform)],
              "period_s": platform.curvine.node_firewall.period_seconds}
    agent_module.config_from_dict(config)
    return config


def rules() -> tuple[list[k8s.PolicyRule], list[k8s.PolicyRule]]:
    """(cluster rules, rules in Curvine's namespace): ``list``/``watch`` nodes; ``list``/``watch`` pods."""
    return ([k8s.PolicyRule(api_groups=[""], resources=["nodes"], verbs=["list", "watch"])],
            [k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["list", "watch"])])


class NodeFirewall(agent.ScriptAgent):
    """The filter's ConfigMap, ServiceAccount, RBAC and DaemonSet (module docstring).

    Attributes:
        objects: every namespaced ApiObject (the chart makes them depend on the namespace);
        daemon_set: the DaemonSet.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig) -> None:
        ns = platform.curvine.namespace
        super().__init__(scope, construct_id, name=NAME, namespace=ns, labels=LABELS, script=SCRIPT_FILE,
                         config_file=CONFIG_FILE, config=firewall_config(platform), config_dir=CONFIG_DIR,
                         hash_annotation=CONFIG_HASH_ANNOTATION)
        cluster_rules, ns_rules = rules()
        self.cluster_role, cluster_binding = self.own_cluster_role(CLUSTER_ROLE, cluster_rules)
        self.role, self.role_binding = self.own_role(ns_rules)
        port = names.NODE_FIREWALL_METRICS_PORT_NAME
        container = k8s.Container(
            name="firewall", image=platform.versions.images.node_firewall,
            command=[*self.command, "--node", "$(NODE_NAME)", "--serve", "--port", str(agent_module.METRICS_PORT)],
            env=[k8s.EnvVar(name="NODE_NAME", value_from=k8s.EnvVarSource(
                     field_ref=k8s.ObjectFieldSelector(field_path="spec.nodeName"))), *agent.python_env()],
            ports=[k8s.ContainerPort(name=port, container_port=agent_module.METRICS_PORT, protocol="TCP")],
            liveness_probe=agent.http_probe(agent_module.LIVENESS_PATH, port, period_s=LIVENESS_PERIOD_S,
                                            failures=LIVENESS_FAILURES),
            resources=agent.resources(RESOURCES),
            volume_mounts=[self.volume_mount],
            # nft talks netlink to the kernel's nf_tables in the node's network namespace: CAP_NET_ADMIN,
            # nothing more. uid 0: an added capability is effective only for root without ambient caps.
            security_context=k8s.SecurityContext(
                privileged=False, allow_privilege_escalation=False, run_as_user=0, run_as_non_root=False,
                read_only_root_filesystem=True, capabilities=k8s.Capabilities(drop=["ALL"], add=["NET_ADMIN"]),
                seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault")))
        self.daemon_set = k8s.KubeDaemonSet(self, "DaemonSet", metadata=self.metadata, spec=k8s.DaemonSetSpec(
            selector=k8s.LabelSelector(match_labels=LABELS),
            update_strategy=k8s.DaemonSetUpdateStrategy(type="RollingUpdate", rolling_update=k8s.RollingUpdateDaemonSet(
                max_unavailable=k8s.IntOrString.from_number(1))),
            template=self.pod_template(k8s.PodSpec(
                service_account_name=NAME,
                # The table lives in the node's network namespace.
                host_network=True,
                priority_class_name="system-node-critical",
                # Every HyperPod node may run a Worker or a FUSE pod (as the CSI node plugin).
                affinity=k8s.Affinity(node_affinity=k8s.NodeAffinity(
                    required_during_scheduling_ignored_during_execution=k8s.NodeSelector(node_selector_terms=[
                        k8s.NodeSelectorTerm(match_expressions=[
                            k8s.NodeSelectorRequirement(**r) for r in hyperpod_node_requirements(())])]))),
                tolerations=[k8s.Toleration(operator="Exists")],
                termination_grace_period_seconds=10,
                containers=[container],
                volumes=[self.volume]))))
        self.daemon_set.add_dependency(self.config_map, cluster_binding, self.role_binding)
        self.objects: list[cdk8s.ApiObject] = [self.config_map, self.service_account, self.role, self.role_binding,
                                               self.daemon_set]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m k8s.node_firewall --peer 10.0.1.5 --peer 10.0.2.0/28 --scraper 10.192.0.0/16``."""
    return agent_module.main(["--print", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
