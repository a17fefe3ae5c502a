"""The GPU side of `bench decode_profile`: per decode step, wall time, GPU-busy time, kernels
and launches, beside the step's HBM floor (the measurements are described in
`llmlab.bench.decode_profile`'s docstring). On a CPU the same machinery runs and finds no
kernel, which is how the tests check it."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmlab.analysis.dtypes import precision_label
from llmlab.analysis.step_time import covered
from llmlab.bench import device_info, device_line, free_memory, random_weights, write_report
from llmlab.utils import format_table

STEP_LABEL = "llmlab.decode_step."
# the host's calls that start work on the GPU: one per kernel, or one per replayed graph
LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchCooperativeKernel",
    "cudaGraphLaunch",
    "cuGraphLaunch",
)


def split_profile(events) -> list[dict]:
    """Per profiled step (a host range labelled `STEP_LABEL` + i), from `torch.profiler`'s
    events: kernels the GPU ran, busy µs (the union of their intervals, memsets included),
    µs of memory copies, and the host's launch calls. A device event belongs to the step whose
    host range began last before it (a step ends by reading its tokens back, so its kernels end
    inside it); a host event to the step whose range holds it."""
    import bisect

    cuda = torch.autograd.DeviceType.CUDA
    hosts = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name.startswith(STEP_LABEL) and e.device_type != cuda
    )
    starts = [start for start, _ in hosts]
    steps = [
        {"wall_us": end - start, "kernels": 0, "launches": 0, "copy_us": 0.0, "spans": []}
        for start, end in hosts
    ]
    for e in events:
        if e.name.startswith(STEP_LABEL) or getattr(e, "is_user_annotation", False):
            continue
        start, end = e.time_range.start, e.time_range.end
        i = bisect.bisect_right(starts, start) - 1
        if i < 0:
            continue
        step = steps[i]
        if e.device_type == cuda:
            if e.name.startswith("Memcpy"):
                step["copy_us"] += end - start
            else:
                step["spans"].append((start, end))
                step["kernels"] += not e.name.startswith("Memset")
        elif start <= hosts[i][1] and e.name.startswith(LAUNCH_CALLS):
            step["launches"] += 1
    for step in steps:
        step["busy_us"] = covered(step.pop("spans"))
    return steps


def _add_requests(engine, tag: str, prompts: list[list[int]], max_tokens: int) -> list:
    """Add one greedy request per prompt (EOS ignored); returns the engine's Request objects."""
    from llmlab import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    return [engine.requests[f"{tag}-{i}"] for i in range(len(prompts))]


def _prefill(engine, requests: list) -> None:
    """Step until every request has its first token: what is left are decode-only steps."""
    while any(r.num_output_tokens == 0 for r in requests):
        engine.step()


def decode_walls(engine, requests: list) -> list[float]:
    """Seconds of each decode step of `requests` on the host's clock (a step ends by reading
    its sampled tokens back, so the GPU's work is inside it)."""
    _prefill(engine, requests)
    walls = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    return walls


