"""Stateful resources are never replaced by accident: their logical IDs and replacing properties
match the committed snapshot, and a change names the config field that caused it.

The snapshot (``tests/fixtures/stateful-resources.json``) is of the scenario config. After a change
that is meant to replace a resource (docs/deploy.md, "Replacing a stateful resource"), rewrite it with
``.venv/bin/python scripts/stateful_snapshot.py --config tests/fixtures/config --snapshot
tests/fixtures/stateful-resources.json --write`` (the script's defaults are a deployment's own
``config/`` and ``stateful-resources.json`` at the repository root).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

import stacks
from stacks.stateful import REGENERATE, STATEFUL_RESOURCES, _create_only, compare, snapshot
from tests.example_config import FIXTURE_CONFIG, REPO

SNAPSHOT = REPO / "tests" / "fixtures" / "stateful-resources.json"
SCRIPT = REPO / "scripts" / "stateful_snapshot.py"


def current(templates: dict, project) -> dict:
    return snapshot({name: t.to_json() for name, t in templates.items()}, project.platform,
                    stack_names=stacks.stack_ids(project), config_dir="tests/fixtures/config")


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads(SNAPSHOT.read_text())


@pytest.fixture(scope="module")
def now(templates, project) -> dict:
    return current(templates, project)


def test_stateful_resources_match_the_committed_snapshot(saved, now) -> None:
    problems = compare(saved, now)
    assert not problems, "a deploy would replace stateful resources:\n" + "\n".join(problems)
    assert {r["logical_id"] for r in now["resources"].values()} == {
        "EksCluster", "HyperPodCluster", "CurvinePrimaryVolume"}


def test_the_snapshot_follows_references_into_the_network_stack(now) -> None:
    """A new subnet CIDR leaves the HyperPod template's ImportValue unchanged but replaces the subnet."""
    deps = now["resources"]["HyperPod cluster"]["dependencies"]
    types = {d["type"] for d in deps.values()}
    assert {"AWS::EC2::Subnet", "AWS::EC2::SecurityGroup", "AWS::EC2::VPC", "AWS::EKS::Cluster"} <= types
    (subnet,) = [d for d in deps.values() if d["type"] == "AWS::EC2::Subnet"]
    assert subnet["properties"]["AvailabilityZone"] == "us-west-2a"
    assert subnet["properties"]["CidrBlock"].startswith("10.192.")


def test_replacing_properties_are_the_cloudformation_create_only_properties() -> None:
    """The table in stacks/stateful.py is cfn-lint's createOnlyProperties (a cfn-lint bump that
    adds one fails here); the EBS volume's schema lists none, so its table is ours."""
    for spec in STATEFUL_RESOURCES:
        schema = _create_only("us-west-2", spec.type)
        if spec.type == "AWS::EC2::Volume":
            assert schema == []
            assert set(spec.properties) == {"AvailabilityZone", "Encrypted", "KmsKeyId", "SnapshotId", "OutpostArn"}
        else:
            assert sorted(spec.properties) == schema, spec.role


@pytest.fixture(scope="module")
def changed(project, tmp_path_factory) -> dict:
    """The scenario with four config fields changed that replace stateful resources (one synth)."""
    from platform_config import ProjectConfig
    from platform_config.platform_models import PlatformConfig

    data = project.platform.model_dump(mode="json")
    data["gpu_availability_zone"] = "us-west-2b"
    data["hyperpod"]["cluster_name"] = "kvcache-hyperpod-2"
    data["eks"]["cluster_name"] = "kvcache-eks-2"
    data["network"]["cidr"] = "10.193.0.0/16"
    changed = ProjectConfig(PlatformConfig.model_validate(data), project.business_lines, project.config_dir)
    app = stacks.new_app(outdir=str(tmp_path_factory.mktemp("changed")))
    stacks.build_platform(app, changed)
    templates = {s.stack_name: s.template for s in app.synth().stacks}
    return snapshot(templates, changed.platform, stack_names=stacks.stack_ids(changed),
                    config_dir="tests/fixtures/config")


def one(problems: list[str], *parts: str) -> str:
    found = [p for p in problems if all(part in p for part in parts)]
    assert found, f"no message with {parts}:\n" + "\n".join(problems)
    return found[0]


def test_config_changes_that_replace_name_the_config_field(saved, changed) -> None:
    problems = compare(saved, changed)
    where = "in tests/fixtures/config/platform.yaml"
    one(problems, "EKS cluster kvcache-eks/EksCluster: Name changes", "replaces the EKS cluster on deploy",
        f'caused by config field eks.cluster_name ("kvcache-eks" -> "kvcache-eks-2") {where}')
    one(problems, "HyperPod cluster kvcache-hyperpod/HyperPodCluster: ClusterName changes",
        'caused by config field hyperpod.cluster_name ("kvcache-hyperpod" -> "kvcache-hyperpod-2")')
    one(problems, "HyperPod cluster kvcache-hyperpod/HyperPodCluster: VpcConfig changes",
        'gpu_availability_zone ("us-west-2a" -> "us-west-2b")')
    one(problems, "VpcConfig refers to kvcache-network/Vpc8378EB38 (AWS::EC2::VPC), which is replaced because "
        'CidrBlock ("10.192.0.0/16" -> "10.193.0.0/16") changes',
        'caused by config fields network.cidr ("10.192.0.0/16" -> "10.193.0.0/16"), gpu_availability_zone')
    one(problems, "VpcConfig refers to kvcache-eks/EksCluster (AWS::EKS::Cluster), which is replaced because Name",
        'eks.cluster_name ("kvcache-eks" -> "kvcache-eks-2")')
    one(problems, "Curvine volume kvcache-hyperpod/CurvinePrimaryVolume: AvailabilityZone changes",
        'caused by config field gpu_availability_zone ("us-west-2a" -> "us-west-2b")')
    assert all(REGENERATE in p for p in problems)


