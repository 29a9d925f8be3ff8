"""Export what the tier needs from the rendered manifests, as JSON (runs in the project's .venv).

For every business line of the scenario config (``tests/fixtures/config``), and for a copy in
which ``rag-assistant`` serves a fine-tuned model (the issue's input: new ``model.name`` and
``source.location``, same ``/opt/ml/model`` path), this renders the charts exactly as
``make manifests`` does, takes the line's Kyverno ``Policy`` and ``InferenceEndpointConfig`` from
them, applies the Policy (``tests.k8s.kyverno_eval``) to the Pod the operator renders
(``tests.k8s.operator_render``) once per simulated pod, and writes the vLLM container's env and
the volume mounted at its ``PROMETHEUS_MULTIPROC_DIR``, its ``args``, and the vLLM plugin
ConfigMap's files (the L2 gate). Nothing LMCache reads is typed here:
every value comes from the rendered objects. It also writes, for every LMCache series the
dashboards and alerts of the same config select, the label matchers they select it with (the
scrape's own target labels left out), so the tier can check LMCache's exposition against them; and, for the fault tier (tests_faults/),
each line's rendered ``janitor.json``, the FUSE operation bound of the StorageClass's Curvine client
settings, LMCache's lookup and blocking timeouts, and the L2 mount watchdog's ``watchdog.json``.

Usage::

    .venv/bin/python -m tests_lmcache.export_env --out build/lmcache-tier/env.json [--pods 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from k8s import canary as canary_chart
from k8s import janitor, mount_watchdog, names, vllm_plugins
from k8s.curvine_config import fuse_master_op_bound_ms
from k8s.lmcache import LMCACHE_CONFIG_KEYS, LMCACHE_VERSION, l2_fault_timeouts
from k8s.patch import L2_MOUNT_PATH, L2_REMOTE_URL
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from observability import alerts, dashboards, targets
from platform_config import ProjectConfig, load_project
from platform_config.vllm_args import TENSOR_PARALLEL_FLAG, parallel_sizes
from tests.example_config import FIXTURE_CONFIG, copy_example_config, edit_yaml
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.operator_render import pod
from tests.observability.conftest import panel_targets, selectors
from tests.observability.test_promql import TARGET_LABELS

#: Name under which the changed-model variant of rag-assistant is exported.
CHANGED_MODEL_LINE = "rag-assistant@fine-tuned"
VOLUME_ID = "vol-0a1b2c3d4e5f60718"
ZONE = "us-west-2a"


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def _one_named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _metrics_dir(admitted: dict[str, Any], vllm: dict[str, Any]) -> dict[str, Any] | None:
    """The vLLM container's ``PROMETHEUS_MULTIPROC_DIR`` and the pod volume mounted there (None if either is missing)."""
    path = next((e.get("value") for e in vllm.get("env") or [] if e["name"] == "PROMETHEUS_MULTIPROC_DIR"), None)
    mounts = [m for m in vllm.get("volumeMounts") or [] if m["mountPath"] == path]
    if path is None or len(mounts) != 1:
        return None
    volumes = [v for v in admitted["spec"].get("volumes") or [] if v["name"] == mounts[0]["name"]]
    return {"mount_path": path, "volume": volumes[0] if len(volumes) == 1 else None}


def lmcache_selections(project: ProjectConfig) -> dict[str, list[dict[str, list[str]]]]:
    """Series name -> the label matchers ({label: [op, value]}) of every selector of it in the
    dashboard and the alerts of ``project``, without the scrape's target labels (job, pod...)."""
    exprs = [e for _, e in panel_targets(dashboards.build_dashboard(project.platform, project.business_lines))]
    exprs += [a.expr for a in alerts.all_alerts(project.platform, project.business_lines)]
    out: dict[str, list[dict[str, list[str]]]] = {}
    for expr in exprs:
        for name, matchers in selectors(expr):
            if name.startswith("lmcache:"):
                own = {k: list(v) for k, v in matchers.items() if k not in TARGET_LABELS}
                if own not in out.setdefault(name, []):
                    out[name].append(own)
    return out


