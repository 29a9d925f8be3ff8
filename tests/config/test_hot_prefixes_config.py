"""A line's declared hot prefixes (issue 17): read with the config, bounded, refused cleanly.

Every refusal is one problem naming the line's file, the field and (for a prefix file) that file, and
what is allowed; through ``app.py`` it is one ``error:`` line, exit 2, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capacity import project_checks
from capacity.project_checks import hot_prefix_budget, load_checked_project
from platform_config.line_models import MAX_HOT_PREFIX_BYTES
from tests.config.test_broken_inputs import RAG, refused
from tests.config.test_config import problems
from tests.example_config import edit_yaml

PROMPT_FILE = "rag-assistant.system-prompt.md"


def declare(config_dir: Path, *prefixes: dict, **section) -> None:
    edit_yaml(config_dir / RAG, lambda d: d.update(hot_prefixes={**section, "prefixes": list(prefixes)}))


def test_the_scenario_line_declares_its_system_prompt_read_from_the_file_beside_it(config_dir: Path) -> None:
    project = load_checked_project(config_dir)
    (prefix,) = project.business_line("rag-assistant").hot_prefixes.prefixes
    assert prefix.name == "system-prompt" and prefix.kind == "chat"
    assert prefix.messages[0].role == "system" and prefix.messages[0].file == PROMPT_FILE
    assert prefix.messages[0].text == (config_dir / "business-lines" / PROMPT_FILE).read_text(encoding="utf-8")
    assert not [w for w in project.warnings if PROMPT_FILE in w]  # a prefix file is not "ignored"


def test_a_prefix_file_in_a_subdirectory_and_a_raw_text_prefix(config_dir: Path) -> None:
    (config_dir / "business-lines" / "prompts").mkdir()
    (config_dir / "business-lines" / "prompts" / "tools.json").write_text('{"tools": ["search"]}\n', encoding="utf-8")
    declare(config_dir, {"name": "tools", "file": "prompts/tools.json"}, {"name": "inline", "text": "Be brief.\n"})
    project = load_checked_project(config_dir)
    tools, inline = project.business_line("rag-assistant").hot_prefixes.prefixes
    assert (tools.kind, tools.raw_text, inline.raw_text) == ("text", '{"tools": ["search"]}\n', "Be brief.\n")
    assert not [w for w in project.warnings if "prompts" in w]


def test_a_missing_prefix_file_names_the_line_the_field_and_the_file(config_dir: Path, tmp_path: Path) -> None:
    (config_dir / "business-lines" / PROMPT_FILE).unlink()
    line = refused(config_dir, tmp_path)
    assert line == (f"{config_dir / RAG}: hot_prefixes.prefixes.0.messages.0.file: {config_dir / 'business-lines' / PROMPT_FILE}: "
                    "no such file; allowed: a UTF-8 text file, its path relative to the directory of the line's file")


def test_a_prefix_file_that_is_not_utf8_names_its_line(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / "business-lines" / PROMPT_FILE
    path.write_bytes(b"You are helpful.\nCaf\xe9 menu.\n")
    line = refused(config_dir, tmp_path)
    assert line == (f"{config_dir / RAG}: hot_prefixes.prefixes.0.messages.0.file: {path} (line 2): not UTF-8 text: "
                    "byte 0xe9 is not valid UTF-8; allowed: a text file saved as UTF-8")


@pytest.mark.parametrize("content, why", [
    ("   \n\n", "is empty; allowed: the prefix's text"),
    ("line one\nline\x00two\n", "holds the control character U+0000 on line 2; allowed: text whose only control "
                                "characters are tab, newline and carriage return"),
])
def test_an_empty_or_binary_prefix_file_is_refused(config_dir: Path, content: str, why: str) -> None:
    path = config_dir / "business-lines" / PROMPT_FILE
    path.write_text(content, encoding="utf-8")
    (problem,) = problems(config_dir)
    assert problem.startswith(f"{config_dir / RAG}: hot_prefixes.prefixes.0.messages.0.file: {path}: {why}")


def test_a_directory_where_the_prefix_file_should_be(config_dir: Path) -> None:
    (config_dir / "business-lines" / "dir.md").mkdir()
    declare(config_dir, {"name": "p", "file": "dir.md"})
    (problem,) = problems(config_dir)
    assert problem == (f"{config_dir / RAG}: hot_prefixes.prefixes.0.file: {config_dir / 'business-lines' / 'dir.md'}: "
                       "a directory, not a file; allowed: a UTF-8 text file, its path relative to the directory of "
                       "the line's file")


@pytest.mark.parametrize("path", ["../platform.yaml", "/etc/passwd", "a/../../x.md", "./x.md"])
def test_a_prefix_file_outside_the_lines_directory_is_refused(config_dir: Path, path: str) -> None:
    declare(config_dir, {"name": "p", "file": path})
    (problem,) = problems(config_dir)
    assert problem.startswith(f"{config_dir / RAG}: hot_prefixes.prefixes.0.file: ")
    assert "not allowed; allowed: a path relative to the line's file" in problem or "must stay inside" in problem


def test_the_text_of_all_prefixes_is_bounded(config_dir: Path) -> None:
    half = "word " * (MAX_HOT_PREFIX_BYTES // 10 + 1)  # just over half the bound each
    declare(config_dir, {"name": "a", "text": half}, {"name": "b", "text": half})
    (problem,) = problems(config_dir)
    total = 2 * len(half)
    assert problem == (f"{config_dir / RAG}: hot_prefixes.prefixes: the prefixes' text is {total:,} bytes of UTF-8 "
                       f"(a {len(half):,}, b {len(half):,}); allowed: at most {MAX_HOT_PREFIX_BYTES:,} bytes per line (it "
                       "travels in the line's CloudFormation template, docs/l2-cache.md 'Hot prefixes'): shorter or "
                       "fewer prefixes")
    declare(config_dir, {"name": "a", "text": half})  # one of them fits
    load_checked_project(config_dir)


@pytest.mark.parametrize("prefix, field, why", [
    ({"name": "p", "messages": [{"role": "system", "content": "x", "file": PROMPT_FILE}]},
     "hot_prefixes.prefixes.0.messages.0.content", "give the message's text in content or name its file in file"),
    ({"name": "p", "text": "x", "messages": [{"role": "system", "content": "x"}]},
     "hot_prefixes.prefixes.0.messages", "a prefix takes exactly one of messages, text or file (got messages, text)"),
    ({"name": "p"}, "hot_prefixes.prefixes.0.messages", "a prefix takes exactly one of messages, text or file (got none)"),
    ({"name": "p", "messages": [{"role": "tool", "content": "x"}]}, "hot_prefixes.prefixes.0.messages.0.role",
     "not allowed; allowed: 'system', 'developer', 'user' or 'assistant'"),
    ({"name": "Not_A_Label", "text": "x"}, "hot_prefixes.prefixes.0.name", "a DNS-1123 label"),
])
def test_a_malformed_prefix_names_its_field(config_dir: Path, prefix: dict, field: str, why: str) -> None:
    declare(config_dir, prefix)
    (problem,) = problems(config_dir)
    assert problem.startswith(f"{config_dir / RAG}: {field}: ") and why in problem, problem


def test_two_prefixes_of_one_name(config_dir: Path) -> None:
    declare(config_dir, {"name": "p", "text": "x"}, {"name": "p", "text": "y"})
    (problem,) = problems(config_dir)
    assert problem.startswith(f"{config_dir / RAG}: hot_prefixes.prefixes.1.name: prefix name 'p' is used twice")


def test_the_pinned_share_must_stay_below_the_low_watermark(config_dir: Path) -> None:
    edit_yaml(config_dir / RAG, lambda d: d["hot_prefixes"].update(max_l2_fraction=0.5))
    edit_yaml(config_dir / "platform.yaml", lambda d: d["curvine"].setdefault("eviction", {}).update(low_watermark=0.4))
    (problem,) = problems(config_dir)
    assert problem == (f"{config_dir / RAG}: hot_prefixes.max_l2_fraction: pinned chunks are never evicted, so pinning "
                       f"0.5 of l2_size would leave the janitor unable to reach curvine.eviction.low_watermark 0.4 "
                       f"({config_dir / 'platform.yaml'}); allowed: below 0.4 (got 0.5)")


def test_a_janitor_image_of_an_older_python_is_refused_for_hot_prefixes(config_dir: Path) -> None:
    edit_yaml(config_dir / "platform.yaml", lambda d: d["versions"]["images"].update(l2_janitor="python:3.10.14-slim"))
    (problem,) = problems(config_dir)
    assert problem.startswith(f"{config_dir / 'platform.yaml'}: versions.images.l2_janitor: business line rag-assistant "
                              "declares hot prefixes")
    assert problem.endswith("allowed: a python image of 3.11 or later (the vLLM image runs 3.12) (got 'python:3.10.14-slim')")
    edit_yaml(config_dir / RAG, lambda d: d["hot_prefixes"].update(enabled=False))  # the switch: no warm-up, no rule
    load_checked_project(config_dir)


def test_prefixes_on_a_line_without_l2_are_a_warning(config_dir: Path) -> None:
    edit_yaml(config_dir / RAG, lambda d: d["cache"].update(l2_enabled=False, l1_cpu_gib=None))
    project = load_checked_project(config_dir)
    assert any(w.startswith(f"{config_dir / RAG}: hot_prefixes declares 1 prefix(es), but cache.l2_enabled is false")
               for w in project.warnings)


def test_the_pinned_share_bound_and_its_refusal(config_dir: Path) -> None:
    """The bound for the scenario's system prompt: 5,035 bytes + 16 + 64 template tokens = 5,115 tokens at
    most, 4,864 of them in 19 full chunks, x 57,344 B (Qwen2-7B, bf16, TP 1) + 19 headers of 28 B."""
    b = hot_prefix_budget(load_checked_project(config_dir).business_line("rag-assistant"))
    assert (b.token_bound, b.pinned_tokens, b.kv_bytes_per_token, b.files) == (5115, 4864, 57344, 19)
    assert b.pinned_bytes == 4864 * 57344 + 19 * 28 and b.fits
    # A 1Gi l2_size with a 10% share allows 107 MB: the same prompt (279 MB bound) is refused.
    edit_yaml(config_dir / RAG, lambda d: d["cache"].update(l2_size="1Gi"))
    (problem,) = problems(config_dir)
    assert problem == (f"{config_dir / RAG}: hot_prefixes.prefixes: the prefixes may pin up to 0.26 GiB of L2 (26.0% of "
                       "cache.l2_size 1Gi): at most 5,115 tokens (their UTF-8 bytes plus the chat template's), 4,864 of "
                       "them in full 256-token chunks, x 57,344 B of KV per token of Qwen2-7B-Instruct; allowed: at most "
                       "hot_prefixes.max_l2_fraction 0.1 of it (0.10 GiB): shorter prefixes, a larger max_l2_fraction "
                       "or a larger l2_size (scripts/plan.py --business-line shows the figures)")


def test_tp_ranks_multiply_files_not_bytes(config_dir: Path) -> None:
    """A 70B Llama at TP 8: each rank writes its share of the KV heads, so a chunk is 8 files whose bytes
    add up to the model's KV per token (327,680 B), not 8 times it."""
    text = "x " * 2000
    edit_yaml(config_dir / "business-lines" / "research-reasoning.yaml",
              lambda d: d.update(hot_prefixes={"prefixes": [{"name": "doc", "text": text}]}))
    b = hot_prefix_budget(load_checked_project(config_dir).business_line("research-reasoning"))
    assert (b.token_bound, b.pinned_tokens, b.kv_bytes_per_token, b.files) == (4001, 3840, 327680, 15 * 8)


