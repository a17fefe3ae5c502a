"""Self-checks of chapter 04 (KV cache): the source chapter's self-check question 2
(Llama-3-70B's KV bytes per token and per 4K request) in three steps, our own model's cache, MLA,
the work a cache saves, the learner's own cached generation loop, and the KV budget on a GPU (fp8
KV, utilisation)."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.analysis import costs
from llmlab.config import get_config
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch01 import combine_mistakes
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    not_yet,
    passed,
    staged,
)
from llmlab.course.check.question import Expected, numeric

M = catalog("ch04")

PRESET = "llama-3-70b"  # 80 layers, hidden 8192, 64 query heads, 8 KV heads, head_dim 128
DTYPE_BYTES = 2  # BF16
REQUEST_TOKENS = 4096
PROMPT_LEN, NEW_TOKENS = 20, 100  # as in chapter 03's exercise

# the KV-calculator task: Llama-3-8B, BF16 weights on an H100, fp8 KV cache, 16K-token requests
BUDGET_MODEL, BUDGET_GPU, BUDGET_CONTEXT = "llama-3-8b", "H100-SXM", 16384
BUDGET_UTILIZATION, BUDGET_ACTIVATION_GB = 0.9, 1.0
# the utilisation question: Llama-3-8B, BF16 weights and KV, on a 24 GB L4
GAIN_GPU, GAIN_FROM, GAIN_TO = "L4", 0.90, 0.95


def _kv_mistakes(cfg, scale: float) -> list[tuple[float, str]]:
    """Typical wrong KV answers, each `scale` × (bytes per token per layer of that mistake)."""
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    from_hidden = costs.kv_bytes_per_token_from_hidden(cfg, DTYPE_BYTES) / cfg.num_hidden_layers
    group = cfg.num_attention_heads / cfg.num_key_value_heads  # query heads per KV head
    return combine_mistakes(
        (from_hidden * scale, M("kv.hidden_size")),
        (per_layer / 2 * scale, M("kv.k_without_v")),
        (per_layer * 8 * scale, M("kv.bits")),
        (per_layer / DTYPE_BYTES * scale, M("kv.numbers")),
        (per_layer * 2 * scale, M("kv.fp32")),
        (per_layer * group * scale, M("kv.query_heads")),
    )


@numeric(rel=1e-3)
def kv_bytes_per_token_per_layer() -> Expected:
    """Llama-3-70B, BF16: KV cache bytes of one token in one layer."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    return Expected(expected, mistakes=_kv_mistakes(cfg, 1))


@numeric(rel=1e-3)
def kv_bytes_per_token() -> Expected:
    """Llama-3-70B, BF16: KV cache bytes of one token over the whole model."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes_per_token(cfg, DTYPE_BYTES)
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    mistakes = _kv_mistakes(cfg, cfg.num_hidden_layers) + [
        (per_layer, M("kv_bytes_per_token.one_layer")),
    ]
    return Expected(expected, mistakes=mistakes)


@numeric(rel=5e-3)
def kv_gb_for_request() -> Expected:
    """Llama-3-70B, BF16: KV cache of one REQUEST_TOKENS-token request, in GB (1 GB = 1e9 bytes)."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes(cfg, REQUEST_TOKENS, DTYPE_BYTES) / 1e9
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    scale = REQUEST_TOKENS * cfg.num_hidden_layers / 1e9
    binary = expected * 1e9 / 2**30
    mixed = expected * 1e9 / 1024 / 1e6 / 1.024  # KB as 1024 B, then 1 GB = 1,024,000 KB
    mixed2 = expected * 1e9 / 1024 / 1e6  # KB as 1024 B, then 1 GB = 1e6 KB
    mistakes = _kv_mistakes(cfg, scale) + [
        (per_layer * REQUEST_TOKENS / 1e9, M("kv_gb_for_request.one_layer")),
        (binary, M("kv_gb_for_request.gib")),
        (mixed, M("kv_gb_for_request.mixed_prefixes")),
        (mixed2, M("kv_gb_for_request.mixed_prefixes_2")),
    ]
    return Expected(expected, mistakes=mistakes)


@numeric(rel=1e-3)
def smollm2_kv_bytes_per_token() -> Expected:
    """Our model, SmolLM2-135M, runs in float32 (4 bytes): KV cache bytes per token, all layers."""
    cfg = get_config("smollm2-135m")
    expected = costs.kv_bytes_per_token(cfg, 4)
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, 4)
    from_hidden = costs.kv_bytes_per_token_from_hidden(cfg, 4)
    group = cfg.num_attention_heads / cfg.num_key_value_heads
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (from_hidden, M("smollm2_kv_bytes_per_token.hidden_size")),
            (expected / 2, M("smollm2_kv_bytes_per_token.k_without_v")),
            (costs.kv_bytes_per_token(cfg, 2), M("smollm2_kv_bytes_per_token.bf16")),
            (per_layer, M("one_layer_of_many")),
            (expected * group, M("kv.query_heads")),
        ),
    )


