"""Config validation: the example loads, and every kind of bad input is named precisely.

Each error test copies the example config to a temp dir, breaks one thing, and checks that
``load_project`` raises a ConfigError whose report names the file, the field, and what is
allowed. (That nothing is written on such an error is tested where writing happens: app.py
and scripts/manifests.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capacity.project_checks import load_checked_project
from platform_config import ConfigError, load_platform
from platform_config.fields import ROUTING_STRATEGIES
from tests.example_config import EXAMPLE, EXAMPLE_LINES, REPO, USER_CONFIG, edit_yaml, set_fixed


def problems(config_dir: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_checked_project(config_dir)
    return [str(p) for p in info.value.problems]


def only_problem(config_dir: Path) -> str:
    found = problems(config_dir)
    assert len(found) == 1, found
    return found[0]


def test_repository_config_is_valid() -> None:
    """Whatever lines config/ holds now must load: this is what `make synth` reads."""
    project = load_checked_project(USER_CONFIG)
    assert {l.name for l in project.business_lines} == {
        p.stem for p in (USER_CONFIG / "business-lines").glob("*.y*ml")}


def test_scenario_config_loads() -> None:
    project = load_checked_project(EXAMPLE)
    assert [l.name for l in project.business_lines] == list(EXAMPLE_LINES)


def test_example_config_loads_with_g6e_and_p5_groups(config_dir: Path) -> None:
    project = load_checked_project(config_dir)
    types = {g.instance_type for g in project.platform.hyperpod.instance_groups}
    assert any(t.startswith("ml.g6e.") for t in types)
    assert "ml.p5.48xlarge" in types
    assert project.platform.hyperpod.tiered_storage.memory_allocation_percentage == 20
    assert [l.name for l in project.business_lines] == list(EXAMPLE_LINES)
    assert {l.instance_type for l in project.business_lines} == {"ml.g6e.12xlarge", "ml.p5.48xlarge"}


def test_defaults_are_the_documented_ones(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["hyperpod"].pop("tiered_storage"))
    edit_yaml(path, lambda d: d["hyperpod"].pop("node_recovery"))
    line_path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line_path, lambda d: (d.pop("routing_strategy"), d.pop("python_hash_seed")))
    project = load_checked_project(config_dir)
    # On, as specified and as the reference deployment ran, though neither L1 nor L2 uses it
    # (docs/l2-cache.md, "L1 is not Tiered Storage").
    assert project.platform.hyperpod.tiered_storage.enabled is True
    assert project.platform.hyperpod.tiered_storage.memory_allocation_percentage == 20
    assert project.platform.hyperpod.node_recovery == "Automatic"
    line = project.business_line("rag-assistant")
    assert line.routing_strategy == "prefixaware"
    assert line.python_hash_seed == 0


@pytest.mark.parametrize("percentage", [19, 101, 0])
def test_tiered_storage_percentage_out_of_range(config_dir: Path, percentage: int) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["hyperpod"]["tiered_storage"].update(memory_allocation_percentage=percentage))
    message = only_problem(config_dir)
    assert str(path) in message
    assert "hyperpod.tiered_storage.memory_allocation_percentage" in message
    assert ("greater than or equal to 20" in message) or ("less than or equal to 100" in message)
    assert repr(percentage) in message


@pytest.mark.parametrize("percentage", [20, 100])
def test_tiered_storage_percentage_bounds_accepted(config_dir: Path, percentage: int) -> None:
    # The platform file alone: at 100% no host memory is left for any line's pods (tests/config/test_node_fit.py).
    edit_yaml(config_dir / "platform.yaml",
         lambda d: d["hyperpod"]["tiered_storage"].update(memory_allocation_percentage=percentage))
    assert load_platform(config_dir / "platform.yaml").hyperpod.tiered_storage.memory_allocation_percentage == percentage


def test_unknown_key_is_rejected_in_platform(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["hyperpod"].update(tiered_storag={"enabled": True}))
    message = only_problem(config_dir)
    assert f"{path}: hyperpod.tiered_storag: unknown key" in message


def test_unknown_key_is_rejected_in_business_line(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["cache"].update(l3_enabled=True))
    assert f"{path}: cache.l3_enabled: unknown key" in only_problem(config_dir)


def test_unknown_routing_strategy_lists_allowed(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.update(routing_strategy="fastest"))
    message = only_problem(config_dir)
    assert f"{path}: routing_strategy" in message
    assert "'fastest'" in message
    for strategy in ROUTING_STRATEGIES:
        assert strategy in message


def _enable_gateway(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["inference_operator"]["gateway"].update(
        enabled=True, service_account="inference-gateway-controller"))


def test_a_line_on_the_gateway_needs_the_gateway_in_the_platform(config_dir: Path) -> None:
    """``routing_strategy: gateway`` with ``inference_operator.gateway.enabled: false``: one problem, naming the
    line's file and field, the platform file and its field, and every value allowed instead."""
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.update(routing_strategy="gateway"))
    message = only_problem(config_dir)
    assert message.startswith(f"{path}: routing_strategy: ")
    assert f"inference_operator.gateway.enabled is false in {config_dir / 'platform.yaml'}" in message
    allowed = message.split("allowed: ", 1)[1]
    assert "inference_operator.gateway.enabled true" in allowed
    for strategy in ("prefixaware", "kvaware", "session", "roundrobin"):
        assert strategy in allowed
    assert message.endswith("(got 'gateway')")


