"""`y = x @ Wᵀ + b` for every linear layer of the model, with a choice of matmul library.

Almost all of a forward's FLOPs are these matmuls, so the library that runs them sets the speed
of everything else in the course. On a CPU, PyTorch's `F.linear` calls Intel MKL's sgemm; oneDNN
(shipped inside the same PyTorch wheel) has its own matmul, which on the AMD EPYC we develop on
runs 2x faster at batch 32 and 1.8x faster for the batch-1 GEMV (`python -m llmlab bench
forward` prints both). vLLM's CPU backend calls oneDNN for the same reason.

Two backends:

- "onednn": `torch.ops.mkldnn._linear_pointwise` on the plain (dense, row-major) weight, no
  repacking and no second copy of the weights. Used for float32/bfloat16 CPU tensors when
  PyTorch was built with oneDNN and no gradient is wanted; anything else falls back to "aten".
- "aten": `torch.nn.functional.linear`, what transformers uses.

The model on its own uses "aten" by default, so that chapter 02's comparison with transformers
runs the very same matmul and only our code can differ (max |Δlogits| 4e-5; oneDNN's different
summation order alone moves SmolLM2's logits by up to 1.6e-4, as far from a float64 forward as
MKL's result is). The engine runs its forwards on "onednn" (`LLM(..., matmul="aten")` to
compare). `LLMLAB_MATMUL=onednn` in the environment changes the global default;
`use_matmul(name)` changes it for a block.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F

MATMUL_BACKENDS = ("onednn", "aten")


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
    return (_backend == "onednn" and _ONEDNN is not None and x.device.type == "cpu"
            and weight.device.type == "cpu" and x.dtype == weight.dtype
            and x.dtype in _ONEDNN_DTYPES and weight.dim() == 2 and weight.is_contiguous()
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight[out, in]ᵀ (+ bias [out]) -> [..., out], on the chosen library."""
    if onednn_applies(x, weight) and (bias is None or bias.dtype == x.dtype):
        return _ONEDNN(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
