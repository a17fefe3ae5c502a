"""The CPU fast path: the Llama of `llmlab.model`, its layers run by C kernels on prepared weights.

`llmlab.model` is the definition and stays plain. This module is a second implementation of
its decoder layer and LM head, chosen once by the engine's model runner when the attention
backend is "cpu" (`cpu_model(model)`), the way `llmlab.parallel.tp` swaps `RowParallelLinear`
into a model and vLLM picks layer implementations per platform. The tests check it against the
readable model.

What it does differently, and why (all measured on a 2-core CPU):

- **Weights prepared once, after loading** (vLLM's `process_weights_after_loading`;
  nano-vllm packs q/k/v at load too). q, k and v, which read the same input, become one
  stacked matrix, as do gate and up: one matmul instead of three. The readable layer's
  `q_proj.weight` ... `up_proj.weight` are then views into those stacked matrices, so both
  implementations read one dense copy. Each matrix is also packed once for batches: a second
  copy of the weights, in `kernels/cpu_gemm.c`'s blocks or oneDNN's layout (`torch.ops.mkldnn`,
  shipped inside PyTorch; vLLM's CPU backend calls oneDNN too), whichever measured faster on
  this machine (`llmlab.ops.cpu_matmul_choice`). oneDNN's float32 matmul ran 15-25 % faster
  than aten's; ours, which asks for each weight panel before it needs it, took a batch-64
  float32 step of a 2-core Zen 4 from 134-143 ms to 124 ms.
  **Change a weight after `cpu_model`, and you must call it again**: the packed copies do not
  follow the parameters. A second `cpu_model` of the same model (a second engine on it) packs
  only the matrices that changed and reuses the other copies (`PackedCopies`): on the 2-core
  Zen 4, a float32 engine on an already loaded model took 0.05-0.08 s to build instead of
  0.5-1.05 s.
- **One-row matmuls run our GEMVs**: a batch-1 decode step only streams each weight once, and
  on SmolLM2's small matrices a plain loop streams faster than oneDNN's GEMV, whose per-call
  set-up shows. Where our packed copy exists, one row reads its blocks front to back
  (`kernels/cpu_gemm.c`); otherwise it reads the dense rows four at a time
  (`kernels/cpu_gemv.c`), prefetching ahead of them. What one row streams sits on 2 MB pages
  (`llmlab.model.huge_pages`): measured faster.
- **A layer's elementwise steps in C** (`kernels/cpu_layer.c`: RMSNorm with the residual add
  fused in as vLLM's `fused_add_rms_norm`, RoPE, SiLU × up) and the attention in C
  (`kernels/cpu_attention.c`, K/V read in place through the block table): ~15 calls per layer
  instead of ~70 small PyTorch operators. A decode step of several sequences runs RoPE, the
  cache write and attention as one call (`cpu_backend.decode_attention`), ~11 calls per layer:
  on a 2-core Zen 4 at batch 8, 6-9 % of a bf16 step.
- **A batch-1 decode step runs all its layers as one C call** (`llmlab.ops.cpu_decode`: the
  same kernels in one OpenMP region, whose threads spin between the phases instead of being
  woken for each kernel), as a CUDA graph replays a decode step's kernels on a GPU.
- **Little Python around that call**: the interpreter's and PyTorch's code is out of the caches
  after the step has streamed its weights through them (2-core Zen 4: building a step's inputs
  took 80 us warm, 260-420 us then), so each operator between two steps costs tens of
  microseconds. RoPE's cos and sin are rows of tables computed at load (vLLM's
  `cos_sin_cache`; two lookups instead of six operators), and the step enters inference mode
  once. A bf16 step spent 1.11-1.19 ms outside its C calls before, 0.97-0.99 ms after.

- **Several tokens per call** (multi-step scheduling, `num_scheduler_steps`): a greedy request
  decoding alone runs its next K tokens in one C call (`greedy_decode`: the embedding, the
  layers, the final norm, the LM head and the argmax, `DecodeStack.greedy_steps`), so the
  engine's Python runs once per K tokens. 2-core Zen 4, K = 8 against 1 in one engine: bf16
  1.13x, float32 1.07x, int8 1.20x tokens/s (`docs/design.md`).

- **Fewer bytes per weight**: a bfloat16 model, or one quantized to int8 (`llmlab.model.quantization`),
  keeps its weights in that dtype and the C kernels widen them inside the matmul
  (`kernels/cpu_quant.c`); activations stay float32 here (`CpuLlamaModel`). For batches (and
  from one row, the fused layer's GEMVs too: `PACKED_MIN_ROWS`) the weights are also packed
  once into `kernels/cpu_gemm.c`'s blocks, whose `vdpbf16ps` tiles do twice float32's
  arithmetic per instruction (x rounded to bf16 inside the matmul), or, for bf16 where it
  measured faster on this machine, into oneDNN's layout (`llmlab.ops.cpu_matmul_choice`).
  Before, a bf16 model decoded slower than a float32 one at batch 64: its widening matmul ran
  at half oneDNN's float32 speed.

The step's metadata was checked when it was built (`llmlab.ops.metadata`); each layer checks
only that its cache has the shape its weights were prepared for, so every pointer handed to C
is one that was checked.
"""

