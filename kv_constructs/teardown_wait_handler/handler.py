"""Custom resource handler: on Delete, wait until a namespace's load balancers are gone.

A business line's endpoint gets its load balancer from the AWS Load Balancer Controller the inference
add-on bundles: an Ingress in the line's namespace becomes an ALB, target groups and a security
group, which the controller deletes only after the Ingress is deleted, asynchronously. Nothing in
CloudFormation waits for that, so ``cdk destroy --all`` could delete the add-on (and the controller)
first and leave them, with their ENIs, behind (and the VPC undeletable). Each line stack ends its
deletion with this resource: it returns once no load balancer, target group or security group of
the controller belongs to the namespace any more, and fails, naming what is left, when that takes
longer than ``TimeoutSeconds``.

Standard library and the Lambda runtime's boto3 only. Resource properties: ``Namespace``,
``ClusterName`` (the EKS cluster, the value of the controller's cluster tag), ``TimeoutSeconds``
(bounded by the handler's own timeout). Which resources belong to a namespace, by
the controller's tags (kubernetes-sigs/aws-load-balancer-controller ``pkg/deploy/tracking/provider.go``):
``elbv2.k8s.aws/cluster`` on everything it creates; ``ingress.k8s.aws/stack`` = ``<namespace>/<ingress>``
(implicit group) or the group name; ``ingress.k8s.aws/resource`` = ``<namespace>/<ingress>-<svc>:<port>``
on target groups; ``service.k8s.aws/stack`` / ``service.k8s.aws/resource`` likewise for Services.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

#: Tag the controller puts on every AWS resource it creates.
CLUSTER_TAG = "elbv2.k8s.aws/cluster"
#: Tags whose value starts with ``<namespace>/`` for resources of that namespace.
NAMESPACED_TAGS = ("ingress.k8s.aws/stack", "ingress.k8s.aws/resource", "service.k8s.aws/stack",
                   "service.k8s.aws/resource")
#: Seconds between two looks.
POLL_SECONDS = 15
#: DescribeTags takes at most 20 ARNs (Elastic Load Balancing API reference).
TAG_BATCH = 20


#: Errors of DescribeTags for an ARN deleted since it was listed (the Elastic Load Balancing API
#: reference's errors of DescribeTags): that resource is gone, which is what the wait waits for.
GONE_ERRORS = ("LoadBalancerNotFound", "TargetGroupNotFound", "ListenerNotFound", "RuleNotFound")


def belongs_to(tags: dict[str, str], namespace: str, cluster: str | None = None) -> bool:
    """Whether a resource with ``tags`` was made by the controller of ``cluster`` (its
    ``elbv2.k8s.aws/cluster`` value; None: any cluster, for waits created before the property) for
    ``namespace``. Another cluster's Ingress in a namespace of the same name is not ours."""
    if CLUSTER_TAG not in tags or (cluster is not None and tags[CLUSTER_TAG] != cluster):
        return False
    return any(tags.get(key, "").startswith(f"{namespace}/") for key in NAMESPACED_TAGS)


def _error_code(exc: Exception) -> str:
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))


def _tags(elbv2: Any, arns: list[str]) -> Iterable[tuple[str, dict[str, str]]]:
    """(ARN, tags) of every ARN still there: a batch that fails because one of its resources was
    deleted after the listing is asked again one ARN at a time, and the deleted ones are left out."""
    for start in range(0, len(arns), TAG_BATCH):
        batch = arns[start:start + TAG_BATCH]
        try:
            descriptions = elbv2.describe_tags(ResourceArns=batch)["TagDescriptions"]
        except Exception as exc:  # botocore's ClientError, without importing botocore here
            if _error_code(exc) not in GONE_ERRORS:
                raise
            descriptions = []
            for arn in batch:
                try:
                    descriptions += elbv2.describe_tags(ResourceArns=[arn])["TagDescriptions"]
                except Exception as one:
                    if _error_code(one) not in GONE_ERRORS:
                        raise
        for description in descriptions:
            yield description["ResourceArn"], {t["Key"]: t.get("Value", "") for t in description.get("Tags", [])}


def remaining(elbv2: Any, ec2: Any, namespace: str, cluster: str | None = None) -> list[str]:
    """ARNs / IDs of the load balancers, target groups and security groups the controller of
    ``cluster`` made for ``namespace`` (:func:`belongs_to`)."""
    found: list[str] = []
    for operation, key, arn_key in (("describe_load_balancers", "LoadBalancers", "LoadBalancerArn"),
                                    ("describe_target_groups", "TargetGroups", "TargetGroupArn")):
        arns = [item[arn_key] for page in elbv2.get_paginator(operation).paginate() for item in page.get(key, [])]
        found += [arn for arn, tags in _tags(elbv2, arns) if belongs_to(tags, namespace, cluster)]
    for page in ec2.get_paginator("describe_security_groups").paginate(
            Filters=[{"Name": "tag-key", "Values": [CLUSTER_TAG]}]):
        for group in page.get("SecurityGroups", []):
            tags = {t["Key"]: t.get("Value", "") for t in group.get("Tags", [])}
            if belongs_to(tags, namespace, cluster):
                found.append(group["GroupId"])
    return found


def wait_until_gone(elbv2: Any, ec2: Any, namespace: str, timeout_seconds: float, *, cluster: str | None = None,
                    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once :func:`remaining` is empty; look every :data:`POLL_SECONDS`.

    Raises:
        TimeoutError: still there after ``timeout_seconds``; the message names what is left.
    """
    deadline = clock() + timeout_seconds
    while True:
        left = remaining(elbv2, ec2, namespace, cluster)
        if not left:
            return
        if clock() + POLL_SECONDS > deadline:
            raise TimeoutError(
                f"namespace {namespace}: {len(left)} load-balancer resource(s) of the AWS Load Balancer Controller "
                f"still exist after {int(timeout_seconds)} s: {', '.join(left[:10])}. The controller deletes them "
                f"once the namespace's Ingress is gone; keep the addons stack (it runs the controller) and delete "
                f"this stack again (docs/day-two.md, 'Teardown')")
        sleep(POLL_SECONDS)


def on_event(event: dict[str, Any], context: Any, clients: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """The Provider framework's onEvent: Create/Update do nothing; Delete waits (see module doc)."""
    props = event["ResourceProperties"]
    namespace = props["Namespace"]
    if event["RequestType"] == "Delete":
        if clients is None:
            import boto3

            clients = boto3.client
        timeout = float(props["TimeoutSeconds"])
        if context is not None:  # never past the Lambda's own end, with a minute for the answer
            timeout = min(timeout, context.get_remaining_time_in_millis() / 1000 - 60)
        # ClusterName: absent from waits created before it was added (their deletes match any cluster).
        wait_until_gone(clients("elbv2"), clients("ec2"), namespace, timeout, cluster=props.get("ClusterName"))
    return {"PhysicalResourceId": f"load-balancers-of-{namespace}"}
