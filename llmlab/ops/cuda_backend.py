"""The "cuda" backend: CUDA C++ kernels from `kernels/`, built on first use on a GPU.

`reshape_and_cache` and `paged_attention_decode` run the hand-written kernels
(`kernels/cache_kernels.cu`, `kernels/paged_attention.cu`, bound by `kernels/binding.cpp`).
`paged_attention_prefill` has no CUDA kernel: it runs the torch implementation
(`llmlab.ops.torch_backend`) on the same CUDA tensors.

The extension is compiled with `torch.utils.cpp_extension.load` the first time it is needed
(about a minute), into `$LLMLAB_CACHE/torch_extensions/...` (default `~/.cache/llmlab`), never
into the repository; later processes reuse the build. Without a CUDA GPU every function raises
a RuntimeError that says so.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from llmlab.ops import _checks, torch_backend
from llmlab.paths import cache_dir

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
SOURCES = ("binding.cpp", "cache_kernels.cu", "paged_attention.cu")
_extension: ModuleType | None = None


def _require_gpu() -> None:
    if not torch.cuda.is_available() or torch.version.cuda is None:
        why = (
            "this torch build has no CUDA support"
            if torch.version.cuda is None
            else "torch.cuda.is_available() is False"
        )
        raise RuntimeError(
            f"backend='cuda' needs an NVIDIA GPU with CUDA, and there is none "
            f"here ({why}, torch {torch.__version__}). Use backend='torch' "
            "(or 'triton', which runs through its interpreter on CPU)."
        )


def load_extension(verbose: bool = False) -> ModuleType:
    """Build (first time) and import the CUDA extension; return the module."""
    global _extension
    _require_gpu()
    if _extension is None:
        from torch.utils.cpp_extension import load

        missing = [s for s in SOURCES if not (KERNELS_DIR / s).is_file()]
        if missing:
            raise RuntimeError(
                f"CUDA sources {missing} not found in {KERNELS_DIR}; the 'cuda' "
                "backend needs the repository checkout (pip install -e .)"
            )
        tag = f"torch{torch.__version__.split('+')[0]}-cu{torch.version.cuda}"
        build = cache_dir() / "torch_extensions" / f"llmlab_cuda_ops-{tag}"
        build.mkdir(parents=True, exist_ok=True)
        _extension = load(
            name="llmlab_cuda_ops",
            sources=[str(KERNELS_DIR / s) for s in SOURCES],
            extra_include_paths=[str(KERNELS_DIR)],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"],
            build_directory=str(build),
            verbose=verbose,
        )
    return _extension


def _check_cuda(tensors: dict[str, torch.Tensor]) -> None:
    _require_gpu()
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise ValueError(
                f"{name}.device: got {t.device}, expected a CUDA tensor (backend='cuda')"
            )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """CUDA `reshape_and_cache` (kernels/cache_kernels.cu); slot -1 is skipped. An fp8 cache
    stores key / k_scale and value / v_scale, rounded to e4m3 in the kernel."""
    _checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    _check_cuda(
        {
            "key": key,
            "value": value,
            "key_cache": key_cache,
            "value_cache": value_cache,
            "slot_mapping": slot_mapping,
        }
    )
    load_extension().reshape_and_cache(
        key, value, key_cache, value_cache, slot_mapping, float(k_scale), float(v_scale)
    )


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """CUDA paged decode attention (kernels/paged_attention.cu): fp32/fp16/bf16 queries over
    a cache of the same dtype or of fp8 e4m3 (with its k/v scales), GQA."""
    _checks.check_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
    _check_cuda(
        {
            "query": query,
            "key_cache": key_cache,
            "value_cache": value_cache,
            "block_tables": block_tables,
            "seq_lens": seq_lens,
        }
    )
    if query.shape[2] > 256:
        raise ValueError(
            f"query: head_dim={query.shape[2]}, expected <= 256 for the CUDA decode kernel"
        )
    return load_extension().paged_attention_decode(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        float(scale),
        float(k_scale),
        float(v_scale),
    )


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Prefill on the "cuda" backend: the torch implementation on the CUDA tensors (there is
    no hand-written CUDA prefill kernel; see kernels/README.md)."""
    _checks.check_prefill(
        query, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale
    )
    _check_cuda(
        {
            "query": query,
            "key_cache": key_cache,
            "value_cache": value_cache,
            "block_tables": block_tables,
            "cu_seqlens_q": cu_seqlens_q,
            "seq_lens": seq_lens,
        }
    )
    return torch_backend.paged_attention_prefill(
        query, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale, k_scale, v_scale
    )
