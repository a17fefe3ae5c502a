"""The engine loop: requests in, one scheduled step at a time, tokens out.

`LLMEngine` owns a `Scheduler` (which requests run this step, KV blocks from a
`KVCacheManager`) and a `ModelRunner` (one forward over the flat batch). Each `step()`:

1. `scheduler.schedule()` → a `SchedulerOutput` (with speculation, `schedule_drafts` then gives
   decoding requests the slots for their draft tokens);
2. `model_runner.execute_model(...)` → the tokens each caught-up request's step emitted: one, or
   with drafts the accepted ones and one more (the runner holds the proposer and the verifier);
3. `scheduler.update_from_output(...)` appends them, checks stop conditions, frees finished
   requests' blocks;
4. returns a delta `RequestOutput` per request that got tokens (streaming): a stop string or a
   grammar that ends it among several tokens drops the ones after.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Any

from llmlab.config.engine import EngineConfig, SpeculativeConfig
from llmlab.core.request import Request, RequestStatus
from llmlab.core.scheduler import Scheduler, SchedulerOutput
from llmlab.engine import processor
from llmlab.engine.allocator import keep_freed_memory
from llmlab.engine.builder import (
    calibration_token_ids,
    eos_token_ids,
    max_model_len_of,
    num_kv_blocks_of,
    prepare_model,
    resolve_attention_backend,
)
from llmlab.engine.detokenizer import IncrementalDetokenizer
from llmlab.engine.outputs import CompletionOutput, RequestOutput
from llmlab.kvcache.manager import KVCacheManager
from llmlab.model import LlamaModel
from llmlab.sampling import SamplingParams, make_generator
from llmlab.worker.model_runner import ModelRunner

STEP_OVERHEAD_HISTORY = 10_000  # steps whose scheduling overhead `step_overheads` keeps


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
        self.model, self.tokenizer, self.device = model, tokenizer, model.device
        self.vocab_size = model.config.vocab_size
        self.max_model_len = max_model_len_of(config, model)
        self.num_kv_blocks = num_kv_blocks_of(config, model, self.max_model_len)
        self.eos_token_ids = eos_token_ids(model.config.eos_token_id, tokenizer)
        self.speculative_config = SpeculativeConfig.from_value(config.speculative_config)
        self.kv_cache_manager = KVCacheManager(
            self.num_kv_blocks,
            config.block_size,
            enable_caching=config.enable_prefix_caching,
            block_pool=config.block_pool_cls,
        )
        self.scheduler = self._make_scheduler()
        self.model_runner = self._make_runner()
        # forwards per step for multi-step scheduling (one where the runner cannot run more)
        self.num_scheduler_steps = (
            config.num_scheduler_steps if self.model_runner.runs_multi_step else 1
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

    def _make_scheduler(self) -> Scheduler:
        config, spec = self.config, self.speculative_config
        return (config.scheduler_cls or Scheduler)(
            self.kv_cache_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            scheduling=config.scheduling,
            **({} if spec is None else {"num_speculative_tokens": spec.num_speculative_tokens}),
        )

    def _make_runner(self) -> ModelRunner:
        config, model = self.config, self.model
        kv_scales = None
        if config.kv_cache_dtype == "fp8":
            from llmlab.model.quantization import kv_scales as measure_kv_scales

            kv_scales = measure_kv_scales(model, calibration_token_ids(model, self.tokenizer))
        return ModelRunner(
            model,
            self.kv_cache_manager,
            self.num_kv_blocks,
            config.block_size,
            config.attention_backend,
            default_generator=make_generator(config.seed, self.device),
            kv_cache_dtype=config.torch_kv_cache_dtype,
            kv_scales=kv_scales,
            max_num_seqs=config.max_num_seqs,
            max_model_len=self.max_model_len,
            enforce_eager=config.enforce_eager,
            speculative_config=self.speculative_config,
        )

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> Request:
        """Queue a request. Raises ValueError (nothing queued) for a bad prompt or parameters."""
        processor.check_request(request_id, params, self.requests)
        token_ids, text = processor.prompt_token_ids(prompt, self.tokenizer, request_id)
        processor.check_token_ids(token_ids, params, self.vocab_size, self.max_model_len)
        processor.check_needs_tokenizer(params, self.tokenizer)
        grammar = None
        if params.structured_outputs is not None:
            grammar = self.structured_outputs().matcher(params.structured_outputs)
        req = Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_time=time.perf_counter() if arrival_time is None else arrival_time,
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
            from llmlab.sampling.structured_output import StructuredOutputManager

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
        """Run one scheduled step; return a delta RequestOutput per request that got tokens
        (one, with speculation the accepted drafts and one more, with multi-step scheduling
        one per forward)."""
        t0 = time.perf_counter()
        sched_out = self.scheduler.schedule()
        if self.speculative_config is not None:
            self.scheduler.schedule_drafts(sched_out)
        elif self.num_scheduler_steps > 1:
            self.scheduler.schedule_steps(sched_out, self.num_scheduler_steps)
        t1 = time.perf_counter()
        self.last_scheduler_output = sched_out
        if sched_out.is_empty:
            return []
        sampled = self.model_runner.execute_model(sched_out)
        now = time.perf_counter()
        self.forward_seconds += now - t1
        failed = self._fail_requests(sched_out, sampled, now)
        got_token, finished = self.scheduler.update_from_output(sched_out, sampled, now)
        self.step_overheads.append((t1 - t0 + time.perf_counter() - now, sched_out.num_requests))
        counts = (
            self.scheduler.last_num_new_tokens
            if self.speculative_config is not None or sched_out.num_steps > 1
            else [1] * len(got_token)
        )
        outputs = [self._deliver(req, n, finished, now) for req, n in zip(got_token, counts)]
        outputs += [delta_output(req, [], "") for req in failed]
        for req in failed + finished:
            self.requests.pop(req.request_id, None)
        return outputs

    def _deliver(self, req: Request, n: int, finished: list, now: float) -> RequestOutput:
        """The delta output of a request that got `n` tokens this step: their logprobs, the
        grammar fed, the text and a stop string looked for, token by token (whatever ends the
        request drops the tokens after it, as if they had come one step at a time)."""
        logprobs = self.model_runner.last_logprobs
        if logprobs and req.logprobs is not None:  # only undrafted requests: n == 1
            req.logprobs.append(logprobs[req.request_id])
        new_ids = req.output_token_ids[-n:]
        if req.grammar is not None:
            new_ids = self._advance_grammar(req, new_ids, finished)
        text = ""
        if req.detokenizer is not None:
            new_ids = self._detokenize(req, new_ids, finished, now)
            text = req.detokenizer.next_delta(req.is_finished)
        return delta_output(req, new_ids, text)

    def _detokenize(self, req: Request, new_ids: list[int], finished: list, now: float) -> list:
        """Feed the step's tokens to the request's text; a stop string among them ends the
        request there (stop strings count once min_tokens outputs exist, vLLM's rule)."""
        det, n = req.detokenizer, len(new_ids)
        first = req.num_output_tokens - n  # outputs before this step's
        for j, token in enumerate(new_ids):
            last = j == n - 1
            check = first + j + 1 > req.sampling_params.min_tokens
            if det.update([token], req.is_finished and last, check) and not (
                req.is_finished and last
            ):
                new_ids = _keep_first(req, new_ids, j + 1)  # none after the stop string
                if not req.is_finished:
                    self.scheduler.finish_request(req, RequestStatus.FINISHED_STOPPED)
                    finished.append(req)
                else:  # it had stopped later anyway
                    req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = det.stop_string
                req.metrics.finished_time = now
                break
        return new_ids

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

    def _advance_grammar(self, req: Request, new_ids: list[int], finished: list) -> list[int]:
        """Feed the step's tokens to the request's matcher one by one; where the grammar ends
        the request (complete, the token its end, or a token it refused, which cannot happen)
        the tokens after that one are dropped. Returns the tokens kept."""
        n = len(new_ids)
        for j, token in enumerate(new_ids):
            last = j == n - 1
            accepted = req.grammar.accept_token(token)
            if (req.is_finished and last) or (accepted and not req.grammar.is_terminated()):
                continue
            kept = _keep_first(req, new_ids, j + 1)
            if req.is_finished:  # it had ended later in the step: it ends here instead
                req.status = RequestStatus.FINISHED_STOPPED
            else:
                self.scheduler.finish_request(req, RequestStatus.FINISHED_STOPPED)
            req.metrics.finished_time = req.metrics.token_times[-1]
            if req not in finished:
                finished.append(req)
            return kept
        return new_ids

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


def _keep_first(req: Request, new_ids: list[int], keep: int) -> list[int]:
    """Drop the step's tokens after its first `keep` (from the request's outputs and their
    times): something among them ended the request. Returns the tokens kept."""
    drop = len(new_ids) - keep
    if drop:
        req.remove_last_output_tokens(drop)
        del req.metrics.token_times[-drop:]
    return new_ids[:keep]