@numeric(rel=1e-3)
def mla_kv_bytes_per_token() -> Expected:
    """DeepSeek-V3 (MLA, BF16): KV cache bytes per token, all layers. Per layer it caches one
    latent vector of kv_lora_rank numbers plus one shared RoPE key of qk_rope_head_dim numbers."""
    cfg = get_config("deepseek-v3")
    expected = costs.kv_bytes_per_token(cfg, DTYPE_BYTES)
    e = cfg.extra
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    latent_only = e["kv_lora_rank"] * DTYPE_BYTES * cfg.num_hidden_layers
    mha = costs.kv_variants(cfg, DTYPE_BYTES)["MHA"]
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (2 * expected, M("mla_kv_bytes_per_token.factor_2")),
            (latent_only, M("mla_kv_bytes_per_token.rope_key")),
            (per_layer, M("one_layer_of_many")),
            (mha, M("mla_kv_bytes_per_token.mha")),
        ),
    )


@numeric(rel=1e-9)
def tokens_processed_with_cache() -> Expected:
    """With a KV cache, how many token positions go through the model in total while generating
    NEW_TOKENS tokens from a PROMPT_LEN-token prompt?"""
    p, n = PROMPT_LEN, NEW_TOKENS
    expected = p + (n - 1)
    return Expected(
        expected,
        mistakes=[
            (p + n, M("tokens_processed_with_cache.last_fed_back")),
            (n, M("tokens_processed_with_cache.prompt_forgotten")),
            (sum(p + i for i in range(n)), M("tokens_processed_with_cache.no_cache")),
        ],
    )


# --------------------------------------------------------------------------- the learner's cache

GEN_PROMPT = "The KV cache keeps the keys and values of earlier tokens, so"
GEN_NEW_TOKENS = 12


# Slips of a cached loop recognised by the text they generate (each run once, only for a wrong
# answer the simpler checks do not explain): the next token read at the prompt's first position
# instead of its last; every token rotated as if at position 0; a decode step whose query sees
# only its own key and value (the cache replaced, not appended to); the whole sequence fed again
# at every step, on top of the cache.
GEN_SLIP_HINTS = {  # slip -> the catalog key of its hint
    "first_position": M.key("generate_greedy.slip_first_position"),
    "positions_restart": M.key("generate_greedy.slip_positions_restart"),
    "own_token_only": M.key("generate_greedy.slip_own_token_only"),
    "sequence_refed": M.key("generate_greedy.slip_sequence_refed"),
}
GEN_SLIPS = tuple(GEN_SLIP_HINTS)


@functools.lru_cache(maxsize=1)
def _smollm2() -> tuple[Any, Any]:
    from llmlab.model import load_model

    return load_model("smollm2-135m")


@functools.lru_cache(maxsize=1)
def _reference_text() -> tuple[str, tuple[str, ...]]:
    """generate_with_cache's greedy continuation of GEN_PROMPT on SmolLM2: (text, token pieces)."""
    from llmlab.engine.generate import generate_with_cache
    from llmlab.sampling import SamplingParams

    model, tok = _smollm2()
    prompt = tok.encode(GEN_PROMPT, add_special_tokens=False)
    ids = generate_with_cache(
        model,
        prompt,
        max_new_tokens=GEN_NEW_TOKENS,
        params=SamplingParams(temperature=0.0, ignore_eos=True),
    ).token_ids
    return tok.decode(ids), tuple(tok.decode(ids[: k + 1]) for k in range(len(ids)))


def _slip_tokens(model: Any, prompt: list[int], slip: str) -> list[int]:
    """The greedy tokens of a cached loop with `slip` (one of GEN_SLIPS) on SmolLM2."""
    import torch

    from llmlab.kvcache import ContiguousKVCache

    def fresh_cache(max_len: int) -> ContiguousKVCache:
        return ContiguousKVCache(model.config, batch_size=1, max_len=max_len, dtype=model.dtype)

    cache = fresh_cache((len(prompt) + GEN_NEW_TOKENS) * (GEN_NEW_TOKENS + 1))
    out, feed = [], list(prompt)
    for step in range(GEN_NEW_TOKENS):
        if slip == "own_token_only" and step:
            cache = fresh_cache(1)  # the newest token's K/V alone
        n = [len(feed)]
        positions = torch.arange(n[0]) if slip == "positions_restart" else cache.positions(n)
        hidden = model(torch.tensor(feed), positions, cache.context(n))  # [len(feed), hidden]
        cache.advance(n)
        row = 0 if slip == "first_position" and step == 0 else len(feed) - 1
        out.append(int(model.compute_logits(hidden[row : row + 1]).argmax()))
        feed = list(prompt) + out if slip == "sequence_refed" else out[-1:]
    return out


