"""`python -m llmlab bench kernels`: paged decode attention time per backend.

For several (batch, context) shapes, times `ops.paged_attention_decode` on every backend that
runs here and reports the achieved bandwidth: bytes of K/V read for all context positions, plus
the query read and the output written, per second of kernel time. Decode attention is
memory-bound, so the useful yardstick is the machine's own copy bandwidth, measured here by
timing a large device-to-device (or host) copy (bytes read + bytes written per second).

On a CPU machine: "torch" and "cpu" (C kernels) on the full sweep; "triton" runs through its
interpreter, which is not a performance path, so it gets one tiny case, marked as such; "cuda"
is skipped with the reason. Writes build/bench-kernels.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from llmlab import ops
from llmlab.utils import cdiv, format_table

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_samples(fn, device: torch.device, repeats: int, warmup: int = 2) -> list[float]:
    """Seconds of each of `repeats` runs of `fn()` (after `warmup` runs)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return samples


def time_call(fn, device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median seconds of `fn()` over `repeats` runs (after `warmup` runs)."""
    return statistics.median(time_samples(fn, device, repeats, warmup))


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second (read + written) of copying an `nbytes` buffer on `device`."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), device, repeats=10)
    return 2 * nbytes / seconds


def make_decode_inputs(
    batch: int,
    context: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> dict:
    """Random decode inputs; each sequence's blocks are a random choice of physical blocks."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = cdiv(context, block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    value_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, generator=gen).view(batch, blocks_per_seq)
    return dict(
        query=torch.randn(batch, num_heads, head_dim, generator=gen).to(dtype=dtype, device=device),
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=tables.to(torch.int32).to(device),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        scale=head_dim**-0.5,
    )


def decode_bytes(
    batch: int, context: int, num_heads: int, num_kv_heads: int, head_dim: int, elem: int
) -> int:
    """Bytes a decode step must move: K and V for every position, query in, output out."""
    kv = 2 * batch * context * num_kv_heads * head_dim * elem
    return kv + 2 * batch * num_heads * head_dim * elem


def main(argv: list[str] | None = None) -> int:
    """Run the sweep, print a table, write the JSON; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m llmlab bench kernels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--fast", action="store_true", help="fewer, smaller shapes")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="default: bf16 on a GPU, fp32 on a CPU",
    )
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--out", default="build/bench-kernels.json")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if gpu else "fp32")]
    elem = torch.empty((), dtype=dtype).element_size()
    # GPU: a Llama-3-8B layer (32 heads, 8 KV heads, d 128); CPU: SmolLM2-135M (9, 3, d 64).
    num_heads, num_kv_heads, head_dim = (32, 8, 128) if gpu else (9, 3, 64)
    if gpu:
        shapes = [(1, 4096), (16, 2048), (64, 4096), (256, 2048)]
        if args.fast:
            shapes = [(1, 4096), (64, 2048)]
    else:
        shapes = [(1, 512), (8, 512), (32, 1024)]
        if args.fast:
            shapes = [(1, 256), (8, 256)]
    repeats = 20 if gpu else (5 if args.fast else 10)

    backends = ops.available_backends()
    copy_bw = copy_bandwidth(device, (1 << 30) if gpu else (1 << 26))
    rows, notes = [], []
    if "cuda" not in backends:
        notes.append("cuda: skipped, no CUDA GPU here")
    for backend in backends:
        cases = shapes
        if backend == "triton" and not gpu:
            notes.append(
                "triton: runs through the interpreter on CPU (not a performance "
                "path); timed on one tiny case only"
            )
            cases = [(2, 64)]
        if backend == "cuda" and not gpu:
            continue
        if backend == "cpu" and gpu:
            notes.append("cpu: skipped, its C kernels take CPU tensors only")
            continue
        for batch, context in cases:
            inputs = make_decode_inputs(
                batch, context, num_heads, num_kv_heads, head_dim, args.block_size, dtype, device
            )
            reps = 1 if backend == "triton" and not gpu else repeats
            out = ops.paged_attention_decode(**inputs, backend=backend)
            ref = ops.paged_attention_decode(**inputs, backend="torch")
            max_err = float((out.float() - ref.float()).abs().max())
            samples = time_samples(
                lambda: ops.paged_attention_decode(**inputs, backend=backend),
                device,
                reps,
                warmup=0 if reps == 1 else 2,
            )
            seconds = statistics.median(samples)
            nbytes = decode_bytes(batch, context, num_heads, num_kv_heads, head_dim, elem)
            rows.append(
                dict(
                    backend=backend + ("-interpreter" if backend == "triton" and not gpu else ""),
                    batch=batch,
                    context=context,
                    seconds=seconds,
                    best_seconds=min(samples),
                    bytes=nbytes,
                    bandwidth=nbytes / seconds,
                    fraction_of_copy=nbytes / seconds / copy_bw,
                    max_abs_diff_vs_torch=max_err,
                )
            )

    name = torch.cuda.get_device_name(device) if gpu else platform.processor() or "cpu"
    print(
        f"paged decode attention, {dtype} on {name}; heads {num_heads}/{num_kv_heads}, "
        f"head_dim {head_dim}, block {args.block_size}"
    )
    print(
        f"measured copy bandwidth (read + write): {copy_bw / 1e9:.1f} GB/s; GB/s and 'of copy' "
        "use the median time"
    )
    print(
        format_table(
            [
                [
                    r["backend"],
                    r["batch"],
                    r["context"],
                    f"{r['seconds'] * 1e3:.3f}",
                    f"{r['best_seconds'] * 1e3:.3f}",
                    f"{r['bandwidth'] / 1e9:.1f}",
                    f"{r['fraction_of_copy']:.0%}",
                    f"{r['max_abs_diff_vs_torch']:.2e}",
                ]
                for r in rows
            ],
            ["backend", "batch", "context", "median ms", "best ms", "GB/s", "of copy", "|diff|"],
        )
    )
    for note in notes:
        print("note:", note)

    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(
        json.dumps(
            dict(
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=name,
                dtype=str(dtype).replace("torch.", ""),
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                block_size=args.block_size,
                torch=torch.__version__,
                copy_bandwidth=copy_bw,
                rows=rows,
                notes=notes,
            ),
            indent=2,
        )
    )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
