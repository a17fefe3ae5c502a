"""The runs `python -m llmlab bench throughput` compares and how each is measured: a runner per
system (our engine with a fresh `LLM` each time, transformers' loops, vLLM through its bridge),
each system timed on the same work, the scheduler's own time per request replayed without the
forward, and the tok/s the machine's matmul peak allows on the work (the compute bound).
"""

from __future__ import annotations

import gc
import time

import torch

from llmlab.bench import (
    free_memory,
)
from llmlab.bench.hf_peers import (
    hf_continuous_api,
    run_hf_continuous,
    run_hf_sequential,
    run_hf_static,
)
from llmlab.i18n import tr
from llmlab.utils import cdiv

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
