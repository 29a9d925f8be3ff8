"""Do the business lines' pods fit the HyperPod nodes? GPUs, CPU and memory of each node together.

One function, :func:`fit_lines`, answers it for the config check
(:func:`platform_config.loader.cross_check`, so synthesis refuses what cannot schedule) and for the
planner (``scripts/plan.py --business-line``, which prints the node budget and the placement).

**A node's budget** (:func:`node_budget`), what the scheduler can give the lines' pods:

* capacity: the instance's GPUs, host memory (``host_memory_gib``) and CPUs (its vCPUs, halved when
  the instance group's ``threads_per_core`` is 1: :meth:`InstanceType.cpus`);
* less HyperPod Tiered Storage's share of host memory (``hyperpod.tiered_storage``
  ``memory_allocation_percentage``, when enabled): AWS reserves it for the ai-toolkit daemon's
  memory pool (the ``sagemaker-hyperpod://`` backend and managed tiered checkpointing), not for
  pods (docs/sources.md §14);
* less the kubelet's reservation. HyperPod does not publish its AMI's values, so this is EKS's
  AL2023 ``nodeadm`` formula (amazon-eks-ami v20260724, ``nodeadm/internal/kubelet/config.go``):
  ``kubeReserved`` memory ``11 MiB x maxPods + 255 MiB`` with ``maxPods`` from the instance's
  network interfaces (:attr:`InstanceType.max_pods`), ``kubeReserved`` CPU 6% of the first core,
  1% of the second, 0.5% of the next two and 0.25% of the rest, and ``evictionHard``
  ``memory.available`` 100 MiB (no ``systemReserved``);
* less the requests of the platform's own pods that may run on the node (:func:`platform_pods`),
  read from the constants the charts render (:mod:`platform_config.pod_resources`): the Curvine Worker (nodes
  of ``curvine.worker_instance_groups``), the Curvine CSI node plugin and one standalone FUSE pod
  (one per node and StorageClass; only when a line uses L2), the L2 mount watchdog (one per node,
  ``curvine.mount_watchdog.enabled``), the node filter of Curvine's ports (one per node,
  ``curvine.node_firewall.enabled``), the DCGM exporter (its values, else
  its chart's defaults), and every L2 line's janitor (a Deployment the scheduler may put on any
  HyperPod node, so every node keeps room for all of them: the worst case).

**Placement** (:func:`fit_lines`): per instance type, first-fit decreasing over the nodes of its
groups that carry no ``NoSchedule``/``NoExecute`` taint (an InferenceEndpointConfig cannot
tolerate one): replicas by GPUs, then by their largest share of a node's CPU or memory, each on the
first node with room for all three. A heuristic: it may refuse a mix that a cleverer packing would
place (never the reverse), and the scheduler does not promise to find a packing either.

Not modelled (so the budget is optimistic by their size): the kernel's own memory (a node's
``capacity`` is ``MemTotal``, a little below the instance's nominal memory), the requests of
DaemonSets this platform does not render (the VPC CNI, kube-proxy, the EBS/S3/FSx CSI node plugins,
the EKS Pod Identity agent, HyperPod's health agent and device plugins, the ai-toolkit daemon itself;
tens to hundreds of millicores and MiB each) and of the sidecar containers the inference operator
adds to every model pod (no public source gives them). Leave headroom accordingly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from platform_config import pod_resources as pr
from platform_config.fields import quantity_bytes
from platform_config.instances import INSTANCE_TYPES
from platform_config.line_models import MAX_REPLICAS, BusinessLineConfig
from platform_config.platform_models import InstanceGroupConfig, PlatformConfig
from platform_config.pod_resources import PodResources

MIB = 2**20
GIB = 2**30

#: ``kubeReserved`` memory of EKS's nodeadm: ``11 MiB x maxPods + 255 MiB`` (module docstring).
KUBE_RESERVED_MEMORY_PER_POD_MIB = 11
KUBE_RESERVED_MEMORY_BASE_MIB = 255
#: ``evictionHard`` ``memory.available`` of nodeadm's default kubelet configuration.
EVICTION_HARD_MEMORY_MIB = 100
#: ``kubeReserved`` CPU of nodeadm: (millicores in the range, reserved per 10,000) for the first
#: core, the second, the next two, and the rest (None: up to the node's CPUs).
KUBE_RESERVED_CPU_RANGES: tuple[tuple[int | None, int], ...] = ((1000, 600), (1000, 100), (2000, 50), (None, 25))


def kube_reserved_cpu_millicores(cpus: int) -> int:
    """nodeadm's ``getCPUMillicoresToReserve`` for a node of ``cpus`` CPUs: 24 CPUs -> 130."""
    total, start, reserved = cpus * 1000, 0, 0
    for width, per_10000 in KUBE_RESERVED_CPU_RANGES:
        end = total if width is None else start + width
        if total > start:
            reserved += (min(total, end) - start) * per_10000 // 10000
        start = end
    return reserved


