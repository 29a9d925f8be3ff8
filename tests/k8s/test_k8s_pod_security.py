"""Pod Security ``baseline`` in the line namespaces: the operator's Tiered Storage shared memory.

With ``l2CacheBackend: tieredstorage`` the operator gives its vLLM Pod a ``hostPath`` volume of
``/dev/shm`` (or of ``/dev/shm/ai_toolkit_cache``, ``type: File``) for the ai-toolkit shared
memory (docs/sources.md §9). ``baseline`` forbids every ``hostPath``, so the line's pods would
be refused; the L2 mutation (Kyverno policy, or the Deployment patch without Kyverno) removes the
volume and every mount of it, because only the replaced backend used it. Anything else baseline
forbids is left in place, so the API server refuses the Pod with a clear PSA error.

The baseline check is :mod:`tests.k8s.pod_security`, a model of k8s.io/pod-security-admission
v0.33.13; its first tests hold it to the library's own expected messages at that tag.
"""

from __future__ import annotations

import copy

import jsonpatch
import kubernetes_validate
import pytest
from tests.k8s import operator_render
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.pod_security import KUBERNETES_VERSION, baseline_violations, forbidden_message

from k8s import names
from k8s.line_chart import namespace_labels
from k8s.patch import endpoint_json_patch, is_hyperpod_shm_volume

# --- The checker model against k8s.io/pod-security-admission v0.33.13 ------------------------


def _c(name, **sc):
    return {"name": name, "image": "x", **({"securityContext": sc} if sc else {})}


#: (pod spec, metadata, expected violations). Cases marked "upstream" restate the inputs and the
#: expected detail of the library's own policy/check_*_test.go at v0.33.13.
CHECKER_CASES = {
    "upstream capabilities": (
        {"containers": [_c("a", capabilities={"add": ["FOO", "BAR"]}), _c("b", capabilities={"add": ["BAR", "BAZ"]})]},
        None,
        ['non-default capabilities (containers "a", "b" must not include "BAR", "BAZ", "FOO" in '
         'securityContext.capabilities.add)']),
    "upstream one host port": (
        {"containers": [{"name": "a", "ports": [{"hostPort": 0}]},
                        {"name": "b", "ports": [{"hostPort": 0}, {"hostPort": 20}]}]},
        None, ['hostPort (container "b" uses hostPort 20)']),
    "upstream host ports": (
        {"containers": [{"name": "a", "ports": [{"hostPort": 0}]},
                        {"name": "b", "ports": [{"hostPort": 0}, {"hostPort": 10}, {"hostPort": 20}]},
                        {"name": "c", "ports": [{"hostPort": 0}, {"hostPort": 10}, {"hostPort": 30}]}]},
        None, ['hostPort (containers "b", "c" use hostPorts 10, 20, 30)']),
    "upstream seLinux pod and containers": (
        {"securityContext": {"seLinuxOptions": {"type": "foo", "user": "bar", "role": "baz"}},
         "containers": [_c("a", seLinuxOptions={"type": "container_t"}),
                        _c("b", seLinuxOptions={"type": "container_init_t"}),
                        _c("c", seLinuxOptions={"type": "container_kvm_t"}),
                        _c("d", seLinuxOptions={"type": "container_engine_t"}),
                        _c("e", seLinuxOptions={"type": "bar"}),
                        _c("f", seLinuxOptions={"user": "bar"}),
                        _c("g", seLinuxOptions={"role": "baz"})]},
        None,
        ['seLinuxOptions (pod and containers "e", "f", "g" set forbidden securityContext.seLinuxOptions: '
         'types "bar", "foo"; user may not be set; role may not be set)']),
    "upstream hostProcess": (
        {"securityContext": {"windowsOptions": {"hostProcess": True}},
         "containers": [{"name": "a"}, _c("b", windowsOptions={}), _c("d", windowsOptions={"hostProcess": False}),
                        _c("e", windowsOptions={"hostProcess": True}), _c("f", windowsOptions={"hostProcess": True})]},
        None, ['hostProcess (pod and containers "e", "f" must not set securityContext.windowsOptions.hostProcess=true)']),
    "upstream unconfined AppArmor pod": (
        {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}, "containers": [{"name": "a"}]},
        None, ['forbidden AppArmor profile (pod must not set AppArmor profile type to "Unconfined")']),
    "AppArmor annotation": (
        {"containers": [{"name": "a"}, {"name": "b"}]},
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "unconfined",
                         "container.apparmor.security.beta.kubernetes.io/b": "localhost/custom"}},
        ['forbidden AppArmor profile (annotation must not set AppArmor profile type to '
         '"container.apparmor.security.beta.kubernetes.io/a="unconfined"")']),
    "host namespaces": (
        {"hostNetwork": True, "hostIPC": True, "containers": [{"name": "a"}]},
        None, ["host namespaces (hostNetwork=true, hostIPC=true)"]),
    "privileged init container": (
        {"initContainers": [_c("init", privileged=True)], "containers": [_c("a", privileged=False)]},
        None, ['privileged (container "init" must not set securityContext.privileged=true)']),
    "procMount": (
        {"containers": [_c("a", procMount="Unmasked"), _c("b", procMount="Default")]},
        None, ['procMount (container "a" must not set securityContext.procMount to "Unmasked")']),
    "seccomp Unconfined": (
        {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
         "containers": [_c("a", seccompProfile={"type": "Unconfined"}), _c("b", seccompProfile={"type": "Localhost"})]},
        None, ['seccompProfile (container "a" must not set securityContext.seccompProfile.type to "Unconfined")']),
    "sysctls": (
        {"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"},
                                         {"name": "kernel.msgmax", "value": "65536"}]},
         "containers": [{"name": "a"}]},
        None, ["forbidden sysctls (kernel.msgmax)"]),
    "hostPath volumes": (
        {"volumes": [{"name": "a", "hostPath": {"path": "/"}}, {"name": "b", "emptyDir": {}},
                     {"name": "c", "hostPath": {"path": "/dev/shm"}}], "containers": [{"name": "a"}]},
        None, ['hostPath volumes (volumes "a", "c")']),
    "allowed values": (
        {"hostNetwork": False, "securityContext": {"seccompProfile": {"type": "RuntimeDefault"},
                                                   "seLinuxOptions": {"type": "container_engine_t"},
                                                   "appArmorProfile": {"type": "Localhost"},
                                                   "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1 2"}]},
         "containers": [_c("a", privileged=False, procMount="Default",
                           capabilities={"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL"]}),
                        {"name": "b", "ports": [{"containerPort": 80, "hostPort": 0}]}],
         "volumes": [{"name": "v", "emptyDir": {"medium": "Memory"}}]},
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "runtime/default"}}, []),
}


