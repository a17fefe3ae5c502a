"""Speculative decoding: the n-gram proposer, greedy verification, rejection sampling keeping the
target's distribution (chi-square, fixed seed), the engine's greedy output equal to plain greedy
token for token (tiny model under preemption, prefix hits, chunked prefill and aborts; the real
model), the block pool whole after rejections, acceptance counters equal a count by hand, and
bad configurations refused."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from engine_fuzz import drive
from greedy_match import assert_same_or_near_tie

from llmlab import LLM, SamplingParams
from llmlab.analysis.speculation import chi_square_sf
from llmlab.engine import LLMEngine
from llmlab.model import tiny_model
from llmlab.sampling.rejection_sampler import greedy_verify, rejection_sample
from llmlab.spec_decode import SpeculativeConfig
from llmlab.spec_decode.ngram_proposer import NgramProposer

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 3, "draft_num_layers": 1}
# a correct sampler fails a chi-square test at this level with this probability (per test)
CHI2_FAILURE_PROBABILITY = 1e-4


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1)


# ---- the pieces -------------------------------------------------------------------------------


def test_ngram_proposes_what_followed_the_longest_match():
    p = NgramProposer(prompt_lookup_min=1, prompt_lookup_max=3)
    # suffix [7, 8, 9] occurred at 1..3, followed by 4, 5
    assert p.propose([1, 7, 8, 9, 4, 5, 6, 7, 8, 9], 2) == [4, 5]
    assert p.propose([1, 7, 8, 9, 4, 5, 6, 7, 8, 9], 10) == [4, 5, 6, 7, 8, 9]
    # the longest n wins over an earlier shorter match: [2, 3] at 4..5 beats [3] at 0
    assert p.propose([3, 0, 0, 9, 2, 3, 5, 1, 2, 3], 1) == [5]
    assert p.propose([1, 2, 3, 4], 3) == []  # nothing repeats
    assert NgramProposer(2, 3).propose([5, 1, 6, 1], 2) == []  # only a 1-gram matches
    assert p.propose([4, 4], 3) == [4]  # the follower may be the last token
    assert p.propose([4, 4, 4], 0) == []


def test_greedy_verify_accepts_the_agreeing_prefix_then_one_target_token():
    assert greedy_verify([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert greedy_verify([5, 6, 7, 8], [5, 9, 7]) == [5, 6]  # correction at 2nd
    assert greedy_verify([5, 6], [1]) == [5]
    with pytest.raises(ValueError, match="target_token_ids"):
        greedy_verify([1, 2], [1, 2])


def _bigram(vocab: int, seed: int, sharp: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * sharp).softmax(-1)


def _chi2_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return chi_square_sf(counts.tolist(), (probs * counts.sum()).tolist())


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_rejection_sampling_keeps_the_target_distribution(deterministic_draft):
    """A toy target and draft over 4 tokens (bigrams: the next token's distribution depends on
    the last one). Speculative steps with k = 2 generate 3 tokens after a fixed context; the
    joint distribution of those 3 tokens must be the target's (64 cells, 12000 samples,
    chi-square; a correct sampler fails with probability CHI2_FAILURE_PROBABILITY)."""
    vocab, k, length, runs, start = 4, 2, 3, 12000, 0
    p_table, q_table = _bigram(vocab, 0, 1.5), _bigram(vocab, 1, 1.5)
    g = torch.Generator().manual_seed(1234)
    counts = torch.zeros(vocab**length, dtype=torch.float64)
    for _ in range(runs):
        seq = [start]
        while len(seq) <= length:
            drafts, q_rows, last = [], [], seq[-1]
            for _ in range(k):
                q = q_table[last]
                d = (
                    int(q.argmax())
                    if deterministic_draft
                    else int(torch.multinomial(q, 1, generator=g))
                )
                drafts.append(d)
                q_rows.append(q)
                last = d
            context = [seq[-1]] + drafts
            p = p_table[torch.tensor(context)]  # [k + 1, V]
            q = None if deterministic_draft else torch.stack(q_rows)  # [k, V]
            seq += rejection_sample(p, drafts, q, g)
        a, b, c = seq[1 : 1 + length]
        counts[(a * vocab + b) * vocab + c] += 1
    exact = torch.tensor(
        [
            float(p_table[start, a] * p_table[a, b] * p_table[b, c])
            for a, b, c in itertools.product(range(vocab), repeat=length)
        ]
    )
    assert _chi2_p_value(counts, exact) > CHI2_FAILURE_PROBABILITY


def test_a_biased_sampler_fails_the_same_test():
    """The test has power: accepting every draft (no rejection) is caught."""
    vocab, runs = 4, 12000
    p_table, q_table = _bigram(vocab, 0, 1.5), _bigram(vocab, 1, 1.5)
    g = torch.Generator().manual_seed(1234)
    counts = torch.zeros(vocab**2, dtype=torch.float64)
    for _ in range(runs):
        d = int(torch.multinomial(q_table[0], 1, generator=g))  # always accepted
        b = int(torch.multinomial(p_table[d], 1, generator=g))
        counts[d * vocab + b] += 1
    exact = torch.tensor(
        [float(p_table[0, a] * p_table[a, b]) for a, b in itertools.product(range(vocab), repeat=2)]
    )
    assert _chi2_p_value(counts, exact) < CHI2_FAILURE_PROBABILITY


def test_rejection_sample_checks_shapes():
    with pytest.raises(ValueError, match="target_probs"):
        rejection_sample(torch.full((2, 4), 0.25), [1, 2])
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(torch.full((3, 4), 0.25), [1, 2], torch.full((3, 4), 0.25))


def test_engine_sampling_with_drafts_keeps_the_target_distribution():
    """The whole engine at temperature 1 on a 4-token tiny model: the second and third output
    tokens, whose steps carry n-gram drafts, are distributed as the target says (16 cells,
    chi-square, fixed seed; fails with probability CHI2_FAILURE_PROBABILITY if correct)."""
    m = tiny_model(seed=3, vocab_size=4, bos_token_id=0, eos_token_id=3)
    prompt = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1]
    n = 3000
    llm = LLM(
        m,
        seed=7,
        max_num_seqs=256,
        max_num_batched_tokens=4096,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
    )
    outs = llm.generate(
        [prompt] * n, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    stats = llm.llm_engine.stats()
    assert stats["spec_decode_num_drafts"] > n // 2 and stats["spec_decode_num_accepted_tokens"] > 0
    counts = torch.zeros(16, dtype=torch.float64)
    for o in outs:
        t = o.outputs[0].token_ids
        counts[t[1] * 4 + t[2]] += 1
    probs = lambda seq: m.logits_for(seq)[-1].double().softmax(-1)  # noqa: E731
    exact = torch.zeros(16, dtype=torch.float64)
    p1 = probs(prompt)
    for a in range(4):
        p2 = probs(prompt + [a])
        for b in range(4):
            p3 = probs(prompt + [a, b])
            exact[b * 4 : (b + 1) * 4] += p1[a] * p2[b] * p3
    assert _chi2_p_value(counts, exact) > CHI2_FAILURE_PROBABILITY


# ---- the engine: greedy equals plain greedy ---------------------------------------------------


def _repetitive_prompts(n, seed, vocab=512):
    """Prompts that repeat a random phrase (n-gram drafts find matches) and random ones."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 8))]
        tail = [rng.randrange(3, vocab) for _ in range(rng.randint(0, 6))]
        body = phrase * rng.randint(1, 5) + tail
        prompts.append(body[: rng.randint(1, 60)])
    return prompts


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft_model"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(block_size=4, num_kv_blocks=24, max_num_seqs=8, max_model_len=80),  # preemption
        dict(max_num_batched_tokens=16),  # chunked prefill
        dict(attention_backend="torch", enable_prefix_caching=False),
    ],
    ids=["defaults", "tiny-pool", "chunked", "torch-no-prefix-cache"],
)
def test_greedy_speculative_equals_greedy_plain(model, spec, kwargs):
    prompts = _repetitive_prompts(16, seed=5)
    params = [
        SamplingParams(temperature=0.0, max_tokens=random.Random(i).randint(1, 24), ignore_eos=True)
        for i in range(len(prompts))
    ]
    kwargs = dict(dict(max_model_len=128), **kwargs)
    plain = LLM(model, **kwargs).generate(prompts, params, use_tqdm=False)
    llm = LLM(model, speculative_config=spec, **kwargs)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, a, b in zip(prompts, outs, plain):
        assert_same_or_near_tie(model, prompt, a.outputs[0].token_ids, b.outputs[0].token_ids)
        assert a.outputs[0].finish_reason == b.outputs[0].finish_reason
    engine = llm.llm_engine
    stats = engine.stats()
    assert stats["spec_decode_num_draft_tokens"] > 0
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    assert all(b.ref_cnt == 0 for b in engine.kv_cache_manager.block_pool.blocks)
    if "num_kv_blocks" in kwargs:
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft_model"])
def test_fuzz_random_requests_aborts_and_a_tiny_pool(model, spec):
    """Random arrivals, shared prefixes, aborts and a pool small enough to preempt: after every
    step each running request holds exactly the blocks of its computed tokens (rejected drafts'
    blocks handed back), and every finished output equals the plain engine's greedy output."""
    rng = random.Random(99)
    bs, max_len = 4, 96
    kw = dict(
        block_size=bs,
        num_kv_blocks=40,
        max_model_len=max_len,
        max_num_seqs=12,
        max_num_batched_tokens=40,
    )
    engine = LLMEngine(model, speculative_config=spec, **kw)
    shared = [rng.randrange(3, 512) for _ in range(12)] * 3
    arrivals: dict[int, list] = {}
    for i in range(60):
        prompt = shared[: rng.randint(0, 36)] + _repetitive_prompts(1, seed=i)[0]
        prompt = prompt[: rng.randint(1, 50)]
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 30), ignore_eos=True)
        arrivals.setdefault(rng.randint(0, 40), []).append((f"r{i}", prompt, params))

    def check_step():
        out = engine.last_scheduler_output
        assert out.total_num_scheduled_tokens <= kw["max_num_batched_tokens"]
        for req in engine.scheduler.running:
            assert req.num_computed_tokens < req.num_tokens  # no draft K/V kept

    tokens, finished, aborted = drive(engine, arrivals, rng, 40, check_step)
    stats = engine.stats()
    assert stats["preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    assert stats["spec_decode_num_draft_tokens"] > 0
    done = sorted(finished - aborted)
    plain = LLM(model, **kw).generate(
        [tokens[r][0] for r in done], [tokens[r][1] for r in done], use_tqdm=False
    )
    for rid, want in zip(done, plain):
        prompt, params, got = tokens[rid]
        assert len(got) == params.max_tokens
        assert_same_or_near_tie(model, prompt, got, want.outputs[0].token_ids)
    for rid in aborted - finished:  # an aborted request's tokens: a prefix
        prompt, params, got = tokens[rid]
        assert len(got) < params.max_tokens


def test_acceptance_counters_equal_a_count_by_hand(model):
    """One request, n-gram drafts: replay its plain greedy output and count by hand which
    drafts the verifier must accept; the engine's counters, per request and in stats(), agree."""
    prompt = [10, 11, 12, 13, 14] * 4
    k, max_tokens = 3, 40
    want = LLM(model).generate(
        [prompt],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        use_tqdm=False,
    )
    want = want[0].outputs[0].token_ids
    proposer = NgramProposer(1, 3)
    seq, drafts_n, draft_tokens, accepted, per_pos = prompt + want[:1], 0, 0, 0, [0] * k
    while len(seq) - len(prompt) < max_tokens:
        allowed = min(k, max_tokens - (len(seq) - len(prompt)) - 1)
        d = proposer.propose(seq, allowed) if allowed > 0 else []
        follow = want[len(seq) - len(prompt) :]
        a = 0
        while a < len(d) and d[a] == follow[a]:
            a += 1
        if d:
            drafts_n, draft_tokens, accepted = drafts_n + 1, draft_tokens + len(d), accepted + a
            for i in range(a):
                per_pos[i] += 1
        seq += follow[: a + 1]
    llm = LLM(
        model,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        },
    )
    out = llm.generate(
        [prompt],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert out.outputs[0].token_ids == want
    m = out.metrics
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (
        drafts_n,
        draft_tokens,
        accepted,
    )
    assert accepted > 0 and draft_tokens > accepted  # the case has both outcomes
    stats = llm.llm_engine.stats()
    assert stats["spec_decode_num_drafts"] == drafts_n
    assert stats["spec_decode_num_accepted_tokens_per_pos"] == per_pos
    assert stats["spec_decode_acceptance_rate"] == pytest.approx(accepted / draft_tokens)
    assert stats["spec_decode_mean_acceptance_length"] == pytest.approx(1 + accepted / drafts_n)


def test_requests_the_verifier_does_not_cover_decode_plainly_beside_drafted_ones(model):
    """logprobs, penalties and min_tokens in a speculating engine: the same tokens and logprobs
    as the plain engine (those requests take no drafts), next to drafted requests."""
    prompts = [[7, 8, 9] * 5] * 4
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=12, min_tokens=5, stop_token_ids=[9]),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    plain = LLM(model).generate(prompts, params, use_tqdm=False)
    llm = LLM(model, speculative_config=NGRAM)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(outs, plain):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert [list(e) for e in outs[0].outputs[0].logprobs] == [
        list(e) for e in plain[0].outputs[0].logprobs
    ]
    assert outs[0].metrics.num_drafts == outs[1].metrics.num_drafts == 0
    assert outs[3].metrics.num_drafts > 0


