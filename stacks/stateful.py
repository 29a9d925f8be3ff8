"""The stateful resources, the template properties that would replace them, and the config fields behind those.

A change to a create-only property makes CloudFormation replace the resource: create a new one,
then delete the old. For the EKS cluster and the HyperPod cluster, both custom-named, the update
fails ("cannot update a stack when a custom-named resource requires replacing"); where it goes
through, nodes, their NVMe L2 pool and the Curvine metadata are lost (aws-cdk issue 30107 asks
for a guard against exactly this). So the logical IDs and these properties are recorded in a
snapshot (``tests/fixtures/stateful-resources.json`` for the scenario config,
``stateful-resources.json`` at the repository root for a deployment's own ``config/``), and
:func:`compare` names what changed and which config field did it.

Create-only properties: from the resource schemas cfn-lint 1.58.0 ships (``createOnlyProperties``
of ``AWS::EKS::Cluster`` and ``AWS::SageMaker::Cluster``; docs/sources.md §10). The
``AWS::EC2::Volume`` schema lists none, but EBS ModifyVolume changes only size, type, IOPS and
throughput, so a volume in another zone, with other encryption or from a snapshot is a new,
empty volume: those properties are recorded for the Curvine volume.

References count too. The HyperPod cluster's ``VpcConfig`` is ``Fn::ImportValue`` of the network
stack's subnet and security group: a new subnet CIDR leaves that token unchanged, yet replaces
the subnet and so, at deploy time, the HyperPod cluster. So every resource a replacing property
refers to (``Ref``, ``Fn::GetAtt``, ``Fn::ImportValue`` across stacks, transitively) is recorded
with its own create-only properties (from cfn-lint's schema for its type), as a dependency.

Snapshot shape (JSON)::

    {"config_dir": "tests/fixtures/config",
     "resources": {"<role>": {"config": {"<dotted config field>": value, ...},
                              "stack": "kvcache-eks", "type": "AWS::EKS::Cluster",
                              "logical_id": "EksCluster",
                              "properties": {"Name": "kvcache-eks", ...},
                              "dependencies": {"<stack>/<logical id>": {
                                  "type": "AWS::EC2::Subnet", "via": "VpcConfig",
                                  "properties": {"CidrBlock": "10.192.0.0/18", ...}}}}}}

``stack``/``type``/``logical_id``/``properties`` are absent when the resource is not in the
templates (the Curvine volume with Curvine disabled).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from platform_config import PlatformConfig

#: How the script rewrites the scenario config's snapshot (the default of :func:`compare`; the
#: script passes the command of the pair it checks).
REGENERATE = (".venv/bin/python scripts/stateful_snapshot.py --config tests/fixtures/config "
              "--snapshot tests/fixtures/stateful-resources.json --write")


@dataclass(frozen=True)
class StatefulResource:
    """One stateful resource: where it is and which config fields its replacing properties follow.

    Attributes:
        role: human name, the snapshot key.
        stack_role: key of :func:`stacks.stack_ids` of the stack holding it.
        type: CloudFormation type; the stack holds at most one of it.
        properties: property path (``/``-separated, as in ``createOnlyProperties``) -> the
            dotted config fields it follows (empty: only code sets it).
        presence: config fields that decide whether the resource exists at all.
    """

    role: str
    stack_role: str
    type: str
    properties: Mapping[str, tuple[str, ...]]
    presence: tuple[str, ...] = ()
    #: Every stack name starts with ``project``, so all of these move with it.
    location: tuple[str, ...] = field(default=("project",))

    @property
    def config_fields(self) -> tuple[str, ...]:
        """Every config field that can replace or remove this resource (deduplicated, ordered)."""
        fields = [*self.location, *self.presence, *(f for fs in self.properties.values() for f in fs)]
        return tuple(dict.fromkeys(fields))


#: The network fields that pick the HyperPod subnet and security group.
_NETWORK = ("network", "availability_zones", "gpu_availability_zone")

STATEFUL_RESOURCES: tuple[StatefulResource, ...] = (
    StatefulResource(
        role="EKS cluster",
        stack_role="eks",
        type="AWS::EKS::Cluster",
        properties={
            "OutpostConfig": (),
            "EncryptionConfig": (),
            "KubernetesNetworkConfig/IpFamily": (),
            "KubernetesNetworkConfig/ServiceIpv4Cidr": (),
            "AccessConfig/BootstrapClusterCreatorAdminPermissions": (),
            "Name": ("eks.cluster_name",),
            "RoleArn": (),
            "BootstrapSelfManagedAddons": (),
        },
    ),
    StatefulResource(
        role="HyperPod cluster",
        stack_role="hyperpod",
        type="AWS::SageMaker::Cluster",
        properties={
            "ClusterName": ("hyperpod.cluster_name",),
            # Subnet of the GPU zone, the shared security group and the EKS cluster's group.
            "VpcConfig": _NETWORK,
            "Orchestrator/Eks": ("eks.cluster_name",),
        },
    ),
    StatefulResource(
        role="Curvine volume",
        stack_role="hyperpod",
        type="AWS::EC2::Volume",
        properties={
            "AvailabilityZone": ("gpu_availability_zone",),
            "Encrypted": (),
            "KmsKeyId": (),
            "SnapshotId": (),
            "OutpostArn": (),
        },
        presence=("curvine.enabled",),
    ),
)


def _get(data: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _references(value: Any) -> list[tuple[str, str | None]]:
    """``(kind, target)`` of every intrinsic reference in ``value``: ``("local", logical_id)`` for
    ``Ref``/``Fn::GetAtt``, ``("export", name)`` for ``Fn::ImportValue``."""
    found: list[tuple[str, str | None]] = []
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str) and not value["Ref"].startswith("AWS::"):
            found.append(("local", value["Ref"]))
        elif "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            found.append(("local", target[0] if isinstance(target, list) else str(target).split(".")[0]))
        elif "Fn::ImportValue" in value and isinstance(value["Fn::ImportValue"], str):
            found.append(("export", value["Fn::ImportValue"]))
        else:
            for item in value.values():
                found += _references(item)
    elif isinstance(value, list):
        for item in value:
            found += _references(item)
    return found


def _create_only(region: str, type_name: str) -> list[str]:
    """``createOnlyProperties`` of ``type_name`` as ``/``-paths below ``Properties`` (cfn-lint's
    schema; ``[]`` when it has none or no schema). Array wildcards cut the path there."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    try:
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, type_name).schema
    except Exception:  # custom resources and types cfn-lint does not know
        return []
    paths = []
    for path in schema.get("createOnlyProperties", []):
        parts = path.removeprefix("/properties/").split("/")
        parts = parts[: parts.index("*")] if "*" in parts else parts
        paths.append("/".join(parts))
    return sorted(dict.fromkeys(paths))