from __future__ import annotations

import itertools
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from llmlab.model import huge_pages
from llmlab.model.llama import DecoderLayer, LlamaModel, rope_cos_sin_cache
from llmlab.ops import cpu_backend, cpu_decode, cpu_matmul, cpu_matmul_choice
from llmlab.ops.metadata import AttentionMetadata

# from this many rows a bf16 / int8 matmul runs its batch kernel on a packed copy; fewer rows
# stream the dense weight (cpu_quant.c). One row reads the packed blocks front to back, while
# the dense GEMV reads four rows at once, streams too short for the hardware prefetchers;
# measured on a 2-core Zen 4, one row, us per matrix, dense vs packed: bf16, 30 [3072, 576] from
# memory 161 vs 127, one of them from cache 40 vs 31, [576, 576] 11.7 vs 10.9, the [49152, 576]
# LM head 2036 vs 1711; int8 (one row packed: vpdpwssd on the blocks, x rounded to int16 as the
# dense GEMV does), a layer's four matrices x 30 from memory, ms: 3.75-3.99 vs 3.38-3.53. int8
# from 2 rows: the same integer sums, each row of x rounded to int16 (from 128 rows widened to
# bf16: see INT16_MAX_ROWS in cpu_gemm.c).
# oneDNN's bf16 matmul, where it is the batch kernel, from 2 rows: it rounds its outputs to
# bf16, and one row streams the dense weight. float32 on llmlab's packed blocks from one row
# too, the fused layer's GEMVs included: with the packed copies on 2 MB pages, a batch-1 step
# took 1.7-2.1 ms less than on the dense weights (18.4 against 20.2, 21.1; the median of 24
# pairs of 19-step blocks swapped in one process, each order once), its attention phase too
# (0.69-0.74 against 0.95-0.97 ms, a cause not found). On oneDNN's, one float32 row runs the
# dense GEMV (cpu_gemv.c).
PACKED_MIN_ROWS = {
    ("llmlab", torch.float32): 1,
    ("llmlab", torch.bfloat16): 1,
    ("llmlab", torch.int8): 1,
    ("onednn", torch.float32): 2,
    ("onednn", torch.bfloat16): 2,
}


def _one_row_reads_packed(kernel: str | None, dtype: torch.dtype) -> bool:
    """Whether one row of x reads a matrix's packed copy for `kernel` (`_batch_kernel`'s
    choice) and weights of `dtype`, rather than the dense matrix (`PACKED_MIN_ROWS`)."""
    return PACKED_MIN_ROWS.get((kernel, dtype)) == 1


