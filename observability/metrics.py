"""Every metric the dashboards and alerts use, sourced to the code of the pinned versions.

Each :class:`Metric` names the metric as its component registers it, its type, and a
:class:`Source`: repository, file and the versions (tags) it was read at (docs/sources.md §13).
:meth:`Metric.series` turns a registered name into the series names a scrape stores, by the
naming rules of the client library that exposes it (:class:`Naming`); the tests check those
rules against ``prometheus_client`` itself and check that every series name a PromQL
expression of this package selects is one of these.

Version matters: vLLM renamed its cache metrics (``vllm:gpu_prefix_cache_*`` became
``vllm:prefix_cache_*``, ``vllm:gpu_cache_usage_perc`` became ``vllm:kv_cache_usage_perc``), and
LMCache adds and relabels metrics between releases. So each source lists the versions it was
verified at; a metric used here exists, with the same type, in every listed version.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

from cluster_agents import hot_prefixes, kv_canary, l2_janitor, l2_mount_watchdog

Kind = Literal["counter", "gauge", "histogram"]


class Naming(Enum):
    """How a client library turns a registered metric into stored series names."""

    #: Python ``prometheus_client`` (vLLM, LMCache): a counter ``x`` is exposed as ``x_total``
    #: (a trailing ``_total`` in the registered name is not doubled); histograms as
    #: ``x_bucket``, ``x_sum``, ``x_count``. In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``)
    #: no ``_created`` series are written.
    PYTHON_CLIENT = "prometheus_client (Python)"
    #: Go OpenTelemetry Prometheus exporter (go.opentelemetry.io/otel/exporters/prometheus
    #: v0.59.0, as Kyverno v1.15.2 configures it: ``WithoutUnits()``): counters get ``_total``.
    OTEL_GO = "OpenTelemetry Prometheus exporter (Go), WithoutUnits"
    #: Rust ``prometheus`` crate (Curvine's ``orpc::common::Metrics``): names as registered.
    RUST_PROMETHEUS = "prometheus crate (Rust)"
    #: dcgm-exporter: the field name of its counters CSV, as registered.
    DCGM_CSV = "dcgm-exporter counters CSV"
    #: A series every Prometheus-compatible scraper writes per target (``up``).
    SCRAPER = "scraper (per target)"
    #: This project's own L2 janitor (names as written in its text output).
    PROJECT = "this project"
    #: Kubernetes ``k8s.io/component-base/metrics`` (Prometheus client_golang): names as
    #: registered, ``Namespace_Subsystem_Name`` (a counter's ``_total`` is part of its name).
    KUBERNETES_COMPONENT_BASE = "k8s.io/component-base/metrics (client_golang)"


@dataclass(frozen=True)
class Source:
    """Where metric names were read: repository, file, versions, and how it was read."""

    component: str
    repository: str
    path: str
    versions: tuple[str, ...]
    naming: Naming
    #: How the file was read at those versions (fetched tag, PyPI wheel of that version, ...).
    read_from: str


@dataclass(frozen=True)
class Metric:
    """One metric as its component registers it.

    Attributes:
        name: registered name (before any suffix the client library adds).
        kind: ``counter``, ``gauge`` or ``histogram``.
        unit: what one unit of the value is (``tokens``, ``bytes``, ``seconds``, ``ratio``, ...).
        labels: labels the component itself sets (scrape target labels come on top).
        meaning: one line, for the docs' metric table.
        source: where the name was read.
    """

    name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    meaning: str
    source: Source

    def series(self) -> tuple[str, ...]:
        """Series names a scrape of this metric stores, by :attr:`Source.naming`.

        Raises:
            ValueError: a naming rule that does not apply to this kind.
        """
        naming = self.source.naming
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.kind == "counter" and naming in (Naming.PYTHON_CLIENT, Naming.OTEL_GO):
            return (f"{self.name.removesuffix('_total')}_total",)
        return (self.name,)


# --- sources ------------------------------------------------------------------------------------

#: vLLM 0.29.0 is the release lmcache/vllm-openai:v0.5.5 (the pinned image) installs: its
#: Dockerfile installs the newest vLLM at build time, and the image was built at LMCache's 0.5.5
#: release, between vLLM 0.29.0 and 0.30.0 (docs/sources.md §13). Both read, same names and types.
VLLM: Final = Source(
    component="vLLM", repository="vllm-project/vllm", path="vllm/v1/metrics/loggers.py",
    versions=("v0.29.0", "v0.30.0"), naming=Naming.PYTHON_CLIENT,
    read_from="the PyPI wheels vllm==0.29.0 and vllm==0.30.0 (the file as released at those tags)")
#: The LMCache release of the pinned image (``platform_config.fields.LMCACHE_VERSION``; a light
#: test holds the two together). ``make test-lmcache`` runs that release, scrapes its metrics the
#: way vLLM's ``/metrics`` does, and checks every LMCache row of :data:`METRICS` (name, type,
#: labels) against what it exposes.
LMCACHE: Final = Source(
    component="LMCache", repository="LMCache/LMCache", path="lmcache/observability.py",
    versions=("v0.5.5",), naming=Naming.PYTHON_CLIENT,
    read_from="the PyPI sdist and wheel lmcache==0.5.5; exposition checked by make test-lmcache")
CURVINE_MASTER: Final = Source(
    component="Curvine Primary (master)", repository="CurvineIO/curvine",
    path="curvine-server/src/master/master_metrics.rs", versions=("v0.3.2-alpha",),
    naming=Naming.RUST_PROMETHEUS, read_from="the fetched repository at tag v0.3.2-alpha")
CURVINE_WORKER: Final = Source(
    component="Curvine Worker", repository="CurvineIO/curvine",
    path="curvine-server/src/worker/worker_metrics.rs", versions=("v0.3.2-alpha",),
    naming=Naming.RUST_PROMETHEUS, read_from="the fetched repository at tag v0.3.2-alpha")
KYVERNO_WEBHOOK: Final = Source(
    component="Kyverno admission controller", repository="kyverno/kyverno",
    path="pkg/webhooks/handlers/metrics.go", versions=("v1.15.2",), naming=Naming.OTEL_GO,
    read_from="the fetched repository at tag v1.15.2 (exporter options in pkg/metrics/metrics.go)")
KYVERNO_ENGINE: Final = Source(
    component="Kyverno policy engine", repository="kyverno/kyverno", path="pkg/engine/engine.go",
    versions=("v1.15.2",), naming=Naming.OTEL_GO,
    read_from="the fetched repository at tag v1.15.2 (attributes in pkg/engine/metrics.go)")
DCGM: Final = Source(
    component="NVIDIA DCGM exporter", repository="NVIDIA/dcgm-exporter", path="etc/default-counters.csv",
    versions=("4.5.3-4.8.2",), naming=Naming.DCGM_CSV,
    read_from="the fetched repository at tag 4.5.3-4.8.2 (Helm chart 4.8.2, image 4.5.3-4.8.2)")
SCRAPER: Final = Source(
    component="Prometheus scrape (AMP managed scraper)", repository="prometheus/prometheus",
    path="docs/configuration: 'up' per target", versions=("any",), naming=Naming.SCRAPER,
    read_from="Prometheus data model: every scrape writes up{job, instance, <target labels>}")
#: The EKS API server (``eks.version`` 1.34: k8s.io/apiserver v0.34.x, the staging repository of
#: kubernetes/kubernetes 1.34). Exposed on the API server's ``/metrics``, scraped by job
#: :data:`observability.targets.JOB_APISERVER`.
KUBE_APISERVER: Final = Source(
    component="Kubernetes API server (ValidatingAdmissionPolicy)", repository="kubernetes/apiserver",
    path="pkg/admission/plugin/policy/validating/metrics/metrics.go", versions=("v0.34.0",),
    naming=Naming.KUBERNETES_COMPONENT_BASE,
    read_from="the fetched repository at tag v0.34.0 (counted in pkg/admission/plugin/policy/validating/dispatcher.go)")
L2_JANITOR: Final = Source(
    component="L2 janitor (k8s/janitor.py Deployment)", repository="this project", path="cluster_agents/l2_janitor.py",
    versions=("this repository",), naming=Naming.PROJECT,
    read_from="prometheus_text() of the janitor, served on GET /metrics by its --serve HTTP server")
HOT_PREFIXES: Final = Source(
    component="Hot-prefix warmer (in the L2 janitor's process, k8s/janitor.py)", repository="this project",
    path="cluster_agents/hot_prefixes.py", versions=("this repository",), naming=Naming.PROJECT,
    read_from="HotPrefixWarmer.metrics(), appended to the janitor's GET /metrics")
L2_MOUNT_WATCHDOG: Final = Source(
    component="L2 mount watchdog (k8s/mount_watchdog.py DaemonSet)", repository="this project",
    path="cluster_agents/l2_mount_watchdog.py", versions=("this repository",), naming=Naming.PROJECT,
    read_from="prometheus_text() of the watchdog, served on GET /metrics by its --serve HTTP server")
KV_CANARY: Final = Source(
    component="Cross-pod hit canary (k8s/canary.py Deployment)", repository="this project",
    path="cluster_agents/kv_canary.py", versions=("this repository",), naming=Naming.PROJECT,
    read_from="prometheus_text() of the canary, served on GET /metrics by its --serve HTTP server")

_VLLM_LABELS = ("model_name", "engine")
#: ``PrometheusLogger._metadata_to_labels`` (lmcache 0.5.5). ``role`` is ``worker`` or
#: ``scheduler`` in vLLM; only worker engines log these metrics (the scheduler builds no engine
#: unless ``enable_scheduler_bypass_lookup``, left off), ``worker_id`` is the TP rank.
_LMCACHE_LABELS = ("model_name", "worker_id", "role", "served_model_name")


def _m(name: str, kind: Kind, unit: str, labels: tuple[str, ...], meaning: str, source: Source) -> Metric:
    return Metric(name=name, kind=kind, unit=unit, labels=labels, meaning=meaning, source=source)


#: Every metric used by a dashboard panel or an alert, keyed by registered name.
METRICS: Final[dict[str, Metric]] = {m.name: m for m in (
    # vLLM (L0 = vLLM's GPU prefix cache; request load; TTFT; tokens).
    _m("vllm:prefix_cache_queries", "counter", "tokens", _VLLM_LABELS,
       "prompt tokens looked up in the GPU prefix cache (L0)", VLLM),
    _m("vllm:prefix_cache_hits", "counter", "tokens", _VLLM_LABELS,
       "prompt tokens found in the GPU prefix cache (L0 hits)", VLLM),
    _m("vllm:prompt_tokens", "counter", "tokens", _VLLM_LABELS, "prompt tokens processed", VLLM),
    _m("vllm:generation_tokens", "counter", "tokens", _VLLM_LABELS, "tokens generated", VLLM),
    _m("vllm:time_to_first_token_seconds", "histogram", "seconds", _VLLM_LABELS,
       "time to first token of each request", VLLM),
    _m("vllm:kv_cache_usage_perc", "gauge", "ratio", _VLLM_LABELS,
       "share of the GPU KV-cache blocks in use (1 = full)", VLLM),
    _m("vllm:num_requests_running", "gauge", "requests", _VLLM_LABELS, "requests running on the GPU", VLLM),
    _m("vllm:num_requests_waiting", "gauge", "requests", _VLLM_LABELS, "requests queued", VLLM),
    # LMCache (L1 CPU tier and L2 remote backend = Curvine through the fs:// connector).
    _m("lmcache:num_requested_tokens", "counter", "tokens", _LMCACHE_LABELS,
       "tokens vLLM asked LMCache to retrieve", LMCACHE),
    _m("lmcache:num_hit_tokens", "counter", "tokens", _LMCACHE_LABELS,
       "tokens LMCache retrieved (L1 and L2 hits together)", LMCACHE),
    _m("lmcache:num_stored_tokens", "counter", "tokens", _LMCACHE_LABELS, "tokens LMCache stored", LMCACHE),
    _m("lmcache:num_lookup_requests", "counter", "requests", _LMCACHE_LABELS,
       "lookups vLLM asked of LMCache (one per new request; none while LMCache is unhealthy)", LMCACHE),
    _m("lmcache:num_store_requests", "counter", "requests", _LMCACHE_LABELS,
       "store requests (each stores its full chunks; at most chunk_size - 1 tokens of a tail are not stored)",
       LMCACHE),
    _m("lmcache:num_remote_write_requests", "counter", "chunks", _LMCACHE_LABELS,
       "chunks written to the remote backend (L2), counted after a successful write only", LMCACHE),
    _m("lmcache:num_remote_read_requests", "counter", "chunks", _LMCACHE_LABELS,
       "chunks read from the remote backend (L2 hits; one object per chunk and TP rank)", LMCACHE),
    _m("lmcache:num_remote_read_bytes", "counter", "bytes", _LMCACHE_LABELS,
       "bytes read from the remote backend (L2)", LMCACHE),
    _m("lmcache:num_remote_write_bytes", "counter", "bytes", _LMCACHE_LABELS,
       "bytes written to the remote backend (L2)", LMCACHE),
    _m("lmcache:retrieve_speed", "histogram", "tokens/s", _LMCACHE_LABELS, "retrieve throughput per request",
       LMCACHE),
    _m("lmcache:store_speed", "histogram", "tokens/s", _LMCACHE_LABELS, "store throughput per request", LMCACHE),
    _m("lmcache:local_cache_usage", "gauge", "bytes", _LMCACHE_LABELS, "bytes held in the CPU tier (L1)",
       LMCACHE),
    # Curvine Primary: the pool (sum over live Workers) and Worker liveness.
    _m("capacity", "gauge", "bytes", (), "pool capacity (Primary) / Worker capacity (Worker)", CURVINE_MASTER),
    _m("fs_used", "gauge", "bytes", (), "bytes used by the file system (Primary: whole pool)", CURVINE_MASTER),
    _m("available", "gauge", "bytes", (), "bytes still available (Primary: whole pool)", CURVINE_MASTER),
    _m("worker_num", "gauge", "workers", ("tag",), "Workers by state: tag=live|lost|blacklist|decommission",
       CURVINE_MASTER),
    # Curvine Workers.
    _m("failed_disks", "gauge", "disks", (), "storage directories of a Worker that failed", CURVINE_WORKER),
    _m("read_bytes", "counter", "bytes", (), "bytes a Worker served", CURVINE_WORKER),
    _m("write_bytes", "counter", "bytes", (), "bytes a Worker wrote", CURVINE_WORKER),
    # Kyverno (the admission webhook that puts the L2 patch on every vLLM pod).
    _m("kyverno_admission_requests", "counter", "requests",
       ("resource_kind", "resource_namespace", "resource_request_operation", "request_allowed"),
       "admission requests the webhook answered, by outcome", KYVERNO_WEBHOOK),
    _m("kyverno_admission_review_duration_seconds", "histogram", "seconds",
       ("resource_kind", "resource_namespace", "resource_request_operation", "request_allowed"),
       "latency of an admission review", KYVERNO_WEBHOOK),
    _m("kyverno_policy_results", "counter", "rule results",
       ("policy_name", "policy_namespace", "rule_name", "rule_result", "resource_kind", "resource_namespace"),
       "rule results by policy: rule_result=pass|fail|warn|error|skip", KYVERNO_ENGINE),
    # The API server's ValidatingAdmissionPolicy checks: the FUSE pod guard's refusals (deny) and
    # the deletes it admitted (the counting policy's warn); a passing validation is not counted.
    _m("apiserver_validating_admission_policy_check_total", "counter", "checks",
       ("policy", "policy_binding", "error_type", "enforcement_action"),
       "policy checks that denied, warned or audited (error_type=no_error|compile_error|invalid_error|"
       "out_of_budget; enforcement_action=deny|warn|audit, or allow after an ignored error)", KUBE_APISERVER),
    # GPUs.
    _m("DCGM_FI_DEV_GPU_UTIL", "gauge", "percent", ("gpu", "UUID", "Hostname", "modelName", "namespace", "pod"),
       "GPU utilisation (namespace/pod: the pod using the GPU)", DCGM),
    _m("DCGM_FI_DEV_FB_USED", "gauge", "MiB", ("gpu", "UUID", "Hostname", "modelName", "namespace", "pod"),
       "GPU memory used", DCGM),
    _m("DCGM_FI_DEV_FB_FREE", "gauge", "MiB", ("gpu", "UUID", "Hostname", "modelName", "namespace", "pod"),
       "GPU memory free", DCGM),
    # Scrape health.
    _m("up", "gauge", "1/0", ("job", "instance"), "1 if the last scrape of the target succeeded", SCRAPER),
    # L2 janitor (per-line L2 use: Curvine's CSI driver reports no volume stats).
    _m(l2_janitor.USED_BYTES_METRIC, "gauge", "bytes", ("line", "namespace"),
       "bytes in the line's L2 directory after the janitor's last pass", L2_JANITOR),
    _m(l2_janitor.LAST_RUN_METRIC, "gauge", "unix seconds", ("line", "namespace"),
       "when the janitor's last pass for the line finished", L2_JANITOR),
    _m(l2_janitor.ERRORS_METRIC, "gauge", "count", ("line", "namespace"),
       "errors of the janitor's last pass (0 = it succeeded)", L2_JANITOR),
    _m(l2_janitor.PINNED_BYTES_METRIC, "gauge", "bytes", ("line", "namespace"),
       "bytes of the line's hot-prefix chunks in L2 (never deleted; part of the used bytes)", L2_JANITOR),
    # Hot prefixes (issue 17): the warmer in the janitor's process, on the janitor's /metrics.
    _m(hot_prefixes.DECLARED_TOKENS_METRIC, "gauge", "tokens", ("line", "namespace", "prefix"),
       "tokens of a declared hot prefix as a replica tokenized it", HOT_PREFIXES),
    _m(hot_prefixes.PINNED_TOKENS_METRIC, "gauge", "tokens", ("line", "namespace", "prefix"),
       "of them, the tokens in full chunks: what L2 holds of the prefix and the janitor keeps", HOT_PREFIXES),
    _m(hot_prefixes.L2_TOKENS_METRIC, "gauge", "tokens", ("line", "namespace", "prefix"),
       "leading tokens of the prefix whose chunks are in L2 for every rank now (what a lookup hits)", HOT_PREFIXES),
    _m(hot_prefixes.WARMUPS_METRIC + "_total", "counter", "warm-ups", ("line", "namespace", "prefix", "result"),
       "warm-ups of a prefix by result: " + ", ".join(hot_prefixes.RESULTS), HOT_PREFIXES),
    _m(hot_prefixes.NAMES_OK_METRIC, "gauge", "1/0", ("line", "namespace"),
       "1 if the warmer's computed chunk names were found in L2, 0 if replicas stored chunks under other names",
       HOT_PREFIXES),
    # L2 mount watchdog (one per HyperPod node: every pod's Curvine L2 mount).
    _m(l2_mount_watchdog.UP_METRIC, "gauge", "1/0", ("namespace", "pod", "node", "volume", "pod_uid"),
       "1 if the pod's L2 mount answered in the watchdog's last pass, 0 if dead, hung or failing",
       L2_MOUNT_WATCHDOG),
    _m(l2_mount_watchdog.STATE_METRIC, "gauge", "1/0", ("namespace", "pod", "node", "volume", "pod_uid", "state"),
       "1 for the mount's state in the last pass: alive, dead, hung or error", L2_MOUNT_WATCHDOG),
    _m(l2_mount_watchdog.EVICTIONS_METRIC, "counter", "pods", ("node", "result"),
       "evictions of pods with a dead L2 mount: result=evicted|refused|failed", L2_MOUNT_WATCHDOG),
    _m(l2_mount_watchdog.UNMOUNTS_METRIC, "counter", "mounts", ("node", "result"),
       "lazy unmounts of dead L2 binds of terminating pods: result=unmounted|failed", L2_MOUNT_WATCHDOG),
    _m(l2_mount_watchdog.LAST_PASS_METRIC, "gauge", "unix seconds", ("node",),
       "when the watchdog's last pass on the node finished", L2_MOUNT_WATCHDOG),
    # Cross-pod hit canary (one per L2 line).
    _m(kv_canary.RATIO_METRIC, "gauge", "ratio", ("line", "namespace"),
       "L2-served share of the last measured canary prompt on the second replica (1 = every chunk)", KV_CANARY),
    _m(kv_canary.TTFT_METRIC, "gauge", "seconds", ("line", "namespace", "phase"),
       "TTFT of the last measured run's requests: phase=cold (first replica), warm (second)", KV_CANARY),
    _m(kv_canary.REPLICAS_METRIC, "gauge", "replicas", ("line", "namespace"),
       "comparable replicas (Running, Ready, same L2 directory) the last run found", KV_CANARY),
    _m(kv_canary.LAST_RUN_METRIC, "gauge", "unix seconds", ("line", "namespace"), "when the last run finished",
       KV_CANARY),
    _m(kv_canary.RUNS_METRIC + "_total", "counter", "runs", ("line", "namespace", "result"),
       "canary runs by result: measured, busy, one_replica, no_pair, error", KV_CANARY),
    _m(kv_canary.REQUEST_TTFT_METRIC, "histogram", "seconds", ("line", "namespace"),
       "TTFT of the canary's own requests in vLLM's TTFT buckets (subtracted from the TTFT SLO)", KV_CANARY),
)}


def series_index() -> dict[str, Metric]:
    """Stored series name -> :class:`Metric` for every metric of :data:`METRICS`."""
    return {series: metric for metric in METRICS.values() for series in metric.series()}


def metric(name: str) -> Metric:
    """The :class:`Metric` registered as ``name``.

    Raises:
        KeyError: ``name`` is not in :data:`METRICS` (add it with its source first).
    """
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in observability.metrics.METRICS; add it with its source") from None


def series(name: str, suffix: str = "") -> str:
    """The stored series name of metric ``name`` (``suffix``: ``_bucket``, ``_sum``, ``_count`` of a histogram).

    ``series("vllm:prompt_tokens")`` -> ``"vllm:prompt_tokens_total"``.

    Raises:
        KeyError: unknown metric, or a suffix the metric does not have.
    """
    names = metric(name).series()
    wanted = [s for s in names if s.endswith(suffix)] if suffix else list(names)
    if len(wanted) != 1:
        raise KeyError(f"metric {name!r} has series {names}; suffix {suffix!r} selects {wanted}")
    return wanted[0]