@functools.lru_cache(maxsize=1)
def _slip_texts() -> dict[str, str]:
    """{slip: the text a loop with that slip generates} for GEN_SLIPS (computed once)."""
    model, tok = _smollm2()
    prompt = tok.encode(GEN_PROMPT, add_special_tokens=False)
    return {slip: tok.decode(_slip_tokens(model, prompt, slip)) for slip in GEN_SLIPS}


def _generate_greedy_hint(ex: str, answer: str, text: str, prefixes: tuple[str, ...]) -> str:
    """The hint of a wrong text: the prompt left in, too few or too many tokens, a recognised
    slip, else the stage (prefill or decode) where it goes wrong, with its rule from the second
    try on."""
    if answer.startswith(GEN_PROMPT) or GEN_PROMPT in answer:
        return M("generate_greedy.prompt_included")
    if answer in prefixes[:-1]:
        return M("generate_greedy.too_few", got=prefixes.index(answer) + 1, n=GEN_NEW_TOKENS)
    if answer.startswith(text):
        return M("generate_greedy.too_many", n=GEN_NEW_TOKENS)
    slip = next((s for s, t in _slip_texts().items() if answer == t), None)
    if slip is not None:
        return M(GEN_SLIP_HINTS[slip])
    if not answer.startswith(prefixes[0]):
        return staged(ex, M("generate_greedy.prefill_wrong"), M("generate_greedy.prefill_then"))
    return staged(ex, M("generate_greedy.decode_wrong"), M("generate_greedy.decode_then"))


def generate_greedy(answer: Any) -> CheckResult:
    """The text of the GEN_NEW_TOKENS tokens the learner's own cached loop generates greedily from
    GEN_PROMPT with SmolLM2 (new tokens only, decoded). Checked against
    `llmlab.engine.generate.generate_with_cache`: identical tokens give identical text; a wrong text is
    compared with what the known slips of GEN_SLIPS generate."""
    ex = "ch04.generate_greedy"
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    if not isinstance(answer, str):
        return not_yet(ex, M("generate_greedy.not_a_str", got_type=type(answer).__name__))
    text, prefixes = _reference_text()
    if answer == text:
        return passed(ex, M("generate_greedy.success"))
    return not_yet(ex, _generate_greedy_hint(ex, answer, text, prefixes))


# --------------------------------------------------------------------------- the KV budget


def _budget_case(dtype: str, util: float = BUDGET_UTILIZATION) -> float:
    from llmlab.analysis.kv_budget import kv_summary

    cfg = get_config(BUDGET_MODEL)
    s = kv_summary(
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        dtype,
        BUDGET_CONTEXT,
        1,
        BUDGET_GPU,
        weight_bytes=costs.weight_bytes(cfg, 2),
        gpu_memory_utilization=util,
        activation_bytes=BUDGET_ACTIVATION_GB * 1e9,
    )
    return s.max_requests


@numeric(rel=0.005)
def max_requests_fp8() -> Expected:
    """The KV-calculator task: how many BUDGET_CONTEXT-token Llama-3-8B requests fit at once on an
    H100 (BF16 weights on the card, BUDGET_ACTIVATION_GB GB of activations, utilisation
    BUDGET_UTILIZATION) with an fp8 KV cache?"""
    expected = _budget_case("fp8")
    cfg = get_config(BUDGET_MODEL)
    per_request = costs.kv_bytes(cfg, BUDGET_CONTEXT, 1)
    hbm = 80e9
    w = costs.weight_bytes(cfg, 2)
    budget, activations = hbm * BUDGET_UTILIZATION, BUDGET_ACTIVATION_GB * 1e9
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (_budget_case("bf16"), M("max_requests_fp8.bf16_cache")),
            (int(budget // per_request), M("max_requests_fp8.no_weights")),
            (int((budget - w) // per_request), M("max_requests_fp8.no_activations")),
            (int((hbm - w - activations) // per_request), M("max_requests_fp8.whole_card")),
        ),
    )


def _gain_budget(util: float) -> float:
    from llmlab.analysis.kv_budget import kv_budget_bytes

    return kv_budget_bytes(GAIN_GPU, util, costs.weight_bytes(get_config(BUDGET_MODEL), 2))


@numeric(rel=0.01)
def utilization_gain() -> Expected:
    """Llama-3-8B (BF16 weights and KV) on an L4: raising the utilisation from GAIN_FROM to
    GAIN_TO multiplies the number of requests that fit by about what factor?"""
    before, after = _gain_budget(GAIN_FROM), _gain_budget(GAIN_TO)
    expected = after / before
    return Expected(
        expected,
        mistakes=[
            (GAIN_TO / GAIN_FROM, M("utilization_gain.whole_card")),
            (1.0, M("utilization_gain.unchanged")),
            (before / after, M("utilization_gain.upside_down")),
        ],
    )


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
