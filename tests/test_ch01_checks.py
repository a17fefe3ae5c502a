"""Chapter 01's self-checks beyond the shared table in test_check_ch01_05: hints in stages, no
string of the module passes as an answer, the token-viewer task and the vocabulary trade-off."""

from __future__ import annotations

import pytest
from test_ch00_checks import assert_no_literal_passes

from llmlab.course.check import ch01, core
from llmlab.course.check.core import NOT_ANSWERED

RIGHT_EFFECTS = {
    "embedding_table_bytes": "up",
    "bits_per_token_id": "up",
    "kv_bytes_per_token": "unchanged",
    "prompt_kv_bytes": "down",
    "lm_head_flops_per_token": "up",
    "forwards_for_the_reply": "down",
}


@pytest.mark.model
def test_no_literal_of_the_module_passes():
    assert_no_literal_passes(ch01)


def test_every_called_exercise_is_described():
    assert set(ch01.EXERCISES) == {
        "utf8_bytes",
        "first_merge",
        "merge_function",
        "tokens_per_han",
        "han_by_tokens",
        "id_bits",
        "embedding_bytes",
        "vocab_tradeoff",
    }
    assert [i.kind for i in ch01.EXERCISES.values()].count("reasoning") >= 2


def test_first_merge_hint_comes_in_stages():
    core._WRONG_TRIES.pop("ch01.first_merge", None)
    first, second = ch01.first_merge("ba").message, ch01.first_merge("ba").message
    assert "more often" in first and "Count every" not in first and "Count every" in second


def test_vocab_tradeoff_accepts_the_right_reasoning_and_names_each_slip():
    assert ch01.vocab_tradeoff(RIGHT_EFFECTS).passed
    r = ch01.vocab_tradeoff({**RIGHT_EFFECTS, "kv_bytes_per_token": "up"})
    assert (
        not r.passed
        and "layers and heads" in r.message
        and "embedding_table_bytes" not in r.message
    )
    r = ch01.vocab_tradeoff({**RIGHT_EFFECTS, "prompt_kv_bytes": "unchanged"})
    assert not r.passed and "how many tokens" in r.message
    assert ch01.vocab_tradeoff(None).message == NOT_ANSWERED
    assert not ch01.vocab_tradeoff({**RIGHT_EFFECTS, "bits_per_token_id": "sideways"}).passed


@pytest.mark.model
def test_han_by_tokens_checks_each_character_with_the_real_tokenizer():
    from llmlab.tokenizer import count_tokens, real_tokenizer

    tok = real_tokenizer()
    found = {}
    for cp in range(0x4E00, 0x9FFF):
        n = count_tokens(tok, chr(cp))
        found.setdefault(n, chr(cp))
        if len(found) == 3:
            break
    assert set(found) == {1, 2, 3}
    assert ch01.han_by_tokens(found).passed
    assert ch01.han_by_tokens({str(k): v for k, v in found.items()}).passed
    core._WRONG_TRIES.pop("ch01.han_by_tokens", None)
    swapped = ch01.han_by_tokens({1: found[2], 2: found[1], 3: found[3]})
    assert not swapped.passed and f"{found[2]} takes 2" in swapped.message
    assert "common" not in swapped.message  # the advice only on the second try
    assert "common" in ch01.han_by_tokens({1: found[2], 2: found[1], 3: found[3]}).message
    assert not ch01.han_by_tokens({1: "ab", 2: found[2], 3: found[3]}).passed
    assert not ch01.han_by_tokens({1: found[1]}).passed
    assert ch01.han_by_tokens(None).message == NOT_ANSWERED


def _merge_right(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _merge_overlapping(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        elif not (i > 0 and (ids[i - 1], ids[i]) == pair):
            out.append(ids[i])
    return out


def _merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2 :]
    return ids


def test_merge_function_passes_the_left_to_right_merge_and_names_the_slips():
    assert ch01.merge_function(_merge_right).passed
    core._WRONG_TRIES.pop("ch01.merge_function", None)
    first = ch01.merge_function(_merge_overlapping).message
    assert "overlap" in first and "Walk" not in first
    assert "fewer occurrences" in ch01.merge_function(_merge_first_only).message
    assert "Walk" in ch01.merge_function(_merge_first_only).message
    assert "returns None" in ch01.merge_function(lambda ids, pair, new_id: None).message
    assert "nothing was merged" in ch01.merge_function(lambda ids, pair, new_id: ids).message
