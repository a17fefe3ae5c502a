"""`python -m llmlab bench llamacpp`: llmlab against llama.cpp, decode at batch 1, 8, 32, 64.

llama.cpp is the CPU engine a student would otherwise pick. It runs here through the optional
extra `llama-cpp-python` (`make llamacpp`; it compiles llama.cpp for this CPU, about ten
minutes), never installed by `make lab` or `make test`. Without it the bench says how to add
it, skips that system and still measures llmlab.

Both systems run the same weights at the same precision: llama.cpp an F32 GGUF made once from
the shipped Q4_1 file by llama.cpp's own quantize function (`llamacpp_engine.f32_gguf`), llmlab
the same Q4_1 file dequantised to float32. `--precision bfloat16` gives llmlab
`dtype="bfloat16"` and llama.cpp a BF16 GGUF; `--precision int8` llmlab `quantization="int8"`
(a scale per output channel) and llama.cpp Q8_0 (a scale per 32 weights), both made by
llama.cpp's quantize from that F32 file (`llamacpp_engine.gguf_of`). The workload is llama-batched-bench's: every
sequence `--prompt-len` prompt tokens (128) and `--gen-len` generated tokens (128), greedy, EOS
ignored, the same token ids given to both.

- llmlab: `LLM(model)` with its default backend (what the benchmarks measure), driven one
  `step()` at a time; `max_num_batched_tokens` large enough that the whole batch's prompts
  are one step, as llama.cpp takes them in one `llama_decode`. `--num-scheduler-steps K`
  gives it multi-step scheduling (`EngineConfig.num_scheduler_steps`; default 1, the
  engine's default): a decode step then runs up to K forwards, each `step()` bringing up to K
  tokens per sequence.
- llama.cpp: its low-level API (`llamacpp_engine.LlamaCpp`), one sequence id per request, one
  `llama_decode` of every prompt, then one per step; greedy is an argmax over its logits. KV
  cache F32 (`--kv-type f16` for llama.cpp's default), `n_threads` = torch's thread count.

Timing, the same for both, on the wall clock: prefill runs from the first call until every
sequence has its first token (prompts through the model, one token sampled each); decode is
everything after that (gen-len - 1 steps: forward, sampling, the engine's own bookkeeping).
decode tok/s = tokens made during decode / decode seconds; total tok/s = (prompt + generated
tokens) / (prefill + decode seconds), as llama-batched-bench's S. Rounds alternate the systems
(llmlab, llama.cpp, then llama.cpp, llmlab, ...) so a drifting machine hits both; the table
gives medians over rounds, and each ratio is the median of the rounds' paired ratios (the two
runs of a round are back to back).

Each table names the CPU model, the matmul instruction sets it reports (`cpu_flags`: AVX-512
BF16, VNNI, AMX, ...) and the kernel llmlab's matmuls run at that precision: a figure means
little without the machine. `--all-precisions` runs float32, bfloat16 and int8 one after the
other in one sitting (batches 1, 8 and 64 unless `--batches` says otherwise), so the three
tables see the same machine; the JSON then holds one report per precision.

Writes build/bench-llamacpp.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time

import torch

from llmlab.bench import add_option, bench_parser, chat_prompt_ids, write_report
from llmlab.bench.llamacpp_engine import (
    KV_TYPES,
    GreedyRun,
    LlamaCpp,
    gguf_of,
    import_llama_cpp,
    install_command,
)
from llmlab.bench.llamacpp_report import machine_info, print_table, results_row
from llmlab.config import PRECISIONS
from llmlab.utils import cdiv

SYSTEMS = ("llmlab", "llama.cpp")
# --precision: llama.cpp's GGUF type at each precision both systems run (llmlab's settings for
# it are llmlab.config.PRECISIONS')
GGUF_TYPES = {"float32": "F32", "bfloat16": "BF16", "int8": "Q8_0"}
DEFAULT_BATCHES = "1,8,32,64"
ALL_PRECISIONS_BATCHES = "1,8,64"  # --all-precisions: three tables in one sitting, kept short


# ---- the workload ----------------------------------------------------------------------------


def build_workload(tokenizer, num_seqs: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    """`num_seqs` prompts of exactly `prompt_len` token ids, no two alike in their first block.

    Each is chat-rendered prompts from data/prompts.json laid end to end in an order drawn per
    sequence, cut to its last `prompt_len` tokens: every prompt ends where a chat hands over to
    the assistant. Distinct first blocks (16 tokens) keep llmlab's prefix cache out of it, as
    llama.cpp has none across sequences.
    """
    if num_seqs < 1 or prompt_len < 16:
        raise ValueError(f"need num_seqs >= 1 and prompt_len >= 16, got {num_seqs}, {prompt_len}")
    rendered = chat_prompt_ids(tokenizer)
    rng = random.Random(seed)
    work: list[list[int]] = []
    first_blocks: set[tuple[int, ...]] = set()
    for _ in range(100 * num_seqs):
        ids: list[int] = []
        for i in rng.sample(range(len(rendered)), len(rendered)):
            ids = rendered[i] + ids  # prepend: the last prompt stays whole
            if len(ids) >= prompt_len:
                break
        if len(ids) < prompt_len:
            raise ValueError(
                f"prompt_len={prompt_len} is longer than all of data/prompts.json "
                f"({len(ids)} tokens)"
            )
        ids = ids[-prompt_len:]
        if tuple(ids[:16]) not in first_blocks:
            first_blocks.add(tuple(ids[:16]))
            work.append(ids)
            if len(work) == num_seqs:
                return work
    raise ValueError(
        f"could not draw {num_seqs} prompts of {prompt_len} tokens with distinct "
        f"first blocks from data/prompts.json; ask for fewer sequences"
    )


# ---- llmlab ----------------------------------------------------------------------------------


def run_llmlab(model, prompts: list[list[int]], gen_len: int, **engine_kwargs) -> GreedyRun:
    """`prompts` through a fresh `LLM(model)` (default backend; `engine_kwargs`: dtype,
    quantization), greedy, EOS ignored, one step at a time: prefill ends with the step that
    gives the last sequence its first token."""
    from llmlab import LLM, SamplingParams
    from llmlab.analysis.dtypes import precision_label

    num_seqs, prompt_len = len(prompts), max(map(len, prompts))
    max_len = prompt_len + gen_len
    llm = LLM(
        model,
        max_num_seqs=num_seqs,
        max_model_len=max_len,
        max_num_batched_tokens=max(2048, num_seqs * prompt_len),
        num_kv_blocks=num_seqs * cdiv(max_len, 16),
        **engine_kwargs,
    )
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True)
    requests = [engine.add_request(str(i), ids, params) for i, ids in enumerate(prompts)]
    started: set[str] = set()
    made = made_in_prefill = 0
    t0 = time.perf_counter()
    t_first = None
    while engine.has_unfinished_requests():
        deltas = engine.step()
        made += sum(len(d.outputs[0].token_ids) for d in deltas)  # several with multi-step
        if t_first is None:
            started.update(d.request_id for d in deltas)
            if len(started) == num_seqs:
                t_first, made_in_prefill = time.perf_counter(), made
    t_end = time.perf_counter()
    config = {
        "attention_backend": engine.config.attention_backend,
        "dtype": precision_label(engine),
        "threads": torch.get_num_threads(),
        "block_size": engine.config.block_size,
        "max_num_batched_tokens": engine.config.max_num_batched_tokens,
        "kv_cache_dtype": str(model.dtype),
        "num_scheduler_steps": engine.config.num_scheduler_steps,
    }
    return GreedyRun(
        tokens=[list(r.output_token_ids) for r in requests],
        prefill_seconds=t_first - t0,
        decode_seconds=t_end - t_first,
        decode_tokens=made - made_in_prefill,
        prompt_tokens=sum(map(len, prompts)),
        config=config,
    )


# ---- the bench -------------------------------------------------------------------------------


def llama_cpp_skip_reason(model_name: str) -> str | None:
    """Why llama.cpp cannot run `model_name` here (with what to do about it), or None."""
    from llmlab.model.weights import BUILTIN

    if import_llama_cpp() is None:
        return (
            f"llama-cpp-python (the optional extra) is not installed. Add it (it compiles "
            f"llama.cpp, about ten minutes) with\n    {install_command()}\nor, in a "
            f"checkout, `make llamacpp`."
        )
    if model_name not in BUILTIN:
        return (
            f"it runs the GGUF files of the built-in models {sorted(BUILTIN)}, and "
            f"--model is {model_name!r}"
        )
    return None


def load_model(name: str):
    """(our LlamaModel, tokenizer); 'tiny' gives the random tiny model (smoke tests)."""
    if name == "tiny":
        from llmlab.bench.throughput import _TinyTokenizer
        from llmlab.model import tiny_model

        model = tiny_model(seed=0)
        return model, _TinyTokenizer(model.config.vocab_size)
    from llmlab.model import load_model as load

    return load(name)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = bench_parser("llamacpp", __doc__)
    add_option(
        ap,
        "--batches",
        note=f"default {DEFAULT_BATCHES}; {ALL_PRECISIONS_BATCHES} with --all-precisions",
    )
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--gen-len", type=int, default=128, help="generated tokens per sequence")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every system and batch")
    ap.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=1,
        help="llmlab's forwards per scheduled step (multi-step scheduling; default 1)",
    )
    add_option(ap, "--threads", note="llama.cpp's too; default: torch's thread count")
    ap.add_argument(
        "--kv-type",
        default="f32",
        choices=sorted(KV_TYPES),
        help="llama.cpp's KV cache element (llmlab's is float32)",
    )
    add_option(ap, "--model", "smollm2-135m", note="'tiny' for the random tiny model, llmlab only")
    ap.add_argument(
        "--precision",
        default="float32",
        choices=list(GGUF_TYPES),
        help="both systems at one precision: float32 (llama.cpp F32), bfloat16 "
        "(llmlab dtype='bfloat16', llama.cpp BF16), int8 (llmlab "
        "quantization='int8', per-channel scales; llama.cpp Q8_0, a scale "
        "per 32 weights)",
    )
    ap.add_argument(
        "--all-precisions",
        action="store_true",
        help="float32, bfloat16 and int8 one after the other in one sitting (one JSON, the "
        "tables by precision); ignores --precision",
    )
    add_option(ap, "--json", "build/bench-llamacpp.json")
    args = ap.parse_args(argv)
    if args.batches is None:
        args.batches = ALL_PRECISIONS_BATCHES if args.all_precisions else DEFAULT_BATCHES
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        raise ValueError(
            f"--batches must be comma-separated integers, got {args.batches!r}"
        ) from None
    if not args.batches or min(args.batches) < 1:
        raise ValueError(f"--batches must be integers >= 1, got {args.batches}")
    for name in ("prompt_len", "gen_len", "rounds", "num_scheduler_steps"):
        low = {"prompt_len": 16, "gen_len": 2, "rounds": 1, "num_scheduler_steps": 1}[name]
        if getattr(args, name) < low:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}"
            )
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    return args


def run_rounds(args, systems: dict, work: list[list[int]]) -> tuple[dict, list[float]]:
    """Every batch `args.rounds` times, the systems alternating: ({system: {batch: [runs]}},
    the 1-minute load average after each batch)."""
    runs: dict[str, dict[int, list[GreedyRun]]] = {
        s: {b: [] for b in args.batches} for s in systems
    }
    loads = []
    for r in range(args.rounds):
        for i, b in enumerate(args.batches):
            order = list(systems) if (r + i) % 2 == 0 else list(reversed(systems))
            for name in order:
                gc.collect()
                res = systems[name](work[:b])
                runs[name][b].append(res)
                s = res.summary()
                print(
                    f"  round {r + 1} batch {b:>3} {name:<10} decode "
                    f"{s['decode_tok_per_s']:8.1f} tok/s ({s['ms_per_decode_step']:6.1f} ms/step)"
                    f"  total {s['total_tok_per_s']:8.1f} tok/s",
                    flush=True,
                )
            loads.append(os.getloadavg()[0])
    return runs, loads


def bench_precision(args, precision: str, model, work: list[list[int]], threads: int) -> dict:
    """Both systems at one precision over every batch: the report of one table."""
    llama = None
    skipped = llama_cpp_skip_reason(args.model)
    kind = GGUF_TYPES[precision]
    if skipped:
        print(f"llama.cpp: skipped, {skipped}", flush=True)
    else:
        print(f"llama.cpp: {kind} GGUF (made once by llama.cpp's quantize) ...", flush=True)
        llama = LlamaCpp(gguf_of(args.model, kind, threads), threads, args.kv_type)
    settings = {**PRECISIONS[precision], "num_scheduler_steps": args.num_scheduler_steps}
    systems = {"llmlab": lambda prompts: run_llmlab(model, prompts, args.gen_len, **settings)}
    if llama is not None:
        systems["llama.cpp"] = lambda prompts: llama.run(prompts, args.gen_len)
    for run in systems.values():  # warm-up: compiles llmlab's kernels, pages both models in
        run([work[0]])
    try:
        runs, loads = run_rounds(args, systems, work)
    finally:
        if llama is not None:
            llama.close()
    return {
        "machine": {**machine_info(threads), "load_average_1min": loads},
        "settings": {
            "model": args.model,
            "precision": precision,
            "gguf": kind,
            "prompt_len": args.prompt_len,
            "gen_len": args.gen_len,
            "rounds": args.rounds,
            "greedy": True,
            "ignore_eos": True,
            "batches": args.batches,
            "num_scheduler_steps": args.num_scheduler_steps,
        },
        "skipped": {"llama.cpp": skipped.splitlines()[0]} if skipped else {},
        "config": {name: runs[name][args.batches[0]][0].config for name in systems},
        "results": {str(b): results_row(runs, b, args.gen_len) for b in args.batches},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the comparison at one precision (or, with --all-precisions, at each in turn); print
    the tables; write the JSON. Returns 0."""
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    model, tokenizer = load_model(args.model)
    work = build_workload(tokenizer, max(args.batches), args.prompt_len)
    precisions = list(GGUF_TYPES) if args.all_precisions else [args.precision]
    reports = {}
    for precision in precisions:
        print(f"== {precision}", flush=True)
        reports[precision] = bench_precision(args, precision, model, work, threads)
    for report in reports.values():
        print_table(report)
    if args.all_precisions:
        write_report({"machine": machine_info(threads), "precisions": reports}, args.json)
    else:
        write_report(reports[args.precision], args.json)
    return 0
