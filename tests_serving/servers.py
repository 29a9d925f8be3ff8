"""Real ``vllm serve`` processes of one business line, started from the rendered Pod, and their HTTP API.

What a server gets, against what the admitted Pod's vLLM container would run
(:func:`serving_env`, :func:`serving_argv`; ``test_only_substitution.py`` reads both back from
``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline``):

=============================================  ==============================================  =========================================
rendered (admitted Pod)                        here                                            why
=============================================  ==============================================  =========================================
env: every variable                            the same value                                  (LMCache and vLLM read them as in the Pod)
env ``LMCACHE_REMOTE_URL`` .../mnt/curvine/...  fs:// URL of the same relative path under the  no Curvine here; the mount is the fault
                                               tier's FUSE mount (:mod:`tests_serving.chunkfs`)  tier's FUSE passthrough over a plain dir
env ``LMCACHE_MAX_LOCAL_CPU_SIZE`` (16 GiB)    :data:`TEST_L1_GIB`                             LMCache allocates L1 for real; 2+ servers
env ``PROMETHEUS_MULTIPROC_DIR`` (emptyDir)    a temporary directory per server                the Pod's emptyDir volume
(no such variable)                             ``VLLM_CPU_KVCACHE_SPACE``                       CPU stand-in of the GPU's KV cache memory
(no such variable)                             ``VLLM_CPU_OMP_THREADS_BIND`` one core each     two servers on 2 cores, no shared core
(no such variable)                             ``KVCACHE_TEST_CONNECTOR_BASE``                 the class the rendered args name
env ``KVCACHE_L2_KEY`` (``secretKeyRef`` of     :data:`TEST_CHUNK_KEY`                          the line's chunk-key Secret, which the janitor
the line's chunk-key Secret; the export keeps                                                  creates in the cluster; here a fixed test key,
only plain values)                                                                             so the keyed chunk names are the ones tested
env ``PYTHONPATH`` (the plugin ConfigMap's     a temporary directory holding the rendered      the Pod's read-only ConfigMap volume; the
mount, /opt/kvcache/vllm-plugins)              ConfigMap's files (:func:`write_plugins`), then  repository makes the test connector module
                                               the repository                                  importable
(no such variable)                             ``PATH``, ``HOME``                              a process environment
env ``KVCACHE_L2_GATE_OPEN_AFTER_MS`` /         both :data:`GATE_TEST_MS`                        three vLLM servers on 2 cores slow a healthy
``..._LOOKUP_SLOW_MS`` (``lmcache.l2_gate``:    (only when the base is the L2 gate)             probe through the FUSE mount past 50 ms
50 / 100 ms)                                                                                   (seen: 422 ms), and the gate then opens on a
                                                                                               healthy L2 and skips it; the faults'
                                                                                               probes still outlast the bound (hang: 3 s)
env ``LMCACHE_LOOKUP_TIMEOUT_MS`` (200: twice  :data:`LOOKUP_TIMEOUT_TEST_MS`, twice the gate's  the scheduler's lookup RPC to the worker
the gate's lookup bound)                       test bound                                      (a stat per chunk through the Python FUSE
                                                                                               daemon) took over 200 ms on the healthy
                                                                                               mount here, and LMCache then answers 0 hit
                                                                                               tokens ("Timeout occurred for rank 0"): the
                                                                                               request silently runs without L2 (seen on
                                                                                               all three servers at once, 2026-12-03)
args: positional model ``/opt/ml/model``       ``--model <tiny model dir>``                   no weights here (:mod:`tests_serving.tiny_model`);
                                                                                               ``python -m vllm.entrypoints.openai.api_server``
                                                                                               ignores the positional model ``vllm serve``
                                                                                               takes (entry.py ``main`` never reads
                                                                                               ``model_tag``)
args: ``--tensor-parallel-size``,              dropped                                         GPU only (one CPU worker)
``--pipeline-parallel-size``,
``--gpu-memory-utilization``, ...
args: ``--kv-transfer-config``                 the same JSON but ``kv_connector`` /            LMCache 0.5.5 has no CPU copy connector
                                               ``kv_connector_module_path``: the test copy     (:mod:`tests_serving.cpu_connector`);
                                               connector, subclass of what the rendered JSON   its base is the rendered class
                                               names
(none)                                         ``--host 127.0.0.1 --port N``                   several servers on one host
(none)                                         ``--dtype float32``                             vLLM's CPU platform downcasts float32 to
                                                                                               bfloat16 by default; float32 keeps a
                                                                                               completion over loaded KV bit-stable, so
                                                                                               "identical" is a sharp test
(none)                                         ``-O0``                                         no torch.compile: on 2 CPU cores it costs
                                                                                               about 2 min per server at every start (the
                                                                                               AOT cache does not load back on CPU); on a
                                                                                               GPU it is a start-up cost too, not a
                                                                                               different KV path
=============================================  ==============================================  =========================================

The rendered ``--kv-transfer-config`` is the operator's value completed by the platform
(:mod:`k8s.kv_transfer`: the L2 gate's ``GatedLMCacheConnectorV1`` from ``kvcache_l2_gate``,
``kv_role`` ``kv_both``, ``kv_load_failure_policy`` ``recompute``); the test connector subclasses
whatever class it names (``KVCACHE_TEST_CONNECTOR_BASE``). The args come from
:func:`rendered_args` alone.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests_serving import cpu_connector

REPO = Path(__file__).resolve().parents[1]
#: The line the tier serves: rag-assistant (L2 on, ``--enable-prefix-caching``, TTFT SLO 1 s).
LINE = "rag-assistant"
#: L1 (LMCache CPU buffer) of a test server, GiB: 128 chunks of the tiny model (4 MiB each).
TEST_L1_GIB = "0.5"
#: vLLM's CPU KV cache of a test server, GiB (``VLLM_CPU_KVCACHE_SPACE``): 65,536 tokens of the tiny model.
KV_CACHE_GIB = "1"
#: The flags that exist for GPUs only; each takes a value.
GPU_ONLY_FLAGS = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--gpu-memory-utilization",
                  "--data-parallel-size", "-dp", "--cuda-graph-sizes", "--max-cudagraph-capture-size")
KV_TRANSFER_FLAG = "--kv-transfer-config"
#: The module vLLM's registry loads ``LMCacheConnectorV1`` from (``KVConnectorFactory``).
VLLM_CONNECTOR_MODULE = cpu_connector.DEFAULT_BASE.split(":")[0]
START_TIMEOUT_S = 900
REQUEST_TIMEOUT_S = 300
#: The line's chunk key as the kubelet would give it from the janitor's Secret (``KVCACHE_L2_KEY``,
#: ``k8s.patch``): any secret string; 43 characters as the janitor's 256 random bits in base64url.
TEST_CHUNK_KEY = "serving-tier-test-key-not-a-secret-000000000"
CHUNK_KEY_ENV = "KVCACHE_L2_KEY"
#: Tokens generated per request (greedy): enough to compare completions and time the decode.
MAX_TOKENS = 16
#: The gate's series in ``/metrics`` (``prometheus_client`` appends ``_total`` to a counter).
GATE_OPEN_GAUGE = "kvcache_l2_gate_open"
GATE_TRANSITIONS = "kvcache_l2_gate_transitions_total"
#: The longest a gate may stay open on a healthy mount (s): its hold doubles on each reopen within
#: 10 s, up to 30 s (``REOPEN_WINDOW_S``, ``KVCACHE_L2_GATE_MAX_CLOSE_AFTER_MS``), plus a margin.
GATE_CLOSE_TIMEOUT_S = 60.0



def rendered_args(exported: dict[str, Any], line: str, pod: int) -> list[str]:
    """The admitted Pod ``pod``'s vLLM container ``args``, as :mod:`tests_lmcache.export_env` exports
    them (``args`` beside ``envs``: one list, the same for every admitted Pod of a line, or one per
    Pod): the one place the tier's argv comes from."""
    args = exported["lines"][line]["args"]
    return list(args[pod] if args and isinstance(args[0], list) else args)


