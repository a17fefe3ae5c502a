"""llmlab.parallel: sharding plans, the launcher's failure handling, TP and PP against one process,
and the communication cost model."""

from __future__ import annotations

import time

import pytest
import torch

from llmlab.analysis import parallel_cost
from llmlab.config import get_config
from llmlab.model import tiny_model
from llmlab.ops import single_sequence_metadata
from llmlab.parallel import launch as L
from llmlab.parallel import pp, tp
from llmlab.parallel.source import ModelSource

UNEVEN = dict(
    num_attention_heads=9, num_key_value_heads=3, head_dim=16, hidden_size=48, intermediate_size=96
)  # SmolLM2's 9 query / 3 KV heads, scaled down


# --- plans (no processes) ----------------------------------------------------------------------


def test_tp_plan_gives_each_rank_whole_kv_groups_smollm2():
    cfg = get_config("smollm2-135m")  # 9 query heads, 3 KV heads, 1536 MLP channels
    two = tp.tp_plan(cfg, 2)
    assert [len(s.kv_heads) for s in two] == [2, 1]
    assert [len(s.q_heads) for s in two] == [6, 3]  # 3 query heads per KV head
    assert [len(s.ffn) for s in two] == [768, 768]
    assert two[1].q_heads == range(6, 9) and two[1].kv_heads == range(2, 3)
    assert [len(s.q_heads) for s in tp.tp_plan(cfg, 3)] == [3, 3, 3]
    with pytest.raises(ValueError, match="world_size"):
        tp.tp_plan(cfg, 4)  # more ranks than KV heads


@pytest.mark.parametrize("world_size", [2, 3])
def test_partial_sums_of_the_shards_rebuild_the_full_layer(world_size):
    """Column- then row-parallel: the shards' outputs, summed (the all-reduce), equal the layer's."""
    model = tiny_model(seed=1, **UNEVEN)
    shards = [
        tp.shard_model(model, s, all_reduce=lambda t: t)
        for s in tp.tp_plan(model.config, world_size)
    ]
    T = 6
    x = torch.randn(T, model.config.hidden_size)  # [T, hidden]
    cos, sin = model.rope_cos_sin(torch.arange(T))

    def attention(m):
        ctx = single_sequence_metadata(m.allocate_kv_caches(1, T), 0, T, T)
        return m.layers[0].self_attn(x, cos, sin, ctx, 0)  # [T, hidden]

    with torch.inference_mode():
        full_attn, full_mlp = attention(model), model.layers[0].mlp(x)
        part_attn = [attention(s) for s in shards]
        part_mlp = [s.layers[0].mlp(x) for s in shards]
    torch.testing.assert_close(sum(part_attn), full_attn, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sum(part_mlp), full_mlp, atol=1e-5, rtol=1e-5)
    assert (part_attn[0] - full_attn).abs().max() > 1e-3  # one shard alone is only a part


def test_shards_hold_a_fraction_of_the_layer_weights():
    model = tiny_model(seed=0)
    shard = tp.shard_model(model, tp.tp_plan(model.config, 2)[0], all_reduce=lambda t: t)
    full_layer = sum(p.numel() for p in model.layers[0].parameters())
    norms = 2 * model.config.hidden_size  # replicated RMSNorm weights
    half_layer = sum(p.numel() for p in shard.layers[0].parameters())
    assert half_layer - norms == (full_layer - norms) // 2


def test_pp_plan_and_microbatches():
    assert pp.pp_plan(30, 2) == [range(0, 15), range(15, 30)]
    assert pp.pp_plan(5, 2) == [range(0, 3), range(3, 5)]
    assert pp.split_microbatches(5, 2) == [range(0, 3), range(3, 5)]
    with pytest.raises(ValueError, match="num_stages"):
        pp.pp_plan(2, 3)
    with pytest.raises(ValueError, match="num_microbatches"):
        pp.split_microbatches(2, 4)


def test_theoretical_bubble_by_hand():
    assert pp.theoretical_bubble(2, 1) == pytest.approx(1 / 2)
    assert pp.theoretical_bubble(2, 4) == pytest.approx(1 / 5)
    assert pp.theoretical_bubble(4, 8) == pytest.approx(3 / 11)
    assert pp.theoretical_bubble(1, 3) == 0.0


def test_measured_bubble_of_a_hand_made_schedule_matches_the_formula():
    # p = 2 stages, m = 2 micro-batches of 1 s each: stage 0 busy 0-2, stage 1 busy 1-3
    timelines = [
        pp.StageTimeline(0, [(0.0, 1.0), (1.0, 2.0)]),
        pp.StageTimeline(1, [(1.0, 2.0), (2.0, 3.0)]),
    ]
    assert pp.measured_bubble(timelines) == pytest.approx([1 / 3, 1 / 3])
    assert pp.theoretical_bubble(2, 2) == pytest.approx(1 / 3)


# --- the cost model ------------------------------------------------------------------------------


