"""`python -m llmlab bench kernels`: paged attention time per backend, decode and mixed steps.

For several (batch, context) shapes it times `ops.paged_attention_decode` on every backend that
runs here, and for mixed steps (decode tokens and a prompt chunk in one call, the "varlen"
path) `ops.paged_attention_prefill`. Attention of this kind is memory-bound, so each time is
turned into bandwidth: the bytes of K/V of every sequence's context (read once), plus the query
read and the output written, per second; and that into a share of the machine's own copy
bandwidth, measured here by timing a large device-to-device (or host) copy (read + written).

On a GPU each call is timed twice: eagerly, as a Python caller sees it (argument checks and
launches included), and replayed from a CUDA graph, the device's time alone, as an engine that
captures its decode step sees it. GB/s and "of copy" use the graph's time where a backend can
be captured ("cuda", "triton"), else the eager one. The "cuda" backend runs three ways: as it
chooses ("path": one pass, or split context with its partition size x count), and forced to
one pass and to partitions of 512.

On a CPU machine: "torch" and "cpu" (C kernels) on the full sweep; "triton" runs through its
interpreter, which is not a performance path, so it gets one tiny case, marked as such; "cuda"
is skipped with the reason. Writes build/bench-kernels.json: `rows` (decode) and `mixed_rows`.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmlab import ops
from llmlab.bench import add_option, bench_parser, device_info, device_line, write_report
from llmlab.utils import cdiv, format_table

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (batch, context) of the decode sweep; a GPU's includes batch 1 x 4,096 and 64..256 x 2,048
DECODE_SHAPES = {
    "gpu": [(1, 4096), (16, 2048), (64, 2048), (64, 4096), (128, 2048), (256, 2048)],
    "gpu-fast": [(1, 4096), (64, 2048)],
    "cpu": [(1, 512), (8, 512), (32, 1024)],
    "cpu-fast": [(1, 256), (8, 256)],
}
# mixed steps: (decode rows, their context, new tokens of one prompt chunk, its cached context)
MIXED_SHAPES = {
    "gpu": [(63, 2048, 512, 1536), (255, 2048, 256, 0)],
    "gpu-fast": [(63, 2048, 512, 1536)],
    "cpu": [(7, 512, 64, 192)],
    "cpu-fast": [(7, 256, 32, 64)],
}
GRAPH_CALLS = 10  # calls captured in one graph: its replay's time / GRAPH_CALLS is one call's


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


def graph_samples(fn, device: torch.device, repeats: int) -> list[float]:
    """Seconds of one `fn()` replayed from a CUDA graph of GRAPH_CALLS calls: the device's time
    alone, nothing of Python in between. `fn` must have run once (compiled, allocated)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return [s / GRAPH_CALLS for s in time_samples(graph.replay, device, repeats, warmup=1)]


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second (read + written) of copying an `nbytes` buffer on `device`."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), device, repeats=10)
    return 2 * nbytes / seconds


@dataclass(frozen=True)
class Heads:
    num_heads: int
    num_kv_heads: int
    head_dim: int


