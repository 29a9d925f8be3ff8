"""Curvine's servers get SIGTERM and log to stdout at a bounded level (issue 15, item 4).

The curvine image's ENTRYPOINT (/entrypoint.sh, CurvineIO/curvine v0.3.2-alpha
curvine-docker/deploy/entrypoint.sh) runs ``curvine-server ... 2>&1 | tee <file> &`` and waits as
bash PID 1 without a trap: the server never sees SIGTERM and the tee copy grows in the container's
writable layer. The Workers also log two INFO lines per block read and two per block write
(docs/sources.md §19). Here: the rendered containers run the server binary itself, the master's
wrapper really hands its PID to the server (run with /bin/sh and a stand-in server that reports
its PID and the signal it gets), the servers log only to stdout, the Workers at WARN, and the log
bytes per day of the per-block lines (k8s.curvine_logs) before and after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from tests.k8s.conftest import find

from k8s import curvine_config, curvine_logs, names
from k8s.curvine_chart import CURVINE_HOME, CURVINE_SERVER, FIRST_START_MARKER_WAIT_S, _master_start_script, server_argv

CONF = f"{names.CURVINE_CONFIG_DIR}/{names.CURVINE_CONFIG_FILE}"
DATA_DIR = "/opt/dlami/nvme/curvine-data"


def _containers(obj):
    pod = obj["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def _server(curvine, kind, name, container):
    (c,) = [c for c in _containers(find(curvine, kind, name)) if c["name"] == container]
    return c


def test_the_worker_container_is_the_server_itself(curvine):
    worker = _server(curvine, "DaemonSet", names.CURVINE_WORKER, "worker")
    assert worker["command"] == ["/app/curvine/lib/curvine-server"] == [CURVINE_SERVER]
    assert worker["args"] == ["--service", "worker", "--conf", CONF]
    assert worker["workingDir"] == CURVINE_HOME == "/app/curvine"  # where the entrypoint cd'd to


def test_no_container_of_the_curvine_image_runs_its_entrypoint(manifests, k8s_project):
    """A container of the curvine image without ``command`` runs the image's ENTRYPOINT
    (/entrypoint.sh): every one of ours names its command, and none calls the entrypoint."""
    image = k8s_project.platform.versions.images.curvine
    seen = 0
    for objs in manifests.values():
        for obj in objs:
            if obj["kind"] not in ("StatefulSet", "DaemonSet", "Deployment"):
                continue
            for c in _containers(obj):
                if c["image"] != image:
                    continue
                seen += 1
                assert c.get("command"), (obj["metadata"]["name"], c["name"])
                text = " ".join(c["command"] + c.get("args", []))
                assert "/entrypoint.sh" not in text and "tee" not in text.split(), (obj["metadata"]["name"], c["name"])
    assert seen == 4  # master + its init container, worker + its init container


def test_server_argv_refuses_an_unknown_service():
    with pytest.raises(ValueError, match="'master' and 'worker'"):
        server_argv("fuse", conf=CONF)


#: Stand-in for curvine-server: reports its PID and arguments, creates the RocksDB files the
#: marker loop waits for, and on SIGTERM reports it and exits 0 (as the real server returns from
#: main after RpcServer::start0's shutdown).
FAKE_SERVER = r'''#!/usr/bin/env python3
import os, signal, sys, time
out = os.environ["REPORT"]
with open(out, "a") as f:
    f.write(f"pid={os.getpid()} args={' '.join(sys.argv[1:])}\n")
meta = os.path.join(os.environ["ROOT"], "meta", "data")
os.makedirs(meta, exist_ok=True)
open(os.path.join(meta, "CURRENT"), "w").close()
def term(signum, frame):
    with open(out, "a") as f:
        f.write("got SIGTERM\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(0.05)
'''


def test_the_master_wrapper_hands_its_pid_and_sigterm_to_the_server(tmp_path):
    """The kubelet signals the container's PID 1, the process it started: the wrapper. After its
    ``exec`` that PID is the server, which gets SIGTERM and exits 0; the marker is still written."""
    root = tmp_path / "data" / "curvine"
    root.mkdir(parents=True)
    server = tmp_path / "curvine-server"
    server.write_text(FAKE_SERVER.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    server.chmod(0o755)
    report = tmp_path / "report"
    script = (_master_start_script(conf=CONF)
              .replace(curvine_config.PRIMARY_ROOT, str(root))
              .replace(f"exec {CURVINE_SERVER} ", f"exec {server} ")
              .replace(f"-lt {FIRST_START_MARKER_WAIT_S} ", "-lt 20 "))
    proc = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True,  # its own group, killed below
                            env={"PATH": "/usr/bin:/bin", "ROOT": str(root), "REPORT": str(report)})
    try:
        deadline = time.monotonic() + 30
        while not (report.exists() and (root / ".kvcache-initialized").exists()):
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
            time.sleep(0.05)
        (started,) = report.read_text().splitlines()
        assert started == f"pid={proc.pid} args=--service master --conf {CONF}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        try:  # whatever is left of the group (a server that never got the signal)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    assert report.read_text().splitlines()[-1] == "got SIGTERM"


def test_servers_log_only_to_stdout_workers_without_per_block_lines(toml_conf):
    master, worker = toml_conf["master"], toml_conf["worker"]
    for log in (master["log"], worker["log"], toml_conf["log"], toml_conf["cli"]["log"]):
        assert log["log_dir"] == "stdout"  # a directory would be rolling files in the writable layer
        assert curvine_logs.effective_level(log["level"]) == log["level"]  # a typo would silently be INFO
    assert worker["log"]["level"] == "warn" and master["log"]["level"] == "info"
    assert master["audit_logging_enabled"] is False  # one INFO line per metadata RPC otherwise


def test_fuse_pods_log_no_audit_line_per_call(curvine):
    """The FUSE pods read no config of ours; their client audit (default on) goes off by flag."""
    params = find(curvine, "StorageClass", "curvine-sc")["parameters"]
    assert params["client.audit-logging-enabled"] == "false"


# --- the per-block lines and their bytes per day ----------------------------------------------

#: The lines as a v0.3.2-alpha Worker prints them, written out from the format strings
#: (read_handler.rs 104-113 / 127 and 205, write_handler.rs 117-125 / 141 and 265-271) with the
#: module's example values: req_id 4962768465676381896, block 1,000,000 << 24, a 14 MiB chunk.
PATH = '"/opt/dlami/nvme/curvine-data/kvcache/active/b0/b2/blk_16777216000000"'
EXPECTED = {
    "read": [
        "2026/08/13 12:00:00.000 INFO read_handler.rs:127 Read remote-block start req_id: 4962768465676381896, "
        f"path: {PATH}, chunk_size: 131072, read len: 14.0MB, read_ahead: true-1048576\n",
        "2026/08/13 12:00:00.000 INFO read_handler.rs:205 Read block end for req_id 4962768465676381896\n",
    ],
    "write": [
        "2026/08/13 12:00:00.000 INFO write_handler.rs:141 Write remote-block start req_id: 4962768465676381896, "
        f"path: {PATH}, chunk_size: 131072, off: 0, block_size: 128.0MB\n",
        "2026/08/13 12:00:00.000 INFO write_handler.rs:265 write block end for req_id 4962768465676381896, "
        "is commit: true, off: 0, len: 14680064\n",
    ],
}


@pytest.mark.parametrize("operation, pair_bytes", [("read", 338), ("write", 367)])
def test_per_block_lines_are_rendered_as_the_worker_prints_them(operation, pair_bytes, k8s_project):
    lines = curvine_logs.block_lines(operation, chunk_bytes=curvine_logs.EXAMPLE_CHUNK_BYTES, data_dir=DATA_DIR,
                                     cluster_id=k8s_project.platform.project)
    assert [line.render() for line in lines] == EXPECTED[operation]
    assert sum(len(t) for t in EXPECTED[operation]) == pair_bytes


def test_byte_units_are_orpcs():
    assert [curvine_logs.byte_to_string(n) for n in (0, 1023, 14 * 2**20 + 300, 128 * 2**20, 3 * 2**40)] == \
        ["0", "1023.0B", "14.0MB", "128.0MB", "3.0TB"]


def test_log_bytes_per_day_before_and_after(toml_conf, k8s_project):
    """At the stated load (10 requests/s of 2,500-token prompts: 9 chunk files each, 90/s), INFO
    costs the Workers 2.63 GB/day if every chunk is read back, 2.85 GB/day if every chunk is
    stored; the rendered level logs none of those lines."""
    rate = curvine_logs.example_chunk_files_per_s()
    assert rate == 90
    kw = {"chunk_files_per_s": rate, "data_dir": DATA_DIR, "cluster_id": k8s_project.platform.project}
    assert curvine_logs.bytes_per_day("read", "info", **kw) == 338 * 90 * 86_400 == 2_628_288_000
    assert curvine_logs.bytes_per_day("write", "info", **kw) == 367 * 90 * 86_400 == 2_853_792_000
    rendered = toml_conf["worker"]["log"]["level"]
    assert curvine_logs.bytes_per_day("read", rendered, **kw) == curvine_logs.bytes_per_day("write", rendered, **kw) == 0
    # The model can say otherwise: an unknown level is INFO in orpc's logger.
    assert curvine_logs.bytes_per_day("write", "warning", **kw) == 2_853_792_000