def kubelet_reserved_memory_mib(max_pods: int) -> int:
    """``kubeReserved`` memory plus the hard eviction threshold, MiB: 292 max pods -> 3,567."""
    return KUBE_RESERVED_MEMORY_PER_POD_MIB * max_pods + KUBE_RESERVED_MEMORY_BASE_MIB + EVICTION_HARD_MEMORY_MIB


@dataclass(frozen=True)
class Reservation:
    """What one thing takes from a node: ``cpu_millicores``, ``memory_bytes``; ``name`` and ``detail``
    say what it is and where the figure comes from."""

    name: str
    cpu_millicores: int
    memory_bytes: int
    detail: str = ""


def pod_request(pod: PodResources) -> tuple[int, int]:
    """(millicores, bytes) the scheduler counts for ``pod``: the sum of its containers' requests, or
    its largest init container's when that is more, per resource."""
    def total(items: Iterable[dict], key: str, scale: float) -> list[int]:
        return [round(quantity_bytes(c.get("requests", {}).get(key, "0")) * scale) for c in items]

    cpu = max([sum(total(pod.containers, "cpu", 1000))] + total(pod.init_containers, "cpu", 1000))
    memory = max([sum(total(pod.containers, "memory", 1))] + total(pod.init_containers, "memory", 1))
    return cpu, memory


def platform_pods(platform: PlatformConfig, group: InstanceGroupConfig,
                  lines: Iterable[BusinessLineConfig]) -> list[Reservation]:
    """The platform's own pods that may run on a node of ``group``, each with its request
    (module docstring); ``lines`` are the business lines of the cluster (their L2 janitors)."""
    l2_lines = [l for l in lines if l.cache.l2_enabled]
    pods: list[tuple[pr.PodResources, int]] = []
    c = platform.curvine
    if c.enabled:
        if group.name in {g.name for g in platform.curvine_worker_groups()}:
            pods.append((pr.CURVINE_WORKER_POD, 1))
        pods.append((pr.CSI_NODE_POD, 1))
        if l2_lines:
            pods.append((pr.FUSE_POD, 1))
        if c.mount_watchdog.enabled:
            pods.append((pr.MOUNT_WATCHDOG_POD, 1))
        if c.node_firewall.enabled:
            pods.append((pr.NODE_FIREWALL_POD, 1))
    obs = platform.observability
    if obs.enabled and obs.dcgm_exporter.install:
        pods.append((pr.dcgm_exporter_pod(), 1))
    if c.enabled and l2_lines:
        pods.append((pr.JANITOR_POD, len(l2_lines)))
    out = []
    for pod, count in pods:
        cpu, memory = pod_request(pod)
        name = pod.name if count == 1 else f"{count} x {pod.name}"
        out.append(Reservation(name, cpu * count, memory * count))
    return out


