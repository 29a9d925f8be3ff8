"""HyperPod's own rules for a cluster and its instance groups, checked before anything is synthesized.

A CloudFormation schema (and so cfn-lint) sees only property types, patterns and lengths; the
service refuses more at CreateCluster time. Every limit below names its source; the list with
dates and versions is docs/sources.md §10. The platform's config models
(``platform_config.platform_models``) and the reusable construct (``kv_constructs.hyperpod_cluster``)
both check these, so a config file and a hand-built ``InstanceGroupSpec`` fail the same way.

Sources, short names used below:

- **schema**: the ``AWS::SageMaker::Cluster`` resource schema shipped in cfn-lint 1.58.0
  (``cfnlint/data/schemas/resources/1efa22c05ae3bec0.json``, schema date 2026-10-20).
- **API**: SageMaker API reference, ``ClusterKubernetesConfig`` / ``ClusterKubernetesTaint``.
- **k8s**: Kubernetes documentation "Labels and Selectors" (key syntax; ``kubernetes.io/`` and
  ``k8s.io/`` reserved for Kubernetes core components) and the Node validation of the API server
  (a taint is unique by key and effect).
- **resilience labels**: SageMaker HyperPod docs "Resilience-related Kubernetes labels by
  SageMaker HyperPod" (HyperPod writes ``sagemaker.amazonaws.com/*`` labels) and the
  ``sagemaker.amazonaws.com/node-health-status=Unschedulable:NoSchedule`` taint HyperPod puts on
  nodes during deep health checks (aws/sagemaker-hyperpod-cli PR #449).
- **deep health checks**: SageMaker HyperPod docs "Deep health checks" (EKS and Slurm pages):
  checks exist for GPU and Trainium instances only; ``InstanceConnectivity`` runs cluster-level
  NCCL tests across nodes and needs at least 2 nodes.
- **prerequisites**: SageMaker HyperPod docs "Getting started with Amazon EKS support in
  SageMaker HyperPod": custom taints cannot be added to instance groups with deep health checks.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

# --- schema limits ---------------------------------------------------------------------------

#: ``InstanceGroups``: 1 to 100 groups per cluster (schema ``ClusterInstanceGroupsList``).
INSTANCE_GROUPS_MAX = 100
#: ``InstanceCount`` / ``MinInstanceCount``: 0 to 6,758 (schema).
INSTANCE_COUNT_MAX = 6758
#: ``EbsVolumeConfig.VolumeSizeInGB``: 1 to 16,384 (schema; GiB in practice).
EBS_VOLUME_SIZE_GB_MIN, EBS_VOLUME_SIZE_GB_MAX = 1, 16384
#: ``OnStartDeepHealthChecks`` values (schema ``DeepHealthCheckType``; at most 3 items, no repeats).
DEEP_HEALTH_CHECKS = ("InstanceStress", "InstanceConnectivity")
#: ``LifeCycleConfig.OnCreate``: file name of the entry point, 1 to 128 characters (schema).
ON_CREATE_MAX = 128
#: ``LifeCycleConfig.SourceS3Uri``: at most 1,024 characters, ``s3://`` or ``https://`` (schema).
SOURCE_S3_URI_MAX = 1024
#: ``TrainingPlanArn`` (schema): 50 to 2,048 characters of this pattern.
TRAINING_PLAN_ARN_PATTERN = r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.*$"
TRAINING_PLAN_ARN_MIN, TRAINING_PLAN_ARN_MAX = 50, 2048
#: ``NodeProvisioningMode`` (schema enum; omitting it keeps HyperPod's earlier all-or-nothing
#: provisioning).
NODE_PROVISIONING_MODES = ("Continuous",)

#: Where instance storage (NVMe) can be mounted on a HyperPod node, in the order
#: ``lifecycle/on_create.sh`` prefers them: /opt/dlami/nvme (the DLAMI's instance-store mount,
#: where the reference deployment found it; docs/sources.md §1) and /opt/sagemaker (HyperPod's
#: mount for the secondary EBS volume, and per HyperPod's EKS storage docs the LVM volume over
#: the instance NVMe; docs/sources.md §10). The script takes the first that is backed by
#: instance storage, whatever its path; ``curvine.worker_data_dir`` must lie below one of them.
INSTANCE_STORE_MOUNTS = ("/opt/dlami/nvme", "/opt/sagemaker")

# --- Kubernetes labels and taints of an instance group -------------------------------------

#: Label and taint keys (API ``ClusterKubernetesConfig`` / ``ClusterKubernetesTaint``): an
#: optional DNS-subdomain prefix and ``/``, then a name; 1 to 317 characters.
KUBERNETES_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
KUBERNETES_KEY_MAX = 317
#: Label and taint values (API): at most 63 characters; labels need at least one (API), a taint
#: value may be omitted.
KUBERNETES_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
KUBERNETES_VALUE_MAX = 63
#: At most 50 labels and 50 taints per instance group (API).
LABELS_MAX = TAINTS_MAX = 50
#: Kubernetes key parts: prefix at most 253 characters, name at most 63 (k8s).
KEY_PREFIX_MAX, KEY_NAME_MAX = 253, 63
#: Key prefixes that are not ours to set: HyperPod's own health labels and taint
#: (resilience labels) and Kubernetes' reserved domains, subdomains included (k8s).
RESERVED_KEY_DOMAINS = ("sagemaker.amazonaws.com", "kubernetes.io", "k8s.io")

_KEY = re.compile(KUBERNETES_KEY_PATTERN)


def reserved_domain(key: str) -> str | None:
    """The reserved domain a ``prefix/name`` key falls under (``"kubernetes.io"`` for
    ``node.kubernetes.io/x``), or ``None`` for keys without a prefix or with a free prefix."""
    prefix, slash, _ = key.rpartition("/")
    if not slash:
        return None
    return next((d for d in RESERVED_KEY_DOMAINS if prefix == d or prefix.endswith("." + d)), None)


def kubernetes_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a label or taint key of a HyperPod instance group, or ``None``.

    Checks the API pattern and length, the Kubernetes prefix/name lengths and the reserved
    domains (:data:`RESERVED_KEY_DOMAINS`).
    """
    if not _KEY.match(key) or len(key) > KUBERNETES_KEY_MAX:
        return (f"key {key!r} is not a Kubernetes label/taint key; allowed: [prefix/]name, name of letters, "
                f"digits, '-', '_', '.' (pattern {KUBERNETES_KEY_PATTERN}, at most {KUBERNETES_KEY_MAX})")
    prefix, _, name = key.rpartition("/")
    if len(prefix) > KEY_PREFIX_MAX or len(name) > KEY_NAME_MAX:
        return (f"key {key!r}: prefix at most {KEY_PREFIX_MAX} and name at most {KEY_NAME_MAX} characters "
                "(Kubernetes label key syntax); allowed: a shorter prefix or name")
    domain = reserved_domain(key)
    if domain:
        return (f"key {key!r} uses the reserved prefix {domain}/ (HyperPod's own health labels and taints, or "
                f"Kubernetes core components); allowed: a prefix of your own, e.g. kvcache.io/")
    return None


