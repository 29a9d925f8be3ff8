"""An S3 bucket with this project's baseline: encrypted, TLS-only, no public access, versioned, logged."""

from __future__ import annotations

import re

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

from kv_constructs import nag

#: S3 bucket naming rules (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html),
#: restricted to what we generate: lowercase letters, digits and hyphens, 3-63 characters.
BUCKET_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")

#: Days the server access logs are kept; long enough for a quarterly access review.
ACCESS_LOG_RETENTION_DAYS = 90

#: Longest S3 bucket name.
BUCKET_NAME_MAX = 63


def prefixed_bucket_name(head: str, *, account: str, region: str) -> str:
    """``<head>-<account>-<region>``, ``head`` cut (trailing ``-`` stripped) to fit 63 characters.

    For buckets whose name a service constrains by prefix (``sagemaker-`` for HyperPod lifecycle
    scripts, ``hyperpod-tls-`` for the inference operator's certificates), so CloudFormation
    cannot generate it. Account and region make the name globally unique; the cut falls on the
    end of ``head``, so a required prefix at its start survives.

    Args:
        head: required prefix plus a project-specific part, e.g. ``"sagemaker-kvcache-lifecycle"``.
        account: 12-digit AWS account ID.
        region: AWS region, e.g. ``us-west-2``.

    Raises:
        ValueError: the result breaks the S3 naming rules (e.g. upper-case letters in ``head``).
    """
    suffix = f"-{account}-{region}"
    name = head[: BUCKET_NAME_MAX - len(suffix)].rstrip("-") + suffix
    if not BUCKET_NAME_PATTERN.match(name):
        raise ValueError(f"bucket name {name!r} (from {head!r}) is not a valid S3 bucket name")
    return name


class SecureBucket(Construct):
    """A bucket encrypted at rest (SSE-S3), reachable only over TLS, public access blocked,
    versioned, with server access logs in a sibling bucket of the same construct.

    SSE-S3 rather than KMS: readers (HyperPod nodes, the inference operator) then need no
    ``kms:Decrypt`` grant, and the content (lifecycle scripts, public TLS certificates of the
    inference endpoints) is not secret; encryption at rest is still on.

    Attributes:
        bucket: the bucket (``s3.Bucket``).
        access_logs: the server-access-log bucket.

    Args:
        bucket_name: explicit name (needed where a service demands a prefix such as
            ``sagemaker-`` or ``hyperpod-tls-``; see :func:`prefixed_bucket_name`); ``None`` lets
            CloudFormation generate one.
        removal_policy: what happens to the bucket when it leaves the stack; ``RETAIN`` default
            (S3 refuses to delete non-empty buckets anyway).
        auto_delete_objects: empty the bucket (every object version) when it is deleted, through
            aws-cdk-lib's auto-delete custom resource; needs ``removal_policy=DESTROY``. For
            buckets whose content is regenerated on every deploy: a *named* bucket that stays
            behind after ``cdk destroy`` makes the next deploy fail with "already exists".
        access_logs_removal_policy: the access-log bucket's policy, ``RETAIN`` default whatever
            happens to the bucket: the logs are the audit trail and are deleted only by a
            person. Its name is generated, so a retained log bucket never blocks a redeploy.

    Raises:
        ValueError: ``bucket_name`` breaks the S3 naming rules (length 3-63, ``[a-z0-9-]``), or
            ``auto_delete_objects`` without ``removal_policy=DESTROY``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket_name: str | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        auto_delete_objects: bool = False,
        access_logs_removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        if bucket_name is not None and not BUCKET_NAME_PATTERN.match(bucket_name):
            raise ValueError(
                f"bucket name {bucket_name!r} is not a valid S3 bucket name "
                "(3-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit)"
            )
        if auto_delete_objects and removal_policy != RemovalPolicy.DESTROY:
            raise ValueError("auto_delete_objects=True needs removal_policy=RemovalPolicy.DESTROY")
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(ACCESS_LOG_RETENTION_DAYS))],
            removal_policy=access_logs_removal_policy,
        )
        nag.acknowledge(
            self.access_logs,
            "S1",
            "This is the server-access-log destination of its sibling bucket; logging the log "
            "bucket into itself would recurse.",
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            bucket_name=bucket_name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="access-logs/",
            removal_policy=removal_policy,
            auto_delete_objects=auto_delete_objects,
        )

    @property
    def bucket_name(self) -> str:
        """Name of the bucket (a token unless given explicitly)."""
        return self.bucket.bucket_name
