"""One command-line convention for the six operator tools (``scripts/plan.py``, ``overlap.py``,
``bench_ttft.py``, ``verify.py``, ``preflight.py``, ``orphans.py``), the manifest writer
(``scripts/manifests.py``), the stateful-resource guard (``scripts/stateful_snapshot.py``), the bootstrap's
execution policies (``scripts/bootstrap_policy.py``), the Helm chart vendoring (``scripts/vendor_chart.py``)
and the CRD schema generator (``scripts/update_crd_schema.py``);
the exit codes also hold for ``scripts/patch_endpoint.sh`` and the L2 janitor
(``cluster_agents/l2_janitor.py``) run by hand.

* **Exit codes** (:data:`EXIT_CODES`, docs/operator-tools.md's one table is generated from it and a test
  keeps them equal): ``0`` fine, ``1`` the tool answered and the answer is "no", ``2`` bad
  input (flags, config, files) or something unreachable (AWS, the cluster, the endpoint), so
  the question was not answered. A script never exits 1 for an error.
* **Errors**: one line ``error: <message>`` on stderr, no traceback (:class:`ToolError`,
  :func:`fail`; a config error prints one such line per problem); a flag error too (:class:`ArgumentParser`: it names the flag, points to
  ``--help`` and exits 2).
* **Broken pipes**: ``scripts/plan.py | head`` ends quietly (:func:`emit`, :func:`run`), keeping
  the tool's exit code (the answer does not depend on who reads the output).
* **Help**: real defaults are shown, never ``(default: None)`` (:class:`HelpFormatter`).
* **One config directory**: ``--config DIR``, else ``$KVCACHE_CONFIG_DIR``, else the repository's
  ``config/`` (:func:`add_config_option`, :func:`load_config`), loaded with every check.
* **Argument types** that name the flag in their error: :func:`positive_int`,
  :func:`fraction`, :func:`existing_file`, ...
* **Progress bars** (tqdm) only on a terminal and never with ``--json`` (:func:`progress_wanted`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence, TextIO

EXIT_OK = 0
EXIT_NO = 1
EXIT_ERROR = 2


@dataclass(frozen=True)
class ExitMeaning:
    """What exit codes 0, 1 and 2 mean for one tool (2 is always bad input or unreachable)."""

    ok: str
    no: str
    error: str


#: The single source of the exit-code convention, per tool (docs/operator-tools.md renders it).
EXIT_CODES: dict[str, ExitMeaning] = {
    "plan.py": ExitMeaning("the model fits", "it does not fit at the given TP / instance type",
                           "bad input: flags, config or files"),
    "overlap.py": ExitMeaning("the shared-prefix share is at or above the threshold", "it is below the threshold",
                              "bad input: flags or files, or a log without one usable request"),
    "bench_ttft.py": ExitMeaning("cold vs warm measured, warm faster, no request failed",
                                 "warm is not faster than cold, or some requests failed",
                                 "bad input, the endpoint unreachable, or cold vs warm not measured "
                                 "(e.g. the warm phase never ran)"),
    "verify.py": ExitMeaning("every check passes", "a check fails",
                             "bad input or config, or the cluster or AWS unreachable"),
    "preflight.py": ExitMeaning("every check passes", "a check fails", "bad input or config, or AWS unreachable"),
    "orphans.py": ExitMeaning("no orphaned line stack, or every one deleted",
                              "orphaned line stacks remain (listed; deletion declined, refused or failed)",
                              "bad input or config, credentials of another account, AWS unreachable, or "
                              "--destroy without a terminal and without --yes"),
    "stateful_snapshot.py": ExitMeaning("no stateful resource would be replaced, or the snapshot was written",
                                        "a deploy would replace or delete a stateful resource (one line each, "
                                        "naming the config field)",
                                        "bad input or config, or no readable snapshot to check against "
                                        "(record one with --write)"),
    "manifests.py": ExitMeaning("the manifests were written to the output directory",
                                "not used (the script asks no yes/no question)",
                                "bad input: config, flags, volume ID or zone, or an unreadable outputs file; "
                                "nothing written"),
    "bootstrap_policy.py": ExitMeaning("the policy documents were written and the commands printed",
                                       "not used (the script asks no yes/no question)",
                                       "bad input: config, no or unreadable cloud assembly, one synthesized for "
                                       "another account or region, a resource type no schema or special case "
                                       "covers (named), or more documents than a role holds"),
    "vendor_chart.py": ExitMeaning("every chart chosen was written, its SHA-256 the repository index's digest",
                                   "a configured digest differs from the one the repository's index lists (that "
                                   "chart not written)",
                                   "bad input: config or --chart; or a repository unreachable, an OCI registry, "
                                   "the version not in the index, or an archive whose SHA-256 is not the index's "
                                   "(that chart not written; the ones before it were)"),
    "update_crd_schema.py": ExitMeaning("the schema file was written, or with --check it is what the CRD gives",
                                        "with --check: the committed schema differs from the CRD's (rewrite it "
                                        "without --check)",
                                        "bad input: no such CRD file, not YAML, or no single v1 storage version"),
    # Two more tools an operator runs by hand, on the same codes; neither can import this module
    # (a shell script; a standard-library file shipped in a ConfigMap), so their --help texts are
    # kept equal to exit_epilog() by tests.
    "patch_endpoint.sh": ExitMeaning("the line's Deployment is patched and its Pods Ready (--dry-run: the patch "
                                     "passed server-side validation)",
                                     "not used (the script asks no yes/no question)",
                                     "bad input (unknown line, invalid config, L2 off), or a kubectl step "
                                     "failed (the operator is restored)"),
    "cluster_agents/l2_janitor.py": ExitMeaning("the pass finished at or below the high watermark",
                                          "still above the high watermark after the pass (everything left is "
                                          "younger than the minimum age)",
                                          "an error: a deletion failed, the Pods could not be listed, the PVC "
                                          "is not mounted, or bad flags or config"),
}


def tool_path(tool: str) -> str:
    """Where a tool of :data:`EXIT_CODES` lives: ``scripts/<tool>`` unless the key is a path."""
    return tool if "/" in tool else f"scripts/{tool}"


def exit_code_table() -> str:
    """The exit-code table of docs/operator-tools.md (Markdown), generated from :data:`EXIT_CODES`."""
    rows = ["| tool | 0 | 1 | 2 |", "|---|---|---|---|"]
    rows += [f"| `{tool_path(tool)}` | {m.ok} | {m.no} | {m.error} |" for tool, m in EXIT_CODES.items()]
    return "\n".join(rows)


def exit_epilog(tool: str) -> str:
    """The ``--help`` epilog of ``tool``: its three exit codes."""
    m = EXIT_CODES[tool]
    return f"exit status: 0 = {m.ok}; 1 = {m.no}; 2 = {m.error}."


class ToolError(Exception):
    """Bad input or an unreachable service: :func:`run` prints ``error: <message>``, exits 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default only when there is one to show: never ``(default: None)`` or
    ``(default: False)``, and not twice when the help text already explains its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors follow the convention too: one line on stderr,
    ``error: <argparse's message>; see scripts/<tool> --help``, exit 2. argparse's own
    prints the whole usage block first (over 20 lines for ``plan.py``) and then
    ``scripts/<tool>: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"error: {message}; see {self.prog} --help\n")


