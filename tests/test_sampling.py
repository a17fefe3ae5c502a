"""Sampling: greedy, temperature, top-k, top-p; seeds; validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmlab.sampling import (
    SamplingParams,
    apply_logits_processors,
    apply_top_k_top_p,
    make_generator,
    sample,
)


def random_logits(seed: int, vocab: int = 50) -> torch.Tensor:
    return torch.randn(1, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = random_logits(0, 100).repeat(3, 1)
    out = sample(logits, [SamplingParams(temperature=0)] * 3)
    assert out.tolist() == [int(logits[0].argmax())] * 3


def test_greedy_runs_the_c_argmax_only_where_the_c_kernels_are_loaded(monkeypatch):
    """Float32 CPU logits go through the C argmax once this process runs the C kernels (an
    engine on the fast path loaded them), through torch where it does not (the readable path
    builds nothing) or where the rows are not contiguous; the same tokens every time."""
    from llmlab.ops import cpu_backend, cpu_library

    ok, why = cpu_backend.available()  # loads the library
    if not ok:
        pytest.skip(why)
    calls = []

    def spy(x):
        calls.append(tuple(x.shape))
        return real(x)

    real = cpu_backend.argmax_rows
    monkeypatch.setattr(cpu_backend, "argmax_rows", spy)
    wide = torch.randn(40, 6, generator=torch.Generator().manual_seed(3)).round()  # ties
    greedy = [SamplingParams(temperature=0)] * 6
    for logits, runs_c in ((wide.t().contiguous(), True), (wide.t(), False)):
        assert sample(logits, greedy).tolist() == logits.argmax(dim=-1).tolist()
        assert calls == ([(6, 40)] if runs_c else []), calls
        calls.clear()
    monkeypatch.setattr(cpu_library, "_lib", None)  # as in a process on the readable path
    assert sample(wide.t().contiguous(), greedy).tolist() == wide.argmax(dim=0).tolist()
    assert calls == []


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 10))
def test_top_k_never_samples_outside_the_k_most_likely(seed, k):
    logits = random_logits(seed)
    allowed = set(logits[0].topk(k).indices.tolist())
    params = [SamplingParams(temperature=1.5, top_k=k, seed=seed)]
    for draw in range(20):
        tok = int(sample(logits, params, [make_generator(seed * 100 + draw)])[0])
        assert tok in allowed


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), p=st.floats(0.05, 0.95))
def test_top_p_never_samples_outside_the_smallest_nucleus(seed, p):
    logits = random_logits(seed)
    probs = logits[0].softmax(-1)
    order = probs.argsort(descending=True)
    cum = probs[order].cumsum(0)
    size = int((cum < p).sum()) + 1  # smallest prefix with mass >= p
    nucleus = set(order[:size].tolist())
    masked = apply_top_k_top_p(logits, torch.tensor([50]), torch.tensor([p]))
    assert set(torch.isfinite(masked[0]).nonzero().flatten().tolist()) == nucleus
    params = [SamplingParams(temperature=1.0, top_p=p)]
    for draw in range(20):
        assert int(sample(logits, params, [make_generator(draw)])[0]) in nucleus


def test_same_seed_same_tokens_whatever_the_batch():
    logits = random_logits(7, 1000)
    p = SamplingParams(temperature=1.0, seed=42)
    alone = [int(sample(logits, [p], [g])[0]) for g in [make_generator(42)] for _ in range(5)]
    g1, g2 = make_generator(42), make_generator(9)
    batch = torch.cat([logits, random_logits(8, 1000)])
    together = [int(sample(batch, [p, SamplingParams(seed=9)], [g1, g2])[0]) for _ in range(5)]
    assert alone == together
    other = [int(sample(logits, [p], [g])[0]) for g in [make_generator(43)] for _ in range(5)]
    assert other != alone


def test_temperature_sharpens_the_distribution():
    logits = random_logits(3, 20)
    best = int(logits.argmax())
    g = make_generator(0)
    cold = [int(sample(logits, [SamplingParams(temperature=0.05)], [g])[0]) for _ in range(50)]
    hot = [int(sample(logits, [SamplingParams(temperature=2.0)], [g])[0]) for _ in range(200)]
    assert cold.count(best) >= 48
    assert len(set(hot)) > 5


@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 1e-38, 5e-6])
def test_a_temperature_below_the_epsilon_is_greedy(temperature):
    """vLLM's _SAMPLING_EPS: below 1e-5 is greedy. Dividing by 1e-40 (0 in float32) would make
    every logit inf and the softmax NaN; greedy gives the argmax even where logits are -inf."""
    p = SamplingParams(temperature=temperature)
    assert p.greedy and p.temperature == 0.0
    logits = random_logits(3, 300).repeat(4, 1)
    logits[1:, :200] = float("-inf")  # masked rows, as a grammar or min_tokens leaves them
    got = sample(logits, [p] * 4, [make_generator(0)] * 4)
    assert got.tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("temperature,raised", [(1e-5, 0.01), (3e-3, 0.01), (0.01, 0.01)])
def test_a_tiny_temperature_is_raised_to_vllms_floor(temperature, raised):
    """vLLM's _MAX_TEMP: a temperature in [1e-5, 1e-2) samples at 1e-2, finitely."""
    p = SamplingParams(temperature=temperature, seed=0)
    assert not p.greedy and p.temperature == raised
    logits = random_logits(4, 300)
    logits[0, :250] = float("-inf")
    tokens = {int(sample(logits, [p], [make_generator(s)])[0]) for s in range(20)}
    assert tokens and all(torch.isfinite(logits[0, t]) for t in tokens)


