"""Mutations of a config directory the way users make them (issue 27), as hypothesis strategies.

A :class:`Mutation` changes one thing in a copy of the scenario config (``tests/fixtures/config``):
a value's type, a key removed, added or typed twice, an extreme or unit-changed number, unicode, a
YAML 1.1 form, a file renamed or replaced by a link, a prefix file pointing outside the config, or a
value copied from another field or file (collisions, contradictions). Strategies draw the file, the
field and the new value from what the file holds, so every key of every example file is reachable.

Used by ``tests/properties/test_config_mutations.py``; the description is what hypothesis prints
for a failing example, so it says exactly what was done.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from hypothesis import strategies as st

Path_ = tuple[Any, ...]  # a field: keys and list indices from the file's top level

PLATFORM = "platform.yaml"
LINES_DIR = "business-lines"

#: Strings users type where a value belongs: units, YAML 1.1 words, unicode look-alikes, paths,
#: blanks, numbers in other scripts, lengths past every limit.
TYPED_STRINGS = (
    "", " ", "\t", "yes", "no", "on", "off", "null", "~", "None", "true", "NaN", "inf", "-1", "0", "1e3",
    "0x1F", "1_000", "08", "12:30", "500GB", "500 Gi", "500gi", "500Gib", "0.5Ti", "1000k", "8k", "8192 ",
    " 8192", "١٢٨", "１２８", "ｇ６ｅ", "rag\u200bassistant", "Rag-Assistant", "rag_assistant", "-rag", "rag-",
    "räg", "😀", "../../etc/passwd", "/", "/tmp", "C:\\models", "s3://bucket/key", "a" * 64, "a" * 300,
    "x" * 5000, "kvcache", "curvine", "kube-system", "default", "ml.g6e.12xlarge", "ml.p5.48xlarge",
    "us-west-2a", "us-east-1", "10.0.0.0/8", "0.0.0.0/0", "300.192.0.0/16", "aws:tag", "kvcache.io/project",
    "--max-model-len", "--kv-transfer-config", "latest", "python:latest", "curvine@sha256:" + "0" * 64,
)

#: Raw YAML scalars, written unquoted into the text: forms YAML 1.1 or 1.2 read as something else.
RAW_SCALARS = (
    "yes", "no", "on", "off", "y", "n", "~", "null", "0o17", "017", "0x1F", "1_000", "12:30:00", "1e3", ".inf",
    "-.inf", ".nan", "2026-12-02", "!!binary aGVsbG8=", "!!python/name:os.system", "&a 1", "*a", "[]", "{}",
    "[1, 2", "'unterminated", '"\\x"', "| \n", ">-", "@at", "`tick", "%percent", "- item", "? key", "key: value",
)


def scalar_values() -> st.SearchStrategy[Any]:
    """Values of another type or range than the field expects: None, booleans, extreme integers,
    odd floats, :data:`TYPED_STRINGS`, short unicode text."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, -1, 1, 2, 3, 7, 63, 64, 65, 128, 255, 256, 1023, 2**31, 2**63, 10**30, -(2**63)]),
        st.integers(min_value=-(10**6), max_value=10**6),
        st.sampled_from([0.0, -0.0, 0.5, 1.5, 1e-300, 1e300, float("inf"), float("-inf"), float("nan")]),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.sampled_from(TYPED_STRINGS),
        st.text(max_size=12),
    )


def user_values() -> st.SearchStrategy[Any]:
    """:func:`scalar_values` and small lists and mappings of them (a scalar where a list belongs, ...)."""
    return st.one_of(
        scalar_values(),
        st.lists(scalar_values(), max_size=3),
        st.dictionaries(st.sampled_from(["a", "name", "enabled", "", "1"]), scalar_values(), max_size=2),
    )