def test_ring_all_reduce_time_by_hand():
    link = parallel_cost.Interconnect("test", bandwidth=1e9, latency=1e-6, source="made up")
    # p = 4: 2·3 = 6 steps of α, plus 2·3/4 · 1 MB / 1 GB/s = 1.5 ms
    assert parallel_cost.ring_all_reduce_time(1e6, 4, link) == pytest.approx(6e-6 + 1.5e-3)
    assert parallel_cost.ring_all_reduce_time(1e6, 1, link) == 0.0
    assert parallel_cost.p2p_time(1e6, link) == pytest.approx(1e-6 + 1e-3)


def test_interconnects_use_one_direction_of_the_datasheet_figure():
    assert parallel_cost.get_interconnect("nvlink").bandwidth == pytest.approx(450e9)
    assert parallel_cost.get_interconnect("pcie").bandwidth == pytest.approx(64e9)
    with pytest.raises(ValueError, match="interconnect"):
        parallel_cost.get_interconnect("carrier-pigeon")


def test_llama_70b_decode_step_by_hand():
    c = parallel_cost.decode_step_cost(
        "llama-3-70b", tp=8, batch=1, interconnect="nvlink", context=1
    )
    cfg = get_config("llama-3-70b")
    assert c.all_reduces == 2 * 80
    assert c.all_reduce_bytes == 8192 * 2  # one token's hidden state, BF16
    # batch 1 is memory-bound: ≈ 70.6e9 params · 2 bytes / (8 GPUs · 3.35 TB/s) ≈ 5.3 ms
    assert c.compute == pytest.approx(70.55e9 * 2 / (8 * 3.35e12), rel=0.01)
    per_ar = 14 * 1e-6 + 14 / 8 * 16384 / 450e9
    assert c.tp_comm == pytest.approx(160 * per_ar)
    assert cfg.num_hidden_layers == 80


def test_tp_communication_grows_with_degree_and_hurts_more_on_pcie():
    for batch in (1, 256):
        sweep = {(c.interconnect.split()[0], c.tp): c for c in parallel_cost.tp_sweep(batch=batch)}
        for t in (2, 4, 8):
            assert sweep[("PCIe", t)].tp_comm > sweep[("NVLink", t)].tp_comm
        assert sweep[("NVLink", 2)].compute > sweep[("NVLink", 8)].compute
        assert sweep[("NVLink", 2)].tp_comm < sweep[("NVLink", 8)].tp_comm
        assert sweep[("PCIe", 8)].comm_fraction > 0.5  # PCIe at TP=8: mostly waiting
    assert parallel_cost.decode_step_cost(tp=1).tp_comm == 0.0
    assert parallel_cost.decode_step_cost(tp=1, pp=2).pp_comm > 0
    with pytest.raises(ValueError, match="tp"):
        parallel_cost.decode_step_cost(tp=0)


# --- real processes ------------------------------------------------------------------------------


@pytest.mark.dist
def test_launcher_runs_a_real_all_reduce():
    assert L.launch(L.all_reduce_sum_of_ranks, 2, timeout=60) == [3.0, 3.0]


@pytest.mark.dist
def test_a_crashing_rank_fails_with_its_name_and_error():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 failed: ValueError: deliberate failure"):
        L.launch(L.crash_on_rank, 2, (1,), timeout=30)
    assert time.monotonic() - t0 < 30


@pytest.mark.dist
def test_a_rank_that_dies_silently_is_named():
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 died with exit code 3"):
        L.launch(L.exit_on_rank, 2, (1,), timeout=30)


@pytest.mark.dist
def test_a_hung_rank_times_out_instead_of_hanging():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out after 6 s: rank\(s\) \[.*1\]"):
        L.launch(L.hang_on_rank, 2, (1,), timeout=6)
    assert time.monotonic() - t0 < 6 + 15  # killed, not waited for


def _check_tp(source: ModelSource, prompt: list[int], world_size: int, new_tokens: int):
    model = source.build()
    res = tp.run_tensor_parallel(source, prompt, world_size, new_tokens, timeout=240)
    ref = model.logits_for(prompt)  # [T, vocab]
    assert (res.logits - ref).abs().max().item() < 1e-4
    assert res.token_ids == tp.greedy_reference(model, prompt, new_tokens)
    layers = model.config.num_hidden_layers
    assert res.all_reduces_per_forward == [2 * layers] * new_tokens  # 2 per layer, each forward
    return res, model


