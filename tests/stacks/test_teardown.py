"""A teardown that leaves nothing (issue 19): each line's delete waits for its load balancers, and the
documented teardown order is the order the stack dependencies give."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_cdk.assertions import Match
from botocore.stub import Stubber

from kv_constructs.teardown_wait import READ_ACTIONS, RESOURCE_TYPE, WAIT_TIMEOUT
from kv_constructs.teardown_wait_handler import handler
from platform_config.stack_names import stack_ids

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_RESOURCE = "Custom::AWSCDK-EKS-KubernetesResource"


def _manifest_kinds(resource: dict) -> set[str]:
    manifest = resource["Properties"]["Manifest"]
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    return set(re.findall(r'\\?"kind\\?":\s*\\?"([A-Za-z]+)', text))


def test_every_line_deletes_its_wait_last(templates, project) -> None:
    """The wait is created first and deleted last in the line's stack: the Namespace manifest depends on
    it, and the Storage and Endpoint manifests on the Namespace."""
    ids = stack_ids(project)
    for line in project.business_lines:
        template = templates[ids[f"line-{line.name}"]]
        (wait_id,) = template.find_resources(RESOURCE_TYPE)
        template.has_resource_properties(RESOURCE_TYPE, {
            "Namespace": line.namespace, "ClusterName": project.platform.eks.cluster_name,
            "TimeoutSeconds": int(WAIT_TIMEOUT.to_seconds()),
            "ServiceToken": {"Fn::ImportValue": Match.string_like_regexp(ids["addons"])},
            # CloudFormation's wait for an answer: 20 minutes, not its default hour (issue 26 item 3).
            "ServiceTimeout": 1200})
        manifests = template.find_resources(KUBERNETES_RESOURCE)
        (namespace_id,) = [lid for lid, r in manifests.items() if _manifest_kinds(r) == {"Namespace"}]
        assert wait_id in manifests[namespace_id].get("DependsOn", []), line.name
        for lid, resource in manifests.items():
            if lid != namespace_id:
                assert namespace_id in resource.get("DependsOn", []), (line.name, lid)


def test_the_wait_is_bounded_inside_its_handler(templates, project) -> None:
    """10 minutes of waiting inside a 15-minute Lambda (the generic check of every custom resource's
    wait is tests/stacks/test_cluster_stack.py; this pins the numbers)."""
    addons = templates[stack_ids(project)["addons"]]
    functions = addons.find_resources("AWS::Lambda::Function", {"Properties": {
        "Handler": "handler.on_event", "Description": Match.string_like_regexp("load balancers are gone")}})
    (function,) = functions.values()
    assert function["Properties"]["Timeout"] == 900 and WAIT_TIMEOUT.to_seconds() == 600


def test_the_waiter_may_only_read(templates, project) -> None:
    addons = templates[stack_ids(project)["addons"]]
    policies = [p for p in addons.find_resources("AWS::IAM::Policy").values()
                if "ReadLoadBalancersAndSecurityGroups" in json.dumps(p)]
    (policy,) = policies
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert sorted(statements["ReadLoadBalancersAndSecurityGroups"]["Action"]) == sorted(READ_ACTIONS)
    actions = [a for s in statements.values() for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])]
    assert all(a.split(":")[1].startswith(("Describe", "CreateLogStream", "PutLogEvents")) for a in actions), actions


# --- The documented teardown order is the stacks' ---------------------------------------------------


def _documented_order() -> list[str]:
    """The stack roles of docs/day-two.md's numbered teardown list, in order."""
    text = (REPO / "docs" / "day-two.md").read_text(encoding="utf-8")
    section = text.split("## Teardown", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `kvcache-([a-z0-9<>-]+)`", section, re.M)


def test_the_documented_teardown_order_is_what_the_dependencies_give(platform, project) -> None:
    """`cdk destroy --all` deletes a stack only after every stack that depends on it: the docs' order
    must put each stack after all of its dependents, and name every platform stack and the lines."""
    order = _documented_order()
    assert order[0] == "line-<name>" or order[0].startswith("line"), order
    ids = {v: k for k, v in stack_ids(project).items()}
    position = {role: i for i, role in enumerate(order)}
    stacks = platform.all()
    roles = {s: ("line-<name>" if ids[s.stack_name].startswith("line-") else ids[s.stack_name]) for s in stacks}
    assert set(roles.values()) == set(order), (order, sorted(set(roles.values())))
    for stack in stacks:
        for dependency in stack.dependencies:
            assert position[roles[stack]] < position[roles[dependency]], (roles[stack], roles[dependency])
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/day-two.md" in readme


# --- The handler, against botocore's Stubber (Elastic Load Balancing v2 and EC2 service models) -----

NS = "rag-assistant"
ALB = "arn:aws:elasticloadbalancing:us-west-2:111122223333:loadbalancer/app/k8s-ragassis-albrag-0123456789/abc"
OTHER = "arn:aws:elasticloadbalancing:us-west-2:111122223333:loadbalancer/app/k8s-legal-alb-0123456789/def"
TG = "arn:aws:elasticloadbalancing:us-west-2:111122223333:targetgroup/k8s-ragassis-ragassis-0123456789/fed"


def _clients() -> tuple[Any, Any]:
    session = boto3.session.Session(aws_access_key_id="AKIAEXAMPLE", aws_secret_access_key="secret",
                                    region_name="us-west-2")
    return session.client("elbv2"), session.client("ec2")


def _tags(arn: str, **tags: str) -> dict[str, Any]:
    return {"ResourceArn": arn, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}


def _one_look(elbv2_stub: Stubber, ec2_stub: Stubber, *, alb: bool, group: bool) -> None:
    """One poll: load balancers (+ tags), target groups (+ tags), security groups by tag key."""
    lbs = [ALB, OTHER] if alb else [OTHER]
    elbv2_stub.add_response("describe_load_balancers", {"LoadBalancers": [{"LoadBalancerArn": a} for a in lbs]}, {})
    tags = [_tags(OTHER, **{"elbv2.k8s.aws/cluster": "kvcache-eks", "ingress.k8s.aws/stack": "legal-search/alb-legal"})]
    if alb:
        tags.insert(0, _tags(ALB, **{"elbv2.k8s.aws/cluster": "kvcache-eks", "ingress.k8s.aws/stack": f"{NS}/alb-rag",
                                     "ingress.k8s.aws/resource": "LoadBalancer"}))
    elbv2_stub.add_response("describe_tags", {"TagDescriptions": tags}, {"ResourceArns": lbs})
    elbv2_stub.add_response("describe_target_groups", {"TargetGroups": [{"TargetGroupArn": TG}] if alb else []}, {})
    if alb:
        elbv2_stub.add_response("describe_tags", {"TagDescriptions": [_tags(TG, **{
            "elbv2.k8s.aws/cluster": "kvcache-eks", "ingress.k8s.aws/stack": "shared-group",  # an explicit group
            "ingress.k8s.aws/resource": f"{NS}/alb-rag-rag-assistant:8080"})]}, {"ResourceArns": [TG]})
    groups = [{"GroupId": "sg-0aaa", "Tags": [{"Key": "elbv2.k8s.aws/cluster", "Value": "kvcache-eks"},
                                              {"Key": "ingress.k8s.aws/stack", "Value": f"{NS}/alb-rag"}]}] if group else []
    ec2_stub.add_response("describe_security_groups", {"SecurityGroups": groups},
                          {"Filters": [{"Name": "tag-key", "Values": ["elbv2.k8s.aws/cluster"]}]})


def test_delete_waits_until_the_namespaces_load_balancer_resources_are_gone() -> None:
    elbv2, ec2 = _clients()
    with Stubber(elbv2) as elbv2_stub, Stubber(ec2) as ec2_stub:
        _one_look(elbv2_stub, ec2_stub, alb=True, group=True)    # the controller has not finished
        _one_look(elbv2_stub, ec2_stub, alb=False, group=True)   # the ALB went, its security group not yet
        _one_look(elbv2_stub, ec2_stub, alb=False, group=False)  # gone (another line's ALB stays)
        now, sleeps = [0.0], []
        handler.wait_until_gone(elbv2, ec2, NS, 600, clock=lambda: now[0],
                                sleep=lambda s: (sleeps.append(s), now.__setitem__(0, now[0] + s)))
        elbv2_stub.assert_no_pending_responses()
        ec2_stub.assert_no_pending_responses()
    assert sleeps == [handler.POLL_SECONDS, handler.POLL_SECONDS]


def test_delete_fails_after_the_bound_naming_what_is_left() -> None:
    elbv2, ec2 = _clients()
    with Stubber(elbv2) as elbv2_stub, Stubber(ec2) as ec2_stub:
        for _ in range(3):
            _one_look(elbv2_stub, ec2_stub, alb=True, group=True)
        now = [0.0]
        with pytest.raises(TimeoutError) as info:
            handler.wait_until_gone(elbv2, ec2, NS, 40, clock=lambda: now[0],
                                    sleep=lambda s: now.__setitem__(0, now[0] + s))
    message = str(info.value)
    assert message.startswith(f"namespace {NS}: 3 load-balancer resource(s)") and "after 40 s" in message
    assert ALB in message and TG in message and "sg-0aaa" in message and OTHER not in message
    assert "keep the addons stack" in message


def test_create_and_update_wait_for_nothing() -> None:
    calls = []
    for request in ("Create", "Update"):
        answer = handler.on_event({"RequestType": request, "ResourceProperties": {"Namespace": NS, "TimeoutSeconds": "600"}},
                                  None, clients=lambda service: calls.append(service))
        assert answer == {"PhysicalResourceId": f"load-balancers-of-{NS}"}
    assert calls == []


def test_delete_never_waits_past_the_lambdas_own_end() -> None:
    seen = {}

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 300_000

    original = handler.wait_until_gone
    try:
        handler.wait_until_gone = lambda elbv2, ec2, namespace, timeout, cluster: seen.update(
            timeout=timeout, cluster=cluster)
        handler.on_event({"RequestType": "Delete", "ResourceProperties": {
            "Namespace": NS, "ClusterName": "kvcache-eks", "TimeoutSeconds": "600"}},
                         Context(), clients=lambda service: service)
    finally:
        handler.wait_until_gone = original
    assert seen == {"timeout": 240, "cluster": "kvcache-eks"}  # 300 s left, less a minute for the answer


def test_a_load_balancer_deleted_between_the_listing_and_its_tags_is_gone_not_an_error() -> None:
    """DescribeTags fails for the whole batch when one of its ARNs was deleted since the listing
    (LoadBalancerNotFound): asked again one by one, the deleted one is left out, the others counted."""
    elbv2, ec2 = _clients()
    with Stubber(elbv2) as elbv2_stub, Stubber(ec2) as ec2_stub:
        elbv2_stub.add_response("describe_load_balancers", {"LoadBalancers": [{"LoadBalancerArn": a} for a in (ALB, OTHER)]}, {})
        elbv2_stub.add_client_error("describe_tags", "LoadBalancerNotFound", "One or more load balancers not found",
                                    expected_params={"ResourceArns": [ALB, OTHER]})
        elbv2_stub.add_client_error("describe_tags", "LoadBalancerNotFound", "not found",
                                    expected_params={"ResourceArns": [ALB]})
        elbv2_stub.add_response("describe_tags", {"TagDescriptions": [_tags(OTHER, **{
            "elbv2.k8s.aws/cluster": "kvcache-eks", "ingress.k8s.aws/stack": f"{NS}/alb-other"})]}, {"ResourceArns": [OTHER]})
        elbv2_stub.add_response("describe_target_groups", {"TargetGroups": []}, {})
        ec2_stub.add_response("describe_security_groups", {"SecurityGroups": []},
                              {"Filters": [{"Name": "tag-key", "Values": ["elbv2.k8s.aws/cluster"]}]})
        assert handler.remaining(elbv2, ec2, NS, "kvcache-eks") == [OTHER]
        elbv2_stub.assert_no_pending_responses()


@pytest.mark.parametrize("tags, cluster, belongs", [
    ({"elbv2.k8s.aws/cluster": "kvcache-eks", "ingress.k8s.aws/stack": f"{NS}/alb-x"}, "kvcache-eks", True),
    # Another cluster's controller in a namespace of the same name: not ours, never waited for.
    ({"elbv2.k8s.aws/cluster": "other-eks", "ingress.k8s.aws/stack": f"{NS}/alb-x"}, "kvcache-eks", False),
    # A wait created before ClusterName existed (its delete has no ClusterName): any cluster.
    ({"elbv2.k8s.aws/cluster": "other-eks", "ingress.k8s.aws/stack": f"{NS}/alb-x"}, None, True),
])
def test_only_this_clusters_controller_counts(tags, cluster, belongs) -> None:
    assert handler.belongs_to(tags, NS, cluster) is belongs


@pytest.mark.parametrize("tags, belongs", [
    ({"elbv2.k8s.aws/cluster": "c", "ingress.k8s.aws/stack": f"{NS}/alb-x"}, True),
    ({"elbv2.k8s.aws/cluster": "c", "service.k8s.aws/stack": f"{NS}/svc"}, True),
    ({"elbv2.k8s.aws/cluster": "c", "ingress.k8s.aws/resource": f"{NS}/alb-x-svc:80"}, True),
    ({"elbv2.k8s.aws/cluster": "c", "ingress.k8s.aws/stack": f"{NS}-other/alb-x"}, False),
    ({"ingress.k8s.aws/stack": f"{NS}/alb-x"}, False),  # not made by the controller
])
def test_what_belongs_to_a_namespace(tags, belongs) -> None:
    assert handler.belongs_to(tags, NS) is belongs
