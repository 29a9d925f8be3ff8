"""The hash-checked lock files of the project's virtualenv (issue 25, low item "pip without hashes").

``make setup`` installs ``requirements-dev.lock`` and the workflow's AWS jobs ``requirements.lock``,
both with ``pip install --require-hashes``: every package, transitive ones included, at one version,
each with the SHA-256 of its files. These tests keep the locks equal to what ``requirements*.txt``
pin, so a bump without ``make lock`` fails here, not on a machine that installs something else.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.example_config import REPO

#: An entry: ``name==version`` at the start of a line, then its indented continuation lines.
ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)(.*(?:\n[ \t]+.*)*)", re.M)
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}\b")
LOCKS = {"requirements-dev.lock": "requirements-dev.txt", "requirements.lock": "requirements.txt"}


def canonical(name: str) -> str:
    """PEP 503 normalized name (``aws-cdk.lambda-layer-kubectl-v34`` = ``aws_cdk_lambda_layer_kubectl_v34``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of sha256 hashes) of a lock file."""
    return {canonical(m.group(1)): (m.group(2), len(HASH.findall(m.group(3)))) for m in ENTRY.finditer(path.read_text())}


def pinned(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` (extras stripped) in a requirements file and the
    files it includes with ``-r``."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            out |= pinned(path.parent / line[3:].strip())
        elif "==" in line:
            name, version = line.split("==", 1)
            out[canonical(name.split("[", 1)[0])] = version.strip()
    return out


@pytest.mark.parametrize("lock,source", sorted(LOCKS.items()))
def test_the_lock_holds_every_pin_at_its_version_with_hashes(lock: str, source: str) -> None:
    locks = locked(REPO / lock)
    wanted = pinned(REPO / source)
    assert wanted, source
    wrong = {name: (version, locks.get(name, ("missing", 0))[0]) for name, version in wanted.items()
             if locks.get(name, ("missing", 0))[0] != version}
    assert not wrong, f"{lock} disagrees with {source} (pinned, locked): {wrong}; run `make lock`"
    unhashed = sorted(name for name, (_, hashes) in locks.items() if hashes == 0)
    assert not unhashed, f"{lock}: no --hash for {unhashed}"
    # Transitive packages are locked too: more entries than pins.
    assert len(locks) > len(wanted)


def test_the_runtime_lock_is_the_dev_lock_s_subset() -> None:
    runtime, dev = locked(REPO / "requirements.lock"), locked(REPO / "requirements-dev.lock")
    differ = {name: (v, dev.get(name, ("missing",))[0]) for name, (v, _) in runtime.items()
              if dev.get(name, ("missing",))[0] != v}
    assert not differ, f"requirements.lock and requirements-dev.lock lock different versions: {differ}; run `make lock`"


def test_every_install_of_the_project_venv_checks_hashes() -> None:
    makefile = (REPO / "Makefile").read_text()
    (setup,) = [line for line in makefile.splitlines() if "$(VENV)/bin/pip install" in line]
    assert "--require-hashes -r requirements-dev.lock" in setup, setup
    assert re.search(r"^\$\(VENV\)/\.installed: requirements-dev\.lock$", makefile, re.M)
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "platform.yml").read_text())
    installs = [step["run"] for job in workflow["jobs"].values() for step in job["steps"]
                if "pip install" in step.get("run", "") and ".venv/bin/pip" in step.get("run", "")]
    assert installs
    for run in installs:
        assert "--require-hashes -r requirements.lock" in run or "make " in run, run
