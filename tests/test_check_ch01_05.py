"""Self-checks of chapters 01–05: the right answer passes, each typical mistake gets a hint that
names it, None is "not yet", and no message gives the answer away.

Expected values are derived here from the seed text and first principles, not read from the
checkers.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from llmlab.course.check import ch01, ch02, ch03, ch04, ch05
from llmlab.course.check.core import FAIL_WORD, NOT_ANSWERED

L70_PER_LAYER = 2 * 8 * 128 * 2  # the seed: 4,096 B
L70_PER_TOKEN = L70_PER_LAYER * 80  # 327,680 B
L70_4K_GB = L70_PER_TOKEN * 4096 / 1e9  # 1.342 GB
L70_PARAMS = 70_553_706_496
SMOL_FP32 = 2 * 30 * 3 * 64 * 4  # layers 30, KV heads 3, head_dim 64, float32
DSV3 = (512 + 64) * 2 * 61  # latent + RoPE key, BF16, 61 layers

# (checker, right answer, [(typical wrong answer, word the hint must contain), ...])
NUMERIC = [
    (ch01.utf8_bytes, 6 + 1 + 1 + 6 + 1 + 5 + 1 + 4, [(14, "characters"), (21, "3 bytes")]),
    (ch01.id_bits, 16, [(15, "round"), (2, "bytes")]),
    (
        ch01.embedding_bytes,
        128256 * 4096 * 2,
        [(128256 * 4096, "parameters"), (128256 * 4096 * 4, "FP32"), (128256 * 4096 * 16, "bits")],
    ),
    (ch03.forwards, 100, [(120, "whole prompt"), (99, "first new token")]),
    (
        ch03.tokens_processed_no_cache,
        sum(20 + i for i in range(100)),
        [(120, "final length"), (100 * 120, "grows")],
    ),
    (
        ch03.temperature_prob,
        math.exp(4) / (math.exp(4) + math.exp(2) + 1),
        [
            (math.exp(2) / (math.exp(2) + math.e + 1), "temperature 1"),
            (math.exp(1) / (math.exp(1) + math.exp(0.5) + 1), "multiplied"),
        ],
    ),
    (
        ch04.kv_bytes_per_token_per_layer,
        L70_PER_LAYER,
        [
            (2 * 8192 * 2, "hidden size"),
            (2 * 8192 * 2, "bits"),
            (8 * 128 * 2, "K and V"),
            (2 * 8 * 128 * 4, "FP32"),
            (2 * 8 * 128, "numbers, not bytes"),
        ],
    ),
    (
        ch04.kv_bytes_per_token,
        L70_PER_TOKEN,
        [
            (2 * 8192 * 2 * 80, "hidden size"),
            (8 * 128 * 2 * 80, "K and V"),
            (L70_PER_LAYER, "one layer"),
            (L70_PER_TOKEN / 8, "bits"),
        ],
    ),
    (
        ch04.kv_gb_for_request,
        L70_4K_GB,
        [
            (10.7, "hidden size"),
            (L70_4K_GB / 2, "K and V"),
            (L70_4K_GB / 80, "one layer"),
            (1.25, "GiB"),
            (1.28, "mixed prefixes"),
            (L70_4K_GB * 8, "bits"),
            (L70_4K_GB * 1e9, "unit prefix"),
        ],
    ),
    (
        ch04.smollm2_kv_bytes_per_token,
        SMOL_FP32,
        [
            (2 * 576 * 30 * 4, "hidden size"),
            (SMOL_FP32 / 2, "K and V"),
            (SMOL_FP32 / 2, "2 bytes"),
            (SMOL_FP32 / 30, "one layer"),
        ],
    ),
    (
        ch04.mla_kv_bytes_per_token,
        DSV3,
        [(2 * DSV3, "no factor 2"), (512 * 2 * 61, "RoPE key"), (DSV3 / 61, "one layer")],
    ),
    (
        ch04.tokens_processed_with_cache,
        20 + 99,
        [
            (120, "never fed"),
            (100, "prefill"),
            (sum(20 + i for i in range(100)), "without the cache"),
        ],
    ),
    (ch05.decode_flops, 2 * L70_PARAMS, [(L70_PARAMS, "2 FLOPs")]),
    (ch05.decode_intensity, 48.0, [(2.0, "batch 1"), (24.0, "FP8"), (1 / 48, "upside down")]),
    (ch05.prefill_ridge_tokens, 237, [(339, "H100"), (1, "memory-bound")]),
    (ch04.max_requests_fp8, 51, [(25, "BF16"), (67, "weights"), (52, "activations")]),
    (ch04.utilization_gain, 1.2166, [(0.95 / 0.9, "whole card"), (1 / 1.2166, "upside down")]),
]

CHOICE = [
    (ch01.first_merge, "an", [("na", "more often"), ("xy", "never occurs"), ("ban", "two")]),
    (ch03.top_p_kept, {0, 1}, [({0}, "one short"), ({0, 1, 2}, "too many"), ({1, 2}, "skips")]),
    (
        ch05.write_before_read,
        "token_misses_itself",
        [
            ("same_result", "including"),
            ("cache_overflows", "same entries"),
            ("earlier_keys_overwritten", "own slot"),
        ],
    ),
    (
        ch05.cache_reads,
        ["attention"],
        [("qkv_projection", "own q, k, v"), (["attention", "ffn"], "FFN"), ("lm_head", "lm_head")],
    ),
    (ch05.short_prefill_bound, "memory", [("compute", "long prompts only")]),
]


def number_forms(x: float) -> list[str]:
    """Ways a number could be printed in a message."""
    forms = {f"{x:.3g}", f"{x:.4g}", f"{x:.2f}", f"{x:.3e}", f"{x:.2e}"}
    if float(x).is_integer():
        forms |= {str(int(x)), f"{int(x):,}"}
    return [f for f in forms if f not in {"0.00"}]


def reveals(message: str, expected) -> bool:
    if isinstance(expected, (int, float)):
        return any(
            re.search(rf"(?<![\d.,]){re.escape(f)}(?![\d])", message)
            for f in number_forms(expected)
        )
    if isinstance(expected, (set, list)):
        return any(reveals(message, e) for e in expected)
    return (
        f"'{expected}'" in message
        or f'"{expected}"' in message
        or (len(expected) > 3 and expected in message)
    )


def ids(table):
    return [t[0].__module__.rsplit(".", 1)[1] + "." + t[0].__name__ for t in table]


@pytest.mark.parametrize("checker, right, wrongs", NUMERIC + CHOICE, ids=ids(NUMERIC + CHOICE))
def test_right_answer_passes(checker, right, wrongs, capsys):
    result = checker(right)
    assert result.passed, result.message
    assert "PASS" in capsys.readouterr().out  # printed for the grader


@pytest.mark.parametrize("checker, right, wrongs", NUMERIC + CHOICE, ids=ids(NUMERIC + CHOICE))
def test_none_is_not_yet(checker, right, wrongs, capsys):
    result = checker(None)
    assert not result.passed and result.message == NOT_ANSWERED
    assert FAIL_WORD in capsys.readouterr().out


@pytest.mark.parametrize("checker, right, wrongs", NUMERIC + CHOICE, ids=ids(NUMERIC + CHOICE))
def test_typical_mistakes_get_a_hint_that_names_them_without_the_answer(checker, right, wrongs):
    for wrong, word in wrongs:
        result = checker(wrong)
        assert not result.passed, f"{wrong!r} should not pass"
        assert word.lower() in result.message.lower(), (wrong, result.message)
        assert not reveals(result.message, right), (wrong, result.message)


@pytest.mark.parametrize("checker, right, wrongs", NUMERIC, ids=ids(NUMERIC))
def test_unrelated_numbers_and_non_numbers_are_not_yet_without_the_answer(checker, right, wrongs):
    for wrong in (right * 3.7 + 11, "a string", [1, 2]):
        result = checker(wrong)
        assert not result.passed
        assert not reveals(result.message, right), (wrong, result.message)


def test_numeric_checkers_accept_numpy_and_torch_values():
    import numpy as np

    assert ch04.kv_bytes_per_token(np.int64(L70_PER_TOKEN)).passed
    assert ch04.kv_bytes_per_token(torch.tensor(float(L70_PER_TOKEN))).passed


def test_first_merge_accepts_a_pair_of_pieces():
    assert ch01.first_merge(("a", "n")).passed
    assert not ch01.first_merge(42).passed


def _attention(q, k, v):
    T, d = q.shape
    scores = q @ k.T / d**0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def test_attention_checker_passes_a_correct_function_and_diagnoses_slips():
    assert ch02.attention(_attention).passed

    def no_mask(q, k, v):
        return (q @ k.T / q.shape[1] ** 0.5).softmax(-1) @ v

    def no_scale(q, k, v):
        T = q.shape[0]
        s = (q @ k.T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    def wrong_axis(q, k, v):
        T, d = q.shape
        s = (q @ k.T / d**0.5).masked_fill(
            torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")
        )
        return s.softmax(0) @ v

    def broken(q, k, v):
        raise RuntimeError("oops")

    for fn, word in (
        (no_mask, "mask"),
        (no_scale, "scaled"),
        (wrong_axis, "axis"),
        (broken, "raised"),
        (lambda q, k, v: q.T, "must be"),
        (42, "function"),
    ):
        result = ch02.attention(fn)
        assert not result.passed and word in result.message, result.message
    assert ch02.attention(None).message == NOT_ANSWERED


@pytest.mark.model
def test_tokens_per_han_checker_uses_the_real_tokenizer():
    from llmlab.paths import DATA_DIR
    from llmlab.tokenizer import real_tokenizer

    text = (DATA_DIR / "text" / "inference_zh.txt").read_text(encoding="utf-8")
    tok = real_tokenizer()
    n_tokens = len(tok.encode(text, add_special_tokens=False))
    n_han = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    right = n_tokens / n_han
    assert ch01.tokens_per_han(right).passed
    wrong = ch01.tokens_per_han(n_han / n_tokens)
    assert not wrong.passed and "upside down" in wrong.message
    assert not reveals(wrong.message, right)
    assert ch01.tokens_per_han(None).message == NOT_ANSWERED


def test_every_chapter_has_at_least_three_exercises():
    from llmlab.course.check.core import CheckResult

    for module in (ch01, ch02, ch03, ch04, ch05):
        exercises = [
            name
            for name, obj in vars(module).items()
            if callable(obj)
            and not name.startswith("_")
            and (getattr(obj, "__module__", "") + ".").startswith(module.__name__ + ".")
            and obj.__annotations__.get("return") in ("CheckResult", CheckResult)
        ]
        assert len(exercises) >= 3, (module.__name__, exercises)
