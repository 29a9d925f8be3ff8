"""The convention every operator tool follows (operator_tools/cli.py): help texts, exit codes and the
README's one table of them, error lines, quiet broken pipes; and the permissions the docs list
for each tool, recorded from the calls the code makes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError

from operator_tools import cli
from operator_tools.preflight import run_preflight
from platform_config import load_project
from tests.example_config import FIXTURE_CONFIG
from tests.tools.script_loader import REPO, load_script

TOOLS = ("plan", "overlap", "bench_ttft", "verify", "preflight", "orphans", "manifests", "stateful_snapshot",
         "bootstrap_policy", "vendor_chart",
         "update_crd_schema")
README = (REPO / "README.md").read_text()
OPERATOR_DOC = (REPO / "docs" / "operator-tools.md").read_text()


@pytest.mark.parametrize("tool", TOOLS)
def test_help_shows_real_defaults_only_and_the_exit_codes(tool: str, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-from-env")
    text = load_script(tool).build_parser().format_help()
    flat = " ".join(text.split())  # argparse wraps lines
    assert "default: None" not in flat and "default: False" not in flat
    assert not re.search(r"\(default: [^)]*\)\s*\(default:", flat)
    m = cli.EXIT_CODES[f"{tool}.py"]
    assert f"exit status: 0 = {m.ok}; 1 = {m.no}; 2 = {m.error}." in flat
    assert "sk-secret-from-env" not in text


def test_api_key_default_is_shown_once_and_never_its_value(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-from-env")
    flat = " ".join(load_script("bench_ttft").build_parser().format_help().split())
    options = flat[flat.index("options:"):]
    api_key_help = options[options.index("--api-key API_KEY"):options.index("--endpoint {")]
    assert api_key_help.count("default") == 1 and "$OPENAI_API_KEY" in api_key_help


def test_the_docs_have_the_one_exit_code_table() -> None:
    assert cli.exit_code_table() in OPERATOR_DOC
    # The Python tools, plus the two run by hand that cannot import operator_tools/cli.py (their
    # --help texts are compared with it in tests/k8s/test_k8s_patch_script.py and
    # tests/agents/test_l2_janitor.py).
    assert set(cli.EXIT_CODES) == {f"{t}.py" for t in TOOLS} | {"patch_endpoint.sh", "cluster_agents/l2_janitor.py"}
    assert "| `scripts/patch_endpoint.sh` |" in OPERATOR_DOC and "| `cluster_agents/l2_janitor.py` |" in OPERATOR_DOC
    # Nowhere else restates the codes tool by tool: the docs and the scripts point to the table.
    for tool in TOOLS:
        doc = load_script(tool).__doc__
        assert not re.search(r"[Ee]xit code \d", doc) and "--help" in doc, tool


@pytest.mark.parametrize("tool", TOOLS)
def test_a_flag_error_is_one_error_line_too(tool: str, capsys) -> None:
    """README: an error is one `error: ...` line on stderr. argparse's own printed the whole usage
    block (over 20 lines for plan.py) and then `scripts/<tool>: error: ...`."""
    with pytest.raises(SystemExit) as exc:
        load_script(tool).build_parser().parse_args(["--no-such-flag"])
    assert exc.value.code == cli.EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert err.endswith(f"; see scripts/{tool}.py --help\n") and "usage:" not in err


def test_a_flag_error_names_the_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        load_script("plan").main(["--model", "Qwen2-7B", "--instance-type", "ml.g6e.xlarge", "--tp", "x"])
    assert capsys.readouterr().err == "error: argument --tp: 'x' is not an integer; see scripts/plan.py --help\n"


def test_run_applies_the_convention(capsys) -> None:
    def bad_input(argv: Any) -> int:
        raise cli.ToolError("--thing: no such file: /x")

    with pytest.raises(SystemExit) as exc:
        cli.run(bad_input, [])
    assert exc.value.code == cli.EXIT_ERROR
    assert capsys.readouterr().err == "error: --thing: no such file: /x\n"
    with pytest.raises(SystemExit) as exc:
        cli.run(lambda argv: cli.EXIT_NO, [])
    assert exc.value.code == cli.EXIT_NO


def _run_into_a_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    """Run a script with stdout a pipe whose reader has already gone, as after ``| head -1``."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, *args], stdout=write_end, stderr=subprocess.PIPE, cwd=REPO,
                              text=True, timeout=120)
    finally:
        os.close(write_end)


