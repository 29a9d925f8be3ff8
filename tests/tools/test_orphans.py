"""Orphaned line stacks: found by name prefix and project tag, deleted by ID after confirmation.

AWS is simulated with botocore's Stubber on real boto3 clients, so every request is checked
against the service model (operation, parameters) and every response has the real shape.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from operator_tools.orphans import LineStack, delete_stacks, find_orphans, line_stacks
from platform_config import load_project
from tests.example_config import FIXTURE_CONFIG
from tests.tools.script_loader import load_script

PROJECT = load_project(FIXTURE_CONFIG)
REGION = PROJECT.platform.region
ACCOUNT = PROJECT.platform.account
CREATED = dt.datetime(2026, 9, 1, tzinfo=dt.timezone.utc)


def stack(name: str, status: str = "CREATE_COMPLETE", project: str | None = "kvcache", **extra: Any) -> dict:
    """One ``DescribeStacks`` entry as CloudFormation returns it."""
    tags = [{"Key": "kvcache.io/project", "Value": project}] if project else []
    return {"StackName": name, "StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{name}/0a1b",
            "StackStatus": status, "CreationTime": CREATED, "Tags": tags, **extra}


#: What an account with this project deployed, one line since removed from config, looks like.
DEPLOYED = [
    stack("kvcache-network"), stack("kvcache-eks"), stack("kvcache-addons"),
    stack("kvcache-line-rag-assistant"), stack("kvcache-line-research-reasoning"),
    stack("kvcache-line-doc-search"),                                    # file deleted: orphan
    stack("kvcache-line-old-pilot", "UPDATE_ROLLBACK_COMPLETE"),        # file deleted: orphan
    stack("kvcache-line-other-team", project="someone-else"),           # another project's tag
    stack("kvcache-line-untagged", project=None),                       # no tag: not ours to judge
    stack("kvcache-line-nested", ParentId="arn:aws:cloudformation:us-west-2:111122223333:stack/p/1"),
    stack("kvcache-line-gone", "DELETE_COMPLETE"),
    stack("kvcache-linear-thing"),
]


def test_orphans_are_tagged_line_stacks_without_a_config_file() -> None:
    assert [s.name for s in find_orphans(PROJECT, DEPLOYED)] == ["kvcache-line-doc-search", "kvcache-line-old-pilot"]
    assert {s.line for s in line_stacks(PROJECT, DEPLOYED)} == {
        "rag-assistant", "research-reasoning", "doc-search", "old-pilot"}


def test_every_configured_line_is_backed_whatever_the_fixture_holds() -> None:
    deployed = [stack(f"kvcache-line-{line.name}") for line in PROJECT.business_lines]
    assert find_orphans(PROJECT, deployed) == []


def _clients(described_pages: list[list[dict]], *, account: str = ACCOUNT):
    sts = boto3.client("sts", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
    cfn = boto3.client("cloudformation", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
    sts_stub, cfn_stub = Stubber(sts), Stubber(cfn)
    sts_stub.add_response("get_caller_identity", {"Account": account, "UserId": "AROA:ci",
                                                  "Arn": f"arn:aws:sts::{account}:assumed-role/deploy/ci"}, {})
    for i, page in enumerate(described_pages):
        response: dict[str, Any] = {"Stacks": page}
        if i + 1 < len(described_pages):
            response["NextToken"] = f"page-{i + 1}"
        cfn_stub.add_response("describe_stacks", response, {"NextToken": f"page-{i}"} if i else {})

    class Session:
        def __init__(self, region_name: str) -> None:
            assert region_name == REGION  # the region comes from platform.yaml

        def client(self, service: str):
            return {"sts": sts, "cloudformation": cfn}[service]

    return Session, sts_stub, cfn_stub


def _expect_deletion(cfn_stub: Stubber, orphan: dict) -> None:
    cfn_stub.add_response("delete_stack", {}, {"StackName": orphan["StackId"]})


def _expect_wait(cfn_stub: Stubber, orphan: dict, final_status: str = "DELETE_COMPLETE", reason: str = "") -> None:
    done = {**orphan, "StackStatus": final_status}
    if reason:
        done["StackStatusReason"] = reason
    cfn_stub.add_response("describe_stacks", {"Stacks": [{**orphan, "StackStatus": "DELETE_IN_PROGRESS"}]},
                          {"StackName": orphan["StackId"]})
    cfn_stub.add_response("describe_stacks", {"Stacks": [done]}, {"StackName": orphan["StackId"]})


def run(argv: list[str], session, confirm=lambda prompt: "delete") -> int:
    return load_script("orphans").main(["--config", str(FIXTURE_CONFIG), *argv], session_factory=session,
                                       confirm=confirm)


def test_listing_reads_every_page_and_exits_1_when_orphans_exist(capsys) -> None:
    session, sts_stub, cfn_stub = _clients([DEPLOYED[:6], DEPLOYED[6:]])
    with sts_stub, cfn_stub:
        assert run([], session) == 1
        cfn_stub.assert_no_pending_responses()
    out = capsys.readouterr().out
    assert "kvcache-line-doc-search" in out and "kvcache-line-old-pilot" in out
    assert "kvcache-line-other-team" not in out and "kvcache-line-rag-assistant" not in out


def test_listing_with_no_orphans_exits_0(capsys) -> None:
    session, sts_stub, cfn_stub = _clients([[stack(f"kvcache-line-{l.name}") for l in PROJECT.business_lines]])
    with sts_stub, cfn_stub:
        assert run([], session) == 0
    assert "no orphaned business-line stacks" in capsys.readouterr().out


def test_destroy_asks_then_deletes_by_stack_id_and_waits(monkeypatch, capsys) -> None:
    orphans = [s for s in DEPLOYED if s["StackName"] in ("kvcache-line-doc-search", "kvcache-line-old-pilot")]
    session, sts_stub, cfn_stub = _clients([DEPLOYED])
    for o in orphans:
        _expect_deletion(cfn_stub, o)
    for o in orphans:
        _expect_wait(cfn_stub, o)
    monkeypatch.setattr("operator_tools.orphans.DELETE_POLL_SECONDS", 0)
    prompts: list[str] = []
    with sts_stub, cfn_stub:
        rc = run(["--destroy"], session, confirm=lambda p: prompts.append(p) or "delete")
        cfn_stub.assert_no_pending_responses()
    assert rc == 0
    assert len(prompts) == 1 and "Delete these 2 stack(s) in us-west-2 (account 111122223333)" in prompts[0]
    out = capsys.readouterr().out
    assert "deleted  kvcache-line-doc-search" in out and "deleted  kvcache-line-old-pilot" in out


def test_declined_confirmation_deletes_nothing(capsys) -> None:
    session, sts_stub, cfn_stub = _clients([DEPLOYED])
    with sts_stub, cfn_stub:  # no delete_stack response stubbed: a call would fail the test
        assert run(["--destroy"], session, confirm=lambda p: "yes") == 1
        cfn_stub.assert_no_pending_responses()
    assert "not confirmed; nothing deleted" in capsys.readouterr().err


def test_destroy_without_a_terminal_needs_yes(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    session, sts_stub, cfn_stub = _clients([DEPLOYED])
    with sts_stub, cfn_stub:
        assert load_script("orphans").main(["--config", str(FIXTURE_CONFIG), "--destroy"],
                                           session_factory=session) == 2
    assert "pass --yes" in capsys.readouterr().err


def test_a_failed_deletion_is_reported_and_exits_1(capsys) -> None:
    orphan = next(s for s in DEPLOYED if s["StackName"] == "kvcache-line-doc-search")
    session, sts_stub, cfn_stub = _clients([[s for s in DEPLOYED if s["StackName"] != "kvcache-line-old-pilot"]])
    _expect_deletion(cfn_stub, orphan)
    cfn_stub.add_response("describe_stacks", {"Stacks": [{**orphan, "StackStatus": "DELETE_FAILED",
                                                         "StackStatusReason": "Endpoint: kubectl delete timed out"}]},
                          {"StackName": orphan["StackId"]})
    with sts_stub, cfn_stub:
        assert run(["--destroy", "--yes"], session) == 1
    assert "FAILED   kvcache-line-doc-search  DELETE_FAILED: Endpoint: kubectl delete timed out" in \
        capsys.readouterr().out


def test_credentials_of_another_account_stop_before_any_stack_call(capsys) -> None:
    session, sts_stub, cfn_stub = _clients([], account="999999999999")
    with sts_stub, cfn_stub:
        assert run(["--destroy", "--yes"], session) == 2
    assert "credentials are for 999999999999, config says 111122223333" in capsys.readouterr().err


def test_aws_errors_exit_2(capsys) -> None:
    session, sts_stub, cfn_stub = _clients([])
    cfn_stub.add_client_error("describe_stacks", "AccessDenied", "not authorized to perform DescribeStacks")
    with sts_stub, cfn_stub:
        assert run([], session) == 2
    assert "cannot query AWS in us-west-2" in capsys.readouterr().err


def test_delete_stacks_reports_the_waiters_last_status() -> None:
    cfn = boto3.client("cloudformation", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
    orphan = stack("kvcache-line-doc-search")
    with Stubber(cfn) as stub:
        _expect_deletion(stub, orphan)
        _expect_wait(stub, orphan, "DELETE_FAILED", "PVC still bound")
        (result,) = delete_stacks(cfn, [LineStack("kvcache-line-doc-search", "doc-search", "CREATE_COMPLETE",
                                                  orphan["StackId"])], poll_seconds=0)
    assert not result.ok and result.detail == "DELETE_FAILED: PVC still bound"
