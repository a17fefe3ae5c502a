"""Where a decode step's time goes (chapter 16): the host's share of a step, the operators a step
launches, and on a GPU what CUDA graphs take away.

- `count_ops(fn)`: the operators `fn()` runs that compute something (a `TorchDispatchMode` sees
  every aten operator; views and bare allocations launch no kernel on a GPU and are not counted).
- `decode_steps(llm, prompts, steps)`: the engine's decode steps, timed one by one, and the
  operators of one of them.
- `host_split(model)`: the same engine step on `model` and on its *skeleton* (`skeleton_config`:
  the same layers, heads and operators, with matrices so small that their arithmetic is nearly
  free). The skeleton's step is what the host costs (Python, the scheduler, building the inputs,
  dispatching each operator); the rest of the real step is arithmetic.
- `multi_step_gain(model)`: batch-1 decode with one forward per scheduling and with several
  (multi-step scheduling, `num_scheduler_steps`), alternated in one engine: what the host's
  work between two steps costs a token.
- `gpu_decode_split(model)`: on a CUDA GPU, a decode step eagerly and from CUDA graphs: wall
  time, GPU-busy time (the union of the kernels' intervals in `torch.profiler`'s trace) and
  kernels per step. None without a GPU.
- `decode_kernel_seconds(kernels)`: decode-attention functions timed on a GPU on one shape.
- `prompt_ids(lengths, vocab_size)`, `decode_prompts(batch, length, vocab_size)`: prompts of token
  ids for a model without a tokenizer.
- `gpu_run(name)`: figures this project measured on a GPU (`data/gpu_runs.json`), to set beside
  the reader's own.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import time
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llmlab.config import ModelConfig
from llmlab.paths import DATA_DIR
from llmlab.utils import best_of


def gpu_run(name: str = "h200-first") -> dict[str, Any]:
    """One recorded GPU run of `data/gpu_runs.json` (card, date, software and figures)."""
    runs = json.loads((DATA_DIR / "gpu_runs.json").read_text(encoding="utf-8"))["runs"]
    if name not in runs:
        raise ValueError(f"name: got {name!r}, expected one of {sorted(runs)}")
    return runs[name]


# ----------------------------------------------------------------------------- operators


def _computes(func: Any) -> bool:
    """False for an operator that only makes a view (its result aliases an input: no kernel on a
    GPU) or only allocates memory."""
    if any(r.alias_info is not None for r in func._schema.returns):
        return False
    return not func.__name__.startswith(("empty", "new_empty"))


class OpCounter(TorchDispatchMode):
    """Counts, by name, the aten operators that compute something while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _computes(func):
            self.counts[func.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def count_ops(fn: Callable[[], Any]) -> Counter[str]:
    """The operators `fn()` runs that compute something, counted by name."""
    with OpCounter() as counter:
        fn()
    return counter.counts


# ----------------------------------------------------------------------------- the engine's steps


def prompt_ids(lengths: list[int], vocab_size: int) -> list[list[int]]:
    """One prompt of token ids (from 3 to `vocab_size` - 1) per length, no two alike."""
    return [
        [3 + (7 * i + 13 * j) % (vocab_size - 3) for j in range(n)] for i, n in enumerate(lengths)
    ]


def decode_prompts(batch: int, length: int, vocab_size: int) -> list[list[int]]:
    """`batch` prompts of `length` token ids below `vocab_size`, no two alike."""
    return prompt_ids([length] * batch, vocab_size)


def decode_steps(
    llm: Any, prompts: list[list[int]], steps: int, count: bool = True
) -> dict[str, Any]:
    """Prefill `prompts` (greedy, one request each), then run `steps` decode steps of the engine
    one by one: {"seconds": per decode step, "ops": operators of the first decode step (None
    without `count`: on a GPU a step may capture a CUDA graph, which no dispatch mode may
    watch), "batch": requests in it}. Every step after the prefill is decode-only: the prompts
    are admitted together and none stops early (`ignore_eos`)."""
    from llmlab import SamplingParams

    if steps < 2:
        raise ValueError(f"steps: got {steps!r}, expected an int >= 2")
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"decode-step-{i}", p, params)
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    batch = len(engine.scheduler.running)
    ops = sum(count_ops(engine.step).values()) if count else None
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        seconds.append(time.perf_counter() - t0)
    while engine.has_unfinished_requests():
        engine.step()
    return {"seconds": seconds, "ops": ops, "batch": batch}