class CpuLinear(nn.Module):
    """y = x Wᵀ (+ b) on a weight prepared once. float32: rows run on a packed copy,
    `kernels/cpu_gemm.c`'s (from one row) or oneDNN's (from 2 rows; one row on our GEMV over the
    dense weight), whichever `_batch_kernel` chose (aten's `F.linear` where neither runs, or our
    GEMV for one row). bfloat16, or int8 with per-output-channel `scale`: our kernels widen the
    weight inside the matmul (`kernels/cpu_quant.c`), or run on their packed copy from
    `PACKED_MIN_ROWS` rows. Input and output are float32. `packs`: where the packed copy comes
    from (`PackedCopies`: an earlier one of the same, unchanged matrix, or a new one in its
    arena), else a new one in ordinary memory; `parts`: the matrices `weight` stacks (their
    versions tell a change), else `weight` itself."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        scale: torch.Tensor | None = None,
        packs: PackedCopies | None = None,
        parts: tuple[torch.Tensor, ...] | None = None,
    ):
        super().__init__()
        if weight.device.type != "cpu" or weight.dtype not in cpu_matmul.WEIGHT_TYPES:
            raise ValueError(
                f"CpuLinear: weight is {weight.dtype} on {weight.device}, expected "
                f"one of {tuple(cpu_matmul.WEIGHT_TYPES)} on the CPU"
            )
        if bias is not None and (
            bias.device.type != "cpu"
            or bias.dtype
            not in (torch.float32, weight.dtype if weight.dtype == torch.bfloat16 else None)
        ):
            raise ValueError(
                f"CpuLinear: bias is {bias.dtype} on {bias.device}, expected "
                "float32 (or bfloat16 beside bfloat16 weights) on the CPU"
            )
        if (weight.dtype == torch.int8) != (scale is not None):
            raise ValueError(
                "CpuLinear: scale: an int8 weight needs its per-row float32 "
                "scales, other dtypes none"
            )
        if weight.dtype != torch.float32 and weight.shape[1] % 16:
            raise ValueError(
                f"CpuLinear: in_features of a {weight.dtype} weight must be a "
                f"multiple of 16, got {weight.shape[1]}"
            )
        self.weight = weight.detach().contiguous()  # [out, in], dense, shared
        self.scale = None if scale is None else scale.detach().float().contiguous()  # [out]
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.gemv = weight.shape[1] % 16 == 0  # the C GEMV's row unit
        self.quantized = weight.dtype != torch.float32  # bf16 / int8: cpu_quant.c
        self.batch_kernel = _batch_kernel(self.weight)  # for batches: "llmlab", "onednn", None
        packs = packs or PackedCopies(None)
        self.packed = packs.packed(self.weight, self.batch_kernel, parts or (weight,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            x = x.float()
        if x.stride(-1) != 1:
            x = x.contiguous()
        kernel = (self.batch_kernel, self.weight.dtype)
        if self.batch_kernel is not None and x.shape[0] >= PACKED_MIN_ROWS[kernel]:
            if self.batch_kernel == "llmlab":
                return cpu_matmul.packed_gemm(
                    x, self.packed, self.weight.shape[0], self.scale, self.bias
                )  # [T, out]
            if self.quantized:  # oneDNN's bf16: bf16 in, bf16 out, widened after
                y = cpu_matmul.onednn_linear(x.bfloat16(), self.packed).float()  # [T, out]
                return y if self.bias is None else y + self.bias
            return cpu_matmul.onednn_linear(x, self.packed, self.bias)  # [T, out]
        if self.quantized:
            return cpu_matmul.qgemm(x, self.weight, self.scale, self.bias)  # [T, out]
        if x.shape[0] == 1 and self.gemv and x.is_contiguous():
            return cpu_matmul.gemv(x, self.weight, self.bias)  # [1, out]
        return F.linear(x, self.weight, self.bias)

    def extra_bytes(self) -> int:
        """Memory this layer adds to the model's parameters: its packed copy for batches
        (oneDNN's, or `kernels/cpu_gemm.c`'s)."""
        return 0 if self.packed is None else self.packed.numel() * self.packed.element_size()


# each model's packed copies from its last `cpu_model` (`PackedCopies.made`), gone with the model
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class PackedCopies:
    """The packed copies of one `cpu_model`'s matrices: each new one packed into `arena` (a
    `huge_pages.Arena`, taken in the order the layers are built; None: ordinary memory), or,
    for a matrix the model's previous `cpu_model` packed (`earlier`: its `made`), that copy
    again where the matrix is unchanged: the same memory, shape, dtype and kernel, and the same
    versions of its parts (q, k and v for a stacked qkv), which PyTorch counts up at every
    in-place change of a tensor or of a view of it.
    So a second engine on the same model packs nothing (a float32 SmolLM2's packed copies are
    540 MB; on the 2-core Zen 4 KVM guest of `_one_row_reads_dense`, of four float32 engines
    built one after another on one loaded model, each after the first took 0.5-1.05 s to build
    packing again, 0.05-0.08 s reusing the copies), and an engine built after a weight changed
    in place packs that matrix again. (A change through `.data`, which PyTorch does not count,
    is not seen: build the model again after one.) Each entry holds its dense matrices, so their
    memory cannot be handed to another tensor while the entry lives; the copies stay with the
    model until its next `cpu_model` or its end (a matrix packed again leaves its old copy's
    pages in use until the earlier buffer's last copy is gone)."""

    def __init__(self, arena: huge_pages.Arena | None, earlier: dict | None = None):
        self.arena = arena
        self.earlier = earlier or {}
        self.made: dict = {}  # (data_ptr, shape, dtype, kernel) -> (parts, versions, packed)

    def packed(
        self, weight: torch.Tensor, kernel: str | None, parts: tuple[torch.Tensor, ...]
    ) -> torch.Tensor | None:
        """The packed copy of `weight` (stacked from `parts`) for `kernel` ("llmlab":
        `kernels/cpu_gemm.c`'s blocks; "onednn": oneDNN's blocked layout, in the weight's dtype;
        None: none)."""
        if kernel is None:
            return None
        key = (weight.data_ptr(), tuple(weight.shape), weight.dtype, kernel)
        versions = tuple(t._version for t in parts)
        entry = self.earlier.get(key)
        if entry is None or entry[1] != versions:
            entry = (parts, versions, self._pack(weight, kernel))
        self.made[key] = entry
        return entry[2]

    def _pack(self, weight: torch.Tensor, kernel: str) -> torch.Tensor:
        with torch.no_grad():
            if kernel == "onednn":
                return cpu_matmul.onednn_pack(weight)
            n, k = weight.shape
            arena = self.arena
            place = arena and arena.take(cpu_matmul.packed_numel(n, k), weight.dtype)
            return cpu_matmul.pack_weight(weight, out=place)


def _batch_kernel(weight: torch.Tensor) -> str | None:
    """Which kernel multiplies a batch of rows (`PACKED_MIN_ROWS`) by `weight` here: float32
    and bf16 the faster of llmlab's packed matmul and oneDNN's on this machine
    (`llmlab.ops.cpu_matmul_choice`, measured once per dtype); int8 llmlab's packed matmul
    where this CPU has AVX-512 BF16; None: cpu_quant.c's widening matmul (bf16, int8) or aten's
    `F.linear` (float32)."""
    if weight.dtype in cpu_matmul_choice.DTYPES:
        choice = cpu_matmul_choice.choice(weight.dtype)
        if choice == "onednn" or (choice == "llmlab" and cpu_matmul.packed_weight_applies(weight)):
            return choice
        return None
    return "llmlab" if cpu_matmul.packed_weight_applies(weight) else None


def _adjacent_rows(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The one matrix `tensors` are consecutive row blocks of (a model prepared before), or None."""
    first = tensors[0]
    offset = first.storage_offset()
    for t in tensors:
        if (
            not t.is_contiguous()
            or t.dim() != first.dim()
            or t.shape[1:] != first.shape[1:]
            or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or t.storage_offset() != offset
        ):
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return (
        first.detach()
        .new_empty(0)
        .set_(first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]))
    )


def stack_linears(
    modules: list[nn.Module],
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The modules' weights stacked along out-features (their biases likewise, or None; their
    int8 scales likewise, or None), and each module's weight (and bias) re-pointed at its rows:
    one dense copy serves both. A model prepared before already holds its weights that way:
    they are used as they are."""
    weights = [m.weight.detach() for m in modules]
    biases = [m.bias for m in modules]
    scales = [getattr(m, "weight_scale", None) for m in modules]
    scale = None if scales[0] is None else torch.cat(scales)  # [sum(out)]
    if all(b is None for b in biases) and (stacked := _adjacent_rows(weights)) is not None:
        return stacked, None, scale
    with torch.no_grad():
        weight = torch.cat(weights)  # [sum(out), in]
        bias = (
            None
            if all(b is None for b in biases)
            else torch.cat(
                [
                    b.detach() if b is not None else m.weight.new_zeros(m.out_features)
                    for m, b in zip(modules, biases)
                ]
            )
        )
    start = 0
    for m in modules:
        rows = slice(start, start + m.out_features)
        if isinstance(m.weight, nn.Parameter):
            m.weight = nn.Parameter(weight[rows], requires_grad=False)
        else:  # a buffer (int8): re-pointed the same way
            m.weight = weight[rows]
        if m.bias is not None:
            m.bias = nn.Parameter(bias[rows], requires_grad=False)
        start += m.out_features
    return weight, bias, scale


class CpuDecoderLayer(nn.Module):
    """`llmlab.model.DecoderLayer`'s math with C kernels and prepared weights; built from one
    (its packed copies from `packs` where given, see `CpuLinear`)."""

    def __init__(self, layer: DecoderLayer, packs: PackedCopies | None = None):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.scale = attn.scale
        self.qkv_sizes = [self.heads * self.head_dim] + [self.kv_heads * self.head_dim] * 2
        self.inter = mlp.gate_proj.out_features
        # the norms in float32 (a bf16 model's are converted: 2 x hidden floats)
        self.ln1, self.ln2 = (
            _float_norm(n) for n in (layer.input_layernorm, layer.post_attention_layernorm)
        )
        qkv, gate_up = [attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]
        w_qkv, b_qkv, s_qkv = stack_linears(qkv)
        w_gate_up, _, s_gate_up = stack_linears(gate_up)
        # in the order a step reads them: their new packed copies go into the arena in this order
        self.qkv = CpuLinear(w_qkv, b_qkv, s_qkv, packs, tuple(m.weight for m in qkv))
        self.o_proj = CpuLinear(
            attn.o_proj.weight, attn.o_proj.bias, getattr(attn.o_proj, "weight_scale", None), packs
        )
        self.gate_up = CpuLinear(
            w_gate_up, None, s_gate_up, packs, tuple(m.weight for m in gate_up)
        )
        self.down_proj = CpuLinear(
            mlp.down_proj.weight,
            mlp.down_proj.bias,
            getattr(mlp.down_proj, "weight_scale", None),
            packs,
        )
        # a decode step's RoPE, cache write and attention as one call (`decode_attention`),
        # where the C attention takes these sizes (others run the torch backend's attention)
        self.one_call_decode = cpu_backend.attention_sizes_apply(
            self.heads, self.kv_heads, self.head_dim
        )
        self.plan = self.make_plan()

    def make_plan(self) -> cpu_decode.DecodeLayerPlan | None:
        """The fused one-token layer on this layer's weights (their pointers as they are now),
        or None where the C code does not take its sizes or biases."""
        if not (
            self.o_proj.bias is None
            and self.down_proj.bias is None
            and cpu_decode.decode_layer_applies(
                self.heads, self.kv_heads, self.head_dim, self.qkv.weight.shape[1], self.inter
            )
        ):
            return None
        linears = (self.qkv, self.o_proj, self.gate_up, self.down_proj)
        # the GEMVs on the packed copies where the one-row CpuLinear reads them (bf16 and int8
        # on llmlab's kernel)
        packed = all(_one_row_reads_packed(m.batch_kernel, m.weight.dtype) for m in linears)
        return cpu_decode.DecodeLayerPlan(
            self.ln1.weight.detach(),
            self.ln2.weight.detach(),
            self.ln1.eps,
            self.qkv.weight,
            self.qkv.bias,
            self.o_proj.weight,
            self.gate_up.weight,
            self.down_proj.weight,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.scale,
            None if self.qkv.scale is None else tuple(m.scale for m in linears),
            tuple(m.packed for m in linears) if packed else None,
        )

    def _check_cache(self, key_cache: torch.Tensor) -> None:
        """The cache must have the heads and head size these weights were prepared for."""
        want = (self.kv_heads, self.head_dim)
        if (
            tuple(key_cache.shape[2:]) != want
            or key_cache.dtype not in (torch.float32, torch.float8_e4m3fn)
            or key_cache.device.type != "cpu"
        ):
            raise ValueError(
                f"kv_caches: got {tuple(key_cache.shape)} {key_cache.dtype} on "
                f"{key_cache.device}, expected float32 or float8_e4m3fn "
                f"[num_blocks, block_size, {want[0]}, {want[1]}] on the CPU"
            )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        metadata: AttentionMetadata,
        layer: int,
    ) -> torch.Tensor:
        self._check_cache(metadata.kv_caches[layer][0])
        if x.dtype != torch.float32:  # a bf16 model's embeddings: float32 here on
            x = x.float()
        T = x.shape[0]
        h = cpu_backend.rms_norm(x, self.ln1.weight, self.ln1.eps)  # [T, hidden]
        qkv = self.qkv(h)  # [T, (heads + 2 kv_heads) d]
        kv = metadata.paged_kv(layer)  # fp8 scales (1, 1) for a float32 cache
        if self.one_call_decode and kv.is_decode and kv.key_cache.dtype == torch.float32:
            # RoPE, the cache write and attention in one C call, one unit per (sequence, KV head)
            out = cpu_backend.decode_attention(
                qkv, cos, sin, kv, metadata.slot_mapping, self.heads, self.scale
            )  # [T, heads, d]
        else:
            q, k, v = qkv.split(self.qkv_sizes, dim=-1)
            q = cpu_backend.rope(q, self.heads, cos, sin)  # [T, heads, d]
            k = cpu_backend.rope(k, self.kv_heads, cos, sin)  # [T, kv_heads, d]
            v = v.reshape(T, self.kv_heads, self.head_dim).contiguous()
            cpu_backend.reshape_and_cache(k, v, kv, metadata.slot_mapping)
            out = cpu_backend.paged_attention(q, kv, self.scale)  # [T, heads, d]
        a = self.o_proj(out.reshape(T, -1))  # [T, hidden]
        h, x = cpu_backend.rms_norm(a, self.ln2.weight, self.ln2.eps, residual=x)  # x += a
        gate, up = self.gate_up(h).split(self.inter, dim=-1)  # [T, inter] ×2
        return x + self.down_proj(cpu_backend.silu_mul(gate, up))

    def extra_bytes(self) -> int:
        return sum(m.extra_bytes() for m in (self.qkv, self.o_proj, self.gate_up, self.down_proj))


def cpu_model_applies(model: LlamaModel) -> tuple[bool, str]:
    """(True, "") when `cpu_model` can run `model` here, else (False, why)."""
    if model.device.type != "cpu" or model.dtype not in (torch.float32, torch.bfloat16):
        return False, (
            f"the C kernels take a float32 or bfloat16 model (int8 weights "
            f"included) on the CPU; this one is {model.dtype} on {model.device}"
        )
    cfg = model.config
    if cfg.hidden_size % 16 or cfg.intermediate_size % 16 or cfg.head_dim % 2:
        return False, (
            "the C kernels take hidden and intermediate sizes that are multiples "
            f"of 16, got {cfg.hidden_size} and {cfg.intermediate_size}"
        )
    return cpu_backend.available()


def cpu_model(model: LlamaModel) -> LlamaModel:
    """`model` with every decoder layer swapped for a `CpuDecoderLayer` and the LM head for a
    `CpuLinear`; the embedding, final norm and RoPE tables are shared, not copied, and so are
    the dense weights (see the module's docstring: call again after changing the weights).
    Where a one-row step here streams some dense matrix (`_one_row_reads_dense`), `model`'s
    weight matrices first move onto huge pages (`huge_pages.rehome_weights`), in place: the
    same values, which the batch-1 GEMVs stream faster from there."""
    ok, why = cpu_model_applies(model)
    if not ok:
        raise ValueError(f"the 'cpu' fast path cannot run this model: {why}")
    if _one_row_reads_dense(model):
        huge_pages.rehome_weights(model)
    # our packed copies on huge pages too, packed straight there in the order a step reads them:
    # a batch-1 step streams them (2-core Zen 4, `bench decode_profile`, alternated: int8
    # 130-164 tok/s from 4 KB pages, 176-179 from 2 MB pages; bf16 within the noise, 84-108
    # against 88-105). The room: one packed copy of each matrix at most
    arena = huge_pages.Arena(
        sum(
            cpu_matmul.packed_numel(*w.shape) * w.element_size() + huge_pages.ALIGN
            for w in huge_pages.weight_matrices(model)
        )
    )
    with torch.device("meta"):  # no memory, no init: every module is swapped
        fast = CpuLlamaModel(model.config)
    fast.embed_tokens = model.embed_tokens
    fast.norm = CpuRMSNorm(model.norm)
    packs = PackedCopies(arena, _PACKED.get(model))
    fast.layers = nn.ModuleList(CpuDecoderLayer(layer, packs) for layer in model.layers)
    fast.lm_head = CpuLinear(
        model.lm_head.weight,
        model.lm_head.bias,
        getattr(model.lm_head, "weight_scale", None),
        packs,
    )
    _PACKED[model] = packs.made  # for the next engine on this model
    fast.inv_freq = model.inv_freq
    table = rope_cos_sin_cache(model.inv_freq, model.config.max_position_embeddings)
    half = table.shape[1] // 2
    fast.register_buffer("rope_cos", table[:, :half].contiguous(), persistent=False)
    fast.register_buffer("rope_sin", table[:, half:].contiguous(), persistent=False)
    fast.weight_dtype = model.lm_head.weight.dtype
    fast.decode_head = _decode_head(fast)
    return fast.eval()


def _one_row_reads_dense(model: LlamaModel) -> bool:
    """Whether a one-row step here streams the dense copy of some matrix of `model` (its layers'
    and its LM head's): one with no packed copy that one row reads (`PACKED_MIN_ROWS`). Only
    then are the dense copies worth moving onto 2 MB pages: where every matrix has such a copy,
    a step never reads them (nor the embedding, but one row per token), and the move only costs
    the start. It costs most on a VM whose host takes back the memory its guest frees ("free
    page reporting"): on the 2-core Zen 4 KVM guest, a new process filled its first GB of 2 MB
    pages in 2.2-2.6 s, of 4 KB pages in 0.4-0.6 s (2 MB pages it had freed itself: 0.06 s).
    There, one engine's first start in a new process, moved against left in place (3
    alternated pairs): float32 3.1-3.7 s against 1.9-2.4 s (peak memory 1.80 against 1.54 GB),
    bf16 2.4-2.9 against 1.5-2.3 s, int8 1.6-2.2 against 1.4-1.9 s; the decode step the same
    (128 batch-1 tokens, 6 alternated rounds in one process, median ms per token: float32
    12.45 against 12.24, bf16 7.93 against 7.91, int8 4.84 against 4.77)."""
    embedding = model.embed_tokens.weight.data_ptr()
    head = model.lm_head.weight.data_ptr()
    return any(
        not _one_row_reads_packed(_batch_kernel(w), w.dtype)
        for w in huge_pages.weight_matrices(model)
        if w.data_ptr() != embedding or w.data_ptr() == head
    )


def _decode_head(fast: CpuLlamaModel) -> cpu_decode.DecodeHead | None:
    """The `DecodeHead` of a fast model whose LM head has no bias and a GEMV row unit, whose
    final norm shares its layers' epsilon and whose embedding is float32, bfloat16 or int8 read
    out as float32; else None (`greedy_decode` then does not run). Its GEMV reads what a one-row
    `CpuLinear` reads: the packed copy where `PACKED_MIN_ROWS` says so, else the dense matrix."""
    head, embed = fast.lm_head, fast.embed_tokens
    if (
        head.bias is not None
        or not head.gemv
        or getattr(embed, "out_dtype", torch.float32) != torch.float32
        or not fast.layers
        or fast.layers[0].plan is None
        or fast.norm.eps != fast.layers[0].plan.eps
    ):
        return None
    packed = _one_row_reads_packed(head.batch_kernel, head.weight.dtype)
    return cpu_decode.DecodeHead(
        embed.weight.detach(),
        getattr(embed, "weight_scale", None),
        fast.norm.weight.detach(),
        head.weight,
        head.packed if packed else None,
        head.scale,
    )


class CpuLlamaModel(LlamaModel):
    """The fast path's model: activations in float32 whatever the weights' dtype (bf16 or int8
    weights are widened inside the matmul kernels), so RoPE tables and the residual stream are
    float32; `weight_dtype` says what the matrices are stored in."""

    weight_dtype: torch.dtype = torch.float32
    _stacks: tuple = ((), ())  # (the plans they were made for, [DecodeStack or layer index])
    decode_head: cpu_decode.DecodeHead | None = None  # `greedy_decode`'s ends of the model

    def rope_cos_sin(self, positions: torch.Tensor):
        """cos, sin [T, d/2] float32: rows of the tables `cpu_model` computed at load (two
        lookups where computing the angles takes six operators), or computed the same way for a
        position past them."""
        try:
            return self.rope_cos.index_select(0, positions), self.rope_sin.index_select(
                0, positions
            )
        except IndexError:
            angles = positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)  # [T, d/2]
            return angles.cos(), angles.sin()

    def run_layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        metadata: AttentionMetadata,
        count: int,
    ) -> torch.Tensor:
        """A batch-1 step over float32 caches runs each run of layers that have a fused plan as
        one C call (`cpu_decode.DecodeStack`); a layer without one, or any other step, runs
        layer by layer."""
        caches = metadata.kv_caches
        if x.shape[0] != 1 or any(k.dtype != torch.float32 for k, _ in caches[:count]):
            return super().run_layers(x, cos, sin, metadata, count)
        if x.dtype != torch.float32:  # a bf16 model's embeddings: float32 here on
            x = x.float()
        x = x.contiguous()
        for part in self._decode_parts(count):
            if isinstance(part, int):
                x = self.layers[part](x, cos, sin, metadata, part)
            else:
                first, stack = part
                x = stack(
                    x,
                    cos,
                    sin,
                    caches[first : first + len(stack.plans)],
                    metadata.slot_mapping,
                    metadata.block_tables,
                    metadata.seq_lens,
                )
        return x

    def greedy_decode_applies(self, caches: list) -> bool:
        """Whether `greedy_decode` runs here: every layer in one C call (each with a fused plan,
        float32 caches) and a `DecodeHead` (see `_decode_head` for where `cpu_model` makes
        one)."""
        return self.decode_head is not None and self._one_call_layers(caches) is not None

    def _one_call_layers(self, caches: list) -> cpu_decode.DecodeStack | None:
        """The `DecodeStack` that runs every layer of a batch-1 step, or None where the layers
        take more calls than one (a layer without a plan) or a cache is not float32."""
        parts = self._decode_parts(len(self.layers))
        if len(parts) != 1 or isinstance(parts[0], int):
            return None
        if any(k.dtype != torch.float32 for k, _ in caches):
            return None
        return parts[0][1]

    def greedy_decode(
        self, token: int, positions: torch.Tensor, metadata: AttentionMetadata, stop_ids: list
    ) -> list[int]:
        """Up to K = len(positions) greedy tokens of one sequence, one forward each, each token
        fed to the next forward, all in one C call (`DecodeStack.greedy_steps`): multi-step
        scheduling's loop (`ModelRunner.execute_steps`) with nothing between two tokens but a
        barrier. `metadata` describes the K tokens as one chunk of the sequence (positions [K]
        from its cache length on, slot_mapping [K], the length after the last), checked once
        when it was built; forward j writes slot j and attends over the keys up to position j.
        Stops after a token in `stop_ids`. The same kernels and results as K steps of `forward`,
        each followed by the sampler's argmax of `compute_logits` (`greedy_decode_applies`
        says where it runs)."""
        stack = self._one_call_layers(metadata.kv_caches)
        num = positions.shape[0]
        cos, sin = self.rope_cos_sin(positions)  # [K, d/2] each
        end = int(metadata.seq_lens[0])
        return stack.greedy_steps(
            self.decode_head,
            token,
            cos.contiguous(),
            sin.contiguous(),
            metadata.kv_caches,
            metadata.slot_mapping,
            metadata.block_tables[0],
            torch.arange(end - num + 1, end + 1, dtype=torch.int32),  # forward j's length
            torch.tensor(stop_ids, dtype=torch.int64),
        )

    def _decode_parts(self, count: int) -> list:
        """The first `count` layers as (first index, DecodeStack) for each run of layers with a
        plan and the index of each layer without; made again when a layer's plan changed."""
        # iterated, not indexed (each index is a str(int) lookup) nor sliced (a slice builds a
        # new ModuleList each step)
        plans = tuple(layer.plan for layer in itertools.islice(self.layers, count))
        if plans != self._stacks[0]:
            parts, run = [], []
            for i, plan in enumerate((*plans, None)):
                if plan is not None:
                    run.append(plan)
                    continue
                if run:
                    parts.append((i - len(run), cpu_decode.DecodeStack(run)))
                    run = []
                if i < count:
                    parts.append(i)
            self._stacks = (plans, parts)
        return self._stacks[1]


