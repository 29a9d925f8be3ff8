"""The scraper can open every scrape port on every node group that runs a target.

Security groups are followed through the synthesized templates, by reference (``Ref``,
``Fn::GetAtt``, ``Fn::ImportValue`` resolved to the exporting stack's output), never by a
hard-coded logical ID:

* nodes: an EKS managed node group without a launch template carries exactly the cluster
  security group of its cluster (EKS user guide, "sec-group-reqs"); a HyperPod cluster's nodes
  carry its ``VpcConfig.SecurityGroupIds`` (and an instance group's ``OverrideVpcConfig``);
* rules: every ``AWS::EC2::SecurityGroupIngress`` and inline ``SecurityGroupIngress`` of every
  template, plus the one rule EKS itself puts on the cluster security group (all traffic from
  itself; not in any template).

What the model leaves out: network ACLs (none in this platform), egress rules of the scraper's
group (all outbound), and what a NetworkPolicy does inside the cluster (checked separately below
against the rendered manifests).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

import pytest

from k8s.curvine_chart import HYPERPOD_NODE_LABEL, vpc_cidr
from k8s.render import render_manifests
from observability.autoscaling import project_scaling
from observability import targets
from observability.cluster_objects import dcgm_exporter_values

SgRef = tuple[str, str]  # (stack, canonical JSON of a local Ref/GetAtt)


@dataclass(frozen=True)
class Rule:
    group: SgRef
    source: SgRef
    protocol: str
    from_port: int
    to_port: int

    def admits(self, port: int) -> bool:
        if self.protocol == "-1":
            return True
        return self.protocol in ("tcp", "6") and self.from_port <= port <= self.to_port


def _key(stack: str, value: Any) -> SgRef:
    return stack, json.dumps(value, sort_keys=True)


def resolve(templates: dict[str, dict], stack: str, value: Any) -> SgRef:
    """A security-group reference, followed to the stack that defines it."""
    if isinstance(value, dict) and "Fn::ImportValue" in value:
        name = value["Fn::ImportValue"]
        exporters = [(s, o["Value"]) for s, t in templates.items() for o in t.get("Outputs", {}).values()
                     if o.get("Export", {}).get("Name") == name]
        assert len(exporters) == 1, f"export {name}: {exporters}"
        return resolve(templates, *exporters[0])
    assert isinstance(value, dict) and ({"Ref"} == set(value) or {"Fn::GetAtt"} == set(value)), (
        f"{stack}: a security group given as {value!r}; extend the model")
    return _key(stack, value)


def _resources(templates: dict[str, dict], kind: str):
    for stack, template in templates.items():
        for logical_id, resource in template.get("Resources", {}).items():
            if resource["Type"] == kind:
                yield stack, logical_id, resource.get("Properties", {})


def cluster_security_group(stack: str, cluster_logical_id: str) -> SgRef:
    return _key(stack, {"Fn::GetAtt": [cluster_logical_id, "ClusterSecurityGroupId"]})


def node_groups(templates: dict[str, dict]) -> dict[str, frozenset[SgRef]]:
    """``system:<stack>/<logical id>`` or ``hyperpod:<stack>/<logical id>`` -> the groups its nodes carry."""
    groups: dict[str, frozenset[SgRef]] = {}
    for stack, logical_id, props in _resources(templates, "AWS::EKS::Nodegroup"):
        assert "LaunchTemplate" not in props and "RemoteAccess" not in props, "extend the model: custom node SGs"
        cluster = props["ClusterName"]
        assert set(cluster) == {"Ref"}, cluster
        assert templates[stack]["Resources"][cluster["Ref"]]["Type"] == "AWS::EKS::Cluster"
        groups[f"system:{stack}/{logical_id}"] = frozenset({cluster_security_group(stack, cluster["Ref"])})
    for stack, logical_id, props in _resources(templates, "AWS::SageMaker::Cluster"):
        shared = frozenset(resolve(templates, stack, g) for g in props["VpcConfig"]["SecurityGroupIds"])
        groups[f"hyperpod:{stack}/{logical_id}"] = shared
        for group in props.get("InstanceGroups", []):
            override = group.get("OverrideVpcConfig", {}).get("SecurityGroupIds")
            if override:
                groups[f"hyperpod:{stack}/{logical_id}/{group['InstanceGroupName']}"] = frozenset(
                    resolve(templates, stack, g) for g in override)
    return groups


def ingress_rules(templates: dict[str, dict]) -> list[Rule]:
    """Every ingress rule that names a source security group, plus EKS's own rule on each cluster group."""
    rules: list[Rule] = []

    def add(stack: str, group: SgRef, rule: dict[str, Any]) -> None:
        if "SourceSecurityGroupId" not in rule:
            return  # CIDR rules: the scraper's ENIs are not named by any
        rules.append(Rule(group=group, source=resolve(templates, stack, rule["SourceSecurityGroupId"]),
                          protocol=str(rule["IpProtocol"]), from_port=int(rule.get("FromPort", -1)),
                          to_port=int(rule.get("ToPort", -1))))

    for stack, _, props in _resources(templates, "AWS::EC2::SecurityGroupIngress"):
        add(stack, resolve(templates, stack, props["GroupId"]), props)
    for stack, logical_id, props in _resources(templates, "AWS::EC2::SecurityGroup"):
        for rule in props.get("SecurityGroupIngress", []):
            add(stack, _key(stack, {"Fn::GetAtt": [logical_id, "GroupId"]}), rule)
    for stack, logical_id, _ in _resources(templates, "AWS::EKS::Cluster"):
        own = cluster_security_group(stack, logical_id)  # EKS: inbound all traffic from itself
        rules.append(Rule(group=own, source=own, protocol="-1", from_port=-1, to_port=-1))
    return rules


