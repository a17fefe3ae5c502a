"""`python -m llmlab bench llamacpp`: llmlab against llama.cpp, decode at batch 1, 8, 32, 64.

llama.cpp is the CPU engine a student would otherwise pick. It runs here through the optional
extra `llama-cpp-python` (`make llamacpp`; it compiles llama.cpp for this CPU, about ten
minutes), never installed by `make lab` or `make test`. Without it the bench says how to add
it, skips that system and still measures llmlab.

Both systems run the same weights at the same precision: llama.cpp an F32 GGUF made once from
the shipped Q4_1 file by llama.cpp's own quantize function with requantising allowed (cached
under llmlab's cache directory), llmlab the same Q4_1 file dequantised to float32. The workload
is llama-batched-bench's: every sequence `--prompt-len` prompt tokens (128) and
`--gen-len` generated tokens (128), greedy, EOS ignored, the same token ids given to both.

- llmlab: `LLM(model)` with its default backend (what the benchmarks measure), driven one
  `step()` at a time; `max_num_batched_tokens` large enough that the whole batch's prompts
  are one step, as llama.cpp takes them in one `llama_decode`.
- llama.cpp: its low-level API, one sequence id per request: `llama_batch_init`, one
  `llama_decode` of every prompt, then one `llama_decode` of one token per sequence per
  step; greedy is an argmax over the logits it returns. KV cache F32 (`--kv-type f16` for
  llama.cpp's default) and `n_threads` = torch's thread count.

Timing, the same for both, on the wall clock: prefill runs from the first call until every
sequence has its first token (prompts through the model, one token sampled each); decode is
everything after that (gen-len - 1 steps: forward, sampling, the engine's own bookkeeping).
decode tok/s = tokens made during decode / decode seconds; total tok/s = (prompt + generated
tokens) / (prefill + decode seconds), as llama-batched-bench's S. Rounds alternate the systems
(llmlab, llama.cpp, then llama.cpp, llmlab, ...) so a drifting machine hits both; the table
gives medians over rounds, and each ratio is the median of the rounds' paired ratios (the two
runs of a round are back to back).

Writes build/bench-llamacpp.json (or --json PATH).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmlab.config import DATA_DIR
from llmlab.utils import cdiv

REQUIREMENT = "llama-cpp-python>=0.3"      # pyproject's `llamacpp` extra (a test keeps them equal)
SYSTEMS = ("llmlab", "llama.cpp")
DEFAULT_BATCHES = "1,8,32,64"
KV_TYPES = {"f32": 0, "f16": 1}           # ggml_type ids of llama.cpp's KV cache element


def install_command() -> str:
    """The exact command that adds llama.cpp to this Python."""
    return f'{sys.executable} -m pip install "{REQUIREMENT}"'


def import_llama_cpp():
    """The `llama_cpp` module, or None where the optional extra is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


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
    prompts = json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]
    rendered = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": p["text"]}], add_generation_prompt=True, tokenize=False))
        for p in prompts]
    rng = random.Random(seed)
    work: list[list[int]] = []
    first_blocks: set[tuple[int, ...]] = set()
    for _ in range(100 * num_seqs):
        ids: list[int] = []
        for i in rng.sample(range(len(rendered)), len(rendered)):
            ids = rendered[i] + ids                   # prepend: the last prompt stays whole
            if len(ids) >= prompt_len:
                break
        if len(ids) < prompt_len:
            raise ValueError(f"prompt_len={prompt_len} is longer than all of data/prompts.json "
                             f"({len(ids)} tokens)")
        ids = ids[-prompt_len:]
        if tuple(ids[:16]) not in first_blocks:
            first_blocks.add(tuple(ids[:16]))
            work.append(ids)
            if len(work) == num_seqs:
                return work
    raise ValueError(f"could not draw {num_seqs} prompts of {prompt_len} tokens with distinct "
                     f"first blocks from data/prompts.json; ask for fewer sequences")


