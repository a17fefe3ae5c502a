"""The engine itself on a CUDA GPU: every feature correct there.

Skipped, saying so, without a CUDA GPU. `kernels/gpu_check.sh` runs it on a GPU machine, where
there is no network and no model file: the model is `random_model` with the real shape of
SmolLM2-135M, and the reference is transformers' `LlamaForCausalLM` holding the same weights. A
grammar needs a tokenizer: `synthetic_tokenizer` builds a byte-level one over the model's whole
vocabulary with the `tokenizers` package, which transformers brings.

Developers without a GPU can still check the tests' own logic: `LLMLAB_GPU_TESTS_ON_CPU=1` runs
the module on the CPU with a tiny model (it proves nothing about a GPU).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from greedy_match import assert_greedy_match, hf_greedy

from llmlab import LLM, SamplingParams
from llmlab.config import tiny_config
from llmlab.model import random_model
from llmlab.sampling import apply_logits_processors

ON_CPU = os.environ.get("LLMLAB_GPU_TESTS_ON_CPU") == "1"
HAVE_GPU = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (HAVE_GPU or ON_CPU), reason="needs a CUDA GPU (none here)"),
]
DEVICE = "cuda" if HAVE_GPU else "cpu"
SHAPE = "smollm2-135m" if HAVE_GPU else tiny_config(vocab_size=600, num_hidden_layers=2)
BACKENDS = ("triton", "cuda", "torch") if HAVE_GPU else ("torch",)
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model():
    """Random weights of the real shape, float32 on the device (parity with transformers is
    checked in float32: bfloat16 rounding makes near-ties of random logits common)."""
    return random_model(SHAPE, seed=0, dtype=torch.float32, device=DEVICE)


@pytest.fixture(scope="module")
def hf(model):
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(**model.config.to_hf_dict()))
    # our names are transformers' inside its `model.` (all but the LM head)
    state = {
        k if k.startswith("lm_head") else f"model.{k}": v for k, v in model.state_dict().items()
    }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.tie_weights()
    return hf.to(DEVICE).eval()


@pytest.fixture(scope="module")
def prompts(model):
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    lengths = [5, 17, 33, 48, 9, 61, 24, 40]
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def reference(hf, prompts):
    return [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


def greedy(model, prompts, **kwargs) -> list[list[int]]:
    llm = LLM(model, dtype="float32", device=DEVICE, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    engine = llm.llm_engine
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks  # nothing leaked
    return [o.outputs[0].token_ids for o in outs]


CONFIGS = {
    **{f"{b}": dict(attention_backend=b) for b in BACKENDS},
    **{f"{b}-eager": dict(attention_backend=b, enforce_eager=True) for b in BACKENDS[:2]},
    "default": {},
    "tiny-pool-chunked": dict(
        num_kv_blocks=12, block_size=16, max_model_len=96, max_num_batched_tokens=32
    ),
    "no-prefix-caching": dict(enable_prefix_caching=False),
    "ngram": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
    "draft-model": dict(speculative_config={"method": "draft_model", "num_speculative_tokens": 2}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_transformers(model, hf, prompts, reference, name):
    ours = greedy(model, prompts, **CONFIGS[name])
    for i, (o, r) in enumerate(zip(ours, reference)):
        assert_greedy_match(o, r, prompts[i], hf, label=f"{name} prompt {i}")


def test_a_tiny_pool_preempts_and_still_matches(model, hf, prompts, reference):
    llm = LLM(
        model, dtype="float32", device=DEVICE, num_kv_blocks=12, block_size=16, max_model_len=96
    )
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.llm_engine.stats()["preemptions"] > 0
    for i, o in enumerate(outs):
        assert_greedy_match(o.outputs[0].token_ids, reference[i], prompts[i], hf, f"prompt {i}")


def test_decode_graphs_replay_the_eager_tokens_at_bucket_sizes(model, prompts):
    """bfloat16, batches of exactly a captured size (1, 2, 4, 8): the replayed graph runs the
    eager step's kernels on the same shapes, so the tokens are identical."""
    for n in (1, 2, 4, 8):
        kwargs = dict(dtype="bfloat16", device=DEVICE)
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        on = LLM(model, **kwargs).generate(prompts[:n], params, use_tqdm=False)
        off = LLM(model, enforce_eager=True, **kwargs).generate(prompts[:n], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in on] == [o.outputs[0].token_ids for o in off]


