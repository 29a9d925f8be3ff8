"""CPU and memory are checked per node with the GPUs (issue 10, fit item 1).

Before, only GPUs were packed: ``resources.memory: 4000Gi`` on a 384 GiB node, ``cpu: "500"``,
``cpu: "8Gi"`` and six 380Gi pods on two nodes all synthesized, and their pods would have stayed
Pending. Now :func:`platform_config.node_fit.fit_lines` packs GPUs, CPU and memory of each node at
once, against what a node has for the lines' pods: capacity less Tiered Storage's share, the
kubelet's reservation (EKS nodeadm's formula) and the platform's own pods.

Figures of a g6e.12xlarge node of the scenario (``threads_per_core`` 1: 24 CPUs; 384 GiB;
Tiered Storage 20%; 292 max pods):

* Tiered Storage 20% of 384 GiB = 76.8 GiB;
* kubelet/system: CPU 60 + 10 + 10 + 20,000 x 0.25% = 130 m; memory 11 x 292 + 255 + 100 = 3,567 MiB;
* Curvine Worker 1 CPU / 2 GiB, CSI node plugin 70 m / 192 MiB, FUSE pod 2 CPU / 2 GiB (Guaranteed:
  requests = limits, issue 15), DCGM exporter 100 m / 128 MiB, one L2 janitor per L2 line 50 m / 128 MiB.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from platform_config import load_project
from platform_config.instances import INSTANCE_TYPES
from platform_config.node_fit import (
    GIB,
    MIB,
    fit_lines,
    kube_reserved_cpu_millicores,
    kubelet_reserved_memory_mib,
    node_budget,
)
from tests.config.test_config import only_problem, problems
from tests.example_config import FIXTURE_CONFIG, edit_yaml, set_fixed

PROJECT = load_project(FIXTURE_CONFIG)


_problems, _only_problem = problems, only_problem


def _only_rag_on_one_g6e_node(config_dir: Path, **resources: str) -> Path:
    """The scenario with rag-assistant alone on one g6e.12xlarge node (the other g6e lines removed)."""
    for name in ("legal-search", "ticket-triage"):
        (config_dir / "business-lines" / f"{name}.yaml").unlink()
    edit_yaml(config_dir / "platform.yaml", lambda d: d["hyperpod"]["instance_groups"][0].update(instance_count=1))
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["resources"].update(resources))
    return path


# --- the budget ---------------------------------------------------------------------------------

def test_nodeadm_kubelet_reservation() -> None:
    # 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of the rest (millicores).
    assert [kube_reserved_cpu_millicores(n) for n in (1, 2, 4, 24, 96)] == [60, 70, 80, 130, 310]
    # maxPods = ENIs x (IPv4 per ENI - 1) + 2; memory = 11 MiB x maxPods + 255 MiB, + 100 MiB eviction.
    assert INSTANCE_TYPES["ml.g6e.12xlarge"].max_pods == 10 * 29 + 2 == 292
    assert INSTANCE_TYPES["ml.p5.48xlarge"].max_pods == 2 * 49 + 2 == 100
    assert kubelet_reserved_memory_mib(292) == 3567 and kubelet_reserved_memory_mib(100) == 1455


def test_a_g6e_node_budget_of_the_scenario() -> None:
    g6e = PROJECT.platform.hyperpod.instance_groups[0]
    budget = node_budget(PROJECT.platform, g6e, PROJECT.business_lines)
    assert (budget.gpus, budget.cpu_millicores, budget.memory_bytes) == (4, 24_000, 384 * GIB)  # SMT off: 48/2
    taken = {r.name: (r.cpu_millicores, r.memory_bytes) for r in budget.reservations}
    assert taken == {
        "Tiered Storage 20%": (0, round(384 * GIB * 0.2)),
        "kubelet/system": (130, 3567 * MIB),
        "Curvine Worker": (1000, 2048 * MIB),
        "Curvine CSI node plugin": (70, 192 * MIB),
        "Curvine FUSE pod": (2000, 2048 * MIB),
        "L2 mount watchdog": (20, 64 * MIB),
        "Curvine node filter": (10, 48 * MIB),
        "DCGM exporter": (100, 128 * MIB),
        "3 x L2 janitor": (150, 384 * MIB),  # rag-assistant, research-reasoning, ticket-triage
    }
    assert budget.free_cpu_millicores == 24_000 - 3480 == 20_520
    assert budget.free_memory_bytes == 384 * GIB - round(384 * GIB * 0.2) - (3567 + 2048 + 192 + 2048 + 64 + 48 + 128 + 384) * MIB
    assert f"{budget.free_memory_bytes / GIB:.2f}" == "298.92"


def test_threads_per_core_2_doubles_the_cpus_and_a_group_without_worker_has_none() -> None:
    platform = PROJECT.platform
    g6e, p5 = platform.hyperpod.instance_groups
    smt = g6e.model_copy(update={"threads_per_core": 2})
    assert node_budget(platform, smt, PROJECT.business_lines).cpu_millicores == 48_000
    only_p5 = platform.model_copy(update={"curvine": platform.curvine.model_copy(
        update={"worker_instance_groups": ("p5-inference",)})})
    assert "Curvine Worker" not in {r.name for r in node_budget(only_p5, g6e, PROJECT.business_lines).reservations}
    assert "Curvine Worker" in {r.name for r in node_budget(only_p5, p5, PROJECT.business_lines).reservations}


def test_the_scenario_places_every_replica() -> None:
    fits = fit_lines(PROJECT.platform, [(Path(f"{l.name}.yaml"), l) for l in PROJECT.business_lines])
    g6e = fits["ml.g6e.12xlarge"]
    assert g6e.fits and [[r.line for r in n.replicas] for n in g6e.nodes] == [
        ["legal-search", "ticket-triage"], ["rag-assistant", "rag-assistant"]]
    assert fits["ml.p5.48xlarge"].fits


# --- what the newcomer found --------------------------------------------------------------------

def test_four_80gi_pods_on_a_g6e_12xlarge_at_20_percent_tiered_storage_do_not_fit(config_dir: Path) -> None:
    """The example's old comment: 4 x 80 GiB + the 76.8 GiB share = 396.8 GiB > 384 GiB."""
    path = _only_rag_on_one_g6e_node(config_dir, cpu="4")
    edit_yaml(path, lambda d: set_fixed(d, replicas=4))
    message = _only_problem(config_dir)
    assert message.startswith(
        f"{config_dir / 'business-lines'}: replicas: the lines on ml.g6e.12xlarge (rag-assistant 4 x (1 GPU, 4 CPU, "
        f"80.00 GiB)) do not fit on its 1 node(s) in {config_dir / 'platform.yaml'}: a node has 4 GPU(s), 24 CPU, "
        "384.00 GiB less Tiered Storage 20% 76.80 GiB; kubelet/system 0.13 CPU, 3.48 GiB; Curvine Worker 1 CPU, "
        "2.00 GiB; Curvine CSI node plugin 0.07 CPU, 0.19 GiB; Curvine FUSE pod 2 CPU, 2.00 GiB; L2 mount watchdog "
        "0.02 CPU, 0.06 GiB; Curvine node filter 0.01 CPU, 0.05 GiB; DCGM exporter 0.1 CPU, 0.12 GiB; 2 x L2 janitor 0.1 CPU, 0.25 GiB = 20.57 CPU, 299.04 GiB; first that does not fit: "
        "rag-assistant replica 4 of 4 (1 GPU, 4 CPU, 80.00 GiB), when the nodes had free node 1: 1 GPU, 8.57 CPU, "
        "59.04 GiB; lines left out: rag-assistant; allowed: raise instance_count, or lower replicas, resources.cpu "
        "or resources.memory")
    # Without Tiered Storage the same four pods fit: its share is what was missing.
    edit_yaml(config_dir / "platform.yaml", lambda d: d["hyperpod"]["tiered_storage"].update(enabled=False))
    assert load_project(config_dir).business_line("rag-assistant").replicas == 4