def make_parser(tool: str, description: str) -> argparse.ArgumentParser:
    """An :class:`ArgumentParser` with :class:`HelpFormatter` and the tool's exit codes as epilog."""
    return ArgumentParser(prog=f"scripts/{tool}", description=description,
                          formatter_class=HelpFormatter, epilog=exit_epilog(tool))


def fail(message: object, stream: TextIO | None = None) -> int:
    """Print ``error: <message>`` on stderr; return 2 (for ``return cli.fail(...)`` in ``main``).

    A :class:`~platform_config.ConfigError` prints one ``error:`` line per problem, each naming
    its file and field or line."""
    problems = getattr(message, "problems", None)
    for text in ([str(p) for p in problems] if problems else [str(message)]):
        print(f"error: {text}", file=stream or sys.stderr)
    return EXIT_ERROR


#: The help of every command's ``--config``.
CONFIG_HELP = ("config directory holding platform.yaml and business-lines/ (default: $KVCACHE_CONFIG_DIR, "
               "else the repository's config/)")


def add_config_option(parser: argparse.ArgumentParser, help: str = CONFIG_HELP) -> None:
    """``--config DIR``, the same on every command (default: :func:`platform_config.loader.default_config_dir`)."""
    parser.add_argument("--config", type=Path, metavar="DIR", help=help)


