"""The chunk key in the rendered objects (issue 25 item 3; docs/security.md, "Chunk keys"): every vLLM Pod
of an L2 line reads ``KVCACHE_L2_KEY`` from the line's Secret through a ``secretKeyRef`` that the L2
mutation adds (policy and fallback patch alike), LMCache hashes with ``sha256_cbor``, the janitor may
create Secrets and read only that one, and no rendered object holds a key or the Secret itself."""

from __future__ import annotations

import json

from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.operator_render import deployment, pod

from k8s import janitor as janitor_chart
from k8s import names
from k8s.lmcache import PINNED_SETTINGS, owned_env_names
from k8s.patch import endpoint_json_patch
from cluster_agents import l2_janitor

KEY_ENV = "KVCACHE_L2_KEY"


def _ref(line) -> dict:
    return {"name": KEY_ENV, "valueFrom": {"secretKeyRef": {"name": names.chunk_key_secret_name(line), "key": "key"}}}


def _vllm_env(p: dict, line) -> list[dict]:
    (c,) = [c for c in p["spec"]["containers"] if c["name"] == names.endpoint_name(line)]
    return c["env"]


def test_lmcache_hashes_chunks_with_sha256_cbor() -> None:
    assert {s.key: s.value for s in PINNED_SETTINGS}["pre_caching_hash_algorithm"] == "sha256_cbor"
    assert janitor_chart.pinned_hash_algorithm() == "sha256_cbor"


def test_a_key_value_set_by_the_cr_or_a_user_is_replaced_by_the_secret_reference(policy, line) -> None:
    p = pod(line)
    env = _vllm_env(p, line)
    env += [{"name": KEY_ENV, "value": "guessable"}, {"name": KEY_ENV, "valueFrom": {"secretKeyRef": {
        "name": "someone-elses", "key": "key"}}}]
    after = apply_policy(policy, p, seed=7)
    assert [e for e in _vllm_env(after, line) if e["name"] == KEY_ENV] == [_ref(line)]
    assert KEY_ENV in owned_env_names(line)


def test_the_fallback_patch_adds_the_same_reference(k8s_project, line) -> None:
    ops = endpoint_json_patch(k8s_project.platform, line, deployment=deployment(line))
    added = [op["value"] for op in ops if op["op"] == "add" and isinstance(op.get("value"), dict)
             and op["value"].get("name") == KEY_ENV]
    assert added == [_ref(line)]


def test_no_rendered_object_holds_a_key_or_the_secret(manifests) -> None:
    """The Secret is made in the cluster by the janitor (cluster_agents.l2_janitor.ChunkKey), never by a
    chart: no Secret object at all, and every KVCACHE_L2_KEY anywhere is a secretKeyRef."""
    text = json.dumps(manifests)
    assert names.CHUNK_KEY_SECRET_PREFIX in text  # the references are there ...
    for objects in manifests.values():
        for obj in objects:
            assert not (obj["kind"] == "Secret" and obj["metadata"]["name"].startswith(names.CHUNK_KEY_SECRET_PREFIX))

    def walk(node):
        if isinstance(node, dict):
            if node.get("name") == KEY_ENV:
                assert set(node) == {"name", "valueFrom"} and set(node["valueFrom"]) == {"secretKeyRef"}, node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    for objects in manifests.values():
        walk(objects)


def test_the_janitor_and_its_warmer_name_the_lines_secret(k8s_project, manifests) -> None:
    for line in k8s_project.business_lines:
        if not line.cache.l2_enabled:
            continue
        objects = next(v for k, v in manifests.items() if k.endswith(line.name))
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == janitor_chart.NAME]
        conf = l2_janitor.config_from_dict(json.loads(cm["data"][janitor_chart.CONFIG_FILE]))
        assert conf.key_secret == names.chunk_key_secret_name(line)
        if janitor_chart.HOT_PREFIX_CONFIG_FILE in cm["data"]:
            hot = json.loads(cm["data"][janitor_chart.HOT_PREFIX_CONFIG_FILE])
            assert (hot["hash_algorithm"], hot["key_secret"]) == ("sha256_cbor", names.chunk_key_secret_name(line))
        (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == janitor_chart.NAME]
        secret_rules = [r for r in role["rules"] if "secrets" in r["resources"]]
        # create (RBAC cannot name a created object) and get of the one Secret; no list, watch, update, delete.
        assert secret_rules == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
                                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                                 "resourceNames": [names.chunk_key_secret_name(line)]}]


# --- the admission policy on the janitor's Secret creates --------------------------------------------


def _decide(manifests, obj: dict, *, namespace: str, username: str | None = None):
    from tests.k8s import vap_eval

    policy = next(o for o in manifests["curvine"] if o["kind"] == "ValidatingAdmissionPolicy"
                  and o["metadata"]["name"] == janitor_chart.KEY_SECRET_LIMITS)
    binding = next(o for o in manifests["curvine"] if o["kind"] == "ValidatingAdmissionPolicyBinding"
                   and o["metadata"]["name"] == janitor_chart.KEY_SECRET_LIMITS)
    request = {"operation": "CREATE", "namespace": namespace, "name": obj["metadata"].get("name", ""),
               "userInfo": {"username": username or f"system:serviceaccount:{namespace}:{janitor_chart.NAME}"},
               "resource": {"group": "", "version": "v1", "resource": "secrets"}, "subResource": ""}
    return vap_eval.evaluate(policy, [binding], request=request, old_object=None, obj=obj,
                             namespace_labels={"kubernetes.io/metadata.name": namespace})


def test_a_janitor_may_create_only_its_chunk_key_secret(manifests, line) -> None:
    mine = l2_janitor.ChunkKey(line.namespace, names.chunk_key_secret_name(line)).secret_object("ab" * 32)
    decision = _decide(manifests, mine, namespace=line.namespace)
    assert decision.applied and decision.allowed, decision  # exactly what ChunkKey.ensure sends
    for change in ({"metadata": {**mine["metadata"], "name": "other"}},
                   {"type": "kubernetes.io/service-account-token"},
                   {"immutable": False}, {"immutable": None}, {"type": None}):
        attempt = {k: v for k, v in {**mine, **change}.items() if v is not None}
        refused = _decide(manifests, attempt, namespace=line.namespace)
        assert refused.applied and not refused.allowed, (change, refused)
    # Nobody else's creates are this policy's business (RBAC decides those).
    for user in ("system:admin", f"system:serviceaccount:{line.namespace}:kv-canary",
                 f"system:serviceaccount:{line.namespace}:l2-janitor-not"):
        assert not _decide(manifests, {**mine, "type": "kubernetes.io/tls"}, namespace=line.namespace,
                           username=user).applied
