"""TTFT benchmark against local streaming servers (127.0.0.1, ephemeral ports) whose first-token
delay is known: 200 ms for a prefix they have not seen, 50 ms for one they have."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from tests.tools.script_loader import load_script
from operator_tools import cli
from operator_tools.bench_ttft import BenchConfig, build_requests, endpoint_url, percentile, run

COLD_S, WARM_S, CHUNK_GAP_S = 0.200, 0.050, 0.100
PREFIX_KEY_CHARS = 60  # the run id + document index are in the first characters


class FakeServer:
    """An OpenAI-style SSE server. ``cache`` may be shared between servers (the L2 tier)."""

    def __init__(self, cache: set[str], lock: threading.Lock, *, api_key: str | None = None,
                 fail_every: int = 0, hit_delay_s: float = WARM_S) -> None:
        self.cache, self.lock, self.api_key, self.fail_every = cache, lock, api_key, fail_every
        self.hit_delay_s = hit_delay_s
        self.seen: list[tuple[str, str]] = []  # (path, "cold"|"warm")
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked streaming on keep-alive connections, as uvicorn does

            def log_message(self, *args: Any) -> None:
                pass

            def _chunk(self, data: str) -> None:
                raw = data.encode()
                self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                self.wfile.flush()

            def _refuse(self, status: int, msg: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path not in ("/v1/chat/completions", "/v1/completions"):  # as vLLM: 404 elsewhere
                    self._refuse(404, b'{"detail": "Not Found"}')
                    return
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    self._refuse(401)
                    return
                chat = self.path.endswith("/chat/completions")
                prompt = body["messages"][-1]["content"] if chat else body["prompt"]
                key = prompt[:PREFIX_KEY_CHARS]
                with server.lock:
                    warm = key in server.cache
                    server.cache.add(key)
                    server.seen.append((self.path, "warm" if warm else "cold"))
                    n = len(server.seen)
                if server.fail_every and n % server.fail_every == 0:
                    self._refuse(503, b'{"error": "overloaded"}')
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if chat:  # a role-only chunk at once: TTFT must not stop here
                    self._chunk('data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n')
                time.sleep(server.hit_delay_s if warm else COLD_S)
                for i in range(body["max_tokens"]):
                    piece = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
                    self._chunk(f"data: {json.dumps({'choices': [piece]})}\n\n")
                    time.sleep(CHUNK_GAP_S)
                self._chunk("data: [DONE]\n\n")
                self._chunk("")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def servers(n: int, **kwargs: Any) -> list[FakeServer]:
    cache: set[str] = set()
    lock = threading.Lock()
    return [FakeServer(cache, lock, **kwargs) for _ in range(n)]


@pytest.fixture
def one() -> Iterator[FakeServer]:
    (s,) = servers(1)
    yield s
    s.close()


def cfg(url: str, **kwargs: Any) -> BenchConfig:
    base = dict(base_url=url, model="m", requests=8, reuse_share=0.5, prefix_tokens=300, suffix_tokens=8,
                max_tokens=4, concurrency=2, duration_s=30, timeout_s=10)
    base.update(kwargs)
    return BenchConfig(**base)


def test_measured_ttft_matches_the_servers_delays(one: FakeServer) -> None:
    report = run(cfg(one.url))
    d = report.to_dict()
    assert d["requests"] == {"planned": 8, "cold": 4, "warm": 4, "completed": 8, "errors": 0, "skipped": 0}
    assert [k for _, k in one.seen] == ["cold"] * 4 + ["warm"] * 4
    # Lower bounds are the delays themselves. Upper bounds stay below delay + the 400 ms of content
    # chunks, so measuring at the role-only chunk (~0 ms) or at the end of the stream fails, and
    # leave 150-350 ms for loopback HTTP on a busy 2-core machine. Warm p50 stays below the cold
    # delay: the report tells the two apart.
    assert 200 <= d["cold"]["ttft_ms"]["p50"] < 550 and 200 <= d["cold"]["ttft_ms"]["p99"] < 550, d
    assert 50 <= d["warm"]["ttft_ms"]["p50"] < 200 and 50 <= d["warm"]["ttft_ms"]["p99"] < 400, d
    assert d["cold_warm_ratio"] == pytest.approx(d["cold"]["ttft_ms"]["p50"] / d["warm"]["ttft_ms"]["p50"], abs=1e-3)
    assert d["cold_warm_ratio"] > 1.0, d
    # End to end: first-token delay + 4 content chunks 100 ms apart.
    assert 200 + 4 * 100 <= d["cold"]["e2e_ms"]["p50"] < 950, d
    assert 50 + 4 * 100 <= d["warm"]["e2e_ms"]["p50"] < 800, d
    assert set(d["ttft_ms"]) == {"p50", "p90", "p99", "mean"}


def test_two_urls_cold_writes_to_a_and_warm_reads_from_b() -> None:
    a, b = servers(2)
    try:
        report = run(cfg(a.url, read_base_url=b.url, requests=6, reuse_share=0.5, endpoint="completions"))
        assert [k for _, k in a.seen] == ["cold"] * 3
        assert [k for _, k in b.seen] == ["warm"] * 3  # B never saw the prefixes: the shared cache served them
        assert {p for p, _ in a.seen + b.seen} == {"/v1/completions"}
        assert 50 <= report.to_dict()["warm"]["ttft_ms"]["p50"] < 200
    finally:
        a.close()
        b.close()


def test_without_a_shared_cache_pod_b_is_cold() -> None:
    (a,), (b,) = servers(1), servers(1)
    try:
        report = run(cfg(a.url, read_base_url=b.url, requests=4))
        assert [k for _, k in b.seen] == ["cold"] * 2
        assert 0.5 < report.cold_warm_ratio < 2.0  # no reuse across pods: ~1x, where shared L2 gives ~4x
    finally:
        a.close()
        b.close()


def test_the_duration_bound_stops_new_requests(one: FakeServer) -> None:
    started = time.monotonic()
    report = run(cfg(one.url, requests=40, reuse_share=0.1, concurrency=1, duration_s=0.5))
    elapsed = time.monotonic() - started
    d = report.to_dict()["requests"]
    assert 1 <= d["completed"] <= 4 and d["completed"] + d["skipped"] == 40
    assert elapsed < 3.0  # one request is 0.6 s; all 40 would take 24 s
    # The 4 warm requests never started: cold vs warm is not answered, and the report says why.
    assert report.unanswered is not None and "warm phase: 0 of 4" in report.unanswered
    assert "4 not started (the duration bound of 0.5 s had passed)" in report.unanswered


def test_a_plan_without_warm_requests_is_refused() -> None:
    with pytest.raises(ValueError, match="plans no warm request"):
        cfg("http://127.0.0.1:1", requests=1, reuse_share=0.5)
    with pytest.raises(ValueError, match="plans no warm request"):
        cfg("http://127.0.0.1:1", requests=40, reuse_share=0.0)


@pytest.mark.parametrize("base, expected", [
    ("http://h:8000", "http://h:8000/v1/chat/completions"),
    ("http://h:8000/", "http://h:8000/v1/chat/completions"),
    ("http://h:8000/v1", "http://h:8000/v1/chat/completions"),
    ("http://h:8000/v1/", "http://h:8000/v1/chat/completions"),
    ("https://router.example/llm/v1", "https://router.example/llm/v1/chat/completions"),
])
def test_base_url_with_or_without_v1(base: str, expected: str) -> None:
    assert endpoint_url(base) == expected
    assert endpoint_url(base, "completions") == expected.replace("chat/completions", "completions")


def test_the_openai_base_url_form_calls_v1_once(one: FakeServer) -> None:
    report = run(cfg(one.url + "/v1", requests=2))
    assert report.to_dict()["requests"]["errors"] == 0
    assert {p for p, _ in one.seen} == {"/v1/chat/completions"}


def test_http_errors_show_the_url_called(one: FakeServer) -> None:
    report = run(cfg(one.url + "/api", requests=2))
    errors = report.to_dict()["errors"]
    assert errors == [f'HTTP 404 from POST {one.url}/api/v1/chat/completions: {{"detail": "Not Found"}}']
    assert "warm phase" in report.unanswered and "no cold request succeeded" in report.unanswered


def test_errors_are_counted_not_raised() -> None:
    (s,) = servers(1, fail_every=3)
    try:
        report = run(cfg(s.url, requests=6, concurrency=1))
        d = report.to_dict()
        assert d["requests"]["errors"] == 2 and d["requests"]["completed"] == 4
        assert d["errors"] == [f'HTTP 503 from POST {s.url}/v1/chat/completions: {{"error": "overloaded"}}']
    finally:
        s.close()


def test_api_key_is_sent_and_not_reported() -> None:
    (s,) = servers(1, api_key="sk-test")
    try:
        assert run(cfg(s.url, api_key="sk-test", requests=2)).to_dict()["requests"]["errors"] == 0
        bad = run(cfg(s.url, api_key="wrong", requests=2)).to_dict()
        # The cold request is refused, so the warm one is not sent (nothing to reuse).
        assert (bad["requests"]["errors"], bad["requests"]["skipped"]) == (1, 1) and "api_key" not in bad["config"]
        assert bad["errors"][0].startswith(f"HTTP 401 from POST {s.url}/v1/chat/completions")
        assert "wrong" not in json.dumps(bad)
    finally:
        s.close()


def test_request_plan_prefixes_are_unique_per_cold_request_and_reused_by_warm() -> None:
    plan = build_requests(cfg("http://127.0.0.1:1", requests=10, reuse_share=0.7), run_id="r1")
    cold = [p for k, _, p in plan if k == "cold"]
    warm = [(i, p) for k, i, p in plan if k == "warm"]
    assert len(cold) == 3 and len(warm) == 7
    assert len({p[:PREFIX_KEY_CHARS] for p in cold}) == 3
    assert all(p.startswith(cold[i].split("\n\nQuestion")[0]) for i, p in warm)
    assert len({p for _, p in warm}) == 7  # unique suffixes
    assert len(cold[0].split("\n\nQuestion")[0].split()) == 300


def test_exact_prefix_length_with_a_tokenizer(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from operator_tools.bench_ttft import WORDS, TextMaker

    words = list(WORDS) + ["[", "]", "run", "x", "document", "0"]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    import random

    maker = TextMaker(str(path))
    text = maker.make("[run x document 0]", 250, random.Random(0))
    assert maker.count(text) == 250


def test_percentile_is_linear_interpolation() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 99) == 10 and percentile([], 50) is None
    assert percentile(list(range(101)), 90) == 90


def test_invalid_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="allowed: chat, completions"):
        cfg("http://127.0.0.1:1", endpoint="responses")
    with pytest.raises(ValueError, match="http"):
        cfg("127.0.0.1:8000")
    with pytest.raises(ValueError, match="reuse share"):
        cfg("http://127.0.0.1:1", reuse_share=2)


def test_cli_json(one: FakeServer, capsys) -> None:
    rc = load_script("bench_ttft").main(["--base-url", one.url, "--model", "m", "--requests", "4",
                                         "--prefix-tokens", "200", "--max-tokens", "2", "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert set(out["ttft_ms"]) >= {"p50", "p90", "p99"} and out["cold_warm_ratio"] > 2
    rc = load_script("bench_ttft").main(["--base-url", one.url, "--model", "m", "--requests", "2",
                                         "--prefix-tokens", "50", "--progress"])
    captured = capsys.readouterr()
    assert rc == 0 and "cold/warm TTFT (p50)" in captured.out and "2/2" in captured.err


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cli_closed_port_exits_2_and_names_the_url(capsys) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    rc = load_script("bench_ttft").main(["--base-url", url, "--model", "m", "--requests", "4", "--json"])
    captured = capsys.readouterr()
    assert rc == cli.EXIT_ERROR
    assert f"cannot reach POST {url}/chat/completions" in captured.err and "port-forward" in captured.err
    assert json.loads(captured.out)["answered"] is False


def test_cli_closed_port_prints_one_error_line(capsys) -> None:
    """The report lists failed requests as `failed` rows; the one `error:` line is the tool's, on stderr."""
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    assert load_script("bench_ttft").main(["--base-url", url, "--model", "m", "--requests", "2"]) == cli.EXIT_ERROR
    out, err = capsys.readouterr()
    lines = (out + err).splitlines()
    assert [line for line in lines if line.startswith("error:")] == err.splitlines() and err.count("\n") == 1
    assert any(line.startswith(f"failed   cannot reach POST {url}/chat/completions") for line in out.splitlines())


