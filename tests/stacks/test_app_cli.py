"""``python app.py`` with bad config: exit 2 (the tools' convention), an error naming file and field,
and nothing written."""

from __future__ import annotations

from pathlib import Path

from tests.example_config import edit_yaml, run_app


def test_bad_platform_value_exits_2_names_file_and_field_and_writes_nothing(config_dir, tmp_path) -> None:
    platform = config_dir / "platform.yaml"
    edit_yaml(platform, lambda d: d["hyperpod"]["tiered_storage"].update(memory_allocation_percentage=15))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 2
    assert str(platform) in result.stderr
    assert "hyperpod.tiered_storage.memory_allocation_percentage" in result.stderr
    assert "15" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_bad_business_line_exits_2_names_the_line_file(config_dir, tmp_path) -> None:
    line = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line, lambda d: d.update(instance_type="ml.g6e.48xlarge"))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 2
    assert str(line) in result.stderr
    assert "instance_type" in result.stderr
    assert "allowed: ml.g6e.12xlarge, ml.p5.48xlarge" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_value_beyond_ebs_limits_is_a_config_error_before_any_output(config_dir, tmp_path) -> None:
    """The schema allows iops up to 64,000 (io2); gp3 stops at 16,000, which the volume construct knows."""
    platform = config_dir / "platform.yaml"
    edit_yaml(platform, lambda d: d["curvine"]["primary_volume"].update(iops=20000))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert str(platform) in result.stderr
    assert "curvine.primary_volume.iops" in result.stderr
    assert "3000-16000" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_two_files_for_one_line_is_a_config_error_naming_both(config_dir, tmp_path) -> None:
    """rag-assistant.yml beside rag-assistant.yaml: both are read, so both are named; no jsii error."""
    yaml_file = config_dir / "business-lines" / "rag-assistant.yaml"
    yml_file = yaml_file.with_suffix(".yml")
    yml_file.write_text(yaml_file.read_text())
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert f"business line 'rag-assistant' is defined by 2 files ({yaml_file}, {yml_file})" in result.stderr
    assert "JavaScriptError" not in result.stderr and "Traceback" not in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_a_model_the_planner_says_does_not_fit_is_refused(config_dir, tmp_path) -> None:
    """Llama-3.1-70B (131 GiB of bf16 weights) on one 48 GB L40S: the planner's rule, at synth."""
    line = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line, lambda d: (d["model"].update(name="Llama-3.1-70B-Instruct"), d.update(gpus_per_replica=1)))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert f"{line}: gpus_per_replica: Llama-3.1-70B-Instruct (bfloat16) does not fit ml.g6e.12xlarge" in result.stderr
    assert "allowed: gpus_per_replica 4 or more" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_a_zero_pvc_size_is_refused(config_dir, tmp_path) -> None:
    line = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line, lambda d: d["cache"].update(l2_size="0Gi"))
    result = run_app(config_dir, tmp_path / "out")
    assert result.returncode == 2
    assert f"{line}: cache.l2_size: must be above zero" in result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_warnings_are_printed_and_do_not_stop_synthesis(config_dir, monkeypatch, capsys) -> None:
    """A model outside the planner's table: app.py says its fit is unchecked, then synthesizes."""
    import importlib.util
    import sys
    import types

    line = config_dir / "business-lines" / "rag-assistant.yaml"
    edit_yaml(line, lambda d: d["model"].update(name="Mistral-7B-Instruct"))
    built = []
    fake = types.SimpleNamespace(new_app=lambda **kw: types.SimpleNamespace(synth=lambda: built.append("synth")),
                                 build_platform=lambda app, project: (
                                     built.append(project), types.SimpleNamespace(observability=None))[1],
                                 add_nag_checks=lambda app: built.append("nag"))
    limits = types.SimpleNamespace(template_size_problems=lambda outdir, project, shown_as: [],
                                   validation_problems=lambda outdir, project, shown_as: [])
    monkeypatch.setitem(sys.modules, "stacks", fake)  # the CDK side is tested elsewhere; this is app.main's flow
    monkeypatch.setitem(sys.modules, "stacks.synthesis_checks", limits)
    monkeypatch.setenv("CDK_OUTDIR", str(config_dir.parent / "out"))
    monkeypatch.setenv("KVCACHE_CONFIG_DIR", str(config_dir))
    spec = importlib.util.spec_from_file_location("_app_under_test", Path(__file__).resolve().parents[2] / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    assert app.main() == 0
    err = capsys.readouterr().err
    assert f"warning: {line}: model.name 'Mistral-7B-Instruct' is not in the planner's table" in err
    assert "scripts/plan.py --business-line" in err and "--hf-config" in err
    assert built[-2:] == ["nag", "synth"]


def test_a_template_over_cloudformations_limit_is_refused_with_nothing_written(config_dir, tmp_path) -> None:
    """A 1.1 MB line template used to synthesize with only CDK's warning, and exit 0; the deploy
    would have failed. Now: exit 2, the template named, the limit and what grows it, nothing written."""
    lines = config_dir / "business-lines"
    for name in ("legal-search", "research-reasoning", "ticket-triage"):
        (lines / f"{name}.yaml").unlink()
    line = lines / "rag-assistant.yaml"
    edit_yaml(line, lambda d: d["vllm"].update(args=[*d["vllm"]["args"], "--served-model-name", "q" * 1_050_000]))
    out = tmp_path / "out"
    result = run_app(config_dir, out)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.rstrip("\n").splitlines()[-1]
    prefix = f"error: {out}/kvcache-line-rag-assistant.template.json: "
    assert last.startswith(prefix)
    size = int(last[len(prefix):].split(" ", 1)[0].replace(",", ""))
    assert 1_050_000 < size < 2_000_000  # the 1.05 MB argument, once (in the endpoint's args)
    assert last.endswith(" bytes, more than CloudFormation accepts in a template (1,000,000 bytes; the deploy would "
                         "fail); it holds this business line's Kubernetes manifests; allowed: a smaller line config "
                         "(vllm.args, model source, hot_prefixes)")
    assert list(out.iterdir()) == [] and not list(tmp_path.glob(".out.*")), "nothing written, no staging left"


def test_an_instance_type_not_offered_in_the_region_names_the_key_not_a_traceback(config_dir, tmp_path) -> None:
    """CloudFormation's validation at synthesis knows ml.g6e.12xlarge is not offered in eu-west-1; the
    jsii error that followed its report was a Python traceback. Now one line per finding, exit 2."""
    platform = config_dir / "platform.yaml"
    edit_yaml(platform, lambda d: d.update(region="eu-west-1", availability_zones=["eu-west-1a", "eu-west-1b"],
                                           gpu_availability_zone="eu-west-1a"))
    out = tmp_path / "out"
    result = run_app(config_dir, out)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors and all(e.startswith(f"error: {platform}: hyperpod.instance_groups.instance_type: ") for e in errors)
    assert ("InstanceGroups.InstanceType: 'ml.g6e.12xlarge' is not valid for region 'eu-west-1' (CloudFormation "
            "Validate E3644, on HyperPodCluster of kvcache-hyperpod.template.json, kvcache-hyperpod/HyperPod/Resource); "
            "allowed: an instance type SageMaker HyperPod offers in region eu-west-1, or a region that offers this "
            "one") in errors[0]
    assert list(out.iterdir()) == [] and not list(tmp_path.glob(".out.*"))
