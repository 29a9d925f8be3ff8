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

What the policy does, in four steps applied in order (Kyverno processes rules in declaration
order, each on the result of the previous one):

1. ``remove-owned-entries``: removes every existing volume the patch owns
   (:func:`k8s.patch.owned_volumes`: ``curvine-l2-cache``, ``prometheus-multiproc``), every
   mount of one of them or at one of their paths (``/mnt/curvine/l2cache``,
   ``/tmp/prometheus-multiproc``) in the vLLM container, and every env entry the patch owns
   (``LMCACHE_REMOTE_URL`` the operator injects, ``LMCACHE_EXTRA_CONFIG`` with its
   shared-memory setting, the CR's ``LMCACHE_REMOTE_SERDE`` and ``PYTHONHASHSEED``, any
   ``PROMETHEUS_MULTIPROC_DIR``, the operator's ``LMCACHE_MAX_LOCAL_CPU_SIZE`` when the line
   sets ``cache.l1_cpu_gib``, any duplicates). It also removes what only the replaced Tiered
   Storage backend needed: every ``hostPath`` volume of ``/dev/shm`` or a path under it (the
   ai-toolkit shared memory, :func:`k8s.patch.is_hyperpod_shm_volume`, whatever its name) and
   every mount of such a volume in any container or init container. Pod Security admission runs after the mutating
   webhooks, so the Pod it sees has no ``hostPath`` and passes the namespace's ``baseline``;
   anything else baseline forbids is left in place and refused with the PSA error.
   ``foreach`` in ``Descending`` order, so removing entry *i* never shifts an index still to be
   visited; each list is walked by exactly one ``foreach`` (mounts before volumes, so the
   volume names are still there to match).
2. ``append-l2-settings``: appends exactly one of each owned env entry (values from
   :func:`k8s.patch.line_cache_env`) and one mount of each owned volume, to the vLLM container
   only (the one exposing the model invocation port, or named after the endpoint).
3. ``ensure-volumes`` / ``add-l2-volume``: adds the owned volumes (the PVC and the metrics
   ``emptyDir``) and the mutation label.