def test_a_line_on_the_gateway_loads_when_the_platform_runs_it(config_dir: Path) -> None:
    _enable_gateway(config_dir)
    edit_yaml(config_dir / "business-lines" / "rag-assistant.yaml", lambda d: d.update(routing_strategy="gateway"))
    project = load_checked_project(config_dir)
    assert project.business_line("rag-assistant").routing_strategy == "gateway"
    # The other lines keep the operator's router: the gateway is a per-line choice.
    assert {l.routing_strategy for l in project.business_lines if l.name != "rag-assistant"} <= {
        "prefixaware", "kvaware", "session", "roundrobin"}


def test_the_gateway_alone_changes_no_line(config_dir: Path) -> None:
    """Turning the platform's gateway on routes no line by it: each line opts in."""
    before = {l.name: l.routing_strategy for l in load_checked_project(config_dir).business_lines}
    _enable_gateway(config_dir)
    assert {l.name: l.routing_strategy for l in load_checked_project(config_dir).business_lines} == before
    assert "gateway" not in before.values()


def test_pvc_size_must_be_a_quantity(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["cache"].update(l2_size="500 gigs"))
    message = only_problem(config_dir)
    assert f"{path}: cache.l2_size" in message and "'500 gigs'" in message
    assert "allowed: a Kubernetes quantity such as 500Gi" in message


def test_instance_type_must_belong_to_an_instance_group(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.update(instance_type="ml.g6e.48xlarge"))
    message = only_problem(config_dir)
    assert f"{path}: instance_type: no HyperPod instance group has this type" in message
    assert "ml.g6e.12xlarge, ml.p5.48xlarge" in message


def test_unknown_instance_type_is_rejected(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.update(instance_type="ml.g4dn.xlarge"))
    message = only_problem(config_dir)
    assert f"{path}: instance_type: unknown instance type; allowed:" in message
    assert "ml.g6e.12xlarge" in message


def test_gpus_per_replica_must_fit_the_instance_type(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: (d.update(gpus_per_replica=8), d["vllm"]["args"].extend(["-tp", "8"])))
    message = only_problem(config_dir)
    assert str(path) in message
    assert "does not fit ml.g6e.12xlarge (4 GPU(s)); allowed: 1..4" in message


@pytest.mark.parametrize("namespace", ["RAG", "rag_assistant", "-rag", "x" * 64])
def test_namespace_must_be_a_dns_label(config_dir: Path, namespace: str) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.update(namespace=namespace))
    message = only_problem(config_dir)
    assert f"{path}: namespace" in message


def test_namespaces_must_be_unique(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "research-reasoning.yaml"
    edit_yaml(path, lambda d: d.update(namespace="rag-assistant"))
    message = only_problem(config_dir)
    assert f"{path}: namespace: already used by" in message
    assert "rag-assistant.yaml" in message


def test_platform_namespaces_are_reserved(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.update(namespace="curvine"))
    assert f"{path}: namespace: reserved for the platform" in only_problem(config_dir)


def test_business_line_file_name_must_be_a_valid_name(config_dir: Path) -> None:
    src = config_dir / "business-lines" / "rag-assistant.yaml"
    bad = config_dir / "business-lines" / "Rag_Assistant.yaml"
    src.rename(bad)
    message = only_problem(config_dir)
    assert f"{bad}: name" in message


def test_name_field_must_match_file_name(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.update(name="other"))
    assert f"{path}: name: must equal the file name 'rag-assistant'" in only_problem(config_dir)


def test_instance_group_names_must_be_valid_and_unique(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["hyperpod"]["instance_groups"][0].update(name="g6e_inference"))
    assert f"{path}: hyperpod.instance_groups.0.name" in only_problem(config_dir)

    def duplicate(d: dict[str, Any]) -> None:
        d["hyperpod"]["instance_groups"][0]["name"] = "p5-inference"
    edit_yaml(path, duplicate)
    message = only_problem(config_dir)
    assert "instance group names must be unique; repeated: p5-inference" in message


def test_a_line_cannot_target_only_tainted_groups(config_dir: Path) -> None:
    """InferenceEndpointConfig has no tolerations: its pods would stay Pending forever."""
    edit_yaml(config_dir / "platform.yaml", lambda d: d["hyperpod"]["instance_groups"][1].update(
        taints=[{"key": "kvcache.io/large-model", "value": "true", "effect": "NoSchedule"}]))
    message = only_problem(config_dir)
    assert "research-reasoning.yaml: instance_type: every instance group of this type (p5-inference)" in message
    assert "no tolerations field" in message


def test_prefer_no_schedule_taints_do_not_block_a_line(config_dir: Path) -> None:
    p5 = load_checked_project(config_dir).platform.hyperpod.instance_groups[1]
    assert (p5.instance_type, p5.taints[0].effect) == ("ml.p5.48xlarge", "PreferNoSchedule")


def _keep_only_line_on_its_type(config_dir: Path, name: str) -> None:
    """Delete the copy's other lines on ``name``'s instance type, to test capacity in isolation."""
    project = load_checked_project(config_dir)
    for line in project.business_lines:
        if line.name != name and line.instance_type == project.business_line(name).instance_type:
            (config_dir / "business-lines" / f"{line.name}.yaml").unlink()


def _small_pods(config_dir: Path, name: str) -> None:
    """Give ``name`` a small CPU and memory request, so only its GPUs bound how many fit a node
    (CPU and memory per node: tests/config/test_node_fit.py)."""
    def small(d: dict[str, Any]) -> None:
        d["resources"] = {"cpu": "4", "memory": "40Gi"}
        if d.get("cache", {}).get("l1_cpu_gib"):
            d["cache"]["l1_cpu_gib"] = 8
    edit_yaml(config_dir / "business-lines" / f"{name}.yaml", small)


def test_all_lines_must_fit_on_their_instance_groups(config_dir: Path) -> None:
    # rag-assistant alone on 2 nodes x 4 L40S: 8 one-GPU replicas fill them, a 9th does not fit.
    _keep_only_line_on_its_type(config_dir, "rag-assistant")
    _small_pods(config_dir, "rag-assistant")
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: set_fixed(d, replicas=8))
    assert load_checked_project(config_dir).business_line("rag-assistant").replicas == 8
    edit_yaml(path, lambda d: set_fixed(d, replicas=9))
    message = only_problem(config_dir)
    assert ("replicas: the lines on ml.g6e.12xlarge (rag-assistant 9 x (1 GPU, 4 CPU, 40.00 GiB)) do not fit on "
            "its 2 node(s)") in message
    assert "first that does not fit: rag-assistant replica 9 of 9" in message
    # 20.57 CPU and 299.04 GiB per node for the lines (tests/config/test_node_fit.py), less 4 x (4 CPU, 40 GiB).
    assert "when the nodes had free node 1: 0 GPU, 4.57 CPU, 139.04 GiB; node 2: 0 GPU, 4.57 CPU, 139.04 GiB" in message


