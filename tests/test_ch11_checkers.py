"""Chapter 11's newer checkers: the eviction case, chunked-prefill steps, the explorer's task and
the 24x question pass their right answers (computed on the real manager and scheduler), name
typical mistakes, stage their hints, never print the answer, and every exercise the notebook
calls is listed in EXERCISES."""

from __future__ import annotations

import re

import nbformat
import pytest

from llmlab.course.check import ch11, core
from llmlab.course.check.catalog import KINDS
from llmlab.course.widgets import blocks

NOTEBOOK = "notebooks/11-vllm-arrives.ipynb"


def _fails_with(result, *words):
    assert not result.passed, result
    for w in words:
        assert w in result.message, (w, result.message)


def test_first_evicted_matches_the_free_queue_of_a_real_manager():
    queue, used, prefix = ch11.questions._evict_run()
    expected = ch11.questions._evict_expected()
    # never-used blocks first; the prefix's blocks last, in reverse order of position
    assert [bid for bid, _ in queue[-len(prefix) :]] == sorted(prefix, reverse=True)
    assert queue[expected["safe"]][0] in prefix
    assert dict(queue)[expected["first"]] is True
    assert ch11.first_evicted(dict(expected)).passed


def test_first_evicted_names_the_mistakes():
    right = ch11.questions._evict_expected()
    _, used, _ = ch11.questions._evict_run()
    _fails_with(ch11.first_evicted(dict(right, first=min(used))), "allocated first")
    _fails_with(ch11.first_evicted(dict(right, safe=ch11.EVICT_NUM_BLOCKS)), "not the last")
    _fails_with(ch11.first_evicted({"first": right["first"]}), "keys")
    _fails_with(ch11.first_evicted(dict(right, first="two")), "numbers")
    assert not ch11.first_evicted(None).passed


def test_first_evicted_gives_the_mechanism_only_from_the_second_wrong_try():
    right = ch11.questions._evict_expected()
    core._WRONG_TRIES.pop("ch11.first_evicted", None)
    first = ch11.first_evicted(dict(right, safe=right["safe"] + 5))
    second = ch11.first_evicted(dict(right, safe=right["safe"] + 5))
    assert "free() releases" not in first.message and "free() releases" in second.message


def test_chunked_prefill_steps():
    rows = blocks.chunked_prefill_schedule(
        ch11.CHUNK_PROMPT_LEN, ch11.CHUNK_BUDGET, ch11.CHUNK_DECODES
    )
    assert sum(r["prefill"] for r in rows) == ch11.CHUNK_PROMPT_LEN
    assert all(r["decode"] == ch11.CHUNK_DECODES for r in rows)
    assert all(r["prefill"] + r["decode"] <= ch11.CHUNK_BUDGET for r in rows)
    assert ch11.chunked_prefill_steps(len(rows)).passed
    naive = -(-ch11.CHUNK_PROMPT_LEN // ch11.CHUNK_BUDGET)
    assert naive != len(rows), "the case must tell the naive answer from the right one"
    _fails_with(ch11.chunked_prefill_steps(naive), "decodes")


def test_explorer_task_counts_free_cached_blocks():
    right = ch11.questions._explorer_expected()
    assert right >= 1
    assert ch11.explorer_cached_free(right).passed
    _fails_with(ch11.explorer_cached_free(0), "keep their hash")


def test_ratio_reason_needs_both_reasons_and_explains_wrong_ones():
    right = set(ch11.RATIO_CORRECT)
    assert len(ch11.RATIO_OPTIONS) > len(right)
    assert ch11.ratio_reason(right).passed
    assert ch11.ratio_reason([x.upper() for x in right]).passed
    one = sorted(right)[0]
    _fails_with(ch11.ratio_reason({one}), "not the only one")
    _fails_with(ch11.ratio_reason(one), "not the only one")
    _fails_with(ch11.ratio_reason(right | {"c"}), "more")
    # the correct letters do not sit together at the head of the options
    assert sorted(ch11.RATIO_OPTIONS)[: len(right)] != sorted(right)


@pytest.mark.parametrize(
    "fn",
    [ch11.first_evicted, ch11.chunked_prefill_steps, ch11.explorer_cached_free, ch11.ratio_reason],
)
def test_none_is_not_yet(fn):
    r = fn(None)
    assert not r.passed and "not answered" in r.message


def test_every_exercise_the_notebook_calls_is_listed():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    called = {
        m
        for c in nb.cells
        if c.cell_type == "code"
        for m in re.findall(r"ch11\.(\w+)\(answer", c.source)
    }
    assert called == set(ch11.EXERCISES)
    assert sum(info.kind == "reasoning" for info in ch11.EXERCISES.values()) >= 2
    assert all(info.kind in KINDS for info in ch11.EXERCISES.values())
    assert ch11.EXERCISES["source_q5"].source_question == 5
