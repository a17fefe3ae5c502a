"""The engine on the tiny random-weight model: correctness against a no-cache reference,
sampling reproducibility, stop conditions, streaming, metrics, validation, abort, and a
300-request stress test that forces preemption."""

from __future__ import annotations

import random

import pytest

from llmlab import LLM, SamplingParams
from llmlab.engine import LLMEngine, RequestOutput
from llmlab.model import tiny_model

NEAR_TIE = 1e-4


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1)


def reference_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy tokens recomputed from scratch each step (no cache), with each step's top-2 gap."""
    seq, gaps = list(prompt), []
    for _ in range(n):
        logits = model.logits_for(seq)[-1]  # [vocab]
        top2 = logits.topk(2)
        gaps.append(float(top2.values[0] - top2.values[1]))
        seq.append(int(top2.indices[0]))
    return seq[len(prompt) :], gaps


def assert_matches_reference(model, prompts, outs, n):
    for prompt, out in zip(prompts, outs):
        ref, gaps = reference_greedy(model, prompt, n)
        got = out.outputs[0].token_ids
        for i, (a, b) in enumerate(zip(got, ref)):
            if a != b:
                assert gaps[i] <= NEAR_TIE, f"token {i} differs ({a} vs {b}), top-2 gap {gaps[i]}"
                print(f"near-tie accepted at token {i} (gap {gaps[i]:.1e})")
                break
        else:
            assert len(got) == len(ref)


def random_prompts(n, lo, hi, seed=0, vocab=512):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),  # defaults
        dict(block_size=4, num_kv_blocks=20, max_num_seqs=8, max_model_len=72),  # preemption
        dict(max_num_batched_tokens=16),  # chunked prefill
        dict(enable_prefix_caching=False, enable_chunked_prefill=False, max_num_batched_tokens=128),
        dict(scheduling="static", max_num_seqs=3),
    ],
)
def test_greedy_matches_no_cache_reference(model, kwargs):
    prompts = random_prompts(10, 1, 60, seed=2)
    prompts[3] = prompts[2][:40] + [7, 8, 9]  # a shared prefix
    llm = LLM(model, **{"max_model_len": 128, **kwargs})
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.request_id for o in outs] == sorted((o.request_id for o in outs), key=int)
    assert_matches_reference(model, prompts, outs, 8)
    stats = llm.llm_engine.stats()
    assert stats["free_blocks"] == stats["num_kv_blocks"]
    if kwargs.get("num_kv_blocks") == 20:
        assert stats["preemptions"] > 0
    if kwargs.get("max_num_batched_tokens") == 16:
        assert stats["chunked_prefill_steps"] > 0


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_unwritten_pool_memory_is_never_read(model, backend):
    """The engine's KV pool is not zeroed (`allocate_kv_caches(zeroed=False)`): with every slot
    poisoned with NaN before the first step, chunked, cached and preempted requests must still
    match the no-cache reference."""
    prompts = random_prompts(8, 20, 50, seed=4)
    prompts[5] = prompts[4][:32] + [5, 6]  # a prefix-cache hit
    llm = LLM(
        model,
        max_model_len=96,
        block_size=4,
        num_kv_blocks=24,
        max_num_seqs=8,
        max_num_batched_tokens=32,
        attention_backend=backend,
    )
    for k, v in llm.llm_engine.model_runner.kv_caches:
        k.fill_(float("nan"))
        v.fill_(float("nan"))
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_matches_reference(model, prompts, outs, 8)
    stats = llm.llm_engine.stats()
    assert stats["preemptions"] > 0 and stats["chunked_prefill_steps"] > 0
    assert sum(o.num_cached_tokens for o in outs) > 0


