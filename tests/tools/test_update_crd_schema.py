"""scripts/update_crd_schema.py on the tools' CLI convention (operator_tools/cli.py): --help, one-line
errors naming the file, exit codes 0/1/2, and --check. Runs without ../shared/reference: the CRD
here is a small one written by the test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from operator_tools import cli
from tests.tools.script_loader import REPO, load_script


@pytest.fixture
def tool(tmp_path: Path, monkeypatch):
    """The script's module, writing its schema file into tmp_path instead of imports/."""
    module = load_script("update_crd_schema")
    monkeypatch.setattr(module, "SCHEMA_FILE", tmp_path / "imports" / "schema.json")
    monkeypatch.setattr(module, "REPO", tmp_path)
    (tmp_path / "imports").mkdir()
    return module


def _crd(path: Path, storage_name: str = "v1") -> Path:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "spec": {"versions": [
               {"name": "v1alpha1", "storage": False, "schema": {"openAPIV3Schema": {"type": "object"}}},
               {"name": storage_name, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object"}}}}}]}}
    path.write_text(yaml.safe_dump(crd))
    return path


def test_help_exits_0_without_a_traceback() -> None:
    """`--help` used to be read as the CRD's path: FileNotFoundError: '--help', exit 1."""
    done = subprocess.run([sys.executable, "scripts/update_crd_schema.py", "--help"], cwd=REPO, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert "usage: scripts/update_crd_schema.py" in done.stdout and "exit status: 0 = " in done.stdout


def test_writes_then_checks_the_schema(tool, tmp_path: Path, capsys) -> None:
    crd = _crd(tmp_path / "crd.yaml")
    assert tool.main([str(crd)]) == cli.EXIT_OK
    written = json.loads(tool.SCHEMA_FILE.read_text())
    assert written["properties"] == {"spec": {"type": "object"}} and "do not edit" in written["$comment"]
    assert capsys.readouterr().out.startswith("wrote imports/schema.json from ")
    assert tool.main([str(crd), "--check"]) == cli.EXIT_OK
    tool.SCHEMA_FILE.write_text("{}\n")
    assert tool.main([str(crd), "--check"]) == cli.EXIT_NO
    out = capsys.readouterr().out
    assert "imports/schema.json is not what" in out and "rewrite it" in out
    assert tool.SCHEMA_FILE.read_text() == "{}\n"  # --check never writes


def test_a_missing_crd_is_one_error_line_naming_it(tool, tmp_path: Path, capsys, monkeypatch) -> None:
    missing = tmp_path / "nope.yaml"
    assert tool.main([str(missing)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {missing}: no such CRD file; pass the operator's CRD")
    # Without an argument, on a checkout that has no ../shared/reference beside it.
    monkeypatch.setattr(tool, "DEFAULT_CRD", missing)
    assert tool.main([]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {missing} (the default, beside this project's own checkout)" in err
    assert not tool.SCHEMA_FILE.exists()


@pytest.mark.parametrize("content, message", [
    ("spec: [unclosed", "not valid YAML"),
    ("kind: ConfigMap\n", "not a CustomResourceDefinition: no spec.versions list"),
])
def test_a_file_that_is_no_crd_is_one_error_line(tool, tmp_path: Path, capsys, content: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    assert tool.main([str(bad)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}: {message}")


def test_a_crd_without_a_v1_storage_version_is_refused(tool, tmp_path: Path, capsys) -> None:
    crd = _crd(tmp_path / "crd.yaml", storage_name="v2")
    assert tool.main([str(crd)]) == cli.EXIT_ERROR
    assert capsys.readouterr().err == f"error: {crd}: expected one storage version v1, found ['v2']\n"
    assert not tool.SCHEMA_FILE.exists()
