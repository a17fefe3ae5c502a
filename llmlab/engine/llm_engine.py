"""The engine loop: requests in, one scheduled step at a time, tokens out.

`LLMEngine` owns a `Scheduler` (which requests run this step, KV blocks from a
`KVCacheManager`) and a `ModelRunner` (one forward over the flat batch). Each `step()`:

1. `scheduler.schedule()` → a `SchedulerOutput`;
2. `model_runner.execute_model(...)` → one token per request that is caught up;
3. `scheduler.update_from_output(...)` appends them, checks stop conditions, frees finished
   requests' blocks;
4. returns a delta `RequestOutput` per request that got a token (streaming).
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from llmlab import ops
from llmlab.detokenizer import IncrementalDetokenizer
from llmlab.engine.allocator import keep_freed_memory
from llmlab.engine.model_runner import ModelRunner
from llmlab.engine.outputs import CompletionOutput, RequestOutput
from llmlab.engine.scheduler import Scheduler, SchedulerOutput
from llmlab.engine_config import (
    DEFAULT_MAX_MODEL_LEN,
    DTYPES,
    SCHEDULER_INTERFACE,  # noqa: F401  (re-exported: where the engine says what it calls)
    EngineConfig,
    SpeculativeConfig,
    check_scheduler_cls,  # noqa: F401
    resolve_device,
)
from llmlab.i18n import tr
from llmlab.kvcache.manager import KVCacheManager
from llmlab.model import LlamaModel
from llmlab.request import Request, RequestStatus
from llmlab.sampling import SamplingParams, make_generator
from llmlab.utils import cdiv

STEP_OVERHEAD_HISTORY = 10_000  # steps whose scheduling overhead `step_overheads` keeps


def prepare_model(model: LlamaModel, config: EngineConfig) -> LlamaModel:
    """`model` on the config's device, in its dtype and quantization: `model` itself when
    nothing changes, else a converted copy (the caller's model is left as it was). On a GPU,
    dtype "auto" runs a float32 model in bfloat16 (what a GPU computes fast; SmolLM2's own
    weights are bfloat16)."""
    device = resolve_device(config.device, model.device)
    dtype = DTYPES[config.dtype]
    if dtype is None and device.type == "cuda" and model.dtype == torch.float32:
        dtype = torch.bfloat16
    if device != model.device or (dtype is not None and dtype != model.dtype):
        model = _copy_to(model, device, dtype or model.dtype)
    if config.quantization == "int8":
        from llmlab.quantization import quantize_model_int8

        model = quantize_model_int8(model)
    return model


def _copy_to(model: LlamaModel, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    """A copy of `model` on `device` in `dtype`, made without a second copy on the host when the
    device is another one (the layers are built on "meta" and take the converted weights)."""
    if device == model.device:
        return copy.deepcopy(model).to(dtype)
    with torch.device("meta"):
        moved = LlamaModel(model.config)
    state = {k: v.to(device=device, dtype=dtype) for k, v in model.state_dict().items()}
    moved.load_state_dict(state, assign=True)
    if model.config.tie_word_embeddings:
        moved.lm_head.weight = moved.embed_tokens.weight
    moved.inv_freq = model.inv_freq.to(device)
    return moved.eval()


def calibration_token_ids(model: LlamaModel, tokenizer: Any, max_tokens: int = 256) -> list[int]:
    """The tokens an fp8 cache's scales are measured on: the start of data/text/inference_en.txt
    (with a tokenizer), else a fixed pseudo-random sequence."""
    if tokenizer is not None:
        text = Path(__file__).resolve().parents[2] / "data" / "text" / "inference_en.txt"
        return list(tokenizer.encode(text.read_text()))[:max_tokens]
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (max_tokens,), generator=g).tolist()


def resolve_attention_backend(name: str | None, model: LlamaModel) -> str:
    """The backend an engine on `model` runs: `name`, checked to run here, or for None the
    fastest one that does. Only "cpu" compiles anything (its C kernels)."""
    if name is None:
        if model.device.type == "cuda":
            return "triton" if ops.backend_available("triton")[0] else "torch"
        from llmlab.model_cpu import cpu_model_applies

        return "cpu" if cpu_model_applies(model)[0] else "torch"
    ok, why = ops.backend_available(name)
    if ok and name == "cpu":
        from llmlab.model_cpu import cpu_model_applies

        ok, why = cpu_model_applies(model)
    if not ok:
        raise ValueError(f"attention_backend {name!r} cannot run here: {why}")
    return name


def kv_bytes_per_block(
    model: LlamaModel, block_size: int, kv_dtype: torch.dtype | None = None
) -> int:
    """Bytes of one block of K and V over all layers (in `kv_dtype`, default the model's)."""
    cfg = model.config
    elem = torch.empty((), dtype=kv_dtype or model.dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


class LLMEngine:
    """Continuous-batching inference engine over our `LlamaModel` with a paged KV cache.

    model: a `LlamaModel`. tokenizer: a Hugging Face tokenizer, or None (then prompts must be
    token ids and outputs carry no text). The other arguments are `EngineConfig`'s; see
    `llmlab.LLM` for their meaning.
    """

    def __init__(self, model: LlamaModel, tokenizer: Any = None, **kwargs: Any) -> None:
        if not isinstance(model, LlamaModel):
            raise ValueError(
                f"model must be an llmlab.model.LlamaModel, got {type(model).__name__}"
            )
        config = EngineConfig(**kwargs)
        model = prepare_model(model, config)
        self.config = config = replace(
            config, attention_backend=resolve_attention_backend(config.attention_backend, model)
        )
        keep_freed_memory()  # steps reuse memory instead of page-faulting it in again
        self.model = model
        self.device = model.device
        self.tokenizer = tokenizer
        mcfg = model.config
        self.vocab_size = mcfg.vocab_size
        if config.max_model_len is None:
            self.max_model_len = min(mcfg.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        else:
            if config.max_model_len > mcfg.max_position_embeddings:
                raise ValueError(
                    f"max_model_len must be <= the model's max_position_embeddings="
                    f"{mcfg.max_position_embeddings}, got {config.max_model_len}"
                )
            self.max_model_len = config.max_model_len
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens must be >= max_model_len={self.max_model_len} when "
                f"enable_chunked_prefill is False (a whole prompt must fit in one step), got "
                f"{config.max_num_batched_tokens}"
            )
        bs = config.block_size
        blocks_per_seq = cdiv(self.max_model_len, bs)
        if config.num_kv_blocks is None:
            # enough for max_num_seqs requests of max_model_len, capped by the memory budget
            wanted = config.max_num_seqs * blocks_per_seq
            affordable = config.kv_cache_memory_bytes // kv_bytes_per_block(
                model, bs, config.torch_kv_cache_dtype
            )
            self.num_kv_blocks = max(min(wanted, affordable), blocks_per_seq)
        else:
            self.num_kv_blocks = config.num_kv_blocks
        if self.num_kv_blocks < blocks_per_seq:
            raise ValueError(
                f"num_kv_blocks={self.num_kv_blocks} cannot hold even one request of "
                f"max_model_len={self.max_model_len} (needs {blocks_per_seq} blocks of "
                f"{bs} tokens); raise num_kv_blocks or lower max_model_len"
            )
        self.eos_token_ids = _eos_ids(mcfg.eos_token_id, tokenizer)

        self.kv_cache_manager = KVCacheManager(
            self.num_kv_blocks,
            bs,
            enable_caching=config.enable_prefix_caching,
            block_pool=config.block_pool_cls,
        )
        scheduler_kwargs = dict(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            scheduling=config.scheduling,
        )
        kv_scales = None
        if config.torch_kv_cache_dtype is not None and config.kv_cache_dtype == "fp8":
            from llmlab.quantization import kv_scales as measure_kv_scales

            kv_scales = measure_kv_scales(model, calibration_token_ids(model, tokenizer))
        runner_args = (
            model,
            self.kv_cache_manager,
            self.num_kv_blocks,
            bs,
            config.attention_backend,
        )
        runner_kwargs = dict(
            default_generator=make_generator(config.seed, self.device),
            kv_cache_dtype=config.torch_kv_cache_dtype,
            kv_scales=kv_scales,
            max_num_seqs=config.max_num_seqs,
            max_model_len=self.max_model_len,
            enforce_eager=config.enforce_eager,
        )
        # speculation is a second scheduler, runner and step, chosen here, once
        self.speculative_config = spec = SpeculativeConfig.from_value(config.speculative_config)
        if spec is None:
            scheduler_cls = config.scheduler_cls or Scheduler
            self.scheduler = scheduler_cls(self.kv_cache_manager, **scheduler_kwargs)
            self.model_runner = ModelRunner(*runner_args, **runner_kwargs)
        else:
            from llmlab.engine.spec_decode.engine import spec_step
            from llmlab.engine.spec_decode.setup import build_spec_decode

            self._spec_step = spec_step
            self.scheduler, self.model_runner = build_spec_decode(
                spec, model, self.kv_cache_manager, scheduler_kwargs, runner_args, runner_kwargs
            )
        self.requests: dict[str, Request] = {}  # every unfinished request by id
        # True: every request's text is built token by token and each step's delta output
        # carries its new text (a server streaming text sets it); False: only requests with
        # stop strings are detokenized as they go, the others once at the end
        self.detokenize_incrementally = False
        self.last_scheduler_output: SchedulerOutput | None = None
        self.forward_seconds = 0.0
        # the latest steps: (seconds in schedule() + update_from_output(), requests scheduled)
        self.step_overheads: deque[tuple[float, int]] = deque(maxlen=STEP_OVERHEAD_HISTORY)

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> Request:
        """Queue a request. Raises ValueError (nothing queued) for a bad prompt or parameters."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(
                tr(
                    f"request_id must be a non-empty str, got {request_id!r}",
                    f"request_id 必须是非空的 str，你给的是 {request_id!r}",
                )
            )
        if request_id in self.requests:
            raise ValueError(
                tr(
                    f"request_id {request_id!r} is already in use by an unfinished request",
                    f"request_id {request_id!r} 已经被一个尚未完成的请求占用",
                )
            )
        if not isinstance(params, SamplingParams):
            raise ValueError(
                tr(
                    f"params must be a SamplingParams, got {type(params).__name__}",
                    f"params 必须是 SamplingParams，你给的是 {type(params).__name__}",
                )
            )
        params.validate()
        text = None
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    tr(
                        "prompt is a str but this engine has no tokenizer; "
                        "pass token ids (list[int])",
                        "prompt 是 str，但这个引擎没有分词器；请传 token id（list[int]）",
                    )
                )
            text = prompt
            token_ids = list(self.tokenizer.encode(prompt))
        elif isinstance(prompt, (list, tuple)):
            token_ids = list(prompt)
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
                raise ValueError(
                    tr(
                        "prompt must be a str or a list of int token ids",
                        "prompt 必须是 str，或由 int token id 组成的列表",
                    )
                )
        else:
            raise ValueError(
                tr(
                    f"prompt must be a str or a list of int token ids, got {type(prompt).__name__}",
                    f"prompt 必须是 str，或由 int token id 组成的列表；你给的是 {type(prompt).__name__}",
                )
            )
        if not token_ids:
            raise ValueError(
                tr(
                    f"prompt must not be empty (request {request_id!r})",
                    f"prompt 不能为空（请求 {request_id!r}）",
                )
            )
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                tr(
                    f"prompt token ids must be in [0, {self.vocab_size}), got {bad[:5]}",
                    f"prompt 的 token id 必须在 [0, {self.vocab_size}) 之内，你给的有 {bad[:5]}",
                )
            )
        bad = [t for t in params.stop_token_ids or () if t >= self.vocab_size]
        if bad:
            raise ValueError(
                tr(
                    f"SamplingParams.stop_token_ids must be in [0, {self.vocab_size}), "
                    f"got {bad[:5]}",
                    f"SamplingParams.stop_token_ids 必须在 [0, {self.vocab_size}) 之内，"
                    f"你给的有 {bad[:5]}",
                )
            )
        bad = [t for t in params.logit_bias or () if t >= self.vocab_size]
        if bad:
            raise ValueError(
                tr(
                    f"SamplingParams.logit_bias: token ids must be in "
                    f"[0, {self.vocab_size}), got {bad[:5]}",
                    f"SamplingParams.logit_bias 的 token id 必须在 [0, {self.vocab_size}) "
                    f"之内，你给的有 {bad[:5]}",
                )
            )
        if params.stop and self.tokenizer is None:
            raise ValueError(
                tr(
                    "SamplingParams.stop: stop strings need a tokenizer, and this "
                    "engine has none; use stop_token_ids",
                    "SamplingParams.stop：停止字符串需要分词器，这个引擎没有；请用 stop_token_ids",
                )
            )
        grammar = None
        if params.structured_outputs is not None:
            if self.tokenizer is None:
                raise ValueError(
                    tr(
                        "SamplingParams.structured_outputs needs a tokenizer, and "
                        "this engine has none",
                        "SamplingParams.structured_outputs 需要分词器，这个引擎没有",
                    )
                )
            grammar = self.structured_outputs().matcher(params.structured_outputs)
        if len(token_ids) > self.max_model_len:
            raise ValueError(
                tr(
                    f"prompt has {len(token_ids)} tokens, more than "
                    f"max_model_len={self.max_model_len}",
                    f"prompt 有 {len(token_ids)} 个 token，超过了 max_model_len={self.max_model_len}",
                )
            )
        now = time.perf_counter() if arrival_time is None else arrival_time
        req = Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_time=now,
            prompt=text,
            generator=make_generator(params.seed, self.device),
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
        )
        req.grammar = grammar
        if self.tokenizer is not None and (params.stop or self.detokenize_incrementally):
            req.detokenizer = IncrementalDetokenizer(
                self.tokenizer, params.stop, params.include_stop_str_in_output
            )
        self.requests[request_id] = req
        self.scheduler.add_request(req)
        return req

    def structured_outputs(self):
        """The grammar compiler and matcher factory (made on first use: xgrammar reads the
        whole vocabulary once, a fraction of a second)."""
        if self.model_runner.structured_output_manager is None:
            from llmlab.structured_output import StructuredOutputManager

            self.model_runner.structured_output_manager = StructuredOutputManager(
                self.tokenizer,
                self.vocab_size,
                self.eos_token_ids,
                backend=self.config.structured_outputs_backend,
            )
        return self.model_runner.structured_output_manager

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. False if no such unfinished request."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.finish_request(req, RequestStatus.FINISHED_ABORTED)
        req.metrics.finished_time = time.perf_counter()
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.num_unfinished_requests

    # ---- the loop -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return a delta RequestOutput per request that got a token
        (with a speculative config: the tokens it got, one or more)."""
        if self.speculative_config is not None:
            return self._spec_step(self)
        t0 = time.perf_counter()
        sched_out = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.last_scheduler_output = sched_out
        if sched_out.is_empty:
            return []
        sampled = self.model_runner.execute_model(sched_out)
        now = time.perf_counter()
        self.forward_seconds += now - t1
        failed = self._fail_requests(sched_out, sampled, now)
        got_token, finished = self.scheduler.update_from_output(sched_out, sampled, now)
        finished = failed + finished
        self.step_overheads.append((t1 - t0 + time.perf_counter() - now, sched_out.num_requests))
        logprobs = self.model_runner.last_logprobs
        outputs = []
        for req in got_token:
            if logprobs and req.logprobs is not None:
                req.logprobs.append(logprobs[req.request_id])
            if req.grammar is not None and not self._advance_grammar(req):
                finished.append(req)
            text = ""
            det = req.detokenizer
            if det is not None:
                # stop strings count once min_tokens outputs exist (vLLM's rule)
                check = req.num_output_tokens > req.sampling_params.min_tokens
                if (
                    det.update(req.output_token_ids[-1:], req.is_finished, check)
                    and not req.is_finished
                ):
                    # a stop string: the request ends here, as with a stop token
                    self.scheduler.finish_request(req, RequestStatus.FINISHED_STOPPED)
                    req.stop_reason = det.stop_string
                    req.metrics.finished_time = now
                    finished.append(req)
                text = det.next_delta(req.is_finished)
            outputs.append(delta_output(req, req.output_token_ids[-1:], text))
        outputs += [delta_output(req, [], "") for req in failed]
        for req in finished:
            self.requests.pop(req.request_id, None)
        return outputs

    def _fail_requests(
        self, sched_out: SchedulerOutput, sampled: list, now: float
    ) -> list[Request]:
        """Finish, alone, each request whose sampling or verification failed this step (the
        runner's `failed_requests`, None in `sampled`), and take it out of `sched_out` and
        `sampled` in place so the scheduler's update sees only the others. Returns them."""
        failed_ids = self.model_runner.failed_requests
        if not failed_ids:
            return []
        failed, keep, kept_sampled = [], [], []
        k = 0
        for i, req in enumerate(sched_out.requests):
            caught_up = (
                sched_out.num_computed_tokens[i] + sched_out.num_new_tokens[i] >= req.num_tokens
            )
            token = sampled[k] if caught_up else None
            k += caught_up
            if req.request_id in failed_ids:
                self.scheduler.finish_request(req, RequestStatus.FINISHED_ERROR)
                req.stop_reason = failed_ids[req.request_id]
                req.metrics.finished_time = now
                failed.append(req)
                continue
            keep.append(i)
            if caught_up:
                kept_sampled.append(token)
        for name in ("requests", "num_new_tokens", "num_computed_tokens"):
            values = getattr(sched_out, name)
            values[:] = [values[i] for i in keep]
        sampled[:] = kept_sampled
        return failed

    def _advance_grammar(self, req: Request, token: int | None = None, last: bool = True) -> bool:
        """Feed a new token (default: the last output token) to the request's matcher. False
        when that ended the request here (its grammar is complete and the token was the end,
        with EOS ignored, or the matcher refused a token it had allowed, which cannot happen).
        last: False for a token a speculative step emitted before its last one."""
        token = req.output_token_ids[-1] if token is None else token
        accepted = req.grammar.accept_token(token)
        if (req.is_finished and last) or (accepted and not req.grammar.is_terminated()):
            return True
        if req.is_finished:  # it had ended later in the step: it ends here instead
            req.status = RequestStatus.FINISHED_STOPPED
        else:
            self.scheduler.finish_request(req, RequestStatus.FINISHED_STOPPED)
        req.metrics.finished_time = req.metrics.token_times[-1]
        return False

    def make_output(self, req: Request) -> RequestOutput:
        """The cumulative RequestOutput of a request (all tokens, decoded text; cut at the
        stop string that ended it)."""
        if req.detokenizer is not None:
            text = req.detokenizer.output_text
        else:
            text = (
                ""
                if self.tokenizer is None
                else self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
            )
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=list(req.prompt_token_ids),
            outputs=[
                CompletionOutput(
                    0,
                    text,
                    list(req.output_token_ids),
                    req.status.finish_reason,
                    req.stop_reason,
                    None if req.logprobs is None else list(req.logprobs),
                )
            ],
            finished=req.status.is_finished,
            num_cached_tokens=req.num_cached_tokens or 0,
            metrics=req.metrics,
            prompt_logprobs=None if req.prompt_logprobs is None else list(req.prompt_logprobs),
        )

    def get_request_output(self, request_id: str) -> RequestOutput:
        """The cumulative output of an unfinished request."""
        try:
            return self.make_output(self.requests[request_id])
        except KeyError:
            raise ValueError(f"request_id {request_id!r} is not an unfinished request") from None

    def stats(self) -> dict[str, Any]:
        """Queue lengths, KV pool state, preemptions, prefix-cache hits, step counts, timings."""
        sch = self.scheduler.stats
        kv = self.kv_cache_manager
        pc = kv.prefix_cache_stats
        per_req = sch.schedule_seconds / max(sch.num_scheduled_requests, 1)
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "num_kv_blocks": self.num_kv_blocks,
            "free_blocks": kv.num_free_blocks,
            "kv_usage": kv.usage,
            "preemptions": sch.num_preemptions,
            "prefix_cache_queries": pc.queries,
            "prefix_cache_hits": pc.hits,
            "prefix_cache_hit_rate": pc.hit_rate,
            "steps": sch.num_steps,
            "chunked_prefill_steps": sch.num_chunked_prefill_steps,
            "scheduled_tokens": sch.num_scheduled_tokens,
            "schedule_seconds": sch.schedule_seconds,
            "forward_seconds": self.forward_seconds,
            "schedule_seconds_per_step_per_request": per_req,
            **(self.scheduler.spec_stats_dict() if self.speculative_config is not None else {}),
        }


def delta_output(req: Request, new_ids: list[int], text: str) -> RequestOutput:
    """A step's delta for one request: its `new_ids` and their `text`, the logprobs of those
    tokens, its state after the step (the prompt's logprobs with its first token only)."""
    n = len(new_ids)
    logprobs = None
    if req.logprobs is not None:
        logprobs = req.logprobs[-n:] if n else []
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=[
            CompletionOutput(0, text, new_ids, req.status.finish_reason, req.stop_reason, logprobs)
        ],
        finished=req.status.is_finished,
        num_cached_tokens=req.num_cached_tokens or 0,
        metrics=req.metrics,
        prompt_logprobs=req.prompt_logprobs if n and req.num_output_tokens == n else None,
    )


def _eos_ids(config_eos: int | list[int] | None, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(config_eos)
    tok_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return frozenset(ids)
