"""Multi-step scheduling (`num_scheduler_steps`): the engine's tokens equal one forward per step,
token for token (the real model in three precisions through the one-call C loop and the batch
loop, a tiny model under preemption, prefix hits, aborts and stop tokens), the slots of K
tokens reserved or none, no block kept after a request ends, and bad settings refused."""

from __future__ import annotations

import json
import random

import httpx
import pytest
import torch
from engine_fuzz import drive
from greedy_match import assert_greedy_match, assert_same_or_near_tie, hf_greedy

from llmlab import LLM, SamplingParams
from llmlab.config import PRECISIONS
from llmlab.core.scheduler import Scheduler
from llmlab.engine import LLMEngine
from llmlab.model import tiny_model
from llmlab.ops import cpu_backend, cpu_matmul_choice
from llmlab.serve.api_server import build_app
from llmlab.serve.grammar_compiler import GrammarLimits
from llmlab.serve.launch import ServerThread
from llmlab.utils import cdiv

K = 8
WEIGHTS = ("float32", "bfloat16", "int8")  # the weight precisions, by PRECISIONS' names


def _stream(engine: LLMEngine, requests: list) -> tuple[dict, int]:
    """Run `requests` ((id, prompt, params)) to the end: ({id: (tokens, finish_reason)}, the
    most tokens one delta brought)."""
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    got: dict = {rid: ([], None) for rid, _, _ in requests}
    most = 0
    while engine.has_unfinished_requests():
        for d in engine.step():
            out = d.outputs[0]
            got[d.request_id][0].extend(out.token_ids)
            most = max(most, len(out.token_ids))
            if d.finished:
                got[d.request_id] = (got[d.request_id][0], out.finish_reason)
    kv = engine.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks, "a request kept blocks after it ended"
    return got, most


@pytest.mark.skipif(not cpu_backend.available()[0], reason="no C compiler: no 'cpu' fast path")
@pytest.mark.parametrize(
    "precision, kernel",
    [(p, "llmlab") for p in WEIGHTS] + [("float32", "onednn")],
    ids=[*WEIGHTS, "float32-dense-gemv"],
)
def test_real_model_multi_step_equals_one_forward_per_step(
    real_model, precision, kernel, monkeypatch
):
    """Batch 1 through the one-call C loop (`greedy_decode`; its GEMVs on our packed copies, or
    with oneDNN as the batch kernel on the dense matrices), a stop token met mid-way, the end of
    max_model_len, then two requests at once through the batch loop: the same tokens and finish
    reasons as one forward per step, up to K tokens per delta."""
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: kernel)
    model, tokenizer = real_model
    prompt = tokenizer.encode("The three primary colours are")
    kw = dict(max_model_len=len(prompt) + 45, attention_backend="cpu", **PRECISIONS[precision])
    plain = LLMEngine(model, tokenizer, **kw)
    multi = LLMEngine(model, tokenizer, num_scheduler_steps=K, **kw)
    assert multi.model_runner.model.greedy_decode_applies(multi.model_runner.kv_caches)
    greedy = SamplingParams(temperature=0.0, max_tokens=37, ignore_eos=True)
    first = [("a", prompt, greedy)]
    plain_a, _ = _stream(plain, first)
    tokens = plain_a["a"][0]
    # a stop token first met in the middle of a K-token step, after a full one
    stop_at = next(
        t for i, t in enumerate(tokens) if i > K + 1 and i % K != 0 and t not in tokens[:i]
    )
    requests = [
        first,
        [("s", prompt, SamplingParams(temperature=0.0, max_tokens=37, stop_token_ids=[stop_at]))],
        [("l", prompt, SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))],
        [("b1", prompt, greedy), ("b2", prompt[:4], greedy)],
    ]
    finish = {}
    for batch in requests:
        want = plain_a if batch is first else _stream(plain, batch)[0]
        got, most = _stream(multi, batch)
        assert got == want, f"{precision}: {[rid for rid, _, _ in batch]}"
        assert most == K, (batch[0][0], most)
        finish.update({rid: reason for rid, (_, reason) in got.items()})
    assert got["b1"][0] == tokens and finish["s"] == "stop" and finish["l"] == "length"


