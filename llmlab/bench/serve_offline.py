"""`bench serve --compare-offline`: the same requests run in this process, `LLM.generate` at
saturation and the engine driven at the HTTP run's arrivals, so the server's cost shows."""

from __future__ import annotations

import time
from typing import Any

from llmlab.analysis import metrics
from llmlab.analysis.metrics import BenchmarkSummary
from llmlab.bench.serve_client import BenchRequest

# ---- against offline llmlab -------------------------------------------------------------------


def offline_llm(serve_args: list[str]) -> Any:
    """An `LLM` with the engine settings `python -m llmlab serve SERVE_ARGS` uses."""
    from llmlab import LLM
    from llmlab.serve.launch import engine_kwargs, load, parser

    args = parser().parse_args(serve_args)
    model, tokenizer = load(args.model)
    return LLM(model, tokenizer=tokenizer, **engine_kwargs(args))


def engine_prompt_ids(tokenizer: Any, req: BenchRequest, chat: bool) -> list[int]:
    """The token ids the server makes of this request's prompt."""
    if isinstance(req.prompt, list):
        return list(req.prompt)
    if chat:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": req.prompt}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer.encode(rendered))
    return list(tokenizer.encode(req.prompt))


def run_offline(
    llm: Any, prompts: list[list[int]], requests: list[BenchRequest], ignore_eos: bool
) -> dict[str, float]:
    """`LLM.generate` on the same requests at once: output tokens, seconds, tok/s."""
    params = _greedy_params(requests, ignore_eos)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"output_tokens": tokens, "seconds": seconds, "output_throughput": tokens / seconds}


def run_in_process(
    llm: Any,
    prompts: list[list[int]],
    requests: list[BenchRequest],
    rate: float,
    burstiness: float,
    seed: int,
    ignore_eos: bool,
    slo: dict[str, float] | None,
) -> BenchmarkSummary:
    """The engine driven at the same arrivals as the HTTP run (`metrics.run_with_arrivals`)."""
    params = _greedy_params(requests, ignore_eos)
    arrivals = metrics.arrival_times(len(requests), rate, burstiness, seed)
    outs, duration = metrics.run_with_arrivals(llm.llm_engine, prompts, params, arrivals)
    return metrics.summarize(outs, duration=duration, slo=slo)


def _greedy_params(requests: list[BenchRequest], ignore_eos: bool) -> list[Any]:
    """The sampling the HTTP client asks for (greedy, each request's output length)."""
    from llmlab import SamplingParams

    return [
        SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=ignore_eos)
        for r in requests
    ]
