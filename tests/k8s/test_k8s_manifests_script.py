"""``scripts/manifests.py`` (make manifests): same charts as the CDK path; bad input writes nothing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from k8s.patch import endpoint_json_patch
from platform_config import ConfigError, load_project
from tests.example_config import FIXTURE_CONFIG, edit_yaml
from tests.k8s.conftest import REPO, VOLUME_ID, ZONE


@pytest.fixture(autouse=True)
def _no_volume_env(monkeypatch):
    """A developer's CURVINE_VOLUME_ID/AZ must not change what these tests see."""
    monkeypatch.delenv("CURVINE_VOLUME_ID", raising=False)
    monkeypatch.delenv("CURVINE_VOLUME_AZ", raising=False)


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("_k8s_manifests_script", REPO / "scripts" / "manifests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_writes_one_file_per_chart_equal_to_render(script, tmp_path, manifests, k8s_project):
    out = tmp_path / "dist"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--volume-id", VOLUME_ID,
                        "--availability-zone", ZONE]) == 0
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    lines = [line.name for line in k8s_project.business_lines]
    assert {"rag-assistant", "research-reasoning"} <= set(lines)
    with_l2 = [line.name for line in k8s_project.business_lines if line.cache.l2_enabled]
    assert len(with_l2) < len(lines)  # the fixture has a line without L2: it gets no patch
    assert written == sorted([script.WRITTEN_LIST, "curvine.yaml", "kyverno-values.yaml", *(f"line-{n}.yaml" for n in lines),
                              *(f"patches/{n}.reference.json" for n in with_l2)])
    for name, objects in manifests.items():
        assert list(yaml.safe_load_all((out / f"{name}.yaml").read_text())) == objects


def test_static_patch_is_marked_reference_only(script, tmp_path, k8s_project):
    """The static patch cannot be fed to `kubectl patch --type=json`: it is an object, not an array."""
    out = tmp_path / "dist"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 0
    ref = json.loads((out / "patches" / "rag-assistant.reference.json").read_text())
    assert isinstance(ref, dict) and not isinstance(ref, list)
    assert "scripts/patch_endpoint.sh rag-assistant" in ref["reference_only"]
    assert ref["deployment"] == "rag-assistant/rag-assistant"
    line = k8s_project.business_line("rag-assistant")
    assert ref["operations"] == endpoint_json_patch(k8s_project.platform, line)
    assert all(op["op"] == "add" for op in ref["operations"])  # append-only: what "reference" means


def test_volume_and_zone_from_a_deploy_outputs_file(script, tmp_path):
    outputs = tmp_path / "cdk-outputs.json"
    outputs.write_text(json.dumps({"kvcache-hyperpod": {"CurvineVolumeId": "vol-0fedcba9876543210",
                                                        "CurvineVolumeAvailabilityZone": "us-west-2b"},
                                   "kvcache-eks": {"ClusterName": "kvcache-eks"}}))
    out = tmp_path / "dist"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--outputs-file", str(outputs)]) == 0
    pv = next(o for o in yaml.safe_load_all((out / "curvine.yaml").read_text()) if o["kind"] == "PersistentVolume")
    assert pv["spec"]["csi"]["volumeHandle"] == "vol-0fedcba9876543210"
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["us-west-2b"]


def test_without_a_volume_id_the_curvine_chart_is_skipped(script, tmp_path, capsys):
    out = tmp_path / "dist"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 0
    assert not (out / "curvine.yaml").exists() and (out / "line-rag-assistant.yaml").exists()
    err = capsys.readouterr().err
    assert "curvine.yaml not written" in err
    # Every way the README gives to pass the ID, the environment variable included.
    assert all(way in err for way in ("CURVINE_VOLUME_ID=vol-", "--volume-id", "--outputs-file", "cdk-outputs.json"))