def scrape_meta(namespace: str, labels: dict[str, str], port: dict[str, Any]) -> dict[str, str]:
    """The ``__meta_kubernetes_*`` labels Kubernetes pod discovery gives a Running pod's port, from
    the pod's labels and one container port (pod and node names are the live harness's)."""
    meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_phase": "Running",
            "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
            "__meta_kubernetes_pod_container_port_name": port.get("name", "")}
    meta.update({targets.meta_label(k): v for k, v in labels.items()})
    return meta


def _template(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj["spec"]["template"]


def export_project(project: ProjectConfig, pods: int, seed_base: int) -> dict[str, Any]:
    """Per line: the env of ``pods`` admitted Pods and the engine facts of its rendered endpoint."""
    manifests = render_manifests(project, volume_id=VOLUME_ID, availability_zone=ZONE, scaling=project_scaling(project))
    out: dict[str, Any] = {}
    for line in project.business_lines:
        if not line.cache.l2_enabled:
            continue
        objects = manifests[names.line_chart_name(line)]
        policy = _one(objects, "Policy")
        worker = _one(objects, "InferenceEndpointConfig")["spec"]["worker"]
        envs, metrics_dirs, args = [], [], []
        for k in range(pods):
            admitted = apply_policy(policy, pod(line), seed=seed_base + k)
            (vllm,) = [c for c in admitted["spec"]["containers"]
                       if any(p.get("containerPort") == worker["modelInvocationPort"]["containerPort"]
                              for p in c.get("ports") or [])]
            envs.append({e["name"]: e["value"] for e in vllm["env"] if "value" in e})
            args.append(vllm.get("args") or [])
            metrics_dirs.append(_metrics_dir(admitted, vllm))
        meta = {targets.JOB_VLLM: scrape_meta(line.namespace, admitted["metadata"].get("labels") or {},
                                              worker["modelInvocationPort"])}
        for job, kind_name in ((targets.JOB_L2_JANITOR, names.L2_JANITOR), (targets.JOB_KV_CANARY, names.KV_CANARY)):
            if any(o["kind"] == "Deployment" and o["metadata"]["name"] == kind_name for o in objects):
                template = _template(objects, "Deployment", kind_name)
                (container,) = template["spec"]["containers"]
                meta[job] = scrape_meta(line.namespace, template["metadata"]["labels"], container["ports"][0])
        if any(m != metrics_dirs[0] for m in metrics_dirs):
            raise AssertionError(f"{line.name}: the metrics directory differs between admitted pods: {metrics_dirs}")
        janitor_cms = [o for o in objects if o["kind"] == "ConfigMap" and janitor.CONFIG_FILE in (o.get("data") or {})]
        if any(a != args[0] for a in args):
            raise AssertionError(f"{line.name}: the vLLM args differ between admitted pods: {args}")
        out[line.name] = {
            "envs": envs,
            # The vLLM container's args after the operator and the admission policy (the serving
            # tier starts vLLM with them: tests_serving/).
            "args": args[0],
            # The vLLM plugin ConfigMap as rendered (the L2 gate) and where the pods mount it.
            "vllm_plugins": {"dir": vllm_plugins.PLUGIN_DIR,
                             "files": _one_named(objects, "ConfigMap", names.VLLM_PLUGINS)["data"]},
            # The janitor.json the line's chart renders (its ConfigMap), for the fault tier.
            "janitor_config": json.loads(janitor_cms[0]["data"][janitor.CONFIG_FILE]) if janitor_cms else None,
            "metrics_dir": metrics_dirs[0],
            # What vLLM puts in LMCache's engine metadata: the model *path* it was started with
            # (first worker arg), the world size, the model dtype (docs/l2-cache.md).
            "engine": {"model_name": worker["args"][0], "world_size": parallel_sizes(worker["args"]).get(TENSOR_PARALLEL_FLAG, 1),
                       "dtype": line.model.dtype},
            "lmcache_release": line.vllm.lmcache_release,
            "model": line.model.name,
            "namespace": line.namespace,
            # What the live Prometheus and the canary of the tier are given, as rendered.
            "scrape_meta": meta,
            "canary_config": canary_chart.canary_config(line) if canary_chart.enabled(project.platform, line) else None,
            # The janitor ConfigMap's hot_prefixes.json and the prefix text files it names, as rendered.
            "hot_prefixes": ({k: v for k, v in janitor_cms[0]["data"].items()
                              if k == janitor.HOT_PREFIX_CONFIG_FILE or k.startswith("prefix-")}
                             if janitor_cms and janitor.HOT_PREFIX_CONFIG_FILE in janitor_cms[0]["data"] else None),
        }
    return out


def _watchdog_meta(curvine_objects: list[dict[str, Any]], project: ProjectConfig) -> dict[str, str] | None:
    daemonsets = [o for o in curvine_objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == names.L2_MOUNT_WATCHDOG]
    if not daemonsets:
        return None
    template = daemonsets[0]["spec"]["template"]
    (container,) = [c for c in template["spec"]["containers"] if c.get("ports")]
    return scrape_meta(project.platform.curvine.namespace, template["metadata"]["labels"], container["ports"][0])


def export(pods: int = 4) -> dict[str, Any]:
    """The whole document written by :func:`main`."""
    project = load_project(FIXTURE_CONFIG)
    lines = export_project(project, pods, seed_base=100)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = copy_example_config(Path(tmp) / "config")

        def fine_tune(d: dict[str, Any]) -> None:
            d["model"]["name"] = "Qwen2-7B-Instruct-ft-v2"
            d["model"]["source"]["location"] = "qwen2-7b-instruct-ft-v2"

        edit_yaml(cfg / "business-lines" / "rag-assistant.yaml", fine_tune)
        changed = export_project(load_project(cfg), pods, seed_base=200)
    lines[CHANGED_MODEL_LINE] = changed["rag-assistant"]
    curvine_objects = render_manifests(project, volume_id=VOLUME_ID, availability_zone=ZONE, scaling=project_scaling(project))["curvine"]
    watchdog_cms = [o for o in curvine_objects
                    if o["kind"] == "ConfigMap" and mount_watchdog.CONFIG_FILE in (o.get("data") or {})]
    return {
        "lmcache_version": LMCACHE_VERSION,
        # The hot-spot alert's factor (a replica above it x its fair share of the prompt tokens), for
        # the serving tier's routing tests.
        "hot_spot_factor": alerts.HOT_SPOT_FACTOR,
        # The longest a FUSE operation waits on an absent Curvine Primary with the StorageClass's
        # client settings: what the fault tier's ``hang`` models (tests_faults/faultfs.py).
        "fuse_master_op_bound_ms": fuse_master_op_bound_ms(),
        "lmcache_timeouts": l2_fault_timeouts(project.platform),
        # The L2 mount watchdog's rendered watchdog.json (issue 15 item 2), for the fault tier.
        "mount_watchdog_config": (json.loads(watchdog_cms[0]["data"][mount_watchdog.CONFIG_FILE])
                                  if watchdog_cms else None),
        "config_keys": sorted(LMCACHE_CONFIG_KEYS),
        "l2_mount_path": L2_MOUNT_PATH,
        "l2_root_url": L2_REMOTE_URL,
        "lines": lines,
        "lmcache_selections": lmcache_selections(project),
        # The L2 mount watchdog's pod as Kubernetes pod discovery labels it (its scrape job's view).
        "mount_watchdog_scrape_meta": _watchdog_meta(curvine_objects, project),
        # The rule file the observability stack sends to AMP and the scraper's configuration.
        "rule_file": alerts.rule_groups_yaml(project.platform, project.business_lines),
        "scrape_config": targets.scrape_configuration(project.platform, project.business_lines),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests_lmcache.export_env", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pods", type=int, default=4, help="admitted Pods per line (distinct temp dirs)")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(export(args.pods), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