def test_streamed_deltas_carry_every_token(model):
    engine = LLMEngine(model, speculative_config=NGRAM)
    prompt = [20, 21, 22, 23] * 6
    engine.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    got, multi = [], False
    while engine.has_unfinished_requests():
        for d in engine.step():
            got += d.outputs[0].token_ids
            multi |= len(d.outputs[0].token_ids) > 1
    plain = LLM(model).generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), use_tqdm=False
    )
    assert got == plain[0].outputs[0].token_ids and multi


@pytest.mark.parametrize(
    "config, word",
    [
        ({"method": "eagle"}, "method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"method": "ngram", "k": 3}, "unknown"),
        ({"method": "draft_model", "draft_num_layers": 2}, "draft_num_layers"),  # tiny has 2 layers
        ("ngram", "speculative_config"),
    ],
)
def test_bad_speculative_configs_name_the_key(model, config, word):
    with pytest.raises(ValueError, match=word):
        LLM(model, speculative_config=config)


def test_speculative_config_accepts_the_dataclass(model):
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=2)
    assert LLM(model, speculative_config=cfg).llm_engine.speculative_config == cfg


# ---- the real model ---------------------------------------------------------------------------


@pytest.mark.model
def test_real_model_greedy_speculative_equals_plain(real_model):
    model, tokenizer = real_model
    prompts = [
        "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig. "
        "Again: apple, banana, cherry,",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    ]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    kw = dict(max_model_len=256, num_kv_blocks=64)
    plain = LLM(model, tokenizer, **kw).generate(prompts, params, use_tqdm=False)
    for spec in (
        {"method": "ngram", "num_speculative_tokens": 4},
        {"method": "draft_model", "num_speculative_tokens": 2, "draft_num_layers": 8},
    ):
        llm = LLM(model, tokenizer, speculative_config=spec, **kw)
        outs = llm.generate(prompts, params, use_tqdm=False)
        for a, b in zip(outs, plain):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids, spec["method"]
            assert a.outputs[0].text == b.outputs[0].text
        stats = llm.llm_engine.stats()
        assert stats["spec_decode_num_accepted_tokens"] > 0, spec["method"]
        assert llm.llm_engine.kv_cache_manager.num_free_blocks == llm.llm_engine.num_kv_blocks