def rendered_kv_transfer(args: list[str]) -> dict[str, Any] | None:
    """The JSON of ``--kv-transfer-config`` in ``args`` (either ``flag value`` or ``flag=value``)."""
    for k, arg in enumerate(args):
        if arg == KV_TRANSFER_FLAG:
            return json.loads(args[k + 1])
        if arg.startswith(KV_TRANSFER_FLAG + "="):
            return json.loads(arg.split("=", 1)[1])
    return None


def connector_base(kv: dict[str, Any]) -> str:
    """``module:Class`` of the connector a rendered ``--kv-transfer-config`` loads."""
    return f"{kv.get('kv_connector_module_path') or VLLM_CONNECTOR_MODULE}:{kv['kv_connector']}"


@dataclass
class Argv:
    """The server's argv after :func:`serving_argv`, with what was changed."""

    args: list[str]
    base: str
    kv_transfer: dict[str, Any]
    replaced: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)


def serving_argv(rendered: list[str], *, model_dir: Path, port: int,
                 kv_overrides: dict[str, Any] | None = None) -> Argv:
    """The rendered ``args`` with only the substitutions of the module docstring.

    ``kv_overrides``: further keys of ``--kv-transfer-config`` (controls only, e.g. vLLM's default
    ``kv_load_failure_policy``; a value None removes the key).
    """
    out: list[str] = []
    dropped: list[str] = []
    replaced: dict[str, tuple[Any, Any]] = {}
    added: list[str] = []
    kv = rendered_kv_transfer(rendered)
    if kv is None:
        raise AssertionError(f"the rendered args carry no {KV_TRANSFER_FLAG}: {rendered}")
    base = connector_base(kv)
    test_kv = {**kv, "kv_connector": cpu_connector.CONNECTOR_NAME,
               "kv_connector_module_path": "tests_serving.cpu_connector"}
    for key, value in (kv_overrides or {}).items():
        if value is None:
            test_kv.pop(key, None)
        else:
            test_kv[key] = value
    replaced[KV_TRANSFER_FLAG] = (kv, test_kv)
    k = 0
    if rendered and not rendered[0].startswith("-"):
        replaced["model"] = (rendered[0], str(model_dir))
        out += ["--model", str(model_dir)]
        k = 1
    while k < len(rendered):
        arg = rendered[k]
        flag = arg.split("=", 1)[0]
        takes_value = "=" not in arg and k + 1 < len(rendered) and not rendered[k + 1].startswith("-")
        if flag in GPU_ONLY_FLAGS:
            dropped.append(arg if "=" in arg else f"{arg} {rendered[k + 1]}")
            k += 1 if "=" in arg else 2
            continue
        if flag == KV_TRANSFER_FLAG:
            k += 1 if "=" in arg else 2
            continue
        out.append(arg)
        if takes_value:
            out.append(rendered[k + 1])
            k += 2
        else:
            k += 1
    extra = [KV_TRANSFER_FLAG, json.dumps(test_kv), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
             "-O0"]
    added += ["--host 127.0.0.1", f"--port {port}", "--dtype float32", "-O0"]
    return Argv(out + extra, base, kv, replaced, dropped, added)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Reply:
    """One completion: HTTP status, text, token count, TTFT and total seconds (client side)."""

    status: int
    text: str
    tokens: int
    ttft_s: float
    total_s: float
    body: str = ""
    #: The log-probability of each generated token (``logprobs`` asked, not streaming), else None.
    logprobs: list[float] | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.tokens > 0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first, per second after the first (None with fewer than 2 tokens)."""
        if self.tokens < 2 or self.total_s <= self.ttft_s:
            return None
        return (self.tokens - 1) / (self.total_s - self.ttft_s)


def complete(port: int, model: str, prompt: str | list[int], *, max_tokens: int = MAX_TOKENS, stream: bool = True,
             logprobs: bool = False) -> Reply:
    """Greedy completion (temperature 0, fixed seed) of ``model`` at ``127.0.0.1:port``: a server, or a
    router in front of several. Streaming: TTFT is the arrival of the first chunk that carries text;
    a stream that ends without text is an empty completion (how vLLM ends a failed streaming
    request: HTTP 200, no tokens). ``logprobs`` (not streaming): the
    reply carries each generated token's log-probability (OpenAI ``logprobs: 1``)."""
    assert not (stream and logprobs), "logprobs are read from a whole (not streamed) reply"
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 0,
            "stream": stream, "ignore_eos": True, **({"logprobs": 1} if logprobs else {})}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if not stream or resp.status != 200:
            raw = resp.read()
            t1 = time.perf_counter()
            if resp.status != 200:
                return Reply(resp.status, "", 0, t1 - t0, t1 - t0, raw.decode("utf-8", "replace")[:2000])
            doc = json.loads(raw)
            choice = doc["choices"][0]
            return Reply(200, choice["text"], doc["usage"]["completion_tokens"], t1 - t0, t1 - t0,
                         logprobs=choice["logprobs"]["token_logprobs"] if logprobs else None)
        parts: list[str] = []
        ttft = None
        tokens = 0
        raw_lines = []
        for line in resp:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            raw_lines.append(data[:300].decode("utf-8", "replace"))
            if data == b"[DONE]":
                break
            doc = json.loads(data)
            for choice in doc.get("choices") or []:
                if choice.get("text"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    parts.append(choice["text"])
                    tokens += 1
        t1 = time.perf_counter()
        return Reply(200, "".join(parts), tokens, ttft if ttft is not None else t1 - t0, t1 - t0,
                     "\n".join(raw_lines[-5:]))
    finally:
        conn.close()



@dataclass
class Server:
    """One running ``vllm serve`` (the API server process; its engine core and worker are children)."""

    name: str
    proc: subprocess.Popen
    port: int
    env: dict[str, str]
    argv: Argv
    rendered_env: dict[str, str]
    rendered_args: list[str]
    log_path: Path
    metrics_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model(self) -> str:
        """The served model name: vLLM's default, the ``--model`` path."""
        return self.argv.args[self.argv.args.index("--model") + 1]

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def healthy(self) -> bool:
        try:
            return self._request("GET", "/health")[0] == 200
        except OSError:
            return False

    def tokenize(self, prompt: str) -> list[int]:
        status, body = self._request("POST", "/tokenize", {"model": self.model, "prompt": prompt})
        assert status == 200, body[:500]
        return json.loads(body)["tokens"]

    def complete(self, prompt: str | list[int], *, max_tokens: int = MAX_TOKENS, stream: bool = True,
                 logprobs: bool = False) -> Reply:
        """:func:`complete` against this server."""
        return complete(self.port, self.model, prompt, max_tokens=max_tokens, stream=stream, logprobs=logprobs)

    def metrics_text(self) -> str:
        status, body = self._request("GET", "/metrics")
        assert status == 200
        return body.decode("utf-8", "replace")

    def counters(self) -> dict[str, float]:
        """Every sample of ``/metrics`` summed over its labels, by series name."""
        from cluster_agents.kv_canary import parse_metrics

        out: dict[str, float] = {}
        for name, _, value in parse_metrics(self.metrics_text()):
            out[name] = out.get(name, 0.0) + value
        return out

    def gate_state(self) -> tuple[bool, float] | None:
        """The L2 gate of this server's scheduler, read from ``/metrics``: (open now, opens so far), or
        None when the connector has no gate (``kvcache_l2_gate_open``, ``kvcache_l2_gate_transitions
        {to="open"}``; vllm_plugins/l2_gate.py ``_Metrics``)."""
        from cluster_agents.kv_canary import parse_metrics

        is_open: bool | None = None
        opens = 0.0
        for name, labels, value in parse_metrics(self.metrics_text()):
            if name == GATE_OPEN_GAUGE:
                is_open = bool(value) or bool(is_open)
            elif name == GATE_TRANSITIONS and labels.get("to") == "open":
                opens += value
        return None if is_open is None else (is_open, opens)

    def gate_log(self, last_chars: int = 3000) -> str:
        """The gate's ``L2GATE`` lines of the server's log (its transitions and their reasons)."""
        return "\n".join(line for line in self.log().splitlines() if "L2GATE" in line)[-last_chars:]

    def wait_gate_closed(self, timeout_s: float = GATE_CLOSE_TIMEOUT_S) -> float:
        """Until the server's L2 gate is closed (at once without a gate); returns its count of opens.

        While the gate is open the connector neither looks up nor saves (by design: a replica then
        serves as one without L2), so a test step that needs the L2 waits here first. AssertionError
        after ``timeout_s``: the gate stayed open on a healthy mount (its log says why).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.gate_state()
            if state is None:
                return 0.0
            is_open, opens = state
            if not is_open:
                return opens
            if time.monotonic() > deadline:
                raise AssertionError(f"the L2 gate of {self.name} still open after {timeout_s} s:\n{self.gate_log()}")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        """The API server and its descendants (engine core, worker)."""
        found = [self.proc.pid]
        k = 0
        while k < len(found):
            try:
                children = Path(f"/proc/{found[k]}/task/{found[k]}/children").read_text().split()
            except OSError:
                children = []
            found += [int(c) for c in children]
            k += 1
        return found

    def stop(self) -> str:
        """SIGTERM to the process group, wait, return the log."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        return self.log()


def l2_url(rendered_url: str, root_url: str, mount: Path) -> str:
    """The rendered ``LMCACHE_REMOTE_URL`` (under ``root_url``) re-rooted at ``mount``."""
    assert rendered_url.startswith(root_url), rendered_url
    return f"fs://localhost:0{mount}/{rendered_url[len(root_url):]}"


def write_plugins(plugins: dict[str, Any] | None, into: Path) -> Path:
    """The line's vLLM plugin ConfigMap (``export_env``'s ``vllm_plugins``: ``dir``, ``files``) as the
    Pod sees it: each file, byte for byte, in ``into`` (created); returns ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for name, text in ((plugins or {}).get("files") or {}).items():
        (into / name).write_text(text, encoding="utf-8")
    return into


def serving_env(rendered: dict[str, str], *, root_url: str, mount: Path, metrics_dir: Path, home: Path,
                base: str, core: int, plugins: dict[str, Any] | None = None,
                plugin_dir: Path | None = None) -> dict[str, str]:
    """The rendered env with the substitutions and additions of the module docstring, nothing else.

    ``PYTHONPATH``: the rendered value names the plugin ConfigMap's mount (``plugins["dir"]``);
    here ``plugin_dir`` (written by :func:`write_plugins`) takes its place, then the repository.
    """
    env = dict(rendered)
    rendered_path = [p for p in rendered.get("PYTHONPATH", "").split(":") if p]
    if plugins and plugin_dir is not None:
        rendered_path = [str(plugin_dir) if p == plugins["dir"] else p for p in rendered_path]
        if str(plugin_dir) not in rendered_path:
            raise AssertionError(f"PYTHONPATH {rendered.get('PYTHONPATH')!r} does not name the plugin mount {plugins['dir']}")
    env["LMCACHE_REMOTE_URL"] = l2_url(rendered["LMCACHE_REMOTE_URL"], root_url, mount)
    env["LMCACHE_MAX_LOCAL_CPU_SIZE"] = TEST_L1_GIB
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    env[CHUNK_KEY_ENV] = TEST_CHUNK_KEY
    env.update({"VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB, "VLLM_CPU_OMP_THREADS_BIND": str(core),
                cpu_connector.BASE_ENV: base, "PATH": os.environ["PATH"], "HOME": str(home),
                "PYTHONPATH": ":".join([*rendered_path, str(REPO)])})
    if base.startswith("kvcache_l2_gate:"):
        for name in GATE_TEST_ENV:  # the rendered lmcache.l2_gate bounds (50 / 100 ms) replaced
            env[name] = GATE_TEST_MS
    if LOOKUP_TIMEOUT_ENV in rendered:  # the rendered lmcache.lookup_timeout_ms (200) replaced
        env[LOOKUP_TIMEOUT_ENV] = LOOKUP_TIMEOUT_TEST_MS
    return env


#: The L2 gate's bounds here (ms): a probe outstanding, or a lookup taking, longer opens the gate
#: (``KVCACHE_L2_GATE_OPEN_AFTER_MS`` / ``..._LOOKUP_SLOW_MS``, vllm_plugins/l2_gate.py ``GateSettings``).
GATE_TEST_MS = "1000"
GATE_TEST_ENV = ("KVCACHE_L2_GATE_OPEN_AFTER_MS", "KVCACHE_L2_GATE_LOOKUP_SLOW_MS")
#: LMCache's lookup RPC bound here (ms; ``LMCACHE_LOOKUP_TIMEOUT_MS``, rendered 200): twice the gate's
#: test bound, as the rendered 200 is twice the gate's 100 ms, so a slow lookup still opens the gate
#: before LMCache gives up on it.
LOOKUP_TIMEOUT_TEST_MS = str(2 * int(GATE_TEST_MS))
LOOKUP_TIMEOUT_ENV = "LMCACHE_LOOKUP_TIMEOUT_MS"

#: What :func:`serving_env` may change or add, and nothing else (test_only_substitution.py).
ENV_REPLACED = ("LMCACHE_REMOTE_URL", "LMCACHE_MAX_LOCAL_CPU_SIZE", "PROMETHEUS_MULTIPROC_DIR", "PYTHONPATH",
                LOOKUP_TIMEOUT_ENV, *GATE_TEST_ENV)
ENV_ADDED = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", cpu_connector.BASE_ENV, "PATH", "HOME", "PYTHONPATH",
             CHUNK_KEY_ENV, *GATE_TEST_ENV)


def start_server(name: str, *, rendered_env: dict[str, str], rendered: list[str], root_url: str, mount: Path,
                 model_dir: Path, work: Path, home: Path, core: int, plugins: dict[str, Any] | None = None,
                 kv_overrides: dict[str, Any] | None = None) -> Server:
    """Start one server (returns at once; :func:`wait_ready` waits for it). ``plugins``: the line's
    exported plugin ConfigMap (``vllm_plugins``), written to ``work/plugins-<name>``."""
    port = free_port()
    argv = serving_argv(rendered, model_dir=model_dir, port=port, kv_overrides=kv_overrides)
    metrics_dir = work / f"metrics-{name}"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    plugin_dir = write_plugins(plugins, work / f"plugins-{name}") if plugins else None
    env = serving_env(rendered_env, root_url=root_url, mount=mount, metrics_dir=metrics_dir, home=home,
                      base=argv.base, core=core, plugins=plugins, plugin_dir=plugin_dir)
    log_path = work / f"{name}.log"
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *argv.args], cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Server(name, proc, port, env, argv, dict(rendered_env), list(rendered), log_path, metrics_dir)


def wait_ready(servers: list[Server], timeout_s: float = START_TIMEOUT_S) -> None:
    """Until every server answers ``/health``; AssertionError with its log if one exits or times out."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        for server in list(pending):
            if server.proc.poll() is not None:
                raise AssertionError(f"{server.name} exited ({server.proc.returncode}):\n{server.log()[-6000:]}")
            if server.healthy():
                pending.remove(server)
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"{pending[0].name} not ready after {timeout_s} s:\n{pending[0].log()[-6000:]}")
        time.sleep(1)


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.5):
    """Poll ``predicate`` until it returns a true value (returned) or ``timeout_s`` passes (AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
