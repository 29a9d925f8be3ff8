"""Fixtures of the real-LMCache tier: the exported pod env and a launcher of pod processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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

    @staticmethod
    def finish(started: tuple[subprocess.Popen, Path, dict]) -> PodRun:
        proc, result, env = started
        log, _ = proc.communicate(timeout=POD_TIMEOUT_S)
        assert proc.returncode == 0, log[-4000:]
        return PodRun(json.loads(result.read_text(encoding="utf-8")), log, env)

    def run(self, line: str, actions: list[dict[str, Any]], **kwargs: Any) -> PodRun:
        """Start one pod process and wait for it."""
        return self.finish(self.start(line, actions, **kwargs))


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
