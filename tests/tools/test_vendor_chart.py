"""scripts/vendor_chart.py against a real HTTPS Helm repository on 127.0.0.1 (certificate verified):
the archive kept only when its SHA-256 is the index's digest (and the config's), written where
synthesis reads it, the digest printed; a tampered archive, a re-published version, a missing
version and an OCI registry are refused with nothing written."""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from operator_tools import chart_vendor
from operator_tools.cli import EXIT_ERROR, EXIT_NO, EXIT_OK
from platform_config.platform_models import HelmChartVersion
from tests.example_config import FIXTURE_CONFIG
from tests.helm.charts import HttpsChartRepository, chart_archive, index_entry, write_index
from tests.tools.script_loader import load_script

KYVERNO, DCGM = ("kyverno", "3.5.2"), ("dcgm-exporter", "4.8.2")


@pytest.fixture()
def repo(tmp_path, monkeypatch):
    """An HTTPS repository with kyverno 3.5.2 (relative URL, as Helm's own index writes) and
    dcgm-exporter 4.8.2 (absolute URL); ``digests`` by chart name."""
    served = tmp_path / "served"
    digests = {KYVERNO[0]: chart_archive(served / "kyverno-3.5.2.tgz", *KYVERNO),
               DCGM[0]: chart_archive(served / "archives" / "dcgm-exporter-4.8.2.tgz", *DCGM)}
    server = HttpsChartRepository(served, tmp_path / "certs")
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
    write_index(served, {
        KYVERNO[0]: [index_entry(*KYVERNO, "kyverno-3.5.2.tgz", digests[KYVERNO[0]]),
                     index_entry(KYVERNO[0], "3.5.1", "kyverno-3.5.1.tgz", "sha256:" + "0" * 64)],
        DCGM[0]: [index_entry(*DCGM, f"{server.url}archives/dcgm-exporter-4.8.2.tgz", digests[DCGM[0]])],
    })
    server.digests, server.served = digests, served
    yield server
    server.close()


def pin(repo, name_version=KYVERNO, **extra) -> HelmChartVersion:
    return HelmChartVersion(repository=repo.url, chart=name_version[0], version=name_version[1], **extra)


def test_the_archive_is_kept_with_the_index_digest(repo, tmp_path) -> None:
    target = tmp_path / "charts" / "kyverno-3.5.2.tgz"
    done = chart_vendor.vendor(pin(repo), target)
    assert done.digest == repo.digests["kyverno"]
    assert target.read_bytes() == (repo.served / "kyverno-3.5.2.tgz").read_bytes()
    assert done.size == target.stat().st_size
    assert [p.name for p in target.parent.iterdir()] == ["kyverno-3.5.2.tgz"]  # no temporary file left


def test_a_configured_digest_must_be_the_index_one(repo, tmp_path) -> None:
    target = tmp_path / "kyverno.tgz"
    chart_vendor.vendor(pin(repo, digest=repo.digests["kyverno"]), target)  # equal: fine
    target.unlink()
    with pytest.raises(chart_vendor.DigestMismatch, match=repo.digests["kyverno"]):
        chart_vendor.vendor(pin(repo, digest="sha256:" + "a" * 64), target)
    assert not target.exists()


def test_an_archive_that_is_not_what_the_index_lists_is_refused(repo, tmp_path) -> None:
    archive = repo.served / "kyverno-3.5.2.tgz"
    archive.write_bytes(archive.read_bytes() + b"tampered")
    target = tmp_path / "kyverno.tgz"
    with pytest.raises(chart_vendor.VendorError, match="but the index lists " + repo.digests["kyverno"]):
        chart_vendor.vendor(pin(repo), target)
    assert not target.exists()


@pytest.mark.parametrize(("name_version", "message"), [
    (("kyverno", "9.9.9"), "kyverno has no version 9.9.9; the newest listed: 3.5.2, 3.5.1"),
    (("policy-reporter", "1.0.0"), "no chart 'policy-reporter'; allowed: dcgm-exporter, kyverno"),
])
def test_an_unknown_chart_or_version_names_what_the_index_has(repo, tmp_path, name_version, message) -> None:
    with pytest.raises(chart_vendor.VendorError) as info:
        chart_vendor.vendor(pin(repo, name_version), tmp_path / "x.tgz")
    assert message in str(info.value)