def test_lines_sharing_an_instance_type_share_its_gpus(config_dir: Path) -> None:
    """The fixture's other g6e lines hold some of the 8 L40S: rag-assistant gets only the rest."""
    project = load_checked_project(config_dir)
    taken = sum(l.replicas * l.gpus_per_replica for l in project.business_lines
                if l.instance_type == "ml.g6e.12xlarge" and l.name != "rag-assistant")
    assert taken > 0, "the fixture shares the g6e nodes between lines"
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    for line in project.business_lines:
        if line.instance_type == "ml.g6e.12xlarge":
            _small_pods(config_dir, line.name)
    edit_yaml(path, lambda d: set_fixed(d, replicas=8 - taken))
    load_checked_project(config_dir)
    edit_yaml(path, lambda d: set_fixed(d, replicas=8 - taken + 1))
    message = only_problem(config_dir)
    assert f"rag-assistant {8 - taken + 1} x (1 GPU, 4 CPU, 40.00 GiB)" in message
    assert "do not fit on its 2 node(s)" in message and "0 GPU" in message


def test_gpu_capacity_is_counted_per_node(config_dir: Path) -> None:
    # 3-GPU replicas on 4-GPU nodes: one per node, so 2 fit and 3 do not, though 9 <= 8 + 4 spare.
    # (A model outside the planner's table: no model in it divides its heads by 3, which vLLM needs.)
    _keep_only_line_on_its_type(config_dir, "rag-assistant")
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: (set_fixed(d, replicas=2, gpus_per_replica=3), d["model"].update(name="Three-Way-12B"),
                               d["vllm"]["args"].extend(["-tp", "3"])))
    load_checked_project(config_dir)
    edit_yaml(path, lambda d: set_fixed(d, replicas=3, gpus_per_replica=3))
    assert "rag-assistant 3 x (3 GPU, 10 CPU, 80.00 GiB)" in only_problem(config_dir)


def test_l1_buffer_must_fit_the_pod_memory(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: (d["cache"].update(l1_cpu_gib=80), d["resources"].update(memory="80Gi")))
    message = only_problem(config_dir)
    assert "cache.l1_cpu_gib 80 GiB must be below resources.memory 80Gi (80 GiB)" in message
    edit_yaml(path, lambda d: d["cache"].update(l1_cpu_gib=79.5))
    assert load_checked_project(config_dir).business_line("rag-assistant").cache.l1_cpu_gib == 79.5


def test_quantity_bytes() -> None:
    from platform_config.fields import quantity_bytes

    assert quantity_bytes("80Gi") == 80 * 2**30
    assert quantity_bytes("1.5G") == 1.5e9 and quantity_bytes("500m") == 0.5 and quantity_bytes("6") == 6
    with pytest.raises(ValueError):
        quantity_bytes("5 gigs")


def test_missing_required_field_is_named(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d.pop("namespace"))
    assert f"{path}: namespace: required field is missing" in only_problem(config_dir)


