"""`make synth` swaps in a new cdk.out only after a successful synthesis (never half-written).

The swap logic runs with a stand-in CDK CLI (fast, and able to fail after writing part of its
output); one run with the real CLI and a bad config checks the whole path end to end.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

from tests.example_config import REPO, copy_example_config, edit_yaml

#: A stand-in for node_modules/.bin/cdk: writes one template into --output, then fails when
#: FAKE_CDK_FAIL is set (after writing, like a synthesis that dies half-way).
FAKE_CDK = r"""#!/usr/bin/env bash
out=""
while [[ $# -gt 0 ]]; do [[ "$1" == "--output" ]] && out="$2"; shift; done
echo '{"Resources": {}}' > "$out/new-stack.template.json"
# What the real CLI prints on stderr around a multi-stack synth, and a warning of the app.
printf '\nSuccessfully synthesized to %s\n' "$(cd "$out" && pwd)" >&2
echo "Supply a stack id (kvcache-network, kvcache-eks) to display its template." >&2
echo "warning: rag-assistant: model outside the planner's table" >&2
[[ -z "${FAKE_CDK_FAIL:-}" ]]
"""


def make_synth(tmp_path: Path, cdk: str | None = None, **env: str) -> subprocess.CompletedProcess:
    args = ["make", "--no-print-directory", "-o", "setup", "synth", f"CDK_OUT={tmp_path / 'cdk.out'}"]
    if cdk:
        args.append(f"CDK={cdk}")
    return subprocess.run(args, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)


def last_good(tmp_path: Path) -> Path:
    good = tmp_path / "cdk.out"
    good.mkdir()
    (good / "old-stack.template.json").write_text('{"last": "good"}')
    return good


def fake_cdk(tmp_path: Path) -> str:
    path = tmp_path / "fake-cdk"
    path.write_text(FAKE_CDK)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("cdk.out."))


def test_success_replaces_cdk_out_as_a_whole(tmp_path) -> None:
    good = last_good(tmp_path)
    result = make_synth(tmp_path, fake_cdk(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in good.iterdir()) == ["new-stack.template.json"]  # nothing of the old one
    assert result.stdout == f"synthesized 1 stack templates into {good}/\n"
    assert leftovers(tmp_path) == []


def test_it_prints_one_line_and_keeps_the_clis_other_messages(tmp_path) -> None:
    """The CLI's "Successfully synthesized to <temporary dir>" named a directory gone after the
    swap, and "Supply a stack id" is advice for a plain `cdk synth`: both are dropped, and no
    command line naming the temporary directory is echoed; anything else still shows."""
    result = make_synth(tmp_path, fake_cdk(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and "cdk.out.new." not in result.stdout + result.stderr
    assert result.stderr == "warning: rag-assistant: model outside the planner's table\n"
    failed = make_synth(tmp_path, fake_cdk(tmp_path), FAKE_CDK_FAIL="1")
    assert failed.returncode != 0 and "model outside the planner's table" in failed.stderr
    assert failed.stdout == ""


def test_a_failed_synthesis_keeps_the_last_good_cdk_out(tmp_path) -> None:
    good = last_good(tmp_path)
    result = make_synth(tmp_path, fake_cdk(tmp_path), FAKE_CDK_FAIL="1")
    assert result.returncode != 0
    assert sorted(p.name for p in good.iterdir()) == ["old-stack.template.json"]
    assert (good / "old-stack.template.json").read_text() == '{"last": "good"}'
    assert leftovers(tmp_path) == []  # the half-written output is gone


def test_a_bad_config_with_the_real_cdk_cli_keeps_the_last_good_cdk_out(tmp_path) -> None:
    config = copy_example_config(tmp_path / "config")
    edit_yaml(config / "business-lines" / "rag-assistant.yaml", lambda d: d.update(routing_strategy="fastest"))
    good = last_good(tmp_path)
    result = make_synth(tmp_path, KVCACHE_CONFIG_DIR=str(config))
    assert result.returncode != 0
    assert "rag-assistant.yaml: routing_strategy" in result.stderr
    assert "Subprocess exited with error 2" in result.stderr  # docs/configuration.md: app.py exits 2
    assert result.returncode == 2
    assert sorted(p.name for p in good.iterdir()) == ["old-stack.template.json"]
    assert leftovers(tmp_path) == []


#: A stand-in CDK CLI that takes its time and writes FAKE_CDK_TEMPLATES templates.
SLOW_FAKE_CDK = r"""#!/usr/bin/env bash
out=""
while [[ $# -gt 0 ]]; do [[ "$1" == "--output" ]] && out="$2"; shift; done
sleep "${FAKE_CDK_SLEEP:-0}"
for i in $(seq "$FAKE_CDK_TEMPLATES"); do echo '{}' > "$out/stack-$i.template.json"; done
"""


def test_two_synths_at_once_run_one_after_the_other(tmp_path) -> None:
    """Issue 27: two `make synth` at once had no lock, and the last to swap won while each printed
    its own count. Now the second waits for the first: each count printed is what it swapped in, and
    cdk.out holds the count of the one that finished last."""
    cdk = tmp_path / "cdk"
    cdk.write_text(SLOW_FAKE_CDK)
    cdk.chmod(cdk.stat().st_mode | stat.S_IEXEC)
    args = ["make", "--no-print-directory", "-o", "setup", "synth", f"CDK_OUT={tmp_path / 'cdk.out'}", f"CDK={cdk}"]
    first = subprocess.Popen(args, cwd=REPO, env={**os.environ, "FAKE_CDK_TEMPLATES": "9", "FAKE_CDK_SLEEP": "2"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    second = subprocess.Popen(args, cwd=REPO, env={**os.environ, "FAKE_CDK_TEMPLATES": "8", "FAKE_CDK_SLEEP": "0"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_second, _ = second.communicate(timeout=120)
    out_first, _ = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0
    assert "synthesized 9 stack templates" in out_first and "synthesized 8 stack templates" in out_second
    # The second, started while the first held the lock, swapped in after it: its 8 templates stay.
    assert len(list((tmp_path / "cdk.out").glob("*.template.json"))) == 8
