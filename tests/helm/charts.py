"""Helm chart archives and an HTTPS chart repository on 127.0.0.1, for the chart-by-digest tests.

:func:`chart_archive` writes what ``helm package`` writes: a gzipped tar of one folder named after
the chart, ``Chart.yaml`` at its top. :class:`HttpsChartRepository` serves a folder over HTTPS with
a certificate made by Debian's ``openssl`` for ``localhost``, which the tests trust through
``SSL_CERT_FILE`` (read by Python's default SSL context), so the code under test fetches exactly as
it does from a real repository: ``https://``, the certificate verified.
"""

from __future__ import annotations

import functools
import hashlib
import io
import ssl
import subprocess
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml


def chart_archive(path: Path, name: str, version: str, *, top: str | None = None,
                  extra: dict[str, bytes] | None = None, links: dict[str, str] | None = None) -> str:
    """Write a chart archive of ``name`` ``version`` to ``path``; return its ``sha256:<hex>``.

    Args:
        top: the folder at the archive's top (default ``name``, as Helm writes it).
        extra: more members, by path inside the archive, e.g. ``{"../escape": b"x"}``.
        links: symbolic-link members, path -> target, e.g. ``{"kyverno/t.yaml": "Chart.yaml"}``.
    """
    folder = top or name
    members = {
        f"{folder}/Chart.yaml": yaml.safe_dump({"apiVersion": "v2", "name": name, "version": version}).encode(),
        f"{folder}/values.yaml": b"replicas: 1\n",
        f"{folder}/templates/configmap.yaml": (
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata:\n  chart: "
            + name.encode() + b"\n"),
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size, info.mtime = len(data), 1_700_000_000
            archive.addfile(info, io.BytesIO(data))
        for member, target in (links or {}).items():
            info = tarfile.TarInfo(member)
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 1_700_000_000
            archive.addfile(info)
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def write_index(folder: Path, charts: dict[str, list[dict[str, Any]]]) -> None:
    """``index.yaml`` as a classic Helm repository serves it (``apiVersion: v1``, ``entries``)."""
    (folder / "index.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "entries": charts}), encoding="utf-8")


def index_entry(name: str, version: str, url: str, digest: str) -> dict[str, Any]:
    """One version's entry; ``digest`` without the ``sha256:`` prefix, as Helm writes it."""
    return {"name": name, "version": version, "urls": [url], "digest": digest.removeprefix("sha256:"),
            "apiVersion": "v2"}


class HttpsChartRepository:
    """Serves ``folder`` at ``https://localhost:<port>/`` until :meth:`close`; :attr:`ca_file` is the
    certificate to trust (self-signed, ``subjectAltName`` localhost and 127.0.0.1); a path in
    :attr:`redirects` answers ``302 Found`` to its URL instead."""

    def __init__(self, folder: Path, certs: Path) -> None:
        certs.mkdir(parents=True, exist_ok=True)
        self.ca_file, key = certs / "cert.pem", certs / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(self.ca_file)], check=True, capture_output=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, key)

        #: Request path -> the URL a ``302 Found`` sends the client to (set by a test).
        self.redirects: dict[str, str] = {}
        redirects = self.redirects

        class Quiet(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path in redirects:
                    self.send_response(302)
                    self.send_header("Location", redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        handler = functools.partial(Quiet, directory=str(folder))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.url = f"https://localhost:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