@pytest.mark.skipif(not cpu_backend.available()[0], reason="no C compiler: no 'cpu' fast path")
def test_real_model_multi_step_matches_hugging_face(real_model, hf_model):
    """The one-call C loop against transformers' greedy `generate`."""
    model, tokenizer = real_model
    prompt = tokenizer.encode("Write a short poem about the sea.")
    llm = LLM(model, tokenizer, attention_backend="cpu", num_scheduler_steps=K)
    ours = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    ref = hf_greedy(hf_model, prompt, 40)
    assert_greedy_match(ours[0].outputs[0].token_ids, ref, prompt, hf_model, "multi-step")


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_fuzz_multi_step_under_preemption_prefix_hits_and_aborts(backend, monkeypatch):
    """Random arrivals, shared prefixes, aborts, stop tokens and a pool small enough to preempt:
    after every step a running request holds exactly the blocks of its computed tokens, the
    pool is whole at the end, and every finished output equals one forward per step (on the
    "cpu" backend, steps of one request through the one-call C loop among them)."""
    if backend == "cpu" and not cpu_backend.available()[0]:
        pytest.skip("no C compiler: no 'cpu' fast path")
    monkeypatch.setattr(cpu_matmul_choice, "choice", lambda dtype, save=True: "llmlab")
    model = tiny_model(seed=3)
    rng = random.Random(5)
    bs = 4
    kw = dict(
        block_size=bs,
        num_kv_blocks=40,
        max_model_len=96,
        max_num_seqs=6,
        max_num_batched_tokens=40,
        attention_backend=backend,
    )
    engine = LLMEngine(model, num_scheduler_steps=K, **kw)
    one_call = []  # steps the one-call C loop ran
    fast = engine.model_runner.model
    if backend == "cpu":
        loop = fast.greedy_decode
        fast.greedy_decode = lambda *a: one_call.append(1) or loop(*a)
    shared = [rng.randrange(3, 500) for _ in range(30)]
    arrivals: dict[int, list] = {}
    for i in range(40):
        prompt = (shared[: rng.randint(0, 30)] + [rng.randrange(3, 500) for _ in range(20)])[
            : rng.randint(1, 45)
        ]
        stops = [rng.randrange(3, 500) for _ in range(40)] if i % 3 == 0 else None
        params = SamplingParams(
            temperature=0.0, max_tokens=rng.randint(1, 30), ignore_eos=True, stop_token_ids=stops
        )
        arrivals.setdefault(rng.randint(0, 30), []).append((f"r{i}", prompt, params))
    multi_steps = []

    def count_multi_steps():
        multi_steps.append(engine.last_scheduler_output.num_steps > 1)

    tokens, finished, aborted = drive(engine, arrivals, rng, 30, count_multi_steps)
    assert engine.stats()["preemptions"] > 0 and any(multi_steps)
    assert (len(one_call) > 0) == (backend == "cpu")
    done = sorted(finished - aborted)
    plain = LLM(model, **kw).generate(
        [tokens[r][0] for r in done], [tokens[r][1] for r in done], use_tqdm=False
    )
    for rid, want in zip(done, plain):
        prompt, params, got = tokens[rid]
        assert_same_or_near_tie(model, prompt, got, want.outputs[0].token_ids)


