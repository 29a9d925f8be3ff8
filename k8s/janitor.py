"""The Kubernetes side of a line's L2 janitor (its logic is :mod:`cluster_agents.l2_janitor`).

Objects, all in the line's namespace (the PVC is namespaced, so the janitor must run there):

* ConfigMap ``l2-janitor``: ``janitor.json`` (:func:`janitor_config`), ``l2_janitor.py`` (the
  module's source), ``l2_directories.py`` (which directories a pass keeps) and ``agent_core.py``,
  standard library only, so the pinned ``python`` image
  needs no build step (:class:`k8s.agent.LineAgent`); for a line with hot prefixes
  (``hot_prefixes``, docs/l2-cache.md "Hot prefixes") also ``hot_prefixes.json``
  (:func:`hot_prefix_config`), one ``prefix-<i>[-<j>].txt`` per text and ``hot_prefixes.py``
  (:mod:`cluster_agents.hot_prefixes`), and the container gets ``--hot-prefixes``: it warms the prefixes
  through the line's replicas (by Pod IP, the Pods its Role already lists) and keeps their chunks.
  No other object and no other right: the warm-up needs the PVC (to see and keep the chunks) and
  the Pod list, both the janitor's already;
* ServiceAccount, Role and RoleBinding ``l2-janitor``: ``list`` on ``pods`` in this namespace,
  nothing else (the janitor reads the live Pods' ``LMCACHE_REMOTE_URL`` and temp directory so it
  never deletes a directory a running Pod writes to);
* Deployment ``l2-janitor``: one replica, strategy ``Recreate`` (the old Pod is gone before the
  new one starts, so two janitors do not prune one directory at once), mounting the line's PVC at
  the same path as the vLLM Pods. Its container runs ``l2_janitor.py --serve``: a pass every
  :data:`PERIOD_S`, one at a time, and the last pass's gauges on ``GET /metrics`` (container
  port :data:`k8s.names.L2_JANITOR_METRICS_PORT_NAME`, Pod label
  :data:`k8s.names.L2_JANITOR_COMPONENT_LABEL`: what the observability stack scrapes). A
  liveness probe restarts a container whose pass has run longer than :data:`PASS_DEADLINE_S`;
  a readiness probe shows a janitor whose last pass failed as not ready. A pod-template
  annotation carries a hash of the ConfigMap, so a new script or setting rolls the Pod.

Why a Deployment and not a CronJob: a CronJob's Pod lives for one pass, too briefly to be
scraped, and Curvine's CSI driver (v0.3.2-alpha) reports no volume stats, so the janitor is the
only source of a line's L2 use.

Why each number (docs/l2-cache.md, "Day two"):

* :data:`MIN_DELETE_AGE_S` = 600 s: a chunk deleted between LMCache's lookup and its retrieve
  is not an error in lmcache 0.5.5 (the pinned release, :data:`k8s.lmcache.LMCACHE_VERSION`; read in
  its wheel): ``FSConnector.get`` returns None on ``FileNotFoundError``,
  ``retrieve`` stops at the first missing chunk, and the vLLM adapter reports the blocks it
  could not load (``get_block_ids_with_load_errors``) so vLLM recomputes them. The age guard
  keeps the chunks written in the last ten minutes (those a sibling Pod or the next turn of a
  conversation most likely looks up next) out of reach, which makes that recompute path rare;
  it is also at least one janitor period, so a file is always seen by one pass before it can
  be deleted by the next.
* :data:`PERIOD_S` 10 minutes: the pool must absorb what lines write between two passes,
  which is what ``curvine.l2_pool_reserve_fraction`` reserves.
* :data:`DIR_GRACE_S` 24 hours: a model directory the configuration or a Pod named within it is
  never deleted (besides the current and the previous configuration's, kept for good): a
  rollback, Pods waiting for GPUs or admission, a janitor that was down. It costs no capacity:
  the age limit and the watermarks still delete the chunk files inside (``cluster_agents.l2_janitor``).
"""

from __future__ import annotations

import json
from typing import Any, Final

import cdk8s
from constructs import Construct

from k8s import agent, names
from k8s.kube import k8s
from k8s.lmcache import PINNED_SETTINGS, l2_cache_dir
from k8s.nodes import hyperpod_node_requirements, instance_group_tolerations
from k8s.patch import L2_MOUNT_PATH
from cluster_agents import hot_prefixes, l2_janitor
from platform_config import BusinessLineConfig, PlatformConfig, pod_resources
from platform_config.fields import quantity_bytes
from platform_config.vllm_args import PIPELINE_PARALLEL_FLAG, TENSOR_PARALLEL_FLAG, parallel_sizes

