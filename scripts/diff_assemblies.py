#!/usr/bin/env python3
"""``cdk diff`` of two cloud assemblies, offline: a pull request's ``cdk.out`` against its base branch's.

The pull-request job of the fork's pipeline (.github/workflows/platform.yml, job ``diff``) runs it with
no AWS credentials at all (issue 25 item 8: a role a pull request can assume is a role every author
of a branch can use for anything, since the workflow file is theirs to edit). Each stack of
``--head`` is compared with the same stack's template in ``--base`` by the pinned CDK CLI
(``cdk diff --app <head> --template <base template> <stack>``, which reads no deployed stack), and
stacks only in one of them are named. What it shows is the change against what ``main`` synthesizes,
which is what the pipeline deployed once ``main``'s run finished; drift and an undeployed ``main`` are
not seen (``cdk diff`` with your own credentials shows them).

Usage::

    python3 scripts/diff_assemblies.py --base base/cdk.out --head cdk.out [--cdk node_modules/.bin/cdk]

Standard library only (the job has no project virtualenv). Exit status 0 (the diff printed, whatever
it says) or 2 (a missing or unreadable assembly, or the CLI failed), as every tool here
(operator_tools/cli.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

STACK_TYPE = "aws:cloudformation:stack"


def stacks(assembly: Path) -> dict[str, str]:
    """Stack selector (its display name, else the artifact ID) -> template file of ``assembly``.

    Raises:
        ValueError: no readable ``manifest.json``.
    """
    try:
        manifest = json.loads((assembly / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{assembly}: not a cloud assembly ({exc})") from None
    out = {}
    for artifact_id, artifact in (manifest.get("artifacts") or {}).items():
        if artifact.get("type") == STACK_TYPE:
            out[artifact.get("displayName") or artifact_id] = artifact["properties"]["templateFile"]
    return out


def diff(base: Path, head: Path, cdk: str) -> tuple[int, str]:
    """(exit status, text) of the comparison (module docstring)."""
    try:
        before, after = stacks(base), stacks(head)
    except ValueError as exc:
        return 2, f"error: {exc}\n"
    parts = []
    env = {**os.environ, "CDK_DISABLE_VERSION_CHECK": "true", "CDK_DISABLE_CLI_TELEMETRY": "true"}
    for name in sorted(after):
        if name not in before:
            parts.append(f"Stack {name}\n[+] new stack (not in the base branch's assembly)\n")
            continue
        argv = [cdk, "diff", "--app", str(head), "--template", str(base / before[name]), name, "--no-color",
                "--no-version-reporting"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 2, "".join(parts) + f"error: {' '.join(argv)}: {exc}\n"
        if done.returncode != 0:
            return 2, "".join(parts) + f"error: cdk diff of {name} failed: {done.stderr.strip()[-2000:]}\n"
        parts.append(done.stdout + done.stderr)
    for name in sorted(set(before) - set(after)):
        parts.append(f"Stack {name}\n[-] removed (in the base branch's assembly, not in this one)\n")
    return 0, "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the base branch's cdk.out")
    parser.add_argument("--head", type=Path, required=True, help="the pull request's cdk.out")
    parser.add_argument("--cdk", default="node_modules/.bin/cdk", help="the CDK CLI")
    args = parser.parse_args(argv)
    status, text = diff(args.base, args.head, args.cdk)
    (sys.stdout if status == 0 else sys.stderr).write(text)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
