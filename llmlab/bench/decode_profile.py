"""`python -m llmlab bench decode_profile`: where a decode step of the engine spends its time.

On a CPU (the default without a GPU): one request (`--prompt-len` prompt tokens, `--gen-len`
greedy tokens, EOS ignored) runs through `LLM(model)` with its default backend. This one
engine's parts are wrapped in timers (the code itself is unchanged), and each decode step's
wall time is split into:

  schedule        the scheduler and block manager (`schedule` + `update_from_output`)
  inputs          the flat batch and its attention metadata, checked (`prepare_inputs`)
  embed + rope    the token's embedding row and its RoPE cos/sin
  layers          the decoder layers (on the "cpu" backend all in one fused C call); below
                  the table, those calls split by phase (`cpu_decode.LAYER_PHASES`: each phase
                  ends at a barrier of the layers' OpenMP region, timed inside C), and what is
                  left outside the C call (Python and ctypes around it)
  final norm
  lm_head         the logits: one GEMV over the [vocab, hidden] embedding matrix
  sampling        `llmlab.sampling.sample` (an argmax for greedy)
  rest            what `step()` does besides: outputs, the runner's Python between the parts

Beside the parts that stream weights, their floor: bytes / this machine's read bandwidth,
measured just before and just after the round the table shows (on 2 MB pages where the
kernel gives them, as the weights are; `paired_rounds` says why beside it). And the price of
waking the OpenMP threads: an empty parallel region (our GEMV on a 4x16 matrix) on all threads
less the same on one thread, times the regions a step opens (one for the decoder layers, one
for the lm_head).

On a GPU (`--device cuda`): `--batch` requests at once (default 1 and 64), each batch with the
decode CUDA graphs on and off (`enforce_eager`), and per decode step:

  wall            `engine.step()` on the host's clock, in a run with no profiler attached
  GPU busy        the union of the step's kernel intervals on the GPU's clock, from
                  `torch.profiler` (CUPTI) in a second run of the same shape
  kernels         kernels the GPU ran in the step; launches: the host's launch calls
                  (`cudaLaunchKernel`, `cuLaunchKernel`, `cudaGraphLaunch`, ...)
  HBM floor       bytes the step must read (every weight once, each request's K and V) over
                  the card's copy bandwidth, measured by a device-to-device copy

Why busy comes from the profiler and wall from a run without it: the profiler records every
launch on the host, which slows the host (and so the wall time of a host-bound step), while
the kernels' durations on the GPU stay as they are. Busy is a union of intervals rather than a
sum of durations so that kernels overlapping on two streams count once; CUDA events around the
step would give the span from first launch to last kernel, idle gaps included, not the busy
time. With `--shape NAME` the model has random weights of a preset's shape (no files needed)
and the prompts are random token ids.

Writes build/bench-decode-profile.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections import defaultdict

import torch

from llmlab.analysis.dtypes import precision_label
from llmlab.bench import (
    add_option,
    bench_device,
    bench_parser,
    model_or_shape,
    random_weights,
    write_report,
)
from llmlab.bench.decode_profile_table import PARTS, print_table
from llmlab.ops.cpu_decode import LAYER_PHASES
from llmlab.utils import best_of


class StepTimer:
    """Seconds per part per step, for the parts `profile_decode` wraps."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[part] += time.perf_counter() - t0

        return timed

    def end_step(self, total: float, phases: torch.Tensor | None = None) -> None:
        """Close a step of `total` seconds; `phases`: the fused layers' seconds per phase
        (`cpu_decode.timed_layer_phases`), recorded under "layer: <phase>" and zeroed."""
        step = dict(self.current)
        if phases is not None:
            for name, seconds in zip(LAYER_PHASES, phases.tolist()):
                step[f"layer: {name}"] = seconds
            phases.zero_()
        step["rest"] = total - sum(step.get(p, 0.0) for p in PARTS if p != "rest")
        step["total"] = total
        self.steps.append(step)
        self.current = defaultdict(float)


@contextlib.contextmanager
def _timed(timer: StepTimer, targets: list[tuple[object, str, str]]):
    """Shadow each `obj.name` by a timed copy (an instance or module attribute) for the block;
    put every one back after, also on the modules the fast model shares with the readable one."""
    saved = []
    try:
        for obj, name, part in targets:
            had_own = name in vars(obj)
            saved.append((obj, name, had_own, vars(obj).get(name)))
            setattr(obj, name, timer.wrap(part, getattr(obj, name)))
        yield
    finally:
        for obj, name, had_own, value in reversed(saved):
            if had_own:
                setattr(obj, name, value)
            else:
                delattr(obj, name)


