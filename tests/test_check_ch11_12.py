"""Checkers of chapters 11 and 12: right answers pass, typical mistakes get their hint, None
is "not yet", hints never give the answer away; chapter 12's map of the seed's five questions
points at checkers that exist; and chapter 11's waste trace has the vLLM paper's shape."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from test_course import resolve

from llmlab.analysis import sim
from llmlab.course.check import ch11, ch12, core
from llmlab.course.check.core import FAIL_WORD, NOT_ANSWERED, PASS_WORD
from llmlab.tools import vllm_bridge


def _fails_with(result, *words):
    assert not result.passed, result
    for w in words:
        assert w in result.message, (w, result.message)


# ---- chapter 11 ---------------------------------------------------------------------------


def test_slot_for_position():
    table, bs, pos = ch11.SLOT_BLOCK_TABLE, ch11.SLOT_BLOCK_SIZE, ch11.SLOT_POSITION
    logical, offset = divmod(pos, bs)
    right = table[logical] * bs + offset
    assert ch11.slot_for_position(right).passed
    _fails_with(ch11.slot_for_position(pos), "logical position")
    _fails_with(ch11.slot_for_position(table[logical] + offset), "multiply")
    _fails_with(ch11.slot_for_position(table[logical] * bs + pos), "modulo")
    assert str(right) not in ch11.slot_for_position(right + 1000).message


def test_cached_tokens_counts_whole_shared_blocks_only():
    bs, shared = ch11.HIT_BLOCK_SIZE, ch11.HIT_SYSTEM_LEN
    assert shared % bs, "the exercise needs a prefix that ends inside a block"
    right = shared // bs * bs
    assert ch11.cached_tokens(right).passed
    _fails_with(ch11.cached_tokens(shared), "whole blocks")
    _fails_with(ch11.cached_tokens(-(-shared // bs) * bs), "round down")
    _fails_with(ch11.cached_tokens(shared // bs), "tokens, not blocks")


def test_source_q5_matching():
    right = {
        "block_table": "paging",
        "prefix_sharing": "shared_pages",
        "block_eviction": "lru_replacement",
        "request_scheduling": "process_scheduling",
        "preemption": "swapping",
    }
    assert ch11.source_q5(right).passed
    assert ch11.source_q5({k: v.replace("_", " ").upper() for k, v in right.items()}).passed
    assert ch11.source_q5(dict(right, block_table="demand_paging")).passed  # also defensible
    # vLLM V1 preempts by recomputing, as the chapter says: the matches for that are accepted too
    for concept in ("process_scheduling", "demand_paging"):
        assert ch11.source_q5(dict(right, preemption=concept)).passed, concept
    _fails_with(ch11.source_q5(dict(right, preemption="paging")), "recomputes")
    assert len(ch11.Q5_CONCEPTS) > len(ch11.Q5_DESIGNS)  # not a bijection
    assert list(ch11.Q5_CONCEPTS) != [
        next(iter(sorted(ch11.Q5_ACCEPTED[d]))) for d in ch11.Q5_DESIGNS
    ]
    r = ch11.source_q5(dict(right, prefix_sharing="copy_on_write"))
    assert not r.passed and "never written" in r.message  # why the tempting one is wrong
    swapped = dict(right, block_table="shared_pages", prefix_sharing="paging")
    r = ch11.source_q5(swapped)
    _fails_with(r, "block_table:", "prefix_sharing:")
    assert "block_eviction:" not in r.message
    _fails_with(ch11.source_q5(dict(right, preemption="garbage_collection")), "choose one of")
    _fails_with(ch11.source_q5({"block_table": "paging"}), "keys")
    _fails_with(ch11.source_q5(["paging"]), "dict")


@pytest.mark.parametrize(
    "fn",
    [
        ch11.slot_for_position,
        ch11.cached_tokens,
        ch11.source_q5,
        ch12.glossary_match,
        ch12.vllm_fixes,
    ],
)
def test_none_is_not_yet_and_junk_never_crashes(fn, capsys):
    r = fn(None)
    assert not r.passed and "not answered" in r.message
    assert f"] {FAIL_WORD}:" in capsys.readouterr().out  # the grader's line is printed
    for junk in ("x", 3.5, [], {"a": 1}, object()):
        assert not fn(junk).passed


def test_waste_trace_has_the_paper_shape():
    """Issue 7's acceptance on chapter 11's own trace: contiguous max-length reservation wastes
    >= 50 %, paging < 5 %."""
    trace = sim.make_trace(**ch11.WASTE_TRACE)
    w = sim.kv_memory_waste(
        trace, ch11.WASTE_MAX_MODEL_LEN, ch11.WASTE_BLOCK_SIZE, ch11.WASTE_MAX_BATCH
    )
    assert w.contiguous_waste >= 0.5
    assert w.paged_waste < 0.05
    # paging never wastes more than one partial block per live request
    assert (
        max(p - u for u, p in zip(w.used, w.paged)) < ch11.WASTE_BLOCK_SIZE * ch11.WASTE_MAX_BATCH
    )


# ---- chapter 12 ---------------------------------------------------------------------------


def test_glossary_match_accepts_any_listed_chinese_name():
    from llmlab.course.glossary import lookup

    right = {t: lookup(t).zh for t in ch12.GLOSSARY_QUIZ}
    assert ch12.glossary_match(right).passed
    assert ch12.glossary_match(dict(right, prefill="填充")).passed  # the seed's word
    r = ch12.glossary_match(dict(right, prefill=lookup("decode").zh))
    _fails_with(r, "prefill:", "'decode'")
    _fails_with(ch12.glossary_match(dict(right, decode="不存在")), "not a Chinese name")


def test_vllm_fixes():
    right = dict(
        zip(
            ch12.PROBLEMS,
            [
                "paged_attention",
                "continuous_batching",
                "chunked_prefill",
                "prefix_caching",
                "tensor_parallelism",
            ],
        )
    )
    assert ch12.vllm_fixes(right).passed
    r = ch12.vllm_fixes(dict(right, kv_fragmentation="prefix_caching"))
    _fails_with(r, "kv_fragmentation:")
    assert "paged_attention" not in r.message.split("kv_fragmentation:")[1].split(".")[0]


def test_seed_questions_point_at_real_checkers(capsys):
    assert sorted(ch12.SEED_QUESTIONS) == [1, 2, 3, 4, 5]
    for q, (text, checkers) in ch12.SEED_QUESTIONS.items():
        assert text and checkers
        for module, name in checkers:
            fn = getattr(importlib.import_module(f"llmlab.course.check.{module}"), name)
            r = fn(None)
            assert not r.passed and "not answered" in r.message, (q, module, name)
    assert PASS_WORD not in capsys.readouterr().out


def test_vllm_feature_grades_by_content_and_names_each_mistake(monkeypatch, tmp_path):
    """Any feature vLLM has and llmlab lacks passes with a file where vLLM does it; a feature
    llmlab has too names where llmlab does it; a file elsewhere is named, the way there only
    on the second try; more choices than right answers, the two kinds mixed."""
    from llmlab.tools import vllm_bridge

    monkeypatch.setenv(vllm_bridge.PYTHON_ENV, str(tmp_path / "no-python"))  # no vLLM here
    assert set(ch12.VLLM_FEATURE_CHOICES) == set(ch12.VLLM_ONLY) | set(ch12.BOTH_DO)
    kinds = [f in ch12.VLLM_ONLY for f in ch12.VLLM_FEATURE_CHOICES]
    assert kinds != sorted(kinds) and kinds != sorted(kinds, reverse=True)
    for feature, places in ch12.VLLM_ONLY.items():
        file = places[0] + ("__init__.py" if places[0].endswith("/") else "")
        assert ch12.vllm_feature({"feature": feature, "file": "/site-packages/" + file}).passed, (
            feature
        )
    for feature, ours in ch12.BOTH_DO.items():
        assert resolve(ours) is not None  # where llmlab does it is real
        result = ch12.vllm_feature({"feature": feature, "file": "vllm/v1/core/block_pool.py"})
        assert not result.passed and ours in result.message
    core._WRONG_TRIES.pop("ch12.vllm_feature", None)
    first = ch12.vllm_feature({"feature": "lora_adapters", "file": "vllm/v1/core/block_pool.py"})
    second = ch12.vllm_feature({"feature": "lora_adapters", "file": "vllm/v1/core/block_pool.py"})
    assert (
        "not where" in first.message
        and "imports" not in first.message
        and "imports" in second.message
    )
    assert "choose one" in ch12.vllm_feature({"feature": "telepathy", "file": "vllm/x.py"}).message
    assert ch12.vllm_feature(None).message == NOT_ANSWERED


@pytest.mark.vllm
@pytest.mark.skipif(
    not vllm_bridge.available(),
    reason="vLLM's environment is not there: `make vllm` adds it",
)
def test_every_place_named_for_a_vllm_feature_is_in_the_installed_vllm():
    from llmlab.tools import vllm_bridge

    for feature, places in ch12.VLLM_ONLY.items():
        for place in places:
            assert vllm_bridge.installed_path(place) is not None, (feature, place)
    assert not ch12.vllm_feature(
        {"feature": "lora_adapters", "file": "vllm/lora/not_a_file.py"}
    ).passed


# ---- chapter 12 asks the seed's questions 2-5 about fresh cases, never re-running a chapter's checker


def test_chapter_12_reruns_no_checker_of_another_chapter():
    import nbformat

    from llmlab.course.instructor import exercise_ids

    nb = nbformat.read(
        Path(__file__).resolve().parent.parent / "notebooks" / "12-glossary-and-review.ipynb",
        as_version=4,
    )
    ids = exercise_ids(nb)
    assert all(ex.startswith("ch12.") for ex in ids), ids
    for q in (2, 3, 4, 5):
        assert any(m == "ch12" for m, _ in ch12.SEED_QUESTIONS[q][1]), q


def test_kv_gb_fresh_case_names_the_mistakes():
    from llmlab.analysis import costs
    from llmlab.config import get_config

    cfg = get_config(ch12.Q2_MODEL)
    right = costs.kv_bytes_per_token(cfg, dtype_bytes=1) * ch12.Q2_TOKENS / 1e9
    assert ch12.kv_gb_fresh_case(right).passed
    _fails_with(ch12.kv_gb_fresh_case(right * 2), "FP8")
    _fails_with(ch12.kv_gb_fresh_case(right / cfg.num_hidden_layers), "one layer")
    _fails_with(ch12.kv_gb_fresh_case(right * 1e9 / 2**30), "GiB")


def test_q3_fresh_case_is_far_from_the_seeds_promise_and_names_the_kv_cache():
    ratio, bound, ratio_no_kv = ch12.fresh_cases._q3_fresh()
    assert ratio < ch12.Q3_BATCH / 2 < ratio_no_kv, (
        "long contexts must break the near-batch-fold gain"
    )
    assert ch12.q3_fresh_case({"throughput_ratio": ratio, "bound": bound}).passed
    _fails_with(ch12.q3_fresh_case({"throughput_ratio": ratio_no_kv, "bound": bound}), "KV cache")
    _fails_with(ch12.q3_fresh_case({"throughput_ratio": 1.0, "bound": bound}), "once per step")
    wrong_bound = "compute" if bound == "memory" else "memory"
    _fails_with(ch12.q3_fresh_case({"throughput_ratio": ratio, "bound": wrong_bound}), "bound:")


def test_q4_fresh_case_pulls_tpot_and_throughput_apart():
    floors = ch12.q4_floors()
    (ta, sa), (tb, sb) = floors["A"], floors["B"]
    assert ta <= ch12.Q4_TPOT_TARGET_S < tb and sb > sa, floors  # the premise of the question
    assert ch12.q4_fresh_case({"voice_assistant": "A", "overnight_summaries": "b"}).passed
    r = ch12.q4_fresh_case({"voice_assistant": "B", "overnight_summaries": "B"})
    _fails_with(r, "voice_assistant:", "TPOT")
    assert "overnight_summaries:" not in r.message


def test_q5_fresh_case_asks_mechanisms_chapter_11_did_not_list():
    assert not set(ch12.Q5_MECHANISMS) & set(ch11.Q5_DESIGNS)
    right = {k: sorted(v)[0] for k, v in ch12.Q5_ACCEPTED.items()}
    assert ch12.q5_fresh_case(right).passed
    r = ch12.q5_fresh_case(dict(right, blocks_allocated_as_tokens_arrive="swapping"))
    _fails_with(r, "blocks_allocated_as_tokens_arrive:")
