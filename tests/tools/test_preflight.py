"""Pre-deploy checks, fed recorded AWS responses (no network, no credentials)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kv_tools.preflight import (
    CheckResult,
    check_addon_versions,
    check_bootstrap,
    check_zones,
    pinned_addons,
    run_preflight,
    version_key,
)
from platform_config import load_platform
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


class _FakeSession:
    """Answers the read-only calls run_preflight makes, like boto3 would."""

    def __init__(self, region_name: str, account: str = PLATFORM.account) -> None:
        self.account = account

    def client(self, service: str) -> Any:
        session = self

        class ClientError(Exception):
            pass

        class Client:
            exceptions = type("Exceptions", (), {"ClientError": ClientError})

            def get_caller_identity(self) -> dict[str, Any]:
                return {"Account": session.account}

            def describe_availability_zones(self) -> dict[str, Any]:
                return {"AvailabilityZones": [{"ZoneName": z, "State": "available"}
                                              for z in ("us-west-2a", "us-west-2b", "us-west-2c")]}

            def get_paginator(self, operation: str) -> Any:
                assert operation == "describe_addon_versions"

                class Paginator:
                    def paginate(self, kubernetesVersion: str, addonName: str) -> list[dict[str, Any]]:
                        assert kubernetesVersion == "1.33"
                        version = pinned_addons(PLATFORM)[addonName]
                        return [{"addons": [{"addonName": addonName,
                                             "addonVersions": [{"addonVersion": version}]}]}]
                return Paginator()

            def describe_stacks(self, StackName: str) -> dict[str, Any]:
                raise ClientError("Stack with id CDKToolkit does not exist")

        return Client()


def test_run_preflight_reports_every_check() -> None:
    results = run_preflight(PLATFORM, session_factory=_FakeSession)
    by_name = {r.name: r for r in results}
    assert by_name["account"].ok and by_name["availability zones"].ok
    assert all(r.ok for n, r in by_name.items() if n.startswith("add-on "))
    assert by_name["cdk bootstrap"] == CheckResult(
        "cdk bootstrap", False, "stack CDKToolkit not found; run `cdk bootstrap`")


def test_run_preflight_flags_the_wrong_account() -> None:
    results = run_preflight(PLATFORM, session_factory=lambda region_name: _FakeSession(region_name, "999999999999"))
    assert results[0] == CheckResult("account", False, "credentials are for 999999999999, config says 111122223333")
