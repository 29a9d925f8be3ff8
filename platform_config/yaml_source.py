"""Reading the config files: every way a path can be unreadable, and every YAML form that would
silently change a value.

Each problem is a :class:`~platform_config.problems.ConfigProblem` naming the file and the line or
field, never a traceback:

* **paths**: missing, a directory where a file is expected (or the reverse), a broken symbolic
  link, a symbolic link loop, a FIFO, socket or device (reading one would hang or make no sense),
  no permission, any other ``OSError`` (its ``strerror``);
* **text**: not UTF-8 (the byte and its line); a UTF-8 byte-order mark is accepted;
* **YAML**: a syntax error (its line), more than one document, a **duplicate key** in a mapping
  (PyYAML keeps the last one silently), and the forms PyYAML reads by YAML 1.1 where YAML 1.2 (and
  most other tools, editors and linters) read something else: ``yes``/``no``/``on``/``off`` as
  booleans, ``010`` as octal 8, ``0b101`` as binary, ``1:30`` as sexagesimal 90, ``1_000`` as 1000.
  Each is refused with both readings, so a value never changes silently. Dates (``2026-11-30``)
  stay text, as in YAML 1.2; a date field parses the text itself.

The unquoted scalars that YAML turned into numbers, booleans or null are remembered with their
text (:attr:`YamlDocument.scalars`), so a field that wanted text can say why it got a number
(``account: 111122223333`` unquoted is the number, not the 12-character ID) and how to fix it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from platform_config.problems import ConfigError, ConfigProblem

#: The suffixes of a YAML config file.
YAML_SUFFIXES = (".yaml", ".yml")

_STR = "tag:yaml.org,2002:str"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"
#: Tags the composer gives that have no constructor of their own (merge keys are resolved by the mapping).
_IMPLICIT_TAGS = {_MERGE}


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without the YAML 1.1 timestamp type (dates stay text, as in YAML 1.2)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


@dataclass(frozen=True)
class Scalar:
    """An unquoted scalar YAML read as something other than text: ``text`` as written, ``tag``
    (int, float, bool or null), ``value`` as read, ``line`` 1-based."""

    text: str
    tag: str
    value: Any
    line: int

    def reading(self) -> str:
        """How YAML read it, for a message: ``the number 111122223333``, ``true``, ``null (empty)``."""
        if self.tag == _NULL:
            return "null (an empty value)" if not self.text else f"null ({self.text})"
        if self.tag == _BOOL:
            return "true" if self.value else "false"
        return f"the number {self.value!r}"


@dataclass(frozen=True)
class YamlDocument:
    """One YAML file read: ``data`` (a mapping) and the non-text unquoted scalars by path
    (mapping keys as written, list positions as ints)."""

    path: Path
    data: dict[str, Any]
    scalars: dict[tuple[Any, ...], Scalar] = field(default_factory=dict)


def path_problem(path: Path, *, directory: bool = False, allowed: str = "") -> ConfigProblem | None:
    """Why ``path`` cannot be read as a regular file (``directory``: as a directory), or None.

    Covers a missing path, a broken symbolic link, a symbolic link loop, permission, the wrong
    kind (a directory for a file, a file for a directory, a FIFO, socket or device) and any other
    ``OSError``. ``allowed`` says what is expected (default: ``a YAML file`` / ``a directory``).
    """
    kind = "directory" if directory else "file"
    allowed = allowed or ("a directory" if directory else "a YAML file")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return ConfigProblem(str(path), "", f"a symbolic link to {os.readlink(path)}, which does not exist; "
                                                f"allowed: {allowed} (or a link to one)")
        return ConfigProblem(str(path), "", f"no such {kind}; allowed: {allowed}")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return ConfigProblem(str(path), "", f"a symbolic link loop (it points to {os.readlink(path)}, which never "
                                                f"reaches a {kind}); allowed: {allowed} (or a link to one)")
        if exc.errno == errno.EACCES:
            return ConfigProblem(str(path), "", f"not readable: permission denied; allowed: {allowed} you may read")
        return ConfigProblem(str(path), "", f"cannot be read: {exc.strerror or exc}; allowed: {allowed}")
    if directory:
        if not stat.S_ISDIR(st.st_mode):
            return ConfigProblem(str(path), "", f"not a directory; allowed: {allowed}")
        return None
    if stat.S_ISDIR(st.st_mode):
        return ConfigProblem(str(path), "", f"a directory, not a file; allowed: {allowed}")
    if not stat.S_ISREG(st.st_mode):
        return ConfigProblem(str(path), "", f"not a regular file (a FIFO, socket or device); allowed: {allowed}")
    return None


def read_text(path: Path) -> str:
    """The UTF-8 text of the regular file ``path`` (a leading byte-order mark dropped).

    Raises:
        ConfigError: one problem, naming the file: unreadable (:func:`path_problem`), or not UTF-8
            (the first bad byte and its line).
    """
    problem = path_problem(path)
    if problem is not None:
        raise ConfigError([problem])
    try:
        raw = path.read_bytes()
    except OSError as exc:  # raced with a change, or a failure stat could not see
        raise ConfigError([ConfigProblem(str(path), "", f"cannot be read: {exc.strerror or exc}; allowed: a file this user "
                                                                  "can read")]) from None
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError([ConfigProblem(
            str(path), "", f"not UTF-8 text: byte 0x{raw[exc.start]:02x} is not valid UTF-8; allowed: a text file "
                           "saved as UTF-8", line=line)]) from None


def read_yaml_document(path: Path) -> YamlDocument:
    """Read ``path`` as one YAML mapping (an empty file is an empty mapping).

    Raises:
        ConfigError: every problem found, each naming the file and the line: unreadable or not UTF-8
            (:func:`read_text`), not valid YAML, several documents, duplicate keys, YAML 1.1-only
            forms (module docstring), or a document that is not a mapping.
    """
    text = read_text(path)
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        problems: list[ConfigProblem] = []
        scalars: dict[tuple[Any, ...], Scalar] = {}
        if node is not None:
            _walk(node, (), loader, path, problems, scalars)
        if problems:
            raise ConfigError(problems)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ConfigError([ConfigProblem(
            str(path), "", f"not valid YAML: {what}; allowed: one YAML mapping (key: value lines)",
            line=None if mark is None else mark.line + 1)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(str(path), "", f"not valid YAML: {exc}; allowed: one YAML mapping "
                                                        "(key: value lines)")]) from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a single text", int: "a single number", float: "a single number",
                bool: "a single boolean"}.get(type(data), type(data).__name__)
        raise ConfigError([ConfigProblem(str(path), "", f"holds {kind}, not a YAML mapping; allowed: key: value lines, "
                                                        "as in the example config")])
    return YamlDocument(path, data, scalars)


_YAML11_INT = re.compile(r"^[-+]?(0[0-7_]+|0b[01_]+|[0-9][0-9_]*(:[0-5]?[0-9])+|.*_.*)$")
_YAML11_FLOAT = re.compile(r"^[-+]?([0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*|.*_.*)$")


def _yaml11_only(node: ScalarNode, value: Any) -> str | None:
    """Why YAML 1.2 would read this plain scalar differently from PyYAML (YAML 1.1), or None."""
    text = node.value
    if node.tag == _BOOL and text.lower() not in ("true", "false"):
        return (f"{text} is a boolean only in YAML 1.1 (read here as {str(value).lower()}); YAML 1.2 and most other "
                f"tools read it as text; allowed: true or false, or \"{text}\" in quotes for the text")
    if node.tag == _INT and _YAML11_INT.match(text):
        kind = ("octal" if re.match(r"^[-+]?0[0-7]", text) else "binary" if "0b" in text
                else "base 60" if ":" in text else "digits with '_' removed")
        return (f"{text} is a number only in YAML 1.1 (read here as {value}, {kind}); YAML 1.2 reads it otherwise; "
                f"allowed: a plain decimal number such as {value}, or \"{text}\" in quotes for the text")
    if node.tag == _FLOAT and _YAML11_FLOAT.match(text):
        return (f"{text} is a number only in YAML 1.1 (read here as {value}); YAML 1.2 reads it otherwise; allowed: a "
                f"plain decimal number such as {value}, or \"{text}\" in quotes for the text")
    return None


def _scalar_value(loader: _Loader, node: ScalarNode) -> Any:
    """The value PyYAML gives a plain scalar (its constructor for the resolved tag, no shared state)."""
    return loader.yaml_constructors[node.tag](loader, node)


def _walk(node: Node, path: tuple[Any, ...], loader: _Loader, file: Path, problems: list[ConfigProblem],
          scalars: dict[tuple[Any, ...], Scalar]) -> None:
    """Check ``node`` and below: duplicate keys, YAML 1.1-only forms; record non-text plain scalars."""
    dotted = ".".join(str(p) for p in path)
    if node.tag not in loader.yaml_constructors and node.tag not in _IMPLICIT_TAGS:
        # A tag the safe loader cannot build (!!python/name:..., !Ref): PyYAML would fail without saying where.
        problems.append(ConfigProblem(str(file), dotted, f"YAML tag {node.tag!r} is not allowed; allowed: plain "
                                                         "values, without a '!' tag", line=node.start_mark.line + 1))
        return
    if isinstance(node, ScalarNode):
        if node.style is None and node.tag != _STR:
            value = _scalar_value(loader, node)
            why = _yaml11_only(node, value)
            if why:
                problems.append(ConfigProblem(str(file), dotted, why, line=node.start_mark.line + 1))
            scalars[path] = Scalar(node.value, node.tag, value, node.start_mark.line + 1)
        return
    if isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, path + (index,), loader, file, problems, scalars)
        return
    if not isinstance(node, MappingNode):
        return
    first_line: dict[tuple[str, str], int] = {}
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE:  # "<<: *defaults": explicit keys may override merged ones (YAML's rule)
            for merged in (value_node.value if isinstance(value_node, SequenceNode) else [value_node]):
                _walk(merged, path, loader, file, problems, scalars)
            continue
        if isinstance(key_node, ScalarNode):
            key_line = key_node.start_mark.line + 1
            identity = (key_node.tag, key_node.value)
            if key_node.style is None and key_node.tag != _STR:
                key_value = _scalar_value(loader, key_node)
                why = _yaml11_only(key_node, key_value)
                if why:
                    problems.append(ConfigProblem(str(file), dotted, f"key {why}", line=key_line))
            if identity in first_line:
                problems.append(ConfigProblem(
                    str(file), ".".join(str(p) for p in path + (key_node.value,)),
                    f"duplicate key {key_node.value!r} (first at line {first_line[identity]}); YAML keeps only the "
                    "last one, silently; allowed: each key once per mapping", line=key_line))
            first_line.setdefault(identity, key_line)
            child = key_node.value
        else:
            child = "?"
        _walk(value_node, path + (child,), loader, file, problems, scalars)
