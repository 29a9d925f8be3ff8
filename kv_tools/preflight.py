"""Pre-deploy checks: is this account and region ready for ``cdk deploy`` of this config?

Synthesis is offline on purpose, so nothing at synth time proves that the pinned add-on
versions exist for the cluster's Kubernetes version, that the zones are real, or that the
account was bootstrapped. This module asks AWS, read-only, before a deploy does.

The checks are pure functions over the plain dicts the AWS APIs return (so tests feed them
recorded responses); :func:`run_preflight` is the thin layer that calls boto3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from platform_config import PlatformConfig

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
    the HyperPod minimums.

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
        results.append(CheckResult(f"add-on {name}", not problems, "; ".join(problems) or pinned))
    return results


def check_bootstrap(stacks_response: dict[str, Any] | None) -> CheckResult:
    """The CDK bootstrap stack exists (``cloudformation:DescribeStacks``); None if absent."""
    if not stacks_response or not stacks_response.get("Stacks"):
        return CheckResult("cdk bootstrap", False, f"stack {CDK_BOOTSTRAP_STACK} not found; run `cdk bootstrap`")
    status = stacks_response["Stacks"][0].get("StackStatus", "")
    ok = status.endswith("_COMPLETE") and "ROLLBACK" not in status and "DELETE" not in status
    return CheckResult("cdk bootstrap", ok, f"{CDK_BOOTSTRAP_STACK} is {status}")


def run_preflight(platform: PlatformConfig, session_factory: Callable[..., Any] | None = None) -> list[CheckResult]:
    """Run every check against AWS with standard credential resolution; read-only calls.

    Args:
        session_factory: returns a ``boto3.Session``-like object (tests inject one).
    """
    if session_factory is None:
        import boto3  # imported here so the pure checks need no AWS SDK

        session_factory = boto3.Session
    session = session_factory(region_name=platform.region)
    results = [check_account(platform, session.client("sts").get_caller_identity())]
    results.append(check_zones(platform, session.client("ec2").describe_availability_zones()))

    eks = session.client("eks")
    offered: dict[str, list[str]] = {}
    paginator = eks.get_paginator("describe_addon_versions")
    for name in pinned_addons(platform):
        for page in paginator.paginate(kubernetesVersion=platform.eks.version, addonName=name):
            for addon in page.get("addons", []):
                offered.setdefault(addon["addonName"], []).extend(
                    v["addonVersion"] for v in addon.get("addonVersions", []))
    results.extend(check_addon_versions(platform, offered))

    cloudformation = session.client("cloudformation")
    try:
        stacks = cloudformation.describe_stacks(StackName=CDK_BOOTSTRAP_STACK)
    except cloudformation.exceptions.ClientError:
        stacks = None
    results.append(check_bootstrap(stacks))
    return results
