"""Provision a Prometheus data source and dashboards into an Amazon Managed Grafana workspace at deploy.

A custom resource (``Custom::GrafanaProvisioning``) behind an ``aws_cdk.custom_resources.Provider``
whose ``onEvent`` handler is this repository's Lambda
(``observability/grafana_provisioning/handler.py``: steps, idempotency and delete behaviour are
documented there). The dashboards travel as an S3 asset, not as a property: the JSON of 50
business lines is about 480 KB compact (measured, ``tests/observability/test_grafana_provisioning.py``),
half of CloudFormation's 1 MB template limit.

Network: given a ``vpc`` (the workspace is private: ``observability.grafana.network_access``), the
handler runs in the given private subnets with a security group of its own that allows only HTTPS
out. It then reaches the workspace's HTTP API through the workspace's interface VPC endpoint
(``com.amazonaws.<region>.grafana-workspace``, private DNS: the workspace's own host name resolves to
the endpoint inside the VPC), and the Amazon Managed Grafana API (``grafana.<region>.amazonaws.com``:
service accounts and tokens) and S3 (the dashboards) the way the subnets reach AWS services: the NAT
gateways, and S3's gateway endpoint, of a VPC the platform creates (docs/sources.md §32). Without a
``vpc`` it runs outside any VPC of ours and reaches the workspace's public endpoint.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Final

from aws_cdk import ArnFormat, CustomResource, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_grafana as grafana
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from constructs import Construct

from kv_constructs import nag

#: The handler's directory (the whole Lambda asset).
HANDLER_DIR: Final = Path(__file__).resolve().parent.parent / "observability" / "grafana_provisioning"
#: CloudFormation type of the custom resource.
RESOURCE_TYPE: Final = "Custom::GrafanaProvisioning"
#: The handler's lifetime. Its only wait (Grafana's readiness, :data:`READY_TIMEOUT`) plus 5
#: minutes for the API calls and the answer fit inside it (tests/stacks/test_cluster_stack.py
#: checks every custom resource's wait against its handler across the templates).
HANDLER_TIMEOUT: Final = Duration.minutes(8)
#: Longest wait for the workspace's HTTP API to answer (a workspace just created may take a moment).
READY_TIMEOUT: Final = Duration.minutes(2)
#: Lambda runtime of the handler (standard library + the runtime's boto3).
RUNTIME: Final = lambda_.Runtime.PYTHON_3_14
#: The only port the handler opens connections to (its security group's one egress rule, in a VPC).
HTTPS_PORT: Final = 443
#: AWS managed policy with the EC2 network-interface actions Lambda needs for a function in a VPC.
VPC_ACCESS_POLICY: Final = "service-role/AWSLambdaVPCAccessExecutionRole"
#: Grafana API actions the handler needs, all scoped to the one workspace (Amazon Managed Grafana
#: API reference: service accounts and their tokens; the token lives 15 minutes and is deleted).
GRAFANA_ACTIONS: Final = (
    "grafana:ListWorkspaceServiceAccounts", "grafana:CreateWorkspaceServiceAccount",
    "grafana:DeleteWorkspaceServiceAccount", "grafana:ListWorkspaceServiceAccountTokens",
    "grafana:CreateWorkspaceServiceAccountToken", "grafana:DeleteWorkspaceServiceAccountToken",
)


def workspace_arn(scope: Construct, workspace: grafana.CfnWorkspace) -> str:
    """``arn:<partition>:grafana:<region>:<account>:/workspaces/<id>`` (the workspace resource type)."""
    return Stack.of(scope).format_arn(service="grafana", resource="/workspaces", resource_name=workspace.attr_id,
                                      arn_format=ArnFormat.SLASH_RESOURCE_NAME)


class GrafanaProvisioning(Construct):
    """The data source and dashboards of one Amazon Managed Grafana workspace, provisioned on every deploy.

    Args:
        workspace: the Grafana workspace (Grafana 9 or later: service accounts).
        prometheus_url: query endpoint of the AMP workspace (``attr_prometheus_endpoint``).
        dashboards: Grafana dashboard JSON models (dicts with a ``uid``), shipped as one S3 asset.
        datasource_uid, datasource_name: the data source's uid and name in Grafana.
        service_account_name: name of the Grafana service account the handler uses.
        vpc, subnets: run the handler in these (private) subnets of ``vpc``, to reach a workspace that
            admits only its VPC endpoint (module doc); both or neither.

    Attributes:
        function: the handler ``lambda_.Function``; ``role``: its ``iam.Role``.
        security_group: the handler's ``ec2.SecurityGroup`` (HTTPS out only), or None outside a VPC.
        asset: the dashboards' ``s3_assets.Asset``; ``resource``: the ``CustomResource``.

    Raises:
        ValueError: only one of ``vpc`` and ``subnets`` is given, or ``subnets`` is empty.
    """

    def __init__(self, scope: Construct, construct_id: str, *, workspace: grafana.CfnWorkspace, prometheus_url: str,
                 dashboards: list[dict[str, Any]], datasource_uid: str, datasource_name: str,
                 service_account_name: str, vpc: ec2.IVpc | None = None,
                 subnets: list[ec2.ISubnet] | None = None) -> None:
        if (vpc is None) != (subnets is None) or subnets == []:
            raise ValueError("GrafanaProvisioning: give both vpc and (non-empty) subnets, or neither")
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        with tempfile.TemporaryDirectory() as staging:
            # The asset is staged (copied into the cloud assembly by content hash) right here.
            path = Path(staging) / "dashboards.json"
            path.write_text(json.dumps(dashboards, separators=(",", ":"), sort_keys=True), encoding="utf-8")
            self.asset = s3_assets.Asset(self, "Dashboards", path=str(path))

        log_group = logs.LogGroup(self, "Logs", retention=logs.RetentionDays.ONE_YEAR)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                             description="Provisions the Grafana data source and dashboards of this platform")
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ServiceAccountAndShortLivedTokensOfThisWorkspace", actions=list(GRAFANA_ACTIONS),
            resources=[workspace_arn(self, workspace)]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="ReadTheDashboardsAsset", actions=["s3:GetObject"],
            resources=[stack.format_arn(service="s3", region="", account="", resource=self.asset.s3_bucket_name,
                                        resource_name=self.asset.s3_object_key,
                                        arn_format=ArnFormat.SLASH_RESOURCE_NAME)]))
        self.role.add_to_policy(iam.PolicyStatement(
            sid="WriteItsLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[log_group.log_group_arn]))

        self.security_group: ec2.SecurityGroup | None = None
        network: dict[str, Any] = {}
        if vpc is not None:
            # HTTPS out, nothing else (DNS to the VPC resolver is not subject to security groups).
            # Any address: the Grafana API and S3 are public AWS endpoints reached through the NAT
            # (or S3's gateway endpoint, whose prefix list would need a lookup at synth).
            self.security_group = ec2.SecurityGroup(
                self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
                description="Grafana provisioning handler: HTTPS out only (workspace endpoint, Grafana API, S3)")
            self.security_group.add_egress_rule(
                ec2.Peer.any_ipv4(), ec2.Port.tcp(HTTPS_PORT),
                "HTTPS: the workspace through its VPC endpoint; the Grafana API and S3")
            network = {"vpc": vpc, "vpc_subnets": ec2.SubnetSelection(subnets=list(subnets or [])),
                       "security_groups": [self.security_group]}
            # Lambda creates the function's network interfaces with the execution role's rights.
            self.role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name(VPC_ACCESS_POLICY))
            nag.acknowledge(self.role, f"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{VPC_ACCESS_POLICY}]",
                            "Lambda creates and deletes a VPC function's network interfaces with its execution "
                            "role; AWSLambdaVPCAccessExecutionRole is the AWS managed policy the Lambda developer "
                            "guide names for that (EC2 network-interface actions on *, which EC2 does not scope "
                            "for Describe; logs actions)")

        self.function = lambda_.Function(
            self, "Handler", runtime=RUNTIME, handler="handler.on_event", role=self.role, log_group=log_group,
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc"]),
            timeout=HANDLER_TIMEOUT, memory_size=256,
            description="Grafana data source + dashboards (observability stack custom resource)", **network)

        provider = cr.Provider(self, "Provider", on_event_handler=self.function)
        self.resource = CustomResource(
            self, "Resource", service_token=provider.service_token, resource_type=RESOURCE_TYPE,
            properties={
                "WorkspaceId": workspace.attr_id,
                "WorkspaceEndpoint": workspace.attr_endpoint,
                "PrometheusUrl": prometheus_url,
                "Region": stack.region,
                "DataSourceUid": datasource_uid,
                "DataSourceName": datasource_name,
                "DashboardsBucket": self.asset.s3_bucket_name,
                "DashboardsKey": self.asset.s3_object_key,
                "ServiceAccountName": service_account_name,
                "ReadyTimeoutSeconds": int(READY_TIMEOUT.to_seconds()),
            })
        nag.acknowledge_cdk_managed(provider, owner="aws-cdk-lib custom_resources.Provider framework (Grafana provisioning)")
