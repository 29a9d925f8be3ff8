"""The Kyverno side of the L2 patch: each line's mutating Policy and the engine's Helm values.

Why a policy on Pods. The operator owns the Deployment it renders from an
InferenceEndpointConfig and overwrites any patch on it at the next re-render (CRD edit,
operator upgrade, Deployment deletion). Every re-render ends in new Pods, and every Pod passes
admission, so a policy that mutates Pods at CREATE fixes each Pod as it is born, whatever the
operator put in the template: the result is reconcile-proof.

Why only Pods, only CREATE, auto-generation off. Kyverno by default also rewrites the
controllers of matching Pods (``pod-policies.kyverno.io/autogen-controllers``); a rewritten
Deployment differs from what the operator renders, the operator puts its version back, Kyverno
mutates it again: the two fight forever. With ``autogen-controllers: none`` and a match on
``Pod`` / ``CREATE`` only, the Deployment stays exactly as the operator wants it.

What the policy does, in three rules applied in order (Kyverno processes rules in declaration
order, each on the result of the previous one):

1. ``remove-owned-entries``: removes every existing volume named ``curvine-l2-cache``, every
   mount of it or at ``/mnt/curvine/l2cache`` in the vLLM container, and every env entry the
   patch owns (``LMCACHE_REMOTE_URL`` the operator injects, ``LMCACHE_EXTRA_CONFIG`` with its
   shared-memory setting, the CR's ``LMCACHE_REMOTE_SERDE`` and ``PYTHONHASHSEED``, the
   operator's ``LMCACHE_MAX_LOCAL_CPU_SIZE`` when the line sets ``cache.l1_cpu_gib``, any
   duplicates). ``foreach`` in ``Descending`` order, so removing entry *i* never shifts an
   index still to be visited.
2. ``append-l2-settings``: appends exactly one of each owned env entry (values from
   :func:`k8s.patch.line_cache_env`) and the mount, to the vLLM container only (the one exposing
   the model invocation port, or named after the endpoint).
3. ``ensure-volumes`` / ``add-l2-volume``: adds the PVC volume.

The patches use only index-free appends (``/-``) or indices of the list being iterated, so the
result does not depend on whether Kyverno re-reads ``request.object`` between rules.
"""

from __future__ import annotations

import json
from typing import Any, Final

from k8s import names
from k8s.lmcache import owned_env_names
from k8s.patch import L2_MOUNT_PATH, l2_volume, l2_volume_mount, pod_env_entries
from platform_config import BusinessLineConfig, PlatformConfig

KYVERNO_API_VERSION: Final = "kyverno.io/v1"
KYVERNO_NAMESPACE: Final = "kyverno"
#: Annotation that turns off Kyverno's generation of rules for Pod controllers.
AUTOGEN_ANNOTATION: Final = "pod-policies.kyverno.io/autogen-controllers"
#: Per-pod token of the policy: Kyverno's ``random()`` JMESPath function is evaluated once per
#: admission request, i.e. once per Pod. (The name of a ReplicaSet's Pod is still empty at
#: admission, and ``$(VAR)`` would collide with Kyverno's own ``$()`` reference syntax.)
POLICY_TMP_TOKEN: Final = "{{ random('[a-z0-9]{12}') }}"
#: Identity of the controller that creates the operator's Pods on EKS (kube-controller-manager
#: runs with per-controller service-account credentials). Kyverno must not skip its requests.
REPLICASET_CONTROLLER_USER: Final = "system:serviceaccount:kube-system:replicaset-controller"
REPLICASET_CONTROLLER_GROUPS: Final = ("system:serviceaccounts", "system:serviceaccounts:kube-system",
                                       "system:authenticated")


def _yaml_patch(ops: list[dict[str, Any]]) -> str:
    """A patchesJson6902 string. JSON is valid YAML, and keeps ``{{ }}`` and quotes verbatim."""
    return "\n".join(["["] + [f"  {json.dumps(op)}," for op in ops[:-1]] + [f"  {json.dumps(ops[-1])}", "]"]) + "\n"


