"""IAM roles for Kubernetes service accounts (IRSA) on an ``aws_eks_v2`` cluster."""

from __future__ import annotations

import re
from typing import Sequence

from aws_cdk import CfnJson, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class IrsaRole(Construct):
    """An IAM role that exactly one Kubernetes service account may assume through the cluster's OIDC provider.

    Trust: ``sts:AssumeRoleWithWebIdentity`` from the cluster's IAM OIDC provider, with
    ``StringEquals`` on ``<issuer>:sub = system:serviceaccount:<namespace>:<name>`` and
    ``<issuer>:aud = sts.amazonaws.com`` (AWS EKS user guide, "Assign IAM roles to Kubernetes
    service accounts"). The issuer is only known at deploy time, so the condition keys go
    through ``CfnJson`` (the same mechanism ``aws_eks_v2.ServiceAccount`` uses).

    Attributes:
        role: the ``iam.Role``; ``role.role_arn`` is what an add-on's ``serviceAccountRoleArn`` or
            a ``eks.amazonaws.com/role-arn`` annotation takes.

    Args:
        cluster: the EKS cluster; its ``open_id_connect_provider`` is used (created on first use).
        namespace: namespace of the service account (RFC 1123 label).
        service_account: service-account name (RFC 1123 label).
        extra_service_principals: AWS services that may also assume the role with
            ``sts:AssumeRole`` (the HyperPod inference operator's execution role is trusted by
            ``sagemaker.amazonaws.com`` as well), only on behalf of this stack's account
            (``aws:SourceAccount``, against the confused deputy: another account's SageMaker
            resource cannot be made to use the role).
        description: IAM role description.
        role_name: a fixed IAM role name, for roles other resources name rather than reference
            (default: a name CloudFormation generates).

    Raises:
        ValueError: ``namespace`` or ``service_account`` is not a valid Kubernetes name.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        namespace: str,
        service_account: str,
        extra_service_principals: Sequence[str] = (),
        description: str | None = None,
        role_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        for field, value in (("namespace", namespace), ("service_account", service_account)):
            if not _K8S_NAME.match(value) or len(value) > 63:
                raise ValueError(f"IrsaRole {field} {value!r} is not a valid Kubernetes name (RFC 1123 label)")
        self.namespace = namespace
        self.service_account = service_account
        provider = cluster.open_id_connect_provider
        issuer = provider.open_id_connect_provider_issuer
        conditions = CfnJson(
            self,
            "TrustConditions",
            value={
                f"{issuer}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                f"{issuer}:aud": "sts.amazonaws.com",
            },
        )
        principal: iam.IPrincipal = iam.OpenIdConnectPrincipal(provider).with_conditions(
            {"StringEquals": conditions}
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=principal,
            description=description or f"IRSA role of {namespace}/{service_account}",
            role_name=role_name,
        )
        for service in extra_service_principals:
            self.role.assume_role_policy.add_statements(  # type: ignore[union-attr]
                iam.PolicyStatement(
                    actions=["sts:AssumeRole"],
                    principals=[iam.ServicePrincipal(service)],
                    conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
                )
            )

    @property
    def policy(self) -> Construct | None:
        """The role's inline ``DefaultPolicy`` (``None`` before a statement is added).

        Depend on this, not on the role: a reference to ``role_arn`` already orders the role,
        but not the policy that grants its permissions.
        """
        return self.role.node.try_find_child("DefaultPolicy")

    @property
    def role_arn(self) -> str:
        """ARN of the role."""
        return self.role.role_arn

    @property
    def subject(self) -> str:
        """The ``sub`` claim the role trusts: ``system:serviceaccount:<namespace>:<name>``."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"
