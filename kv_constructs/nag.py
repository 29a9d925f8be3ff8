"""cdk-nag (AwsSolutions) acknowledgments, kept next to the constructs they are about.

cdk-nag 3 runs as a CDK *validation plugin* (``Validations.of(app).add_plugins(...)``): any
finding, warning or error, fails ``cdk synth``. A finding is silenced only by
``Validations.of(construct).acknowledge(Acknowledgment(id, reason))`` on the construct or one of
its ancestors, and the id must match exactly. Findings about IAM wildcards carry the offending
resource in the id, flattened from the CloudFormation intrinsic
(``AwsSolutions-IAM5[Resource::<LogicalId.Arn>/prefix/*]``), and logical ids are hashes, so this
module computes those ids from the same tokens the policy uses instead of hard-coding hashes.

Every helper takes a ``reason`` a reviewer can check. With
``AwsSolutionsChecks(write_suppressions_to_cloud_formation=True)`` (what ``app.py`` registers),
each acknowledgment is also written to the resource's template Metadata (``cdk_nag``), so the
reasons ship with the templates.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_eks_v2 as eks
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

PACK = "AwsSolutions"


def rule(rule_id: str) -> str:
    """``"IAM4"`` -> ``"AwsSolutions-IAM4"`` (ids already prefixed are returned unchanged)."""
    return rule_id if rule_id.startswith(f"{PACK}-") else f"{PACK}-{rule_id}"


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one finding id on ``scope`` and everything below it.

    Args:
        scope: construct the finding is reported on, or an ancestor of it.
        rule_id: ``"EC23"``, ``"AwsSolutions-EC23"`` or a finding id such as
            ``"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKS_CNI_Policy]"``.
        reason: why the finding is acceptable here; shown in reports and template metadata.

    Raises:
        ValueError: ``reason`` is shorter than 20 characters (a reason must be checkable).
    """
    acknowledge_all(scope, [rule_id], reason)


def acknowledge_all(scope: IConstruct, rule_ids: Iterable[str], reason: str) -> None:
    """:func:`acknowledge` of each of ``rule_ids`` on ``scope``, with one ``Validations.of`` call.

    Raises:
        ValueError: ``reason`` is shorter than 20 characters (a reason must be checkable).
    """
    ids = list(rule_ids)
    if not ids:
        return
    if len(reason.strip()) < 20:
        raise ValueError(f"cdk-nag acknowledgment of {ids[0]} needs a reason a reviewer can check")
    validations = Validations.of(scope)
    for rule_id in ids:
        validations.acknowledge(Acknowledgment(id=rule(rule_id), reason=reason))


def flatten_reference(stack: Stack, value: Any) -> str:
    """Render a (possibly token-bearing) string the way cdk-nag names it in finding ids.

    Mirrors cdk-nag 3.0.2 ``utils/flatten-cfn-reference``: ``Fn::GetAtt [L, A]`` -> ``<L.A>``,
    ``Ref L`` -> ``<L>``, ``Fn::Join`` concatenated, ``${X}`` in ``Fn::Sub`` -> ``<X>``.
    """
    return flatten_resolved(stack.resolve(value))


def flatten_resolved(resolved: Any) -> str:
    """:func:`flatten_reference` of a value already resolved (``Stack.resolve``): no jsii call."""

    def visit(node: Any) -> str:
        if node is None:
            return ""
        if isinstance(node, str):
            return node.replace("${", "<").replace("}", ">")
        if isinstance(node, dict):
            if "Fn::Join" in node:
                delimiter, items = node["Fn::Join"]
                return delimiter.join(visit(i) for i in items)
            if "Fn::Sub" in node:
                return visit(node["Fn::Sub"])
            if "Fn::GetAtt" in node:
                resource, attribute = node["Fn::GetAtt"]
                return f"<{visit(resource)}.{visit(attribute)}>"
            if "Fn::ImportValue" in node:
                return visit(node["Fn::ImportValue"])
            if "Ref" in node:
                return f"<{visit(node['Ref'])}>"
        return json.dumps(node, separators=(",", ":"))

    return visit(resolved)