4. ``complete-kv-transfer-config``: vLLM's ``--kv-transfer-config`` carries
   ``kv_load_failure_policy: recompute`` (the operator's value rewritten, merged with the
   platform's settings, never a second flag: :mod:`k8s.kv_transfer`).

The patches use only index-free appends (``/-``) or indices of the list being iterated, so the
result does not depend on whether Kyverno re-reads ``request.object`` between rules.
"""

from __future__ import annotations

import json
from typing import Any, Final

from k8s import kv_transfer, names
from k8s.lmcache import owned_env_names
from k8s.patch import HYPERPOD_SHM_HOST_PATH, line_cache_env, owned_volumes, pod_env_entries
from platform_config import BusinessLineConfig, PlatformConfig

KYVERNO_API_VERSION: Final = "kyverno.io/v1"
#: Namespace label of the business-line namespaces (set by :class:`k8s.line_chart.BusinessLineChart`);
#: Kyverno's webhooks only ever see namespaces that carry it.
BUSINESS_LINE_NAMESPACE_LABEL: Final = "kvcache.io/business-line"
#: kubectl jsonpath that is non-empty only once Kyverno has put the policy in its webhook
#: (``status.conditions`` holds one condition, ``Ready``, True when the policy is in the webhook
#: configuration: ``updatePolicyStatuses`` in kyverno ``pkg/controllers/webhook/controller.go``).
POLICY_READY_JSONPATH: Final = '.status.conditions[?(@.status=="True")].type'

KYVERNO_NAMESPACE: Final = "kyverno"
#: Pod Security level of the Kyverno namespace: every container the pinned chart (3.5.2) starts there
#: (admission controller and its init container, the webhook and report cleanup hooks, the chart's
#: test) sets ``runAsNonRoot``, no privilege escalation, every capability dropped and the
#: ``RuntimeDefault`` seccomp profile, with no host namespace or hostPath (``charts/kyverno/values.yaml``
#: at f4ffc2d4; ``kyverno_helm_values`` overrides none of it), which is what ``restricted`` asks.
KYVERNO_POD_SECURITY: Final = "restricted"
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


def _has_vllm_container(line: BusinessLineConfig) -> dict[str, Any]:
    """Rule precondition: the Pod has a vLLM container (same test as :func:`_vllm_preconditions`).

    Every rule carries it, so a Pod that merely shares the ``app=<line>`` label (a sidecar-only
    Pod, a debug Pod, the L2 janitor) never gets the PVC, the volume or the label.
    """
    selector = (f"request.object.spec.containers[?name == '{names.endpoint_name(line)}' || "
                f"contains(ports[].containerPort || `[]`, `{line.vllm.port}`)]")
    return {"all": [{"key": f"{{{{ length({selector}) }}}}", "operator": "NotEquals", "value": 0}]}


def shm_volume_jmespath(volume: str = "") -> str:
    """JMESPath that is true when ``volume`` (an expression for a pod volume; empty: the current
    node of a filter) is a ``hostPath`` of ``/dev/shm`` or a path under it:
    :func:`k8s.patch.is_hyperpod_shm_volume` in the policy."""
    path = f"{volume}.hostPath.path" if volume else "hostPath.path"
    return (f"({path} == '{HYPERPOD_SHM_HOST_PATH}' || "
            f"starts_with({path} || '', '{HYPERPOD_SHM_HOST_PATH}/'))")


def _mount_removals(line: BusinessLineConfig) -> list[dict[str, Any]]:
    """``foreach`` entries of ``remove-owned-entries`` over every container's and init container's
    mounts: the HyperPod shared-memory mounts anywhere, the owned mounts (:func:`k8s.patch.owned_volumes`,
    by volume name or path) in the vLLM container.

    One pass per list (containers, then init containers), so the result does not depend on
    whether Kyverno re-reads ``request.object`` between entries. ``element0`` is the container
    (Kyverno adds ``element<nesting>`` for each level, ``AddElement`` in kyverno
    ``pkg/engine/context/context.go``).
    """
    shm_names = f"request.object.spec.volumes[?{shm_volume_jmespath()}].name || `[]`"
    shm_mount = {"key": f"{{{{ contains({shm_names}, element.name) }}}}", "operator": "Equals", "value": True}
    is_vllm = (f"(element0.name == '{names.endpoint_name(line)}' || "
               f"contains(element0.ports[].containerPort || `[]`, `{line.vllm.port}`))")
    owned = owned_volumes(line)
    owned_mount = "(" + " || ".join([f"element.name == '{v['name']}'" for v, _ in owned]
                                    + [f"element.mountPath == '{m['mountPath']}'" for _, m in owned]) + ")"
    entries = []
    for kind, conditions in (
            ("containers", [shm_mount, {"key": f"{{{{ {is_vllm} && {owned_mount} }}}}", "operator": "Equals",
                                        "value": True}]),
            ("initContainers", [shm_mount])):
        entries.append({
            "list": f"request.object.spec.{kind} || `[]`",
            "foreach": [{
                "list": "element.volumeMounts || `[]`",
                "order": "Descending",
                "preconditions": {"any": conditions},
                "patchesJson6902": _yaml_patch([{
                    "op": "remove", "path": f"/spec/{kind}/{{{{ elementIndex0 }}}}/volumeMounts/{{{{ elementIndex1 }}}}"}]),
            }],
        })
    return entries


def webhook_match_conditions(line: BusinessLineConfig) -> list[dict[str, str]]:
    """CEL ``matchConditions`` of the policy's webhook: the line's namespace and a vLLM container.

    A policy with ``webhookConfiguration.matchConditions`` gets a webhook of its own in Kyverno
    1.15 (``CustomWebhookMatchConditions`` -> ``newWebhookPerPolicy``, kyverno
    ``pkg/controllers/webhook/controller.go``, docs/sources.md §9) instead of joining the shared
    fail-closed webhook; the API server evaluates these conditions before calling Kyverno, so a
    Kyverno outage fails only the vLLM Pods of this line's namespace, nothing else. Each
    expression is total on a Pod CREATE (``has()`` guards every optional field), so it never
    errors (an error would apply the failure policy).
    """
    ep, port = names.endpoint_name(line), line.vllm.port
    return [
        {"name": "business-line-namespace", "expression": f"request.namespace == '{line.namespace}'"},
        {"name": "vllm-pod", "expression": (
            "has(object.spec) && has(object.spec.containers) && object.spec.containers.exists(c, "
            f"c.name == '{ep}' || (has(c.ports) && c.ports.exists(p, p.containerPort == {port})))")},
    ]


def policy_spec(platform: PlatformConfig, line: BusinessLineConfig) -> dict[str, Any]:
    """``spec`` of the line's Kyverno Policy (see the module docstring for the rules)."""
    vllm = _vllm_preconditions(line)
    owned = list(owned_env_names(line))
    volumes = owned_volumes(line)
    match = _match(line)
    has_vllm = _has_vllm_container(line)
    remove_rule = {
        "name": "remove-owned-entries",
        "match": match,
        "preconditions": has_vllm,
        "mutate": {"foreach": [
            *_mount_removals(line),
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
            {
                # Last: the mount passes above look the shared-memory volume names up here.
                "list": "request.object.spec.volumes || `[]`",
                "order": "Descending",
                "preconditions": {"any": [
                    {"key": "{{ element.name }}", "operator": "AnyIn", "value": [v["name"] for v, _ in volumes]},
                    {"key": f"{{{{ {shm_volume_jmespath('element')} }}}}", "operator": "Equals", "value": True},
                ]},
                "patchesJson6902": _yaml_patch([{"op": "remove", "path": "/spec/volumes/{{ elementIndex }}"}]),
            },
        ]},
    }
    container = "/spec/containers/{{ elementIndex }}"
    appends = [{"op": "add", "path": f"{container}/env/-", "value": e}
               for e in pod_env_entries(platform, line, tmp_dir_token=POLICY_TMP_TOKEN)]
    appends += [{"op": "add", "path": f"{container}/volumeMounts/-", "value": m} for _, m in volumes]
    append_rule = {
        "name": "append-l2-settings",
        "match": match,
        "preconditions": has_vllm,
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
            *has_vllm["all"],
            {"key": "{{ length(request.object.spec.volumes || `[]`) }}", "operator": "Equals", "value": 0}]},
        "mutate": {"patchesJson6902": _yaml_patch([{"op": "add", "path": "/spec/volumes", "value": []}])},
    }
    add_volume = {
        "name": "add-l2-volume",
        "match": match,
        "preconditions": has_vllm,
        # The label tells verify.py and the alerts that this Pod went through the mutation
        # (a Pod created while the policy was not ready never gets it).
        "mutate": {"patchesJson6902": _yaml_patch([
            *({"op": "add", "path": "/spec/volumes/-", "value": v} for v, _ in volumes),
            {"op": "add", "path": f"/metadata/labels/{names.L2_MUTATED_LABEL_POINTER}", "value": names.L2_MUTATED_VALUE},
        ])},
    }
    # Admission only: a background scan could not mutate running Pods anyway, and the random() token
    # has no meaning outside an admission request. Fail closed, but only for this line's vLLM Pods: a
    # vLLM Pod that started without the patch would silently write to the operator's node-local
    # backend instead of the shared pool (webhook_match_conditions).
    return fail_closed_admission_spec(webhook_match_conditions(line), [
        remove_rule, append_rule, ensure_volumes, add_volume, kv_transfer.kyverno_rule(match, has_vllm, vllm)])