def test_the_check_is_the_one_every_command_loads() -> None:
    import inspect

    assert "hot_prefix_problems" in inspect.getsource(project_checks.load_checked_project)


def test_a_prefix_file_linked_from_outside_the_config_is_refused(config_dir: Path, tmp_path: Path) -> None:
    """Issue 25: a link's target would land in the template and a ConfigMap, whatever it names."""
    prompt = config_dir / "business-lines" / PROMPT_FILE
    outside = tmp_path / "secret.md"
    outside.write_text("not for the cluster\n", encoding="utf-8")
    prompt.unlink()
    prompt.symlink_to(outside)
    (problem,) = problems(config_dir)
    assert problem == (f"{config_dir / RAG}: hot_prefixes.prefixes.0.messages.0.file: {prompt} is a link to {outside}, "
                       f"outside {(config_dir / 'business-lines').resolve()}; allowed: a file inside the directory of "
                       "the line's file (copy it there)")


def test_a_prefix_file_linked_within_the_lines_directory_is_read(config_dir: Path) -> None:
    lines = config_dir / "business-lines"
    (lines / PROMPT_FILE).rename(lines / "prompt-v2.md")
    (lines / PROMPT_FILE).symlink_to("prompt-v2.md")
    (prefix,) = load_checked_project(config_dir).business_line("rag-assistant").hot_prefixes.prefixes
    assert prefix.messages[0].text == (lines / "prompt-v2.md").read_text(encoding="utf-8")


def test_a_prefix_that_may_exceed_the_model_length_is_a_warning(config_dir: Path) -> None:
    """The bound (a token per UTF-8 byte plus the template's) against --max-model-len 8192."""
    declare(config_dir, {"name": "long", "text": "x" * 8191}, {"name": "short", "text": "x" * 8190})
    project = load_checked_project(config_dir)
    (warning,) = [w for w in project.warnings if "--max-model-len" in w]
    assert warning.startswith(f"{config_dir / RAG}: hot_prefixes.prefixes.0 (long) may be longer than vllm.args "
                              "--max-model-len 8192: up to 8,192 tokens")
