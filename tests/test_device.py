"""Device mistakes fail on a CPU too.

On a GPU every per-step tensor the engine makes must live on the logits' (the model's) device: a
sampler that builds its temperatures on the CPU, or a seeded request whose generator is a CPU
one, crashes there with "Expected all tensors to be on the same device". None of that shows on a
CPU-only machine, where every tensor is on the CPU. So these tests hand the engine's per-step
code logits and models on the "meta" device, which refuses to mix with CPU tensors the way CUDA
does (and refuses the data-dependent shapes, `nonzero` and `bincount`, that make a GPU wait),
and they check that a generator on another device is refused by name.

The decode CUDA graphs are checked on a CPU the same way: `DecodeGraphs` with `EagerGraph`
replays the captured forward eagerly on the same persistent buffers, so the buckets, the padding
rows and the one-transfer staging are exercised, and the tokens compared with the eager engine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmlab.core.request import Request
from llmlab.core.scheduler import SchedulerOutput
from llmlab.engine import LLMEngine
from llmlab.kvcache.manager import KVCacheManager
from llmlab.model import tiny_model
from llmlab.sampling import SamplingParams, apply_logits_processors, make_generator, sample
from llmlab.sampling.rejection_sampler import rejection_sample, target_probs
from llmlab.worker.cuda_graphs import DecodeGraphs, capture_sizes
from llmlab.worker.input_batch import StagingBuffers, build_step_arrays
from llmlab.worker.model_runner import ModelRunner

META = torch.device("meta")
VOCAB = 512


def meta_logits(rows: int) -> torch.Tensor:
    return torch.empty(rows, VOCAB, device=META)


MIXED = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.2, top_k=5, top_p=0.5),
]


def test_sampler_keeps_every_tensor_on_the_logits_device():
    out = sample(meta_logits(len(MIXED)), MIXED)
    assert out.device == META and out.shape == (len(MIXED),) and out.dtype == torch.int64


def test_sampler_with_only_cut_rows_and_only_uncut_rows_stays_on_device():
    for params in (MIXED[2:], MIXED[:2], [SamplingParams(temperature=0)]):
        assert sample(meta_logits(len(params)), params).device == META


def test_a_generator_on_another_device_is_refused_by_name():
    params = [SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=1.0)]
    with pytest.raises(ValueError, match=r"generators\[0\].*cpu.*meta"):
        sample(meta_logits(2), params, [make_generator(3), None])
    # the same generator on the logits' device is accepted
    logits = torch.randn(2, VOCAB)
    assert sample(logits, params, [make_generator(3, logits.device), None]).shape == (2,)


def test_logits_processors_build_their_tensors_on_the_logits_device():
    params = SamplingParams(
        temperature=1.0,
        logit_bias={3: 2.0, 7: -1.0},
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=0.2,
    )
    logits = meta_logits(2)
    apply_logits_processors(logits, 1, params, [1, 2, 3], [4, 4, 5])
    assert logits.device == META


def test_target_probs_and_the_rejection_sampler_follow_the_logits_device():
    params = [SamplingParams(temperature=0.9, top_k=10), SamplingParams(temperature=1.1)]
    probs = target_probs(meta_logits(2), params)
    assert probs.device == META and probs.shape == (2, VOCAB)
    with pytest.raises(ValueError, match=r"generators\[0\].*cpu.*meta"):
        rejection_sample(torch.empty(3, VOCAB, device=META), [1, 2], None, make_generator(0))


def meta_runner(backend: str = "torch") -> ModelRunner:
    model = tiny_model().to(META)
    mgr = KVCacheManager(32, 4, enable_caching=False)
    return ModelRunner(model, mgr, 32, 4, backend, None, max_num_seqs=8, max_model_len=64)


def test_the_runner_builds_every_per_step_tensor_on_the_model_device():
    """A mixed step (a prefill chunk, a decode) on a model that lives on "meta": the flat batch
    and the metadata are built on the host and sent, all of them, to the model's device."""
    runner = meta_runner()
    mgr = runner.kv_cache_manager
    a = Request("a", list(range(10, 19)), SamplingParams(), 0.0)
    b = Request("b", list(range(30, 35)), SamplingParams(), 0.0)
    for req, n in ((a, 9), (b, 3)):
        assert mgr.allocate_slots(req, n) is not None
    a.num_computed_tokens = 8  # a decodes its last token, b prefills 3 of 5
    out = SchedulerOutput()
    out.add(a, 1)
    out.add(b, 3)
    inp = runner.prepare_inputs(out)
    md = inp.metadata
    tensors = [inp.input_ids, inp.positions, inp.sample_rows, md.cu_seqlens_q, md.seq_lens]
    tensors += [md.slot_mapping, md.block_tables, *md.kv_caches[0]]
    assert all(t.device == META for t in tensors)
    assert md.max_query_len == 3 and inp.input_ids.shape == (4,)


