"""Fixtures of the real-LMCache tier: the exported pod env and a launcher of pod processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Interpreter with the project's dependencies, which renders the manifests (the tier's own
#: virtualenv holds only torch, lmcache and pytest).
PROJECT_PYTHON = Path(os.environ.get("KVCACHE_PROJECT_PYTHON", REPO / ".venv" / "bin" / "python"))
#: A small KV geometry for correctness (4 layers, 2 KV heads x 16): 128 KiB per 256-token chunk.
SMALL = {"layers": 4, "kv_heads": 2, "head_dim": 16}
#: Qwen2-7B (docs/sources.md §5): 28 layers, 4 KV heads x 128, bf16 -> 57,344 B/token.
QWEN2_7B = {"layers": 28, "kv_heads": 4, "head_dim": 128}
#: L1 buffer of a test pod, GiB: LMCache allocates it for real, the rendered 16 GiB would not fit.
TEST_L1_GIB = "0.05"
POD_TIMEOUT_S = 300


def export_env(out: Path) -> dict[str, Any]:
    """Run :mod:`tests_lmcache.export_env` with the project's interpreter; return the document."""
    if not PROJECT_PYTHON.exists():
        pytest.exit(f"{PROJECT_PYTHON} not found: run `make setup` (or set KVCACHE_PROJECT_PYTHON)", returncode=2)
    # No jsii setting here: export_env's first import, ``k8s``, calls prepare_jsii_node() in the
    # project's interpreter before cdk8s starts Node (and leaves a user's own value alone).
    subprocess.run([str(PROJECT_PYTHON), "-m", "tests_lmcache.export_env", "--out", str(out)], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text(encoding="utf-8"))


@dataclass
class PodRun:
    """A finished pod process: its action records and its combined log."""

    records: list[dict[str, Any]]
    log: str
    env: dict[str, str]

    def of(self, op: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["op"] == op]