def scraper_groups(templates: dict[str, dict]) -> frozenset[SgRef]:
    ((stack, _, props),) = list(_resources(templates, "AWS::APS::Scraper"))
    return frozenset(resolve(templates, stack, g) for g in props["Source"]["EksConfiguration"]["SecurityGroupIds"])


def unreachable(templates: dict[str, dict], ports: list[int]) -> list[str]:
    """``"<node group>:<port>"`` for every scrape port the scraper cannot open on a node group."""
    sources, rules = scraper_groups(templates), ingress_rules(templates)
    return [f"{name}:{port}" for name, carried in node_groups(templates).items() for port in ports
            if not any(r.group in carried and r.source in sources and r.admits(port) for r in rules)]


@pytest.fixture(scope="module")
def raw(templates) -> dict[str, dict]:
    return {name: template.to_json() for name, template in templates.items()}


@pytest.fixture(scope="module")
def ports(obs_project) -> dict[int, tuple[str, ...]]:
    return targets.scrape_ports(obs_project.platform, obs_project.business_lines)


def test_the_model_finds_both_node_groups_and_every_job_port(raw, ports, obs_project) -> None:
    groups = node_groups(raw)
    assert sorted(name.split(":")[0] for name in groups) == ["hyperpod", "system"]
    jobs = {j for names in ports.values() for j in names}
    assert jobs == {targets.JOB_VLLM, targets.JOB_L2_JANITOR, targets.JOB_CURVINE_MASTER, targets.JOB_CURVINE_WORKER,
                    targets.JOB_KYVERNO, targets.JOB_DCGM, targets.JOB_L2_MOUNT_WATCHDOG, targets.JOB_KV_CANARY,
                    targets.JOB_NODE_FIREWALL}
    assert {obs_project.business_lines[0].vllm.port, 9001, 9002, 8000, 9100, 9101, 9400, 9420} <= set(ports)


def test_scraper_reaches_every_scrape_port_on_every_node_group(raw, ports) -> None:
    """The review's fault: system nodes carry only the cluster group, the scraper was only in the
    shared group, so the Curvine Primary and Kyverno (both schedulable there) were never scraped."""
    assert unreachable(raw, list(ports)) == []


def test_scraper_reaches_the_api_server_for_pod_discovery(raw) -> None:
    """The control plane's ENIs carry the cluster security group (and the shared group)."""
    ((stack, logical_id, _),) = list(_resources(raw, "AWS::EKS::Cluster"))
    cluster_group = cluster_security_group(stack, logical_id)
    sources = scraper_groups(raw)
    assert any(r.group == cluster_group and r.source in sources and r.admits(targets.API_SERVER_PORT)
               for r in ingress_rules(raw))