def test_a_closed_pipe_ends_quietly_with_the_tools_answer(tmp_path: Path) -> None:
    """``plan.py ... | head`` used to end with a BrokenPipeError traceback."""
    planned = _run_into_a_closed_pipe(["scripts/plan.py", "--model", "Qwen2-7B", "--instance-type", "ml.g6e.12xlarge"])
    assert planned.stderr == "" and planned.returncode == cli.EXIT_OK
    too_big = _run_into_a_closed_pipe(["scripts/plan.py", "--model", "Qwen2.5-32B", "--instance-type",
                                       "ml.g6e.xlarge", "--json"])
    assert too_big.stderr == "" and too_big.returncode == cli.EXIT_NO
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"prompt": "x" * 5000}) + "\n")
    overlap = _run_into_a_closed_pipe(["scripts/overlap.py", str(log)])
    assert overlap.stderr == "" and overlap.returncode == cli.EXIT_NO


@pytest.mark.parametrize("text, value", [("0.4", 0.4), ("40%", 0.4), ("0", 0.0), ("1", 1.0)])
def test_fraction_flags_accept_a_fraction_or_a_percentage(text: str, value: float) -> None:
    assert cli.fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["40", "101%", "-1", "x"])
def test_fraction_flags_refuse_anything_else(text: str) -> None:
    with pytest.raises(Exception, match="0.4|40%"):
        cli.fraction(text)


# --- permissions each tool needs, recorded from the code's own calls ---------------------------------

class _RecordingSession:
    """A boto3 Session stand-in that answers every call with an empty response (or the one in
    ``responses``, keyed by IAM action) and records it as the IAM action it needs
    (``ec2:DescribeAvailabilityZones``). A waiter records the operation botocore's own waiter
    model polls (``stack_delete_complete`` -> ``cloudformation:DescribeStacks``)."""

    calls: list[str] = []
    responses: dict[str, dict] = {}

    def __init__(self, region_name: str) -> None:
        self.region_name = region_name

    def client(self, service: str) -> Any:
        calls = self.calls

        def action(method: str) -> str:
            return f"{service}:{''.join(w.capitalize() for w in method.split('_'))}"

        responses = self.responses

        class Paginator:
            def __init__(self, method: str) -> None:
                self.method = method

            def paginate(self, **kwargs: Any) -> list[dict]:
                calls.append(action(self.method))
                return [responses.get(action(self.method), {})]

        class Waiter:
            def __init__(self, name: str) -> None:
                model = botocore.session.get_session().get_waiter_model(service)
                self.operation = model.get_waiter("".join(w.capitalize() for w in name.split("_"))).operation

            def wait(self, **kwargs: Any) -> None:
                calls.append(f"{service}:{self.operation}")

        class Client:
            exceptions = type("Exceptions", (), {"ClientError": ClientError})

            def get_paginator(self, method: str) -> Paginator:
                return Paginator(method)

            def get_waiter(self, name: str) -> Waiter:
                return Waiter(name)

            def __getattr__(self, method: str) -> Any:
                def call(**kwargs: Any) -> dict:
                    calls.append(action(method))
                    return responses.get(action(method), {})
                return call

        return Client()


def _documented(tool: str) -> str:
    """The row of ``tool`` in the docs' permissions table."""
    section = OPERATOR_DOC[OPERATOR_DOC.index("### Permissions each tool needs"):]
    section = section[:section.index("\n#")]
    rows = [line for line in section.splitlines() if line.startswith(f"| `scripts/{tool}.py`")]
    assert len(rows) == 1, f"one permissions row for {tool}"
    return rows[0]


def test_preflight_permissions_in_the_docs_are_the_calls_it_makes() -> None:
    """With a deployed hyperpod stack and a node under deep health checks, so the update guard reads
    every node API it may call, and a Primary volume the config grows, so its check reads the volume."""
    _RecordingSession.calls = []
    _RecordingSession.responses = {
        "cloudformation:GetTemplate": {"TemplateBody": {"Resources": {"CurvinePrimaryVolume": {
            "Type": "AWS::EC2::Volume", "Properties": {"Size": 1, "VolumeType": "gp3", "Iops": 3000, "Throughput": 125}}}}},
        "cloudformation:DescribeStackResource": {"StackResourceDetail": {"PhysicalResourceId": "vol-0abc"}},
        "ec2:DescribeVolumes": {"Volumes": [{"VolumeId": "vol-0abc", "Size": 1, "State": "in-use"}]},
        "sagemaker:ListClusterNodes": {"ClusterNodeSummaries": [{
            "InstanceGroupName": "g6e-inference", "InstanceId": "i-0bbb",
            "InstanceStatus": {"Status": "DeepHealthCheckInProgress"}}]},
        "sagemaker:DescribeClusterNode": {"NodeDetails": {"InstanceStatus": {"Status": "DeepHealthCheckInProgress"}}}}
    try:
        run_preflight(load_project(FIXTURE_CONFIG).platform, session_factory=_RecordingSession)
    finally:
        _RecordingSession.responses = {}
    called = set(_RecordingSession.calls)
    assert "ec2:DescribeAvailabilityZones" in called  # the recorder sees the calls
    row = _documented("preflight")
    documented = set(re.findall(r"`([a-z0-9-]+:[A-Za-z]+)`", row))
    assert called == documented, row