def test_prefix_cache_hits_show_in_num_cached_tokens(model):
    llm = LLM(model, max_model_len=128)
    base = random_prompts(1, 50, 50, seed=3)[0]
    first = llm.generate([base + [5]], GREEDY, use_tqdm=False)[0]
    second = llm.generate([base + [6]], GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 48  # 3 full blocks of 16
    assert llm.llm_engine.stats()["prefix_cache_hits"] >= 48
    assert_matches_reference(model, [base + [6]], [second], 8)


def test_seeded_sampling_is_reproducible_regardless_of_batch(model):
    params = SamplingParams(
        temperature=0.9, top_k=50, top_p=0.9, max_tokens=10, seed=1234, ignore_eos=True
    )
    prompt = random_prompts(1, 20, 20, seed=4)[0]
    alone = LLM(model, max_model_len=128).generate([prompt], params, use_tqdm=False)
    others = random_prompts(6, 5, 40, seed=5)
    mixed_params = [
        SamplingParams(temperature=1.0, max_tokens=12, seed=i, ignore_eos=True) for i in range(6)
    ]
    crowd = LLM(model, max_model_len=128, max_num_batched_tokens=24, seed=9).generate(
        others[:3] + [prompt] + others[3:],
        mixed_params[:3] + [params] + mixed_params[3:],
        use_tqdm=False,
    )
    assert crowd[3].outputs[0].token_ids == alone[0].outputs[0].token_ids
    # and a different seed gives a different continuation (10 tokens from 512: no accident)
    other = LLM(model, max_model_len=128).generate(
        [prompt],
        SamplingParams(
            temperature=0.9, top_k=50, top_p=0.9, max_tokens=10, seed=99, ignore_eos=True
        ),
        use_tqdm=False,
    )
    assert other[0].outputs[0].token_ids != alone[0].outputs[0].token_ids


def test_engine_seed_makes_unseeded_sampling_reproducible(model):
    prompts = random_prompts(4, 5, 30, seed=6)
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    a = LLM(model, max_model_len=128, seed=5).generate(prompts, params, use_tqdm=False)
    b = LLM(model, max_model_len=128, seed=5).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


def test_stop_conditions(model):
    prompt = random_prompts(1, 10, 10, seed=7)[0]
    llm = LLM(model, max_model_len=64)
    free_run = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    stop_tok = free_run[3]
    first_idx = free_run.index(stop_tok)
    # stop token ends the request, included in the output, reason "stop"
    out = llm.generate(
        [prompt],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_tok]),
        use_tqdm=False,
    )[0]
    assert out.outputs[0].token_ids == free_run[: first_idx + 1]
    assert out.outputs[0].finish_reason == "stop"
    # EOS: the engine's eos id ends it unless ignore_eos
    llm.llm_engine.eos_token_ids = frozenset({stop_tok})
    for req_params in (SamplingParams(temperature=0.0, max_tokens=8),):
        out = llm.generate([prompt], req_params, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == free_run[: first_idx + 1]
    # min_tokens: stop/EOS cannot be generated until that many tokens exist (masked)
    out = llm.generate(
        [prompt],
        SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8, stop_token_ids=[stop_tok]),
        use_tqdm=False,
    )[0]
    got = out.outputs[0].token_ids
    assert got[:first_idx] == free_run[:first_idx] and stop_tok not in got
    assert len(got) == 8 and out.outputs[0].finish_reason == "length"
    # max_model_len: a 60-token prompt in a 64-token window gets 4 tokens, reason "length"
    long_prompt = random_prompts(1, 60, 60, seed=8)[0]
    out = llm.generate(
        [long_prompt],
        SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].finish_reason == "length"


