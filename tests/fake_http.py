"""A JSON HTTP server on 127.0.0.1 for tests whose code under test talks HTTP to a stand-in (the
Kubernetes API server of the agents, Grafana's HTTP API of the dashboard provisioner).

The stand-in is one function, ``answer(method, path, body, headers) -> (status, body)``: the request
body parsed from JSON (None when empty), the reply serialised as JSON with its length. Each request
runs on a thread of its own (``ThreadingHTTPServer``), as a real server answers concurrent clients.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: ``answer(method, path with query, parsed JSON body or None, request headers) -> (HTTP status, JSON body)``.
Answer = Callable[[str, str, Any, Mapping[str, str]], tuple[int, Any]]


class JsonServer:
    """Serves ``answer`` on an ephemeral port until :meth:`close` (or the end of a ``with`` block)."""

    def __init__(self, answer: Answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                status, reply = answer(self.command, self.path, body, self.headers)
                raw = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._http.serve_forever, name="fake-http", daemon=True).start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> JsonServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