def test_l2_on_while_curvine_off(config_dir: Path) -> None:
    with_l2 = [l.name for l in load_checked_project(config_dir).business_lines if l.cache.l2_enabled]
    assert len(with_l2) >= 2
    edit_yaml(config_dir / "platform.yaml", lambda d: d["curvine"].update(enabled=False))
    found = problems(config_dir)
    assert len(found) == len(with_l2)  # one problem per line with L2 on, none for the others
    for line in with_l2:
        assert any(f"{line}.yaml: cache.l2_enabled: L2 needs Curvine" in p for p in found)


def test_curvine_off_is_fine_when_no_line_uses_l2(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["curvine"].update(enabled=False))
    for path in (config_dir / "business-lines").glob("*.yaml"):
        edit_yaml(path, lambda d: d.setdefault("cache", {}).update(l2_enabled=False))
    assert load_checked_project(config_dir).platform.curvine.enabled is False


def test_no_age_limit_still_leaves_the_watermarks(config_dir: Path) -> None:
    """ttl_hours 0: the janitor deletes by size only (LMCache never deletes; the watermarks bound it)."""
    from k8s.janitor import janitor_config

    edit_yaml(config_dir / "platform.yaml", lambda d: d["curvine"]["eviction"].update(ttl_hours=0))
    project = load_checked_project(config_dir)
    conf = janitor_config(project.platform, project.business_line("rag-assistant"))
    assert conf["max_age_s"] is None
    assert (conf["capacity_bytes"], conf["high_watermark"]) == (500 * 2**30, 0.8)


def test_watermarks_must_be_ordered(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml",
         lambda d: d["curvine"]["eviction"].update(high_watermark=0.5, low_watermark=0.6))
    assert "low_watermark (0.6) must be below high_watermark (0.5)" in only_problem(config_dir)


@pytest.mark.parametrize("image", ["lmcache/vllm-openai", "lmcache/vllm-openai:latest", "vllm@sha256:abc"])
def test_images_must_be_pinned(config_dir: Path, image: str) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["vllm"].update(image=image))
    message = only_problem(config_dir)
    assert f"{path}: vllm.image" in message


def test_platform_images_must_be_pinned(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["versions"]["images"].update(curvine="docker.io/curvine/curvine:latest"))
    assert f"{path}: versions.images.curvine" in only_problem(config_dir)


def test_addon_versions_cannot_float(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["versions"]["addons"].update({"cert-manager": "latest"}))
    assert f"{path}: versions.addons.cert-manager" in only_problem(config_dir)


def test_zones_must_be_in_region_and_include_the_gpu_zone(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d.update(gpu_availability_zone="us-west-2c"))
    assert only_problem(config_dir) == (f"{path}: gpu_availability_zone: us-west-2c is not one of availability_zones; "
                                        "allowed: us-west-2a, us-west-2b")
    edit_yaml(path, lambda d: d.update(gpu_availability_zone="us-east-1a"))
    assert only_problem(config_dir) == (f"{path}: gpu_availability_zone: us-east-1a is not one of availability_zones, "
                                        "and it is not in region us-west-2; allowed: us-west-2a, us-west-2b")


def test_a_zone_outside_the_region_is_named(config_dir: Path) -> None:
    """issue 18: the message names the zone that is not in the region (it said "every zone")."""
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d.update(availability_zones=["us-west-2a", "us-east-1b"]))
    assert only_problem(config_dir) == (f"{path}: availability_zones: us-east-1b is not in region us-west-2; "
                                        "allowed: zones of us-west-2, such as us-west-2a and us-west-2b")
    edit_yaml(path, lambda d: d.update(availability_zones=["us-west-2a", "us-west-2a"]))
    assert only_problem(config_dir) == f"{path}: availability_zones: repeats us-west-2a; allowed: each zone once"


def test_public_endpoint_needs_explicit_cidrs(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["eks"].update(endpoint_access="public_and_private"))
    assert "needs public_access_cidrs" in only_problem(config_dir)


def test_existing_vpc_needs_a_subnet_per_zone(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d.update(network={
        "mode": "existing", "vpc_id": "vpc-0123456789abcdef0", "vpc_cidr": "10.0.0.0/16",
        "private_subnet_ids": {"us-west-2a": "subnet-0123456789abcdef0"}}))
    assert only_problem(config_dir) == (f"{path}: network.private_subnet_ids: no subnet for zone(s) us-west-2b; "
                                        "allowed: a private subnet ID for every zone of availability_zones")


def test_unknown_network_mode_lists_allowed(config_dir: Path) -> None:
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["network"].update(mode="peered"))
    message = only_problem(config_dir)
    assert f"{path}: network" in message and "'create'" in message and "'existing'" in message


def test_unknown_model_source_type_lists_allowed(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["model"]["source"].update(type="gcs"))
    message = only_problem(config_dir)
    assert f"{path}: model.source" in message
    for allowed in ("'s3'", "'huggingface'", "'fsx'"):
        assert allowed in message