def profiled_decode(engine, requests: list) -> list[dict]:
    """`split_profile` of the decode steps of `requests`, run under `torch.profiler` (the GPU's
    activity too where the engine runs on one)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    _prefill(engine, requests)
    activities = [ProfilerActivity.CPU]
    if engine.model_runner.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        i = 0
        while engine.has_unfinished_requests():
            with record_function(f"{STEP_LABEL}{i}"):
                engine.step()
            i += 1
    return split_profile(prof.events())


def profile_device_decode(
    model,
    batch: int,
    prompt_len: int,
    gen_len: int,
    profile_steps: int = 8,
    rounds: int = 1,
    seed: int = 0,
    **engine_kwargs,
) -> dict:
    """Decode steps of `batch` requests of random prompts at once, on the model's device: the
    wall time of each (fastest median of `rounds` runs with no profiler), then GPU-busy time,
    kernels and launches of `profile_steps` more under the profiler. `engine_kwargs`: the
    engine's attention_backend, dtype, kv_cache_dtype, enforce_eager."""
    from llmlab import LLM
    from llmlab.config.engine import EngineConfig
    from llmlab.utils import cdiv

    max_len = prompt_len + gen_len
    llm = LLM(
        model,
        max_num_seqs=batch,
        max_model_len=max_len,
        max_num_batched_tokens=max(2048, batch * prompt_len),  # the prefill in one step
        num_kv_blocks=batch * cdiv(max_len, EngineConfig.block_size) + 1,  # no preemption
        **engine_kwargs,
    )
    engine = llm.llm_engine
    gen = torch.Generator().manual_seed(seed)

    def prompts() -> list[list[int]]:
        return torch.randint(
            3, model.config.vocab_size, (batch, prompt_len), generator=gen
        ).tolist()

    decode_walls(engine, _add_requests(engine, "warm", prompts(), 3))  # compile, page in
    walls = [
        decode_walls(engine, _add_requests(engine, f"wall{r}", prompts(), gen_len))
        for r in range(rounds)
    ]
    wall = min(walls, key=statistics.median)
    profiled = profiled_figures(engine, _add_requests(engine, "prof", prompts(), profile_steps + 1))
    kv_dtype = engine.config.torch_kv_cache_dtype or engine.model_runner.model.dtype
    return {
        "batch": batch,
        "enforce_eager": engine.config.enforce_eager,
        "cuda_graphs": engine.model_runner.graphs is not None,
        "attention_backend": engine.config.attention_backend,
        "precision": precision_label(engine),
        "decode_steps": len(wall),
        "wall_ms": 1e3 * statistics.median(wall),
        "wall_ms_rounds": [1e3 * statistics.median(w) for w in walls],
        **profiled,
        "preemptions": engine.stats()["preemptions"],
        "context": prompt_len + gen_len // 2,  # the median decode step's keys per request
        "weight_elem_bytes": engine.model_runner.model.dtype.itemsize,
        "kv_elem_bytes": kv_dtype.itemsize,
    }


def profiled_figures(engine, requests: list) -> dict:
    """Medians over the decode steps of `requests` run under the profiler (`split_profile`):
    wall, busy and copy ms, kernels and launches per step. Where the profiler cannot trace
    here, each is None and `profile_error` says why: the wall times stand without it."""
    try:
        steps = profiled_decode(engine, requests)
        if not steps:
            raise RuntimeError("the profile holds no decode step")
    except RuntimeError as e:
        keys = ("profiled_wall_ms", "busy_ms", "copy_ms", "kernels_per_step", "launches_per_step")
        error = {"profiled_steps": 0, "profile_error": f"{type(e).__name__}: {e}"}
        return error | dict.fromkeys(keys)

    def median(key: str) -> float:
        return statistics.median(s[key] for s in steps)

    return {
        "profiled_steps": len(steps),
        "profiled_wall_ms": median("wall_us") / 1e3,
        "busy_ms": median("busy_us") / 1e3,
        "copy_ms": median("copy_us") / 1e3,
        "kernels_per_step": median("kernels"),
        "launches_per_step": median("launches"),
    }


def add_floor(run: dict, cfg, copy_bw: float) -> None:
    """The step's HBM floor beside its times: every weight read once, and each request's K and
    V at the median step's context, over the card's copy bandwidth (bytes read + written per
    second of a device-to-device copy)."""
    from llmlab.analysis import costs

    weights = costs.weight_bytes(cfg, run["weight_elem_bytes"])
    kv = run["batch"] * costs.kv_bytes(cfg, run["context"], run["kv_elem_bytes"])
    run["bytes_read"] = weights + kv
    run["floor_ms"] = 1e3 * (weights + kv) / copy_bw
    run["busy_fraction"] = None if run["busy_ms"] is None else run["busy_ms"] / run["wall_ms"]
    run["floor_fraction"] = run["floor_ms"] / run["wall_ms"]


