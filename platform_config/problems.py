"""The one shape of a configuration error: which file, which field (or line), what is wrong and
what is allowed. Every check of the project reports through it, so every command prints bad input
the same way (one line per problem) and exits 2 without writing anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class ConfigProblem:
    """One problem: which file, which field (dotted path) or line, the bad value, and what is allowed.

    Attributes:
        file: the file or directory at fault, as the user named it.
        field: dotted path of the field (``hyperpod.instance_groups.0.instance_count``); empty when
            the problem is the file itself (unreadable, not YAML), then ``line`` may locate it.
        message: what is wrong and, after ``allowed:``, what would be accepted.
        value: the bad value, shown as ``(got ...)``; None shows nothing.
        line: 1-based line in ``file`` (YAML syntax, duplicate keys, YAML 1.1 forms), or None.
    """

    file: str
    field: str
    message: str
    value: Any = None
    line: int | None = None

    def __str__(self) -> str:
        shown = "" if self.value is None else f" (got {self.value!r})"
        where = [self.file] + ([f"line {self.line}"] if self.line is not None else []) + (
            [self.field] if self.field else [])
        return f"{': '.join(where)}: {self.message}{shown}"


class ConfigError(Exception):
    """Raised for any invalid configuration; ``problems`` lists every problem found.

    ``str(error)`` is the report ``app.py`` and the tools print before exiting 2.
    """

    def __init__(self, problems: Iterable[ConfigProblem]):
        self.problems = tuple(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class FieldError(ValueError):
    """A model validator's error that names the field at fault, relative to the model, so the report
    names ``availability_zones`` rather than the model (or nothing, for the file's top level)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