@dataclass
class ReplicaProcess:
    """A running stand-in replica (:mod:`tests_lmcache.replica`): its Pod name, URL and env."""

    name: str
    line: str
    proc: subprocess.Popen
    url: str
    env: dict[str, str]
    #: The vLLM container's env as rendered (in-cluster paths), what the Kubernetes API would list.
    rendered_env: dict[str, str]
    log_path: Path
    #: Its own L2 mount (:meth:`Tier.start_replica_on_mount`), which :func:`point_mount` can kill.
    mount: Path | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def pod_object(self, endpoint: str, ready: bool = True) -> dict[str, Any]:
        """The Pod as ``GET /api/v1/namespaces/<ns>/pods`` lists it: the operator's ``app`` label,
        Running (and Ready), Pod IP 127.0.0.1, vLLM's port named ``http`` (this process's port)
        and the rendered env."""
        return {"metadata": {"name": self.name, "labels": {"app": endpoint}},
                "spec": {"containers": [{"name": endpoint, "ports": [{"name": "http", "containerPort": self.port}],
                                         "env": [{"name": k, "value": v} for k, v in self.rendered_env.items()]}]},
                "status": {"phase": "Running", "podIP": "127.0.0.1",
                           "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}

    def stop(self) -> str:
        """SIGTERM, wait, return the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@dataclass
class Tier:
    """The exported env and a temporary L2 root standing in for ``/mnt/curvine/l2cache``."""

    doc: dict[str, Any]
    root: Path
    home: Path
    work: Path
    _n: list[int] = field(default_factory=lambda: [0])

    def pod_env(self, line: str, pod: int = 0, *, l1_gib: str = TEST_L1_GIB,
                overrides: dict[str, str | None] | None = None) -> dict[str, str]:
        """The admitted Pod's env with the three test overrides (L2 root, L1 size, and the
        Prometheus multiprocess directory re-pointed from the Pod's ``emptyDir`` mount to
        :meth:`metrics_dir`), nothing else.

        ``overrides`` may set or (with None) remove further variables, for controls only.
        """
        env = dict(self.doc["lines"][line]["envs"][pod])
        root_url = self.doc["l2_root_url"]
        url = env["LMCACHE_REMOTE_URL"]
        assert url.startswith(root_url), url
        env["LMCACHE_REMOTE_URL"] = f"fs://localhost:0{self.root}/{url[len(root_url):]}"
        env["LMCACHE_MAX_LOCAL_CPU_SIZE"] = l1_gib
        assert env["PROMETHEUS_MULTIPROC_DIR"] == self.doc["lines"][line]["metrics_dir"]["mount_path"], env
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir(line, pod))
        for name, value in (overrides or {}).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return {"PATH": os.environ["PATH"], "HOME": str(self.home), **env}

    def metrics_dir(self, line: str, pod: int = 0) -> Path:
        """The test's stand-in for pod ``pod``'s metrics ``emptyDir`` (created, like the kubelet
        creates the volume before the container starts)."""
        path = self.work / "metrics" / f"{line}-{pod}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def line_dir(self, line: str) -> Path:
        """The line's model-scoped L2 directory under the test root."""
        url = self.doc["lines"][line]["envs"][0]["LMCACHE_REMOTE_URL"]
        return self.root / url[len(self.doc["l2_root_url"]):].strip("/")

    def start(self, line: str, actions: list[dict[str, Any]], *, pod: int = 0, geometry: dict[str, int] = SMALL,
              engine: dict[str, Any] | None = None, env: dict[str, str] | None = None,
              rename_barrier: dict[str, Any] | None = None) -> tuple[subprocess.Popen, Path, dict]:
        """Start one pod process (``rename_barrier``: see :func:`tests_lmcache.pod.install_rename_barrier`)."""
        self._n[0] += 1
        n = self._n[0]
        spec = {"geometry": geometry, "engine": engine or self.doc["lines"][line]["engine"],
                "actions": actions, "result": str(self.work / f"pod{n}.result.json"),
                "read_back": actions == [{"op": "read_back"}], "rename_barrier": rename_barrier}
        spec_path = self.work / f"pod{n}.spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        pod_env = env if env is not None else self.pod_env(line, pod)
        proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "tests_lmcache.pod", str(spec_path)], cwd=REPO, env=pod_env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return proc, Path(spec["result"]), pod_env

    def serve(self, line: str, *, pod: int = 0, geometry: dict[str, int] = SMALL,
              env: dict[str, str] | None = None) -> "ServedPod":
        """Start one pod process that stays up and runs actions one at a time
        (:func:`tests_lmcache.pod.serve`); returns once its engine is built."""
        self._n[0] += 1
        n = self._n[0]
        replies_r, replies_w = os.pipe()
        spec = {"geometry": geometry, "engine": self.doc["lines"][line]["engine"], "actions": [],
                "result": str(self.work / f"pod{n}.result.json"), "serve_replies_fd": replies_w}
        spec_path = self.work / f"pod{n}.spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        log_path = self.work / f"pod{n}.log"
        pod_env = env if env is not None else self.pod_env(line, pod)
        with log_path.open("w", encoding="utf-8") as log:
            proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "tests_lmcache.pod", str(spec_path)],
                                    cwd=REPO, env=pod_env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    text=True, pass_fds=(replies_w,))
        os.close(replies_w)
        served = ServedPod(proc, os.fdopen(replies_r, encoding="utf-8"), log_path, pod_env)
        served.ready = served.reply()
        return served

    def start_replica(self, line: str, name: str, *, pod: int = 0, env: dict[str, str] | None = None,
                      geometry: dict[str, int] = SMALL, vllm_none_hash: bool = False,
                      chunk_key: str | None = None) -> ReplicaProcess:
        """Start a stand-in replica (:mod:`tests_lmcache.replica`) of ``line`` with the env of
        admitted Pod ``pod`` (or ``env``); return once it listens. ``vllm_none_hash``: LMCache chains
        its keys from vLLM's ``NONE_HASH`` (:mod:`tests_lmcache.vllm_none_hash`), as in a vLLM Pod;
        ``chunk_key``: the value the Pod's ``KVCACHE_L2_KEY`` ``secretKeyRef`` would give, applied as the
        L2 gate applies it."""
        self._n[0] += 1
        n = self._n[0]
        port_file = self.work / f"replica{n}.port"
        spec = {"geometry": geometry, "engine": self.doc["lines"][line]["engine"], "port_file": str(port_file),
                "served_model_name": self.doc["lines"][line]["model"], "vllm_none_hash": vllm_none_hash,
                "chunk_key": chunk_key}
        spec_path = self.work / f"replica{n}.spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        pod_env = env if env is not None else self.pod_env(line, pod)
        log_path = self.work / f"replica{n}.log"
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "tests_lmcache.replica", str(spec_path)],
                                    cwd=REPO, env=pod_env, stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + POD_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"replica {name} did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.1)
        return ReplicaProcess(name, line, proc, f"http://127.0.0.1:{port_file.read_text()}", pod_env,
                              dict(self.doc["lines"][line]["envs"][pod]), log_path)

    def start_replica_on_mount(self, line: str, name: str, mount: Path, *, pod: int = 0) -> ReplicaProcess:
        """:meth:`start_replica` whose L2 path goes through its own mount: ``mount``, a new symlink to
        the L2 root that :func:`point_mount` re-points (elsewhere: a dead mount), as a Pod's CSI
        volume is its own bind of the node's FUSE session."""
        mount.symlink_to(self.root)
        env = self.pod_env(line, pod)
        env["LMCACHE_REMOTE_URL"] = env["LMCACHE_REMOTE_URL"].replace(str(self.root), str(mount), 1)
        replica = self.start_replica(line, name, pod=pod, env=env)
        replica.mount = mount
        return replica

    @staticmethod
    def finish(started: tuple[subprocess.Popen, Path, dict]) -> PodRun:
        proc, result, env = started
        log, _ = proc.communicate(timeout=POD_TIMEOUT_S)
        assert proc.returncode == 0, log[-4000:]
        return PodRun(json.loads(result.read_text(encoding="utf-8")), log, env)

    def run(self, line: str, actions: list[dict[str, Any]], **kwargs: Any) -> PodRun:
        """Start one pod process and wait for it."""
        return self.finish(self.start(line, actions, **kwargs))