NAME: Final = names.L2_JANITOR
CONFIG_FILE: Final = "janitor.json"
SCRIPT_FILE: Final = "l2_janitor.py"
HOT_PREFIX_CONFIG_FILE: Final = "hot_prefixes.json"
HOT_PREFIX_SCRIPT_FILE: Final = "hot_prefixes.py"
#: The module the janitor imports beside agent_core.py (:mod:`cluster_agents.l2_directories`).
DIRECTORIES_FILE: Final = "l2_directories.py"
CONFIG_DIR: Final = "/opt/kvcache-janitor"
#: Seconds from the start of one pass to the start of the next (every 10 minutes).
PERIOD_S: Final = l2_janitor.PERIOD_S
#: Nothing younger than this is deleted (module docstring); at least one period.
MIN_DELETE_AGE_S: Final = 600
#: A model directory the configuration or a Pod named within this many seconds is kept.
DIR_GRACE_S: Final = l2_janitor.DIR_GRACE_S
#: A pass that has not finished after this fails the liveness probe; the restarted container
#: starts over with a new pass.
PASS_DEADLINE_S: Final = l2_janitor.PASS_DEADLINE_S
#: Liveness probe: every minute, restart after 3 failures in a row (a pass stuck for about
#: PASS_DEADLINE_S + 3 minutes). Readiness: every 30 s, not ready at the first failed pass.
LIVENESS_PERIOD_S: Final = 60
LIVENESS_FAILURES: Final = 3
READINESS_PERIOD_S: Final = 30
PROBE_TIMEOUT_S: Final = 5
#: Pod-template annotation holding the SHA-256 of the ConfigMap's data (rolls the Pod on a change).
CONFIG_HASH_ANNOTATION: Final = "kvcache.io/l2-janitor-config-sha256"
#: Shared with the per-node budget of the config check (:mod:`platform_config.pod_resources`).
RESOURCES: Final = pod_resources.JANITOR_RESOURCES
#: Pod labels of the janitor; deliberately not the operator's ``app=<line>``. The component label
#: is what the observability stack's scrape job selects on.
LABELS: Final = {"app.kubernetes.io/name": NAME, names.L2_JANITOR_COMPONENT_LABEL[0]: names.L2_JANITOR_COMPONENT_LABEL[1]}


def janitor_config(platform: PlatformConfig, line: BusinessLineConfig) -> dict[str, Any]:
    """``janitor.json`` of the line (the fields of :class:`cluster_agents.l2_janitor.JanitorConfig`).

    ``live_dir`` is :func:`k8s.lmcache.l2_cache_dir`; ``capacity_bytes`` the PVC's ``l2_size``;
    the watermarks ``curvine.eviction.high_watermark`` / ``low_watermark`` (fractions of it);
    ``max_age_s`` ``curvine.eviction.ttl_hours`` in seconds (None when 0); ``dir_grace_s``
    :data:`DIR_GRACE_S`; ``retire_grace_s`` the janitor's own
    :data:`cluster_agents.l2_janitor.RETIRE_GRACE_S` (an evicted chunk leaves lookups at once, its
    files go at the first pass that long after: docs/l2-cache.md, "Evictions and readers on other nodes").
    """
    ev = platform.curvine.eviction
    config = {
        "line": line.name,
        "namespace": line.namespace,
        "live_dir": l2_cache_dir(platform, line),
        "capacity_bytes": int(quantity_bytes(line.cache.l2_size)),
        "high_watermark": ev.high_watermark,
        "low_watermark": ev.low_watermark,
        "max_age_s": ev.ttl_hours * 3600 if ev.ttl_hours else None,
        "min_delete_age_s": MIN_DELETE_AGE_S,
        "mount_path": L2_MOUNT_PATH,
        "dir_grace_s": DIR_GRACE_S,
        "retire_grace_s": l2_janitor.RETIRE_GRACE_S,
        "key_secret": names.chunk_key_secret_name(line),
    }
    l2_janitor.config_from_dict(config)  # the same validation the janitor applies at run time
    return config


def pinned_hash_algorithm() -> str:
    """LMCache's ``pre_caching_hash_algorithm`` as the L2 policy pins it (:data:`k8s.lmcache.PINNED_SETTINGS`)."""
    return next(s.value for s in PINNED_SETTINGS if s.key == "pre_caching_hash_algorithm")