@dataclass(frozen=True)
class NodeBudget:
    """One node of an instance group: its capacity and what is taken before the lines' pods.

    Attributes:
        group, instance_type: where the node is.
        gpus, cpu_millicores, memory_bytes: capacity.
        reservations: Tiered Storage, kubelet/system, each platform pod (see the module docstring).
    """

    group: str
    instance_type: str
    gpus: int
    cpu_millicores: int
    memory_bytes: int
    reservations: tuple[Reservation, ...]

    @property
    def free_cpu_millicores(self) -> int:
        """CPU left for the lines' pods, millicores."""
        return self.cpu_millicores - sum(r.cpu_millicores for r in self.reservations)

    @property
    def free_memory_bytes(self) -> int:
        """Memory left for the lines' pods, bytes."""
        return self.memory_bytes - sum(r.memory_bytes for r in self.reservations)

    def describe(self) -> str:
        """One line: capacity, each reservation, what is left (the config check's wording)."""
        taken = "; ".join(f"{r.name} " + (f"{cpu_text(r.cpu_millicores)} CPU, " if r.cpu_millicores else "")
                          + gib_text(r.memory_bytes) for r in self.reservations)
        return (f"{self.gpus} GPU(s), {cpu_text(self.cpu_millicores)} CPU, {gib_text(self.memory_bytes)} less "
                f"{taken} = {cpu_text(self.free_cpu_millicores)} CPU, {gib_text(self.free_memory_bytes)}")


def cpu_text(millicores: int) -> str:
    """Cores with up to two decimals: 23870 -> ``23.87``, 24000 -> ``24``."""
    return f"{millicores / 1000:,.2f}".rstrip("0").rstrip(".")


def gib_text(nbytes: float) -> str:
    """GiB with two decimals: ``300.65 GiB``."""
    return f"{nbytes / GIB:,.2f} GiB"


def node_budget(platform: PlatformConfig, group: InstanceGroupConfig,
                lines: Iterable[BusinessLineConfig]) -> NodeBudget:
    """The budget of one node of ``group`` (module docstring); ``lines``: the cluster's lines."""
    instance = INSTANCE_TYPES[group.instance_type]
    cpus = instance.cpus(group.threads_per_core)
    memory = instance.host_memory_gib * GIB
    reservations = []
    ts = platform.hyperpod.tiered_storage
    if ts.enabled:
        reservations.append(Reservation(
            f"Tiered Storage {ts.memory_allocation_percentage}%", 0,
            round(memory * ts.memory_allocation_percentage / 100),
            "of host memory, reserved for HyperPod's ai-toolkit daemon"))
    reservations.append(Reservation(
        "kubelet/system", kube_reserved_cpu_millicores(cpus), kubelet_reserved_memory_mib(instance.max_pods) * MIB,
        f"EKS nodeadm's formula, {instance.max_pods} max pods (HyperPod publishes none)"))
    reservations += platform_pods(platform, group, lines)
    return NodeBudget(group.name, group.instance_type, instance.gpus, cpus * 1000, memory, tuple(reservations))


@dataclass(frozen=True)
class Replica:
    """One replica of a line: what its pod asks for (GPUs, millicores, bytes)."""

    line: str
    index: int
    gpus: int
    cpu_millicores: int
    memory_bytes: int

    def describe(self) -> str:
        return f"{self.gpus} GPU, {cpu_text(self.cpu_millicores)} CPU, {gib_text(self.memory_bytes)}"


def replica_of(line: BusinessLineConfig, index: int = 1) -> Replica:
    """The request of replica ``index`` (1-based) of ``line``: ``gpus_per_replica``, ``resources``."""
    return Replica(line.name, index, line.gpus_per_replica, round(quantity_bytes(line.resources.cpu) * 1000),
                   round(quantity_bytes(line.resources.memory)))


@dataclass
class NodeLoad:
    """A node and the replicas placed on it; ``free_*`` is what is left."""

    budget: NodeBudget
    replicas: list[Replica] = field(default_factory=list)

    @property
    def free_gpus(self) -> int:
        return self.budget.gpus - sum(r.gpus for r in self.replicas)

    @property
    def free_cpu_millicores(self) -> int:
        return self.budget.free_cpu_millicores - sum(r.cpu_millicores for r in self.replicas)

    @property
    def free_memory_bytes(self) -> int:
        return self.budget.free_memory_bytes - sum(r.memory_bytes for r in self.replicas)

    def room_for(self, r: Replica) -> bool:
        return (self.free_gpus >= r.gpus and self.free_cpu_millicores >= r.cpu_millicores
                and self.free_memory_bytes >= r.memory_bytes)

    def describe_free(self) -> str:
        return (f"{self.free_gpus} GPU, {cpu_text(self.free_cpu_millicores)} CPU, "
                f"{gib_text(self.free_memory_bytes)}")


