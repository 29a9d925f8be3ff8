"""The ``configurationValues`` the platform passes to EKS add-ons, derived from config.

One place builds them, so the stacks that create the add-ons and ``scripts/preflight.py``
(which checks every key against the add-on's published configuration schema before a deploy)
cannot disagree. Pure: no AWS or CDK imports; ARNs and bucket names come in as arguments
(CDK tokens from the stacks, placeholders from preflight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from platform_config.platform_models import PlatformConfig

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


@dataclass(frozen=True)
class AddonKey:
    """One key of the inference add-on's ``configurationValues`` and why it is sent (or not).

    Attributes:
        path: dotted path in the configuration (``alb.serviceAccount.roleArn``).
        value: what the platform sends and why.
        source: where the key is documented for the add-on (never only a Helm chart's values:
            the add-on's schema is its own, e.g. its ``keda.auth.aws.irsa`` is the chart's
            ``keda.podIdentity.aws.irsa``); docs/sources.md §1 and §11.
        opt_in: the config field(s) that must be set for the key to be sent (Markdown), for keys
            no source read for this project shows in the add-on's configuration; ``None`` for
            verified keys.
        when: for a verified key sent only in some configurations, when (Markdown, e.g. ``only
            with `x```, ``unless `y: false```); ``None``: always.
        left_out_by: the config switch (plain text, as in platform.yaml) that leaves a verified key
            out, for an add-on version whose schema lacks it; preflight names it when the schema does.
        never_sent: a verified key the platform deliberately does not send.
    """

    path: str
    value: str
    source: str
    opt_in: str | None = None
    when: str | None = None
    left_out_by: str | None = None
    never_sent: bool = False

    @property
    def verified(self) -> bool:
        """A source shows the key in the add-on's configuration (unverified keys are opt-in)."""
        return self.opt_in is None

    @property
    def sent(self) -> str:
        """When the key is sent: ``always``, ``never``, :attr:`when`, or ``only with <switch>``."""
        if self.never_sent:
            return "never"
        if not self.verified:
            return f"only with {self.opt_in}"
        return self.when or "always"


#: The AWS sources that name the verified keys (docs/sources.md §1, §11).
_ADDON_SOURCES = "AWS's add-on guide, `helm_to_addon.sh`, awsome-distributed-ai (docs/sources.md §11)"
#: The gateway keys: AWS's gateway guide, "Prerequisites and deployment" (add-on v2.0.0-eksbuild.2 or
#: later, the version pinned; its ``create-addon`` example sends both keys).
_GATEWAY_GUIDE = "AWS's gateway guide, Prerequisites (docs/sources.md §31)"

