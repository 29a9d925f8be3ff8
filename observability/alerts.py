"""Alerts as code: Prometheus rule groups for the AMP workspace and its alert manager (SNS).

Each :class:`Alert` carries its PromQL (from :mod:`observability.queries`), how long it must hold
(``for``), a severity, what it means and what to do (annotations ``description`` and
``runbook``; docs/observability.md's alert table says the same, and a test checks it names every alert). :func:`rule_groups` renders them as the YAML
an ``AWS::APS::RuleGroupsNamespace`` takes; :func:`alert_manager_definition` routes every alert
to the SNS topic.

Severity ``critical``: users are hurt now or will be within minutes (TTFT over SLO, no
admission webhook, Primary down, pool nearly full). ``warning``: the cache works worse than it
should (hit rate collapsed, a line over its watermark, a pod without L2, a line's L2 janitor stale
or failing, L2 stores or retrieves failing, the cross-pod hit canary failing, a dead L2 mount or a
node without its mount watchdog, a hot prefix's warm-ups failing or its chunks not pinnable).

Every alert is evaluated by a real rule engine in the tests: ``promtool test rules`` with input
series that fire it, the nearest healthy series that must not, and the labels a receiver gets
(``tests/observability/test_promtool.py``, which fails naming any alert without a test), and a
live Prometheus against the real-LMCache tier's pods (``tests_lmcache/test_live_alerts.py``).
What each alert means and what to do: docs/observability.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from k8s import names
from cluster_agents import l2_janitor, l2_mount_watchdog
from observability import queries, targets
from platform_config import BusinessLineConfig, PlatformConfig
from platform_config.fields import GATEWAY_ROUTING

#: Namespace name of the rule groups in the workspace.
RULES_NAMESPACE: Final = "kvcache-tiers"
#: A line's janitor is stale when its last finished pass is older than this many periods
#: (:data:`cluster_agents.l2_janitor.PERIOD_S`): three passes missed, not one late pass.
JANITOR_STALE_PERIODS: Final = 3
#: How far back the stale alert still sees a janitor that stopped being scraped.
JANITOR_STALE_LOOKBACK: Final = "1d"
#: Failing passes in a row before the janitor's failure alert fires.
JANITOR_FAILED_PASSES: Final = 3
#: Window over which an L2 store or retrieve shortfall is counted, and how long it must last: a
#: pod wrote to L2 less than half of the chunks it certainly stored, in every 10-minute window for
#: 10 minutes (store), or missed a chunk's worth of requested tokens so (retrieve).
L2_FAILURE_WINDOW: Final = "10m"
L2_FAILURE_FOR: Final = "10m"
#: Share of the chunks a pod certainly had to write that must be missing from L2 for the store
#: alert: more than half. A duplicate write LMCache skips while the same chunk is in flight, or a
#: store cut short by a full CPU buffer, lose a few; half of everything over 20 minutes is a fault.
L2_STORE_MISSING_SHARE: Final = 0.5
#: Most L2 pods one node can hold whose mounts die together when its FUSE pod restarts: one vLLM
#: pod per GPU of the largest instance types (8) and the janitors that land there; healing evicts
#: them one per ``curvine.mount_watchdog.eviction_interval_seconds``.
MOUNT_HEAL_PODS_PER_NODE: Final = 10
#: A node's L2 mount watchdog is missing when it has not finished a pass for this many of its
#: periods (``curvine.mount_watchdog.period_seconds``; a pass is bounded by the probe timeout,
#: below one period, and a stalled one is restarted by its liveness probe), for
#: :data:`WATCHDOG_MISSING_FOR`: long enough for a DaemonSet pod to be pulled and started on a new
#: node, which vLLM pods (minutes of model loading before their first scrape) never beat.
WATCHDOG_STALE_PERIODS: Final = 5
WATCHDOG_MISSING_FOR: Final = "10m"
#: Warm-up results that need the operator: the replicas refuse the requests or tokenizing fails
#: (``error``), or the prefix does not fit the model's context (``too_long``). Not ``partial`` or
#: ``not_stored``: a replica that holds the prefix in its CPU buffer (L1) answers from it and stores
#: nothing, which is no loss to its users, and the next new replica restores L2; failing L2 writes
#: have their own alert (``KvCacheL2StoreFailing``); ``names_mismatch`` too.
HOT_PREFIX_FAILED_RESULTS: Final = ("error", "too_long")
#: Slack beyond one warm-up period for a round to finish (its requests, up to 60 s of settling).
HOT_PREFIX_ROUND_SLACK_MIN: Final = 5
#: Window in which the API server's counts of the FUSE pod guard are looked at: an admitted delete
#: (a FUSE pod replaced) or a failing check keeps its alert firing this long after the event, so a
#: single event reaches the receiver through AMP's 1-minute evaluation and the alert manager's
#: 30 s group wait (alert_manager_definition).
FUSE_POD_EVENT_WINDOW: Final = "15m"
#: ... and held this long first: the shortest hold of every alert here (two evaluations of AMP's
#: 1-minute groups), which a single event outlasts by the window above.
FUSE_POD_EVENT_FOR: Final = "2m"
#: A replica takes more than this many times its fair share (1 / replicas) of its line's prompt tokens:
#: 75% of a two-replica line, 37.5% of a four-replica one. Round robin keeps every replica near 1x, the
#: load-dominant blend of scripts/bench_routing.py within 1.3x; prefixaware on a prefix every request
#: shares puts one replica at n x (docs/routing.md).
HOT_SPOT_FACTOR: Final = 1.5
#: ... over :data:`observability.queries.SHARE_WINDOW`, for this long: routing is a fixed setting, so a
#: hot spot lasts; a pod that left keeps its series (and the replica count) up to one window, shorter.
HOT_SPOT_FOR: Final = "30m"
#: The API server's metrics are not collected: no answering target of the apiserver job for this
#: long (the FUSE pod guard's refusals and admissions are then unseen).
APISERVER_UNSCRAPED_FOR: Final = "15m"
#: Time a replacement pod takes to be scheduled and to mount L2 afresh after its eviction (the old
#: vLLM pod's graceful termination included): the alert waits this much beyond the evictions.
MOUNT_HEAL_RESTART_S: Final = 300


def mount_dead_hold_minutes(platform: PlatformConfig) -> int:
    """``for`` of ``KvCacheL2MountDead``: longer than healing normally takes, in whole minutes.

    One pass to see the mount (``period_seconds``), then, for a hung session, the wait before the
    watchdog replaces it (``replace_hung_after_seconds``, when it heals; its binds are dead then),
    then up to :data:`MOUNT_HEAL_PODS_PER_NODE` evictions one ``eviction_interval_seconds`` apart,
    then :data:`MOUNT_HEAL_RESTART_S` for the last replacement: 30 + 300 + 10 x 60 + 300 s = 20.5 min
    -> 21 min with the defaults (16 min without replacing hung sessions).
    """
    w = platform.curvine.mount_watchdog
    replace_s = w.replace_hung_after_seconds if w.heal else 0
    seconds = (w.period_seconds + replace_s + MOUNT_HEAL_PODS_PER_NODE * w.eviction_interval_seconds
               + MOUNT_HEAL_RESTART_S)
    return -(-seconds // 60)


@dataclass(frozen=True)
class Alert:
    """One alerting rule.

    Attributes:
        name: alert name (``alertname`` label); one name may have one rule per business line.
        expr: PromQL; the alert fires for every series it returns.
        for_: how long ``expr`` must hold, a Prometheus duration.
        severity: ``critical`` or ``warning``.
        summary: one line, templated with the series' labels.
        meaning: what firing means (docs/observability.md).
        action: what to do when it fires (docs/observability.md).
        labels: extra labels (``business_line`` for per-line rules).
    """

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    meaning: str
    action: str
    labels: dict[str, str] = field(default_factory=dict)

    def rule(self) -> dict[str, Any]:
        """The Prometheus alerting-rule mapping."""
        return {"alert": self.name, "expr": self.expr, "for": self.for_,
                "labels": {"severity": self.severity, **self.labels},
                "annotations": {"summary": self.summary, "description": self.meaning, "runbook": self.action}}


def _per_line(lines: list[BusinessLineConfig], make) -> list[Alert]:
    return [make(line) for line in lines]


def line_alerts(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> list[Alert]:
    """The per-line alerts: TTFT over SLO (every line); L2 watermark and hit-rate collapse (L2 lines)."""
    cfg = platform.observability.alerts
    eviction = platform.curvine.eviction
    l2_lines = queries.l2_lines(platform, lines)
    out = _per_line(list(lines), lambda line: Alert(
        name="KvCacheTtftP90OverSlo",
        expr=f"{queries.ttft_quantile(line, 0.9)} > {line.slo.ttft_p90_ms / 1000:g}",
        for_="10m", severity="critical", labels={"business_line": line.name},
        summary=f"{line.name}: TTFT p90 {{{{ $value | humanizeDuration }}}} over its SLO of {line.slo.ttft_p90_ms} ms",
        meaning="The line's 90th-percentile time to first token (5-minute window) has stayed above "
                "slo.ttft_p90_ms for 10 minutes.",
        action="On the line's dashboard row, look at the tier shares first: if L0/L1/L2 hits fell, the cache "
               "stopped helping (see KvCacheL2HitRateCollapsed); if 'waiting' requests grow, the line needs "
               "more replicas; if GPU utilisation is low with high TTFT, check L2 read throughput and Curvine."))
    multi = [line for line in lines if (line.autoscaling.max_replicas if line.autoscaling else line.replicas) > 1]
    out += _per_line(multi, lambda line: Alert(
        name="KvCacheReplicaHotSpot",
        expr=queries.replica_hot_spot(line, HOT_SPOT_FACTOR),
        for_=HOT_SPOT_FOR, severity="warning", labels={"business_line": line.name},
        summary=f"{line.name}: {{{{ $labels.pod }}}} takes {{{{ $value | humanizePercentage }}}} of the line's "
                "prompt tokens",
        meaning=f"One replica received more than {HOT_SPOT_FACTOR:g}x its fair share (1 / the line's replicas) of "
                f"the line's prompt tokens over {queries.SHARE_WINDOW}, for {HOT_SPOT_FOR}: the router sends it "
                + ("most of the traffic (the HyperPod Inference Gateway's prefix weight outweighing its queue and "
                   "KV-cache weights on this line's scheduler)" if line.routing_strategy == GATEWAY_ROUTING else
                   "most of the traffic (prefixaware with a prefix every request shares, kvaware or session with one "
                   "heavy user)")
                + " while the others idle. Its queue, hence TTFT, grows; adding replicas does not help.",
        action="On the line's dashboard row, 'Share of prompt tokens per replica' shows which; "
               + (f"raise weights.queue (or lower weights.prefix) on the line's scheduler entry in the "
                  f"InferenceGatewayConfig {names.gateway_name(line)} of namespace {line.namespace}: set gateway.weights "
                  "in the line's file and deploy, then remove the entry's weights so the line's gateway policy writes "
                  "the new ones (the operator keeps weights set there; docs/routing.md)."
                  if line.routing_strategy == GATEWAY_ROUTING else
                  "scripts/overlap.py on a request log says which routing_strategy the traffic calls for "
                  "(docs/routing.md). routing_strategy is fixed after creation: change it in the line's file and "
                  "re-create the endpoint; meanwhile deleting the hot pod only moves the hot spot.")))
    out += _per_line(l2_lines, lambda line: Alert(
        name="KvCacheLineL2AboveHighWatermark",
        expr=(f"{queries.l2_used_bytes(line)} > "
              f"{eviction.high_watermark:g} * {queries.l2_size_bytes(line):.0f}"),
        for_="30m", severity="warning", labels={"business_line": line.name},
        summary=f"{line.name}: L2 directory above {eviction.high_watermark:.0%} of its l2_size {line.cache.l2_size}",
        meaning="After the janitor's runs of the last 30 minutes the line's L2 directory is still above "
                "curvine.eviction.high_watermark x cache.l2_size: the janitor could not prune enough (all "
                "chunks younger than its minimum age) or is failing.",
        action=f"Read the janitor's last passes (kubectl -n <namespace> logs deploy/{names.L2_JANITOR}); "
               "if chunks are all young, the line writes faster than l2_size allows: raise cache.l2_size "
               "(and the pool) or lower the L2 share of this line."))
    stale_after_s = JANITOR_STALE_PERIODS * l2_janitor.PERIOD_S
    out += _per_line(l2_lines, lambda line: Alert(
        name="KvCacheL2JanitorStale",
        expr=f"{queries.janitor_seconds_since_last_pass(line, JANITOR_STALE_LOOKBACK)} > {stale_after_s}",
        for_="5m", severity="warning", labels={"business_line": line.name},
        summary=f"{line.name}: the L2 janitor's last pass finished {{{{ $value | humanizeDuration }}}} ago",
        meaning=f"The line's L2 janitor has not finished a pass for more than {JANITOR_STALE_PERIODS} periods "
                f"({stale_after_s // 60} minutes), or stopped being scraped (seen up to "
                f"{JANITOR_STALE_LOOKBACK} later): nothing bounds the line's L2 directory, which grows until "
                "the pool is full.",
        action=f"kubectl -n <namespace> get pods -l app.kubernetes.io/name={names.L2_JANITOR} -o wide (Pending: "
               "no HyperPod node can mount the PVC; restarts: a pass stuck past its deadline, often the "
               f"Curvine FUSE mount); kubectl -n <namespace> logs deploy/{names.L2_JANITOR} --previous; check "
               "KvCacheCurvinePrimaryDown and the CSI node plugin on the janitor's node."))
    out += _per_line(l2_lines, lambda line: Alert(
        name="KvCacheL2JanitorFailing",
        expr=f"{queries.janitor_errors(line)} > 0",
        for_=f"{(JANITOR_FAILED_PASSES - 1) * l2_janitor.PERIOD_S // 60}m", severity="warning",
        labels={"business_line": line.name},
        summary=f"{line.name}: the L2 janitor's passes fail ({{{{ $value }}}} error(s) in the last one)",
        meaning=f"{JANITOR_FAILED_PASSES} passes in a row of the line's L2 janitor ended with errors (its Pod "
                "is also not ready): deletions fail, or it cannot list the line's Pods, in which case it "
                "still expires and evicts chunks but leaves temp and old-model directories.",
        action=f"kubectl -n <namespace> logs deploy/{names.L2_JANITOR} | tail -1 (the 'errors' field); "
               f"'listing Pods' errors: check the Role and RoleBinding {names.L2_JANITOR}; 'not a directory': "
               "the PVC is not mounted; unlink/rmtree errors: Curvine's health."))
    def store_failing(line: BusinessLineConfig) -> Alert:
        due, written = queries.l2_store_chunks(line, L2_FAILURE_WINDOW)
        return Alert(
            name="KvCacheL2StoreFailing",
            expr=f"({due} >= 1) and ({due} - ({written} or {due} * 0) > {L2_STORE_MISSING_SHARE:g} * {due})",
            for_=L2_FAILURE_FOR, severity="warning", labels={"business_line": line.name},
            summary=f"{line.name}: {{{{ $labels.pod }}}} stores KV chunks that do not reach L2",
            meaning=f"Over {L2_FAILURE_WINDOW}, LMCache in this vLLM pod wrote to L2 (the Curvine directory) less "
                    f"than {1 - L2_STORE_MISSING_SHARE:.0%} of the full chunks it certainly stored, for "
                    f"{L2_FAILURE_FOR}: L2 writes fail (mount dead or read-only, ENOSPC, I/O errors), or the "
                    "pod's CPU buffer is so full it stores little. Other pods miss what this one computes.",
            action="kubectl -n <namespace> logs <pod> | grep -E 'Put task failed|remote'; kubectl -n <namespace> "
                   "exec <pod> -- df -h /mnt/curvine/l2cache (a FUSE mount, not overlay; 'Transport endpoint is "
                   "not connected' = the mount is dead: delete the pod); check KvCacheCurvinePoolAlmostFull and "
                   "Curvine's health.")

    out += _per_line(l2_lines, store_failing)
    out += _per_line(l2_lines, lambda line: Alert(
        name="KvCacheL2RetrieveFailing",
        expr=f"{queries.l2_retrieve_shortfall(line, L2_FAILURE_WINDOW)} >= {line.cache.chunk_size_tokens}",
        for_=L2_FAILURE_FOR, severity="warning", labels={"business_line": line.name},
        summary=f"{line.name}: {{{{ $labels.pod }}}} fails to load {{{{ $value | humanize }}}} KV tokens it found",
        meaning=f"In every {L2_FAILURE_WINDOW} window for {L2_FAILURE_FOR}, LMCache in this vLLM pod failed to "
                "retrieve at least a chunk's worth of the tokens its lookup had found (requested minus "
                "retrieved): chunks unreadable (I/O errors, a hung mount past LMCache's blocking timeout), "
                "truncated or deleted between lookup and retrieve. vLLM recomputes them, so TTFT suffers. "
                "After about 10 failed reads in 30 s LMCache 0.5.5 marks itself unhealthy and skips the cache "
                "for 5 minutes, which this alert then no longer sees (docs/observability.md).",
        action="kubectl -n <namespace> logs <pod> | grep -E 'get_blocking|retrieved tokens is less'; check the mount "
               "(df -h /mnt/curvine/l2cache in the pod), Curvine Workers (KvCacheCurvineWorkersLost) and the "
               "janitor's minimum age (docs/l2-cache.md)."))
    canary_lines = [l for l in l2_lines if l.runs_canary]
    low_runs = cfg.canary_low_runs
    out += _per_line(canary_lines, lambda line: Alert(
        name="KvCacheCrossPodCanaryFailing",
        expr=f"{queries.canary_hit_ratio(line)} < {cfg.canary_min_hit_ratio:g}",
        for_=f"{(low_runs - 1) * line.canary.period_minutes}m", severity="warning",
        labels={"business_line": line.name},
        summary=f"{line.name}: cross-pod L2 hits of the canary at {{{{ $value | humanizePercentage }}}} for "
                f"{low_runs} runs",
        meaning=f"{low_runs} measured runs in a row of the line's canary found less than "
                f"{cfg.canary_min_hit_ratio:.0%} of a fresh prompt that one replica computed served from L2 on "
                "another replica: cross-pod sharing is broken (chunk keys differ between pods, pods write to "
                "different directories, stores or reads fail), whatever the traffic does. One replica, replicas "
                "of two models, or a reader too busy to measure export no ratio and never fire it.",
        action=f"kubectl -n <namespace> logs deploy/{names.KV_CANARY} --tail=3 (writer, reader, "
               "writer_chunks_written, reader_l2_tokens); writer_chunks_written 0: see KvCacheL2StoreFailing; "
               "written but not read: compare the two pods' LMCACHE_REMOTE_URL, L2KEYS key fingerprint and their "
               "mounts (scripts/verify.py, docs/l2-cache.md 'Checking after deploy that two pods share the cache')."))
    hot_lines = [l for l in l2_lines if l.hot_prefixes.active]

    def warmups_failing(line: BusinessLineConfig) -> Alert:
        period = line.hot_prefixes.warm_period_minutes
        return Alert(
            name="KvCacheHotPrefixWarmupFailing",
            expr=queries.hot_prefix_warmups_failing(line, HOT_PREFIX_FAILED_RESULTS,
                                                    f"{2 * period + HOT_PREFIX_ROUND_SLACK_MIN}m"),
            for_=f"{period + HOT_PREFIX_ROUND_SLACK_MIN}m", severity="warning", labels={"business_line": line.name},
            summary=f"{line.name}: the warm-ups of hot prefix {{{{ $labels.prefix }}}} keep failing",
            meaning=f"Warm-ups of a declared prefix ended in {' or '.join(HOT_PREFIX_FAILED_RESULTS)} and none "
                    f"in anything else for a warm-up period and {HOT_PREFIX_ROUND_SLACK_MIN} minutes (so at "
                    "least two rounds in a row): the prefix is not kept in L2, and every replica that does not "
                    "hold it in its CPU buffer (every new one) prefills it cold.",
            action=f"kubectl -n <namespace> logs deploy/{names.L2_JANITOR} | grep kvcache_hot_prefixes (each "
                   "round's result per prefix): too_long: the prefix is longer than the model's context, shorten "
                   "it; error: the replicas refuse /tokenize or the one-token request (their logs), or the "
                   "janitor cannot reach them (docs/l2-cache.md, 'Hot prefixes').")

    out += _per_line(hot_lines, warmups_failing)
    out += _per_line(hot_lines, lambda line: Alert(
        name="KvCacheHotPrefixNamesMismatch",
        expr=f"{queries.hot_prefix_names_ok(line)} == 0",
        for_="5m", severity="warning", labels={"business_line": line.name},
        summary=f"{line.name}: the janitor cannot pin the hot prefixes (their chunk names are not LMCache's)",
        meaning="The warmer's self-check found that a warm-up made replicas write chunk files, none of them "
                "under the names it computed for the prefix: the janitor pins names that do not exist, so it "
                "evicts the prefixes' real chunks by age and size like any other.",
        action="Compare the key fingerprint the vLLM pods log (kubectl -n <namespace> logs <pod> | grep L2KEYS: "
               "'keyed' and the same fingerprint in every pod) and their LMCACHE_PRE_CACHING_HASH_ALGORITHM "
               "(sha256_cbor) with the janitor's chunk-key Secret (kvcache-l2-key-<generation>; a Secret deleted "
               "and recreated while pods ran leaves them on the old key: restart them); kubectl -n <namespace> logs "
               "deploy/" + names.L2_JANITOR + " | grep -e names_mismatch -e kvcache_l2_chunk_key "
               "(docs/l2-cache.md, 'The chunk key' and 'Hot prefixes')."))
    for line in l2_lines:
        current = queries.l2_hit_share(line, "15m")
        baseline = queries.l2_hit_share(line, "6h", offset="15m")
        out.append(Alert(
            name="KvCacheL2HitRateCollapsed",
            expr=(f"({current}) < {cfg.l2_hit_rate_collapse_ratio:g} * ({baseline}) "
                  f"and ({baseline}) > {cfg.l2_hit_rate_baseline_min:g} "
                  f"and {queries.prompt_tokens_rate(line)} > 0"),
            for_="30m", severity="warning", labels={"business_line": line.name},
            summary=f"{line.name}: L2 hit rate fell below {cfg.l2_hit_rate_collapse_ratio:.0%} of its 6-hour level",
            meaning="Tokens served from L2 per prompt token over the last 15 minutes are below "
                    "alerts.l2_hit_rate_collapse_ratio of the 6 hours before, while the line has traffic. "
                    "Typical causes: a model change (new chunk keys, the old directory no longer matches), "
                    "a wiped or remounted L2 directory, pods without the L2 patch, or a PYTHONHASHSEED "
                    "mismatch between pods.",
            action="Check KvCachePodWithoutL2 and the pods' LMCACHE_REMOTE_URL (scripts/verify.py); if the model "
                   "changed, the collapse is expected and the rate recovers as the new model's chunks are "
                   "written; if the directory was wiped, check the janitor's log and Curvine's health."))
    return out


def platform_alerts(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> list[Alert]:
    """Curvine pool and Primary, the admission webhook and unmutated pods (when Curvine is on)."""
    if not platform.curvine.enabled:
        return []
    cfg = platform.observability.alerts
    l2_lines = queries.l2_lines(platform, lines)
    out = [
        Alert(
            name="KvCacheCurvinePoolAlmostFull",
            expr=f"{queries.pool_used_ratio()} > {cfg.pool_usage_threshold:g}",
            for_="15m", severity="critical",
            summary=f"Curvine L2 pool above {cfg.pool_usage_threshold:.0%}: {{{{ $value | humanizePercentage }}}}",
            meaning="The Curvine pool (all Workers' NVMe) is fuller than alerts.pool_usage_threshold. LMCache "
                    "never deletes, so when the pool is full new chunks fail to store and L2 stops growing.",
            action="Compare each line's L2 use on the dashboard with its l2_size; check the janitors run; add GPU "
                   "nodes (more Workers) or raise curvine.worker_capacity_gib if the NVMe has room."),
        Alert(
            name="KvCacheCurvinePrimaryDown",
            expr=queries.target_up_absent(targets.JOB_CURVINE_MASTER),
            for_="2m", severity="critical",
            summary="Curvine Primary is not answering its metrics endpoint",
            meaning="No Curvine Primary (master) pod answered a scrape for 2 minutes. Without the Primary "
                    "no client can open L2 files: every L2 lookup misses and FUSE mounts may hang.",
            action=f"kubectl -n {platform.curvine.namespace} get pods -l app.kubernetes.io/component=master; "
                   "read its logs; check the Primary's EBS volume is attached (docs/l2-cache.md)."),
        Alert(
            name="KvCacheCurvineWorkersLost",
            expr=f"{queries.curvine_workers('lost')} > 0",
            for_="5m", severity="warning",
            summary="Curvine reports {{ $value }} lost Worker(s)",
            meaning="The Primary lost contact with a Worker; its blocks (KV chunks) are gone until it returns "
                    "(replication is off, chunks are recomputable).",
            action=f"kubectl -n {platform.curvine.namespace} get pods -l app.kubernetes.io/component=worker -o wide; "
                   "check the node and its NVMe (failed_disks on the dashboard)."),
    ]
    if l2_lines and platform.curvine.mount_watchdog.enabled:
        hold = mount_dead_hold_minutes(platform)
        w = platform.curvine.mount_watchdog
        out.append(Alert(
            name="KvCacheL2MountDead",
            expr=f"{queries.l2_mounts_up()} == 0",
            for_=f"{hold}m", severity="warning",
            summary="{{ $labels.namespace }}/{{ $labels.pod }} on {{ $labels.node }}: its L2 mount has not answered "
                    f"for {hold} minutes",
            meaning=f"The L2 mount watchdog on the pod's node found its Curvine mount dead (its FUSE session "
                    f"was restarted under it: ENOTCONN, or a device other than the node's live session), hung "
                    f"(no answer within {w.probe_timeout_seconds} s) or failing (EIO: often the Primary) in every "
                    f"pass for {hold} minutes, longer than healing takes. LMCache's L2 lookups and stores fail "
                    "there: the pod serves with a full prefill, and a pod terminating with a dead mount keeps "
                    "its GPUs until the mount is gone.",
            action=f"kubectl -n {platform.curvine.namespace} logs ds/{names.L2_MOUNT_WATCHDOG} (the pod's node) "
                   f"shows the state and what healing did; {l2_mount_watchdog.STATE_METRIC} says which. dead: "
                   "healing off (curvine.mount_watchdog.heal), no controller (delete the pod), or evictions "
                   "refused by a PodDisruptionBudget; delete the pod. hung or error: check KvCacheCurvinePrimaryDown "
                   f"and the FUSE pod (kubectl -n {platform.curvine.namespace} get pods -l app=curvine-standalone "
                   "-o wide); restarting pods does not help. scripts/verify.py lists every pod's mount."))
        stale_s = WATCHDOG_STALE_PERIODS * w.period_seconds
        out.append(Alert(
            name="KvCacheL2MountWatchdogMissing",
            expr=queries.l2_nodes_without_watchdog(l2_lines, stale_s),
            for_=WATCHDOG_MISSING_FOR, severity="warning",
            summary="{{ $labels.node }} runs vLLM pods of L2 lines with no L2 mount watchdog passing",
            meaning=f"A node runs scraped vLLM pods of L2 lines, and no L2 mount watchdog there finished a pass "
                    f"in {stale_s} s ({WATCHDOG_STALE_PERIODS} periods) for {WATCHDOG_MISSING_FOR}: its pod is "
                    "not scheduled on the node (not a HyperPod node, no room), crashes, or is not scraped. "
                    "Nobody sees or heals a dead L2 mount there, and KvCacheL2MountDead cannot fire for its pods.",
            action=f"kubectl -n {platform.curvine.namespace} get pods -l app.kubernetes.io/name="
                   f"{names.L2_MOUNT_WATCHDOG} -o wide --field-selector spec.nodeName=<node>; none: the DaemonSet "
                   "runs on HyperPod nodes only (its node affinity), so a vLLM pod on another node is not "
                   "watched: check the line's instance group; Pending: the node's free CPU and memory; "
                   "crashing: its logs (--previous); until it runs, scripts/verify.py checks that node's mounts."))
        out += [
            Alert(
                name="KvCacheFusePodReplaced",
                expr=queries.events_in(queries.fuse_pod_deletes("admitted"), FUSE_POD_EVENT_WINDOW),
                for_=FUSE_POD_EVENT_FOR, severity="warning",
                summary="The Curvine CSI node plugin deleted {{ $value | printf \"%.0f\" }} FUSE pod(s) in the last "
                        f"{FUSE_POD_EVENT_WINDOW}",
                meaning="The FUSE pod guard admitted the node plugin's delete of a FUSE pod: its self-heal (the "
                        "pod crash-looped, was evicted, restarted more than 5 times, or stayed not Ready through "
                        "a 60 s wait at a new mount), or the garbage collector removing a pod whose session was "
                        "already gone. Every L2 mount still bound to that pod's session on its node is dead; "
                        "the L2 mount watchdog evicts their pods one a minute (KvCacheL2MountDead if it cannot).",
                action=f"kubectl -n {platform.curvine.namespace} logs ds/{names.CSI_NODE} -c csi-plugin | grep -E "
                       "'needs recreation|not ready after waiting|Deleting Standalone' (which node, why); "
                       f"kubectl -n {platform.curvine.namespace} get pods -l app=curvine-standalone -o wide "
                       "(restarts, OOMKilled: the FUSE pod's memory; not Ready for 60 s: a wedged curvine-fuse, "
                       "check KvCacheCurvinePrimaryDown); the watchdog's log on that node shows the evictions."),
            Alert(
                name="KvCacheFusePodGuardFailing",
                expr=queries.events_in(queries.fuse_pod_deletes("refused", errors=True), FUSE_POD_EVENT_WINDOW,
                                       by="policy, error_type"),
                for_=FUSE_POD_EVENT_FOR, severity="critical",
                summary="The FUSE pod guard's policy {{ $labels.policy }} fails to evaluate ({{ $labels.error_type }})",
                meaning="A check of the FUSE pod guard (or of the policy that counts its admissions) ended in an "
                        "evaluation error. The guard fails closed: every delete of a FUSE pod by the node plugin "
                        "is refused, its self-heal of a broken FUSE pod included, so a crashed FUSE pod is never "
                        "replaced and new L2 mounts on its node fail until someone deletes it by hand.",
                action="kubectl get validatingadmissionpolicy curvine-fuse-pod-guard -o yaml (status.typeChecking); "
                       f"kubectl -n {platform.curvine.namespace} logs ds/{names.CSI_NODE} -c csi-plugin | grep "
                       "curvine-fuse-pod-guard (the API server's message); compare the FUSE pods' status with the "
                       "fields the policy reads (docs/l2-cache.md, 'The guard'); delete a broken FUSE pod by hand "
                       "(docs/l2-cache.md, 'Removing a FUSE pod by hand')."),
            Alert(
                name="KvCacheFusePodGuardUnmeasured",
                expr=queries.target_up_absent(targets.JOB_APISERVER),
                for_=APISERVER_UNSCRAPED_FOR, severity="warning",
                summary="The API server's metrics are not collected: the FUSE pod guard's decisions are not counted",
                meaning=f"No API server target of job {targets.JOB_APISERVER} answered a scrape for "
                        f"{APISERVER_UNSCRAPED_FOR}: FUSE pods the node plugin deletes (KvCacheFusePodReplaced) and "
                        "guard errors (KvCacheFusePodGuardFailing) go unseen.",
                action="In the AMP console, the scraper's status and its error for the job; check the scraper's access "
                       "entry allows get on /metrics (docs/observability.md) and the cluster security group admits "
                       "the scraper on 443."),
            Alert(
                name="KvCacheAdmissionWebhookDown",
                expr=queries.target_up_absent(targets.JOB_KYVERNO),
                for_="5m", severity="critical",
                summary="No Kyverno admission controller answers",
                meaning="No Kyverno admission-controller pod answered a scrape for 5 minutes. The L2 policies "
                        "fail closed, so no new vLLM pod of an L2 line can be created (scale-up, rollout, "
                        "node replacement) until the webhook is back.",
                action="kubectl -n kyverno get pods -l app.kubernetes.io/component=admission-controller; read "
                       "their logs and events; the Kyverno release is in the L2-cache stack."),
            Alert(
                name="KvCacheAdmissionFailing",
                expr=(f"{queries.admission_denied_in(l2_lines)} > 0 "
                      f"or {queries.l2_policy_failures(l2_lines)} > 0"),
                for_="5m", severity="critical",
                summary="Kyverno refuses or fails pod admission in {{ $labels.resource_namespace }}",
                meaning="Kyverno denied Pod admissions in an L2 line's namespace, or an L2 policy rule failed "
                        "or errored. The policies only mutate, so a denial means the mutation failed: the "
                        "operator's pods are not being created.",
                action="kubectl -n <namespace> get events --field-selector reason=FailedCreate; "
                       "kubectl -n <namespace> describe policy <line>-l2-cache; compare the operator's pod "
                       "template with what the policy expects (docs/l2-cache.md)."),
            Alert(
                name="KvCachePodWithoutL2",
                expr=f"{queries.unmutated_vllm_pods(l2_lines)} > 0",
                for_="5m", severity="warning",
                summary="{{ $labels.pod }} ({{ $labels.business_line }}) runs without the L2 patch",
                meaning=f"A running vLLM pod of an L2 line lacks the pod label {names.L2_MUTATED_LABEL}="
                        f"{names.L2_MUTATED_VALUE} the Kyverno policy sets: it was created without the "
                        "mutation (policy missing or installed after the pod), so it writes KV to the "
                        "operator's node-local backend, not to the shared pool.",
                action="Check the line's Policy exists (kubectl -n <namespace> get policy), then delete the pod "
                       "so it is re-created through the webhook; scripts/verify.py checks the rest."),
        ]
    return out


def all_alerts(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> list[Alert]:
    """Every alert of the platform, platform alerts first."""
    return platform_alerts(platform, lines) + line_alerts(platform, lines)


def rule_groups(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> dict[str, Any]:
    """The Prometheus rule file: group ``kvcache-platform`` and ``kvcache-lines``."""
    groups = [
        {"name": "kvcache-platform", "interval": "1m", "rules": [a.rule() for a in platform_alerts(platform, lines)]},
        {"name": "kvcache-lines", "interval": "1m", "rules": [a.rule() for a in line_alerts(platform, lines)]},
    ]
    return {"groups": [g for g in groups if g["rules"]]}


def rule_groups_yaml(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> str:
    """:func:`rule_groups` as YAML (``AWS::APS::RuleGroupsNamespace`` ``Data``)."""
    return yaml.safe_dump(rule_groups(platform, lines), sort_keys=False, width=1000)


def alert_manager_definition(topic_arn: str, region: str) -> str:
    """The workspace's alert manager definition: every alert to the SNS topic ``topic_arn``.

    Amazon Managed Service for Prometheus accepts only SNS receivers, requires ``sigv4.region``
    and forbids ``api_url`` (AMP user guide, "Configure alert manager to send messages to your
    Amazon SNS topic"). ``topic_arn`` may be a CDK token; the YAML is built as text around it.
    """
    config = {
        "route": {"receiver": "sns", "group_by": ["alertname", "business_line"],
                  "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"},
        "receivers": [{"name": "sns", "sns_configs": [{
            "topic_arn": "TOPIC_ARN", "sigv4": {"region": region},
            "subject": "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}",
            "attributes": {"severity": "{{ .CommonLabels.severity }}"},
        }]}],
    }
    body = yaml.safe_dump(config, sort_keys=False, width=1000)
    indented = "".join(f"  {line}\n" for line in body.splitlines())
    return ("alertmanager_config: |\n" + indented).replace("TOPIC_ARN", topic_arn)
