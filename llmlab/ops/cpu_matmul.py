"""The CPU matmuls: a one-row GEMV on float32 weights (`kernels/cpu_gemv.c`), matmuls on bf16
and int8 weights widened inside the kernel (`kernels/cpu_quant.c`), and the batch matmul on such
weights packed once at load (`kernels/cpu_gemm.c`), and oneDNN's matmul on its own packed copy
(`torch.ops.mkldnn`, shipped inside PyTorch). The engine's CPU fast path
(`llmlab.model.cpu.CpuLinear`) calls them; their instruction sets are chosen at run time
(`isa`, `set_isa_cap`), and which bf16 batch kernel runs on this machine by a measurement
(`llmlab.ops.cpu_matmul_choice`, which also says in words which kernels run where).
"""

from __future__ import annotations

import torch

from llmlab.ops.cpu_library import ISA_FLAGS, isa_cap_mask, load_library, traced

# weight types of `kernels/cpu_quant.c` (LLMLAB_W_*), by torch dtype
WEIGHT_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}


def _onednn_ops():
    """oneDNN's linear and weight reorder, where this PyTorch has them (None, None otherwise)."""
    if not torch.backends.mkldnn.is_available():
        return None, None
    mkldnn = torch.ops.mkldnn
    linear = getattr(mkldnn, "_linear_pointwise", None)
    reorder = getattr(mkldnn, "_reorder_linear_weight", None)
    return (linear, reorder) if linear is not None and reorder is not None else (None, None)