def profile_decode(model, prompt: list[int], gen_len: int, **engine_kwargs) -> dict:
    """Median ms per decode step of each part (see the module docstring) on one request;
    `engine_kwargs`: dtype, quantization, kv_cache_dtype (EngineConfig's)."""
    from llmlab import LLM, SamplingParams
    from llmlab.worker import model_runner as runner_module

    llm = LLM(model, max_num_seqs=1, max_model_len=len(prompt) + gen_len, **engine_kwargs)
    engine = llm.llm_engine
    runner, scheduler = engine.model_runner, engine.scheduler
    fast = runner.model
    timer = StepTimer()
    targets = [
        (scheduler, "schedule", "schedule"),
        (scheduler, "update_from_output", "schedule"),
        (runner, "prepare_inputs", "inputs"),
        (fast, "rope_cos_sin", "embed + rope"),
        (fast.embed_tokens, "forward", "embed + rope"),
        (fast, "run_layers", "layers"),
        (fast.norm, "forward", "final norm"),
        (fast, "compute_logits", "lm_head"),
        (runner_module, "sample", "sampling"),
    ]
    params = SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True)
    engine.add_request("0", prompt, params)
    split = contextlib.nullcontext()
    if engine.config.attention_backend == "cpu":  # the fused C layers, split by phase
        from llmlab.ops import cpu_decode

        split = cpu_decode.timed_layer_phases()
    with _timed(timer, targets), split as phases:
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            timer.end_step(time.perf_counter() - t0, phases)
    decode = timer.steps[1:]  # the first step is the prefill
    ms = {p: 1e3 * statistics.median(s.get(p, 0.0) for s in decode) for p in PARTS}
    layer_ms = {
        name: 1e3 * statistics.median(s.get(f"layer: {name}", 0.0) for s in decode)
        for name in LAYER_PHASES
    }
    ms["total"] = 1e3 * statistics.median(s["total"] for s in decode)
    return {
        "ms_per_step": ms,
        "decode_steps": len(decode),
        "steps": [{p: 1e3 * v for p, v in s.items()} for s in decode],
        "attention_backend": engine.config.attention_backend,
        "precision": precision_label(engine),
        "layer_weight_bytes": sum(_weight_bytes(layer) for layer in fast.layers),
        "lm_head_weight_bytes": fast.lm_head.weight.numel() * fast.lm_head.weight.element_size(),
        "num_layers": len(fast.layers),
        "layer_phases_ms": layer_ms if phases is not None else None,
    }


def add_precision_args(ap: argparse.ArgumentParser) -> None:
    """--dtype, --quantization, --kv-cache-dtype: EngineConfig's settings, for any bench."""
    from llmlab.config.engine import DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS

    ap.add_argument(
        "--dtype",
        default="auto",
        choices=list(DTYPES),
        help="weights' and activations' dtype (EngineConfig.dtype)",
    )
    ap.add_argument(
        "--quantization",
        default=None,
        choices=[q for q in QUANTIZATIONS if q],
        help="weight-only quantization (EngineConfig.quantization)",
    )
    ap.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=list(KV_CACHE_DTYPES),
        help="KV cache dtype (EngineConfig.kv_cache_dtype)",
    )


def precision_kwargs(args) -> dict:
    return {
        "dtype": args.dtype,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
    }


def _weight_bytes(layer) -> int:
    """Bytes of the dense weights a layer's batch-1 step streams (each distinct storage once)."""
    seen, total = set(), 0
    for t in [p for p in layer.parameters()] + [
        t
        for m in layer.modules()
        for t in (
            getattr(m, "weight", None),
            getattr(m, "scale", None),
            getattr(m, "weight_scale", None),
        )
        if isinstance(t, torch.Tensor)
    ]:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def read_roof() -> float:
    """This machine's read bandwidth now (bytes/s), from 2 MB pages where the kernel gives
    them, as the fast path's weights are."""
    from llmlab.analysis import hardware

    return hardware.measure_bandwidth("cpu", kind="read", huge_pages=True)


def paired_rounds(run_round, rounds: int, roof) -> list[dict]:
    """`rounds` profiles from `run_round()`, each with the read bandwidth measured just before
    and just after it (`roof()`, the larger of the two) under "read_bandwidth". On a shared
    machine the bandwidth changes from minute to minute (40 to 89 GB/s within an hour
    on one VM), so a step is held against the roof measured beside it, not seconds away: a
    roof read apart from the round has put a step under its own floor."""
    out = []
    for _ in range(rounds):
        before = roof()
        profile = run_round()
        profile["read_bandwidth"] = max(before, roof())
        out.append(profile)
    return out


def omp_wake_us(threads: int, calls: int = 2000) -> dict:
    """µs per empty OpenMP parallel region (our GEMV on 4x16) on `threads` threads and on one;
    their difference is what waking the other threads costs per region."""
    from llmlab.ops import cpu_matmul

    x, w = torch.randn(1, 16), torch.randn(4, 16)
    saved = torch.get_num_threads()
    out = {}
    try:
        for n in (1, threads):
            torch.set_num_threads(n)

            def burst() -> None:
                for _ in range(calls):
                    cpu_matmul.gemv(x, w)

            out[n] = best_of(burst, repeats=5) / calls * 1e6
    finally:
        torch.set_num_threads(saved)
    return {
        "one_thread_us": out[1],
        "all_threads_us": out[threads],
        "wake_us_per_region": max(out[threads] - out[1], 0.0),
    }