def acknowledge_wildcards(
    scope: IConstruct,
    *,
    reason: str,
    actions: Iterable[str] = (),
    resources: Iterable[Any] = (),
) -> None:
    """Acknowledge ``AwsSolutions-IAM5`` findings for the given wildcard actions/resources.

    Args:
        scope: the role or policy (or an ancestor) whose statements hold the wildcards.
        reason: why each wildcard is needed (service without resource-level permissions, ...).
        actions: wildcard actions exactly as written in the policy, e.g. ``"eks:Describe*"``.
        resources: wildcard resources as passed to the policy (tokens allowed), e.g.
            ``bucket.arn_for_objects("lifecycle/*")`` or ``"*"``.
    """
    resources = list(resources)
    # One jsii call resolves every resource (each construct call is a round trip to Node).
    flat = [flatten_resolved(r) for r in Stack.of(scope).resolve(resources)] if resources else []
    acknowledge_all(scope, [f"IAM5[Action::{action}]" for action in actions]
                    + [f"IAM5[Resource::{f}]" for f in flat], reason)


def acknowledge_managed_policies(scope: IConstruct, policy_names: Iterable[str], reason: str) -> None:
    """Acknowledge ``AwsSolutions-IAM4`` for AWS managed policies (by name, e.g. ``AmazonEKS_CNI_Policy``).

    ``service-role/...`` names are accepted as written in the ARN.
    """
    acknowledge_all(scope, [f"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]" for name in policy_names],
                    reason)


# --- CDK-owned provider functions ----------------------------------------------------------------

#: Rules that CDK-generated provider Lambdas (custom-resource frameworks) trip by design: the
#: basic-execution managed policy (IAM4), ``*``-suffixed grants written by aws-cdk-lib (IAM5),
#: and a runtime pinned by the CDK release rather than by us (L1).
CDK_PROVIDER_RULES = ("IAM4", "IAM5", "L1")


def acknowledge_cdk_managed(scope: IConstruct, *, owner: str, rules: Iterable[str] = CDK_PROVIDER_RULES) -> None:
    """Acknowledge the findings of CDK-owned provider code below ``scope``, finding by finding.

    Runs the AwsSolutions pack over ``scope`` only and acknowledges each finding whose rule is
    in ``rules`` on the exact construct it was reported on, so nothing outside ``scope`` and
    no other rule is silenced. Call it *after* the provider is fully built (grants added).

    Args:
        scope: the CDK-generated construct (a provider, singleton function, kubectl handler).
        owner: what generates the code and why we accept it, e.g.
            ``"aws-cdk-lib BucketDeployment handler"``; becomes part of the reason.
        rules: rule ids (without pack prefix) that may be acknowledged.
    """
    allowed = tuple(rule(r) for r in rules)
    reason = (
        f"{owner}: code, runtime and IAM policy are generated and maintained by aws-cdk-lib, "
        "not by this project; the function only runs during CloudFormation deployments."
    )
    report = AwsSolutionsChecks().validate_scope(scope)
    by_path: dict[str, list[str]] = {}
    for violation in report.violations:
        name = violation.rule_name
        if name.split("[", 1)[0] not in allowed:
            continue
        for resource in violation.violating_resources:
            ids = by_path.setdefault(resource.construct_path, [])
            if name not in ids:
                ids.append(name)
    base = scope.node.path
    found: dict[str, IConstruct] = {base: scope}
    for path, ids in by_path.items():
        acknowledge_all(_find_below(base, path, found), ids, reason)


def _find_below(base: str, path: str, found: dict[str, IConstruct]) -> IConstruct:
    """The construct at absolute ``path``, at or below the scope at ``base`` (``found[base]``);
    ``found`` caches the prefixes walked (findings share them, and each step is a jsii call)."""
    if path != base and not path.startswith(f"{base}/"):
        raise ValueError(f"cdk-nag reported {path}, outside {base}")
    node, walked = found[base], base
    for part in [p for p in path[len(base):].split("/") if p]:
        walked = f"{walked}/{part}"
        if walked not in found:
            found[walked] = node.node.find_child(part)
        node = found[walked]
    return node


def suppress_kubectl_provider(cluster: eks.Cluster) -> None:
    """Acknowledge the findings of the kubectl handler that ``aws_eks_v2`` creates for ``cluster``.

    The handler (Lambda + custom-resource provider framework, generated by aws-cdk-lib) applies
    manifests and Helm charts for every stack that targets the cluster, and those stacks may
    grant it more (``HelmChart(chart_asset=...)`` adds read access to the asset bucket). So call
    this *after* every stack that uses the cluster is built; ``stacks.build_platform`` does.
    Calling it again later (say, from a stack added afterwards) is harmless.

    Raises:
        ValueError: the cluster has no kubectl provider.
    """
    provider = cluster.kubectl_provider
    if provider is None:
        raise ValueError(f"cluster {cluster.node.path} has no kubectl provider to acknowledge")
    acknowledge_cdk_managed(provider, owner="aws_eks_v2 kubectl provider (kubectl/helm Lambda handler)")
