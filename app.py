#!/usr/bin/env python3
"""CDK entry point: load and validate config, build the stacks, add cdk-nag, synthesize.

Config directory: ``$KVCACHE_CONFIG_DIR`` (default ``config``). A config error is printed to
stderr and the process exits 1 before any construct exists, so nothing is written. Warnings
(checks that could not run, see ``ProjectConfig.warnings``) go to stderr and do not stop synthesis.
"""

from __future__ import annotations

import os
import sys

from platform_config import ConfigError, load_project


def main() -> int:
    config_dir = os.environ.get("KVCACHE_CONFIG_DIR", "config")
    try:
        project = load_project(config_dir)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    for warning in project.warnings:  # checks that could not run (e.g. a model the planner does not know)
        print(f"warning: {warning}", file=sys.stderr)

    # Imported only now: jsii starts a Node process, pointless for a config error.
    import stacks

    app = stacks.new_app()
    try:
        built = stacks.build_platform(app, project)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    stacks.add_nag_checks(app)
    app.synth()
    # Only after a successful synth: the dashboards go beside the templates (cdk.out/dashboards/).
    if built.observability is not None:
        from observability.dashboards import write_dashboards

        write_dashboards(app.outdir, built.observability.dashboards)
    return 0


if __name__ == "__main__":
    sys.exit(main())
