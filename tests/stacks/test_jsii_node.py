"""jsii's Node.js runs with two V8 flags (scripts/jsii_node.sh): a speed setting, never a change of
output. A user's own JSII_NODE wins; the templates are those of plain node, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from platform_config import runtime
from tests.example_config import FIXTURE_CONFIG, REPO


def test_the_default_is_the_script_and_a_users_own_value_wins(monkeypatch) -> None:
    monkeypatch.delenv("JSII_NODE", raising=False)
    runtime.prepare_jsii_node()
    assert os.environ["JSII_NODE"] == str(REPO / "scripts" / "jsii_node.sh")
    monkeypatch.setenv("JSII_NODE", "/opt/node22/bin/node")
    runtime.prepare_jsii_node()
    assert os.environ["JSII_NODE"] == "/opt/node22/bin/node"


def test_the_script_runs_node_with_its_flags() -> None:
    code = "console.log(process.execArgv.filter(a => a.startsWith('--') && a !== '-e').join(' '))"
    result = subprocess.run([str(REPO / "scripts" / "jsii_node.sh"), "-e", code],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "--single-threaded --liftoff-only"


def test_the_templates_are_plain_nodes_byte_for_byte(synthesized, tmp_path: Path) -> None:
    """The session's synthesis ran with the flags (tests/conftest.py); the same app with plain node."""
    out = tmp_path / "plain"
    code = ("import sys, stacks; from platform_config import load_project; "
            f"app = stacks.new_app(outdir={str(out)!r}); stacks.build_platform(app, load_project({str(FIXTURE_CONFIG)!r})); "
            "app.synth()")
    env = {**os.environ, "JSII_NODE": "node"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    ours = sorted(p.name for p in Path(synthesized.outdir).glob("*.template.json"))
    assert ours and ours == sorted(p.name for p in out.glob("*.template.json"))
    for name in ours:
        assert (out / name).read_bytes() == (Path(synthesized.outdir) / name).read_bytes(), name
