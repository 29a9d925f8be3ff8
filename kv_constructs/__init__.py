"""Reusable CDK constructs of the tiered KV cache platform.

Named ``kv_constructs`` rather than ``constructs`` so it never shadows the ``constructs``
library that every CDK app imports (``from constructs import Construct``).

- :class:`HyperPodCluster`: ``AWS::SageMaker::Cluster`` on EKS with its execution role.
- :class:`CurvinePrimaryVolume`: the encrypted, retained EBS volume of the Curvine Primary.
- :class:`SecureBucket`: encrypted, TLS-only, private, versioned, access-logged S3 bucket;
  :func:`prefixed_bucket_name` for buckets whose name a service constrains by prefix.
- :class:`IrsaRole`: IAM role for one Kubernetes service account (IRSA).
- :class:`GrafanaProvisioning` (:mod:`kv_constructs.grafana_provisioning`): data source and
  dashboards of an Amazon Managed Grafana workspace, provisioned at deploy by a custom resource.
- :mod:`kv_constructs.nag`: cdk-nag acknowledgment helpers (``suppress_kubectl_provider``, ...).
"""

from platform_config.runtime import prepare_jsii_node

# Before any construct module imports aws_cdk (which starts jsii's Node process).
prepare_jsii_node()

from kv_constructs import nag  # noqa: E402
from kv_constructs.curvine_volume import CurvinePrimaryVolume, CurvinePrimaryVolumeProps  # noqa: E402
from kv_constructs.hyperpod_cluster import (  # noqa: E402
    HyperPodCluster,
    InstanceGroupSpec,
    LifecycleScripts,
    TaintSpec,
    TieredStorage,
)
from kv_constructs.irsa import IrsaRole  # noqa: E402
from kv_constructs.secure_bucket import SecureBucket, prefixed_bucket_name  # noqa: E402

__all__ = [
    "CurvinePrimaryVolume",
    "CurvinePrimaryVolumeProps",
    "HyperPodCluster",
    "InstanceGroupSpec",
    "IrsaRole",
    "LifecycleScripts",
    "SecureBucket",
    "TaintSpec",
    "TieredStorage",
    "nag",
    "prefixed_bucket_name",
]
