"""Vendor a Helm chart: download its archive, check it against the repository's index, keep it.

A classic Helm repository serves ``index.yaml``; each version of each chart there lists ``urls`` (the
archive, absolute or relative to the repository) and ``digest``, the SHA-256 of that archive (Helm,
"The Chart Repository Guide"; docs/sources.md §34). :func:`vendor` fetches both, refuses an archive
whose SHA-256 is not the index's digest, and writes it where synthesis reads it
(``HelmChartVersion.archive_path``). The platform then installs the committed archive
(kv_constructs/helm_charts.py), so a version re-published in the repository changes nothing deployed.

OCI registries have no ``index.yaml``; for them, ``helm pull oci://... --version`` then ``sha256sum``
is the documented manual step (docs/security.md, "Helm charts by digest").
"""

from __future__ import annotations

import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from platform_config.platform_models import CHART_DIGEST_PATTERN, HelmChartVersion, chart_digest

#: Largest index or archive read (bytes): a bound far above a chart archive or a repository index,
#: so that a response that is neither is refused rather than read into memory.
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
#: Seconds to wait for a repository to answer (connect and each read).
TIMEOUT_S = 30.0


class VendorError(Exception):
    """Bad input or an unreachable repository: nothing was written."""


class DigestMismatch(Exception):
    """The configured ``digest`` is not the one the repository's index lists: nothing was written."""


@dataclass(frozen=True)
class Vendored:
    """One chart written: where, how big (bytes) and its digest (``sha256:<hex>``)."""

    path: Path
    size: int
    digest: str


class _HttpsOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows a redirect to plain http by default, which would let whoever is on that path
    serve the index and the archive together (and so pass the digest check): refused."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        if urllib.parse.urlsplit(newurl).scheme != "https":
            raise VendorError(f"{req.full_url}: redirected to {newurl}; only https is fetched")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpsOnlyRedirects)


def _get(url: str) -> bytes:
    """The body of ``url``, over HTTPS only (redirects included), certificates verified by Python's
    default context, at most :data:`MAX_DOWNLOAD_BYTES`.

    Raises:
        VendorError: not https, redirected to another scheme, unreachable, an HTTP error, or too large.
    """
    if urllib.parse.urlsplit(url).scheme != "https":
        raise VendorError(f"{url}: only https is fetched")
    try:
        with _OPENER.open(url, timeout=TIMEOUT_S) as response:
            body = response.read(MAX_DOWNLOAD_BYTES + 1)
    except (urllib.error.URLError, OSError) as exc:
        raise VendorError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    if len(body) > MAX_DOWNLOAD_BYTES:
        raise VendorError(f"{url}: larger than {MAX_DOWNLOAD_BYTES // (1024 * 1024)} MiB; refused")
    return body


def index_entry(pin: HelmChartVersion) -> tuple[str, str]:
    """The archive URL and digest that ``<pin.repository>/index.yaml`` lists for ``pin``'s version.

    Raises:
        VendorError: an OCI repository, the index unreachable or not a Helm index, the chart or
            version absent (the nearest versions named), or an entry without ``urls`` or a
            ``sha256:`` digest.
    """
    if pin.repository.startswith("oci://"):
        raise VendorError(f"{pin.repository} is an OCI registry (no index.yaml): run `helm pull {pin.repository}/"
                          f"{pin.chart} --version {pin.version}`, then `sha256sum` the archive (docs/security.md)")
    base = pin.repository.rstrip("/") + "/"
    index_url = urllib.parse.urljoin(base, "index.yaml")
    try:
        index = yaml.safe_load(_get(index_url))
    except yaml.YAMLError as exc:
        raise VendorError(f"{index_url}: not YAML: {exc}") from None
    entries = index.get("entries") if isinstance(index, dict) else None
    if not isinstance(entries, dict):
        raise VendorError(f"{index_url}: no entries; not a Helm repository index")
    versions = entries.get(pin.chart)
    if not versions:
        raise VendorError(f"{index_url}: no chart {pin.chart!r}; allowed: {', '.join(sorted(map(str, entries))[:20])}")
    if not isinstance(versions, list) or not all(isinstance(v, dict) for v in versions):
        raise VendorError(f"{index_url}: entries.{pin.chart} is not a list of versions; not a Helm repository index")
    entry = next((v for v in versions if str(v.get("version")) == pin.version), None)
    if entry is None:
        listed = ", ".join(str(v.get("version")) for v in versions[:10])
        raise VendorError(f"{index_url}: {pin.chart} has no version {pin.version}; the newest listed: {listed}")
    urls, digest = entry.get("urls"), str(entry.get("digest", ""))
    if (not isinstance(urls, list) or not urls or not isinstance(urls[0], str)
            or re.fullmatch(CHART_DIGEST_PATTERN, f"sha256:{digest}") is None):
        raise VendorError(f"{index_url}: {pin.chart} {pin.version} lists no archive URL or no SHA-256 digest")
    return urllib.parse.urljoin(base, urls[0]), f"sha256:{digest}"


def vendor(pin: HelmChartVersion, target: Path) -> Vendored:
    """Download ``pin``'s archive, check it against the repository's index, write it to ``target``.

    ``target`` is written only once everything checked out (a temporary file renamed into place).

    Raises:
        VendorError: as :func:`index_entry`, or the downloaded archive's SHA-256 is not the index's.
        DigestMismatch: ``pin.digest`` is set and the index lists another.
    """
    url, listed = index_entry(pin)
    if pin.digest is not None and pin.digest != listed:
        raise DigestMismatch(f"{pin.chart} {pin.version}: the config says {pin.digest}, the repository's index "
                             f"lists {listed} (re-published, or the config is wrong); nothing written")
    body = _get(url)
    actual = chart_digest(body)
    if actual != listed:
        raise VendorError(f"{url}: SHA-256 {actual}, but the index lists {listed}; nothing written")
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(body)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Vendored(target, len(body), actual)
