"""Every autoscaling trigger's PromQL evaluated by Prometheus' own engine, and the IAM and stack wiring
by which KEDA reads the platform's workspace (issue 26, "Replicas are fixed").

The queries are the ones the scenario's ``rag-assistant`` renders into its InferenceEndpointConfig
(:func:`observability.autoscaling.triggers`), run by ``promtool test rules`` (``promql_expr_test``,
Debian 12's Prometheus 2.42.0, as the alerts are) on recorded series: the value KEDA would read,
a single element, and 0 (never an empty result or NaN) when there is nothing to read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Capture, Match

from observability import autoscaling, targets
from tests.observability import promtool
from tests.observability.promtool import series
from tests.observability.test_promtool import CANARY, LINE, VLLM, ttft_buckets

OTHER = {"job": targets.JOB_VLLM, "business_line": "legal-search", "namespace": "legal-search"}
TTFT = "vllm:time_to_first_token_seconds"


@pytest.fixture(scope="module")
def triggers(obs_project) -> dict[str, str]:
    """Trigger name -> query of the scenario's autoscaling line."""
    return {t.name: t.query for t in autoscaling.triggers(obs_project.business_line(LINE))}


def one(value: float) -> list[dict[str, Any]]:
    """``exp_samples`` of a query that returns exactly one element, without labels."""
    return [{"labels": "{}", "value": value}]


def cases(q: dict[str, str]) -> list[dict[str, Any]]:
    """promtool test groups: input series and the value each trigger's query must give."""
    waiting = q[autoscaling.WAITING_REQUESTS]
    usage = q[autoscaling.KV_CACHE_USAGE]
    ttft = q[autoscaling.TTFT_P90]
    busy = {"interval": "1m", "input_series": [
        series("vllm:num_requests_waiting", {**VLLM, "pod": "rag-0"}, "3x20"),
        series("vllm:num_requests_waiting", {**VLLM, "pod": "rag-1"}, "5x20"),
        series("vllm:num_requests_waiting", {**OTHER, "pod": "legal-0"}, "7x20"),  # another line: not counted
        series("vllm:kv_cache_usage_perc", {**VLLM, "pod": "rag-0"}, "0.5x20"),
        series("vllm:kv_cache_usage_perc", {**VLLM, "pod": "rag-1"}, "1x20"),
        series("vllm:kv_cache_usage_perc", {**OTHER, "pod": "legal-0"}, "0x20"),
        # 9 requests a minute between 0.5 s and 0.75 s, 1 between 1 s and 2.5 s: p90 0.75 s.
        *ttft_buckets(TTFT, VLLM, {0.75: 9, 2.5: 1}, 20)],
        "promql_expr_test": [{"expr": waiting, "eval_time": "10m", "exp_samples": one(8)},
                             {"expr": usage, "eval_time": "10m", "exp_samples": one(0.75)},
                             {"expr": ttft, "eval_time": "10m", "exp_samples": one(0.75)}]}
    # Every slow request is the canary's own (in vLLM's histogram and in the canary's): the users'
    # p90 is not slow, and a window without user requests reads 0, not NaN (KEDA refuses NaN).
    canary_only = {"interval": "1m", "input_series": [
        *ttft_buckets(TTFT, VLLM, {2.5: 2}, 20), *ttft_buckets("kvcache_canary_request_ttft_seconds", CANARY, {2.5: 2}, 20)],
        "promql_expr_test": [{"expr": ttft, "eval_time": "10m", "exp_samples": one(0)}]}
    # Nothing scraped yet (a new line) or only another line's pods: each query still answers one 0.
    nothing = {"interval": "1m", "input_series": [series("vllm:num_requests_waiting", {**OTHER, "pod": "legal-0"}, "7x20")],
               "promql_expr_test": [{"expr": e, "eval_time": "10m", "exp_samples": one(0)} for e in (waiting, usage, ttft)]}
    # After a burst the queue drains: the query follows the gauge down (scale-in is the HPA's to damp).
    drained = {"interval": "1m", "input_series": [series("vllm:num_requests_waiting", {**VLLM, "pod": "rag-0"}, "12x5 0x15")],
               "promql_expr_test": [{"expr": waiting, "eval_time": "3m", "exp_samples": one(12)},
                                    {"expr": waiting, "eval_time": "10m", "exp_samples": one(0)}]}
    return [busy, canary_only, nothing, drained]


def run_promtool(directory: Path, q: dict[str, str]):
    rules = promtool.write_yaml(directory / "rules.yaml", {"groups": []})
    tests = promtool.write_yaml(directory / "tests.yaml", {"rule_files": [rules.name], "evaluation_interval": "1m",
                                                           "tests": cases(q)})
    return promtool.promtool(["test", "rules", tests.name], cwd=directory)


