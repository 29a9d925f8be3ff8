"""The PromQL of every dashboard panel and alert, built from the metric table and the scrape jobs.

Every selector goes through :func:`selector`, which takes a *registered* metric name from
:data:`observability.metrics.METRICS` and the suffix of the series wanted, so an expression can
only name a series the table sources (a test parses every expression and checks it again).

Tier accounting per business line (rates over :data:`RATE_WINDOW`, tokens/s):

* prompt tokens: ``vllm:prompt_tokens``;
* L0 hits: ``vllm:prefix_cache_hits`` (tokens found in vLLM's GPU prefix cache);
* L1+L2 hits: ``lmcache:num_hit_tokens`` of TP rank 0 (``worker_id="0"``): every rank of a
  tensor-parallel pod retrieves its own shard of the same tokens, so one rank counts tokens;
* L2 hits: chunks rank 0 read from the remote backend (the Curvine ``fs://`` directory)
  x the line's ``cache.chunk_size_tokens``: LMCache stores one object per full chunk and rank
  (``save_unfull_chunk`` off by default), so this is exact for full chunks;
* L1 hits: L1+L2 hits minus L2 hits (never below 0).
"""

from __future__ import annotations

from typing import Final

from k8s import names
from k8s.fuse_pod_guard import FUSE_POD_DELETES_ADMITTED, FUSE_POD_GUARD
from cluster_agents import hot_prefixes, kv_canary, l2_janitor, l2_mount_watchdog
from observability import targets
from observability.metrics import series
from platform_config import BusinessLineConfig, PlatformConfig
from platform_config.fields import quantity_bytes

#: Window of every rate in panels and alerts: 5 minutes holds 10 scrapes at the default 30 s.
RATE_WINDOW: Final = "5m"
#: LMCache's counters of one tensor-parallel rank (see the module docstring).
RANK0: Final = {"worker_id": "0"}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(name: str, suffix: str = "", **labels: str) -> str:
    """``series{label="value",...}`` for registered metric ``name``; values ending in ``~`` match as regex.

    ``selector("vllm:prompt_tokens", job="kvcache-vllm")`` ->
    ``vllm:prompt_tokens_total{job="kvcache-vllm"}``.

    Raises:
        KeyError: ``name`` is not in the metric table.
    """
    parts = []
    for key, value in labels.items():
        if value.endswith("~"):
            parts.append(f'{key}=~"{_escape(value[:-1])}"')
        elif value.startswith("!"):
            parts.append(f'{key}!="{_escape(value[1:])}"')
        else:
            parts.append(f'{key}="{_escape(value)}"')
    return f"{series(name, suffix)}{{{','.join(parts)}}}"


def line_labels(line: BusinessLineConfig) -> dict[str, str]:
    """Labels selecting a line's vLLM/LMCache series (job and ``business_line`` target label)."""
    return {"job": targets.JOB_VLLM, "business_line": line.name}


def rate_sum(name: str, labels: dict[str, str], by: str = "", *, window: str = RATE_WINDOW, offset: str = "") -> str:
    """``sum [by (..)] (rate(<series>[window] [offset ..]))`` of a counter."""
    grouping = f" by ({by})" if by else ""
    off = f" offset {offset}" if offset else ""
    return f"sum{grouping}(rate({selector(name, **labels)}[{window}]{off}))"


def quantile(q: float, name: str, labels: dict[str, str], by: str = "") -> str:
    """``histogram_quantile(q, sum by (le[, by]) (rate(<name>_bucket[RATE_WINDOW])))``."""
    grouping = f"le, {by}" if by else "le"
    return (f"histogram_quantile({q:g}, sum by ({grouping})"
            f"(rate({selector(name, '_bucket', **labels)}[{RATE_WINDOW}])))")


# --- per business line ---------------------------------------------------------------------------


