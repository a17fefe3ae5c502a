"""`python -m llmlab bench forward`: our forward vs transformers, time per decode token at batch 1.

Both models hold the same weights and run in this process with the same thread count; each
decodes the same greedy tokens after the same prompt, timed per step after a warm-up. Ours runs
twice: the readable model on the aten matmul transformers uses (the difference is then our
code), and the engine's CPU fast path (`llmlab.model_cpu`: C kernels, prepared weights).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


@torch.inference_mode()
def _time_ours(model, prompt_ids: list[int], steps: int, backend: str) -> list[float]:
    from llmlab.kvcache import ContiguousKVCache

    cache = ContiguousKVCache(model.config, 1, len(prompt_ids) + steps + 1)
    n = [len(prompt_ids)]
    times = []
    hidden = model(torch.tensor(prompt_ids), cache.positions(n), cache.context(n, backend))
    cache.advance(n)
    token = int(model.compute_logits(hidden[-1:]).argmax())
    for _ in range(steps):
        t0 = time.perf_counter()
        hidden = model(torch.tensor([token]), cache.positions([1]), cache.context([1], backend))
        cache.advance([1])
        token = int(model.compute_logits(hidden).argmax())
        times.append(time.perf_counter() - t0)
    return times


@torch.inference_mode()
def _time_hf(hf, prompt_ids: list[int], steps: int) -> list[float]:
    out = hf(torch.tensor([prompt_ids]), use_cache=True)
    past, token = out.past_key_values, int(out.logits[0, -1].argmax())
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = hf(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past, token = out.past_key_values, int(out.logits[0, -1].argmax())
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    from transformers import LlamaForCausalLM

    from llmlab.tools.doctor import cpu_name
    from llmlab.model import load_model
    from llmlab.model_cpu import cpu_model
    from llmlab.weights import model_dir

    ap = argparse.ArgumentParser(prog="python -m llmlab bench forward")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="build/bench-forward.json")
    args = ap.parse_args(argv)

    model, tok = load_model("smollm2-135m")
    fast = cpu_model(model)
    hf = LlamaForCausalLM.from_pretrained(model_dir("smollm2-135m"), dtype=torch.float32).eval()
    prompt = tok("The key idea behind a KV cache is")["input_ids"]
    _time_ours(model, prompt, 4, "torch"), _time_ours(fast, prompt, 4, "cpu")  # warm-up
    _time_hf(hf, prompt, 4)
    ours, ours_fast, theirs = [], [], []
    for _ in range(args.rounds):                                              # interleaved rounds
        ours += _time_ours(model, prompt, args.steps, "torch")
        ours_fast += _time_ours(fast, prompt, args.steps, "cpu")
        theirs += _time_hf(hf, prompt, args.steps)
    result = {"llmlab_ms_per_token": 1e3 * statistics.median(ours),
              "llmlab_cpu_ms_per_token": 1e3 * statistics.median(ours_fast),
              "transformers_ms_per_token": 1e3 * statistics.median(theirs),
              "machine": {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__},
              "steps": args.steps * args.rounds}
    result["ratio_transformers_over_llmlab"] = result["transformers_ms_per_token"] / result["llmlab_ms_per_token"]
    result["ratio_transformers_over_llmlab_cpu"] = (result["transformers_ms_per_token"]
                                                    / result["llmlab_cpu_ms_per_token"])
    print(f"decode, batch 1, median of {result['steps']} steps, {torch.get_num_threads()} threads on {cpu_name()}")
    print(f"  llmlab readable model (aten)   {result['llmlab_ms_per_token']:7.2f} ms/token")
    print(f"  llmlab CPU fast path           {result['llmlab_cpu_ms_per_token']:7.2f} ms/token")
    print(f"  transformers (aten matmul)     {result['transformers_ms_per_token']:7.2f} ms/token")
    print(f"  transformers / ours: {result['ratio_transformers_over_llmlab']:.2f}x (readable), "
          f"{result['ratio_transformers_over_llmlab_cpu']:.2f}x (fast path)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
