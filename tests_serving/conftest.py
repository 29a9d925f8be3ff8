"""Fixtures of the serving tier (``make test-serving``): the exported Pod, the tiny model, the L2 FUSE
mount and three real vLLM servers shared by every test, and the tables printed at the end of the run.

The servers (:mod:`tests_serving.servers`), one process tree each, all on the one FUSE mount
(:mod:`tests_serving.chunkfs`, ``ok`` unless a test switches it) standing in for the line's Curvine
PVC, so their L2 directory is one shared fs:// directory as in a business line:

* ``a`` and ``b``: admitted Pods 0 and 1 of rag-assistant, as rendered (``kv_load_failure_policy``
  ``recompute``, :mod:`k8s.kv_transfer`);
* ``default_policy``: admitted Pod 2, the same but for ``kv_load_failure_policy`` removed, i.e.
  vLLM 0.29's default ``fail`` (``KVTransferConfig``, vllm/config/kv_transfer.py): the control that
  shows why the rendered policy matters.

They start together (``-O0``: no torch.compile, :mod:`tests_serving.servers`) and stop at the end
of the session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from tests_faults.harness import FaultMount
from tests_lmcache.conftest import export_env
from tests_serving import chunkfs, servers
from tests_serving.servers import LINE, REPO, Server

#: What the terminal summary prints, filled by the tests (key -> (title, text)).
REPORT: dict[str, tuple[str, str]] = {}
#: Wall time of the session's phases (seconds), printed in the summary.
TIMES: dict[str, float] = {}
_T0 = time.monotonic()


def pytest_configure(config: pytest.Config) -> None:
    if not os.path.exists("/dev/fuse"):
        raise pytest.UsageError("the serving tier needs /dev/fuse (run as root on a machine with FUSE: make test-serving)")


class ServingMount(FaultMount):
    """:class:`tests_faults.harness.FaultMount` running :mod:`tests_serving.chunkfs` (faultfs plus
    per-chunk ``vanish``)."""

    def __init__(self, backing: Path, mount: Path, control: Path, log: Path) -> None:
        self.backing, self.mount, self.control, self.log = backing, mount, control, log
        chunkfs.write_control(control, "ok")
        with log.open("w", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests_serving.chunkfs", "--backing", str(backing), "--mount", str(mount),
                 "--control", str(control)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chunkfs did not mount {mount}: {log.read_text(encoding='utf-8')[-2000:]}")
            time.sleep(0.01)

    def switch(self, mode: str, **kwargs: Any) -> None:
        chunkfs.write_control(self.control, mode, **kwargs)


@dataclass
class Rig:
    """The session's mount and servers; ``work``: the servers' (and routers') logs; ``launch(name, pod,
    core)``: start one more server of the line, from admitted Pod ``pod``, stopped with the others at
    the end of the session (not waited for: :func:`tests_serving.servers.wait_ready`)."""

    exported: dict[str, Any]
    mount: ServingMount
    model_dir: Path
    a: Server
    b: Server
    default_policy: Server
    work: Path
    launch: Callable[[str, int, int], Server]

    @property
    def servers(self) -> list[Server]:
        return [self.a, self.b, self.default_policy]

    def line_dir(self) -> Path:
        """The line's model-scoped L2 directory in the backing directory (what Curvine holds)."""
        url = self.exported["lines"][LINE]["envs"][0]["LMCACHE_REMOTE_URL"]
        return self.mount.backing / url[len(self.exported["l2_root_url"]):].strip("/")

    def chunk_files(self) -> set[str]:
        d = self.line_dir()
        return {f for f in os.listdir(d) if f.endswith(".data")} if d.exists() else set()


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> dict[str, Any]:
    t0 = time.monotonic()
    out = tmp_path_factory.mktemp("export")
    doc = export_env(out / "env.json")
    TIMES["export (project .venv)"] = time.monotonic() - t0
    return doc


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    from tests_serving.tiny_model import make_model

    return make_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="session")
def rig(exported, model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("serving")
    backing, mount_dir, work, home = base / "backing", base / "l2cache", base / "work", base / "home"
    for d in (backing, mount_dir, work, home):
        d.mkdir()
    mount = ServingMount(backing, mount_dir, base / "chunkfs.control.json", base / "chunkfs.log")
    started: list[Server] = []
    t0 = time.monotonic()
    try:
        line = exported["lines"][LINE]

        def start(name: str, pod: int, core: int, **kwargs: Any) -> Server:
            started.append(servers.start_server(
                name, rendered_env=line["envs"][pod], rendered=servers.rendered_args(exported, LINE, pod),
                root_url=exported["l2_root_url"], mount=mount_dir, model_dir=model_dir, work=work, home=home,
                core=core, plugins=line.get("vllm_plugins"), **kwargs))
            return started[-1]

        a = start("a", 0, 0)
        b = start("b", 1, 1)
        control = start("default_policy", 2, 0, kv_overrides={"kv_load_failure_policy": None})
        servers.wait_ready(started)
        TIMES["servers start (3, in parallel)"] = time.monotonic() - t0
        yield Rig(exported, mount, model_dir, a, b, control, work, start)
    finally:
        mount.switch("ok")
        logs = work / "logs"
        for server in started:
            server.stop()
        mount.stop()
        keep = os.environ.get("KVCACHE_SERVING_KEEP_LOGS")
        if keep:
            shutil.copytree(work, keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("metrics-*"))
        del logs


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    for title, text in REPORT.values():
        terminalreporter.write_sep("=", title)
        terminalreporter.write_line(text)
    if TIMES:
        TIMES["session (until summary)"] = time.monotonic() - _T0
        terminalreporter.write_sep("=", "Serving tier wall time")
        for what, seconds in TIMES.items():
            terminalreporter.write_line(f"{what:<40} {seconds:8.1f} s")