@pytest.mark.parametrize("case", list(CHECKER_CASES))
def test_checker_model_matches_the_library(case):
    spec, meta, expected = CHECKER_CASES[case]
    assert baseline_violations(spec, meta) == expected


def test_checker_reports_every_violation_in_the_library_order():
    spec = {"hostPID": True, "volumes": [{"name": "shm", "hostPath": {"path": "/dev/shm"}}],
            "containers": [_c("vllm", privileged=True, capabilities={"add": ["SYS_ADMIN"]})]}
    found = baseline_violations(spec)
    assert found == ['non-default capabilities (container "vllm" must not include "SYS_ADMIN" in '
                     'securityContext.capabilities.add)',
                     "host namespaces (hostPID=true)", 'hostPath volumes (volume "shm")',
                     'privileged (container "vllm" must not set securityContext.privileged=true)']
    assert forbidden_message("p-1", found[2:3]) == (
        'pods "p-1" is forbidden: violates PodSecurity "baseline:v1.34": hostPath volumes (volume "shm")')


def test_checker_is_pinned_to_the_clusters_version(k8s_project):
    """The model states the 1.34 checks: a cluster upgrade must revisit it (1.34 added one, below)."""
    assert k8s_project.platform.eks.version == KUBERNETES_VERSION
    for line in k8s_project.business_lines:
        assert namespace_labels(k8s_project.platform, line)["pod-security.kubernetes.io/enforce-version"] == (
            f"v{KUBERNETES_VERSION}")
    with pytest.raises(ValueError, match="1.35"):
        baseline_violations({"containers": []}, version="1.35")


@pytest.mark.parametrize("containers, detail", [
    # The cases of k8s.io/pod-security-admission v0.34.9 policy/check_hostProbesAndhostLifecycle_test.go.
    ([{"name": "a", "livenessProbe": {"httpGet": {"host": "localhost", "port": 80}},
       "readinessProbe": {"tcpSocket": {"host": "127.0.0.1", "port": 80}},
       "lifecycle": {"preStop": {"httpGet": {"host": "::1", "port": 80}}}}],
     'container "a" uses probe or lifecycle hosts "127.0.0.1", "::1", "localhost"'),
    ([{"name": "invalid2", "startupProbe": {"httpGet": {"host": "b.com", "port": 80}}},
      {"name": "invalid1", "lifecycle": {"postStart": {"tcpSocket": {"host": "a.com", "port": 80}}}},
      {"name": "fine", "livenessProbe": {"httpGet": {"host": "", "port": 80}}}],
     'containers "invalid1", "invalid2" use probe or lifecycle hosts "a.com", "b.com"'),
])
def test_the_134_check_of_probe_and_lifecycle_hosts(containers, detail):
    assert baseline_violations({"containers": containers}) == [f"probe or lifecycle host ({detail})"]


