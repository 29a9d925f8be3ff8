"""``scripts/patch_endpoint.sh`` runs the safe sequence, against a recording fake ``kubectl``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.example_config import FIXTURE_CONFIG
from tests.k8s.conftest import REPO
from tests.k8s.operator_render import deployment

from k8s import names
from operator_tools import cli
from platform_config import load_project

RAG = load_project(FIXTURE_CONFIG).business_line("rag-assistant")

SCRIPT = REPO / "scripts" / "patch_endpoint.sh"

FAKE_KUBECTL = r"""#!/usr/bin/env bash
echo "$*" >> "$KUBECTL_LOG"
case "$*" in
  *"hyperpod-inference-controller-manager -o jsonpath"*) echo 1 ;;
  *"-o jsonpath={.spec.replicas}"*) echo 2 ;;
  *"get deployment"*"-o json") cat "$DEPLOYMENT_JSON" ;;
  *"patch deployment"*)
    all="$*"; file="${all##*--patch-file }"; file="${file%% *}"; cp "$file" "$PATCH_COPY"
    [[ -n "${FAIL_PATCH:-}" ]] && exit 1 ;;
esac
[[ -n "${FAIL_ALL:-}" ]] && { echo "The connection to the server was refused" >&2; exit 1; }
exit 0
"""


def _run(tmp_path: Path, k8s_project, fail: bool = False,
         unreachable: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    kubectl = bindir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    dep = tmp_path / "deploy.json"
    dep.write_text(json.dumps(deployment(k8s_project.business_line("rag-assistant"))))
    log = tmp_path / "kubectl.log"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "KUBECTL_LOG": str(log),
           "DEPLOYMENT_JSON": str(dep), "PATCH_COPY": str(tmp_path / "applied.json"), "PYTHON": sys.executable}
    if fail:
        env["FAIL_PATCH"] = "1"
    if unreachable:
        env["FAIL_ALL"] = "1"
    proc = subprocess.run(["bash", str(SCRIPT), "rag-assistant", "--config", str(FIXTURE_CONFIG)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    return proc, log.read_text().splitlines()


def _index(calls: list[str], needle: str) -> int:
    hits = [i for i, c in enumerate(calls) if needle in c]
    assert hits, f"{needle!r} not called: {calls}"
    return hits[-1]


def test_safe_sequence(tmp_path, k8s_project):
    proc, calls = _run(tmp_path, k8s_project)
    assert proc.returncode == 0, proc.stderr
    pause = _index(calls, "hyperpod-inference-controller-manager --replicas=0")
    drain = _index(calls, "scale deployment rag-assistant --replicas=0")
    # The Pods' selector comes from k8s/names.py, like every other name.
    gone = _index(calls, f"wait pod -l {names.OPERATOR_POD_LABEL}={names.endpoint_name(RAG)} --for=delete")
    assert drain < gone
    patch = _index(calls, "patch deployment rag-assistant --type=json")
    up = _index(calls, "scale deployment rag-assistant --replicas=2")
    ready = _index(calls, "rollout status deployment rag-assistant")
    restore = _index(calls, "hyperpod-inference-controller-manager --replicas=1")
    assert pause < drain < patch < up < ready < restore
    ops = json.loads((tmp_path / "applied.json").read_text())
    assert any(op["op"] == "remove" for op in ops) and ops[-1]["path"].endswith("/env/-")


def test_operator_restored_when_the_patch_fails(tmp_path, k8s_project):
    proc, calls = _run(tmp_path, k8s_project, fail=True)
    assert proc.returncode == 2, proc.stderr  # an error, never 1 ("the answer is no")
    assert "error: step failed at line" in proc.stderr and 'patch deployment "$DEPLOY"' in proc.stderr
    assert "hyperpod-inference-controller-manager --replicas=1" in calls[-1]
    assert not any("--replicas=2" in c for c in calls), "no scale-up after a failed patch"


def test_an_unreachable_cluster_exits_2(tmp_path, k8s_project):
    proc, calls = _run(tmp_path, k8s_project, unreachable=True)
    assert proc.returncode == 2 and "connection to the server was refused" in proc.stderr, proc.stderr
    assert len(calls) == 1 and "get deployment rag-assistant" in calls[0]


def _run_bare(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The script with no kubectl on PATH at all: input errors must stop it before any cluster call."""
    full_env = {**os.environ, "PYTHON": sys.executable, "PATH": "/usr/bin:/bin", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=120)


def test_help_prints_usage_and_exit_codes_without_a_traceback(tmp_path):
    for flag in ("--help", "-h"):
        proc = _run_bare([flag], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("usage: scripts/patch_endpoint.sh <business-line>")
        # The exit codes of the README's one table (operator_tools/cli.py), word for word.
        assert cli.exit_epilog("patch_endpoint.sh") in " ".join(proc.stdout.split()) and "--dry-run" in proc.stdout
        assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("args, message", [
    (["no-such-line"], "error: no business line 'no-such-line'; known: "),
    ([], "error: no business line given"),
    (["rag-assistant", "--frobnicate"], "error: unknown option --frobnicate"),
    (["rag-assistant", "--config"], "error: --config needs a directory"),
    (["rag-assistant", "--config", "missing-dir"], "error: config directory missing-dir not found"),
])
def test_bad_input_exits_2_with_one_clean_message(tmp_path, args, message):
    if args and args[0] == "no-such-line":
        args = [*args, "--config", str(FIXTURE_CONFIG)]
    proc = _run_bare(args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_invalid_config_and_l2_off_line_exit_2_without_a_traceback(tmp_path):
    """A relative --config is the caller's (the script's Python steps run in the repository)."""
    from tests.example_config import copy_example_config, edit_yaml

    cfg = copy_example_config(tmp_path / "cfg")
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["cache"].update(l2_enabled=False))
    proc = _run_bare(["rag-assistant", "--config", "cfg"], tmp_path)
    assert proc.returncode == 2 and "cache.l2_enabled: false; nothing to patch" in proc.stderr, proc.stderr
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d.update(replicas=0))
    proc = _run_bare(["rag-assistant", "--config", "cfg"], tmp_path)
    assert proc.returncode == 2 and "rag-assistant.yaml: replicas:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
