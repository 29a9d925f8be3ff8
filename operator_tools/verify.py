"""Post-deploy verification: is the tiered KV cache of this platform (and its lines) working?

Checks, each a row of the pass/fail table:

platform
  * the HyperPod cluster is ``InService`` and Tiered Storage is ``Enable`` with the configured
    ``InstanceMemoryAllocationPercentage`` (``sagemaker:DescribeCluster``);
  * the ``ai-toolkit`` DaemonSet (namespace ``aws-hyperpod``, run by HyperPod once Tiered
    Storage is on) is ready on every node it is scheduled to;
  * the Curvine Primary StatefulSet and the Worker DaemonSet are ready;
  * the ``curvine`` CSIDriver exists and its node plugin is registered (``CSINode``) on as
    many nodes as the node-plugin DaemonSet wants;
  * the L2 mount watchdog DaemonSet is ready (``curvine.mount_watchdog.enabled``);
business line (L2 enabled)
  * its RWX PVC is ``Bound``; its inference pods (label ``app=<line>``) are Ready;
  * every pod's vLLM container has exactly one ``LMCACHE_REMOTE_URL``, equal to the line's fs://
    URL (its model-scoped directory on the Curvine mount, :func:`k8s.patch.line_remote_url`; the
    operator injects its own ``sagemaker-hyperpod://`` one; two entries mean the patch appended
    without removing it); exactly one of every other entry of
    :func:`k8s.patch.line_cache_env` (the env the admission policy and the Deployment patch set:
    ``LMCACHE_REMOTE_SERDE``, ``LMCACHE_SAVE_UNFULL_CHUNK``, ``LMCACHE_PRE_CACHING_HASH_ALGORITHM``,
    ``LMCACHE_CHUNK_SIZE``, the telemetry opt-outs, ``LMCACHE_MAX_LOCAL_CPU_SIZE`` when configured,
    ``LMCACHE_EXTRA_CONFIG`` compared as JSON, ...) with the value that function gives, read from
    it, never retyped here; the only entry not compared by value is the per-pod temp directory
    inside ``LMCACHE_EXTRA_CONFIG``, which must be ``.tmp-<token>`` (one path component) and
    differ between pods; exactly one ``KVCACHE_L2_KEY``, the ``secretKeyRef`` to the line's chunk-key
    Secret and never a value (:func:`chunk_key_problems`; the Secret itself is not read); and none of
    the names the patch owns but does not set for this line (e.g. the telemetry opt-outs when
    ``lmcache.usage_telemetry`` is on);
  * every volume the patch owns (:func:`k8s.patch.owned_volumes`: the L2 mount backed by the
    line's PVC, the ``emptyDir`` of ``PROMETHEUS_MULTIPROC_DIR``), mounted once, writable, and the
    same ``PYTHONHASHSEED`` as its siblings (and as configured): with different seeds cross-pod
    hits are silently 0;
  * every pod's vLLM container runs with ``kv_load_failure_policy: recompute`` and LMCache's
    connector: the last ``--kv-transfer-config`` of its args (vLLM keeps the last) holds every
    key of :data:`k8s.kv_transfer.PLATFORM_SETTINGS` with its value; with vLLM's default
    (``fail``) an L2 read that fails after a lookup hit fails the user's request;
  * every pod with a vLLM container carries the label of the L2 mutation
    (``kvcache.io/l2-cache=curvine``, set by the line's Kyverno Policy): a pod created while
    the policy was not ready (or while Kyverno skipped it) was never mutated, since the policy
    acts at CREATE only; delete it and its ReplicaSet recreates it mutated;
  * the L2 mount of every inference pod (and of the line's janitor) is alive, as the L2 mount
    watchdog on the pod's node saw it in its last pass (``GET /mounts`` of each watchdog pod,
    through the API server's pod proxy): a dead mount (a restarted FUSE session), a hung or a
    failing one is listed with its reason and what the watchdog did about it. Read from the
    watchdogs rather than by ``exec`` into each pod: they already bound every probe (a ``stat`` of
    a hung FUSE mount never returns), it needs only ``get pods/proxy`` in Curvine's namespace
    instead of ``create pods/exec`` (a shell) in every line's, and it is what the alert reads;
  * a gateway line (``routing_strategy: gateway``) with ``gateway.jwt`` or ``gateway.weights``: the
    operator's ``InferenceGatewayConfig`` ``<line>-gateway`` carries them (``spec.auth`` equal to the
    config's provider; every scheduler entry without ``configMapRef`` with the configured weights). The
    line's Kyverno policy writes them at admission only: an object admitted while its webhook was not
    registered, or an entry whose weights were set by hand or by the operator, keeps other values;
  * optionally (``cross_pod=True``): the same fresh prompt sent to pod A then pod B shows
    "LMCache hit tokens: N > 0" in pod B's log.

The checks are pure functions over plain dicts (Kubernetes objects as ``kubectl get -o json``
returns them, the DescribeCluster response as boto3 returns it); :class:`LiveReader` is the thin
I/O layer (kubernetes client + boto3, standard kubeconfig and credential resolution), and tests
inject a fake reader.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Iterable, Protocol

from k8s import kv_transfer, names
from k8s.gateway_policy import GATEWAY_CONFIG_API_VERSION, GATEWAY_CONFIG_PLURAL
from k8s.lmcache import POD_NAME_ENV, PYTHONHASHSEED_ENV, TMP_DIR_PREFIX, env_name, owned_env_names
from k8s.patch import DEPLOYMENT_TMP_TOKEN, chunk_key_env_entry, find_vllm_container, line_cache_env, owned_volumes
from k8s.vllm_plugins import CHUNK_KEY_ENV
from cluster_agents import l2_mount_watchdog
from cluster_agents.l2_directories import TMP_DIR_KEY  # the LMCACHE_EXTRA_CONFIG key of the temp dir (tested equal)
from observability.alerts import HOT_SPOT_FACTOR
from observability.metrics import series as metric_series
from operator_tools.preflight import CheckResult
from platform_config import BusinessLineConfig, PlatformConfig, ProjectConfig

HYPERPOD_NAMESPACE = "aws-hyperpod"
AI_TOOLKIT = "ai-toolkit"
REMOTE_URL_ENV = env_name("remote_url")
EXTRA_CONFIG_ENV = env_name("extra_config")
HASH_SEED_ENV = PYTHONHASHSEED_ENV
#: Entries of :func:`k8s.patch.line_cache_env` that have a check row of their own; the
#: "LMCache env" row compares every other entry.
OWN_ROWS = frozenset((REMOTE_URL_ENV, HASH_SEED_ENV))
#: Row of the vLLM pods' ``--kv-transfer-config`` (:func:`kv_transfer_problems`).
KV_TRANSFER_ROW = "vLLM KV transfer config"
#: vLLM + LMCache log line of a retrieval (docs/sources.md §5).
HIT_LOG_PATTERN = re.compile(r"LMCache hit tokens:\s*(\d+)")


#: The counter of prompt tokens on vLLM's ``/metrics`` (``vllm:prompt_tokens``, observability/metrics.py).
PROMPT_TOKENS_SERIES = metric_series("vllm:prompt_tokens")
#: Prompt tokens a line's replicas must have counted together before their shares are judged: about a
#: hundred requests of the reference's 1,000-token prompts; fewer, and one long prompt decides.
SHARE_MIN_PROMPT_TOKENS = 100_000


def _ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, True, detail)


def _fail(name: str, detail: str) -> CheckResult:
    return CheckResult(name, False, detail)


# --- pure checks ---------------------------------------------------------------------------------


def check_hyperpod_cluster(describe: dict[str, Any] | None, platform: PlatformConfig) -> list[CheckResult]:
    """Cluster status and Tiered Storage from a ``DescribeCluster`` response (None: not found)."""
    name = platform.hyperpod.cluster_name
    if not describe:
        return [_fail("HyperPod cluster", f"{name} not found in {platform.region}")]
    status = describe.get("ClusterStatus", "?")
    results = [CheckResult("HyperPod cluster", status == "InService", f"{name} is {status}")]
    wanted = platform.hyperpod.tiered_storage
    ts = describe.get("TieredStorageConfig") or {}
    mode, pct = ts.get("Mode", "Disable"), ts.get("InstanceMemoryAllocationPercentage")
    if not wanted.enabled:
        results.append(_ok("Tiered Storage", f"disabled in config (cluster: {mode})"))
    elif mode != "Enable":
        results.append(_fail("Tiered Storage", f"Mode is {mode}; config wants Enable at "
                                               f"{wanted.memory_allocation_percentage}%"))
    elif pct != wanted.memory_allocation_percentage:
        results.append(_fail("Tiered Storage", f"enabled at {pct}%, config says "
                                               f"{wanted.memory_allocation_percentage}%"))
    else:
        results.append(_ok("Tiered Storage", f"Enable, {pct}% of instance memory"))
    return results


def daemonset_ready(name: str, ds: dict[str, Any] | None, what: str) -> CheckResult:
    """A DaemonSet exists, is scheduled somewhere, and every scheduled pod is ready and updated."""
    if ds is None:
        return _fail(name, f"{what} not found")
    status = ds.get("status") or {}
    desired = status.get("desiredNumberScheduled", 0)
    ready = status.get("numberReady", 0)
    updated = status.get("updatedNumberScheduled", desired)
    if desired == 0:
        return _fail(name, f"{what}: scheduled on no node")
    ok = ready == desired and updated == desired
    return CheckResult(name, ok, f"{what}: {ready}/{desired} ready" + ("" if updated == desired else
                                                                      f", {updated}/{desired} updated"))


def statefulset_ready(name: str, sts: dict[str, Any] | None, what: str) -> CheckResult:
    """A StatefulSet exists, wants at least one replica, and all are ready."""
    if sts is None:
        return _fail(name, f"{what} not found")
    wanted = (sts.get("spec") or {}).get("replicas", 1)
    ready = (sts.get("status") or {}).get("readyReplicas", 0)
    return CheckResult(name, wanted >= 1 and ready == wanted, f"{what}: {ready}/{wanted} ready")


def check_ai_toolkit(daemonsets: Iterable[dict[str, Any]], platform: PlatformConfig) -> CheckResult:
    """The HyperPod ``ai-toolkit`` DaemonSet (matched by name) in ``aws-hyperpod`` is ready."""
    name = "ai-toolkit DaemonSet"
    if not platform.hyperpod.tiered_storage.enabled:
        return _ok(name, "not expected: Tiered Storage is disabled in config")
    found = [d for d in daemonsets if AI_TOOLKIT in (d.get("metadata") or {}).get("name", "")]
    if not found:
        return _fail(name, f"no DaemonSet named *{AI_TOOLKIT}* in {HYPERPOD_NAMESPACE}")
    ds = found[0]
    return daemonset_ready(name, ds, f"{HYPERPOD_NAMESPACE}/{ds['metadata']['name']}")


def check_csi_driver(driver: dict[str, Any] | None, csinodes: Iterable[dict[str, Any]],
                     node_plugin: dict[str, Any] | None) -> CheckResult:
    """The CSIDriver object exists and the node plugin registered on every node it runs on."""
    name = "CSI driver registered"
    if driver is None:
        return _fail(name, f"CSIDriver {names.CSI_DRIVER_NAME} not found")
    registered = sorted((n.get("metadata") or {}).get("name", "?") for n in csinodes
                        if any(d.get("name") == names.CSI_DRIVER_NAME for d in (n.get("spec") or {}).get("drivers") or []))
    wanted = ((node_plugin or {}).get("status") or {}).get("desiredNumberScheduled", 1)
    ok = bool(registered) and len(registered) >= wanted
    return CheckResult(name, ok, f"{names.CSI_DRIVER_NAME} on {len(registered)} node(s), node plugin wants {wanted}")


def check_pvc(line: BusinessLineConfig, pvc: dict[str, Any] | None) -> CheckResult:
    """The line's RWX PVC exists and is ``Bound``."""
    name = f"{line.name}: PVC Bound"
    ref = f"{line.namespace}/{names.pvc_name(line)}"
    if pvc is None:
        return _fail(name, f"{ref} not found")
    phase = (pvc.get("status") or {}).get("phase", "?")
    modes = (pvc.get("spec") or {}).get("accessModes") or []
    if phase != "Bound":
        return _fail(name, f"{ref} is {phase}")
    if "ReadWriteMany" not in modes:
        return _fail(name, f"{ref} is Bound but not ReadWriteMany ({', '.join(modes) or 'no access modes'})")
    return _ok(name, f"{ref} Bound, ReadWriteMany")


