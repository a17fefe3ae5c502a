"""Chapter 04's newer checkers: the learner's cached generation loop (graded by its text against
generate_with_cache), the KV-calculator task and the utilisation question."""

import pytest

from llmlab.course.check import ch04
from llmlab.course.check.core import NOT_ANSWERED
from llmlab.engine.generate import generate_with_cache
from llmlab.sampling import SamplingParams


def _greedy_tokens(model, tok):
    ids = tok.encode(ch04.GEN_PROMPT, add_special_tokens=False)
    return generate_with_cache(
        model,
        ids,
        max_new_tokens=ch04.GEN_NEW_TOKENS,
        params=SamplingParams(temperature=0.0, ignore_eos=True),
    ).token_ids


@pytest.mark.slow
def test_generate_greedy_passes_the_reference_text_and_names_each_slip(real_model):
    model, tok = real_model
    out = _greedy_tokens(model, tok)
    right = tok.decode(out)
    assert ch04.generate_greedy(right).passed
    assert ch04.generate_greedy(None).message == NOT_ANSWERED
    assert "str" in ch04.generate_greedy([1, 2]).message
    assert "without the prompt" in ch04.generate_greedy(ch04.GEN_PROMPT + right).message
    # one token fewer: the right start, counted (the slips of a loop: tests/test_planted_bugs.py);
    # a greedy loop stopped a token early gives the same run's first 11 tokens
    fewer = tok.decode(out[:-1])
    assert f"only 11 of the {ch04.GEN_NEW_TOKENS}" in ch04.generate_greedy(fewer).message
    assert "first token already differs" in ch04.generate_greedy("zzz" + right).message
    assert "later ones differ" in ch04.generate_greedy(right[:-3] + "zzz").message


def test_budget_checkers_name_the_mistake_before_the_formula():
    from llmlab.course.check import core

    core._WRONG_TRIES.pop("ch04.max_requests_fp8", None)  # other tests may have tried it
    assert ch04.max_requests_fp8(51).passed
    first = ch04.max_requests_fp8(7)
    assert not first.passed and "utilisation ×" not in first.message
    second = ch04.max_requests_fp8(7)
    assert "utilisation ×" in second.message and "51" not in second.message
    assert ch04.utilization_gain(1.2166).passed
    assert "whole card" in ch04.utilization_gain(0.95 / 0.90).message
