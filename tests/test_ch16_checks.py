"""Chapter 16 (a step on a GPU): the kernel checker's simulation of slips computes, with no slip,
what the reference computes; through the whole check path (launcher, driver, comparison,
diagnosis) but without Triton (a fake kernel stores the simulated partial results), the right
results pass, kept under another max too, and every slip fails with its rule; the merge's check
names each of its slips; odd answers are named without a crash; the number and choice exercises;
`with_decode_attention` runs the engine's decode steps through the given function and gives the
package's tokens. The student's real kernel, through Triton's interpreter, and the planted bugs
of both pieces: tests/test_planted_bugs.py; the chapter's figures in Chinese:
tests/test_figures_zh.py."""

from __future__ import annotations

import math

import pytest
import torch

from llmlab.course.build.ch16 import CASES, make_case, with_decode_attention
from llmlab.course.check import ch16, core
from llmlab.ops.reference import reference_paged_attention_decode

pytestmark = pytest.mark.usefixtures("first_try")  # each test is a student's first try, in English


class FakeKernel:
    """Stands in for a Triton kernel: `kernel[grid](...)` stores what a kernel with `slip`
    stores (the checker's simulation), after `edit(acc, m, l)` when given."""

    def __init__(self, slip=None, edit=None):
        self.slip, self.edit = slip, edit

    def __getitem__(self, grid):
        def launch(q, kc, vc, tables, seq_lens, part_out, part_max, part_sum, scale, *_, **__):
            t = dict(query=q, key_cache=kc, value_cache=vc, block_tables=tables)
            acc, m, l = ch16.partials(dict(t, seq_lens=seq_lens, scale=scale), self.slip)
            if self.edit is not None:
                acc, m, l = self.edit(acc, m, l)
            part_out.copy_(acc), part_max.copy_(m), part_sum.copy_(l)

        return launch


