"""The ``configurationValues`` the platform passes to EKS add-ons, derived from config.

One place builds them, so the stacks that create the add-ons and ``scripts/preflight.py``
(which checks every key against the add-on's published configuration schema before a deploy)
cannot disagree. Pure: no AWS or CDK imports; ARNs and bucket names come in as arguments
(CDK tokens from the stacks, placeholders from preflight).
"""

from __future__ import annotations

from typing import Any, Final

from platform_config.models import PlatformConfig

INFERENCE_ADDON: Final = "amazon-sagemaker-hyperpod-inference"

#: ``configuration_values`` of the core add-ons.
#:
#: vpc-cni ``enableNetworkPolicy`` (a *string*, per the add-on's configuration schema and the EKS
#: user guide, "Restrict Pod network traffic with Kubernetes network policies"): runs the network
#: policy agent, without which the platform's NetworkPolicies are enforced by nothing (see
#: ``stacks.cluster_stack`` for the caveats on HyperPod nodes).
CORE_ADDON_CONFIGURATION: Final[dict[str, dict[str, str]]] = {
    "vpc-cni": {"enableNetworkPolicy": "true"},
}

#: Every key of the inference add-on's configuration and why it is set (or deliberately left
#: out). Sources: docs/sources.md §1 (keys of the add-on guide and the operator's
#: ``helm_to_addon.sh``) and §11 (v2 gateway, release notes, load-balancer scheme).
INFERENCE_ADDON_KEYS: Final[dict[str, str]] = {
    "executionRoleArn": "the operator's execution role (IRSA of hyperpod-inference-controller-manager and "
                        "sagemaker.amazonaws.com); its name starts with SageMakerHyperPodInference, which the "
                        "add-on requires of it",
    "tlsCertificateS3Bucket": "the platform's hyperpod-tls-* bucket for the endpoints' TLS certificates",
    "hyperpodClusterArn": "the HyperPod cluster whose nodes run the endpoints",
    "alb.enabled": "true: each endpoint gets a load balancer from the add-on's own AWS Load Balancer "
                   "Controller (the platform installs no other)",
    "alb.serviceAccount.create": "true: the add-on creates the controller's ServiceAccount, annotated with roleArn",
    "alb.serviceAccount.roleArn": "IRSA role with the controller's IAM policy, narrowed to this account and region",
    "alb.ingressClassParams.spec.scheme": "inference_operator.load_balancer_scheme, forced on every Ingress of "
                                          "the controller's class (only with inference_operator.set_scheme_in_addon)",
    "keda.enabled": "true: endpoint autoscaling",
    "keda.auth.aws.irsa.enabled": "true: KEDA reads CloudWatch / Prometheus metrics with its own IRSA role",
    "keda.auth.aws.irsa.roleArn": "IRSA role that may only read metrics",
    "inferenceGateway.enabled": "inference_operator.gateway.enabled; false by default (v2.0.0 turns the gateway "
                                "on, with TLS auto-issue, unless told otherwise)",
    "inferenceGateway.serviceAccount.roleArn": "only with the gateway on: IRSA role with "
                                               "AmazonSageMakerHyperPodInferenceGatewayAccess, created before the add-on",
    "jumpstartGatedModelDownloadRoleArn": "not set: business lines deploy InferenceEndpointConfig, never gated "
                                          "JumpStart models, so no download role is created",
}


def inference_addon_configuration(
    platform: PlatformConfig,
    *,
    execution_role_arn: str,
    tls_bucket: str,
    hyperpod_cluster_arn: str,
    alb_role_arn: str,
    keda_role_arn: str,
    gateway_role_arn: str | None = None,
) -> dict[str, Any]:
    """``configurationValues`` of ``amazon-sagemaker-hyperpod-inference`` (keys: :data:`INFERENCE_ADDON_KEYS`).

    Args:
        platform: validated platform config (``inference_operator.*``).
        execution_role_arn, alb_role_arn, keda_role_arn: role ARNs (CDK tokens or placeholders).
        tls_bucket: bucket *name* of the TLS certificates.
        hyperpod_cluster_arn: ARN of the HyperPod cluster.
        gateway_role_arn: role of the inference gateway; required when the gateway is enabled.

    Returns:
        A JSON-serializable dict; nested objects, as the add-on's schema expects.

    Raises:
        ValueError: gateway enabled without ``gateway_role_arn``.
    """
    operator = platform.inference_operator
    alb: dict[str, Any] = {"enabled": True, "serviceAccount": {"create": True, "roleArn": alb_role_arn}}
    if operator.set_scheme_in_addon:
        alb["ingressClassParams"] = {"spec": {"scheme": operator.load_balancer_scheme}}
    gateway: dict[str, Any] = {"enabled": operator.gateway.enabled}
    if operator.gateway.enabled:
        if gateway_role_arn is None:
            raise ValueError("inference gateway enabled: gateway_role_arn is required")
        gateway["serviceAccount"] = {"roleArn": gateway_role_arn}
    return {
        "executionRoleArn": execution_role_arn,
        "tlsCertificateS3Bucket": tls_bucket,
        "hyperpodClusterArn": hyperpod_cluster_arn,
        "alb": alb,
        "keda": {"enabled": True, "auth": {"aws": {"irsa": {"enabled": True, "roleArn": keda_role_arn}}}},
        "inferenceGateway": gateway,
    }


def configured_addons(platform: PlatformConfig) -> dict[str, dict[str, Any]]:
    """Add-on name -> the configuration the platform sets, with placeholder ARNs (for schema checks).

    Only add-ons with a configuration appear; their key sets equal what the stacks synthesize.
    """
    placeholder = "arn:aws:iam::000000000000:role/placeholder"
    configured: dict[str, dict[str, Any]] = {name: dict(values) for name, values in CORE_ADDON_CONFIGURATION.items()}
    configured[INFERENCE_ADDON] = inference_addon_configuration(
        platform, execution_role_arn=placeholder, tls_bucket="hyperpod-tls-placeholder",
        hyperpod_cluster_arn="arn:aws:sagemaker:us-east-1:000000000000:cluster/placeholder",
        alb_role_arn=placeholder, keda_role_arn=placeholder,
        gateway_role_arn=placeholder if platform.inference_operator.gateway.enabled else None)
    return configured