def test_a_code_change_is_told_apart_from_a_config_change(saved) -> None:
    now = copy.deepcopy(saved)
    eks = now["resources"]["EKS cluster"]
    eks["properties"]["RoleArn"] = {"Fn::GetAtt": ["ClusterRoleRenamed", "Arn"]}
    message = one(compare(saved, now), "EKS cluster kvcache-eks/EksCluster: RoleArn changes")
    assert "only code sets it (a refactor, a construct or library upgrade)" in message

    now = copy.deepcopy(saved)
    now["resources"]["HyperPod cluster"]["logical_id"] = "HyperPodHyperPodClusterABCD1234"
    message = one(compare(saved, now), "HyperPod cluster kvcache-hyperpod/HyperPodCluster moves to "
                  "kvcache-hyperpod/HyperPodHyperPodClusterABCD1234")
    assert "CloudFormation creates a new HyperPod cluster and deletes the old one" in message
    assert "no config field it follows changed, so code did it" in message


def test_turning_curvine_off_reports_the_volume_deletion(saved) -> None:
    now = copy.deepcopy(saved)
    volume = now["resources"]["Curvine volume"]
    for key in ("stack", "type", "logical_id", "properties", "dependencies"):
        volume.pop(key)
    volume["config"]["curvine.enabled"] = False
    message = one(compare(saved, now), "Curvine volume kvcache-hyperpod/CurvinePrimaryVolume is no longer in the "
                  "templates: a deploy deletes it")
    assert "caused by config field curvine.enabled (true -> false)" in message


def test_the_documented_command_checks_the_scenario() -> None:
    """The script on the fixture config against the committed file, in a fresh process without the
    jsii variable set: importing ``stacks`` quiets Node's end-of-life notice by itself."""
    env = {k: v for k, v in os.environ.items() if k != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"}
    result = subprocess.run([sys.executable, str(SCRIPT), "--config", "tests/fixtures/config",
                             "--snapshot", "tests/fixtures/stateful-resources.json"],
                            capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ("no stateful resource would be replaced (tests/fixtures/config vs "
                             "tests/fixtures/stateful-resources.json)\n")
    assert "b'" not in result.stderr and "end-of-life" not in result.stderr.lower(), result.stderr


def script():
    from tests.tools.script_loader import load_script

    return load_script("stateful_snapshot")


def test_defaults_are_your_config_and_a_snapshot_at_the_repo_root() -> None:
    cli = script()
    args = cli.build_parser().parse_args([])
    # No --config: $KVCACHE_CONFIG_DIR, else config, like every command.
    assert (args.config, cli.DEFAULT_CONFIG, args.snapshot, args.write) == (None, "config", "stateful-resources.json",
                                                                            False)
    assert (REPO / cli.FIXTURE_SNAPSHOT) == SNAPSHOT and (REPO / cli.FIXTURE_CONFIG) == FIXTURE_CONFIG
    assert REGENERATE == (f".venv/bin/python scripts/stateful_snapshot.py --config {cli.FIXTURE_CONFIG} "
                          f"--snapshot {cli.FIXTURE_SNAPSHOT} --write")


def test_the_script_writes_then_flags_a_tampered_snapshot(tmp_path, monkeypatch, saved, capsys) -> None:
    """Exit codes and messages of the CLI (synthesis stubbed with the committed snapshot)."""
    cli = script()
    from operator_tools.cli import EXIT_ERROR, EXIT_NO, EXIT_OK

    monkeypatch.setattr(cli, "current_snapshot", lambda config_dir: copy.deepcopy(saved))
    target = tmp_path / "mine.json"
    # Nothing recorded yet: the question cannot be answered (2), and the error says how to record.
    assert cli.main(["--snapshot", str(target)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"scripts/stateful_snapshot.py --snapshot {target} --write" in err
    assert cli.main(["--snapshot", str(target), "--write"]) == EXIT_OK
    assert capsys.readouterr().out == f"wrote {target}\n"
    assert json.loads(target.read_text()) == saved
    assert cli.main(["--snapshot", str(target)]) == EXIT_OK
    tampered = copy.deepcopy(saved)
    tampered["resources"]["EKS cluster"]["properties"]["Name"] = "old-name"
    target.write_text(json.dumps(tampered))
    assert cli.main(["--snapshot", str(target)]) == EXIT_NO
    out = capsys.readouterr().out
    assert "EKS cluster kvcache-eks/EksCluster: Name changes" in out
    assert f"then run: .venv/bin/python scripts/stateful_snapshot.py --snapshot {target} --write" in out
    target.write_text("{not json")
    assert cli.main(["--snapshot", str(target)]) == EXIT_ERROR
    assert "not a readable snapshot" in capsys.readouterr().err


def test_a_bad_config_is_an_error_line_and_exit_2(tmp_path, capsys) -> None:
    cli = script()
    from operator_tools.cli import EXIT_ERROR

    (tmp_path / "snap.json").write_text("{}")
    assert cli.main(["--config", str(tmp_path / "nope"), "--snapshot", str(tmp_path / "snap.json")]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "platform.yaml" in err and "Traceback" not in err
