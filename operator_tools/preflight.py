"""Pre-deploy checks: is this account and region ready for ``cdk deploy`` of this config?

Synthesis is offline on purpose, so nothing at synth time proves that the pinned add-on
versions exist for the cluster's Kubernetes version, that the add-ons accept the configuration
keys the platform sets, that a running cluster has a version HyperPod supports, that the zones
are real, that the account was bootstrapped, or that EBS would take a change of the Curvine
Primary's volume now. This module asks AWS, read-only, before a
deploy does.

The checks are pure functions over the plain dicts the AWS APIs return (so tests feed them
recorded responses); :func:`run_preflight` is the thin layer that calls boto3.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from k8s.image_digests import IMAGE_DIGESTS, curvine_images
from platform_config import PlatformConfig
from platform_config.addon_configuration import (
    INFERENCE_ADDON,
    INFERENCE_ADDON_KEYS,
    OMITTED_KEYS_WITH_REQUIRED_DEFAULT,
    configured_addons,
)
from platform_config.fields import is_digest_pinned
from platform_config.kubernetes_versions import HYPERPOD_KUBERNETES_VERSIONS, release
from platform_config.stack_names import platform_stack_name

#: Minimum add-on versions the inference add-on depends on (docs/sources.md §1, from the
#: HyperPod inference setup guide).
INFERENCE_DEPENDENCY_MINIMUMS = {
    "aws-mountpoint-s3-csi-driver": "v1.14.1-eksbuild.1",
    "aws-fsx-csi-driver": "v1.6.0-eksbuild.1",
    "metrics-server": "v0.7.2-eksbuild.4",
    "cert-manager": "v1.18.2-eksbuild.2",
}
#: HyperPod needs VPC CNI 1.18.3 or newer (HyperPod EKS prerequisites).
VPC_CNI_MINIMUM = "v1.18.3-eksbuild.1"
CDK_BOOTSTRAP_STACK = "CDKToolkit"

#: Node statuses during which an update of the HyperPod cluster must wait. AWS, "Updating SageMaker
#: HyperPod cluster configuration": "If deep health checks are running on the cluster, this API will
#: not function as expected [...] you should wait until the deep health checks finish"; the node's
#: status while they run is ``DeepHealthCheckInProgress`` (SageMaker API, ``ClusterInstanceStatus``,
#: in botocore's service model). docs/sources.md §15.
UPDATE_BLOCKING_NODE_STATUSES: tuple[str, ...] = ("DeepHealthCheckInProgress",)
#: Name of the check that guards updates of the HyperPod cluster (``scripts/preflight.py --only``).
HYPERPOD_UPDATE_CHECK = "hyperpod update"


@dataclass(frozen=True)
class CheckResult:
    """One row of the pass/fail table."""

    name: str
    ok: bool
    detail: str


def version_key(version: str) -> tuple[int, ...]:
    """Order EKS add-on versions: ``v1.18.2-eksbuild.2`` -> ``(1, 18, 2, 2)``.

    Raises:
        ValueError: the string has no numeric ``major.minor`` part.
    """
    core, _, build = version.lstrip("v").partition("-eksbuild.")
    parts = [int(p) for p in core.split(".") if p.isdigit()]
    if len(parts) < 2:
        raise ValueError(f"not an add-on version: {version!r}")
    return tuple(parts) + (int(build) if build.isdigit() else 0,)


def pinned_addons(platform: PlatformConfig) -> dict[str, str]:
    """Add-on name (as EKS spells it) -> pinned version, from ``versions.addons``."""
    return platform.versions.addons.model_dump(by_alias=True)


#: Name of the EKS support-calendar row (:func:`check_support_calendar`).
SUPPORT_CHECK = "EKS support"


def check_account(platform: PlatformConfig, caller_identity: dict[str, Any]) -> CheckResult:
    """The credentials in use belong to the configured account (``sts:GetCallerIdentity``)."""
    actual = caller_identity.get("Account")
    return CheckResult("account", actual == platform.account,
                       f"credentials are for {actual}, config says {platform.account}")


def check_zones(platform: PlatformConfig, zones_response: dict[str, Any]) -> CheckResult:
    """Every configured zone exists and is available (``ec2:DescribeAvailabilityZones``)."""
    available = {z["ZoneName"] for z in zones_response.get("AvailabilityZones", [])
                 if z.get("State") == "available"}
    missing = [z for z in platform.availability_zones if z not in available]
    detail = "all available" if not missing else f"not available in {platform.region}: {', '.join(missing)}"
    return CheckResult("availability zones", not missing, detail)


def check_addon_versions(platform: PlatformConfig,
                         versions_by_addon: dict[str, list[str]]) -> list[CheckResult]:
    """Each pinned add-on version is offered for the cluster's Kubernetes version and meets
    the HyperPod minimums; a passing row names the newest version offered above the pin, if any.

    Args:
        versions_by_addon: add-on name -> versions offered for ``eks.version``, as collected
            from ``eks:DescribeAddonVersions(kubernetesVersion=...)``.
    """
    results = []
    minimums = {**INFERENCE_DEPENDENCY_MINIMUMS, "vpc-cni": VPC_CNI_MINIMUM}
    for name, pinned in pinned_addons(platform).items():
        offered = versions_by_addon.get(name, [])
        problems = []
        if pinned not in offered:
            newest = max(offered, key=version_key) if offered else "none"
            problems.append(f"{pinned} not offered for Kubernetes {platform.eks.version} (newest: {newest})")
        if name in minimums and version_key(pinned) < version_key(minimums[name]):
            problems.append(f"{pinned} is below the required {minimums[name]}")
        newer = sorted((v for v in offered if version_key(v) > version_key(pinned)), key=version_key)
        detail = "; ".join(problems) or pinned
        if not problems and newer:
            # Not a failure: a pin is a choice; the report says what a bump would move to (issue 26).
            detail += f" (newer offered: {newer[-1]}{f' and {len(newer) - 1} more' if len(newer) > 1 else ''})"
        results.append(CheckResult(f"add-on {name}", not problems, detail))
    return results


def check_cluster_version(platform: PlatformConfig, cluster_response: dict[str, Any] | None) -> CheckResult:
    """The EKS cluster's Kubernetes version is one HyperPod supports and equals ``eks.version``.

    Args:
        cluster_response: ``eks:DescribeCluster`` of ``eks.cluster_name``; ``None`` when the cluster
            does not exist yet (then the configured version is what the first deploy creates).
    """
    supported = ", ".join(HYPERPOD_KUBERNETES_VERSIONS)
    wanted = platform.eks.version
    if cluster_response is None:
        ok = wanted in HYPERPOD_KUBERNETES_VERSIONS
        return CheckResult("cluster version", ok, f"{platform.eks.cluster_name} not created yet; eks.version "
                           f"{wanted} {'is' if ok else 'is not'} supported by HyperPod ({supported})")
    actual = cluster_response.get("cluster", {}).get("version", "?")
    problems = []
    if actual not in HYPERPOD_KUBERNETES_VERSIONS:
        problems.append(f"runs Kubernetes {actual}, which HyperPod does not support ({supported})")
    if actual != wanted:
        problems.append(f"runs Kubernetes {actual} but eks.version is {wanted}")
    return CheckResult("cluster version", not problems,
                       "; ".join(problems) or f"{platform.eks.cluster_name} runs {actual} (supported: {supported})")


def _resolve(schema: dict[str, Any], node: Any) -> dict[str, Any]:
    """Follow local ``$ref`` (``#/definitions/x``) until a schema object."""
    seen = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/"):
        target: Any = schema
        for part in node["$ref"][2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        node, seen = target, seen + 1
        if seen > 32:
            break
    return node if isinstance(node, dict) else {}


def _branches(schema: dict[str, Any], node: Any) -> list[dict[str, Any]]:
    """``node`` and, recursively, its ``allOf``/``anyOf``/``oneOf`` branches, ``$ref`` resolved."""
    node = _resolve(schema, node)
    found = [node]
    for combinator in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(combinator, []):
            found.extend(_branches(schema, branch))
    return found


def _children(schema: dict[str, Any], node: Any, key: str) -> list[dict[str, Any]] | None:
    """The schemas ``key`` may take under object ``node``; None if ``node`` does not declare it.

    Declared: named in ``properties``, matched by ``patternProperties``, or admitted by an explicit
    ``additionalProperties`` (true or a schema). An object schema that names no property at all
    (a free-form map such as ``podAnnotations``) admits every key.
    """
    found: list[dict[str, Any]] = []
    for branch in _branches(schema, node):
        properties = branch.get("properties", {})
        patterns = branch.get("patternProperties", {})
        extra = branch.get("additionalProperties")
        if key in properties:
            found.append(_resolve(schema, properties[key]))
        elif any(re.search(pattern, key) for pattern in patterns):
            found.extend(_resolve(schema, v) for pattern, v in patterns.items() if re.search(pattern, key))
        elif isinstance(extra, dict):
            found.append(_resolve(schema, extra))
        elif extra is True or (extra is None and not properties and not patterns
                               and not any(k in branch for k in ("allOf", "anyOf", "oneOf"))):
            found.append({})
    return found or None


def keys_missing_from_schema(schema: dict[str, Any], configuration: dict[str, Any]) -> list[str]:
    """Dotted paths of ``configuration`` keys that ``schema`` (JSON Schema) does not declare.

    A key counts as declared when a ``properties`` or ``patternProperties`` entry of the object
    (or of one of its ``allOf``/``anyOf``/``oneOf`` branches) admits it, or when the object admits
    any key (``additionalProperties`` true or a schema). An object that declares ``properties``
    and says nothing about others is treated as closed: a key it does not name is either
    rejected by EKS or ignored by the add-on, and both are worth knowing before a deploy.

    Args:
        schema: the add-on's configuration schema (parsed JSON Schema).
        configuration: the values the platform sets (nested dicts).

    Returns:
        Paths such as ``alb.ingressClassParams``, in ``configuration`` order; children of a
        missing key are not listed.
    """
    missing: list[str] = []

    def walk(node: dict[str, Any], values: dict[str, Any], prefix: str) -> None:
        for key, value in values.items():
            path = f"{prefix}{key}"
            children = _children(schema, node, key)
            if children is None:
                missing.append(path)
            elif isinstance(value, dict):
                walk({"anyOf": children}, value, f"{path}.")
    walk(schema, configuration, "")
    return missing


def check_addon_configuration(name: str, version: str, configuration: dict[str, Any],
                              response: dict[str, Any]) -> CheckResult:
    """Every key the platform sets on add-on ``name`` exists in that version's configuration schema.

    Args:
        configuration: what the stacks pass (:func:`platform_config.addon_configuration.configured_addons`).
        response: ``eks:DescribeAddonConfiguration(addonName=name, addonVersion=version)``; its
            ``configurationSchema`` is a JSON Schema document as a string (empty: no settings).
    """
    raw = response.get("configurationSchema") or ""
    label = f"add-on {name} configuration"
    if not raw:
        return CheckResult(label, False, f"{version} publishes no configuration schema; it accepts none of "
                           f"{', '.join(sorted(configuration))}")
    missing = keys_missing_from_schema(json.loads(raw), configuration)
    if missing:
        # A verified key the config can leave out (the explicit gateway "off" on an add-on version
        # from before the gateway): name the switch.
        fixes = sorted({key.left_out_by for key in INFERENCE_ADDON_KEYS if key.left_out_by and any(
            key.path == path or key.path.startswith(f"{path}.") for path in missing)})
        hint = f"; to leave it out set {', '.join(fixes)}" if fixes else ""
        return CheckResult(label, False, f"{version} schema lacks {', '.join(missing)}{hint}")
    return CheckResult(label, True, f"{version} schema has every key set")


_MISSING = object()


def _nested(path: str, leaf: Any = "?") -> dict[str, Any]:
    """``a.b.c`` -> ``{"a": {"b": {"c": leaf}}}``."""
    node: Any = leaf
    for part in reversed(path.split(".")):
        node = {part: node}
    return node


def _dig(values: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(values, dict) or part not in values:
            return _MISSING
        values = values[part]
    return values


def schema_default(schema: dict[str, Any], path: str) -> Any:
    """The default ``schema`` states for the dotted ``path`` when the key is left out.

    The outermost statement wins: an enclosing object's ``default`` that contains the path (it
    applies when the whole object is absent), else the ``default`` of the key itself.

    Returns:
        The default, or :data:`_MISSING` when the schema does not declare the path or states none.
    """
    parts = path.split(".")
    nodes: list[Any] = [schema]
    for depth, part in enumerate(parts):
        children = _children(schema, {"anyOf": nodes}, part)
        if children is None:
            return _MISSING
        for child in children:
            for branch in _branches(schema, child):
                if "default" in branch:
                    value = branch["default"] if depth == len(parts) - 1 else _dig(branch["default"], parts[depth + 1:])
                    if value is not _MISSING:
                        return value
        nodes = children
    return _MISSING


def check_left_out_keys(name: str, version: str, configuration: dict[str, Any],
                        response: dict[str, Any]) -> CheckResult:
    """What the add-on's schema says about the unverified keys the platform leaves out.

    Fails when a key of :data:`~platform_config.addon_configuration.OMITTED_KEYS_WITH_REQUIRED_DEFAULT`
    is left out while the schema declares it without the default the platform needs (today:
    ``inferenceGateway.enabled``, sent by default and left out only with
    ``inference_operator.gateway.set_in_addon: false``); the detail names the config switch that
    sends the key. Opt-in keys the schema does have are listed, so their switch can be
    turned on with evidence.

    Args:
        configuration: what the stacks pass for add-on ``name``.
        response: ``eks:DescribeAddonConfiguration`` of the pinned version (schema as a string).
    """
    label = f"add-on {name} keys left out"
    raw = response.get("configurationSchema") or ""
    schema = json.loads(raw) if raw else {}
    sent = {k.path for k in INFERENCE_ADDON_KEYS if _dig(configuration, k.path.split(".")) is not _MISSING}
    problems, available = [], []
    for path, (needed, switch) in OMITTED_KEYS_WITH_REQUIRED_DEFAULT.items():
        if path in sent or keys_missing_from_schema(schema, _nested(path)):
            continue
        default = schema_default(schema, path)
        if default != needed:
            stated = "states no default" if default is _MISSING else f"defaults to {json.dumps(default)}"
            problems.append(f"{version} schema has {path} and {stated}; the platform needs {json.dumps(needed)} "
                            f"and leaves it out: set {switch}")
    for key in INFERENCE_ADDON_KEYS:
        if not key.verified and key.path not in sent and not keys_missing_from_schema(schema, _nested(key.path)):
            available.append(f"{key.path} (opt in: {key.opt_in.replace('`', '')})")
    if problems:
        return CheckResult(label, False, "; ".join(problems))
    if available:
        return CheckResult(label, True, f"{version} schema also has {', '.join(available)}")
    return CheckResult(label, True, f"{version}: nothing left out that the schema declares")


def check_bootstrap(stacks_response: dict[str, Any] | None) -> CheckResult:
    """The CDK bootstrap stack exists (``cloudformation:DescribeStacks``); None if absent."""
    if not stacks_response or not stacks_response.get("Stacks"):
        return CheckResult("cdk bootstrap", False, (
            f"stack {CDK_BOOTSTRAP_STACK} not found; run `cdk bootstrap` with the execution policies "
            "scripts/bootstrap_policy.py prints (without them its role gets AdministratorAccess)"))
    status = stacks_response["Stacks"][0].get("StackStatus", "")
    ok = status.endswith("_COMPLETE") and "ROLLBACK" not in status and "DELETE" not in status
    return CheckResult("cdk bootstrap", ok, f"{CDK_BOOTSTRAP_STACK} is {status}")


# --- No update of the HyperPod cluster while deep health checks run (issue 19) ---------------------


@dataclass(frozen=True)
class NodeStatus:
    """One HyperPod node as ``sagemaker:DescribeClusterNode`` (or ``ListClusterNodes``) reports it.

    Attributes:
        node: the instance ID, or the logical ID of a node still being provisioned.
        group: its instance group; ``status``: ``ClusterInstanceStatusDetails.Status``;
        message: ``ClusterInstanceStatusDetails.Message`` ("" when absent).
    """

    node: str
    group: str
    status: str
    message: str = ""

    def describe(self) -> str:
        """``i-0abc (g6e-inference): DeepHealthCheckInProgress, <message>``."""
        return f"{self.node} ({self.group}): {self.status}" + (f", {self.message}" if self.message else "")


def _comparable(template: dict[str, Any]) -> dict[str, Any]:
    """A template without what changes no resource: metadata (``aws:cdk:path``, cdk-nag notes) and
    the ``AWS::CDK::Metadata`` resource."""
    resources = {lid: {k: v for k, v in r.items() if k != "Metadata"}
                 for lid, r in (template.get("Resources") or {}).items() if r.get("Type") != "AWS::CDK::Metadata"}
    rest = {k: v for k, v in template.items() if k not in ("Resources", "Metadata")}
    return {**rest, "Resources": resources}


def template_changes(synthesized: dict[str, Any], deployed: dict[str, Any]) -> list[str]:
    """What a deploy of ``synthesized`` over ``deployed`` would change, as short phrases.

    Any difference counts (a role replaced by the same deploy changes the cluster's ``ExecutionRole``
    without its properties' text changing), except resource metadata and ``AWS::CDK::Metadata``.

    Returns:
        ``["HyperPodCluster changes", "LifecycleScripts added", "Outputs change"]``; empty: no change.
    """
    new, old = _comparable(synthesized), _comparable(deployed)
    changes = []
    for lid in sorted(set(new["Resources"]) | set(old["Resources"])):
        if lid not in old["Resources"]:
            changes.append(f"{lid} added")
        elif lid not in new["Resources"]:
            changes.append(f"{lid} removed")
        elif new["Resources"][lid] != old["Resources"][lid]:
            changes.append(f"{lid} changes")
    for section in sorted((set(new) | set(old)) - {"Resources"}):
        if new.get(section) != old.get(section):
            changes.append(f"{section} change")
    return changes


def hyperpod_nodes(sagemaker: Any, cluster_name: str) -> list[NodeStatus] | None:
    """Every node of the HyperPod cluster with its status; ``None`` when the cluster does not exist.

    ``sagemaker:ListClusterNodes`` (paginated, ``IncludeNodeLogicalIds`` so nodes still being
    provisioned are listed too), then ``sagemaker:DescribeClusterNode`` of every node not
    ``Running`` for its current status and message (the API reference: "You can use
    DescribeClusterNode API to track progress of the deep health checks").
    """
    nodes: list[NodeStatus] = []
    try:
        for page in sagemaker.get_paginator("list_cluster_nodes").paginate(
                ClusterName=cluster_name, IncludeNodeLogicalIds=True):
            for summary in page.get("ClusterNodeSummaries", []):
                status = summary.get("InstanceStatus", {})
                node_id = summary.get("InstanceId") or summary.get("NodeLogicalId", "?")
                node = NodeStatus(node_id, summary.get("InstanceGroupName", "?"), status.get("Status", "?"),
                                  status.get("Message", ""))
                if node.status != "Running":
                    key = {"NodeId": summary["InstanceId"]} if summary.get("InstanceId") else \
                        {"NodeLogicalId": summary.get("NodeLogicalId", "")}
                    try:
                        details = sagemaker.describe_cluster_node(ClusterName=cluster_name, **key)["NodeDetails"]
                    except sagemaker.exceptions.ResourceNotFound:
                        # The node went between the two calls (replaced, scaled in): keep what the
                        # listing said, so a node listed in a deep health check still blocks (fail
                        # closed), rather than read "no such node" as "no such cluster".
                        details = {}
                    status = details.get("InstanceStatus", {})
                    node = NodeStatus(node_id, details.get("InstanceGroupName", node.group),
                                      status.get("Status", node.status), status.get("Message", node.message))
                nodes.append(node)
    except sagemaker.exceptions.ResourceNotFound:
        return None
    return nodes


def _deployed_template(cloudformation: Any, stack_name: str) -> dict[str, Any] | None:
    """The template ``stack_name`` was deployed with (``cloudformation:GetTemplate``); None: no such stack."""
    try:
        body = cloudformation.get_template(StackName=stack_name, TemplateStage="Original").get("TemplateBody") or {}
    except cloudformation.exceptions.ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise
    # botocore decodes a JSON body into a dict (its GetTemplate handler); a string is parsed here.
    return json.loads(body) if isinstance(body, str) else dict(body)


def check_hyperpod_update(platform: PlatformConfig, sagemaker: Any, cloudformation: Any,
                          synthesized: dict[str, Any] | None) -> CheckResult:
    """The deploy does not update the HyperPod cluster while deep health checks run on its nodes.

    Passes when the hyperpod stack does not exist yet (the deploy creates the cluster), when the
    synthesized template of that stack equals the deployed one (no update), when the cluster does
    not exist, or when no node is in :data:`UPDATE_BLOCKING_NODE_STATUSES`. Fails otherwise, naming
    every such node and its status: CloudFormation's UpdateCluster in that window can leave the stack
    ``UPDATE_FAILED`` or ``UPDATE_ROLLBACK_FAILED``.

    Args:
        sagemaker, cloudformation: boto3 clients (read-only calls: ``ListClusterNodes``,
            ``DescribeClusterNode``, ``GetTemplate``).
        synthesized: the hyperpod stack's template from the cloud assembly about to be deployed;
            ``None``: not known, so any deploy is taken to change the stack.
    """
    stack = platform_stack_name(platform.project, "hyperpod")
    cluster = platform.hyperpod.cluster_name
    deployed = _deployed_template(cloudformation, stack)
    if deployed is None:
        return CheckResult(HYPERPOD_UPDATE_CHECK, True, f"{stack} not deployed yet: the deploy creates {cluster}")
    if synthesized is None:
        reason = f"no cloud assembly given (--cloud-assembly), so the deploy is taken to change {stack}"
    else:
        changes = template_changes(synthesized, deployed)
        if not changes:
            return CheckResult(HYPERPOD_UPDATE_CHECK, True, f"{stack} does not change: no update of {cluster}")
        shown = ", ".join(changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
        reason = f"{stack} changes ({shown})"
    nodes = hyperpod_nodes(sagemaker, cluster)
    if nodes is None:
        return CheckResult(HYPERPOD_UPDATE_CHECK, True, f"{reason}; HyperPod cluster {cluster} not found")
    blocking = [n for n in nodes if n.status in UPDATE_BLOCKING_NODE_STATUSES]
    if blocking:
        return CheckResult(HYPERPOD_UPDATE_CHECK, False, (
            f"{reason}, but deep health checks run on {len(blocking)} node(s) of {cluster}: "
            f"{'; '.join(n.describe() for n in blocking)}. UpdateCluster does not work while they run (AWS, "
            f"'Updating SageMaker HyperPod cluster configuration'), and the stack could end UPDATE_FAILED or "
            f"UPDATE_ROLLBACK_FAILED: deploy again once they finish (InstanceStress takes about 2 h per node)"))
    others = [n for n in nodes if n.status != "Running"]
    note = f"; not Running: {'; '.join(n.describe() for n in others)}" if others else ""
    return CheckResult(HYPERPOD_UPDATE_CHECK, True,
                       f"{reason}; no deep health checks on the {len(nodes)} node(s) of {cluster}{note}")


# --- Edits of the Curvine Primary's EBS volume that EBS would refuse (issue 26 item 5) ------------

#: Name of the Primary-volume row (:func:`check_primary_volume_edit`).
PRIMARY_VOLUME_CHECK = "Curvine Primary volume"
#: Logical ID of the volume in the hyperpod stack (``kv_constructs.CurvinePrimaryVolume.LOGICAL_ID``,
#: pinned there; a test holds the two equal, this module does not import the CDK).
PRIMARY_VOLUME_LOGICAL_ID = "CurvinePrimaryVolume"
#: Hours after the start of a modification during which the volume is not modified again. AWS,
#: ModifyVolume (EC2 API reference, docs.amazonaws.cn copy) and the EBS user guide, "Modify a volume
#: using Amazon EBS Elastic Volumes": "After modifying a volume, you must wait at least six hours and
#: ensure that the volume is in the in-use or available state before you can modify the same volume."
#: The ModifyVolume text in botocore 1.44.8's EC2 model says instead: wait until the last modification
#: is ``completed``, at most four modifications in a rolling 24 hours. DescribeVolumesModifications
#: returns only the most recent modification, so the four cannot be counted: the six hours are kept
#: (docs/sources.md §25).
VOLUME_MODIFICATION_COOLDOWN = dt.timedelta(hours=6)
#: Volume states in which ModifyVolume accepts a modification (both texts above).
MODIFIABLE_VOLUME_STATES: tuple[str, ...] = ("in-use", "available")
#: Modification states of a modification still under way (``VolumeModification.ModificationState``
#: is modifying | optimizing | completed | failed): none may start until it is ``completed``.
UNFINISHED_MODIFICATION_STATES: tuple[str, ...] = ("modifying", "optimizing")
#: Error code of DescribeVolumesModifications for a volume that was never modified ("Modification for
#: volume 'vol-...' does not exist"; awslabs/aws-sdk-rust issue 1346, 2025-08): no modification.
NEVER_MODIFIED_ERROR = "InvalidVolumeModification.NotFound"
#: Error code of DescribeVolumes for an ID that names no volume (EC2 API reference, "Error codes").
VOLUME_NOT_FOUND_ERROR = "InvalidVolume.NotFound"


@dataclass(frozen=True)
class VolumeSettings:
    """What ModifyVolume can change on the Primary's volume.

    Attributes:
        size_gib: size in GiB; volume_type: ``gp3`` or ``io2``; iops: provisioned IOPS;
        throughput_mibps: gp3 throughput in MiB/s (None for io2, which has no such setting).
    """

    size_gib: int
    volume_type: str
    iops: int | None
    throughput_mibps: int | None

    def changes_from(self, old: "VolumeSettings") -> list[str]:
        """``["size 100 GiB -> 200 GiB", "type gp3 -> io2", "throughput 125 MiB/s -> none"]``: what
        differs from ``old``."""
        shown = lambda value, unit: "none" if value is None else f"{value}{unit}"  # noqa: E731
        found = []
        for label, unit, new_value, old_value in (
                ("size", " GiB", self.size_gib, old.size_gib), ("type", "", self.volume_type, old.volume_type),
                ("IOPS", "", self.iops, old.iops), ("throughput", " MiB/s", self.throughput_mibps, old.throughput_mibps)):
            if new_value != old_value:
                found.append(f"{label} {shown(old_value, unit)} -> {shown(new_value, unit)}")
        return found


def configured_volume(platform: PlatformConfig) -> VolumeSettings | None:
    """The Primary volume ``curvine.primary_volume`` asks for; None when Curvine is off."""
    if not platform.curvine.enabled:
        return None
    v = platform.curvine.primary_volume
    return VolumeSettings(v.size_gib, v.volume_type, v.iops, v.throughput_mibps if v.volume_type == "gp3" else None)


def deployed_volume(template: dict[str, Any]) -> VolumeSettings | None:
    """The volume's settings in a deployed hyperpod template (``Size``, ``VolumeType``, ``Iops``,
    ``Throughput`` of :data:`PRIMARY_VOLUME_LOGICAL_ID`): what CloudFormation compares the new
    template with. None when the template has no such volume."""
    resource = (template.get("Resources") or {}).get(PRIMARY_VOLUME_LOGICAL_ID)
    if not resource or resource.get("Type") != "AWS::EC2::Volume":
        return None
    props = resource.get("Properties") or {}
    number = lambda key: int(props[key]) if key in props else None  # noqa: E731 - the template may quote numbers
    return VolumeSettings(number("Size") or 0, str(props.get("VolumeType", "gp2")), number("Iops"), number("Throughput"))


def volume_edit_problems(wanted: VolumeSettings, volume: dict[str, Any], modification: dict[str, Any] | None,
                         now: dt.datetime) -> list[str]:
    """Why EBS would refuse to modify ``volume`` to ``wanted`` now; empty: it would not.

    Args:
        wanted: the settings the deploy sets.
        volume: the volume as ``ec2:DescribeVolumes`` returns it (``Size`` GiB, ``State``).
        modification: its most recent modification as ``ec2:DescribeVolumesModifications`` returns
            it (``ModificationState``, ``StartTime``, ``Progress``), or None if never modified.
        now: the current time, timezone-aware (UTC).

    Rules (sources in docs/sources.md §25): no smaller size (EBS does not support sizing down;
    CloudFormation, AWS::EC2::Volume); a volume ``in-use`` or ``available``; the last modification
    ``completed`` (not ``modifying`` or ``optimizing``); :data:`VOLUME_MODIFICATION_COOLDOWN` since
    the last modification started.
    """
    problems = []
    size = volume.get("Size")
    if isinstance(size, int) and wanted.size_gib < size:
        problems.append(f"size {wanted.size_gib} GiB is below the volume's {size} GiB, and EBS volumes cannot "
                        f"shrink: set curvine.primary_volume.size_gib to {size} or more")
    state = volume.get("State", "?")
    if state not in MODIFIABLE_VOLUME_STATES:
        problems.append(f"the volume is {state}; EBS modifies only a volume that is "
                        f"{' or '.join(MODIFIABLE_VOLUME_STATES)}")
    if modification:
        mod_state = modification.get("ModificationState", "?")
        started = modification.get("StartTime")
        when = started.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if isinstance(started, dt.datetime) else "?"
        if mod_state in UNFINISHED_MODIFICATION_STATES:
            progress = modification.get("Progress")
            problems.append(f"its last modification (started {when}) is still {mod_state}"
                            f"{f' ({progress}%)' if progress is not None else ''}; EBS takes no other until it is completed")
        if isinstance(started, dt.datetime) and now - started < VOLUME_MODIFICATION_COOLDOWN:
            ready = (started + VOLUME_MODIFICATION_COOLDOWN).astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            problems.append(f"its last modification started {when}, less than "
                            f"{VOLUME_MODIFICATION_COOLDOWN.seconds // 3600} hours ago: deploy this change after {ready}")
    return problems


def check_primary_volume_edit(platform: PlatformConfig, cloudformation: Any, ec2: Any,
                              now: dt.datetime) -> CheckResult:
    """The deploy does not ask EBS for a change of the Curvine Primary's volume that EBS would refuse.

    CloudFormation calls ModifyVolume when the volume's ``Size``, ``VolumeType``, ``Iops`` or
    ``Throughput`` in the template changes. A refused call fails the hyperpod stack's update and rolls
    back everything else it changed (the HyperPod cluster with it). Passes when the hyperpod stack or
    the volume does not exist yet (the deploy creates it), when Curvine is off, or when the configured
    settings equal the deployed template's; otherwise fails with every reason of
    :func:`volume_edit_problems`.

    Args:
        cloudformation, ec2: boto3 clients (read-only calls: ``GetTemplate``, ``DescribeStackResource``,
            ``DescribeVolumes``, ``DescribeVolumesModifications``).
        now: the current time, timezone-aware.
    """
    wanted = configured_volume(platform)
    if wanted is None:
        return CheckResult(PRIMARY_VOLUME_CHECK, True, "curvine.enabled is false: no Primary volume")
    stack = platform_stack_name(platform.project, "hyperpod")
    deployed = _deployed_template(cloudformation, stack)
    current = deployed_volume(deployed) if deployed is not None else None
    if current is None:
        where = f"{stack} not deployed yet" if deployed is None else f"{stack} has no {PRIMARY_VOLUME_LOGICAL_ID}"
        return CheckResult(PRIMARY_VOLUME_CHECK, True, f"{where}: the deploy creates the volume")
    changes = wanted.changes_from(current)
    if not changes:
        return CheckResult(PRIMARY_VOLUME_CHECK, True, f"no change ({wanted.size_gib} GiB {wanted.volume_type})")
    resource = cloudformation.describe_stack_resource(StackName=stack, LogicalResourceId=PRIMARY_VOLUME_LOGICAL_ID)
    volume_id = resource["StackResourceDetail"].get("PhysicalResourceId", "")
    try:
        volumes = ec2.describe_volumes(VolumeIds=[volume_id]).get("Volumes", [])
    except ec2.exceptions.ClientError as exc:  # EC2 answers an unknown ID with an error, not an empty list
        if exc.response.get("Error", {}).get("Code") != VOLUME_NOT_FOUND_ERROR:
            raise
        volumes = []
    if not volumes:
        return CheckResult(PRIMARY_VOLUME_CHECK, False, f"{', '.join(changes)}, but {volume_id} of {stack} was not "
                           "found: the update would fail; see docs/l2-cache.md, \"Recovering the Primary\"")
    try:
        modifications = ec2.describe_volumes_modifications(VolumeIds=[volume_id]).get("VolumesModifications", [])
    except ec2.exceptions.ClientError as exc:
        # A volume never modified is an error, not an empty list (awslabs/aws-sdk-rust#1346).
        if exc.response.get("Error", {}).get("Code") != NEVER_MODIFIED_ERROR:
            raise
        modifications = []
    latest = max(modifications, key=lambda m: m.get("StartTime") or dt.datetime.min.replace(tzinfo=dt.timezone.utc),
                 default=None)
    problems = volume_edit_problems(wanted, volumes[0], latest, now)
    if problems:
        return CheckResult(PRIMARY_VOLUME_CHECK, False, (
            f"{volume_id}: {', '.join(changes)}, which EBS would refuse: {'; '.join(problems)} "
            "(the stack update would fail and roll back; docs/day-two.md)"))
    return CheckResult(PRIMARY_VOLUME_CHECK, True, f"{volume_id}: {', '.join(changes)} (EBS allows it now)")


#: Days before the end of standard support from which the support check says it is near.
SUPPORT_NOTICE_DAYS = 60


def check_support_calendar(platform: PlatformConfig, today: dt.date) -> CheckResult:
    """Where ``eks.version`` stands in the EKS support calendar (its row of
    :data:`platform_config.kubernetes_versions.KUBERNETES_RELEASES`), against ``eks.support_type``.

    Fails only when the cluster would be upgraded by EKS itself: ``STANDARD`` within
    :data:`SUPPORT_NOTICE_DAYS` of (or past) the end of standard support, or any type past the end
    of extended support. Otherwise passes, saying when extended support (and its price) starts.
    """
    row = release(platform.eks.version)
    kind = platform.eks.support_type
    end, last = row.standard_support_end, row.extended_support_end
    if today > last:
        return CheckResult(SUPPORT_CHECK, False, f"Kubernetes {row.version}: extended support ended {last}; EKS "
                           "upgrades the control plane by itself: upgrade now (docs/day-two.md)")
    if kind == "STANDARD" and (end - today).days <= SUPPORT_NOTICE_DAYS:
        return CheckResult(SUPPORT_CHECK, False, (
            f"Kubernetes {row.version}: standard support {'ended' if today > end else 'ends'} {end}, and "
            f"eks.support_type STANDARD lets EKS upgrade the control plane then, possibly past HyperPod's versions "
            f"({', '.join(HYPERPOD_KUBERNETES_VERSIONS)}); upgrade first, or set EXTENDED (docs/day-two.md)"))
    if today > end:
        return CheckResult(SUPPORT_CHECK, True, (
            f"Kubernetes {row.version}: in extended support since {end} (until {last}): the cluster is billed "
            "at the extended-support price; plan the upgrade (docs/day-two.md)"))
    return CheckResult(SUPPORT_CHECK, True, (
        f"Kubernetes {row.version}: standard support until {end} ({(end - today).days} days), then "
        + ("extended support (its price) until " + str(last) if kind == "EXTENDED" else "EKS upgrades it")))


#: Name of the check of the images of the Curvine namespace (:func:`check_image_digests`).
IMAGE_DIGESTS_CHECK = "image digests"


def check_image_digests(platform: PlatformConfig) -> CheckResult:
    """Which images of the privileged Curvine namespace are still pinned by tag, and the command that
    resolves each (digests need registry access, which synth does not have: docs/security.md,
    "Threat model: privileged Curvine pods").

    Passes either way (the example config keeps tags); the detail says whether the admission
    policy ``curvine-image-digests`` is rendered. With ``versions.images.require_digests`` a tag
    never gets this far: the config refuses it.
    """
    images = curvine_images(platform)
    tags = {field: image for field, image in images.items() if not is_digest_pinned(image)}
    if not tags:
        return CheckResult(IMAGE_DIGESTS_CHECK, True, (
            f"every image of namespace {platform.curvine.namespace} is pinned by digest: "
            f"{IMAGE_DIGESTS} admits only those"))
    resolve = "; ".join(f"versions.images.{field}: crane digest {image}" for field, image in tags.items())
    return CheckResult(IMAGE_DIGESTS_CHECK, True, (
        f"{len(tags)} of {len(images)} images of namespace {platform.curvine.namespace} pinned by tag, so "
        f"{IMAGE_DIGESTS} is not rendered; resolve each and write <image>@sha256:<digest> back, then set "
        f"versions.images.require_digests: true ({resolve})"))


#: Name of the check of the Helm charts installed from a repository (:func:`check_chart_digests`).
CHART_DIGESTS_CHECK = "chart digests"


def check_chart_digests(platform: PlatformConfig) -> CheckResult:
    """Which Helm charts the platform installs by version only (fetched from their repository at
    deploy time), and the command that pins them (docs/security.md, "Helm charts by digest").

    Passes either way (the example config pins by version: its repositories are not reachable where
    it was written); with ``versions.charts.require_digests`` a chart without a digest never gets this
    far: the config refuses it.
    """
    pins = platform.helm_chart_pins()
    loose = [f"{field} ({pin.chart} {pin.version})" for field, pin in pins.items() if pin.digest is None]
    if not loose:
        return CheckResult(CHART_DIGESTS_CHECK, True, (
            f"every chart installed from a repository ({len(pins)}) is pinned by digest: synthesis installs its "
            "committed archive, checked against it"))
    return CheckResult(CHART_DIGESTS_CHECK, True, (
        f"{len(loose)} of {len(pins)} charts installed by version only, from their repository at deploy time: "
        f"{'; '.join(loose)}; pin them with `scripts/vendor_chart.py`, commit the archives, set each printed "
        "digest, then versions.charts.require_digests: true"))


def run_preflight(platform: PlatformConfig, session_factory: Callable[..., Any] | None = None, *,
                  hyperpod_template: dict[str, Any] | None = None, only: str | None = None) -> list[CheckResult]:
    """Run every check against AWS with standard credential resolution; read-only calls.

    Args:
        session_factory: returns a ``boto3.Session``-like object (tests inject one).
        hyperpod_template: the hyperpod stack's synthesized template (``cdk.out``), for
            :func:`check_hyperpod_update`; ``None``: any deploy is taken to change that stack.
        only: :data:`HYPERPOD_UPDATE_CHECK` runs that check alone (CI, right before the hyperpod stack).
    """
    if session_factory is None:
        import boto3  # imported here so the pure checks need no AWS SDK

        session_factory = boto3.Session
    session = session_factory(region_name=platform.region)
    update_check = lambda: check_hyperpod_update(  # noqa: E731
        platform, session.client("sagemaker"), session.client("cloudformation"), hyperpod_template)
    if only == HYPERPOD_UPDATE_CHECK:
        return [update_check()]
    if only is not None:
        raise ValueError(f"unknown check {only!r}; allowed: {HYPERPOD_UPDATE_CHECK!r}")
    results = [check_account(platform, session.client("sts").get_caller_identity())]
    results.append(check_zones(platform, session.client("ec2").describe_availability_zones()))

    eks = session.client("eks")
    offered: dict[str, list[str]] = {}
    paginator = eks.get_paginator("describe_addon_versions")
    pinned = pinned_addons(platform)
    for name in pinned:
        for page in paginator.paginate(kubernetesVersion=platform.eks.version, addonName=name):
            for addon in page.get("addons", []):
                offered.setdefault(addon["addonName"], []).extend(
                    v["addonVersion"] for v in addon.get("addonVersions", []))
    results.extend(check_addon_versions(platform, offered))

    for name, configuration in configured_addons(platform).items():
        try:
            response = eks.describe_addon_configuration(addonName=name, addonVersion=pinned[name])
        except eks.exceptions.ClientError as exc:  # e.g. the version does not exist
            results.append(CheckResult(f"add-on {name} configuration", False, f"schema not readable: {exc}"))
            continue
        results.append(check_addon_configuration(name, pinned[name], configuration, response))
        if name == INFERENCE_ADDON and response.get("configurationSchema"):
            results.append(check_left_out_keys(name, pinned[name], configuration, response))

    try:
        cluster = eks.describe_cluster(name=platform.eks.cluster_name)
    except eks.exceptions.ResourceNotFoundException:
        cluster = None
    results.append(check_cluster_version(platform, cluster))
    results.append(check_support_calendar(platform, dt.date.today()))
    if platform.curvine.enabled:
        results.append(check_image_digests(platform))
    results.append(check_chart_digests(platform))

    cloudformation = session.client("cloudformation")
    try:
        stacks = cloudformation.describe_stacks(StackName=CDK_BOOTSTRAP_STACK)
    except cloudformation.exceptions.ClientError:
        stacks = None
    results.append(check_bootstrap(stacks))
    results.append(update_check())
    results.append(check_primary_volume_edit(platform, cloudformation, session.client("ec2"),
                                             dt.datetime.now(dt.timezone.utc)))
    return results