@dataclass(frozen=True)
class Unplaced:
    """A replica no node had room for, and what every node had free at that moment."""

    replica: Replica
    free_then: tuple[str, ...]


@dataclass(frozen=True)
class TypeFit:
    """The lines on one instance type packed onto its schedulable nodes.

    Attributes:
        instance_type: the type.
        lines: the lines on it, (file, line), as given.
        nodes: every schedulable node with the replicas placed on it.
        too_big: (file, line, field, message, allowed) for each line whose single replica exceeds an
            empty node's budget (``resources.cpu`` or ``resources.memory``); those are not packed.
        unplaced: the replicas that found no room, in packing order.
    """

    instance_type: str
    lines: tuple[tuple[Path, BusinessLineConfig], ...]
    nodes: tuple[NodeLoad, ...]
    too_big: tuple[tuple[Path, BusinessLineConfig, str, str, str], ...]
    unplaced: tuple[Unplaced, ...]

    @property
    def fits(self) -> bool:
        return not self.too_big and not self.unplaced

    def budgets(self) -> list[NodeBudget]:
        """The distinct budgets of the nodes (one per instance group), in group order."""
        seen: dict[str, NodeBudget] = {}
        for node in self.nodes:
            seen.setdefault(node.budget.group, node.budget)
        return list(seen.values())


def schedulable_groups(platform: PlatformConfig, instance_type: str) -> list[InstanceGroupConfig]:
    """Groups of ``instance_type`` whose nodes a line's pods can use: no ``NoSchedule`` or
    ``NoExecute`` taint (an InferenceEndpointConfig has no tolerations; PreferNoSchedule is fine)."""
    return [g for g in platform.hyperpod.instance_groups if g.instance_type == instance_type
            and all(t.effect == "PreferNoSchedule" for t in g.taints)]


def fit_lines(platform: PlatformConfig, lines: list[tuple[Path, BusinessLineConfig]]) -> dict[str, TypeFit]:
    """Pack every line's replicas onto the nodes of its instance type (module docstring): each line at
    its most, :attr:`~platform_config.line_models.BusinessLineConfig.max_replica_count` (``replicas``, or
    ``autoscaling.max_replicas``), so an autoscaling line can always grow to its maximum.

    Args:
        lines: (file, line) pairs: every line of the cluster (all of them share the nodes, and
            each L2 line's janitor is counted on every node).

    Returns:
        instance type -> :class:`TypeFit`, for every type some line uses and some schedulable
        group has (a type without one is reported by the instance-type rules instead).
    """
    every_line = [l for _, l in lines]
    result: dict[str, TypeFit] = {}
    for instance_type in sorted({l.instance_type for _, l in lines}):
        groups = schedulable_groups(platform, instance_type)
        if not groups:
            continue
        budgets = {g.name: node_budget(platform, g, every_line) for g in groups}  # one per group, shared by its nodes
        nodes = tuple(NodeLoad(budgets[g.name]) for g in groups for _ in range(g.instance_count))
        on_type = tuple((p, l) for p, l in lines if l.instance_type == instance_type)
        if not nodes:  # instance_count 0 everywhere: no replica has a node
            unplaced = tuple(Unplaced(replica_of(l, i + 1), ()) for _, l in on_type for i in range(l.max_replica_count))
            result[instance_type] = TypeFit(instance_type, on_type, nodes, (), unplaced)
            continue
        most_cpu = max(n.budget.free_cpu_millicores for n in nodes)
        most_memory = max(n.budget.free_memory_bytes for n in nodes)
        too_big = []
        packable = []
        ts_hint = (", or a smaller hyperpod.tiered_storage.memory_allocation_percentage"
                   if platform.hyperpod.tiered_storage.enabled else "")
        smt_hint = (", or threads_per_core 2 on the instance group (twice the CPUs)"
                    if any(g.threads_per_core == 1 for g in groups) else "")
        for path, line in on_type:
            one = replica_of(line)
            if most_memory <= 0:
                too_big.append((path, line, "resources.memory",
                                f"a {instance_type} node has no memory left for the lines' pods "
                                f"({gib_text(most_memory)})", f"a smaller share for Tiered Storage{ts_hint}"))
            elif one.memory_bytes > most_memory:
                too_big.append((path, line, "resources.memory",
                                f"{line.resources.memory} ({gib_text(one.memory_bytes)}) per replica is more than a "
                                f"whole {instance_type} node has for the lines' pods: {gib_text(most_memory)}",
                                f"at most {gib_text(most_memory)} per replica, a larger instance type{ts_hint}"))
            elif one.cpu_millicores > most_cpu:
                too_big.append((path, line, "resources.cpu",
                                f"{line.resources.cpu} CPU per replica is more than a whole {instance_type} node has "
                                f"for the lines' pods: {cpu_text(most_cpu)} CPU",
                                f"at most {cpu_text(most_cpu)} CPU per replica, a larger instance type{smt_hint}"))
            else:
                packable.append(line)
        replicas = [replica_of(l, i + 1) for l in packable for i in range(l.max_replica_count)]
        # Widest first; then the replica taking the largest share of a node's CPU or memory.
        replicas.sort(key=lambda r: (-r.gpus, -max(r.cpu_millicores / max(most_cpu, 1),
                                                  r.memory_bytes / max(most_memory, 1))))
        unplaced = []
        for replica in replicas:
            node = next((n for n in nodes if n.room_for(replica)), None)
            if node is None:
                unplaced.append(Unplaced(replica, tuple(n.describe_free() for n in nodes)))
            else:
                node.replicas.append(replica)
        result[instance_type] = TypeFit(instance_type, on_type, nodes, tuple(too_big), tuple(unplaced))
    return result