def hot_prefix_config(platform: PlatformConfig, line: BusinessLineConfig) -> tuple[dict[str, Any], dict[str, str]] | None:
    """``hot_prefixes.json`` of the line (the fields of :class:`cluster_agents.hot_prefixes.HotPrefixConfig`)
    and the text files it names (ConfigMap key -> text), or None when the line warms no prefix
    (``hot_prefixes.enabled`` false, none declared, or L2 off).

    The texts are ConfigMap keys of their own (``prefix-<i>.txt``, ``prefix-<i>-<j>.txt`` for message
    ``j`` of prefix ``i``), not strings inside the JSON, so the template escapes them once less.
    ``world_size`` is TP x PP (vLLM's ``parallel_config.world_size``: one chunk file per rank);
    ``pod_label``, ``port`` and ``port_name`` find the replicas as the canary does.
    """
    if not (line.cache.l2_enabled and line.hot_prefixes.active):
        return None
    sizes = parallel_sizes(line.vllm.args)
    files: dict[str, str] = {}
    prefixes: list[dict[str, Any]] = []
    for i, prefix in enumerate(line.hot_prefixes.prefixes):
        if prefix.messages:
            entry: dict[str, Any] = {"name": prefix.name, "messages": []}
            for j, message in enumerate(prefix.messages):
                files[f"prefix-{i}-{j}.txt"] = message.text
                entry["messages"].append({"role": message.role, "file": f"prefix-{i}-{j}.txt"})
        else:
            files[f"prefix-{i}.txt"] = prefix.raw_text
            entry = {"name": prefix.name, "file": f"prefix-{i}.txt"}
        prefixes.append(entry)
    config = {
        "line": line.name,
        "namespace": line.namespace,
        "live_dir": l2_cache_dir(platform, line),
        "mount_path": L2_MOUNT_PATH,
        "pod_label": [names.OPERATOR_POD_LABEL, names.endpoint_name(line)],
        "port": line.vllm.port,
        "port_name": names.VLLM_PORT_NAME,
        "chunk_size": line.cache.chunk_size_tokens,
        "world_size": sizes.get(TENSOR_PARALLEL_FLAG, 1) * sizes.get(PIPELINE_PARALLEL_FLAG, 1),
        "python_hash_seed": line.python_hash_seed,
        "hash_algorithm": pinned_hash_algorithm(),
        "key_secret": names.chunk_key_secret_name(line),
        "warm_period_s": line.hot_prefixes.warm_period_minutes * 60,
        "prefixes": prefixes,
    }
    # The same validation the agent applies at run time (texts given here, not read from files).
    hot_prefixes.HotPrefixConfig(**{**config, "pod_label": tuple(config["pod_label"]), "prefixes": ()})
    return config, files


#: The cluster-wide admission policy (and binding) on the L2 janitors' Secret creates.
KEY_SECRET_LIMITS: Final = "kvcache-l2-janitor-secrets"


def key_secret_limits(scope: Construct, labels: dict[str, str] | None = None
                      ) -> tuple[k8s.KubeValidatingAdmissionPolicy, k8s.KubeValidatingAdmissionPolicyBinding]:
    """``kvcache-l2-janitor-secrets``: an L2 janitor's identity (service account ``l2-janitor`` of any
    namespace) may create only a chunk-key Secret (``kvcache-l2-key-*``, :func:`k8s.names.chunk_key_secret_name`),
    ``Opaque`` and ``immutable`` (:meth:`cluster_agents.l2_janitor.ChunkKey.secret_object`). RBAC cannot
    name the object of a ``create``, so without it a stolen janitor token could create any Secret in its
    line's namespace (a service-account token Secret included). One cluster-scoped
    ValidatingAdmissionPolicy and binding (``Deny``, fails closed) in the L2 chart, beside
    ``curvine-csi-node-limits``: the line charts hold only objects of their own namespace."""
    prefix = names.CHUNK_KEY_SECRET_PREFIX
    policy = k8s.KubeValidatingAdmissionPolicy(
        scope, "JanitorSecretLimits", metadata=k8s.ObjectMeta(name=KEY_SECRET_LIMITS, labels=labels),
        spec=k8s.ValidatingAdmissionPolicySpec(
            failure_policy="Fail",
            match_constraints=k8s.MatchResources(resource_rules=[k8s.NamedRuleWithOperations(
                api_groups=[""], api_versions=["v1"], operations=["CREATE"], resources=["secrets"])]),
            match_conditions=[k8s.MatchCondition(
                name="l2-janitor", expression=("request.userInfo.username.startsWith('system:serviceaccount:')"
                                               f" && request.userInfo.username.endsWith(':{NAME}')"))],
            validations=[k8s.Validation(
                expression=(f"has(object.metadata.name) && object.metadata.name.startsWith('{prefix}')"
                            " && has(object.type) && object.type == 'Opaque'"
                            " && has(object.immutable) && object.immutable == true"),
                reason="Forbidden",
                message=f"an L2 janitor may create only its line's chunk-key Secret ({prefix}<generation>, "
                        "type Opaque, immutable)")]))
    binding = k8s.KubeValidatingAdmissionPolicyBinding(
        scope, "JanitorSecretLimitsBinding", metadata=k8s.ObjectMeta(name=KEY_SECRET_LIMITS, labels=labels),
        spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=KEY_SECRET_LIMITS, validation_actions=["Deny"]))
    binding.add_dependency(policy)
    return policy, binding


