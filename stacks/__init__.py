"""The platform's CloudFormation stacks and how they are wired together.

``build_platform(app, project)`` creates, in deployment order::

    {project}-network -> {project}-eks -> {project}-hyperpod -> {project}-addons
        -> {project}-l2-cache -> {project}-observability (when ``observability.enabled``)
                              -> {project}-line-<name> (one per business line)

The observability stack and the line stacks depend on l2-cache (and what it depends on), not
on each other: observability deploys right after l2-cache, in parallel with the lines (its
scrape jobs select the lines' namespaces, which need not exist yet). An autoscaling line is the
exception: its triggers query the observability stack's Prometheus workspace, whose ID its stack
imports, so it deploys after observability.

Every stack gets the explicit environment from config (account, region) and availability
zones are passed explicitly, so synthesis needs no AWS credentials and makes no lookups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from platform_config.runtime import prepare_jsii_node

prepare_jsii_node()  # before aws_cdk starts jsii's Node process (see platform_config/runtime.py)

import aws_cdk as cdk  # noqa: E402
from aws_cdk import Validations

from kv_constructs import nag
from kv_constructs.helm_charts import verified_chart_dir
from platform_config import ConfigError, ConfigProblem, ProjectConfig
from platform_config.loader import PLATFORM_FILE
from platform_config.stack_names import PROJECT_TAG, stack_ids
from stacks.addons_stack import AddonsStack
from stacks.business_line_stack import BusinessLineStack
from stacks.cluster_stack import ClusterStack
from stacks.hyperpod_stack import HyperPodStack, curvine_volume_props, dependency_chart_dir
from stacks.l2_cache_stack import L2CacheStack
from stacks.network_stack import NetworkStack
from stacks.observability_stack import ObservabilityStack

__all__ = [
    "AddonsStack",
    "BusinessLineStack",
    "ClusterStack",
    "HyperPodStack",
    "L2CacheStack",
    "NetworkStack",
    "ObservabilityStack",
    "PlatformStacks",
    "build_platform",
    "add_nag_checks",
    "cdk_json_context",
    "stack_ids",
]

#: Repository root (where cdk.json lives).
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class PlatformStacks:
    """The stacks of one platform, as built by :func:`build_platform`."""

    network: NetworkStack
    cluster: ClusterStack
    hyperpod: HyperPodStack
    addons: AddonsStack
    l2_cache: L2CacheStack
    business_lines: dict[str, BusinessLineStack]
    #: Metrics, alerts, Grafana (None when ``observability.enabled`` is false).
    observability: ObservabilityStack | None = None

    def all(self) -> list[cdk.Stack]:
        """Every stack, in a deployment order: platform stacks, observability (needs only l2-cache), lines."""
        extra = [self.observability] if self.observability is not None else []
        return [self.network, self.cluster, self.hyperpod, self.addons, self.l2_cache, *extra,
                *self.business_lines.values()]


def cdk_json_context(path: Path = REPO_ROOT / "cdk.json") -> dict[str, Any]:
    """The ``context`` block of ``cdk.json`` (feature flags).

    The CDK CLI passes it to the app; plain ``python app.py`` runs (tests, benchmarks) do not,
    so :func:`new_app` feeds it in explicitly and every run sees the same flags.
    """
    return dict(json.loads(path.read_text(encoding="utf-8")).get("context", {}))


#: Context the CDK CLI sets on every ``cdk synth`` (``--path-metadata``, on by default); set it
#: for plain-Python runs too so tests and benchmarks synthesize the same templates as the CLI.
CLI_DEFAULT_CONTEXT = {"aws:cdk:enable-path-metadata": True}


def new_app(**kwargs: Any) -> cdk.App:
    """A ``cdk.App`` with the feature flags of ``cdk.json`` (CLI context still takes precedence)."""
    context = {**CLI_DEFAULT_CONTEXT, **cdk_json_context(), **kwargs.pop("context", {})}
    return cdk.App(context=context, **kwargs)


def add_nag_checks(app: cdk.App) -> None:
    """Register cdk-nag's AwsSolutions pack as a validation plugin: any finding fails synth.

    Acknowledgments are written into template metadata (``cdk_nag``) as an audit trail.
    """
    from cdk_nag import AwsSolutionsChecks

    Validations.of(app).add_plugins(AwsSolutionsChecks(app, write_suppressions_to_cloud_formation=True))


def _preflight(project: ProjectConfig) -> None:
    """Checks that need construct-level knowledge, done before any construct exists.

    Raises:
        ConfigError: naming ``platform.yaml`` and the field (e.g. EBS limits of the Curvine volume, a
            Helm chart archive that is missing or does not match its ``digest``).
    """
    platform_file = str(project.config_dir / PLATFORM_FILE)
    chart = project.platform.hyperpod.dependency_chart
    if chart is not None:
        try:
            dependency_chart_dir(chart)
        except ValueError as exc:
            raise ConfigError([ConfigProblem(platform_file, "hyperpod.dependency_chart.path", str(exc), chart.path)]) from None
    for field, pin in project.platform.helm_chart_pins().items():
        if pin.digest is not None:
            try:
                verified_chart_dir(pin)
            except ValueError as exc:
                raise ConfigError([ConfigProblem(platform_file, f"{field}.digest", str(exc), pin.digest)]) from None
    if project.platform.curvine.enabled:
        try:
            curvine_volume_props(project.platform)
        except ValueError as exc:
            message = str(exc)
            field = message.split(" ", 1)[0]
            raise ConfigError([ConfigProblem(platform_file, f"curvine.primary_volume.{field}", message)]) from None


def build_platform(app: cdk.App, project: ProjectConfig) -> PlatformStacks:
    """Create every stack of ``project`` in ``app`` and wire their dependencies.

    Args:
        app: the CDK app (use :func:`new_app` for the cdk.json feature flags).
        project: validated config from ``platform_config.load_project``.

    Returns:
        :class:`PlatformStacks`.

    Raises:
        ConfigError: a value passes the config schema but breaks an AWS limit the constructs
            check (raised before any construct is created).
    """
    _preflight(project)
    platform = project.platform
    env = cdk.Environment(account=platform.account, region=platform.region)
    ids = stack_ids(project)
    tags = {PROJECT_TAG: platform.project, **platform.tags}

    def stack_kwargs(role: str, description: str) -> dict[str, Any]:
        return {"env": env, "description": description, "tags": tags, "stack_name": ids[role]}

    network = NetworkStack(app, ids["network"], platform=platform,
                           **stack_kwargs("network", "Tiered KV cache: VPC, subnets, endpoints, shared security group"))
    cluster = ClusterStack(
        app, ids["eks"], platform=platform, vpc=network.vpc, private_subnets=network.private_subnets,
        system_subnet=network.hyperpod_subnet, security_group=network.security_group,
        **stack_kwargs("eks", "Tiered KV cache: EKS cluster orchestrating HyperPod"))
    hyperpod = HyperPodStack(
        app, ids["hyperpod"], platform=platform, cluster=cluster.cluster, vpc=network.vpc,
        hyperpod_subnet=network.hyperpod_subnet, security_group=network.security_group,
        **stack_kwargs("hyperpod", "Tiered KV cache: HyperPod cluster (L1 Tiered Storage) and Curvine Primary volume"))
    addons = AddonsStack(
        app, ids["addons"], platform=platform, business_lines=project.business_lines, cluster=cluster.cluster,
        hyperpod_cluster_arn=hyperpod.hyperpod_cluster.cluster_arn,
        **stack_kwargs("addons", "Tiered KV cache: EKS add-ons and the HyperPod inference operator"))
    l2_cache = L2CacheStack(
        app, ids["l2-cache"], platform=platform, cluster=cluster.cluster, curvine_volume=hyperpod.curvine_volume,
        **stack_kwargs("l2-cache", "Tiered KV cache: L2 tier (Curvine on the GPU nodes' NVMe)"))
    # With Curvine disabled the L2 stack may hold no resources; the CDK CLI skips deploying an
    # empty stack, so CloudFormation's "Resources must be non-empty" (F0001) does not apply.
    Validations.of(l2_cache).acknowledge(cdk.Acknowledgment(
        id="CloudFormation-Validate::F0001",
        reason="An empty L2 stack (Curvine disabled) is skipped by 'cdk deploy', never sent to CloudFormation.",
    ))
    observability: ObservabilityStack | None = None
    if platform.observability.enabled:
        observability = ObservabilityStack(
            app, ids["observability"], platform=platform, business_lines=project.business_lines,
            cluster=cluster.cluster, vpc=network.vpc, subnets=network.private_subnets,
            keda_role=addons.keda_role.role,
            **stack_kwargs("observability", "Tiered KV cache: metrics (AMP + managed scraper), alerts, Grafana"))
    lines: dict[str, BusinessLineStack] = {}
    for line in project.business_lines:
        # An autoscaling line's triggers query the observability stack's workspace: its stack imports
        # the workspace ID and so deploys after that stack (a fixed line does not wait for it).
        workspace_id = (observability.workspace.attr_workspace_id
                        if observability is not None and line.autoscaling is not None else None)
        stack = BusinessLineStack(
            app, ids[f"line-{line.name}"], platform=platform, line=line, cluster=cluster.cluster,
            policy_engine=l2_cache.kyverno, inference_operator=addons.inference_operator,
            teardown_service_token=addons.teardown_waiter.service_token, prometheus_workspace_id=workspace_id,
            **stack_kwargs(f"line-{line.name}", f"Tiered KV cache: business line {line.name}"))
        lines[line.name] = stack

    # Order that references alone do not imply (e.g. an add-on needs HyperPod nodes to run on,
    # the L2 tier needs the EBS CSI driver, a line needs the operator and the L2 tier).
    cluster.add_stack_dependency(network, "EKS runs in the VPC")
    hyperpod.add_stack_dependency(cluster, "HyperPod is orchestrated by the EKS cluster")
    addons.add_stack_dependency(hyperpod, "add-ons run on HyperPod nodes and reference the HyperPod cluster")
    l2_cache.add_stack_dependency(addons, "the L2 tier needs the EBS CSI driver and the operator's CRDs")
    for stack in lines.values():
        stack.add_stack_dependency(addons, "a line's endpoint is reconciled by the inference operator")
        stack.add_stack_dependency(l2_cache, "a line mounts the L2 tier")
    if observability is not None:
        observability.add_stack_dependency(l2_cache, "Curvine and Kyverno exist before they are scraped")

    # Last: stacks above may have granted the kubectl handler more (e.g. reading chart assets).
    nag.suppress_kubectl_provider(cluster.cluster)
    return PlatformStacks(network=network, cluster=cluster, hyperpod=hyperpod, addons=addons,
                          l2_cache=l2_cache, business_lines=lines, observability=observability)
