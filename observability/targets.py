"""What the AMP managed scraper scrapes, and its scrape configuration (a Prometheus YAML).

One job per kind of target, each found by Kubernetes pod discovery (``kubernetes_sd_configs``
role ``pod``) and kept by namespace, pod label and container port, so nothing else in the
cluster is scraped:

========================  ==========================  ===========================================
job                       pods                        port
========================  ==========================  ===========================================
``kvcache-vllm``          each line's endpoint pods   ``vllm.port`` (vLLM's ``/metrics``; LMCache's
                          (``app=<line>``)            metrics are served there too, see docs/observability.md)
``kvcache-curvine-master`` Curvine Primary            container port ``web`` (9001)
``kvcache-curvine-worker`` Curvine Workers            container port ``web`` (9002)
``kvcache-kyverno``       Kyverno admission pods      container port ``metrics-port`` (8000)
``kvcache-dcgm``          DCGM exporter pods          container port ``metrics`` (9400)
``kvcache-l2-janitor``    each line's L2 janitor      container port ``metrics`` (9100, k8s/janitor.py)
``kvcache-l2-mount-       the L2 mount watchdog on    container port ``metrics`` (9101,
watchdog``                every HyperPod node         k8s/mount_watchdog.py)
``kvcache-kv-canary``     each line's hit canary      container port ``metrics`` (9100, k8s/canary.py)
``kvcache-node-firewall`` the node filter on every    container port ``metrics`` (9420, on the host
                          HyperPod node               network: k8s/node_firewall.py)
========================  ==========================  ===========================================

And one job that is not a pod: ``kvcache-apiserver`` scrapes the API server's own ``/metrics``
(endpoints of the ``kubernetes`` Service in ``default``, HTTPS with the scraper's service-account
token, as the Prometheus community chart's ``kubernetes-apiservers`` job does; the managed
scraper's access entry allows ``get`` on ``/metrics``, docs/sources.md §13) and keeps nothing but
the ValidatingAdmissionPolicy check counts of the FUSE pod guard's two policies
(:func:`apiserver_job`): what the guard refused and what it admitted (docs/l2-cache.md, "The
guard"). Its port is the API server's 443, already admitted for discovery.

Target labels added by relabelling: ``business_line`` (vLLM, from the namespace), ``namespace``
and ``pod`` (vLLM, Curvine, Kyverno, the node filter), ``l2_cache`` (vLLM: the value of the pod label
:data:`k8s.names.L2_MUTATED_LABEL` the Kyverno policy sets; absent on a pod it did not mutate),
``node`` (all but the mount watchdog). The DCGM exporter, the janitor, the canary and the mount
watchdog expose their own ``namespace``/``pod``/``line`` labels (the pod *using* a GPU; the line
measured; the pod whose mount was checked; the watchdog also its ``node``), so those jobs add no
target label of the same name (a clash would rename theirs to ``exported_*``).

Every job keeps its targets by port *number* too, so :func:`scrape_ports` is the exact set of TCP
ports the scraper opens; the observability stack admits the scraper on those ports (and the API
server's 443, for discovery) into the EKS cluster security group, the one group every node carries
(system node group: only that one; HyperPod nodes: that one and the shared group).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import yaml

from k8s import names
from k8s.curvine_config import MASTER_WEB_PORT, WORKER_WEB_PORT
from k8s.fuse_pod_guard import FUSE_POD_DELETES_ADMITTED, FUSE_POD_GUARD
from k8s.kyverno import KYVERNO_NAMESPACE
from cluster_agents import kv_canary, l2_janitor, l2_mount_watchdog, node_firewall
from platform_config import BusinessLineConfig, PlatformConfig

JOB_VLLM: Final = "kvcache-vllm"
JOB_CURVINE_MASTER: Final = "kvcache-curvine-master"
JOB_CURVINE_WORKER: Final = "kvcache-curvine-worker"
JOB_KYVERNO: Final = "kvcache-kyverno"
JOB_DCGM: Final = "kvcache-dcgm"
JOB_L2_JANITOR: Final = "kvcache-l2-janitor"
JOB_L2_MOUNT_WATCHDOG: Final = "kvcache-l2-mount-watchdog"
JOB_KV_CANARY: Final = "kvcache-kv-canary"
JOB_NODE_FIREWALL: Final = "kvcache-node-firewall"
JOB_APISERVER: Final = "kvcache-apiserver"
#: The API server's series the apiserver job keeps (observability/metrics.py), and only for these
#: policies: the FUSE pod guard and the policy that counts what it admits (k8s/fuse_pod_guard.py).
APISERVER_METRIC: Final = "apiserver_validating_admission_policy_check_total"
APISERVER_POLICIES: Final = (FUSE_POD_GUARD, FUSE_POD_DELETES_ADMITTED)
#: Where a pod's service-account token and the cluster CA are mounted (Kubernetes documentation,
#: "Accessing the Kubernetes API from a Pod"): the scraper authenticates to the API server with them.
SERVICE_ACCOUNT_TOKEN_FILE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_ACCOUNT_CA_FILE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

#: Pod labels of the Curvine chart (k8s/curvine_chart.py; a test checks they match).
CURVINE_NAME_LABEL: Final = ("app.kubernetes.io/name", "curvine")
CURVINE_COMPONENT_LABEL: Final = "app.kubernetes.io/component"
CURVINE_WEB_PORT_NAME: Final = "web"
#: Kyverno chart 3.5.2 (kyverno v1.15.2): admission-controller pod label and metrics port name
#: (charts/kyverno/templates/admission-controller/deployment.yaml, _helpers.tpl).
KYVERNO_COMPONENT: Final = ("app.kubernetes.io/component", "admission-controller")
KYVERNO_METRICS_PORT_NAME: Final = "metrics-port"
#: ... its number: the chart's ``admissionController.metricsService.port`` default (docs/sources.md §13).
KYVERNO_METRICS_PORT: Final = 8000
#: dcgm-exporter chart 4.8.2: pod label ``app.kubernetes.io/name`` and container port ``metrics``.
DCGM_NAME_LABEL: Final = ("app.kubernetes.io/name", "dcgm-exporter")
DCGM_METRICS_PORT_NAME: Final = "metrics"
#: ... its number: ``containerPort: {{ .Values.service.port }}``, default 9400 (deployment/values.yaml at
#: 4.5.3-4.8.2; also the port of an exporter the GPU operator installs, ``dcgm_exporter.install: false``).
DCGM_METRICS_PORT: Final = 9400
#: The Kubernetes API server (HTTPS): the scraper's pod discovery goes through the cluster's
#: private endpoint, whose ENIs carry the cluster security group (AMP user guide: managed
#: collectors need private endpoint access, docs/sources.md §13).
API_SERVER_PORT: Final = 443
#: The L2 janitor's pods and port: the names its Deployment uses (k8s/names.py, k8s/janitor.py)
#: and the port its HTTP server listens on (cluster_agents/l2_janitor.py).
L2_JANITOR_COMPONENT: Final = names.L2_JANITOR_COMPONENT_LABEL
L2_JANITOR_METRICS_PORT_NAME: Final = names.L2_JANITOR_METRICS_PORT_NAME
L2_JANITOR_METRICS_PORT: Final = l2_janitor.METRICS_PORT
#: The L2 mount watchdog's pods and port (k8s/names.py, k8s/mount_watchdog.py, cluster_agents/l2_mount_watchdog.py).
L2_MOUNT_WATCHDOG_COMPONENT: Final = names.L2_MOUNT_WATCHDOG_COMPONENT_LABEL
L2_MOUNT_WATCHDOG_METRICS_PORT_NAME: Final = names.L2_MOUNT_WATCHDOG_METRICS_PORT_NAME
L2_MOUNT_WATCHDOG_METRICS_PORT: Final = l2_mount_watchdog.METRICS_PORT
#: The node filter's pods and port (k8s/names.py, k8s/node_firewall.py, cluster_agents/node_firewall.py):
#: on the host network, so the target is the node's IP.
NODE_FIREWALL_COMPONENT: Final = names.NODE_FIREWALL_COMPONENT_LABEL
NODE_FIREWALL_METRICS_PORT_NAME: Final = names.NODE_FIREWALL_METRICS_PORT_NAME
NODE_FIREWALL_METRICS_PORT: Final = node_firewall.METRICS_PORT
#: The cross-pod hit canary's pods and port (k8s/names.py, k8s/canary.py, cluster_agents/kv_canary.py);
#: the same port number as the janitor's, so the scraper needs no other security-group rule.
KV_CANARY_COMPONENT: Final = names.KV_CANARY_COMPONENT_LABEL
KV_CANARY_METRICS_PORT_NAME: Final = names.KV_CANARY_METRICS_PORT_NAME
KV_CANARY_METRICS_PORT: Final = kv_canary.METRICS_PORT

#: Target label holding the pod's :data:`k8s.names.L2_MUTATED_LABEL` value (vLLM job).
L2_CACHE_TARGET_LABEL: Final = "l2_cache"


def meta_label(label: str) -> str:
    """Kubernetes SD meta label of a pod label: ``kvcache.io/l2-cache`` -> ``__meta_kubernetes_pod_label_kvcache_io_l2_cache``.

    Prometheus replaces every character outside ``[a-zA-Z0-9_]`` with ``_``.
    """
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _alternation(values: list[str]) -> str:
    return "|".join(re.escape(v) for v in values)


@dataclass(frozen=True)
class Job:
    """One scrape job: which namespaces, which pods (label), which container port."""

    name: str
    namespaces: tuple[str, ...]
    pod_label: tuple[str, str]
    port_name: str | None = None
    port_numbers: tuple[int, ...] = ()
    #: Target labels: namespace and pod of the scraped pod (off where the target exposes its own).
    pod_target_labels: bool = True
    #: Target label: node of the scraped pod (off where the target exposes its own).
    node_target_label: bool = True

    def scrape_config(self, extra_relabel: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The job's ``scrape_configs`` entry (Prometheus configuration format)."""
        label, value = self.pod_label
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
            {"source_labels": [meta_label(label)], "regex": re.escape(value) if value else ".+", "action": "keep"},
        ]
        if self.port_name is not None:
            relabel.append({"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                            "regex": re.escape(self.port_name), "action": "keep"})
        if self.port_numbers:
            relabel.append({"source_labels": ["__meta_kubernetes_pod_container_port_number"],
                            "regex": _alternation([str(p) for p in self.port_numbers]), "action": "keep"})
        if self.pod_target_labels:
            relabel += [
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            ]
        if self.node_target_label:
            relabel.append({"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"})
        relabel += extra_relabel or []
        return {
            "job_name": self.name,
            "metrics_path": "/metrics",
            "scheme": "http",
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": list(self.namespaces)}}],
            "relabel_configs": relabel,
        }


def _vllm(lines: tuple[BusinessLineConfig, ...]) -> tuple[Job, list[dict[str, Any]]]:
    """The vLLM job: every line's endpoint pods, ``business_line`` from the namespace.

    The operator labels the pods ``app=<endpoint name>`` (:data:`k8s.names.OPERATOR_POD_LABEL`);
    the port is the line's ``vllm.port``. Each line's namespace maps to ``business_line=<name>``.
    """
    job = Job(name=JOB_VLLM, namespaces=tuple(l.namespace for l in lines),
              pod_label=(names.OPERATOR_POD_LABEL, ""),
              port_numbers=tuple(sorted({l.vllm.port for l in lines})))
    extra: list[dict[str, Any]] = [
        # Only the endpoint's own pods (app=<endpoint>), not other pods of the namespace.
        {"source_labels": ["__meta_kubernetes_namespace", meta_label(names.OPERATOR_POD_LABEL)],
         "separator": "/",
         "regex": _alternation([f"{l.namespace}/{names.endpoint_name(l)}" for l in lines]),
         "action": "keep"},
    ]
    extra += [{"source_labels": ["__meta_kubernetes_namespace"], "regex": re.escape(l.namespace),
               "target_label": "business_line", "replacement": l.name} for l in lines]
    extra.append({"source_labels": [meta_label(names.L2_MUTATED_LABEL)], "target_label": L2_CACHE_TARGET_LABEL})
    return job, extra


def _jobs(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> list[tuple[Job, list[dict[str, Any]]]]:
    """(job, extra relabel rules) of every scrape job, in the order of :func:`jobs`."""
    obs = platform.observability
    out: list[tuple[Job, list[dict[str, Any]]]] = []
    if lines:
        out.append(_vllm(lines))
        l2_lines = [l for l in lines if l.cache.l2_enabled]
        if l2_lines:
            out.append((Job(name=JOB_L2_JANITOR, namespaces=tuple(l.namespace for l in l2_lines),
                            pod_label=L2_JANITOR_COMPONENT, port_name=L2_JANITOR_METRICS_PORT_NAME,
                            port_numbers=(L2_JANITOR_METRICS_PORT,), pod_target_labels=False), []))
        canary_lines = [l for l in l2_lines if l.runs_canary and platform.curvine.enabled]
        if canary_lines:
            out.append((Job(name=JOB_KV_CANARY, namespaces=tuple(l.namespace for l in canary_lines),
                            pod_label=KV_CANARY_COMPONENT, port_name=KV_CANARY_METRICS_PORT_NAME,
                            port_numbers=(KV_CANARY_METRICS_PORT,), pod_target_labels=False), []))
    if platform.curvine.enabled:
        ns = (platform.curvine.namespace,)
        for name, component, port in ((JOB_CURVINE_MASTER, "master", MASTER_WEB_PORT),
                                      (JOB_CURVINE_WORKER, "worker", WORKER_WEB_PORT)):
            out.append((Job(name=name, namespaces=ns, pod_label=(CURVINE_COMPONENT_LABEL, component),
                            port_name=CURVINE_WEB_PORT_NAME, port_numbers=(port,)),
                        [{"source_labels": [meta_label(CURVINE_NAME_LABEL[0])],
                          "regex": re.escape(CURVINE_NAME_LABEL[1]), "action": "keep"}]))
        if platform.curvine.mount_watchdog.enabled:
            out.append((Job(name=JOB_L2_MOUNT_WATCHDOG, namespaces=ns, pod_label=L2_MOUNT_WATCHDOG_COMPONENT,
                            port_name=L2_MOUNT_WATCHDOG_METRICS_PORT_NAME, port_numbers=(L2_MOUNT_WATCHDOG_METRICS_PORT,),
                            pod_target_labels=False, node_target_label=False), []))
        if platform.curvine.node_firewall.enabled:
            out.append((Job(name=JOB_NODE_FIREWALL, namespaces=ns, pod_label=NODE_FIREWALL_COMPONENT,
                            port_name=NODE_FIREWALL_METRICS_PORT_NAME, port_numbers=(NODE_FIREWALL_METRICS_PORT,)),
                        []))
        out.append((Job(name=JOB_KYVERNO, namespaces=(KYVERNO_NAMESPACE,), pod_label=KYVERNO_COMPONENT,
                        port_name=KYVERNO_METRICS_PORT_NAME, port_numbers=(KYVERNO_METRICS_PORT,)), []))
    # An exporter installed by someone else (install: false): any namespace (empty = all).
    out.append((Job(name=JOB_DCGM, namespaces=(obs.namespace,) if obs.dcgm_exporter.install else (),
                    pod_label=DCGM_NAME_LABEL, port_name=DCGM_METRICS_PORT_NAME, port_numbers=(DCGM_METRICS_PORT,),
                    pod_target_labels=False), []))
    return out


def apiserver_job() -> dict[str, Any]:
    """The API server's ``/metrics``: endpoints discovery of Service ``default/kubernetes``, port
    ``https``, bearer token and CA of the scraper's service account; only :data:`APISERVER_METRIC`
    of :data:`APISERVER_POLICIES` is kept (``metric_relabel_configs``), so the job stores a handful
    of series however many metrics the API server exposes."""
    return {
        "job_name": JOB_APISERVER,
        "metrics_path": "/metrics",
        "scheme": "https",
        "bearer_token_file": SERVICE_ACCOUNT_TOKEN_FILE,
        "tls_config": {"ca_file": SERVICE_ACCOUNT_CA_FILE},
        "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": ["default"]}}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_service_name", "__meta_kubernetes_endpoint_port_name"],
             "separator": ";", "regex": "kubernetes;https", "action": "keep"},
        ],
        "metric_relabel_configs": [
            {"source_labels": ["__name__", "policy"], "separator": ";",
             "regex": f"{re.escape(APISERVER_METRIC)};({_alternation(list(APISERVER_POLICIES))})", "action": "keep"},
        ],
    }