@dataclass
class GreedyRun:
    """One system's run of one batch: the tokens and where the time went."""

    tokens: list[list[int]]            # generated token ids per sequence
    prefill_seconds: float             # until every sequence had its first token
    decode_seconds: float              # the rest
    decode_tokens: int                 # tokens made during decode
    prompt_tokens: int
    config: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)     # a system's own extra figures

    def summary(self) -> dict:
        generated = sum(map(len, self.tokens))
        seconds = self.prefill_seconds + self.decode_seconds
        return {"prefill_seconds": self.prefill_seconds, "decode_seconds": self.decode_seconds,
                "decode_tokens": self.decode_tokens,
                "decode_tok_per_s": self.decode_tokens / self.decode_seconds,
                "total_tok_per_s": (self.prompt_tokens + generated) / seconds,
                "ms_per_decode_step": 1e3 * self.decode_seconds
                                      / max(self.decode_tokens // len(self.tokens), 1),
                **self.measured}


# ---- llmlab ----------------------------------------------------------------------------------

def run_llmlab(model, prompts: list[list[int]], gen_len: int) -> GreedyRun:
    """`prompts` through a fresh `LLM(model)` (default backend), greedy, EOS ignored, one step
    at a time: prefill ends with the step that gives the last sequence its first token."""
    from llmlab import LLM, SamplingParams

    num_seqs, prompt_len = len(prompts), max(map(len, prompts))
    max_len = prompt_len + gen_len
    llm = LLM(model, max_num_seqs=num_seqs, max_model_len=max_len,
              max_num_batched_tokens=max(2048, num_seqs * prompt_len),
              num_kv_blocks=num_seqs * cdiv(max_len, 16))
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True)
    requests = [engine.add_request(str(i), ids, params) for i, ids in enumerate(prompts)]
    started: set[str] = set()
    made = made_in_prefill = 0
    t0 = time.perf_counter()
    t_first = None
    while engine.has_unfinished_requests():
        deltas = engine.step()
        made += len(deltas)
        if t_first is None:
            started.update(d.request_id for d in deltas)
            if len(started) == num_seqs:
                t_first, made_in_prefill = time.perf_counter(), made
    t_end = time.perf_counter()
    config = {"attention_backend": engine.config.attention_backend, "dtype": str(model.dtype),
              "threads": torch.get_num_threads(), "block_size": engine.config.block_size,
              "max_num_batched_tokens": engine.config.max_num_batched_tokens,
              "kv_cache_dtype": str(model.dtype)}
    return GreedyRun(tokens=[list(r.output_token_ids) for r in requests],
                     prefill_seconds=t_first - t0, decode_seconds=t_end - t_first,
                     decode_tokens=made - made_in_prefill,
                     prompt_tokens=sum(map(len, prompts)), config=config)


# ---- llama.cpp -------------------------------------------------------------------------------

GGML_LOG_LEVEL_ERROR = 4


def _errors_only(level: int, text: bytes, _user_data) -> None:
    if level == GGML_LOG_LEVEL_ERROR:
        sys.stderr.write(text.decode(errors="replace"))


@functools.cache
def _quiet(llama_cpp):
    """Keep llama.cpp's log to its errors (it logs every tensor it loads or converts); the
    callback is cached because llama.cpp calls it for as long as the process lives."""
    callback = llama_cpp.llama_log_callback(_errors_only)
    llama_cpp.llama_log_set(callback, None)
    return callback


def f32_gguf(name: str = "smollm2-135m", threads: int | None = None) -> Path:
    """An all-F32 GGUF of the built-in model `name`, made once from its shipped (Q4_1) GGUF by
    llama.cpp's quantize with requantising allowed, cached in `cache_dir()/gguf`."""
    from llmlab.paths import cache_dir
    from llmlab.weights import gguf_path

    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        raise RuntimeError(f"llama-cpp-python is not installed; add it with:\n    "
                           f"{install_command()}")
    _quiet(llama_cpp)
    src = gguf_path(name)
    target = cache_dir() / "gguf" / src.name.replace(".Q4_1.", ".F32.")
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True           # the source is quantised: dequantise it
    params.nthread = threads or torch.get_num_threads()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({src} -> F32) failed with {rc}")
    tmp.rename(target)
    return target


