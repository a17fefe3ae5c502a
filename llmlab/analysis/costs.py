"""What a model costs, computed from its shape alone: parameters, FLOPs, bytes, KV cache size.

Everything here takes a `ModelConfig` (see `llmlab.config.PRESETS` for real models), so the
same formulas answer questions about SmolLM2-135M, which we run, and Llama-3-70B or
DeepSeek-V3, which we never load.

Units: bytes, FLOP (floating-point operations, one multiply-add = 2 FLOP). Only plots and
printed tables convert to GB or GiB.

Conventions
- A "linear" layer y = x W with W of shape [n_in, n_out] costs 2 * n_in * n_out FLOP per token.
- "context" is the number of tokens a query attends to, the new token included.
- DeepSeek-style configs (``cfg.extra["attention_type"] == "mla"``) use multi-head latent
  attention (MLA) and a mixture of experts (MoE); the functions below read the extra fields
  (kv_lora_rank, qk_rope_head_dim, ...) for them.
"""

from __future__ import annotations

from llmlab.config import ModelConfig
from llmlab.i18n import tr

__all__ = [
    "is_mla",
    "head_size",
    "param_count",
    "active_param_count",
    "matmul_params_per_token",
    "attention_flops_per_token",
    "flops_per_token",
    "prefill_flops",
    "decode_flops",
    "weight_bytes",
    "decode_bytes_per_step",
    "kv_bytes_per_token_per_layer",
    "kv_bytes_per_token",
    "kv_bytes_per_token_from_hidden",
    "kv_bytes",
    "kv_variants",
    "STEP_OPS",
    "step_costs",
    "DTYPE_BYTES",
    "dtype_bytes_of",
]

# bytes per element of the dtypes the course talks about
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


def dtype_bytes_of(dtype: str | int | float) -> float:
    """Bytes per element for a dtype name ("bf16", "fp8", ...) or a number of bytes."""
    if isinstance(dtype, str):
        key = dtype.lower().replace("float", "fp").replace("bfloat", "bf")
        if key not in DTYPE_BYTES:
            raise ValueError(
                tr(
                    f"dtype must be one of {sorted(DTYPE_BYTES)} or a number of bytes, got {dtype!r}",
                    f"dtype 必须是 {sorted(DTYPE_BYTES)} 之一，或一个字节数，你给了 {dtype!r}",
                )
            )
        return DTYPE_BYTES[key]
    return _positive("dtype_bytes", dtype)


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(
            tr(
                f"{name} must be a number {bound}, got {value!r}",
                f"{name} 必须是 {bound} 的数，你给了 {value!r}",
            )
        )
    return value


def check_int(name: str, value: int, minimum: int = 1) -> int:
    """`value` when it is an int >= `minimum`; else a ValueError naming `name`, in the reader's
    language (the check of every count analysis takes: a batch, a context, a prompt length)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            tr(
                f"{name} must be an int >= {minimum}, got {value!r}",
                f"{name} 必须是不小于 {minimum} 的整数，你给了 {value!r}",
            )
        )
    return value


def is_mla(cfg: ModelConfig) -> bool:
    """True for multi-head latent attention (DeepSeek-V2/V3)."""
    return cfg.extra.get("attention_type") == "mla"


def head_size(hidden_size: int, num_heads: int) -> int:
    """The size of one attention head: hidden_size / num_heads (4096 / 32 = 128)."""
    check_int("hidden_size", hidden_size)
    check_int("num_heads", num_heads)
    if hidden_size % num_heads:
        raise ValueError(
            tr(
                f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})",
                f"hidden_size（{hidden_size}）必须能被 num_heads（{num_heads}）整除",
            )
        )
    return hidden_size // num_heads


# ---------------------------------------------------------------------------------------------
# parameters


def _attention_params(cfg: ModelConfig) -> int:
    """Weights of one attention layer (projections only; norms are counted separately)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    if is_mla(cfg):
        e = cfg.extra
        q_dim = e["qk_nope_head_dim"] + e["qk_rope_head_dim"]
        n = 0
        if e.get("q_lora_rank"):
            # queries go through a low-rank bottleneck too: hidden -> q_lora_rank -> heads * q_dim
            n += h * e["q_lora_rank"] + e["q_lora_rank"] + e["q_lora_rank"] * heads * q_dim
        else:
            n += h * heads * q_dim
        # hidden -> latent (kv_lora_rank) plus one shared RoPE key (qk_rope_head_dim); latent norm
        n += h * (e["kv_lora_rank"] + e["qk_rope_head_dim"]) + e["kv_lora_rank"]
        # latent -> per-head keys (nope part) and values
        n += e["kv_lora_rank"] * heads * (e["qk_nope_head_dim"] + e["v_head_dim"])
        n += heads * e["v_head_dim"] * h  # o_proj
        return n
    q = heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    n = h * q + 2 * h * kv + q * h  # q, k, v, o
    if cfg.attention_bias:
        n += q + 2 * kv  # Qwen2: bias on q, k, v
    return n


