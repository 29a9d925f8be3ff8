"""The version table: one knob (eks.version) and one row per version of what moves with it."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from platform_config import kubernetes_versions as kv
from platform_config import load_platform
from tests.example_config import FIXTURE_CONFIG, USER_CONFIG


def test_hyperpod_lists_1_28_to_1_34_and_the_example_runs_the_newest() -> None:
    """docs/sources.md §15: the current prerequisites page (as its translation shows) lists 1.28-1.34."""
    assert kv.HYPERPOD_KUBERNETES_VERSIONS == ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33", "1.34")
    assert kv.DEFAULT_KUBERNETES_VERSION == "1.34"
    for directory in (FIXTURE_CONFIG, USER_CONFIG):
        assert load_platform(directory / "platform.yaml").eks.version == "1.34", directory


@pytest.mark.parametrize("version", sorted(kv.KUBERNETES_RELEASES))
def test_every_row_is_consistent(version: str) -> None:
    row = kv.KUBERNETES_RELEASES[version]
    assert row.version == version and version in kv.HYPERPOD_KUBERNETES_VERSIONS
    assert row.kube_proxy.startswith(f"v{version}.")  # kube-proxy is built per minor version
    for pin in (row.kube_proxy, row.coredns, row.vpc_cni):
        assert re.match(r"^v[0-9]+\.[0-9]+\.[0-9]+-eksbuild\.[0-9]+$", pin), pin
    assert row.standard_support_end < row.extended_support_end
    assert row.requirements == (f"cdk8s-plus-{row.minor}=={row.cdk8s_plus_pin}",
                                f"aws-cdk.lambda-layer-kubectl-v{row.minor}=={row.kubectl_layer_pin}")


def test_the_rows_carry_the_sourced_values() -> None:
    """EKS user guide (English) kube-proxy and CoreDNS tables, PyPI pins, EKS calendar (docs/sources.md §15)."""
    new, old = kv.KUBERNETES_RELEASES["1.34"], kv.KUBERNETES_RELEASES["1.33"]
    assert (new.kube_proxy, new.coredns, new.cdk8s_plus_pin, new.kubectl_layer_pin) == (
        "v1.34.1-eksbuild.2", "v1.12.4-eksbuild.1", "2.0.66", "2.2.2")
    assert (old.kube_proxy, old.coredns, old.cdk8s_plus_pin, old.kubectl_layer_pin) == (
        "v1.33.5-eksbuild.2", "v1.12.4-eksbuild.1", "2.5.63", "2.2.2")
    assert new.standard_support_end == dt.date(2026, 12, 2) and old.standard_support_end == dt.date(2026, 7, 29)


def test_release_refuses_what_hyperpod_does_not_list_and_names_the_allowed() -> None:
    with pytest.raises(ValueError, match="allowed: 1.28, 1.29, 1.30, 1.31, 1.32, 1.33, 1.34"):
        kv.release("1.35")
    with pytest.raises(ValueError, match="no pins for it; allowed: 1.33, 1.34"):
        kv.release("1.30")


def test_the_bottom_layer_imports_nothing_above_it() -> None:
    """platform_config/kubernetes_versions.py is pure data: standard library only."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(kv.__file__).read_text(encoding="utf-8"))
    imported = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "datetime", "importlib", "re", "dataclasses", "typing"}, imported
