"""The Kubernetes versions HyperPod supports, and one row per version of what moves with it.

Pure data and the standard library (the bottom layer: no import of ``k8s``, ``stacks`` or any other
package of this repository). ``eks.version`` is the one knob; everything that must move with it is
in the row of that version in :data:`KUBERNETES_RELEASES`:

- the two PyPI packages built for one Kubernetes minor version, pinned in ``requirements.txt``:
  ``cdk8s-plus-<NN>`` (the charts' API classes) and ``aws-cdk.lambda-layer-kubectl-v<NN>`` (kubectl
  and Helm of the CDK's kubectl handler);
- the core EKS add-on pins ``kube-proxy`` (built per minor version), ``coredns`` and ``vpc-cni``,
  used unless ``versions.addons`` in ``config/platform.yaml`` overrides one;
- the dates of EKS standard and extended support.

Sources (docs/sources.md §15): the HyperPod list from AWS's "Getting started with Amazon EKS
support in SageMaker HyperPod" (its current translation lists 1.28-1.34); the add-on pins from the
EKS user guide's "Manage kube-proxy" and "Manage CoreDNS" tables; the package pins from PyPI; the
support dates from the EKS version calendar (endoflife.date/amazon-eks).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import re
from dataclasses import dataclass
from typing import Final

#: Kubernetes versions HyperPod supports for its EKS cluster, oldest first (docs/sources.md §15).
HYPERPOD_KUBERNETES_VERSIONS: Final[tuple[str, ...]] = ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33", "1.34")

#: ``1.<minor>``, as EKS and ``eks.version`` spell a Kubernetes version.
KUBERNETES_VERSION_PATTERN: Final = r"^1\.([0-9]{2})$"

_CDK8S_PLUS_DIST = re.compile(r"^cdk8s[-_.]plus[-_.]([0-9]{2})$", re.IGNORECASE)


@dataclass(frozen=True)
class KubernetesRelease:
    """Everything pinned for one Kubernetes minor version.

    Attributes:
        version: ``"1.34"``.
        cdk8s_plus_pin: exact version of ``cdk8s-plus-<NN>`` on PyPI (``"2.0.66"``).
        kubectl_layer_pin: exact version of ``aws-cdk.lambda-layer-kubectl-v<NN>`` on PyPI.
        kube_proxy, coredns, vpc_cni: EKS add-on versions (``v1.34.1-eksbuild.2``).
        standard_support_end, extended_support_end: EKS support calendar of the version.
    """

    version: str
    cdk8s_plus_pin: str
    kubectl_layer_pin: str
    kube_proxy: str
    coredns: str
    vpc_cni: str
    standard_support_end: _dt.date
    extended_support_end: _dt.date

    @property
    def minor(self) -> str:
        """``"34"`` for ``"1.34"``."""
        return self.version.split(".")[1]

    @property
    def cdk8s_plus(self) -> str:
        """PyPI name of the charts' API classes, ``cdk8s-plus-34`` (module ``cdk8s_plus_34``)."""
        return f"cdk8s-plus-{self.minor}"

    @property
    def cdk8s_plus_module(self) -> str:
        """``cdk8s_plus_34``."""
        return f"cdk8s_plus_{self.minor}"

    @property
    def kubectl_layer(self) -> str:
        """PyPI name of the kubectl handler's layer, ``aws-cdk.lambda-layer-kubectl-v34``."""
        return f"aws-cdk.lambda-layer-kubectl-v{self.minor}"

    @property
    def kubectl_layer_module(self) -> str:
        """``aws_cdk.lambda_layer_kubectl_v34``."""
        return f"aws_cdk.lambda_layer_kubectl_v{self.minor}"

    @property
    def kubectl_layer_class(self) -> str:
        """``KubectlV34Layer``."""
        return f"KubectlV{self.minor}Layer"

    @property
    def requirements(self) -> tuple[str, str]:
        """The two ``requirements.txt`` lines of this version, ``name==pin``."""
        return (f"{self.cdk8s_plus}=={self.cdk8s_plus_pin}", f"{self.kubectl_layer}=={self.kubectl_layer_pin}")

    @property
    def addon_pins(self) -> dict[str, str]:
        """Core add-on name (as EKS spells it) -> pinned version."""
        return {"vpc-cni": self.vpc_cni, "coredns": self.coredns, "kube-proxy": self.kube_proxy}


