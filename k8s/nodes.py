"""Scheduling onto HyperPod nodes, shared by every chart and Helm value set that runs pods there.

One definition of the node labels HyperPod puts on its nodes, of "only HyperPod nodes (of these
instance groups)" and of "tolerate the taints of the instance groups", used by the Curvine chart (Workers), each line's L2 janitor and the DCGM
exporter's Helm values (observability), so the three cannot drift apart.
"""

from __future__ import annotations

from typing import Final

from platform_config import PlatformConfig

#: Label HyperPod puts on its nodes (the reference deployment selects them with it,
#: docs/sources.md §1), and its value.
HYPERPOD_NODE_LABEL: Final = "sagemaker.amazonaws.com/compute-type"
HYPERPOD_NODE_VALUE: Final = "hyperpod"
#: Label with the HyperPod instance group name of a node.
HYPERPOD_GROUP_LABEL: Final = "sagemaker.amazonaws.com/instance-group-name"
#: Label the eks stack puts on its system node group (an EKS managed node group in the GPU zone's
#: subnet, ``stacks.cluster_stack``), and its value: where the Curvine Primary's EBS volume attaches.
SYSTEM_NODE_LABEL: Final = "kvcache.io/node-role"
SYSTEM_NODE_VALUE: Final = "system"
#: Well-known node label of the zone (set by the kubelet on every node).
ZONE_NODE_LABEL: Final = "topology.kubernetes.io/zone"


def system_node_requirements(zone: str) -> list[dict[str, object]]:
    """Node-selector requirements of "a system node in ``zone``" (all must hold).

    The Curvine Primary's EBS volume is attached only there: to an EC2 instance of the EKS managed
    node group, the EBS CSI driver's ordinary ``ec2:AttachVolume`` path. Attaching to a HyperPod
    node goes through ``sagemaker:AttachClusterNodeVolume`` instead, which this platform has not
    seen work (docs/sources.md §15), so the Primary never lands there.

    Args:
        zone: zone name of the volume (``us-west-2a``) or a CDK token.
    """
    return [{"key": SYSTEM_NODE_LABEL, "operator": "In", "values": [SYSTEM_NODE_VALUE]},
            {"key": ZONE_NODE_LABEL, "operator": "In", "values": [zone]}]


def hyperpod_node_requirements(groups: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """Node-selector requirements of "a HyperPod node", and "of the instance groups ``groups``"
    when that is not empty; all must hold (one ``NodeSelectorTerm``'s ``matchExpressions``).

    Returns:
        Kubernetes ``NodeSelectorRequirement`` objects as plain dicts, whose keys are also the
        keyword arguments of the cdk8s ``k8s.NodeSelectorRequirement`` class.
    """
    requirements: list[dict[str, object]] = [
        {"key": HYPERPOD_NODE_LABEL, "operator": "In", "values": [HYPERPOD_NODE_VALUE]}]
    if groups:
        requirements.append({"key": HYPERPOD_GROUP_LABEL, "operator": "In", "values": list(groups)})
    return requirements


def instance_group_tolerations(platform: PlatformConfig, groups: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Tolerations of every taint of the instance groups ``groups`` (empty: every group).

    Each taint of ``hyperpod.instance_groups[].taints`` (which HyperPod puts on the group's nodes,
    ``KubernetesConfig.Taints``) becomes ``{"key", "operator": "Equal", "value", "effect"}``:
    exactly the configured taint, not any value of its key (``Exists``). The same taint on two
    groups gives one toleration; order is the config's.

    Returns:
        Kubernetes ``Toleration`` objects as plain dicts, whose keys are also the keyword
        arguments of the cdk8s ``k8s.Toleration`` class.
    """
    tolerations: list[dict[str, str]] = []
    for group in platform.hyperpod.instance_groups:
        if groups and group.name not in groups:
            continue
        for taint in group.taints:
            toleration = {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
            if toleration not in tolerations:
                tolerations.append(toleration)
    return tolerations