def test_staging_sends_every_array_in_one_buffer_at_fixed_offsets():
    """Arrays of the same sizes land at the same device addresses (what a graph replays on),
    and their values arrive intact."""
    staging = StagingBuffers(torch.device("cpu"), capacity=64)  # small: it must grow
    arrays = build_step_arrays([5, 6, 7], [[3], [1, 2], [4]], [0, 4, 2], [1, 1, 1], [0, 1, 2], 4)
    first = staging.send(arrays)
    again = staging.send(
        build_step_arrays([8, 9, 1], [[2], [3, 0], [1]], [1, 5, 0], [1, 1, 1], [0, 1, 2], 4)
    )
    for name, t in first.items():
        assert t.data_ptr() == again[name].data_ptr(), name
    assert again["input_ids"].tolist() == [8, 9, 1]
    assert again["slot_mapping"].tolist() == [2 * 4 + 1, 0 * 4 + 1, 1 * 4 + 0]
    assert again["block_tables"].tolist() == [[2, 0], [3, 0], [1, 0]]
    assert again["seq_lens"].tolist() == [2, 6, 1]


def test_one_sequence_step_arrays_match_the_same_sequence_in_a_batch():
    """A batch-1 decode step's arrays (built without the batch's table and offsets) are the
    rows the same sequence gets beside another, and a prefill step's too."""
    for tokens, starts, q_lens in (([7], [6], [1]), ([7, 8, 9], [4], [3])):
        one = build_step_arrays(tokens, [[5, 2]], starts, q_lens, [len(tokens) - 1], 4)
        two = build_step_arrays(
            tokens + [3], [[5, 2], [1, 0, 6]], starts + [9], q_lens + [1], [0], 4
        )
        n = len(tokens)
        assert one.block_tables.dtype == np.int32 and one.cu_seqlens_q.dtype == np.int32
        assert one.block_tables.tolist() == [two.block_tables[0, :2].tolist()]
        assert one.cu_seqlens_q.tolist() == two.cu_seqlens_q[:2].tolist() == [0, n]
        assert one.slot_mapping.tolist() == two.slot_mapping[:n].tolist()
        assert one.positions.tolist() == two.positions[:n].tolist()
        assert one.seq_lens.tolist() == [starts[0] + n]
    assert build_step_arrays([7], [[5, 2]], [6], [1], [0], 4).slot_mapping.tolist() == [2 * 4 + 2]
    wide = build_step_arrays([7], [[5, 2]], [6], [1], [0], 4, table_width=3)
    assert wide.block_tables.tolist() == [[5, 2, 0]]


def test_padding_rows_of_a_graph_step_write_nothing_and_read_block_zero():
    arrays = build_step_arrays(
        [5, 6], [[3], [1, 2]], [0, 4], [1, 1], [0, 1], 4, pad_to=4, table_width=3
    )
    assert arrays.input_ids.tolist() == [5, 6, 0, 0]
    assert arrays.slot_mapping.tolist() == [12, 8, -1, -1]
    assert arrays.seq_lens.tolist() == [1, 5, 1, 1]
    assert arrays.cu_seqlens_q.tolist() == [0, 1, 2, 3, 4]
    assert arrays.block_tables.tolist() == [[3, 0, 0], [1, 2, 0], [0, 0, 0], [0, 0, 0]]
    assert arrays.sample_rows.tolist() == [0, 1]


def test_capture_sizes_cover_every_batch_up_to_the_cap():
    assert capture_sizes(64)[:5] == [1, 2, 4, 8, 16] and capture_sizes(64)[-1] == 64
    assert capture_sizes(6) == [1, 2, 4, 6]
    graphs = DecodeGraphs(capture_sizes(20))
    assert [graphs.bucket(n) for n in (1, 3, 5, 9, 17, 20, 21)] == [1, 4, 8, 16, 20, 20, None]


