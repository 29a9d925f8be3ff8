"""Export the admitted vLLM container's ``args`` of every L2 line, as JSON (runs in the project's .venv).

Interim: until :mod:`tests_lmcache.export_env` exports them itself (key ``args`` beside ``envs``),
the serving tier takes them from here; :func:`tests_serving.servers.rendered_args` prefers
export_env's key once it is there. The Pods are rendered and admitted exactly as export_env does
(the line's Kyverno ``Policy`` applied to the operator's Pod, the same seeds), for the same
scenario config (``tests/fixtures/config``).

Usage::

    .venv/bin/python -m tests_serving.export_args --out build/serving-tier/args.json [--pods 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from k8s import names
from k8s.render import render_manifests
from platform_config import load_project
from tests.example_config import FIXTURE_CONFIG
from tests.k8s.kyverno_eval import apply_policy
from tests.k8s.operator_render import pod
from tests_lmcache.export_env import VOLUME_ID, ZONE

#: export_env's seed of the first admitted Pod of the scenario config (``export(seed_base=100)``).
SEED_BASE = 100


def export(pods: int = 4) -> dict[str, list[list[str]]]:
    """Line -> the admitted vLLM container's ``args`` of ``pods`` Pods (L2 lines only)."""
    project = load_project(FIXTURE_CONFIG)
    manifests = render_manifests(project, volume_id=VOLUME_ID, availability_zone=ZONE)
    out: dict[str, list[list[str]]] = {}
    for line in project.business_lines:
        if not line.cache.l2_enabled:
            continue
        objects = manifests[names.line_chart_name(line)]
        (policy,) = [o for o in objects if o["kind"] == "Policy"]
        (endpoint,) = [o for o in objects if o["kind"] == "InferenceEndpointConfig"]
        port = endpoint["spec"]["worker"]["modelInvocationPort"]["containerPort"]
        args: list[list[str]] = []
        for k in range(pods):
            admitted: dict[str, Any] = apply_policy(policy, pod(line), seed=SEED_BASE + k)
            (vllm,) = [c for c in admitted["spec"]["containers"]
                       if any(p.get("containerPort") == port for p in c.get("ports") or [])]
            args.append(list(vllm.get("args") or []))
        out[line.name] = args
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests_serving.export_args", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pods", type=int, default=4)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(export(args.pods), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
