"""Overlap analysis on small logs with exactly known answers, using a word-level tokenizer
built in-process (no hub downloads): every word ``w<i>`` and every ChatML marker is one token."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.tools.script_loader import load_script
from kv_tools.overlap import (
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
    assert overlap.main([str(log), "--tokenizer", str(tmp_path / "nope.json")]) == 2


def test_analyse_file_reads_plain_files(tmp_path: Path, tok: HFTokenizer) -> None:
    log = tmp_path / "r.jsonl"
    log.write_text("\n".join(json.dumps({"prompt": words(0, 512)}) for _ in range(2)) + "\n")
    assert analyse_file(log, tokenizer=tok).served_tokens == 512