def _vllm_preconditions(line: BusinessLineConfig) -> dict[str, Any]:
    """Selects the vLLM container inside a foreach over ``spec.containers``."""
    return {"any": [
        {"key": "{{ element.ports[].containerPort || `[]` }}", "operator": "AnyIn", "value": [line.vllm.port]},
        {"key": "{{ element.name }}", "operator": "Equals", "value": names.endpoint_name(line)},
    ]}


def _match(line: BusinessLineConfig) -> dict[str, Any]:
    return {"any": [{"resources": {
        "kinds": ["Pod"],
        "operations": ["CREATE"],
        # No "namespaces": a namespaced Policy only ever sees its own namespace.
        "selector": {"matchLabels": {names.OPERATOR_POD_LABEL: names.endpoint_name(line)}},
    }}]}


def policy_spec(platform: PlatformConfig, line: BusinessLineConfig) -> dict[str, Any]:
    """``spec`` of the line's Kyverno Policy (see the module docstring for the rules)."""
    vllm = _vllm_preconditions(line)
    owned = list(owned_env_names(line))
    match = _match(line)
    remove_rule = {
        "name": "remove-owned-entries",
        "match": match,
        "mutate": {"foreach": [
            {
                "list": "request.object.spec.volumes || `[]`",
                "order": "Descending",
                "preconditions": {"all": [{"key": "{{ element.name }}", "operator": "Equals",
                                           "value": names.L2_VOLUME_NAME}]},
                "patchesJson6902": _yaml_patch([{"op": "remove", "path": "/spec/volumes/{{ elementIndex }}"}]),
            },
            {
                "list": "request.object.spec.containers",
                "preconditions": vllm,
                "foreach": [{
                    "list": "element.volumeMounts || `[]`",
                    "order": "Descending",
                    "preconditions": {"any": [
                        {"key": "{{ element.name }}", "operator": "Equals", "value": names.L2_VOLUME_NAME},
                        {"key": "{{ element.mountPath }}", "operator": "Equals", "value": L2_MOUNT_PATH},
                    ]},
                    "patchesJson6902": _yaml_patch([{
                        "op": "remove", "path": "/spec/containers/{{ elementIndex0 }}/volumeMounts/{{ elementIndex1 }}"}]),
                }],
            },
            {
                "list": "request.object.spec.containers",
                "preconditions": vllm,
                "foreach": [{
                    "list": "element.env || `[]`",
                    "order": "Descending",
                    "preconditions": {"all": [{"key": "{{ element.name }}", "operator": "AnyIn", "value": owned}]},
                    "patchesJson6902": _yaml_patch([{
                        "op": "remove", "path": "/spec/containers/{{ elementIndex0 }}/env/{{ elementIndex1 }}"}]),
                }],
            },
        ]},
    }
    container = "/spec/containers/{{ elementIndex }}"
    appends = [{"op": "add", "path": f"{container}/env/-", "value": e}
               for e in pod_env_entries(platform, line, tmp_dir_token=POLICY_TMP_TOKEN)]
    appends.append({"op": "add", "path": f"{container}/volumeMounts/-", "value": l2_volume_mount()})
    append_rule = {
        "name": "append-l2-settings",
        "match": match,
        "mutate": {"foreach": [
            {
                "list": "request.object.spec.containers",
                "preconditions": {**vllm, "all": [
                    {"key": "{{ length(element.env || `[]`) }}", "operator": "Equals", "value": 0}]},
                "patchesJson6902": _yaml_patch([{"op": "add", "path": f"{container}/env", "value": []}]),
            },
            {
                "list": "request.object.spec.containers",
                "preconditions": {**vllm, "all": [
                    {"key": "{{ length(element.volumeMounts || `[]`) }}", "operator": "Equals", "value": 0}]},
                "patchesJson6902": _yaml_patch([{"op": "add", "path": f"{container}/volumeMounts", "value": []}]),
            },
            {
                "list": "request.object.spec.containers",
                "preconditions": vllm,
                "patchesJson6902": _yaml_patch(appends),
            },
        ]},
    }
    ensure_volumes = {
        "name": "ensure-volumes",
        "match": match,
        "preconditions": {"all": [
            {"key": "{{ length(request.object.spec.volumes || `[]`) }}", "operator": "Equals", "value": 0}]},
        "mutate": {"patchesJson6902": _yaml_patch([{"op": "add", "path": "/spec/volumes", "value": []}])},
    }
    add_volume = {
        "name": "add-l2-volume",
        "match": match,
        "mutate": {"patchesJson6902": _yaml_patch([{"op": "add", "path": "/spec/volumes/-",
                                                     "value": l2_volume(line)}])},
    }
    return {
        # Admission only: a background scan could not mutate running Pods anyway, and the
        # random() token has no meaning outside an admission request.
        "background": False,
        "admission": True,
        "applyRules": "All",
        # Fail closed: a vLLM pod that starts without the patch would silently write to the
        # operator's node-local backend instead of the shared pool. Kyverno runs 3 replicas.
        "webhookConfiguration": {"failurePolicy": "Fail", "timeoutSeconds": 15},
        "rules": [remove_rule, append_rule, ensure_volumes, add_volume],
    }


