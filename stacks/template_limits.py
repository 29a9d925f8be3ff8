"""CloudFormation's size limit on a synthesized template, checked before anything is written.

A template larger than CloudFormation accepts synthesizes fine and fails only at deploy (the CDK
uploads it to the bootstrap bucket, then CreateStack refuses it). ``app.py`` checks every template
after synthesis and exits 2 naming the file, its size, the limit and what grows it.
"""

from __future__ import annotations

from pathlib import Path

from platform_config import ConfigProblem, ProjectConfig

#: Largest template body CloudFormation accepts from S3, bytes: "Template body size in an Amazon S3
#: object: 1 MB" (AWS CloudFormation User Guide, "AWS CloudFormation quotas"; the CDK CLI deploys
#: every template through the bootstrap bucket). cfn-lint 1.58.0's rule E1002 checks the same
#: 1,000,000 bytes (``cfnlint.helpers.LIMITS["template"]["body"]``); docs/sources.md §15.
TEMPLATE_BODY_LIMIT_BYTES = 1_000_000


def template_size_problems(outdir: Path, project: ProjectConfig, *, shown_as: Path | None = None) -> list[ConfigProblem]:
    """One problem per ``*.template.json`` in ``outdir`` larger than :data:`TEMPLATE_BODY_LIMIT_BYTES`.

    Args:
        outdir: where the templates were synthesized.
        project: the config they come from.
        shown_as: the directory to name in the messages (``app.py`` synthesizes into a temporary
            directory and names the one it would have written to).

    The message says what makes the template grow: for the observability stack, the business lines
    (each adds its scrape job, alert rules and queries); for a line's stack, that line's own config.
    """
    problems = []
    lines = len(project.business_lines)
    for template in sorted(outdir.glob("*.template.json")):
        size = template.stat().st_size
        if size <= TEMPLATE_BODY_LIMIT_BYTES:
            continue
        stack = template.name.removesuffix(".template.json")
        if stack.endswith("-observability"):
            grows = (f"it holds the scrape jobs, alert rules and queries of all {lines} business lines; allowed: "
                     f"fewer lines per platform (about {max(1, lines * TEMPLATE_BODY_LIMIT_BYTES // size)} fit), "
                     "or observability.enabled: false")
        elif "-line-" in stack:
            grows = ("it holds this business line's Kubernetes manifests; allowed: a smaller line config "
                     "(vllm.args, model source)")
        else:
            grows = "allowed: fewer or smaller resources in this stack"
        problems.append(ConfigProblem(
            str((shown_as or outdir) / template.name), "", f"{size:,} bytes, more than CloudFormation accepts in a template "
                               f"({TEMPLATE_BODY_LIMIT_BYTES:,} bytes; the deploy would fail); {grows}"))
    return problems