def test_orphans_permissions_in_the_docs_are_the_calls_it_makes() -> None:
    """Listing and ``--destroy --yes`` with one orphan: every call the script makes, as IAM actions."""
    project = load_project(FIXTURE_CONFIG)
    orphan = {"StackName": f"{project.platform.project}-line-gone", "StackStatus": "CREATE_COMPLETE",
              "StackId": "arn:aws:cloudformation:us-west-2:111122223333:stack/kvcache-line-gone/1",
              "Tags": [{"Key": "kvcache.io/project", "Value": project.platform.project}]}
    _RecordingSession.responses = {"sts:GetCallerIdentity": {"Account": project.platform.account},
                                   "cloudformation:DescribeStacks": {"Stacks": [orphan]}}
    orphans = load_script("orphans")
    try:
        _RecordingSession.calls = []
        assert orphans.main(["--config", str(FIXTURE_CONFIG)], session_factory=_RecordingSession) == cli.EXIT_NO
        listing = set(_RecordingSession.calls)
        _RecordingSession.calls = []
        assert orphans.main(["--config", str(FIXTURE_CONFIG), "--destroy", "--yes"],
                            session_factory=_RecordingSession) == cli.EXIT_OK
        destroying = set(_RecordingSession.calls)
    finally:
        _RecordingSession.responses = {}
    assert listing == {"sts:GetCallerIdentity", "cloudformation:DescribeStacks"}
    assert destroying == listing | {"cloudformation:DeleteStack"}
    row = _documented("orphans")
    assert set(re.findall(r"`([a-z0-9-]+:[A-Za-z]+)`", row)) == destroying, row


def test_orphans_cli_follows_the_convention(capsys) -> None:
    orphans = load_script("orphans")
    assert orphans.main(["--config", str(FIXTURE_CONFIG / "nope")]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "platform.yaml" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        orphans.main(["--config", str(FIXTURE_CONFIG), "--yes"])
    assert exc.value.code == cli.EXIT_ERROR and "--yes only applies to --destroy" in capsys.readouterr().err
    closed = _run_into_a_closed_pipe(["scripts/orphans.py", "--help"])
    assert closed.stderr == "" and closed.returncode == cli.EXIT_OK


def test_offline_tools_need_no_permissions() -> None:
    for tool in ("plan", "overlap"):
        assert "none" in _documented(tool)


def test_l1_is_explained_the_same_way_in_readme_and_docs() -> None:
    definition = ("LMCache's CPU buffer (`local_cpu`) in host memory inside each vLLM pod, sized per pod by "
                  "`cache.l1_cpu_gib`")
    for path in ("README.md", "docs/l2-cache.md", "docs/operator-tools.md"):
        text = " ".join((REPO / path).read_text().split())
        assert definition in text, path
    for path in ("README.md", "docs/l2-cache.md"):
        assert "LMCache's CPU offload (HyperPod Tiered Storage)" not in (REPO / path).read_text(), path


def test_preflight_cli_exit_codes(capsys) -> None:
    from botocore.exceptions import NoCredentialsError

    preflight = load_script("preflight")

    def no_credentials(region_name: str) -> Any:
        class Session:
            def client(self, service: str) -> Any:
                class Client:
                    def get_caller_identity(self) -> dict:
                        raise NoCredentialsError()
                return Client()
        return Session()

    assert preflight.main(["--config", str(FIXTURE_CONFIG)], session_factory=no_credentials) == cli.EXIT_ERROR
    assert capsys.readouterr().err == "error: cannot query AWS in us-west-2: Unable to locate credentials\n"
    _RecordingSession.calls = []
    # Empty answers: wrong account, no zones, no add-on versions, no bootstrap stack -> checks fail.
    assert preflight.main(["--config", str(FIXTURE_CONFIG), "--json"], session_factory=_RecordingSession) == cli.EXIT_NO
    rows = json.loads(capsys.readouterr().out)
    assert rows and not all(r["ok"] for r in rows)
    assert preflight.main(["--config", str(FIXTURE_CONFIG / "nope")]) == cli.EXIT_ERROR
    assert "platform.yaml" in capsys.readouterr().err