SAMPLED = [
    SamplingParams(temperature=0.8, seed=1, max_tokens=16),
    SamplingParams(temperature=1.0, top_k=20, seed=2, max_tokens=16),
    SamplingParams(temperature=0.7, top_p=0.9, seed=3, max_tokens=16),
    SamplingParams(temperature=1.0, min_tokens=8, seed=4, max_tokens=16),
    SamplingParams(temperature=1.0, presence_penalty=1.0, frequency_penalty=0.5, seed=5),
    SamplingParams(temperature=1.0, repetition_penalty=1.3, seed=6, max_tokens=16),
    SamplingParams(temperature=1.0, logit_bias={7: 100.0}, seed=7, max_tokens=4),
    SamplingParams(temperature=0.9, logprobs=3, prompt_logprobs=2, seed=8, max_tokens=8),
]


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_every_sampling_feature_runs_and_seeds_reproduce_whatever_the_batch(model, prompts, spec):
    speculative = None if spec is None else {"method": spec, "num_speculative_tokens": 3}
    llm = LLM(model, device=DEVICE, speculative_config=speculative)
    together = llm.generate(prompts, SAMPLED, use_tqdm=False)
    alone = [llm.generate([p], [s], use_tqdm=False)[0] for p, s in zip(prompts, SAMPLED)]
    for a, b in zip(together, alone):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert all(t == 7 for t in together[6].outputs[0].token_ids)  # a +100 bias wins
    assert len(together[3].outputs[0].token_ids) >= 8  # min_tokens holds EOS back
    lp = together[7].outputs[0].logprobs
    assert len(lp) == len(together[7].outputs[0].token_ids)
    assert all(len(entry) >= 3 for entry in lp)
    engine = llm.llm_engine
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_logits_processors_on_the_device_equal_them_on_the_cpu():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 500, generator=g)
    params = SamplingParams(
        logit_bias={3: 2.0}, repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3
    )
    on_device = logits.to(DEVICE)
    apply_logits_processors(logits, 1, params, [1, 2, 3], [4, 4, 9])
    apply_logits_processors(on_device, 1, params, [1, 2, 3], [4, 4, 9])
    torch.testing.assert_close(on_device.cpu(), logits)


def test_logprobs_are_log_softmax_of_the_reference_logits(model, hf, prompts):
    llm = LLM(model, dtype="float32", device=DEVICE)
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=2, ignore_eos=True)
    out = llm.generate([prompts[1]], params, use_tqdm=False)[0].outputs[0]
    ids = torch.tensor([prompts[1] + out.token_ids[:-1]], device=DEVICE)
    with torch.no_grad():
        ref = hf(ids).logits[0, -len(out.token_ids) :].float().log_softmax(-1)
    for j, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert abs(entry[tok].logprob - float(ref[j, tok])) < 1e-3


@pytest.mark.parametrize("kwargs", [dict(kv_cache_dtype="fp8"), dict(quantization="int8")])
def test_fewer_bytes_run_and_mostly_agree_with_float(model, prompts, kwargs):
    """fp8 KV and int8 weights round differently from float32, so tokens may drift; the first
    token of most prompts must still agree (a broken kernel agrees with nothing)."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    base = LLM(model, device=DEVICE).generate(prompts, params, use_tqdm=False)
    low = LLM(model, device=DEVICE, **kwargs).generate(prompts, params, use_tqdm=False)
    agree = sum(a.outputs[0].token_ids[0] == b.outputs[0].token_ids[0] for a, b in zip(base, low))
    assert agree >= 6, f"{kwargs}: only {agree} of {len(prompts)} first tokens agree"


def synthetic_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer over `vocab_size` tokens: three special tokens (EOS is token 2,
    as in SmolLM2), the 256 byte symbols, then two-symbol strings of printable ASCII. Enough for
    xgrammar to build a mask over a random model's whole vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>"]
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(specials + symbols)}
    printable = [s for s in symbols if s.isascii() and s.isprintable()]
    merges = [(a, b) for a in printable for b in printable][: vocab_size - len(vocab)]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def test_a_grammar_holds_on_the_device(model):
    pytest.importorskip("xgrammar")
    from llmlab.sampling.structured_output import StructuredOutputsParams

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["n"],
    }
    tokenizer = synthetic_tokenizer(model.config.vocab_size)
    llm = LLM(model, tokenizer=tokenizer, device=DEVICE)
    grammar = StructuredOutputsParams(json=schema)
    params = [
        SamplingParams(temperature=t, seed=i, max_tokens=40, structured_outputs=grammar)
        for i, t in enumerate((0.0, 0.8, 1.0, 1.2))
    ]
    for out in llm.generate(["a"] * 4, params, use_tqdm=False):
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        value = json.loads(out.outputs[0].text)
        assert set(value) == {"n"} and 0 <= value["n"] <= 999