def test_streaming_deltas_add_up_to_final_outputs(model):
    engine = LLMEngine(model, max_model_len=128, max_num_batched_tokens=20)
    prompts = random_prompts(5, 3, 30, seed=9)
    params = [SamplingParams(temperature=0.0, max_tokens=3 + i, ignore_eos=True) for i in range(5)]
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"q{i}", p, sp)
    streamed = {f"q{i}": [] for i in range(5)}
    finished = []
    reqs = dict(engine.requests)
    while engine.has_unfinished_requests():
        for delta in engine.step():
            assert isinstance(delta, RequestOutput)
            assert len(delta.outputs[0].token_ids) == 1
            streamed[delta.request_id] += delta.outputs[0].token_ids
            if delta.finished:
                finished.append(delta.request_id)
                assert delta.outputs[0].finish_reason == "length"
    assert sorted(finished) == sorted(streamed)
    for rid, req in reqs.items():
        assert streamed[rid] == req.output_token_ids
        assert len(streamed[rid]) == req.sampling_params.max_tokens


def test_metrics_timestamps_are_ordered(model):
    outs = LLM(model, max_model_len=128).generate(
        random_prompts(3, 5, 20, seed=10), GREEDY, use_tqdm=False
    )
    for o in outs:
        m = o.metrics
        assert len(m.token_times) == len(o.outputs[0].token_ids) == 8
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time
        assert m.first_token_time == m.token_times[0]
        assert all(a <= b for a, b in zip(m.token_times, m.token_times[1:]))
        assert m.token_times[-1] <= m.finished_time


