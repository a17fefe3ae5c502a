"""Chapter 12's checkers: the generation loop with its KV-cache marks (consistent with where
llmlab/model/llama.py writes and reads the cache), matching exercises with more choices than answers in
an order that is not the answers', the symptoms exercise, and the learning goals' exercise ids."""

from __future__ import annotations

import importlib
import inspect

import pytest

from llmlab.course.check import ch12
from llmlab.course.check.core import NOT_ANSWERED

RIGHT = {"prefill": [list(p) for p in ch12.LOOP_WITH_CACHE], "decode_starts_at": "embed"}


def _with(i: int, pair) -> dict:
    steps = [list(p) for p in ch12.LOOP_WITH_CACHE]
    steps[i] = list(pair)
    return {"prefill": steps, "decode_starts_at": "embed"}


def _fails(result, *words):
    assert not result.passed, result.message
    for w in words:
        assert w in result.message, (w, result.message)


def test_every_exercise_is_a_checker_and_none_is_not_answered():
    assert len(ch12.EXERCISES) >= 4
    assert sum(i.kind == "reasoning" for i in ch12.EXERCISES.values()) >= 2
    for name in ch12.EXERCISES:
        r = getattr(ch12, name)(None)
        assert not r.passed and r.message == NOT_ANSWERED
        for junk in ("x", 3.5, [], {"a": 1}, object()):
            assert not getattr(ch12, name)(junk).passed


def test_the_loop_passes_and_the_hint_names_the_first_wrong_step():
    assert ch12.generation_loop_steps(RIGHT).passed
    assert ch12.generation_loop_steps(
        {"prefill": [tuple(p) for p in ch12.LOOP_WITH_CACHE], "decode_starts_at": "Embed"}
    ).passed
    _fails(
        ch12.generation_loop_steps(_with(2, ("qkv_projection", "write"))), "step 3", "hand them on"
    )
    _fails(ch12.generation_loop_steps(_with(3, ("attention", "read"))), "step 4", "also writes")
    _fails(ch12.generation_loop_steps(_with(3, ("attention", "write"))), "step 4", "also reads")
    _fails(ch12.generation_loop_steps(_with(5, ("lm_head", "read"))), "step 6", "never touches")
    swapped = [list(p) for p in ch12.LOOP_WITH_CACHE]
    swapped[3], swapped[4] = swapped[4], swapped[3]
    _fails(
        ch12.generation_loop_steps({"prefill": swapped, "decode_starts_at": "embed"}),
        "step 4",
        "'ffn'",
    )
    with_recompute = [list(p) for p in ch12.LOOP_WITH_CACHE]
    with_recompute.insert(3, ["recompute_past_kv", "write"])
    _fails(
        ch12.generation_loop_steps({"prefill": with_recompute, "decode_starts_at": "embed"}),
        "nothing of the past is recomputed",
    )
    _fails(ch12.generation_loop_steps(dict(RIGHT, decode_starts_at="tokenize")), "already an id")
    _fails(
        ch12.generation_loop_steps(dict(RIGHT, prefill=RIGHT["prefill"][:5])), "stops after step 5"
    )


def test_the_loop_writes_and_reads_the_cache_where_the_model_does():
    """The attention step is the one that writes (reshape_and_cache) and then reads, in
    llmlab/model/llama.py and llmlab.ops; the projections only compute k and v."""
    from llmlab import model, ops

    marks = dict(ch12.LOOP_WITH_CACHE)
    assert [s for s, m in ch12.LOOP_WITH_CACHE if m != "none"] == ["attention"]
    assert marks["attention"] == "write_then_read"
    assert "ops.attention" in inspect.getsource(model.Attention.forward)
    assert "ops" not in inspect.getsource(model.Attention.qkv)
    body = inspect.getsource(ops.attention)
    assert body.index("reshape_and_cache") < body.index("_attend_step(")  # write, then read
    assert "_attend_step(" in inspect.getsource(ops.paged_attention)  # the same read
    reads = inspect.getsource(ops._attend_step)
    assert "reshape_and_cache" not in reads
    assert all(r in reads for r in ("grouped_attention(", ".paged_attention(", "is_decode"))
    assert ch12.LOOP_STEPS == tuple(s for s, _ in ch12.LOOP_WITH_CACHE)


@pytest.mark.parametrize(
    "choices, right",
    [
        (ch12.GLOSSARY_CHOICES, None),
        (ch12.FIXES, ch12.matching._FIX_RIGHT),
        (ch12.CAUSES, ch12.matching._SYMPTOM_RIGHT),
    ],
)
def test_matching_shows_more_choices_than_answers_in_an_order_not_the_answers(choices, right):
    from llmlab.course.glossary import lookup

    if right is None:  # the glossary quiz is graded by content: any listed Chinese name counts
        right = {
            t: next(n for n in (lookup(t).zh, *lookup(t).zh_aliases) if n in choices)
            for t in ch12.GLOSSARY_QUIZ
        }
    assert len(choices) > len(right)
    firsts = [sorted(v)[0] if isinstance(v, frozenset) else v for v in right.values()]
    assert all(f in choices for f in firsts)
    assert list(choices[: len(firsts)]) != firsts


def test_vllm_fixes_accepts_either_parallelism_and_says_why_a_distractor_is_wrong():
    right = {
        "kv_fragmentation": "paged_attention",
        "idle_slots_after_finish": "continuous_batching",
        "long_prompt_stalls_decodes": "chunked_prefill",
        "repeated_system_prompt": "prefix_caching",
        "model_too_big_for_one_gpu": "pipeline_parallelism",
    }
    assert ch12.vllm_fixes(right).passed
    _fails(
        ch12.vllm_fixes(dict(right, kv_fragmentation="kv_cache_quantization")),
        "kv_fragmentation:",
        "max-length reservation",
    )


def test_symptoms_pass_and_a_distractor_says_why():
    assert ch12.symptoms(dict(ch12.matching._SYMPTOM_RIGHT)).passed
    _fails(
        ch12.symptoms(
            dict(ch12.matching._SYMPTOM_RIGHT, ttft_grows_with_prompt_length="tokenizer_too_slow")
        ),
        "ttft_grows_with_prompt_length:",
        "millisecond",
    )


def test_each_learning_goal_points_at_existing_exercises():
    assert [g[0] for g in ch12.LEARNING_GOALS] == [1, 2, 3, 4]
    for number, source_words, english, ids in ch12.LEARNING_GOALS:
        assert source_words and english and len(ids) >= 2, number
        for ex in ids:
            module, name = ex.split(".")
            fn = getattr(importlib.import_module(f"llmlab.course.check.{module}"), name, None)
            assert callable(fn), f"goal {number}: {ex} is not a checker"
