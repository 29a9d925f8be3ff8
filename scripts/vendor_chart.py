#!/usr/bin/env python3
"""Download the Helm charts the platform installs, check each against its repository's index, keep them.

For every chart the config installs from a repository (`versions.charts.kyverno` with Curvine,
`observability.dcgm_exporter.chart` when installed), or those named with --chart: read the
repository's `index.yaml`, download the archive it lists for the pinned version, refuse it unless
its SHA-256 is the index's `digest` (and the config's, when one is set), and write it to the
chart's `archive` (default `charts/<chart>-<version>.tgz`). Then commit the archives and set each
printed `digest` in config/platform.yaml: synthesis installs the committed archive and refuses
one that does not match (docs/security.md, "Helm charts by digest").

    .venv/bin/python scripts/vendor_chart.py

Needs HTTPS to the chart repositories (not synthesis: it reads only the committed archives).
Exit codes: see --help (the table in docs/operator-tools.md).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from operator_tools import cli  # noqa: E402
from operator_tools.chart_vendor import DigestMismatch, VendorError, vendor  # noqa: E402
from platform_config import ConfigError  # noqa: E402

TOOL = "vendor_chart.py"


def build_parser():
    parser = cli.make_parser(TOOL, __doc__.splitlines()[0])
    cli.add_config_option(parser)
    parser.add_argument("--chart", action="append", default=[], metavar="FIELD",
                        help="only this chart's config field, e.g. versions.charts.kyverno (repeatable); "
                             "default: every chart the config installs from a repository")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        project = cli.load_config(args.config)
    except ConfigError as exc:
        return cli.fail(exc)
    pins = project.platform.helm_chart_pins()
    unknown = [field for field in args.chart if field not in pins]
    if unknown:
        return cli.fail(f"--chart {', '.join(unknown)}: not a chart this config installs; "
                        f"allowed: {', '.join(pins) or 'none (Curvine and the DCGM exporter are off)'}")
    chosen = {field: pin for field, pin in pins.items() if not args.chart or field in args.chart}
    lines, mismatched = [], []
    for field, pin in chosen.items():
        target = pin.archive_file()
        try:
            done = vendor(pin, target)
        except DigestMismatch as exc:
            mismatched.append(f"{field}: {exc}")
            continue
        except VendorError as exc:
            if lines:  # the charts written before it, and their digests
                cli.emit("\n".join(lines + mismatched))
            return cli.fail(f"{field}: {exc}")
        lines.append(f"{field}: wrote {done.path} ({done.size:,} bytes); set {field}.digest: {done.digest}")
    cli.emit("\n".join(lines + mismatched))
    return cli.EXIT_NO if mismatched else cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