def instance_group_problems(
    *,
    instance_type: str,
    instance_count: int,
    deep_health_checks: Sequence[str],
    taints: Iterable[tuple[str, str]] = (),
    min_instance_count: int | None = None,
    accelerators: int | None = None,
) -> list[str]:
    """HyperPod's cross-field rules for one instance group; each problem names the field(s).

    Args:
        instance_type: ``ml.*`` type (for the messages).
        instance_count: ``InstanceCount``.
        deep_health_checks: ``OnStartDeepHealthChecks`` values.
        taints: ``(key, effect)`` of every taint of the group.
        min_instance_count: ``MinInstanceCount`` or ``None``.
        accelerators: GPUs (or Trainium chips) per instance when known; ``0`` means a CPU type,
            on which HyperPod has no deep health check to run. ``None``: not known, not checked.

    Returns:
        Problems as ``"<field>: <what is wrong>; allowed: ..."`` (empty when the group is valid).
    """
    problems: list[str] = []
    taints = list(taints)
    checks = list(deep_health_checks)
    repeated = sorted({c for c in checks if checks.count(c) > 1})
    if repeated:
        problems.append(f"deep_health_checks: {', '.join(repeated)} repeated; allowed: each of "
                        f"{', '.join(DEEP_HEALTH_CHECKS)} at most once")
    if checks and taints:
        problems.append(
            "taints: HyperPod rejects custom taints on an instance group with deep health checks "
            f"({', '.join(dict.fromkeys(checks))}) (HyperPod EKS prerequisites, docs/sources.md §10); "
            "allowed: remove the taints, or set deep_health_checks: []")
    if "InstanceConnectivity" in checks and instance_count < 2:
        problems.append(
            f"deep_health_checks: InstanceConnectivity runs NCCL tests across nodes and needs at least 2 "
            f"instances, the group has {instance_count}; allowed: InstanceStress only, or instance_count >= 2")
    if checks and accelerators == 0:
        problems.append(
            f"deep_health_checks: HyperPod runs deep health checks on GPU and Trainium instances only; "
            f"{instance_type} has neither; allowed: []")
    dupes = sorted({f"{k}:{e}" for k, e in taints if taints.count((k, e)) > 1})
    if dupes:
        problems.append(f"taints: {', '.join(dupes)} repeated; allowed: each key and effect once (a node's "
                            "taints are unique by them)")
    if min_instance_count is not None and min_instance_count > instance_count:
        problems.append(f"min_instance_count: {min_instance_count} exceeds instance_count {instance_count}; "
                        f"allowed: 0..{instance_count}")
    return problems
