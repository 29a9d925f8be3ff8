"""Dashboards as code: a row per business line, the right thresholds, valid JSON written beside the templates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from observability import dashboards, queries
from tests.example_config import REPO, copy_example_config, edit_yaml
from tests.observability.conftest import panel_targets


def rows(model) -> list[str]:
    return [p["title"] for p in model["panels"] if p["type"] == "row"]


def panels_of_row(model, title_part: str) -> list[dict]:
    out, inside = [], False
    for panel in model["panels"]:
        if panel["type"] == "row":
            inside = title_part in panel["title"]
        elif inside:
            out.append(panel)
    return out


def test_one_platform_row_then_one_row_per_business_line(obs_project, dashboard) -> None:
    titles = rows(dashboard)
    assert titles[0].startswith("Platform")
    assert [t.split()[2] for t in titles[1:-1]] == [l.name for l in obs_project.business_lines]
    # Then one row of the cross-pod hit canary, every L2 line's series in its panels.
    assert titles[-1].startswith("Cross-pod hit canary")
    assert [p["title"] for p in panels_of_row(dashboard, "Cross-pod hit canary")] == [
        "Cross-pod hit ratio (canary)", "Canary TTFT: cold / warm",
        "Canary runs per hour, by result"]


def test_no_canary_row_without_a_line_that_runs_the_canary(tmp_path) -> None:
    from platform_config import load_project
    from tests.example_config import copy_example_config, edit_yaml

    copy = copy_example_config(tmp_path / "config")
    for name in ("rag-assistant", "research-reasoning", "ticket-triage"):
        edit_yaml(copy / "business-lines" / f"{name}.yaml", lambda d: d.setdefault("canary", {}).update(enabled=False))
    project = load_project(copy)
    titles = rows(dashboards.build_dashboard(project.platform, project.business_lines))
    assert not [t for t in titles if t.startswith("Cross-pod")]


def test_dashboard_binds_to_any_prometheus_data_source(dashboard) -> None:
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_panel_ids_are_unique_and_layout_fits_the_grid(dashboard) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert ids == list(range(1, len(ids) + 1))
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]


def test_each_line_row_has_the_issue_panels(obs_project, dashboard) -> None:
    for line in obs_project.business_lines:
        titles = [p["title"] for p in panels_of_row(dashboard, f"Business line {line.name} ")]
        for wanted in ("Prompt tokens served from cache, by tier", "Hit rates", "Hit tokens per second, by tier",
                       f"TTFT p50 / p90 / p99 (SLO p90 {line.slo.ttft_p90_ms} ms)", "Tokens per second",
                       "GPU utilisation"):
            assert wanted in titles, (line.name, wanted)
        l2_use = f"L2 use of {line.cache.l2_size}"
        assert (l2_use in titles) == line.cache.l2_enabled, (line.name, l2_use)  # no L2, no L2 gauge


def test_ttft_panel_draws_the_lines_slo(obs_project, dashboard) -> None:
    for line in obs_project.business_lines:
        (panel,) = [p for p in panels_of_row(dashboard, f"Business line {line.name} ") if p["title"].startswith("TTFT")]
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[-1] == {"color": "red", "value": line.slo.ttft_p90_ms / 1000}
        assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "dashed"
        assert [t["expr"] for t in panel["targets"]] == [queries.ttft_quantile(line, q) for q in (0.5, 0.9, 0.99)]


def test_l2_use_gauge_is_scaled_to_l2_size_with_the_high_watermark(obs_project, dashboard) -> None:
    line = obs_project.business_line("rag-assistant")
    (gauge,) = [p for p in panels_of_row(dashboard, "Business line rag-assistant ") if p["title"].startswith("L2 use")]
    defaults = gauge["fieldConfig"]["defaults"]
    assert defaults["max"] == 500 * 2**30 and defaults["unit"] == "bytes"
    assert defaults["thresholds"]["steps"][1]["value"] == 0.8 * 500 * 2**30
    assert gauge["targets"][0]["expr"] == queries.l2_used_bytes(line)


def test_pool_gauge_marks_the_alert_threshold(dashboard) -> None:
    (gauge,) = [p for p in dashboard["panels"] if p["title"] == "L2 pool used"]
    assert gauge["fieldConfig"]["defaults"]["thresholds"]["steps"][-1] == {"color": "red", "value": 0.85}


def test_a_line_without_l2_has_no_l2_panels(tmp_path) -> None:
    copy = copy_example_config(tmp_path / "config")
    edit_yaml(copy / "business-lines" / "rag-assistant.yaml", lambda d: d["cache"].update(l2_enabled=False))
    from platform_config import load_project

    project = load_project(copy)
    model = dashboards.build_dashboard(project.platform, project.business_lines)
    titles = [p["title"] for p in panels_of_row(model, "Business line rag-assistant ")]
    assert not [t for t in titles if t.startswith(("L2 ", "LMCache retrieve"))]
    shares = next(p for p in panels_of_row(model, "Business line rag-assistant ") if p["title"].startswith("Prompt"))
    assert [t["legendFormat"] for t in shares["targets"]] == ["L0 (GPU prefix cache)", "L1 (CPU, LMCache)"]


def test_write_dashboards_writes_importable_json(dashboard, tmp_path) -> None:
    (path,) = dashboards.write_dashboards(tmp_path, [dashboard])
    assert path == tmp_path / "dashboards" / "kvcache-kv-tiers.json"
    loaded = json.loads(path.read_text())
    assert loaded == dashboard and loaded["uid"] == "kvcache-kv-tiers"
    assert len(panel_targets(loaded)) == len(panel_targets(dashboard))


def test_app_writes_the_dashboard_beside_the_templates(tmp_path) -> None:
    """``python app.py`` (what ``cdk synth`` runs) leaves cdk.out/dashboards/<uid>.json after the templates."""
    outdir = tmp_path / "cdk.out"
    outdir.mkdir()
    env = {**os.environ, "KVCACHE_CONFIG_DIR": str(REPO / "tests" / "fixtures" / "config"), "CDK_OUTDIR": str(outdir)}
    result = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (outdir / "kvcache-observability.template.json").is_file()
    model = json.loads((outdir / "dashboards" / "kvcache-kv-tiers.json").read_text())
    assert len(rows(model)) == 6  # the platform row, one per fixture line, the canary row
    assert Path(outdir / "manifest.json").is_file()


def test_the_observability_doc_names_every_panel_and_alert(dashboard, all_alerts) -> None:
    section = (REPO / "docs" / "observability.md").read_text(encoding="utf-8")
    for alert in {a.name for a in all_alerts}:
        assert f"`{alert}`" in section, alert
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            title = panel["title"].split(" (SLO")[0].split(" of ")[0]
            assert title in section, title


def test_dashboard_json_round_trips_through_grafanas_typed_model(dashboard) -> None:
    """The JSON decodes into grafana-foundation-sdk's Dashboard model (Grafana's schema types) unchanged."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    decoded = Dashboard.from_json(dashboard)
    assert json.loads(json.dumps(decoded, cls=JSONEncoder)) == dashboard
    assert decoded.uid == "kvcache-kv-tiers" and decoded.templating.list_val[0].name == "datasource"