def test_invalid_yaml_names_the_file(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    path.write_text("namespace: [unclosed\n")
    assert only_problem(config_dir) == (
        f"{path}: line 2: not valid YAML: while parsing a flow sequence expected ',' or ']', but got "
        "'<stream end>'; allowed: one YAML mapping (key: value lines)")


def test_every_problem_is_reported_at_once(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml",
         lambda d: d["hyperpod"]["tiered_storage"].update(memory_allocation_percentage=5))
    edit_yaml(config_dir / "business-lines" / "rag-assistant.yaml", lambda d: d.update(routing_strategy="x"))
    edit_yaml(config_dir / "business-lines" / "research-reasoning.yaml", lambda d: d.update(replicas=0))
    found = problems(config_dir)
    assert len(found) == 3
    assert str(ConfigError([])).startswith("invalid configuration")


def test_the_config_reference_is_current() -> None:
    """docs/configuration.md's reference tables are generated; editing a model without `make docs` fails."""
    from platform_config.reference import BEGIN, END, REFERENCE_DOC, config_reference

    assert REFERENCE_DOC == REPO / "docs" / "configuration.md"
    block = REFERENCE_DOC.read_text().split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.strip() == config_reference().strip(), "docs/configuration.md is stale: run `make docs`"


def test_lines_l2_sizes_must_fit_the_curvine_pool(config_dir: Path) -> None:
    """Issue 8: Curvine v0.3.2 sets no quota per PVC, so the sizes bound the pool only if they fit
    in it: 3 Workers (2 g6e + 1 p5) x 2000 GiB x (1 - 0.1) = 5,400 GiB; the fixture's 500Gi + 2Ti
    + 200Gi = 2,748 GiB fits, with research-reasoning at 5Ti (5,820 GiB) it does not."""
    from platform_config.loader import l2_pool_gib

    assert l2_pool_gib(load_checked_project(config_dir).platform) == (3, 5400.0)
    edit_yaml(config_dir / "business-lines" / "research-reasoning.yaml", lambda d: d["cache"].update(l2_size="5Ti"))
    with pytest.raises(ConfigError) as err:
        load_checked_project(config_dir)
    (problem,) = [p for p in err.value.problems if p.field == "cache.l2_size"]
    assert "5,820 GiB" in problem.message and "5,400 GiB" in problem.message
    assert "rag-assistant 500Gi" in problem.message and "research-reasoning 5Ti" in problem.message
    # Only Workers count: the same sizes fit once Workers run on both groups' larger disks.
    edit_yaml(config_dir / "platform.yaml", lambda d: d["curvine"].update(worker_capacity_gib=3000))
    load_checked_project(config_dir)


# --- one file per line, sizes above zero, the planner's fit rule (issue 10) ----------------------


def test_two_files_for_one_line_name_both_files(config_dir: Path) -> None:
    yaml_file = config_dir / "business-lines" / "rag-assistant.yaml"
    yml_file = yaml_file.with_suffix(".yml")
    yml_file.write_text(yaml_file.read_text())
    message = only_problem(config_dir)  # one problem, not a namespace clash on top
    assert message.startswith(f"{yaml_file}: name: business line 'rag-assistant' is defined by 2 files")
    assert f"({yaml_file}, {yml_file})" in message and "allowed: one file per line" in message


@pytest.mark.parametrize("field, value", [("l2_size", "0Gi"), ("l2_size", "0"), ("l2_size", "0.0Ti")])
def test_zero_l2_size_is_refused(config_dir: Path, field: str, value: str) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["cache"].update({field: value}))
    message = only_problem(config_dir)
    assert f"{path}: cache.{field}: must be above zero" in message and repr(value) in message


@pytest.mark.parametrize("field, value, problem", [
    ("cpu", "0", "must be above zero"), ("memory", "0Gi", "must be above zero"),
    ("memory", "-80Gi", "allowed: a Kubernetes quantity"), ("cpu", "", "allowed: a Kubernetes quantity")])
def test_empty_zero_or_negative_resources_are_refused(config_dir: Path, field: str, value: str, problem: str) -> None:
    path = config_dir / "business-lines" / "legal-search.yaml"
    edit_yaml(path, lambda d: d["resources"].update({field: value}))
    message = only_problem(config_dir)
    assert f"{path}: resources.{field}: " in message and problem in message


def test_a_model_that_does_not_fit_its_gpus_is_refused_with_the_planners_reason(config_dir: Path) -> None:
    """Llama-3.1-70B on one L40S: what `plan.py` calls DOES NOT FIT, synthesis refuses too."""
    from capacity.fit import choose_tp, inputs_from_line

    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: (d["model"].update(name="Llama-3.1-70B-Instruct"), d.update(gpus_per_replica=1)))
    message = only_problem(config_dir)
    assert f"{path}: gpus_per_replica: Llama-3.1-70B-Instruct (bfloat16) does not fit ml.g6e.12xlarge" in message
    assert "allowed: gpus_per_replica 4 or more" in message
    edit_yaml(path, lambda d: (set_fixed(d, gpus_per_replica=4, replicas=1), d["vllm"]["args"].extend(["-tp", "4"])))
    project = load_checked_project(config_dir)
    fit, min_tp = choose_tp(inputs_from_line(project.business_line("rag-assistant"), project.platform))
    assert fit.fits and min_tp == 4  # the same function decides both ways