def test_a_memory_request_larger_than_a_node_is_refused_on_its_field(config_dir: Path) -> None:
    path = _only_rag_on_one_g6e_node(config_dir, memory="4000Gi")
    message = _only_problem(config_dir)
    assert message.startswith(
        f"{path}: resources.memory: 4000Gi (4,000.00 GiB) per replica is more than a whole ml.g6e.12xlarge node has "
        f"for the lines' pods: 299.04 GiB (a node in {config_dir / 'platform.yaml'}: 4 GPU(s), 24 CPU, 384.00 GiB "
        "less Tiered Storage 20% 76.80 GiB;")
    assert message.endswith(
        "= 20.57 CPU, 299.04 GiB); allowed: at most 299.04 GiB per replica, a larger instance type, or a smaller "
        "hyperpod.tiered_storage.memory_allocation_percentage (got '4000Gi')")


def test_a_cpu_request_larger_than_a_node_is_refused_on_its_field(config_dir: Path) -> None:
    path = _only_rag_on_one_g6e_node(config_dir, cpu="500")
    message = _only_problem(config_dir)
    assert message.startswith(f"{path}: resources.cpu: 500 CPU per replica is more than a whole ml.g6e.12xlarge node "
                              "has for the lines' pods: 20.57 CPU (a node in")
    assert message.endswith("allowed: at most 20.57 CPU per replica, a larger instance type, or threads_per_core 2 on "
                            "the instance group (twice the CPUs) (got '500')")


