"""A batch-1 decode step's decoder layers in one C call (`llmlab_decode_layers`,
`kernels/cpu_layer.c`): what the engine's CPU fast path (`llmlab.model.cpu`) runs for one token
of one sequence.

At batch 1 a layer streams its weights in a few hundred microseconds, and what surrounds that
shows: a Python call and a dozen checks per layer, and an OpenMP region whose worker threads
have to be woken (tens of microseconds each time they slept). So the weights of each layer are
checked once (`DecodeLayerPlan`), and a run of consecutive layers becomes one call
(`DecodeStack`): one region for the whole step, its threads waiting for each other by spinning
between the layer's phases, the way a CUDA graph replays a decode step's kernels on a GPU with
one launch. The kernels and the order of float operations are those of the kernel-by-kernel
path, so the results are identical (the tests compare them). A bf16 layer whose matrices have
`kernels/cpu_gemm.c`'s packed copies (`packed=`) runs its GEMVs on those, as its one-row
`CpuLinear`s do: the blocks are read front to back, which a dense GEMV's four short rows at a
time are not.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools

import torch

from llmlab.ops.cpu_backend import HEAD_DIMS, MAX_GROUP, attention_sizes_apply
from llmlab.ops.cpu_library import load_library, traced
from llmlab.ops.cpu_matmul import WEIGHT_TYPES, packed_numel

# the weight types of packed matrices (LLMLAB_W_BF16_PACKED, _INT8_PACKED, _F32_PACKED,
# cpu_kernels.h)
PACKED_TYPES = {torch.bfloat16: 3, torch.int8: 4, torch.float32: 5}


def decode_layer_applies(heads: int, kv_heads: int, head_dim: int, hidden: int, inter: int) -> bool:
    """Whether `llmlab_decode_layers` takes a layer of these sizes (its attention kernel's head
    sizes and GQA groups, 16-float rows)."""
    return hidden % 16 == 0 and inter % 16 == 0 and attention_sizes_apply(heads, kv_heads, head_dim)


def _check_packed(packed: tuple[torch.Tensor, ...], matrices: tuple[torch.Tensor, ...]) -> None:
    """ValueError unless `packed` are the four float32, bfloat16 or int8 `matrices`' packed
    copies: contiguous CPU tensors of their dtype, of `cpu_matmul.packed_numel` elements each,
    K a multiple of 32 for bfloat16 and int8."""
    names = ("w_qkv", "w_o", "w_gate_up", "w_down")
    dtype = matrices[0].dtype
    if len(packed) != 4 or dtype not in PACKED_TYPES:
        raise ValueError(
            f"decode layer: packed must be the four matrices' packed copies, for "
            f"{' or '.join(map(str, PACKED_TYPES))} weights; got {len(packed)} tensors for "
            f"{dtype} weights"
        )
    pairs = dtype != torch.float32  # bf16 and int8 blocks hold (k, k + 1) pairs
    for name, p, w in zip(names, packed, matrices):
        n, k = w.shape
        if (pairs and k % 32) or p.dtype != dtype or p.numel() != packed_numel(n, k):
            raise ValueError(
                f"decode layer: packed {name} is {p.dtype} of {p.numel()} elements for a "
                f"[{n}, {k}] matrix; expected {dtype} of {packed_numel(n, k)}"
                + (", K % 32 == 0" if pairs else "")
            )
        if p.device.type != "cpu" or not p.is_contiguous():
            raise ValueError(f"decode layer: packed {name} must be a contiguous CPU tensor")


def _check_tensors(what: str, expected: dict) -> None:
    """ValueError naming the first of `expected` ({name: (tensor, shape, dtype)}) that is not a
    contiguous CPU tensor of that shape and dtype; `what` ("decode layer", "decode head") begins
    the message."""
    for name, (t, shape, want) in expected.items():
        fits = tuple(t.shape) == shape and t.dtype == want and t.device.type == "cpu"
        if not (fits and t.is_contiguous()):
            raise ValueError(
                f"{what}: {name} is {tuple(t.shape)} {t.dtype} on "
                f"{t.device}, expected contiguous {want} {shape} on the CPU"
            )


def _check_layer_weights(
    given: dict[str, torch.Tensor | None],
    sizes: tuple[int, int, int],
    weight_scales: tuple[torch.Tensor, ...] | None,
) -> None:
    """ValueError naming the first of a decoder layer's tensors (`given`: ln1, ln2, w_qkv, b_qkv
    or None, w_o, w_gate_up, w_down) that is not what `llmlab_decode_layers` takes: the four
    matrices of one weight type (int8 with `weight_scales`, float32 scales per output row),
    norms, bias and scales float32, each shape as the norm's size, `sizes` (heads, kv_heads,
    head_dim) and w_down's inner size make it, and sizes the fused layer's kernels take."""
    (heads, kv_heads, head_dim), wdtype = sizes, given["w_qkv"].dtype
    hidden, inter = given["ln1"].numel(), given["w_down"].shape[-1]
    if wdtype not in WEIGHT_TYPES or (wdtype == torch.int8) != (weight_scales is not None):
        raise ValueError(
            f"decode layer: weights are {wdtype}, expected one of "
            f"{tuple(WEIGHT_TYPES)} (int8 with weight_scales, others without)"
        )
    qw, kw = heads * head_dim, kv_heads * head_dim
    expected = {
        "ln1": (given["ln1"], (hidden,)),
        "ln2": (given["ln2"], (hidden,)),
        "w_qkv": (given["w_qkv"], (qw + 2 * kw, hidden)),
        "w_o": (given["w_o"], (hidden, qw)),
        "w_gate_up": (given["w_gate_up"], (2 * inter, hidden)),
        "w_down": (given["w_down"], (hidden, inter)),
    }
    if given["b_qkv"] is not None:
        expected["b_qkv"] = (given["b_qkv"], (qw + 2 * kw,))
    if weight_scales is not None:
        for name, t in zip(("s_qkv", "s_o", "s_gate_up", "s_down"), weight_scales):
            expected[name] = (t, (expected["w" + name[1:]][1][0],))
    matrices = ("w_qkv", "w_o", "w_gate_up", "w_down")  # in wdtype, the rest float32
    _check_tensors(
        "decode layer",
        {
            name: (t, shape, wdtype if name in matrices else torch.float32)
            for name, (t, shape) in expected.items()
        },
    )
    if not decode_layer_applies(heads, kv_heads, head_dim, hidden, inter):
        raise ValueError(
            f"decode layer: hidden {hidden} and intermediate {inter} must be "
            f"multiples of 16, head_dim {head_dim} one of {HEAD_DIMS}, heads "
            f"{heads} a multiple of kv_heads {kv_heads} (at most {MAX_GROUP}x)"
        )


class DecodeLayerPlan:
    """A decoder layer's weights, checked once, as `llmlab_decode_layers` takes them: the
    tensors (kept alive here) and their pointers. Build it again when a weight changes."""

    def __init__(
        self,
        ln1: torch.Tensor,
        ln2: torch.Tensor,
        eps: float,
        w_qkv: torch.Tensor,
        b_qkv: torch.Tensor | None,
        w_o: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        heads: int,
        kv_heads: int,
        head_dim: int,
        scale: float,
        weight_scales: tuple[torch.Tensor, ...] | None = None,
        packed: tuple[torch.Tensor, ...] | None = None,
    ):
        """The four matrices in float32, bfloat16, or int8 with `weight_scales` (float32 scales
        per output row of w_qkv, w_o, w_gate_up, w_down). `packed`: the four matrices' copies
        made by `cpu_matmul.pack_weight`, which the GEMVs then read."""
        hidden, inter = ln1.numel(), w_down.shape[-1]
        wdtype = w_qkv.dtype
        qw, kw = heads * head_dim, kv_heads * head_dim
        _check_layer_weights(
            {
                "ln1": ln1,
                "ln2": ln2,
                "w_qkv": w_qkv,
                "b_qkv": b_qkv,
                "w_o": w_o,
                "w_gate_up": w_gate_up,
                "w_down": w_down,
            },
            (heads, kv_heads, head_dim),
            weight_scales,
        )
        matrices = (w_qkv, w_o, w_gate_up, w_down)
        if packed is not None:
            _check_packed(packed, matrices)
            matrices = packed
        self.tensors = (ln1, ln2, w_qkv, b_qkv, w_o, w_gate_up, w_down, weight_scales, packed)
        self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter = (
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
        )
        self.eps, self.scale = eps, scale
        self.wtype = WEIGHT_TYPES[wdtype] if packed is None else PACKED_TYPES[wdtype]
        self.scratch_size = 3 * qw + 2 * kw + 3 * inter
        scale_ptrs = (
            (None,) * 4 if weight_scales is None else tuple(t.data_ptr() for t in weight_scales)
        )
        # the order of cpu_layer.c's LN1 ... S_DOWN slots; the two caches follow (`pointers`)
        self.weights = (
            ln1.data_ptr(),
            ln2.data_ptr(),
            matrices[0].data_ptr(),
            None if b_qkv is None else b_qkv.data_ptr(),
            matrices[1].data_ptr(),
            matrices[2].data_ptr(),
            matrices[3].data_ptr(),
            *scale_ptrs,
        )

    def shape(self) -> tuple:
        """What the layers of one call must share: sizes, norm epsilon, scale, weight type."""
        return (
            self.hidden,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.inter,
            self.eps,
            self.scale,
            self.wtype,
        )

    def check_cache(self, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
        """ValueError unless both caches are contiguous float32 CPU tensors [blocks, block_size,
        kv_heads, head_dim] of the same shape: what the C layer reads and writes."""
        want = (self.kv_heads, self.head_dim)
        for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
            if (
                t.dim() != 4
                or tuple(t.shape[2:]) != want
                or t.shape != key_cache.shape
                or t.dtype != torch.float32
                or t.device.type != "cpu"
                or not t.is_contiguous()
            ):
                raise ValueError(
                    f"kv_caches: {name} is {tuple(t.shape)} {t.dtype} on {t.device}, "
                    f"expected contiguous float32 [num_blocks, block_size, {want[0]}, "
                    f"{want[1]}] on the CPU"
                )


class DecodeStack:
    """Consecutive decoder layers (their `DecodeLayerPlan`s) run for one token in one C call.
    The layers' pointers with their caches' are gathered, and the caches checked, once per set
    of caches (the engine's are the same tensors from step to step)."""

    def __init__(self, plans: list[DecodeLayerPlan]):
        if not plans or any(p.shape() != plans[0].shape() for p in plans):
            raise ValueError(
                "decode stack: plans must be one or more layers of the same sizes, norm "
                f"epsilon, scale and weight type, got {[p.shape() for p in plans]}"
            )
        self.plans = list(plans)
        self._caches: tuple = ()  # the (key, value) caches the array was made for
        self._cache_ids: tuple = ()  # their ids (unique while held)
        self._array = None
        self._scratch = torch.empty(self.plans[0].scratch_size, dtype=torch.float32)

    def _pointers(self, caches: list[tuple[torch.Tensor, torch.Tensor]]) -> ctypes.Array:
        """Every layer's weight pointers then its two caches', as one array of void pointers:
        made (and the caches checked) when the caches are not the ones of the last call."""
        ids = tuple(map(id, itertools.chain.from_iterable(caches)))
        if ids == self._cache_ids:
            return self._array
        if len(caches) != len(self.plans):
            raise ValueError(
                f"decode stack: got {len(caches)} (key, value) cache pairs for "
                f"{len(self.plans)} layers"
            )
        for plan, (k, v) in zip(self.plans, caches):
            plan.check_cache(k, v)
            if k.shape != caches[0][0].shape:  # one block size for the call
                raise ValueError(
                    f"decode stack: caches of {tuple(k.shape)} and {tuple(caches[0][0].shape)}"
                    " in one call; every layer's must have the same shape"
                )
        ptrs = [
            p
            for plan, (k, v) in zip(self.plans, caches)
            for p in (*plan.weights, k.data_ptr(), v.data_ptr())
        ]
        self._array = (ctypes.c_void_p * len(ptrs))(*ptrs)
        self._caches = tuple((k, v) for k, v in caches)  # held: the array points into them
        self._cache_ids = ids
        return self._array

    def _sizes(self, caches: list) -> tuple:
        """The C calls' block_size, hidden, heads, kv_heads, head_dim, inter and scale."""
        first = self.plans[0]
        return (
            caches[0][0].shape[1],
            first.hidden,
            first.heads,
            first.kv_heads,
            first.head_dim,
            first.inter,
            first.scale,
        )

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        """The layers for one new token, x [1, hidden] -> [1, hidden] (a new tensor); writes
        the token's K/V into each layer's cache slot. The step's metadata (slot_mapping [1],
        block_tables [1, W], seq_lens [1]) is NOT checked here: it was checked once for the step
        when its `AttentionMetadata` was built; the caches are checked against the plans."""
        first = self.plans[0]
        if x.shape != (1, first.hidden) or not x.is_contiguous() or x.dtype != torch.float32:
            raise ValueError(
                f"decode stack: x must be contiguous float32 [1, {first.hidden}], "
                f"got {tuple(x.shape)} {x.dtype}"
            )
        half = (1, first.head_dim // 2)
        if not all(
            c.shape == half and c.dtype == torch.float32 and c.is_contiguous() for c in (cos, sin)
        ):
            raise ValueError(
                f"decode stack: cos, sin must be contiguous float32 {list(half)}, got "
                f"{tuple(cos.shape)} {cos.dtype} and {tuple(sin.shape)} {sin.dtype}"
            )
        layers = self._pointers(caches)
        out = torch.empty(1, first.hidden, dtype=torch.float32)
        with traced("llmlab_cpu::decode_layers"):
            rc = load_library().llmlab_decode_layers(
                len(self.plans),
                layers,
                x.data_ptr(),
                out.data_ptr(),
                self._scratch.data_ptr(),
                first.eps,
                first.wtype,
                cos.data_ptr(),
                sin.data_ptr(),
                slot_mapping.data_ptr(),
                block_tables.data_ptr(),
                seq_lens.data_ptr(),
                *self._sizes(caches),
            )
        if rc != 0:
            raise RuntimeError(
                "cpu_layer.c refused the decode layers: a head_dim without an attention "
                "variant, or packed weights on a CPU without their instructions (AVX-512F for "
                "float32, AVX-512 BF16 for bf16 and int8)"
            )
        return out

    def greedy_steps(
        self,
        head: "DecodeHead",
        token: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        slots: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        stop_ids: torch.Tensor,
    ) -> list[int]:
        """Up to K greedy tokens of one sequence in one C call (`llmlab_decode_steps`): forward
        j embeds token j (`token`, then each token the forward before picked), runs these
        layers at position j (cos, sin [K, head_dim / 2]; slots [K] int64; seq_lens [K] int32,
        forward j's length; block_table [W] int32), then `head`'s final norm, LM head and
        argmax; it stops after a token among stop_ids (int64). The slots, table and lengths
        are a step's metadata, checked when it was built; shapes and dtypes are checked here."""
        first, num = self.plans[0], slots.shape[0]
        half = (num, first.head_dim // 2)
        _check_tensors(
            "decode steps",
            {
                "cos": (cos, half, torch.float32),
                "sin": (sin, half, torch.float32),
                "slots": (slots, (num,), torch.int64),
                "seq_lens": (seq_lens, (num,), torch.int32),
                "block_table": (block_table, tuple(block_table.shape[-1:]), torch.int32),
                "stop_ids": (stop_ids, tuple(stop_ids.shape[-1:]), torch.int64),
            },
        )
        if head.hidden != first.hidden or not 0 <= token < head.vocab:
            raise ValueError(
                f"decode steps: token must be in [0, {head.vocab}) and the head's hidden size "
                f"{head.hidden} the layers' {first.hidden}; got token {token}"
            )
        layers = self._pointers(caches)
        tokens = torch.empty(num, dtype=torch.int64)
        with traced("llmlab_cpu::decode_steps"):
            count = load_library().llmlab_decode_steps(
                len(self.plans),
                layers,
                head.pointers,
                head.embed_type,
                head.head_type,
                head.vocab,
                head.x.data_ptr(),
                self._scratch.data_ptr(),
                head.logits.data_ptr(),
                first.eps,
                first.wtype,
                cos.data_ptr(),
                sin.data_ptr(),
                slots.data_ptr(),
                block_table.data_ptr(),
                seq_lens.data_ptr(),
                *self._sizes(caches),
                token,
                stop_ids.data_ptr(),
                stop_ids.numel(),
                num,
                tokens.data_ptr(),
            )
        if count < 0:
            raise RuntimeError(
                "cpu_layer.c refused the decode steps: a head_dim without an attention variant, "
                "or packed weights on a CPU without their instructions"
            )
        return tokens[:count].tolist()


class DecodeHead:
    """The model's ends around its layers, checked once, as `llmlab_decode_steps` takes them:
    the embedding (float32, bfloat16, or int8 with a float32 scale per token), the final
    RMSNorm's weight and the LM head (float32, bfloat16, or int8 with its scales per row),
    which the GEMV reads from its packed copy (`cpu_matmul.pack_weight`) where it is given, as
    a one-row `CpuLinear` does; with the buffers the call writes (the hidden row, the logits)."""

    def __init__(
        self,
        embed: torch.Tensor,
        embed_scales: torch.Tensor | None,
        norm: torch.Tensor,
        lm_head: torch.Tensor,
        lm_head_packed: torch.Tensor | None,
        lm_head_scales: torch.Tensor | None,
    ):
        vocab, hidden = embed.shape
        expected = {
            "embed": (embed, (vocab, hidden), embed.dtype),
            "norm": (norm, (hidden,), torch.float32),
            "lm_head": (lm_head, (vocab, hidden), lm_head.dtype),
        }
        if lm_head_packed is not None:
            size = (packed_numel(vocab, hidden),)
            expected["lm_head_packed"] = (lm_head_packed, size, lm_head.dtype)
        for name, t in (("embed_scales", embed_scales), ("lm_head_scales", lm_head_scales)):
            if (t is not None) != (expected[name[: -len("_scales")]][2] == torch.int8):
                raise ValueError(f"decode head: {name} comes with an int8 matrix, and only then")
            if t is not None:
                expected[name] = (t, (vocab,), torch.float32)
        for name, t in (("embed", embed), ("lm_head", lm_head)):
            if t.dtype not in PACKED_TYPES:
                raise ValueError(
                    f"decode head: {name} is {t.dtype}, expected one of {tuple(PACKED_TYPES)}"
                )
        _check_tensors("decode head", expected)
        matrix = lm_head if lm_head_packed is None else lm_head_packed
        self.tensors = (embed, embed_scales, norm, matrix, lm_head_scales)
        self.vocab, self.hidden = vocab, hidden
        self.embed_type = WEIGHT_TYPES[embed.dtype]
        types = WEIGHT_TYPES if lm_head_packed is None else PACKED_TYPES
        self.head_type = types[lm_head.dtype]
        # cpu_layer.c's EMBED ... LM_HEAD_SCALES slots
        self.pointers = (ctypes.c_void_p * 5)(
            *(None if t is None else t.data_ptr() for t in self.tensors)
        )
        self.x = torch.empty(hidden, dtype=torch.float32)
        self.logits = torch.empty(vocab, dtype=torch.float32)


# the phases of `llmlab_decode_layers` as `timed_layer_phases` splits it (kernels/cpu_layer.c):
# each ends at a barrier (all threads done), timed by the calling thread
LAYER_PHASES = (
    "region start",  # the call until its thread is inside the OpenMP region
    "norm + qkv",  # RMSNorm (each thread) and the q/k/v GEMV
    "rope + attention",  # per KV head: RoPE, K/V into the cache, attention
    "o_proj",  # x + W_o a
    "norm + gate_up",  # RMSNorm (each thread) and the gate/up GEMV
    "silu x up",
    "down_proj",  # x + W_down h
    "region end",  # the last barrier until the call returns
)


@contextlib.contextmanager
def timed_layer_phases():
    """Seconds spent in each of `LAYER_PHASES`, summed over every fused decode call run inside
    the block: yields a float64 tensor [len(LAYER_PHASES)] that the C code adds to (zero it to
    start again). How `bench decode_profile` splits its "layers" part."""
    seconds = torch.zeros(len(LAYER_PHASES), dtype=torch.float64)
    lib = load_library()
    lib.llmlab_time_layer_phases(seconds.data_ptr())
    try:
        yield seconds
    finally:
        lib.llmlab_time_layer_phases(None)