def test_a_tp_that_does_not_divide_the_heads_is_refused(config_dir: Path) -> None:
    _keep_only_line_on_its_type(config_dir, "rag-assistant")
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: (set_fixed(d, gpus_per_replica=3, replicas=1),  # Qwen2-7B: 28 heads, 4 KV heads
                               d["vllm"]["args"].extend(["-tp", "3"])))
    assert "gpus_per_replica: tp 3 does not divide Qwen2-7B's 28 attention heads" in only_problem(config_dir)


def test_the_long_sequence_must_fit_too(config_dir: Path) -> None:
    """Weights fit one L40S, but 2M tokens is beyond the model's context (and its KV beyond the GPU):
    vLLM would refuse to start. The context is checked first, in vLLM's own units (2000k = 2M)."""
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["vllm"].update(args=["/opt/ml/model", "--max-model-len", "2000k"]))
    assert ("--max-model-len 2000k = 2000000 tokens exceeds Qwen2-7B's context of 131072 tokens"
            in only_problem(config_dir))


def test_a_model_outside_the_planners_table_is_a_warning_not_an_error(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["model"].update(name="Mistral-7B-Instruct"))
    project = load_checked_project(config_dir)
    warning, hot = project.warnings
    assert warning.startswith(f"{path}: model.name 'Mistral-7B-Instruct' is not in the planner's table")
    assert f"scripts/plan.py --business-line {path} --hf-config" in warning
    # The line's hot prefixes: their L2 share needs the model's KV bytes too (the janitor measures it).
    assert hot.startswith(f"{path}: model.name 'Mistral-7B-Instruct' is not in the planner's table") and \
        "the L2 share its hot prefixes pin is not checked" in hot


def test_the_fixture_lines_all_fit_without_warnings() -> None:
    assert load_checked_project(EXAMPLE).warnings == ()


def test_config_dir_of_a_line_file(config_dir: Path, tmp_path: Path) -> None:
    from platform_config.loader import config_dir_of

    assert config_dir_of(config_dir / "business-lines" / "rag-assistant.yaml") == config_dir.resolve()
    lone = tmp_path / "rag-assistant.yaml"
    lone.write_text("")
    assert config_dir_of(lone) == Path("config")


@pytest.mark.parametrize("value, message", [
    ("abc", "--gpu-memory-utilization 'abc' is not a number; allowed: a fraction in (0, 1], e.g. 0.9"),
    ("1.5", "gpu memory utilization must be within (0, 1] (got 1.5)"),
])
def test_a_bad_gpu_memory_utilization_is_reported_on_vllm_args(config_dir: Path, value: str, message: str) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["vllm"].update(args=["/opt/ml/model", "--gpu-memory-utilization", value]))
    assert only_problem(config_dir) == f"{path}: vllm.args: {message}"


def test_the_problem_field_comes_from_the_planners_error_not_its_text(config_dir: Path, monkeypatch) -> None:
    """The planner's PlanInputError names the field; the loader maps it (LINE_CONFIG_FIELDS) and
    never guesses from words in the message (a message mentioning "utilization" or "convert" used
    to land on vllm.args whatever its cause)."""
    import capacity.fit as fit
    import capacity.project_checks as checks

    def bad(line, platform, **kw):
        raise fit.PlanInputError([fit.InputProblem("tp", "could not convert: utilization"),
                                  fit.InputProblem("chunk_tokens", "chunk size must be >= 1 (got 0)"),
                                  fit.InputProblem("region", "a field no line key maps to")])

    monkeypatch.setattr(checks, "inputs_from_line", bad)
    found = [p for p in problems(config_dir) if "rag-assistant.yaml" in p]
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    assert found == [f"{path}: gpus_per_replica: could not convert: utilization",
                     f"{path}: cache.chunk_size_tokens: chunk size must be >= 1 (got 0)",
                     f"{path}: region: a field no line key maps to"]


# --- unquoted YAML numbers in quantity fields (polish-docs item 3) -------------------------------


@pytest.mark.parametrize("field, number, stored", [
    ("cpu", 10, "10"), ("cpu", 0.5, "0.5"), ("cpu", 2.0, "2"), ("memory", 85899345920, "85899345920")])
def test_an_unquoted_number_is_a_quantity(config_dir: Path, field: str, number: float, stored: str) -> None:
    """Kubernetes takes `cpu: 10` unquoted; so does the config, as the quantity string "10"."""
    path = config_dir / "business-lines" / "legal-search.yaml"
    edit_yaml(path, lambda d: d["resources"].update({field: number}))
    assert path.read_text().count(f"{field}: {number}\n") == 1  # YAML wrote a number, not a string
    line = next(l for l in load_checked_project(config_dir).business_lines if l.name == "legal-search")
    assert getattr(line.resources, field) == stored


@pytest.mark.parametrize("section, field, number", [("cache", "l2_size", 0), ("resources", "cpu", 0),
                                                    ("resources", "memory", 0.0)])
def test_an_unquoted_zero_gets_the_above_zero_message(config_dir: Path, section: str, field: str,
                                                      number: float) -> None:
    """Not pydantic's "Input should be a valid string": the rule a quoted "0" breaks."""
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d[section].update({field: number}))
    message = only_problem(config_dir)
    assert message.startswith(f"{path}: {section}.{field}: must be above zero") and "valid string" not in message


