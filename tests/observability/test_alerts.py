"""Alerts as code: the required alerts, their thresholds from config, the rule file and the SNS route."""

from __future__ import annotations

import yaml

from k8s import names
from observability import alerts, queries, targets
from platform_config.fields import quantity_bytes
from tests.example_config import copy_example_config, edit_yaml
from tests.observability.conftest import selectors


def by_name(all_alerts) -> dict[str, list[alerts.Alert]]:
    out: dict[str, list[alerts.Alert]] = {}
    for alert in all_alerts:
        out.setdefault(alert.name, []).append(alert)
    return out


def test_the_issue_alerts_are_all_there(all_alerts) -> None:
    assert set(by_name(all_alerts)) == {
        "KvCacheLineL2AboveHighWatermark", "KvCacheCurvinePoolAlmostFull", "KvCacheCurvinePrimaryDown",
        "KvCacheAdmissionWebhookDown", "KvCacheAdmissionFailing", "KvCacheL2HitRateCollapsed",
        "KvCacheTtftP90OverSlo", "KvCachePodWithoutL2", "KvCacheCurvineWorkersLost",
        "KvCacheL2JanitorStale", "KvCacheL2JanitorFailing", "KvCacheL2MountDead",
        # issue 16: L2 stores and retrieves failing, the cross-pod hit canary failing
        "KvCacheL2StoreFailing", "KvCacheL2RetrieveFailing", "KvCacheCrossPodCanaryFailing",
        # a node without its mount watchdog; a hot prefix's warm-ups failing, or its chunks not pinnable
        "KvCacheL2MountWatchdogMissing", "KvCacheHotPrefixWarmupFailing", "KvCacheHotPrefixNamesMismatch",
        # issue 24 item 4: the FUSE pod guard's admitted deletes, its errors, and whether they are counted
        "KvCacheFusePodReplaced", "KvCacheFusePodGuardFailing", "KvCacheFusePodGuardUnmeasured",
        # issue 29 item 3: one replica taking most of its line's traffic (a routing hot spot)
        "KvCacheReplicaHotSpot"}
    for alert in all_alerts:
        assert alert.severity in ("critical", "warning") and alert.meaning and alert.action


def test_ttft_alert_per_line_uses_the_lines_slo_in_seconds(obs_project, all_alerts) -> None:
    rules = {a.labels["business_line"]: a for a in by_name(all_alerts)["KvCacheTtftP90OverSlo"]}
    assert set(rules) == {"rag-assistant", "research-reasoning", "legal-search", "ticket-triage"}  # L2 or not
    assert rules["rag-assistant"].expr.endswith(" > 1")       # slo.ttft_p90_ms: 1000
    assert rules["research-reasoning"].expr.endswith(" > 3")  # slo.ttft_p90_ms: 3000
    assert rules["legal-search"].expr.endswith(" > 2")        # the default, 2000 ms
    for line in obs_project.business_lines:
        assert rules[line.name].expr.startswith("histogram_quantile(0.9, ")
        # Lines with the canary take its requests out of vLLM's histogram (docs/observability.md);
        # legal-search (L2 off) has no canary.
        canary = {"kvcache_canary_request_ttft_seconds_bucket"} if line.runs_canary else set()
        assert {n for n, _ in selectors(rules[line.name].expr)} == {"vllm:time_to_first_token_seconds_bucket"} | canary
    assert not obs_project.business_line("legal-search").runs_canary


def test_hot_spot_alert_only_on_lines_that_can_have_two_replicas(obs_project, all_alerts) -> None:
    rules = {a.labels["business_line"]: a for a in by_name(all_alerts)["KvCacheReplicaHotSpot"]}
    most = {line.name: line.autoscaling.max_replicas if line.autoscaling else line.replicas
            for line in obs_project.business_lines}
    assert set(rules) == {name for name, n in most.items() if n > 1} and "rag-assistant" in rules
    expr = rules["rag-assistant"].expr
    assert {n for n, _ in selectors(expr)} == {"vllm:prompt_tokens_total"}
    assert f" > {alerts.HOT_SPOT_FACTOR:g} / scalar(count(" in expr and "sum by (pod)" in expr


