"""What the in-cluster agents l2_janitor.py (with hot_prefixes.py), l2_mount_watchdog.py and kv_canary.py share.

Standard library only. Each chart ships it beside its script in the script's ConfigMap (k8s/agent.py),
from whose directory the script imports it. Every agent's ConfigMap carries it: keep it small.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TEXT = "text/plain; charset=utf-8"
METRICS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class ApiError(Exception):
    """An API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KubeApi:
    """The API server at ``base_url`` (``https://host:port``): bearer ``token``, or ``token_file``'s
    text read at each call (service-account tokens rotate); TLS ``context`` (None: plain HTTP);
    ``timeout_s`` seconds per request."""

    def __init__(self, base_url: str, *, token: str = "", token_file: Path | None = None,
                 context: ssl.SSLContext | None = None, timeout_s: float = 10) -> None:
        self.base_url, self.token, self.token_file = base_url.rstrip("/"), token, token_file
        self.context, self.timeout_s = context, timeout_s

    @classmethod
    def in_cluster(cls, *, timeout_s: float = 10) -> Any:
        """With the Pod's service account. KeyError without ``KUBERNETES_SERVICE_HOST``, OSError without its CA."""
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}", timeout_s=timeout_s,
                   token_file=SERVICE_ACCOUNT_DIR / "token",
                   context=ssl.create_default_context(cafile=str(SERVICE_ACCOUNT_DIR / "ca.crt")))

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON object answered to ``method path`` (``body`` sent as JSON). Raises
        :class:`ApiError`; OSError if ``token_file`` cannot be read."""
        token = self.token_file.read_text(encoding="utf-8").strip() if self.token_file else self.token
        headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode("utf-8"), "application/json"
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise ApiError(exc.code, f"{method} {path}: HTTP {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from None

    def list_pods(self, namespace: str, field_selector: str = "") -> list[dict[str, Any]]:
        """The Pods of ``namespace`` (those ``field_selector`` selects, if given); raises as :meth:`call`."""
        query = "?" + urllib.parse.urlencode({"fieldSelector": field_selector}) if field_selector else ""
        return self.call("GET", f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods{query}").get("items") or []


def replica_request(url: str, method: str, path: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]:
    """One plain-HTTP request to a replica (``url``: ``http://<pod IP>:<port>``), JSON ``body`` if
    any: (status, reply body). OSError (a timeout included) when the replica does not answer."""
    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def config_from_dict(cls: Callable[..., Any], data: dict[str, Any], what: str) -> Any:
    """``cls(**data)``: a rendered JSON config as its dataclass. ValueError ``<what> config: ...``
    on a missing or unknown key (``cls`` raises its own for a bad value)."""
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{what} config: {exc}") from None


def sample(name: str, labels: dict[str, str], value: str) -> str:
    """One sample line of the Prometheus text format (:data:`METRICS_TEXT`): ``name{k="v",...} value``,
    label values escaped as the format requires (backslash, newline, double quote), in the order of
    ``labels``; ``value`` as the caller formats it."""
    def escaped(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    pairs = ",".join(f'{k}="{escaped(v)}"' for k, v in labels.items())
    return f"{name}{{{pairs}}} {value}"


def family(name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], str]] = ()) -> list[str]:
    """One metric family: its ``# HELP`` and ``# TYPE`` (``gauge``, ``counter``, ``histogram``) lines,
    then :func:`sample` of ``name`` for each (labels, value) of ``samples``."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *(sample(name, l, v) for l, v in samples)]


def health(check: Callable[[], tuple[bool, str]]) -> Callable[[], tuple[int, str, str]]:
    """A probe's route for :func:`make_server`: 200 if ``check()`` gives (True, text), else 503."""
    def route() -> tuple[int, str, str]:
        ok, text = check()
        return (200 if ok else 503), text + "\n", TEXT
    return route


def make_server(routes: dict[str, Callable[[], tuple[int, str, str]]], port: int, host: str = "") -> ThreadingHTTPServer:
    """HTTP server answering ``GET <path>[?query]`` with ``routes[path]()`` (status, body, content
    type), else 404; no request log. ``port`` 0 picks a free one. OSError if it is taken."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            route = routes.get(self.path.split("?", 1)[0])
            status, body, kind = route() if route else (404, "not found\n", TEXT)
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            pass  # scrapes and probes: not worth a log line each

    return ThreadingHTTPServer((host, port), Handler)


def every(period_s: float, step: Callable[[], Any], stop: threading.Event) -> None:
    """``step()`` until ``stop`` is set (checked between steps), one starting every ``period_s``
    seconds, or at once after a longer one."""
    while not stop.is_set():
        began = time.monotonic()
        step()
        stop.wait(max(0.0, period_s - (time.monotonic() - began)))


def serve(make: Callable[[int], ThreadingHTTPServer], port: int, loop: Callable[[threading.Event], None]) -> int:
    """``--serve``: server ``make(port)`` in a thread, ``loop(stop)`` until SIGTERM or Ctrl-C. Exit
    status 0, or 2 (an error, operator_tools/cli.py) when the port cannot be served."""
    try:
        server = make(port)
    except OSError as exc:  # e.g. the port is taken
        print(f"error: cannot serve on port {port}: {exc}", file=sys.stderr)
        return 2
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        loop(stop)
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0


#: LMCache's fs:// URL of the line's L2 directory, in the env the L2 mutation gives the vLLM container.
REMOTE_URL_ENV = "LMCACHE_REMOTE_URL"


def l2_dir_of(url: str, mount_path: str) -> str | None:
    """The directory of an ``fs://host:port/<mount>/<dir>/`` URL relative to ``mount_path`` (``""``
    for the mount itself), or None for another scheme or a path outside the mount."""
    parsed = urllib.parse.urlparse(url)
    path, mount = parsed.path.rstrip("/"), mount_path.rstrip("/")
    if parsed.scheme != "fs" or not (path == mount or path.startswith(mount + "/")):
        return None
    return path[len(mount) + 1:]


@dataclass(frozen=True)
class EndpointPod:
    """A Running, Ready, not deleting replica of an endpoint: ``name``, ``uid``, ``created`` (its
    ``creationTimestamp``, RFC 3339 text), ``url`` (``http://<pod IP>:<port>``) and its vLLM container's
    ``remote_url`` (:data:`REMOTE_URL_ENV`, ``""`` when unset)."""

    name: str
    uid: str
    created: str
    url: str
    remote_url: str


def endpoint_pods(pods: list[dict[str, Any]], pod_label: tuple[str, str], port_name: str,
                  port: int) -> list[EndpointPod]:
    """The Running, Ready, not deleting Pods of ``pods`` (API objects) labelled ``pod_label`` whose
    container exposes vLLM's port (named ``port_name``, else number ``port``), in ``pods``' order."""
    key, value = pod_label
    found = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if (meta.get("labels") or {}).get(key) != value or meta.get("deletionTimestamp"):
            continue
        if status.get("phase") != "Running" or not status.get("podIP"):
            continue
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
            continue
        for container in spec.get("containers") or []:
            ports = container.get("ports") or []
            named = [p["containerPort"] for p in ports if p.get("name") == port_name and "containerPort" in p]
            if not named and not any(p.get("containerPort") == port for p in ports):
                continue
            env = {e.get("name"): e.get("value") for e in container.get("env") or []}
            host = status["podIP"]
            host = f"[{host}]" if ":" in host else host
            found.append(EndpointPod(meta.get("name", ""), meta.get("uid", ""), meta.get("creationTimestamp") or "",
                                     f"http://{host}:{named[0] if named else port}", env.get(REMOTE_URL_ENV) or ""))
            break
    return found
