"""An autoscaling line's manifests (issue 26): the InferenceEndpointConfig's ``autoScalingSpec``, and the
disruption budget and the cross-pod canary at ``min_replicas``.

The scenario's ``rag-assistant`` autoscales 1..2 (starts at 2; SLO 1,000 ms); the other lines are fixed.
"""

from __future__ import annotations

import cdk8s
import jsonschema
import pytest

from cluster_agents import kv_canary
from k8s import names
from k8s.canary import canary_config
from k8s.line_chart import BusinessLineChart, LineScaling, ScalingTrigger, autoscaling_spec
from observability import autoscaling, queries
from tests.k8s.conftest import find

RAG = "rag-assistant"


@pytest.fixture(scope="module")
def rag(k8s_project):
    return k8s_project.business_line(RAG)


def endpoint(manifests, line) -> dict:
    return find(manifests[names.line_chart_name(line)], "InferenceEndpointConfig", names.endpoint_name(line))


def test_the_autoscaling_line_renders_its_bounds_and_three_triggers(manifests, rag, k8s_project) -> None:
    spec = endpoint(manifests, rag)["spec"]
    assert spec["replicas"] == 2  # the initial count (the CRD: "initial pod count")
    scaling = spec["autoScalingSpec"]
    assert {k: v for k, v in scaling.items() if k != "prometheusTriggerList"} == {
        "minReplicaCount": 1, "maxReplicaCount": 2, "pollingInterval": 30,
        "scaleDownStabilizationTime": 300, "scaleUpStabilizationTime": 0}
    address = f"https://aps-workspaces.{k8s_project.platform.region}.amazonaws.com/workspaces/" \
              f"{autoscaling.PLACEHOLDER_WORKSPACE_ID}"
    assert scaling["prometheusTriggerList"] == [
        {"name": "waiting-requests", "query": queries.autoscale_waiting_requests(rag), "serverAddress": address,
         "targetValue": 4, "metricType": "Average"},
        {"name": "kv-cache-usage", "query": queries.autoscale_kv_cache_usage(rag), "serverAddress": address,
         "targetValue": 0.8, "metricType": "Value"},
        # 0.8 of the line's TTFT p90 SLO of 1,000 ms, in seconds (the query's unit).
        {"name": "ttft-p90", "query": queries.autoscale_ttft_p90_seconds(rag), "serverAddress": address,
         "targetValue": 0.8, "metricType": "Value"},
    ]
    assert "prometheusTrigger" not in scaling and "cloudWatchTrigger" not in scaling
    # The TTFT trigger reads the SLO alert's own quantile (the canary's requests left out).
    assert queries.ttft_quantile(rag, 0.9) in scaling["prometheusTriggerList"][2]["query"]


def test_fixed_lines_render_no_autoscaling(manifests, k8s_project) -> None:
    for line in k8s_project.business_lines:
        if line.autoscaling is None:
            spec = endpoint(manifests, line)["spec"]
            assert "autoScalingSpec" not in spec and spec["replicas"] == line.replicas


def test_the_autoscaling_spec_validates_against_the_crd_and_its_pattern(manifests, rag, crd_v1_schema) -> None:
    obj = endpoint(manifests, rag)
    jsonschema.validate(obj, crd_v1_schema, cls=jsonschema.Draft7Validator)
    bad = {**obj, "spec": {**obj["spec"], "autoScalingSpec": {**obj["spec"]["autoScalingSpec"], "prometheusTriggerList": [
        {**obj["spec"]["autoScalingSpec"]["prometheusTriggerList"][0],
         "serverAddress": "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/"}]}}}
    with pytest.raises(jsonschema.ValidationError):  # the CRD refuses a trailing slash; so do we (below)
        jsonschema.validate(bad, crd_v1_schema, cls=jsonschema.Draft7Validator)


def test_a_bad_server_address_or_no_trigger_is_refused_before_rendering(rag) -> None:
    trigger = ScalingTrigger("waiting-requests", "vector(1)", 4, "Average")
    with pytest.raises(ValueError, match="is not a workspace query URL"):
        autoscaling_spec(rag, LineScaling("https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/", (trigger,)))
    with pytest.raises(ValueError, match="at least one trigger"):
        autoscaling_spec(rag, LineScaling(autoscaling.workspace_query_url("us-west-2", "ws-1"), ()))
    # A CDK token (the observability stack's workspace ID) is resolved at deploy, not matched here.
    token = autoscaling.workspace_query_url("us-west-2", "${Token[TOKEN.123]}")
    assert autoscaling_spec(rag, LineScaling(token, (trigger,))).prometheus_trigger_list[0].server_address == token


def test_an_autoscaling_line_without_its_triggers_is_not_rendered(k8s_project, rag) -> None:
    with pytest.raises(ValueError, match="autoscales: its chart needs the triggers"):
        BusinessLineChart(cdk8s.App(), "line", platform=k8s_project.platform, line=rag)


def test_triggers_follow_the_config(k8s_project, rag) -> None:
    """A trigger set to null is left out; the TTFT target follows the SLO."""
    line = rag.model_copy(update={
        "autoscaling": rag.autoscaling.model_copy(update={"triggers": rag.autoscaling.triggers.model_copy(
            update={"kv_cache_usage": None, "ttft_p90_slo_fraction": 0.5})}),
        "slo": rag.slo.model_copy(update={"ttft_p90_ms": 3000})})
    assert [(t.name, t.target_value, t.metric_type) for t in autoscaling.triggers(line)] == [
        ("waiting-requests", 4, "Average"), ("ttft-p90", 1.5, "Value")]