@pytest.mark.dist
def test_tp2_matches_one_process_on_the_tiny_model():
    res, model = _check_tp(ModelSource("tiny", seed=0), [5, 17, 42, 99, 3, 250, 7], 2, 4)
    cfg = model.config
    # prefill (7 tokens) + 3 decode steps (1 token), each all-reduce [tokens, hidden] float32
    assert res.all_reduce_bytes == 2 * cfg.num_hidden_layers * (7 + 3) * cfg.hidden_size * 4
    assert res.kv_cache_bytes_per_rank[0] == res.kv_cache_bytes_per_rank[1]


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_tp_with_uneven_gqa_groups_matches_one_process(world_size):
    res, _ = _check_tp(
        ModelSource("tiny", seed=2, overrides=UNEVEN), [3, 1, 4, 1, 5, 9], world_size, 3
    )
    kv = [len(s.kv_heads) for s in res.shards]
    assert kv == ([2, 1] if world_size == 2 else [1, 1, 1])
    # the KV cache is split with the KV heads: rank 0 holds twice rank 1's at TP=2
    assert res.kv_cache_bytes_per_rank[0] == kv[0] * res.kv_cache_bytes_per_rank[-1]


@pytest.mark.dist
@pytest.mark.model
@pytest.mark.slow
def test_tp2_matches_one_process_on_smollm2(real_model):
    model, tokenizer = real_model
    prompt = tokenizer.encode("The capital of France is")
    res = tp.run_tensor_parallel(ModelSource("smollm2-135m"), prompt, 2, 4, timeout=300)
    ref = model.logits_for(prompt)
    assert (res.logits - ref).abs().max().item() < 1e-4
    assert res.token_ids == tp.greedy_reference(model, prompt, 4)
    assert res.all_reduces_per_forward == [60] * 4  # 30 layers × 2
    assert [len(s.q_heads) for s in res.shards] == [6, 3]


@pytest.mark.dist
def test_pp2_matches_one_process_with_microbatches():
    source = ModelSource("tiny", seed=0, overrides=dict(num_hidden_layers=3))
    model = source.build()
    prompts = [[5, 17, 42, 99, 3], [1, 2, 3], [100, 200, 300, 400], [9, 8, 7, 6, 5, 4]]
    res = pp.run_pipeline_parallel(
        source, prompts, num_stages=2, num_microbatches=2, max_new_tokens=3, timeout=240
    )
    assert res.stage_layers == [range(0, 2), range(2, 3)]
    for prompt, logits, tokens in zip(prompts, res.logits, res.token_ids):
        assert (logits - model.logits_for(prompt)).abs().max().item() < 1e-4
        assert tokens == tp.greedy_reference(model, prompt, 3)
    assert len(res.timelines) == 3 and all(len(t.intervals) == 2 for t in res.timelines[0])
    assert all(0.0 <= b < 1.0 for b in res.prefill_bubble)
    # stage 1 cannot start a micro-batch before stage 0 has finished it
    s0, s1 = res.timelines[0]
    assert all(b[0] >= a[1] - 1e-3 for a, b in zip(s0.intervals, s1.intervals))


@pytest.mark.dist
def test_measured_pipeline_schedule_obeys_causality_and_the_m1_bound():
    """Timing-free facts of a measured schedule (how much micro-batching saves is measured in
    notebook 09, not asserted: it depends on the machine's load).

    Stage 1 can start micro-batch i only after stage 0 has finished it. With m = 1 the stages
    never overlap, so span ≥ busy₀ + busy₁ and the mean idle fraction is at least 1/2.
    """
    source = ModelSource("tiny", overrides=dict(num_hidden_layers=4))
    res = pp.measure_bubble(
        source,
        num_stages=2,
        batch_size=4,
        seq_len=16,
        microbatch_counts=(1, 4),
        repeats=1,
        timeout=240,
    )
    assert res[1]["theory"] == pytest.approx(0.5) and res[4]["theory"] == pytest.approx(0.2)
    assert res[1]["measured"] >= 0.5 - 1e-6
    for m in (1, 4):
        s0, s1 = res[m]["timelines"]
        assert len(s0.intervals) == len(s1.intervals) == m
        assert all(b[0] >= a[1] for a, b in zip(s0.intervals, s1.intervals))
        assert all(0.0 <= b < 1.0 for b in res[m]["stages"])


def test_explorer_text_and_bars_come_from_the_cost_model():
    import matplotlib

    matplotlib.use("Agg")
    from llmlab.course.widgets.parallel import (
        PARALLEL_TEXT_PATTERN,
        parallel_text,
        plot_parallel_cost,
    )

    m = PARALLEL_TEXT_PATTERN.search(
        parallel_text(tp=4, interconnect="pcie", batch=32, context=512)
    )
    c = parallel_cost.decode_step_cost(
        "llama-3-70b", tp=4, batch=32, interconnect="pcie", context=512
    )
    assert m and int(m.group(1)) == 4 and m.group(3).startswith("PCIe")
    assert float(m.group(4)) == pytest.approx(c.compute * 1e3, abs=0.01)
    assert float(m.group(5)) == pytest.approx(c.comm * 1e3, abs=0.01)
    fig = plot_parallel_cost(tp=4, interconnect="pcie", batch=32, context=512)
    heights = sorted(round(p.get_height(), 6) for p in fig.axes[1].patches if p.get_fill())
    assert round(c.tp_comm * 1e3, 6) in heights  # the PCIe panel's TP=4 comm bar
