"""What synthesis finds that the config check cannot see before it, as one problem per finding.

* A template larger than CloudFormation accepts synthesizes fine and fails only at deploy (the CDK
  uploads it to the bootstrap bucket, then CreateStack refuses it): ``app.py`` checks every
  template and exits 2 naming the file, its size, the limit and what grows it
  (:func:`template_size_problems`).
* The synthesis-time validation (the CDK's CloudFormation validation, cdk-nag) prints its report
  and then fails ``app.synth()`` with a jsii traceback; ``app.py`` turns the report into one
  problem per finding, naming the config key when the property is one a key sets (an instance
  type not offered in the region), and exits 2 (:func:`validation_problems`).

Nothing is written in either case: ``app.py`` synthesizes into a temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from platform_config import ConfigProblem, ProjectConfig

#: Largest template body CloudFormation accepts from S3, bytes: "Template body size in an Amazon S3
#: object: 1 MB" (AWS CloudFormation User Guide, "AWS CloudFormation quotas"; the CDK CLI deploys
#: every template through the bootstrap bucket). cfn-lint 1.58.0's rule E1002 checks the same
#: 1,000,000 bytes (``cfnlint.helpers.LIMITS["template"]["body"]``, its source_url the same AWS page).
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
                     "(vllm.args, model source, hot_prefixes)")
        else:
            grows = "allowed: fewer or smaller resources in this stack"
        problems.append(ConfigProblem(
            str((shown_as or outdir) / template.name), "", f"{size:,} bytes, more than CloudFormation accepts in a template "
                               f"({TEMPLATE_BODY_LIMIT_BYTES:,} bytes; the deploy would fail); {grows}"))
    return problems


#: CloudFormation properties a config key sets directly: (property path, config file, field, what is
#: allowed). For a violation of one of them the message names the key to change.
PROPERTY_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("Properties.InstanceGroups.InstanceType", "platform.yaml", "hyperpod.instance_groups.instance_type",
     "an instance type SageMaker HyperPod offers in region {region}, or a region that offers this one"),
)


def validation_problems(outdir: Path, project: ProjectConfig, *, shown_as: Path | None = None) -> list[ConfigProblem]:
    """The violations of the synthesis-time validation that failed (``validation-report.json``: the
    CDK's CloudFormation validation, cdk-nag), one problem each, instead of the jsii traceback
    ``app.synth()`` raises after printing the report.

    A violation of a property a config key sets (:data:`PROPERTY_FIELDS`) names that key, its file
    and what is allowed; any other names the template, the resource and the rule.
    """
    report_file = outdir / "validation-report.json"
    try:
        report = json.loads(report_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [ConfigProblem(str(shown_as or outdir), "", "synthesis failed its validation (the report above names "
                                                           "each resource and rule); allowed: a config CloudFormation "
                                                           "and cdk-nag accept")]
    problems = []
    for plugin in report.get("pluginReports", []):
        if plugin.get("conclusion") == "success":
            continue
        for violation in plugin.get("violations", []):
            for construct in violation.get("violatingConstructs", []):
                resource = construct.get("cloudFormationResource", {})
                paths = resource.get("propertyPaths", [])
                known = next((entry for entry in PROPERTY_FIELDS if entry[0] in paths), None)
                where = (f"{resource.get('logicalId')} of {resource.get('templatePath')}, "
                         f"{construct.get('constructPath')}")
                rule = f"{plugin.get('pluginName')} {violation.get('ruleName')}"
                if known is not None:
                    _, file, field, allowed = known
                    problems.append(ConfigProblem(
                        str(project.config_dir / file), field,
                        f"{violation.get('description')} ({rule}, on {where}); allowed: "
                        + allowed.format(region=project.platform.region)))
                else:
                    problems.append(ConfigProblem(
                        str((shown_as or outdir) / str(resource.get("templatePath", ""))), "",
                        f"{resource.get('logicalId')} {', '.join(paths)}: {violation.get('description')} ({rule}, on "
                        f"{construct.get('constructPath')}); allowed: what the rule accepts: change the config value "
                        "this resource is built from"))
    return problems
