"""One stack per business line: its chart applied through the cluster's kubectl provider.

Contract used by ``stacks.build_platform``:
    BusinessLineStack(scope, construct_id, *, platform: PlatformConfig, line: BusinessLineConfig,
                      cluster: eks_v2.Cluster, policy_engine: Construct | None = None,
                      inference_operator: Construct | None = None,
                      teardown_service_token: str | None = None,
                      prometheus_workspace_id: str | None = None, **stack_kwargs)
The caller adds the stack dependencies on the add-ons and L2-cache stacks; ``policy_engine``
(the Kyverno HelmChart) and ``inference_operator`` (the add-on that installs the
InferenceEndpointConfig CRD), when given, become explicit construct dependencies of the
manifests whose kinds they define. ``teardown_service_token`` (the addons stack's
:class:`kv_constructs.teardown_wait.LoadBalancerTeardownWaiter`) adds the line's teardown wait.
``prometheus_workspace_id`` (the observability stack's workspace, a token: the line's stack then
imports it and deploys after that stack) is required for an autoscaling line, whose triggers query it.
"""

from __future__ import annotations

from typing import Any

import cdk8s
from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from k8s import names
from k8s.gateway_policy import gateway_policy_manifest
from kv_constructs.teardown_wait import wait_for_load_balancers
from k8s.kyverno import POLICY_READY_JSONPATH
from k8s.render import build_line_chart
from observability.autoscaling import line_scaling, workspace_query_url
from platform_config import BusinessLineConfig, PlatformConfig


#: Minutes to wait for Kyverno to report a line's Policy ready before the deploy fails.
POLICY_READY_TIMEOUT_MIN = 10


class BusinessLineStack(Stack):
    """The Kubernetes objects of one business line, applied in dependency order.

    Three manifests and, for an L2 line, one wait between them, each applied after what defines
    its kinds or holds it:

    * ``Namespace`` (manifest): the line's namespace;
    * ``Storage`` (manifest): every other object of the line's chart but the endpoint: egress
      NetworkPolicy, RWX PVC, the Kyverno Policy (kind from the Kyverno chart's CRDs) and the L2
      janitor (ConfigMap, ServiceAccount, Role, RoleBinding, Deployment), after the namespace;
    * ``PolicyReady`` (a ``KubernetesObjectValue``, L2 lines only, not a manifest): waits until
      Kyverno reports the Policy ``Ready``, i.e. in its webhook (``kubectl get policy -o
      jsonpath`` of :data:`k8s.kyverno.POLICY_READY_JSONPATH`, retried until non-empty, at most
      :data:`POLICY_READY_TIMEOUT_MIN` minutes). The policy mutates Pods at CREATE only, so a Pod
      created before that would never get the L2 patch;
    * ``Endpoint`` (manifest): the InferenceEndpointConfig (kind from the inference operator's
      CRD), after the namespace and after the Policy is ready, so the operator's first Pods are
      mutated;
    * ``LoadBalancersGone`` (``Custom::LoadBalancersGone``, with ``teardown_service_token``): every
      other resource depends on it, so on delete it runs last: after the endpoint and the namespace
      are deleted it waits (at most 10 minutes) until the load balancer, target groups and security
      group the add-on's load balancer controller made for the namespace are gone, and fails
      naming them otherwise, before the addons stack can remove the controller (docs/day-two.md).

    Attributes:
        chart: the cdk8s chart; ``namespace``, ``storage``, ``endpoint``: the manifests;
        ``policy_ready``: the ``KubernetesObjectValue`` (None when L2 is off);
        ``load_balancers_gone``: the teardown wait (None without ``teardown_service_token``).
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 line: BusinessLineConfig, cluster: eks.ICluster, policy_engine: Construct | None = None,
                 inference_operator: Construct | None = None, teardown_service_token: str | None = None,
                 prometheus_workspace_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.line = line
        scaling = None
        if line.autoscaling is not None:
            if prometheus_workspace_id is None:
                raise ValueError(f"business line {line.name!r} autoscales: its stack needs the Prometheus workspace "
                                 "(observability.enabled)")
            scaling = line_scaling(line, workspace_query_url(platform.region, prometheus_workspace_id))
        self.chart = build_line_chart(cdk8s.App(), platform, line, scaling)
        objects = list(self.chart.to_json())
        by_kind: dict[str, list[dict]] = {"namespace": [], "storage": [], "endpoint": []}
        for obj in objects:
            if obj["kind"] == "Namespace":
                by_kind["namespace"].append(obj)
            elif obj["kind"] == "InferenceEndpointConfig":
                by_kind["endpoint"].append(obj)
            else:
                by_kind["storage"].append(obj)
        self.namespace = eks.KubernetesManifest(self, "Namespace", cluster=cluster, manifest=by_kind["namespace"],
                                                overwrite=True)
        self.load_balancers_gone = None
        if teardown_service_token is not None:
            self.load_balancers_gone = wait_for_load_balancers(
                self, "LoadBalancersGone", service_token=teardown_service_token, namespace=line.namespace,
                cluster_name=platform.eks.cluster_name)
            # Everything else hangs off the namespace, so this is created first and deleted last.
            self.namespace.node.add_dependency(self.load_balancers_gone)
        self.storage = eks.KubernetesManifest(self, "Storage", cluster=cluster, manifest=by_kind["storage"],
                                              overwrite=True)
        self.storage.node.add_dependency(self.namespace)
        self.endpoint = eks.KubernetesManifest(self, "Endpoint", cluster=cluster, manifest=by_kind["endpoint"],
                                               overwrite=True)
        self.endpoint.node.add_dependency(self.namespace, self.storage)

        def endpoint_waits_for(construct_id: str, policy: str) -> eks.KubernetesObjectValue:
            """The endpoint is applied once Kyverno reports ``policy`` (from the storage manifest) Ready."""
            ready = eks.KubernetesObjectValue(
                self, construct_id, cluster=cluster, object_type="policies.kyverno.io", object_name=policy,
                object_namespace=line.namespace, json_path=POLICY_READY_JSONPATH,
                timeout=Duration.minutes(POLICY_READY_TIMEOUT_MIN))
            ready.node.add_dependency(self.storage)
            self.endpoint.node.add_dependency(ready)
            return ready

        # The L2 mutation acts at pod CREATE only: pods created before its webhook was registered would
        # run without L2 (issue 8, case 4).
        self.policy_ready: eks.KubernetesObjectValue | None = None
        if line.cache.l2_enabled:
            self.policy_ready = endpoint_waits_for("PolicyReady", names.policy_name(line))
        # A gateway line's jwt and weights reach the operator's InferenceGatewayConfig only through its
        # Policy's webhook, which Kyverno registers asynchronously: the endpoint (whose operator creates
        # that object) waits for it too, or the object's first version could slip in without spec.auth.
        self.gateway_policy_ready: eks.KubernetesObjectValue | None = None
        if gateway_policy_manifest(line) is not None:
            self.gateway_policy_ready = endpoint_waits_for("GatewayPolicyReady", names.gateway_policy_name(line))
        if policy_engine is not None and (self.policy_ready or self.gateway_policy_ready):
            self.storage.node.add_dependency(policy_engine)
        if inference_operator is not None:
            self.endpoint.node.add_dependency(inference_operator)
        CfnOutput(self, "NamespaceName", value=line.namespace)
        CfnOutput(self, "EndpointName", value=names.endpoint_name(line),
                  description="InferenceEndpointConfig (and Deployment) name; pods carry app=<this>")
