"""`y = x @ Wᵀ + b` for every linear layer of the model, with a choice of matmul library.

Almost all of a forward's FLOPs are these matmuls, so the library that runs them sets the speed
of everything else in the course. On a CPU, PyTorch's `F.linear` calls Intel MKL's sgemm; oneDNN
(shipped inside the same PyTorch wheel) has its own matmul, which on the AMD EPYC we develop on
runs 2x faster at batch 32 and 1.8x faster for the batch-1 GEMV (`python -m llmlab bench
forward` prints both). vLLM's CPU backend calls oneDNN for the same reason.

Three backends:

- "onednn": `torch.ops.mkldnn._linear_pointwise`. Called with the plain (dense, row-major)
  weight it needs no extra memory; a layer that passes a `cache` gets its weight reordered once
  into oneDNN's blocked layout (a second copy of the weights, 540 MB for SmolLM2) and runs
  faster still. Used for float32/bfloat16 CPU tensors when PyTorch was built with oneDNN and no
  gradient is wanted; anything else falls back to "aten".
- "aten": `torch.nn.functional.linear`, what transformers uses.
- "cpu": "onednn", except for a one-row input (a decode step at batch 1), which goes to our
  GEMV in C (`kernels/cpu_gemv.c`, built with the "cpu" attention kernels, see
  `llmlab.ops.cpu_backend`). A one-row matmul only streams its weight; on SmolLM2's small
  per-layer matrices that plain loop streams faster than oneDNN's GEMV, whose per-call set-up
  shows (batch-1 step 15-18 ms -> 13-15 ms here). Without a C compiler "cpu" is "onednn".

The model on its own uses "aten" by default, so that chapter 02's comparison with transformers
runs the very same matmul and only our code can differ (max |Δlogits| 4e-5; oneDNN's different
summation order alone moves SmolLM2's logits by up to 1.6e-4, as far from a float64 forward as
MKL's result is). The engine runs its forwards on "cpu" (`LLM(..., matmul="onednn")` or
`"aten"` to compare). `LLMLAB_MATMUL=onednn` in the environment changes the global default;
`use_matmul(name)` changes it for a block.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from llmlab.ops._memo import snapshot, unchanged

MATMUL_BACKENDS = ("onednn", "aten", "cpu")


def _check_name(name: str, what: str) -> str:
    if name not in MATMUL_BACKENDS:
        raise ValueError(f"{what}: got {name!r}, expected one of {', '.join(map(repr, MATMUL_BACKENDS))}")
    return name


_backend = _check_name(os.environ.get("LLMLAB_MATMUL", "aten"), "LLMLAB_MATMUL")


def _onednn_op():
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


_ONEDNN = _onednn_op()
_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None) if _ONEDNN else None
# oneDNN picks the packed layout for a typical batch; the packed weight serves any batch size.
PACK_BATCH_HINT = 32
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16)


def matmul_backend() -> str:
    """The matmul library linear layers use now: "onednn" or "aten"."""
    return _backend


def set_matmul_backend(name: str) -> None:
    """Choose the matmul library for every later `linear` call ("onednn" or "aten")."""
    global _backend
    _backend = _check_name(name, "name")


@contextlib.contextmanager
def use_matmul(name: str) -> Iterator[None]:
    """`with use_matmul("aten"): ...` runs the block with that matmul library, then restores."""
    old = _backend
    set_matmul_backend(name)
    try:
        yield
    finally:
        set_matmul_backend(old)


def onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` will run on oneDNN (CPU, fp32/bf16, same dtype, no autograd)."""
    return (_backend in ("onednn", "cpu") and _ONEDNN is not None and x.device.type == "cpu"
            and weight.device.type == "cpu" and x.dtype == weight.dtype
            and x.dtype in _ONEDNN_DTYPES and weight.dim() == 2 and weight.is_contiguous()
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def _prepacked(weight: torch.Tensor, cache: dict) -> torch.Tensor:
    """`weight` reordered into oneDNN's blocked layout, kept in `cache` while the weight stays.

    A second copy of the weight (the dense one stays the parameter everything else reads). It
    is rebuilt when the layer gets another weight tensor, this one is changed in place (its
    version counter moves) or gets new data (`module.to(...)` swaps a parameter's `.data`,
    which moves no counter but its address); inference tensors have no version counter, so
    they stay dense.
    """
    if _REORDER is None or weight.is_inference():
        return weight
    if cache.get("weight") is weight and unchanged(cache["snapshot"], (weight,)):
        return cache["packed"]
    with torch.no_grad():
        packed = _REORDER(weight.detach(), PACK_BATCH_HINT)
    cache.update(weight=weight, snapshot=snapshot((weight,)), packed=packed)
    return packed


_GEMV_OK: bool | None = None      # whether the C GEMV builds here (checked on first use)
_cpu_backend = None               # llmlab.ops.cpu_backend, imported then


def _gemv_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the "cpu" library runs `linear(x, weight, bias)` as our GEMV: one row, float32
    CPU tensors, contiguous, in-features a multiple of 16, no autograd, the C kernels built."""
    global _GEMV_OK, _cpu_backend
    if (_backend != "cpu" or x.dim() != 2 or x.shape[0] != 1 or x.dtype != torch.float32
            or x.device.type != "cpu" or not x.is_contiguous() or weight.dtype != torch.float32
            or weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] != x.shape[1]
            or x.shape[1] % 16 != 0 or not weight.is_contiguous()):
        return False
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    if _GEMV_OK is None:
        from llmlab.ops import cpu_backend
        _cpu_backend = cpu_backend
        _GEMV_OK = cpu_backend.available()[0]
    return _GEMV_OK


def _stack(weights: list[torch.Tensor], biases: list[torch.Tensor | None], cache: dict,
           slot: str, prepack: bool):
    """(weights stacked along out-features, their biases concatenated or None), kept in
    `cache[slot]` while every weight and bias is the same tensor at the same version; with
    `prepack`, reordered into oneDNN's layout. None for inference tensors (no version counter
    to tell whether they changed) or when this PyTorch cannot prepack."""
    tensors = [t for t in (*weights, *biases) if t is not None]
    if any(t.is_inference() for t in tensors) or (prepack and _REORDER is None):
        return None
    entry = cache.get(slot)
    if entry is not None and unchanged(entry[0], (*weights, *biases)):
        return entry[1]
    with torch.no_grad():
        weight = torch.cat([w.detach() for w in weights])
        if prepack:
            weight = _REORDER(weight, PACK_BATCH_HINT)
        bias = (None if all(b is None for b in biases) else
                torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0])
                           for w, b in zip(weights, biases)]))
    cache[slot] = (snapshot((*weights, *biases)), (weight, bias))
    return weight, bias


def stacked_dense(weights: list[torch.Tensor], biases: list[torch.Tensor | None],
                  cache: dict):
    """The dense stacked copy of `weights` (and their biases) that `linear_split` keeps in
    `cache` for the one-row GEMV, as (weight, bias or None); built on first use, None for
    inference-tensor weights. The fused decode layer (`llmlab.model`) streams the same copy."""
    return _stack(weights, biases, cache, "dense", prepack=False)


def linear_split(x: torch.Tensor, weights: list[torch.Tensor],
                 biases: list[torch.Tensor | None] | None = None,
                 cache: dict | None = None) -> list[torch.Tensor]:
    """`[linear(x, w, b) for w, b in zip(weights, biases)]`, as one matmul where it helps.

    Layers that read the same input (q, k and v; gate and up) can run as one matmul against
    their weights stacked along out-features: one call instead of three, one pass over x, a
    wider matrix for the library to split between threads. With a `cache`, the stacked matrix
    is kept there: prepacked for oneDNN, dense for the "cpu" library's one-row GEMV (a second
    copy of those weights); the result is split back into views (one per weight; not
    contiguous). With "aten" (or inference-tensor weights) the layers run one by one, exactly
    as `linear` does.
    """
    biases = list(biases) if biases is not None else [None] * len(weights)
    sizes = [w.shape[0] for w in weights]
    if cache is not None and _backend == "cpu" and all(
            _gemv_applies(x, w, b) for w, b in zip(weights, biases)):
        # one row: one GEMV over a dense stacked copy (one call streams faster than three)
        stacked = stacked_dense(weights, biases, cache)
        if stacked is not None:
            return list(_cpu_backend.gemv(x, *stacked).split(sizes, dim=-1))
    if cache is not None and all(onednn_applies(x, w) for w in weights) and all(
            b is None or b.dtype == x.dtype for b in biases):
        stacked = _stack(weights, biases, cache, "onednn", prepack=True)
        if stacked is not None:
            return list(_ONEDNN(x, *stacked, "none", [], "").split(sizes, dim=-1))
    return [linear(x, w, b) for w, b in zip(weights, biases)]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           cache: dict | None = None) -> torch.Tensor:
    """x [..., in] @ weight[out, in]ᵀ (+ bias [out]) -> [..., out], on the chosen library.

    `cache`: a dict the caller keeps with its layer (see `llmlab.model.Linear`); with it, oneDNN
    runs on a prepacked copy of the weight (another 15-25 % faster than on the dense weight).
    """
    if _backend == "cpu" and _gemv_applies(x, weight, bias):
        return _cpu_backend.gemv(x, weight, bias)
    if onednn_applies(x, weight) and (bias is None or bias.dtype == x.dtype):
        w = weight if cache is None else _prepacked(weight, cache)
        return _ONEDNN(x, w, bias, "none", [], "")
    return F.linear(x, weight, bias)
