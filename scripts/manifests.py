#!/usr/bin/env python3
"""``make manifests``: the cdk8s charts as plain YAML in ``dist/`` for GitOps or kubectl users.

Same code path as the CDK app (:func:`k8s.render.render_manifests` builds the same chart
classes the stacks apply), from the same config directory (``--config DIR``, else
``$KVCACHE_CONFIG_DIR``, else ``config/``; ``make manifests CONFIG=dir``). Writes into the output
directory (readable by everyone, like ``cdk.out/``), replacing and removing only the files it wrote
there before (listed in ``.kvcache-manifests.json``): a file of the same name that it did not write
is refused, never overwritten, and nothing else in the directory is touched:

* ``curvine.yaml``                    the Curvine chart (needs the Primary's EBS volume ID);
* ``line-<name>.yaml``                one file per business line, in apply order;
* ``kyverno-values.yaml``             values for the pinned Kyverno Helm chart
                                       (install it before applying the line files);
* ``patches/<name>.reference.json``   REFERENCE ONLY, not applicable as-is: the append-only
                                       RFC 6902 operations for the reference layout (vLLM is
                                       container 0), wrapped in an object that says so, so
                                       ``kubectl patch --type=json`` rejects the file. On
                                       clusters without Kyverno run ``scripts/patch_endpoint.sh
                                       <line>``, which computes the patch against the live
                                       Deployment (removes the operator's entries first).

The volume ID and zone come from ``--volume-id`` / ``--availability-zone`` (or the environment
variables ``CURVINE_VOLUME_ID`` / ``CURVINE_VOLUME_AZ``, e.g.
``CURVINE_VOLUME_ID=vol-... make manifests``), else from the
outputs file of a deployed app (``cdk deploy --all --outputs-file cdk-outputs.json``; keys
``CurvineVolumeId`` / ``CurvineVolumeAvailabilityZone`` of the hyperpod stack), else the zone
defaults to ``gpu_availability_zone`` from config. A zone outside the platform's region is refused.
Without a volume ID the Curvine chart is not rendered: an existing ``curvine.yaml`` in the output
directory is kept as it was (a warning says so) unless ``--drop-curvine`` asks to remove it.

An autoscaling line's InferenceEndpointConfig names the platform's Prometheus workspace, which KEDA
queries (docs/observability.md, "Autoscaling"): its ID comes from ``--prometheus-workspace-id`` (or
``PROMETHEUS_WORKSPACE_ID``), else the outputs file (key ``PrometheusWorkspaceId`` of the
observability stack); without one the line files name a workspace that does not exist
(``ws-00000000-...``, a warning says so) and their triggers read nothing until re-rendered.

Bad input (invalid config, malformed volume ID or zone, unreadable outputs file) prints one
``error:`` line per problem and writes nothing. Exit codes: see --help (the table in docs/operator-tools.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from any directory
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from k8s import names  # noqa: E402
from k8s.kyverno import kyverno_helm_values  # noqa: E402
from k8s.patch import endpoint_json_patch  # noqa: E402
from k8s.render import CURVINE_CHART, render_manifests  # noqa: E402
from observability.autoscaling import PLACEHOLDER_WORKSPACE_ID, project_scaling  # noqa: E402
from operator_tools import cli  # noqa: E402
from platform_config import BusinessLineConfig, ConfigError, ProjectConfig  # noqa: E402
from platform_config.yaml_source import path_problem  # noqa: E402

TOOL = "manifests.py"

#: Output keys the L2-cache stack exports (stacks/l2_cache_stack.py).
VOLUME_ID_OUTPUT = "CurvineVolumeId"
ZONE_OUTPUT = "CurvineVolumeAvailabilityZone"
PLACEHOLDER_VOLUME_ID = "vol-00000000000000000"
#: Output key of the observability stack's Prometheus workspace ID (stacks/observability_stack.py).
WORKSPACE_OUTPUT = "PrometheusWorkspaceId"
#: An AMP workspace ID: ``ws-`` and letters, digits or dashes (the CRD's serverAddress pattern).
WORKSPACE_ID_PATTERN = r"^ws-[a-zA-Z0-9-]+$"


class InputError(Exception):
    """Bad command-line input; the message names the flag or file."""


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the TOML config, the policy's patches)."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML of ``objects`` in order (keys kept in chart order)."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def read_outputs(path: Path) -> dict[str, str]:
    """Flatten a ``cdk deploy --outputs-file`` JSON (``{stack: {key: value}}``) to ``{key: value}``.

    Raises:
        InputError: unreadable file, not the outputs format, or a key exported by two stacks.
    """
    problem = path_problem(path, allowed="the JSON file `cdk deploy --outputs-file` writes")
    if problem is not None:
        raise InputError(f"--outputs-file {problem}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON
        raise InputError(f"--outputs-file {path}: cannot read JSON: {exc}; allowed: the JSON file "
                         "`cdk deploy --outputs-file` writes") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InputError(f"--outputs-file {path}: expected {{stack: {{output: value}}}} from cdk deploy --outputs-file")
    flat: dict[str, str] = {}
    for stack, outputs in data.items():
        for key, value in outputs.items():
            if key in (VOLUME_ID_OUTPUT, ZONE_OUTPUT) and key in flat and flat[key] != value:
                raise InputError(f"--outputs-file {path}: {key} exported by more than one stack ({stack})")
            flat[key] = str(value)
    return flat


def resolve_volume(project: ProjectConfig, volume_id: str | None, zone: str | None,
                   outputs_file: Path | None) -> tuple[str | None, str]:
    """Volume ID (or None) and zone from flags, then the outputs file, then config.

    Raises:
        InputError: the zone is not in the platform's region (naming where it came from).
    """
    outputs = read_outputs(outputs_file) if outputs_file is not None else {}
    volume_id = volume_id or outputs.get(VOLUME_ID_OUTPUT)
    source = ("--availability-zone (or CURVINE_VOLUME_AZ)" if zone else
              f"{ZONE_OUTPUT} of --outputs-file {outputs_file}" if outputs.get(ZONE_OUTPUT) else None)
    zone = zone or outputs.get(ZONE_OUTPUT) or project.platform.gpu_availability_zone
    region = project.platform.region
    if source is not None and zone[:-1] != region:
        raise InputError(f"{source}: {zone} is not in the platform's region {region} ({project.config_dir}/platform.yaml); "
                         f"allowed: the zone of the Curvine Primary's volume, {project.platform.gpu_availability_zone} "
                         f"(gpu_availability_zone), or another zone of {region}")
    return volume_id, zone


def resolve_workspace(workspace_id: str | None, outputs_file: Path | None) -> str | None:
    """The Prometheus workspace ID from the flag (or env), then the outputs file; None without either.

    Raises:
        InputError: an ID that is not ``ws-...`` (naming where it came from).
    """
    source = "--prometheus-workspace-id (or PROMETHEUS_WORKSPACE_ID)"
    if workspace_id is None and outputs_file is not None:
        workspace_id = read_outputs(outputs_file).get(WORKSPACE_OUTPUT)
        source = f"{WORKSPACE_OUTPUT} of --outputs-file {outputs_file}"
    if workspace_id is not None and not re.match(WORKSPACE_ID_PATTERN, workspace_id):
        raise InputError(f"{source}: {workspace_id!r} is not a Prometheus workspace ID; allowed: ws-... (the "
                         f"{WORKSPACE_OUTPUT} output of the observability stack)")
    return workspace_id


def build_files(project: ProjectConfig, volume_id: str | None, zone: str,
                workspace_id: str | None = None) -> dict[str, str]:
    """Relative path -> file content, all rendered in memory (nothing touches the disk)."""
    rendered = render_manifests(project, volume_id=volume_id or PLACEHOLDER_VOLUME_ID, availability_zone=zone,
                                scaling=project_scaling(project, workspace_id or PLACEHOLDER_WORKSPACE_ID))
    files: dict[str, str] = {}
    for name, objects in rendered.items():
        if name == CURVINE_CHART and volume_id is None:
            continue
        files[f"{name}.yaml"] = to_yaml(objects)
    files["kyverno-values.yaml"] = yaml.dump(kyverno_helm_values(), Dumper=_Dumper, sort_keys=False)
    for line in project.business_lines:
        if line.cache.l2_enabled:
            files[f"patches/{line.name}.reference.json"] = json.dumps(reference_patch(project, line), indent=2) + "\n"
    return files


def reference_patch(project: ProjectConfig, line: BusinessLineConfig) -> dict[str, Any]:
    """The static Deployment patch of ``line``, wrapped so it cannot be applied by mistake.

    A JSON *object* (not the array ``kubectl patch --type=json`` expects), holding the append-only
    operations of :func:`k8s.patch.endpoint_json_patch` without a live Deployment, and what they
    assume. Applied as-is they would leave the operator's ``LMCACHE_REMOTE_URL`` and
    ``LMCACHE_EXTRA_CONFIG`` beside ours; ``scripts/patch_endpoint.sh`` removes those first.
    """
    return {
        "reference_only": (
            "Not applicable as-is. Apply with `scripts/patch_endpoint.sh "
            f"{line.name}`, which recomputes the patch against the live Deployment: it removes the "
            "operator's LMCACHE_REMOTE_URL / LMCACHE_EXTRA_CONFIG and every other entry it owns first "
            "(each guarded by a test op), then adds exactly one of each."),
        "assumes": ("vLLM is container 0 of the operator-rendered Deployment; operations only append, "
                    "so existing entries of the same names stay (the kubelet uses the last)."),
        "deployment": f"{line.namespace}/{names.endpoint_name(line)}",
        "operations": endpoint_json_patch(project.platform, line),
    }


#: The list of files a run wrote into the output directory (JSON), so the next run replaces and
#: removes only those: a directory may hold anything else (a GitOps checkout, ``.git`` included).
WRITTEN_LIST = ".kvcache-manifests.json"


def _written_before(out: Path) -> set[str]:
    """Relative paths the last run wrote into ``out`` (:data:`WRITTEN_LIST`; empty if none)."""
    listing = out / WRITTEN_LIST
    if not listing.is_file():
        return set()
    try:
        data = json.loads(listing.read_text(encoding="utf-8"))
        return {rel for rel in data["files"] if isinstance(rel, str)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--out {out}: {WRITTEN_LIST} is not the list this tool writes ({exc}); "
                         "allowed: remove it, or another --out") from None


def check_out_dir(out: Path, files: dict[str, str]) -> set[str]:
    """Refuse an ``out`` this tool must not write into; returns what the last run wrote there.

    Raises:
        InputError: ``out`` (or a folder on the way to one of ``files``) is not a directory, or one of
            ``files`` is there already and was not written by this tool (it would be overwritten).
    """
    out = out.absolute()
    allowed = "allowed: a directory (created if missing) that holds no other files of these names"
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is not a directory; {allowed}")
    if not out.exists():
        return set()
    before = _written_before(out)
    foreign = []
    for rel in sorted(files):
        path = out / rel
        for folder in (out / parent for parent in Path(rel).parents if parent != Path(".")):
            if folder.exists() and not folder.is_dir():
                raise InputError(f"--out {out}: {folder} is not a directory; {allowed}")
        if (path.exists() or path.is_symlink()) and rel not in before:
            foreign.append(rel)
    if foreign:
        raise InputError(f"--out {out}: {', '.join(foreign)} already there and not written by {TOOL} "
                         f"(no {WRITTEN_LIST} lists them): nothing was overwritten; {allowed}")
    return before


def write_files(out: Path, files: dict[str, str], *, keep: tuple[str, ...] = ()) -> None:
    """Write ``files`` (relative path -> text) into ``out`` and remove the files the last run wrote
    there that this run does not (except those of ``keep``); nothing else in ``out`` is touched.

    Every file is first written beside its place and then renamed over it, so a reader never sees
    half a file. Directories and files get the modes a plain ``mkdir`` and ``open`` give under the
    current umask (``cdk.out/`` has the same). :data:`WRITTEN_LIST` records what was written.

    Raises:
        InputError: see :func:`check_out_dir` (checked before anything is written).
    """
    out = out.absolute()
    before = check_out_dir(out, files)
    kept = before & set(keep)  # still this tool's: a later run may replace or remove them
    written = {**files, WRITTEN_LIST: json.dumps({"tool": TOOL, "files": sorted(set(files) | kept)}, indent=2) + "\n"}
    staged: list[tuple[Path, Path]] = []
    try:
        for rel, content in written.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            staged.append((Path(tmp), path))
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for rel in sorted(before - set(files) - set(keep)):
        stale = out / rel
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
        with contextlib.suppress(OSError):  # a folder this tool made, once empty (patches/)
            if stale.parent != out:
                stale.parent.rmdir()


def build_parser() -> argparse.ArgumentParser:
    parser = cli.make_parser(TOOL, __doc__.splitlines()[0])
    cli.add_config_option(parser)
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="output directory; only the files this tool wrote there are replaced or removed")
    parser.add_argument("--volume-id", default=os.environ.get("CURVINE_VOLUME_ID") or None,
                        help="EBS volume ID of the Curvine Primary (vol-...; env CURVINE_VOLUME_ID)")
    parser.add_argument("--availability-zone", default=os.environ.get("CURVINE_VOLUME_AZ") or None,
                        help="zone of that volume (env CURVINE_VOLUME_AZ; default: gpu_availability_zone)")
    parser.add_argument("--outputs-file", type=Path,
                        help="JSON written by `cdk deploy --all --outputs-file FILE` (default: "
                             "cdk-outputs.json in the repository root, if present)")
    parser.add_argument("--prometheus-workspace-id", default=os.environ.get("PROMETHEUS_WORKSPACE_ID") or None,
                        help="ID of the platform's Prometheus workspace (ws-...; env PROMETHEUS_WORKSPACE_ID), which "
                             "autoscaling lines' triggers query (default: PrometheusWorkspaceId of the outputs file)")
    parser.add_argument("--drop-curvine", action="store_true",
                        help=f"without a volume ID, remove an existing {CURVINE_CHART}.yaml from the output "
                             "directory (by default it is kept as it was)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 written, 2 bad input: nothing written)."""
    args = build_parser().parse_args(argv)
    outputs_file = args.outputs_file
    if outputs_file is None and (ROOT / "cdk-outputs.json").exists():
        outputs_file = ROOT / "cdk-outputs.json"
    try:
        project = cli.load_config(args.config)
        volume_id, zone = resolve_volume(project, args.volume_id, args.availability_zone, outputs_file)
        workspace_id = resolve_workspace(args.prometheus_workspace_id, outputs_file)
        files = build_files(project, volume_id, zone, workspace_id)
    except (ConfigError, InputError, ValueError) as exc:  # nothing is written: the files exist only in memory
        return cli.fail(exc)
    curvine_file = f"{CURVINE_CHART}.yaml"
    kept = (curvine_file,) if volume_id is None and not args.drop_curvine else ()
    try:
        write_files(args.out, files, keep=kept)
    except (InputError, OSError) as exc:  # a file in the way, a full disk, no permission
        return cli.fail(exc)
    if zone != project.platform.gpu_availability_zone and volume_id is not None:
        print(f"warning: the Curvine Primary's volume is in {zone}, gpu_availability_zone is "
              f"{project.platform.gpu_availability_zone}: the Primary can only run on nodes in {zone}", file=sys.stderr)
    if volume_id is None and project.platform.curvine.enabled:
        what = (f"the existing {args.out / curvine_file} is kept as it was (not re-rendered; --drop-curvine removes it)"
                if kept and (args.out / curvine_file).is_file() else f"{curvine_file} not written")
        print(f"warning: no Curvine Primary volume ID (CURVINE_VOLUME_ID=vol-..., --volume-id, or an outputs file "
              f"with {VOLUME_ID_OUTPUT}: --outputs-file or cdk-outputs.json); {what}", file=sys.stderr)
    autoscaling = [line.name for line in project.business_lines if line.autoscaling is not None]
    if autoscaling and workspace_id is None:
        print(f"warning: no Prometheus workspace ID (--prometheus-workspace-id, PROMETHEUS_WORKSPACE_ID, or an "
              f"outputs file with {WORKSPACE_OUTPUT}); the autoscaling triggers of {', '.join(autoscaling)} name "
              f"{PLACEHOLDER_WORKSPACE_ID}, which does not exist: they read nothing until re-rendered", file=sys.stderr)
    for rel in sorted(files):
        cli.emit(f"{args.out / rel}")
    return cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
