"""STUB (to be filled by issue 3): one stack per business line.

Contract used by ``stacks.build_platform``:
    BusinessLineStack(scope, construct_id, *, platform: PlatformConfig, line: BusinessLineConfig,
                      cluster: eks_v2.Cluster, **stack_kwargs)
The caller adds the dependencies on the add-ons and L2-cache stacks.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from platform_config import BusinessLineConfig, PlatformConfig


class BusinessLineStack(Stack):
    """One business line's namespace and outputs (stub)."""

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 line: BusinessLineConfig, cluster: eks.ICluster, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.line = line
        eks.KubernetesManifest(self, "Namespace", cluster=cluster, manifest=[{
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": line.namespace}}])
        CfnOutput(self, "NamespaceName", value=line.namespace)
