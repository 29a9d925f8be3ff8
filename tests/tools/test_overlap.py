"""Overlap analysis on small logs with exactly known answers, using a word-level tokenizer
built in-process (no hub downloads): every word ``w<i>`` and every ChatML marker is one token."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.tools.script_loader import load_script
from operator_tools import cli
from operator_tools.overlap import (
    COMPLETION,
    NO_SYSTEM,
    ApproxTokenizer,
    HFTokenizer,
    analyse,
    analyse_file,
    format_report,
)

SPECIALS = ["<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    vocab = {"[UNK]": 0, "system": 1, "user": 2, "assistant": 3}
    vocab.update({f"w{i}": 4 + i for i in range(5000)})
    vocab.update({s: len(vocab) + n for n, s in enumerate(SPECIALS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tok(tokenizer_path: Path) -> HFTokenizer:
    return HFTokenizer(tokenizer_path)


def words(start: int, n: int) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


def chat(system: str | None, user: str) -> str:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user}]
    return json.dumps({"model": "m", "messages": messages, "stream": True})


def test_chatml_tokens_are_counted_exactly(tok: HFTokenizer) -> None:
    # <|im_start|> system w.. <|im_end|> = 1 + 1 + 512 + 1; user turn 1 + 1 + 100 + 1; generation prompt 2.
    report = analyse([chat(words(0, 512), words(1000, 100))], tokenizer=tok)
    assert report.prompt_tokens == 515 + 103 + 2 == 620 and report.exact


def test_shared_system_prompt_is_served_in_whole_chunks(tok: HFTokenizer) -> None:
    system = words(0, 512)  # tokens 0..514 are the system turn: chunks 0 and 1 (tokens 0..511) shared
    log = [chat(system, words(1000 + 100 * i, 100)) for i in range(4)]
    report = analyse(log, tokenizer=tok)
    assert report.requests == 4 and report.prompt_tokens == 4 * 620
    assert report.served_tokens == 3 * 512  # the first request pays, the next three hit 2 chunks each
    assert report.share == pytest.approx(1536 / 2480)
    assert report.requests_with_hit == 3
    assert report.to_dict()["above_threshold"] is True


def test_partial_chunks_are_not_served_and_chunk_size_matters(tok: HFTokenizer) -> None:
    log = [chat(words(0, 300), words(1000 + 50 * i, 50)) for i in range(2)]  # 302 shared leading tokens
    assert analyse(log, tokenizer=tok).served_tokens == 256
    assert analyse(log, tokenizer=tok, chunk_tokens=128).served_tokens == 256
    assert analyse(log, tokenizer=tok, chunk_tokens=100).served_tokens == 300


def test_only_leading_tokens_count(tok: HFTokenizer) -> None:
    # Same tokens 256..767 but different first chunk: a prefix cache serves nothing.
    a = json.dumps({"prompt": words(0, 256) + " " + words(2000, 512)})
    b = json.dumps({"prompt": words(300, 256) + " " + words(2000, 512)})
    report = analyse([a, b], tokenizer=tok)
    assert report.served_tokens == 0 and report.share == 0.0
    assert report.to_dict()["above_threshold"] is False
    assert "below the ~40% adoption threshold" in report.verdict


def test_per_system_prompt_groups(tok: HFTokenizer) -> None:
    log = [chat("w1 " + words(10, 600), words(1000 + i * 10, 10)) for i in range(3)]
    log += [chat("w2 " + words(10, 600), words(2000, 10))]
    log += [chat(None, words(3000, 10)), json.dumps({"prompt": words(0, 300)})]
    report = analyse(log, tokenizer=tok)
    groups = {g.label: g for g in report.groups.values()}
    first = next(g for label, g in groups.items() if label.startswith("w1 w10 w11"))
    assert first.requests == 3 and first.served_tokens == 2 * 512
    assert first.label.endswith("...") and len(first.label) == 60
    second = next(g for label, g in groups.items() if label.startswith("w2 "))
    assert second.served_tokens == 0  # its first token differs, so no chunk is shared
    assert groups[NO_SYSTEM].requests == 1 and groups[COMPLETION].requests == 1


def test_malformed_lines_are_counted_never_fatal(tok: HFTokenizer) -> None:
    good = chat(words(0, 300), "w1")
    log = [good, "{not json", "[1, 2]", json.dumps({"model": "m"}), "", json.dumps({"messages": "hi"}),
           json.dumps({"prompt": [1.5]}), json.dumps({"messages": [{"role": "user", "content": 7}]}), good]
    report = analyse(log, tokenizer=tok)
    assert report.requests == 2 and report.served_tokens == 256
    assert dict(report.malformed) == {"invalid JSON": 1, "not a JSON object": 1, "no messages or prompt": 1,
                                      "bad messages": 1, "bad prompt": 1, "bad message content": 1}
    assert report.malformed_lines == [2, 3, 4, 6, 7, 8]
    assert "6 lines skipped" in format_report(report)


def test_batch_api_lines_token_id_prompts_and_prompt_batches(tok: HFTokenizer) -> None:
    ids = list(range(4, 4 + 512))
    log = [json.dumps({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": words(0, 10)}]}}),
           json.dumps({"prompt": ids}),
           json.dumps({"prompt": [ids, ids[:300]]})]
    report = analyse(log, tokenizer=tok)
    assert report.requests == 4
    assert report.served_tokens == 512 + 256


def test_the_cache_bound_holds_and_is_reported(tok: HFTokenizer) -> None:
    # Two prefixes alternating with room for one chunk key: every lookup misses.
    log = [json.dumps({"prompt": words(0 if i % 2 else 1000, 256)}) for i in range(6)]
    bounded = analyse(log, tokenizer=tok, max_cached_chunks=1)
    assert bounded.served_tokens == 0 and bounded.cached_chunks == 1 and bounded.evictions == 5
    assert "lower bound" in bounded.verdict
    unbounded = analyse(log, tokenizer=tok)
    assert unbounded.served_tokens == 4 * 256 and unbounded.evictions == 0


def test_the_log_is_streamed_not_loaded(tok: HFTokenizer) -> None:
    consumed = []

    def lines():
        for i in range(1000):
            consumed.append(i)
            yield json.dumps({"prompt": words(0, 256) + f" w{1000 + i}"})

    report = analyse(lines(), tokenizer=tok, batch_size=64, max_cached_chunks=16)
    assert report.requests == 1000 and report.served_tokens == 999 * 256
    assert report.cached_chunks == 1 and len(consumed) == 1000


def test_prompt_length_distribution(tok: HFTokenizer) -> None:
    log = [json.dumps({"prompt": words(0, n)}) for n in (10, 100, 300, 300, 1000)]
    d = analyse(log, tokenizer=tok).to_dict()["prompt_length"]
    assert (d["p50"], d["p90"], d["p99"], d["max"], d["mean"]) == (300, 1000, 1000, 1000, 342.0)
    assert d["histogram"] == [{"min": 0, "max": 255, "requests": 2}, {"min": 256, "max": 511, "requests": 2},
                              {"min": 512, "max": 1023, "requests": 1}]


def test_without_a_tokenizer_the_approximation_is_labelled() -> None:
    report = analyse([json.dumps({"prompt": "abcd" * 1000})] * 2)
    assert not report.exact and "approximation" in report.tokenizer
    assert report.prompt_tokens == 2000 and report.served_tokens == 768  # 3 whole chunks of 256
    assert "approximate" in report.verdict
    assert ApproxTokenizer().encode_batch(["abcde"])[0].length == 2


def test_invalid_parameters_are_rejected() -> None:
    with pytest.raises(ValueError, match="chunk_tokens"):
        analyse([], chunk_tokens=0)
    with pytest.raises(ValueError, match="allowed: chatml, plain"):
        analyse([], template="llama")


def test_cli_json_and_exit_codes(tokenizer_path: Path, tmp_path: Path, capsys) -> None:
    log = tmp_path / "requests.jsonl.gz"
    with gzip.open(log, "wt", encoding="utf-8") as fh:
        for i in range(4):
            fh.write(chat(words(0, 512), words(1000 + 100 * i, 100)) + "\n")
        fh.write("garbage\n")
    overlap = load_script("overlap")
    assert overlap.main([str(log), "--tokenizer", str(tokenizer_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["share"] == pytest.approx(0.6194, abs=1e-4) and out["exact_tokens"] is True
    assert out["malformed"]["count"] == 1 and out["chunk_tokens"] == 256
    assert overlap.main([str(log), "--tokenizer", str(tokenizer_path), "--threshold", "0.9"]) == 1
    text = capsys.readouterr().out
    assert "below the ~90% adoption threshold" in text and "system prompt" in text
    assert overlap.main([str(tmp_path / "missing.jsonl")]) == 2
    assert f"no such file: {tmp_path / 'missing.jsonl'}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse: exit 2, naming the flag and the path
        overlap.main([str(log), "--tokenizer", str(tmp_path / "nope.json")])
    assert exc.value.code == 2
    assert f"argument --tokenizer: no such file: {tmp_path / 'nope.json'}" in capsys.readouterr().err


def test_analyse_file_reads_plain_files(tmp_path: Path, tok: HFTokenizer) -> None:
    log = tmp_path / "r.jsonl"
    log.write_text("\n".join(json.dumps({"prompt": words(0, 512)}) for _ in range(2)) + "\n")
    assert analyse_file(log, tokenizer=tok).served_tokens == 512


@pytest.mark.parametrize("given, share", [("0.4", 0.4), ("40%", 0.4), ("42.5%", 0.425), (" 35 % ", 0.35),
                                          ("1", 1.0), ("0", 0.0), ("100%", 1.0)])
def test_threshold_is_a_fraction_or_an_explicit_percentage(given: str, share: float) -> None:
    assert cli.parse_fraction(given) == pytest.approx(share)


@pytest.mark.parametrize("given, message", [
    ("40", "40 is not a fraction within 0..1; for 40% write 0.4 or 40%"),
    ("1.5", "for 1.5% write 0.015 or 1.5%"),
    ("140%", "140% is outside 0..1"),
    ("-0.1", "-0.1 is outside 0..1"),
    ("forty", "'forty' is not a share"),
])
def test_threshold_anything_else_is_refused_with_the_flag(given: str, message: str, tmp_path: Path,
                                                           capsys) -> None:
    """``--threshold 40`` used to be accepted and reported as "below the ~4000% threshold"."""
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(SystemExit) as exc:
        load_script("overlap").main([str(log), "--threshold", given])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --threshold:" in err and message in err


def test_threshold_as_percentage_on_the_command_line(tokenizer_path: Path, tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl"
    log.write_text("\n".join(chat(words(0, 512), words(1000 + 100 * i, 100)) for i in range(4)) + "\n")
    overlap = load_script("overlap")
    assert overlap.main([str(log), "--tokenizer", str(tokenizer_path), "--threshold", "62%"]) == 1
    assert "61.9% is below the ~62% adoption threshold" in capsys.readouterr().out
    assert overlap.main([str(log), "--tokenizer", str(tokenizer_path), "--threshold", "61.5%", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["threshold"] == 0.615


def test_analyse_refuses_a_percentage_as_threshold() -> None:
    with pytest.raises(ValueError, match="outside 0..1; it is a share"):
        analyse([], threshold=40)


@pytest.mark.parametrize("content", ["", "\n\n", "{not json\n" + json.dumps({"model": "m"}) + "\n"])
def test_cli_empty_input_exits_2(content: str, tmp_path: Path, capsys) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_text(content)
    assert load_script("overlap").main([str(log)]) == cli.EXIT_ERROR
    captured = capsys.readouterr()
    assert f"error: no usable request in {log}" in captured.err and captured.out == ""


def test_cli_chunk_size_zero_names_the_flag(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        load_script("overlap").main([str(tmp_path / "r.jsonl"), "--chunk-size", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --chunk-size: must be >= 1 (got 0)" in err and "chunk_tokens" not in err


def test_shared_prefix_distribution(tok: HFTokenizer) -> None:
    log = [chat(words(0, 512), words(1000 + 100 * i, 100)) for i in range(4)]  # 620 tokens each
    report = analyse(log, tokenizer=tok)
    assert dict(report.shared_lengths) == {0: 1, 512: 3}
    assert dict(report.shared_percent) == {0: 1, 512 * 100 // 620: 3}  # 82%


def test_cli_plot_draws_the_distribution_against_the_threshold(tokenizer_path: Path, tok: HFTokenizer,
                                                                tmp_path: Path, capsys) -> None:
    from matplotlib.container import BarContainer

    from operator_tools.plots import overlap_figure

    log = tmp_path / "r.jsonl"
    log.write_text("\n".join(chat(words(0, 512), words(1000 + 100 * i, 100)) for i in range(4)) + "\n")
    svg = tmp_path / "overlap.svg"
    assert load_script("overlap").main([str(log), "--tokenizer", str(tokenizer_path), "--plot", str(svg),
                                        "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["share"] > 0 and err == f"plot: wrote {svg}\n"  # stdout stays one JSON document
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text

    report = analyse_file(log, tokenizer=tok)
    share_ax, length_ax = overlap_figure(report).axes
    assert share_ax.get_xlabel() == "shared prefix (% of the request's prompt tokens)"
    assert length_ax.get_xlabel() == "shared prefix length (tokens)"
    assert share_ax.get_ylabel() == length_ax.get_ylabel() == "requests"
    lines = {line.get_label(): line.get_xdata()[0] for line in share_ax.get_lines()}
    assert lines == {"adoption threshold 40%": 40.0, "overall share 61.9%": pytest.approx(61.94, abs=0.01)}

    def bars(ax, centre: bool):  # bin left edge (or bar centre) -> requests, for the non-empty bars
        (container,) = [c for c in ax.containers if isinstance(c, BarContainer)]
        return {p.get_x() + (p.get_width() / 2 if centre else 0): p.get_height()
                for p in container.patches if p.get_height()}

    assert bars(share_ax, centre=False) == {0.0: 1, 80.0: 3}  # one request served nothing, three 82%
    assert bars(length_ax, centre=True) == {0.0: 1, 512.0: 3}


def test_cli_progress_bar_on_request(tmp_path: Path, capsys) -> None:
    log = tmp_path / "r.jsonl.gz"
    with gzip.open(log, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(json.dumps({"prompt": words(0, 300)}) for _ in range(50)) + "\n")
    overlap = load_script("overlap")
    assert overlap.main([str(log), "--progress", "--json"]) == 0
    err = capsys.readouterr().err
    # Measured in bytes of the file on disk (compressed bytes for .gz), so it reaches 100% exactly.
    assert "overlap: 100%" in err and "B/s" in err
    assert overlap.main([str(log), "--json"]) == 0  # not a terminal: no bar
    assert capsys.readouterr().err == ""


def test_a_truncated_gz_is_an_error_not_a_low_share(tmp_path: Path, capsys) -> None:
    """A log cut off mid-copy used to end in an EOFError traceback and exit 1, the code that means
    "below the threshold". Part of a log would give a wrong answer: exit 2, naming the file."""
    body = "".join(json.dumps({"messages": [{"role": "system", "content": "s" * 3000},
                                            {"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(200))
    whole = gzip.compress(body.encode())
    log = tmp_path / "requests.jsonl.gz"
    log.write_bytes(whole[:len(whole) // 2])
    assert load_script("overlap").main([str(log)]) == cli.EXIT_ERROR
    assert capsys.readouterr().err == (f"error: {log} ends before the end of its gzip stream (truncated, or still being "
                                       "written); allowed: a complete .gz file, or the uncompressed log\n")
    log.write_bytes(b"plain text, not gzip")
    assert load_script("overlap").main([str(log)]) == cli.EXIT_ERROR
    assert capsys.readouterr().err.startswith(f"error: {log} is not a readable gzip file (")


# --- routing advice (issue 29 item 2) ----------------------------------------------------------------------

SYSTEM = "You are the assistant of Example Corp. " + words(4000, 1200)  # ~1,500 approximate tokens


def chat_line(messages: list[dict], **fields) -> str:
    return json.dumps({"model": "m", "messages": messages, **fields})


def advice_of(lines: list[str], **kwargs):
    return analyse(lines, tokenizer=ApproxTokenizer(), **kwargs).routing


def test_one_system_prompt_shared_by_all_is_never_routed_prefixaware() -> None:
    lines = [chat_line([{"role": "system", "content": SYSTEM}, {"role": "user", "content": words(10 * i, 10) * 60}],
                       user=f"u{i}") for i in range(200)]
    advice = advice_of(lines)
    assert advice.hot_spot and advice.strategy == "roundrobin" and advice.ideal == "load only"
    assert any("one replica" in r for r in advice.reasons)


def test_without_a_shared_first_chunk_there_is_no_hot_spot() -> None:
    lines = [chat_line([{"role": "user", "content": f"question {i}: " + words(10 * i, 10) * 60}]) for i in range(200)]
    assert not advice_of(lines).hot_spot


def conversations(sessions: int, turns: int) -> list[str]:
    lines, history = [], {s: [{"role": "system", "content": "Be brief."}] for s in range(sessions)}
    for t in range(turns):
        for s in range(sessions):
            history[s] = history[s] + [{"role": "user", "content": f"s{s} t{t} " + words(100 * s + t, 5) * 100}]
            lines.append(chat_line(history[s], user=f"session-{s}"))
            history[s] = history[s] + [{"role": "assistant", "content": words(200 * s + t, 5) * 40}]
    return lines


def test_reuse_within_sessions_is_routed_by_session() -> None:
    advice = advice_of(conversations(40, 5))
    assert advice.strategy == "session" and advice.ideal == "session affinity"
    # The same log without session ids: the reuse is no longer attributable to a session.
    anonymous = [json.dumps({k: v for k, v in json.loads(line).items() if k != "user"})
                 for line in conversations(40, 5)]
    assert advice_of(anonymous).strategy != "session"


def documents_log(system: str | None) -> list[str]:
    docs = [f"document {d}: " + words(50 * d, 50) * 40 for d in range(20)]  # ~3,000 approximate tokens each
    head = [{"role": "system", "content": system}] if system else []
    return [chat_line(head + [{"role": "user", "content": docs[(7 * i) % 20] + f"\nquestion {i}?"}], user=f"u{i}")
            for i in range(300)]


def test_per_document_reuse_wants_prefix_affinity_with_a_load_bound() -> None:
    with_l2 = advice_of(documents_log(SYSTEM))
    assert with_l2.ideal == "prefix affinity with a load bound" and with_l2.strategy == "roundrobin"
    assert with_l2.hot_spot
    # Without the L2 affinity saves the whole recompute: prefixaware, unless a shared first chunk hot-spots it.
    assert advice_of(documents_log(SYSTEM), l2=False).strategy == "roundrobin"
    no_head = advice_of(documents_log(None), l2=False)
    assert no_head.strategy == "prefixaware" and not no_head.hot_spot


def test_prompts_shorter_than_the_l2_break_even_are_routed_by_load() -> None:
    lines = [chat_line([{"role": "system", "content": words(0, 300)}, {"role": "user", "content": f"q{i}"}])
             for i in range(100)]
    advice = advice_of(lines)
    assert advice.strategy == "roundrobin" and "break-even" in advice.reasons[-1]
    assert advice_of(lines, break_even_tokens=100).reasons[-1] != advice.reasons[-1]


def test_the_report_prints_the_routing_advice(tok: HFTokenizer) -> None:
    report = analyse(documents_log(SYSTEM), tokenizer=ApproxTokenizer())
    text = format_report(report)
    assert "routing       roundrobin (the traffic wants prefix affinity with a load bound" in text
    assert report.to_dict()["routing"]["strategy"] == "roundrobin"


def test_per_document_reuse_is_routed_by_the_gateway_when_the_platform_runs_it() -> None:
    """With the HyperPod Inference Gateway on (``--gateway``), per-document reuse gets ``gateway``: prefix
    affinity with a load bound, which no CRD strategy has, L2 or not; the other rules keep their advice."""
    for l2 in (True, False):
        advice = advice_of(documents_log(SYSTEM), l2=l2, gateway=True)
        assert advice.strategy == "gateway" and advice.ideal == "prefix affinity with a load bound", l2
        assert advice.hot_spot  # still reported: prefixaware would hot-spot this log
        assert "HyperPod Inference Gateway" in advice.reasons[-1]
    assert advice_of(documents_log(SYSTEM)).strategy == "roundrobin"  # without the gateway: unchanged
    assert advice_of(conversations(40, 5), gateway=True).strategy == "session"
    short = [chat_line([{"role": "system", "content": words(0, 300)}, {"role": "user", "content": f"q{i}"}])
             for i in range(100)]
    assert advice_of(short, gateway=True).strategy == "roundrobin"


def test_the_gateway_flag_reaches_the_advice(tmp_path: Path, capsys) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(documents_log(SYSTEM)) + "\n")
    overlap = load_script("overlap")
    overlap.main([str(log), "--json", "--gateway"])
    assert json.loads(capsys.readouterr().out)["routing"]["strategy"] == "gateway"
    overlap.main([str(log), "--json"])
    assert json.loads(capsys.readouterr().out)["routing"]["strategy"] == "roundrobin"