def prompt_tokens_rate(line: BusinessLineConfig) -> str:
    """Prompt tokens per second of the line."""
    return rate_sum("vllm:prompt_tokens", line_labels(line))


def generation_tokens_rate(line: BusinessLineConfig) -> str:
    """Generated tokens per second of the line."""
    return rate_sum("vllm:generation_tokens", line_labels(line))


def l0_hit_tokens_rate(line: BusinessLineConfig) -> str:
    """Prompt tokens per second found in vLLM's GPU prefix cache (L0)."""
    return rate_sum("vllm:prefix_cache_hits", line_labels(line))


def l0_hit_rate(line: BusinessLineConfig) -> str:
    """L0 hit rate: prefix-cache hit tokens / queried tokens (0-1)."""
    labels = line_labels(line)
    return f"{rate_sum('vllm:prefix_cache_hits', labels)} / {rate_sum('vllm:prefix_cache_queries', labels)}"


def lmcache_hit_tokens_rate(line: BusinessLineConfig) -> str:
    """Tokens per second LMCache retrieved for the line (L1 and L2 together, one TP rank)."""
    return rate_sum("lmcache:num_hit_tokens", {**line_labels(line), **RANK0})


def lmcache_hit_rate(line: BusinessLineConfig) -> str:
    """LMCache hit rate: retrieved tokens / tokens asked of LMCache (0-1)."""
    labels = {**line_labels(line), **RANK0}
    return f"{rate_sum('lmcache:num_hit_tokens', labels)} / {rate_sum('lmcache:num_requested_tokens', labels)}"


def l2_hit_tokens_rate(line: BusinessLineConfig, window: str = RATE_WINDOW, offset: str = "") -> str:
    """Tokens per second read from L2: rank-0 chunk reads x ``chunk_size_tokens``."""
    reads = rate_sum("lmcache:num_remote_read_requests", {**line_labels(line), **RANK0}, window=window, offset=offset)
    return f"({reads} * {line.cache.chunk_size_tokens})"


def l1_hit_tokens_rate(line: BusinessLineConfig) -> str:
    """Tokens per second served from L1 (LMCache hits minus L2 hits, at least 0)."""
    return f"clamp_min({lmcache_hit_tokens_rate(line)} - {l2_hit_tokens_rate(line)}, 0)"


def l2_hit_share(line: BusinessLineConfig, window: str = RATE_WINDOW, offset: str = "") -> str:
    """L2 hit rate of a line: L2-served tokens / prompt tokens over ``window`` (0-1)."""
    prompts = rate_sum("vllm:prompt_tokens", line_labels(line), window=window, offset=offset)
    return f"{l2_hit_tokens_rate(line, window, offset)} / {prompts}"


def canary_labels(line: BusinessLineConfig) -> dict[str, str]:
    """Labels selecting a line's canary series (job and the canary's own ``line`` label)."""
    return {"job": targets.JOB_KV_CANARY, "line": line.name}


def ttft_quantile(line: BusinessLineConfig, q: float) -> str:
    """TTFT quantile ``q`` (0-1) of the line's user requests, seconds.

    vLLM's TTFT histogram has no per-request label (``model_name`` is the server's first served
    name for every request, ``engine`` its engine index; vLLM 0.29.0 ``vllm/v1/metrics/loggers.py``),
    so on a line that runs the cross-pod hit canary its requests are taken out bucket by bucket:
    the canary exports its own requests in vLLM's buckets (``kvcache_canary_request_ttft_seconds``,
    :mod:`cluster_agents.kv_canary`), and ``vLLM - canary`` (clamped at 0; the canary's buckets count as
    0 while it has no series) is what the quantile is computed from.
    """
    vllm = (f"sum by (le)(rate({selector('vllm:time_to_first_token_seconds', '_bucket', **line_labels(line))}"
            f"[{RATE_WINDOW}]))")
    if not line.runs_canary:
        return f"histogram_quantile({q:g}, {vllm})"
    canary = (f"sum by (le)(rate({selector(kv_canary.REQUEST_TTFT_METRIC, '_bucket', **canary_labels(line))}"
              f"[{RATE_WINDOW}]))")
    return f"histogram_quantile({q:g}, clamp_min({vllm} - ({canary} or {vllm} * 0), 0))"


