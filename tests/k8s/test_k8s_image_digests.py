"""Only the platform's images, pinned by digest, run in the Curvine namespace (k8s/image_digests.py,
issue 25 item 7); ``versions.images.require_digests`` turns a tag into a config error.

The scenario config pins by tag (digests cannot be looked up here), so these tests render the
Curvine chart from a copy whose images carry digests (made-up, well-formed) and evaluate the
rendered ValidatingAdmissionPolicy with tests/k8s/vap_eval.py: the chart's own pods and the FUSE
pod the driver builds are admitted; a tag, another image, an init or ephemeral container of
another image, a changed image are refused.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import kubernetes_validate
import pytest

from k8s import names
from k8s.image_digests import IMAGE_DIGESTS, curvine_images, enforced
from k8s.kube import KUBERNETES_VERSION
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from platform_config import load_project
from platform_config import ConfigError
from tests.example_config import copy_example_config, edit_yaml
from tests.k8s import vap_eval
from tests.k8s.conftest import VOLUME_ID, ZONE, find
from tests.k8s.test_k8s_csi_node_limits import fuse_pod
from tests.k8s.test_k8s_mount_lifetime import _namespace_labels, _plugin_env

BUSYBOX = "docker.io/library/busybox@sha256:" + "ab" * 32


def _digest(image: str) -> str:
    return f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def _pin_every_image(data: dict) -> None:
    images = data["versions"]["images"]
    images.setdefault("l2_janitor", "python:3.12.8-slim-bookworm")
    for field, image in list(images.items()):
        images[field] = _digest(image)


@pytest.fixture(scope="module")
def pinned_dir(tmp_path_factory) -> Path:
    config = copy_example_config(tmp_path_factory.mktemp("digests") / "config")
    edit_yaml(config / "platform.yaml", _pin_every_image)
    return config


@pytest.fixture(scope="module")
def pinned(pinned_dir):
    project = load_project(pinned_dir)
    return project, render_manifests(project, volume_id=VOLUME_ID, availability_zone=ZONE,
                                     scaling=project_scaling(project))["curvine"]


@pytest.fixture(scope="module")
def decide(pinned):
    _, curvine = pinned
    policy = find(curvine, "ValidatingAdmissionPolicy", IMAGE_DIGESTS)
    binding = find(curvine, "ValidatingAdmissionPolicyBinding", IMAGE_DIGESTS)

    def run(obj, *, operation="CREATE", old=None, namespace="curvine", sub="", user="system:serviceaccount:kube-system:daemon-set-controller"):
        request = {"operation": operation, "namespace": namespace, "name": obj["metadata"].get("name", ""),
                   "userInfo": {"username": user},
                   "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": sub}
        labels = _namespace_labels(curvine, "curvine") if namespace == "curvine" else \
            {"kubernetes.io/metadata.name": namespace}
        return vap_eval.evaluate(policy, [binding], request=request, old_object=old, obj=obj, namespace_labels=labels)

    return run


def _pods(curvine) -> list[dict]:
    """A pod of every workload of the chart, as its controller creates it from the template."""
    pods = []
    for o in curvine:
        if o["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
            template = copy.deepcopy(o["spec"]["template"])
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {**template["metadata"], "name": f"{o['metadata']['name']}-0",
                                      "namespace": o["metadata"]["namespace"]},
                         "spec": template["spec"]})
    return pods


def test_with_tags_no_policy_is_rendered(k8s_project, curvine):
    assert not enforced(k8s_project.platform)
    assert not [o for o in curvine if o["metadata"].get("name") == IMAGE_DIGESTS]


def test_with_digests_the_policy_is_rendered_and_valid(pinned):
    project, curvine = pinned
    assert enforced(project.platform)
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        kubernetes_validate.validate(find(curvine, kind, IMAGE_DIGESTS), KUBERNETES_VERSION, strict=True)


def test_the_charts_own_pods_are_admitted(pinned, decide):
    project, curvine = pinned
    pods = _pods(curvine)
    assert {p["metadata"]["name"] for p in pods} >= {f"{names.CSI_NODE}-0", f"{names.L2_MOUNT_WATCHDOG}-0"}
    assert {c["image"] for p in pods for c in p["spec"]["containers"]} == set(curvine_images(project.platform).values())
    for pod in pods:
        decision = decide(pod)
        assert decision.applied and decision.allowed, (pod["metadata"]["name"], decision)


def test_the_fuse_pod_runs_the_plugins_digest(pinned, decide):
    """``imagePullPolicy: Never`` from ``STANDALONE_IMAGE``: the very reference of the node
    plugin's container, digest included, and the policy admits it."""
    _, curvine = pinned
    env = _plugin_env(find(curvine, "DaemonSet", names.CSI_NODE))
    (plugin,) = [c for c in find(curvine, "DaemonSet", names.CSI_NODE)["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "csi-plugin"]
    assert env["STANDALONE_IMAGE"] == plugin["image"] and "@sha256:" in plugin["image"]
    decision = decide(fuse_pod(env), user=f"system:serviceaccount:curvine:{names.CSI_NODE}")
    assert decision.applied and decision.allowed, decision


def _tag(pod):
    c = pod["spec"]["containers"][0]
    c["image"] = c["image"].partition("@")[0]


def _other_digest(pod):
    pod["spec"]["containers"][0]["image"] = BUSYBOX


def _init(pod):
    pod["spec"]["initContainers"] = [{"name": "x", "image": BUSYBOX}]


def _ephemeral(pod):
    pod["spec"]["ephemeralContainers"] = [{"name": "x", "image": "docker.io/library/busybox:1.36"}]


@pytest.mark.parametrize("change", [_tag, _other_digest, _init, _ephemeral])
def test_another_image_is_refused(pinned, decide, change):
    _, curvine = pinned
    pod = next(p for p in _pods(curvine) if p["metadata"]["name"].startswith(names.CSI_NODE))
    change(pod)
    decision = decide(pod, user="arn:aws:sts::111122223333:assumed-role/admin/me")
    assert decision.applied and not decision.allowed
    assert "pinned by digest" in decision.message


def test_updates_may_keep_but_not_change_an_image(pinned, decide):
    _, curvine = pinned
    old = next(p for p in _pods(curvine) if p["metadata"]["name"].startswith(names.CURVINE_MASTER))
    _tag(old)  # a pod started before the digests: a label change on it stays possible
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"]["extra"] = "x"
    assert decide(relabelled, operation="UPDATE", old=old).allowed
    debug = copy.deepcopy(old)
    _ephemeral(debug)
    decision = decide(debug, operation="UPDATE", old=old, sub="ephemeralcontainers")
    assert decision.applied and not decision.allowed
    swapped = copy.deepcopy(old)
    _other_digest(swapped)
    swapped["spec"]["containers"][0]["image"] = "ghcr.io/curvineio/curvine:v0.3.3"
    assert not decide(swapped, operation="UPDATE", old=old).allowed


def test_other_namespaces_are_not_concerned(pinned, decide):
    _, curvine = pinned
    pod = _pods(curvine)[0]
    _other_digest(pod)
    assert not decide(pod, namespace="rag-assistant").applied


def test_require_digests_names_the_file_the_field_and_the_forms(config_dir: Path):
    path = config_dir / "platform.yaml"
    edit_yaml(path, lambda d: d["versions"]["images"].update(require_digests=True))
    with pytest.raises(ConfigError) as info:
        load_project(config_dir)
    (problem,) = [str(p) for p in info.value.problems]
    assert f"{path}: versions.images.curvine" in problem
    assert "@sha256:<64 lowercase hex digits>" in problem and "crane digest" in problem


def test_require_digests_accepts_digests(pinned_dir: Path):
    edit_yaml(pinned_dir / "platform.yaml", lambda d: d["versions"]["images"].update(require_digests=True))
    project = load_project(pinned_dir)
    assert project.platform.versions.images.require_digests and enforced(project.platform)