@dataclass
class ServedPod:
    """A pod process that stays up (:meth:`Tier.serve`): :meth:`act` sends one action and
    waits for its record; its log is a file (``log_path``)."""

    proc: subprocess.Popen
    replies: Any
    log_path: Path
    env: dict[str, str]
    ready: dict[str, Any] | None = None

    def reply(self) -> dict[str, Any]:
        line = self.replies.readline()
        if not line:
            self.proc.wait(timeout=POD_TIMEOUT_S)
            raise AssertionError(f"pod exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
        return json.loads(line)

    def act(self, action: dict[str, Any]) -> dict[str, Any]:
        """Run ``action`` in the pod and return its record."""
        self.proc.stdin.write(json.dumps(action) + "\n")
        self.proc.stdin.flush()
        return self.reply()

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> str:
        """Ask the pod to exit (it waits for its L2 writes first); returns its log. Fails if it
        exits with an error."""
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=POD_TIMEOUT_S)
        self.replies.close()
        assert self.proc.returncode == 0, self.log()[-4000:]
        return self.log()


def point_mount(link: Path, target: Path) -> None:
    """(Re)point a pod's L2 mount, the symlink ``link``, at ``target`` atomically (a missing target
    makes it a dead mount)."""
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> dict[str, Any]:
    return export_env(tmp_path_factory.mktemp("export") / "env.json")


def make_tier(exported: dict[str, Any], base: Path) -> Tier:
    """A :class:`Tier` with its L2 root, HOME and work directory under ``base``."""
    root, home, work = base / "l2cache", base / "home", base / "work"
    for d in (root, home, work):
        d.mkdir()
    return Tier(exported, root, home, work)


@pytest.fixture
def tier(exported, tmp_path) -> Tier:
    return make_tier(exported, tmp_path)


@pytest.fixture
def live_prometheus(exported, tmp_path):
    """A started :class:`tests_lmcache.prometheus.LivePrometheus` with the generated rule file and
    scrape jobs (``for:`` 0, 1-s intervals); give it targets with ``set_targets`` and read alerts
    with ``wait_for_alert`` / ``wait_for_resolved``. Stopped after the test. For other tiers (the
    L2 fault tier) that scrape their own processes."""
    from tests_lmcache.prometheus import LivePrometheus

    prometheus = LivePrometheus(tmp_path / "prometheus", rule_file=exported["rule_file"],
                                scrape_config=exported["scrape_config"]).start()
    try:
        yield prometheus
    finally:
        prometheus.stop()
