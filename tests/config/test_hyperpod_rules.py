"""HyperPod's own rules (docs/sources.md §10): each bad value fails at load with file, field and allowed values.

Every test copies the scenario config, breaks one HyperPod rule and checks the single problem the
loader reports. The rules themselves live in ``platform_config/hyperpod_rules.py``; the construct
side is tested in ``tests/stacks/test_kv_constructs.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from platform_config import load_project
from platform_config.instances import INSTANCE_TYPES, InstanceType
from tests.config.test_config import only_problem
from tests.example_config import edit_yaml

G6E, P5 = 0, 1  # indexes of the scenario's instance groups (g6e-inference, p5-inference)


def group(index: int, **changes: Any) -> Callable[[dict], None]:
    return lambda d: d["hyperpod"]["instance_groups"][index].update(changes)


def hyperpod(**changes: Any) -> Callable[[dict], None]:
    return lambda d: d["hyperpod"].update(changes)


def problem_after(config_dir: Path, change: Callable[[dict], None]) -> str:
    path = config_dir / "platform.yaml"
    edit_yaml(path, change)
    message = only_problem(config_dir)
    assert message.startswith(f"{path}: "), message  # the file is named first
    return message


PLAN = "arn:aws:sagemaker:us-west-2:111122223333:training-plan/p5-inference-plan"


@pytest.mark.parametrize("change, field, expected", [
    # Taints and deep health checks on one group: CreateCluster is rejected.
    (group(G6E, taints=[{"key": "kvcache.io/gpu", "effect": "NoSchedule"}]), "hyperpod.instance_groups.0",
     "taints: HyperPod rejects custom taints on an instance group with deep health checks (InstanceStress)"
     " (HyperPod EKS prerequisites, docs/sources.md §10); allowed: remove the taints, or set deep_health_checks: []"),
    (group(P5, deep_health_checks=["InstanceStress"]), "hyperpod.instance_groups.1",
     "instance group p5-inference: taints: HyperPod rejects custom taints"),
    # InstanceConnectivity is a multi-node NCCL test.
    (group(G6E, instance_count=1, deep_health_checks=["InstanceConnectivity"]), "hyperpod.instance_groups.0",
     "InstanceConnectivity runs NCCL tests across nodes and needs at least 2 instances, the group has 1; "
     "allowed: InstanceStress only, or instance_count >= 2"),
    (group(G6E, deep_health_checks=["InstanceStress", "InstanceStress"]), "hyperpod.instance_groups.0",
     "deep_health_checks: InstanceStress repeated"),
    # Label and taint keys: syntax, size, reserved prefixes.
    (group(G6E, labels={"sagemaker.amazonaws.com/node-health-status": "Schedulable"}),
     "hyperpod.instance_groups.0.labels", "uses the reserved prefix sagemaker.amazonaws.com/"),
    (group(G6E, labels={"node-role.kubernetes.io/gpu": "true"}),
     "hyperpod.instance_groups.0.labels", "uses the reserved prefix kubernetes.io/"),
    (group(P5, taints=[{"key": "k8s.io/gpu", "effect": "PreferNoSchedule"}]),
     "hyperpod.instance_groups.1.taints.0.key", "uses the reserved prefix k8s.io/"),
    (group(G6E, labels={"kvcache.io/" + "n" * 64: "x"}), "hyperpod.instance_groups.0.labels",
     "prefix at most 253 and name at most 63 characters"),
    (group(G6E, labels={"bad key": "x"}), "hyperpod.instance_groups.0.labels",
     "a Kubernetes label/taint key: [prefix/]name"),
    (group(G6E, labels={"kvcache.io/tier": ""}), "hyperpod.instance_groups.0.labels.kvcache.io/tier",
     "at least 1 character"),
    (group(G6E, labels={f"kvcache.io/l{i}": "x" for i in range(51)}), "hyperpod.instance_groups.0.labels",
     "at most 50 items"),
    (group(P5, taints=[{"key": "kvcache.io/a", "effect": "PreferNoSchedule"}] * 2), "hyperpod.instance_groups.1",
     "taints: kvcache.io/a:PreferNoSchedule repeated; allowed: each key and effect once"),
    # Counts, reserved capacity.
    (group(G6E, instance_count=6759), "hyperpod.instance_groups.0.instance_count", "less than or equal to 6758"),
    (group(P5, min_instance_count=2), "hyperpod.instance_groups.1",
     "min_instance_count: 2 exceeds instance_count 1; allowed: 0..1"),
    (group(P5, training_plan_arn="arn:aws:sagemaker:us-west-2:111122223333:reserved/p5"),
     "hyperpod.instance_groups.1.training_plan_arn",
     "a training plan ARN (arn:aws:sagemaker:<region>:<account>:training-plan/<name>)"),
    (hyperpod(node_provisioning_mode="Standard"), "hyperpod.node_provisioning_mode", "allowed: 'Continuous'"),
])
def test_hyperpod_rule_violations_are_named(config_dir, change, field, expected) -> None:
    message = problem_after(config_dir, change)
    assert f": {field}" in message, message
    assert expected in message, message


def test_too_many_instance_groups(config_dir) -> None:
    def add(d: dict) -> None:
        template = d["hyperpod"]["instance_groups"][P5]
        d["hyperpod"]["instance_groups"] += [dict(template, name=f"extra-{i}") for i in range(99)]
    message = problem_after(config_dir, add)
    assert ": hyperpod.instance_groups: " in message and "at most 100 items" in message


def test_valid_reserved_capacity_and_provisioning_values_load(config_dir) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, group(P5, instance_count=2, min_instance_count=1, training_plan_arn=PLAN))
    edit_yaml(path, hyperpod(node_provisioning_mode=None))
    hp = load_project(config_dir).platform.hyperpod
    assert hp.node_provisioning_mode is None
    assert (hp.instance_groups[P5].training_plan_arn, hp.instance_groups[P5].min_instance_count) == (PLAN, 1)


def test_node_provisioning_mode_defaults_to_continuous(config_dir) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["hyperpod"].pop("node_provisioning_mode"))
    assert load_project(config_dir).platform.hyperpod.node_provisioning_mode == "Continuous"


def test_deep_health_checks_need_an_accelerator(config_dir, monkeypatch) -> None:
    """HyperPod's deep health checks exist for GPU and Trainium instances only."""
    monkeypatch.setitem(INSTANCE_TYPES, "ml.m7i.4xlarge", InstanceType("ml.m7i.4xlarge", "", 0, 0, 16, 64, 0))
    message = problem_after(config_dir, lambda d: d["hyperpod"]["instance_groups"].append(
        {"name": "cpu", "instance_type": "ml.m7i.4xlarge", "instance_count": 2, "deep_health_checks": ["InstanceStress"]}))
    assert "instance group cpu: deep_health_checks: HyperPod runs deep health checks on GPU and Trainium instances only" \
        in message


