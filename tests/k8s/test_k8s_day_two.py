"""Issue 8: the L2 tier on day two. Each expected value is a fact of Curvine v0.3.2-alpha or
Kyverno v1.15.2 at that tag (docs/sources.md §9), named next to the assertion."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

import celpy
import pytest
from tests.k8s import operator_render
from tests.k8s.conftest import find
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.pod_security import baseline_violations

from k8s import curvine_config, names
from k8s.curvine_chart import (
    CURVINE_SERVER, FIRST_START_MARKER_WAIT_S, PRIMARY_START_STATES, _config_check_script, _master_start_script,
)
from k8s.curvine_config import NODE_PORT_RANGE, node_host_listeners
from k8s.kyverno import BUSINESS_LINE_NAMESPACE_LABEL, kyverno_helm_values, webhook_match_conditions


def _pod(obj):
    return obj["spec"]["template"]["spec"]


# --- 1. No TTL in anything the CSI controller, curvine-cli or the FUSE client reads ------------

#: Keys that give a Curvine client a TTL: ClientConf ``ttl_ms`` / ``ttl_action`` (serde aliases of
#: ``ttl_ms_str`` / ``ttl_action_str``, curvine-common src/conf/client_conf.rs @ v0.3.2-alpha), and
#: their curvine-fuse flags ``--client.ttl-ms`` / ``--client.ttl-action`` (ClientConfCliOverrides:
#: prefix "client", strip_suffix "_str", kebab case).
TTL_TOML_KEYS = {"ttl_ms", "ttl_ms_str", "ttl_action", "ttl_action_str"}
TTL_FLAG_KEYS = {"client.ttl-ms", "client.ttl-action"}


def _conf_file_readers(curvine):
    """(object, container) of every container told where the cluster config is (CURVINE_CONF_FILE)."""
    for obj in curvine:
        if obj["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
            pod = _pod(obj)
            for c in pod.get("initContainers", []) + pod["containers"]:
                if any(e["name"] == "CURVINE_CONF_FILE" for e in c.get("env", [])):
                    yield obj["metadata"]["name"], c["name"]


def test_no_config_the_controller_cli_or_fuse_reads_carries_a_ttl(curvine, toml_conf):
    """CreateVolume runs ``curvine-cli fs mkdir -p`` for fs_path and each PV (curvine-csi
    pkg/csi/controller.go ``CreateCurinveDir``); curvine-cli loads CURVINE_CONF_FILE
    (curvine-cli src/main.rs ``resolve_conf_path``); mkdir copies the client TTL into the
    directory (``MkdirOptsBuilder::with_conf``, curvine-common src/state/opts.rs). FUSE mkdir does
    the same with its own client conf (curvine-fuse src/fs/curvine_file_system.rs), so the FUSE
    flags carry no TTL either."""
    readers = set(_conf_file_readers(curvine))
    assert (names.CSI_CONTROLLER, "csi-plugin") in readers  # the controller reads this very file
    assert not TTL_TOML_KEYS & set(toml_conf["client"]), toml_conf["client"]
    for table, values in toml_conf.items():
        if isinstance(values, dict):
            assert not TTL_TOML_KEYS & set(values), table
    sc = find(curvine, "StorageClass", "curvine-sc")
    assert not TTL_FLAG_KEYS & set(sc["parameters"])
    assert not any("ttl" in key for key in sc["parameters"]), sc["parameters"]


def test_ttl_check_can_fail(k8s_project):
    """The same check on a config that still had the old TTL fails."""
    old = dict(curvine_config.cluster_conf(k8s_project.platform))
    old["client"] = {**old["client"], "ttl_ms": "1d", "ttl_action": "delete"}
    assert TTL_TOML_KEYS & set(old["client"]) == {"ttl_ms", "ttl_action"}


# --- 2. Every host-network listener on a GPU node has its own explicit port --------------------

#: v0.3.2-alpha defaults (curvine-common src/conf/cluster_conf.rs): DEFAULT_WORKER_WEB_PORT 9001,
#: DEFAULT_FUSE_WEB_PORT 9002. A FUSE pod without --web-port binds 9002.
V032_DEFAULT_FUSE_WEB_PORT = 9002


def host_listeners_from_manifests(manifests, toml_conf) -> dict[str, list[tuple[str, str, int]]]:
    """Per node kind, every (owner, listener, port) of our host-network pods, read from the
    rendered objects: Workers (their container ports and the TOML ``[worker]`` ports they bind)
    and the CSI's standalone FUSE pods (one per node and StorageClass; web port from the
    ``web-port`` parameter, else Curvine's default)."""
    per_node: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for objects in manifests.values():
        for obj in objects:
            if obj["kind"] not in ("DaemonSet", "Deployment", "StatefulSet"):
                continue
            pod = _pod(obj)
            if not pod.get("hostNetwork"):
                continue
            name = obj["metadata"]["name"]
            for c in pod["containers"]:
                for p in c.get("ports", []):
                    per_node["gpu"].append((name, p.get("name", "?"), p["containerPort"]))
            if name == names.CURVINE_WORKER:
                declared = {port for _, _, port in per_node["gpu"]}
                for key in ("rpc_port", "web_port"):  # worker_server.rs: one RPC, one web server
                    assert toml_conf["worker"][key] in declared, f"Worker binds {key} undeclared"
    for objects in manifests.values():
        for obj in objects:
            if obj["kind"] == "StorageClass" and obj["provisioner"] == names.CSI_DRIVER_NAME:
                port = int(obj["parameters"].get("web-port", V032_DEFAULT_FUSE_WEB_PORT))
                per_node["gpu"].append((f"curvine-fuse ({obj['metadata']['name']})", "web", port))
    return per_node


