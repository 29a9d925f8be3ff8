"""A newcomer's first hour, as far as it runs offline (issue 18): a fresh checkout, the README's
first-deploy checklist applied to a config folder of one's own, then the README's offline commands
(``make synth CONFIG=dir``, ``scripts/plan.py``, ``make manifests CONFIG=dir``) against it.

The folder starts as the shipped example (the scenario config's platform and its copy of the
``rag-assistant`` example), so a fork that replaced the examples in ``config/`` runs the same path.

The checkout is the working tree's files (tracked and new, as ``git ls-files`` lists them) in a
temporary directory; it shares this run's virtualenv and ``node_modules`` (``make -o setup``: the
set-up itself is what a fresh clone's ``make synth`` adds, checked by the project's fresh-clone run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.example_config import FIXTURE_CONFIG, REPO, copy_line_file

README = (REPO / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The working tree as a fresh clone would have it, with this run's environment linked in."""
    root = tmp_path_factory.mktemp("newcomer") / "repo"
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    os.symlink(Path(sys.prefix), root / ".venv")
    os.symlink((REPO / "node_modules").resolve(), root / "node_modules")
    return root


def make(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("KVCACHE_CONFIG_DIR", "CURVINE_VOLUME_ID")}
    return subprocess.run(["make", "--no-print-directory", "-o", "setup", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=900)


def _example_folder(target: Path) -> Path:
    """A config folder as a newcomer's starts: the example platform and the RAG example line."""
    (target / "business-lines").mkdir(parents=True)
    shutil.copy2(FIXTURE_CONFIG / "platform.yaml", target / "platform.yaml")
    shutil.copy2(FIXTURE_CONFIG / "prices.yaml", target / "prices.yaml")
    copy_line_file(FIXTURE_CONFIG / "business-lines" / "rag-assistant.yaml", target / "business-lines" / "rag-assistant.yaml")
    return target


def _apply_the_checklist(config: Path) -> None:
    """Step 2 and 3 of the README's checklist, with a newcomer's values."""
    platform = config / "platform.yaml"
    data = yaml.safe_load(platform.read_text())
    data.update(account="444455556666", region="us-east-1", availability_zones=["us-east-1a", "us-east-1b"],
                gpu_availability_zone="us-east-1b", tags={"team": "inference"})
    data["eks"]["admin_principal_arns"] = ["arn:aws:iam::444455556666:role/InferenceAdmins"]
    data["hyperpod"]["instance_groups"][0]["instance_count"] = 3
    data["observability"]["alerts"]["email_subscriptions"] = ["oncall@example.com"]
    platform.write_text(yaml.safe_dump(data, sort_keys=False))
    assert "account: '444455556666'" in platform.read_text()  # quoted, as the checklist says
    line = config / "business-lines" / "rag-assistant.yaml"
    data = yaml.safe_load(line.read_text())
    data["model"]["source"].update(bucket="newcomer-models", region="us-east-1", location="qwen2-7b-instruct")
    data["replicas"] = 3
    data["autoscaling"]["max_replicas"] = 6  # the example autoscales: its bound moves with replicas (3 nodes, 2 each)
    line.write_text(yaml.safe_dump(data, sort_keys=False))


def test_the_checklist_then_the_offline_commands_on_a_config_folder_of_ones_own(checkout: Path) -> None:
    config = _example_folder(checkout.parent / "my-config")
    _apply_the_checklist(config)

    # The README's step 4, run as written but for the folder (`make test` is this suite).
    step4 = README.split("**4. Check offline**", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in step4.splitlines()]
    assert commands == ["make synth && make test",
                        ".venv/bin/python scripts/plan.py --business-line config/business-lines/<name>.yaml",
                        "make manifests"]

    synth = make(checkout, "synth", f"CONFIG={config}")
    assert synth.returncode == 0, synth.stderr[-3000:]
    assert re.fullmatch(r"synthesized \d+ stack templates into cdk.out/\n", synth.stdout)
    manifest = json.loads((checkout / "cdk.out" / "manifest.json").read_text())
    environments = {a["environment"] for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"}
    assert environments == {"aws://444455556666/us-east-1"}
    network = json.loads((checkout / "cdk.out" / "kvcache-network.template.json").read_text())
    zones = {r["Properties"]["AvailabilityZone"] for r in network["Resources"].values()
             if r["Type"] == "AWS::EC2::Subnet"}
    assert zones == {"us-east-1a", "us-east-1b"}

    plan = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "scripts/plan.py", "--business-line",
                           str(config / "business-lines" / "rag-assistant.yaml")], cwd=checkout,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines()[0] == (f"config        {config}/platform.yaml "
                                           "(the platform this line is planned against)")
    assert "(bfloat16) on ml.g6e.12xlarge" in plan.stdout and ", 3 replica(s)" in plan.stdout

    manifests = make(checkout, "manifests", f"CONFIG={config}")
    assert manifests.returncode == 0, manifests.stderr
    dist = checkout / "dist"
    assert stat.S_IMODE(dist.stat().st_mode) & 0o055 == 0o055  # readable like cdk.out/
    line = [o for o in yaml.safe_load_all((dist / "line-rag-assistant.yaml").read_text()) if o]
    endpoint = next(o for o in line if o["kind"] == "InferenceEndpointConfig")
    assert endpoint["spec"]["modelSourceConfig"]["s3Storage"]["bucketName"] == "newcomer-models"
    assert endpoint["spec"]["replicas"] == 3
    assert endpoint["spec"]["autoScalingSpec"]["maxReplicaCount"] == 6


def test_a_mistake_in_the_checklist_is_one_line_and_keeps_the_last_good_output(checkout: Path) -> None:
    """The account without quotes, as a newcomer types it: refused with the fix, cdk.out/ untouched."""
    config = _example_folder(checkout.parent / "typo-config")
    platform = config / "platform.yaml"
    assert 'account: "111122223333"' in platform.read_text()
    platform.write_text(platform.read_text().replace('account: "111122223333"', "account: 444455556666"))
    (checkout / "cdk.out").mkdir(exist_ok=True)
    (checkout / "cdk.out" / "marker").write_text("last good")
    synth = make(checkout, "synth", f"CONFIG={config}")
    assert synth.returncode == 2
    assert (f"error: {config}/platform.yaml: account: not allowed; allowed: a valid string; unquoted, YAML reads "
            '444455556666 as the number 444455556666: write "444455556666" in quotes for the text') in synth.stderr
    assert (checkout / "cdk.out" / "marker").read_text() == "last good"
    manifests = make(checkout, "manifests", f"CONFIG={config}")
    assert manifests.returncode == 2 and "error: " in manifests.stderr