def skeleton_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg`'s skeleton: the same layers, heads, KV heads and tied embeddings (so the same
    operators run, in the same order), with a hidden size, head size, MLP and vocabulary so
    small that the arithmetic costs next to nothing."""
    return dataclasses.replace(
        cfg, name=f"{cfg.name}-skeleton", hidden_size=32, intermediate_size=32, head_dim=8,
        vocab_size=1024,
    )  # fmt: skip


def host_split(
    model: Any, batch: int = 1, steps: int = 16, prompt_len: int = 32, backend: str = "torch"
) -> dict[str, Any]:
    """A decode step of `model` split into what the host costs and what the arithmetic costs.

    Both engines run the same prompts with `attention_backend=backend` ("torch": the readable
    model, operator by operator, as a GPU engine launches them without fused layers). Returns
    seconds per decode step (the fastest of `steps`) for "step" (the model) and "host" (its
    skeleton), "compute" = step - host, "host_share", and "ops" / "ops_skeleton", the
    operators per step of each (equal when the skeleton is a fair stand-in)."""
    from llmlab import LLM
    from llmlab.model import random_model

    skeleton = random_model(skeleton_config(model.config), seed=0, device=model.device)
    prompts = decode_prompts(batch, prompt_len, skeleton.config.vocab_size)
    kw = dict(
        attention_backend=backend,
        max_model_len=prompt_len + steps + 8,
        max_num_seqs=batch,
        enable_prefix_caching=False,
    )
    real = decode_steps(LLM(model, None, **kw), prompts, steps)
    bare = decode_steps(LLM(skeleton, None, **kw), prompts, steps)
    step, host = min(real["seconds"]), min(bare["seconds"])
    return {
        "batch": batch,
        "step": step,
        "host": host,
        "compute": max(0.0, step - host),
        "host_share": min(1.0, host / step),
        "ops": real["ops"],
        "ops_skeleton": bare["ops"],
    }


def multi_step_gain(
    model: Any,
    num_scheduler_steps: int = 8,
    tokens: int = 160,
    rounds: int = 4,
    prompt_len: int = 32,
    **engine_kwargs: Any,
) -> dict[str, Any]:
    """Batch-1 greedy decode of `model` with one forward per scheduling and with
    `num_scheduler_steps` forwards per scheduling (multi-step scheduling), measured in one
    engine: `rounds` requests of `tokens` tokens each, the engine's setting switched between
    the two every 2 × `num_scheduler_steps` tokens (so a slow moment of the machine falls on
    both alike). `engine_kwargs` go to `LLM` (dtype, quantization). Returns seconds per token,
    the median over those spans, for "one" and "multi", "speedup" = one / multi, "saved" =
    one - multi (what the host's work between steps cost a token), "spans" (counted of each)
    and "tokens_per_step", the tokens an engine step brought in each (1 and up to K)."""
    from llmlab import LLM, SamplingParams

    if not isinstance(num_scheduler_steps, int) or num_scheduler_steps < 2:
        raise ValueError(f"num_scheduler_steps: got {num_scheduler_steps!r}, expected an int >= 2")
    span = 2 * num_scheduler_steps
    if not isinstance(tokens, int) or tokens < 2 * span + 1:
        raise ValueError(f"tokens: got {tokens!r}, expected an int >= {2 * span + 1}")
    llm = LLM(
        model,
        None,
        max_num_seqs=1,
        max_model_len=prompt_len + tokens + 8,
        num_scheduler_steps=num_scheduler_steps,
        **engine_kwargs,
    )
    engine = llm.llm_engine
    if engine.num_scheduler_steps != num_scheduler_steps:
        raise ValueError("multi-step scheduling runs on a CPU only: this engine runs on a GPU")
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    (prompt,) = decode_prompts(1, prompt_len, model.config.vocab_size)
    modes = (1, num_scheduler_steps)
    per_token: dict[int, list[float]] = {k: [] for k in modes}
    steps = dict.fromkeys(modes, 0)  # engine steps of the counted spans
    for r in range(rounds + 1):  # the first round warms the engine up and is not counted
        engine.add_request(f"multi-step-{r}", prompt, params)
        engine.step()  # the prefill
        for i in itertools.count():
            if not engine.has_unfinished_requests():
                break
            k = modes[(i + r) % 2]
            engine.num_scheduler_steps = k
            n, calls, t0 = 0, 0, time.perf_counter()
            while n < span and engine.has_unfinished_requests():
                n += sum(len(out.outputs[0].token_ids) for out in engine.step())
                calls += 1
            if r > 0 and n == span:
                per_token[k].append((time.perf_counter() - t0) / n)
                steps[k] += calls
    engine.num_scheduler_steps = num_scheduler_steps
    one, multi = (statistics.median(per_token[k]) for k in modes)
    return {
        "num_scheduler_steps": num_scheduler_steps,
        "one": one,
        "multi": multi,
        "speedup": one / multi,
        "saved": one - multi,
        "spans": min(len(v) for v in per_token.values()),
        "tokens_per_step": {k: span * len(per_token[k]) / steps[k] for k in modes},
    }


# ----------------------------------------------------------------------------- on a GPU


def gpu_busy(fn: Callable[[], Any], repeats: int = 5) -> dict[str, float]:
    """Run `fn()` `repeats` times under `torch.profiler` (CUDA activity): per call, the seconds
    of wall time, the seconds the GPU was running something (the union of the intervals of its
    kernels and copies, so overlapping ones count once) and the kernels and copies launched."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    spans = [
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]  # microseconds
    return {
        "wall": wall / repeats,
        "busy": covered(spans) * 1e-6 / repeats,
        "kernels": len(spans) / repeats,
    }


def covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals (start, end): time during which at least one
    of them runs, overlaps counted once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def gpu_decode_split(
    model: Any, batch: int = 1, steps: int = 20, prompt_len: int = 32
) -> dict[str, dict[str, float]] | None:
    """On a CUDA GPU: `model`'s decode step run eagerly (`enforce_eager=True`) and replayed
    from CUDA graphs, each {"step": seconds per step (the fastest of `steps`), "busy": GPU-busy
    seconds per step, "kernels": kernels and copies per step (`gpu_busy`)}. None when this
    machine has no CUDA GPU."""
    if not torch.cuda.is_available():
        return None
    from llmlab import LLM

    prompts = decode_prompts(batch, prompt_len, model.config.vocab_size)
    out = {}
    for name, eager in (("eager", True), ("graphs", False)):
        llm = LLM(
            model,
            None,
            device="cuda",
            enforce_eager=eager,
            max_model_len=prompt_len + 3 * steps + 8,
            max_num_seqs=batch,
        )
        timed = decode_steps(llm, prompts, steps, count=False)  # warms up the kernels too
        profiled = _profiled_decode_steps(llm, prompts, steps)
        out[name] = {"step": min(timed["seconds"]), **profiled}
        del llm
        torch.cuda.empty_cache()
    return out


def _profiled_decode_steps(llm: Any, prompts: list[list[int]], steps: int) -> dict[str, float]:
    """GPU-busy seconds and kernels per decode step, from the profiler over `steps` steps."""
    from llmlab import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=2 * steps, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"profiled-{i}", p, params)
    for _ in range(2):  # the prefill, then a first decode step
        engine.step()
    found = gpu_busy(engine.step, repeats=steps)
    while engine.has_unfinished_requests():
        engine.step()
    return {"busy": found["busy"], "kernels": found["kernels"]}


def decode_kernel_seconds(
    kernels: dict[str, Callable],
    num_seqs: int = 8,
    context: int = 2048,
    num_heads: int = 9,
    num_kv_heads: int = 3,
    head_dim: int = 64,
    block_size: int = 16,
) -> dict[str, float] | None:
    """Each decode-attention function of `kernels` (name -> a function with the arguments of
    `llmlab.ops.paged_attention_decode`) timed on a CUDA GPU on one float32 batch: `num_seqs`
    sequences of `context` cached tokens in shuffled blocks, SmolLM2-135M's heads by default.
    Seconds per call (the fastest of several, after a warm-up that compiles). None without a GPU."""
    if not torch.cuda.is_available():
        return None
    g = torch.Generator(device="cuda").manual_seed(0)
    width = -(-context // block_size)
    num_blocks = num_seqs * width
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, device="cuda", generator=g)
    value_cache = torch.randn(shape, device="cuda", generator=g)
    perm = torch.randperm(num_blocks, device="cuda", generator=g)
    tables = perm.view(num_seqs, width).to(torch.int32)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device="cuda")
    query = torch.randn(num_seqs, num_heads, head_dim, device="cuda", generator=g)
    args = (query, key_cache, value_cache, tables, seq_lens, head_dim**-0.5)
    return {
        name: best_of(lambda f=fn: f(*args), 20, warmup=3, sync=torch.cuda.synchronize)
        for name, fn in kernels.items()
    }