def test_watermark_alert_compares_the_janitors_bytes_with_high_watermark_times_l2_size(obs_project, all_alerts) -> None:
    rules = {a.labels["business_line"]: a for a in by_name(all_alerts)["KvCacheLineL2AboveHighWatermark"]}
    assert rules["rag-assistant"].expr == (
        'max(kvcache_l2_janitor_used_bytes{job="kvcache-l2-janitor",line="rag-assistant"}) > 0.8 * 536870912000')
    assert quantity_bytes("500Gi") == 536870912000
    assert rules["research-reasoning"].expr.endswith(f"> 0.8 * {2 * 2**40}")


def test_janitor_stale_alert_fires_after_three_periods_without_a_pass(obs_project, all_alerts) -> None:
    rules = {a.labels["business_line"]: a for a in by_name(all_alerts)["KvCacheL2JanitorStale"]}
    assert set(rules) == {"rag-assistant", "research-reasoning", "ticket-triage"}  # the L2 lines
    assert rules["rag-assistant"].expr == (
        'time() - max(max_over_time(kvcache_l2_janitor_last_run_timestamp_seconds{job="kvcache-l2-janitor",'
        'line="rag-assistant"}[1d])) > 1800')
    assert 1800 == 3 * 600  # three janitor periods (cluster_agents.l2_janitor.PERIOD_S)
    from cluster_agents.l2_janitor import PERIOD_S

    assert PERIOD_S == 600 and rules["rag-assistant"].for_ == "5m"


def test_janitor_failing_alert_waits_for_three_failed_passes(all_alerts) -> None:
    rules = {a.labels["business_line"]: a for a in by_name(all_alerts)["KvCacheL2JanitorFailing"]}
    assert rules["research-reasoning"].expr == (
        'max(kvcache_l2_janitor_errors{job="kvcache-l2-janitor",line="research-reasoning"}) > 0')
    # The gauge holds a pass's result for one period: true at the end of failed pass 1, still true
    # 20 minutes later only if passes 2 and 3 failed too.
    assert rules["research-reasoning"].for_ == "20m"


def test_pool_alert_threshold_comes_from_config(obs_project, tmp_path) -> None:
    (alert,) = by_name(alerts.all_alerts(obs_project.platform, obs_project.business_lines))["KvCacheCurvinePoolAlmostFull"]
    assert alert.expr.endswith(" > 0.85")
    copy = copy_example_config(tmp_path / "config")
    edit_yaml(copy / "platform.yaml", lambda d: d["observability"]["alerts"].update(pool_usage_threshold=0.9))
    from platform_config import load_project

    edited = load_project(copy)
    (alert,) = by_name(alerts.all_alerts(edited.platform, edited.business_lines))["KvCacheCurvinePoolAlmostFull"]
    assert alert.expr.endswith(" > 0.9")


def test_primary_and_webhook_down_fire_on_absence_of_a_healthy_target(all_alerts) -> None:
    alerts_ = by_name(all_alerts)
    assert alerts_["KvCacheCurvinePrimaryDown"][0].expr == f'absent(up{{job="{targets.JOB_CURVINE_MASTER}"}} == 1)'
    assert alerts_["KvCacheAdmissionWebhookDown"][0].expr == f'absent(up{{job="{targets.JOB_KYVERNO}"}} == 1)'


def test_admission_failing_watches_pod_denials_and_l2_policy_errors_in_l2_namespaces(all_alerts) -> None:
    (alert,) = by_name(all_alerts)["KvCacheAdmissionFailing"]
    found = dict(selectors(alert.expr))
    assert found["kyverno_admission_requests_total"]["request_allowed"] == ("Equal", "false")
    # The L2 lines only: legal-search (L2 off) has no policy to fail.
    assert found["kyverno_admission_requests_total"]["resource_namespace"] == (
        "Re", "rag-assistant|research-reasoning|ticket-triage")
    assert found["kyverno_policy_results_total"]["policy_name"] == (
        "Re", "rag-assistant-l2-cache|research-reasoning-l2-cache|ticket-triage-l2-cache")
    assert found["kyverno_policy_results_total"]["rule_result"] == ("Re", "fail|error")