def canary_hit_ratio(line: BusinessLineConfig) -> str:
    """The line's cross-pod hit ratio of the last measured canary run (0-1; absent otherwise)."""
    return f"max({selector(kv_canary.RATIO_METRIC, **canary_labels(line))})"


def canary_by_line(name: str, by: str = "line") -> str:
    """``max by (<by>)`` of canary gauge ``name`` over every line (one dashboard query for all lines)."""
    return f"max by ({by})({selector(name, job=targets.JOB_KV_CANARY)})"


def canary_runs_by_line_and_result() -> str:
    """Canary runs per hour, by line and result, over every line."""
    return (f"sum by (line, result)(increase({selector(kv_canary.RUNS_METRIC + '_total', job=targets.JOB_KV_CANARY)}"
            f"[1h]))")


def l2_store_chunks(line: BusinessLineConfig, window: str) -> tuple[str, str]:
    """Per pod of the line, over ``window``: (full chunks LMCache certainly had to write to L2,
    chunks it wrote).

    LMCache counts every store request's tokens (``num_stored_tokens``) and writes every full
    chunk of them to L2 (``num_remote_write_requests``, counted only after a write succeeded;
    lmcache 0.5.5). A request leaves at most ``chunk_size - 1`` tokens of a tail unstored, so
    ``(stored tokens - (chunk_size - 1) x store requests) / chunk_size`` chunks were certainly due
    (a lower bound: requests of a tail only count negative). Rank 0 only (every TP rank writes its
    own shard of each chunk).
    """
    labels = {**line_labels(line), **RANK0}
    chunk = line.cache.chunk_size_tokens
    by = "sum by (namespace, pod)"
    due = (f"(({by}(increase({selector('lmcache:num_stored_tokens', **labels)}[{window}])) - {chunk - 1} * "
           f"{by}(increase({selector('lmcache:num_store_requests', **labels)}[{window}]))) / {chunk})")
    written = f"{by}(increase({selector('lmcache:num_remote_write_requests', **labels)}[{window}]))"
    return due, written


def l2_retrieve_shortfall(line: BusinessLineConfig, window: str) -> str:
    """Per pod of the line: tokens LMCache was asked to retrieve over ``window`` and did not.

    vLLM asks LMCache to retrieve exactly the chunks its lookup found (``num_requested_tokens``;
    the LMCache vLLM adapter of lmcache 0.5.5 logs "The number of retrieved tokens is less than
    the expected number of tokens! This should not happen!" otherwise), so requested minus
    retrieved (``num_hit_tokens``) is what failed to load: unreadable, truncated or vanished
    chunks, or reads past LMCache's blocking timeout. Rank 0 only.
    """
    labels = {**line_labels(line), **RANK0}
    by = "sum by (namespace, pod)"
    return (f"{by}(increase({selector('lmcache:num_requested_tokens', **labels)}[{window}])) - "
            f"{by}(increase({selector('lmcache:num_hit_tokens', **labels)}[{window}]))")


def requests(line: BusinessLineConfig, state: str) -> str:
    """Running or waiting requests of the line (``state``: ``running`` | ``waiting``)."""
    return f"sum({selector(f'vllm:num_requests_{state}', **line_labels(line))})"


#: Window of each replica's share of a line's traffic: a quarter of an hour, so a burst of long prompts on
#: one replica is not a hot spot, while a router that sends one replica most of the traffic is.
SHARE_WINDOW: Final = "15m"


