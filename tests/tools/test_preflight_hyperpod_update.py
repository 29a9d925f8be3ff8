"""No HyperPod update while deep health checks run (issue 19): preflight against botocore's Stubber.

Real boto3 clients of the installed botocore, so every request and answer is checked against the
SageMaker and CloudFormation service models (``ClusterInstanceStatus`` enum, required members);
the answers are written for these tests (no AWS account is reachable here).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest
from botocore.stub import Stubber

from operator_tools.preflight import (
    HYPERPOD_UPDATE_CHECK,
    UPDATE_BLOCKING_NODE_STATUSES,
    CheckResult,
    check_hyperpod_update,
    hyperpod_nodes,
    run_preflight,
    template_changes,
)
from platform_config import load_platform
from tests.example_config import FIXTURE_CONFIG
from tests.tools.aws_stubs import offline_client, stub_get_template

PLATFORM = load_platform(FIXTURE_CONFIG / "platform.yaml")
STACK = "kvcache-hyperpod"
CLUSTER = "kvcache-hyperpod"
LAUNCH = dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.timezone.utc)

#: A hyperpod stack template as the CDK writes it (what the check compares; shortened).
DEPLOYED = {
    "Resources": {
        "HyperPodCluster": {"Type": "AWS::SageMaker::Cluster",
                            "Properties": {"ClusterName": CLUSTER, "NodeRecovery": "Automatic",
                                           "InstanceGroups": [{"InstanceGroupName": "g6e-inference",
                                                               "InstanceCount": 2}]},
                            "Metadata": {"aws:cdk:path": "kvcache-hyperpod/HyperPod/Cluster"}},
        "CDKMetadata": {"Type": "AWS::CDK::Metadata", "Properties": {"Analytics": "v2:deflate64:old"}},
    },
    "Outputs": {"HyperPodClusterName": {"Value": CLUSTER}},
}


def client(service: str) -> Any:
    return offline_client(service, PLATFORM.region)


def node(instance_id: str, status: str, group: str = "g6e-inference", **extra: Any) -> dict[str, Any]:
    return {"InstanceGroupName": group, "InstanceId": instance_id, "InstanceType": "ml.g6e.12xlarge",
            "LaunchTime": LAUNCH, "InstanceStatus": {"Status": status, **extra}}


def stubbed(deployed: dict[str, Any] | None, nodes: list[dict[str, Any]] | None,
            details: dict[str, dict[str, Any]] | None = None) -> tuple[Any, Any, Stubber, Stubber]:
    """CloudFormation answers GetTemplate with ``deployed`` (None: no such stack); SageMaker answers
    ListClusterNodes with ``nodes`` (None: no such cluster) and DescribeClusterNode with ``details``."""
    cloudformation, sagemaker = client("cloudformation"), client("sagemaker")
    cfn_stub, sm_stub = Stubber(cloudformation), Stubber(sagemaker)
    stub_get_template(cfn_stub, STACK, deployed)
    if nodes is None:
        sm_stub.add_client_error("list_cluster_nodes", "ResourceNotFound", f"Cluster {CLUSTER} not found",
                                 expected_params={"ClusterName": CLUSTER, "IncludeNodeLogicalIds": True})
    elif deployed is not None:
        sm_stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": nodes},
                             {"ClusterName": CLUSTER, "IncludeNodeLogicalIds": True})
        for summary in nodes:
            if summary["InstanceStatus"]["Status"] != "Running":
                answer = (details or {}).get(summary["InstanceId"], summary)
                sm_stub.add_response("describe_cluster_node", {"NodeDetails": answer},
                                     {"ClusterName": CLUSTER, "NodeId": summary["InstanceId"]})
    cfn_stub.activate()
    sm_stub.activate()
    return sagemaker, cloudformation, sm_stub, cfn_stub


def changed() -> dict[str, Any]:
    """The synthesized template of a deploy that scales the G6e group (an UpdateCluster)."""
    template = copy.deepcopy(DEPLOYED)
    template["Resources"]["HyperPodCluster"]["Properties"]["InstanceGroups"][0]["InstanceCount"] = 3
    return template


def test_the_blocking_status_is_the_service_models() -> None:
    """The enum value the check waits on exists in the installed SageMaker service model."""
    shape = client("sagemaker").meta.service_model.shape_for("ClusterInstanceStatus")
    assert set(UPDATE_BLOCKING_NODE_STATUSES) == {"DeepHealthCheckInProgress"} <= set(shape.enum)


def test_an_update_while_a_node_is_under_deep_health_checks_is_stopped_naming_the_node() -> None:
    nodes = [node("i-0aaa", "Running"), node("i-0bbb", "DeepHealthCheckInProgress")]
    details = {"i-0bbb": {"InstanceGroupName": "g6e-inference", "InstanceId": "i-0bbb",
                          "InstanceStatus": {"Status": "DeepHealthCheckInProgress",
                                             "Message": "InstanceStress: DCGM level 4 running"}}}
    sagemaker, cloudformation, sm_stub, cfn_stub = stubbed(DEPLOYED, nodes, details)
    result = check_hyperpod_update(PLATFORM, sagemaker, cloudformation, changed())
    assert result.name == HYPERPOD_UPDATE_CHECK and not result.ok
    assert result.detail.startswith("kvcache-hyperpod changes (HyperPodCluster changes), but deep health checks run "
                                    "on 1 node(s) of kvcache-hyperpod: i-0bbb (g6e-inference): "
                                    "DeepHealthCheckInProgress, InstanceStress: DCGM level 4 running.")
    assert "UPDATE_ROLLBACK_FAILED" in result.detail and "i-0aaa" not in result.detail
    sm_stub.assert_no_pending_responses()
    cfn_stub.assert_no_pending_responses()


def test_describe_cluster_node_has_the_last_word() -> None:
    """A node listed as Pending that DescribeClusterNode reports under deep health checks blocks too."""
    nodes = [node("i-0ccc", "Pending")]
    details = {"i-0ccc": {"InstanceGroupName": "g6e-inference", "InstanceId": "i-0ccc",
                          "InstanceStatus": {"Status": "DeepHealthCheckInProgress"}}}
    sagemaker, cloudformation, sm_stub, _ = stubbed(DEPLOYED, nodes, details)
    result = check_hyperpod_update(PLATFORM, sagemaker, cloudformation, changed())
    assert not result.ok and "i-0ccc (g6e-inference): DeepHealthCheckInProgress" in result.detail
    sm_stub.assert_no_pending_responses()


def test_a_node_gone_between_list_and_describe_keeps_its_listed_status() -> None:
    """A node replaced between ListClusterNodes and DescribeClusterNode (ResourceNotFound for the
    node) is not "no cluster": its listed status stands, so a node listed under deep health checks
    still stops the deploy (issue 26 item 4: the guard failed open)."""
    cloudformation, sagemaker = client("cloudformation"), client("sagemaker")
    cfn_stub, sm_stub = Stubber(cloudformation), Stubber(sagemaker)
    cfn_stub.add_response("get_template", {"TemplateBody": json.dumps(DEPLOYED)},
                          {"StackName": STACK, "TemplateStage": "Original"})
    sm_stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [
        node("i-0ddd", "DeepHealthCheckInProgress", Message="InstanceStress"), node("i-0eee", "Pending")]},
        {"ClusterName": CLUSTER, "IncludeNodeLogicalIds": True})
    for gone in ("i-0ddd", "i-0eee"):
        sm_stub.add_client_error("describe_cluster_node", "ResourceNotFound", f"Node {gone} not found",
                                 expected_params={"ClusterName": CLUSTER, "NodeId": gone})
    cfn_stub.activate()
    sm_stub.activate()
    result = check_hyperpod_update(PLATFORM, sagemaker, cloudformation, changed())
    assert not result.ok and "i-0ddd (g6e-inference): DeepHealthCheckInProgress, InstanceStress" in result.detail
    assert "not found" not in result.detail
    sm_stub.assert_no_pending_responses()


@pytest.mark.parametrize("synthesized, deployed, nodes, ok, detail", [
    # No change to the stack: nodes under checks do not matter and are not even read.
    ("same", DEPLOYED, [], True, "kvcache-hyperpod does not change: no update of kvcache-hyperpod"),
    # Metadata only (a construct path, the CDK's analytics): no resource changes, no UpdateCluster.
    ("metadata", DEPLOYED, [], True, "kvcache-hyperpod does not change: no update of kvcache-hyperpod"),
    # First deploy: CreateCluster, not UpdateCluster.
    ("changed", None, [], True, "kvcache-hyperpod not deployed yet: the deploy creates kvcache-hyperpod"),
    # A change while every node runs normally; another non-Running status is named, not blocking.
    ("changed", DEPLOYED, [node("i-0aaa", "Running"), node("i-0ddd", "SystemUpdating")], True,
     "kvcache-hyperpod changes (HyperPodCluster changes); no deep health checks on the 2 node(s) of "
     "kvcache-hyperpod; not Running: i-0ddd (g6e-inference): SystemUpdating"),
    # The stack exists but its cluster is gone.
    ("changed", DEPLOYED, None, True, "kvcache-hyperpod changes (HyperPodCluster changes); HyperPod cluster "
     "kvcache-hyperpod not found"),
    # Without a cloud assembly, any deploy counts as a change.
    (None, DEPLOYED, [node("i-0bbb", "DeepHealthCheckInProgress")], False,
     "no cloud assembly given (--cloud-assembly), so the deploy is taken to change kvcache-hyperpod, but deep "
     "health checks run on 1 node(s)"),
])
def test_the_check_runs_only_when_the_hyperpod_stack_would_change(synthesized, deployed, nodes, ok, detail) -> None:
    template = {"same": DEPLOYED, "changed": changed(), None: None}.get(synthesized)
    if synthesized == "metadata":
        template = copy.deepcopy(DEPLOYED)
        template["Resources"]["HyperPodCluster"]["Metadata"] = {"aws:cdk:path": "kvcache-hyperpod/Moved/Cluster"}
        template["Resources"]["CDKMetadata"]["Properties"]["Analytics"] = "v2:deflate64:new"
        template["Metadata"] = {"cdk_nag": {}}
    listed = nodes if synthesized not in ("same", "metadata") else None
    sagemaker, cloudformation, sm_stub, cfn_stub = stubbed(deployed, listed if deployed is not None else None)
    if synthesized in ("same", "metadata") or deployed is None:
        sm_stub.deactivate()  # nothing may be asked of SageMaker
        sm_stub = Stubber(sagemaker)
        sm_stub.activate()
    result = check_hyperpod_update(PLATFORM, sagemaker, cloudformation, template)
    assert result.ok is ok
    assert result.detail.startswith(detail), result.detail
    sm_stub.assert_no_pending_responses()
    cfn_stub.assert_no_pending_responses()


def test_template_changes_name_what_changes() -> None:
    assert template_changes(DEPLOYED, DEPLOYED) == []
    new = changed()
    new["Resources"]["LifecycleScripts"] = {"Type": "Custom::CDKBucketDeployment", "Properties": {}}
    new["Outputs"]["Extra"] = {"Value": "x"}
    assert template_changes(new, DEPLOYED) == ["HyperPodCluster changes", "LifecycleScripts added", "Outputs change"]
    assert template_changes(DEPLOYED, new) == ["HyperPodCluster changes", "LifecycleScripts removed", "Outputs change"]


def test_nodes_are_read_across_pages() -> None:
    sagemaker = client("sagemaker")
    stub = Stubber(sagemaker)
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [node("i-0001", "Running")], "NextToken": "t"},
                      {"ClusterName": CLUSTER, "IncludeNodeLogicalIds": True})
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [node("i-0002", "DeepHealthCheckInProgress")]},
                      {"ClusterName": CLUSTER, "IncludeNodeLogicalIds": True, "NextToken": "t"})
    stub.add_response("describe_cluster_node", {"NodeDetails": node("i-0002", "DeepHealthCheckInProgress")},
                      {"ClusterName": CLUSTER, "NodeId": "i-0002"})
    with stub:
        found = hyperpod_nodes(sagemaker, CLUSTER)
    assert [(n.node, n.status) for n in found] == [("i-0001", "Running"), ("i-0002", "DeepHealthCheckInProgress")]


def test_a_node_still_being_provisioned_is_described_by_its_logical_id() -> None:
    sagemaker = client("sagemaker")
    stub = Stubber(sagemaker)
    pending = {"InstanceGroupName": "g6e-inference", "InstanceId": "", "NodeLogicalId": "node-abc",
               "InstanceType": "ml.g6e.12xlarge", "LaunchTime": LAUNCH, "InstanceStatus": {"Status": "Pending"}}
    stub.add_response("list_cluster_nodes", {"ClusterNodeSummaries": [pending]},
                      {"ClusterName": CLUSTER, "IncludeNodeLogicalIds": True})
    stub.add_response("describe_cluster_node", {"NodeDetails": {"NodeLogicalId": "node-abc",
                                                                "InstanceStatus": {"Status": "Pending"}}},
                      {"ClusterName": CLUSTER, "NodeLogicalId": "node-abc"})
    with stub:
        (found,) = hyperpod_nodes(sagemaker, CLUSTER)
    assert (found.node, found.group, found.status) == ("node-abc", "g6e-inference", "Pending")


class _Session:
    """A boto3 Session stand-in whose clients are the stubbed real ones."""

    def __init__(self, clients: dict[str, Any]) -> None:
        self.clients = clients

    def client(self, service: str) -> Any:
        return self.clients[service]


def test_run_preflight_only_runs_the_guard_with_the_synthesized_template() -> None:
    nodes = [node("i-0bbb", "DeepHealthCheckInProgress")]
    sagemaker, cloudformation, sm_stub, _ = stubbed(DEPLOYED, nodes)
    session = _Session({"sagemaker": sagemaker, "cloudformation": cloudformation})
    (result,) = run_preflight(PLATFORM, session_factory=lambda region_name: session, hyperpod_template=changed(),
                              only=HYPERPOD_UPDATE_CHECK)
    assert not result.ok and "i-0bbb" in result.detail
    with pytest.raises(ValueError, match="allowed: 'hyperpod update'"):
        run_preflight(PLATFORM, session_factory=lambda region_name: session, only="cluster version")


def test_the_cli_reads_the_cloud_assembly_and_exits_1_naming_the_node(tmp_path, capsys) -> None:
    from tests.tools.script_loader import load_script

    preflight = load_script("preflight")
    (tmp_path / f"{STACK}.template.json").write_text(json.dumps(changed()))
    sagemaker, cloudformation, _, _ = stubbed(DEPLOYED, [node("i-0bbb", "DeepHealthCheckInProgress")])
    session = _Session({"sagemaker": sagemaker, "cloudformation": cloudformation})
    code = preflight.main(["--config", str(FIXTURE_CONFIG), "--cloud-assembly", str(tmp_path), "--only",
                           HYPERPOD_UPDATE_CHECK], session_factory=lambda region_name: session)
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("FAIL  hyperpod update  kvcache-hyperpod changes (HyperPodCluster changes)")
    assert "i-0bbb (g6e-inference): DeepHealthCheckInProgress" in out
    # No template for the stack in the directory: a bad flag, exit 2, one error line.
    assert preflight.main(["--config", str(FIXTURE_CONFIG), "--cloud-assembly", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --cloud-assembly: cannot read ") and err.count("\n") == 1


def test_check_result_shape() -> None:
    assert CheckResult(HYPERPOD_UPDATE_CHECK, True, "x").name == "hyperpod update"