def run_greedy_and_sampled(
    engine: LLMEngine, num: int = 6, max_tokens: int = 12
) -> dict[str, list[int]]:
    prompts = [list(range(3 + i, 12 + 3 * i)) for i in range(num)]
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, max_tokens=max_tokens)
        engine.add_request(str(i), p, params)
    got: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    return got


def test_decode_steps_replayed_on_persistent_buffers_give_the_eager_tokens():
    """The graph path (staging buffers, buckets, padding rows) on a CPU, with EagerGraph in
    place of a CUDA graph: the same tokens as the eager engine, greedy and seeded, and the
    decode steps did go through the graphs."""
    kwargs = dict(attention_backend="torch", block_size=4, max_num_seqs=6, max_model_len=64)
    eager = run_greedy_and_sampled(LLMEngine(tiny_model(), **kwargs))
    engine = LLMEngine(tiny_model(), **kwargs)
    runner = engine.model_runner
    runner.staging = StagingBuffers(runner.device)
    runner.graphs = DecodeGraphs(capture_sizes(6))
    runner.capture_graphs(use_cuda_graphs=False)
    replays = []
    replay = runner.graphs.replay
    runner.graphs.replay = lambda size: replays.append(size) or replay(size)
    assert run_greedy_and_sampled(engine) == eager
    assert replays and set(replays) <= {1, 2, 4, 6}


@pytest.mark.triton
def test_the_gpu_fast_path_under_the_runner_gives_the_readable_tokens():
    """What the engine runs on a GPU, run on a CPU: the fused layers of `model_gpu` (through the
    Triton interpreter) in the runner, decode steps replayed on the staging buffers. Greedy and
    seeded tokens equal the readable engine's."""
    from llmlab.model.gpu import gpu_model

    kwargs = dict(block_size=4, max_num_seqs=6, max_model_len=64)
    readable = run_greedy_and_sampled(LLMEngine(tiny_model(), **kwargs), 4, 6)
    engine = LLMEngine(tiny_model(), attention_backend="triton", **kwargs)
    runner = engine.model_runner
    runner.model = gpu_model(runner.model, interpret=True)
    runner.staging = StagingBuffers(runner.device)
    runner.graphs = DecodeGraphs(capture_sizes(6))
    runner.capture_graphs(use_cuda_graphs=False)
    assert run_greedy_and_sampled(engine, 4, 6) == readable


def _run(engine: LLMEngine, params: dict[str, SamplingParams]) -> dict[str, tuple]:
    prompts = {rid: list(range(5 + i, 25 + i)) for i, rid in enumerate(params)}
    for rid, p in params.items():
        engine.add_request(rid, prompts[rid], p)
    got: dict[str, list[int]] = {rid: [] for rid in params}
    reasons = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id].extend(out.outputs[0].token_ids)
            if out.finished:
                reasons[out.request_id] = out.outputs[0].finish_reason
    return {rid: (got[rid], reasons[rid]) for rid in params}


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3}])
def test_a_request_whose_sampling_fails_ends_alone(monkeypatch, spec):
    """One request's sampling (or verification) raises: it finishes with finish_reason "error",
    its batch-mates get the tokens they get without it, and no block is left held."""
    from llmlab.worker import model_runner

    def poisoned(fn):
        def wrapped(logits, row_or_params, *args):
            params = row_or_params if isinstance(row_or_params, list) else args[0]
            if any(getattr(p, "top_k", 0) == 7 for p in params if p is not None):
                raise FloatingPointError("a poisoned request")
            return fn(logits, row_or_params, *args)

        return wrapped

    monkeypatch.setattr(model_runner, "sample", poisoned(model_runner.sample))
    monkeypatch.setattr(model_runner, "target_probs", poisoned(model_runner.target_probs))
    kwargs = dict(attention_backend="torch", block_size=4, speculative_config=spec)
    mates = {
        str(i): SamplingParams(temperature=0.8 if i % 2 else 0, seed=i, max_tokens=10)
        for i in range(3)
    }
    quiet = _run(LLMEngine(tiny_model(), **kwargs), mates)
    engine = LLMEngine(tiny_model(), **kwargs)
    bad = SamplingParams(temperature=0.9, top_k=7, seed=9, max_tokens=10)
    noisy = _run(engine, {**mates, "bad": bad})
    assert noisy.pop("bad")[1] == "error"
    assert noisy == quiet
    kv = engine.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks and not engine.requests
