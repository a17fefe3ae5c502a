"""The serving benchmark client: its figures on a recorded stream equal values worked out by
hand, and against a real (tiny-model) server it sends at the arrival times, keeps to its
concurrency limit and writes its JSON."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from llmlab.analysis import metrics
from llmlab.bench import serve as bench
from llmlab.bench import serve_client as client
from llmlab.engine import LLMEngine
from llmlab.model import tiny_model
from llmlab.serve.api_server import build_app
from llmlab.serve.launch import ServerThread


def chunk(text: str, finish: str | None = None, chat: bool = False) -> str:
    piece = {"delta": {"content": text}} if chat else {"text": text}
    return "data: " + json.dumps({"choices": [dict(piece, index=0, finish_reason=finish)]})


def usage(prompt: int, completion: int) -> str:
    return "data: " + json.dumps(
        {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    )


# Four requests, as a client would have recorded them: (time, line).
# A: sent 0.0, tokens 1.0 1.5 2.0 2.5       -> TTFT 1.0, TPOT 0.5, E2EL 2.5, gaps .5 .5 .5
# B: sent 1.0, tokens 1.2 1.3               -> TTFT 0.2, TPOT 0.1, E2EL 0.3, gap .1
# C: sent 2.0, one token 2.4                -> TTFT 0.4, no TPOT,  E2EL 0.4
# D: sent 0.5, two chunks 1.5 and 3.0 carrying 5 tokens (usage) -> TTFT 1.0, E2EL 2.5,
#    TPOT (2.5 − 1.0) / (5 − 1) = 0.375, one chunk gap 1.5
# E: answered 503: a failure, left out of every figure
RECORDED = {
    "A": (
        0.0,
        [
            (0.9, ": keep-alive"),
            (1.0, chunk("The")),
            (1.5, chunk(" cat")),
            (2.0, chunk(" sat")),
            (2.5, chunk(".", "length")),
            (2.5, usage(3, 4)),
            (2.5, "data: [DONE]"),
        ],
    ),
    "B": (
        1.0,
        [
            (1.1, "data: " + json.dumps({"choices": [], "usage": None})),
            (1.2, chunk("Hi", chat=True)),
            (1.3, chunk("!", "stop", chat=True)),
            (1.3, "data: [DONE]"),
        ],
    ),
    "C": (2.0, [(2.4, chunk("", "length")), (2.4, usage(7, 1)), (2.4, "data: [DONE]")]),
    "D": (
        0.5,
        [
            (1.5, chunk("one two")),
            (3.0, chunk(" three four five", "length")),
            (3.0, usage(2, 5)),
            (3.0, "data: [DONE]"),
        ],
    ),
}


def recorded_records():
    recs = [
        client.record_stream(sent, lines, chat=(name == "B"))
        for name, (sent, lines) in RECORDED.items()
    ]
    recs.append(client.RequestRecord(sent_at=0.2, error="HTTP 503: queue full", status=503))
    return recs


def test_figures_on_a_recorded_stream_equal_hand_computed_values():
    recs = recorded_records()
    a, b, c, d, e = recs
    assert a.text == "The cat sat." and b.text == "Hi!" and a.finish_reason == "length"
    assert [r.success for r in recs] == [True, True, True, True, False]
    assert [r.output_tokens for r in recs[:4]] == [4, 2, 1, 5]  # B has no usage: its chunks
    s = client.summarize_records(
        recs, duration=4.0, slo={"ttft": 0.5, "tpot": 0.4}, prompt_lens=[0, 6, 0, 0, 0]
    )
    assert s.num_requests == 4  # E is left out
    assert s.total_output_tokens == 4 + 2 + 1 + 5
    assert s.total_input_tokens == 3 + 6 + 7 + 2  # B's from the prompt length
    assert s.request_throughput == pytest.approx(4 / 4.0)
    assert s.output_throughput == pytest.approx(12 / 4.0)
    assert s.ttft.mean == pytest.approx((1.0 + 0.2 + 0.4 + 1.0) / 4)
    assert s.ttft.median == pytest.approx((0.4 + 1.0) / 2)
    assert s.tpot.count == 3  # C has one token: no TPOT
    assert s.tpot.mean == pytest.approx((0.5 + 0.1 + 0.375) / 3)
    itls = [0.5, 0.5, 0.5, 0.1, 1.5]  # pooled chunk gaps
    assert s.itl.count == 5 and s.itl.mean == pytest.approx(sum(itls) / 5)
    assert s.itl.p99 == pytest.approx(float(np.percentile(itls, 99)))
    assert s.e2el.mean == pytest.approx((2.5 + 0.3 + 0.4 + 2.5) / 4)
    # SLO TTFT ≤ 0.5 s and TPOT ≤ 0.4 s: B (0.2, 0.1) and C (0.4, none) meet it, A and D not
    assert s.num_good == 2 and s.goodput == pytest.approx(2 / 4.0)
    out = client.summary_dict(s, recs)
    assert out["completed"] == 4 and out["failed"] == 1
    assert out["mean_ttft_ms"] == pytest.approx(650.0) and out["median_tpot_ms"] == pytest.approx(
        375.0
    )
    assert out["errors"] == ["HTTP 503: queue full"]


def test_received_bytes_split_into_lines_stamped_when_their_last_byte_came():
    # one SSE stream cut into pieces at awkward places, as TCP may deliver it
    stream = (
        f"{chunk('The')}\n\n{chunk(' cat', 'length')}\r\n\n{usage(3, 2)}\n\ndata: [DONE]\n\n"
    ).encode()
    cuts = [0, 5, 40, stream.index(b"\n") + 1, stream.index(b"[DONE]") + 2, len(stream)]
    pieces = [(float(i), stream[a:b]) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    lines = list(client.timed_lines(pieces))
    assert [line for _, line in lines] == stream.decode().replace("\r\n", "\n").split("\n")[:-1]
    # the first line ends in piece 2 (bytes 40.. hold its newline), [DONE]'s in the last
    assert lines[0][0] == 2.0 and lines[-2] == (4.0, "data: [DONE]")
    rec = client.record_stream(0.0, lines)
    assert rec.success and rec.text == "The cat" and rec.chunk_times == [2.0, 3.0]
    assert rec.completion_tokens == 2
    # a stream cut in the middle of a line: the broken line is not parsed (no JSON error)
    cut = list(client.timed_lines([(1.0, stream[: stream.index(b"cat") + 1])]))
    assert [line for _, line in cut] == [chunk("The"), ""]


def test_chunked_encoding_is_removed_piece_by_piece_keeping_arrival_times():
    payloads = [b"data: one\n\n", b"data: two, a longer one\n\n", b"data: [DONE]\n\n"]
    raw = b"".join(
        b"%x;ext=1\r\n" % len(p) + p + b"\r\n" if i == 1 else b"%x\r\n" % len(p) + p + b"\r\n"
        for i, p in enumerate(payloads)
    )
    raw += b"0\r\n\r\n"
    # cut everywhere: inside a size line, inside data, between data and its CRLF
    for cuts in ([], [1], [3, 20], [len(raw) - 3], list(range(1, len(raw), 7))):
        bounds = [0, *cuts, len(raw)]
        pieces = [(float(k), raw[a:b]) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        out = client.dechunk(pieces)
        assert b"".join(p for _, p in out) == b"".join(payloads), cuts
        # each output piece carries the time of one received piece, in order, and no more
        # payload than that piece brought
        times = [t for t, _ in out]
        assert times == sorted(set(times))
        assert all(len(p) <= len(pieces[int(t)][1]) for t, p in out)
    # the [DONE] line's last byte arrives in the last piece that carries payload
    split = raw.index(b"[DONE]") + 3
    out = client.dechunk([(0.0, raw[:split]), (1.0, raw[split:])])
    assert out[-1] == (1.0, b"NE]\n\n")
    trailing = client.dechunk([(0.0, b"5\r\nhello\r\n0\r\n\r\n"), (1.0, b"junk")])
    assert trailing == [(0.0, b"hello")]  # nothing after the last chunk


def test_a_stream_without_done_or_with_an_error_chunk_is_a_failure():
    cut = client.record_stream(0.0, [(0.1, chunk("a"))])
    assert not cut.success
    err = client.record_stream(
        0.0,
        [
            (0.1, "data: " + json.dumps({"error": {"message": "engine died"}})),
            (0.1, "data: [DONE]"),
        ],
    )
    assert not err.success and err.error == "engine died"
    with pytest.raises(RuntimeError, match="no request succeeded"):
        client.summarize_records([cut, err], duration=1.0)


def test_goodput_slos_parse_as_vllm_writes_them():
    assert client.parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 0.5, "tpot": 0.05}
    assert client.parse_goodput(None) is None
    for bad in (["ttft"], ["itl:5"], ["tpot:fast"]):
        with pytest.raises(ValueError, match="--goodput"):
            client.parse_goodput(bad)


@pytest.fixture(scope="module")
def tiny_server():
    engine = LLMEngine(
        tiny_model(seed=0), None, max_model_len=128, max_num_seqs=8, num_kv_blocks=64
    )
    with ServerThread(build_app(engine, "tiny")) as srv:
        yield srv


def test_requests_leave_at_their_arrival_times_and_within_the_concurrency_limit(tiny_server):
    reqs = client.build_requests(8, 6, dataset="random", random_input_len=12, seed=3)
    rate, limit = 40.0, 2
    before = time.perf_counter()  # the run's start is after this, never before
    records, duration = bench._run_async(
        client.run_requests(
            tiny_server.url,
            reqs,
            "tiny",
            request_rate=rate,
            max_concurrency=limit,
            seed=3,
            max_seconds=60,
            progress=False,
        )
    )
    assert all(r.success for r in records) and [r.output_tokens for r in records] == [6] * 8
    offsets = metrics.arrival_times(8, rate, 1.0, 3)
    sent = [r.sent_at - before for r in records]
    assert all(s >= o - 1e-3 for s, o in zip(sent, offsets)), "a request left before its time"
    events = sorted(
        [(r.sent_at, 1) for r in records] + [(r.chunk_times[-1], -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    in_flight, most = 0, 0
    for _, step in events:
        in_flight += step
        most = max(most, in_flight)
    assert most <= limit


def test_the_client_records_refusals_and_dead_ends_as_failures(tiny_server):
    reqs = client.build_requests(2, 4, dataset="random", random_input_len=8, seed=1)
    refused, _ = bench._run_async(
        client.run_requests(tiny_server.url, reqs, "no-such-model", max_seconds=30, progress=False)
    )
    assert [r.status for r in refused] == [404, 404] and not any(r.success for r in refused)
    assert all(r.error.startswith("HTTP 404: ") and "no-such-model" in r.error for r in refused)
    nobody, _ = bench._run_async(
        client.run_requests("http://127.0.0.1:9", reqs[:1], "tiny", max_seconds=30, progress=False)
    )
    assert not nobody[0].success and nobody[0].error.startswith("ConnectionRefusedError")
    with pytest.raises(ValueError, match="url"):
        bench._run_async(client.stream_post("ftp://host/x", {}))


def test_the_command_writes_results_with_machine_settings_and_date(tiny_server, bench_report):
    args = [
        "--base-url",
        tiny_server.url,
        "--dataset",
        "random",
        "--num-prompts",
        "6",
        "--output-len",
        "5",
        "--request-rate",
        "50,inf",
        "--goodput",
        "ttft:5000",
        "--disable-tqdm",
    ]
    report = bench_report(bench.main, args)
    assert {"machine", "settings", "date", "runs"} <= set(report)
    assert report["settings"]["model"] == "tiny" and report["settings"]["request_rates"] == [
        50.0,
        "inf",
    ]
    for run in report["runs"]:
        http = run["http"]
        assert http["completed"] == 6 and http["failed"] == 0
        assert http["total_output_tokens"] == 30 and http["total_input_tokens"] == 6 * 64
        assert http["request_goodput"] == pytest.approx(http["request_throughput"])
        assert 0 < http["median_ttft_ms"] <= http["p99_ttft_ms"]
        assert not math.isnan(http["mean_tpot_ms"])


def _summaries():
    base = [metrics.Timeline(0.0, (0.1, 0.15, 0.2)), metrics.Timeline(0.0, (0.3, 0.4, 0.5))]
    slow = [metrics.Timeline(0.0, (0.5, 0.7, 0.9)), metrics.Timeline(0.0, (0.8, 1.1, 1.4))]
    return {1.0: metrics.summarize(base), 4.0: metrics.summarize(slow)}


def test_latency_vs_load_figure_plots_the_percentiles_in_ms():
    import matplotlib

    matplotlib.use("Agg")
    from llmlab.course.widgets.metrics import plot_latency_vs_load

    s = _summaries()
    fig = plot_latency_vs_load(s, ("ttft", "tpot"))
    ttft_ax, tpot_ax = fig.axes
    assert ttft_ax.get_ylabel() == "TTFT (ms)" and "req/s" in ttft_ax.get_xlabel()
    p50 = next(line for line in ttft_ax.get_lines() if line.get_label() == "p50")
    assert list(p50.get_xdata()) == [1.0, 4.0]
    assert list(p50.get_ydata()) == pytest.approx(
        [s[1.0].ttft.median * 1e3, s[4.0].ttft.median * 1e3]
    )
    assert {line.get_label() for line in tpot_ax.get_lines()} == {"p50", "p90", "p99"}
    assert fig._suptitle.get_text()
    with pytest.raises(ValueError, match="metric"):
        plot_latency_vs_load(s, ("latency",))


def test_throughput_latency_figure_has_a_line_per_system_and_statistic():
    import matplotlib

    matplotlib.use("Agg")
    from llmlab.course.widgets.metrics import plot_throughput_latency

    s = _summaries()
    fig = plot_throughput_latency({"over HTTP": s, "in process": s}, "tpot", title="t")
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["over HTTP: p50", "over HTTP: p99", "in process: p50", "in process: p99"]
    x = ax.get_lines()[0].get_xdata()
    assert list(x) == pytest.approx([s[1.0].output_throughput, s[4.0].output_throughput])
    assert ax.get_xlabel() == "output throughput (tokens/s)" and ax.get_ylabel() == "TPOT (ms)"
    assert ax.get_title() == "t"


def test_client_nice_outside_its_range_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"--client-nice must be in \[0, 19\], got 25"):
        bench.main(["--base-url", "http://127.0.0.1:9", "--client-nice", "25", "--fast"])