class L2Janitor(agent.LineAgent):
    """The janitor's ConfigMap, RBAC and Deployment for one line (see the module docstring and
    :class:`k8s.agent.LineAgent` for the attributes)."""

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 line: BusinessLineConfig) -> None:
        hot = hot_prefix_config(platform, line)
        extra_files = {DIRECTORIES_FILE: agent.source(DIRECTORIES_FILE)}
        if hot is not None:
            extra_files |= {HOT_PREFIX_CONFIG_FILE: json.dumps(hot[0], indent=2, sort_keys=True) + "\n",
                            HOT_PREFIX_SCRIPT_FILE: agent.source(HOT_PREFIX_SCRIPT_FILE), **hot[1]}
        super().__init__(scope, construct_id, name=NAME, namespace=line.namespace, labels=LABELS, script=SCRIPT_FILE,
                         config_file=CONFIG_FILE, config=janitor_config(platform, line), config_dir=CONFIG_DIR,
                         hash_annotation=CONFIG_HASH_ANNOTATION, extra_files=extra_files)
        port = names.L2_JANITOR_METRICS_PORT_NAME
        container = k8s.Container(
            name="janitor", image=platform.versions.images.l2_janitor,
            command=[*self.command, "--root", L2_MOUNT_PATH, "--serve", "--port", str(l2_janitor.METRICS_PORT),
                     "--period-s", str(PERIOD_S), "--pass-deadline-s", str(PASS_DEADLINE_S),
                     "--termination-log", "/dev/termination-log",
                     *(["--hot-prefixes", f"{CONFIG_DIR}/{HOT_PREFIX_CONFIG_FILE}"] if hot is not None else [])],
            env=agent.python_env(),
            ports=[k8s.ContainerPort(name=port, container_port=l2_janitor.METRICS_PORT, protocol="TCP")],
            liveness_probe=agent.http_probe(l2_janitor.LIVENESS_PATH, port, period_s=LIVENESS_PERIOD_S,
                                            failures=LIVENESS_FAILURES, timeout_s=PROBE_TIMEOUT_S),
            readiness_probe=agent.http_probe(l2_janitor.READINESS_PATH, port, period_s=READINESS_PERIOD_S,
                                             failures=1, timeout_s=PROBE_TIMEOUT_S),
            resources=agent.resources(RESOURCES),
            volume_mounts=[self.volume_mount, k8s.VolumeMount(name=names.L2_VOLUME_NAME, mount_path=L2_MOUNT_PATH)],
            # uid 0 without any capability: the Curvine FUSE mount checks permissions for every
            # uid but 0 (curvine-fuse check_permissions) and the vLLM Pods write as root.
            security_context=k8s.SecurityContext(
                run_as_user=0, run_as_non_root=False, allow_privilege_escalation=False, privileged=False,
                read_only_root_filesystem=True, capabilities=k8s.Capabilities(drop=["ALL"]),
                seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault")),
            termination_message_policy="FallbackToLogsOnError")
        pod_spec = k8s.PodSpec(
            service_account_name=NAME, containers=[container],
            # HyperPod nodes only: only they run the Curvine CSI node plugin that mounts the PVC.
            affinity=k8s.Affinity(node_affinity=k8s.NodeAffinity(
                required_during_scheduling_ignored_during_execution=k8s.NodeSelector(node_selector_terms=[
                    k8s.NodeSelectorTerm(match_expressions=[
                        k8s.NodeSelectorRequirement(**r) for r in hyperpod_node_requirements()])]))),
            tolerations=[k8s.Toleration(**t) for t in instance_group_tolerations(platform)],
            volumes=[self.volume,
                     k8s.Volume(name=names.L2_VOLUME_NAME, persistent_volume_claim=k8s.PersistentVolumeClaimVolumeSource(
                         claim_name=names.pvc_name(line)))])
        # The chunk-key Secret (docs/security.md, "Chunk keys"): create, which RBAC cannot narrow to
        # one name, and get of that one Secret; no list, watch, update, patch or delete.
        self.role.add_json_patch(cdk8s.JsonPatch.add("/rules/-", {
            "apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}))
        self.role.add_json_patch(cdk8s.JsonPatch.add("/rules/-", {
            "apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
            "resourceNames": [names.chunk_key_secret_name(line)]}))
        # ... and an admission policy in the L2 chart narrows the create to that Secret (key_secret_limits).
        self.deploy(pod_spec)
