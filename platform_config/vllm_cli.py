"""What vLLM 0.29's command line refuses, checked offline: a line's ``vllm.args`` either start the
server or are refused at synthesis, not at pod start.

The options come from vLLM's own parser, generated into ``vllm_serve_flags.json`` by
``scripts/update_vllm_flags.py`` (serving tier virtualenv; the serving tier fails when vLLM's parser
and the table differ). The rules are argparse's and ``FlexibleArgumentParser.parse_args``'s
(``vllm/utils/argparse_utils.py``), followed here in the order vLLM applies them:

1. spelling: ``--a_b`` is ``--a-b`` (the name up to the first ``.``), ``-O3`` / ``-O 3`` are
   ``--optimization-level 3``; ``--json-flag.key value`` sets one key of a JSON option;
2. argparse: an exact option, ``--option=value``, or a unique prefix of one (``allow_abbrev``); a
   prefix of several is ambiguous; an option takes ``nargs`` values (an option-looking word is not
   a value; ``-1`` and ``-0.5`` are); the first free word is the model (one positional,
   ``model_tag``); any other free word is an unrecognized argument;
3. each value through the option's type (``int``, ``float``, JSON, vLLM's human-readable integers)
   and its choices;
4. ``validate_parsed_serve_args`` (``vllm/entrypoints/launchers/cli_args.py``): the option pairs
   it requires.

What is not followed: the fields inside a JSON config option (``--compilation-config``: vLLM's
dataclasses validate them, pydantic at pod start), ``--config <file>`` (refused: no such file in
the pod), a chat template's content. ``tests_serving/test_vllm_arguments.py`` holds this module
against vLLM's parser on every example line and on mutated ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from platform_config.vllm_args import human_readable_int, human_readable_int_or_auto, is_flag

FLAGS_FILE = Path(__file__).with_name("vllm_serve_flags.json")
#: Options whose values the config checks with a message of its own, the allowed range and not only
#: the type (:mod:`platform_config.vllm_args`, :class:`platform_config.line_models.BusinessLineConfig`):
#: the line's validator leaves their values to those checks (``values_checked_elsewhere``).
CHECKED_ELSEWHERE = frozenset({"max_model_len", "gpu_memory_utilization", "tensor_parallel_size",
                               "pipeline_parallel_size", "data_parallel_size"})
#: Options a pod must not be started with, and why: they exit instead of serving, or read a file.
EXITING_OPTIONS = {
    "help": "it prints the help and exits: the pod restarts for ever",
    "config": "it reads its options from a YAML file, which is not in the pod; write them in vllm.args",
    "data_parallel_multi_port_external_lb": ("it runs one API server per data-parallel rank, each on a port of its "
                                             "own, where the operator routes to the one port of vllm.port"),
}
#: ``LoRAModulePath``'s fields (vllm/entrypoints/openai/models/protocol.py): the JSON form of a
#: ``--lora-modules`` value; ``name`` and ``path`` are required.
LORA_MODULE_FIELDS = frozenset({"name", "path", "base_model_name", "is_3d_lora_weight"})


@dataclass(frozen=True)
class Option:
    """One option of vLLM's parser: ``dest`` (its name), its option strings, ``nargs`` (0, 1, ``?``,
    ``+``), ``kind`` (``store``, ``flag``, ``append``, ``help``), the value ``type`` and ``choices``."""

    dest: str
    options: tuple[str, ...]
    nargs: int | str
    kind: str
    type: str
    choices: tuple[str, ...] | None


@lru_cache(maxsize=1)
def options() -> tuple[str, dict[str, Option]]:
    """``(vLLM version, option string -> Option)`` of :data:`FLAGS_FILE`."""
    data = json.loads(FLAGS_FILE.read_text(encoding="utf-8"))
    table = {}
    for dest, o in data["options"].items():
        option = Option(dest, tuple(o["options"]), o["nargs"], o["kind"], o["type"],
                        None if o["choices"] is None else tuple(o["choices"]))
        for name in option.options:
            table[name] = option
    return data["vllm"], table


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher


def _spelled(args: list[str]) -> tuple[list[str], list[str]]:
    """Step 1, as ``FlexibleArgumentParser.parse_args`` rewrites the words before argparse reads
    them: ``(words, problems)``.

    ``--a_b`` becomes ``--a-b`` (up to the first ``.``); ``-O3``, ``-O=3`` and ``-O 3`` become
    ``--optimization-level 3``; then every word that starts with ``-`` and holds a ``.`` before any
    ``=`` is a dotted key (``--compilation-config.mode 3``): it and its value (the next word unless
    ``=`` gives it) leave their place, and each dotted option comes back at the end as one JSON
    object. vLLM applies that rule to any such word, a negative decimal such as ``-0.5`` included.
    """
    words: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            head, dot, rest = name[2:].partition(".")
            words.append("--" + head.replace("_", "-") + dot + rest + sep + value)
        elif arg.startswith("-O") and arg != "-O":
            words += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in ("0", "1", "2", "3"):
            words.append("--optimization-level")
        else:
            words.append(arg)
    out: list[str] = []
    problems: list[str] = []
    objects: dict[str, dict[str, Any]] = {}
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        name, sep, value = word.partition("=")
        if not (word.startswith("-") and "." in name):
            out.append(word)
            continue
        if not sep:
            if i + 1 >= len(words):
                problems.append(f"{word} has no value (vLLM reads the word after it)")
                continue
            value, skip = words[i + 1], True
        if name.endswith("+"):
            name, value = name[:-1], json.dumps(value.split(","))
        key, *keys = name.split(".")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            try:
                parsed = human_readable_int(value)
            except ValueError:
                parsed = value
        for part in reversed(keys):
            parsed = {part: parsed}
        _merge(objects.setdefault(key, {}), parsed)
    for key, obj in objects.items():
        out += [key, json.dumps(obj)]
    return out, problems


def _merge(original: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's ``recursive_dict_update``: nested objects merge, lists extend, the last value wins."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            _merge(original[k], v)
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] += v
        else:
            original[k] = v


def _lookup(word: str, table: dict[str, Option]) -> tuple[Option | None, str | None, str | None]:
    """Step 2 for one option-looking word: ``(option, explicit value, problem)``."""
    if word in table:
        return table[word], None, None
    name, sep, value = word.partition("=")
    if sep and name in table:
        return table[name], value, None
    if word.startswith("--"):
        matches = sorted({o.dest: o for s, o in table.items() if s.startswith(name) and s.startswith("--")}.values(),
                         key=lambda o: o.dest)
        if len(matches) == 1:
            return matches[0], (value if sep else None), None
        if len(matches) > 1:
            names = ", ".join(sorted(s for o in matches for s in o.options if s.startswith(name))[:6])
            return None, None, f"{name} is ambiguous: it begins {names}; write the whole option"
    return None, None, None


def _type_problem(option: Option, value: str) -> str | None:
    """Step 3: why ``option``'s type or choices refuse ``value``, or None."""
    kind = option.type
    if kind == "lora_module":
        return _lora_problem(value)
    if kind.startswith("optional:"):
        if value in ("", "None"):  # None, which argparse then holds to the choices
            return None if option.choices is None else (
                f"{option.options[0]} {value!r} is not one of its choices ({', '.join(option.choices[:12])})")
        kind = kind.removeprefix("optional:")
    converted: Any = value
    try:
        if kind == "int":
            converted = int(value)
        elif kind == "float":
            converted = float(value)
        elif kind == "human_readable_int":
            converted = human_readable_int(value)
        elif kind == "human_readable_int_or_auto":
            converted = human_readable_int_or_auto(value)
        elif kind == "json":
            json.loads(value)
        elif kind == "json_object" and not isinstance(json.loads(value), dict):
            return f"{option.options[0]} {value!r} is not a JSON object"
        elif kind == "union_dict_and_str" and re.match(r"(?s)^\s*{.*}\s*$", value):
            json.loads(value)
        elif kind == "lower_underscore":
            converted = value.lower().replace("-", "_")
    except ValueError:
        what = {"int": "a whole number", "float": "a number", "json": "JSON", "json_object": "a JSON object",
                "union_dict_and_str": "a JSON object or a word"}.get(kind, "a token count such as 8192 or 8k")
        return f"{option.options[0]} {value!r} is not {what}"
    if option.choices is not None and str(converted) not in option.choices:
        shown = ", ".join(option.choices[:12]) + (", ..." if len(option.choices) > 12 else "")
        return f"{option.options[0]} {value!r} is not one of its choices ({shown})"
    return None