def jobs(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> list[dict[str, Any]]:
    """Every scrape job of the platform (vLLM only when there are lines, Curvine and the API
    server's guard counts only when Curvine is enabled)."""
    out = []
    for job, extra in _jobs(platform, lines):
        config = job.scrape_config(extra)
        if not job.namespaces:
            del config["kubernetes_sd_configs"][0]["namespaces"]
        out.append(config)
    if platform.curvine.enabled:
        out.append(apiserver_job())
    return out


def scrape_ports(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> dict[int, tuple[str, ...]]:
    """TCP port -> names of the jobs that scrape it, over every job of :func:`jobs`, sorted by port.

    Every job keeps its targets by port number (a ``keep`` rule on
    ``__meta_kubernetes_pod_container_port_number``), so these are all the ports the scraper
    connects to on a node (a pod IP or, for the hostNetwork Curvine Workers, the node IP).
    """
    ports: dict[int, list[str]] = {}
    for job, _ in _jobs(platform, lines):
        for port in job.port_numbers:
            ports.setdefault(port, []).append(job.name)
    return {port: tuple(ports[port]) for port in sorted(ports)}


def scrape_configuration(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> dict[str, Any]:
    """The scraper's whole configuration: global interval/timeout and :func:`jobs`."""
    interval = platform.observability.scrape_interval_seconds
    return {
        "global": {"scrape_interval": f"{interval}s", "scrape_timeout": f"{min(10, interval)}s"},
        "scrape_configs": jobs(platform, lines),
    }


def scrape_configuration_yaml(platform: PlatformConfig, lines: tuple[BusinessLineConfig, ...]) -> str:
    """:func:`scrape_configuration` as YAML (what ``AWS::APS::Scraper`` ``ConfigurationBlob`` takes)."""
    return yaml.safe_dump(scrape_configuration(platform, lines), sort_keys=False, width=1000)