def _random_cache(lens: list[int], heads: Heads, block_size, dtype, device, seed: int) -> dict:
    """K/V caches holding `lens` positions per sequence, each sequence's blocks a random
    choice of physical blocks; the block table and lengths to read them. The values are drawn
    on `device` (gigabytes of them on a GPU)."""
    blocks_per_seq = max(cdiv(n, block_size) for n in lens)
    num_blocks = len(lens) * blocks_per_seq
    shape = (num_blocks, block_size, heads.num_kv_heads, heads.head_dim)
    tables = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator(device=device).manual_seed(seed)
    return dict(
        key_cache=torch.randn(shape, generator=gen, device=device).to(dtype),
        value_cache=torch.randn(shape, generator=gen, device=device).to(dtype),
        block_tables=tables.view(len(lens), blocks_per_seq).to(torch.int32).to(device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        scale=heads.head_dim**-0.5,
    )


def _random_query(rows: int, heads: Heads, dtype, device, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    q = torch.randn(rows, heads.num_heads, heads.head_dim, generator=gen, device=device)
    return q.to(dtype)  # [rows, num_heads, head_dim]


def make_decode_inputs(batch, context, heads: Heads, block_size, dtype, device, seed=0) -> dict:
    """Random decode inputs: `batch` sequences of `context` positions, one query each."""
    inputs = _random_cache([context] * batch, heads, block_size, dtype, device, seed)
    return dict(query=_random_query(batch, heads, dtype, device, seed), **inputs)


def make_mixed_inputs(rows, context, chunk, chunk_context, heads, block_size, dtype, device):
    """A mixed step: `rows` decode sequences at `context` positions, and one prompt chunk of
    `chunk` new tokens after `chunk_context` cached ones, in one varlen call."""
    lens = [context] * rows + [chunk_context + chunk]
    inputs = _random_cache(lens, heads, block_size, dtype, device, seed=1)
    cu = torch.tensor([*range(rows + 1), rows + chunk], dtype=torch.int32, device=device)
    query = _random_query(rows + chunk, heads, dtype, device, seed=1)
    return dict(query=query, cu_seqlens_q=cu, **inputs)


def attention_bytes(lens: list[int], num_query_rows: int, heads: Heads, elem: int) -> int:
    """Bytes a step must move at least: K and V of every position once, query in, out out."""
    kv = 2 * sum(lens) * heads.num_kv_heads * heads.head_dim * elem
    return kv + 2 * num_query_rows * heads.num_heads * heads.head_dim * elem


@dataclass(frozen=True)
class System:
    """One way to run a case: `label` in the table, `backend` of `llmlab.ops`, and for the
    "cuda" backend a forced `partition_size` (None: its own choice)."""

    label: str
    backend: str
    partition_size: int | None = None

    def call(self, inputs: dict) -> Callable[[], torch.Tensor]:
        """The call that runs `inputs` (a mixed step when they hold cu_seqlens_q)."""
        if self.partition_size is not None:
            from llmlab.ops import cuda_backend
            from llmlab.ops.paged_kv import PagedKV

            tensors = dict(inputs)
            query, scale = tensors.pop("query"), tensors.pop("scale")
            kv = PagedKV(**tensors)
            size = self.partition_size
            return lambda: cuda_backend.paged_attention(query, kv, scale, partition_size=size)
        run = (
            ops.paged_attention_prefill if "cu_seqlens_q" in inputs else ops.paged_attention_decode
        )
        return lambda: run(**inputs, backend=self.backend)

    def path(self, inputs: dict, device: torch.device) -> str:
        """How the "cuda" kernel cuts this call: one pass, or split context (size x count)."""
        if self.backend != "cuda":
            return "-"
        from llmlab.ops import cuda_backend

        kc = inputs["key_cache"]
        plan = cuda_backend.plan_attention(
            inputs["query"].shape[0],
            kc.shape[2],
            inputs["block_tables"].shape[1] * kc.shape[1],
            torch.cuda.get_device_properties(device).multi_processor_count,
            self.partition_size,
        )
        return f"split {plan.partition_size} x {plan.num_partitions}" if plan.split else "one pass"


def systems(gpu: bool, notes: list[str]) -> list[System]:
    """The backends that run here (the "cuda" one also forced both ways); why others don't."""
    found = []
    for backend in ops.available_backends():
        if backend == "cpu" and gpu:
            notes.append("cpu: skipped, its C kernels take CPU tensors only")
            continue
        found.append(System(backend, backend))
        if backend == "cuda":
            found += [System("cuda one-pass", "cuda", 0), System("cuda split-512", "cuda", 512)]
    if not any(s.backend == "cuda" for s in found):
        notes.append("cuda: skipped, no CUDA GPU here")
    if not gpu and any(s.backend == "triton" for s in found):
        notes.append(
            "triton: runs through the interpreter on CPU (not a performance path); timed on "
            "one tiny decode case only"
        )
    return found


def measure(system: System, inputs: dict, ref: torch.Tensor, nbytes: int, ctx: dict) -> dict:
    """Time one system on one case: eager, and from a CUDA graph where it can be captured."""
    device, gpu = ctx["device"], ctx["device"].type == "cuda"
    interpreted = system.backend == "triton" and not gpu
    fn = system.call(inputs)
    out = fn()  # also compiles / allocates before any timing or capture
    max_err = float((out.float() - ref.float()).abs().max())
    reps = ctx["repeats"]
    if interpreted:
        reps = 1
    elif system.backend == "torch":  # the yardstick of correctness, not of speed: a few runs
        reps = min(5, reps)
    samples = time_samples(fn, device, reps, warmup=0 if interpreted else 2)
    graph = None
    if gpu and system.backend in ("cuda", "triton"):
        try:
            graph = statistics.median(graph_samples(fn, device, reps))
        except RuntimeError as e:  # a launcher that waits for the GPU cannot be captured
            ctx["notes"].append(f"{system.label}: no CUDA graph ({str(e).splitlines()[0]})")
    seconds = statistics.median(samples)
    timed = graph if graph is not None else seconds
    return dict(
        backend=system.label + ("-interpreter" if interpreted else ""),
        path=system.path(inputs, device) if gpu else "-",
        seconds=seconds,
        best_seconds=min(samples),
        device_seconds=graph,
        timing="graph" if graph is not None else "eager",
        bytes=nbytes,
        bandwidth=nbytes / timed,
        fraction_of_copy=nbytes / timed / ctx["copy_bw"],
        max_abs_diff_vs_torch=max_err,
    )


def run_cases(kind: str, shapes: list, found: list[System], ctx: dict) -> list[dict]:
    """Every system on every shape of one kind ("decode" or "mixed"); rows for the report."""
    heads, device, dtype, elem = ctx["heads"], ctx["device"], ctx["dtype"], ctx["elem"]
    rows = []
    for shape in shapes:
        if kind == "decode":
            batch, context = shape
            inputs = make_decode_inputs(batch, context, heads, ctx["block_size"], dtype, device)
            lens, extra = [context] * batch, {}
        else:
            batch, context, chunk, chunk_context = shape
            inputs = make_mixed_inputs(*shape, heads, ctx["block_size"], dtype, device)
            lens = [context] * batch + [chunk_context + chunk]
            extra = dict(chunk=chunk, chunk_context=chunk_context)
        ref = System("torch", "torch").call(inputs)()
        nbytes = attention_bytes(lens, inputs["query"].shape[0], heads, elem)
        for system in found:
            if system.backend == "triton" and device.type != "cuda":
                continue  # the interpreter's tiny case is timed on its own
            row = measure(system, inputs, ref, nbytes, ctx)
            rows.append(dict(kind=kind, batch=batch, context=context, **extra, **row))
        del inputs, ref
    return rows


def interpreter_row(ctx: dict) -> dict:
    """Triton's interpreter on one tiny decode case (CPU machines)."""
    inputs = make_decode_inputs(2, 64, ctx["heads"], ctx["block_size"], ctx["dtype"], ctx["device"])
    ref = System("torch", "torch").call(inputs)()
    nbytes = attention_bytes([64, 64], 2, ctx["heads"], ctx["elem"])
    row = measure(System("triton", "triton"), inputs, ref, nbytes, ctx)
    return dict(kind="decode", batch=2, context=64, **row)


def print_rows(title: str, rows: list[dict]) -> None:
    """One table: time (eager; the graph's on a GPU), bandwidth and share of copy bandwidth."""
    print(title)
    table = []
    for r in rows:
        graph = r["device_seconds"]
        shape = f"{r['batch']} x {r['context']}" + (
            f" + {r['chunk']} new after {r['chunk_context']}" if "chunk" in r else ""
        )
        table.append(
            [
                r["backend"],
                shape,
                r["path"],
                f"{r['seconds'] * 1e3:.3f}",
                "-" if graph is None else f"{graph * 1e3:.3f}",
                f"{r['bandwidth'] / 1e9:.1f}",
                f"{r['fraction_of_copy']:.0%}",
                f"{r['max_abs_diff_vs_torch']:.2e}",
            ]
        )
    headers = ["backend", "batch x context", "path", "eager ms", "graph ms", "GB/s", "of copy"]
    print(format_table(table, [*headers, "|diff|"]))


def main(argv: list[str] | None = None) -> int:
    """Workload, systems, measurement, report; returns the exit status."""
    parser = bench_parser("kernels", __doc__.split("\n\n")[0])
    add_option(parser, "--fast", note="fewer, smaller shapes")
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
    # GPU: a Llama-3-8B layer (32 heads, 8 KV heads, d 128); CPU: SmolLM2-135M (9, 3, d 64).
    heads = Heads(32, 8, 128) if gpu else Heads(9, 3, 64)
    sweep = ("gpu" if gpu else "cpu") + ("-fast" if args.fast else "")
    ctx = dict(
        device=device,
        dtype=dtype,
        elem=torch.empty((), dtype=dtype).element_size(),
        heads=heads,
        block_size=args.block_size,
        repeats=20 if gpu else (5 if args.fast else 10),
        copy_bw=copy_bandwidth(device, (1 << 30) if gpu else (1 << 26)),
        notes=[],
    )
    notes: list[str] = ctx["notes"]
    found = systems(gpu, notes)
    rows = run_cases("decode", DECODE_SHAPES[sweep], found, ctx)
    if not gpu and any(s.backend == "triton" for s in found):
        rows.append(interpreter_row(ctx))
    mixed_rows = run_cases("mixed", MIXED_SHAPES[sweep], found, ctx)

    info = device_info(device)
    print(
        f"paged attention, {dtype} on {device_line(info)}; heads {heads.num_heads}/"
        f"{heads.num_kv_heads}, head_dim {heads.head_dim}, block {args.block_size}"
    )
    print(
        f"measured copy bandwidth (read + write): {ctx['copy_bw'] / 1e9:.1f} GB/s; GB/s and "
        "'of copy' use the median time, from the CUDA graph where there is one"
    )
    print_rows("decode (one query row per sequence)", rows)
    print_rows("mixed steps (decode rows and a prompt chunk, one varlen call)", mixed_rows)
    for note in notes:
        print("note:", note)
    report = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=info.get("gpu", info["cpu"]),
        machine=info,
        dtype=str(dtype).replace("torch.", ""),
        num_heads=heads.num_heads,
        num_kv_heads=heads.num_kv_heads,
        head_dim=heads.head_dim,
        block_size=args.block_size,
        torch=torch.__version__,
        copy_bandwidth=ctx["copy_bw"],
        rows=rows,
        mixed_rows=mixed_rows,
        notes=notes,
    )
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
