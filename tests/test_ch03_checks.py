"""Chapter 03's self-checks beyond the shared table in test_check_ch01_05: hints in stages, no
string of the module passes as an answer, the sampling-explorer task, and no mention of the
seed's self-check question 1 (drawing the loop with its KV-cache reads and writes is chapter 12's)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from test_ch00_checks import assert_no_literal_passes

from llmlab.course.check import ch03, core
from llmlab.course.check.core import NOT_ANSWERED

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.model
def test_no_literal_of_the_module_passes():
    assert_no_literal_passes(ch03)


def test_every_called_exercise_is_described():
    assert set(ch03.EXERCISES) == {
        "forwards",
        "tokens_processed_no_cache",
        "top_p_kept",
        "top_p_function",
        "temperature_prob",
        "samplable_tokens",
    }
    assert [i.kind for i in ch03.EXERCISES.values()].count("reasoning") >= 2
    assert all(info.source_question is None for info in ch03.EXERCISES.values())


@pytest.mark.parametrize(
    "checker, formula_word",
    [
        (ch03.forwards, "sampled token"),
        (ch03.tokens_processed_no_cache, "add them up"),
        (ch03.temperature_prob, "Softmax"),
    ],
)
def test_the_formula_comes_only_from_the_second_wrong_try(checker, formula_word):
    ex = f"ch03.{checker.__name__}"
    core._WRONG_TRIES.pop(ex, None)
    first, second = checker(12345).message, checker(12345).message
    assert formula_word not in first and formula_word in second and second.startswith(first)


def test_top_p_records_the_ids_it_expects():
    ch03.top_p_kept({0})
    assert core.expected_values("ch03.top_p_kept") == [0.0, 1.0]


def test_the_chapter_no_longer_calls_the_forward_count_the_seeds_question_1():
    import llmlab.course.check.ch03 as module

    nb = nbformat.read(ROOT / "notebooks" / "03-generation.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells) + (module.__doc__ or "")
    assert "question 1" not in text.lower()


@pytest.mark.model
def test_samplable_tokens_counts_with_the_real_model(real_model):
    from llmlab.course.widgets.sampling import next_token_distribution, prompt_logits

    model, tok = real_model
    logits = prompt_logits(ch03.EXPLORER_PROMPT, model, tok)
    want = {
        t: next_token_distribution(logits, t, -1, ch03.EXPLORER_TOP_P).num_kept
        for t in ch03.EXPLORER_TEMPERATURES
    }
    hot, cold = ch03.EXPLORER_TEMPERATURES
    assert want[cold] < want[hot]
    assert ch03.samplable_tokens(want).passed
    assert ch03.samplable_tokens({str(k): v for k, v in want.items()}).passed
    swapped = ch03.samplable_tokens({hot: want[cold], cold: want[hot]})
    assert not swapped.passed and "wrong way round" in swapped.message
    core._WRONG_TRIES.pop("ch03.samplable_tokens", None)
    same = ch03.samplable_tokens({hot: want[hot], cold: want[hot]})
    assert not same.passed and "slider" in same.message and "applied before" not in same.message
    assert "applied before" in ch03.samplable_tokens({hot: want[hot], cold: want[hot]}).message
    assert not ch03.samplable_tokens({hot: want[hot]}).passed
    assert ch03.samplable_tokens(None).message == NOT_ANSWERED
    assert sorted(core.expected_values("ch03.samplable_tokens")) == sorted(
        map(float, want.values())
    )


def _keep(probs, top_p):
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]
    return set(order[before < top_p].tolist())


def _stop_early(probs, top_p):
    order = probs.argsort(descending=True)
    return set(order[probs[order].cumsum(0) < top_p].tolist())


def _index_order(probs, top_p):
    before = probs.cumsum(0) - probs
    return set(int(i) for i in (before < top_p).nonzero().flatten())


def test_top_p_function_passes_a_right_nucleus_and_names_the_slips():
    import torch

    assert ch03.top_p_function(_keep).passed
    assert ch03.top_p_function(
        lambda p, t: torch.tensor(sorted(_keep(p, t)))
    ).passed  # a tensor of ids
    core._WRONG_TRIES.pop("ch03.top_p_function", None)
    first = ch03.top_p_function(_stop_early).message
    assert "one short" in first and "Sort" not in first
    assert "Sort" in ch03.top_p_function(_stop_early).message
    assert "index order" in ch03.top_p_function(_index_order).message


def test_top_p_cases_agree_with_the_nucleus_by_definition():
    for probs, p in ch03._top_p_cases():
        assert ch03._nucleus(probs, p) == _keep(probs, p)
