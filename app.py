#!/usr/bin/env python3
"""CDK entry point: load and check the config, build the stacks, add cdk-nag, synthesize.

Config directory: ``$KVCACHE_CONFIG_DIR`` (``make synth CONFIG=dir`` sets it), else the
repository's ``config/``. Output: ``$CDK_OUTDIR`` (the CDK CLI sets it).

Exit status (the tools' convention, operator_tools/cli.py): 0 synthesized; 2 bad input: a config problem (found before any construct exists),
a template over CloudFormation's size limit, or a finding of the synthesis-time validation (CloudFormation's
rules, cdk-nag; stacks/synthesis_checks.py). Each problem is one line
on stderr naming the file and the field or line, and nothing is written to ``$CDK_OUTDIR``:
synthesis goes to a temporary directory beside it, moved in only when every check passed.
Warnings (files ignored, checks that could not run) go to stderr and do not stop synthesis.
Ctrl-C: one line, exit 130, ``$CDK_OUTDIR`` untouched (a ``.cdk.out.*`` staging folder beside it
can remain when jsii's Node process was still writing into it).
"""

from __future__ import annotations

import gc

# A short-lived process: the cyclic garbage collector's passes while aws-cdk-lib's Python bindings
# import (tens of thousands of classes) find nothing to free and cost about 0.2 s of CPU (measured
# in docs/ci-and-tests.md, "Synthesis speed"); reference counting still frees everything else.
gc.disable()

import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from operator_tools import cli  # noqa: E402
from capacity.project_checks import load_checked_project  # noqa: E402
from platform_config import ConfigError  # noqa: E402
from platform_config.loader import default_config_dir  # noqa: E402


def main() -> int:
    try:
        project = load_checked_project(default_config_dir())
    except ConfigError as exc:
        return cli.fail(exc)  # one "error: <file>: <field or line>: ..." line per problem, exit 2
    for warning in project.warnings:
        print(f"warning: {warning}", file=sys.stderr)

    # Imported only now: jsii starts a Node process, pointless for a config error.
    import stacks
    from stacks.synthesis_checks import template_size_problems, validation_problems

    outdir = Path(os.environ.get("CDK_OUTDIR") or tempfile.mkdtemp(prefix="cdk.out."))
    outdir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{outdir.name}.", dir=outdir.parent))
    try:
        app = stacks.new_app(outdir=str(staging), auto_synth=False)
        try:
            built = stacks.build_platform(app, project)
        except ConfigError as exc:
            return cli.fail(exc)
        stacks.add_nag_checks(app)
        try:
            app.synth()
        except RuntimeError as exc:  # jsii's error for the validation report it printed above
            if "ValidationFailed" not in str(exc):
                raise
            return cli.fail(ConfigError(validation_problems(staging, project, shown_as=outdir)))
        too_large = template_size_problems(staging, project, shown_as=outdir)
        if too_large:
            return cli.fail(ConfigError(too_large))
        # Only after a successful synth: the dashboards go beside the templates (cdk.out/dashboards/).
        if built.observability is not None:
            from observability.dashboards import write_dashboards

            write_dashboards(str(staging), built.observability.dashboards)
        _move_into(staging, outdir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return 0


def _move_into(source: Path, target: Path) -> None:
    """Move every entry of ``source`` into ``target``, replacing entries of the same name
    (renames on one file system: the 57 MB of layer assets are not copied)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        destination = target / entry.name
        if destination.is_dir() and not destination.is_symlink():
            shutil.rmtree(destination)
        elif destination.exists() or destination.is_symlink():
            destination.unlink()
        entry.rename(destination)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # Ctrl-C: main's finally has removed the staging folder; a traceback would only hide that.
        print("interrupted: nothing written to the output folder (the last synthesized output, if any, is "
              "unchanged)", file=sys.stderr)
        sys.exit(130)
