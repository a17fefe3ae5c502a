"""The chapter 03/04 generation loops: same tokens as transformers' generate."""

from __future__ import annotations

import pytest
from greedy_match import assert_greedy_match, hf_greedy

from llmlab.engine import generate
from llmlab.model import tiny_model
from llmlab.sampling import SamplingParams

PROMPTS = [
    "The capital of France is",
    "Write a haiku about GPUs.",
    "List three prime numbers:",
    "今天天气真好，",
    "请用一句话解释注意力机制。",
    "import torch\nx = torch.",
    "The key idea of paged attention is",
    "Q: What is 12 times 7?\nA:",
]


def test_both_loops_agree_on_the_tiny_model():
    model = tiny_model(seed=1)
    prompt = [3, 17, 99, 250, 4]
    a = generate.generate_no_cache(
        model, prompt, 20, SamplingParams(temperature=0, ignore_eos=True)
    )
    b = generate.generate_with_cache(
        model, prompt, 20, SamplingParams(temperature=0, ignore_eos=True)
    )
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20
    # the naive loop processes the whole sequence each step; the cached one a single token
    assert a.tokens_processed == sum(len(prompt) + i for i in range(20))
    assert b.tokens_processed == len(prompt) + 19
    assert a.num_forwards == b.num_forwards == 20


def test_seeded_sampling_is_reproducible_in_both_loops():
    model = tiny_model(seed=2)
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=123, ignore_eos=True)
    a = generate.generate_with_cache(model, [5, 6, 7], 15, p)
    b = generate.generate_no_cache(model, [5, 6, 7], 15, p)
    c = generate.generate_with_cache(
        model, [5, 6, 7], 15, SamplingParams(temperature=1.0, seed=124, ignore_eos=True)
    )
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_loops_validate_their_inputs():
    model = tiny_model()
    with pytest.raises(ValueError, match="prompt_ids"):
        generate.generate_with_cache(model, [], 4)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate.generate_no_cache(model, [model.config.vocab_size], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate.generate_with_cache(model, [1], 0)


@pytest.mark.model
@pytest.mark.slow
def test_greedy_loops_match_transformers_generate(real_model, hf_model):
    model, tok = real_model
    exact = 0
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        ref = hf_greedy(hf_model, ids, 32)
        params = SamplingParams(temperature=0, ignore_eos=True)
        cached = generate.generate_with_cache(model, ids, 32, params).token_ids
        # the no-cache loop re-runs the whole sequence every step: 12 tokens show it right at a
        # fraction of the cost (it also equals the cached loop on the tiny model, test above)
        naive = generate.generate_no_cache(model, ids, 12, params).token_ids
        exact += assert_greedy_match(cached, ref, ids, hf_model, f"cached loop, {prompt!r}")
        assert_greedy_match(naive, ref[:12], ids, hf_model, f"no-cache loop, {prompt!r}")
    assert exact >= len(PROMPTS) - 1


@pytest.mark.parametrize("loop", ["no_cache", "with_cache"])
def test_min_tokens_bans_stop_tokens_as_the_engine_does(loop):
    """One rule for min_tokens: EOS and stop tokens cannot be sampled before it; the loops of
    chapters 03-04 and `LLM` give the same tokens."""
    from llmlab import LLM
    from llmlab.engine.generate import generate_no_cache, generate_with_cache
    from llmlab.model import tiny_model

    model = tiny_model(seed=3)
    prompt = [5, 9, 17, 33]
    first = generate_with_cache(model, prompt, 1).token_ids[0]  # greedy's first token
    params = SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[first], max_tokens=12)
    run = generate_no_cache if loop == "no_cache" else generate_with_cache
    got = run(model, prompt, 12, params).token_ids
    want = LLM(model, max_model_len=64).generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert got == want.token_ids
    assert first not in got[:4] and len(got) >= 4
    assert got[-1] == first or len(got) == 12  # stopped by it, or length