def device_model(args):
    """The model the GPU profile runs: random weights of `--shape`, or `--model` loaded, on
    the device in the dtype asked for (auto: bfloat16)."""
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    shape = "tiny" if args.model == "tiny" else args.shape
    if shape is not None:
        return random_weights(shape, dtype, args.device)
    from llmlab.model import load_model

    return load_model(args.model, dtype=dtype, device=args.device)[0]


def gpu_main(args: argparse.Namespace) -> int:
    """The GPU profile: every batch size with graphs on and off, the table, the JSON."""
    from llmlab.analysis import hardware

    machine = device_info(args.device)
    print(f"machine: {device_line(machine)}", flush=True)
    model = device_model(args)
    copy_bw = hardware.measure_bandwidth(str(args.device), kind="copy")
    dtype = str(model.dtype).removeprefix("torch.")
    runs = []
    for batch in args.batch:
        for graphs in args.graphs:
            run = profile_device_decode(
                model,
                batch,
                args.prompt_len,
                args.gen_len,
                args.profile_steps,
                args.rounds,
                attention_backend=args.attention,
                dtype=dtype,
                kv_cache_dtype=args.kv_cache_dtype,
                enforce_eager=graphs == "off",
            )
            runs.append(run)
            print(f"  batch {batch}, graphs {graphs}: {run['wall_ms']:.2f} ms/step", flush=True)
            free_memory(args.device)
    copy_bw = max(copy_bw, hardware.measure_bandwidth(str(args.device), kind="copy"))
    for run in runs:
        add_floor(run, model.config, copy_bw)
    report = {
        "machine": machine,
        "settings": {
            "model": args.model or f"random weights, shape {args.shape}",
            "prompt_len": args.prompt_len,
            "gen_len": args.gen_len,
            "rounds": args.rounds,
            "profile_steps": args.profile_steps,
        },
        "copy_bandwidth": copy_bw,
        "runs": runs,
    }
    print_gpu_table(report)
    write_report(report, args.json)
    return 0


def print_gpu_table(report: dict) -> None:
    s, runs = report["settings"], report["runs"]
    first = runs[0]
    print(
        f"\ndecode steps on {report['machine'].get('gpu', report['machine']['device'])}, "
        f"{s['model']}, attention_backend={first['attention_backend']!r}, "
        f"{first['precision']}, prompt {s['prompt_len']} + {s['gen_len']} tokens; wall: median "
        f"of {first['decode_steps']} steps; busy, kernels, launches: median of "
        f"{first['profiled_steps']} profiled steps; copy bandwidth "
        f"{report['copy_bandwidth'] / 1e9:,.0f} GB/s (read + write, measured)"
    )
    rows = [
        [
            r["batch"],
            "off" if r["enforce_eager"] else "on" if r["cuda_graphs"] else "on (none here)",
            f"{r['wall_ms']:.3f}",
            f"{r['batch'] * 1e3 / r['wall_ms']:,.0f}",
            *(
                "n/a" if r[key] is None else format(r[key], spec)
                for key, spec in (
                    ("busy_ms", ".3f"),
                    ("busy_fraction", ".0%"),
                    ("kernels_per_step", ".0f"),
                    ("launches_per_step", ".0f"),
                    ("copy_ms", ".3f"),
                )
            ),
            f"{r['floor_ms']:.3f}",
            f"{r['floor_fraction']:.0%}",
        ]
        for r in runs
    ]
    headers = ["batch", "graphs", "wall ms", "tok/s", "busy ms", "busy/wall", "kernels"]
    headers += ["launches", "copies ms", "floor ms", "floor/wall"]
    print(format_table(rows, headers))
    for r in runs:
        if r.get("profile_error"):
            print(f"batch {r['batch']}: no profile ({r['profile_error']})")
