"""Helm charts installed from a repository, by version or, with a digest, from a checked archive.

``eks.HelmChart`` with ``repository`` and ``version`` has the kubectl handler run ``helm upgrade --install
--version``: the repository serves whatever bytes it holds for that version on the day of the deploy, and
no option checks a digest. A :class:`~platform_config.platform_models.HelmChartVersion` with ``digest``
is installed instead from its archive committed in this repository: synthesis checks the archive's
SHA-256 against the digest, extracts it (Python's ``tarfile`` ``data`` filter, then files and folders
only: no absolute paths, no links, nothing outside the folder) and ships the chart folder as an S3
asset (``chart_asset``), which the handler unzips and installs. So what runs is what was reviewed, and a moved version in the repository
changes nothing. docs/security.md, "Helm charts by digest"; docs/sources.md §34.
"""

from __future__ import annotations

import atexit
import io
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from platform_config.platform_models import HelmChartVersion, chart_digest

#: Extracted charts of this process ((archive, digest, chart, version) -> chart folder): each archive
#: is hashed on every call, extracted and checked once.
_EXTRACTED: dict[tuple[Path, str, str, str], Path] = {}


#: Largest total size (bytes) of an archive's files once extracted: a bound of ours far above a chart,
#: so that a compressed archive that unpacks to gigabytes is refused before it is written.
MAX_EXTRACTED_BYTES = 256 * 1024 * 1024


def _files_and_folders_only(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter (no absolute paths, nothing outside ``dest``, no device files), and
    then only regular files and folders: Helm packages no links, so one is not a chart's."""
    member = tarfile.data_filter(member, dest)
    if not (member.isfile() or member.isdir()):
        raise ValueError(f"member {member.name!r} is a link or special file; allowed: files and folders")
    return member


def verified_chart_dir(pin: HelmChartVersion) -> Path:
    """Check ``pin``'s archive against ``pin.digest`` and return the extracted chart folder.

    The archive is read once: the bytes hashed are the bytes extracted. The folder (``Chart.yaml`` at
    its top) lives in a temporary directory removed when the process exits; CDK copies it into the
    cloud assembly when the asset is created.

    Raises:
        ValueError: ``pin`` has no digest; the archive is missing; its SHA-256 differs from the digest
            (both named); it is not a gzipped tar; a member (named) would land outside the folder or
            is a link or special file; its files exceed :data:`MAX_EXTRACTED_BYTES`; it holds not
            exactly one top folder named ``pin.chart`` with a ``Chart.yaml`` whose ``name`` and
            ``version`` are ``pin.chart`` and ``pin.version``.
    """
    if pin.digest is None:
        raise ValueError(f"{pin.chart} {pin.version} has no digest, so it is installed from its repository")
    path = pin.archive_file()
    if not path.is_file():
        raise ValueError(f"no chart archive at {path}; write it with scripts/vendor_chart.py (docs/security.md, "
                         f"'Helm charts by digest'), or remove the digest to install {pin.chart} {pin.version} "
                         f"from {pin.repository}")
    data = path.read_bytes()
    actual = chart_digest(data)
    if actual != pin.digest:
        raise ValueError(f"{path} has SHA-256 {actual}, not the configured {pin.digest}; allowed: the archive "
                         f"of {pin.chart} {pin.version} whose digest the repository's index.yaml lists")
    key = (path, pin.digest, pin.chart, pin.version)
    if key in _EXTRACTED:
        return _EXTRACTED[key]
    target = Path(tempfile.mkdtemp(prefix=f"chart-{pin.chart}-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = archive.getmembers()
            size = sum(m.size for m in members if m.isfile())
            if size > MAX_EXTRACTED_BYTES:
                raise ValueError(f"its files add up to {size:,} bytes; allowed: at most {MAX_EXTRACTED_BYTES:,}")
            archive.extractall(target, members=members, filter=_files_and_folders_only)
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise ValueError(f"{path} refused as a chart archive (a gzipped tar of one folder): {exc}") from None
    tops = sorted(p.name for p in target.iterdir())
    if tops != [pin.chart]:
        raise ValueError(f"{path} holds {', '.join(tops) or 'nothing'} at its top; allowed: one folder {pin.chart}/")
    chart_dir = target / pin.chart
    try:
        meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {pin.chart}/Chart.yaml unreadable: {exc}") from None
    found = (str(meta.get("name")), str(meta.get("version")))
    if found != (pin.chart, pin.version):
        raise ValueError(f"{path}: its Chart.yaml is {found[0]} {found[1]}; allowed: {pin.chart} {pin.version}")
    _EXTRACTED[key] = chart_dir
    return chart_dir


def pinned_helm_chart(scope: Construct, construct_id: str, *, cluster: eks.ICluster, pin: HelmChartVersion,
                      **options: Any) -> eks.HelmChart:
    """An ``eks.HelmChart`` of ``pin``: from its checked archive when ``pin.digest`` is set (an S3 asset
    ``<construct_id>Archive``), else from ``pin.repository`` at ``pin.version``.

    Args:
        options: the other ``eks.HelmChart`` arguments (release, namespace, values, wait, ...).

    Raises:
        ValueError: as :func:`verified_chart_dir` (``stacks.build_platform`` checks every pin first and
            raises a ConfigError naming the field instead).
    """
    if pin.digest is None:
        return eks.HelmChart(scope, construct_id, cluster=cluster, chart=pin.chart, repository=pin.repository,
                             version=pin.version, **options)
    asset = s3_assets.Asset(scope, f"{construct_id}Archive", path=str(verified_chart_dir(pin)))
    return eks.HelmChart(scope, construct_id, cluster=cluster, chart_asset=asset, **options)