def test_six_380gi_pods_on_two_nodes_are_refused(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    for name in ("legal-search", "ticket-triage"):
        (config_dir / "business-lines" / f"{name}.yaml").unlink()
    edit_yaml(path, lambda d: (set_fixed(d, replicas=6), d["resources"].update(memory="380Gi", cpu="2")))
    assert _only_problem(config_dir).startswith(
        f"{path}: resources.memory: 380Gi (380.00 GiB) per replica is more than a whole ml.g6e.12xlarge node has for "
        "the lines' pods: 299.04 GiB")


def test_cpu_only_packing_leaves_a_replica_out(config_dir: Path) -> None:
    """Three 10-CPU pods on one 24-CPU node: GPUs and memory would allow it, CPU does not."""
    path = _only_rag_on_one_g6e_node(config_dir)
    edit_yaml(path, lambda d: set_fixed(d, replicas=3))
    message = _only_problem(config_dir)
    assert "first that does not fit: rag-assistant replica 3 of 3 (1 GPU, 10 CPU, 80.00 GiB)" in message
    assert "when the nodes had free node 1: 2 GPU, 0.57 CPU, 139.04 GiB" in message


@pytest.mark.parametrize("field, value, expected", [
    ("cpu", "8Gi", "resources.cpu: not allowed; allowed: a Kubernetes quantity of CPU: cores such as 8 or 0.5, or "
                   "millicores such as 500m, without a byte suffix"),
    ("cpu", "8k", "resources.cpu: not allowed; allowed: a Kubernetes quantity of CPU"),
    ("memory", "0.5", "resources.memory: '0.5' is 0.5 bytes, below 1Gi (a number without a suffix counts bytes, 'm' "
                      "thousandths of a byte); allowed: a byte quantity of at least 1Gi such as 80Gi or 2Ti"),
    ("memory", "80", "resources.memory: '80' is 80 bytes, below 1Gi"),
    ("memory", "500m", "resources.memory: '500m' is 0.5 bytes, below 1Gi"),
])
def test_a_quantity_in_the_wrong_unit_is_refused(config_dir: Path, field: str, value: str, expected: str) -> None:
    path = config_dir / "business-lines" / "ticket-triage.yaml"
    edit_yaml(path, lambda d: d["resources"].update({field: value}))
    message = _only_problem(config_dir)
    assert message.startswith(f"{path}: {expected}") and message.endswith(f"(got {value!r})")


def test_an_l2_size_below_one_gib_is_refused(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "ticket-triage.yaml"
    edit_yaml(path, lambda d: d["cache"].update(l2_size="200M"))
    assert _only_problem(config_dir).startswith(f"{path}: cache.l2_size: '200M' is 2e+08 bytes, below 1Gi")


def test_tiered_storage_at_100_percent_leaves_no_memory_for_any_pod(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml",
              lambda d: d["hyperpod"]["tiered_storage"].update(memory_allocation_percentage=100))
    found = _problems(config_dir)
    assert len(found) == 4  # every line
    assert all("resources.memory: a ml." in p and "node has no memory left for the lines' pods" in p for p in found)


# --- the L2 pool is real NVMe -------------------------------------------------------------------

def test_a_worker_capacity_beyond_the_nvme_is_refused(config_dir: Path) -> None:
    """3,800 GB of NVMe on a g6e.12xlarge is 3,539 GiB: a larger Curvine tier promises blocks it cannot hold."""
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["curvine"].update(worker_capacity_gib=4000))
    assert _only_problem(config_dir) == (
        f"{path}: curvine.worker_capacity_gib: 4000 GiB per Worker is more than the 3,539 GiB of NVMe of "
        "ml.g6e.12xlarge (instance group g6e-inference), so Curvine would accept blocks the disk cannot hold; "
        "allowed: at most 3539, less what model weights and logs need there (got 4000)")


def test_dcgm_exporter_requests_set_in_its_values_win_over_the_charts(monkeypatch) -> None:
    """Helm merges values into the chart's defaults key by key: a cpu request set in the platform's
    values replaces the chart's 100m, the chart's 128Mi memory request stays; the Helm values send
    exactly what the budget counts."""
    from observability.cluster_objects import dcgm_exporter_values
    from platform_config import pod_resources

    given = {"requests": {"cpu": "300m"}}
    monkeypatch.setattr(pod_resources, "DCGM_EXPORTER_VALUES_RESOURCES", given)
    assert dcgm_exporter_values(PROJECT.platform)["resources"] == given
    g6e = PROJECT.platform.hyperpod.instance_groups[0]
    taken = {r.name: (r.cpu_millicores, r.memory_bytes)
             for r in node_budget(PROJECT.platform, g6e, PROJECT.business_lines).reservations}
    assert taken["DCGM exporter"] == (300, 128 * MIB)
