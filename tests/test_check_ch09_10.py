"""Checkers of chapters 09 and 10: right answers pass, typical mistakes get a hint naming the
mistake, None is "not yet", and no message gives the answer away."""

from __future__ import annotations

import pytest

from llmlab.course.check import ch09, ch10

# the right answers, worked out by hand
ALLREDUCES = 60  # SmolLM2: 30 layers × 2 row-parallel projections
BUBBLE = 3 / 11  # p = 4, m = 8: (p − 1)/(m + p − 1)
# Llama-3-70B, batch 64, BF16: 64 · 8192 · 2 = 1,048,576 bytes; PCIe 64 GB/s one way, α = 5 µs
# TP = 8: 14 · 5 µs + 14/8 · 1,048,576 / 64e9 s = 70 µs + 28.672 µs
RING_US = 70 + 14 / 8 * 1_048_576 / 64e9 * 1e6
TPOT = (1.9 - 0.8) / 4  # tokens at 0.8 … 1.9 s, 5 tokens
MEAN_TPOT = (0.05 + 0.1) / 2  # the one-token request has no TPOT
TTLT = 0.3 + 100 * 0.05
GOODPUT = 3 / 3.0  # requests 0, 3 (one token), 4 meet both targets
STYLE = {
    "q_proj": "column",
    "k_proj": "column",
    "v_proj": "column",
    "o_proj": "row",
    "gate_proj": "column",
    "up_proj": "column",
    "down_proj": "row",
}
Q4 = {"chat": "ttft", "batch_jobs": "throughput", "code_completion": "e2el"}

CASES = [
    (ch09.allreduces_per_forward, ALLREDUCES),
    (ch09.parallel_style, STYLE),
    (ch09.bubble_fraction, BUBBLE),
    (ch09.ring_all_reduce_us, RING_US),
    (ch09.split_two_servers, {"tp": 4, "pp": 4}),
    (ch10.tpot, TPOT),
    (ch10.mean_tpot, MEAN_TPOT),
    (ch10.ttlt, TTLT),
    (ch10.goodput, GOODPUT),
    (ch10.source_q4, Q4),
]


@pytest.mark.parametrize(
    "checker,right", CASES, ids=[c[0].__module__[-4:] + "." + c[0].__name__ for c in CASES]
)
def test_right_answer_passes_and_none_is_not_yet(checker, right, capsys):
    assert checker(right).passed
    res = checker(None)
    assert not res.passed and "not answered" in res.message
    assert "[check ch" in capsys.readouterr().out  # the grader's line is printed


WRONG = [
    (ch09.allreduces_per_forward, 30, "one per layer"),
    (ch09.allreduces_per_forward, 120, "count it once"),
    (ch09.allreduces_per_forward, 61, "replicated"),
    (ch09.bubble_fraction, 3 / 8, "m + p − 1"),
    (ch09.bubble_fraction, 100 * 3 / 11, "percentage"),
    (ch09.bubble_fraction, 8 / 11, "busy fraction"),
    (ch09.ring_all_reduce_us, 70 + 14 / 8 * 1_048_576 / 128e9 * 1e6, "one direction"),
    (ch09.ring_all_reduce_us, 14 / 8 * 1_048_576 / 64e9 * 1e6, "latency term"),
    (ch09.ring_all_reduce_us, RING_US * 1e-6, "microseconds"),
    (ch09.split_two_servers, {"tp": 16, "pp": 1}, "slow link"),
    (ch09.split_two_servers, {"tp": 2, "pp": 8}, "bubble"),
    (ch09.split_two_servers, {"tp": 8, "pp": 1}, "all 16 GPUs"),
    (ch09.split_two_servers, {"tp": 8, "pp": 2}, "28 query heads"),
    (ch10.tpot, 1.9 / 5, "first-token wait"),
    (ch10.tpot, 1.1 / 5, "n − 1 gaps"),
    (ch10.tpot, TPOT * 1e3, "milliseconds"),
    (ch10.mean_tpot, (0.05 + 0.1) / 3, "as TPOT 0"),
    (ch10.mean_tpot, float("nan"), "NaN"),
    (ch10.mean_tpot, 0.35 / 5, "mean ITL"),  # gaps 0.05 ×3 and 0.1 ×2, pooled
    (ch10.ttlt, 0.3 + 101 * 0.05, "n − 1"),
    (ch10.ttlt, 100 * 0.05, "TTFT"),
    (ch10.goodput, 6 / 3.0, "throughput of all requests"),
    (ch10.goodput, 2 / 3.0, "one-token request"),
    (ch10.goodput, 5 / 3.0, "TPOT target"),
    (ch10.goodput, 4 / 3.0, "TTFT target"),
    (ch10.goodput, 3, "rate"),
]


@pytest.mark.parametrize(
    "checker,wrong,hint", WRONG, ids=[f"{c.__name__}-{h}" for c, _, h in WRONG]
)
def test_typical_mistake_gets_a_hint_naming_it(checker, wrong, hint):
    res = checker(wrong)
    assert not res.passed
    assert hint in res.message


def test_parallel_style_mistakes():
    swapped = {k: ("row" if v == "column" else "column") for k, v in STYLE.items()}
    assert "swapped" in ch09.parallel_style(swapped).message
    assert "who adds up" in ch09.parallel_style(dict.fromkeys(STYLE, "column")).message
    qkv_row = dict(STYLE, q_proj="row")
    assert "whole heads" in ch09.parallel_style(qkv_row).message
    assert "keys" in ch09.parallel_style({"q_proj": "column"}).message
    assert '"column" or "row"' in ch09.parallel_style(dict(STYLE, o_proj="diagonal")).message


def test_source_q4_hints_per_product_without_the_answer():
    res = ch10.source_q4({"chat": "throughput", "batch_jobs": "ttft", "code_completion": "tpot"})
    assert not res.passed
    for key in ("chat:", "batch_jobs:", "code_completion:"):
        assert key in res.message
    assert not any(f'"{m}"' in res.message for m in ("ttft", "throughput", "e2el"))
    assert "choose one of" in ch10.source_q4(dict(Q4, chat="vibes")).message
    assert ch10.source_q4(
        {**Q4, "chat": "TPOT", "code_completion": "TTFT"}
    ).passed  # also defensible


def _spellings(x: float) -> set[str]:
    return {f"{x:.{d}f}" for d in (1, 2, 3, 4)} | {f"{x:g}", str(x)}


@pytest.mark.parametrize("checker,right", [c for c in CASES if isinstance(c[1], (int, float))])
def test_no_message_reveals_the_answer(checker, right):
    answers = [None, right * 1.37, right * 0.5, -1, "abc"]
    answers += [w for c, w, _ in WRONG if c is checker]
    for a in answers:
        msg = checker(a).message
        for s in _spellings(right):
            if len(s.replace("0", "").replace(".", "")) >= 2:  # skip trivially short strings
                assert s not in msg, (a, msg)