@pytest.mark.model
def test_real_model_stop_string_inside_accepted_drafts(real_model):
    """A stop string met among a step's several tokens ends the text there and drops the tokens
    after it: text, tokens and finish reason as without speculation."""
    model, tokenizer = real_model
    prompt = "Say it twice: one two three four five six. Again: one two three"
    base = (
        LLM(model, tokenizer, max_model_len=128)
        .generate(
            [prompt],
            SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
            use_tqdm=False,
        )[0]
        .outputs[0]
    )
    stop = base.text[len(base.text) // 3 : len(base.text) // 3 + 3]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[stop])
    want = LLM(model, tokenizer, max_model_len=128).generate([prompt], params, use_tqdm=False)[0]
    llm = LLM(
        model,
        tokenizer,
        max_model_len=128,
        speculative_config={"method": "ngram", "num_speculative_tokens": 4},
    )
    got = llm.generate([prompt], params, use_tqdm=False)[0]
    assert got.outputs[0].text == want.outputs[0].text
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert got.outputs[0].finish_reason == "stop" and got.outputs[0].stop_reason == stop
    assert got.metrics.num_accepted_tokens > 0
    assert llm.llm_engine.kv_cache_manager.num_free_blocks == llm.llm_engine.num_kv_blocks


# ---- the server -------------------------------------------------------------------------------


def test_server_speculates_and_reports_vllm_spec_decode_metrics(model):
    import httpx

    from llmlab.serve.api_server import build_app
    from llmlab.serve.launch import ServerThread
    from llmlab.serve.prometheus import parse_prometheus

    prompt = [10, 11, 12, 13, 14] * 4
    want = LLM(model).generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True), use_tqdm=False
    )
    engine = LLMEngine(model, max_model_len=128, speculative_config=NGRAM)
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 20,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    with ServerThread(build_app(engine, "tiny")) as srv:
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200
        assert r.json()["choices"][0]["token_ids"] == want[0].outputs[0].token_ids
        streamed = []
        with httpx.stream(
            "POST", srv.url + "/v1/completions", json=dict(body, stream=True), timeout=60
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    streamed += json.loads(line[6:])["choices"][0].get("token_ids") or []
        assert streamed == want[0].outputs[0].token_ids
        metrics = parse_prometheus(httpx.get(srv.url + "/metrics", timeout=10).text)
    stats = engine.stats()
    lb = '{model_name="tiny"}'
    assert metrics["vllm:spec_decode_num_drafts_total" + lb] == stats["spec_decode_num_drafts"] > 0
    assert (
        metrics["vllm:spec_decode_num_draft_tokens_total" + lb]
        == stats["spec_decode_num_draft_tokens"]
    )
    assert (
        metrics["vllm:spec_decode_num_accepted_tokens_total" + lb]
        == stats["spec_decode_num_accepted_tokens"]
        > 0
    )
    assert (
        metrics[
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}'
        ]
        == stats["spec_decode_num_accepted_tokens_per_pos"][0]
    )


