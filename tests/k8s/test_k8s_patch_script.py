"""``scripts/patch_endpoint.sh`` runs the safe sequence, against a recording fake ``kubectl``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.k8s.conftest import REPO
from tests.k8s.operator_render import deployment

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
exit 0
"""


def _run(tmp_path: Path, k8s_project, fail: bool = False) -> tuple[subprocess.CompletedProcess, list[str]]:
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
    proc = subprocess.run(["bash", str(REPO / "scripts" / "patch_endpoint.sh"), "rag-assistant"], cwd=tmp_path,
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
    patch = _index(calls, "patch deployment rag-assistant --type=json")
    up = _index(calls, "scale deployment rag-assistant --replicas=2")
    ready = _index(calls, "rollout status deployment rag-assistant")
    restore = _index(calls, "hyperpod-inference-controller-manager --replicas=1")
    assert pause < drain < patch < up < ready < restore
    ops = json.loads((tmp_path / "applied.json").read_text())
    assert any(op["op"] == "remove" for op in ops) and ops[-1]["path"].endswith("/env/-")


def test_operator_restored_when_the_patch_fails(tmp_path, k8s_project):
    proc, calls = _run(tmp_path, k8s_project, fail=True)
    assert proc.returncode != 0
    assert "hyperpod-inference-controller-manager --replicas=1" in calls[-1]
    assert not any("--replicas=2" in c for c in calls), "no scale-up after a failed patch"