def disruptions_allowed(pods: int, max_unavailable: int) -> int:
    """The disruption controller's count for a ``maxUnavailable`` budget with every pod healthy:
    desiredHealthy = expected - maxUnavailable, allowed = healthy - desiredHealthy, at least 0
    (kubernetes ``pkg/controller/disruption/disruption.go``, ``getExpectedPodCount`` / ``updatePdbStatus``)."""
    return max(0, pods - max(0, pods - max_unavailable))


def test_the_disruption_budget_holds_from_min_to_max_replicas(manifests, rag) -> None:
    """At every count the HPA may choose, min_replicas (1 here) included, a drain takes exactly one
    replica at a time and is never blocked (maxUnavailable 1, not minAvailable, whatever the count)."""
    pdb = find(manifests[names.line_chart_name(rag)], "PodDisruptionBudget", names.endpoint_name(rag))
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"] == {"matchLabels": {names.OPERATOR_POD_LABEL: names.endpoint_name(rag)}}
    for pods in range(rag.min_replica_count, rag.max_replica_count + 1):
        assert disruptions_allowed(pods, pdb["spec"]["maxUnavailable"]) == 1, pods
    assert rag.min_replica_count == 1  # the scenario exercises the one-replica floor


def test_the_canary_at_min_replicas_reports_one_replica_and_no_ratio(manifests, rag) -> None:
    """Scaled down to min_replicas 1, the line's canary (its rendered config) finds one replica: the
    run is ``one_replica``, no ratio is exported, so KvCacheCrossPodCanaryFailing cannot fire
    (its promtool case ``one_replica``, tests/observability/test_promtool.py)."""
    config = kv_canary.config_from_dict(canary_config(rag))
    label, value = config.pod_label
    pod = {"metadata": {"name": f"{value}-0", "labels": {label: value}},
           "spec": {"containers": [{"name": "vllm", "ports": [{"name": config.port_name, "containerPort": config.port}],
                                    "env": [{"name": "LMCACHE_REMOTE_URL", "value": "fs://localhost:0/mnt/x/"}]}]},
           "status": {"phase": "Running", "podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}}
    canary = kv_canary.Canary(config, list_pods=lambda: [pod] * rag.min_replica_count, log=lambda _: None)
    run = canary.run_once()
    assert (run.result, run.replicas, run.ratio) == ("one_replica", 1, None)
    text = canary.metrics()
    assert kv_canary.RATIO_METRIC not in text and f"{kv_canary.REPLICAS_METRIC}{{" in text
    # The canary Deployment itself stays one replica whatever the line's count.
    deployment = find(manifests[names.line_chart_name(rag)], "Deployment", names.KV_CANARY)
    assert deployment["spec"]["replicas"] == 1



# --- make manifests: the workspace an autoscaling line's triggers query ----------------------------


@pytest.fixture(scope="module")
def manifests_script():
    import importlib.util

    from tests.k8s.conftest import REPO

    spec = importlib.util.spec_from_file_location("_k8s_manifests_autoscaling", REPO / "scripts" / "manifests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _server_addresses(path) -> set[str]:
    import yaml

    (obj,) = [o for o in yaml.safe_load_all(path.read_text()) if o["kind"] == "InferenceEndpointConfig"]
    return {t["serverAddress"] for t in obj["spec"]["autoScalingSpec"]["prometheusTriggerList"]}


@pytest.fixture
def _no_workspace_env(monkeypatch):
    for name in ("PROMETHEUS_WORKSPACE_ID", "CURVINE_VOLUME_ID", "CURVINE_VOLUME_AZ"):
        monkeypatch.delenv(name, raising=False)


def test_make_manifests_names_the_workspace_given_or_from_the_outputs_file(manifests_script, tmp_path, capsys,
                                                                           _no_workspace_env) -> None:
    import json

    from tests.example_config import FIXTURE_CONFIG

    out = tmp_path / "dist"
    assert manifests_script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out),
                                  "--prometheus-workspace-id", "ws-1234abcd-0000-4000-8000-00000000abcd"]) == 0
    assert _server_addresses(out / "line-rag-assistant.yaml") == {
        "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1234abcd-0000-4000-8000-00000000abcd"}
    assert "Prometheus workspace" not in capsys.readouterr().err
    outputs = tmp_path / "cdk-outputs.json"
    outputs.write_text(json.dumps({"kvcache-observability": {"PrometheusWorkspaceId": "ws-feed"}}))
    assert manifests_script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out), "--outputs-file", str(outputs)]) == 0
    assert _server_addresses(out / "line-rag-assistant.yaml") == {
        "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-feed"}


def test_make_manifests_without_a_workspace_warns_and_a_bad_one_writes_nothing(manifests_script, tmp_path, capsys,
                                                                               _no_workspace_env) -> None:
    from tests.example_config import FIXTURE_CONFIG

    out = tmp_path / "dist"
    assert manifests_script.main(["--config", str(FIXTURE_CONFIG), "--out", str(out)]) == 0
    assert _server_addresses(out / "line-rag-assistant.yaml") == {
        f"https://aps-workspaces.us-west-2.amazonaws.com/workspaces/{autoscaling.PLACEHOLDER_WORKSPACE_ID}"}
    err = capsys.readouterr().err
    assert (f"the autoscaling triggers of rag-assistant name {autoscaling.PLACEHOLDER_WORKSPACE_ID}, which does not "
            "exist: they read nothing until re-rendered") in err
    bad = tmp_path / "bad"
    assert manifests_script.main(["--config", str(FIXTURE_CONFIG), "--out", str(bad),
                                  "--prometheus-workspace-id", "https://aps-workspaces/x"]) == 2
    assert not bad.exists()
    assert "error: --prometheus-workspace-id (or PROMETHEUS_WORKSPACE_ID): 'https://aps-workspaces/x' is not a " \
           "Prometheus workspace ID; allowed: ws-..." in capsys.readouterr().err