def test_scraper_is_admitted_only_on_the_scrape_ports(raw, ports) -> None:
    """Least privilege: a group of its own, no ingress into it, and rules for exactly these TCP ports."""
    sources = scraper_groups(raw)
    assert len(sources) == 1
    own = [r for r in ingress_rules(raw) if r.group in sources]
    assert own == []
    admitted = sorted((r.protocol, r.from_port, r.to_port) for r in ingress_rules(raw) if r.source in sources)
    assert admitted == sorted(("tcp", p, p) for p in [*ports, targets.API_SERVER_PORT])


def test_the_check_catches_the_scraper_in_the_shared_group_only(raw, ports) -> None:
    """The wiring before the fix (scraper in the shared group only) leaves the system nodes unreachable."""
    before = json.loads(json.dumps(raw))
    ((_, _, props),) = list(_resources(before, "AWS::SageMaker::Cluster"))
    (shared,) = [g for g in props["VpcConfig"]["SecurityGroupIds"] if "ClusterSecurityGroupId" not in json.dumps(g)]
    ((obs_stack, scraper_id, _),) = list(_resources(before, "AWS::APS::Scraper"))
    before[obs_stack]["Resources"][scraper_id]["Properties"]["Source"]["EksConfiguration"]["SecurityGroupIds"] = [shared]
    missing = unreachable(before, list(ports))
    assert missing and all(m.startswith("system:") for m in missing)
    assert {int(m.rsplit(":", 1)[1]) for m in missing} == set(ports)


# --- Where the targets run: why the system node group matters -------------------------------------

def _required_hyperpod(pod_spec: dict[str, Any]) -> bool:
    """True when the pod may run only on HyperPod nodes (a required node-affinity term on the label)."""
    required = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    return bool(required) and all(
        any(e["key"] == HYPERPOD_NODE_LABEL and e["operator"] == "In" for e in term.get("matchExpressions", []))
        for term in required)


def test_curvine_primary_and_kyverno_may_run_on_system_nodes(obs_project) -> None:
    """The Primary only *prefers* non-HyperPod nodes and Kyverno's replicas carry no affinity, so
    both land on the system nodes; Workers, the janitor and the DCGM exporter are HyperPod-only."""
    from k8s.kyverno import kyverno_helm_values

    curvine = render_manifests(obs_project, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(obs_project))["curvine"]
    by_component = {o["spec"]["template"]["metadata"]["labels"].get(targets.CURVINE_COMPONENT_LABEL):
                    o["spec"]["template"]["spec"] for o in curvine if o["kind"] in ("StatefulSet", "DaemonSet")}
    assert not _required_hyperpod(by_component["master"])
    assert _required_hyperpod(by_component["worker"])
    assert "affinity" not in kyverno_helm_values()["admissionController"]
    assert _required_hyperpod(dcgm_exporter_values(obs_project.platform))


def test_network_policies_admit_the_scraper_on_the_scrape_ports(obs_project, ports) -> None:
    """A NetworkPolicy that selects a scraped pod admits its scrape port from the VPC (the scraper's
    ENIs are in the private subnets), e.g. the Curvine Primary's ``curvine-master-ingress``."""
    rendered = render_manifests(obs_project, volume_id="vol-0a1b2c3d4e5f60718", availability_zone="us-west-2a", scaling=project_scaling(obs_project))
    objects = [o for chart in rendered.values() for o in chart]
    vpc = ipaddress.ip_network(vpc_cidr(obs_project.platform))
    pods = [(o["metadata"].get("namespace"), o["spec"]["template"]["metadata"]["labels"],
             {p["containerPort"] for c in o["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])})
            for o in objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
            and not o["spec"]["template"]["spec"].get("hostNetwork")]
    checked = 0
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        if "Ingress" not in spec.get("policyTypes", []):
            continue
        selector = spec["podSelector"].get("matchLabels", {})
        for namespace, labels, container_ports in pods:
            if namespace != policy["metadata"]["namespace"] or not selector.items() <= labels.items():
                continue
            for port in set(ports) & container_ports:
                checked += 1
                assert any(
                    (not rule.get("ports") or any(p.get("port") == port for p in rule["ports"]))
                    and (not rule.get("from") or any(
                        "ipBlock" in peer and vpc.subnet_of(ipaddress.ip_network(peer["ipBlock"]["cidr"]))
                        for peer in rule["from"]))
                    for rule in spec.get("ingress", [])), (policy["metadata"]["name"], port)
    assert checked >= 1  # the Curvine Primary's web port