#: Every key of the inference add-on's configuration: what is sent, why, and on whose word.
#: Unverified keys are opt-in (default off) so that the default configuration holds only keys a
#: source shows; ``scripts/preflight.py`` checks every key sent against the pinned version's
#: schema and reports a schema key left out whose default matters (the gateway).
#:
#: ``inferenceGateway.enabled`` is sent by default, ``false`` when no line uses the gateway: AWS's
#: gateway guide documents the key for the pinned add-on and says installing the add-on "makes the
#: gateway available, so no separate installation is required" (and TLS auto-issue "is enabled by
#: default"), so an add-on left to its own default may run a gateway no one configured, without
#: its role. ``inference_operator.gateway.set_in_addon: false`` leaves the key out, for an add-on
#: version whose schema lacks it (preflight names that switch, and fails if a schema that has the
#: key does not default it off while it is left out).
INFERENCE_ADDON_KEYS: Final[tuple[AddonKey, ...]] = (
    AddonKey("executionRoleArn", "the operator's execution role (IRSA of hyperpod-inference-controller-manager "
             "and sagemaker.amazonaws.com), named `SageMakerHyperPodInference-<project>-<region>`: installed as "
             "an add-on, the operator refuses a role name without that prefix", _ADDON_SOURCES),
    AddonKey("tlsCertificateS3Bucket", "the `hyperpod-tls-<project>-<account>-<region>` bucket of the endpoints' "
             "TLS certificates", _ADDON_SOURCES),
    AddonKey("hyperpodClusterArn", "the HyperPod cluster of this platform", _ADDON_SOURCES),
    AddonKey("alb.enabled", "`true`: each endpoint's load balancer comes from the add-on's own AWS Load "
             "Balancer Controller (the platform installs no other)", _ADDON_SOURCES),
    AddonKey("alb.serviceAccount.create", "`true`: the add-on creates the controller's ServiceAccount, "
             "annotated with `roleArn`", _ADDON_SOURCES),
    AddonKey("alb.serviceAccount.roleArn", "the controller's IRSA role (official policy, narrowed to this "
             "account and region)", _ADDON_SOURCES),
    AddonKey("keda.enabled", "`true`: endpoint autoscaling", _ADDON_SOURCES),
    AddonKey("keda.auth.aws.irsa.enabled", "`true`: KEDA reads metrics with its own IRSA role", _ADDON_SOURCES),
    AddonKey("keda.auth.aws.irsa.roleArn", "KEDA's IRSA role, which may only read metrics", _ADDON_SOURCES),
    AddonKey("alb.ingressClassParams.spec.scheme", "`inference_operator.load_balancer_scheme`, forced on every "
             "Ingress of the controller's class", "unverified: only the bundled controller chart's values "
             "(1.13.2); the add-on's schema is its own", opt_in="`inference_operator.set_scheme_in_addon`"),
    AddonKey("inferenceGateway.enabled", "`inference_operator.gateway.enabled`; `false` is sent explicitly "
             "when the gateway is off (installing the add-on makes the gateway available unless told "
             "otherwise)", _GATEWAY_GUIDE,
             when="unless `inference_operator.gateway.set_in_addon: false` (gateway off)",
             left_out_by="inference_operator.gateway.set_in_addon: false"),
    AddonKey("inferenceGateway.serviceAccount.roleArn", "an IRSA role with "
             "`AmazonSageMakerHyperPodInferenceGatewayAccess`, created before the add-on, trusted by "
             "`gateway.service_account` (default `inference-gateway-controller`)", _GATEWAY_GUIDE,
             when="only with `inference_operator.gateway.enabled`"),
    AddonKey("jumpstartGatedModelDownloadRoleArn", "lines deploy `InferenceEndpointConfig`, never "
             "gated JumpStart models, so no download role is created", _ADDON_SOURCES, never_sent=True),
)


def inference_addon_key_table() -> str:
    """docs/deploy.md's table of the inference add-on's keys (Markdown), from :data:`INFERENCE_ADDON_KEYS`."""
    rows = ["| key | sent | value and reason | documented by |", "|---|---|---|---|"]
    for key in INFERENCE_ADDON_KEYS:
        rows.append(f"| `{key.path}` | {key.sent} | {key.value} | {key.source} |")
    return "\n".join(rows)


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

    By default only verified keys are sent. ``alb.ingressClassParams`` is added with
    ``inference_operator.set_scheme_in_addon``. ``inferenceGateway`` is ``{enabled: true,
    serviceAccount: {roleArn}}`` with ``gateway.enabled``, else ``{enabled: false}`` unless
    ``gateway.set_in_addon`` is false (then the key is left out).

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
    configuration: dict[str, Any] = {
        "executionRoleArn": execution_role_arn,
        "tlsCertificateS3Bucket": tls_bucket,
        "hyperpodClusterArn": hyperpod_cluster_arn,
        "alb": alb,
        "keda": {"enabled": True, "auth": {"aws": {"irsa": {"enabled": True, "roleArn": keda_role_arn}}}},
    }
    gateway = operator.gateway
    if gateway.enabled:
        if gateway_role_arn is None:
            raise ValueError("inference gateway enabled: gateway_role_arn is required")
        configuration["inferenceGateway"] = {"enabled": True, "serviceAccount": {"roleArn": gateway_role_arn}}
    elif gateway.set_in_addon:
        configuration["inferenceGateway"] = {"enabled": False}
    return configuration


#: Schema keys the platform can be told to leave out whose absence is only safe when the add-on's
#: own default agrees: dotted path of the key -> (the value the platform needs, the config switch
#: that sends it). Checked by ``scripts/preflight.py`` against the pinned version's schema.
OMITTED_KEYS_WITH_REQUIRED_DEFAULT: Final[dict[str, tuple[Any, str]]] = {
    "inferenceGateway.enabled": (False, "inference_operator.gateway.set_in_addon: true (the default)"),
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