def _assert_nothing_written(script, cfg: Path, tmp_path: Path, capsys, *expected: str, extra=()) -> None:
    out = tmp_path / "dist"
    out.mkdir()
    (out / "keep.txt").write_text("previous run")
    rc = script.main(["--config", str(cfg), "--out", str(out), "--volume-id", VOLUME_ID, *extra])
    err = capsys.readouterr().err
    assert rc == 2  # the tools' convention: bad input
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"], "nothing may be written on bad input"
    assert not list(tmp_path.glob(".dist-*")), "no temp dir left behind"
    for text in expected:
        assert text in err, err


def test_unknown_routing_strategy(script, config_copy, tmp_path, capsys):
    cfg = config_copy()
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d.update(routing_strategy="fastest"))
    _assert_nothing_written(script, cfg, tmp_path, capsys, "rag-assistant.yaml", "routing_strategy",
                            "prefixaware", "kvaware", "session", "roundrobin")


def test_pvc_size_not_a_quantity(script, config_copy, tmp_path, capsys):
    cfg = config_copy()
    edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", lambda d: d["cache"].update(l2_size="500 gigs"))
    _assert_nothing_written(script, cfg, tmp_path, capsys, "rag-assistant.yaml", "cache.l2_size", "500 gigs")


def test_l2_on_while_curvine_off(script, config_copy, tmp_path, capsys):
    cfg = config_copy()
    edit_yaml(cfg / "platform.yaml", lambda d: d["curvine"].update(enabled=False))
    _assert_nothing_written(script, cfg, tmp_path, capsys, "cache.l2_enabled", "curvine.enabled")
    with pytest.raises(ConfigError) as exc:
        load_project(cfg)
    assert {p.field for p in exc.value.problems} == {"cache.l2_enabled"}


def test_malformed_volume_id_and_outputs_file(script, tmp_path, capsys):
    _assert_nothing_written(script, FIXTURE_CONFIG, tmp_path, capsys, "volume_id", "vol-",
                            extra=["--volume-id", "i-0123456789abcdef0"])
    bad = tmp_path / "outputs.json"
    bad.write_text("not json")
    out = tmp_path / "dist2"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--outputs-file", str(bad)]) == 2
    assert not out.exists() and "--outputs-file" in capsys.readouterr().err


def test_volume_id_from_the_environment(script, tmp_path, monkeypatch):
    monkeypatch.setenv("CURVINE_VOLUME_ID", "vol-0aaaabbbbccccdddd")
    out = tmp_path / "dist"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 0
    pv = next(o for o in yaml.safe_load_all((out / "curvine.yaml").read_text()) if o["kind"] == "PersistentVolume")
    assert pv["spec"]["csi"]["volumeHandle"] == "vol-0aaaabbbbccccdddd"
    zone = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert zone == [load_project(FIXTURE_CONFIG).platform.gpu_availability_zone]


# --- issue 18: the tools' exit codes, the region, a readable dist/, curvine.yaml kept -------------

def test_a_volume_zone_outside_the_region_is_refused(script, tmp_path, capsys):
    _assert_nothing_written(script, FIXTURE_CONFIG, tmp_path, capsys,
                            "error: --availability-zone (or CURVINE_VOLUME_AZ): us-east-1a is not in the platform's "
                            f"region us-west-2 ({FIXTURE_CONFIG}/platform.yaml); allowed: the zone of the Curvine "
                            "Primary's volume, us-west-2a (gpu_availability_zone), or another zone of us-west-2",
                            extra=["--availability-zone", "us-east-1a"])


def test_a_zone_outside_the_region_from_the_outputs_file_is_refused_too(script, tmp_path, capsys):
    outputs = tmp_path / "cdk-outputs.json"
    outputs.write_text(json.dumps({"kvcache-hyperpod": {"CurvineVolumeId": VOLUME_ID,
                                                        "CurvineVolumeAvailabilityZone": "eu-west-1a"}}))
    out = tmp_path / "dist"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--outputs-file", str(outputs)]) == 2
    assert f"CurvineVolumeAvailabilityZone of --outputs-file {outputs}: eu-west-1a is not in" in capsys.readouterr().err
    assert not out.exists()