def test_pod_without_l2_alert_reads_the_policys_label_through_the_target_label(all_alerts) -> None:
    (alert,) = by_name(all_alerts)["KvCachePodWithoutL2"]
    ((name, matchers),) = selectors(alert.expr)
    assert name == "up"
    assert matchers[targets.L2_CACHE_TARGET_LABEL] == ("NotEqual", names.L2_MUTATED_VALUE)
    assert matchers["business_line"] == ("Re", "rag-assistant|research-reasoning|ticket-triage")  # not legal-search


def test_hit_rate_collapse_compares_15_minutes_with_the_6_hours_before(obs_project, all_alerts) -> None:
    rules = {a.labels["business_line"]: a for a in by_name(all_alerts)["KvCacheL2HitRateCollapsed"]}
    line = obs_project.business_line("rag-assistant")
    assert rules[line.name].expr.startswith(f"({queries.l2_hit_share(line, '15m')}) < 0.5 * (")
    assert "[6h] offset 15m" in rules[line.name].expr and ") > 0.05 and " in rules[line.name].expr
    assert f"* {line.cache.chunk_size_tokens})" in rules[line.name].expr


def test_a_line_without_l2_gets_only_the_ttft_and_hot_spot_alerts(tmp_path) -> None:
    copy = copy_example_config(tmp_path / "config")
    edit_yaml(copy / "business-lines" / "rag-assistant.yaml",
              lambda d: d["cache"].update(l2_enabled=False, l2_size="500Gi"))
    from platform_config import load_project

    project = load_project(copy)
    per_line = [a for a in alerts.all_alerts(project.platform, project.business_lines)
                if a.labels.get("business_line") == "rag-assistant"]
    # no janitor, L2 or canary alerts either; the hot spot is routing's, L2 or not (2 replicas at most here)
    assert [a.name for a in per_line] == ["KvCacheTtftP90OverSlo", "KvCacheReplicaHotSpot"]
    (pods,) = by_name(alerts.all_alerts(project.platform, project.business_lines))["KvCachePodWithoutL2"]
    assert "rag-assistant" not in pods.expr


def test_rule_file_is_prometheus_rule_groups(obs_project) -> None:
    data = yaml.safe_load(alerts.rule_groups_yaml(obs_project.platform, obs_project.business_lines))
    assert [g["name"] for g in data["groups"]] == ["kvcache-platform", "kvcache-lines"]
    for group in data["groups"]:
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
            assert rule["labels"]["severity"] in ("critical", "warning")
            assert set(rule["annotations"]) == {"summary", "description", "runbook"}


def test_alert_manager_sends_everything_to_the_sns_topic_with_sigv4_region() -> None:
    definition = yaml.safe_load(alerts.alert_manager_definition("arn:aws:sns:us-west-2:111122223333:t", "us-west-2"))
    config = yaml.safe_load(definition["alertmanager_config"])
    assert config["route"]["receiver"] == "sns"
    (receiver,) = config["receivers"]
    (sns,) = receiver["sns_configs"]
    assert sns["topic_arn"] == "arn:aws:sns:us-west-2:111122223333:t"
    assert sns["sigv4"] == {"region": "us-west-2"}
    assert "api_url" not in sns and "http_config" not in sns  # AMP refuses both