def _per_replica(line: BusinessLineConfig, what: str, window: str) -> str:
    name, suffix = {"prompt_tokens": ("vllm:prompt_tokens", ""),
                    "requests": ("vllm:time_to_first_token_seconds", "_count")}[what]
    return f"sum by (pod)(rate({selector(name, suffix, **line_labels(line))}[{window}]))"


def replica_share(line: BusinessLineConfig, what: str = "prompt_tokens", window: str = SHARE_WINDOW) -> str:
    """Each replica's (pod's) share of the line's ``prompt_tokens`` (``vllm:prompt_tokens``: the prefill
    work routing hands it, cached or not) or ``requests`` (requests that got a first token, the count of
    ``vllm:time_to_first_token_seconds``) over ``window``, 0-1, by ``pod``. Routing decides it: round
    robin gives each of n replicas 1/n; production-stack's prefixaware gives one replica all the requests
    that share a first 128 characters (docs/routing.md)."""
    per_pod = _per_replica(line, what, window)
    return f"{per_pod} / scalar(sum({per_pod}))"


def replicas_with_traffic_series(line: BusinessLineConfig, window: str = SHARE_WINDOW) -> str:
    """How many replicas (pods) of the line have prompt-token series over ``window`` (idle ones included:
    a replica that gets nothing is what a hot spot leaves)."""
    return f"count({_per_replica(line, 'prompt_tokens', window)})"


def replica_hot_spot(line: BusinessLineConfig, factor: float, window: str = SHARE_WINDOW) -> str:
    """The replicas whose share of the line's prompt tokens exceeds ``factor`` x their fair share (1 / the
    replicas with series), by ``pod``. A line of one replica never matches (its share 1 < factor)."""
    return (f"{replica_share(line, 'prompt_tokens', window)} > {factor:g} / "
            f"scalar({replicas_with_traffic_series(line, window)})")


def kv_cache_usage(line: BusinessLineConfig) -> str:
    """GPU KV-cache usage per pod (0-1)."""
    return f"max by (pod)({selector('vllm:kv_cache_usage_perc', **line_labels(line))})"


# --- autoscaling triggers (KEDA's Prometheus scaler; docs/observability.md, "Autoscaling") ------------
#
# KEDA's scaler sends each query to the workspace's ``/api/v1/query`` and needs exactly one element
# back: several are an error, none (or NaN / Inf) reads as 0 only while its ``ignoreNullValues`` is on
# (its default; the operator's CRD has no field for it). So each query aggregates to one series and
# ends in ``or vector(0)``: a line no replica of which is scraped yet, or a quiet window, reads 0,
# whatever the operator sets (kedacore/keda ``pkg/scalers/prometheus_scaler.go``; docs/sources.md §26).


def autoscale_waiting_requests(line: BusinessLineConfig) -> str:
    """Requests waiting in the line's vLLM queues, summed over its replicas (0 when none is scraped)."""
    return f"{requests(line, 'waiting')} or vector(0)"


def autoscale_kv_cache_usage(line: BusinessLineConfig) -> str:
    """GPU KV-cache usage (0-1) averaged over the line's replicas (0 when none is scraped)."""
    return f"avg({selector('vllm:kv_cache_usage_perc', **line_labels(line))}) or vector(0)"


def autoscale_ttft_p90_seconds(line: BusinessLineConfig) -> str:
    """TTFT p90 of the line's user requests, seconds: the SLO alert's own quantile
    (:func:`ttft_quantile`, the canary's requests left out); 0 when the window holds no request
    (``histogram_quantile`` of empty buckets is NaN, which ``>= 0`` drops)."""
    return f"({ttft_quantile(line, 0.9)} >= 0) or vector(0)"


def l1_used_bytes(line: BusinessLineConfig) -> str:
    """Bytes in each pod's LMCache CPU tier (L1), all ranks of the pod."""
    return f"sum by (pod)({selector('lmcache:local_cache_usage', **line_labels(line))})"