# ---- the command --------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from llmlab.ops import BACKENDS

    ap = bench_parser("decode_profile", __doc__.split("\n\n")[0])
    add_option(ap, "--device")
    add_option(ap, "--model", note="default smollm2-135m; 'tiny' for smoke runs")
    add_option(ap, "--shape")
    ap.add_argument(
        "--batch",
        default=None,
        help="requests per step, comma-separated (GPU; default 1,64); the CPU profile is batch 1",
    )
    ap.add_argument("--graphs", default=None, help="GPU: 'on,off' (the default), 'on' or 'off'")
    add_option(ap, "--attention", note="default: what LLM() picks here", choices=BACKENDS)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=None, help="default 128 (CPU), 64 (GPU)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="profiled requests; the table takes the round with the fastest median step "
        "(default 3 on a CPU, 1 on a GPU)",
    )
    ap.add_argument(
        "--profile-steps", type=int, default=8, help="GPU: decode steps run under the profiler"
    )
    add_option(ap, "--threads", note="default: torch's thread count")
    add_option(ap, "--json", "build/bench-decode-profile.json")
    add_precision_args(ap)
    return ap.parse_args(argv)


def _settle(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on the device; raise ValueError naming a bad option."""
    args.device = bench_device(args.device)
    gpu = args.device.type == "cuda"
    args.model, args.shape = model_or_shape(args.model, args.shape)
    args.gen_len = args.gen_len or (64 if gpu else 128)
    args.rounds = args.rounds or (1 if gpu else 3)
    for name, low in (
        ("prompt_len", 16),
        ("gen_len", 3),
        ("rounds", 1),
        ("threads", 1),
        ("profile_steps", 1),
    ):
        if getattr(args, name) is not None and getattr(args, name) < low:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}"
            )
    if not gpu and (args.batch not in (None, "1") or args.graphs is not None):
        raise ValueError(
            "--batch and --graphs profile a GPU (--device cuda); the CPU profile splits one "
            f"batch-1 step, got --batch {args.batch}, --graphs {args.graphs}"
        )
    if gpu:
        _settle_gpu(args)
    return args


def _settle_gpu(args: argparse.Namespace) -> None:
    try:
        args.batch = [int(b) for b in (args.batch or "1,64").split(",") if b]
    except ValueError:
        raise ValueError(f"--batch must be comma-separated ints, got {args.batch!r}") from None
    if not args.batch or min(args.batch) < 1:
        raise ValueError(f"--batch must be sizes >= 1, got {args.batch}")
    args.graphs = [g for g in (args.graphs or "on,off").split(",") if g]
    if not args.graphs or set(args.graphs) - {"on", "off"}:
        raise ValueError(f"--graphs must be 'on', 'off' or 'on,off', got {args.graphs}")
    if args.quantization is not None:
        raise ValueError(
            f"--quantization {args.quantization}: the GPU profile measures the dense model "
            "(int8 weights are widened per call there, not a speed path); leave it out"
        )


def main(argv: list[str] | None = None) -> int:
    args = _settle(_parse(argv))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.type == "cuda":
        from llmlab.bench import gpu_steps

        return gpu_steps.gpu_main(args)
    return cpu_main(args)


def cpu_main(args: argparse.Namespace) -> int:
    """The batch-1 step split into its parts (the module docstring), the table, the JSON."""
    from llmlab.bench.llamacpp import build_workload, load_model
    from llmlab.tools.doctor import cpu_name

    if args.shape is not None:
        model = random_weights(args.shape)
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, model.config.vocab_size, (args.prompt_len,), generator=gen)
        prompt = prompt.tolist()
    else:
        model, tokenizer = load_model(args.model)
        prompt = build_workload(tokenizer, 1, args.prompt_len)[0]
    threads = torch.get_num_threads()
    kwargs = precision_kwargs(args)
    if args.attention is not None:
        kwargs["attention_backend"] = args.attention
    profile_decode(model, prompt[:16], 3, **kwargs)  # warm-up: compile, page in
    rounds = paired_rounds(
        lambda: profile_decode(model, prompt, args.gen_len, **kwargs), args.rounds, read_roof
    )
    best = min(rounds, key=lambda r: r["ms_per_step"]["total"])
    read_bw = best["read_bandwidth"]
    wake = omp_wake_us(threads)
    report = {
        "machine": {
            "cpu": cpu_name(),
            "threads": threads,
            "read_bandwidth": read_bw,
            "load_average_1min": os.getloadavg()[0],
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        },
        "settings": {
            "model": args.model or f"random weights, shape {args.shape}",
            "prompt_len": args.prompt_len,
            "gen_len": args.gen_len,
            "rounds": args.rounds,
        },
        "profile": best,
        "rounds_total_ms": [r["ms_per_step"]["total"] for r in rounds],
        "rounds_read_bandwidth": [r["read_bandwidth"] for r in rounds],
        "omp": wake,
        "floors_ms": {
            "layers": 1e3 * best["layer_weight_bytes"] / read_bw,
            "lm_head": 1e3 * best["lm_head_weight_bytes"] / read_bw,
        },
    }
    print_table(report)
    write_report(report, args.json)
    return 0
