"""Kyverno + the Curvine chart on the EKS cluster (the L2 tier, issue 3).

Contract used by ``stacks.build_platform``:
    L2CacheStack(scope, construct_id, *, platform: PlatformConfig, cluster: eks_v2.Cluster,
                 curvine_volume: kv_constructs.CurvinePrimaryVolume, **stack_kwargs)

Everything is applied through the cluster's kubectl provider with constructs scoped to *this*
stack (``eks.KubernetesManifest`` / ``eks.HelmChart`` rather than ``cluster.add_cdk8s_chart``,
which would place them in the cluster stack and make it reference the HyperPod stack's
volume: a dependency cycle).
"""

from __future__ import annotations

from typing import Any

import cdk8s
from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from k8s.kyverno import KYVERNO_NAMESPACE, kyverno_helm_values, kyverno_namespace
from k8s.network_policies import BLOCK_CURVINE_PORTS, EGRESS_REQUIRED, KYVERNO_GENERATE_RIGHTS
from k8s.render import build_curvine_chart
from kv_constructs.helm_charts import pinned_helm_chart
from platform_config import PlatformConfig
from stacks.cluster_stack import HELM_TIMEOUT

#: A namespace every cluster has, whose generated block-curvine-ports shows that Kyverno's
#: background controller has run the generator over the existing namespaces.
EGRESS_WITNESS_NAMESPACE = "default"
#: How long the deploy waits for it (the background controller's first pass takes seconds).
EGRESS_GENERATED_TIMEOUT_MIN = 10


class L2CacheStack(Stack):
    """The L2 KV-cache tier on the cluster: Kyverno (pinned Helm chart) and the Curvine chart.

    Args:
        scope: the CDK app.
        construct_id: stack id.
        platform: validated platform config (``curvine.*``, ``versions.charts.kyverno``).
        cluster: the EKS cluster with a kubectl provider.
        curvine_volume: the Primary's EBS volume (``volume_id`` token, ``availability_zone``).
        **kwargs: passed to ``Stack``.

    Attributes:
        kyverno: the ``eks.HelmChart`` of Kyverno (None when Curvine is disabled). Business-line
            stacks depend on it: their Policy's kind is defined by its CRDs.
        kyverno_namespace: manifest of the ``kyverno`` Namespace (Pod Security ``restricted``), before the chart.
        curvine_namespace: manifest of the ``curvine`` Namespace.
        curvine: manifest of every other object of the Curvine chart (applied after the
            namespace that holds them).
        chart: the cdk8s chart (tokens unresolved), for tests.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 cluster: eks.ICluster, curvine_volume: Any, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.platform = platform
        self.cluster = cluster
        self.curvine_volume = curvine_volume
        self.kyverno: eks.HelmChart | None = None
        self.kyverno_namespace: eks.KubernetesManifest | None = None
        self.curvine_namespace: eks.KubernetesManifest | None = None
        self.curvine: eks.KubernetesManifest | None = None
        self.chart: cdk8s.Chart | None = None
        if not platform.curvine.enabled:
            return
        pin = platform.versions.charts.kyverno
        # The namespace is ours, not Helm's (create_namespace=False), so it carries Pod Security labels.
        self.kyverno_namespace = eks.KubernetesManifest(
            self, "KyvernoNamespace", cluster=cluster, manifest=[kyverno_namespace(platform.eks.version)],
            overwrite=True)
        self.kyverno = pinned_helm_chart(
            self, "Kyverno", cluster=cluster, pin=pin, release="kyverno", namespace=KYVERNO_NAMESPACE,
            create_namespace=False, values=kyverno_helm_values(),
            # wait: the CRDs and the admission webhook must be ready before any line's Policy.
            wait=True, timeout=HELM_TIMEOUT, atomic=True)
        self.kyverno.node.add_dependency(self.kyverno_namespace)

        # CDK tokens (the volume ID) pass through cdk8s as strings and resolve at deploy.
        self.chart = build_curvine_chart(cdk8s.App(), platform, volume_id=curvine_volume.volume_id,
                                         availability_zone=curvine_volume.availability_zone)
        objects = list(self.chart.to_json())
        namespaces = [o for o in objects if o["kind"] == "Namespace"]
        is_binding = lambda o: (o["kind"], o["metadata"]["name"]) == (  # noqa: E731
            "ValidatingAdmissionPolicyBinding", EGRESS_REQUIRED)
        is_rights = lambda o: (o["kind"], o["metadata"]["name"]) == ("ClusterRole", KYVERNO_GENERATE_RIGHTS)  # noqa: E731
        rest = [o for o in objects if o["kind"] != "Namespace" and not is_binding(o) and not is_rights(o)]
        self.curvine_namespace = eks.KubernetesManifest(self, "CurvineNamespace", cluster=cluster,
                                                        manifest=namespaces, overwrite=True)
        # Kyverno refuses a generate policy whose background controller may not create the kind; the
        # rights reach it through ClusterRole aggregation, which the controller-manager does
        # asynchronously: so the aggregated ClusterRole is applied first, on its own.
        self.kyverno_generate_rights = eks.KubernetesManifest(
            self, "KyvernoGenerateRights", cluster=cluster, manifest=[o for o in objects if is_rights(o)],
            overwrite=True)
        self.kyverno_generate_rights.node.add_dependency(self.kyverno)
        self.curvine = eks.KubernetesManifest(self, "Curvine", cluster=cluster, manifest=rest, overwrite=True)
        self.curvine.node.add_dependency(self.curvine_namespace, self.kyverno_generate_rights)
        # The chart holds a Kyverno ClusterPolicy and a NetworkPolicy in Kyverno's namespace.
        self.curvine.node.add_dependency(self.kyverno)
        # The admission policy that refuses pods where block-curvine-ports is missing is bound only
        # once Kyverno's background controller has generated the copies of the namespaces that exist
        # (seen in `default`): bound earlier, a restart in cert-manager or the operator's namespace
        # would be refused until the copy arrives (k8s.network_policies).
        self.egress_generated = eks.KubernetesObjectValue(
            self, "EgressGenerated", cluster=cluster, object_type="networkpolicies.networking.k8s.io",
            object_name=BLOCK_CURVINE_PORTS, object_namespace=EGRESS_WITNESS_NAMESPACE,
            json_path=".metadata.name", timeout=Duration.minutes(EGRESS_GENERATED_TIMEOUT_MIN))
        self.egress_generated.node.add_dependency(self.curvine)
        self.egress_required = eks.KubernetesManifest(
            self, "EgressRequired", cluster=cluster, manifest=[o for o in objects if is_binding(o)], overwrite=True)
        self.egress_required.node.add_dependency(self.egress_generated)

        # The volume's ID and zone are outputs of the hyperpod stack that creates it (re-exporting
        # an imported value here would only add a second source; cfn-lint W6001).
        CfnOutput(self, "CurvineStorageClass", value=platform.curvine.storage_class_name,
                  description="StorageClass of the business lines' RWX L2 PVCs")
