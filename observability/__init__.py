"""Metrics, dashboards and alerts of the tiered KV cache (docs/observability.md).

Pure Python (no aws_cdk import), so tests and tools read the same definitions the CDK stack
deploys:

- :mod:`observability.metrics`: every metric the dashboards and alerts use, with the component,
  version and source file it comes from (docs/sources.md §13), and how its series are named.
- :mod:`observability.targets`: what is scraped (job names, pod labels, ports) and the AMP
  managed scraper's configuration.
- :mod:`observability.queries`: the PromQL of every panel and alert, per business line.
- :mod:`observability.alerts`: Prometheus rule groups and the alert manager definition (SNS).
- :mod:`observability.dashboards`: Grafana dashboard JSON (grafana-foundation-sdk).
- :mod:`observability.cluster_objects`: the DCGM exporter's namespace, Helm values and counters CSV.
- :mod:`observability.grafana_provisioning`: the Lambda (standard library + boto3) that writes the
  data source and the dashboards into Amazon Managed Grafana at deploy.

Named ``observability`` (not ``constructs``): nothing here shadows a library module.
"""