def _dense_mlp_params(cfg: ModelConfig, intermediate: int) -> int:
    return 3 * cfg.hidden_size * intermediate  # gate, up, down (SwiGLU)


def _is_moe_layer(cfg: ModelConfig, layer: int) -> bool:
    e = cfg.extra
    return bool(e.get("n_routed_experts")) and layer >= e.get("first_k_dense_replace", 0)


def _mlp_params(cfg: ModelConfig, layer: int, active_only: bool) -> int:
    if not _is_moe_layer(cfg, layer):
        return _dense_mlp_params(cfg, cfg.intermediate_size)
    e = cfg.extra
    expert = _dense_mlp_params(cfg, e["moe_intermediate_size"])
    routed = e["num_experts_per_tok"] if active_only else e["n_routed_experts"]
    router = cfg.hidden_size * e["n_routed_experts"] + e["n_routed_experts"]  # gate + its bias
    return (routed + e.get("n_shared_experts", 0)) * expert + router


def _count(cfg: ModelConfig, active_only: bool) -> int:
    h = cfg.hidden_size
    n = cfg.vocab_size * h  # token embedding
    if not cfg.tie_word_embeddings:
        n += cfg.vocab_size * h  # lm_head
    for layer in range(cfg.num_hidden_layers):
        n += _attention_params(cfg) + _mlp_params(cfg, layer, active_only) + 2 * h  # 2 RMSNorms
    return n + h  # final norm


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters (each shared tensor once), e.g. 8,030,261,248 for Llama-3.1-8B."""
    return _count(cfg, active_only=False)


def active_param_count(cfg: ModelConfig) -> int:
    """Parameters one token uses: for a mixture of experts only its routed and shared experts."""
    return _count(cfg, active_only=True)


def matmul_params_per_token(cfg: ModelConfig) -> int:
    """Weights that one token multiplies with: every linear layer plus the lm_head.

    The embedding table is a lookup (no FLOPs); with tied embeddings the same matrix is used
    again as lm_head, which *is* a matmul. Norm weights are negligible and left out.
    """
    h = cfg.hidden_size
    n = active_param_count(cfg) - cfg.vocab_size * h  # drop the lookup table
    if cfg.tie_word_embeddings:
        n += cfg.vocab_size * h  # lm_head reuses it
    return n - (2 * cfg.num_hidden_layers + 1) * h  # norms are not matmuls


# ---------------------------------------------------------------------------------------------
# FLOPs


def attention_flops_per_token(cfg: ModelConfig, context: int) -> int:
    """FLOPs of Q·Kᵀ and weights·V for one query token that attends to `context` tokens.

    Per layer and head: 2·d_qk·context for the scores plus 2·d_v·context for the weighted sum.
    """
    check_int("context", context)
    if is_mla(cfg):
        e = cfg.extra
        d_qk = e["qk_nope_head_dim"] + e["qk_rope_head_dim"]
        d_v = e["v_head_dim"]
    else:
        d_qk = d_v = cfg.head_dim
    return 2 * cfg.num_hidden_layers * cfg.num_attention_heads * (d_qk + d_v) * context


def flops_per_token(cfg: ModelConfig, context: int, phase: str = "decode") -> float:
    """FLOPs to push one token through the model (all matmuls incl. lm_head, plus attention).

    phase="decode": one new token that attends to `context` tokens (itself included).
    phase="prefill": the average over a prompt of `context` tokens; with the causal mask token
    i attends to i + 1 tokens, so on average to (context + 1) / 2. Then
    `prefill_flops(cfg, n) == n * flops_per_token(cfg, n, "prefill")`.
    """
    check_int("context", context)
    matmul = 2 * matmul_params_per_token(cfg)
    per_key = attention_flops_per_token(cfg, 1)
    if phase == "decode":
        return float(matmul + per_key * context)
    if phase == "prefill":
        return float(matmul + per_key * (context + 1) / 2)
    raise ValueError(
        tr(
            f"phase must be 'prefill' or 'decode', got {phase!r}",
            f"phase 必须是 'prefill' 或 'decode'，你给了 {phase!r}",
        )
    )


def prefill_flops(cfg: ModelConfig, prompt_len: int) -> float:
    """FLOPs of one prefill forward over `prompt_len` tokens, logits computed for every token.

    (An engine needs only the last token's logits and saves (prompt_len - 1) · 2 · vocab · hidden.)
    """
    check_int("prompt_len", prompt_len)
    return prompt_len * flops_per_token(cfg, prompt_len, "prefill")


def decode_flops(cfg: ModelConfig, batch: int, context: int) -> float:
    """FLOPs of one decode step: `batch` sequences, each adding one token at length `context`."""
    check_int("batch", batch)
    return batch * flops_per_token(cfg, context, "decode")


# ---------------------------------------------------------------------------------------------
# bytes


def weight_bytes(cfg: ModelConfig, dtype_bytes: float = 2) -> float:
    """Bytes of all weights, e.g. ≈ 141 GB for Llama-3-70B in BF16."""
    return param_count(cfg) * _positive("dtype_bytes", dtype_bytes)


def decode_bytes_per_step(
    cfg: ModelConfig, batch: int, context: int, dtype_bytes: float = 2
) -> float:
    """Bytes one decode step moves from memory: all weights once (shared by the whole batch)
    plus, for every sequence, its KV cache of `context` tokens.

    Activations are ignored (tiny at decode). A mixture of experts is counted as reading all of
    its experts, which is what happens once the batch is large enough to route to each of them.
    """
    check_int("batch", batch)
    check_int("context", context)
    return weight_bytes(cfg, dtype_bytes) + batch * kv_bytes(cfg, context, dtype_bytes)


def kv_bytes_per_token_per_layer(cfg: ModelConfig, dtype_bytes: float = 2) -> float:
    """KV cache bytes one token takes in one attention layer.

    GQA/MHA/MQA: 2 (K and V) × num_kv_heads × head_dim × dtype_bytes
    (Llama-3-70B in BF16: 2 × 8 × 128 × 2 = 4,096 B).
    MLA: one compressed latent (kv_lora_rank) plus one shared RoPE key (qk_rope_head_dim) per
    token, no separate K and V: (kv_lora_rank + qk_rope_head_dim) × dtype_bytes.
    """
    _positive("dtype_bytes", dtype_bytes)
    if is_mla(cfg):
        e = cfg.extra
        return (e["kv_lora_rank"] + e["qk_rope_head_dim"]) * dtype_bytes
    return 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes


def kv_bytes_per_token(cfg: ModelConfig, dtype_bytes: float = 2) -> float:
    """KV cache bytes of one token over all layers (Llama-3-70B, BF16: 327,680 B)."""
    return cfg.num_hidden_layers * kv_bytes_per_token_per_layer(cfg, dtype_bytes)


def kv_bytes_per_token_from_hidden(cfg: ModelConfig, dtype_bytes: float = 2) -> float:
    """The common *wrong* way: 2 × hidden_size × layers × dtype_bytes, as if every query head
    had its own K and V head (plain multi-head attention). For Llama-3-70B this is 8× too big."""
    _positive("dtype_bytes", dtype_bytes)
    return 2 * cfg.hidden_size * cfg.num_hidden_layers * dtype_bytes


def kv_bytes(cfg: ModelConfig, num_tokens: int, dtype_bytes: float = 2) -> float:
    """KV cache bytes of `num_tokens` tokens (Llama-3-70B, 4,096 tokens, BF16: 1.34e9 B)."""
    check_int("num_tokens", num_tokens, minimum=0)
    return num_tokens * kv_bytes_per_token(cfg, dtype_bytes)


def kv_variants(cfg: ModelConfig, dtype_bytes: float = 2) -> dict[str, float]:
    """KV bytes per token of `cfg` and of the same model with other attention layouts.

    Keys: "MHA" (one K/V head per query head), "GQA" (the model's own num_kv_heads, absent if
    that equals MHA or MQA), "MQA" (one K/V head), and "MLA" for MLA models (their real layout).
    For MLA models the MHA/MQA rows use the per-head key size d_nope + d_rope and value size
    v_head_dim, i.e. what the model would cache if it kept plain per-head K and V.
    """
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    _positive("dtype_bytes", dtype_bytes)
    if is_mla(cfg):
        e = cfg.extra
        per_head = (e["qk_nope_head_dim"] + e["qk_rope_head_dim"] + e["v_head_dim"]) * dtype_bytes
        return {
            "MHA": layers * heads * per_head,
            "MQA": layers * per_head,
            "MLA": kv_bytes_per_token(cfg, dtype_bytes),
        }
    per_head = 2 * cfg.head_dim * dtype_bytes
    out = {"MHA": layers * heads * per_head}
    if 1 < cfg.num_key_value_heads < heads:
        out["GQA"] = kv_bytes_per_token(cfg, dtype_bytes)
    out["MQA"] = layers * per_head
    return out


# ---------------------------------------------------------------------------------------------
# one engine step, operation by operation

# The operations of one forward of a dense Llama-family model, in the order they run (vLLM's
# layer names: qkv_proj and gate_up_proj are its merged linear layers).
STEP_OPS = (
    "embed_tokens",
    "qkv_proj",
    "attention",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "lm_head",
)


def _step_batch(batch: object) -> list[tuple[int, int]]:
    """The batch as [(new_tokens, context)], checked: 1 <= new_tokens <= context."""
    pairs = list(batch) if isinstance(batch, (list, tuple)) else None
    if not pairs or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_int(x) for x in p) for p in pairs
    ):
        raise ValueError(
            tr(
                f"batch must be a non-empty list of (new_tokens, context) int pairs, got {batch!r}",
                f"batch 必须是非空列表，元素为 (new_tokens, context) 整数对，你给了 {batch!r}",
            )
        )
    for new, context in pairs:
        if not 1 <= new <= context:
            raise ValueError(
                tr(
                    f"each sequence needs 1 <= new_tokens <= context, got ({new}, {context})",
                    f"每条序列都要满足 1 <= new_tokens <= context，你给了 ({new}, {context})",
                )
            )
    return [(int(n), int(c)) for n, c in pairs]


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def step_costs(
    cfg: ModelConfig, batch: list[tuple[int, int]], dtype_bytes: float = 2
) -> dict[str, tuple[float, float]]:
    """FLOPs and bytes moved by each operation of one engine step: {op: (flops, bytes)}, the ops
    of `STEP_OPS`.

    batch: one (new_tokens, context) pair per sequence of the step: it brings `new_tokens`
    tokens, and holds `context` tokens once they are in (the new ones included, so a decode
    step is (1, context), a whole prompt of n tokens (n, n), a prompt whose first tokens were
    already cached (n, context > n)). Every sequence samples one token, at its last new position.

    Counted (one multiply-add = 2 FLOP; dtype_bytes for weights and the KV cache alike):
    - a linear layer W [n_in, n_out] over T tokens: 2·T·n_in·n_out FLOP; its weights are read
      once per step, whatever the batch: n_in·n_out·dtype_bytes (per layer);
    - embed_tokens: a lookup, no FLOPs; it reads one row of `hidden_size` per new token;
    - attention: with the causal mask the j-th of a sequence's n new tokens (j = 1..n) attends
      to context − n + j tokens; per attended token, layer and query head 4·head_dim FLOP
      (q·k and the weighted sum of v). Bytes: every token of the context moves its K and V once
      (the cached ones are read, the new ones written): 2·kv_heads·head_dim·dtype_bytes per
      token and layer — kv_heads, not query heads (GQA);
    - lm_head: only the sampled positions, one row per sequence (vLLM's logits_indices).
    Activations (each token's input and output vectors), norms and biases are left out: at
    these batch sizes they are small beside the weights and the KV cache.
    """
    if is_mla(cfg) or cfg.extra.get("n_routed_experts"):
        raise ValueError(
            tr(
                f"step_costs counts dense GQA models; {cfg.name} has MLA or a mixture of experts",
                f"step_costs 只统计稠密 GQA 模型，{cfg.name} 用了 MLA 或混合专家",
            )
        )
    pairs = _step_batch(batch)
    _positive("dtype_bytes", dtype_bytes)
    h, inter, layers, vocab = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_hidden_layers,
        cfg.vocab_size,
    )
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    tokens = sum(n for n, _ in pairs)

    def linear(n_in: int, n_out: int, rows: int, copies: int = layers) -> tuple[float, float]:
        return float(2 * rows * n_in * n_out * copies), float(n_in * n_out * copies * dtype_bytes)

    # keys attended, summed over every new token: n·(context − n) + (1 + 2 + ... + n)
    keys = sum(n * (c - n) + n * (n + 1) // 2 for n, c in pairs)
    context_tokens = sum(c for _, c in pairs)
    return {
        "embed_tokens": (0.0, float(tokens * h * dtype_bytes)),
        "qkv_proj": linear(h, q + 2 * kv, tokens),
        "attention": (
            float(4 * q * keys * layers),
            float(2 * kv * context_tokens * layers * dtype_bytes),
        ),
        "o_proj": linear(q, h, tokens),
        "gate_up_proj": linear(h, 2 * inter, tokens),
        "down_proj": linear(inter, h, tokens),
        "lm_head": linear(h, vocab, len(pairs), copies=1),
    }
