"""llmlab.analysis.step_time: the operators a step runs are counted (views and allocations
left out), the skeleton of a model runs the same operators, the host split of a decode step adds
up, multi-step scheduling's gain is measured with each span run as it was told, the union of
kernel intervals counts overlaps once, the recorded GPU run reads back, and without a GPU the GPU
measurements say so (None). On a GPU (marked `gpu`): graphs on and off
both measured, and decode kernels timed."""

from __future__ import annotations

import pytest
import torch

from llmlab.analysis import step_time
from llmlab.config import tiny_config
from llmlab.model import tiny_model

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_count_ops_counts_what_computes_not_views_or_allocations():
    x = torch.randn(4, 4)
    counts = step_time.count_ops(lambda: (x.view(16).add(1), x.t(), torch.empty(3), x @ x))
    assert counts == {"add.Tensor": 1, "mm.default": 1}, counts  # no view, t or empty


def test_the_skeleton_keeps_the_layers_and_heads_and_shrinks_the_matrices():
    cfg = tiny_config(num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2)
    bare = step_time.skeleton_config(cfg)
    same = (
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "tie_word_embeddings",
    )
    assert all(getattr(bare, f) == getattr(cfg, f) for f in same)
    assert bare.hidden_size < cfg.hidden_size and bare.vocab_size <= 1024


def test_prompts_have_the_lengths_asked_and_stay_in_the_vocabulary():
    prompts = step_time.prompt_ids([3, 9], vocab_size=50)
    assert [len(p) for p in prompts] == [3, 9] and prompts[0] != prompts[1][:3]
    assert all(3 <= t < 50 for p in prompts for t in p)
    assert step_time.decode_prompts(2, 5, 50) == step_time.prompt_ids([5, 5], 50)


def test_host_split_of_the_tiny_model_adds_up_and_the_skeleton_runs_the_same_operators():
    split = step_time.host_split(tiny_model(), batch=2, steps=3, prompt_len=8)
    assert split["ops"] == split["ops_skeleton"] > 10 * tiny_config().num_hidden_layers
    assert split["batch"] == 2
    assert split["step"] > 0 and split["host"] > 0 and split["compute"] >= 0
    assert 0 < split["host_share"] <= 1


def test_decode_steps_times_each_step_after_the_prefill():
    from llmlab import LLM

    llm = LLM(tiny_model(), None, attention_backend="torch", max_model_len=32)
    got = step_time.decode_steps(llm, step_time.decode_prompts(3, 6, 512), steps=4)
    assert got["batch"] == 3 and len(got["seconds"]) == 4 and got["ops"] > 0
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="steps"):
        step_time.decode_steps(llm, [[5, 6]], steps=1)


def test_multi_step_gain_alternates_one_and_k_tokens_per_step_in_one_engine():
    got = step_time.multi_step_gain(tiny_model(), num_scheduler_steps=4, tokens=40, rounds=2)
    assert got["tokens_per_step"] == {1: 1.0, 4: 4.0}  # each span ran as it was told
    assert got["spans"] >= 2 and got["one"] > 0 and got["multi"] > 0
    assert got["speedup"] == pytest.approx(got["one"] / got["multi"])
    assert got["saved"] == pytest.approx(got["one"] - got["multi"])


def test_multi_step_gain_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        step_time.multi_step_gain(tiny_model(), num_scheduler_steps=1)
    with pytest.raises(ValueError, match=r"tokens: got 16, expected an int >= 17"):
        step_time.multi_step_gain(tiny_model(), num_scheduler_steps=4, tokens=16)


def test_covered_counts_overlapping_kernels_once():
    assert step_time.covered([]) == 0
    assert step_time.covered([(0, 2), (1, 3), (5, 6)]) == 4
    assert step_time.covered([(5, 6), (0, 10)]) == 10


def test_the_recorded_h200_run_reads_back_and_an_unknown_run_is_named():
    run = step_time.gpu_run("h200-first")
    assert run["card"] == "NVIDIA H200" and run["kernels_per_decode_step"] == 1317
    step = run["decode_step"]
    assert step["gpu_busy_ms"] < step["wall_ms"]
    with pytest.raises(ValueError, match="name: got 'a100'"):
        step_time.gpu_run("a100")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the answer without a GPU")
def test_without_a_gpu_the_gpu_measurements_say_none():
    assert step_time.gpu_decode_split(tiny_model()) is None
    assert step_time.decode_kernel_seconds({"x": lambda *a: None}) is None


@pytest.mark.gpu
@needs_gpu
def test_on_a_gpu_a_decode_step_is_measured_eagerly_and_from_graphs():
    got = step_time.gpu_decode_split(tiny_model(), batch=2, steps=4, prompt_len=8)
    assert set(got) == {"eager", "graphs"}
    for m in got.values():
        assert m["kernels"] > 0 and 0 < m["busy"] <= m["step"] * 1.5


@pytest.mark.gpu
@needs_gpu
def test_on_a_gpu_decode_kernels_are_timed():
    from functools import partial

    from llmlab import ops

    times = step_time.decode_kernel_seconds(
        {"triton": partial(ops.paged_attention_decode, backend="triton")}, num_seqs=2, context=256
    )
    assert times["triton"] > 0


def test_busy_time_counts_overlapping_kernels_once():
    from llmlab.analysis.step_time import covered

    assert covered([]) == 0
    assert covered([(0, 2), (1, 3), (5, 6)]) == 4  # [0, 3] and [5, 6]
    assert covered([(4, 5), (0, 10), (2, 3)]) == 10  # nested
    assert covered([(0, 1), (1, 2)]) == 2  # touching