def load_config(config_dir: Path | None, stream: TextIO | None = None) -> Any:
    """The project of ``config_dir`` (None: the default directory) as every command loads it:
    :func:`capacity.project_checks.load_checked_project`; its warnings printed as ``warning: ...``.

    Raises:
        ConfigError: every problem found (:func:`fail` prints them, one line each).
    """
    from capacity.project_checks import load_checked_project
    from platform_config.loader import default_config_dir

    project = load_checked_project(config_dir if config_dir is not None else default_config_dir())
    for warning in project.warnings:
        print(f"warning: {warning}", file=stream or sys.stderr)
    return project


def _silence_stdout() -> None:
    # Python's documented recipe: point stdout at devnull so the interpreter's final flush
    # does not raise a second BrokenPipeError while shutting down.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (e.g. captured in tests)
        pass


def emit(text: str) -> None:
    """Print ``text`` to stdout; if the reader went away (``| head``), stop quietly."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _silence_stdout()


def run(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> NoReturn:
    """Run a script's ``main(argv)`` and exit with its code, applying the convention:
    :class:`ToolError` -> ``error: ...`` and 2; a broken stdout pipe -> quiet, 141 (what a
    shell reports for a process ended by SIGPIPE) unless :func:`emit` already absorbed it;
    Ctrl-C -> 130."""
    from platform_config.problems import ConfigError

    try:
        code = main(argv)
    except (ToolError, ConfigError) as exc:
        code = fail(exc)
    except BrokenPipeError:
        _silence_stdout()
        code = 128 + 13
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


def progress_wanted(flag: bool | None, json_output: bool, stream: TextIO | None = None) -> bool:
    """Whether to draw a progress bar: as ``--progress/--no-progress`` say, else only when
    ``stream`` (stderr) is a terminal and the output is not ``--json``."""
    if flag is not None:
        return flag
    stream = stream or sys.stderr
    return not json_output and bool(getattr(stream, "isatty", lambda: False)())


# --- argument types (argparse prefixes their errors with "argument --flag:") ---------------------


def _bounded(convert: Callable[[str], float], what: str, bound: float, inclusive: bool) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)``, refused below ``bound`` (or at it, if not ``inclusive``)."""
    relation = ">=" if inclusive else ">"

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not (value >= bound if inclusive else value > bound):
            raise argparse.ArgumentTypeError(f"must be {relation} {bound:g} (got {text})")
        return value

    parse.__doc__ = f"{what.capitalize()} {relation} {bound:g}."
    return parse


positive_int = _bounded(int, "an integer", 1, inclusive=True)
non_negative_int = _bounded(int, "an integer", 0, inclusive=True)
positive_float = _bounded(float, "a number", 0, inclusive=False)
non_negative_float = _bounded(float, "a number", 0, inclusive=True)


def parse_fraction(text: str) -> float:
    """A share given as a fraction (``0.4``) or an explicit percentage (``40%``), in [0, 1].

    A bare number above 1 (``40``) is refused rather than read as 4,000%: it is ambiguous
    between "40%" and a typo, and a share cannot exceed 100%.

    Raises:
        ValueError: anything else; the message shows both accepted forms.
    """
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1].strip() if percent else raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a share; write a fraction such as 0.4 or a percentage such as 40%") from None
    if not percent and 1.0 < value <= 100.0:
        raise ValueError(f"{raw} is not a fraction within 0..1; for {raw}% write {value / 100:g} or {raw}%")
    if percent:
        value /= 100.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{raw} is outside 0..1 (0%..100%); write a fraction such as 0.4 or a percentage such as 40%")
    return value


def fraction(text: str) -> float:
    """argparse type for :func:`parse_fraction`."""
    try:
        return parse_fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def existing_file(text: str) -> Path:
    """A path to an existing regular file (the error names the path): not a directory, a broken link,
    a link loop or a FIFO (reading one would wait for a writer)."""
    from platform_config.yaml_source import path_problem

    path = Path(text)
    if not path.exists() and not path.is_symlink():
        raise argparse.ArgumentTypeError(f"no such file: {path}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory, not a file")
    problem = path_problem(path, allowed="a regular file")
    if problem is not None:
        raise argparse.ArgumentTypeError(str(problem))
    return path


def existing_path(text: str) -> Path:
    """A path to an existing file or directory (the error names the path)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file or directory: {path}")
    return path
