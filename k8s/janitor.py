"""The Kubernetes side of a line's L2 janitor (its logic is :mod:`kv_tools.l2_janitor`).

Objects, all in the line's namespace (the PVC is namespaced, so the janitor must run there):

* ConfigMap ``l2-janitor``: ``janitor.json`` (:func:`janitor_config`) and ``l2_janitor.py`` (the
  module's source, standard library only, so the pinned ``python`` image needs no build step);
* ServiceAccount, Role and RoleBinding ``l2-janitor``: ``list`` on ``pods`` in this namespace,
  nothing else (the janitor reads the live Pods' ``LMCACHE_REMOTE_URL`` and temp directory so it
  never deletes a directory a running Pod writes to);
* CronJob ``l2-janitor``: every :data:`SCHEDULE`, one run at a time, mounting the line's PVC at
  the same path as the vLLM Pods.

Why each number (docs/l2-cache.md, "Day two"):

* :data:`MIN_DELETE_AGE_S` = 600 s: a chunk deleted between LMCache's lookup and its retrieve
  is not an error in lmcache 0.5.6: ``FSConnector.get`` returns None on ``FileNotFoundError``,
  ``retrieve`` stops at the first missing chunk, and the vLLM adapter reports the blocks it
  could not load (``get_block_ids_with_load_errors``) so vLLM recomputes them. The age guard
  keeps the chunks written in the last ten minutes (those a sibling Pod or the next turn of a
  conversation most likely looks up next) out of reach, which makes that recompute path rare;
  it is also longer than one janitor period, so a file is always seen by one run before it can
  be deleted by the next.
* :data:`SCHEDULE` every 10 minutes: the pool must absorb what lines write between two runs,
  which is what ``curvine.l2_pool_reserve_fraction`` reserves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import cdk8s
from k8s.kube import k8s
from constructs import Construct

from k8s import names
from k8s.lmcache import l2_cache_dir
from k8s.patch import L2_MOUNT_PATH
from kv_tools import l2_janitor
from platform_config import BusinessLineConfig, PlatformConfig
from platform_config.models import quantity_bytes

NAME: Final = "l2-janitor"
CONFIG_FILE: Final = "janitor.json"
SCRIPT_FILE: Final = "l2_janitor.py"
CONFIG_DIR: Final = "/opt/kvcache-janitor"
#: Cron schedule of the janitor (every 10 minutes).
SCHEDULE: Final = "*/10 * * * *"
#: Nothing younger than this is deleted (module docstring).
MIN_DELETE_AGE_S: Final = 600
#: A run that has not finished after this is killed; the next run starts over.
ACTIVE_DEADLINE_S: Final = 1800
#: Label of the HyperPod nodes: only they run the Curvine CSI node plugin that mounts the PVC.
HYPERPOD_NODE_LABEL: Final = "sagemaker.amazonaws.com/compute-type"
RESOURCES: Final = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
#: Pod labels of the janitor; deliberately not the operator's ``app=<line>``.
LABELS: Final = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "l2-janitor"}


def janitor_config(platform: PlatformConfig, line: BusinessLineConfig) -> dict[str, Any]:
    """``janitor.json`` of the line (the fields of :class:`kv_tools.l2_janitor.JanitorConfig`).

    ``live_dir`` is :func:`k8s.lmcache.l2_cache_dir`; ``capacity_bytes`` the PVC's ``l2_size``;
    the watermarks ``curvine.eviction.high_watermark`` / ``low_watermark`` (fractions of it);
    ``max_age_s`` ``curvine.eviction.ttl_hours`` in seconds (None when 0).
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
    }
    l2_janitor.config_from_dict(config)  # the same validation the janitor applies at run time
    return config


def _q(value: str) -> k8s.Quantity:
    return k8s.Quantity.from_string(value)


