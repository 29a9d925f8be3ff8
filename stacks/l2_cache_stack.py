"""STUB (to be filled by the L2-cache work, issue 3): Kyverno + the Curvine chart on the EKS cluster.

Contract used by ``stacks.build_platform``:
    L2CacheStack(scope, construct_id, *, platform: PlatformConfig, cluster: eks_v2.Cluster,
                 curvine_volume: kv_constructs.CurvinePrimaryVolume, **stack_kwargs)
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from platform_config import PlatformConfig


class L2CacheStack(Stack):
    """The L2 KV-cache tier on the cluster (stub)."""

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 cluster: eks.ICluster, curvine_volume: Any, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.platform = platform
        self.cluster = cluster
        self.curvine_volume = curvine_volume
