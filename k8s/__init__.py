"""cdk8s charts of the L2 KV-cache tier and of each business line (plain cdk8s, no aws_cdk).

Modules:
    kube           the Kubernetes API classes (cdk8s-plus-NN) of the cluster's eks.version.
    lmcache        typed allow-list of the LMCache settings and the env a line's pods must carry.
    patch          L2 constants, that env, and the RFC 6902 patch for clusters without Kyverno.
    curvine_config curvine-cluster.toml generated from typed settings.
    curvine_chart  the Curvine chart (Primary, Workers, CSI driver, StorageClass, NetworkPolicy).
    kyverno        the per-line Kyverno Policy and the Kyverno Helm values.
    line_chart     one chart per business line (namespace, RWX PVC, policy, endpoint, endpoint ingress).
    network_policies  who reaches Curvine's ports and the endpoints: block-curvine-ports, its Kyverno
                   generator and the admission policy that requires it, the endpoints' ingress.
    node_firewall  the DaemonSet, ConfigMap and RBAC of the node filter of Curvine's host-network ports
                   (its ruleset and agent: cluster_agents/node_firewall.py).
    agent          what the three in-cluster agents' objects share (ConfigMap with script and
                   cluster_agents/agent_core.py, hash annotation, probes, RBAC to list a line's Pods).
    janitor        the per-line L2 janitor Deployment (its logic: cluster_agents/l2_janitor.py).
    render         builds every chart; the one code path shared by the CDK app and
                   ``scripts/manifests.py``.

Every module here is importable without aws_cdk, so ``make manifests`` and the operator
tools can use them on a machine with no CDK toolchain.
"""

from platform_config.runtime import prepare_jsii_node

# Before any chart module imports cdk8s (which starts jsii's Node process).
prepare_jsii_node()