@pytest.fixture()
def plain_http(repo):
    """The same folder over plain http on 127.0.0.1 (what a redirect must not be followed to)."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(repo.served))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/index.yaml", "/kyverno-3.5.2.tgz"])
def test_a_redirect_to_plain_http_is_refused(repo, plain_http, tmp_path, path) -> None:
    """Whoever sits on a plain-http path could serve the index and the archive together."""
    repo.redirects[path] = plain_http + path.lstrip("/")
    with pytest.raises(chart_vendor.VendorError,
                       match=re.escape(f"redirected to {plain_http}{path.lstrip('/')}; only https is fetched")):
        chart_vendor.vendor(pin(repo), tmp_path / "x.tgz")
    assert not (tmp_path / "x.tgz").exists()


def test_a_redirect_to_https_is_followed(repo, tmp_path) -> None:
    repo.redirects["/kyverno-3.5.2.tgz"] = repo.url + "moved/kyverno-3.5.2.tgz"
    (repo.served / "moved").mkdir()
    (repo.served / "moved" / "kyverno-3.5.2.tgz").write_bytes((repo.served / "kyverno-3.5.2.tgz").read_bytes())
    assert chart_vendor.vendor(pin(repo), tmp_path / "x.tgz").digest == repo.digests["kyverno"]


def test_an_index_listing_a_plain_http_archive_is_refused(repo, plain_http, tmp_path) -> None:
    write_index(repo.served, {"kyverno": [index_entry(*KYVERNO, plain_http + "kyverno-3.5.2.tgz",
                                                      repo.digests["kyverno"])]})
    with pytest.raises(chart_vendor.VendorError, match="only https is fetched"):
        chart_vendor.vendor(pin(repo), tmp_path / "x.tgz")


@pytest.mark.parametrize("versions", [{"3.5.2": {}}, ["not an entry"], [{"version": "3.5.2", "urls": "x.tgz",
                                                                          "digest": "0" * 64}]])
def test_a_malformed_index_is_an_error_not_a_traceback(repo, tmp_path, versions) -> None:
    (repo.served / "index.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "entries": {"kyverno": versions}}))
    with pytest.raises(chart_vendor.VendorError, match="index.yaml: "):
        chart_vendor.vendor(pin(repo), tmp_path / "x.tgz")


def test_an_untrusted_certificate_is_an_error_not_a_download(repo, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-ca.pem"))
    with pytest.raises(chart_vendor.VendorError, match="CERTIFICATE_VERIFY_FAILED"):
        chart_vendor.vendor(pin(repo), tmp_path / "x.tgz")


def test_an_oci_registry_gets_the_manual_step(tmp_path) -> None:
    oci = HelmChartVersion(repository="oci://ghcr.io/nvidia/charts", chart="dcgm-exporter", version="4.8.2")
    with pytest.raises(chart_vendor.VendorError, match=r"helm pull oci://ghcr.io/nvidia/charts/dcgm-exporter "
                                                        r"--version 4.8.2`, then `sha256sum`"):
        chart_vendor.vendor(oci, tmp_path / "x.tgz")


@pytest.fixture()
def config_dir(repo, tmp_path) -> Path:
    """The fixture config, both charts pointed at ``repo`` and their archives at tmp_path/charts/."""
    folder = tmp_path / "config"
    shutil.copytree(FIXTURE_CONFIG, folder)
    platform = yaml.safe_load((folder / "platform.yaml").read_text())
    for chart in (platform["versions"]["charts"]["kyverno"], platform["observability"]["dcgm_exporter"]["chart"]):
        chart.update(repository=repo.url, archive=str(tmp_path / "charts" / f"{chart['chart']}.tgz"))
    (folder / "platform.yaml").write_text(yaml.safe_dump(platform))
    return folder


def test_the_script_writes_every_chart_and_prints_the_digests_to_pin(repo, config_dir, tmp_path, capsys) -> None:
    code = load_script("vendor_chart").main(["--config", str(config_dir)])
    out = capsys.readouterr().out.splitlines()
    assert code == EXIT_OK
    for field, name in (("versions.charts.kyverno", "kyverno"), ("observability.dcgm_exporter.chart", "dcgm-exporter")):
        written = tmp_path / "charts" / f"{name}.tgz"
        digest = "sha256:" + hashlib.sha256(written.read_bytes()).hexdigest()
        assert digest == repo.digests[name]
        assert f"{field}: wrote {written} ({written.stat().st_size:,} bytes); set {field}.digest: {digest}" in out


def test_the_script_answers_no_for_a_republished_version(repo, config_dir, tmp_path, capsys) -> None:
    platform = yaml.safe_load((config_dir / "platform.yaml").read_text())
    platform["versions"]["charts"]["kyverno"]["digest"] = "sha256:" + "b" * 64
    (config_dir / "platform.yaml").write_text(yaml.safe_dump(platform))
    code = load_script("vendor_chart").main(["--config", str(config_dir), "--chart", "versions.charts.kyverno"])
    assert code == EXIT_NO
    assert "the config says sha256:bbbb" in capsys.readouterr().out
    assert not (tmp_path / "charts" / "kyverno.tgz").exists()


def test_the_script_refuses_a_chart_the_config_does_not_install(config_dir, capsys) -> None:
    code = load_script("vendor_chart").main(["--config", str(config_dir), "--chart", "versions.charts.cert-manager"])
    assert code == EXIT_ERROR
    assert capsys.readouterr().err.strip() == (
        "error: --chart versions.charts.cert-manager: not a chart this config installs; allowed: "
        "versions.charts.kyverno, observability.dcgm_exporter.chart")