#: One row per version this repository has prepared (every value sourced in docs/sources.md §15).
#: To move to another version HyperPod lists: add its row with sources, set ``eks.version``, pin
#: its two packages in requirements.txt (docs/day-two.md, "Kubernetes upgrade").
KUBERNETES_RELEASES: Final[dict[str, KubernetesRelease]] = {
    "1.33": KubernetesRelease(
        version="1.33", cdk8s_plus_pin="2.5.63", kubectl_layer_pin="2.2.2",
        kube_proxy="v1.33.5-eksbuild.2", coredns="v1.12.4-eksbuild.1", vpc_cni="v1.20.4-eksbuild.2",
        standard_support_end=_dt.date(2026, 7, 29), extended_support_end=_dt.date(2027, 7, 29)),
    "1.34": KubernetesRelease(
        version="1.34", cdk8s_plus_pin="2.0.66", kubectl_layer_pin="2.2.2",
        kube_proxy="v1.34.1-eksbuild.2", coredns="v1.12.4-eksbuild.1", vpc_cni="v1.20.4-eksbuild.2",
        standard_support_end=_dt.date(2026, 12, 2), extended_support_end=_dt.date(2027, 12, 2)),
}

#: The version the example config and the model's default run: the newest HyperPod lists.
DEFAULT_KUBERNETES_VERSION: Final = HYPERPOD_KUBERNETES_VERSIONS[-1]


def release(version: str) -> KubernetesRelease:
    """The row of ``version``.

    Raises:
        ValueError: ``version`` is not one HyperPod lists (the message names the allowed ones), or
            HyperPod lists it but this table has no row for it (the message names the prepared ones).
    """
    if version not in HYPERPOD_KUBERNETES_VERSIONS:
        raise ValueError(f"Kubernetes {version} is not one SageMaker HyperPod supports; allowed: "
                         f"{', '.join(HYPERPOD_KUBERNETES_VERSIONS)}")
    if version not in KUBERNETES_RELEASES:
        raise ValueError(f"HyperPod supports Kubernetes {version}, but this repository has no pins for it; allowed: "
                         f"{', '.join(KUBERNETES_RELEASES)} (or add its row to KUBERNETES_RELEASES in "
                         f"platform_config/kubernetes_versions.py, with sources)")
    return KUBERNETES_RELEASES[version]


def installed(distribution: str) -> bool:
    """Whether the PyPI ``distribution`` is installed in this environment."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def installed_cdk8s_plus_versions() -> tuple[str, ...]:
    """Kubernetes versions whose ``cdk8s-plus-<NN>`` is installed, oldest first (``("1.34",)``)."""
    found = set()
    for dist in importlib.metadata.distributions():
        match = _CDK8S_PLUS_DIST.match(dist.metadata["Name"] or "")
        if match:
            found.add(f"1.{match.group(1)}")
    return tuple(sorted(found, key=lambda v: int(v.split(".")[1])))


def missing_packages(version: str) -> list[str]:
    """PyPI names of ``version``'s two packages that are not installed (empty: ready to synthesize).

    Raises:
        ValueError: as :func:`release`.
    """
    row = release(version)
    return [name for name in (row.cdk8s_plus, row.kubectl_layer) if not installed(name)]


def install_hint(version: str) -> str:
    """What to do when ``version``'s packages are missing: the exact pins for requirements.txt."""
    row = release(version)
    have = installed_cdk8s_plus_versions()
    found = f"installed for Kubernetes {', '.join(have)}" if have else "no cdk8s-plus package installed"
    return (f"Kubernetes {version} needs the PyPI packages {row.cdk8s_plus} and {row.kubectl_layer} ({found}): "
            f"pin {' and '.join(row.requirements)} in requirements.txt in place of the other version's pair, "
            f"then `make setup` (or `pip install -r requirements.txt`)")