@pytest.mark.parametrize(
    "prompt, params, word",
    [
        ([], GREEDY, "prompt"),
        (list(range(3, 140)), GREEDY, "max_model_len"),
        ([5, 600, 7], GREEDY, "vocab|token ids"),
        ([5, -1], GREEDY, "token ids"),
        ("text without tokenizer", GREEDY, "tokenizer"),
    ],
)
def test_bad_prompts_raise_and_engine_keeps_serving(model, prompt, params, word):
    engine = LLMEngine(model, max_model_len=128)
    engine.add_request("ok", [5, 6, 7], GREEDY)
    with pytest.raises(ValueError, match=word):
        engine.add_request("bad", prompt, params)
    assert "bad" not in engine.requests
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [o.request_id for o in outs].count("ok") == 8
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 0),
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
    ],
)
def test_bad_sampling_params_name_the_argument(model, field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    # parameters changed after construction are checked again when the request is added
    params = SamplingParams(temperature=0.0)
    setattr(params, field, value)
    engine = LLMEngine(model, max_model_len=128)
    with pytest.raises(ValueError, match=field):
        engine.add_request("r", [1, 2, 3], params)
    assert not engine.has_unfinished_requests()


def test_duplicate_request_id_is_refused_and_generate_rolls_back(model):
    engine = LLMEngine(model, max_model_len=128)
    engine.add_request("same", [4, 5], GREEDY)
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("same", [6, 7], GREEDY)
    llm = LLM(model, max_model_len=128)
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([[4, 5, 6], []], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()  # the good one was withdrawn
    assert len(llm.generate([[4, 5, 6]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 8


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(num_kv_blocks=7, block_size=16, max_model_len=128), "num_kv_blocks"),
        (dict(block_size=0), "block_size"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(max_num_batched_tokens=-3), "max_num_batched_tokens"),
        (dict(attention_backend="numpy"), "attention_backend"),
        (dict(scheduling="fifo"), "scheduling"),
        (dict(max_model_len=5000), "max_model_len"),
        (
            dict(enable_chunked_prefill=False, max_num_batched_tokens=64, max_model_len=128),
            "max_num_batched_tokens",
        ),
    ],
)
def test_bad_engine_settings_raise_at_construction(model, kwargs, word):
    with pytest.raises(ValueError, match=word):
        LLM(model, **kwargs)


def test_readable_path_never_compiles_c(model, monkeypatch):
    """An engine on the readable path ("torch") builds no C library, neither at start-up nor
    while it runs; the default picks the fastest backend here ("cpu" where it builds)."""
    from llmlab.ops import cpu_library

    def refuse(*_):
        raise AssertionError("the readable path compiled or loaded the C kernels")

    monkeypatch.setattr(cpu_library, "_build", refuse)
    monkeypatch.setattr(cpu_library, "_lib", None)
    monkeypatch.setattr(cpu_library, "_error", None)
    llm = LLM(model, attention_backend="torch", max_model_len=64)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert type(llm.llm_engine.model_runner.model.layers[0]).__name__ == "DecoderLayer"


def test_default_backend_is_the_fastest_here(model):
    from llmlab.ops import cpu_backend

    engine = LLM(model, max_model_len=64).llm_engine
    want = "cpu" if cpu_backend.available()[0] else "torch"
    assert engine.config.attention_backend == want
    layer = engine.model_runner.model.layers[0]
    assert type(layer).__name__ == ("CpuDecoderLayer" if want == "cpu" else "DecoderLayer")
    with pytest.raises(ValueError, match="attention_backend"):
        LLM(model, attention_backend="gpu")


def test_default_pool_size_covers_max_num_seqs_requests(model):
    engine = LLMEngine(model, max_model_len=100, max_num_seqs=5, block_size=16)
    assert engine.num_kv_blocks == 5 * 7
    real_sized = LLMEngine(model, max_num_seqs=64, kv_cache_memory_bytes=1 << 20)
    from llmlab.engine.builder import kv_bytes_per_block

    assert real_sized.max_model_len == 1024  # tiny model's max_position_embeddings
    assert real_sized.num_kv_blocks == (1 << 20) // kv_bytes_per_block(model, 16)


def test_abort_frees_blocks_and_stops_the_request(model):
    engine = LLMEngine(model, max_model_len=128, max_num_batched_tokens=16)
    engine.add_request("a", random_prompts(1, 40, 40, seed=11)[0], GREEDY)
    engine.add_request("b", [3, 4, 5], GREEDY)
    engine.step()  # a is mid-prefill
    assert engine.kv_cache_manager.num_free_blocks < engine.num_kv_blocks
    assert engine.abort_request("a") and not engine.abort_request("a")
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert {o.request_id for o in outs} == {"b"}
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


@pytest.mark.slow
def test_stress_random_requests_with_preemption(model):
    rng = random.Random(1234)
    block_size, max_model_len, max_num_seqs, budget = 4, 96, 16, 48
    engine = LLMEngine(
        model,
        block_size=block_size,
        num_kv_blocks=60,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
    )
    num_requests = 320
    arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]] = {}
    expected: dict[str, int] = {}
    shared = [rng.randrange(3, 512) for _ in range(40)]
    for i in range(num_requests):
        n = rng.randint(1, 70)
        prompt = (shared[: rng.randint(0, 40)] + [rng.randrange(3, 512) for _ in range(n)])[:n]
        temp = rng.choice([0.0, 0.7, 1.0, 1.3])
        params = SamplingParams(
            temperature=temp,
            top_k=rng.choice([-1, 1, 20]),
            top_p=rng.choice([1.0, 0.9, 0.5]),
            max_tokens=rng.randint(1, 30),
            seed=rng.choice([None, i]),
            ignore_eos=True,
        )
        arrivals.setdefault(rng.randint(0, 150), []).append((f"r{i}", prompt, params))
        expected[f"r{i}"] = min(params.max_tokens, max_model_len - len(prompt))
    got = {rid: 0 for rid in expected}
    step, finished = 0, set()
    kv = engine.kv_cache_manager
    while step <= 150 or engine.has_unfinished_requests():
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
        for delta in engine.step():
            got[delta.request_id] += len(delta.outputs[0].token_ids)
            if delta.finished:
                finished.add(delta.request_id)
        out = engine.last_scheduler_output
        assert out.total_num_scheduled_tokens <= budget
        assert len(out.requests) <= max_num_seqs and len(engine.scheduler.running) <= max_num_seqs
        held = 0
        for req in engine.scheduler.running:
            blocks = kv.get_block_ids(req.request_id)
            assert len(blocks) * block_size >= req.num_computed_tokens
            assert len(blocks) <= -(-max_model_len // block_size)
            held += len(blocks)
        for req in engine.scheduler.waiting:
            assert kv.get_block_ids(req.request_id) == [] and req.num_computed_tokens == 0
        assert kv.num_free_blocks >= kv.num_blocks - held  # shared blocks count once
        step += 1
        assert step < 20000, "the engine stopped making progress"
    assert finished == set(expected)
    assert got == expected
    stats = engine.stats()
    assert stats["preemptions"] > 0 and stats["chunked_prefill_steps"] > 0
    assert kv.num_free_blocks == kv.num_blocks and not engine.requests
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)


