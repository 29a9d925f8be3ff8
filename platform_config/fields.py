"""What the platform's and the business lines' models share: the base model, constrained types
(names, quantities, pinned images, AWS identifiers) and the LMCache release the platform is built on.

Every model forbids unknown keys, so a misspelled field is an error rather than a silently
ignored setting. Field-level rules live on the fields; rules that span files (a business
line's instance type must be one of the platform's instance groups, ...) live in
:func:`platform_config.loader.load_project`.

Units are in the field names: ``*_gib`` is GiB (2^30 bytes), ``*_gb`` decimal GB where AWS
defines the unit that way (EBS ``VolumeSizeInGB`` is GiB in practice but named GB by the API;
we keep the API's name), ``*_mibps`` MiB/s.
"""

from __future__ import annotations

import ipaddress

import math
import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StringConstraints,
)

from platform_config.instances import INSTANCE_TYPES

# --- reusable constrained types -------------------------------------------------------------

#: RFC 1123 label: Kubernetes namespaces, object names, and (being a subset) CloudFormation-safe.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL_PATTERN, max_length=63)]

#: HyperPod ``InstanceGroupName`` / ``ClusterName`` pattern (docs/sources.md §2).
HYPERPOD_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$"
HyperPodName = Annotated[str, StringConstraints(pattern=HYPERPOD_NAME_PATTERN, max_length=63)]

