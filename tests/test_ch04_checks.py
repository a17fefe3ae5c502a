"""Chapter 04's newer checkers: the learner's cached generation loop (run by the checker and
compared with generate_with_cache), the KV-calculator task and the utilisation question; EXERCISES complete."""
import pytest
import torch

from llmlab.check import ch04, ch05
from llmlab.check.core import NOT_ANSWERED, ExerciseInfo
from llmlab.generate import generate_with_cache
from llmlab.sampling import SamplingParams


GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)

def _attend(q, K, V, scale):
    n, T = q.shape[0], K.shape[0]
    g = q.shape[1] // K.shape[1]
    K, V = K.repeat_interleave(g, dim=1), V.repeat_interleave(g, dim=1)
    s = torch.einsum("nhd,thd->hnt", q, K) * scale
    fut = torch.arange(T) > torch.arange(T - n, T)[:, None]
    return torch.einsum("hnt,thd->nhd", s.masked_fill(fut, float("-inf")).softmax(-1), V)

def _forward(model, new_ids, cache, start_offset=0):
    start = cache[0][0].shape[0] + start_offset
    cos, sin = model.rope_cos_sin(torch.arange(start, start + len(new_ids)))
    x = model.embed_tokens(torch.tensor(new_ids))
    for layer, kv in zip(model.layers, cache):
        a = layer.self_attn
        q, k, v = a.qkv(layer.input_layernorm(x), cos, sin)
        kv[0] = torch.cat([kv[0], k]); kv[1] = torch.cat([kv[1], v])
        x = x + a.o_proj(_attend(q, kv[0], kv[1], a.scale).flatten(1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.compute_logits(model.norm(x[-1:]))

def _loop(model, prompt_ids, n, *, offset=0, recompute=False, with_prompt=False):
    cfg = model.config
    empty = torch.zeros(0, cfg.num_key_value_heads, cfg.head_dim)
    out = []
    cache = [[empty, empty] for _ in model.layers]
    new = list(prompt_ids)
    for i in range(n):
        if recompute:
            cache = [[empty, empty] for _ in model.layers]
            new = list(prompt_ids) + out
        out.append(int(_forward(model, new, cache, offset if i else 0).argmax()))
        new = out[-1:]
    return (list(prompt_ids) + out) if with_prompt else out

def right(model, p, n): return _loop(model, p, n)
def no_cache(model, p, n): return _loop(model, p, n, recompute=True)
def bad_decode(model, p, n): return _loop(model, p, n, offset=3)
def with_prompt(model, p, n): return _loop(model, p, n, with_prompt=True)
def package(model, p, n): return generate_with_cache(model, p, max_new_tokens=n, params=GREEDY).token_ids
def boom(model, p, n): raise KeyError("nope")

@pytest.mark.slow
def test_generate_greedy_runs_the_learners_loop_and_names_each_slip(real_model):
    """The checker calls the learner's function on the real model: the right loop passes; a loop
    without a cache (the right tokens, the whole sequence fed every step), one that calls the
    package, one that returns the prompt too, one with a wrong decode position and one that
    raises are each named; the package works again afterwards."""
    model, _ = real_model
    assert ch04.generate_greedy(right).passed
    assert ch04.generate_greedy(None).message == NOT_ANSWERED
    assert "function itself" in ch04.generate_greedy("the copied text").message
    slow = ch04.generate_greedy(no_cache)
    assert not slow.passed and "embedded" in slow.message
    assert "own forward" in ch04.generate_greedy(package).message
    assert "without the prompt" in ch04.generate_greedy(with_prompt).message
    assert "later ones differ" in ch04.generate_greedy(bad_decode).message
    assert "KeyError" in ch04.generate_greedy(boom).message
    assert generate_with_cache(model, [1, 2, 3], max_new_tokens=2, params=GREEDY).token_ids
    assert "forward" not in vars(model)


def test_budget_checkers_name_the_mistake_before_the_formula():
    from llmlab.check import core

    core._WRONG_TRIES.pop("ch04.max_requests_fp8", None)     # other tests may have tried it
    assert ch04.max_requests_fp8(51).passed
    first = ch04.max_requests_fp8(7)
    assert not first.passed and "utilisation ×" not in first.message
    second = ch04.max_requests_fp8(7)
    assert "utilisation ×" in second.message and "51" not in second.message
    assert ch04.utilization_gain(1.2166).passed
    assert "whole card" in ch04.utilization_gain(0.95 / 0.90).message


def test_exercises_tables_cover_every_checker():
    for mod in (ch04, ch05):
        names = {n for n, o in vars(mod).items() if callable(o) and not n.startswith("_")
                 and getattr(o, "__module__", "") == mod.__name__
                 and o.__annotations__.get("return") == "CheckResult"}
        assert names == set(mod.EXERCISES), mod.__name__
        assert all(isinstance(v, ExerciseInfo) for v in mod.EXERCISES.values())
        assert sum(v.kind == "reasoning" for v in mod.EXERCISES.values()) >= 2