def l2_traffic_bytes_rate(line: BusinessLineConfig, direction: str) -> str:
    """L2 bytes per second, ``direction``: ``read`` | ``write`` (all ranks)."""
    return rate_sum(f"lmcache:num_remote_{direction}_bytes", line_labels(line))


def lmcache_speed(line: BusinessLineConfig, which: str, q: float = 0.5) -> str:
    """Median (or ``q``) LMCache ``retrieve``/``store`` speed of the line, tokens/s per request."""
    return quantile(q, f"lmcache:{which}_speed", line_labels(line))


def janitor_selector(name: str, line: BusinessLineConfig) -> str:
    """Selector of the line's L2 janitor gauge ``name`` (job and ``line`` label)."""
    return selector(name, job=targets.JOB_L2_JANITOR, line=line.name)


def l2_used_bytes(line: BusinessLineConfig) -> str:
    """Bytes in the line's L2 directory (the janitor's last measurement)."""
    return f"max({janitor_selector(l2_janitor.USED_BYTES_METRIC, line)})"


def janitor_seconds_since_last_pass(line: BusinessLineConfig, lookback: str) -> str:
    """Seconds since the line's janitor last finished a pass, over the last ``lookback``.

    ``max_over_time`` keeps the last value seen within ``lookback`` after the janitor stops being
    scraped (its Pod gone or unschedulable), so a vanished janitor still counts as stale; a line
    whose janitor never reported (not deployed yet) yields nothing.
    """
    return f"time() - max(max_over_time({janitor_selector(l2_janitor.LAST_RUN_METRIC, line)}[{lookback}]))"


def hot_prefix_tokens(line: BusinessLineConfig, name: str) -> str:
    """Per declared prefix of the line, the warmer's token gauge ``name`` (declared, pinned or in L2)."""
    return f"max by (prefix)({janitor_selector(name, line)})"


def hot_prefix_pinned_bytes(line: BusinessLineConfig) -> str:
    """Bytes of the line's hot-prefix chunks in L2 (the janitor's last pass)."""
    return f"max({janitor_selector(l2_janitor.PINNED_BYTES_METRIC, line)})"


def hot_prefix_warmups_failing(line: BusinessLineConfig, failed: tuple[str, ...], window: str) -> str:
    """Per declared prefix of the line: warm-ups over ``window`` ended in one of the ``failed``
    results, and none in another (1 series per such prefix, label ``prefix``).

    The warmer exports every result's counter from 0 for each declared prefix, so ``increase``
    sees the first failure too.
    """
    counter = hot_prefixes.WARMUPS_METRIC + "_total"
    others = tuple(r for r in hot_prefixes.RESULTS if r not in failed)

    def increase(results: tuple[str, ...]) -> str:
        sel = selector(counter, job=targets.JOB_L2_JANITOR, line=line.name, result="|".join(results) + "~")
        return f"sum by (prefix) (increase({sel}[{window}])) > 0"

    return f"{increase(failed)} unless on (prefix) {increase(others)}"


def hot_prefix_names_ok(line: BusinessLineConfig) -> str:
    """The line's warmer's last self-check: 1 its computed chunk names are LMCache's, 0 they are not."""
    return f"min({janitor_selector(hot_prefixes.NAMES_OK_METRIC, line)})"


def janitor_errors(line: BusinessLineConfig) -> str:
    """Errors of the line's janitor's last pass."""
    return f"max({janitor_selector(l2_janitor.ERRORS_METRIC, line)})"


def l2_size_bytes(line: BusinessLineConfig) -> float:
    """The line's ``cache.l2_size`` in bytes."""
    return quantity_bytes(line.cache.l2_size)


def line_gpu_utilisation(line: BusinessLineConfig) -> str:
    """Mean utilisation (%) of the GPUs the line's pods use (DCGM's pod attribution)."""
    return f"avg({selector('DCGM_FI_DEV_GPU_UTIL', job=targets.JOB_DCGM, namespace=line.namespace)})"