@pytest.mark.parametrize("temperature", [2.0001, 1e308, float("inf"), float("nan"), -1e-40])
def test_a_temperature_out_of_range_is_refused_naming_it(temperature):
    with pytest.raises(ValueError, match=r"temperature must be a number in \[0, 2\]"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", 0),
        ("top_k", -2),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("stop_token_ids", [-1]),
        ("top_k", 2**63),
        ("temperature", float("nan")),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0.0),
        ("logit_bias", {5: 101.0}),
        ("logprobs", 21),
        ("prompt_logprobs", -1),
        ("stop", [""]),
    ],
)
def test_bad_parameters_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_top_p_one_keeps_every_token_even_with_rounding():
    """top_p = 1.0 means off: float rounding of the running sum must not cut the tail."""
    logits = torch.randn(1, 49152, generator=torch.Generator().manual_seed(0)) * 4
    masked = apply_top_k_top_p(logits, torch.tensor([49152]), torch.tensor([1.0]))
    assert torch.isfinite(masked).all()


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_mixing_cut_and_uncut_rows_cuts_each_row_as_alone(seed):
    """Rows that ask for no cut are left as they are (not sorted at all); the others are cut as
    they would be in a batch of their own, whatever rows sit beside them."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 300, generator=g) * 3
    logits[1, :250] = float("-inf")  # a masked row, as structured output leaves it
    top_k = torch.tensor([300, 5, 300, 300, 40, 300])
    top_p = torch.tensor([1.0, 1.0, 0.7, 1.0, 0.9, 1.0])
    before = logits.clone()
    out = apply_top_k_top_p(logits, top_k, top_p)
    for row in range(6):
        alone = apply_top_k_top_p(logits[row : row + 1], top_k[row : row + 1], top_p[row : row + 1])
        assert torch.equal(out[row], alone[0]), row
        if top_k[row] == 300 and top_p[row] == 1.0:
            assert torch.equal(out[row], logits[row]), row
        else:
            assert (out[row] == float("-inf")).sum() > (logits[row] == float("-inf")).sum()
    assert out is not logits and torch.equal(logits, before)  # the input is left as it was


def test_top_k_beyond_the_vocabulary_means_all_tokens():
    logits = torch.randn(1, 50)
    g = torch.Generator().manual_seed(0)
    params = [SamplingParams(temperature=1.0, top_k=2**62, seed=0)]
    tokens = {int(sample(logits, params, [g])[0]) for _ in range(300)}
    assert len(tokens) > 20  # no overflow, no truncation


@pytest.mark.parametrize("seed", range(5))
def test_logits_processors_match_their_definitions(seed):
    torch.manual_seed(seed)
    vocab = 40
    logits = torch.randn(2, vocab)
    prompt, output = [1, 2, 3, 3], [3, 5, 5, 7, 5]
    params = SamplingParams(
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.5,
        logit_bias={7: 2.0, 9: -3.0},
    )
    got = logits.clone()
    apply_logits_processors(got, 1, params, prompt, output)
    want = logits[1].clone()
    want[7] += 2.0
    want[9] -= 3.0
    for t in set(prompt + output):  # repetition: prompt and output tokens
        want[t] = want[t] / 1.5 if want[t] > 0 else want[t] * 1.5
    for t in set(output):  # frequency (per count) and presence
        want[t] -= 0.25 * output.count(t) + 0.5
    assert torch.allclose(got[1], want, atol=1e-6)
    assert torch.equal(got[0], logits[0])  # other rows untouched