_ONEDNN_LINEAR, _ONEDNN_REORDER = _onednn_ops()
PACK_BATCH_HINT = 32  # the batch oneDNN picks its packed layout for; it serves any batch


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [T, in] @ weight [out, in]ᵀ (+ bias) on oneDNN; `weight` dense or packed (`onednn_pack`)."""
    if _ONEDNN_LINEAR is None:
        raise RuntimeError("this PyTorch build has no oneDNN linear (torch.ops.mkldnn)")
    return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")


def onednn_available() -> bool:
    return _ONEDNN_LINEAR is not None


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] reordered once into oneDNN's blocked layout, for `onednn_linear`."""
    if _ONEDNN_REORDER is None:
        raise RuntimeError("this PyTorch build has no oneDNN weight reorder (torch.ops.mkldnn)")
    return _ONEDNN_REORDER(weight, PACK_BATCH_HINT)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x [1, K] @ weight[N, K]ᵀ (+ bias [N])` -> [1, N]: float32, contiguous, on a CPU,
    K % 16 == 0 (the caller, `llmlab.model.cpu.CpuLinear`, checks)."""
    lib = load_library()
    out = torch.empty(1, weight.shape[0], dtype=x.dtype)
    with traced("llmlab_cpu::gemv"):
        lib.llmlab_gemv(
            x.data_ptr(),
            weight.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            weight.shape[0],
            weight.shape[1],
        )
    return out


def qgemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x [T, K] @ weight[N, K]ᵀ (· scales [N]) (+ bias [N])` -> float32 [T, N], with `weight`
    in bfloat16 or int8 (then `scales`, per output row) widened inside the kernel
    (`kernels/cpu_quant.c`); one row runs the GEMV, more the tiled GEMM. x float32 with
    contiguous rows, K % 16 == 0 (the caller, `llmlab.model.cpu.CpuLinear`, checks)."""
    out, _ = _weight_matmul("qgemm", x, weight, weight.shape[0], scales, bias)
    return out


def _weight_matmul(
    name: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    out_features: int,
    scales: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, int | None]:
    """(float32 [T, out_features], the kernel's return code) of the C matmul `llmlab_<name>`:
    `qgemm` on a [N, K] weight or `packed_gemm` on a packed one take the same arguments."""
    T, K = x.shape
    out = torch.empty(T, out_features, dtype=torch.float32)
    with traced(f"llmlab_cpu::{name}"):
        rc = getattr(load_library(), f"llmlab_{name}")(
            x.data_ptr(),
            x.stride(0),
            weight.data_ptr(),
            WEIGHT_TYPES[weight.dtype],
            None if scales is None else scales.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            T,
            out_features,
            K,
        )
    return out, rc


def packed_weight_applies(weight: torch.Tensor) -> bool:
    """Whether `pack_weight` takes this weight here: float32 [N, K] on a CPU with AVX-512, or
    bf16 or int8 [N, K], K % 32 == 0, on a CPU with AVX-512 BF16 (the packed matmul's
    instructions for each); any of them on a CPU with AVX2 and FMA (its AVX2 tiles)."""
    if weight.dim() != 2:
        return False
    have = isa()
    if weight.dtype == torch.float32:
        return "avx512" in have or "avx2" in have
    return (
        weight.dtype in (torch.bfloat16, torch.int8)
        and weight.shape[1] % 32 == 0
        and ("avx512_bf16" in have or "avx2" in have)
    )


def packed_numel(n: int, k: int) -> int:
    """Elements of the packed copy of an [n, k] weight: n padded to whole blocks of 16."""
    return -(-n // 16) * 16 * k


def pack_weight(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`weight` [N, K] (float32, bf16 or int8) in the blocked layout of `kernels/cpu_gemm.c`:
    blocks of 16 output rows, each a run of those 16 rows' (k, k+1) pairs (bf16, int8) or single
    k's (float32), N padded to a multiple of 16 with zeros -> a flat tensor of ceil(N/16)*16*K
    elements (`out`, where given: a contiguous CPU tensor of that many elements of the weight's
    dtype, such as a place in a huge-page buffer). Done once, at load."""
    if not packed_weight_applies(weight):
        raise ValueError(
            f"pack_weight: weight is {weight.dtype} {tuple(weight.shape)}; expected float32 "
            "[N, K] on a CPU with AVX-512 or AVX2, or bfloat16 or int8 [N, K] with K a multiple "
            f"of 32 on a CPU with AVX-512 BF16 or AVX2 (this one has {isa()})"
        )
    n, k = weight.shape
    weight = weight.contiguous()
    size = packed_numel(n, k)
    if out is None:
        out = torch.empty(size, dtype=weight.dtype)
    elif (out.shape, out.dtype, out.device.type, out.is_contiguous()) != (
        (size,),
        weight.dtype,
        "cpu",
        True,
    ):
        raise ValueError(
            f"pack_weight: out is {out.dtype} {tuple(out.shape)} on {out.device}; expected a "
            f"contiguous {weight.dtype} [{size}] on the CPU"
        )
    load_library().llmlab_pack_weight(
        weight.data_ptr(), weight.element_size(), n, k, out.data_ptr()
    )
    return out


def packed_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    out_features: int,
    scales: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x [T, K] @ W[N, K]ᵀ (· scales [N]) (+ bias [N])` -> float32 [T, N] on W packed by
    `pack_weight` (`kernels/cpu_gemm.c`): float32 FMAs on a float32 W; on bf16 `vdpbf16ps` on x
    rounded to bf16; on int8 (with `scales`) integer sums on each row of x rounded to int16
    (`vpdpwssd`), from 128 rows the int8 widened to bf16 and `vdpbf16ps` on x rounded to bf16;
    float32 sums. Without AVX-512 BF16, on AVX2: bf16 widened in registers and float32 FMAs on
    x as it is, int8 the integer sums at every row count. x float32 with contiguous rows
    (the caller, `llmlab.model.cpu.CpuLinear`, checks)."""
    out, rc = _weight_matmul("packed_gemm", x, packed, out_features, scales, bias)
    if rc != 0:
        raise RuntimeError(
            "cpu_gemm.c refused the packed matmul: this CPU lacks the weight's instructions "
            "(AVX-512 or AVX-512 BF16, or AVX2: the weight was packed on a CPU that has them), "
            "K not a multiple of 32 (bf16, int8), or out of memory"
        )
    return out


def isa() -> list[str]:
    """The instruction sets the C kernels use on this CPU (checked at run time through cpuid,
    under the cap of `set_isa_cap`): names of `ISA_FLAGS`."""
    have = load_library().llmlab_isa()
    return [name for name, bit in ISA_FLAGS.items() if have & bit]


def set_isa_cap(names: list[str] | None) -> None:
    """Let the C kernels use at most `names` (of `ISA_FLAGS`), whatever this CPU has; None lifts
    the cap. How a test runs the fallback kernels on a CPU that has the fast instructions (a
    process started with `$LLMLAB_ISA_CAP` begins with that cap: `llmlab.ops.cpu_library`)."""
    load_library().llmlab_set_isa_cap(isa_cap_mask(names))
