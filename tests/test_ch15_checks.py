"""Chapter 15 (structured output): the hand-made mask's checker names odd answers without a crash
(the notebook's solution and the planted bugs: tests/test_planted_bugs.py); the one token exercise
2 says is forbidden is the one xgrammar forbids; the number and choice exercises;
`llmlab.analysis.structured` counts valid answers; the chapter's figures label their axes."""

from __future__ import annotations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from llmlab import i18n  # noqa: E402
from llmlab.analysis import structured  # noqa: E402
from llmlab.course.check import ch15  # noqa: E402

pytestmark = [
    pytest.mark.model,  # the real tokenizer and xgrammar's grammar for it
    pytest.mark.usefixtures("first_try"),  # each test is a student's first try, in English
]


def test_a_wrong_return_is_named_and_never_crashes():  # not a function: test_build.py
    assert "shape [2]" in ch15.allowed_tokens(lambda g, p, e: torch.ones(2, dtype=bool)).message
    assert "dtype torch.float32" in ch15.allowed_tokens(lambda g, p, e: torch.ones(len(p))).message
    assert "you allow EOS" in ch15.allowed_tokens(lambda g, p, e: [True] * len(p)).message


def test_an_all_false_mask_is_told_what_it_forbids():
    result = ch15.allowed_tokens(lambda g, p, e: torch.zeros(len(p), dtype=torch.bool))
    assert not result.passed and "you forbid" in result.message


def test_exercise_2s_answer_is_the_one_token_xgrammar_forbids(real_model):
    """The answer key is what xgrammar's mask says, not a guess: exactly one option forbidden."""
    from llmlab import LLM
    from llmlab.sampling.grammar import vocab_texts
    from llmlab.sampling.structured_output import StructuredOutputsParams

    model, tok = real_model
    manager = LLM(model, tok, max_model_len=64).llm_engine.structured_outputs()
    matcher = manager.matcher(StructuredOutputsParams(json=structured.PERSON_SCHEMA))
    assert matcher.accept_string(ch15.NEXT_STATE)
    allowed = manager.allowed(matcher)
    pieces = vocab_texts(tok, manager.vocab_size)
    forbidden = [k for k, p in ch15.NEXT_OPTIONS.items() if not allowed[pieces.index(p)]]
    assert len(forbidden) == 1
    assert ch15.forbidden_next(forbidden[0]).passed
    for key in set(ch15.NEXT_OPTIONS) - set(forbidden):
        result = ch15.forbidden_next(key)
        assert not result.passed and ch15.NEXT_OPTIONS[key][:1] in result.message


def test_mask_share_and_its_slips():
    fill = ch15.FILL_MS_PER_REQUEST * ch15.BATCH
    assert ch15.mask_share(fill / (fill + ch15.REST_MS)).passed
    assert "one request" in ch15.mask_share(0.05 / 60.05).message
    assert "divides the fill by the rest" in ch15.mask_share(fill / ch15.REST_MS).message
    assert "not a percentage" in ch15.mask_share(100 * fill / (fill + ch15.REST_MS)).message
    assert "everything but the fill" in ch15.mask_share(60 / (fill + 60)).message


def test_why_vllm_hides_it():
    assert ch15.why_vllm_hides_it("overlap").passed
    assert "C++ code on the CPU" in ch15.why_vllm_hides_it("gpu_fill").message
    assert "still fills" in ch15.why_vllm_hides_it("cached_masks").message
    assert "128k" in ch15.why_vllm_hides_it("smaller_vocab").message
    i18n.set_language("zh")
    assert "重叠" in ch15.HIDDEN_OPTIONS["overlap"]


# ------------------------------------------------------------------ llmlab.analysis.structured


def test_is_valid_parses_and_validates():
    schema = structured.PERSON_SCHEMA
    assert structured.is_valid('{"name": "Ana", "age": 30}', schema)
    assert not structured.is_valid('```json\n{"name": "Ana", "age": 30}\n```', schema)
    assert not structured.is_valid('{"name": "Ana"}', schema)  # age is required
    assert not structured.is_valid('{"name": "Ana", "age": 30, "x": 1}', schema)
    assert not structured.is_valid('{"name": "Ana", "age": 300}', schema)


def test_prompts_differ_and_use_the_chat_template(real_model):
    _, tok = real_model
    prompts = structured.person_prompts(tok, 64)
    assert len(set(prompts)) == 64 and all("<|im_start|>assistant" in p for p in prompts)
    assert len(set(structured.age_prompts(tok, 8))) == 8


def test_mask_cost_splits_decode_steps(real_model):
    from llmlab import LLM

    model, tok = real_model
    llm = LLM(model, tok, max_model_len=192, max_num_seqs=4)
    c = structured.mask_cost(llm, structured.person_prompts(tok, 4), structured.PERSON_SCHEMA, 24)
    assert c["batch"] == 4 and c["steps"] >= 5
    assert 0 < c["fill"] < c["step"] and 0 < c["apply"] < c["step"]
    assert not llm.llm_engine.has_unfinished_requests()


def test_the_figures_label_their_axes():
    from llmlab.course.figures import ch15 as fig15

    fig = fig15.plot_validity({"without": 0.1, "with": 1.0}, 16)
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == pytest.approx([10.0, 100.0])
    assert "16" in ax.get_title() and ax.get_xlabel()
    costs = {
        1: {"fill": 1e-4, "apply": 2e-4, "step": 0.03},
        64: {"fill": 5e-4, "apply": 7e-3, "step": 0.19},
    }
    ax = fig15.plot_mask_cost(costs).axes[0]
    widths = [p.get_width() for p in ax.patches]  # fill ×2, apply ×2, rest ×2
    assert widths == pytest.approx([0.1, 0.5, 0.2, 7.0, 29.7, 182.5])
    assert "measured" in ax.get_xlabel()
    assert any("3.9 %" in t.get_text() for t in ax.texts)
