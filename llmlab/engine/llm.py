"""`LLM`: vLLM's offline entry point. Build once, call `generate` on a list of prompts."""

from __future__ import annotations

from typing import Any

import torch

from llmlab.config.engine import check_device
from llmlab.engine.llm_engine import LLMEngine
from llmlab.engine.outputs import RequestOutput
from llmlab.i18n import tr
from llmlab.model import LlamaModel
from llmlab.sampling import SamplingParams


class LLM:
    """An inference engine over one model.

    model: a model name or Hugging Face directory (loaded with `llmlab.model.load_model`), or
    an already built `LlamaModel` (then `tokenizer` is optional: without one, prompts must be
    token ids). Every other keyword argument is an `EngineConfig` setting, with its default
    there: block_size, num_kv_blocks, max_model_len, max_num_seqs, max_num_batched_tokens,
    enable_chunked_prefill, enable_prefix_caching, block_pool_cls (None: the package's
    `BlockPool`; or a block pool class with its interface, chapter 11's build exercise),
    attention_backend (None: the fastest here, what the benchmarks measure; "torch" for the
    readable model), seed, scheduling,
    kv_cache_memory_bytes, dtype ("auto", "float32", "bfloat16"), quantization (None, "int8"),
    kv_cache_dtype ("auto", "fp8"), speculative_config (vLLM's dict: {"method": "ngram",
    "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4}, or
    {"method": "draft_model", "num_speculative_tokens": 3, "draft_num_layers": 8}),
    scheduler_cls (None: the package's `Scheduler`; else a subclass of it, or a class with its
    interface, that the engine builds and steps instead: how chapter 08's and 11's build
    exercises plug the student's scheduler into the real engine), structured_outputs_backend
    (None: xgrammar; else spec -> matcher, as chapter 15 plugs in the student's mask),
    device (None: "cuda" where a CUDA GPU is present, else "cpu"), enforce_eager (True: no
    CUDA graphs), num_scheduler_steps (1; K: up to K forwards per scheduled step, multi-step
    scheduling).
    """

    def __init__(
        self, model: str | LlamaModel = "smollm2-135m", tokenizer: Any = None, **engine_kwargs: Any
    ) -> None:
        if isinstance(model, str):
            from llmlab.model import load_model

            if engine_kwargs.get("device") is None:  # vLLM's default: the GPU where there is one
                engine_kwargs["device"] = "cuda" if torch.cuda.is_available() else "cpu"
            check_device(engine_kwargs["device"])
            model, loaded_tokenizer = load_model(model, device=engine_kwargs["device"])
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
        elif not isinstance(model, LlamaModel):
            raise ValueError(
                f"model must be a model name, a directory or a LlamaModel, "
                f"got {type(model).__name__}"
            )
        self.llm_engine = LLMEngine(model, tokenizer, **engine_kwargs)
        self._counter = 0

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order.

        prompts: one str, a list of str, or a list of token-id lists. sampling_params: one for
        all, or one per prompt (default: `SamplingParams()`). A bad prompt or parameter raises
        ValueError before anything runs; requests already in the engine keep their place.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(
                tr(
                    f"prompts must be a list of str or of token-id lists, "
                    f"got {type(prompts).__name__}",
                    f"prompts 必须是 str 的列表，或 token id 列表的列表；你给的是 {type(prompts).__name__}",
                )
            )
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(
                    tr(
                        f"sampling_params has {len(params_list)} entries for "
                        f"{len(prompts)} prompts; give one, or one per prompt",
                        f"sampling_params 有 {len(params_list)} 项，而 prompt 有 {len(prompts)} 个；"
                        "请只给一个，或者每个 prompt 各给一个",
                    )
                )
        engine = self.llm_engine
        ids: list[str] = []
        try:
            for prompt, params in zip(prompts, params_list):
                request_id = str(self._counter)
                self._counter += 1
                engine.add_request(request_id, prompt, params)
                ids.append(request_id)
        except ValueError:
            for request_id in ids:  # leave the engine as it was
                engine.abort_request(request_id)
            raise
        wanted = set(ids)
        requests = {rid: engine.requests[rid] for rid in ids}
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="Generating", unit="req", dynamic_ncols=True)
        remaining = len(ids)
        try:
            while remaining and engine.has_unfinished_requests():
                for delta in engine.step():
                    if delta.finished and delta.request_id in wanted:
                        remaining -= 1
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return [engine.make_output(requests[rid]) for rid in ids]
