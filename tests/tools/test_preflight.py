"""Pre-deploy checks, fed recorded AWS responses (no network, no credentials)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from operator_tools.preflight import (
    check_chart_digests,
    check_image_digests,
    CheckResult,
    check_addon_configuration,
    check_addon_versions,
    check_bootstrap,
    check_cluster_version,
    check_support_calendar,
    check_left_out_keys,
    check_zones,
    keys_missing_from_schema,
    pinned_addons,
    run_preflight,
    version_key,
)
from platform_config.addon_configuration import INFERENCE_ADDON, configured_addons
from platform_config import load_platform
from platform_config.platform_models import IMAGE_FIELDS
from tests.example_config import FIXTURE_CONFIG

PLATFORM = load_platform(FIXTURE_CONFIG / "platform.yaml")


def offered_all_pinned() -> dict[str, list[str]]:
    return {name: ["v0.0.1-eksbuild.1", version] for name, version in pinned_addons(PLATFORM).items()}


def test_version_key_orders_eksbuild_numbers() -> None:
    assert version_key("v1.18.2-eksbuild.2") > version_key("v1.18.2-eksbuild.1")
    assert version_key("v1.9.0-eksbuild.1") < version_key("v1.18.0-eksbuild.1")
    with pytest.raises(ValueError):
        version_key("latest")


def test_pinned_addons_use_eks_names() -> None:
    names = set(pinned_addons(PLATFORM))
    assert {"vpc-cni", "aws-ebs-csi-driver", "amazon-sagemaker-hyperpod-inference", "cert-manager"} <= names


def test_every_pinned_addon_offered_passes() -> None:
    results = check_addon_versions(PLATFORM, offered_all_pinned())
    assert len(results) == 10 and all(r.ok for r in results)


def test_unoffered_version_fails_and_names_the_newest() -> None:
    offered = offered_all_pinned()
    offered["coredns"] = ["v1.11.4-eksbuild.2", "v1.12.9-eksbuild.1"]
    failed = [r for r in check_addon_versions(PLATFORM, offered) if not r.ok]
    assert [r.name for r in failed] == ["add-on coredns"]
    assert "newest: v1.12.9-eksbuild.1" in failed[0].detail


def test_a_newer_offered_build_is_reported_not_failed() -> None:
    """Stale pins show (issue 26 item 5): the row passes and names the newest build above the pin."""
    offered = offered_all_pinned()
    pinned = pinned_addons(PLATFORM)["coredns"]
    offered["coredns"] = ["v1.11.4-eksbuild.2", pinned, "v1.13.1-eksbuild.1", "v1.12.99-eksbuild.3"]
    (row,) = [r for r in check_addon_versions(PLATFORM, offered) if r.name == "add-on coredns"]
    assert row.ok and row.detail == f"{pinned} (newer offered: v1.13.1-eksbuild.1 and 1 more)"


def test_dependency_below_the_hyperpod_minimum_fails() -> None:
    platform = PLATFORM.model_copy(update={"versions": PLATFORM.versions.model_copy(update={
        "addons": PLATFORM.versions.addons.model_copy(update={"cert_manager": "v1.17.0-eksbuild.1"})})})
    offered = {name: [v] for name, v in pinned_addons(platform).items()}
    failed = [r for r in check_addon_versions(platform, offered) if not r.ok]
    assert [(r.name, r.detail) for r in failed] == [
        ("add-on cert-manager", "v1.17.0-eksbuild.1 is below the required v1.18.2-eksbuild.2")]


def test_zone_missing_or_impaired_fails() -> None:
    response = {"AvailabilityZones": [{"ZoneName": "us-west-2a", "State": "available"},
                                      {"ZoneName": "us-west-2b", "State": "impaired"}]}
    result = check_zones(PLATFORM, response)
    assert not result.ok and "us-west-2b" in result.detail


@pytest.mark.parametrize("status, ok", [("CREATE_COMPLETE", True), ("UPDATE_COMPLETE", True),
                                        ("UPDATE_ROLLBACK_COMPLETE", False), ("DELETE_COMPLETE", False)])
def test_bootstrap_status(status: str, ok: bool) -> None:
    assert check_bootstrap({"Stacks": [{"StackStatus": status}]}).ok is ok
    assert check_bootstrap(None).ok is False


# --- Add-on configuration schemas (eks:DescribeAddonConfiguration) --------------------------------
# Responses in the shape the EKS API returns them (configurationSchema is a JSON Schema *string*).
# Written for these tests, not recorded from AWS: no AWS account is reachable here. The inference
# schema declares the keys of the add-on guide and helm_to_addon.sh (docs/sources.md §1) and of
# v2's gateway (§11); the ALB part holds the controller chart's ingressClassParams, and the tests
# below take it away to show what preflight reports.

def _schema_response(name: str, version: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"addonName": name, "addonVersion": version, "configurationSchema": json.dumps(schema),
            "podIdentityConfiguration": []}


NO_DEFAULT = object()


def _inference_schema(*, ingress_class_params: bool = True, gateway: bool = True, gateway_default: Any = False,
                      gateway_object_default: Any = NO_DEFAULT) -> dict[str, Any]:
    """The inference add-on's schema; ``gateway_default``: the default stated for
    ``inferenceGateway.enabled`` (``NO_DEFAULT``: none), ``gateway_object_default``: one stated for the
    whole ``inferenceGateway`` object."""
    role = {"type": "string", "pattern": "^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$"}
    alb = {"type": "object", "additionalProperties": False, "properties": {
        "enabled": {"type": "boolean"},
        "serviceAccount": {"$ref": "#/definitions/serviceAccount"}}}
    if ingress_class_params:
        alb["properties"]["ingressClassParams"] = {"type": "object", "properties": {
            "create": {"type": "boolean"},
            "spec": {"type": "object", "properties": {"scheme": {"enum": ["internal", "internet-facing"]}}}}}
    properties: dict[str, Any] = {
        "executionRoleArn": role, "tlsCertificateS3Bucket": {"type": "string"},
        "hyperpodClusterArn": {"type": "string"}, "jumpstartGatedModelDownloadRoleArn": role,
        "alb": alb,
        "keda": {"type": "object", "additionalProperties": False, "properties": {
            "enabled": {"type": "boolean"},
            "auth": {"type": "object", "properties": {"aws": {"type": "object", "properties": {"irsa": {
                "type": "object", "properties": {"enabled": {"type": "boolean"}, "roleArn": role}}}}}}}},
        "tolerations": {"type": "array"},
        "podAnnotations": {"type": "object"},  # a free-form map
    }
    if gateway:
        enabled: dict[str, Any] = {"type": "boolean"}
        if gateway_default is not NO_DEFAULT:
            enabled["default"] = gateway_default
        properties["inferenceGateway"] = {"type": "object", "additionalProperties": False, "properties": {
            "enabled": enabled, "serviceAccount": {"$ref": "#/definitions/serviceAccount"}}}
        if gateway_object_default is not NO_DEFAULT:
            properties["inferenceGateway"]["default"] = gateway_object_default
    return {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "additionalProperties": False, "properties": properties,
            "definitions": {"serviceAccount": {"type": "object", "additionalProperties": False, "properties": {
                "create": {"type": "boolean"}, "roleArn": role}}}}


VPC_CNI_SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "enableNetworkPolicy": {"type": "string", "enum": ["true", "false"]},
    "env": {"type": "object", "patternProperties": {"^[A-Z_]+$": {"type": "string"}}}}}


def schema_responses(platform=PLATFORM, **inference: Any) -> dict[str, dict[str, Any]]:
    pinned = pinned_addons(platform)
    return {"vpc-cni": _schema_response("vpc-cni", pinned["vpc-cni"], VPC_CNI_SCHEMA),
            INFERENCE_ADDON: _schema_response(INFERENCE_ADDON, pinned[INFERENCE_ADDON], _inference_schema(**inference))}


def test_configured_addons_are_the_ones_the_stacks_configure() -> None:
    assert set(configured_addons(PLATFORM)) == {"vpc-cni", INFERENCE_ADDON}
    assert configured_addons(PLATFORM)["vpc-cni"] == {"enableNetworkPolicy": "true"}


def test_every_key_we_set_is_in_the_schema() -> None:
    for name, response in schema_responses().items():
        result = check_addon_configuration(name, pinned_addons(PLATFORM)[name], configured_addons(PLATFORM)[name], response)
        assert result.ok, result


def opted_in(platform=PLATFORM, *, scheme: bool = True, gateway: bool = True):
    """``platform`` with ``set_scheme_in_addon`` (the unverified key) and ``gateway.set_in_addon`` (the
    explicit gateway "off", true by default) set as given."""
    operator = platform.inference_operator
    return platform.model_copy(update={"inference_operator": operator.model_copy(update={
        "set_scheme_in_addon": scheme, "gateway": operator.gateway.model_copy(update={"set_in_addon": gateway})})})


def test_keys_the_schema_lacks_are_reported_by_path() -> None:
    configuration = configured_addons(opted_in())[INFERENCE_ADDON]
    response = schema_responses(ingress_class_params=False)[INFERENCE_ADDON]
    result = check_addon_configuration(INFERENCE_ADDON, "v2.0.0-eksbuild.2", configuration, response)
    assert result == CheckResult("add-on amazon-sagemaker-hyperpod-inference configuration", False,
                                 "v2.0.0-eksbuild.2 schema lacks alb.ingressClassParams")
    # An add-on version from before the gateway: the explicit "off" (sent by default) is a key it does
    # not know, and the detail names the switch that leaves it out.
    response = schema_responses(gateway=False)[INFERENCE_ADDON]
    assert check_addon_configuration(INFERENCE_ADDON, "v1.0.0-eksbuild.1", configured_addons(PLATFORM)[INFERENCE_ADDON],
                                     response).detail == (
        "v1.0.0-eksbuild.1 schema lacks inferenceGateway; to leave it out set "
        "inference_operator.gateway.set_in_addon: false")
    # With that switch, the default configuration holds no key either schema lacks.
    for response in (schema_responses(ingress_class_params=False, gateway=False)[INFERENCE_ADDON],):
        assert check_addon_configuration(INFERENCE_ADDON, "v1.0.0-eksbuild.1",
                                         configured_addons(opted_in(scheme=False, gateway=False))[INFERENCE_ADDON],
                                         response).ok


LEFT_OUT = "add-on amazon-sagemaker-hyperpod-inference keys left out"
FIX = "set inference_operator.gateway.set_in_addon: true (the default)"


@pytest.mark.parametrize("schema, ok, detail", [
    ({"gateway_default": NO_DEFAULT}, False, "v2.0.0-eksbuild.2 schema has inferenceGateway.enabled and states no "
     f"default; the platform needs false and leaves it out: {FIX}"),
    ({"gateway_default": True}, False, "v2.0.0-eksbuild.2 schema has inferenceGateway.enabled and defaults to "
     f"true; the platform needs false and leaves it out: {FIX}"),
    # A default stated on the whole object applies when the platform leaves the object out.
    ({"gateway_default": False, "gateway_object_default": {"enabled": True}}, False,
     "v2.0.0-eksbuild.2 schema has inferenceGateway.enabled and defaults to true; the platform needs false and "
     f"leaves it out: {FIX}"),
    ({"gateway_default": False, "ingress_class_params": False}, True,
     "v2.0.0-eksbuild.2: nothing left out that the schema declares"),
    ({"gateway": False, "ingress_class_params": False}, True,
     "v2.0.0-eksbuild.2: nothing left out that the schema declares"),
    ({"gateway": False}, True, "v2.0.0-eksbuild.2 schema also has alb.ingressClassParams.spec.scheme "
     "(opt in: inference_operator.set_scheme_in_addon)"),
])
def test_left_out_gateway_fails_unless_the_schema_defaults_it_off(schema, ok, detail) -> None:
    """The gateway key is sent by default (``enabled: false``); left out with ``set_in_addon: false``,
    preflight stops the deploy when the pinned version's schema has it and does not default it off,
    and names the switch that sends ``false``."""
    response = schema_responses(**schema)[INFERENCE_ADDON]
    left_out = configured_addons(opted_in(scheme=False, gateway=False))[INFERENCE_ADDON]
    assert "inferenceGateway" not in left_out
    result = check_left_out_keys(INFERENCE_ADDON, "v2.0.0-eksbuild.2", left_out, response)
    assert result == CheckResult(LEFT_OUT, ok, detail)
    # By default the key is sent (and the schema check sees it), so nothing is left out.
    sent = configured_addons(PLATFORM)[INFERENCE_ADDON]
    assert sent["inferenceGateway"] == {"enabled": False}
    assert check_left_out_keys(INFERENCE_ADDON, "v2.0.0-eksbuild.2", sent, response).ok


def test_schema_walk_follows_refs_patterns_and_free_form_maps() -> None:
    schema = _inference_schema()
    assert keys_missing_from_schema(schema, {"alb": {"serviceAccount": {"roleArn": "x", "name": "y"}}}) == [
        "alb.serviceAccount.name"]  # through $ref, closed
    assert keys_missing_from_schema(schema, {"podAnnotations": {"any/key": "v"}}) == []  # free-form map
    assert keys_missing_from_schema(VPC_CNI_SCHEMA, {"env": {"WARM_IP_TARGET": "5", "lower": "x"}}) == ["env.lower"]
    assert keys_missing_from_schema({"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
                                    {"a": 1, "b": 2, "c": 3}) == ["c"]
    assert keys_missing_from_schema({"type": "object", "additionalProperties": {"type": "string"}}, {"k": "v"}) == []


def test_an_addon_without_a_schema_accepts_no_configuration() -> None:
    result = check_addon_configuration("vpc-cni", "v1.20.4-eksbuild.2", {"enableNetworkPolicy": "true"},
                                       {"addonName": "vpc-cni", "addonVersion": "v1.20.4-eksbuild.2",
                                        "configurationSchema": ""})
    assert not result.ok and "publishes no configuration schema" in result.detail


# --- Cluster version (eks:DescribeCluster) -------------------------------------------------------


def test_cluster_version_before_and_after_the_first_deploy() -> None:
    assert check_cluster_version(PLATFORM, None).ok
    assert check_cluster_version(PLATFORM, {"cluster": {"name": "kvcache-eks", "version": "1.34"}}) == CheckResult(
        "cluster version", True, "kvcache-eks runs 1.34 (supported: 1.28, 1.29, 1.30, 1.31, 1.32, 1.33, 1.34)")


def test_cluster_on_a_version_hyperpod_does_not_support_fails() -> None:
    result = check_cluster_version(PLATFORM, {"cluster": {"name": "kvcache-eks", "version": "1.35"}})
    assert not result.ok
    assert result.detail == ("runs Kubernetes 1.35, which HyperPod does not support (1.28, 1.29, 1.30, 1.31, 1.32, "
                             "1.33, 1.34); runs Kubernetes 1.35 but eks.version is 1.34")
    # Supported, but not what the config would deploy (an upgrade half done): also a failure.
    result = check_cluster_version(PLATFORM, {"cluster": {"name": "kvcache-eks", "version": "1.33"}})
    assert (result.ok, result.detail) == (False, "runs Kubernetes 1.33 but eks.version is 1.34")


class _FakeSession:
    """Answers the read-only calls run_preflight makes, like boto3 would."""

    def __init__(self, region_name: str, account: str = PLATFORM.account, cluster_version: str | None = None,
                 schemas: dict[str, dict[str, Any]] | None = None) -> None:
        self.account = account
        self.cluster_version = cluster_version
        self.schemas = schema_responses() if schemas is None else schemas
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def client(self, service: str) -> Any:
        session = self

        class ClientError(Exception):
            pass

        class ResourceNotFoundException(ClientError):
            pass

        class Client:
            exceptions = type("Exceptions", (), {"ClientError": ClientError,
                                                 "ResourceNotFoundException": ResourceNotFoundException})

            def describe_addon_configuration(self, addonName: str, addonVersion: str) -> dict[str, Any]:
                session.calls.append(("describe_addon_configuration", {"addonName": addonName,
                                                                       "addonVersion": addonVersion}))
                return session.schemas[addonName]

            def describe_cluster(self, name: str) -> dict[str, Any]:
                session.calls.append(("describe_cluster", {"name": name}))
                if session.cluster_version is None:
                    raise ResourceNotFoundException(f"No cluster found for name: {name}.")
                return {"cluster": {"name": name, "version": session.cluster_version}}

            def get_caller_identity(self) -> dict[str, Any]:
                return {"Account": session.account}

            def describe_availability_zones(self) -> dict[str, Any]:
                return {"AvailabilityZones": [{"ZoneName": z, "State": "available"}
                                              for z in ("us-west-2a", "us-west-2b", "us-west-2c")]}

            def get_paginator(self, operation: str) -> Any:
                assert operation == "describe_addon_versions"

                class Paginator:
                    def paginate(self, kubernetesVersion: str, addonName: str) -> list[dict[str, Any]]:
                        assert kubernetesVersion == PLATFORM.eks.version
                        version = pinned_addons(PLATFORM)[addonName]
                        return [{"addons": [{"addonName": addonName,
                                             "addonVersions": [{"addonVersion": version}]}]}]
                return Paginator()

            def describe_stacks(self, StackName: str) -> dict[str, Any]:
                raise ClientError("Stack with id CDKToolkit does not exist")

            def get_template(self, StackName: str, TemplateStage: str) -> dict[str, Any]:
                session.calls.append(("get_template", {"StackName": StackName}))
                raise ClientError(f"Stack with id {StackName} does not exist")

        return Client()


def test_run_preflight_reports_every_check() -> None:
    results = run_preflight(PLATFORM, session_factory=_FakeSession)
    by_name = {r.name: r for r in results}
    assert by_name["account"].ok and by_name["availability zones"].ok
    assert all(r.ok for n, r in by_name.items() if n.startswith("add-on "))
    assert by_name["cdk bootstrap"] == CheckResult(
        "cdk bootstrap", False, "stack CDKToolkit not found; run `cdk bootstrap` with the execution policies "
        "scripts/bootstrap_policy.py prints (without them its role gets AdministratorAccess)")
    assert by_name["EKS support"].detail.startswith(f"Kubernetes {PLATFORM.eks.version}: ")
    assert by_name["image digests"].ok
    assert by_name["chart digests"].ok


def test_image_digests_names_each_tag_and_how_to_resolve_it() -> None:
    result = check_image_digests(PLATFORM)
    assert result.ok and "curvine-image-digests is not rendered" in result.detail
    assert f"versions.images.curvine_csi: crane digest {PLATFORM.versions.images.curvine_csi}" in result.detail
    digests = {f: f"{getattr(PLATFORM.versions.images, f).partition('@')[0]}@sha256:{'0' * 64}" for f in IMAGE_FIELDS}
    pinned = PLATFORM.model_copy(update={"versions": PLATFORM.versions.model_copy(
        update={"images": PLATFORM.versions.images.model_copy(update=digests)})})
    result = check_image_digests(pinned)
    assert result.ok and "pinned by digest: curvine-image-digests admits only those" in result.detail


def test_chart_digests_names_each_chart_installed_by_version_only() -> None:
    result = check_chart_digests(PLATFORM)
    assert result.ok and result.detail.startswith(
        "2 of 2 charts installed by version only, from their repository at deploy time: versions.charts.kyverno "
        "(kyverno 3.5.2); observability.dcgm_exporter.chart (dcgm-exporter 4.8.2); pin them with "
        "`scripts/vendor_chart.py`")
    digest = "sha256:" + "0" * 64
    charts = PLATFORM.versions.charts.model_copy(update={"kyverno": PLATFORM.versions.charts.kyverno.model_copy(
        update={"digest": digest})})
    exporter = PLATFORM.observability.dcgm_exporter.model_copy(update={
        "chart": PLATFORM.observability.dcgm_exporter.chart.model_copy(update={"digest": digest})})
    pinned = PLATFORM.model_copy(update={
        "versions": PLATFORM.versions.model_copy(update={"charts": charts}),
        "observability": PLATFORM.observability.model_copy(update={"dcgm_exporter": exporter})})
    assert check_chart_digests(pinned).detail == (
        "every chart installed from a repository (2) is pinned by digest: synthesis installs its committed archive, "
        "checked against it")


@pytest.mark.parametrize("support_type, today, ok, says", [
    ("EXTENDED", dt.date(2026, 10, 1), True, "standard support until 2026-12-02 (62 days), then extended support"),
    ("EXTENDED", dt.date(2026, 12, 3), True, "in extended support since 2026-12-02 (until 2027-12-02): the cluster is "
                                              "billed at the extended-support price"),
    ("STANDARD", dt.date(2026, 9, 1), True, "standard support until 2026-12-02 (92 days), then EKS upgrades it"),
    # STANDARD near or past the end: EKS would upgrade the control plane by itself (issue 26 item 2).
    ("STANDARD", dt.date(2026, 11, 1), False, "standard support ends 2026-12-02, and eks.support_type STANDARD lets"),
    ("STANDARD", dt.date(2026, 12, 3), False, "standard support ended 2026-12-02"),
    ("EXTENDED", dt.date(2027, 12, 3), False, "extended support ended 2027-12-02"),
])
def test_the_eks_support_calendar(support_type, today, ok, says) -> None:
    platform = PLATFORM.model_copy(update={"eks": PLATFORM.eks.model_copy(update={"support_type": support_type})})
    assert PLATFORM.eks.version == "1.34"  # the dates below are 1.34's (platform_config/kubernetes_versions.py)
    result = check_support_calendar(platform, today)
    assert result.name == "EKS support" and result.ok is ok and says in result.detail, result


def test_run_preflight_reads_the_pinned_schemas_and_the_cluster_version() -> None:
    sessions: list[_FakeSession] = []

    def factory(region_name: str) -> _FakeSession:
        sessions.append(_FakeSession(region_name, cluster_version="1.34",
                                     schemas=schema_responses(ingress_class_params=False, gateway_default=NO_DEFAULT)))
        return sessions[0]

    by_name = {r.name: r for r in run_preflight(PLATFORM, session_factory=factory)}
    assert by_name["add-on vpc-cni configuration"].ok
    assert by_name["add-on amazon-sagemaker-hyperpod-inference configuration"].ok  # verified keys only
    assert by_name[LEFT_OUT].ok  # the gateway's "off" is sent by default
    sessions.clear()
    left_out = opted_in(scheme=False, gateway=False)
    by_name = {r.name: r for r in run_preflight(left_out, session_factory=factory)}
    assert not by_name[LEFT_OUT].ok and by_name[LEFT_OUT].detail.endswith(FIX)
    sessions.clear()
    by_name = {r.name: r for r in run_preflight(opted_in(), session_factory=factory)}
    failed = by_name["add-on amazon-sagemaker-hyperpod-inference configuration"]
    assert not failed.ok and failed.detail.endswith("schema lacks alb.ingressClassParams")
    assert by_name[LEFT_OUT].ok  # the gateway key is sent
    assert by_name["cluster version"].ok
    asked = [args for call, args in sessions[0].calls if call == "describe_addon_configuration"]
    assert {"addonName": INFERENCE_ADDON, "addonVersion": "v2.0.0-eksbuild.2"} in asked
    assert ("describe_cluster", {"name": "kvcache-eks"}) in sessions[0].calls


def test_run_preflight_flags_the_wrong_account() -> None:
    results = run_preflight(PLATFORM, session_factory=lambda region_name: _FakeSession(region_name, "999999999999"))
    assert results[0] == CheckResult("account", False, "credentials are for 999999999999, config says 111122223333")