@pytest.mark.parametrize("seed", [0, 1])
def test_the_simulation_without_a_slip_merged_is_the_reference(seed):
    for case in CASES:
        t = make_case(case, seed)
        args = {k: t[k] for k in ("query", "key_cache", "value_cache", "block_tables", "seq_lens")}
        want = reference_paged_attention_decode(**args, scale=t["scale"])
        got = ch16.merge(*ch16.partials(t))
        assert not torch.isnan(want).any()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_the_cases_cross_block_and_partition_boundaries_with_shuffled_blocks_and_gqa():
    lengths = {n for case in CASES for n in case[1]}
    for boundary in (ch16.BLOCK_SIZE, ch16.PARTITION_SIZE):
        assert boundary in lengths and boundary + 1 in lengths
    assert {case[2] // case[3] for case in CASES} >= {1, 2, 3, 4}  # MHA and GQA groups
    assert {case[4] for case in CASES} == {"nan", "noise"}
    t = make_case(CASES[0], seed=3)
    assert t["block_tables"].flatten().tolist() != sorted(t["block_tables"].flatten().tolist())


def test_the_right_partial_results_pass_under_any_max_they_are_kept():
    assert ch16.paged_decode_partition(FakeKernel()).passed

    def another_max(acc, m, l):  # sums kept under m + 5, empty partitions at -1e30
        shift = torch.where(torch.isinf(m), 0.0, 5.0)
        m2 = torch.where(torch.isinf(m), -1e30, m + shift)
        return acc * torch.exp(-shift)[..., None], m2, l * torch.exp(-shift)

    result = ch16.paged_decode_partition(FakeKernel(edit=another_max))
    assert result.passed and "4 cases" in result.message


@pytest.mark.parametrize("slip,key", ch16.SLIPS, ids=[s for s, _ in ch16.SLIPS])
def test_each_kernel_slip_fails_with_the_rule_it_breaks(slip, key):
    """Every slip changes the results on the cases drawn, and the diagnosis names its rule (the
    slips that share a rule may be told for one another)."""
    result = ch16.paged_decode_partition(FakeKernel(slip))
    assert not result.passed
    assert ch16.M(key) in result.message, (slip, result.message)


def test_an_empty_partition_left_unstored_and_a_result_no_slip_explains():
    def unstored(acc, m, l):
        empty = torch.isinf(m)
        return acc.masked_fill(empty[..., None], math.nan), m.masked_fill(empty, math.nan), l

    result = ch16.paged_decode_partition(FakeKernel(edit=unstored))
    assert "stored nothing: its m, l and acc still read NaN" in result.message

    def off(acc, m, l):
        return acc + 0.5 * l[..., None], m, l

    result = ch16.paged_decode_partition(FakeKernel(edit=off))
    assert "off by up to" in result.message and "case gqa2" in result.message
    again = ch16.paged_decode_partition(FakeKernel(edit=off))  # the second try adds the rules
    assert "query head h reads KV head h // GROUP" in again.message


def test_odd_kernels_are_named_without_a_crash():
    assert ch16.paged_decode_partition(None).message == core.NOT_ANSWERED
    assert "the function under @triton.jit" in ch16.paged_decode_partition(7).message
    assert "function under @triton.jit" in ch16.paged_decode_partition(lambda: 0).message

    class Raising:
        def __getitem__(self, grid):
            return lambda *a, **k: 1 / 0

    assert "raised ZeroDivisionError" in ch16.paged_decode_partition(Raising()).message

    def unwritten(acc, m, l):
        return acc * math.nan, m * math.nan, l * math.nan

    nothing = ch16.paged_decode_partition(FakeKernel(edit=unwritten))
    assert "the kernel stored nothing" in nothing.message


def test_the_merge_passes_and_each_of_its_slips_is_named():
    assert ch16.merge_partitions(lambda *a: ch16.merge(*a)).passed  # the package's own: refused
    for slip, key in ch16.MERGE_SLIPS:
        result = ch16.merge_partitions(
            lambda out, m, s, slip=slip: ch16.merge_slip(out, m, s, slip).float()
        )
        assert not result.passed and ch16.M(key) in result.message, (slip, result.message)


def test_odd_merges_are_named_without_a_crash():  # what is not a function: test_build.py
    assert "returned a NoneType" in ch16.merge_partitions(lambda *a: None).message
    assert "shape [2]" in ch16.merge_partitions(lambda *a: torch.zeros(2)).message
    as_ints = ch16.merge_partitions(lambda *a: ch16.merge(*a).long())
    assert "dtype torch.int64" in as_ints.message


def test_busy_share_and_its_slips():
    share = ch16.RUN_US / ch16.LAUNCH_US
    assert ch16.busy_share(share).passed
    assert "launch time over the run time" in ch16.busy_share(1 / share).message
    assert "taking turns" in ch16.busy_share(6 / 26).message
    assert "percentage" in ch16.busy_share(100 * share).message
    assert "GPU waits" in ch16.busy_share(1 - share).message


def test_eager_step():
    assert ch16.eager_step("b").passed
    assert "next larger one" in ch16.eager_step("a").message
    assert "captured sizes" in ch16.eager_step("c").message
    assert "persistent buffers" in ch16.eager_step("d").message


def test_partitions_for_sms():
    assert ch16.partitions_for_sms(17).passed
    assert "query heads" in ch16.partitions_for_sms(5).message
    assert "still get no program" in ch16.partitions_for_sms(16).message
    assert "whole numbers" in ch16.partitions_for_sms(16.5).message
    assert "one KV head only" in ch16.partitions_for_sms(132).message


def test_multi_step_speedup_and_its_slips():
    f, h, k = ch16.FORWARD_MS, ch16.HOST_MS, ch16.STEPS
    assert ch16.multi_step_speedup((f + h) / (f + h / k)).passed
    assert not ch16.multi_step_speedup((f + h) / (f + h / (k / 2))).passed
    assert "still paid, once per 8 tokens" in ch16.multi_step_speedup((f + h) / f).message
    assert "still takes its 5 ms" in ch16.multi_step_speedup(k).message
    assert "old over the new" in ch16.multi_step_speedup((f + h / k) / (f + h)).message
    assert "a forward of its own" in ch16.multi_step_speedup((f + h) / (f / k + h)).message


def test_with_decode_attention_runs_every_decode_step_through_the_function():
    """On the tiny model, the engine's decode steps call the given function once per layer and
    step, and its tokens are the package's; prefill steps and the original model are untouched."""
    from llmlab import LLM, SamplingParams, ops
    from llmlab.analysis.step_time import prompt_ids
    from llmlab.model import Attention, tiny_model

    calls = []

    def decode(query, key_cache, value_cache, block_tables, seq_lens, scale):
        calls.append(seq_lens.tolist())
        return ops.paged_attention_decode(
            query, key_cache, value_cache, block_tables, seq_lens, scale
        )

    tiny = tiny_model()
    prompts = prompt_ids([14, 27, 33], tiny.config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    kw = dict(block_size=16, max_model_len=48, attention_backend="torch", dtype="float32")
    mine = LLM(with_decode_attention(tiny, decode), **kw).generate(prompts, params, use_tqdm=False)
    theirs = LLM(tiny, **kw).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mine] == [o.outputs[0].token_ids for o in theirs]
    layers = tiny.config.num_hidden_layers
    assert len(calls) == 4 * layers  # 5 tokens: the prefill's, then 4 decode steps
    assert calls[0] == [15, 28, 34] and calls[-1] == [18, 31, 37]
    assert all(type(layer.self_attn) is Attention for layer in tiny.layers)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_notebooks_kernel_compiles_passes_and_runs_in_the_engine():
    """The notebook's solution, compiled by Triton: the checker runs it on the GPU and it passes;
    in the engine on the GPU it gives the package's tokens; it can be timed."""
    from functools import partial
    from pathlib import Path

    from llmlab import LLM, SamplingParams
    from llmlab.analysis.step_time import decode_kernel_seconds, prompt_ids
    from llmlab.course.build import ch16 as build16
    from llmlab.course.check.cli import load_definitions
    from llmlab.model import tiny_model

    root = Path(__file__).resolve().parents[1]
    ns = load_definitions(root / "notebooks" / "16-gpu-step.ipynb")
    kernel, merge = ns["paged_decode_partition"], ns["merge_partitions"]
    result = ch16.paged_decode_partition(kernel)
    assert result.passed and ch16.M("decode.on_gpu") in result.message
    assert ch16.merge_partitions(merge).passed
    yours = partial(build16.paged_decode, kernel, merge)
    tiny = tiny_model().to("cuda")
    prompts = prompt_ids([14, 27, 33], tiny.config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    kw = dict(block_size=16, max_model_len=48, attention_backend="torch", dtype="float32")
    mine = LLM(build16.with_decode_attention(tiny, yours), **kw).generate(prompts, params)
    theirs = LLM(tiny, **kw).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in mine] == [o.outputs[0].token_ids for o in theirs]
    times = decode_kernel_seconds({"yours": partial(yours, partition_size=512)}, context=512)
    assert times["yours"] > 0
