"""The durable EBS volume of the Curvine Primary (RocksDB metadata + Raft journal)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from aws_cdk import Acknowledgment, RemovalPolicy, Size, Tags, Validations
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from platform_config.fields import AZ_NAME_PATTERN

_AZ_NAME = re.compile(AZ_NAME_PATTERN)

#: The tag ``AmazonEBSCSIDriverPolicyV2`` scopes the EBS CSI driver's volume actions to (AWS managed
#: policy reference; the driver's own docs/tagging.md: "for allowing users to use a policy to limit
#: csi driver's permission to just the resources it manages").
EBS_CSI_MANAGED_TAG = ("ebs.csi.aws.com/cluster", "true")

#: EBS limits (https://docs.aws.amazon.com/ebs/latest/userguide/ebs-volume-types.html):
#: gp3 1-16,384 GiB, 3,000-16,000 IOPS (at most 500 IOPS per GiB), 125-1,000 MiB/s
#: (at most 0.25 MiB/s per IOPS); io2 4-65,536 GiB, 100-256,000 IOPS (at most 1,000 IOPS per GiB).
_GP3 = {"size": (1, 16384), "iops": (3000, 16000), "iops_per_gib": 500, "throughput": (125, 1000)}
_IO2 = {"size": (4, 65536), "iops": (100, 256000), "iops_per_gib": 1000}


@dataclass(frozen=True)
class CurvinePrimaryVolumeProps:
    """Validated properties of :class:`CurvinePrimaryVolume`.

    Attributes:
        availability_zone: zone *name* of the volume; must be the HyperPod subnet's zone, or no
            node can attach it (EBS volumes are zonal).
        size_gib: size in GiB.
        volume_type: ``gp3`` (default, metadata churn of a KV cache is modest) or ``io2``.
        iops: provisioned IOPS.
        throughput_mibps: gp3 throughput in MiB/s (ignored for io2; must stay 125).
        removal_policy: ``retain`` (volume outlives the stack) or ``snapshot`` (CloudFormation
            snapshots, then deletes). ``destroy`` is not offered: losing the Primary's journal
            loses the namespace of the whole L2 pool.

    Raises:
        ValueError: any value outside the EBS limits above, naming the field and the range.
    """

    availability_zone: str
    size_gib: int
    volume_type: Literal["gp3", "io2"] = "gp3"
    iops: int = 3000
    throughput_mibps: int = 125
    removal_policy: Literal["retain", "snapshot"] = "retain"

    def __post_init__(self) -> None:
        if not _AZ_NAME.match(self.availability_zone):
            raise ValueError(f"availability_zone {self.availability_zone!r} is not a zone name like us-west-2a")
        if self.volume_type not in ("gp3", "io2"):
            raise ValueError(f"volume_type {self.volume_type!r} not allowed; allowed: gp3, io2")
        if self.removal_policy not in ("retain", "snapshot"):
            raise ValueError(f"removal_policy {self.removal_policy!r} not allowed; allowed: retain, snapshot")
        limits = _GP3 if self.volume_type == "gp3" else _IO2
        lo, hi = limits["size"]
        if not lo <= self.size_gib <= hi:
            raise ValueError(f"size_gib {self.size_gib} out of range for {self.volume_type}: {lo}-{hi}")
        lo, hi = limits["iops"]
        if not lo <= self.iops <= hi:
            raise ValueError(f"iops {self.iops} out of range for {self.volume_type}: {lo}-{hi}")
        if self.iops > limits["iops_per_gib"] * self.size_gib:
            raise ValueError(
                f"iops {self.iops} exceeds {limits['iops_per_gib']} IOPS per GiB of a {self.size_gib} GiB "
                f"{self.volume_type} volume"
            )
        if self.volume_type == "gp3":
            lo, hi = _GP3["throughput"]
            if not lo <= self.throughput_mibps <= hi:
                raise ValueError(f"throughput_mibps {self.throughput_mibps} out of range for gp3: {lo}-{hi}")
            if self.throughput_mibps > self.iops / 4:
                raise ValueError(
                    f"throughput_mibps {self.throughput_mibps} exceeds 0.25 MiB/s per provisioned IOPS "
                    f"({self.iops} IOPS allow {self.iops // 4})"
                )
        elif self.throughput_mibps != 125:
            raise ValueError("throughput_mibps applies to gp3 only; leave it at 125 for io2")


class CurvinePrimaryVolume(Construct):
    """An encrypted ``AWS::EC2::Volume`` for the Curvine Primary, never deleted with its stack.

    Encryption uses the account's default EBS key (``aws/ebs``), not a customer-managed key:
    HyperPod attaches volumes through ``sagemaker:AttachClusterNodeVolume`` on behalf of the EBS
    CSI driver, and an AWS-managed key needs no extra ``kms:CreateGrant`` on the driver's role or
    key policy. Data is encrypted at rest either way.

    Attributes:
        volume: the ``ec2.Volume`` (L2).
        volume_id: the volume ID (a token, ``Ref`` of the volume).
        availability_zone: the zone name the volume lives in (plain string from config).

    The resource's logical ID is pinned to ``logical_id`` so that refactoring the construct
    tree never replaces (and so never orphans or snapshots) the Primary's journal.
    """

    #: Pinned CloudFormation logical ID of the volume.
    LOGICAL_ID = "CurvinePrimaryVolume"

    def __init__(self, scope: Construct, construct_id: str, *, props: CurvinePrimaryVolumeProps,
                 name: str = "curvine-primary") -> None:
        super().__init__(scope, construct_id)
        self.props = props
        volume_type = (
            ec2.EbsDeviceVolumeType.GP3 if props.volume_type == "gp3" else ec2.EbsDeviceVolumeType.IO2
        )
        self.volume = ec2.Volume(
            self,
            "Volume",
            availability_zone=props.availability_zone,
            size=Size.gibibytes(props.size_gib),
            volume_type=volume_type,
            iops=props.iops,
            throughput=props.throughput_mibps if props.volume_type == "gp3" else None,
            encrypted=True,
            removal_policy=(
                RemovalPolicy.RETAIN if props.removal_policy == "retain" else RemovalPolicy.SNAPSHOT
            ),
            volume_name=name,
        )
        Tags.of(self.volume).add("kvcache.io/component", "curvine-primary")
        # The EBS CSI driver's AmazonEBSCSIDriverPolicyV2 attaches, detaches and modifies only volumes
        # with this tag (the driver tags the volumes it creates; this one CloudFormation creates).
        Tags.of(self.volume).add(EBS_CSI_MANAGED_TAG[0], EBS_CSI_MANAGED_TAG[1])
        cfn = self.volume.node.default_child
        assert isinstance(cfn, ec2.CfnVolume)
        cfn.override_logical_id(self.LOGICAL_ID)
        self.cfn = cfn
        # CloudFormation's built-in linter warns on any literal zone; here the zone is the point.
        Validations.of(cfn).acknowledge(Acknowledgment(
            id="CloudFormation-Validate::W3010",
            reason="EBS volumes are zonal: the zone is the configured GPU zone, the only one whose "
            "HyperPod nodes can attach the volume.",
        ))

    @property
    def volume_id(self) -> str:
        """The EBS volume ID (``vol-...``), as a token."""
        return self.volume.volume_id

    @property
    def availability_zone(self) -> str:
        """Zone name of the volume, e.g. ``us-west-2a``."""
        return self.props.availability_zone