class LlamaCpp:
    """llama.cpp on one GGUF through llama-cpp-python's low-level API, greedy, many sequences.

    Each `run` makes a context sized for its batch (`n_seq_max` sequences of prompt + output
    tokens), so a run starts with an empty KV cache as llmlab's fresh engine does.
    """

    def __init__(self, gguf: Path, threads: int, kv_type: str = "f32") -> None:
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        llama_cpp = import_llama_cpp()
        if llama_cpp is None:
            raise RuntimeError(f"llama-cpp-python is not installed; add it with:\n    "
                               f"{install_command()}")
        self.lib = lib = llama_cpp
        _quiet(lib)
        lib.llama_backend_init()
        self.gguf, self.threads, self.kv_type = Path(gguf), threads, kv_type
        self.model = lib.llama_model_load_from_file(str(gguf).encode(),
                                                    lib.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))

    def close(self) -> None:
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None

    def config(self) -> dict:
        lib = self.lib
        return {"gguf": str(self.gguf), "weights": "F32", "kv_cache_dtype": self.kv_type,
                "threads": self.threads, "flash_attention": "llama.cpp's default (auto)", "llama_cpp_python": getattr(lib, "__version__", None),
                "system_info": lib.llama_print_system_info().decode().strip()}

    def _context(self, num_seqs: int, max_len: int, prompt_tokens: int):
        lib = self.lib
        p = lib.llama_context_default_params()
        p.n_ctx = num_seqs * max_len
        p.n_batch = max(prompt_tokens, num_seqs)     # every prompt in one llama_decode
        p.n_seq_max = num_seqs
        p.n_threads = p.n_threads_batch = self.threads
        p.type_k = p.type_v = KV_TYPES[self.kv_type]
        ctx = lib.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {num_seqs} sequences "
                               f"of {max_len} tokens")
        return ctx

    def _decode(self, ctx, batch, rows: int) -> tuple:
        """One llama_decode; (the argmax of each of the `rows` logits it outputs, seconds
        inside llama_decode)."""
        import numpy as np

        t0 = time.perf_counter()
        rc = self.lib.llama_decode(ctx, batch)
        seconds = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(ctx),
                                       shape=(rows, self.n_vocab))             # [rows, vocab]
        return logits.argmax(axis=1), seconds

    def run(self, prompts: list[list[int]], gen_len: int) -> GreedyRun:
        """Greedy `gen_len` tokens per prompt (EOS is just another token), all at once."""
        import numpy as np

        lib = self.lib
        if not prompts or not prompts[0] or any(len(p) != len(prompts[0]) for p in prompts):
            raise ValueError(f"prompts must be non-empty token lists of one length, got lengths "
                             f"{sorted({len(p) for p in prompts})}")
        if gen_len < 2:
            raise ValueError(f"gen_len must be >= 2 (one token from the prefill, at least one "
                             f"decode step), got {gen_len}")
        num_seqs, prompt_len = len(prompts), len(prompts[0])
        n_prompt = num_seqs * prompt_len
        ctx = self._context(num_seqs, prompt_len + gen_len, n_prompt)
        prefill = lib.llama_batch_init(n_prompt, 0, 1)
        step = lib.llama_batch_init(num_seqs, 0, 1)
        try:
            # sequence ids and output flags are fixed; tokens and positions change
            for b, n, seq_of in ((prefill, n_prompt, lambda j: j // prompt_len),
                                 (step, num_seqs, lambda j: j)):
                for j in range(n):
                    b.n_seq_id[j] = 1
                    b.seq_id[j][0] = seq_of(j)
                b.n_tokens = n
            flags = np.ctypeslib.as_array(prefill.logits, shape=(n_prompt,))
            flags[:] = 0
            flags[prompt_len - 1::prompt_len] = 1       # logits of each prompt's last token
            np.ctypeslib.as_array(step.logits, shape=(num_seqs,))[:] = 1
            step_tokens = np.ctypeslib.as_array(step.token, shape=(num_seqs,))
            step_pos = np.ctypeslib.as_array(step.pos, shape=(num_seqs,))
            out = np.empty((num_seqs, gen_len), dtype=np.int64)

            t0 = time.perf_counter()
            np.ctypeslib.as_array(prefill.token, shape=(n_prompt,))[:] = np.asarray(
                prompts).reshape(-1)
            np.ctypeslib.as_array(prefill.pos, shape=(n_prompt,))[:] = np.tile(
                np.arange(prompt_len), num_seqs)
            out[:, 0], _ = self._decode(ctx, prefill, num_seqs)
            t_first = time.perf_counter()
            inside = 0.0
            for i in range(1, gen_len):
                step_tokens[:] = out[:, i - 1]
                step_pos[:] = prompt_len + i - 1
                out[:, i], seconds = self._decode(ctx, step, num_seqs)
                inside += seconds
            t_end = time.perf_counter()
            threads = lib.llama_n_threads(ctx)
        finally:
            lib.llama_batch_free(prefill)
            lib.llama_batch_free(step)
            lib.llama_free(ctx)
        # the time inside llama_decode: without the argmax and the Python around it
        inner = {"llama_decode_ms_per_step": 1e3 * inside / (gen_len - 1)}
        return GreedyRun(tokens=out.tolist(), prefill_seconds=t_first - t0,
                         decode_seconds=t_end - t_first, decode_tokens=num_seqs * (gen_len - 1),
                         prompt_tokens=n_prompt, config={**self.config(), "threads": threads},
                         measured=inner)


# ---- the bench -------------------------------------------------------------------------------

def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def llama_cpp_skip_reason(model_name: str) -> str | None:
    """Why llama.cpp cannot run `model_name` here (with what to do about it), or None."""
    from llmlab.weights import BUILTIN

    if import_llama_cpp() is None:
        return (f"llama-cpp-python (the optional extra) is not installed. Add it (it compiles "
                f"llama.cpp, about ten minutes) with\n    {install_command()}\nor, in a "
                f"checkout, `make llamacpp`.")
    if model_name not in BUILTIN:
        return (f"it runs the GGUF files of the built-in models {sorted(BUILTIN)}, and "
                f"--model is {model_name!r}")
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
    ap = argparse.ArgumentParser(prog="python -m llmlab bench llamacpp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default=DEFAULT_BATCHES, help="batch sizes, comma-separated")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per sequence")
    ap.add_argument("--gen-len", type=int, default=128, help="generated tokens per sequence")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every system and batch")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for both systems (default: torch's thread count)")
    ap.add_argument("--kv-type", default="f32", choices=sorted(KV_TYPES),
                    help="llama.cpp's KV cache element (llmlab's is float32)")
    ap.add_argument("--model", default="smollm2-135m",
                    help="model name; 'tiny' for the random tiny model (llmlab only)")
    ap.add_argument("--json", default="build/bench-llamacpp.json", help="output path")
    args = ap.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        raise ValueError(f"--batches must be comma-separated integers, got {args.batches!r}") from None
    if not args.batches or min(args.batches) < 1:
        raise ValueError(f"--batches must be integers >= 1, got {args.batches}")
    for name in ("prompt_len", "gen_len", "rounds"):
        low = {"prompt_len": 16, "gen_len": 2, "rounds": 1}[name]
        if getattr(args, name) < low:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, "
                             f"got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print the table; write the JSON. Returns 0."""
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llmlab.doctor import cpu_name

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    model, tokenizer = load_model(args.model)
    max_seqs = max(args.batches)
    work = build_workload(tokenizer, max_seqs, args.prompt_len)

    llama = None
    skipped = llama_cpp_skip_reason(args.model)
    if skipped:
        print(f"llama.cpp: skipped, {skipped}", flush=True)
    else:
        print("llama.cpp: F32 GGUF (made once from the shipped Q4_1 file) ...", flush=True)
        llama = LlamaCpp(f32_gguf(args.model, threads), threads, args.kv_type)
    systems = {"llmlab": lambda prompts: run_llmlab(model, prompts, args.gen_len)}
    if llama is not None:
        systems["llama.cpp"] = lambda prompts: llama.run(prompts, args.gen_len)

    warm = [work[0]]                   # compiles llmlab's kernels, pages both models in
    for run in systems.values():
        run(warm)
    runs: dict[str, dict[int, list[GreedyRun]]] = {s: {b: [] for b in args.batches}
                                                    for s in systems}
    loads = []
    for r in range(args.rounds):
        for i, b in enumerate(args.batches):
            order = list(systems) if (r + i) % 2 == 0 else list(reversed(systems))
            for name in order:
                gc.collect()
                res = systems[name](work[:b])
                runs[name][b].append(res)
                s = res.summary()
                print(f"  round {r + 1} batch {b:>3} {name:<10} decode "
                      f"{s['decode_tok_per_s']:8.1f} tok/s ({s['ms_per_decode_step']:6.1f} ms/step)"
                      f"  total {s['total_tok_per_s']:8.1f} tok/s", flush=True)
            loads.append(os.getloadavg()[0])

    report = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": threads,
                          "torch": torch.__version__, "python": platform.python_version(),
                          "load_average_1min": loads,
                          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                          "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")},
              "settings": {"model": args.model, "prompt_len": args.prompt_len,
                           "gen_len": args.gen_len, "rounds": args.rounds, "greedy": True,
                           "ignore_eos": True, "batches": args.batches},
              "skipped": {"llama.cpp": skipped.splitlines()[0]} if skipped else {},
              "config": {name: runs[name][args.batches[0]][0].config for name in systems},
              "results": {}}
    for b in args.batches:
        row = {}
        for name in systems:
            summaries = [x.summary() for x in runs[name][b]]
            row[name] = {k: statistics.median(s[k] for s in summaries) for k in summaries[0]}
            row[name]["rounds"] = summaries
        if llama is not None:
            ours, theirs = runs["llmlab"][b][0].tokens, runs["llama.cpp"][b][0].tokens
            same = [common_prefix(x, y) for x, y in zip(ours, theirs)]
            row["greedy_common_prefix"] = {"min": min(same), "median": statistics.median(same),
                                           "identical_sequences": sum(n == args.gen_len
                                                                      for n in same)}
            for key in ("decode_tok_per_s", "total_tok_per_s"):
                # each round's two runs were taken one right after the other: their ratio
                # sees the same machine, so the median is over those paired ratios
                paired = [a[key] / b[key] for a, b in zip(row["llmlab"]["rounds"],
                                                          row["llama.cpp"]["rounds"])]
                row[f"ratio_{key}"] = statistics.median(paired)
                row[f"ratio_{key}_rounds"] = paired
        report["results"][str(b)] = row
    if llama is not None:
        llama.close()
    print_table(report)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