@pytest.mark.parametrize("number", [-1, float("inf")])
def test_an_unquoted_number_that_is_no_quantity_names_the_grammar(config_dir: Path, number: float) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["resources"].update(cpu=number))
    message = only_problem(config_dir)
    assert f"{path}: resources.cpu: not allowed; allowed: a Kubernetes quantity" in message
    assert "valid string" not in message


def test_a_boolean_is_not_read_as_a_quantity(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["cache"].update(l2_size=True))
    assert "cache.l2_size" in only_problem(config_dir)


def test_the_reference_gives_cpu_a_cpu_example_and_sizes_a_size_example() -> None:
    from platform_config.reference import config_reference

    rows = {line.split("|")[1].strip(): line for line in config_reference().splitlines() if line.startswith("| `")}
    assert ("a Kubernetes quantity of CPU: cores such as 8 or 0.5, or millicores such as 500m, without a byte "
            "suffix, quoted or not, > 0") in rows["`cpu`"]
    assert "Gi" not in rows["`cpu`"].split("|")[2]
    for size in ("`memory`", "`l2_size`"):
        assert "a Kubernetes quantity such as 500Gi or 2Ti, quoted or not, > 0" in rows[size]


# --- what an unhealthy L2 may cost a request (platform.lmcache, docs/l2-cache.md) --------------------


def test_l2_fault_timeouts_default_to_the_documented_bound(config_dir: Path) -> None:
    """200 ms per lookup, 1 s per chunk read of a retrieve; LMCache 0.5.5's own defaults (3,000 ms,
    10 s) would cost a request seconds whenever the Curvine Primary is away."""
    lmcache = load_checked_project(config_dir).platform.lmcache
    assert (lmcache.lookup_timeout_ms, lmcache.blocking_timeout_secs) == (200, 1)


def test_an_l2_lines_slo_must_exceed_the_lookup_timeout(config_dir: Path) -> None:
    """A line whose TTFT SLO is at or below the lookup timeout would miss it on every request while
    L2 is unhealthy, prefill not even counted: refused, naming the line, the field and the bound."""
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: d["slo"].update(ttft_p90_ms=200))
    found = only_problem(config_dir)
    assert f"{path}: slo.ttft_p90_ms: an unhealthy L2 adds up to lmcache.lookup_timeout_ms (200 ms" in found
    assert "allowed: more than 200 (or lower lmcache.lookup_timeout_ms)" in found
    edit_yaml(config_dir / "platform.yaml", lambda d: d.setdefault("lmcache", {}).update(lookup_timeout_ms=150))
    assert load_checked_project(config_dir).business_line("rag-assistant").slo.ttft_p90_ms == 200


def test_an_slo_below_the_lookup_timeout_is_fine_without_l2(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(path, lambda d: (d["slo"].update(ttft_p90_ms=100), d["cache"].update(l2_enabled=False)))
    assert load_checked_project(config_dir).business_line("rag-assistant").slo.ttft_p90_ms == 100


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("lookup_timeout_ms", 10, "greater than or equal to 20"),
    ("lookup_timeout_ms", 5000, "less than or equal to 3000"),
    ("blocking_timeout_secs", 0, "greater than or equal to 1"),
    # LMCache converts the variable with int(): "0.5" would become None and a wait without end.
    ("blocking_timeout_secs", 0.5, "valid integer"),
])
def test_l2_fault_timeouts_out_of_range_are_refused(config_dir: Path, key: str, value: float, allowed: str) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d.setdefault("lmcache", {}).update({key: value}))
    found = only_problem(config_dir)
    assert f"platform.yaml: lmcache.{key}:" in found and allowed in found, found


def test_the_system_node_ami_release_must_be_of_the_cluster_version(config_dir: Path) -> None:
    """A pinned AMI release of another Kubernetes minor would be refused by EKS at deploy
    (issue 26): refused here, naming both versions."""
    edit_yaml(config_dir / "platform.yaml", lambda d: d["eks"].update(system_node_release_version="1.33.5-20261020"))
    problem = only_problem(config_dir)
    assert "system_node_release_version '1.33.5-20261020' is an AMI of Kubernetes 1.33" in problem
    assert "allowed: a release" in problem


@pytest.mark.parametrize("section, key, value, expected", [
    ("network", "cidr", "300.192.0.0/16", "Octet 300 (> 255) not permitted"),
    ("network", "cidr", "10.192.0.1/16", "has host bits set"),
    ("network", "cidr", "10.192.0.0/12", "the prefix length must be /16 to /24"),
    ("eks", "public_access_cidrs", ["0.0.0.0/0"], "the prefix length must be /1 to /32"),
    ("eks", "public_access_cidrs", ["203.0.113.0/33"], "is not an IPv4 network"),
    ("eks", "public_access_cidrs", ["::/0"], "is not an IPv4 network"),
    ("eks", "public_access_cidrs", ["0.0.0.0/1", "128.0.0.0/1"], "together cover every IPv4 address"),
])
def test_networks_are_checked_as_networks(config_dir: Path, section, key, value, expected) -> None:
    """A pattern alone accepted 300.192.0.0/16 and left a traceback to synthesis (issue 27); the whole
    internet as the EKS endpoint's allow-list is refused too (issue 25, low)."""
    def edit(d):
        d[section][key] = value
        if key == "public_access_cidrs":
            d["eks"]["endpoint_access"] = "public_and_private"
    edit_yaml(config_dir / "platform.yaml", edit)
    problem = only_problem(config_dir)
    assert f"{section}.{key}" in problem and expected in problem and "allowed:" in problem