def unmutated_vllm_pods(lines: list[BusinessLineConfig]) -> str:
    """vLLM pods of L2 lines whose pod carries no ``kvcache.io/l2-cache=curvine`` label.

    ``up`` exists for every Running pod the vLLM job discovered; the ``l2_cache`` target label
    comes from the pod label the Kyverno policy sets, so a pod it did not mutate lacks it.
    """
    regex = "|".join(l.name for l in lines)
    up = selector("up", job=targets.JOB_VLLM, business_line=f"{regex}~",
                  **{targets.L2_CACHE_TARGET_LABEL: f"!{names.L2_MUTATED_VALUE}"})
    return f"count by (business_line, namespace, pod)({up})"


# --- platform ------------------------------------------------------------------------------------


def pool_used_ratio() -> str:
    """Curvine pool use: bytes used / capacity, as the Primary reports them (0-1)."""
    job = {"job": targets.JOB_CURVINE_MASTER}
    return f"sum({selector('fs_used', **job)}) / sum({selector('capacity', **job)})"


def pool_bytes(which: str) -> str:
    """Curvine pool ``capacity`` | ``fs_used`` | ``available`` in bytes (Primary)."""
    return f"sum({selector(which, job=targets.JOB_CURVINE_MASTER)})"


def curvine_workers(tag: str) -> str:
    """Number of Curvine Workers in state ``tag`` (``live``, ``lost``, ...) as the Primary sees them."""
    return f"max({selector('worker_num', job=targets.JOB_CURVINE_MASTER, tag=tag)})"


def targets_up(job: str) -> str:
    """Targets of ``job`` whose last scrape succeeded."""
    return f"sum({selector('up', job=job)})"


def l2_mounts_up() -> str:
    """Every pod's L2 mount as the node's watchdog saw it last: 1 alive, 0 dead, hung or failing."""
    return selector(l2_mount_watchdog.UP_METRIC, job=targets.JOB_L2_MOUNT_WATCHDOG)


def l2_nodes_without_watchdog(lines: list[BusinessLineConfig], stale_s: int) -> str:
    """Nodes running a scraped vLLM pod of an L2 line (``lines``) where no L2 mount watchdog
    finished a pass in the last ``stale_s`` seconds: one series per node, label ``node``.

    The vLLM job labels its targets with the pod's node; the watchdog's
    ``kvcache_l2_mount_watchdog_last_pass_timestamp_seconds`` carries its node. A watchdog that is
    not running there (not scheduled, crashing, not scraped) has no series; one that runs but no
    longer finishes passes has an old one: either way the node is left.
    """
    regex = "|".join(l.name for l in lines)
    vllm = f"count by (node) ({selector('up', job=targets.JOB_VLLM, business_line=f'{regex}~')} == 1)"
    last_pass = selector(l2_mount_watchdog.LAST_PASS_METRIC, job=targets.JOB_L2_MOUNT_WATCHDOG)
    return f"{vllm} unless on (node) (time() - max by (node) ({last_pass}) < {stale_s})"


def l2_mounts_not_alive_by_state() -> str:
    """L2 mounts that are not alive, counted by ``state`` (dead, hung, error) over the cluster."""
    bad = "|".join(s for s in l2_mount_watchdog.STATES if s != l2_mount_watchdog.ALIVE)
    return (f"sum by (state) ({selector(l2_mount_watchdog.STATE_METRIC, job=targets.JOB_L2_MOUNT_WATCHDOG, state=bad + '~')})")


def events_in(counter: str, window: str, by: str = "") -> str:
    """Events a counter selector ``counter`` counted in the last ``window``, summed ``by`` labels,
    where any happened: ``increase()``, or the value of a series that did not exist ``window`` ago.

    The second branch is for the API server's counters, whose series appear only with their first
    event (at 1): ``increase()`` of a series that starts at 1 is 0, so the first event after an API
    server's start would otherwise be missed. A series that was already there before the scraper
    first saw it is counted once as new, with its whole value.
    """
    grouping = f" by ({by})" if by else ""
    return (f"(sum{grouping} (increase({counter}[{window}])) > 0) "
            f"or (sum{grouping} ({counter} unless {counter} offset {window}) > 0)")