def test_dist_is_readable_by_everyone_like_cdk_out(script, tmp_path):
    """It was a temp dir renamed into place: mode 0700, so a web server or another user saw nothing."""
    import os
    import stat

    out = tmp_path / "dist"
    old = os.umask(0o022)
    try:
        assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "patches").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "kyverno-values.yaml").stat().st_mode) == 0o644


def test_without_a_volume_id_an_existing_curvine_yaml_is_kept_unless_asked(script, tmp_path, capsys):
    out = tmp_path / "dist"
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--volume-id", VOLUME_ID]) == 0
    rendered = (out / "curvine.yaml").read_text()
    capsys.readouterr()
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 0
    assert (out / "curvine.yaml").read_text() == rendered, "a run without the volume ID deleted the Curvine chart"
    assert f"the existing {out / 'curvine.yaml'} is kept as it was (not re-rendered; --drop-curvine removes it)" \
        in capsys.readouterr().err
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--drop-curvine"]) == 0
    assert not (out / "curvine.yaml").exists() and (out / "line-rag-assistant.yaml").exists()


def test_make_manifests_takes_the_config_directory(tmp_path):
    """``make manifests CONFIG=dir`` passes the same folder ``make synth CONFIG=dir`` reads (issue 18;
    tests/stacks/test_newcomer_path.py runs both)."""
    import subprocess

    result = subprocess.run(["make", "--no-print-directory", "-n", "manifests", f"CONFIG={tmp_path}"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert f'scripts/manifests.py --config "{tmp_path}" --out dist' in result.stdout


# --- issue 27: never delete or overwrite what this tool did not write ------------------------------

def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_out_at_a_folder_of_other_files_keeps_every_one(script, tmp_path):
    """``--out`` at a GitOps checkout (``.git`` and all) or at ``.``: the files are added beside what is
    there; a later run replaces and removes only what an earlier one wrote."""
    out = tmp_path / "gitops"
    (out / ".git" / "refs").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "README.md").write_text("our GitOps repository")
    (out / "patches").mkdir()
    (out / "patches" / "ours.json").write_text("{}")
    theirs = _tree(out)
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--volume-id", VOLUME_ID]) == 0
    first = _tree(out)
    assert {k: first[k] for k in theirs} == theirs
    assert "curvine.yaml" in first and "line-rag-assistant.yaml" in first
    # A line leaves the config: its file goes, the repository's own files stay.
    cfg = tmp_path / "config"
    import shutil
    shutil.copytree(FIXTURE_CONFIG, cfg)
    (cfg / "business-lines" / "rag-assistant.yaml").unlink()
    assert script.main(["--config", str(cfg), "--out", str(out), "--volume-id", VOLUME_ID]) == 0
    second = _tree(out)
    assert "line-rag-assistant.yaml" not in second and "patches/rag-assistant.reference.json" not in second
    assert {k: second[k] for k in theirs} == theirs


def test_a_file_of_the_same_name_not_written_by_the_tool_is_refused(script, tmp_path, capsys):
    out = tmp_path / "gitops"
    out.mkdir()
    (out / "kyverno-values.yaml").write_text("# hand-written values")
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: --out {out}: kyverno-values.yaml already there and not written by manifests.py" in err
    assert sorted(p.name for p in out.iterdir()) == ["kyverno-values.yaml"], "nothing may be written"
    assert (out / "kyverno-values.yaml").read_text() == "# hand-written values"


@pytest.mark.parametrize("where", ["out", "patches"])
def test_out_at_a_file_is_refused(script, tmp_path, capsys, where):
    out = tmp_path / "dist"
    if where == "out":
        out.write_text("a file")
    else:
        out.mkdir()
        (out / "patches").write_text("a file")
    before = _tree(tmp_path)
    assert script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert _tree(tmp_path) == before
