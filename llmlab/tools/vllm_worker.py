"""Runs inside vLLM's own environment (`make vllm`), never imported by llmlab: it needs only vLLM
and the standard library. `llmlab.tools.vllm_bridge` starts it as a script, writes one JSON job to its
stdin and reads one JSON line from its stdout.

A job: {"model": <folder>, "prompts": [[token ids], ...], "max_tokens": N or [N per prompt],
"max_num_seqs": B, "max_model_len": L, "enforce_eager": bool, "repeat": bool, "warmup": bool}. The answer: each prompt's greedy
token ids, the seconds the generate call took, and what vLLM says about itself (its KV blocks
and block size, the token budget of a step, prefix-cache hits, preemptions).
"""

import json
import os
import sys
import time


def _engine_facts(llm):
    """What vLLM reports about the engine it built, as plain numbers (None where this version
    keeps it elsewhere)."""
    facts = {}
    config = getattr(llm.llm_engine, "vllm_config", None)
    if config is not None:
        facts["block_size"] = config.cache_config.block_size
        facts["num_gpu_blocks"] = config.cache_config.num_gpu_blocks
        facts["max_num_batched_tokens"] = config.scheduler_config.max_num_batched_tokens
        facts["max_num_seqs"] = config.scheduler_config.max_num_seqs
        facts["enable_prefix_caching"] = config.cache_config.enable_prefix_caching
        facts["enable_chunked_prefill"] = getattr(
            config.scheduler_config, "enable_chunked_prefill", None
        )
    try:
        metrics = {m.name: m for m in llm.get_metrics()}
    except Exception:  # older or newer versions without the metrics API: report what we have
        metrics = {}
    for key, name in (
        ("prefix_cache_queries", "vllm:prefix_cache_queries"),
        ("prefix_cache_hits", "vllm:prefix_cache_hits"),
        ("num_preemptions", "vllm:num_preemptions"),
    ):
        m = metrics.get(name)
        facts[key] = getattr(m, "value", None) if m is not None else None
    return facts


def main():
    job = json.loads(sys.stdin.read())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gib", 1)))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(
        model=job["model"],
        dtype="float32",
        max_model_len=job.get("max_model_len", 1024),
        max_num_seqs=job.get("max_num_seqs", 64),
        enforce_eager=job.get("enforce_eager", True),
        disable_log_stats=False,
        seed=0,
    )
    load_s = time.perf_counter() - t0
    lengths = job["max_tokens"]
    lengths = lengths if isinstance(lengths, list) else [lengths] * len(job["prompts"])
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    if job.get("warmup"):  # as the benchmark warms every system: a short prompt, 2 tokens
        llm.generate(
            [TokensPrompt(prompt_token_ids=job["prompts"][0][:16])],
            SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
            use_tqdm=False,
        )
    runs = []
    for _ in range(2 if job.get("repeat") else 1):  # the second run: warm, and prefix-cached
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs.append(time.perf_counter() - t0)
    answer = {
        "version": __import__("vllm").__version__,
        "load_s": load_s,
        "generate_s": runs,
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        "engine": _engine_facts(llm),
    }
    sys.stdout.write("LLMLAB-VLLM " + json.dumps(answer) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":  # vLLM starts its engine core in a spawned process
    main()
