"""Post-deploy checks on objects built from our own synthesized manifests, and on broken copies.

The inference pods are made the way they appear on a cluster: the synthesized
InferenceEndpointConfig becomes the Deployment the operator renders (vLLM container exposing
``worker.modelInvocationPort``, the worker env plus the operator's own
``LMCACHE_REMOTE_URL=sagemaker-hyperpod://$(NODE_IP):9200``), the line's RFC 6902 patch is
applied to it, and each replica is a pod of that template. No cluster, no AWS: a fake reader.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable

import jsonpatch
import pytest

from tests.tools.script_loader import load_script
from k8s import names
from k8s.patch import L2_MOUNT_PATH, endpoint_json_patch, line_cache_env, line_remote_url, owned_volumes
from k8s.render import CURVINE_CHART, render_manifests
from observability.autoscaling import project_scaling
import operator_tools.verify as verify_mod
from operator_tools.verify import (
    OWN_ROWS,
    TMP_DIR_KEY,
    check_cross_pod_hit,
    check_inference_pods,
    cross_pod_probe,
    format_results,
    parse_hit_tokens,
    verify,
)
from platform_config import ProjectConfig, load_project
from platform_config.line_models import LineGatewayConfig
from tests.example_config import FIXTURE_CONFIG
from tests.k8s.operator_render import OPERATOR_KV_TRANSFER, operator_args

REPO = Path(__file__).resolve().parents[2]
PROJECT = load_project(FIXTURE_CONFIG)
PLATFORM = PROJECT.platform
RAG = PROJECT.business_line("rag-assistant")
OPERATOR_URL = "sagemaker-hyperpod://$(NODE_IP):9200"
OPERATOR_EXTRA = json.dumps({"sagemaker_hyperpod_bucket": "lmcache",
                             "sagemaker_hyperpod_shared_memory_name": "ai_toolkit_cache"})
#: The operator's sidecars (same layout as tests/k8s/operator_render.py): checks must look at the
#: vLLM container only, whatever env a sidecar carries.
SIDECARS = [
    {"name": "reverse-proxy", "image": "public.ecr.aws/example/reverse-proxy:1.0.0",
     "ports": [{"containerPort": 8081, "name": "proxy"}],
     "env": [{"name": "LMCACHE_REMOTE_URL", "value": "untouched-sidecar"}]},
    {"name": "otel-collector", "image": "public.ecr.aws/example/otel-collector:1.0.0",
     "volumeMounts": [{"name": "otel-config", "mountPath": "/etc/otel"}]},
]
NODES = ("hyperpod-i-0a", "hyperpod-i-0b", "hyperpod-i-0c")


@pytest.fixture(scope="session")
def synthesized() -> dict[str, list[dict]]:
    return render_manifests(PROJECT, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(PROJECT))


def operator_deployment(iec: dict[str, Any]) -> dict[str, Any]:
    """The Deployment the HyperPod inference operator renders from an InferenceEndpointConfig:
    the vLLM container first (named after the endpoint, exposing the invocation port), the
    operator's LMCache env, then the CR's ``worker.environmentVariables``, then the sidecars."""
    spec, meta = iec["spec"], iec["metadata"]
    worker = spec["worker"]
    env = [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    if spec["kvCacheSpec"].get("enableL2Cache"):
        env += [{"name": "LMCACHE_REMOTE_URL", "value": OPERATOR_URL},
                {"name": "LMCACHE_EXTRA_CONFIG", "value": OPERATOR_EXTRA}]
    if spec["kvCacheSpec"].get("enableL1Cache", True):
        env += [{"name": "LMCACHE_LOCAL_CPU", "value": "True"}]
    env += copy.deepcopy(worker.get("environmentVariables", []))
    container = {
        "name": meta["name"], "image": worker["image"],
        # The operator adds LMCache's connector to the CR's args (tests/k8s/operator_render.py).
        "args": [*worker.get("args", []), "--kv-transfer-config", OPERATOR_KV_TRANSFER],
        "ports": [{"containerPort": worker["modelInvocationPort"]["containerPort"],
                   "name": worker["modelInvocationPort"]["name"]}],
        "env": env, "resources": worker["resources"],
        "volumeMounts": [{"name": worker["modelVolumeMount"]["name"],
                          "mountPath": worker["modelVolumeMount"]["mountPath"]}],
    }
    labels = {names.OPERATOR_POD_LABEL: meta["name"]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"replicas": spec.get("replicas", 1), "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container] + SIDECARS,
                                           "volumes": [{"name": worker["modelVolumeMount"]["name"], "emptyDir": {}},
                                                       {"name": "otel-config", "emptyDir": {}}]}}}}


def pods_of(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """One Running, Ready pod per replica, each on its own node."""
    template = deployment["spec"]["template"]
    out = []
    for i in range(deployment["spec"]["replicas"]):
        spec = copy.deepcopy(template["spec"])
        spec["nodeName"] = NODES[i % len(NODES)]
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{deployment['metadata']['name']}-5f7d8-{i}",
                                 "uid": f"uid-{deployment['metadata']['name']}-{i}",
                                 "namespace": deployment["metadata"]["namespace"],
                                 "labels": dict(template["metadata"]["labels"])},
                    "spec": spec,
                    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    return out


def find(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (hit,) = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return hit


class FakeReader:
    """The cluster and AWS as plain dicts: what :class:`operator_tools.verify.LiveReader` would return."""

    def __init__(self, describe: dict | None, objects: list[dict]) -> None:
        self.describe = describe
        self.objects = objects
        self.posts: list[tuple[str, dict]] = []
        self.log = "INFO LMCache hit tokens: 1792, need to load: 1792\n"
        self.watchdog_reports: dict[str, Any] = {}
        #: Each vLLM pod's vllm:prompt_tokens_total (default 500,000: every replica alike); None: no counter.
        self.prompt_tokens: dict[str, float | None] = {}

    def describe_cluster(self, name: str) -> dict | None:
        assert name == PLATFORM.hyperpod.cluster_name
        return self.describe

    def _match(self, kind: str, namespace: str | None) -> list[dict]:
        return [o for o in self.objects
                if o["kind"] == kind and (namespace is None or o["metadata"].get("namespace") == namespace)]

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        hits = [o for o in self._match(kind, namespace) if o["metadata"]["name"] == name]
        return copy.deepcopy(hits[0]) if hits else None

    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None) -> list[dict]:
        out = self._match(kind, namespace)
        if label_selector:
            key, _, value = label_selector.partition("=")
            out = [o for o in out if o["metadata"].get("labels", {}).get(key) == value]
        return copy.deepcopy(out)

    def pod_get(self, namespace: str, pod: str, port: int, path: str) -> Any:
        if namespace == PLATFORM.curvine.namespace:  # an L2 mount watchdog's last pass
            assert (path, port) == ("mounts", 9101)
            return copy.deepcopy(self.watchdog_reports[pod])
        assert (path, port) == ("v1/models", 8000)
        return {"data": [{"id": "/opt/ml/model"}]}

    def pod_text(self, namespace: str, pod: str, port: int, path: str) -> str:
        assert (path, port) == ("metrics", 8000)
        tokens = self.prompt_tokens.get(pod, 500_000.0)
        return ("# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
                "# TYPE vllm:prompt_tokens_total counter\n"
                f'vllm:prompt_tokens_total{{engine="0",model_name="/opt/ml/model"}} {tokens}\n' if tokens is not None
                else "# no vLLM counters\n")

    def pod_post(self, namespace: str, pod: str, port: int, path: str, body: dict) -> Any:
        self.posts.append((pod, body))
        return {"choices": [{"text": "x"}]}

    def pod_log(self, namespace: str, pod: str, container: str, since_seconds: int) -> str:
        assert container == RAG.name and since_seconds > 0
        return self.log


@pytest.fixture
def cluster(synthesized: dict[str, list[dict]]) -> FakeReader:
    """A healthy deployment of the example config, as the cluster would report it."""
    curvine = copy.deepcopy(synthesized[CURVINE_CHART])
    objects: list[dict] = []
    for obj in curvine:
        if obj["kind"] == "StatefulSet":
            obj["status"] = {"readyReplicas": obj["spec"]["replicas"]}
        elif obj["kind"] == "DaemonSet":
            obj["status"] = {"desiredNumberScheduled": 3, "numberReady": 3, "updatedNumberScheduled": 3}
        objects.append(obj)
    objects.append({"kind": "DaemonSet", "metadata": {"name": "hyperpod-ai-toolkit", "namespace": "aws-hyperpod"},
                    "status": {"desiredNumberScheduled": 3, "numberReady": 3, "updatedNumberScheduled": 3}})
    objects += [{"kind": "CSINode", "metadata": {"name": n},
                 "spec": {"drivers": [{"name": "ebs.csi.aws.com"}, {"name": names.CSI_DRIVER_NAME}]}} for n in NODES]
    for line in PROJECT.business_lines:
        chart = copy.deepcopy(synthesized[names.line_chart_name(line)])
        deployment = operator_deployment(find(chart, "InferenceEndpointConfig"))
        if line.cache.l2_enabled:  # a line without L2 has no PVC and is not patched
            pvc = find(chart, "PersistentVolumeClaim")
            pvc["status"] = {"phase": "Bound"}
            objects.append(pvc)
            deployment = jsonpatch.apply_patch(deployment, endpoint_json_patch(PLATFORM, line, deployment=deployment))
        objects += pods_of(deployment)
    describe = {"ClusterName": PLATFORM.hyperpod.cluster_name, "ClusterStatus": "InService",
                "TieredStorageConfig": {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}}
    reader = FakeReader(describe, objects)
    # One L2 mount watchdog per node, its last pass seeing every L2 pod of its node alive.
    for node in NODES:
        name = f"{names.L2_MOUNT_WATCHDOG}-{node[-2:]}"
        objects.append({"kind": "Pod", "metadata": {"name": name, "namespace": PLATFORM.curvine.namespace,
                                                    "labels": {"app.kubernetes.io/name": names.L2_MOUNT_WATCHDOG}},
                        "spec": {"nodeName": node}, "status": {"phase": "Running"}})
        mounts = [{"namespace": p["metadata"]["namespace"], "pod": p["metadata"]["name"], "pod_uid": p["metadata"]["uid"],
                   "volume": "pvc-1", "state": "alive", "reason": "statvfs answered", "action": ""}
                  for p in objects if p["kind"] == "Pod" and p["spec"].get("nodeName") == node
                  and any(v.get("persistentVolumeClaim") for v in p["spec"].get("volumes", []))]
        reader.watchdog_reports[name] = {"node": node, "mounts": mounts, "api_errors": []}
    return reader


def rag_pods(reader: FakeReader) -> list[dict]:
    return [o for o in reader.objects if o["kind"] == "Pod" and o["metadata"]["namespace"] == RAG.namespace]


def vllm(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


def failed(results) -> list[str]:
    return [r.name for r in results if not r.ok]


def test_the_synthesized_deployment_passes_every_check(cluster: FakeReader) -> None:
    results = verify(cluster, PROJECT)
    assert failed(results) == [], format_results(results)
    by_name = {r.name: r for r in results}
    assert {"Tiered Storage", "ai-toolkit DaemonSet", "Curvine Primary ready", "Curvine Workers ready",
            "CSI driver registered", "L2 mount watchdog ready", "rag-assistant: L2 mounts alive",
            "rag-assistant: PVC Bound", "rag-assistant: LMCACHE_REMOTE_URL",
            "rag-assistant: L2 mount", "rag-assistant: PYTHONHASHSEED shared",
            "research-reasoning: PVC Bound"} <= set(by_name)
    assert by_name["rag-assistant: LMCACHE_REMOTE_URL"].detail == f"exactly one, {line_remote_url(PLATFORM, RAG)}, in 2 pod(s)"
    assert by_name["rag-assistant: PYTHONHASHSEED shared"].detail == "0 in all 2 pod(s)"
    assert by_name["rag-assistant: L2 mounts alive"].detail == (
        "alive in all 2 pod(s), per the L2 mount watchdog on 2 node(s)")


def _set_env(pod: dict, name: str, value: str) -> None:
    for entry in vllm(pod)["env"]:
        if entry["name"] == name:
            entry["value"] = value


def _break_mount(r: FakeReader) -> None:
    pod = rag_pods(r)[1]
    vllm(pod)["volumeMounts"] = [m for m in vllm(pod)["volumeMounts"] if m["mountPath"] != L2_MOUNT_PATH]


def _duplicate_url(r: FakeReader) -> None:
    vllm(rag_pods(r)[0])["env"].append({"name": "LMCACHE_REMOTE_URL", "value": OPERATOR_URL})


def _daemonset(r: FakeReader, name: str) -> dict:
    return next(o for o in r.objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == name)


BREAKAGES: dict[str, tuple[Callable[[FakeReader], None], str]] = {
    "tiered storage off": (lambda r: r.describe["TieredStorageConfig"].update(Mode="Disable"), "Tiered Storage"),
    "tiered storage share drifted": (
        lambda r: r.describe["TieredStorageConfig"].update(InstanceMemoryAllocationPercentage=40), "Tiered Storage"),
    "cluster updating": (lambda r: r.describe.update(ClusterStatus="Updating"), "HyperPod cluster"),
    "ai-toolkit not ready": (lambda r: _daemonset(r, "hyperpod-ai-toolkit")["status"].update(numberReady=2),
                             "ai-toolkit DaemonSet"),
    "ai-toolkit missing": (lambda r: r.objects.remove(_daemonset(r, "hyperpod-ai-toolkit")), "ai-toolkit DaemonSet"),
    "primary down": (lambda r: find(r.objects, "StatefulSet", names.CURVINE_MASTER)["status"].update(readyReplicas=0),
                     "Curvine Primary ready"),
    "a worker down": (lambda r: _daemonset(r, names.CURVINE_WORKER)["status"].update(numberReady=2),
                      "Curvine Workers ready"),
    "csi driver missing": (lambda r: r.objects.remove(find(r.objects, "CSIDriver")), "CSI driver registered"),
    "csi not registered on a node": (
        lambda r: find(r.objects, "CSINode", NODES[2])["spec"].update(drivers=[]), "CSI driver registered"),
    "pvc pending": (lambda r: find(r.objects, "PersistentVolumeClaim", names.pvc_name(RAG))["status"].update(
        phase="Pending"), "rag-assistant: PVC Bound"),
    "mount dropped": (_break_mount, "rag-assistant: L2 mount"),
    "url duplicated": (_duplicate_url, "rag-assistant: LMCACHE_REMOTE_URL"),
    "url without host": (lambda r: _set_env(rag_pods(r)[0], "LMCACHE_REMOTE_URL", "fs:///mnt/curvine/l2cache/"),
                         "rag-assistant: LMCACHE_REMOTE_URL"),
    "hash seeds differ": (lambda r: _set_env(rag_pods(r)[1], "PYTHONHASHSEED", "42"),
                          "rag-assistant: PYTHONHASHSEED shared"),
    "cachegen serde": (lambda r: _set_env(rag_pods(r)[0], "LMCACHE_REMOTE_SERDE", "cachegen"),
                       "rag-assistant: LMCache env"),
    "kv load failure policy fail": (
        lambda r: vllm(rag_pods(r)[0]).update(args=operator_args(RAG)), "rag-assistant: vLLM KV transfer config"),
    "kv transfer appended, connector dropped": (
        lambda r: vllm(rag_pods(r)[1])["args"].extend(["--kv-transfer-config", '{"kv_load_failure_policy":"recompute"}']),
        "rag-assistant: vLLM KV transfer config"),
    "pod not ready": (lambda r: rag_pods(r)[0]["status"].update(conditions=[{"type": "Ready", "status": "False"}]),
                      "rag-assistant: inference pods Ready"),
    "a dead L2 mount": (lambda r: _mount_state(r, "dead", "ENOTCONN: its FUSE session is gone"),
                        "rag-assistant: L2 mounts alive"),
    "a hung L2 mount": (lambda r: _mount_state(r, "hung", "statvfs did not answer within 10 s"),
                        "rag-assistant: L2 mounts alive"),
    "watchdog not ready": (lambda r: _daemonset(r, names.L2_MOUNT_WATCHDOG)["status"].update(numberReady=2),
                           "L2 mount watchdog ready"),
}


def _watchdog_pod(r: FakeReader, node: str) -> dict:
    return next(o for o in r.objects if o["kind"] == "Pod" and o["metadata"]["name"].startswith(names.L2_MOUNT_WATCHDOG)
                and o["spec"]["nodeName"] == node)


def _mount_state(r: FakeReader, state: str, reason: str) -> None:
    pod = rag_pods(r)[1]
    report = r.watchdog_reports[_watchdog_pod(r, pod["spec"]["nodeName"])["metadata"]["name"]]
    [m] = [m for m in report["mounts"] if m["pod_uid"] == pod["metadata"]["uid"]]
    m.update(state=state, reason=reason, action="evicted" if state == "dead" else "")


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_each_breakage_fails_exactly_its_check(cluster: FakeReader, breakage: str) -> None:
    mutate, check = BREAKAGES[breakage]
    mutate(cluster)
    assert failed(verify(cluster, PROJECT)) == [check]


def test_the_unpatched_operator_deployment_fails_url_and_mount(synthesized) -> None:
    iec = find(synthesized[names.line_chart_name(RAG)], "InferenceEndpointConfig")
    results = check_inference_pods(RAG, pods_of(operator_deployment(iec)), platform=PLATFORM)
    # Never mutated: no L2 mutation label either (issue 8: verify reports such pods), and only the
    # two cache settings the CR carries (LMCACHE_REMOTE_SERDE, PYTHONHASHSEED).
    assert failed(results) == ["rag-assistant: L2 mutation", "rag-assistant: LMCACHE_REMOTE_URL",
                               "rag-assistant: LMCache env", "rag-assistant: vLLM KV transfer config",
                               "rag-assistant: L2 mount"]
    # vLLM's default policy, in both pods: every L2 read fault would fail a request.
    assert next(r.detail for r in results if r.name.endswith("KV transfer config")).count(
        "kv_load_failure_policy is None, not 'recompute'") == 2
    env_detail = next(r.detail for r in results if r.name.endswith("LMCache env"))
    assert "LMCACHE_SAVE_UNFULL_CHUNK: 0 entries" in env_detail and "DO_NOT_TRACK: 0 entries" in env_detail
    assert "LMCACHE_REMOTE_SERDE" not in env_detail
    assert OPERATOR_URL in next(r.detail for r in results if r.name.endswith("LMCACHE_REMOTE_URL"))
    assert "delete them" in next(r.detail for r in results if r.name.endswith("L2 mutation"))


def test_a_patch_that_only_appends_leaves_a_duplicate_url(synthesized) -> None:
    iec = find(synthesized[names.line_chart_name(RAG)], "InferenceEndpointConfig")
    deployment = operator_deployment(iec)
    appended = jsonpatch.apply_patch(deployment, endpoint_json_patch(PLATFORM, RAG))  # no live Deployment given
    results = check_inference_pods(RAG, pods_of(appended), platform=PLATFORM)
    # The reference-only variant does not label the pods either, and leaves the operator's
    # LMCACHE_EXTRA_CONFIG and the CR's LMCACHE_REMOTE_SERDE / PYTHONHASHSEED beside ours.
    assert failed(results) == ["rag-assistant: L2 mutation", "rag-assistant: LMCACHE_REMOTE_URL",
                               "rag-assistant: LMCache env", "rag-assistant: PYTHONHASHSEED shared"]
    assert "2 entries" in next(r.detail for r in results if r.name.endswith("LMCACHE_REMOTE_URL"))
    env_detail = next(r.detail for r in results if r.name.endswith("LMCache env"))
    assert "LMCACHE_EXTRA_CONFIG: 2 entries" in env_detail and "LMCACHE_REMOTE_SERDE: 2 entries" in env_detail


def test_no_pods_is_a_failure(cluster: FakeReader) -> None:
    cluster.objects = [o for o in cluster.objects if o["kind"] != "Pod"]
    results = verify(cluster, PROJECT, lines=["rag-assistant"], platform_checks=False)
    assert failed(results) == ["rag-assistant: inference pods"]


def test_missing_cluster_and_line_selection(cluster: FakeReader) -> None:
    cluster.describe = None
    results = verify(cluster, PROJECT, lines=["research-reasoning"])
    assert failed(results) == ["HyperPod cluster"]
    assert not any(r.name.startswith("rag-assistant") for r in results)
    with pytest.raises(KeyError):
        verify(cluster, PROJECT, lines=["nope"])


def test_cross_pod_probe_sends_the_same_fresh_prompt_to_two_nodes(cluster: FakeReader) -> None:
    pods = rag_pods(cluster)
    result = cross_pod_probe(cluster, RAG, pods, settle_s=0)
    assert result.ok and result.detail == f"1792 tokens of {pods[0]['metadata']['name']}'s prompt hit in " \
                                          f"{pods[1]['metadata']['name']}"
    (a, body_a), (b, body_b) = cluster.posts
    assert (a, b) == (pods[0]["metadata"]["name"], pods[1]["metadata"]["name"]) and body_a == body_b
    assert body_a["model"] == "/opt/ml/model" and len(body_a["prompt"].split()) > 2 * 256
    cross_pod_probe(cluster, RAG, pods, settle_s=0)
    assert cluster.posts[2][1]["prompt"] != body_a["prompt"]  # a new nonce every run: never a stale hit


@pytest.mark.parametrize("log, ok", [("LMCache hit tokens: 0\n", False), ("loaded model\n", False),
                                     ("LMCache hit tokens: 0\nLMCache hit tokens: 512\n", True)])
def test_cross_pod_hit_reads_the_last_hit_line(log: str, ok: bool) -> None:
    assert check_cross_pod_hit(RAG, "a", "b", log).ok is ok
    assert parse_hit_tokens("x LMCache hit tokens: 7 y") == 7


def test_cross_pod_needs_two_ready_pods(cluster: FakeReader) -> None:
    assert not cross_pod_probe(cluster, RAG, rag_pods(cluster)[:1], settle_s=0).ok


def test_cross_pod_transport_errors_are_failed_checks(cluster: FakeReader) -> None:
    def boom(*args: Any) -> Any:
        raise ConnectionError("proxy refused")

    cluster.pod_post = boom  # type: ignore[method-assign]
    results = verify(cluster, PROJECT, lines=["rag-assistant"], cross_pod=True, platform_checks=False)
    assert failed(results) == ["rag-assistant: cross-pod hit"]
    assert "proxy refused" in results[-1].detail


def test_cli_table_json_and_exit_codes(cluster: FakeReader, capsys) -> None:
    verify_cli = load_script("verify")
    factory = lambda region, context=None: cluster  # noqa: E731
    assert verify_cli.main(["--config", str(FIXTURE_CONFIG)], reader_factory=factory) == 0
    out = capsys.readouterr().out
    assert "PASS  Tiered Storage" in out and "0 failing" in out
    BREAKAGES["hash seeds differ"][0](cluster)
    assert verify_cli.main(["--config", str(FIXTURE_CONFIG), "--json"], reader_factory=factory) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows if not r["ok"]] == ["rag-assistant: PYTHONHASHSEED shared"]

    def unreachable(region: str, context: str | None = None) -> Any:
        raise RuntimeError("no kubeconfig")

    assert verify_cli.main(["--config", str(FIXTURE_CONFIG)], reader_factory=unreachable) == 2
    assert verify_cli.main(["--config", str(FIXTURE_CONFIG), "--line", "nope"], reader_factory=factory) == 2


#: The RBAC rule (verb, resource) each call of :class:`operator_tools.verify.LiveReader` needs.
RBAC = {
    ("get", "DaemonSet"): "get apps/daemonsets", ("list", "DaemonSet"): "list apps/daemonsets",
    ("get", "StatefulSet"): "get apps/statefulsets", ("get", "Deployment"): "get apps/deployments",
    ("get", "PersistentVolumeClaim"): "get persistentvolumeclaims", ("list", "Pod"): "list pods",
    ("get", "CSIDriver"): "get storage.k8s.io/csidrivers", ("list", "CSINode"): "list storage.k8s.io/csinodes",
    ("pod_get", None): "get pods/proxy", ("pod_post", None): "create pods/proxy", ("pod_log", None): "get pods/log",
    ("pod_text", None): "get pods/proxy",
    ("get", "InferenceGatewayConfig"): "get inference.sagemaker.aws.amazon.com/inferencegatewayconfigs",
}


class RecordingReader:
    """Wraps a reader and records the AWS action or Kubernetes RBAC rule each call needs."""

    def __init__(self, inner: FakeReader) -> None:
        self.inner, self.calls = inner, set()

    def describe_cluster(self, name: str) -> Any:
        self.calls.add("sagemaker:DescribeCluster")
        return self.inner.describe_cluster(name)

    def get(self, kind: str, namespace: str | None, name: str) -> Any:
        self.calls.add(RBAC[("get", kind)])
        return self.inner.get(kind, namespace, name)

    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None) -> Any:
        self.calls.add(RBAC[("list", kind)])
        return self.inner.list(kind, namespace, label_selector)

    def __getattr__(self, method: str) -> Any:  # pod_get, pod_post, pod_log
        self.calls.add(RBAC[(method, None)])
        return getattr(self.inner, method)


def test_verify_permissions_in_the_docs_are_the_calls_it_makes(cluster: FakeReader, monkeypatch) -> None:
    monkeypatch.setattr("operator_tools.verify.time.sleep", lambda seconds: None)  # the probe's settle time
    doc = (REPO / "docs" / "operator-tools.md").read_text()
    section = doc[doc.index("### Permissions each tool needs"):]
    (row,) = [line for line in section[:section.index("\n#")].splitlines() if line.startswith("| `scripts/verify.py`")]
    reader = RecordingReader(cluster)
    verify(reader, PROJECT, cross_pod=True)
    gateway_reader = RecordingReader(gateway_cluster(cluster))
    verify(gateway_reader, GATEWAY_PROJECT)  # a gateway line's settings
    reader.calls |= gateway_reader.calls
    documented = set(re.findall(r"`(sagemaker:[A-Za-z]+|(?:get|list|create) [a-z0-9./]+)`", row))
    assert reader.calls == documented, row


# --- the whole cache env of the policy, from line_cache_env (never retyped) ---------------------

#: Entries of line_cache_env the "LMCache env" row compares: all but those with a row of their own.
COMPARED = [n for n in line_cache_env(PLATFORM, RAG) if n not in OWN_ROWS]


def _env_rows(pods: list[dict], project=PROJECT, line=RAG) -> dict[str, Any]:
    return {r.name: r for r in check_inference_pods(line, pods, platform=project.platform)}


def test_every_policy_entry_is_compared() -> None:
    """The rows together cover every entry of the policy's env, including the settings the review
    found unchecked (save_unfull_chunk, the hash algorithm, the telemetry opt-outs, extra_config)."""
    assert set(COMPARED) | OWN_ROWS == set(line_cache_env(PLATFORM, RAG))
    assert {"LMCACHE_REMOTE_SERDE", "LMCACHE_SAVE_UNFULL_CHUNK", "LMCACHE_PRE_CACHING_HASH_ALGORITHM",
            "LMCACHE_EXTRA_CONFIG", "LMCACHE_CHUNK_SIZE", "LMCACHE_TRACK_USAGE", "DO_NOT_TRACK"} <= set(COMPARED)


def test_the_env_row_names_what_it_compared(cluster: FakeReader) -> None:
    row = _env_rows(rag_pods(cluster))["rag-assistant: LMCache env"]
    assert row.ok and row.detail == f"{len(COMPARED)} variables as configured ({', '.join(COMPARED)}) in 2 pod(s)"


def _other_value(name: str, value: str) -> str:
    if name == "LMCACHE_EXTRA_CONFIG":  # any key but the per-pod temp directory counts
        return json.dumps({**json.loads(value), "save_chunk_meta": False})
    return {"false": "true", "true": "false", "1": "0"}.get(value, value + "0")


@pytest.mark.parametrize("name", COMPARED)
@pytest.mark.parametrize("how", ["changed", "missing", "duplicated"])
def test_each_entry_of_the_policy_env_is_checked(cluster: FakeReader, name: str, how: str) -> None:
    pod = rag_pods(cluster)[1]
    env = vllm(pod)["env"]
    (entry,) = [e for e in env if e["name"] == name]
    if how == "changed":
        entry["value"] = _other_value(name, entry["value"])
    elif how == "missing":
        env.remove(entry)
    else:
        env.append(dict(entry))
    results = verify(cluster, PROJECT, lines=["rag-assistant"], platform_checks=False)
    assert failed(results) == ["rag-assistant: LMCache env"]
    detail = next(r.detail for r in results if not r.ok)
    assert detail.startswith(f"{pod['metadata']['name']}: {name}")


def test_extra_config_is_compared_as_json_but_the_temp_token_is_free(cluster: FakeReader) -> None:
    pods = rag_pods(cluster)
    (entry,) = [e for e in vllm(pods[0])["env"] if e["name"] == "LMCACHE_EXTRA_CONFIG"]
    extra = json.loads(entry["value"])
    entry["value"] = json.dumps(dict(reversed(list({**extra, TMP_DIR_KEY: ".tmp-abc123"}.items()))), indent=1)
    assert _env_rows(pods)["rag-assistant: LMCache env"].ok  # other order, spacing and token: same settings
    for bad in ("tmp-abc", ".tmp-", ".tmp-a/b", None):
        entry["value"] = json.dumps({**extra, TMP_DIR_KEY: bad})
        row = _env_rows(pods)["rag-assistant: LMCache env"]
        assert not row.ok and f"{TMP_DIR_KEY} {bad!r} is not .tmp-<token>" in row.detail
    entry["value"] = json.dumps({**extra, "fs_connector_use_odirect": True})
    assert "fs_connector_use_odirect" in _env_rows(pods)["rag-assistant: LMCache env"].detail
    entry["value"] = "not json"
    assert "LMCACHE_EXTRA_CONFIG is not JSON" in _env_rows(pods)["rag-assistant: LMCache env"].detail


def test_two_pods_sharing_a_temp_directory_fail(cluster: FakeReader) -> None:
    pods = rag_pods(cluster)
    for pod in pods:  # a literal token instead of $(KVCACHE_POD_NAME): both pods write .tmp-same
        for entry in vllm(pod)["env"]:
            if entry["name"] == "LMCACHE_EXTRA_CONFIG":
                entry["value"] = json.dumps({**json.loads(entry["value"]), TMP_DIR_KEY: ".tmp-same"})
    row = _env_rows(pods)["rag-assistant: LMCache env"]
    names_ = sorted(p["metadata"]["name"] for p in pods)
    assert not row.ok and row.detail == f"{', '.join(names_)} share the temp directory .tmp-same"


def test_the_pod_name_token_needs_its_downward_api_variable(cluster: FakeReader) -> None:
    pods = rag_pods(cluster)
    vllm(pods[0])["env"] = [e for e in vllm(pods[0])["env"] if e["name"] != "KVCACHE_POD_NAME"]
    row = _env_rows(pods)["rag-assistant: LMCache env"]
    assert not row.ok and "uses $(KVCACHE_POD_NAME) but KVCACHE_POD_NAME is not the pod name" in row.detail


def _ready_pod(mutated: dict, name: str) -> dict:
    mutated = copy.deepcopy(mutated)
    mutated["metadata"]["name"] = name
    mutated["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return mutated


@pytest.mark.parametrize("telemetry", [False, True], ids=["telemetry-off", "telemetry-on"])
def test_pods_mutated_by_the_rendered_policy_pass(tmp_path: Path, telemetry: bool) -> None:
    """The real rendered Kyverno policy (random per-pod tokens) on operator-rendered pods passes;
    with telemetry on, the policy removes the opt-outs and a pod that still has one fails."""
    from tests.example_config import copy_example_config, edit_yaml
    from tests.k8s import operator_render
    from tests.k8s.kyverno_eval import apply_policy

    from k8s.kyverno import policy_manifest

    cfg = copy_example_config(tmp_path / "cfg")
    edit_yaml(cfg / "platform.yaml", lambda d: d.setdefault("lmcache", {}).update(usage_telemetry=telemetry))
    project = load_project(cfg)
    line = project.business_line("rag-assistant")
    policy = policy_manifest(project.platform, line)
    pods = [_ready_pod(apply_policy(policy, operator_render.pod(line), seed=i), f"rag-assistant-x-{i}")
            for i in range(line.replicas)]
    rows = _env_rows(pods, project, line)
    assert [n for n, r in rows.items() if not r.ok] == [], {n: r.detail for n, r in rows.items()}
    assert ("LMCACHE_TRACK_USAGE" in rows["rag-assistant: LMCache env"].detail) is not telemetry
    if telemetry:
        vllm(pods[0])["env"].append({"name": "DO_NOT_TRACK", "value": "1"})
        row = _env_rows(pods, project, line)["rag-assistant: LMCache env"]
        assert not row.ok and "DO_NOT_TRACK is set, but the line's cache env does not set it" in row.detail


def test_a_new_policy_entry_is_checked_without_touching_verify(cluster: FakeReader, monkeypatch) -> None:
    """An entry added to line_cache_env (e.g. PROMETHEUS_MULTIPROC_DIR) is compared at once."""
    import operator_tools.verify as verify_module

    real = verify_module.line_cache_env
    monkeypatch.setattr(verify_module, "line_cache_env",
                        lambda platform, line, **kw: {**real(platform, line, **kw), "NEW_SETTING": "/tmp/x"})
    row = _env_rows(rag_pods(cluster))["rag-assistant: LMCache env"]
    assert not row.ok and "NEW_SETTING: 0 entries" in row.detail


@pytest.mark.parametrize("index", range(len(owned_volumes(RAG))),
                         ids=[m["mountPath"] for _, m in owned_volumes(RAG)])
@pytest.mark.parametrize("how", ["mount dropped", "other source", "read-only flipped"])
def test_every_owned_volume_is_checked(cluster: FakeReader, index: int, how: str) -> None:
    """The volumes the patch owns (k8s.patch.owned_volumes: the L2 PVC, the Prometheus
    multiprocess emptyDir, the vLLM plugin ConfigMap) are checked like the env: each one mounted
    once, writable or read-only as the patch mounts it, from the volume the patch sets."""
    volume, mount = owned_volumes(RAG)[index]
    pod = rag_pods(cluster)[0]
    mounts = vllm(pod)["volumeMounts"]
    (mine,) = [m for m in mounts if m["mountPath"] == mount["mountPath"]]
    if how == "mount dropped":
        mounts.remove(mine)
    elif how == "read-only flipped":
        mine["readOnly"] = not mount.get("readOnly", False)
    else:
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == mine["name"]]
        for key in [k for k in vol if k != "name"]:
            del vol[key]
        vol["hostPath"] = {"path": "/somewhere"}
    results = verify(cluster, PROJECT, lines=["rag-assistant"], platform_checks=False)
    assert failed(results) == ["rag-assistant: L2 mount"]
    assert mount["mountPath"] in next(r.detail for r in results if not r.ok)


def test_a_dead_mount_names_the_pod_its_node_the_reason_and_the_heal(cluster: FakeReader) -> None:
    _mount_state(cluster, "dead", "ENOTCONN: its FUSE session is gone")
    pod = rag_pods(cluster)[1]
    [row] = [r for r in verify(cluster, PROJECT) if r.name == "rag-assistant: L2 mounts alive"]
    assert row.detail == (f"{pod['metadata']['name']} on {pod['spec']['nodeName']}: dead (ENOTCONN: its FUSE session "
                          "is gone); evicted")


def test_a_node_without_its_watchdog_fails_the_mount_row_of_every_line_with_a_pod_there(cluster: FakeReader) -> None:
    cluster.objects.remove(_watchdog_pod(cluster, NODES[0]))
    results = verify(cluster, PROJECT)
    l2_lines = [l.name for l in PROJECT.business_lines if l.cache.l2_enabled]
    assert failed(results) == [f"{name}: L2 mounts alive" for name in l2_lines]  # every line has a pod on node 0
    row = next(r for r in results if r.name == "rag-assistant: L2 mounts alive")
    assert row.detail == f"{rag_pods(cluster)[0]['metadata']['name']}: no report from the L2 mount watchdog on {NODES[0]}"


def test_an_autoscaled_line_at_min_replicas_is_ready(cluster: FakeReader) -> None:
    """rag-assistant autoscales 1..2 and starts at 2 (issue 26): scaled in to one Ready pod it is
    healthy, and the row says autoscaling, not the initial count."""
    one = rag_pods(cluster)[:1]
    (row,) = [r for r in check_inference_pods(RAG, one, platform=PLATFORM) if r.name.endswith("inference pods Ready")]
    assert row.ok and row.detail == "1/1 Ready, autoscaling 1..2"
    fixed = RAG.model_copy(update={"autoscaling": None})
    (row,) = [r for r in check_inference_pods(fixed, one, platform=PLATFORM) if r.name.endswith("inference pods Ready")]
    assert not row.ok and row.detail == "1/1 Ready, 2 configured"


# --- replica shares: the hot-spot check (issue 29 item 3) ---------------------------------------------------


def test_counter_total_sums_every_sample_of_the_series() -> None:
    text = ('# TYPE vllm:prompt_tokens_total counter\n'
            'vllm:prompt_tokens_total{engine="0",model_name="m {x}"} 1200.0\n'
            'vllm:prompt_tokens_total{engine="1"} 300\n'
            'vllm:prompt_tokens_created{engine="0"} 1.7e9\n'
            'vllm:prompt_tokens_totally 5\n')
    assert verify_mod.counter_total(text, "vllm:prompt_tokens_total") == 1500.0
    assert verify_mod.counter_total("# nothing\n", "vllm:prompt_tokens_total") is None


def test_balanced_replicas_pass_the_share_check(cluster: FakeReader) -> None:
    rows = {r.name: r for r in verify(cluster, PROJECT)}
    row = rows[f"rag-assistant: replica shares ({RAG.routing_strategy})"]
    assert row.ok and "50%" in row.detail


def test_a_hot_replica_fails_the_share_check(cluster: FakeReader) -> None:
    pods = [p["metadata"]["name"] for p in cluster.list("Pod", RAG.namespace)
            if p["metadata"]["labels"].get(names.OPERATOR_POD_LABEL) == names.endpoint_name(RAG)]
    assert len(pods) == 2
    cluster.prompt_tokens = {pods[0]: 900_000.0, pods[1]: 100_000.0}  # 90% > 1.5 x 50%
    (row,) = [r for r in verify(cluster, PROJECT) if r.name.startswith("rag-assistant: replica shares")]
    assert not row.ok and pods[0] in row.detail and "90%" in row.detail
    cluster.prompt_tokens = {pods[0]: 700_000.0, pods[1]: 300_000.0}  # 70%: uneven, not a hot spot
    (row,) = [r for r in verify(cluster, PROJECT) if r.name.startswith("rag-assistant: replica shares")]
    assert row.ok
    cluster.prompt_tokens = {pods[0]: 9_000.0, pods[1]: 1_000.0}  # too little traffic to judge
    (row,) = [r for r in verify(cluster, PROJECT) if r.name.startswith("rag-assistant: replica shares")]
    assert row.ok and "too few" in row.detail
    cluster.prompt_tokens = {pods[0]: None}  # a pod without vLLM's counter
    (row,) = [r for r in verify(cluster, PROJECT) if r.name.startswith("rag-assistant: replica shares")]
    assert not row.ok and pods[0] in row.detail


# --- a gateway line's settings on the operator's InferenceGatewayConfig ----------------------------

#: rag-assistant routed by the gateway with request authentication and weights (AWS's gateway guide).
GATEWAY_RAG = RAG.model_copy(update={"routing_strategy": "gateway", "gateway": LineGatewayConfig.model_validate({
    "jwt": {"name": "corp-idp", "issuer": "https://idp.example.com/realms/rag",
            "remote_jwks_uri": "https://idp.example.com/realms/rag/certs", "audiences": ["rag-assistant"]},
    "weights": {"queue": 4, "kv_cache": 2, "prefix": 2}})})
GATEWAY_PROJECT = ProjectConfig(platform=PLATFORM, config_dir=PROJECT.config_dir, business_lines=tuple(
    GATEWAY_RAG if line.name == RAG.name else line for line in PROJECT.business_lines))
PROVIDER = {"name": "corp-idp", "issuer": "https://idp.example.com/realms/rag",
            "remoteJWKS": {"uri": "https://idp.example.com/realms/rag/certs"}, "audiences": ["rag-assistant"]}
WEIGHTS = {"queue": 4, "kvCache": 2, "prefix": 2}


def gateway_object(auth: Any = None, schedulers: list[dict] | None = None) -> dict:
    """``<line>-gateway`` as the policy leaves it: the configured auth, one entry with the weights."""
    return {"kind": "InferenceGatewayConfig", "apiVersion": "inference.sagemaker.aws.amazon.com/v1alpha1",
            "metadata": {"name": names.gateway_name(GATEWAY_RAG), "namespace": GATEWAY_RAG.namespace},
            "spec": {"bbr": {"enabled": False}, "auth": auth if auth is not None else {"jwt": {"provider": PROVIDER}},
                     "schedulers": schedulers if schedulers is not None else [
                         {"name": "rag", "modelName": "rag", "weights": WEIGHTS}]}}


def gateway_cluster(cluster: FakeReader) -> FakeReader:
    return FakeReader(cluster.describe, [*cluster.objects, gateway_object()])


def test_a_gateway_line_is_checked_for_its_auth_and_weights(cluster: FakeReader) -> None:
    rows = {r.name: r for r in verify(gateway_cluster(cluster), GATEWAY_PROJECT)}
    row = rows["rag-assistant: gateway settings"]
    assert row.ok and row.detail == "rag-assistant/rag-assistant-gateway: spec.auth and weights as configured"
    assert "rag-assistant: gateway settings" not in {r.name for r in verify(cluster, PROJECT)}  # no settings


@pytest.mark.parametrize(("gateway", "says"), [
    (None, "InferenceGatewayConfig rag-assistant/rag-assistant-gateway not found"),
    (gateway_object(auth={}), 'spec.auth is {}, the config says {"jwt": {"provider": {"name": "corp-idp"'),
    (gateway_object(auth={"jwt": {"provider": {**PROVIDER, "audiences": ["anyone"]}}}),
     "kubectl -n rag-assistant annotate inferencegatewayconfig rag-assistant-gateway kvcache.io/resync="),
    (gateway_object(schedulers=[{"name": "rag", "weights": {"queue": 2, "kvCache": 2, "prefix": 3}},
                                {"name": "by-map", "configMapRef": {"name": "weights"}},
                                {"name": "rag-lora"}]),
     'scheduler entries rag, rag-lora have weights other than gateway.weights {"queue": 4, "kvCache": 2, '
     '"prefix": 2}'),
])
def test_a_gateway_object_without_the_lines_settings_fails(gateway: dict | None, says: str) -> None:
    """Admitted before the policy's webhook, or weights set by hand or by the operator: the policy
    only acts at admission, so verify says what differs (an entry with configMapRef is not judged)."""
    row = verify_mod.check_gateway_settings(GATEWAY_RAG, gateway)
    assert not row.ok and says in row.detail, row.detail