class L2Janitor(Construct):
    """The janitor's ConfigMap, RBAC and CronJob for one line (see the module docstring).

    Attributes:
        objects: every ApiObject, for dependency wiring; ``cron_job``: the CronJob.
    """

    def __init__(self, scope: Construct, construct_id: str, *, platform: PlatformConfig,
                 line: BusinessLineConfig) -> None:
        super().__init__(scope, construct_id)
        ns = line.namespace
        meta = k8s.ObjectMeta(name=NAME, namespace=ns, labels=LABELS)
        script = Path(l2_janitor.__file__).read_text(encoding="utf-8")
        self.config_map = k8s.KubeConfigMap(self, "Config", metadata=meta, data={
            CONFIG_FILE: json.dumps(janitor_config(platform, line), indent=2, sort_keys=True) + "\n",
            SCRIPT_FILE: script})
        self.service_account = k8s.KubeServiceAccount(self, "ServiceAccount", metadata=meta)
        self.role = k8s.KubeRole(self, "Role", metadata=meta, rules=[
            k8s.PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])])
        self.role_binding = k8s.KubeRoleBinding(
            self, "RoleBinding", metadata=meta,
            role_ref=k8s.RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=NAME),
            subjects=[k8s.Subject(kind="ServiceAccount", name=NAME, namespace=ns)])
        self.role_binding.add_dependency(self.role, self.service_account)
        container = k8s.Container(
            name="janitor", image=platform.versions.images.l2_janitor,
            command=["python3", f"{CONFIG_DIR}/{SCRIPT_FILE}", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}",
                     "--root", L2_MOUNT_PATH, "--termination-log", "/dev/termination-log"],
            env=[k8s.EnvVar(name="PYTHONDONTWRITEBYTECODE", value="1")],
            resources=k8s.ResourceRequirements(
                requests={k: _q(v) for k, v in RESOURCES["requests"].items()},
                limits={k: _q(v) for k, v in RESOURCES["limits"].items()}),
            volume_mounts=[k8s.VolumeMount(name="config", mount_path=CONFIG_DIR, read_only=True),
                           k8s.VolumeMount(name=names.L2_VOLUME_NAME, mount_path=L2_MOUNT_PATH)],
            # uid 0 without any capability: the Curvine FUSE mount checks permissions for every
            # uid but 0 (curvine-fuse check_permissions) and the vLLM Pods write as root.
            security_context=k8s.SecurityContext(
                run_as_user=0, run_as_non_root=False, allow_privilege_escalation=False, privileged=False,
                read_only_root_filesystem=True, capabilities=k8s.Capabilities(drop=["ALL"]),
                seccomp_profile=k8s.SeccompProfile(type="RuntimeDefault")),
            termination_message_policy="FallbackToLogsOnError")
        pod_spec = k8s.PodSpec(
            service_account_name=NAME, restart_policy="Never", containers=[container],
            affinity=k8s.Affinity(node_affinity=k8s.NodeAffinity(
                required_during_scheduling_ignored_during_execution=k8s.NodeSelector(node_selector_terms=[
                    k8s.NodeSelectorTerm(match_expressions=[k8s.NodeSelectorRequirement(
                        key=HYPERPOD_NODE_LABEL, operator="In", values=["hyperpod"])])]))),
            tolerations=[k8s.Toleration(key=t.key, operator="Equal", value=t.value, effect=t.effect)
                         for g in platform.hyperpod.instance_groups for t in g.taints],
            volumes=[k8s.Volume(name="config", config_map=k8s.ConfigMapVolumeSource(name=NAME)),
                     k8s.Volume(name=names.L2_VOLUME_NAME, persistent_volume_claim=k8s.PersistentVolumeClaimVolumeSource(
                         claim_name=names.pvc_name(line)))])
        self.cron_job = k8s.KubeCronJob(self, "CronJob", metadata=meta, spec=k8s.CronJobSpec(
            schedule=SCHEDULE, concurrency_policy="Forbid", starting_deadline_seconds=300,
            successful_jobs_history_limit=1, failed_jobs_history_limit=3,
            job_template=k8s.JobTemplateSpec(spec=k8s.JobSpec(
                backoff_limit=0, active_deadline_seconds=ACTIVE_DEADLINE_S,
                template=k8s.PodTemplateSpec(metadata=k8s.ObjectMeta(labels=LABELS), spec=pod_spec)))))
        self.cron_job.add_dependency(self.config_map, self.role_binding)
        self.objects: list[cdk8s.ApiObject] = [self.config_map, self.service_account, self.role, self.role_binding,
                                               self.cron_job]
