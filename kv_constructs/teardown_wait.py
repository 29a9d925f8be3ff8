"""Teardown that leaves nothing: each line's delete waits until its load balancers are gone.

The waiter (one Lambda behind an ``aws_cdk.custom_resources.Provider``) lives in the addons stack,
beside the add-on whose AWS Load Balancer Controller makes and deletes the endpoints' load balancers;
every line stack holds one ``Custom::LoadBalancersGone`` resource that its other resources depend on,
so CloudFormation deletes it last in the line's stack: after the InferenceEndpointConfig and the
namespace (whose Ingress the controller cleans up), and before the addons stack can remove the
controller (the line stacks depend on the addons stack). What the handler waits for and why:
``kv_constructs/teardown_wait_handler/handler.py``; the order of a whole teardown: docs/day-two.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from aws_cdk import CfnResource, CustomResource, Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from constructs import Construct

from kv_constructs import nag

#: The handler's directory (the whole Lambda asset).
HANDLER_DIR: Final = Path(__file__).resolve().parent / "teardown_wait_handler"
#: CloudFormation type of a line's wait.
RESOURCE_TYPE: Final = "Custom::LoadBalancersGone"
#: The handler's lifetime: the longest a Lambda may run (900 s), as the kubectl handler's.
HANDLER_TIMEOUT: Final = Duration.minutes(15)
#: Longest wait for a namespace's load balancers: inside the handler's timeout with 5 minutes to spare
#: (the handler also stops a minute before its own end), like every other wait of the platform
#: (tests/stacks/test_cluster_stack.py checks each against its handler).
WAIT_TIMEOUT: Final = Duration.minutes(10)
#: CloudFormation's wait for the resource's answer: the handler's 15 minutes and 5 to spare for the
#: Provider framework around it.
SERVICE_TIMEOUT: Final = Duration.minutes(20)
#: Lambda runtime of the handler (standard library + the runtime's boto3).
RUNTIME: Final = lambda_.Runtime.PYTHON_3_14
#: Read-only calls of the handler; none of them takes a resource ARN (no resource-level permissions).
READ_ACTIONS: Final = ("elasticloadbalancing:DescribeLoadBalancers", "elasticloadbalancing:DescribeTargetGroups",
                       "elasticloadbalancing:DescribeTags", "ec2:DescribeSecurityGroups")


class LoadBalancerTeardownWaiter(Construct):
    """The waiter's Lambda and Provider (create one, in the stack that outlives the lines).

    Attributes:
        function: the handler ``lambda_.Function``; ``service_token``: the Provider's token,
            what :func:`wait_for_load_balancers` resources name.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        log_group = logs.LogGroup(self, "Logs", retention=logs.RetentionDays.ONE_YEAR)
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description="Waits, when a business line is deleted, until its load balancers are gone")
        role.add_to_policy(iam.PolicyStatement(sid="ReadLoadBalancersAndSecurityGroups", actions=list(READ_ACTIONS),
                                               resources=["*"]))
        role.add_to_policy(iam.PolicyStatement(sid="WriteItsLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                               resources=[log_group.log_group_arn]))
        nag.acknowledge_wildcards(
            role, resources=["*"],
            reason="Describe* of Elastic Load Balancing and ec2:DescribeSecurityGroups have no resource-level "
            "permissions (Service Authorization Reference); the handler only reads, to see the namespace's "
            "load balancers gone.")
        self.function = lambda_.Function(
            self, "Handler", runtime=RUNTIME, handler="handler.on_event", role=role, log_group=log_group,
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc"]),
            timeout=HANDLER_TIMEOUT, memory_size=128,
            description="Waits on a business line's delete until its load balancers are gone (addons stack)")
        provider = cr.Provider(self, "Provider", on_event_handler=self.function)
        self.service_token = provider.service_token
        nag.acknowledge_cdk_managed(provider, owner="aws-cdk-lib custom_resources.Provider framework (teardown waiter)")


def wait_for_load_balancers(scope: Construct, construct_id: str, *, service_token: str,
                            namespace: str, cluster_name: str) -> CustomResource:
    """A ``Custom::LoadBalancersGone`` of ``namespace``: a no-op on create, the wait on delete.

    Make the line's other resources depend on it, so it is deleted after them. ``cluster_name``: the
    EKS cluster, whose controller's resources alone count (their ``elbv2.k8s.aws/cluster`` tag).
    ``ServiceTimeout`` (:data:`SERVICE_TIMEOUT`): how long CloudFormation waits for an answer; its
    default, an hour, would hold a delete whose handler died that long.
    """
    resource = CustomResource(scope, construct_id, service_token=service_token, resource_type=RESOURCE_TYPE,
                              properties={"Namespace": namespace, "ClusterName": cluster_name,
                                          "TimeoutSeconds": int(WAIT_TIMEOUT.to_seconds())})
    cfn = resource.node.default_child
    assert isinstance(cfn, CfnResource)
    cfn.add_property_override("ServiceTimeout", int(SERVICE_TIMEOUT.to_seconds()))
    return resource