def print_table(report: dict) -> None:
    m, s, cfg = report["machine"], report["settings"], report["config"]
    print(f"\n{m['cpu']}, {m['cores']} cores; {s['prompt_len']} prompt + {s['gen_len']} "
          f"generated tokens per sequence, greedy, EOS ignored; medians of {s['rounds']} "
          f"alternating rounds; load average {min(m['load_average_1min']):.2f}-"
          f"{max(m['load_average_1min']):.2f}")
    c = cfg["llmlab"]
    print(f"llmlab:    attention_backend={c['attention_backend']!r}, {c['dtype']} weights and "
          f"KV cache, {c['threads']} threads")
    if "llama.cpp" in cfg:
        c = cfg["llama.cpp"]
        print(f"llama.cpp: F32 GGUF, {c['kv_cache_dtype']} KV cache, {c['threads']} threads, "
              f"llama-cpp-python {c['llama_cpp_python']}")
    both = "llama.cpp" in cfg
    head = f"{'batch':>5} {'llmlab decode':>14}"
    if both:
        head += f" {'llama.cpp':>10} {'ratio':>6} {'llmlab total':>13} {'llama.cpp':>10} {'ratio':>6}"
        head += f" {'same greedy':>12}"
    else:
        head += f" {'llmlab total':>13}"
    print(head + "   (tok/s)")
    print("-" * len(head))
    for b, row in report["results"].items():
        ours = row["llmlab"]
        line = f"{b:>5} {ours['decode_tok_per_s']:>14.1f}"
        if both:
            theirs = row["llama.cpp"]
            g = row["greedy_common_prefix"]
            line += (f" {theirs['decode_tok_per_s']:>10.1f} {row['ratio_decode_tok_per_s']:>5.2f}x"
                     f" {ours['total_tok_per_s']:>13.1f} {theirs['total_tok_per_s']:>10.1f}"
                     f" {row['ratio_total_tok_per_s']:>5.2f}x"
                     f" {g['identical_sequences']:>5}/{b:<6}")
        else:
            line += f" {ours['total_tok_per_s']:>13.1f}"
        print(line)
    if both:
        print("ratio: llmlab / llama.cpp, median of each round's back-to-back pair. same greedy: "
              "sequences whose generated tokens are identical in both systems (float32 sums in "
              "a different order can flip a near-tie)")
