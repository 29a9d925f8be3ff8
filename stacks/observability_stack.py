"""Metrics, alerts and the Grafana workspace of the platform (issue 11; docs/observability.md).

Contract used by ``stacks.build_platform``:
    ObservabilityStack(scope, construct_id, *, platform: PlatformConfig,
                       business_lines: tuple[BusinessLineConfig, ...], cluster: eks_v2.Cluster,
                       vpc: ec2.IVpc, subnets: list[ec2.ISubnet], keda_role: iam.IRole | None = None,
                       **stack_kwargs)

Collection path: an Amazon Managed Service for Prometheus workspace, fed by an AMP managed
scraper (``AWS::APS::Scraper``: agentless, AWS runs it outside the cluster, ENIs in our private
subnets), which discovers and scrapes the targets of :mod:`observability.targets`. GPU metrics
come from the NVIDIA DCGM exporter, installed from its pinned Helm chart on the HyperPod nodes.
Rules and alert manager live in the workspace; alerts go to an encrypted SNS topic. Dashboards
are generated as JSON beside the templates (``cdk.out/dashboards/``, written by ``app.py``) and,
when this stack creates the Grafana workspace, provisioned into it at deploy together with the
Prometheus data source (:class:`kv_constructs.grafana_provisioning.GrafanaProvisioning`).

The Grafana workspace is private by default (``observability.grafana.network_access``; issue 25,
low item "Public Grafana workspace"): its network access control admits only an interface VPC
endpoint (``com.amazonaws.<region>.grafana-workspace``) this stack creates in the private subnets,
plus the configured prefix lists, and the provisioning handler runs in those subnets to reach it.
With ``public`` there is no network access control (Amazon Managed Grafana's default: any address)
and the handler runs outside the VPC. docs/sources.md §32.

Autoscaling reads this workspace too: ``keda_role`` (the addons stack's IRSA role of the inference
add-on's KEDA) gets ``aps:QueryMetrics`` on this workspace and nothing else (policy
``KedaQueriesWorkspace``, attached from here so the addons stack, deployed first, needs no reference to
a workspace that does not exist yet). KEDA's Prometheus scaler only calls ``/api/v1/query``
(kedacore/keda ``pkg/scalers/prometheus_scaler.go``), AMP's ``QueryMetrics`` operation (AMP user
guide, "Prometheus-compatible APIs", QueryMetrics: ``/workspaces/<id>/api/v1/query``), authorized by
``aps:QueryMetrics``; docs/sources.md §26.

Network reach of the scraper: its ENIs get a security group of their own, admitted into the EKS
cluster security group on exactly the scrape ports (:func:`observability.targets.scrape_ports`)
and the API server's 443. That group is on every node: the system node group (an EKS managed
node group without a launch template carries it alone; EKS user guide, "sec-group-reqs": inbound
only from itself) and the HyperPod nodes (``stacks.hyperpod_stack``: cluster group and shared
group), and on the control plane's ENIs. Why not simply put the scraper in the cluster group:
that admits it to every port of every node and of the control plane; these rules admit it to
the ports it scrapes.
"""

from __future__ import annotations

import base64
from typing import Any

from aws_cdk import CfnOutput, Fn, Stack
from aws_cdk import aws_aps as aps
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_grafana as grafana
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from kv_constructs.grafana_provisioning import GrafanaProvisioning
from kv_constructs.helm_charts import pinned_helm_chart
from observability import alerts, dashboards, targets
from k8s.network_policies import block_curvine_ports_manifest
from observability.cluster_objects import DCGM_RELEASE, dcgm_exporter_values, monitoring_namespace
from platform_config import BusinessLineConfig, PlatformConfig
from platform_config.platform_models import CreateVpcConfig

#: Uid and name of the Prometheus data source the stack provisions into its Grafana workspace.
DATASOURCE_UID = "kvcache-amp"
DATASOURCE_NAME = "Amazon Managed Prometheus (kv cache)"
#: Name of the Grafana service account the provisioning handler uses (its tokens live 15 minutes).
GRAFANA_SERVICE_ACCOUNT = "kvcache-provisioning"

#: Prometheus query actions the Grafana workspace role needs on the workspace (AMP user guide,
#: "Set up Amazon Managed Grafana for use with Amazon Managed Service for Prometheus").
GRAFANA_QUERY_ACTIONS = ("aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels", "aps:GetMetricMetadata",
                         "aps:DescribeWorkspace")


#: The interface VPC endpoint service of Amazon Managed Grafana *workspaces* (their URLs and HTTP
#: API), as opposed to ``grafana`` (the AWS API that manages workspaces): the only kind a workspace's
#: network access control accepts in ``VpceIds`` (docs/sources.md §32).
GRAFANA_WORKSPACE_ENDPOINT_SERVICE = "grafana-workspace"