# --- The operator's pods under the policy and under the Deployment patch ----------------------

def _with_everywhere_mounts(spec: dict) -> dict:
    """The shared memory also mounted by a sidecar and by an init container."""
    spec = copy.deepcopy(spec)
    (shm,) = [v for v in spec["volumes"] if is_hyperpod_shm_volume(v)]
    spec["containers"][1].setdefault("volumeMounts", []).append({"name": shm["name"], "mountPath": "/dev/shm/x"})
    spec["initContainers"] = [{"name": "warmup", "image": "x",
                               "volumeMounts": [{"name": shm["name"], "mountPath": "/dev/shm/x"},
                                                {"name": "model-weights", "mountPath": "/opt/ml/model"}]}]
    return spec


def _with_two_shm_volumes(spec: dict) -> dict:
    """Both reported shapes at once, under other names, one path with a trailing slash."""
    spec = copy.deepcopy(spec)
    spec["volumes"][-1]["hostPath"]["path"] = "/dev/shm/"
    spec["volumes"].insert(0, {"name": "ai-toolkit", "hostPath": {"path": "/dev/shm/ai_toolkit_cache", "type": "File"}})
    spec["containers"][0]["volumeMounts"].insert(0, {"name": "ai-toolkit", "mountPath": "/dev/shm/ai_toolkit_cache"})
    return spec


#: Shapes of the operator's pod spec, by name: the two reported ones and two harder variants.
SHAPES = {
    "directory": lambda line: operator_render.pod_spec(line),
    "file": lambda line: operator_render.pod_spec(line, shm="file"),
    "mounted-everywhere": lambda line: _with_everywhere_mounts(operator_render.pod_spec(line)),
    "two-volumes": lambda line: _with_two_shm_volumes(operator_render.pod_spec(line)),
}


def _operator_spec(line, shape: str) -> dict:
    return SHAPES[shape](line)


def _assert_admitted(p: dict, line) -> None:
    """No shared-memory hostPath, every mount names a volume, the Pod is valid and passes baseline."""
    spec = p["spec"]
    assert [v for v in spec["volumes"] if "hostPath" in v] == []
    volumes = {v["name"] for v in spec["volumes"]}
    for c in spec.get("initContainers", []) + spec["containers"]:
        assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes, c["name"]
        assert not any(m["mountPath"].startswith("/dev/shm/") for m in c.get("volumeMounts", [])), c["name"]
    kubernetes_validate.validate({**p, "metadata": {**p["metadata"], "name": "x"}}, KUBERNETES_VERSION, strict=True)
    assert baseline_violations(spec, p.get("metadata")) == []
    # What the L2 tier needs is still there.
    vllm = [c for c in spec["containers"] if c["name"] == names.endpoint_name(line)][0]
    assert {"name": names.L2_VOLUME_NAME, "mountPath": "/mnt/curvine/l2cache"} in vllm["volumeMounts"]
    assert {"name": "model-weights", "mountPath": line.vllm.model_mount_path} in vllm["volumeMounts"]


def _pod_with_spec(line, spec: dict) -> dict:
    p = operator_render.pod(line)
    p["spec"] = spec
    return p


