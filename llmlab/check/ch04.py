"""Self-checks of chapter 04 (KV cache): the seed's self-check question 2 (Llama-3-70B's KV
bytes per token and per 4K request) in three steps, our own model's cache, MLA, and the work
a cache saves."""
from __future__ import annotations

from typing import Any

from llmlab import costs
from llmlab.check.ch01 import combine_mistakes
from llmlab.check.core import CheckResult, check_number
from llmlab.config import get_config

PRESET = "llama-3-70b"                   # 80 layers, hidden 8192, 64 query heads, 8 KV heads, head_dim 128
DTYPE_BYTES = 2                          # BF16
REQUEST_TOKENS = 4096
PROMPT_LEN, NEW_TOKENS = 20, 100         # as in chapter 03's exercise


def _kv_mistakes(cfg, scale: float) -> list[tuple[float, str]]:
    """Typical wrong KV answers, each `scale` × (bytes per token per layer of that mistake)."""
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    from_hidden = costs.kv_bytes_per_token_from_hidden(cfg, DTYPE_BYTES) / cfg.num_hidden_layers
    return combine_mistakes(
        (from_hidden * scale, "that uses the hidden size: with GQA only the KV heads are cached "
                              "(num_kv_heads × head_dim per K or V), not hidden_size."),
        (per_layer / 2 * scale, "that stores only one of K and V: the factor 2 for K and V is missing."),
        (per_layer * 8 * scale, "that is bits, not bytes: BF16 is 2 bytes per number."),
        (per_layer / DTYPE_BYTES * scale, "that counts numbers, not bytes: multiply by 2 bytes per BF16 number."),
        (per_layer * 2 * scale, "that uses 4 bytes per number (FP32); the cache here is BF16."),
        (per_layer * cfg.num_attention_heads / cfg.num_key_value_heads * scale,
         "that uses the query heads; K and V exist only for the KV heads (GQA)."),
    )


def kv_bytes_per_token_per_layer(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16: KV cache bytes of one token in one layer."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    return check_number("ch04.kv_bytes_per_token_per_layer", answer, expected, rel=1e-3,
                        mistakes=_kv_mistakes(cfg, 1),
                        default_hint="2 (K and V) × num_kv_heads × head_dim × bytes per number.")


def kv_bytes_per_token(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16: KV cache bytes of one token over the whole model."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes_per_token(cfg, DTYPE_BYTES)
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    mistakes = _kv_mistakes(cfg, cfg.num_hidden_layers) + [
        (per_layer, "that is one layer; every one of the layers keeps its own K and V."),
    ]
    return check_number("ch04.kv_bytes_per_token", answer, expected, rel=1e-3, mistakes=mistakes,
                        default_hint="bytes per token per layer × number of layers.")


def kv_gb_for_request(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16: KV cache of one REQUEST_TOKENS-token request, in GB (1 GB = 1e9 bytes)."""
    cfg = get_config(PRESET)
    expected = costs.kv_bytes(cfg, REQUEST_TOKENS, DTYPE_BYTES) / 1e9
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    scale = REQUEST_TOKENS * cfg.num_hidden_layers / 1e9
    binary = expected * 1e9 / 2**30
    mixed = expected * 1e9 / 1024 / 1e6 / 1.024     # KB as 1024 B, then 1 GB = 1,024,000 KB
    mixed2 = expected * 1e9 / 1024 / 1e6            # KB as 1024 B, then 1 GB = 1e6 KB
    mistakes = _kv_mistakes(cfg, scale) + [
        (per_layer * REQUEST_TOKENS / 1e9, "that is one layer; every layer keeps its own K and V."),
        (binary, "that is GiB (2**30 bytes); the question asks for GB (1e9 bytes)."),
        (mixed, "mixed prefixes: KB taken as 1024 bytes, then GB as a thousand-fold of that; "
                "convert from bytes with 1 GB = 1e9 bytes."),
        (mixed2, "mixed prefixes: KB taken as 1024 bytes but GB as 1e6 KB; convert from bytes "
                 "with 1 GB = 1e9 bytes."),
    ]
    return check_number("ch04.kv_gb_for_request", answer, expected, rel=5e-3, mistakes=mistakes,
                        default_hint="bytes per token (all layers) × tokens, then divide by 1e9.")


def smollm2_kv_bytes_per_token(answer: Any) -> CheckResult:
    """Our model, SmolLM2-135M, runs in float32 (4 bytes): KV cache bytes per token, all layers."""
    cfg = get_config("smollm2-135m")
    expected = costs.kv_bytes_per_token(cfg, 4)
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, 4)
    return check_number("ch04.smollm2_kv_bytes_per_token", answer, expected, rel=1e-3,
                        mistakes=combine_mistakes(
        (costs.kv_bytes_per_token_from_hidden(cfg, 4), "that uses the hidden size; only the KV "
                                                       "heads are cached (GQA)."),
        (expected / 2, "the factor 2 for K and V is missing."),
        (costs.kv_bytes_per_token(cfg, 2), "that uses 2 bytes per number; our model runs in float32."),
        (per_layer, "that is one layer; multiply by the number of layers."),
        (expected * cfg.num_attention_heads / cfg.num_key_value_heads,
         "that uses the query heads; K and V exist only for the KV heads (GQA)."),
    ), default_hint="read layers, KV heads and head_dim from model.config; 4 bytes per float32.")


def mla_kv_bytes_per_token(answer: Any) -> CheckResult:
    """DeepSeek-V3 (MLA, BF16): KV cache bytes per token, all layers. Per layer it caches one
    latent vector of kv_lora_rank numbers plus one shared RoPE key of qk_rope_head_dim numbers."""
    cfg = get_config("deepseek-v3")
    expected = costs.kv_bytes_per_token(cfg, DTYPE_BYTES)
    e = cfg.extra
    per_layer = costs.kv_bytes_per_token_per_layer(cfg, DTYPE_BYTES)
    return check_number("ch04.mla_kv_bytes_per_token", answer, expected, rel=1e-3,
                        mistakes=combine_mistakes(
        (2 * expected, "MLA caches one latent per token, not a separate K and V: no factor 2."),
        (e["kv_lora_rank"] * DTYPE_BYTES * cfg.num_hidden_layers,
         "the shared RoPE key (qk_rope_head_dim) is cached too, next to the latent."),
        (per_layer, "that is one layer; multiply by the number of layers."),
        (costs.kv_variants(cfg, DTYPE_BYTES)["MHA"], "that is what plain multi-head attention "
                                                      "would cache; MLA caches the latent instead."),
    ), default_hint="(kv_lora_rank + qk_rope_head_dim) × bytes per number × layers.")


def tokens_processed_with_cache(answer: Any) -> CheckResult:
    """With a KV cache, how many token positions go through the model in total while generating
    NEW_TOKENS tokens from a PROMPT_LEN-token prompt?"""
    p, n = PROMPT_LEN, NEW_TOKENS
    expected = p + (n - 1)
    return check_number("ch04.tokens_processed_with_cache", answer, expected, rel=1e-9, mistakes=[
        (p + n, "the last generated token is never fed back in: it is sampled and the loop ends."),
        (n, "the prompt goes through the model once too (prefill), all of its tokens."),
        (sum(p + i for i in range(n)), "that is without the cache: with it, each token goes through once."),
    ], default_hint="prefill feeds the prompt once; each later forward feeds only the newest token.")
