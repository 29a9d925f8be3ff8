"""The bootstrap's CloudFormation execution policies (issue 25, low item): generated from the session's
synthesized app (``tests/conftest.py`` ``synthesized``, no second synthesis) and cfn-lint's handler
permissions; every resource type covered, each document within IAM's size quota, no wildcard action,
regional actions held to the region, ``iam:PassRole`` only to the services roles are passed to, and a
type nobody knows a clear error."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from operator_tools import bootstrap_policy as bp
from operator_tools.cli import EXIT_OK, ToolError
from tests.example_config import FIXTURE_CONFIG
from tests.tools.script_loader import load_script

PREFIX = "kvcache-cfn-execution"


@pytest.fixture(scope="module")
def assembly(synthesized) -> Path:
    return Path(synthesized.outdir)


@pytest.fixture(scope="module")
def result(assembly) -> bp.Result:
    return bp.generate(assembly, PREFIX)


def _templates(assembly: Path) -> dict[str, dict]:
    """Every stack template of the assembly, read here independently of the module."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    return {name: json.loads((assembly / a["properties"]["templateFile"]).read_text())
            for name, a in manifest["artifacts"].items() if a["type"] == "aws:cloudformation:stack"}


def _granted(result: bp.Result) -> list[tuple[str, dict]]:
    """(action, its statement) for every action of every document."""
    out = []
    for document in result.documents:
        for statement in document.document["Statement"]:
            actions = statement["Action"]
            out += [(a, statement) for a in ([actions] if isinstance(actions, str) else actions)]
    return out


def test_every_resource_type_of_the_app_is_covered(assembly, result) -> None:
    types = {r["Type"] for t in _templates(assembly).values() for r in t["Resources"].values()}
    assert set(result.collected.types) == types and len(types) > 30
    granted = {a for a, _ in _granted(result)}
    customs = set()
    for rtype in sorted(types):
        actions = bp.handler_permissions(rtype, result.region)
        if actions is None:
            assert bp.special_case(rtype) is not None, rtype
            customs.add(rtype)
            continue
        assert actions, rtype
        missing = {bp.normalize_action(a) for a in actions} - granted - set(result.collected.not_actions)
        assert not missing, (rtype, missing)
    assert customs and all(t.startswith("Custom::") for t in customs)
    assert "lambda:InvokeFunction" in granted


def test_known_types_get_their_known_actions(result) -> None:
    granted = {a for a, _ in _granted(result)}
    assert {"eks:CreateCluster", "eks:DeleteCluster", "eks:CreateAddon", "sagemaker:CreateCluster",
            "sagemaker:UpdateCluster", "iam:CreateRole", "ec2:CreateVpc", "lambda:CreateFunction"} <= granted


def test_each_document_fits_the_managed_policy_quota_and_a_role_holds_them_all(result) -> None:
    assert 1 <= len(result.documents) <= bp.MAX_POLICIES_PER_ROLE == 10
    for document in result.documents:
        pretty = json.dumps(document.document, indent=4)
        assert document.chars == len(re.sub(r"\s", "", pretty)) <= bp.MAX_POLICY_CHARS == 6144
        assert len({s["Sid"] for s in document.document["Statement"]}) == len(document.document["Statement"])
    assert len({d.name for d in result.documents}) == len(result.documents)


def test_no_action_is_a_wildcard(result) -> None:
    for action, _ in _granted(result):
        assert action != "*" and not action.endswith(":*") and re.fullmatch(r"[a-z0-9-]+:[A-Za-z0-9*]+", action), action
    # The one entry of the schemas that is no IAM action is reported, not granted.
    assert set(result.collected.not_actions) == {"s3:REST.PUT.OBJECT"}
    with pytest.raises(ToolError, match=r"ec2:\*"):
        bp.check_no_wildcards(["ec2:CreateVpc", "ec2:*"], "a test")
    with pytest.raises(ToolError, match=r"wildcard action\(s\) \*"):
        bp.check_no_wildcards(["*"], "a test")


def test_regional_actions_are_held_to_the_region_and_global_ones_are_not(result) -> None:
    for action, statement in _granted(result):
        condition = statement.get("Condition", {}).get("StringEquals", {})
        service = action.split(":", 1)[0]
        if action == "iam:PassRole":
            continue
        if service in bp.GLOBAL_SERVICES:
            assert "aws:RequestedRegion" not in condition, action
        else:
            assert condition.get("aws:RequestedRegion") == result.region, action
    services = {a.split(":", 1)[0] for a, _ in _granted(result)}
    assert "iam" in services and "ec2" in services


def test_pass_role_only_to_the_services_roles_are_passed_to(result) -> None:
    passes = [s for a, s in _granted(result) if a.lower() == "iam:passrole"]
    assert len(passes) == 1
    statement = passes[0]
    assert statement["Action"] == "iam:PassRole"
    assert statement["Resource"] == f"arn:aws:iam::{result.account}:role/*"
    services = statement["Condition"]["StringEquals"]["iam:PassedToService"]
    assert {"eks.amazonaws.com", "sagemaker.amazonaws.com", "lambda.amazonaws.com"} <= set(services)
    assert all(s.endswith(".amazonaws.com") for s in services)