# --- the HyperPod dependency chart -----------------------------------------------------------

def test_health_features_without_the_dependency_chart_are_refused(config_dir) -> None:
    message = problem_after(config_dir, hyperpod(dependency_chart_preinstalled=False))
    assert ": hyperpod.dependency_chart: node_recovery is Automatic; instance group g6e-inference has " \
           "deep_health_checks, which need the HyperPod dependency chart" in message
    assert "allowed: set dependency_chart (the stack installs a vendored checkout), or " \
           "dependency_chart_preinstalled: true" in message


def test_without_health_features_no_dependency_chart_is_needed(config_dir) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, hyperpod(dependency_chart_preinstalled=False, node_recovery="None"))
    edit_yaml(path, group(G6E, deep_health_checks=[]))
    hp = load_project(config_dir).platform.hyperpod
    assert hp.dependency_chart is None and not hp.dependency_chart_preinstalled


def test_chart_config_and_preinstalled_contradict(config_dir) -> None:
    message = problem_after(config_dir, hyperpod(dependency_chart={
        "path": "vendor/chart", "source_commit": "1504d53b28a6de4449c0fcdf9d56b8c87f28283f"}))
    assert "dependency_chart and dependency_chart_preinstalled: true both say how" in message
    assert "allowed: one of them" in message


def test_the_example_states_how_the_chart_is_installed() -> None:
    """`make synth` on a fresh clone: no vendored chart, so the example must say it is preinstalled."""
    from tests.example_config import USER_CONFIG

    hp = load_project(USER_CONFIG).platform.hyperpod
    needs_chart = hp.node_recovery == "Automatic" or any(g.deep_health_checks for g in hp.instance_groups)
    assert not needs_chart or hp.dependency_chart is not None or hp.dependency_chart_preinstalled


# --- where the Curvine Worker keeps its data -------------------------------------------------

@pytest.mark.parametrize("path", ["/opt/sagemaker/curvine-data", "/opt/dlami/nvme/kv/curvine-data"])
def test_worker_data_dir_may_be_under_either_instance_store_mount(config_dir, path) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["curvine"].update(worker_data_dir=path))
    assert load_project(config_dir).platform.curvine.worker_data_dir == path


@pytest.mark.parametrize("path, expected", [
    ("/var/lib/curvine", "a directory below /opt/dlami/nvme or /opt/sagemaker"),
    ("/opt/sagemaker", "a directory below /opt/dlami/nvme or /opt/sagemaker"),
    ("/opt/dlami/nvme/../../etc", "'.' and '..' are not allowed"),
    ("/opt/sagemaker/containerd/curvine", "/opt/sagemaker/containerd holds containerd's image store"),
])
def test_worker_data_dir_elsewhere_is_refused(config_dir, path, expected) -> None:
    message = problem_after(config_dir, lambda d: d["curvine"].update(worker_data_dir=path))
    assert ": curvine.worker_data_dir: " in message and expected in message
