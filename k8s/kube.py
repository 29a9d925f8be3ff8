"""The one place that ties Python packages to the cluster's Kubernetes minor version.

Two PyPI packages are built for one Kubernetes minor version each, and must match the EKS
cluster (``eks.version`` in ``config/platform.yaml``):

- ``cdk8s-plus-<NN>`` ships the Kubernetes API classes (``cdk8s_plus_<NN>.k8s``) the charts use;
- ``aws-cdk.lambda-layer-kubectl-v<NN>`` ships kubectl and Helm for the CDK's kubectl handler.

Charts import the API classes from here (``from k8s.kube import k8s``), the cluster stack asks
:func:`kubectl_layer_class` for the layer of ``eks.version``, and the config model refuses an
``eks.version`` whose packages are not installed (:func:`missing_packages`), so a version bump
is one config value plus the two pins in ``requirements.txt``; no other code names a minor version.

Only the standard library is imported at module level: the charts' ``k8s`` package must stay
importable without aws_cdk (``make manifests``), and :mod:`platform_config` imports this module.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Final

#: ``1.<minor>``, as EKS and ``eks.version`` spell a Kubernetes version.
KUBERNETES_VERSION_PATTERN: Final = r"^1\.([0-9]{2})$"

_CDK8S_PLUS_DIST = re.compile(r"^cdk8s[-_.]plus[-_.]([0-9]{2})$", re.IGNORECASE)


class KubernetesPackageError(ImportError):
    """The packages matching a Kubernetes version are missing, or ambiguous. The message says what to install."""


@dataclass(frozen=True)
class KubePackages:
    """The PyPI distributions and Python names that belong to one Kubernetes minor version.

    Attributes:
        version: ``"1.33"``.
        cdk8s_plus: PyPI name, ``cdk8s-plus-33``; its module ``cdk8s_plus_33`` has ``k8s``.
        cdk8s_plus_module: ``cdk8s_plus_33``.
        kubectl_layer: PyPI name, ``aws-cdk.lambda-layer-kubectl-v33``.
        kubectl_layer_module: ``aws_cdk.lambda_layer_kubectl_v33``.
        kubectl_layer_class: ``KubectlV33Layer``.
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
    """The packages of Kubernetes ``version`` (``"1.33"`` -> ``cdk8s-plus-33``, ``...-kubectl-v33``).

    Raises:
        ValueError: ``version`` is not ``1.<two-digit minor>``.
    """
    match = re.match(KUBERNETES_VERSION_PATTERN, version)
    if not match:
        raise ValueError(f"not a Kubernetes minor version: {version!r} (expected e.g. '1.33')")
    minor = match.group(1)
    return KubePackages(
        version=version,
        cdk8s_plus=f"cdk8s-plus-{minor}",
        cdk8s_plus_module=f"cdk8s_plus_{minor}",
        kubectl_layer=f"aws-cdk.lambda-layer-kubectl-v{minor}",
        kubectl_layer_module=f"aws_cdk.lambda_layer_kubectl_v{minor}",
        kubectl_layer_class=f"KubectlV{minor}Layer",
    )


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def installed_versions() -> tuple[str, ...]:
    """Kubernetes versions whose ``cdk8s-plus-<NN>`` is installed, sorted (``("1.33",)``)."""
    found = set()
    for dist in importlib.metadata.distributions():
        match = _CDK8S_PLUS_DIST.match(dist.metadata["Name"] or "")
        if match:
            found.add(f"1.{match.group(1)}")
    return tuple(sorted(found, key=lambda v: int(v.split(".")[1])))


def missing_packages(version: str) -> list[str]:
    """PyPI names of ``version``'s packages that are not installed (empty: ready to synthesize).

    Raises:
        ValueError: malformed ``version`` (see :func:`packages_for`).
    """
    return [name for name in packages_for(version).distributions if not _installed(name)]


def install_hint(version: str) -> str:
    """What to do when ``version``'s packages are missing: the exact pins to put in requirements.txt."""
    wanted = packages_for(version)
    have = installed_versions()
    installed = f"installed for Kubernetes {', '.join(have)}" if have else "no cdk8s-plus package installed"
    return (f"Kubernetes {version} needs the PyPI packages {wanted.cdk8s_plus} and {wanted.kubectl_layer} "
            f"({installed}): pin both in requirements.txt in place of the other version's pair, then "
            f"`make setup` (or `pip uninstall` the old pair and `pip install -r requirements.txt`)")


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
    """The single installed Kubernetes version the charts are generated for.

    Exactly one ``cdk8s-plus-<NN>`` must be installed: with two, which API the charts should use
    would depend on import order, not on ``eks.version``.
    """
    versions = installed_versions()
    if len(versions) == 1:
        return versions[0]
    if not versions:
        raise KubernetesPackageError(
            "no cdk8s-plus-<NN> package is installed; `make setup` installs the one pinned in requirements.txt")
    raise KubernetesPackageError(
        f"several cdk8s-plus packages are installed (Kubernetes {', '.join(versions)}); keep only the one "
        f"matching eks.version in config/platform.yaml (`pip uninstall cdk8s-plus-<NN>` for the others)")


#: Kubernetes version of the installed ``cdk8s-plus-<NN>``; the config model requires
#: ``eks.version`` to equal it, so the charts' API classes always match the cluster.
KUBERNETES_VERSION: Final = _charts_version()


def __getattr__(name: str) -> ModuleType:
    """``k8s``: the Kubernetes API classes of :data:`KUBERNETES_VERSION` (``k8s.KubeNamespace``, ...).

    Resolved on first use (PEP 562), so validating a config, which imports this module, does
    not start the jsii runtime that importing ``cdk8s_plus_<NN>`` starts.
    """
    if name == "k8s":
        module = api(KUBERNETES_VERSION)
        globals()["k8s"] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