def policy_manifest(platform: PlatformConfig, line: BusinessLineConfig) -> dict[str, Any]:
    """The complete Kyverno ``Policy`` object of a line (namespaced: it can only touch its own namespace)."""
    return {
        "apiVersion": KYVERNO_API_VERSION,
        "kind": "Policy",
        "metadata": {
            "name": names.policy_name(line),
            "namespace": line.namespace,
            "annotations": {
                AUTOGEN_ANNOTATION: "none",
                "policies.kyverno.io/title": "Curvine L2 KV cache for the vLLM pods of this business line",
                "policies.kyverno.io/description": (
                    "Mutates Pods at CREATE only: exactly one of each of "
                    + ", ".join(e["name"] for e in pod_env_entries(platform, line, tmp_dir_token=POLICY_TMP_TOKEN))
                    + " (LMCACHE_REMOTE_URL: fs:// on the line's model-scoped directory of the Curvine mount, "
                    "LMCACHE_EXTRA_CONFIG: per-pod temp dir), the line's RWX PVC and its mount at "
                    "/mnt/curvine/l2cache."),
            },
        },
        "spec": policy_spec(platform, line),
    }


def kyverno_helm_values() -> dict[str, Any]:
    """Values for the Kyverno Helm chart (3.x), set explicitly where a default would break us.

    * ``config.excludeGroups: [system:nodes]`` and ``excludeUsernames: []``: the Pods of the
      operator's Deployments are created by the ReplicaSet controller
      (``system:serviceaccount:kube-system:replicaset-controller``, groups
      ``system:serviceaccounts``, ``system:serviceaccounts:kube-system``). Installs that add
      ``system:serviceaccounts:kube-system`` to the excluded groups (a common copy-paste to
      quiet kube-system noise) make Kyverno skip exactly those requests, and no vLLM pod is
      ever mutated. Pinned here so a chart default change cannot do it either.
    * ``config.webhooks``: the webhook namespaceSelector excludes only ``kube-system`` and
      ``kyverno`` (chart default); the business-line namespaces must stay in scope.
    * ``config.resourceFilters`` is left at the chart default: it filters by the *object's*
      kind/namespace (Events, ReplicaSets, objects in kube-system...), not by requester, and
      holds no entry matching Pods in a business-line namespace.
    * 3 admission-controller replicas: the policy fails closed, so the webhook must survive a
      node loss. Background, cleanup and reports controllers are off (unused by a mutate-at-
      admission policy; fewer privileged controllers).
    """
    return {
        "admissionController": {
            "replicas": 3,
            "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        },
        "backgroundController": {"enabled": False},
        "cleanupController": {"enabled": False},
        "reportsController": {"enabled": False},
        "config": {
            "excludeGroups": ["system:nodes"],
            "excludeUsernames": [],
            "webhooks": {"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", KYVERNO_NAMESPACE]},
            ]}},
        },
    }
