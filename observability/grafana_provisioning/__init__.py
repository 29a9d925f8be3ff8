"""The Lambda code (standard library + boto3) that provisions Amazon Managed Grafana at deploy.

This directory is the function's asset (``kv_constructs.grafana_provisioning``): keep it free of
imports from the rest of the repository. Logic and contract: :mod:`.handler`.
"""