def test_seeded_sampling_multi_step_equals_one_forward_per_step():
    """Seeded sampled requests (the batch loop: each forward samples with the request's own
    generator, in the same order as one forward per step)."""
    model = tiny_model(seed=2)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=s, max_tokens=21, ignore_eos=True)
        for s in (1, 2, 3)
    ]
    want = LLM(model).generate(prompts, params, use_tqdm=False)
    got = LLM(model, num_scheduler_steps=4).generate(prompts, params, use_tqdm=False)
    for a, b in zip(got, want):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_schedule_steps_reserves_k_slots_or_none():
    """A decode step of requests that may take K tokens reserves their slots and says K; one
    whose sampling looks at the tokens before (logprobs), or a pool without the room, leaves
    the step at one forward with nothing allocated."""
    model = tiny_model(seed=1)
    bs = 4

    def decoding(num_kv_blocks: int, params: SamplingParams, n: int = 1):
        engine = LLMEngine(model, block_size=bs, num_kv_blocks=num_kv_blocks, max_model_len=16)
        for i in range(n):
            engine.add_request(f"r{i}", [5 + 10 * i + j for j in range(5)], params)
        engine.step()  # the prompts and their first tokens
        return engine, engine.scheduler.schedule()

    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine, out = decoding(16, greedy)
    kv, req = engine.kv_cache_manager, out.requests[0]
    engine.scheduler.schedule_steps(out, K)
    assert out.num_steps == K
    assert len(kv.get_block_ids("r0")) == cdiv(req.num_computed_tokens + K, bs)

    engine, out = decoding(16, SamplingParams(temperature=0.0, max_tokens=20, logprobs=2))
    before = engine.kv_cache_manager.num_free_blocks
    engine.scheduler.schedule_steps(out, K)
    assert out.num_steps == 1 and engine.kv_cache_manager.num_free_blocks == before

    engine, out = decoding(5, greedy, n=2)  # each holds 2 blocks and needs 2 more: 1 is free
    before = engine.kv_cache_manager.num_free_blocks
    assert before == 1 and len(out.requests) == 2
    engine.scheduler.schedule_steps(out, K)
    assert out.num_steps == 1 and engine.kv_cache_manager.num_free_blocks == before

    engine, out = decoding(16, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.scheduler.schedule_steps(out, K)
    assert out.num_steps == 3  # max_tokens: 1 made, 3 to go


class _InterfaceOnly:
    """A scheduler with `Scheduler`'s interface but not its multi-step method."""

    add_request = schedule = update_from_output = finish_request = has_unfinished_requests = (
        Scheduler.schedule
    )


@pytest.mark.parametrize(
    "extra, names",
    [
        ({"num_scheduler_steps": 0}, "num_scheduler_steps must be an int >= 1"),
        ({"num_scheduler_steps": True}, "num_scheduler_steps must be an int >= 1"),
        ({"num_scheduler_steps": 2.0}, "num_scheduler_steps must be an int >= 1"),
        (
            {"num_scheduler_steps": 2, "speculative_config": {"method": "ngram"}},
            "num_scheduler_steps > 1 cannot be combined with speculative_config",
        ),
        (
            {"num_scheduler_steps": 2, "scheduler_cls": _InterfaceOnly},
            "num_scheduler_steps > 1 needs a scheduler_cls that subclasses",
        ),
    ],
)
def test_bad_multi_step_settings_are_refused(extra, names):
    with pytest.raises(ValueError, match=names):
        LLMEngine(tiny_model(seed=0), **extra)


@pytest.mark.skipif(not cpu_backend.available()[0], reason="no C compiler: no 'cpu' fast path")
def test_greedy_steps_refuses_bad_arguments_naming_them(real_model):
    model, tokenizer = real_model
    engine = LLMEngine(model, tokenizer, attention_backend="cpu", max_model_len=64)
    fast = engine.model_runner.model
    stack = fast._one_call_layers(engine.model_runner.kv_caches)
    half = fast.layers[0].plan.head_dim // 2
    args = dict(
        head=fast.decode_head,
        token=5,
        cos=torch.zeros(2, half),
        sin=torch.zeros(2, half),
        caches=engine.model_runner.kv_caches,
        slots=torch.tensor([0, 1]),
        block_table=torch.zeros(4, dtype=torch.int32),
        seq_lens=torch.tensor([1, 2], dtype=torch.int32),
        stop_ids=torch.tensor([0]),
    )
    for name, bad, match in (
        ("token", fast.decode_head.vocab, r"token must be in \[0, 49152\)"),
        ("token", -1, "token must be in"),
        ("slots", torch.tensor([0, 1], dtype=torch.int32), "slots is .* contiguous torch.int64"),
        ("seq_lens", torch.tensor([1, 2]), "seq_lens is .* contiguous torch.int32"),
        (
            "cos",
            torch.zeros(3, half),
            r"cos is \(3, 32\) .* expected contiguous torch.float32 \(2, 32\)",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            stack.greedy_steps(**{**args, name: bad})


@pytest.mark.model
def test_server_streams_the_same_tokens_k_at_a_time(real_model):
    """`serve --num-scheduler-steps`: a streamed completion's chunks, joined, are the tokens and
    text of one forward per step; a chunk brings up to K tokens."""
    model, tokenizer = real_model
    prompt = "The capital of France is"
    llm = LLM(model, tokenizer, max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    want = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    engine = LLMEngine(model, tokenizer, max_model_len=128, num_scheduler_steps=K)
    body = {
        "model": "m",
        "prompt": prompt,
        "max_tokens": 30,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    app = build_app(engine, "m", grammar_limits=GrammarLimits(workers=1))
    with ServerThread(app) as srv:
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = [x[6:] for x in r.iter_lines() if x.startswith("data: {")]
    chunks = [json.loads(x)["choices"][0] for x in lines]
    assert [t for c in chunks for t in c["token_ids"]] == want.token_ids
    assert "".join(c["text"] for c in chunks) == want.text
    assert max(len(c["token_ids"]) for c in chunks) == K
