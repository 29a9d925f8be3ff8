"""The scrape configuration: right pods, right ports, right labels, matching what the charts render."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
import yaml

from k8s import names
from k8s.curvine_config import MASTER_WEB_PORT, WORKER_WEB_PORT
from k8s.kyverno import KYVERNO_NAMESPACE
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from observability import targets


def relabel(meta: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Apply ``keep`` and ``replace`` relabel rules as Prometheus does (the only actions used here).

    Models: source labels joined by ``separator`` (default ``;``), fully anchored RE2 regex (Python
    ``re`` agrees on the patterns used here), ``$1`` replacement default, an empty result deleting
    the target label. Does not model the other actions (labelmap, hashmod, drop, ...).
    """
    labels = dict(meta)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace":
            if match:
                result = re.sub(r"\$(\d+)", lambda ref: match.group(int(ref.group(1))) or "",
                                rule.get("replacement", "$1"))
                if result:
                    labels[rule["target_label"]] = result
                else:
                    labels.pop(rule["target_label"], None)
        else:  # pragma: no cover - guards the model's scope
            raise AssertionError(f"relabel action {action} is not modelled")
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def job(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in config["scrape_configs"] if j["job_name"] == name)


def pod_meta(namespace: str, pod: str, labels: dict[str, str], port: int, port_name: str = "") -> dict[str, str]:
    meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_node_name": "hyperpod-i-0abc",
            "__meta_kubernetes_pod_container_port_number": str(port),
            "__meta_kubernetes_pod_container_port_name": port_name}
    meta.update({targets.meta_label(k): v for k, v in labels.items()})
    return meta


def test_meta_label_sanitizes_like_prometheus() -> None:
    assert targets.meta_label(names.L2_MUTATED_LABEL) == "__meta_kubernetes_pod_label_kvcache_io_l2_cache"


def test_vllm_job_keeps_each_lines_endpoint_pods_and_labels_them(obs_project, scrape_config) -> None:
    rules = job(scrape_config, targets.JOB_VLLM)["relabel_configs"]
    assert job(scrape_config, targets.JOB_VLLM)["kubernetes_sd_configs"][0]["namespaces"]["names"] == [
        l.namespace for l in obs_project.business_lines]
    for line in obs_project.business_lines:
        mutated = relabel(pod_meta(line.namespace, f"{line.name}-7d9-x", {
            names.OPERATOR_POD_LABEL: names.endpoint_name(line), names.L2_MUTATED_LABEL: names.L2_MUTATED_VALUE},
            line.vllm.port), rules)
        assert mutated == {"namespace": line.namespace, "pod": f"{line.name}-7d9-x", "node": "hyperpod-i-0abc",
                           "business_line": line.name, targets.L2_CACHE_TARGET_LABEL: names.L2_MUTATED_VALUE}
        # A pod the policy did not mutate is still scraped, without the l2_cache label (the alert's signal).
        plain = relabel(pod_meta(line.namespace, "p", {names.OPERATOR_POD_LABEL: names.endpoint_name(line)},
                                 line.vllm.port), rules)
        assert plain is not None and targets.L2_CACHE_TARGET_LABEL not in plain
        # Other pods of the namespace, other ports and pending pods are not scraped.
        assert relabel(pod_meta(line.namespace, "p", {names.OPERATOR_POD_LABEL: "router"}, line.vllm.port), rules) is None
        assert relabel(pod_meta(line.namespace, "p", {names.OPERATOR_POD_LABEL: line.name}, 9091), rules) is None
        pending = pod_meta(line.namespace, "p", {names.OPERATOR_POD_LABEL: line.name}, line.vllm.port)
        pending["__meta_kubernetes_pod_phase"] = "Pending"
        assert relabel(pending, rules) is None


def _pod_template(objects: list[dict], kind: str, name: str) -> dict:
    obj = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
    return obj["spec"]["template"]


@pytest.mark.parametrize(("kind", "name", "job_name", "port"), [
    ("StatefulSet", names.CURVINE_MASTER, targets.JOB_CURVINE_MASTER, MASTER_WEB_PORT),
    ("DaemonSet", names.CURVINE_WORKER, targets.JOB_CURVINE_WORKER, WORKER_WEB_PORT),
])
def test_curvine_jobs_keep_the_pods_the_curvine_chart_renders(obs_project, scrape_config, kind, name, job_name,
                                                               port) -> None:
    """Labels and the ``web`` port are read from the rendered chart, not assumed."""
    curvine = render_manifests(obs_project, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(obs_project))["curvine"]
    template = _pod_template(curvine, kind, name)
    container = next(c for c in template["spec"]["containers"]
                     if any(p.get("name") == targets.CURVINE_WEB_PORT_NAME for p in c.get("ports", [])))
    web = next(p for p in container["ports"] if p["name"] == targets.CURVINE_WEB_PORT_NAME)
    assert web["containerPort"] == port
    meta = pod_meta(obs_project.platform.curvine.namespace, f"{name}-0", template["metadata"]["labels"], port,
                    targets.CURVINE_WEB_PORT_NAME)
    assert relabel(meta, job(scrape_config, job_name)["relabel_configs"]) is not None
    other = "worker" if name == names.CURVINE_MASTER else "master"
    wrong = pod_meta(obs_project.platform.curvine.namespace, "x",
                     {**template["metadata"]["labels"], targets.CURVINE_COMPONENT_LABEL: other}, port,
                     targets.CURVINE_WEB_PORT_NAME)
    assert relabel(wrong, job(scrape_config, job_name)["relabel_configs"]) is None