#: SageMaker instance type; the CRD demands ``^ml\\..*`` and we additionally require a known type.
MlInstanceType = Annotated[str, StringConstraints(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")]

def ipv4_network(min_prefix: int = 1, max_prefix: int = 32) -> Any:
    """An IPv4 network in CIDR notation (``10.192.0.0/16``): four octets of 0-255, host bits zero,
    a prefix length within ``[min_prefix, max_prefix]``; the message names what is wrong and gives
    the allowed form (a regular expression alone would accept ``300.192.0.0/16`` and leave the
    error to CloudFormation)."""

    def check(value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IPv4 network ({exc}); allowed: a.b.c.d/n with a, b, c, d "
                             f"in 0-255, host bits 0 and n in {min_prefix}-{max_prefix}, e.g. 10.192.0.0/16") from None
        if not min_prefix <= network.prefixlen <= max_prefix or "/" not in value:
            raise ValueError(f"{value!r}: the prefix length must be /{min_prefix} to /{max_prefix}; allowed: e.g. "
                             f"10.192.0.0/{max(min_prefix, min(16, max_prefix))}")
        return value

    return Annotated[str, AfterValidator(check)]


def _check_known_instance_type(value: str) -> str:
    if value not in INSTANCE_TYPES:
        raise ValueError(f"unknown instance type; allowed: {', '.join(sorted(INSTANCE_TYPES))}")
    return value


#: An ``ml.*`` type listed in :data:`platform_config.instances.INSTANCE_TYPES`.
KnownInstanceType = Annotated[MlInstanceType, AfterValidator(_check_known_instance_type)]

#: Kubernetes resource quantity (``resource.Quantity`` grammar, decimal and binary suffixes).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"


def _quantity_from_number(value: Any) -> Any:
    """A YAML number written where a quantity goes (``cpu: 10``, ``l2_size: 0``) as its decimal
    string (``"10"``, ``"0"``; ``0.5`` -> ``"0.5"``, never exponent notation), as Kubernetes
    accepts an unquoted number in a quantity field; the pattern and the above-zero rule then judge
    it like the quoted string. Anything else (a string, a boolean) passes unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "nan": refused by the pattern, naming the value
    text = format(Decimal(repr(value)), "f") if isinstance(value, float) else str(value)
    return text.rstrip("0").rstrip(".") if "." in text else text


Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN), BeforeValidator(_quantity_from_number)]

_QUANTITY_SUFFIXES = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                      "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(quantity: str) -> float:
    """Value of a Kubernetes quantity (``QUANTITY_PATTERN``) in base units: ``"80Gi"`` -> 85899345920.0.

    Raises:
        ValueError: not a quantity.
    """
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)", quantity)
    if not match or match.group(2) not in _QUANTITY_SUFFIXES:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}; allowed: a number with an optional "
                         "suffix such as 500Gi, 2Ti or 16")
    return float(match.group(1)) * _QUANTITY_SUFFIXES[match.group(2)]


def _check_positive_quantity(value: str) -> str:
    """Reject zero sizes (``0Gi`` would render a 0-byte PVC); negatives fail the pattern already."""
    if quantity_bytes(value) <= 0:
        raise ValueError("must be above zero; allowed: a quantity above 0 such as 500Gi, 8 or 500m")
    return value


#: A :data:`Quantity` above zero (sizes, CPU and memory requests).
PositiveQuantity = Annotated[Quantity, AfterValidator(_check_positive_quantity)]

#: A CPU quantity: cores (``8``, ``0.5``) or millicores (``500m``); a YAML number is read as its
#: decimal string, as for :data:`Quantity`. The Kubernetes grammar would also take ``8Gi`` or ``8k``
#: (8,589,934,592 or 8,000 cores): a byte or decimal suffix on a CPU request is a unit mistake, so
#: the pattern admits none; its description (``loader.PATTERN_DESCRIPTIONS``) gives CPU examples.
CPU_QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?m?$"
CpuQuantity = Annotated[str, StringConstraints(pattern=CPU_QUANTITY_PATTERN), BeforeValidator(_quantity_from_number),
                        AfterValidator(_check_positive_quantity)]

#: The smallest pod memory request and L2 PVC size accepted, bytes (1 GiB). A vLLM pod holds GiBs
#: of host memory (the L1 buffer alone is GiBs) and one KV chunk of a 7B model is 14 MiB, so less
#: is a unit mistake: ``80`` without a suffix is 80 bytes, ``500m`` half a byte.
MIN_BYTES_QUANTITY = 2**30


def _check_bytes_quantity(value: str) -> str:
    if quantity_bytes(value) < MIN_BYTES_QUANTITY:
        raise ValueError(
            f"{value!r} is {quantity_bytes(value):,.3g} bytes, below 1Gi (a number without a suffix counts bytes, "
            "'m' thousandths of a byte); allowed: a byte quantity of at least 1Gi such as 80Gi or 2Ti")
    return value


#: A byte quantity of at least 1 GiB (pod memory, PVC sizes): :data:`MIN_BYTES_QUANTITY`.
BytesQuantity = Annotated[PositiveQuantity, AfterValidator(_check_bytes_quantity)]

#: Version strings are pinned exactly: no ``latest``, no ranges.
PINNED_VERSION_PATTERN = r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+.][0-9A-Za-z.-]+)?$"
PinnedVersion = Annotated[str, StringConstraints(pattern=PINNED_VERSION_PATTERN)]


def _check_image_pinned(image: str) -> str:
    """Reject images without an explicit tag or digest, and the mutable ``latest`` tag."""
    name, _, digest = image.partition("@")
    if digest:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise ValueError(f"digest of {image!r} is not sha256:<64 hex>; allowed: <repository>@sha256:<64 lowercase "
                             "hexadecimal digits>")
        return image
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        raise ValueError(f"image {image!r} has no tag; allowed: <repository>:<version tag> or "
                         "<repository>@sha256:<digest>, e.g. lmcache/vllm-openai:v0.5.5")
    tag = last.rsplit(":", 1)[1]
    if tag == "latest" or not tag:
        raise ValueError(f"image {image!r} uses the mutable tag {tag!r}; allowed: a version tag or a sha256 digest")
    return image


PinnedImage = Annotated[str, AfterValidator(_check_image_pinned)]

#: An image pinned by digest: ``<repository>[:<tag>]@sha256:<64 lowercase hex>`` (the tag, when
#: kept, is for readers; the container runtime pulls the digest).
DIGEST_PINNED_IMAGE_PATTERN = r"^[^@\s]+@sha256:[0-9a-f]{64}$"


def is_digest_pinned(image: str) -> bool:
    """Whether ``image`` names its content by digest (:data:`DIGEST_PINNED_IMAGE_PATTERN`)."""
    return re.fullmatch(DIGEST_PINNED_IMAGE_PATTERN, image) is not None

#: The one LMCache release this platform is built and checked against: the env allow-list and
#: the table of unsafe defaults in ``k8s/lmcache.py`` are read from its source, and
#: ``make test-lmcache`` installs exactly this version from PyPI and runs it. A business line's
#: image must carry it (:attr:`VllmConfig.lmcache_release`); moving to another release means
#: changing this value, the image tags, and re-running ``make test-lmcache`` (which reports any
#: drift of the key list). Why 0.5.5: docs/l2-cache.md, "Which image and LMCache version".
LMCACHE_VERSION = "0.5.5"

#: Repository of LMCache's own vLLM images; their tag names the LMCache release inside
#: (``v0.5.5``, optionally with a build suffix such as ``v0.5.5-cu129``; docs/sources.md §8).
LMCACHE_IMAGE_REPOSITORY = "lmcache/vllm-openai"
_LMCACHE_IMAGE_TAG = re.compile(r"^v([0-9]+\.[0-9]+\.[0-9]+(?:\.post[0-9]+)?)(?:-[0-9A-Za-z.-]+)?$")


def lmcache_version_of_image(image: str) -> str | None:
    """LMCache release named by the tag of an ``lmcache/vllm-openai`` image, else None.

    ``lmcache/vllm-openai:v0.5.5`` and ``docker.io/lmcache/vllm-openai:v0.5.5-cu129`` -> ``"0.5.5"``;
    any other repository, or a digest-only reference, -> None (the tag is the only evidence).
    """
    name = image.partition("@")[0]
    repo, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        return None
    if repo.removeprefix("docker.io/").removeprefix("index.docker.io/") != LMCACHE_IMAGE_REPOSITORY:
        return None
    match = _LMCACHE_IMAGE_TAG.match(tag)
    return match.group(1) if match else None

AWS_ACCOUNT_PATTERN = r"^[0-9]{12}$"
AWS_REGION_PATTERN = r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$"
AZ_NAME_PATTERN = r"^[a-z]{2}(-gov)?-[a-z]+-[0-9][a-z]$"

#: The operator's router strategies: the CRD's enum of ``intelligentRoutingSpec.routingStrategy``.
CRD_ROUTING_STRATEGIES = ("prefixaware", "kvaware", "session", "roundrobin")
#: ``routing_strategy: gateway``: the HyperPod Inference Gateway routes the line instead of the operator's
#: router (``spec.inferenceGateway.enabled``; the two are mutually exclusive per model: docs/sources.md §31).
GATEWAY_ROUTING = "gateway"
#: What a line's ``routing_strategy`` accepts: one of the operator's strategies, or the gateway.
ROUTING_STRATEGIES = (*CRD_ROUTING_STRATEGIES, GATEWAY_ROUTING)
RoutingStrategy = Literal["prefixaware", "kvaware", "session", "roundrobin", "gateway"]


class StrictModel(BaseModel):
    """Base for every config model: unknown keys rejected, values immutable after load, no infinite
    or NaN number (YAML's ``.inf`` would pass a ``> 0`` bound). A validator that spans fields raises
    :class:`~platform_config.problems.FieldError` naming the field the user should change."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


