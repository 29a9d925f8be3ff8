"""Node.js 20: documented commands run quietly (no jsii end-of-life box), and `make bench`
prints nothing but its JSON on stdout."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from platform_config.runtime import END_OF_LIFE_NOTICE_VARIABLE
from tests.example_config import FIXTURE_CONFIG, REPO
from tests.tools.script_loader import load_script

NOTICE = "end-of-life"


def node_major() -> int | None:
    try:
        out = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return int(out.strip().lstrip("v").split(".")[0])


def run_python(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """A child Python without the variable this test session itself sets (tests/conftest.py)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JSII_SILENCE_")}
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**clean, **env}, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("code", ["import stacks", "import k8s.render", "import kv_constructs.helm_charts"])
def test_importing_the_cdk_side_prints_no_node_notice(code) -> None:
    result = run_python(["-c", code])
    assert result.returncode == 0, result.stderr
    assert NOTICE not in result.stderr and "b'" not in result.stderr, result.stderr[:600]


def test_the_chart_vendoring_script_starts_no_cdk(tmp_path) -> None:
    """It downloads files: its --help printed jsii's Node box (it imported the constructs package)."""
    result = run_python(["-X", "importtime", "scripts/vendor_chart.py", "--help"])
    assert result.returncode == 0, result.stderr
    assert NOTICE not in result.stderr and "b'" not in result.stderr, result.stderr[:600]
    assert " aws_cdk" not in result.stderr and " jsii" not in result.stderr


def test_make_manifests_script_prints_no_node_notice(tmp_path) -> None:
    result = run_python(["scripts/manifests.py", "--config", str(FIXTURE_CONFIG), "--out", str(tmp_path / "dist"),
                         "--volume-id", "vol-0a1b2c3d4e5f60718"])
    assert result.returncode == 0, result.stderr
    assert NOTICE not in result.stderr and "b'" not in result.stderr, result.stderr[:600]


def test_the_lmcache_tiers_env_export_is_quiet_without_being_told(tmp_path) -> None:
    """tests_lmcache/conftest.py runs ``tests_lmcache.export_env`` with the project's interpreter and
    sets no jsii variable (its first import, ``k8s``, quiets the notice), so a user's own setting wins."""
    result = run_python(["-m", "tests_lmcache.export_env", "--out", str(tmp_path / "env.json")])
    assert result.returncode == 0, result.stderr
    assert NOTICE not in result.stderr and "b'" not in result.stderr, result.stderr[:600]
    conftest = (REPO / "tests_lmcache" / "conftest.py").read_text()
    assert "JSII_SILENCE" not in conftest and END_OF_LIFE_NOTICE_VARIABLE not in conftest


@pytest.mark.skipif(node_major() != 20, reason="the notice exists only on Node 20")
def test_the_check_can_fail_an_explicit_empty_setting_shows_the_notice() -> None:
    """The default never overrides the user's own value; an empty one lets jsii warn."""
    result = run_python(["-c", "import k8s.render"], **{END_OF_LIFE_NOTICE_VARIABLE: ""})
    assert NOTICE in result.stderr


def test_make_bench_stdout_is_only_the_json(tmp_path) -> None:
    """make echoes no command line (the recipe is silent); set-up output, if any, goes to stderr."""
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\necho \'{"runs": []}\'\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = subprocess.run(["make", "--no-print-directory", "-o", "setup", "bench", f"PY={fake}"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"runs": []}


def test_bench_synth_prints_one_json_object(monkeypatch, capsys) -> None:
    bench = load_script("bench_synth")
    monkeypatch.setattr(bench, "run_once", lambda command, env, outdir: {
        "stacks": 6, "wall_s": 2.0 if "app.py" in command else 1.0, "peak_rss_mib": 1.0, "peak_tree_rss_mib": 1.0,
        "template_kib": 1.0})
    assert bench.main(["--sizes", "1", "2", "--runs", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["config"], r["business_lines"]) for r in out["runs"]][1:] == [("generated", 1), ("generated", 2)]
    assert out["runs"][0]["config"].endswith("config") and out["runs"][0]["ratio_to_bare"] == 2.0
    assert out["bare"]["wall_s"] == 1.0 and out["runs"][0]["wall_s_each"] == [2.0, 2.0]