REFUSED = {
    "directory": 'hostPath volumes (volume "host-shm")',
    "file": 'hostPath volumes (volume "host-shm")',
    "mounted-everywhere": 'hostPath volumes (volume "host-shm")',
    "two-volumes": 'hostPath volumes (volumes "ai-toolkit", "host-shm")',
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_operator_pod_is_refused_without_the_mutation(line, shape):
    """The problem: in a baseline namespace the operator's L2 Pod is refused as rendered."""
    spec = _operator_spec(line, shape)
    assert all(is_hyperpod_shm_volume(v) for v in spec["volumes"] if "hostPath" in v)
    assert baseline_violations(spec) == [REFUSED[shape]]


@pytest.mark.parametrize("refresh", [True, False], ids=["refresh-context", "stale-context"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_policy_removes_the_shared_memory_and_the_pod_passes_baseline(policy, line, shape, refresh):
    before = _pod_with_spec(line, _operator_spec(line, shape))
    after = apply_policy(policy, before, refresh_context=refresh, seed=7)
    _assert_admitted(after, line)
    # Nothing else is touched: the sidecars' own mounts and volumes stay.
    kept = {v["name"] for v in before["spec"]["volumes"] if not is_hyperpod_shm_volume(v)}
    assert kept <= {v["name"] for v in after["spec"]["volumes"]}
    otel = [c for c in after["spec"]["containers"] if c["name"] == "otel-collector"][0]
    assert otel["volumeMounts"] == [{"name": "otel-config", "mountPath": "/etc/otel"}]
    if "initContainers" in before["spec"]:
        assert after["spec"]["initContainers"][0]["volumeMounts"] == [
            {"name": "model-weights", "mountPath": "/opt/ml/model"}]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_deployment_patch_removes_the_shared_memory_and_the_pods_pass_baseline(k8s_project, line, shape):
    dep = operator_render.deployment(line)
    dep["spec"]["template"]["spec"] = _operator_spec(line, shape)
    ops = endpoint_json_patch(k8s_project.platform, line, deployment=dep)
    # Every removal is guarded by a test of the entry's name at that index.
    removes = [k for k, op in enumerate(ops) if op["op"] == "remove"]
    assert all(ops[k - 1]["op"] == "test" and ops[k - 1]["path"] == ops[k]["path"] + "/name" for k in removes)
    patched = jsonpatch.apply_patch(dep, ops)
    _assert_admitted(operator_render.pod_from_deployment(patched), line)
    # Idempotent: nothing shared-memory is left to remove on a second run.
    again = endpoint_json_patch(k8s_project.platform, line, deployment=patched)
    assert jsonpatch.apply_patch(patched, again) == patched


def test_deployment_patch_fails_instead_of_removing_the_wrong_volume(k8s_project, line):
    dep = operator_render.deployment(line)
    ops = endpoint_json_patch(k8s_project.platform, line, deployment=dep)
    # The operator re-rendered in between: a new volume shifted the shared memory's index.
    dep["spec"]["template"]["spec"]["volumes"].insert(0, {"name": "new", "emptyDir": {}})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(dep, ops)


def test_policy_and_patch_together_pass_baseline(policy, k8s_project, line):
    dep = operator_render.deployment(line)
    patched = jsonpatch.apply_patch(dep, endpoint_json_patch(k8s_project.platform, line, deployment=dep))
    _assert_admitted(apply_policy(policy, operator_render.pod_from_deployment(patched), seed=8), line)


def test_only_the_shared_memory_is_removed_anything_else_is_refused_loudly(policy, k8s_project, line):
    """Other hostPaths, a /dev/shm emptyDir and host namespaces are not the backend's: kept, so
    PSA refuses the Pod with a message naming them instead of the pod silently losing them."""
    spec = operator_render.pod_spec(line)
    spec["hostNetwork"] = True
    spec["volumes"] += [{"name": "nvme", "hostPath": {"path": "/opt/dlami/nvme"}},
                        {"name": "shm-like", "hostPath": {"path": "/dev/shmem"}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    spec["containers"][0]["volumeMounts"] += [{"name": "nvme", "mountPath": "/nvme"},
                                              {"name": "shm-like", "mountPath": "/shmem"},
                                              {"name": "dshm", "mountPath": "/dev/shm"}]
    expected = ["host namespaces (hostNetwork=true)", 'hostPath volumes (volumes "nvme", "shm-like")']
    after = apply_policy(policy, _pod_with_spec(line, spec), seed=9)
    dep = operator_render.deployment(line)
    dep["spec"]["template"]["spec"] = spec
    patched = jsonpatch.apply_patch(dep, endpoint_json_patch(k8s_project.platform, line, deployment=dep))
    for result in (after["spec"], patched["spec"]["template"]["spec"]):
        assert [v["name"] for v in result["volumes"] if v["name"] in ("nvme", "shm-like", "dshm", "host-shm")] == [
            "nvme", "shm-like", "dshm"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in result["containers"][0]["volumeMounts"]
        assert baseline_violations(result) == expected
    assert forbidden_message("p", expected) == (
        'pods "p" is forbidden: violates PodSecurity "baseline:v1.34": host namespaces (hostNetwork=true), '
        'hostPath volumes (volumes "nvme", "shm-like")')


def test_our_endpoints_ask_the_operator_for_nothing_baseline_forbids(manifests, k8s_project):
    """The CR's only baseline-restricted fields are under ``spec.kubernetes`` (init containers'
    securityContext and hostPort, hostPath volumes; CRD v1): the line charts never set it."""
    for line in k8s_project.business_lines:
        (iec,) = [o for o in manifests[names.line_chart_name(line)] if o["kind"] == "InferenceEndpointConfig"]
        assert "kubernetes" not in iec["spec"]
        if line.cache.l2_enabled:
            assert iec["spec"]["kvCacheSpec"]["l2CacheSpec"]["l2CacheBackend"] == "tieredstorage"
        else:
            assert "l2CacheSpec" not in iec["spec"]["kvCacheSpec"]