def test_mount_dead_alert_reads_the_watchdogs_gauge_and_outlasts_healing(obs_project, all_alerts) -> None:
    """Named and read exactly as the alert tests of the live-Prometheus tier expect
    (``KvCacheL2MountDead``, ``kvcache_l2_mount_up``); held longer than the watchdog needs to evict
    every L2 pod of a node whose FUSE pod restarted (one per eviction interval) and to see the
    replacements mount."""
    [alert] = by_name(all_alerts)["KvCacheL2MountDead"]
    assert alert.expr == 'kvcache_l2_mount_up{job="kvcache-l2-mount-watchdog"} == 0'
    w = obs_project.platform.curvine.mount_watchdog
    assert (w.period_seconds, w.eviction_interval_seconds, w.replace_hung_after_seconds) == (30, 60, 300)
    # a hung session replaced after 300 s, then 10 pods evicted, then 5 min to restart
    healing_s = w.period_seconds + w.replace_hung_after_seconds + 10 * w.eviction_interval_seconds + 300
    assert alert.for_ == "21m" and 21 * 60 >= healing_s > 20 * 60
    assert alert.severity == "warning" and "{{ $labels.pod }}" in alert.summary
    assert "kubectl -n curvine logs ds/l2-mount-watchdog" in alert.action


def test_watchdog_missing_alert_joins_l2_vllm_nodes_with_the_watchdogs_last_pass(obs_project, all_alerts) -> None:
    """Per node (the vLLM job's ``node`` target label against the watchdog's ``node`` metric label):
    nodes with an answering vLLM pod of an L2 line and no watchdog pass in 5 periods (150 s)."""
    [alert] = by_name(all_alerts)["KvCacheL2MountWatchdogMissing"]
    assert obs_project.platform.curvine.mount_watchdog.period_seconds == 30
    assert alert.expr == (
        'count by (node) (up{job="kvcache-vllm",business_line=~"rag-assistant|research-reasoning|ticket-triage"} '
        '== 1) unless on (node) (time() - max by (node) (kvcache_l2_mount_watchdog_last_pass_timestamp_seconds'
        '{job="kvcache-l2-mount-watchdog"}) < 150)')
    assert alert.for_ == "10m" and alert.severity == "warning" and not alert.labels
    # The join's two sides: the vLLM job sets ``node`` from the pod's node; the watchdog's gauge has it.
    [vllm] = [j for j in targets.jobs(obs_project.platform, obs_project.business_lines)
              if j["job_name"] == targets.JOB_VLLM]
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in vllm["relabel_configs"]


def test_hot_prefix_alerts_only_for_lines_that_declare_them(obs_project, all_alerts) -> None:
    """Warm-ups failing (error, too_long; none else) over two periods and slack (2 x 60 + 5 min), held
    one period and slack (65 min); a failed self-check of the chunk names, held 5 min."""
    [failing] = by_name(all_alerts)["KvCacheHotPrefixWarmupFailing"]
    [names_wrong] = by_name(all_alerts)["KvCacheHotPrefixNamesMismatch"]
    line = obs_project.business_line("rag-assistant")
    assert line.hot_prefixes.warm_period_minutes == 60 and failing.for_ == "65m" and names_wrong.for_ == "5m"
    assert failing.labels == names_wrong.labels == {"business_line": "rag-assistant"}
    sel = 'kvcache_hot_prefix_warmups_total{job="kvcache-l2-janitor",line="rag-assistant",result=~"%s"}[125m]'
    assert failing.expr == (
        f'sum by (prefix) (increase({sel % "error|too_long"})) > 0 unless on (prefix) '
        f'sum by (prefix) (increase({sel % "in_l2|stored|partial|not_stored|names_mismatch|short"})) > 0')
    assert names_wrong.expr == 'min(kvcache_hot_prefix_names_ok{job="kvcache-l2-janitor",line="rag-assistant"}) == 0'
    assert [l.name for l in obs_project.business_lines if l.hot_prefixes.active] == ["rag-assistant"]


def test_no_mount_dead_alert_without_the_watchdog(obs_project) -> None:
    platform = obs_project.platform
    off = platform.model_copy(update={"curvine": platform.curvine.model_copy(update={
        "mount_watchdog": platform.curvine.mount_watchdog.model_copy(update={"enabled": False})})})
    names_off = {a.name for a in alerts.all_alerts(off, obs_project.business_lines)}
    assert not names_off & {"KvCacheL2MountDead", "KvCacheL2MountWatchdogMissing"}
    assert targets.JOB_L2_MOUNT_WATCHDOG not in {j["job_name"] for j in targets.jobs(off, obs_project.business_lines)}
