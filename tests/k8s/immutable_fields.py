"""Which fields of a rendered object Kubernetes refuses to change once the object exists.

A model for the tests (the API server cannot run here), one rule per kind we render, from the
Kubernetes documentation and the API server's own refusals (docs/sources.md §19):

* PersistentVolumeClaim: "spec is immutable after creation except resources.requests and
  volumeAttributesClassName for bound claims"; ``resources.requests`` may only grow, and only on a
  StorageClass with ``allowVolumeExpansion`` ("only dynamically provisioned pvc can be resized and
  the storageclass that provisions the pvc must support resize"). Every claim we render is on a
  class without expansion or statically provisioned, so the whole ``spec`` counts.
* PersistentVolume: the volume source (``csi``), ``volumeMode`` and ``nodeAffinity``.
* StorageClass: ``parameters``, ``provisioner``, ``reclaimPolicy``, ``volumeBindingMode``
  ("objects cannot be updated once they are created"; the API server forbids each).
* CSIDriver: ``attachRequired``, ``fsGroupPolicy``, ``volumeLifecycleModes``.
* Deployment, DaemonSet: ``spec.selector`` ("field is immutable", apps/v1). StatefulSet: its whole
  ``spec`` but ``replicas``, ``ordinals``, ``template``, ``updateStrategy``,
  ``persistentVolumeClaimRetentionPolicy`` and ``minReadySeconds``.
* Service: ``clusterIP`` / ``clusterIPs``. RoleBinding, ClusterRoleBinding: ``roleRef``.
* ConfigMap, Secret with ``immutable: true``: ``data`` / ``binaryData``.
* InferenceEndpointConfig: ``spec.intelligentRoutingSpec.enabled`` (cannot be changed after
  creation, docs/sources.md §1).

What the model leaves out: kinds we do not render; admission webhooks' own rules (Kyverno's
policies have none on these fields); and status.
"""

from __future__ import annotations

from typing import Any, Callable

_STATEFULSET_MUTABLE = {"replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy",
                        "minReadySeconds"}


def _pick(obj: dict[str, Any], *paths: str) -> dict[str, Any]:
    picked = {}
    for path in paths:
        value: Any = obj
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        picked[path] = value
    return picked


RULES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "PersistentVolumeClaim": lambda o: _pick(o, "spec"),
    "PersistentVolume": lambda o: _pick(o, "spec.csi", "spec.volumeMode", "spec.nodeAffinity"),
    "StorageClass": lambda o: _pick(o, "parameters", "provisioner", "reclaimPolicy", "volumeBindingMode"),
    "CSIDriver": lambda o: _pick(o, "spec.attachRequired", "spec.fsGroupPolicy", "spec.volumeLifecycleModes"),
    "Deployment": lambda o: _pick(o, "spec.selector"),
    "DaemonSet": lambda o: _pick(o, "spec.selector"),
    "StatefulSet": lambda o: {k: v for k, v in o["spec"].items() if k not in _STATEFULSET_MUTABLE},
    "Service": lambda o: _pick(o, "spec.clusterIP", "spec.clusterIPs"),
    "RoleBinding": lambda o: _pick(o, "roleRef"),
    "ClusterRoleBinding": lambda o: _pick(o, "roleRef"),
    "ConfigMap": lambda o: _pick(o, "data", "binaryData") if o.get("immutable") else {},
    "Secret": lambda o: _pick(o, "data", "stringData") if o.get("immutable") else {},
    "InferenceEndpointConfig": lambda o: _pick(o, "spec.intelligentRoutingSpec.enabled"),
}


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name): what identifies an object to the API server."""
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def refused_updates(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> list[str]:
    """What applying ``after`` over ``before`` (both :func:`k8s.render.render_manifests` output)
    would ask the API server to change that it refuses, as ``"<kind> <ns>/<name>: <field>"``;
    objects that appear or disappear are listed too (a rename is a delete and a create)."""
    old = {key(o): o for objs in before.values() for o in objs}
    new = {key(o): o for objs in after.values() for o in objs}
    problems = [f"{k[0]} {k[1]}/{k[2]}: removed" for k in sorted(old.keys() - new.keys())]
    problems += [f"{k[0]} {k[1]}/{k[2]}: added" for k in sorted(new.keys() - old.keys())]
    for k in sorted(old.keys() & new.keys()):
        rule = RULES.get(k[0])
        if rule is None:
            continue
        was, now = rule(old[k]), rule(new[k])
        problems += [f"{k[0]} {k[1]}/{k[2]}: {field}" for field in sorted(set(was) | set(now))
                     if was.get(field) != now.get(field)]
    return problems