def test_every_trigger_query_reads_what_users_feel_on_recorded_series(triggers, tmp_path) -> None:
    assert set(triggers) == {autoscaling.WAITING_REQUESTS, autoscaling.KV_CACHE_USAGE, autoscaling.TTFT_P90}
    result = run_promtool(tmp_path, triggers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("name", "old", "new"), [
    (autoscaling.WAITING_REQUESTS, " or vector(0)", ""),              # an empty result on a new line
    (autoscaling.KV_CACHE_USAGE, "avg(", "sum("),                      # a total, not the mean per replica
    (autoscaling.TTFT_P90, " >= 0", ""),                               # NaN in a quiet window
    (autoscaling.TTFT_P90, "clamp_min(", "abs("),                      # the canary's requests counted
])
def test_a_mutated_trigger_query_is_caught(triggers, tmp_path, name, old, new) -> None:
    assert old in triggers[name]
    mutant = {**triggers, name: triggers[name].replace(old, new, 1)}
    if name == autoscaling.TTFT_P90 and old == "clamp_min(":
        mutant[name] = triggers[name].replace(" - (", " + (", 1)  # add the canary's requests instead of removing them
    result = run_promtool(tmp_path, mutant)
    assert result.returncode != 0, f"mutation {old!r} -> {new!r} of {name} was not caught"


# --- how KEDA reads the workspace: IAM and the stacks ------------------------------------------------


def test_keda_may_query_exactly_this_workspace(templates, obs_project) -> None:
    """The observability stack lets the inference add-on's KEDA role (from the addons stack) run
    aps:QueryMetrics on its own workspace, nothing else and no wildcard."""
    project = obs_project.platform.project
    obs, addons = templates[f"{project}-observability"], templates[f"{project}-addons"]
    (workspace_id,) = obs.find_resources("AWS::APS::Workspace")
    role = Capture()
    obs.has_resource_properties("AWS::IAM::Policy", {
        "PolicyDocument": {"Statement": [{"Sid": "QueryThisPrometheusWorkspace", "Effect": "Allow",
                                          "Action": "aps:QueryMetrics",
                                          "Resource": {"Fn::GetAtt": [workspace_id, "Arn"]}}]},
        "Roles": [{"Fn::ImportValue": role}]})
    # Follow the import to the addons stack: it exports the role KEDA's service account assumes.
    (export,) = [o for o in addons.to_json()["Outputs"].values() if o.get("Export", {}).get("Name") == role.as_string()]
    role_id = export["Value"]["Ref"]
    trust = json.dumps(addons.to_json()["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"])
    assert "sts:AssumeRoleWithWebIdentity" in trust
    keda_condition = [r for r in addons.find_resources("Custom::AWSCDKCfnJson").values()
                      if "keda-operator" in json.dumps(r["Properties"]["Value"])]
    assert keda_condition, "the exported role is KEDA's IRSA role"
    assert role_id in json.dumps(addons.find_resources("AWS::EKS::Addon", Match.object_like({"Properties": {
        "AddonName": "amazon-sagemaker-hyperpod-inference"}})))


def test_an_autoscaling_line_queries_the_platform_workspace_and_deploys_after_it(platform, templates, obs_project) -> None:
    project = obs_project.platform.project
    rag, fixed = platform.business_lines[LINE], platform.business_lines["research-reasoning"]
    assert platform.observability in rag.dependencies and platform.observability not in fixed.dependencies
    assert platform.observability not in platform.l2_cache.dependencies
    manifest = json.dumps(templates[f"{project}-line-{LINE}"].find_resources("Custom::AWSCDK-EKS-KubernetesResource"))
    workspace_export = f"{project}-observability:ExportsOutputFnGetAttWorkspaceWorkspaceId"
    assert manifest.count(workspace_export) == 3  # one serverAddress per trigger
    assert f'serverAddress\\":\\"https://aps-workspaces.{obs_project.platform.region}.amazonaws.com/workspaces/' in manifest
    assert "autoScalingSpec" not in json.dumps(templates[f"{project}-line-research-reasoning"].to_json())


def test_the_line_row_of_the_dashboard_names_the_bounds(dashboard) -> None:
    rows = [p["title"] for p in dashboard["panels"] if p.get("type") == "row"]
    assert f"Business line {LINE} (namespace {LINE}, Qwen2-7B-Instruct, autoscaled 1-2x ml.g6e.12xlarge)" in rows
    assert ("Business line research-reasoning (namespace research-reasoning, DeepSeek-R1-Distill-Llama-70B, "
            "1x ml.p5.48xlarge)") in rows
