"""The node budget counts exactly what the charts render (``platform_config.node_fit``).

The budget reads the platform pods' requests from ``platform_config.pod_resources``, the constants the charts
are built from; this renders the charts and recomputes each pod's request from the manifests
(sum of the containers, or the largest init container), so a container or a request added to a
chart without the budget knowing fails here.
"""

from __future__ import annotations

from platform_config.fields import quantity_bytes
from platform_config.node_fit import node_budget, pod_request
from k8s import names
from platform_config import pod_resources
from observability.cluster_objects import dcgm_exporter_values
from tests.k8s.conftest import find


def _request(pod_spec: dict) -> tuple[int, int]:
    def requests(containers: list[dict], key: str, scale: int) -> list[int]:
        return [round(quantity_bytes(c.get("resources", {}).get("requests", {}).get(key, "0")) * scale)
                for c in containers]

    init = pod_spec.get("initContainers", [])
    return (max([sum(requests(pod_spec["containers"], "cpu", 1000))] + requests(init, "cpu", 1000)),
            max([sum(requests(pod_spec["containers"], "memory", 1))] + requests(init, "memory", 1)))


def test_budget_reservations_equal_the_rendered_pods(k8s_project, manifests) -> None:
    curvine = manifests["curvine"]
    worker = find(curvine, "DaemonSet", names.CURVINE_WORKER)["spec"]["template"]["spec"]
    csi_node = find(curvine, "DaemonSet", names.CSI_NODE)["spec"]["template"]["spec"]
    plugin_env = {e["name"]: e.get("value") for e in csi_node["containers"][0]["env"]}
    fuse = (round(quantity_bytes(plugin_env["STANDALONE_CPU_REQUEST"]) * 1000),
            round(quantity_bytes(plugin_env["STANDALONE_MEMORY_REQUEST"])))
    janitors = [find(objects, "Deployment", names.L2_JANITOR)["spec"]["template"]["spec"]
                for chart, objects in manifests.items() if chart.startswith("line-")
                and any(o["kind"] == "Deployment" and o["metadata"]["name"] == names.L2_JANITOR for o in objects)]
    l2_lines = [l for l in k8s_project.business_lines if l.cache.l2_enabled]
    assert len(janitors) == len(l2_lines) == 3

    g6e = k8s_project.platform.hyperpod.instance_groups[0]
    taken = {r.name: (r.cpu_millicores, r.memory_bytes)
             for r in node_budget(k8s_project.platform, g6e, k8s_project.business_lines).reservations}
    assert taken["Curvine Worker"] == _request(worker) == (1000, 2 * 2**30)
    assert taken["Curvine CSI node plugin"] == _request(csi_node) == (70, 192 * 2**20)
    assert taken["Curvine FUSE pod"] == fuse == pod_request(pod_resources.FUSE_POD)
    janitor_total = [sum(x) for x in zip(*(_request(j) for j in janitors))]
    assert list(taken["3 x L2 janitor"]) == janitor_total
    # The DCGM exporter's values set no resources, so the chart's defaults (values.yaml of 4.8.2) apply.
    assert "resources" not in dcgm_exporter_values(k8s_project.platform)
    assert taken["DCGM exporter"] == pod_request(pod_resources.PodResources(
        "DCGM exporter", (pod_resources.DCGM_EXPORTER_CHART_RESOURCES,))) == (100, 128 * 2**20)