def test_every_host_network_listener_on_a_gpu_node_is_unique(manifests, toml_conf, k8s_project):
    per_node = host_listeners_from_manifests(manifests, toml_conf)
    ours = per_node["gpu"]
    theirs = [(l.owner, l.listener, l.port) for l in node_host_listeners(k8s_project.platform)
              if l.owner not in (names.CURVINE_WORKER, names.NODE_FIREWALL) and not l.owner.startswith("curvine-fuse")]
    everything = ours + theirs
    ports = [p for _, _, p in everything]
    assert len(ports) == len(set(ports)), sorted(everything, key=lambda x: x[2])
    assert not any(NODE_PORT_RANGE[0] <= p <= NODE_PORT_RANGE[1] for p in ports)
    # The inventory of the code matches what the manifests render.
    assert sorted(p for _, _, p in ours) == sorted(
        l.port for l in node_host_listeners(k8s_project.platform)
        if l.owner in (names.CURVINE_WORKER, names.NODE_FIREWALL) or l.owner.startswith("curvine-fuse"))
    # The FUSE pods get the port explicitly: without it they bind 9002, the Worker's web port.
    assert toml_conf["worker"]["web_port"] == V032_DEFAULT_FUSE_WEB_PORT
    assert find(manifests["curvine"], "StorageClass", "curvine-sc")["parameters"]["web-port"] == "9003"


def test_host_port_check_finds_the_v032_collision(manifests, toml_conf):
    """Without the web-port parameter the FUSE pod lands on 9002, where the Worker listens."""
    import copy
    broken = copy.deepcopy(manifests)
    del find(broken["curvine"], "StorageClass", "curvine-sc")["parameters"]["web-port"]
    ports = [p for _, _, p in host_listeners_from_manifests(broken, toml_conf)["gpu"]]
    assert ports.count(9002) == 2


# --- 4 and 8. Kyverno: fail closed only for the lines' vLLM Pods --------------------------------

def _cel(expression: str, request: dict, obj: dict) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj)}))