def _lora_problem(value: str) -> str | None:
    """``LoRAParserAction``'s rule (vllm/entrypoints/launchers/cli_args.py) for one value."""
    if value == "":
        return None
    if "=" in value and "," not in value:
        return None if value.count("=") == 1 else f"--lora-modules {value!r} is not name=path"
    try:
        module = json.loads(value)
    except ValueError:
        module = None
    if not (isinstance(module, dict) and {"name", "path"} <= module.keys() <= LORA_MODULE_FIELDS):
        return (f"--lora-modules {value!r} is neither name=path nor a JSON object of "
                f"{', '.join(sorted(LORA_MODULE_FIELDS))} with name and path")
    return None


def serve_args_problems(args: list[str] | tuple[str, ...],
                        values_checked_elsewhere: frozenset[str] = frozenset()) -> list[str]:
    """What vLLM 0.29's OpenAI server refuses in ``args`` (a line's ``vllm.args``), one sentence
    each, in the order of the words; empty when vLLM starts with them. See the module docstring for
    the rules and what is not checked.

    Args:
        values_checked_elsewhere: options (``dest`` names, e.g. :data:`CHECKED_ELSEWHERE`) whose
            values are not checked here, because another check says more about them.
    """
    version, table = options()
    words, problems = _spelled(list(args))
    seen: dict[str, Any] = {}
    model_taken = False
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            # argparse: every word after "--" is positional; the first is the model if none was given.
            problems += [f"{w!r} is an argument vLLM does not recognize" for w in words[i if model_taken else i + 1:]]
            break
        looks_like_option = is_flag(word) and not _NEGATIVE_NUMBER.match(word) and " " not in word
        if not looks_like_option:
            if model_taken:
                problems.append(f"{word!r} is an argument vLLM does not recognize (a second positional: the model is "
                                f"{seen['model_tag']!r}; a value belongs right after its option)")
            else:
                model_taken, seen["model_tag"] = True, word
            continue
        option, explicit, problem = _lookup(word, table)
        if problem:
            problems.append(problem)
            continue
        if option is None:
            problems.append(f"{word.partition('=')[0]} is not an option of vLLM {version}'s server")
            continue
        if option.dest in EXITING_OPTIONS:
            problems.append(f"{word} is not allowed: {EXITING_OPTIONS[option.dest]}")
            continue
        values: list[str] = []
        if explicit is not None:
            if option.nargs == 0:
                problems.append(f"{word}: {option.options[0]} takes no value")
                continue
            values = [explicit]
        else:
            free = []
            while i + len(free) < len(words) and not (is_flag(words[i + len(free)])
                                                      and not _NEGATIVE_NUMBER.match(words[i + len(free)])):
                free.append(words[i + len(free)])
            wanted = {0: 0, 1: 1, "?": min(1, len(free)), "+": len(free), "*": len(free)}[option.nargs]
            if option.nargs in (1, "+") and not free:
                problems.append(f"{word} needs a value")
                continue
            values = free[:wanted]
            i += wanted
        for value in values if option.dest not in values_checked_elsewhere else ():
            problem = _type_problem(option, value)
            if problem:
                problems.append(problem)
        seen[option.dest] = values if option.nargs != 0 else not word.startswith("--no-")
    problems += _serve_checks(seen)
    return problems


def _serve_checks(seen: dict[str, Any]) -> list[str]:
    """Step 4: ``validate_parsed_serve_args``'s pairs (vllm/entrypoints/launchers/cli_args.py)."""
    out = []
    if seen.get("enable_auto_tool_choice") is True and not seen.get("tool_call_parser"):
        out.append("--enable-auto-tool-choice needs --tool-call-parser")
    if seen.get("enable_log_outputs") is True and seen.get("enable_log_requests") is not True:
        out.append("--enable-log-outputs needs --enable-log-requests")
    interval = seen.get("sse_keep_alive_interval")
    seconds = _int_or_none(interval[-1]) if interval else None
    if seconds is not None and seconds < 0:
        out.append("--sse-keep-alive-interval must be 0 or more")
    if seen.get("enable_per_request_metrics") is True and seen.get("disable_log_stats") is True:
        out.append("--enable-per-request-metrics needs engine statistics: remove --disable-log-stats")
    return out


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