def test_an_alert_address_listed_twice_is_refused(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["observability"]["alerts"].update(
        email_subscriptions=["oncall@example.com", "OnCall@example.com"]))
    problem = only_problem(config_dir)
    assert "observability.alerts.email_subscriptions" in problem and "listed more than once" in problem


def test_a_line_whose_stack_name_cloudformation_would_refuse(config_dir: Path) -> None:
    """project (63) + "-line-" + line (63) can exceed CloudFormation's 128 characters: a traceback
    at synthesis before (issue 27), a problem naming the line's file and the longest name now."""
    project = "p" * 63
    edit_yaml(config_dir / "platform.yaml", lambda d: d.update(project=project))
    name = "l" * 63
    src = config_dir / "business-lines" / "legal-search.yaml"
    edit_yaml(src, lambda d: d.update(name=name, namespace="legal"))
    src.rename(src.with_name(f"{name}.yaml"))
    problem = only_problem(config_dir)
    assert f"{name}.yaml: name:" in problem and "is 132 characters; CloudFormation allows 128" in problem
    assert "at most 59 characters" in problem


def test_the_gates_slow_lookup_bound_must_be_below_the_lookup_timeout(config_dir: Path) -> None:
    """A lookup ends at lookup_timeout_ms, so a slow-lookup bound at or above it never opens the gate."""
    edit_yaml(config_dir / "platform.yaml", lambda d: d.setdefault("lmcache", {}).update(
        lookup_timeout_ms=200, l2_gate={"lookup_slow_ms": 200}))
    problem = only_problem(config_dir)
    assert "lmcache.l2_gate.lookup_slow_ms" in problem and "allowed: 10 to 199" in problem


def _patterns(schema: object) -> set[str]:
    """Every ``pattern`` of a JSON schema, nested definitions included."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                found.add(value)
            else:
                found |= _patterns(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= _patterns(value)
    return found


def test_every_pattern_of_the_models_is_said_in_words() -> None:
    """A refused value's message says what is allowed in words before the regular expression (issue
    27: 11 messages whose only 'allowed' was a raw pattern)."""
    from platform_config import BusinessLineConfig, PlatformConfig
    from platform_config.loader import PATTERN_DESCRIPTIONS

    patterns = _patterns(PlatformConfig.model_json_schema()) | _patterns(BusinessLineConfig.model_json_schema())
    assert len(patterns) >= 20
    assert sorted(patterns - set(PATTERN_DESCRIPTIONS)) == []


def test_a_bad_id_is_refused_in_words(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["eks"].update(system_node_instance_type="M7I.XLARGE"))
    problem = only_problem(config_dir)
    assert "eks.system_node_instance_type: not allowed; allowed: an EC2 instance type such as m7i.xlarge" in problem


def test_lmcache_mode_is_in_process_and_multi_process_is_refused(config_dir: Path) -> None:
    """The L2 works only with LMCache inside the vLLM process (issue 26): the default says so, and
    the operator's MultiProcess mode (v3.7), whose sidecar server ignores the L2 env the platform
    sets, is refused naming the file, the field, why, and what is allowed."""
    path = config_dir / "business-lines" / "rag-assistant.yaml"
    assert load_checked_project(config_dir).business_line("rag-assistant").cache.lmcache_mode == "InProcess"
    edit_yaml(path, lambda d: d["cache"].update(lmcache_mode="InProcess"))
    assert load_checked_project(config_dir).business_line("rag-assistant").cache.lmcache_mode == "InProcess"
    edit_yaml(path, lambda d: d["cache"].update(lmcache_mode="MultiProcess"))
    message = only_problem(config_dir)
    assert message.startswith(f"{path}: cache.lmcache_mode: lmcache_mode MultiProcess runs LMCache as a sidecar")
    assert "--l2-adapter" in message and "docs/l2-cache.md" in message
    assert message.endswith("allowed: InProcess (got 'MultiProcess')")
    edit_yaml(path, lambda d: d["cache"].update(lmcache_mode="inprocess"))
    assert only_problem(config_dir) == (
        f"{path}: cache.lmcache_mode: not allowed; allowed: 'InProcess' (got 'inprocess')")


def test_no_document_puts_the_hf_token_on_a_command_line() -> None:
    """Issue 25 (low): ``--from-literal=token=hf_...`` shows the token in ``ps`` and the shell history;
    every instruction creates the Secret from stdin."""
    texts = [p.read_text(encoding="utf-8") for pattern in ("docs/*.md", "README.md", "platform_config/*.py", "scripts/*")
             for p in REPO.glob(pattern) if p.is_file()]
    assert not [t for t in texts if "--from-literal=token" in t]
    assert any("--from-file=token=/dev/stdin" in t for t in texts)