def _admits(conditions, namespace: str, pod: dict) -> bool:
    """The API server calls the webhook only when every matchCondition is true."""
    request = {"namespace": namespace, "operation": "CREATE", "resource": {"group": "", "version": "v1",
                                                                          "resource": "pods"}}
    return all(_cel(c["expression"], request, pod) for c in conditions)


def _policy(manifests, line):
    return find(manifests[names.line_chart_name(line)], "Policy", names.policy_name(line))


def _janitor_pod(line) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "janitor", "namespace": line.namespace,
                         "labels": {"app.kubernetes.io/name": "l2-janitor", names.OPERATOR_POD_LABEL: line.name}},
            "spec": {"containers": [{"name": "janitor", "image": "python"}],
                     "volumes": [{"name": "x", "emptyDir": {}}]}}


def test_policy_gets_its_own_webhook_limited_to_the_lines_vllm_pods(manifests, k8s_project):
    """Kyverno 1.15.2 pkg/controllers/webhook/controller.go: a policy whose
    ``webhookConfiguration.matchConditions`` is non-empty (``CustomWebhookMatchConditions``) gets
    a fine-grained webhook (``newWebhookPerPolicy``) carrying those conditions, instead of
    joining the shared ``...-fail`` webhook."""
    lines = [l for l in k8s_project.business_lines if l.cache.l2_enabled]  # no L2: no policy
    for line in lines:
        spec = _policy(manifests, line)["spec"]
        hook = spec["webhookConfiguration"]
        assert hook["failurePolicy"] == "Fail" and hook["matchConditions"] == webhook_match_conditions(line)
        conditions = hook["matchConditions"]
        vllm = operator_render.pod(line)
        assert _admits(conditions, line.namespace, vllm)
        for other in lines:
            if other is not line:
                assert not _admits(conditions, other.namespace, operator_render.pod(other))
        for ns in ("curvine", "cert-manager", "hyperpod-inference-system", "aws-hyperpod", "kube-system"):
            assert not _admits(conditions, ns, vllm), ns
        sidecar_only = {**vllm, "spec": {**vllm["spec"], "containers": vllm["spec"]["containers"][1:]}}
        assert not _admits(conditions, line.namespace, sidecar_only)
        assert not _admits(conditions, line.namespace, _janitor_pod(line))


def test_kyverno_webhooks_only_see_business_line_namespaces(manifests, k8s_project):
    """The chart's ``config.webhooks.namespaceSelector`` is copied into every resource webhook
    (``buildResourceMutatingWebhookRules``); chart 3.5.2's default excludes only kube-system."""
    selector = kyverno_helm_values()["config"]["webhooks"]["namespaceSelector"]

    def selected(labels: dict[str, str]) -> bool:
        for expr in selector["matchExpressions"]:
            value = labels.get(expr["key"])
            if expr["operator"] == "Exists" and value is None:
                return False
            if expr["operator"] == "NotIn" and value in expr["values"]:
                return False
        return True

    namespaces = {o["metadata"]["name"]: o["metadata"].get("labels", {})
                  for objects in manifests.values() for o in objects if o["kind"] == "Namespace"}
    for ns, labels in namespaces.items():
        labels = {**labels, "kubernetes.io/metadata.name": ns}  # set by the API server
        is_line = ns in {l.namespace for l in k8s_project.business_lines}
        assert selected(labels) is is_line, ns
    for ns in ("kube-system", "kyverno", "cert-manager", "hyperpod-inference-system", "aws-hyperpod", "default"):
        assert not selected({"kubernetes.io/metadata.name": ns}), ns
    assert all(namespaces[l.namespace][BUSINESS_LINE_NAMESPACE_LABEL] == l.name for l in k8s_project.business_lines)


