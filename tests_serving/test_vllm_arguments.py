"""The config's check of ``vllm.args`` agrees with vLLM 0.29's own parser (issue 27).

Synthesis is offline, so a line's arguments are checked by :mod:`platform_config.vllm_cli` from a
table of vLLM's options (``platform_config/vllm_serve_flags.json``). Here, where vLLM is installed,
that table is held to vLLM's parser, and the check's verdict to vLLM's on every example line's
arguments and on hypothesis mutations of them (options inserted with values of every type,
words dropped, repeated, swapped, respelled, abbreviated, joined with ``=``): the config refuses
exactly what the server refuses at start (``FlexibleArgumentParser.parse_args`` and
``validate_parsed_serve_args``, as ``python -m vllm.entrypoints.openai.api_server`` runs them).

Not compared (the module docstring of :mod:`platform_config.vllm_cli` says why): the fields inside
JSON config options, ``--chat-template`` (a path in the pod), ``--config`` (a file).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from platform_config import vllm_cli
from platform_config.vllm_cli import serve_args_problems
from tests_serving.servers import REPO

TABLE = json.loads(vllm_cli.FLAGS_FILE.read_text(encoding="utf-8"))
#: Options whose values depend on the pod or on vLLM's config classes (see the module docstring).
NOT_COMPARED = {"chat_template", "config", "help"}
OPTIONS = sorted((dest, o) for dest, o in TABLE["options"].items() if dest not in NOT_COMPARED)


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def vllm_accepts(parser, args: list[str]) -> bool:
    """Whether vLLM's server would start parsing ``args`` (its parse and its serve-argument checks)."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            namespace = parser.parse_args(list(args))
            validate_parsed_serve_args(namespace)
        except SystemExit:
            return False
        except Exception:  # noqa: BLE001 - any exception stops the server before it serves
            return False
    return True


def example_args() -> list[tuple[str, list[str]]]:
    files = sorted((REPO / "config" / "business-lines").glob("*.yaml")) + sorted(
        (REPO / "tests" / "fixtures" / "config" / "business-lines").glob("*.yaml"))
    return [(f"{f.parent.parent.name}/{f.name}", list(yaml.safe_load(f.read_text())["vllm"]["args"])) for f in files]


def test_the_table_is_vllms_parser() -> None:
    """An upgrade of vLLM that adds, removes or changes an option fails here until the table is
    regenerated (scripts/update_vllm_flags.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_vllm_flags", REPO / "scripts" / "update_vllm_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.table() == TABLE


@pytest.mark.parametrize("name,args", example_args(), ids=[n for n, _ in example_args()])
def test_every_example_lines_arguments_start_vllm(vllm_parser, name: str, args: list[str]) -> None:
    assert serve_args_problems(args) == []
    assert vllm_accepts(vllm_parser, args)


def values_for(option: dict) -> st.SearchStrategy[str]:
    """Values of the option's own type and of others."""
    valid = {"int": ["0", "1", "8", "-1"], "float": ["0.5", "1", "-0.5", "1e3"], "json": ["{}", "[1]", "3"],
             "json_object": ["{}"], "union_dict_and_str": ["{}", "word"], "human_readable_int": ["8k", "8K", "1"],
             "human_readable_int_or_auto": ["auto", "8k", "-1"], "lower_underscore": ["x"]}
    kind = option["type"].removeprefix("optional:")
    mine = list(option["choices"] or valid.get(kind, ["word"]))
    return st.one_of(st.sampled_from(mine), st.sampled_from(["abc", "", "None", "8.5", "2.5k", "{bad", "[]", "true",
                                                             "1_000", " 7", "-", "-x"]))


@st.composite
def mutated_args(draw) -> list[str]:
    _, args = draw(st.sampled_from(example_args()))
    args = list(args)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["insert", "insert", "drop", "repeat", "swap", "respell", "abbreviate",
                                       "join"]))
        at = draw(st.integers(0, len(args)))
        if action == "insert":
            dest, option = draw(st.sampled_from(OPTIONS))
            words = [draw(st.sampled_from(option["options"]))]
            if option["nargs"] != 0 or draw(st.booleans()):
                words += [draw(values_for(option)) for _ in range(draw(st.integers(0 if option["nargs"] != 1 else 1, 2)))]
            args[at:at] = words
        elif not args:
            continue
        elif action == "drop":
            del args[min(at, len(args) - 1)]
        elif action == "repeat":
            word = args[min(at, len(args) - 1)]
            args.insert(at, word)
        elif action == "swap" and len(args) > 1:
            i, j = draw(st.integers(0, len(args) - 1)), draw(st.integers(0, len(args) - 1))
            args[i], args[j] = args[j], args[i]
        elif action == "respell":
            i = min(at, len(args) - 1)
            args[i] = args[i][:2] + args[i][2:].replace("-", "_") if args[i].startswith("--") else args[i]
        elif action == "abbreviate":
            i = min(at, len(args) - 1)
            if args[i].startswith("--") and len(args[i]) > 4:
                args[i] = args[i][:draw(st.integers(3, len(args[i]) - 1))]
        elif action == "join":
            i = min(at, len(args) - 2)
            if i >= 0 and args[i].startswith("-"):
                args[i:i + 2] = [f"{args[i]}={args[i + 1]}"]
    return args


#: The agreement is the property; the examples are many (each is a parse, no server).
@settings(max_examples=int(os.environ.get("KVCACHE_VLLM_ARG_EXAMPLES", "600")), deadline=None,
          derandomize=os.environ.get("KVCACHE_MUTATIONS_SEED") != "random", database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(args=mutated_args())
def test_the_config_refuses_exactly_what_vllm_refuses(vllm_parser, args: list[str]) -> None:
    problems = serve_args_problems(args)
    assert (problems == []) == vllm_accepts(vllm_parser, args), problems