def test_serve_speculative_config_flag_is_checked():
    import argparse

    from llmlab.serve.launch import speculative_config_arg

    assert speculative_config_arg('{"method": "ngram", "num_speculative_tokens": 2}') == {
        "method": "ngram",
        "num_speculative_tokens": 2,
    }
    with pytest.raises(argparse.ArgumentTypeError, match="not JSON"):
        speculative_config_arg("{method: ngram}")
    with pytest.raises(argparse.ArgumentTypeError, match="num_speculative_tokens"):
        speculative_config_arg('{"method": "ngram", "num_speculative_tokens": -1}')


@pytest.mark.slow
def test_the_serve_command_takes_speculative_config():
    import httpx

    from llmlab.serve.launch import ServerProcess
    from llmlab.serve.prometheus import parse_prometheus

    with ServerProcess(
        "tiny",
        [
            "--max-model-len",
            "64",
            "--num-kv-blocks",
            "16",
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 3}',
        ],
        start_timeout=120,
    ) as srv:
        r = httpx.post(
            srv.url + "/v1/completions",
            timeout=30,
            json={
                "model": "tiny",
                "prompt": [20, 21, 22, 23] * 3,
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 8
        m = parse_prometheus(httpx.get(srv.url + "/metrics", timeout=10).text)
        assert m['vllm:spec_decode_num_drafts_total{model_name="tiny"}'] > 0
        assert m['vllm:spec_decode_num_accepted_tokens_total{model_name="tiny"}'] > 0


def test_speculation_is_a_proposer_the_one_runner_holds(model):
    """One step loop: with or without speculation the engine runs the same `Scheduler` and
    `ModelRunner`; speculation is a proposer the runner holds (n-gram, or the draft model on
    the runner's own model) and draft slots the scheduler gives."""
    from llmlab.engine import ModelRunner, Scheduler
    from llmlab.spec_decode import EarlyExitProposer, NgramProposer

    plain = LLM(model).llm_engine
    assert type(plain.scheduler) is Scheduler and type(plain.model_runner) is ModelRunner
    assert plain.model_runner.drafter is None and plain.scheduler.num_speculative_tokens == 0
    assert "spec_decode_num_drafts" not in plain.stats()
    for spec, kind in ((NGRAM, NgramProposer), (DRAFT, EarlyExitProposer)):
        engine = LLM(model, speculative_config=spec).llm_engine
        assert type(engine.scheduler) is Scheduler and type(engine.model_runner) is ModelRunner
        assert isinstance(engine.model_runner.drafter, kind)
        assert engine.scheduler.num_speculative_tokens == spec["num_speculative_tokens"]
    assert engine.model_runner.drafter.model is engine.model_runner.model


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft_model"])
def test_sampled_requests_under_preemption_finish_with_the_pool_whole(model, spec):
    """Mixed temperatures, top-k/top-p, seeds, a pool small enough to preempt: every request
    gets exactly its max_tokens and every block comes back."""
    rng = random.Random(7)
    engine = LLMEngine(
        model,
        block_size=4,
        num_kv_blocks=30,
        max_model_len=80,
        max_num_seqs=10,
        max_num_batched_tokens=32,
        speculative_config=spec,
    )
    want = {}
    for i, prompt in enumerate(_repetitive_prompts(30, seed=11)):
        params = SamplingParams(
            temperature=rng.choice([0.0, 0.5, 1.0]),
            top_k=rng.choice([-1, 5]),
            top_p=rng.choice([1.0, 0.8]),
            seed=rng.choice([None, i]),
            max_tokens=rng.randint(1, 25),
            ignore_eos=True,
        )
        engine.add_request(f"r{i}", prompt, params)
        want[f"r{i}"] = min(params.max_tokens, 80 - len(prompt))
    got = {rid: 0 for rid in want}
    while engine.has_unfinished_requests():
        for d in engine.step():
            got[d.request_id] += len(d.outputs[0].token_ids)
    assert got == want
    kv = engine.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks and all(b.ref_cnt == 0 for b in kv.block_pool.blocks)
    stats = engine.stats()
    assert stats["preemptions"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0
