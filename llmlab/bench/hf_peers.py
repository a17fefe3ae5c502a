"""transformers as `bench throughput`'s peer: `generate` one request at a time
(hf-sequential) and on left-padded batches (hf-static), its own continuous batching
(hf-continuous), on a `LlamaForCausalLM` holding llmlab's very weights (`hf_twin`). Each runner
takes (model, work, batch_size) and returns the output tokens it produced."""

from __future__ import annotations

import contextlib
import time

import torch

from llmlab.utils import cdiv


def generate_one(hf, ids: list[int], max_new_tokens: int, **generate_kwargs) -> list[int]:
    """transformers' greedy `generate` of one unpadded prompt: the new token ids.
    `generate_kwargs` go to `generate` (eos_token_id, min_new_tokens, pad_token_id, ...)."""
    x = torch.tensor([ids], device=hf.device)
    y = hf.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        **{"pad_token_id": 2, **generate_kwargs},
    )
    return y[0, len(ids) :].tolist()


def run_hf_sequential(hf, work, batch_size: int) -> int:
    with torch.inference_mode():
        return sum(len(generate_one(hf, ids, n, eos_token_id=None)) for ids, n in work)


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
                x.to(hf.device),
                attention_mask=mask.to(hf.device),
                max_new_tokens=longest,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
            produced = y.shape[1] - width
            # every row ran `produced` steps; only each request's own length is useful output
            total += sum(min(n, produced) for _, n in batch)
    return total


def hf_continuous_api(hf) -> str | None:
    """The transformers API `run_hf_continuous` drives, named, or None where this version lacks
    it (the model's `continuous_batching_context_manager` and `ContinuousBatchingConfig`)."""
    import transformers

    if hasattr(hf, "continuous_batching_context_manager") and hasattr(
        transformers, "ContinuousBatchingConfig"
    ):
        return (
            f"transformers {transformers.__version__}: continuous_batching_context_manager, "
            "ContinuousBatchingConfig"
        )
    return None


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
        # the manager is built, warmed up (on a GPU: its CUDA graphs captured) and started:
        # its start-up, like llmlab's, is not timed; nor is its stopping after the last result
        t0 = time.perf_counter()
        ids = [manager.add_request(p, max_new_tokens=n) for p, n in work]
        while len(results) < len(ids):
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                results[r.request_id] = r
            elif r is None and not manager.is_running():
                raise RuntimeError("transformers' continuous batching manager stopped early")
        run_hf_continuous.seconds = time.perf_counter() - t0
    return sum(len(results[i].generated_tokens) for i in ids)


def hf_twin(model):
    """transformers' LlamaForCausalLM holding `model`'s weights (the same tensors, shared, not
    copied), on its device and in its dtype."""
    import transformers

    config = transformers.LlamaConfig(**model.config.to_hf_dict())
    # built where it will run (a 1.7B model drawn on the host first takes a minute); a device
    # context slows every call inside it, so the CPU goes without one
    place = torch.device(model.device) if model.device.type != "cpu" else contextlib.nullcontext()
    with place, _default_dtype(model.dtype):
        hf = transformers.LlamaForCausalLM(config)
    # our names are transformers' inside its `model.` (all but the LM head)
    state = {
        (k if k.startswith("lm_head") else f"model.{k}"): v for k, v in model.state_dict().items()
    }
    hf.load_state_dict(state, strict=False, assign=True)
    hf.tie_weights()
    return hf.eval()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Build a module's parameters in `dtype` (its float32 buffers, RoPE's, stay float32)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)