class CpuRMSNorm(nn.Module):
    """The model's final RMSNorm by the C kernel (`cpu_backend.rms_norm`), in float32: one call
    where the readable `RMSNorm` runs seven PyTorch operators. At batch 1 they run right after
    the layers have streamed every weight through the caches, which evicts what the
    interpreter and PyTorch keep there (a 2-core Zen 4: the readable norm of one row took 15 us
    warm, 86 us after a 100 MB read)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = _float_norm(norm).weight  # float32: shared where it already is
        self.eps = norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_backend.rms_norm(x.float(), self.weight, self.eps)  # [T, hidden]


def _float_norm(norm: nn.Module) -> nn.Module:
    """An RMSNorm as it is when float32, else a float32 copy (hidden floats: nothing to share)."""
    if norm.weight.dtype == torch.float32:
        return norm
    from llmlab.model.llama import RMSNorm

    copy = RMSNorm(norm.weight.numel(), norm.eps)
    with torch.no_grad():
        copy.weight.copy_(norm.weight.float())
    return copy


def weight_bytes(model: LlamaModel) -> int:
    """Bytes of every distinct tensor storage `model` computes with: parameters (a tied or
    shared matrix once) plus, for a `cpu_model`, the packed copies for batches."""
    seen, total = set(), 0
    for t in (
        list(model.parameters())
        + list(model.buffers())
        + [
            t
            for m in model.modules()
            if isinstance(m, CpuLinear)
            for t in (m.weight, m.scale)
            if t is not None
        ]
    ):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    extra = sum(m.extra_bytes() for m in model.modules() if isinstance(m, CpuLinear))
    return total + extra
