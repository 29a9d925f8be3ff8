"""The one place that ties Python packages to the cluster's Kubernetes minor version.

Two PyPI packages are built for one Kubernetes minor version each, and must match the EKS
cluster (``eks.version`` in ``config/platform.yaml``):

- ``cdk8s-plus-<NN>`` ships the Kubernetes API classes (``cdk8s_plus_<NN>.k8s``) the charts use;
- ``aws-cdk.lambda-layer-kubectl-v<NN>`` ships kubectl and Helm for the CDK's kubectl handler.

Which pins belong to which version is data in the bottom layer,
:data:`platform_config.kubernetes_versions.KUBERNETES_RELEASES` (one row per version, with the
core add-on pins); this module only imports what a row names. Charts import the API classes from
here (``from k8s.kube import k8s``), the cluster stack asks :func:`kubectl_layer_class` for the
layer of ``eks.version``, and the config model refuses an ``eks.version`` whose packages are not
installed, so a version bump is one config value plus the two pins in ``requirements.txt``.

Several ``cdk8s-plus-<NN>`` may be installed side by side (``pip install -r requirements.txt`` into
an existing environment adds the new pair and keeps the old one): the charts then use the newest
prepared one (:data:`KUBERNETES_VERSION`), which is never older than ``eks.version`` (whose pair the
config requires), and every manifest is still validated against ``eks.version``'s schemas by the
tests (``tests/k8s/test_k8s_schemas.py``).

Only the standard library and :mod:`platform_config` are imported at module level: the charts'
``k8s`` package must stay importable without aws_cdk (``make manifests``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Final

from platform_config import kubernetes_versions as versions

#: ``1.<minor>``, as EKS and ``eks.version`` spell a Kubernetes version.
KUBERNETES_VERSION_PATTERN: Final = versions.KUBERNETES_VERSION_PATTERN


class KubernetesPackageError(ImportError):
    """The packages matching a Kubernetes version are missing. The message says what to install."""


@dataclass(frozen=True)
class KubePackages:
    """The PyPI distributions and Python names that belong to one Kubernetes minor version.

    Attributes:
        version: ``"1.34"``.
        cdk8s_plus: PyPI name, ``cdk8s-plus-34``; its module ``cdk8s_plus_34`` has ``k8s``.
        cdk8s_plus_module: ``cdk8s_plus_34``.
        kubectl_layer: PyPI name, ``aws-cdk.lambda-layer-kubectl-v34``.
        kubectl_layer_module: ``aws_cdk.lambda_layer_kubectl_v34``.
        kubectl_layer_class: ``KubectlV34Layer``.
    """

    version: str
    cdk8s_plus: str
    cdk8s_plus_module: str
    kubectl_layer: str
    kubectl_layer_module: str
    kubectl_layer_class: str

    @property
    def distributions(self) -> tuple[str, str]:
        """Both PyPI names, as ``requirements.txt`` pins them."""
        return (self.cdk8s_plus, self.kubectl_layer)


def packages_for(version: str) -> KubePackages:
    """The packages of Kubernetes ``version`` (``"1.34"`` -> ``cdk8s-plus-34``, ``...-kubectl-v34``).

    Raises:
        ValueError: ``version`` is not one HyperPod supports, or has no row in
            :data:`platform_config.kubernetes_versions.KUBERNETES_RELEASES`.
    """
    row = versions.release(version)
    return KubePackages(version=row.version, cdk8s_plus=row.cdk8s_plus, cdk8s_plus_module=row.cdk8s_plus_module,
                        kubectl_layer=row.kubectl_layer, kubectl_layer_module=row.kubectl_layer_module,
                        kubectl_layer_class=row.kubectl_layer_class)


#: Re-exported from the bottom layer (the config model uses the same functions).
installed_versions = versions.installed_cdk8s_plus_versions
missing_packages = versions.missing_packages
install_hint = versions.install_hint


def kubectl_layer_class(version: str) -> type:
    """The ``KubectlV<NN>Layer`` construct class for ``version`` (kubectl + Helm for the kubectl handler).

    Raises:
        KubernetesPackageError: ``aws-cdk.lambda-layer-kubectl-v<NN>`` is not installed.
    """
    wanted = packages_for(version)
    try:
        module = importlib.import_module(wanted.kubectl_layer_module)
    except ModuleNotFoundError:
        raise KubernetesPackageError(install_hint(version)) from None
    return getattr(module, wanted.kubectl_layer_class)


def api(version: str) -> ModuleType:
    """The Kubernetes API classes of ``version`` (``cdk8s_plus_<NN>.k8s``: ``KubeDeployment``, ...).

    Raises:
        KubernetesPackageError: ``cdk8s-plus-<NN>`` is not installed.
    """
    wanted = packages_for(version)
    try:
        return importlib.import_module(f"{wanted.cdk8s_plus_module}.k8s")
    except ModuleNotFoundError:
        raise KubernetesPackageError(install_hint(version)) from None


def _charts_version() -> str:
    """The newest installed ``cdk8s-plus-<NN>`` that has a row in the version table."""
    prepared = [v for v in installed_versions() if v in versions.KUBERNETES_RELEASES]
    if prepared:
        return prepared[-1]
    raise KubernetesPackageError(
        "no cdk8s-plus-<NN> package of a prepared Kubernetes version is installed "
        f"({', '.join(versions.KUBERNETES_RELEASES)}); `make setup` installs the pair pinned in requirements.txt")


def pod_security_labels(enforce: str, version: str, *, warn: str | None = None,
                        audit: str | None = None) -> dict[str, str]:
    """Pod Security admission labels of a namespace: ``enforce`` (and ``warn``/``audit`` when given),
    each pinned to ``version`` (``v1.34``, the cluster's), so a Kubernetes upgrade does not tighten or
    loosen a level by itself."""
    labels: dict[str, str] = {}
    for mode, level in (("enforce", enforce), ("warn", warn), ("audit", audit)):
        if level is None:
            continue
        if level not in ("privileged", "baseline", "restricted"):
            raise ValueError(f"Pod Security level {level!r}; allowed: privileged, baseline, restricted")
        labels[f"pod-security.kubernetes.io/{mode}"] = level
        labels[f"pod-security.kubernetes.io/{mode}-version"] = version
    return labels


#: Kubernetes version of the ``cdk8s-plus-<NN>`` the charts are built with (see the module doc).
KUBERNETES_VERSION: Final = _charts_version()


def __getattr__(name: str) -> ModuleType:
    """``k8s``: the Kubernetes API classes of :data:`KUBERNETES_VERSION` (``k8s.KubeNamespace``, ...).

    Resolved on first use (PEP 562), so validating a config does not start the jsii runtime that
    importing ``cdk8s_plus_<NN>`` starts.
    """
    if name == "k8s":
        module = api(KUBERNETES_VERSION)
        globals()["k8s"] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