#: What KEDA's Prometheus scaler needs on the workspace: ``/api/v1/query`` only (module docstring).
KEDA_QUERY_ACTIONS = ("aps:QueryMetrics",)


class ObservabilityStack(Stack):
    """AMP workspace + managed scraper, rules, alert manager -> SNS, DCGM exporter, Grafana workspace.

    Attributes:
        key: KMS key (rotation on) encrypting the SNS topic, and the Prometheus workspace when
            ``observability.workspace_key`` is ``customer-managed`` (else AMP's AWS-owned key does).
        workspace: ``aps.CfnWorkspace``; ``scraper``: ``aps.CfnScraper``; ``rules``:
            ``aps.CfnRuleGroupsNamespace``.
        scraper_security_group: the scraper ENIs' ``ec2.SecurityGroup`` (see module doc).
        topic: the alert ``sns.Topic``.
        keda_policy: the ``iam.Policy`` letting KEDA query the workspace (None without ``keda_role``).
        grafana_workspace: ``grafana.CfnWorkspace`` or None; ``grafana_role``: its IAM role or None;
            ``grafana_provisioning``: :class:`GrafanaProvisioning` or None.
        grafana_endpoint: with ``observability.grafana.network_access: private``, the workspace's
            ``ec2.InterfaceVpcEndpoint`` (``grafana-workspace``, private DNS, the private subnets) and
            ``grafana_endpoint_security_group`` its group (HTTPS from the VPC's CIDR and
            ``endpoint_client_cidrs``); otherwise None.
        dcgm_exporter: ``eks.HelmChart`` or None; ``monitoring_namespace``: its ``eks.KubernetesManifest``.
        dashboards: the dashboard JSON models (dicts), for ``app.py`` to write after synthesis.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 business_lines: tuple[BusinessLineConfig, ...], cluster: eks.ICluster,
                 vpc: ec2.IVpc, subnets: list[ec2.ISubnet], keda_role: iam.IRole | None = None,
                 **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        obs = platform.observability
        name = f"{platform.project}-kv-cache"

        # The workspace uses this key only with workspace_key: customer-managed (docs/observability.md,
        # "Observability": an older AMP user guide said such workspaces cannot use managed
        # collectors); otherwise AMP's own key encrypts it. The alert topic always uses it.
        workspace_key = obs.workspace_key == "customer-managed"
        self.key = kms.Key(self, "Key", enable_key_rotation=True,
                           description=f"{name}: {'Prometheus workspace and ' if workspace_key else ''}alert topic")
        # The alert manager publishes to the topic as the service principal; an SSE-KMS topic
        # needs the service to use the key. The statement is the form the AMP user guide gives
        # ("Giving Amazon Managed Service for Prometheus permission to send alert messages to your
        # Amazon SNS topic"): no condition. No source says AMP's KMS request (made through SNS for
        # the publish) carries aws:SourceAccount, and a condition the request lacks would make every
        # alert fail at KMS; the confused-deputy guard stays on the topic policy below (aws:SourceArn
        # of this workspace and aws:SourceAccount, as that page documents). docs/sources.md §15.
        self.key.add_to_resource_policy(iam.PolicyStatement(
            sid="PrometheusAlertManagerPublishesToEncryptedTopic",
            principals=[iam.ServicePrincipal("aps.amazonaws.com")],
            actions=["kms:GenerateDataKey*", "kms:Decrypt"], resources=["*"]))

        self.topic = sns.Topic(self, "AlertTopic", display_name=f"{name} alerts", master_key=self.key,
                               enforce_ssl=True)
        for address in obs.alerts.email_subscriptions:
            self.topic.add_subscription(subscriptions.EmailSubscription(address))

        self.workspace = aps.CfnWorkspace(
            self, "Workspace", alias=name, kms_key_arn=self.key.key_arn if workspace_key else None,
            alert_manager_definition=alerts.alert_manager_definition(self.topic.topic_arn, self.region))
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            sid="PrometheusAlertManagerPublishes",
            principals=[iam.ServicePrincipal("aps.amazonaws.com")],
            actions=["sns:Publish", "sns:GetTopicAttributes"], resources=[self.topic.topic_arn],
            conditions={"ArnEquals": {"aws:SourceArn": self.workspace.attr_arn},
                        "StringEquals": {"aws:SourceAccount": self.account}}))

        self.keda_policy: iam.Policy | None = None
        if keda_role is not None:
            self.keda_policy = iam.Policy(
                self, "KedaQueriesWorkspace", roles=[keda_role], statements=[iam.PolicyStatement(
                    sid="QueryThisPrometheusWorkspace", actions=list(KEDA_QUERY_ACTIONS),
                    resources=[self.workspace.attr_arn])])

        self.rules = aps.CfnRuleGroupsNamespace(
            self, "Rules", workspace=self.workspace.attr_arn, name=alerts.RULES_NAMESPACE,
            data=alerts.rule_groups_yaml(platform, business_lines))

        blob = base64.b64encode(targets.scrape_configuration_yaml(platform, business_lines).encode()).decode()
        self.scraper_security_group = self._scraper_security_group(vpc, cluster, name, platform, business_lines)
        self.scraper = aps.CfnScraper(
            self, "Scraper", alias=name,
            source=aps.CfnScraper.SourceProperty(eks_configuration=aps.CfnScraper.EksConfigurationProperty(
                cluster_arn=cluster.cluster_arn, subnet_ids=[s.subnet_id for s in subnets],
                security_group_ids=[self.scraper_security_group.security_group_id])),
            destination=aps.CfnScraper.DestinationProperty(
                amp_configuration=aps.CfnScraper.AmpConfigurationProperty(workspace_arn=self.workspace.attr_arn)),
            scrape_configuration=aps.CfnScraper.ScrapeConfigurationProperty(configuration_blob=blob))

        # No access entry or RBAC of ours: on an API/API_AND_CONFIG_MAP cluster AMP creates the
        # scraper's access entry itself (a second one for the same role would fail the deploy).

        self.dcgm_exporter: eks.HelmChart | None = None
        self.monitoring_namespace: eks.KubernetesManifest | None = None
        if obs.dcgm_exporter.install:
            pin = obs.dcgm_exporter.chart
            # Our Namespace (Pod Security labels), not Helm's unlabelled one; with Curvine, its
            # block-curvine-ports too: the admission policy kvcache-curvine-egress-required refuses
            # the exporter's pods without it, and Kyverno's generator may not see a namespace created
            # after it (k8s.network_policies).
            extra = [block_curvine_ports_manifest(obs.namespace)] if platform.curvine.enabled else []
            self.monitoring_namespace = eks.KubernetesManifest(
                self, "MonitoringNamespace", cluster=cluster, manifest=[monitoring_namespace(platform), *extra])
            self.dcgm_exporter = pinned_helm_chart(
                self, "DcgmExporter", cluster=cluster, pin=pin, release=DCGM_RELEASE, namespace=obs.namespace,
                create_namespace=False, values=dcgm_exporter_values(platform))
            self.dcgm_exporter.node.add_dependency(self.monitoring_namespace)

        self.dashboards = [dashboards.build_dashboard(platform, business_lines)]
        self.grafana_role: iam.Role | None = None
        self.grafana_workspace: grafana.CfnWorkspace | None = None
        self.grafana_provisioning: GrafanaProvisioning | None = None
        self.grafana_endpoint: ec2.InterfaceVpcEndpoint | None = None
        self.grafana_endpoint_security_group: ec2.SecurityGroup | None = None
        if obs.grafana.create_workspace:
            self.grafana_role = iam.Role(
                self, "GrafanaRole", description=f"{name}: Grafana reads this platform's Prometheus workspace",
                assumed_by=iam.ServicePrincipal("grafana.amazonaws.com", conditions={
                    "StringEquals": {"aws:SourceAccount": self.account}}))
            self.grafana_role.add_to_policy(iam.PolicyStatement(
                sid="QueryThisPrometheusWorkspace", actions=list(GRAFANA_QUERY_ACTIONS),
                resources=[self.workspace.attr_arn]))
            private = obs.grafana.network_access == "private"
            access_control = None
            if private:
                self.grafana_endpoint, self.grafana_endpoint_security_group = self._grafana_endpoint(
                    vpc, subnets, name, platform)
                # Only this endpoint, and the prefix lists the config names, reach the workspace URL.
                access_control = grafana.CfnWorkspace.NetworkAccessControlProperty(
                    vpce_ids=[self.grafana_endpoint.vpc_endpoint_id],
                    prefix_list_ids=list(obs.grafana.prefix_list_ids))
            self.grafana_workspace = grafana.CfnWorkspace(
                self, "Grafana", name=name, description=f"Dashboards of {platform.project}'s tiered KV cache",
                account_access_type="CURRENT_ACCOUNT", authentication_providers=[obs.grafana.authentication],
                permission_type="CUSTOMER_MANAGED", role_arn=self.grafana_role.role_arn,
                data_sources=["PROMETHEUS"], grafana_version=obs.grafana.version,
                network_access_control=access_control)
            self.grafana_provisioning = GrafanaProvisioning(
                self, "GrafanaProvisioning", workspace=self.grafana_workspace,
                prometheus_url=self.workspace.attr_prometheus_endpoint, dashboards=self.dashboards,
                datasource_uid=DATASOURCE_UID, datasource_name=DATASOURCE_NAME,
                service_account_name=GRAFANA_SERVICE_ACCOUNT,
                vpc=vpc if private else None, subnets=list(subnets) if private else None)
            CfnOutput(self, "GrafanaUrl", value=Fn.join("", ["https://", self.grafana_workspace.attr_endpoint]),
                      description="Amazon Managed Grafana workspace (data source and dashboards provisioned)")
            CfnOutput(self, "GrafanaWorkspaceId", value=self.grafana_workspace.attr_id)
            for i, model in enumerate(self.dashboards):
                CfnOutput(self, "DashboardUrl" if i == 0 else f"DashboardUrl{i + 1}",
                          value=Fn.join("", ["https://", self.grafana_workspace.attr_endpoint, f"/d/{model['uid']}"]),
                          description=f"Dashboard '{model['title']}'")

        CfnOutput(self, "PrometheusWorkspaceId", value=self.workspace.attr_workspace_id)
        CfnOutput(self, "PrometheusEndpoint", value=self.workspace.attr_prometheus_endpoint,
                  description="Prometheus-compatible query endpoint (SigV4) of the workspace")
        CfnOutput(self, "AlertTopicArn", value=self.topic.topic_arn,
                  description="SNS topic every alert is published to; subscribe on-call here")
        CfnOutput(self, "ScraperId", value=self.scraper.attr_scraper_id)

    def _grafana_endpoint(self, vpc: ec2.IVpc, subnets: list[ec2.ISubnet], name: str,
                          platform: PlatformConfig) -> tuple[ec2.InterfaceVpcEndpoint, ec2.SecurityGroup]:
        """The workspace's interface VPC endpoint in the private subnets, and its security group.

        Private DNS on: inside the VPC (and from networks that use its resolver) the workspace's
        own host name resolves to the endpoint, so neither users nor the provisioning handler need
        another URL. The group admits HTTPS only, from the VPC's CIDR (a literal from the config,
        reviewable in the template; the handler's and the operators' VPC addresses) and from
        ``endpoint_client_cidrs`` (VPN, Direct Connect, peered VPCs); it opens no egress.
        """
        grafana_config = platform.observability.grafana
        group = ec2.SecurityGroup(self, "GrafanaEndpointSecurityGroup", vpc=vpc, allow_all_outbound=False,
                                  description=f"{name}: Grafana workspace VPC endpoint (HTTPS from the VPC only)")
        group.add_ingress_rule(ec2.Peer.ipv4(vpc_cidr(platform)), ec2.Port.tcp(443),
                               "HTTPS to the Grafana workspace from the VPC")
        for cidr in grafana_config.endpoint_client_cidrs:
            group.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443),
                                   "HTTPS to the Grafana workspace (observability.grafana.endpoint_client_cidrs)")
        endpoint = ec2.InterfaceVpcEndpoint(
            self, "GrafanaEndpoint", vpc=vpc,
            service=ec2.InterfaceVpcEndpointAwsService(GRAFANA_WORKSPACE_ENDPOINT_SERVICE),
            subnets=ec2.SubnetSelection(subnets=list(subnets)), private_dns_enabled=True,
            security_groups=[group], open=False)
        return endpoint, group

    def _scraper_security_group(self, vpc: ec2.IVpc, cluster: eks.ICluster, name: str, platform: PlatformConfig,
                                business_lines: tuple[BusinessLineConfig, ...]) -> ec2.SecurityGroup:
        """The scraper ENIs' group, admitted into the EKS cluster security group on the scrape ports and 443.

        Rules are ``AWS::EC2::SecurityGroupIngress`` resources of this stack on the group EKS
        created (imported by its id): they go away with this stack, and the eks stack is not touched.
        """
        group = ec2.SecurityGroup(self, "ScraperSecurityGroup", vpc=vpc, allow_all_outbound=True,
                                  description=f"{name}: AMP managed scraper ENIs (scrape ports into the cluster group)")
        cluster_group = ec2.SecurityGroup.from_security_group_id(
            self, "EksClusterSecurityGroup", cluster.cluster_security_group_id, mutable=True)
        cluster_group.add_ingress_rule(group, ec2.Port.tcp(targets.API_SERVER_PORT),
                                       "AMP scraper: Kubernetes API (pod discovery, private endpoint)")
        for port, jobs in targets.scrape_ports(platform, business_lines).items():
            cluster_group.add_ingress_rule(group, ec2.Port.tcp(port), f"AMP scraper: {', '.join(jobs)}"[:255])
        return group


def vpc_cidr(platform: PlatformConfig) -> str:
    """The platform VPC's IPv4 CIDR as the config gives it (``network.cidr`` or ``network.vpc_cidr``)."""
    network = platform.network
    return network.cidr if isinstance(network, CreateVpcConfig) else network.vpc_cidr