def _exports(templates: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, Any]]:
    """Export name -> (stack name, exported value) over every template."""
    return {out["Export"]["Name"]: (name, out["Value"])
            for name, template in templates.items()
            for out in template.get("Outputs", {}).values() if isinstance(out.get("Export"), dict)}


def _dependencies(templates: Mapping[str, Mapping[str, Any]], exports: Mapping[str, tuple[str, Any]], stack: str,
                  values: Mapping[str, Any], region: str) -> dict[str, Any]:
    """Every resource the ``values`` (property -> value) refer to, transitively, with its create-only
    properties (``exports``: :func:`_exports` of ``templates``)."""
    found: dict[str, Any] = {}
    todo = [(stack, ref, prop) for prop, value in values.items() for ref in _references(value)]
    while todo:
        here, (kind, target), via = todo.pop(0)
        if kind == "export":
            if target not in exports:
                continue
            there, value = exports[target]
            todo += [(there, ref, via) for ref in _references(value)]
            continue
        resource = templates.get(here, {}).get("Resources", {}).get(target)
        key = f"{here}/{target}"
        if resource is None or key in found:
            continue
        props = resource.get("Properties", {})
        paths = _create_only(region, resource["Type"])
        properties = {p: _get(props, p.split("/")) for p in paths}
        found[key] = {"type": resource["Type"], "via": via, "properties": properties}
        todo += [(here, ref, via) for value in properties.values() for ref in _references(value)]
    return dict(sorted(found.items()))