def test_generated_twice_the_documents_are_the_same(assembly, result) -> None:
    assert [d.document for d in bp.generate(assembly, PREFIX).documents] == [d.document for d in result.documents]


# --- what is refused ---------------------------------------------------------------------------


def _with_resource(assembly: Path, resources: dict) -> dict[str, dict]:
    templates = copy.deepcopy(bp.read_assembly(assembly)[0])
    first = sorted(templates)[0]
    templates[first]["Resources"].update(resources)
    return templates


@pytest.mark.parametrize("rtype", ["AWS::CodeBuild::Project", "AWS::Example::NotAType"])
def test_a_type_without_handlers_or_special_case_is_a_clear_error(assembly, result, rtype) -> None:
    """AWS::CodeBuild::Project is a real type whose cfn-lint schema has no handlers."""
    templates = _with_resource(assembly, {"Added": {"Type": rtype, "Properties": {}}})
    with pytest.raises(bp.UncoveredTypeError) as exc:
        bp.generate_from_templates(templates, result.account, result.region, PREFIX)
    assert rtype in str(exc.value) and "Added" in str(exc.value) and "SPECIAL_TYPES" in str(exc.value)


def test_custom_resources_are_covered_by_their_special_case_only(assembly, result, monkeypatch) -> None:
    monkeypatch.setattr(bp, "SPECIAL_TYPES", {k: v for k, v in bp.SPECIAL_TYPES.items() if k != bp.CUSTOM_RESOURCE})
    monkeypatch.setattr(bp, "special_case", lambda t: t if t in bp.SPECIAL_TYPES else None)
    with pytest.raises(bp.UncoveredTypeError, match=r"Custom::AWSCDK-EKS-KubernetesResource"):
        bp.generate(assembly, PREFIX)


def test_a_role_passed_to_a_service_nobody_named_is_an_error(assembly, result) -> None:
    templates = _with_resource(assembly, {
        "AlertRole": {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": {"Statement": []}}},
        "Alerts": {"Type": "AWS::SNS::Topic", "Properties": {"DeliveryStatusLogging": [
            {"Protocol": "sqs", "FailureFeedbackRoleArn": {"Fn::GetAtt": ["AlertRole", "Arn"]}}]}}})
    with pytest.raises(bp.UncoveredTypeError, match=r"AWS::SNS::Topic .*passes a role"):
        bp.generate_from_templates(templates, result.account, result.region, PREFIX)


def test_a_service_too_large_for_one_document_is_split(result) -> None:
    statements = bp.statements(result.collected, result.account, result.region)
    documents = bp.pack(statements, PREFIX, limit=1500)
    assert len(documents) > len(result.documents)
    assert all(d.chars <= 1500 for d in documents)
    ec2 = [s for d in documents for s in d.document["Statement"] if s["Sid"].startswith("Ec2")]
    assert len(ec2) > 1
    assert sorted(a for a, _ in _granted(bp.Result(result.account, result.region, result.collected, documents))) == \
        sorted(a for a, _ in _granted(result))


# --- the command -------------------------------------------------------------------------------


def test_the_command_writes_the_documents_and_prints_the_bootstrap_command(assembly, result, tmp_path, capsys) -> None:
    out = tmp_path / "policies"
    out.mkdir()
    (out / f"{PREFIX}-9.json").write_text("{}")  # a stale document of an earlier, larger run
    code = load_script("bootstrap_policy").main(["--config", str(FIXTURE_CONFIG), "--assembly", str(assembly),
                                                 "--out", str(out)])
    assert code == EXIT_OK
    written = sorted(out.glob("*.json"))
    assert [p.name for p in written] == [f"{d.name}.json" for d in result.documents]
    for path, document in zip(written, result.documents):
        assert json.loads(path.read_text()) == document.document
    text = capsys.readouterr().out
    arns = [f"arn:aws:iam::{result.account}:policy/{d.name}" for d in result.documents]
    assert f"--cloudformation-execution-policies \"{','.join(arns)}\"" in text
    assert f"cdk bootstrap aws://{result.account}/{result.region} " in text
    create = text.index("aws iam create-policy --policy-name")
    assert create < text.index("cdk bootstrap") < text.index("aws iam create-policy-version")
    assert text.count("aws iam create-policy --policy-name") == len(result.documents)


def test_the_command_without_an_assembly_is_one_error_line(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        load_script("bootstrap_policy").cli.run(load_script("bootstrap_policy").main,
                                                ["--config", str(FIXTURE_CONFIG), "--assembly", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "make synth" in err


def test_an_action_a_handler_was_seen_to_need_is_added(assembly, result, monkeypatch) -> None:
    assert "eks:ExampleMissingAction" not in {a for a, _ in _granted(result)}
    monkeypatch.setattr(bp, "EXTRA_PERMISSIONS", {"AWS::EKS::Cluster": (("eks:ExampleMissingAction",), "a test")})
    granted = {a for a, _ in _granted(bp.generate(assembly, PREFIX))}
    assert "eks:ExampleMissingAction" in granted