def fail_closed_admission_spec(match_conditions: list[dict[str, str]], rules: list[dict[str, Any]]) -> dict[str, Any]:
    """``spec`` of a mutating Policy that acts at admission only (``background: false``), every rule
    applied, on a webhook of its own (the CEL ``match_conditions``) that fails closed within 15 s: a
    Kyverno outage then holds up only the objects the conditions select, never the rest of the cluster."""
    return {
        "background": False,
        "admission": True,
        "applyRules": "All",
        "webhookConfiguration": {"failurePolicy": "Fail", "timeoutSeconds": 15, "matchConditions": match_conditions},
        "rules": rules,
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
                    "Mutates the vLLM Pods of this line at CREATE only: exactly one each of "
                    + ", ".join(line_cache_env(platform, line))
                    + "; the line's RWX PVC and its mount at /mnt/curvine/l2cache; an emptyDir for "
                    "PROMETHEUS_MULTIPROC_DIR (LMCache's metrics on vLLM's /metrics); vLLM's --kv-transfer-config "
                    "completed with kv_load_failure_policy recompute; removes the operator's "
                    "/dev/shm hostPath (only the replaced sagemaker-hyperpod:// backend used it)."),
            },
        },
        "spec": policy_spec(platform, line),
    }


def kyverno_namespace(kubernetes_version: str) -> dict[str, Any]:
    """The ``kyverno`` Namespace, created by the platform (not by Helm) so that it carries Pod Security
    labels: enforce, warn and audit :data:`KYVERNO_POD_SECURITY`, pinned to ``v<kubernetes_version>``."""
    from k8s.kube import pod_security_labels

    version = f"v{kubernetes_version}"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": KYVERNO_NAMESPACE,
        "labels": pod_security_labels(KYVERNO_POD_SECURITY, version, warn=KYVERNO_POD_SECURITY,
                                      audit=KYVERNO_POD_SECURITY)}}


