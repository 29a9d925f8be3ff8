"""Only the platform's own images, pinned by digest, run in the Curvine namespace.

Why. The Curvine namespace is the one whose Pod Security level is ``privileged``: the Curvine
Workers and FUSE pods (hostNetwork, privileged), the CSI node plugin (privileged, mounts the
kubelet's directories) and the L2 mount watchdog (privileged with the host's PID namespace when it
heals) run there. A tag is a name the registry's owner (or whoever takes over the account) can
point at other bytes; the next pull on any node then runs them with those privileges (issue 25,
item 7). A digest names the bytes.

This ValidatingAdmissionPolicy is rendered when every image that runs in the Curvine namespace is
pinned by digest in ``versions.images`` (:func:`enforced`; ``versions.images.require_digests``
makes a tag there a config error instead). It refuses a pod CREATE or UPDATE, from any user or
controller, and an ``ephemeralcontainers`` update, whose containers, init containers or
ephemeral containers name an image that is not one of :func:`curvine_images` exactly; every one
of those is ``<repository>[:<tag>]@sha256:<64 hex>``. An UPDATE may keep an image the pod
already had (a label change on a pod started before the policy is not refused; a new image is).

The FUSE pods follow: the driver starts them from ``STANDALONE_IMAGE`` with ``imagePullPolicy:
Never`` (curvine-csi v0.3.2-alpha ``standalone_manager.go`` l.456), and the chart sets
``STANDALONE_IMAGE`` to exactly the node plugin's reference, digest included, so the kubelet finds
the bytes the plugin's own pod pulled (tests/k8s/test_k8s_csi_node_limits.py).
"""

from __future__ import annotations

from typing import Final

from constructs import Construct

from k8s.fuse_pod_guard import NAMESPACE_NAME_LABEL
from k8s.kube import k8s
from platform_config import PlatformConfig
from platform_config.fields import is_digest_pinned

#: Name of the policy and of its binding (cluster-scoped objects).
IMAGE_DIGESTS: Final = "curvine-image-digests"


def curvine_images(platform: PlatformConfig) -> dict[str, str]:
    """The images that run in the Curvine namespace, by their ``versions.images`` field: Curvine
    (Primary, Workers), the CSI driver (controller, node plugin, FUSE pods), the CSI sidecars, and
    the mount watchdog's Python image when the watchdog is on, the node filter's when it is on."""
    images = platform.versions.images
    found = {"curvine": images.curvine, "curvine_csi": images.curvine_csi,
             "csi_node_driver_registrar": images.csi_node_driver_registrar,
             "csi_provisioner": images.csi_provisioner, "livenessprobe": images.livenessprobe}
    if platform.curvine.mount_watchdog.enabled:
        found["l2_janitor"] = images.l2_janitor
    if platform.curvine.node_firewall.enabled:
        found["node_firewall"] = images.node_firewall
    return found


def enforced(platform: PlatformConfig) -> bool:
    """Whether the chart renders the policy: every image of :func:`curvine_images` is pinned by digest."""
    return all(is_digest_pinned(image) for image in curvine_images(platform).values())


def _images_of(pod: str) -> str:
    return (f"{pod}.spec.containers.map(c, c.image)"
            f" + ((has({pod}.spec.initContainers)) ? {pod}.spec.initContainers.map(c, c.image) : [])"
            f" + ((has({pod}.spec.ephemeralContainers)) ? {pod}.spec.ephemeralContainers.map(c, c.image) : [])")


def image_digests(scope: Construct, *, namespace: str, images: list[str], labels: dict[str, str] | None = None
                  ) -> tuple[k8s.KubeValidatingAdmissionPolicy, k8s.KubeValidatingAdmissionPolicyBinding]:
    """The policy and its binding (``validationActions: [Deny]``, ``failurePolicy: Fail``).

    Args:
        scope: the chart.
        namespace: the Curvine namespace.
        images: the images allowed there, each pinned by digest (:func:`curvine_images`).
        labels: labels for both objects.

    Raises:
        ValueError: an image not pinned by digest (the policy would refuse the chart's own pods).
    """
    loose = [image for image in images if not is_digest_pinned(image)]
    if loose:
        raise ValueError(f"images not pinned by digest: {loose}")
    allowed = ", ".join(f"'{image}'" for image in sorted(set(images)))
    rule = k8s.NamedRuleWithOperations
    policy = k8s.KubeValidatingAdmissionPolicy(
        scope, "ImageDigests", metadata=k8s.ObjectMeta(name=IMAGE_DIGESTS, labels=labels),
        spec=k8s.ValidatingAdmissionPolicySpec(
            failure_policy="Fail",
            match_constraints=k8s.MatchResources(
                resource_rules=[
                    rule(api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=["pods"]),
                    rule(api_groups=[""], api_versions=["v1"], operations=["UPDATE"],
                         resources=["pods/ephemeralcontainers"])],
                namespace_selector=k8s.LabelSelector(match_labels={NAMESPACE_NAME_LABEL: namespace})),
            variables=[
                k8s.Variable(name="images", expression=_images_of("object")),
                k8s.Variable(name="kept", expression=(
                    f"(request.operation == 'UPDATE') ? ({_images_of('oldObject')}) : []")),
            ],
            validations=[k8s.Validation(
                expression=(f"variables.images.all(i, i in variables.kept || "
                            f"(i.matches('^[^@\\\\s]+@sha256:[0-9a-f]{{64}}$') && i in [{allowed}]))"),
                reason="Forbidden",
                message=(f"pods in the {namespace} namespace run only the platform's images, pinned by digest "
                         f"(<repository>[:<tag>]@sha256:<64 hex>, versions.images): {', '.join(sorted(set(images)))}"),
            )]))
    binding = k8s.KubeValidatingAdmissionPolicyBinding(
        scope, "ImageDigestsBinding", metadata=k8s.ObjectMeta(name=IMAGE_DIGESTS, labels=labels),
        spec=k8s.ValidatingAdmissionPolicyBindingSpec(policy_name=IMAGE_DIGESTS, validation_actions=["Deny"]))
    binding.add_dependency(policy)
    return policy, binding
