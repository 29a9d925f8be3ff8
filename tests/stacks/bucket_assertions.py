"""What every ``kv_constructs.SecureBucket`` must hold in a template, asserted in one place."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match, Template


def assert_secure_bucket(template: Template, name: str, **extra_properties: Any) -> str:
    """Assert the bucket ``name`` is SSE-S3 encrypted, blocks public access, and has a bucket
    policy denying any request without TLS; ``extra_properties`` must match too.

    Returns:
        The bucket's logical ID, read from the template (never hard-coded).
    """
    template.has_resource_properties("AWS::S3::Bucket", {
        "BucketName": name,
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
        "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                           "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
        **extra_properties,
    })
    (bucket_id,) = template.find_resources("AWS::S3::Bucket", {"Properties": {"BucketName": name}})
    template.has_resource_properties("AWS::S3::BucketPolicy", {
        "Bucket": {"Ref": bucket_id},
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Action": "s3:*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])},
    })
    return bucket_id
