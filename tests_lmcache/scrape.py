"""What vLLM's ``/metrics`` would serve from a Prometheus multiprocess directory, printed as text.

Run as ``python -m tests_lmcache.scrape`` with ``PROMETHEUS_MULTIPROC_DIR`` set, in a process of
its own, standing in for the vLLM API server of the pod. vLLM 0.29.0 (the release inside
``lmcache/vllm-openai:v0.5.5``, docs/sources.md §13) mounts ``/metrics`` on
``get_prometheus_registry()`` (``vllm/entrypoints/serve/instrumentator/metrics.py``), which, when
``PROMETHEUS_MULTIPROC_DIR`` is set, is a fresh ``CollectorRegistry`` holding one
``prometheus_client.multiprocess.MultiProcessCollector`` (``vllm/v1/metrics/prometheus.py``).
vLLM is not installable here, so this module builds the same registry and prints
``generate_latest`` of it (the body ``make_asgi_app`` serves); with ``--serve`` it serves it over
HTTP instead (:func:`serve`).
"""

from __future__ import annotations

import os
import sys

from prometheus_client import CollectorRegistry, generate_latest, multiprocess


def registry() -> CollectorRegistry:
    """vLLM's multiprocess registry; ValueError when ``PROMETHEUS_MULTIPROC_DIR`` is unset or not a
    directory (``MultiProcessCollector``; vLLM's API server would not start either)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") is None:
        raise ValueError("PROMETHEUS_MULTIPROC_DIR is not set: vLLM would serve its own process's registry only")
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg)
    return reg


def serve() -> None:
    """``--serve``: answer ``GET /metrics`` with the directory's metrics on a free loopback port
    (printed as the first line of stdout) until SIGTERM: a pod's ``/metrics`` for a live Prometheus."""
    import signal
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    registry()  # fails now, not at the first scrape, when the directory is missing

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = generate_latest(registry()) if self.path.split("?", 1)[0] == "/metrics" else b"not found\n"
            self.send_response(200 if body != b"not found\n" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return 0
    sys.stdout.write(generate_latest(registry()).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