def test_cli_warm_phase_that_never_ran_exits_2(one: FakeServer, capsys) -> None:
    """--requests 50 --duration 1 used to skip every warm request and exit 0."""
    rc = load_script("bench_ttft").main(["--base-url", one.url, "--model", "m", "--requests", "10",
                                         "--prefix-tokens", "50", "--max-tokens", "1", "--duration", "0.3"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_ERROR
    assert "warm phase: 0 of 5 request(s) measured" in err and "raise --duration or lower --requests" in err


def test_cli_warm_not_faster_is_the_answer_no(capsys) -> None:
    (s,) = servers(1, hit_delay_s=0.300)  # a "hit" slower than a miss: reuse does not help
    try:
        rc = load_script("bench_ttft").main(["--base-url", s.url, "--model", "m", "--requests", "4",
                                             "--prefix-tokens", "50", "--max-tokens", "1"])
        out = capsys.readouterr().out
        assert rc == cli.EXIT_NO and "warm p50 is NOT faster than cold" in out
    finally:
        s.close()


def test_cli_bad_flags_name_the_flag(capsys) -> None:
    bench = load_script("bench_ttft")
    for argv, flag in ((["--requests", "0"], "--requests"), (["--reuse-share", "50"], "--reuse-share"),
                       (["--tokenizer", "/nonexistent/tokenizer.json"], "--tokenizer")):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--base-url", "http://127.0.0.1:1", "--model", "m", *argv])
        assert exc.value.code == cli.EXIT_ERROR
        err = capsys.readouterr().err
        assert f"argument {flag}:" in err
    assert "/nonexistent/tokenizer.json" in err


def test_the_tokenizer_file_is_named_when_unreadable(tmp_path) -> None:
    from operator_tools.bench_ttft import TextMaker

    with pytest.raises(FileNotFoundError, match="/nonexistent/tokenizer.json"):
        TextMaker("/nonexistent/tokenizer.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=str(bad)):
        TextMaker(str(bad))


def test_cli_plot_draws_cold_and_warm_histograms(one: FakeServer, tmp_path, capsys) -> None:
    from matplotlib.container import BarContainer

    from operator_tools.plots import bench_figure

    png = tmp_path / "ttft.png"
    rc = load_script("bench_ttft").main(["--base-url", one.url, "--model", "m", "--requests", "6",
                                         "--prefix-tokens", "50", "--max-tokens", "1", "--plot", str(png)])
    assert rc == cli.EXIT_OK and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().err.endswith(f"plot: wrote {png}\n")
    report = run(cfg(one.url, requests=6, max_tokens=1))
    ax = bench_figure(report).axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("TTFT (ms)", "requests")
    # ax.hist labels the first bar of each series; heights count requests per bin.
    bars = {c.patches[0].get_label(): sum(p.get_height() for p in c.patches) for c in ax.containers
            if isinstance(c, BarContainer)}
    assert bars == {"cold TTFT (3 requests)": 3, "warm TTFT (3 requests)": 3}
    medians = {line.get_label(): line.get_xdata()[0] for line in ax.get_lines()}
    cold_p50, warm_p50 = percentile(report.ttft("cold"), 50), percentile(report.ttft("warm"), 50)
    assert medians == {f"cold p50 {cold_p50:,.0f} ms": cold_p50, f"warm p50 {warm_p50:,.0f} ms": warm_p50}
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "cold TTFT (3 requests)", f"cold p50 {cold_p50:,.0f} ms", "warm TTFT (3 requests)",
        f"warm p50 {warm_p50:,.0f} ms"]


def test_progress_bar_only_on_a_terminal_and_never_with_json() -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    class Pipe:
        def isatty(self) -> bool:
            return False

    assert cli.progress_wanted(None, json_output=False, stream=Tty()) is True
    assert cli.progress_wanted(None, json_output=True, stream=Tty()) is False
    assert cli.progress_wanted(None, json_output=False, stream=Pipe()) is False
    assert cli.progress_wanted(True, json_output=True, stream=Pipe()) is True
    assert cli.progress_wanted(False, json_output=False, stream=Tty()) is False