def test_model_runner_builds_the_flat_batch(model):
    """Positions, slot_mapping, cu_seqlens_q, seq_lens and sampled rows of a mixed step, checked
    against a token-by-token computation from the block tables."""
    engine = LLMEngine(model, block_size=4, max_model_len=64, max_num_batched_tokens=12)
    engine.add_request("a", list(range(10, 19)), GREEDY)  # 9 tokens
    engine.add_request("b", list(range(30, 35)), GREEDY)  # 5 tokens
    engine.step()  # a: 9 (done), b: 3 of 5
    engine.add_request("c", list(range(50, 57)), GREEDY)  # 7 tokens
    out = engine.scheduler.schedule()  # a decode, b 2, c 7 -> 10 tokens
    assert [r.request_id for r in out.requests] == ["a", "b", "c"]
    assert out.num_new_tokens == [1, 2, 7] and out.num_computed_tokens == [9, 3, 0]
    inp = engine.model_runner.prepare_inputs(out)
    kv = engine.kv_cache_manager
    exp_ids, exp_pos, exp_slots = [], [], []
    for req, n, start in zip(out.requests, out.num_new_tokens, out.num_computed_tokens):
        table = kv.get_block_ids(req.request_id)
        for p in range(start, start + n):
            exp_ids.append(req.all_token_ids[p])
            exp_pos.append(p)
            exp_slots.append(table[p // 4] * 4 + p % 4)
    assert inp.input_ids.tolist() == exp_ids
    assert inp.positions.tolist() == exp_pos
    assert inp.metadata.slot_mapping.tolist() == exp_slots
    assert inp.metadata.cu_seqlens_q.tolist() == [0, 1, 3, 10]
    assert inp.metadata.seq_lens.tolist() == [10, 5, 7]
    assert inp.metadata.max_query_len == 7
    assert inp.sample_rows.tolist() == [0, 2, 9]  # b's chunk ends its prompt
    assert inp.metadata.block_tables.shape == (3, 3)
    for s, req in enumerate(out.requests):
        table = kv.get_block_ids(req.request_id)
        assert inp.metadata.block_tables[s, : len(table)].tolist() == table


def test_engine_keeps_freed_memory_on_glibc():
    """On Linux/glibc the engine fixes malloc's thresholds (once); elsewhere it reports False."""
    import sys

    from llmlab.engine.allocator import keep_freed_memory

    first = keep_freed_memory()
    assert keep_freed_memory() == first
    if sys.platform.startswith("linux"):
        import platform

        if platform.libc_ver()[0] == "glibc":
            assert first is True


# ---- what an OpenAI client asks for: logprobs, prompt logprobs, penalties, logit bias ----------


def run_all(engine):
    outs = {}
    while engine.has_unfinished_requests():
        for d in engine.step():
            outs.setdefault(d.request_id, []).append(d)
    return outs


@pytest.mark.parametrize("chunk", [2048, 7])  # whole prompts, and prompts split over steps
def test_logprobs_equal_log_softmax_of_the_reference_logits(model, chunk):
    engine = LLMEngine(model, max_model_len=128, max_num_batched_tokens=chunk)
    prompts = random_prompts(3, 5, 20, seed=4)
    reqs = [
        engine.add_request(
            f"r{i}",
            p,
            SamplingParams(
                temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2
            ),
        )
        for i, p in enumerate(prompts)
    ]
    run_all(engine)
    for p, req in zip(prompts, reqs):
        out = engine.make_output(req)
        seq = p + out.outputs[0].token_ids
        ref = model.logits_for(seq).float().log_softmax(-1)  # [T, vocab]
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(p)
        for pos in range(1, len(seq)):
            entry = (
                out.prompt_logprobs[pos] if pos < len(p) else out.outputs[0].logprobs[pos - len(p)]
            )
            tok = seq[pos]
            assert next(iter(entry)) == tok  # the chosen token first
            assert entry[tok].logprob == pytest.approx(float(ref[pos - 1, tok]), abs=1e-4)
            assert entry[tok].rank == int((ref[pos - 1] > ref[pos - 1, tok]).sum()) + 1
            top = ref[pos - 1].topk(3 if pos >= len(p) else 2)
            for v, t in zip(top.values.tolist(), top.indices.tolist()):
                assert entry[t].logprob == pytest.approx(v, abs=1e-4)


def test_prompt_logprobs_are_computed_even_when_the_prefix_is_cached(model):
    engine = LLMEngine(model, max_model_len=128, block_size=4)
    p = random_prompts(1, 30, 30, seed=9)[0]
    engine.add_request("warm", p, SamplingParams(temperature=0.0, max_tokens=1))
    run_all(engine)
    req = engine.add_request(
        "scored", p, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    )
    run_all(engine)
    out = engine.make_output(req)
    assert out.num_cached_tokens == 0 and all(e is not None for e in out.prompt_logprobs[1:])


def test_logit_bias_and_penalties_change_what_is_sampled(model):
    engine = LLMEngine(model, max_model_len=128)
    p = random_prompts(1, 8, 8, seed=2)[0]
    greedy = dict(temperature=0.0, max_tokens=12, ignore_eos=True)
    bias = engine.add_request("bias", p, SamplingParams(**greedy, logit_bias={77: 100.0}))
    plain = engine.add_request("plain", p, SamplingParams(**greedy))
    rep = engine.add_request(
        "rep",
        p,
        SamplingParams(
            **greedy, repetition_penalty=2.0, presence_penalty=2.0, frequency_penalty=2.0
        ),
    )
    run_all(engine)
    assert bias.output_token_ids == [77] * 12
    # the random tiny model repeats itself under greedy; the penalties break the loop
    assert len(set(plain.output_token_ids)) < 12
    assert len(set(rep.output_token_ids)) > len(set(plain.output_token_ids))


def test_stop_strings_end_generate_and_are_cut_from_the_text(real_model):
    model, tokenizer = real_model
    llm = LLM(model, tokenizer, max_model_len=128, num_kv_blocks=64)
    prompt = "Count: one, two, three,"
    base = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    stop = base.text[9:13]  # a few characters from the middle of the answer
    cut = base.text[: base.text.index(stop)]
    for include, want in ((False, cut), (True, cut + stop)):
        out = llm.generate(
            [prompt],
            SamplingParams(
                temperature=0.0,
                max_tokens=24,
                ignore_eos=True,
                stop=[stop],
                include_stop_str_in_output=include,
            ),
            use_tqdm=False,
        )[0].outputs[0]
        assert out.text == want and out.finish_reason == "stop" and out.stop_reason == stop
        assert out.token_ids == base.token_ids[: len(out.token_ids)] and len(out.token_ids) < 24
    assert llm.llm_engine.kv_cache_manager.num_free_blocks == llm.llm_engine.num_kv_blocks


def test_stop_strings_need_a_tokenizer(model):
    engine = LLMEngine(model, max_model_len=64)
    with pytest.raises(ValueError, match="stop"):
        engine.add_request("r", [1, 2], SamplingParams(stop=["x"]))
    assert not engine.has_unfinished_requests()
