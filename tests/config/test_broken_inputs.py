"""Broken inputs end in one line naming the file, the field or line and what is allowed; exit 2;
nothing written (issue 18). Never a traceback, never silent acceptance.

Each case breaks a copy of the scenario config one way and runs ``app.py`` the way ``make synth``
does (``KVCACHE_CONFIG_DIR``, ``CDK_OUTDIR``): a config problem stops it before jsii starts, so
these runs are quick. The issue's list is the examples; the other members of each kind follow it:
every way a path can be unreadable, every YAML form that would change a value silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from capacity.project_checks import load_checked_project
from platform_config import ConfigError
from tests.example_config import REPO, edit_yaml

RAG = Path("business-lines") / "rag-assistant.yaml"
PLATFORM = Path("platform.yaml")


def app(config_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python app.py`` over ``config_dir`` into ``tmp_path/cdk.out``, as the CDK CLI runs it."""
    env = {**os.environ, "KVCACHE_CONFIG_DIR": str(config_dir), "CDK_OUTDIR": str(tmp_path / "cdk.out")}
    return subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def refused(config_dir: Path, tmp_path: Path) -> str:
    """Run app.py on a broken config: exit 2, no traceback, nothing written; its one problem line."""
    result = app(config_dir, tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cdk.out").exists() or not any((tmp_path / "cdk.out").iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".cdk.out")], "a staging directory was left"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.rstrip("\n").splitlines()[-1] == errors[0], result.stderr
    assert "<root>" not in errors[0]
    return errors[0].removeprefix("error: ")


def write(path: Path, text: str | bytes) -> None:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")


def replace_text(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


# --- the list ------------------------------------------------------------------------------

def test_a_file_that_is_not_utf8(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / RAG
    write(path, path.read_bytes().replace(b"namespace: rag-assistant", b"# caf\xe9\nnamespace: rag-assistant"))
    line = path.read_bytes()[:path.read_bytes().index(b"\xe9")].count(b"\n") + 1
    assert refused(config_dir, tmp_path) == (
        f"{path}: line {line}: not UTF-8 text: byte 0xe9 is not valid UTF-8; allowed: a text file saved as UTF-8")


def test_a_dotfile_is_ignored_and_said_so(config_dir: Path) -> None:
    """macOS copies leave ``._<name>`` AppleDouble files (binary) beside every file: it used to be read."""
    apple = config_dir / "business-lines" / "._rag-assistant.yaml"
    write(apple, b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ")
    project = load_checked_project(config_dir)
    assert [l.name for l in project.business_lines] == ["legal-search", "rag-assistant", "research-reasoning",
                                                       "ticket-triage"]
    assert project.warnings == (f"ignored {apple}: a dotfile (hidden: macOS '._' metadata, an editor's file); a "
                                "business line's file name starts with a letter or digit",)


def test_a_symlink_loop(config_dir: Path, tmp_path: Path) -> None:
    loop = config_dir / "business-lines" / "loop.yaml"
    loop.symlink_to("loop.yaml")
    assert refused(config_dir, tmp_path) == (
        f"{loop}: a symbolic link loop (it points to loop.yaml, which never reaches a file); allowed: one YAML file "
        "per business line (or a link to one)")


def test_a_directory_named_like_a_line(config_dir: Path, tmp_path: Path) -> None:
    (config_dir / "business-lines" / "x.yaml").mkdir()
    assert refused(config_dir, tmp_path) == (
        f"{config_dir / 'business-lines' / 'x.yaml'}: a directory, not a file; allowed: one YAML file per business line")


def test_a_duplicate_key(config_dir: Path, tmp_path: Path) -> None:
    """YAML keeps the last of two equal keys silently: replicas 2 then 8 used to mean 8."""
    path = config_dir / RAG
    text = path.read_text()
    write(path, text + "replicas: 8\n")
    first = text.splitlines().index("replicas: 2") + 1
    last = len(text.splitlines()) + 1
    assert refused(config_dir, tmp_path) == (
        f"{path}: line {last}: replicas: duplicate key 'replicas' (first at line {first}); YAML keeps only the last "
        "one, silently; allowed: each key once per mapping")


def test_a_duplicate_key_deep_in_a_mapping(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / PLATFORM
    replace_text(path, "    high_watermark: 0.8\n", "    high_watermark: 0.8\n    high_watermark: 0.9\n")
    message = refused(config_dir, tmp_path)
    assert message.startswith(f"{path}: line ") and ": curvine.eviction.high_watermark: duplicate key " in message


@pytest.mark.parametrize("remove", ["every file", "the directory"])
def test_no_business_line_is_refused_unless_allowed(config_dir: Path, tmp_path: Path, remove: str) -> None:
    """``orphans.py --destroy`` on a config without lines would delete every line stack."""
    lines = config_dir / "business-lines"
    for path in lines.iterdir():
        path.unlink()
    if remove == "the directory":
        lines.rmdir()
    assert refused(config_dir, tmp_path) == (
        f"{lines}: no business line (no <name>.yaml file); allowed: at least one, or allow_no_business_lines: true "
        f"in {config_dir / PLATFORM} when the platform is meant to run without lines (scripts/orphans.py --destroy "
        "then deletes every deployed line stack)")
    edit_yaml(config_dir / PLATFORM, lambda d: d.update(allow_no_business_lines=True))
    assert load_checked_project(config_dir).business_lines == ()


def test_a_line_on_an_instance_group_of_count_zero(config_dir: Path, tmp_path: Path) -> None:
    """Its replicas had no node and synthesis said nothing."""
    edit_yaml(config_dir / PLATFORM, lambda d: d["hyperpod"]["instance_groups"][1].update(instance_count=0))
    assert refused(config_dir, tmp_path) == (
        f"{config_dir / 'business-lines' / 'research-reasoning.yaml'}: instance_type: the instance group(s) of this "
        f"type the line's pods can use (p5-inference) have instance_count 0 in {config_dir / PLATFORM}, so its 1 "
        "replica(s) would have no node; allowed: instance_count 1 or more on p5-inference, or a type with nodes "
        "(ml.g6e.12xlarge) (got 'ml.p5.48xlarge')")


def test_an_unquoted_account_id(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / PLATFORM
    replace_text(path, 'account: "111122223333"', "account: 111122223333")
    assert refused(config_dir, tmp_path) == (
        f"{path}: account: not allowed; allowed: a valid string; unquoted, YAML reads 111122223333 as the number "
        '111122223333: write "111122223333" in quotes for the text (got 111122223333)')


def test_an_unquoted_account_id_with_a_leading_zero(config_dir: Path, tmp_path: Path) -> None:
    """YAML 1.1 reads 0111... as octal: another account's number, had it been an int field."""
    path = config_dir / PLATFORM
    replace_text(path, 'account: "111122223333"', "account: 011122223333")
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("account:"))
    assert refused(config_dir, tmp_path) == (
        f"{path}: line {line}: account: 011122223333 is a number only in YAML 1.1 (read here as 1229530843, octal); "
        'YAML 1.2 reads it otherwise; allowed: a plain decimal number such as 1229530843, or "011122223333" in '
        "quotes for the text")


def test_an_availability_zone_outside_the_region_is_named(config_dir: Path, tmp_path: Path) -> None:
    edit_yaml(config_dir / PLATFORM, lambda d: d.update(availability_zones=["us-west-2a", "eu-west-1b"]))
    assert refused(config_dir, tmp_path) == (
        f"{config_dir / PLATFORM}: availability_zones: eu-west-1b is not in region us-west-2; allowed: zones of "
        "us-west-2, such as us-west-2a and us-west-2b")


def test_a_hugging_face_source_without_a_commit_warns_what_can_happen(config_dir: Path) -> None:
    path = config_dir / "business-lines" / "research-reasoning.yaml"
    edit_yaml(path, lambda d: d["model"]["source"].pop("commit_sha"))
    (warning,) = load_checked_project(config_dir).warnings
    assert warning == (
        f"{path}: model.source.commit_sha is not set, so each pod downloads whatever revision of "
        "deepseek-ai/DeepSeek-R1-Distill-Llama-70B the Hub serves when it starts: after the repository changes, "
        "replicas serve different weights, and new pods read the old weights' KV from the line's L2 directory (its "
        "name covers the commit, not the weights) as cache hits; pin the 40-hex commit to rule this out")


# --- every way a path can be unreadable --------------------------------------------------------------

def test_the_config_directory_is_missing(tmp_path: Path) -> None:
    assert refused(tmp_path / "nowhere", tmp_path) == (
        f"{tmp_path / 'nowhere'}: no such directory; allowed: a config directory holding platform.yaml and "
        "business-lines/")


def test_the_config_directory_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("account: x\n")
    assert refused(file, tmp_path) == (
        f"{file}: not a directory; allowed: a config directory holding platform.yaml and business-lines/")


def test_platform_yaml_is_missing(config_dir: Path, tmp_path: Path) -> None:
    (config_dir / PLATFORM).unlink()
    assert refused(config_dir, tmp_path) == f"{config_dir / PLATFORM}: no such file; allowed: a YAML file"


def test_platform_yml_is_named_for_what_it_is(config_dir: Path, tmp_path: Path) -> None:
    (config_dir / PLATFORM).rename(config_dir / "platform.yml")
    assert refused(config_dir, tmp_path) == (
        f"{config_dir / PLATFORM}: no such file, but platform.yml is there; allowed: the name platform.yaml (rename it)")


def test_platform_yaml_is_a_directory(config_dir: Path, tmp_path: Path) -> None:
    (config_dir / PLATFORM).unlink()
    (config_dir / PLATFORM).mkdir()
    assert refused(config_dir, tmp_path) == f"{config_dir / PLATFORM}: a directory, not a file; allowed: a YAML file"


def test_business_lines_is_a_file(config_dir: Path, tmp_path: Path) -> None:
    lines = config_dir / "business-lines"
    for path in lines.iterdir():
        path.unlink()
    lines.rmdir()
    lines.write_text("rag-assistant\n")
    assert refused(config_dir, tmp_path) == (
        f"{lines}: not a directory; allowed: a directory of <name>.yaml files, one per line")


def test_a_broken_symlink(config_dir: Path, tmp_path: Path) -> None:
    link = config_dir / "business-lines" / "moved.yaml"
    link.symlink_to("/nonexistent/moved.yaml")
    assert refused(config_dir, tmp_path) == (
        f"{link}: a symbolic link to /nonexistent/moved.yaml, which does not exist; allowed: one YAML file per "
        "business line (or a link to one)")


def test_a_fifo_is_refused_not_read(config_dir: Path, tmp_path: Path) -> None:
    """Reading a FIFO waits for a writer: synthesis would hang."""
    fifo = config_dir / "business-lines" / "pipe.yaml"
    os.mkfifo(fifo)
    assert refused(config_dir, tmp_path) == (
        f"{fifo}: not a regular file (a FIFO, socket or device); allowed: one YAML file per business line")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_file_without_read_permission(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / RAG
    path.chmod(0)
    assert refused(config_dir, tmp_path) == f"{path}: not readable: permission denied"


def test_a_file_that_is_not_yaml_is_ignored_and_said_so(config_dir: Path) -> None:
    notes = config_dir / "business-lines" / "README.md"
    notes.write_text("# our lines\n")
    assert load_checked_project(config_dir).warnings == (f"ignored {notes}: not a .yaml or .yml file",)


@pytest.mark.parametrize("name", ["legal-search.YAML", "legal-search.yaml.txt", "legal-search.Yml",
                                  "rag-assistant.yaml.bak"])
def test_a_line_file_with_another_suffix_is_refused_not_dropped(config_dir: Path, tmp_path: Path, name: str) -> None:
    """Skipped, the line would vanish with exit 0 and orphans.py would delete its deployed stack
    (issue 27): refused, naming the file and the names allowed."""
    lines = config_dir / "business-lines"
    source = lines / "rag-assistant.yaml" if name.endswith(".bak") else lines / "legal-search.yaml"
    (lines / name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    if not name.endswith(".bak"):
        source.unlink()
    message = refused(config_dir, tmp_path)
    assert name in message and "allowed: <name>.yaml or <name>.yml" in message


def test_a_utf8_byte_order_mark_is_fine(config_dir: Path) -> None:
    path = config_dir / RAG
    write(path, b"\xef\xbb\xbf" + path.read_bytes())
    assert load_checked_project(config_dir).business_line("rag-assistant").namespace == "rag-assistant"


# --- every YAML form that changes a value silently -----------------------------------------------------

@pytest.mark.parametrize("written, reading", [
    ("routing_strategy: on", "on is a boolean only in YAML 1.1 (read here as true); YAML 1.2 and most other tools "
                             'read it as text; allowed: true or false, or "on" in quotes for the text'),
    ("replicas: 010", "010 is a number only in YAML 1.1 (read here as 8, octal); YAML 1.2 reads it otherwise; allowed: "
                      'a plain decimal number such as 8, or "010" in quotes for the text'),
    ("replicas: 0b11", "0b11 is a number only in YAML 1.1 (read here as 3, binary); YAML 1.2 reads it otherwise; "
                       'allowed: a plain decimal number such as 3, or "0b11" in quotes for the text'),
    ("python_hash_seed: 1:30", "1:30 is a number only in YAML 1.1 (read here as 90, base 60); YAML 1.2 reads it "
                               'otherwise; allowed: a plain decimal number such as 90, or "1:30" in quotes for the text'),
    ("python_hash_seed: 1_000", "1_000 is a number only in YAML 1.1 (read here as 1000, digits with '_' removed); "
                                "YAML 1.2 reads it otherwise; allowed: a plain decimal number such as 1000, or "
                                '"1_000" in quotes for the text'),
    ("deploy: yes", "yes is a boolean only in YAML 1.1 (read here as true); YAML 1.2 and most other tools read it as "
                    'text; allowed: true or false, or "yes" in quotes for the text'),
])
def test_yaml_11_only_forms_are_refused_with_both_readings(config_dir: Path, tmp_path: Path, written: str,
                                                           reading: str) -> None:
    path = config_dir / RAG
    key = written.split(":")[0]
    lines = [l for l in path.read_text().splitlines() if not l.startswith(f"{key}:")] + [written]
    path.write_text("\n".join(lines) + "\n")
    assert refused(config_dir, tmp_path) == f"{path}: line {len(lines)}: {key}: {reading}"


def test_an_unquoted_kubernetes_version_says_what_yaml_read(config_dir: Path, tmp_path: Path) -> None:
    """``version: 1.30`` is the float 1.3: the allowed list alone would not say why it was refused."""
    path = config_dir / PLATFORM
    replace_text(path, 'version: "1.34"', "version: 1.30")
    message = refused(config_dir, tmp_path)
    assert message.startswith(f"{path}: eks.version: not allowed; allowed: '1.28', ")
    assert message.endswith('; unquoted, YAML reads 1.30 as the number 1.3: write "1.30" in quotes for the text '
                            "(got 1.3)")


def test_an_unquoted_number_in_a_list_of_text(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / RAG
    edit_yaml(path, lambda d: d["vllm"].update(args=["/opt/ml/model", "--max-model-len", 8192]))
    assert refused(config_dir, tmp_path) == (
        f"{path}: vllm.args.2: not allowed; allowed: a valid string; unquoted, YAML reads 8192 as the number 8192: write "
        '"8192" in quotes for the text (got 8192)')


def test_an_empty_section_says_it_is_null(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / RAG
    text = path.read_text().splitlines()
    start = text.index("cache:")
    end = next(i for i in range(start + 1, len(text)) if text[i] and not text[i].startswith(" "))
    path.write_text("\n".join(text[:start + 1] + text[end:]) + "\n")
    assert refused(config_dir, tmp_path) == (
        f"{path}: cache: not allowed; allowed: a mapping (key: value lines indented below the key); the value is empty, which YAML "
        "reads as null: give a value, or remove the key to take the default")


def test_an_infinite_number_is_refused(config_dir: Path, tmp_path: Path) -> None:
    """``.inf`` passed a ``> 0`` bound: an infinite L1 buffer."""
    path = config_dir / RAG
    replace_text(path, "l1_cpu_gib: 16", "l1_cpu_gib: .inf")
    assert refused(config_dir, tmp_path) == f"{path}: cache.l1_cpu_gib: not allowed; allowed: a finite number (got inf)"


def test_several_documents_in_one_file(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / RAG
    write(path, path.read_text() + "---\nnamespace: other\n")
    message = refused(config_dir, tmp_path)
    assert message.startswith(f"{path}: line ") and "not valid YAML: expected a single document in the stream" in message


def test_a_top_level_list(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / RAG
    write(path, "- namespace: rag-assistant\n")
    assert refused(config_dir, tmp_path) == (
        f"{path}: holds a list, not a YAML mapping; allowed: key: value lines, as in the example config")


def test_dates_stay_text(config_dir: Path) -> None:
    """YAML 1.1 turns 2026-01-01 into a date; as in YAML 1.2 it stays the text a label value wants."""
    edit_yaml(config_dir / PLATFORM, lambda d: d["hyperpod"]["instance_groups"][0]["labels"].update(
        {"kvcache.io/since": "PLACEHOLDER"}))
    replace_text(config_dir / PLATFORM, "PLACEHOLDER", "2026-01-01")
    labels = load_checked_project(config_dir).platform.hyperpod.instance_groups[0].labels
    assert labels["kvcache.io/since"] == "2026-01-01"


def test_union_branch_names_stay_out_of_the_field(config_dir: Path, tmp_path: Path) -> None:
    """pydantic's locations carry the union branch (``network.create.cidr``); the user wrote ``network.cidr``."""
    edit_yaml(config_dir / PLATFORM, lambda d: d["network"].update(cidr="10.0.0.0/8"))
    message = refused(config_dir, tmp_path)
    assert message.startswith(f"{config_dir / PLATFORM}: network.cidr: '10.0.0.0/8': the prefix length must be /16 to /24")
    assert "create" not in message


def test_every_problem_of_several_files_is_one_line_each(config_dir: Path, tmp_path: Path) -> None:
    replace_text(config_dir / PLATFORM, 'account: "111122223333"', "account: 111122223333")
    (config_dir / "business-lines" / "x.yaml").mkdir()
    result = app(config_dir, tmp_path)
    assert result.returncode == 2
    errors = result.stderr.splitlines()
    assert len(errors) == 2 and all(e.startswith("error: ") for e in errors)
    with pytest.raises(ConfigError) as info:
        load_checked_project(config_dir)
    assert [f"error: {p}" for p in info.value.problems] == errors




def test_ctrl_c_during_synthesis_is_one_line_and_writes_nothing(config_dir: Path, tmp_path: Path) -> None:
    """Issue 27: Ctrl-C while the stacks are built printed a KeyboardInterrupt traceback."""
    import signal
    import time

    env = {**os.environ, "KVCACHE_CONFIG_DIR": str(config_dir), "CDK_OUTDIR": str(tmp_path / "cdk.out")}
    # A shell without job control starts background commands with SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored: so the child gets the default back, as a terminal's Ctrl-C would find it.
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)  # the config is checked; jsii and the stacks are under way
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.rstrip().splitlines()[-1].startswith("interrupted: nothing written")
    # The output folder is untouched. A staging folder beside it can remain when the interrupt lands
    # while jsii's Node process is still writing into it (seen once in a loaded fork check): not asserted.
    assert not (tmp_path / "cdk.out").exists() or not any((tmp_path / "cdk.out").iterdir())


# --- found by the mutation sweep (tests/properties/test_config_mutations.py) -------------------------

def test_a_yaml_tag_the_safe_loader_cannot_build(config_dir: Path, tmp_path: Path) -> None:
    """It was a KeyError traceback: PyYAML resolves the tag, then has no constructor for it."""
    path = config_dir / RAG
    replace_text(path, "instance_type: ml.g6e.12xlarge", "instance_type: !!python/name:os.system")
    assert refused(config_dir, tmp_path) == (
        f"{path}: line 12: instance_type: YAML tag 'tag:yaml.org,2002:python/name:os.system' is not allowed; allowed: "
        "plain values, without a '!' tag")


def test_a_section_without_the_key_that_says_its_kind(config_dir: Path, tmp_path: Path) -> None:
    """Not pydantic's "Unable to extract tag using discriminator 'type'"."""
    path = config_dir / RAG
    edit_yaml(path, lambda d: d["model"]["source"].pop("type"))
    assert refused(config_dir, tmp_path) == (
        f"{path}: model.source: the key 'type', which says what kind of section this is, is missing; allowed: "
        "type: fsx or huggingface or s3")


def test_an_unknown_key_lists_the_keys_of_its_section(config_dir: Path, tmp_path: Path) -> None:
    path = config_dir / RAG
    edit_yaml(path, lambda d: d["cache"].update(l2_sise="100Gi"))
    assert refused(config_dir, tmp_path) == (
        f"{path}: cache.l2_sise: unknown key (typo?); allowed: the keys of this section, chunk_key_generation, chunk_size_tokens, l1_cpu_gib, "
        "l1_enabled, l2_enabled, l2_size, lmcache_mode (the config reference, docs/configuration.md) (got '100Gi')")


def test_a_word_where_a_number_goes_names_the_rule_once(config_dir: Path) -> None:
    """pydantic's "a valid integer, unable to parse string as an integer" said the rule twice."""
    edit_yaml(config_dir / RAG, lambda d: d["autoscaling"].update(max_replicas="many"))
    with pytest.raises(ConfigError) as info:
        load_checked_project(config_dir)
    (problem,) = info.value.problems
    assert str(problem) == (f"{config_dir / RAG}: autoscaling.max_replicas: not allowed; allowed: a valid integer "
                            "(got 'many')")


def test_every_warning_of_a_line_is_given_not_only_the_first(config_dir: Path) -> None:
    """Hot prefixes without L2 used to hide a missing commit on the same line."""
    path = config_dir / RAG
    edit_yaml(path, lambda d: (d["cache"].update(l2_enabled=False), d.update(model={
        **d["model"], "source": {"type": "huggingface", "model_id": "Qwen/Qwen2-7B-Instruct"}})))
    warnings = [w for w in load_checked_project(config_dir).warnings if w.startswith(str(path))]
    assert [w.split(": ", 2)[1] for w in warnings] == ["hot_prefixes declares 1 prefix(es), but cache.l2_enabled is "
                                                      "false", "model.source.commit_sha is not set, so each pod "
                                                      "downloads whatever revision of Qwen/Qwen2-7B-Instruct the Hub "
                                                      "serves when it starts"]
