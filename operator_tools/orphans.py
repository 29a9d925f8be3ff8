"""Business-line stacks that are deployed but that no config file backs any more, and their removal.

Deleting ``config/business-lines/<name>.yaml`` removes the line from the CDK app, so
``cdk destroy --exclusively <project>-line-<name>`` no longer finds its stack and the endpoint,
PVC and namespace stay deployed (GPUs held, L2 files kept). This module asks CloudFormation
which line stacks exist and compares them with the config:

* a **line stack** is a stack named :func:`platform_config.stack_names.line_stack_prefix` +
  ``<line>`` that carries the tag ``kvcache.io/project = <project>`` (both, so a stack of another
  project with a similar name is never touched), and is not nested;
* an **orphan** is a line stack whose line has no config file (a line with ``deploy: false``
  still has one, so it is not an orphan).

Deleting an orphan's stack deletes its Kubernetes objects through the cluster's kubectl handler
(the line's manifests are custom resources of the eks stack's provider), so the eks stack must
still exist. Stacks are deleted by stack ID, so a same-named stack created after the listing is
never the one deleted.

The pure functions take the dicts CloudFormation returns (tests feed recorded responses through
botocore's Stubber); :func:`list_line_stacks` and :func:`delete_stacks` make the calls:
``cloudformation:DescribeStacks`` (read) and ``cloudformation:DeleteStack`` (destroy), with
the deploy role's rights on the stack's resources for the delete itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from platform_config.loader import ProjectConfig
from platform_config.stack_names import PROJECT_TAG, line_stack_prefix, stack_ids

#: Seconds between ``DescribeStacks`` polls while waiting for a deletion, and how many polls
#: (30 s x 120 = one hour: an endpoint's pods and a PVC usually go in minutes).
DELETE_POLL_SECONDS = 30
DELETE_MAX_POLLS = 120


@dataclass(frozen=True)
class LineStack:
    """One deployed business-line stack.

    Attributes:
        name: CloudFormation stack name (``<project>-line-<line>``).
        line: the business line's name (the name without the prefix).
        status: ``StackStatus`` (e.g. ``CREATE_COMPLETE``, ``DELETE_FAILED``).
        stack_id: the stack's ARN, which deletion uses.
    """

    name: str
    line: str
    status: str
    stack_id: str


def line_stacks(project: ProjectConfig, described: Iterable[dict[str, Any]]) -> list[LineStack]:
    """The project's line stacks among ``described`` (``DescribeStacks``' ``Stacks`` entries).

    Deleted stacks (``DELETE_COMPLETE``), nested stacks (with a ``ParentId``), stacks without the
    prefix and stacks whose ``kvcache.io/project`` tag names another project are left out.
    """
    project_name = project.platform.project
    prefix = line_stack_prefix(project_name)
    found = []
    for stack in described:
        name = stack["StackName"]
        tags = {t["Key"]: t["Value"] for t in stack.get("Tags") or []}
        if (not name.startswith(prefix) or len(name) == len(prefix) or stack.get("ParentId")
                or tags.get(PROJECT_TAG) != project_name or stack["StackStatus"] == "DELETE_COMPLETE"):
            continue
        found.append(LineStack(name=name, line=name[len(prefix):], status=stack["StackStatus"],
                               stack_id=stack["StackId"]))
    return sorted(found, key=lambda s: s.name)


def find_orphans(project: ProjectConfig, described: Iterable[dict[str, Any]]) -> list[LineStack]:
    """Line stacks (see :func:`line_stacks`) whose line has no file in ``config/business-lines/``."""
    configured = {name for role, name in stack_ids(project).items() if role.startswith("line-")}
    return [s for s in line_stacks(project, described) if s.name not in configured]


def describe_all_stacks(cloudformation: Any) -> list[dict[str, Any]]:
    """Every live stack of the client's account and region (``DescribeStacks``, all pages)."""
    paginator = cloudformation.get_paginator("describe_stacks")
    return [stack for page in paginator.paginate() for stack in page.get("Stacks", [])]


@dataclass(frozen=True)
class Deletion:
    """Outcome of deleting one stack: ``ok`` and, when not, why (the stack's status reason)."""

    stack: LineStack
    ok: bool
    detail: str


def delete_stacks(cloudformation: Any, orphans: Iterable[LineStack], *, poll_seconds: int | None = None,
                  max_polls: int | None = None) -> list[Deletion]:
    """Delete each stack (by ID) and wait for every deletion to finish (polls every
    ``poll_seconds``, default :data:`DELETE_POLL_SECONDS`, at most ``max_polls`` times).

    All deletions start first, then each is awaited with the ``stack_delete_complete`` waiter,
    so N stacks take about as long as the slowest. A failed deletion (``DELETE_FAILED``, e.g.
    a Kubernetes object the kubectl handler could not delete) is reported, not raised.

    Raises:
        botocore.exceptions.ClientError: CloudFormation refused the DeleteStack call itself
            (e.g. termination protection, missing permission).
    """
    from botocore.exceptions import WaiterError

    todo = list(orphans)
    for stack in todo:
        cloudformation.delete_stack(StackName=stack.stack_id)
    waiter = cloudformation.get_waiter("stack_delete_complete")
    results = []
    for stack in todo:
        try:
            waiter.wait(StackName=stack.stack_id, WaiterConfig={
                "Delay": DELETE_POLL_SECONDS if poll_seconds is None else poll_seconds,
                "MaxAttempts": DELETE_MAX_POLLS if max_polls is None else max_polls})
            results.append(Deletion(stack, True, "deleted"))
        except WaiterError as exc:
            last = (exc.last_response or {}).get("Stacks") or [{}]
            status = last[0].get("StackStatus", "unknown status")
            reason = last[0].get("StackStatusReason", str(exc))
            results.append(Deletion(stack, False, f"{status}: {reason}"))
    return results


def format_table(stacks: list[LineStack]) -> str:
    """Aligned text table (stack, line, status); one line saying so when empty."""
    if not stacks:
        return "no orphaned business-line stacks"
    width = max(len(s.name) for s in stacks)
    rows = [f"{'stack':<{width}}  {'line':<20}  status"]
    rows += [f"{s.name:<{width}}  {s.line:<20}  {s.status}" for s in stacks]
    return "\n".join(rows)