def kyverno_helm_values() -> dict[str, Any]:
    """Values for the Kyverno Helm chart (3.x), set explicitly where a default would break us.

    * ``config.excludeGroups: [system:nodes]`` and ``excludeUsernames: []``: the Pods of the
      operator's Deployments are created by the ReplicaSet controller
      (``system:serviceaccount:kube-system:replicaset-controller``, groups
      ``system:serviceaccounts``, ``system:serviceaccounts:kube-system``). Installs that add
      ``system:serviceaccounts:kube-system`` to the excluded groups (a common copy-paste to
      quiet kube-system noise) make Kyverno skip exactly those requests, and no vLLM pod is
      ever mutated. Pinned here so a chart default change cannot do it either.
    * ``config.webhooks``: the namespaceSelector of every resource webhook Kyverno registers
      (``buildResourceMutatingWebhookRules`` copies it into each one, docs/sources.md §9)
      selects only namespaces labelled ``kvcache.io/business-line`` (the line charts label
      theirs), never ``kube-system`` or ``kyverno``. With the chart default (all but
      ``kube-system``) a fail-closed policy without matchConditions blocked Pod creation in
      ``curvine`` (a replaced node's FUSE pods), ``cert-manager``, the inference operator's
      namespace and ``aws-hyperpod`` whenever Kyverno was down.
    * ``config.resourceFilters`` is left at the chart default: it filters by the *object's*
      kind/namespace (Events, ReplicaSets, objects in kube-system...), not by requester, and
      holds no entry matching Pods in a business-line namespace.
    * 3 admission-controller replicas: the policy fails closed, so the webhook must survive a
      node loss. Cleanup and reports controllers are off (unused; fewer privileged controllers). The
      background controller is on: it runs the ``generate`` rule that keeps ``block-curvine-ports``
      in every namespace (:func:`k8s.network_policies.curvine_egress_generator`, issue 25 item 1).
    * ``features.admissionReports.enabled: false``: with it on (the chart's default) the admission
      controller writes one ``EphemeralReport`` per mutated vLLM Pod, and only the reports
      controller, off here, ever deletes them: they would pile up in the business-line namespaces
      until Kyverno's back-pressure threshold (1000) stops it (kyverno v1.15.2
      ``pkg/webhooks/resource/mutation/mutation.go``, ``pkg/controllers/report/aggregate``;
      docs/sources.md §23). Nothing of the platform reads policy reports.
    """
    return {
        "admissionController": {
            "replicas": 3,
            "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        },
        # On for one policy: the ClusterPolicy that generates block-curvine-ports in every namespace
        # (k8s.network_policies); its rights on NetworkPolicies come from an aggregated ClusterRole
        # the Curvine chart renders (label rbac.kyverno.io/aggregate-to-background-controller).
        "backgroundController": {"enabled": True},
        "cleanupController": {"enabled": False},
        "reportsController": {"enabled": False},
        "features": {"admissionReports": {"enabled": False}},
        "config": {
            "excludeGroups": ["system:nodes"],
            "excludeUsernames": [],
            "webhooks": {"namespaceSelector": {"matchExpressions": [
                {"key": BUSINESS_LINE_NAMESPACE_LABEL, "operator": "Exists"},
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", KYVERNO_NAMESPACE]},
            ]}},
        },
    }
