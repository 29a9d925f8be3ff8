"""Internal-only load balancers, enforced in IAM (issue 25 item 5).

Subnet tags keep the AWS Load Balancer Controller's subnet discovery off the public subnets
(``stacks.network_stack``), but an Ingress or Service can name its subnets or its scheme in an
annotation and skip discovery. An explicit Deny in the policies of the two identities that create
load balancers for the cluster (the controller's IRSA role and the EKS cluster role, which the
cloud provider uses for Services it handles) refuses an internet-facing one whatever it was asked
with. Added only with ``inference_operator.load_balancer_scheme: internal``.
"""

from __future__ import annotations

from typing import Final

from aws_cdk import aws_iam as iam

#: Sid of the statement that refuses internet-facing load balancers (``load_balancer_scheme: internal``).
DENY_INTERNET_FACING_SID: Final = "DenyInternetFacingLoadBalancers"


def deny_internet_facing_statement() -> iam.PolicyStatement:
    """Deny ``elasticloadbalancing:CreateLoadBalancer`` when ``elasticloadbalancing:Scheme`` is
    ``internet-facing`` (an ELB condition key since 2023-11, for ALB, NLB and CLB; docs/sources.md §11).

    An explicit Deny wins over every Allow, so no Ingress or Service annotation (a ``scheme``, a
    ``subnets`` list that skips subnet discovery) makes the controller create a public load balancer.
    """
    return iam.PolicyStatement(
        sid=DENY_INTERNET_FACING_SID, effect=iam.Effect.DENY,
        actions=["elasticloadbalancing:CreateLoadBalancer"], resources=["*"],
        conditions={"StringEquals": {"elasticloadbalancing:Scheme": "internet-facing"}})