def test_volume_rules_touch_only_pods_with_the_vllm_container(manifests, k8s_project):
    for line in [l for l in k8s_project.business_lines if l.cache.l2_enabled]:  # no L2: no policy
        policy = _policy(manifests, line)
        for pod in (_janitor_pod(line),
                    {**operator_render.pod(line), "spec": {**operator_render.pod(line)["spec"],
                                                           "containers": operator_render.pod(line)["spec"]["containers"][1:]}}):
            assert apply_policy(policy, pod) == pod, "a Pod without the vLLM container is left as it is"
        mutated = apply_policy(policy, operator_render.pod(line))
        assert mutated["metadata"]["labels"][names.L2_MUTATED_LABEL] == names.L2_MUTATED_VALUE
        claims = [v["persistentVolumeClaim"]["claimName"] for v in mutated["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == [names.pvc_name(line)]


def test_endpoint_waits_for_the_policy_to_be_ready():
    """policy_status.go @ v1.15.2: the only condition type is ``Ready``; ``updatePolicyStatuses``
    sets it True once the policy is in the webhook. The jsonpath is empty until then."""
    from k8s.kyverno import POLICY_READY_JSONPATH
    assert POLICY_READY_JSONPATH == '.status.conditions[?(@.status=="True")].type'


# --- 5. Drains complete ----------------------------------------------------------------------

def disruptions_allowed(pdb_spec: dict, replicas: int, healthy: int) -> int:
    """Kubernetes' disruption controller (pkg/controller/disruption): desiredHealthy is
    minAvailable, or replicas - maxUnavailable; allowed = healthy - desiredHealthy (>= 0)."""
    if "minAvailable" in pdb_spec:
        desired = pdb_spec["minAvailable"]
    else:
        desired = replicas - pdb_spec["maxUnavailable"]
    return max(0, healthy - desired)


def test_primary_pdb_allows_a_planned_move(curvine):
    pdb = find(curvine, "PodDisruptionBudget", names.CURVINE_MASTER)["spec"]
    sts = find(curvine, "StatefulSet", names.CURVINE_MASTER)
    replicas = sts["spec"]["replicas"]
    assert replicas == 1
    assert disruptions_allowed(pdb, replicas, healthy=1) == 1, "a drain may evict the Primary"
    assert disruptions_allowed({"minAvailable": 1}, replicas, healthy=1) == 0, "the old budget blocked every drain"
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


# --- 7. Pod Security ---------------------------------------------------------------------------

def test_line_namespaces_enforce_baseline_and_curvine_stays_privileged(manifests, k8s_project):
    version = f"v{k8s_project.platform.eks.version}"
    for line in k8s_project.business_lines:
        ns = find(manifests[names.line_chart_name(line)], "Namespace", line.namespace)["metadata"]["labels"]
        assert ns["pod-security.kubernetes.io/enforce"] == "baseline"
        assert ns["pod-security.kubernetes.io/enforce-version"] == version
        assert ns["pod-security.kubernetes.io/warn"] == ns["pod-security.kubernetes.io/audit"] == "restricted"
    curvine_ns = find(manifests["curvine"], "Namespace", "curvine")["metadata"]["labels"]
    assert {k: v for k, v in curvine_ns.items() if k.startswith("pod-security.")} == {"pod-security.kubernetes.io/enforce": "privileged",
                          "pod-security.kubernetes.io/enforce-version": version,
                          "pod-security.kubernetes.io/audit": "baseline",
                          "pod-security.kubernetes.io/audit-version": version}


def test_everything_we_put_in_a_line_namespace_passes_baseline(manifests, k8s_project):
    for line in k8s_project.business_lines:
        workloads = [o for o in manifests[names.line_chart_name(line)] if o["kind"] in ("Deployment", "CronJob")]
        # The janitor and the cross-pod hit canary (both L2 lines only).
        assert sorted(o["metadata"]["name"] for o in workloads) == (
            [names.KV_CANARY, names.L2_JANITOR] if line.cache.l2_enabled else [])
        for obj in workloads:
            template = obj["spec"]["template"]
            assert baseline_violations(template["spec"], template["metadata"]) == []
        rendered = operator_render.pod(line)
        if not line.cache.l2_enabled:  # no L2 backend volume, no policy: the pod as rendered
            assert baseline_violations(rendered["spec"]) == []
            continue
        assert baseline_violations(rendered["spec"]) == ['hostPath volumes (volume "host-shm")']
        mutated = apply_policy(_policy(manifests, line), rendered)
        assert baseline_violations(mutated["spec"], mutated["metadata"]) == []
    # The check can fail: the Curvine Workers (hostNetwork, hostPath) would be refused there.
    worker = baseline_violations(_pod(find(manifests["curvine"], "DaemonSet", names.CURVINE_WORKER)))
    assert [v.split(" (")[0] for v in worker] == ["host namespaces", "hostPath volumes"]


# --- 6. The Primary's start states, run for real with /bin/sh --------------------------------

#: Stand-in for the image's curvine-server that applies Curvine v0.3.2-alpha's own rule
#: (``require_existing_master_data``): both stores RocksDB, or both missing/clean-empty (then it
#: creates them), else it refuses. It creates a RocksDB-looking store (CURRENT + MANIFEST-) the
#: way RocksDB does on open.
FAKE_SERVER = r"""#!/bin/sh
echo "args=$*"
state() {
  if [ -f "$1/data/CURRENT" ] && ls "$1/data" | grep -q '^MANIFEST-'; then echo rocksdb; return; fi
  if [ ! -e "$1" ] || [ -z "$(ls -A "$1")" ]; then echo empty; return; fi
  if [ "$(ls -A "$1")" = data ] && [ -z "$(ls -A "$1/data")" ]; then echo empty; return; fi
  echo invalid
}
m=$(state "$ROOT/meta"); j=$(state "$ROOT/journal")
if [ "$m/$j" = "empty/empty" ]; then
  for d in meta journal; do mkdir -p "$ROOT/$d/data"; echo x > "$ROOT/$d/data/CURRENT"; echo x > "$ROOT/$d/data/MANIFEST-000001"; done
elif [ "$m/$j" != "rocksdb/rocksdb" ]; then
  echo "format_master=false found inconsistent or invalid master data directories" >&2; exit 1
fi
"""


class PrimaryVolume:
    """The Primary's EBS volume in a temp dir, the init script and the master wrapper run on it."""

    def __init__(self, tmp_path: Path, conf_text: str) -> None:
        self.mount = tmp_path / "data"
        self.root = self.mount / "curvine"
        self.mount.mkdir()
        self.conf = tmp_path / "curvine-cluster.toml"
        self.conf.write_text(conf_text)
        self.server = tmp_path / "curvine-server"
        self.server.write_text(FAKE_SERVER)
        self.server.chmod(0o755)

    @property
    def marker(self) -> Path:
        return self.root / ".kvcache-initialized"

    def store(self, which: str, kind: str) -> None:
        """Put ``kind`` (rocksdb | empty-data | junk) at meta/ or journal/."""
        d = self.root / which
        if kind == "rocksdb":
            (d / "data").mkdir(parents=True, exist_ok=True)
            (d / "data" / "CURRENT").write_text("MANIFEST-000001\n")
            (d / "data" / "MANIFEST-000001").write_text("x")
        elif kind == "empty-data":
            (d / "data").mkdir(parents=True, exist_ok=True)
        elif kind == "junk":
            d.mkdir(parents=True, exist_ok=True)
            (d / "orphaned-file").write_text("not rocksdb")

    def _run(self, script: str) -> subprocess.CompletedProcess:
        script = (script.replace(curvine_config.PRIMARY_ROOT, str(self.root))
                  .replace(f"exec {CURVINE_SERVER} ", f"exec {self.server} ")
                  .replace(f"-lt {FIRST_START_MARKER_WAIT_S} ", "-lt 3 "))
        return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "ROOT": str(self.root)})

    def init(self) -> subprocess.CompletedProcess:
        return self._run(_config_check_script(conf=str(self.conf), primary=True))

    def master(self) -> subprocess.CompletedProcess:
        started = self._run(_master_start_script(conf=str(self.conf)))
        for _ in range(30):  # the marker loop runs in the background of the wrapper
            if self.marker.exists():
                break
            __import__("time").sleep(0.1)
        return started


