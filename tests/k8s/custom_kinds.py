"""Kinds the platform renders whose schemas are CRDs, not in kubernetes-validate's built-in set: the
operator's InferenceEndpointConfig (held to its CRD schema by the tests that render it) and Kyverno's
Policy and ClusterPolicy (evaluated by tests/k8s/kyverno_eval.py). Every other object is validated
strictly with kubernetes-validate."""

CUSTOM_KINDS = frozenset({"InferenceEndpointConfig", "Policy", "ClusterPolicy"})