def snapshot(templates: Mapping[str, Mapping[str, Any]], platform: PlatformConfig, *,
             stack_names: Mapping[str, str], config_dir: str) -> dict[str, Any]:
    """The snapshot of ``templates`` (stack name -> template dict) for ``platform``.

    Args:
        stack_names: stack role -> stack name (:func:`stacks.stack_ids`).
        config_dir: recorded as given, for the messages.

    Raises:
        ValueError: a stack holds more than one resource of a stateful type.
    """
    resources: dict[str, Any] = {}
    config = platform.model_dump(mode="json")
    exports = _exports(templates)
    for spec in STATEFUL_RESOURCES:
        # Each config field's JSON value, by its dotted name ("eks.cluster_name").
        entry: dict[str, Any] = {"config": {f: _get(config, f.split(".")) for f in spec.config_fields}}
        stack = stack_names[spec.stack_role]
        found = {lid: r for lid, r in templates.get(stack, {}).get("Resources", {}).items() if r["Type"] == spec.type}
        if len(found) > 1:
            raise ValueError(f"{stack} holds {len(found)} {spec.type} resources ({', '.join(found)}); "
                             f"{spec.role} must be the only one")
        if found:
            ((logical_id, resource),) = found.items()
            props = resource.get("Properties", {})
            values = {p: _get(props, p.split("/")) for p in spec.properties}
            entry.update(stack=stack, type=spec.type, logical_id=logical_id, properties=values,
                         dependencies=_dependencies(templates, exports, stack, values, platform.region))
        resources[spec.role] = entry
    return {"config_dir": config_dir, "resources": resources}


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _changes(name: str, old: Any, new: Any) -> list[str]:
    """``"<path> (<old> -> <new>)"`` for every leaf that differs: ``network.cidr ("10.192.0.0/16" -> ...)``."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new)) for c in _changes(f"{name}.{k}", old.get(k), new.get(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in _changes(f"{name}.{i}", a, b)]
    return [] if old == new else [f"{name} ({_short(old)} -> {_short(new)})"]


def _because(spec: StatefulResource, fields: tuple[str, ...], saved: dict, current: dict, where: str) -> str:
    changed = [c for f in fields for c in _changes(f, saved["config"].get(f), current["config"].get(f))]
    if changed:
        return f"caused by config field{'s' if len(changed) > 1 else ''} {', '.join(changed)} in {where}"
    return ("no config field it follows changed, so code did it (a refactor, a construct or library upgrade)"
            if fields else "only code sets it (a refactor, a construct or library upgrade)")


def compare(saved: Mapping[str, Any], current: Mapping[str, Any], *, regenerate: str = REGENERATE) -> list[str]:
    """What would replace or remove a stateful resource, one message per change.

    Each message names the resource, its stack and logical ID, the property (old -> new), the
    config field whose change caused it (or that code did), and how to proceed. Empty list: no
    stateful resource would be replaced.

    Args:
        regenerate: the command that rewrites this snapshot, quoted in the messages.
    """
    where = f"{current.get('config_dir', '?')}/platform.yaml"
    tail = f"If you mean it, follow docs/deploy.md \"Replacing a stateful resource\", then run: {regenerate}"
    problems: list[str] = []
    for spec in STATEFUL_RESOURCES:
        old, new = saved["resources"].get(spec.role), current["resources"][spec.role]
        if old is None:
            problems.append(f"{spec.role}: not in the snapshot; record it: {regenerate}")
            continue
        name = f"{spec.role} {old.get('stack')}/{old.get('logical_id')}"
        if "logical_id" not in old:
            if "logical_id" in new:
                problems.append(f"{spec.role} is new in {new['stack']}/{new['logical_id']} "
                                f"({_because(spec, spec.presence, old, new, where)}); record it: {regenerate}")
            continue
        if "logical_id" not in new:
            problems.append(f"{name} is no longer in the templates: a deploy deletes it; "
                            f"{_because(spec, spec.config_fields, old, new, where)}. {tail}")
            continue
        if (old["stack"], old["logical_id"]) != (new["stack"], new["logical_id"]):
            problems.append(f"{name} moves to {new['stack']}/{new['logical_id']}: CloudFormation creates a new "
                            f"{spec.role} and deletes the old one; {_because(spec, spec.location, old, new, where)}. "
                            f"{tail}")
            continue
        for prop, fields in spec.properties.items():
            before, after = old["properties"].get(prop), new["properties"].get(prop)
            if before != after:
                details = [c.removeprefix(f"{prop} ") for c in _changes(prop, before, after)]
                problems.append(f"{name}: {prop} changes {'; '.join(details)}, which replaces the {spec.role} "
                                f"on deploy; {_because(spec, fields, old, new, where)}. {tail}")
        problems += _dependency_changes(spec, name, old, new, where, tail)
    return problems


def _dependency_changes(spec: StatefulResource, name: str, old: Mapping[str, Any], new: Mapping[str, Any],
                        where: str, tail: str) -> list[str]:
    """Resources the stateful one refers to that would be replaced (a new ID or ARN reaches it)."""
    problems = []
    before, after = old.get("dependencies", {}), new.get("dependencies", {})
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        via, dep_type = (a or b)["via"], (a or b)["type"]
        # The fields of the referring property, plus those of a stateful dependency itself (the
        # HyperPod cluster's VpcConfig includes the EKS cluster's security group).
        fields = tuple(dict.fromkeys([*spec.properties.get(via, ()), *(
            f for other in STATEFUL_RESOURCES if other.type == dep_type for f in other.config_fields)]))
        if b is None or a is None:
            what = "now refers to" if b is None else "no longer refers to"
            problems.append(f"{name}: {via} {what} {key} ({(a or b)['type']}), so its value changes on deploy and "
                            f"the {spec.role} is replaced; {_because(spec, fields, old, new, where)}. {tail}")
            continue
        changed = _changes("", b["properties"], a["properties"])
        changed = [c.removeprefix(".") for c in changed]
        if changed or a["type"] != b["type"]:
            problems.append(f"{name}: {via} refers to {key} ({a['type']}), which is replaced because "
                            f"{', '.join(changed) or 'its type'} changes, and with it the {spec.role}; "
                            f"{_because(spec, fields, old, new, where)}. {tail}")
    return problems