@pytest.fixture(scope="module")
def real_conf(k8s_project) -> str:
    return curvine_config.render_cluster_toml(k8s_project.platform)


# (meta, journal, marker, lost+found at the mount root) -> expected outcome of init.
START_STATES = [
    pytest.param(None, None, False, False, "start", id="fresh"),
    pytest.param(None, None, False, True, "start", id="fresh-with-lost+found"),
    pytest.param("empty-data", "empty-data", False, True, "start", id="clean-empty-data-dirs"),
    pytest.param("rocksdb", "rocksdb", True, True, "start", id="both-present"),
    pytest.param("rocksdb", "rocksdb", False, False, "start", id="both-present-marker-missing"),
    pytest.param("rocksdb", None, True, False, "refuse", id="only-meta"),
    pytest.param(None, "rocksdb", True, False, "refuse", id="only-journal"),
    pytest.param(None, "rocksdb", False, False, "refuse", id="only-journal-no-marker"),
    pytest.param(None, None, True, False, "refuse", id="wiped-volume"),
    pytest.param("junk", "rocksdb", True, False, "refuse", id="meta-not-rocksdb"),
    pytest.param("rocksdb", "junk", True, False, "refuse", id="journal-not-rocksdb"),
]


@pytest.mark.parametrize("meta,journal,marker,lost_found,expected", START_STATES)
def test_primary_start_state(tmp_path, real_conf, meta, journal, marker, lost_found, expected):
    vol = PrimaryVolume(tmp_path, real_conf)
    if lost_found:
        (vol.mount / "lost+found").mkdir()
    if meta:
        vol.store("meta", meta)
    if journal:
        vol.store("journal", journal)
    if marker:
        vol.root.mkdir(parents=True, exist_ok=True)
        vol.marker.write_text("2026-01-01T00:00:00Z\n")
    init = vol.init()
    if expected == "refuse":
        assert init.returncode == 1 and "FATAL" in init.stderr and "Recovering the Primary" in init.stderr
        return
    assert init.returncode == 0, init.stderr
    started = vol.master()
    # Whatever init lets through, Curvine's own rule accepts (the stand-in refuses otherwise).
    assert started.returncode == 0, started.stderr
    assert f"args=--service master --conf {vol.conf}" in started.stdout
    assert vol.marker.exists(), "the marker is written once the metadata exists"
    # And the next pod is a normal restart.
    again = vol.init()
    assert again.returncode == 0 and "normal start" in again.stdout


def test_every_start_state_of_the_table_is_tested():
    """The documented table (k8s.curvine_chart.PRIMARY_START_STATES) and the cases above agree."""
    refused = {(m, j) for m, j, _, action, _ in PRIMARY_START_STATES if action == "refuse"}
    assert ("empty", "rocksdb") in refused and ("rocksdb", "empty") in refused
    assert {action for *_, action, _ in PRIMARY_START_STATES} == {"start", "refuse"}


def test_init_refuses_missing_or_formatting_config(tmp_path):
    missing = subprocess.run(["/bin/sh", "-c", _config_check_script(conf=str(tmp_path / "none.toml"), primary=False)],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "missing or empty" in missing.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("format_master = true\nformat_worker = false\n")
    formatting = subprocess.run(["/bin/sh", "-c", _config_check_script(conf=str(bad), primary=False)],
                                capture_output=True, text=True)
    assert formatting.returncode == 1 and "format_master = false" in formatting.stderr