def related_values(original: Any) -> list[Any]:
    """Edits of ``original`` a user makes: units changed or dropped, scaled, negated, spaced, cased."""
    out: list[Any] = []
    if isinstance(original, bool):
        return [not original, str(original).lower(), int(original)]
    if isinstance(original, (int, float)):
        return [original * 1000, -original, original + 0.5, str(original), 0, original * 2**20, f"{original} "]
    if isinstance(original, str):
        out += [original.upper(), original + " ", " " + original, original + "B", original + "x", original[:-1],
                original * 3, original.replace("-", "_"), original.replace(".", ""), f"{original}\n"]
        number = re.match(r"^(\d+(?:\.\d+)?)([A-Za-z]*)$", original)
        if number:
            value, unit = number.groups()
            out += [value, f"{value} {unit}", f"{value}{unit.lower()}", f"{value}{unit.upper()}",
                    f"{value}{unit[:1]}", f"{value}{unit}B", f"-{value}{unit}", f"0{unit}", f"{value}000000{unit}"]
    return out


def paths_in(data: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every field of ``data`` (mapping keys and list items, at every depth), parents first."""
    out: list[Path_] = []
    if isinstance(data, dict):
        for key, value in data.items():
            out.append(prefix + (key,))
            out += paths_in(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out.append(prefix + (i,))
            out += paths_in(value, prefix + (i,))
    return out


def get(data: Any, path: Path_) -> Any:
    for part in path:
        data = data[part]
    return data


def set_at(data: Any, path: Path_, value: Any) -> None:
    get(data, path[:-1])[path[-1]] = value


def delete_at(data: Any, path: Path_) -> None:
    parent = get(data, path[:-1])
    del parent[path[-1]]


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


@dataclass(frozen=True)
class Mutation:
    """One change to a config directory: ``apply(config_dir)`` makes it; ``file`` is the file it
    changed (relative to the config directory), ``kind`` its family, ``description`` what it did."""

    kind: str
    file: str
    description: str
    apply: Callable[[Path], None]

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return f"Mutation({self.kind}: {self.file}: {self.description})"


def config_files(config_dir: Path) -> list[str]:
    """The YAML files of a config directory, relative to it: platform.yaml, then the lines."""
    lines = sorted(p.name for p in (config_dir / LINES_DIR).glob("*.yaml"))
    return [PLATFORM] + [f"{LINES_DIR}/{name}" for name in lines]


def load(config_dir: Path, file: str) -> Any:
    return yaml.safe_load((config_dir / file).read_text(encoding="utf-8"))


def dump(config_dir: Path, file: str, data: Any) -> None:
    # allow_unicode: a user's editor writes the characters, not \u escapes.
    (config_dir / file).write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")


def _edit(file: str, change: Callable[[Any], None]) -> Callable[[Path], None]:
    def apply(config_dir: Path) -> None:
        data = load(config_dir, file)
        change(data)
        dump(config_dir, file, data)
    return apply


@st.composite
def value_mutations(draw, base: Path) -> Mutation:
    """A field set to another value: of another type, an extreme, or an edit of its own value."""
    file = draw(st.sampled_from(config_files(base)))
    data = load(base, file)
    path = draw(st.sampled_from(paths_in(data)))
    original = get(data, path)
    related = related_values(original)
    value = draw(st.sampled_from(related) if related and draw(st.booleans()) else user_values())
    return Mutation("value", file, f"{dotted(path)}: {original!r} -> {value!r}",
                    _edit(file, lambda d: set_at(d, path, value)))


@st.composite
def key_mutations(draw, base: Path) -> Mutation:
    """A key removed, renamed (a typo, another case) or added beside the others; a list emptied."""
    file = draw(st.sampled_from(config_files(base)))
    data = load(base, file)
    path = draw(st.sampled_from(paths_in(data)))
    action = draw(st.sampled_from(["delete", "rename", "add", "empty"]))
    if action == "delete":
        return Mutation("key", file, f"delete {dotted(path)}", _edit(file, lambda d: delete_at(d, path)))
    if action == "empty":
        empty = draw(st.sampled_from([[], {}, None, ""]))
        return Mutation("key", file, f"{dotted(path)} = {empty!r}", _edit(file, lambda d: set_at(d, path, empty)))
    parent = get(data, path[:-1])
    if not isinstance(parent, dict):
        return Mutation("key", file, f"delete {dotted(path)}", _edit(file, lambda d: delete_at(d, path)))
    key = str(path[-1])
    new_key = draw(st.sampled_from([key.upper(), key.replace("_", "-"), key + "s", key[:-1], " " + key,
                                    key.title(), "unknown_field", "", "1"]))
    if action == "rename":
        def rename(d: Any) -> None:
            holder = get(d, path[:-1])
            holder[new_key] = holder.pop(path[-1])
        return Mutation("key", file, f"rename {dotted(path)} -> {new_key!r}", _edit(file, rename))
    value = draw(user_values())
    return Mutation("key", file, f"add {dotted(path[:-1] + (new_key,))} = {value!r}",
                    _edit(file, lambda d: set_at(d, path[:-1] + (new_key,), value)))


@st.composite
def text_mutations(draw, base: Path) -> Mutation:
    """Edits of the text itself: a key typed twice, a raw YAML 1.1 scalar, tabs, CRLF, a BOM,
    bytes that are not UTF-8, an empty or truncated file."""
    file = draw(st.sampled_from(config_files(base)))
    text = (base / file).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    scalar_lines = [i for i, l in enumerate(lines) if re.match(r"^\s*[\w.-]+:\s+[^\s#|>]", l)]
    action = draw(st.sampled_from(["duplicate", "raw", "tab", "crlf", "bom", "latin1", "empty", "truncate",
                                   "indent"]))
    if action in ("duplicate", "raw", "tab", "indent") and scalar_lines:
        i = draw(st.sampled_from(scalar_lines))
        if action == "duplicate":
            new_lines = lines[:i + 1] + [lines[i]] + lines[i + 1:]
            what = f"line {i + 1} typed twice: {lines[i].strip()!r}"
        elif action == "raw":
            raw = draw(st.sampled_from(RAW_SCALARS))
            key = lines[i].split(":", 1)[0]
            new_lines = lines[:i] + [f"{key}: {raw}\n"] + lines[i + 1:]
            what = f"line {i + 1}: {key.strip()}: {raw}"
        elif action == "tab":
            new_lines = lines[:i] + [lines[i].replace("  ", "\t", 1)] + lines[i + 1:]
            what = f"line {i + 1} indented with a tab"
        else:
            new_lines = lines[:i] + [" " + lines[i]] + lines[i + 1:]
            what = f"line {i + 1} indented one more space"
        new_text = "".join(new_lines)
    elif action == "crlf":
        new_text, what = text.replace("\n", "\r\n"), "CRLF line ends"
    elif action == "bom":
        new_text, what = "\ufeff" + text, "a UTF-8 byte-order mark"
    elif action == "empty":
        new_text, what = draw(st.sampled_from(["", "\n", "# nothing\n", "---\n", "[]\n", "null\n", "42\n"])), "no content"
    elif action == "truncate":
        cut = draw(st.integers(min_value=1, max_value=max(1, len(text) - 1)))
        new_text, what = text[:cut], f"cut after {cut} characters"
    else:  # latin1
        def apply_latin1(config_dir: Path) -> None:
            (config_dir / file).write_bytes(text.replace("namespace", "namespäce").encode("latin-1", "replace")
                                            + "# café\n".encode("latin-1"))
        return Mutation("text", file, "saved as Latin-1", apply_latin1)

    def apply(config_dir: Path) -> None:
        (config_dir / file).write_text(new_text, encoding="utf-8", newline="")
    return Mutation("text", file, what, apply)


@st.composite
def cross_mutations(draw, base: Path) -> Mutation:
    """A value copied from another field, in the same file or another one: names, namespaces,
    instance types, zones and sizes that collide or contradict."""
    files = config_files(base)
    target_file = draw(st.sampled_from(files))
    source_file = draw(st.sampled_from(files))
    target, source = load(base, target_file), load(base, source_file)
    target_path = draw(st.sampled_from(paths_in(target)))
    source_path = draw(st.sampled_from(paths_in(source)))
    value = get(source, source_path)
    return Mutation("cross", target_file, f"{dotted(target_path)} = {source_file}:{dotted(source_path)} ({value!r})",
                    _edit(target_file, lambda d: set_at(d, target_path, value)))


#: File names users give a business line's file (some meant, some by accident).
LINE_FILE_NAMES = ("x.YAML", "x.Yaml", "x.yaml.txt", "x.yml.bak", "x.yaml~", ".x.yaml", "._x.yaml", "x.yml",
                   "X.yaml", "rag assistant.yaml", "räg.yaml", "rag_assistant.yaml", "-rag.yaml", "1.yaml",
                   "a" * 70 + ".yaml", "x.json", "x", "x.yaml.yaml", "x .yaml", "😀.yaml")


@st.composite
def file_mutations(draw, base: Path) -> Mutation:
    """A line's file renamed, copied under a second name, replaced by a link (inside, outside the
    config, dangling, a loop) or by a directory; a prefix file linked from outside the config,
    made absolute, pointed above the config or removed."""
    lines = [f for f in config_files(base) if f != PLATFORM]
    file = draw(st.sampled_from(lines))
    action = draw(st.sampled_from(["rename", "copy", "link-inside", "link-outside", "dangling", "loop", "dir",
                                   "prefix-link-outside", "prefix-absolute", "prefix-parent", "prefix-missing",
                                   "prefix-dir", "platform-missing", "platform-link-outside"]))
    source = Path(file)
    if action in ("rename", "copy"):
        name = draw(st.sampled_from(LINE_FILE_NAMES))

        def apply(config_dir: Path) -> None:
            text = (config_dir / source).read_text(encoding="utf-8")
            if action == "rename":
                (config_dir / source).unlink()
            (config_dir / LINES_DIR / name).write_text(text, encoding="utf-8")
        return Mutation("file", file, f"{action} to {LINES_DIR}/{name}", apply)
    if action.startswith("link") or action in ("dangling", "loop", "dir"):
        def apply(config_dir: Path) -> None:
            path = config_dir / source
            outside = config_dir.parent / f"outside-{source.name}"
            if action == "link-outside":
                outside.write_bytes(path.read_bytes())
                path.unlink()
                path.symlink_to(outside)
            elif action == "link-inside":
                inside = config_dir / LINES_DIR / f".real-{source.name}"
                path.rename(inside)
                path.symlink_to(inside.name)
            elif action == "dangling":
                path.unlink()
                path.symlink_to(config_dir / "no-such-file.yaml")
            elif action == "loop":
                path.unlink()
                path.symlink_to(path.name)
            else:
                path.unlink()
                path.mkdir()
        return Mutation("file", file, action, apply)
    if action.startswith("platform-"):
        def apply(config_dir: Path) -> None:
            path = config_dir / PLATFORM
            if action == "platform-missing":
                path.unlink()
            else:
                outside = config_dir.parent / "outside-platform.yaml"
                outside.write_bytes(path.read_bytes())
                path.unlink()
                path.symlink_to(outside)
        return Mutation("file", PLATFORM, action, apply)

    # A hot prefix file: only the lines that declare one.
    data = load(base, file)
    prefixes = (data.get("hot_prefixes") or {}).get("prefixes") or []
    refs = [(i, j, m["file"]) for i, p in enumerate(prefixes) for j, m in enumerate(p.get("messages") or [])
            if m.get("file")]
    if not refs:
        return Mutation("file", file, "delete the file", lambda d: (d / source).unlink())
    i, j, ref = draw(st.sampled_from(refs))
    field = ("hot_prefixes", "prefixes", i, "messages", j, "file")

    def apply(config_dir: Path) -> None:
        prefix_file = config_dir / LINES_DIR / ref
        outside = config_dir.parent / "outside-prefix.md"
        if action == "prefix-link-outside":
            outside.write_bytes(prefix_file.read_bytes())
            prefix_file.unlink()
            prefix_file.symlink_to(outside)
        elif action == "prefix-absolute":
            outside.write_bytes(prefix_file.read_bytes())
            _edit(file, lambda d: set_at(d, field, str(outside)))(config_dir)
        elif action == "prefix-parent":
            outside.write_bytes(prefix_file.read_bytes())
            _edit(file, lambda d: set_at(d, field, os.path.join("..", "..", outside.name)))(config_dir)
        elif action == "prefix-missing":
            prefix_file.unlink()
        else:
            prefix_file.unlink()
            prefix_file.mkdir()
    return Mutation("file", file, f"{action}: {ref}", apply)


def mutations(base: Path) -> st.SearchStrategy[Mutation]:
    """Any one mutation of the config directory ``base`` (read, never written)."""
    return st.one_of(value_mutations(base), key_mutations(base), text_mutations(base), cross_mutations(base),
                     file_mutations(base))