def _pod_name(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("name", "?")


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _env_values(container: dict[str, Any], env_name: str) -> list[str | None]:
    """Every value of ``env_name`` in the container (None for a ``valueFrom`` entry)."""
    return [e.get("value") for e in container.get("env") or [] if e.get("name") == env_name]


def _tmp_dir(extra: dict[str, Any], pod: dict[str, Any], container: dict[str, Any]) -> tuple[str | None, str]:
    """The pod's temp directory from its parsed ``LMCACHE_EXTRA_CONFIG`` (``$(KVCACHE_POD_NAME)``
    expanded to the pod name, as the kubelet does), or None and the problem."""
    tmp = extra.get(TMP_DIR_KEY)
    if not isinstance(tmp, str) or not tmp.startswith(TMP_DIR_PREFIX) or len(tmp) == len(TMP_DIR_PREFIX) \
            or "/" in tmp or tmp in (".", ".."):
        return None, f"{TMP_DIR_KEY} {tmp!r} is not {TMP_DIR_PREFIX}<token> (one path component)"
    if DEPLOYMENT_TMP_TOKEN in tmp:
        pod_name_refs = [e for e in container.get("env") or [] if e.get("name") == POD_NAME_ENV
                         and ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "metadata.name"]
        if not pod_name_refs:
            return None, f"{TMP_DIR_KEY} uses {DEPLOYMENT_TMP_TOKEN} but {POD_NAME_ENV} is not the pod name"
        tmp = tmp.replace(DEPLOYMENT_TMP_TOKEN, _pod_name(pod))
    return tmp, ""


def cache_env_problems(pod: dict[str, Any], container: dict[str, Any], expected: dict[str, str],
                       unset: Iterable[str]) -> tuple[list[str], str | None]:
    """What differs between a vLLM container's env and ``expected`` (a :func:`k8s.patch.line_cache_env`).

    Every name of ``expected`` but :data:`OWN_ROWS` must appear exactly once with the expected
    value; ``LMCACHE_EXTRA_CONFIG`` is compared as JSON, except the per-pod temp directory, which
    must be :data:`k8s.lmcache.TMP_DIR_PREFIX` plus a token. Every name of ``unset`` (owned by the
    patch, not set for this line) must be absent.

    Returns:
        ``(problems, temp directory)``: human-readable problems (empty when all match) and the
        pod's temp directory (None if it could not be read), for the cross-pod uniqueness check.
    """
    problems: list[str] = []
    tmp: str | None = None
    for name, want in expected.items():
        if name in OWN_ROWS:
            continue
        got = _env_values(container, name)
        if len(got) != 1:
            problems.append(f"{name}: {len(got)} entries" + (f" {got}" if got else ""))
            continue
        if name != EXTRA_CONFIG_ENV:
            if got[0] != want:
                problems.append(f"{name}={got[0]!r}, expected {want!r}")
            continue
        try:
            extra = json.loads(got[0] or "")
        except json.JSONDecodeError:
            problems.append(f"{name} is not JSON: {got[0]!r}")
            continue
        if not isinstance(extra, dict):
            problems.append(f"{name} is not a JSON object: {got[0]!r}")
            continue
        tmp, problem = _tmp_dir(extra, pod, container)
        if problem:
            problems.append(f"{name}: {problem}")
        wanted = {k: v for k, v in json.loads(want).items() if k != TMP_DIR_KEY}
        actual = {k: v for k, v in extra.items() if k != TMP_DIR_KEY}
        if actual != wanted:
            problems.append(f"{name}: {json.dumps(actual, sort_keys=True)}, expected "
                            f"{json.dumps(wanted, sort_keys=True)} (besides {TMP_DIR_KEY})")
    for name in unset:
        if _env_values(container, name):
            problems.append(f"{name} is set, but the line's cache env does not set it")
    return problems, tmp


def chunk_key_problems(container: dict[str, Any], line: BusinessLineConfig) -> list[str]:
    """What is wrong with the container's ``KVCACHE_L2_KEY`` (empty: nothing): it must be exactly one
    entry, the ``secretKeyRef`` to the line's chunk-key Secret (:func:`k8s.patch.chunk_key_env_entry`),
    never a value (docs/security.md, "Chunk keys"). The Secret's content is not read."""
    entries = [e for e in container.get("env") or [] if e.get("name") == CHUNK_KEY_ENV]
    want = chunk_key_env_entry(line)
    if entries == [want]:
        return []
    if any("value" in e for e in entries):
        return [f"{CHUNK_KEY_ENV} is set to a value, not read from the Secret {want['valueFrom']['secretKeyRef']['name']}"]
    return [f"{CHUNK_KEY_ENV}: {json.dumps(entries, sort_keys=True)}, expected exactly {json.dumps(want, sort_keys=True)}"]


def kv_transfer_problems(container: dict[str, Any]) -> list[str]:
    """What is wrong with the ``KVTransferConfig`` the vLLM container runs with (empty: nothing):
    no ``--kv-transfer-config``, an unreadable value, or a key of
    :data:`k8s.kv_transfer.PLATFORM_SETTINGS` missing or different in the last one."""
    try:
        settings = kv_transfer.effective_settings(container.get("args") or [])
    except ValueError as exc:
        return [str(exc)]
    if settings is None:
        return [f"no {kv_transfer.KV_TRANSFER_FLAG} in the vLLM args"]
    return [f"{key} is {settings.get(key)!r}, not {value!r}" for key, value in kv_transfer.PLATFORM_SETTINGS.items()
            if settings.get(key) != value]


def _volume_source(volume: dict[str, Any]) -> str:
    """``PVC <claim>`` or the volume's kind (``emptyDir``), for messages."""
    claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
    return f"PVC {claim}" if claim else next((k for k in volume if k != "name"), "?")


def owned_volume_problems(spec: dict[str, Any], container: dict[str, Any], line: BusinessLineConfig) -> list[str]:
    """What differs from :func:`k8s.patch.owned_volumes` (the line's L2 PVC, the Prometheus
    multiprocess ``emptyDir``, the vLLM plugin ConfigMap, whatever the patch adds later): exactly one
    mount at each path, writable or read-only as the patch mounts it, of a pod volume whose source
    has every field the patch sets."""
    problems: list[str] = []
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for volume, mount in owned_volumes(line):
        path = mount["mountPath"]
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") == path]
        if len(mounts) != 1:
            problems.append(f"{len(mounts)} mounts at {path}")
            continue
        actual = volumes.get(mounts[0].get("name")) or {}
        wrong = [k for k, v in volume.items() if k != "name" and not (
            isinstance(v, dict) and isinstance(actual.get(k), dict) and v.items() <= actual[k].items())]
        if wrong:
            problems.append(f"{path} is not {_volume_source(volume)} {json.dumps(volume[wrong[0]], sort_keys=True)} "
                            f"(got {_volume_source(actual) if actual else 'no volume'})")
        elif bool(mounts[0].get("readOnly")) != bool(mount.get("readOnly")):
            problems.append(f"{path} mounted {'read-only' if mounts[0].get('readOnly') else 'writable'}")
    return problems


def check_inference_pods(line: BusinessLineConfig, pods: list[dict[str, Any]], *,
                         platform: PlatformConfig) -> list[CheckResult]:
    """Readiness, L2 env, mount and hash seed of a line's inference pods (see module docstring).

    The expected env is :func:`k8s.patch.line_cache_env` of the line (the URL is its
    model-scoped directory, :func:`k8s.patch.line_remote_url`).
    """
    prefix = f"{line.name}: "
    expected_env = line_cache_env(platform, line)
    expected_url = expected_env[REMOTE_URL_ENV]
    unset = [n for n in owned_env_names(line) if n not in expected_env and n not in (POD_NAME_ENV, CHUNK_KEY_ENV)]
    if not pods:
        return [_fail(prefix + "inference pods", f"no pod labelled {names.OPERATOR_POD_LABEL}="
                                                 f"{names.endpoint_name(line)} in {line.namespace}")]
    ready = [p for p in pods if _ready(p)]
    # An autoscaling line may run anything from min_replicas up (its replicas is only the initial count).
    expected = line.min_replica_count
    configured = (f"{line.replicas} configured" if line.autoscaling is None else
                  f"autoscaling {line.autoscaling.min_replicas}..{line.autoscaling.max_replicas}")
    results = [CheckResult(prefix + "inference pods Ready", len(ready) == len(pods) and len(pods) >= expected,
                           f"{len(ready)}/{len(pods)} Ready, {configured}")]
    url_problems, env_problems, mount_problems, transfer_problems, seeds = [], [], [], [], {}
    tmp_dirs: dict[str, list[str]] = {}
    unmutated: list[str] = []
    for pod in pods:
        pname = _pod_name(pod)
        spec = pod.get("spec") or {}
        try:
            container = spec["containers"][find_vllm_container(spec, line)]
        except (ValueError, KeyError, IndexError) as exc:
            url_problems.append(f"{pname}: {exc}")
            env_problems.append(f"{pname}: no vLLM container")
            mount_problems.append(f"{pname}: no vLLM container")
            continue
        if ((pod.get("metadata") or {}).get("labels") or {}).get(names.L2_MUTATED_LABEL) != names.L2_MUTATED_VALUE:
            unmutated.append(pname)
        urls = _env_values(container, REMOTE_URL_ENV)
        if len(urls) != 1:
            url_problems.append(f"{pname}: {len(urls)} entries {urls}")
        elif urls[0] != expected_url:
            url_problems.append(f"{pname}: {urls[0]!r}")
        problems, tmp = cache_env_problems(pod, container, expected_env, unset)
        problems += chunk_key_problems(container, line)
        env_problems += [f"{pname}: {p}" for p in problems]
        if tmp is not None:
            tmp_dirs.setdefault(tmp, []).append(pname)
        mount_problems += [f"{pname}: {p}" for p in owned_volume_problems(spec, container, line)]
        transfer_problems += [f"{pname}: {p}" for p in kv_transfer_problems(container)]
        seed = _env_values(container, HASH_SEED_ENV)
        seeds[pname] = seed[-1] if len(seed) == 1 else (f"{len(seed)} entries {seed}" if seed else None)
    # Two writers of one temp directory race on the same temp file (LMCache issue #2517).
    env_problems += [f"{', '.join(sorted(p))} share the temp directory {d}" for d, p in sorted(tmp_dirs.items())
                     if len(p) > 1]
    results.append(CheckResult(
        prefix + "L2 mutation", not unmutated,
        (f"{len(unmutated)} vLLM pod(s) without {names.L2_MUTATED_LABEL}={names.L2_MUTATED_VALUE} (created before the "
         f"Kyverno policy was ready?): {', '.join(sorted(unmutated))}; delete them to have them recreated")
        if unmutated else f"{names.L2_MUTATED_LABEL}={names.L2_MUTATED_VALUE} on all {len(pods)} pod(s)"))
    results.append(CheckResult(prefix + REMOTE_URL_ENV, not url_problems,
                               "; ".join(url_problems) or f"exactly one, {expected_url}, in {len(pods)} pod(s)"))
    compared = [n for n in expected_env if n not in OWN_ROWS]
    results.append(CheckResult(prefix + "LMCache env", not env_problems,
                               "; ".join(env_problems) or f"{len(compared)} variables as configured "
                               f"({', '.join(compared)}) in {len(pods)} pod(s)"))
    results.append(CheckResult(prefix + KV_TRANSFER_ROW, not transfer_problems, "; ".join(transfer_problems) or (
        f"{kv_transfer.settings_json(kv_transfer.PLATFORM_SETTINGS)} in {len(pods)} pod(s)")))
    results.append(CheckResult(prefix + "L2 mount", not mount_problems, "; ".join(mount_problems) or "; ".join(
        f"{m['mountPath']} from {_volume_source(v)}" for v, m in owned_volumes(line))))
    distinct = sorted({str(s) for s in seeds.values()})
    expected = expected_env[HASH_SEED_ENV]
    seed_ok = distinct == [expected]
    if seed_ok:
        detail = f"{expected} in all {len(seeds)} pod(s)"
    else:
        detail = ", ".join(f"{p}={s}" for p, s in sorted(seeds.items())) + f" (config: {expected})"
    results.append(CheckResult(prefix + "PYTHONHASHSEED shared", seed_ok, detail))
    return results


def watchdog_reports(reader: "Reader", platform: PlatformConfig) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The last pass of the L2 mount watchdog on each node: (node -> its ``/mounts`` report,
    problems reaching them). A watchdog pod not Running, not answering or without a finished
    pass is a problem, never an exception."""
    ns = platform.curvine.namespace
    reports: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for pod in reader.list("Pod", ns, f"app.kubernetes.io/name={names.L2_MOUNT_WATCHDOG}"):
        name, node = _pod_name(pod), (pod.get("spec") or {}).get("nodeName", "?")
        phase = (pod.get("status") or {}).get("phase")
        if phase != "Running":
            problems.append(f"watchdog {name} on {node} is {phase}")
            continue
        try:
            report = reader.pod_get(ns, name, l2_mount_watchdog.METRICS_PORT, l2_mount_watchdog.MOUNTS_PATH.lstrip("/"))
        except Exception as exc:  # any transport error is a finding, not a crash
            problems.append(f"watchdog {name} on {node} did not answer: {exc}")
            continue
        if not isinstance(report, dict):
            problems.append(f"watchdog {name} on {node} has not finished a pass yet")
            continue
        reports[node] = report
    return reports, problems


def check_l2_mounts(line: BusinessLineConfig, pods: list[dict[str, Any]], reports: dict[str, dict[str, Any]],
                    reading_problems: list[str]) -> CheckResult:
    """Every pod of ``pods`` (the line's inference pods and janitor) has its Curvine mount alive in
    the last pass of the watchdog on its node (:func:`watchdog_reports`)."""
    problems: list[str] = []
    for pod in pods:
        pname, node = _pod_name(pod), (pod.get("spec") or {}).get("nodeName", "?")
        uid = (pod.get("metadata") or {}).get("uid")
        report = reports.get(node)
        if report is None:
            problems.append(f"{pname}: no report from the L2 mount watchdog on {node}")
            continue
        mounts = [m for m in report.get("mounts") or [] if m.get("pod_uid") == uid]
        if not mounts:
            problems.append(f"{pname}: the watchdog on {node} sees no Curvine mount of it")
        for m in mounts:
            if m.get("state") != l2_mount_watchdog.ALIVE:
                action = f"; {m['action']}" if m.get("action") else ""
                problems.append(f"{pname} on {node}: {m.get('state')} ({m.get('reason')}){action}")
    if problems and reading_problems:
        problems.append("; ".join(reading_problems))
    nodes = len({(p.get("spec") or {}).get("nodeName") for p in pods})
    return CheckResult(f"{line.name}: L2 mounts alive", not problems, "; ".join(problems) or
                       f"alive in all {len(pods)} pod(s), per the L2 mount watchdog on {nodes} node(s)")


def check_gateway_settings(line: BusinessLineConfig, gateway: dict[str, Any] | None) -> CheckResult:
    """The line's ``gateway.jwt`` and ``gateway.weights`` on the live ``InferenceGatewayConfig``
    ``<line>-gateway`` (as :func:`k8s.gateway_policy.gateway_policy_manifest` writes them): ``spec.auth`` is
    exactly ``{jwt: {provider}}`` of the config, and every scheduler entry without ``configMapRef`` has
    the configured weights. Failing, the detail says what differs and how to re-apply the policy."""
    name = f"{line.name}: gateway settings"
    where = f"{line.namespace}/{names.gateway_name(line)}"
    if gateway is None:
        return _fail(name, f"InferenceGatewayConfig {where} not found (the operator creates it once the endpoint "
                           "attaches to the gateway)")
    spec = gateway.get("spec") or {}
    problems = []
    if line.gateway.jwt is not None:
        expected = {"jwt": {"provider": line.gateway.jwt.manifest()}}
        if spec.get("auth") != expected:
            problems.append(f"spec.auth is {json.dumps(spec.get('auth'))}, the config says {json.dumps(expected)} "
                            f"(re-run the policy: kubectl -n {line.namespace} annotate inferencegatewayconfig "
                            f"{names.gateway_name(line)} kvcache.io/resync=\"$(date +%s)\" --overwrite)")
    if line.gateway.weights is not None:
        expected_weights = line.gateway.weights.manifest()
        other = [str(e.get("name")) for e in spec.get("schedulers") or []
                 if "configMapRef" not in e and e.get("weights") != expected_weights]
        if other:
            problems.append(f"scheduler entries {', '.join(other)} have weights other than gateway.weights "
                            f"{json.dumps(expected_weights)} (set by hand or by the operator; remove an entry's "
                            "weights and the policy adds the configured ones at that update)")
    if problems:
        return _fail(name, "; ".join(problems))
    said = [w for w, on in (("spec.auth", line.gateway.jwt), ("weights", line.gateway.weights)) if on is not None]
    return _ok(name, f"{where}: {' and '.join(said)} as configured")


def parse_hit_tokens(log_text: str) -> int | None:
    """The last "LMCache hit tokens: N" in a log, or None if the line never appears."""
    hits = HIT_LOG_PATTERN.findall(log_text)
    return int(hits[-1]) if hits else None


def check_cross_pod_hit(line: BusinessLineConfig, pod_a: str, pod_b: str, log_b: str) -> CheckResult:
    """Pod B's log after the second of two identical requests shows a non-zero L2 hit."""
    name = f"{line.name}: cross-pod hit"
    hits = parse_hit_tokens(log_b)
    if hits is None:
        return _fail(name, f"no 'LMCache hit tokens' line in {pod_b}'s log (is LMCache enabled?)")
    return CheckResult(name, hits > 0, f"{hits} tokens of {pod_a}'s prompt hit in {pod_b}")


def counter_total(metrics_text: str, series_name: str) -> float | None:
    """The sum of every sample of ``series_name`` in a Prometheus text exposition (None: no sample)."""
    total, seen = 0.0, False
    for raw in metrics_text.splitlines():
        if not raw.startswith(series_name) or raw[len(series_name):len(series_name) + 1] not in ("{", " "):
            continue
        rest = raw[len(series_name):]
        if rest.startswith("{"):
            rest = rest[rest.rfind("}") + 1:]
        fields = rest.split()
        try:
            total += float(fields[0])
            seen = True
        except (IndexError, ValueError):
            continue
    return total if seen else None


def check_replica_shares(line: BusinessLineConfig, prompt_tokens: dict[str, float | None]) -> CheckResult:
    """Each Ready replica's share of the line's prompt tokens since it started (its ``vllm:prompt_tokens``
    counter), against :data:`observability.alerts.HOT_SPOT_FACTOR` x its fair share: the hot-spot alert's
    rule on the counters as they stand (after an upgrade or a re-created endpoint, before the alert's
    30 minutes have passed; docs/routing.md)."""
    name = f"{line.name}: replica shares ({line.routing_strategy})"
    if len(prompt_tokens) < 2:
        return _ok(name, f"{len(prompt_tokens)} Ready replica(s): nothing to balance")
    missing = sorted(pod for pod, tokens in prompt_tokens.items() if tokens is None)
    if missing:
        return _fail(name, f"no {PROMPT_TOKENS_SERIES} on the /metrics of {', '.join(missing)}")
    total = sum(t or 0.0 for t in prompt_tokens.values())
    if total < SHARE_MIN_PROMPT_TOKENS:
        return _ok(name, f"{total:,.0f} prompt tokens so far: too few to judge (below {SHARE_MIN_PROMPT_TOKENS:,})")
    fair = 1 / len(prompt_tokens)
    shares = {pod: (tokens or 0.0) / total for pod, tokens in sorted(prompt_tokens.items())}
    listed = ", ".join(f"{pod} {share:.0%}" for pod, share in shares.items())
    hot = [pod for pod, share in shares.items() if share > HOT_SPOT_FACTOR * fair]
    if hot:
        return _fail(name, f"{', '.join(hot)} took over {HOT_SPOT_FACTOR:g}x its fair share ({fair:.0%}) of "
                           f"{total:,.0f} prompt tokens: {listed}; a routing hot spot (docs/routing.md)")
    return _ok(name, f"prompt tokens since each pod started: {listed}")


# --- I/O ---------------------------------------------------------------------------------------


class Reader(Protocol):
    """What :func:`verify` reads; :class:`LiveReader` talks to AWS and Kubernetes."""

    def describe_cluster(self, name: str) -> dict[str, Any] | None: ...
    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...
    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]: ...
    def pod_get(self, namespace: str, pod: str, port: int, path: str) -> Any: ...
    def pod_post(self, namespace: str, pod: str, port: int, path: str, body: dict[str, Any]) -> Any: ...
    def pod_text(self, namespace: str, pod: str, port: int, path: str) -> str: ...
    def pod_log(self, namespace: str, pod: str, container: str, since_seconds: int) -> str: ...


def cross_pod_probe(reader: Reader, line: BusinessLineConfig, pods: list[dict[str, Any]], *,
                    prompt_tokens: int = 2048, settle_s: float = 2.0) -> CheckResult:
    """Send one fresh prompt to pod A, the same to pod B, and check pod B's log for a hit.

    The prompt starts with a random nonce so no earlier run can have cached it; it is about
    ``prompt_tokens`` words long (several whole chunks). Pods on different nodes are
    preferred, so the hit is a cross-node L2 read. The model id comes from pod A's
    ``/v1/models``.
    """
    ready = [p for p in pods if _ready(p)]
    if len(ready) < 2:
        return _fail(f"{line.name}: cross-pod hit", f"needs 2 Ready pods, found {len(ready)}")
    pod_a = ready[0]
    others = [p for p in ready[1:] if (p.get("spec") or {}).get("nodeName") != (pod_a.get("spec") or {}).get("nodeName")]
    pod_b = (others or ready[1:])[0]
    a, b = _pod_name(pod_a), _pod_name(pod_b)
    spec_b = pod_b.get("spec") or {}
    container_b = spec_b["containers"][find_vllm_container(spec_b, line)]["name"]
    port = line.vllm.port
    models = reader.pod_get(line.namespace, a, port, "v1/models")
    model_id = models["data"][0]["id"]
    nonce = uuid.uuid4().hex
    prompt = f"verify {nonce}: " + " ".join(f"word{i % 997}" for i in range(prompt_tokens))
    body = {"model": model_id, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    started = time.monotonic()
    reader.pod_post(line.namespace, a, port, "v1/completions", body)
    time.sleep(settle_s)  # let pod A's LMCache finish writing the chunks to L2
    reader.pod_post(line.namespace, b, port, "v1/completions", body)
    since = int(time.monotonic() - started) + 5
    return check_cross_pod_hit(line, a, b, reader.pod_log(line.namespace, b, container_b, since))


def verify(reader: Reader, project: ProjectConfig, *, lines: Iterable[str] | None = None,
           cross_pod: bool = False, platform_checks: bool = True) -> list[CheckResult]:
    """Run every check against ``reader``; ``lines`` limits the business lines (default all).

    Raises:
        KeyError: a name in ``lines`` is not a business line of ``project``.
    """
    platform = project.platform
    selected = [project.business_line(n) for n in lines] if lines is not None else list(project.business_lines)
    results: list[CheckResult] = []
    if platform_checks:
        results += check_hyperpod_cluster(reader.describe_cluster(platform.hyperpod.cluster_name), platform)
        results.append(check_ai_toolkit(reader.list("DaemonSet", HYPERPOD_NAMESPACE), platform))
        if platform.curvine.enabled:
            ns = platform.curvine.namespace
            results.append(statefulset_ready("Curvine Primary ready", reader.get("StatefulSet", ns, names.CURVINE_MASTER),
                                             f"{ns}/{names.CURVINE_MASTER}"))
            results.append(daemonset_ready("Curvine Workers ready", reader.get("DaemonSet", ns, names.CURVINE_WORKER),
                                           f"{ns}/{names.CURVINE_WORKER}"))
            results.append(check_csi_driver(reader.get("CSIDriver", None, names.CSI_DRIVER_NAME),
                                            reader.list("CSINode"), reader.get("DaemonSet", ns, names.CSI_NODE)))
            if platform.curvine.mount_watchdog.enabled:
                results.append(daemonset_ready("L2 mount watchdog ready",
                                               reader.get("DaemonSet", ns, names.L2_MOUNT_WATCHDOG),
                                               f"{ns}/{names.L2_MOUNT_WATCHDOG}"))
    watch = platform.curvine.enabled and platform.curvine.mount_watchdog.enabled
    reports: tuple[dict[str, dict[str, Any]], list[str]] | None = None
    for line in selected:
        pods = reader.list("Pod", line.namespace, f"{names.OPERATOR_POD_LABEL}={names.endpoint_name(line)}")
        results.append(replica_shares(reader, line, pods))
        if line.gateway.jwt is not None or line.gateway.weights is not None:
            results.append(check_gateway_settings(
                line, reader.get("InferenceGatewayConfig", line.namespace, names.gateway_name(line))))
        if not line.cache.l2_enabled:
            results.append(_ok(f"{line.name}: L2", "cache.l2_enabled is false; nothing to check"))
            continue
        results.append(check_pvc(line, reader.get("PersistentVolumeClaim", line.namespace, names.pvc_name(line))))
        results += check_inference_pods(line, pods, platform=project.platform)
        if watch:
            if reports is None:
                reports = watchdog_reports(reader, platform)
            janitors = reader.list("Pod", line.namespace, f"app.kubernetes.io/name={names.L2_JANITOR}")
            results.append(check_l2_mounts(line, pods + janitors, *reports))
        if cross_pod:
            try:
                results.append(cross_pod_probe(reader, line, pods))
            except Exception as exc:  # any transport error is a failed check, not a crash
                results.append(_fail(f"{line.name}: cross-pod hit", f"probe failed: {exc}"))
    return results


def replica_shares(reader: Reader, line: BusinessLineConfig, pods: list[dict[str, Any]]) -> CheckResult:
    """:func:`check_replica_shares` of the line's Ready pods, each pod's ``/metrics`` read through the API
    server's pod proxy; a pod that does not answer counts as one without the counter."""
    tokens: dict[str, float | None] = {}
    for pod in pods:
        if not _ready(pod):
            continue
        try:
            text = reader.pod_text(line.namespace, _pod_name(pod), line.vllm.port, "metrics")
        except Exception:  # unreachable, 5xx: reported as a pod without the counter
            text = ""
        tokens[_pod_name(pod)] = counter_total(text, PROMPT_TOKENS_SERIES)
    return check_replica_shares(line, tokens)


class LiveReader:
    """Reads the live cluster: kubernetes client (kubeconfig, or in-cluster config) and boto3
    (standard credential chain). Objects are returned as plain dicts in the API's camelCase,
    as ``kubectl get -o json`` shows them; 404 becomes None."""

    def __init__(self, region: str, *, context: str | None = None, session: Any = None) -> None:
        import boto3
        from kubernetes import client, config

        try:
            config.load_kube_config(context=context)
        except config.ConfigException as exc:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                raise RuntimeError(f"no usable kubeconfig ({exc}) and not running in a pod; run "
                                   "`aws eks update-kubeconfig --name <cluster>` first") from None
        self._api = client.ApiClient()
        self._core = client.CoreV1Api(self._api)
        self._apps = client.AppsV1Api(self._api)
        self._storage = client.StorageV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._sagemaker = (session or boto3.Session(region_name=region)).client("sagemaker")
        self._not_found = client.exceptions.ApiException

    def _dict(self, obj: Any) -> dict[str, Any]:
        return self._api.sanitize_for_serialization(obj)

    def describe_cluster(self, name: str) -> dict[str, Any] | None:
        try:
            return self._sagemaker.describe_cluster(ClusterName=name)
        except self._sagemaker.exceptions.ResourceNotFound:
            return None

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        read = {
            "DaemonSet": lambda: self._apps.read_namespaced_daemon_set(name, namespace),
            "StatefulSet": lambda: self._apps.read_namespaced_stateful_set(name, namespace),
            "Deployment": lambda: self._apps.read_namespaced_deployment(name, namespace),
            "PersistentVolumeClaim": lambda: self._core.read_namespaced_persistent_volume_claim(name, namespace),
            "CSIDriver": lambda: self._storage.read_csi_driver(name),
            "InferenceGatewayConfig": lambda: self._custom.get_namespaced_custom_object(
                *GATEWAY_CONFIG_API_VERSION.split("/"), namespace, GATEWAY_CONFIG_PLURAL, name),
        }[kind]
        try:
            return self._dict(read())
        except self._not_found as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        kwargs = {"label_selector": label_selector} if label_selector else {}
        call = {
            "DaemonSet": lambda: self._apps.list_namespaced_daemon_set(namespace, **kwargs),
            "Pod": lambda: self._core.list_namespaced_pod(namespace, **kwargs),
            "CSINode": lambda: self._storage.list_csi_node(**kwargs),
        }[kind]
        return [self._dict(item) for item in call().items]

    def _pod_proxy(self, method: str, namespace: str, pod: str, port: int, path: str, body: Any = None, *,
                   text: bool = False) -> Any:
        # Pod and namespace names are DNS labels: safe in a path as they are.
        params = self._api.param_serialize(
            method=method, resource_path=f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/{path}", body=body,
            header_params={"Content-Type": "application/json", "Accept": "text/plain" if text else "application/json"},
            auth_settings=["BearerToken"])
        response = self._api.call_api(*params, _request_timeout=120)
        response.read()
        if text:
            return (response.data or b"").decode("utf-8", "replace")
        return json.loads(response.data or b"null")

    def pod_get(self, namespace: str, pod: str, port: int, path: str) -> Any:
        return self._pod_proxy("GET", namespace, pod, port, path)

    def pod_text(self, namespace: str, pod: str, port: int, path: str) -> str:
        """A pod's plain-text answer (``/metrics``) through the API server's pod proxy."""
        return self._pod_proxy("GET", namespace, pod, port, path, text=True)

    def pod_post(self, namespace: str, pod: str, port: int, path: str, body: dict[str, Any]) -> Any:
        return self._pod_proxy("POST", namespace, pod, port, path, body)

    def pod_log(self, namespace: str, pod: str, container: str, since_seconds: int) -> str:
        return self._core.read_namespaced_pod_log(pod, namespace, container=container, since_seconds=since_seconds)


def format_results(results: list[CheckResult]) -> str:
    """The pass/fail table ``scripts/verify.py`` prints."""
    width = max((len(r.name) for r in results), default=0)
    rows = [f"{'PASS' if r.ok else 'FAIL'}  {r.name:<{width}}  {r.detail}" for r in results]
    failed = sum(not r.ok for r in results)
    rows.append(f"\nverify: {len(results)} checks, {failed} failing")
    return "\n".join(rows)
