"""The "cuda" backend: CUDA C++ kernels from `kernels/`, built on first use on a GPU.

`reshape_and_cache` runs `kernels/cache_kernels.cu`; `paged_attention`, decode and prefill,
runs one kernel, `kernels/paged_attention.cu` (vLLM's
`csrc/attention/paged_attention_v2.cu` is its model): every query row is one new token with its
own sequence and causal context, so a decode step (one row per sequence) and a step that mixes
prefill chunks with decode tokens ("varlen", rows found through `cu_seqlens_q`) take the same
launch, with no loop over sequences in Python. With few (row, KV head) pairs for the GPU's SMs
and long contexts, the context is split into partitions merged by a second kernel (vLLM's "v2");
`plan_attention` decides that from host-known sizes only (the block table's width, the number of
rows, the SM count), so nothing waits for the GPU. It is plain Python and tested on a CPU.

The functions check nothing: `llmlab.ops` checks the arguments first (with `check_device` and
`check_kernel_shape` below for what this kernel needs), and the fused GPU layer calls them per
layer on a step's metadata checked once, so the Python checks do not run again on every layer.

The extension is compiled with `torch.utils.cpp_extension.load` the first time it is needed
(about a minute), into `$LLMLAB_CACHE/torch_extensions/...` (default `~/.cache/llmlab`), never
into the repository; later processes reuse the build. Without a CUDA GPU every function raises
a RuntimeError that says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from llmlab.ops import _checks
from llmlab.ops.paged_kv import PagedKV
from llmlab.paths import cache_dir
from llmlab.utils import cdiv

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
SOURCES = ("binding.cpp", "cache_kernels.cu", "paged_attention.cu")
# The kernel's limits (kernels/llmlab_kernels.h: LLMLAB_MAX_HEAD_DIM, LLMLAB_MAX_GQA_GROUP,
# LLMLAB_MAX_PARTITIONS).
MAX_HEAD_DIM = 256
MAX_GQA_GROUP = 8
MAX_PARTITIONS = 8192
# Split context: the partition sizes the launcher picks from, largest first, and how many
# blocks per SM it aims for (enough warps with loads in flight to keep an SM's share of the
# memory bandwidth busy).
PARTITION_SIZES = (512, 256, 128, 64)
TARGET_BLOCKS_PER_SM = 4
_extension: ModuleType | None = None


@dataclass(frozen=True)
class AttentionLaunch:
    """How one call of the attention kernel is cut into thread blocks.

    Grid `(num_rows, num_kv_heads, num_partitions)`: a block takes one query row (new token),
    the `group` query heads of one KV head, and `partition_size` positions of the row's context
    (0: the whole context, walked tile by tile). With more than one partition a merge kernel,
    grid `(num_rows, num_heads)`, follows.
    """

    num_rows: int
    num_kv_heads: int
    partition_size: int
    num_partitions: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.num_rows, self.num_kv_heads, self.num_partitions)

    @property
    def split(self) -> bool:
        """True when partial results are merged by the second kernel."""
        return self.num_partitions > 1


def plan_attention(
    num_rows: int,
    num_kv_heads: int,
    max_context: int,
    num_sms: int,
    partition_size: int | None = None,
) -> AttentionLaunch:
    """Pick the launch of the attention kernel from sizes the host knows (no device sync).

    `max_context` bounds every row's context: the block table's width times the block size.
    `partition_size`: None decides (split context when the (row, KV head) blocks alone would
    give fewer than TARGET_BLOCKS_PER_SM per SM and the context spans more than one partition;
    the largest size of PARTITION_SIZES that reaches the target, else the smallest); 0 forces
    one pass; a positive multiple of 32 forces that many positions per partition.
    """
    if partition_size is not None:
        _checks.check_partition_size(partition_size)
        if partition_size == 0:
            return AttentionLaunch(num_rows, num_kv_heads, 0, 1)
        parts = max(1, cdiv(max_context, partition_size))
        if parts > MAX_PARTITIONS:
            raise ValueError(
                f"partition_size: got {partition_size}, which cuts a context of {max_context} "
                f"positions into {parts} partitions; expected at most {MAX_PARTITIONS}"
            )
        return AttentionLaunch(num_rows, num_kv_heads, partition_size, parts)
    blocks = num_rows * num_kv_heads
    target = TARGET_BLOCKS_PER_SM * num_sms
    if blocks < target:
        for size in PARTITION_SIZES:
            parts = cdiv(max_context, size)
            if 1 < parts <= MAX_PARTITIONS and (
                blocks * parts >= target or size == PARTITION_SIZES[-1]
            ):
                return AttentionLaunch(num_rows, num_kv_heads, size, parts)
    return AttentionLaunch(num_rows, num_kv_heads, 0, 1)


def check_kernel_shape(query: torch.Tensor, key_cache: torch.Tensor) -> None:
    """What the attention kernel supports beyond the common checks: head_dim up to 256 and a
    whole number of vectors (4 values for an fp32 cache, 8 otherwise), GQA groups up to 8."""
    head_dim = query.shape[2]
    vec = 4 if key_cache.dtype == torch.float32 else 8
    if head_dim > MAX_HEAD_DIM or head_dim % vec:
        raise ValueError(
            f"query: head_dim={head_dim}, expected a multiple of {vec} up to {MAX_HEAD_DIM} "
            f"for the CUDA attention kernel with a {key_cache.dtype} cache"
        )
    group = query.shape[1] // key_cache.shape[2]
    if group > MAX_GQA_GROUP:
        raise ValueError(
            f"query: num_heads={query.shape[1]} for num_kv_heads={key_cache.shape[2]} is a GQA "
            f"group of {group}, expected at most {MAX_GQA_GROUP} for the CUDA attention kernel"
        )


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


def _ext() -> ModuleType:
    """The loaded extension (loading it the first time)."""
    return _extension if _extension is not None else load_extension()


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def check_device(tensors: dict[str, torch.Tensor]) -> None:
    _require_gpu()
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise ValueError(
                f"{name}.device: got {t.device}, expected a CUDA tensor (backend='cuda')"
            )


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv: PagedKV, slot_mapping: torch.Tensor
) -> None:
    """CUDA `reshape_and_cache` (kernels/cache_kernels.cu); slot -1 is skipped. An fp8 cache
    stores key / k_scale and value / v_scale, rounded to e4m3 in the kernel."""
    _ext().reshape_and_cache(
        key, value, kv.key_cache, kv.value_cache, slot_mapping, float(kv.k_scale), float(kv.v_scale)
    )


def paged_attention(
    query: torch.Tensor,
    kv: PagedKV,
    scale: float,
    *,
    partition_size: int | None = None,
) -> torch.Tensor:
    """CUDA paged attention (kernels/paged_attention.cu): fp32/fp16/bf16 queries over a cache of
    the same dtype or of fp8 e4m3 (with its k/v scales), GQA groups up to 8. Each query row is a
    new token over its sequence's positions up to its own: decode (no query offsets in `kv`, one
    row per sequence), prompts, chunks, prefix-cache hits and decode tokens of one step go in one
    launch (a block takes one row, whatever its sequence's length, so no `max_query_len`).
    `partition_size` as in `plan_attention` (None: chosen per call)."""
    device = query.device.index
    launch = plan_attention(
        query.shape[0],
        kv.key_cache.shape[2],
        kv.block_tables.shape[1] * kv.key_cache.shape[1],
        _num_sms(torch.cuda.current_device() if device is None else device),
        partition_size,
    )
    return _ext().paged_attention(
        query,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        kv.seq_lens,
        kv.cu_seqlens_q,  # None: one row per sequence, the kernel's decode layout
        float(scale),
        float(kv.k_scale),
        float(kv.v_scale),
        launch.partition_size,
        launch.num_partitions,
    )