def fuse_pod_deletes(action: str, errors: bool = False) -> str:
    """The API server's counts of the Curvine CSI node plugin's deletes of FUSE pods
    (k8s/fuse_pod_guard.py): ``action`` ``refused`` (the guard's denials) or ``admitted`` (the
    counting policy's warnings); ``errors``: instead, checks of either policy that failed to
    evaluate (``error_type`` other than ``no_error``)."""
    if errors:
        return selector(targets.APISERVER_METRIC, job=targets.JOB_APISERVER,
                        policy="|".join(targets.APISERVER_POLICIES) + "~", error_type="!no_error")
    policy, enforcement = {"refused": (FUSE_POD_GUARD, "deny"), "admitted": (FUSE_POD_DELETES_ADMITTED, "warn")}[action]
    return selector(targets.APISERVER_METRIC, job=targets.JOB_APISERVER, policy=policy,
                    enforcement_action=enforcement, error_type="no_error")


def target_up_absent(job: str) -> str:
    """Non-empty (1) when no target of ``job`` answered its last scrape, or none exists."""
    return f"absent({selector('up', job=job)} == 1)"


def worker_failed_disks() -> str:
    """Failed storage directories over all Curvine Workers."""
    return f"sum({selector('failed_disks', job=targets.JOB_CURVINE_WORKER)})"


def admission_requests_by_outcome() -> str:
    """Pod admission requests per second answered by Kyverno, by ``request_allowed``."""
    return rate_sum("kyverno_admission_requests", {"job": targets.JOB_KYVERNO, "resource_kind": "Pod"},
                    by="request_allowed")


def admission_denied_in(lines: list[BusinessLineConfig]) -> str:
    """Pod admission requests per second Kyverno refused in the namespaces of ``lines``, by namespace."""
    namespaces = "|".join(l.namespace for l in lines)
    return rate_sum("kyverno_admission_requests",
                    {"job": targets.JOB_KYVERNO, "resource_kind": "Pod", "request_allowed": "false",
                     "resource_namespace": f"{namespaces}~"}, by="resource_namespace")


def l2_policy_failures(lines: list[BusinessLineConfig]) -> str:
    """Failed or errored rule results per second of the lines' L2 policies, by policy."""
    policies = "|".join(names.policy_name(l) for l in lines)
    return rate_sum("kyverno_policy_results",
                    {"job": targets.JOB_KYVERNO, "policy_name": f"{policies}~", "rule_result": "fail|error~"},
                    by="policy_name, resource_namespace")


def admission_latency(q: float = 0.99) -> str:
    """Kyverno admission review latency quantile ``q``, seconds."""
    return quantile(q, "kyverno_admission_review_duration_seconds", {"job": targets.JOB_KYVERNO})


def gpu_utilisation_by_node() -> str:
    """Mean GPU utilisation (%) per node."""
    return f"avg by (Hostname)({selector('DCGM_FI_DEV_GPU_UTIL', job=targets.JOB_DCGM)})"


def gpu_memory_used_ratio_by_node() -> str:
    """GPU memory used / (used + free) per node (0-1)."""
    used = f"sum by (Hostname)({selector('DCGM_FI_DEV_FB_USED', job=targets.JOB_DCGM)})"
    free = f"sum by (Hostname)({selector('DCGM_FI_DEV_FB_FREE', job=targets.JOB_DCGM)})"
    return f"{used} / ({used} + {free})"


def l2_lines(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> list[BusinessLineConfig]:
    """The lines that use L2 (only they get L2 panels and alerts)."""
    return [l for l in lines if l.cache.l2_enabled and platform.curvine.enabled]
