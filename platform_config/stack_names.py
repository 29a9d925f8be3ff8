"""CloudFormation stack names and the project tag: one rule for the CDK app and the operator tools.

``stacks.build_platform`` names and tags its stacks with these; ``operator_tools.orphans`` finds the
deployed line stacks by the same name prefix and tag. Pure Python (no aws_cdk), so the tools
need no jsii runtime.
"""

from __future__ import annotations

from platform_config.loader import ProjectConfig

#: Stack tag (and so resource tag) naming the project on every stack of the platform.
PROJECT_TAG = "kvcache.io/project"
#: Roles of the shared platform stacks, in deployment order.
PLATFORM_ROLES = ("network", "eks", "hyperpod", "addons", "l2-cache")


def line_stack_prefix(project_name: str) -> str:
    """``<project>-line-``: every business line's stack name is this plus the line's name."""
    return f"{project_name}-line-"


def platform_stack_name(project_name: str, role: str) -> str:
    """``<project>-<role>`` for a role of :data:`PLATFORM_ROLES` (``kvcache-hyperpod``).

    Raises:
        ValueError: ``role`` is not a platform role.
    """
    if role not in PLATFORM_ROLES:
        raise ValueError(f"not a platform stack role: {role!r}; allowed: {', '.join(PLATFORM_ROLES)}")
    return f"{project_name}-{role}"


def stack_ids(project: ProjectConfig) -> dict[str, str]:
    """Stack name per role (``network``, ``eks``, ``hyperpod``, ``addons``, ``l2-cache``, ``line-<name>``,
    and ``observability`` when ``observability.enabled``)."""
    p = project.platform.project
    ids = {role: platform_stack_name(p, role) for role in PLATFORM_ROLES}
    ids.update({f"line-{line.name}": line_stack_prefix(p) + line.name for line in project.business_lines})
    if project.platform.observability.enabled:
        ids["observability"] = f"{p}-observability"
    return ids
