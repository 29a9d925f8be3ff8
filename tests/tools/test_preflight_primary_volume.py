"""Edits of the Curvine Primary's EBS volume that EBS would refuse are stopped before the deploy
(issue 26 item 5): preflight against botocore's Stubber.

Real boto3 clients of the installed botocore, so every request and answer is checked against the
CloudFormation and EC2 service models (``VolumeState`` and ``VolumeModificationState`` enums,
required members); the answers are written for these tests (no AWS account is reachable here).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest
from botocore.stub import Stubber

from operator_tools.preflight import (
    MODIFIABLE_VOLUME_STATES,
    PRIMARY_VOLUME_CHECK,
    PRIMARY_VOLUME_LOGICAL_ID,
    UNFINISHED_MODIFICATION_STATES,
    VOLUME_MODIFICATION_COOLDOWN,
    check_primary_volume_edit,
    run_preflight,
)
from platform_config import load_platform
from tests.example_config import FIXTURE_CONFIG
from tests.tools.aws_stubs import offline_client, stub_get_template

PLATFORM = load_platform(FIXTURE_CONFIG / "platform.yaml")
STACK = "kvcache-hyperpod"
VOLUME_ID = "vol-0123456789abcdef0"
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)

#: The Primary volume as the hyperpod stack was deployed with the example's settings (shortened
#: template, as the CDK writes it: tests/stacks/test_hyperpod_stack.py holds the real one).
DEPLOYED = {"Resources": {PRIMARY_VOLUME_LOGICAL_ID: {
    "Type": "AWS::EC2::Volume", "DeletionPolicy": "Retain",
    "Properties": {"AvailabilityZone": "us-west-2a", "Encrypted": True, "Size": 100, "VolumeType": "gp3",
                   "Iops": 3000, "Throughput": 125}}}}


def client(service: str) -> Any:
    return offline_client(service, PLATFORM.region)


def with_volume(**settings: Any) -> Any:
    """The fixture platform with ``curvine.primary_volume`` changed by ``settings``."""
    curvine = PLATFORM.curvine
    volume = curvine.primary_volume.model_copy(update=settings)
    return PLATFORM.model_copy(update={"curvine": curvine.model_copy(update={"primary_volume": volume})})


def volume(size: int = 100, state: str = "in-use", volume_type: str = "gp3") -> dict[str, Any]:
    return {"VolumeId": VOLUME_ID, "Size": size, "State": state, "VolumeType": volume_type, "Iops": 3000,
            "Throughput": 125, "AvailabilityZone": "us-west-2a", "Encrypted": True}


def modification(state: str, started_hours_ago: float, progress: int = 100) -> dict[str, Any]:
    return {"VolumeId": VOLUME_ID, "ModificationState": state, "Progress": progress,
            "StartTime": NOW - dt.timedelta(hours=started_hours_ago), "OriginalSize": 50, "TargetSize": 100}


def stubbed(deployed: dict[str, Any] | None, live: dict[str, Any] | None = None,
            modifications: list[dict[str, Any]] | str | None = None) -> tuple[Any, Any, Stubber, Stubber]:
    """CloudFormation answers GetTemplate with ``deployed`` (None: no such stack) and, when ``live``
    is given, DescribeStackResource with the volume's ID; EC2 answers DescribeVolumes with ``live``
    and DescribeVolumesModifications with ``modifications`` (None: never modified; a string: that
    error code). Nothing else may be called."""
    cloudformation, ec2 = client("cloudformation"), client("ec2")
    cfn_stub, ec2_stub = Stubber(cloudformation), Stubber(ec2)
    stub_get_template(cfn_stub, STACK, deployed)
    if live is not None:
        cfn_stub.add_response("describe_stack_resource", {"StackResourceDetail": {
            "StackName": STACK, "LogicalResourceId": PRIMARY_VOLUME_LOGICAL_ID, "PhysicalResourceId": VOLUME_ID,
            "ResourceType": "AWS::EC2::Volume", "LastUpdatedTimestamp": NOW - dt.timedelta(days=3),
            "ResourceStatus": "UPDATE_COMPLETE"}},
            {"StackName": STACK, "LogicalResourceId": PRIMARY_VOLUME_LOGICAL_ID})
        ec2_stub.add_response("describe_volumes", {"Volumes": [live]}, {"VolumeIds": [VOLUME_ID]})
        if modifications is None or isinstance(modifications, str):
            # None: never modified, which EC2 answers with an error, not an empty list; a str: that error code.
            code = modifications or "InvalidVolumeModification.NotFound"
            ec2_stub.add_client_error("describe_volumes_modifications", code,
                                      f"Modification for volume '{VOLUME_ID}' does not exist.",
                                      expected_params={"VolumeIds": [VOLUME_ID]})
        else:
            ec2_stub.add_response("describe_volumes_modifications", {"VolumesModifications": modifications},
                                  {"VolumeIds": [VOLUME_ID]})
    cfn_stub.activate()
    ec2_stub.activate()
    return cloudformation, ec2, cfn_stub, ec2_stub


def check(platform: Any, cloudformation: Any, ec2: Any, *stubs: Stubber):
    result = check_primary_volume_edit(platform, cloudformation, ec2, NOW)
    for stub in stubs:
        stub.assert_no_pending_responses()
    assert result.name == PRIMARY_VOLUME_CHECK
    return result


def test_the_states_are_the_service_models() -> None:
    """The states the check reads exist in the installed EC2 service model."""
    model = client("ec2").meta.service_model
    assert set(MODIFIABLE_VOLUME_STATES) <= set(model.shape_for("VolumeState").enum)
    assert set(UNFINISHED_MODIFICATION_STATES) | {"completed", "failed"} == set(
        model.shape_for("VolumeModificationState").enum)


def test_the_logical_id_is_the_constructs() -> None:
    from kv_constructs import CurvinePrimaryVolume

    assert PRIMARY_VOLUME_LOGICAL_ID == CurvinePrimaryVolume.LOGICAL_ID


def test_shrinking_the_volume_is_refused_before_the_deploy() -> None:
    """The template says 100 GiB, the volume was grown to 150 by hand, the config asks 120: a grow for
    CloudFormation, a shrink for EBS."""
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(size=150), [modification("completed", 48)])
    result = check(with_volume(size_gib=120), cloudformation, ec2, *stubs)
    assert not result.ok
    assert result.detail == (
        f"{VOLUME_ID}: size 100 GiB -> 120 GiB, which EBS would refuse: size 120 GiB is below the volume's 150 GiB, and "
        "EBS volumes cannot shrink: set curvine.primary_volume.size_gib to 150 or more (the stack update would fail "
        "and roll back; docs/day-two.md)")


def test_a_smaller_size_than_deployed_is_a_shrink() -> None:
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(size=100), [])
    result = check(with_volume(size_gib=80), cloudformation, ec2, *stubs)
    assert not result.ok and "size 100 GiB -> 80 GiB" in result.detail and "cannot shrink" in result.detail


@pytest.mark.parametrize("settings, change", [
    ({"size_gib": 200}, "size 100 GiB -> 200 GiB"),
    ({"iops": 6000, "throughput_mibps": 500}, "IOPS 3000 -> 6000, throughput 125 MiB/s -> 500 MiB/s"),
    ({"volume_type": "io2", "iops": 8000, "throughput_mibps": 125}, "type gp3 -> io2, IOPS 3000 -> 8000, "
                                                                     "throughput 125 MiB/s -> none"),
])
def test_a_second_change_within_six_hours_is_refused_with_the_time_it_may_go(settings, change) -> None:
    """Type, IOPS, throughput and size alike: the last modification started 2 h ago and completed."""
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(), [modification("completed", 2)])
    result = check(with_volume(**settings), cloudformation, ec2, *stubs)
    assert not result.ok
    assert result.detail.startswith(f"{VOLUME_ID}: {change}, which EBS would refuse: ")
    assert "its last modification started 2026-12-02 10:00 UTC, less than 6 hours ago: deploy this change after " \
           "2026-12-02 16:00 UTC" in result.detail


def test_the_same_change_passes_once_the_six_hours_are_over() -> None:
    hours = VOLUME_MODIFICATION_COOLDOWN / dt.timedelta(hours=1)
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(), [modification("completed", hours + 0.1)])
    result = check(with_volume(size_gib=200), cloudformation, ec2, *stubs)
    assert result.ok and result.detail == f"{VOLUME_ID}: size 100 GiB -> 200 GiB (EBS allows it now)"


@pytest.mark.parametrize("state", ["modifying", "optimizing"])
def test_a_modification_still_under_way_blocks_even_after_six_hours(state) -> None:
    """A large volume can optimize for more than 24 hours (EBS user guide); until it completes, EBS
    takes no other modification."""
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(), [modification(state, 30, progress=40)])
    result = check(with_volume(iops=4000), cloudformation, ec2, *stubs)
    assert not result.ok
    assert f"its last modification (started 2026-12-01 06:00 UTC) is still {state} (40%); EBS takes no other until " \
           "it is completed" in result.detail
    assert "less than 6 hours" not in result.detail


def test_a_volume_never_modified_can_grow() -> None:
    """EC2 answers InvalidVolumeModification.NotFound for a volume never modified (and may answer an
    empty list): both are "no modification"."""
    for history in (None, []):
        cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(), history)
        assert check(with_volume(size_gib=101), cloudformation, ec2, *stubs).ok


def test_a_volume_deleted_behind_the_stack_fails_the_row() -> None:
    """The stack names a volume EC2 no longer has (deleted by hand): ModifyVolume would fail."""
    cloudformation, ec2 = client("cloudformation"), client("ec2")
    cfn_stub, ec2_stub = Stubber(cloudformation), Stubber(ec2)
    cfn_stub.add_response("get_template", {"TemplateBody": json.dumps(DEPLOYED)},
                          {"StackName": STACK, "TemplateStage": "Original"})
    cfn_stub.add_response("describe_stack_resource", {"StackResourceDetail": {
        "LogicalResourceId": PRIMARY_VOLUME_LOGICAL_ID, "PhysicalResourceId": VOLUME_ID,
        "ResourceType": "AWS::EC2::Volume", "LastUpdatedTimestamp": NOW, "ResourceStatus": "CREATE_COMPLETE"}},
        {"StackName": STACK, "LogicalResourceId": PRIMARY_VOLUME_LOGICAL_ID})
    ec2_stub.add_client_error("describe_volumes", "InvalidVolume.NotFound",
                              f"The volume '{VOLUME_ID}' does not exist.", expected_params={"VolumeIds": [VOLUME_ID]})
    with cfn_stub, ec2_stub:
        result = check(with_volume(size_gib=200), cloudformation, ec2, cfn_stub, ec2_stub)
    assert not result.ok
    assert result.detail == (f"size 100 GiB -> 200 GiB, but {VOLUME_ID} of {STACK} was not found: the update would "
                             "fail; see docs/l2-cache.md, \"Recovering the Primary\"")


def test_another_ec2_error_is_not_read_as_never_modified() -> None:
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(), "UnauthorizedOperation")
    with pytest.raises(ec2.exceptions.ClientError, match="UnauthorizedOperation"):
        check_primary_volume_edit(with_volume(size_gib=200), cloudformation, ec2, NOW)


def test_a_volume_in_a_state_ebs_does_not_modify_is_refused() -> None:
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(state="error"), [])
    result = check(with_volume(size_gib=200), cloudformation, ec2, *stubs)
    assert not result.ok and "the volume is error; EBS modifies only a volume that is in-use or available" \
        in result.detail


def test_every_reason_is_named_at_once() -> None:
    cloudformation, ec2, *stubs = stubbed(DEPLOYED, volume(size=150), [modification("optimizing", 1, progress=10)])
    result = check(with_volume(size_gib=120), cloudformation, ec2, *stubs)
    assert not result.ok
    assert "cannot shrink" in result.detail and "is still optimizing (10%)" in result.detail
    assert "less than 6 hours ago: deploy this change after 2026-12-02 17:00 UTC" in result.detail


def test_no_change_reads_no_volume() -> None:
    """Settings as deployed: CloudFormation will not call ModifyVolume, whatever the volume's history
    (a modification started an hour ago does not matter); EC2 is not asked."""
    cloudformation, ec2, *stubs = stubbed(DEPLOYED)
    result = check(PLATFORM, cloudformation, ec2, *stubs)
    assert result.ok and result.detail == "no change (100 GiB gp3)"


@pytest.mark.parametrize("deployed, says", [
    (None, f"{STACK} not deployed yet: the deploy creates the volume"),
    ({"Resources": {}}, f"{STACK} has no {PRIMARY_VOLUME_LOGICAL_ID}: the deploy creates the volume"),
])
def test_a_volume_the_deploy_creates_passes(deployed, says) -> None:
    cloudformation, ec2, *stubs = stubbed(deployed)
    result = check(with_volume(size_gib=10), cloudformation, ec2, *stubs)
    assert result.ok and result.detail == says


def test_without_curvine_nothing_is_asked() -> None:
    platform = PLATFORM.model_copy(update={"curvine": PLATFORM.curvine.model_copy(update={"enabled": False})})
    cloudformation, ec2 = client("cloudformation"), client("ec2")
    with Stubber(cloudformation) as cfn_stub, Stubber(ec2) as ec2_stub:
        result = check(platform, cloudformation, ec2, cfn_stub, ec2_stub)
    assert result.ok and result.detail == "curvine.enabled is false: no Primary volume"


def test_an_io2_volume_compares_without_throughput() -> None:
    """io2 has no throughput setting: the template leaves it out, and so does the comparison."""
    deployed = copy.deepcopy(DEPLOYED)
    props = deployed["Resources"][PRIMARY_VOLUME_LOGICAL_ID]["Properties"]
    props.update(VolumeType="io2", Iops=8000)
    del props["Throughput"]
    cloudformation, ec2, *stubs = stubbed(deployed)
    assert check(with_volume(volume_type="io2", iops=8000), cloudformation, ec2, *stubs).ok


def test_run_preflight_reports_the_row() -> None:
    """The row is part of the full report (the other checks answered by a stand-in that knows no stack)."""
    from tests.tools.test_preflight import _FakeSession

    results = run_preflight(with_volume(size_gib=200), session_factory=_FakeSession)
    (row,) = [r for r in results if r.name == PRIMARY_VOLUME_CHECK]
    assert row.ok and row.detail == f"{STACK} not deployed yet: the deploy creates the volume"