def most_replicas(platform: PlatformConfig, lines: list[tuple[Path, BusinessLineConfig]], name: str,
                  limit: int = MAX_REPLICAS) -> int:
    """The most replicas of line ``name`` the nodes of its instance type hold, packed by
    :func:`fit_lines` (the config check's packing) with every other line at its own maximum: the bound
    of ``autoscaling.max_replicas`` the planner reports. 0 when not even one fits.

    Counts up from 1 and stops at the first count that does not fit (first-fit decreasing is not
    monotone in theory; a count above the first failure is not offered).

    Raises:
        StopIteration: ``name`` is not one of ``lines``.
    """
    target = next(l for _, l in lines if l.name == name)
    best = 0
    for n in range(1, limit + 1):
        trial = [(p, l.model_copy(update={"replicas": n, "autoscaling": None}) if l.name == name else l)
                 for p, l in lines]
        fit = fit_lines(platform, trial).get(target.instance_type)
        if fit is None or not fit.fits:
            break
        best = n
    return best


def format_node_fit(fit: TypeFit) -> list[str]:
    """The node budget and placement of one instance type as report lines (``scripts/plan.py``):
    each group's capacity, what is taken and why, what is left for the lines' pods, and where first-fit
    decreasing put every replica. The verdict (and why not) is the config check's own problem text."""
    out: list[str] = []
    for budget in fit.budgets():
        count = sum(1 for n in fit.nodes if n.budget.group == budget.group)
        out.append(f"nodes         {budget.instance_type}: {count} node(s) of {budget.group}, each {budget.gpus} GPU, "
                   f"{cpu_text(budget.cpu_millicores)} CPU, {gib_text(budget.memory_bytes)}")
        for r in budget.reservations:
            cpu = f"{cpu_text(r.cpu_millicores)} CPU" if r.cpu_millicores else "-"
            out.append(f"  - {r.name:<24} {cpu:>10} {gib_text(r.memory_bytes):>12}" + (f"  {r.detail}" if r.detail else ""))
        out.append(f"  = {'for the lines':<24} {cpu_text(budget.free_cpu_millicores) + ' CPU':>10} "
                   f"{gib_text(budget.free_memory_bytes):>12}  per node")
    for i, node in enumerate(fit.nodes):
        counts: dict[str, int] = {}
        for r in node.replicas:
            counts[r.line] = counts.get(r.line, 0) + 1
        placed = ", ".join(f"{name} x{n}" for name, n in counts.items()) or "-"
        out.append(f"  node {i + 1}: {placed}; free {node.describe_free()}")
    return out