def test_kyverno_dcgm_and_janitor_jobs(obs_project, scrape_config) -> None:
    kyverno = job(scrape_config, targets.JOB_KYVERNO)
    assert kyverno["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": [KYVERNO_NAMESPACE]}}]
    admission = pod_meta(KYVERNO_NAMESPACE, "kyverno-admission-controller-1",
                         {"app.kubernetes.io/component": "admission-controller"}, 8000, "metrics-port")
    assert relabel(admission, kyverno["relabel_configs"])["pod"] == "kyverno-admission-controller-1"
    background = pod_meta(KYVERNO_NAMESPACE, "b", {"app.kubernetes.io/component": "background-controller"},
                          8000, "metrics-port")
    assert relabel(background, kyverno["relabel_configs"]) is None
    dcgm = job(scrape_config, targets.JOB_DCGM)
    assert dcgm["kubernetes_sd_configs"][0]["namespaces"]["names"] == [obs_project.platform.observability.namespace]
    exporter = relabel(pod_meta(obs_project.platform.observability.namespace, "dcgm-exporter-x",
                                {"app.kubernetes.io/name": "dcgm-exporter"}, 9400, "metrics"), dcgm["relabel_configs"])
    # No namespace/pod target labels: DCGM's own namespace/pod (the GPU's user) must survive.
    assert exporter == {"node": "hyperpod-i-0abc"}
    janitor = job(scrape_config, targets.JOB_L2_JANITOR)
    assert janitor["kubernetes_sd_configs"][0]["namespaces"]["names"] == [
        l.namespace for l in obs_project.business_lines if l.cache.l2_enabled]
    assert relabel(pod_meta("rag-assistant", "j", {"app.kubernetes.io/component": "l2-janitor"}, 9100, "metrics"),
                   janitor["relabel_configs"]) == {"node": "hyperpod-i-0abc"}


def test_janitor_job_keeps_the_pods_the_line_chart_renders(obs_project, scrape_config) -> None:
    """The janitor's Deployment (k8s/janitor.py) as rendered: pod labels and the ``metrics`` port,
    in each L2 line's namespace; a line without L2 has no janitor and is not in the job."""
    rendered = render_manifests(obs_project, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(obs_project))
    rules = job(scrape_config, targets.JOB_L2_JANITOR)["relabel_configs"]
    scraped = 0
    for line in obs_project.business_lines:
        objects = rendered[names.line_chart_name(line)]
        janitors = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == names.L2_JANITOR]
        if not line.cache.l2_enabled:
            assert janitors == []
            continue
        template = _pod_template(objects, "Deployment", names.L2_JANITOR)
        (container,) = template["spec"]["containers"]
        (port,) = container["ports"]
        assert (port["name"], port["containerPort"]) == ("metrics", 9100)
        meta = pod_meta(line.namespace, "l2-janitor-5c9-x", template["metadata"]["labels"], port["containerPort"],
                        port["name"])
        assert relabel(meta, rules) == {"node": "hyperpod-i-0abc"}  # line/namespace come from the janitor itself
        scraped += 1
        # Another port of the pod, or the vLLM pods of the namespace, are not this job's.
        assert relabel({**meta, "__meta_kubernetes_pod_container_port_name": "http"}, rules) is None
        vllm = pod_meta(line.namespace, "v", {names.OPERATOR_POD_LABEL: line.name}, line.vllm.port)
        assert relabel(vllm, rules) is None
    assert scraped == 3  # rag-assistant, research-reasoning, ticket-triage (legal-search: L2 off)


def test_scrape_configuration_is_the_yaml_the_stack_encodes(obs_project, scrape_config, templates) -> None:
    stack = templates[f"{obs_project.platform.project}-observability"]
    scraper = next(iter(stack.find_resources("AWS::APS::Scraper").values()))
    blob = scraper["Properties"]["ScrapeConfiguration"]["ConfigurationBlob"]
    assert yaml.safe_load(base64.b64decode(blob)) == scrape_config
    assert scrape_config["global"] == {"scrape_interval": "30s", "scrape_timeout": "10s"}
