"""The scheduler: which requests run in the next step, and how many tokens each brings.

In the style of vLLM V1 (`vllm/v1/core/sched/scheduler.py`) there are no separate prefill and
decode phases. Every request has `num_computed_tokens` (tokens whose K/V are cached) and
`num_tokens` (prompt + outputs so far); a step simply lets each chosen request catch up by
some tokens, within a token budget (`max_num_batched_tokens`) and a cap on running requests
(`max_num_seqs`):

- a request that still has many prompt tokens to go brings a prefill *chunk* (chunked
  prefill: a long prompt is split over steps and shares each step with decodes);
- a request that is caught up brings exactly one token, its last sampled one (decode).

Running requests are served first, oldest first, then waiting ones in arrival order. A waiting
request first asks the `KVCacheManager` how much of its prefix is already cached (prefix
caching). When the pool runs out of blocks for a running request, the newest running request
is *preempted*: its blocks are freed and it goes back to the front of the waiting queue, to be
recomputed later (prompt and the tokens it had generated, so nothing is lost; the prefix cache
often hands most of its blocks straight back).

`scheduling="static"` is the baseline of chapter 08: a batch of up to `max_num_seqs` waiting
requests is admitted together and no other request is admitted until the batch's last request
has finished.

Per-step state is the `SchedulerOutput` dataclass, passed explicitly to the model runner and
back; nothing is global.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from llmlab.config.engine import SCHEDULING_POLICIES, EngineConfig
from llmlab.core.request import Request, RequestStatus
from llmlab.kvcache.manager import KVCacheManager
from llmlab.spec_decode.metrics import SpecDecodingStats


@dataclass
class SchedulerOutput:
    """What one step computes: request i brings `num_new_tokens[i]` tokens starting at
    token index `num_computed_tokens[i]` (its cache length before the step)."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)  # preempted while scheduling this step
    num_prefill_chunks: int = 0  # requests whose prompt is not finished after this step
    # speculative decoding only: request id -> its draft tokens, verified in this step after
    # its last token (num_new_tokens counts them)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # multi-step scheduling only: forwards this step runs back to back, each request decoding
    # one token per forward (the slots of all of them reserved: `Scheduler.schedule_steps`)
    num_steps: int = 1
    # when the step's scheduling began (the seconds `Scheduler.record_step` counts)
    created: float = field(default_factory=time.perf_counter, compare=False, repr=False)

    def add(self, request: Request, num_new_tokens: int) -> None:
        """Schedule `num_new_tokens` of `request` from its cache length on."""
        self.requests.append(request)
        self.num_new_tokens.append(num_new_tokens)
        self.num_computed_tokens.append(request.num_computed_tokens)
        if request.num_computed_tokens + num_new_tokens < request.num_tokens:
            self.num_prefill_chunks += 1

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def is_empty(self) -> bool:
        return not self.requests


@dataclass
class SchedulerStats:
    """Counters since the scheduler was made."""

    num_steps: int = 0
    num_preemptions: int = 0
    num_chunked_prefill_steps: int = 0  # steps that left some prompt partly computed
    num_scheduled_requests: int = 0  # sum over steps of requests scheduled
    num_scheduled_tokens: int = 0
    schedule_seconds: float = 0.0  # time inside schedule() and update_from_output()


class Scheduler:
    """Continuous (or static) batching over a `KVCacheManager`.

    max_num_seqs: most requests running at once. max_num_batched_tokens: most tokens in one
    step. max_model_len: longest sequence (prompt + output) a request may reach.
    enable_chunked_prefill: split prompts longer than the remaining budget over several steps;
    off, a prompt is scheduled whole or waits. The defaults are `EngineConfig`'s.
    num_speculative_tokens: k of speculative decoding (0: none); the engine then calls
    `schedule_drafts` after `schedule`, and `update_from_output` takes each request's tokens.
    """

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = EngineConfig.enable_chunked_prefill,
        scheduling: str = EngineConfig.scheduling,
        num_speculative_tokens: int = 0,
    ) -> None:
        if scheduling not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling must be one of {SCHEDULING_POLICIES}, got {scheduling!r}")
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.scheduling = scheduling
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        self._static_batch: set[str] = set()  # static batching: the current batch's ids
        # speculative decoding: up to k draft tokens a decoding request may verify per step
        self.num_speculative_tokens = num_speculative_tokens
        self.spec_stats = SpecDecodingStats(num_speculative_tokens)

    # ---- queue ----------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Take a request out of the queues (finished or aborted) and free its blocks."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif not request.status.is_finished:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        request.status = status
        self.kv_cache_manager.free(request)

    # ---- scheduling -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Choose this step's requests and token counts, allocating their KV blocks.

        The readable definition of continuous batching (chapter 08's build exercise writes it
        again; `LLM(..., scheduler_cls=...)` runs a subclass that overrides it). What is not the
        idea sits in the helpers it calls: `computed_blocks` (the prefix cache's hit),
        `may_admit` (static batching), `admit`, `preempt` and `record_step` (bookkeeping)."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        kv = self.kv_cache_manager
        running = self.running

        # 1. Running requests, oldest first: the next prefill chunk or one decode token.
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:  # nothing to compute (cannot happen between steps)
                i += 1
                continue
            scheduled = True
            while kv.allocate_slots(req, num_new) is None:
                victim = running.pop()  # the newest running request
                self.preempt(victim, out)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            out.add(req, num_new)
            budget -= num_new
            i += 1

        # 2. Waiting requests, in order (preempted ones sit at the front), while there is room.
        #    Not in a step that had to preempt: the pool is full.
        if not out.preempted:
            while self.waiting and budget > 0 and len(running) < self.max_num_seqs:
                req = self.waiting[0]
                if not self.may_admit(req):
                    break
                computed_blocks, num_cached = self.computed_blocks(req)
                num_new = req.num_tokens - num_cached
                if num_new > budget:
                    if not self.enable_chunked_prefill:
                        break
                    num_new = budget
                if kv.allocate_slots(req, num_new, computed_blocks) is None:
                    break
                self.admit(req, num_cached)
                out.add(req, num_new)
                budget -= num_new

        self.record_step(out)
        return out

    def computed_blocks(self, request: Request) -> tuple[list, int]:
        """(the cached blocks of `request`'s prefix, their number of tokens): the prefix cache's
        hit, or none when every prompt token's logits are needed (prompt_logprobs)."""
        if request.prompt_logprobs is None:
            return self.kv_cache_manager.get_computed_blocks(request)
        return [], 0

    def admit(self, request: Request, num_cached: int) -> None:
        """The waiting queue's first request starts running, with `num_cached` tokens already
        in its blocks (its blocks are allocated; the caller schedules its tokens)."""
        if self.waiting[0] is not request:
            raise ValueError(
                f"admit: request {request.request_id!r} is not the first waiting request"
            )
        self.waiting.popleft()
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_cached
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        if request.metrics.first_scheduled_time is None:
            request.metrics.first_scheduled_time = time.perf_counter()
        self.running.append(request)

    def record_step(self, out: SchedulerOutput) -> None:
        """Count the step `out` in `stats` (steps, requests, tokens, chunked prefills and the
        seconds since `out` was made)."""
        stats = self.stats
        stats.num_steps += 1
        stats.num_scheduled_requests += len(out.requests)
        stats.num_scheduled_tokens += out.total_num_scheduled_tokens
        if out.num_prefill_chunks:
            stats.num_chunked_prefill_steps += 1
        stats.schedule_seconds += time.perf_counter() - out.created

    def may_admit(self, request: Request) -> bool:
        """Whether the waiting `request` may start now: always, in continuous batching. Static
        batching (chapter 08's baseline) admits a batch of up to `max_num_seqs` waiting requests
        once the previous batch has drained (none of its members running or waiting), and then
        only members of that batch (a preempted member comes back)."""
        if self.scheduling == "continuous":
            return True
        batch = self._static_batch
        if not self.running and not any(r.request_id in batch for r in self.waiting):
            self._static_batch = batch = {
                r.request_id for _, r in zip(range(self.max_num_seqs), self.waiting)
            }
        return request.request_id in batch

    def preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Free the request's blocks and put it back at the front of the waiting queue (the
        caller has taken it out of `running`), to be recomputed from its first token."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted.append(request)
        self.stats.num_preemptions += 1

    def update_from_output(
        self, out: SchedulerOutput, sampled_token_ids: list, now: float
    ) -> tuple[list[Request], list[Request]]:
        """Advance each scheduled request by its tokens; append the tokens its step emitted.

        `sampled_token_ids` has one entry per request of `out` that was caught up after the
        step (in `out.requests` order; partial prefill chunks sample nothing): its one sampled
        token, or the list of tokens a speculative step emitted (accepted drafts, then one more).
        A stop condition among several tokens ends the request there. Returns (requests that got
        tokens, requests that finished); finished ones are removed and their blocks freed.
        `last_num_new_tokens` holds, per request that got tokens, how many it got.
        """
        t0 = time.perf_counter()
        got_token: list[Request] = []
        finished: list[Request] = []
        self.last_num_new_tokens = []
        specs = out.scheduled_spec_decode_tokens
        sampled = iter(sampled_token_ids)
        for req, n in zip(out.requests, out.num_new_tokens):
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a partial prefill chunk: no token yet
            tokens = next(sampled)
            tokens = [tokens] if isinstance(tokens, int) else tokens
            if req.request_id in specs:
                self._account_drafts(req, specs[req.request_id], len(tokens) - 1)
            elif out.num_steps > 1:  # each forward after the first cached one token more
                req.num_computed_tokens += len(tokens) - 1
            status = self._append_tokens(req, tokens, now)
            got_token.append(req)
            if status is not None:
                req.metrics.finished_time = now
                req.status = status
                finished.append(req)
            elif req.request_id in specs or len(tokens) < out.num_steps:
                # the rejected drafts' (or unused steps') blocks go back to the pool
                self.kv_cache_manager.free_blocks_beyond(req, req.num_computed_tokens)
        if finished:
            self.running = [r for r in self.running if not r.status.is_finished]
            for req in finished:
                self.kv_cache_manager.free(req)
        self.stats.schedule_seconds += time.perf_counter() - t0
        return got_token, finished

    def _append_tokens(self, req: Request, tokens: list[int], now: float) -> RequestStatus | None:
        """Append a step's tokens to `req` until one stops it; the status it stopped in, if any
        (the tokens after the stopping one are dropped)."""
        metrics = req.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        count, status = 0, None
        for token in tokens:
            req.append_output_token(token)
            metrics.token_times.append(now)
            count += 1
            status = req.check_stop()
            if status is not None:
                break
        self.last_num_new_tokens.append(count)
        return status

    # ---- multi-step scheduling -------------------------------------------------------------

    def tokens_left(self, req: Request) -> int:
        """The most tokens `req` may still emit: until max_tokens or max_model_len."""
        return min(
            req.sampling_params.max_tokens - req.num_output_tokens,
            self.max_model_len - req.num_tokens,
        )

    @staticmethod
    def samples_plainly(req: Request) -> bool:
        """Whether `req`'s next tokens need nothing but the plain sampler's rows: no logprobs,
        penalties or logit bias, min_tokens reached (each of those looks at the tokens before)."""
        return (
            not req.needs_extra_sampling and req.num_output_tokens >= req.sampling_params.min_tokens
        )

    def num_steps_allowed(self, req: Request) -> int:
        """The most forwards `req` may decode in one step: `tokens_left`; one where its sampling
        is not the plain sampler's, or a grammar or prompt logprobs come with it."""
        if not self.samples_plainly(req) or req.has_grammar or req.prompt_logprobs is not None:
            return 1
        return self.tokens_left(req)

    def schedule_steps(self, out: SchedulerOutput, num_steps: int) -> None:
        """After `schedule`: when every request of the step decodes (one new token, caught up
        after it), let the step run up to `num_steps` forwards back to back (vLLM V0's
        multi-step scheduling): each request's slots for that many tokens are allocated now,
        and `out.num_steps` says how many forwards to run. The step stays one forward when a
        request may take no more (`num_steps_allowed`) or the pool has no room for every
        request's slots (nothing is allocated then, and nothing preempted)."""
        t0 = time.perf_counter()
        kv = self.kv_cache_manager
        decoding = all(
            n == 1 and start + 1 == req.num_tokens
            for req, start, n in zip(out.requests, out.num_computed_tokens, out.num_new_tokens)
        )
        if decoding and out.requests and not out.scheduled_spec_decode_tokens:
            k = min([num_steps] + [self.num_steps_allowed(req) for req in out.requests])
            needed = sum(
                max(0, kv.num_blocks_needed(req.num_computed_tokens + k) - len(table))
                for req in out.requests
                for table in (kv.get_block_ids(req.request_id),)
            )
            if k > 1 and needed <= kv.num_free_blocks:
                for req in out.requests:
                    kv.allocate_slots(req, k)
                out.num_steps = k
                self.stats.num_scheduled_tokens += (k - 1) * len(out.requests)
        self.stats.schedule_seconds += time.perf_counter() - t0

    # ---- speculative decoding -------------------------------------------------------------

    def num_draft_tokens_allowed(self, req: Request) -> int:
        """The most drafts `req` may take this step: k, fewer near max_tokens or max_model_len
        (a step emits up to drafts + 1 tokens), none while its sampling needs more than the
        plain sampler's rows (logprobs, penalties, logit bias, min_tokens still pending, a
        grammar whose matcher cannot step back: the verifier masks each position with the state
        after the drafts before it, walking the drafts and rolling back, as vLLM does)."""
        if not self.samples_plainly(req) or (
            req.has_grammar and not callable(getattr(req.grammar, "rollback", None))
        ):
            return 0
        return min(self.num_speculative_tokens, self.tokens_left(req) - 1)

    def schedule_drafts(self, out: SchedulerOutput) -> None:
        """After `schedule`: give each request that decodes this step up to k more token slots,
        for its draft tokens (the model runner's proposer fills them in, and verifies them with
        the request's last token in the same forward). The drafts' slots are allocated like any
        token's; when the pool or the step's budget has no room, the request decodes one token
        (speculation never preempts). vLLM's scheduler does this bookkeeping with
        `num_tokens_with_spec` in `vllm/v1/core/sched/scheduler.py`."""
        t0 = time.perf_counter()
        budget = self.max_num_batched_tokens - out.total_num_scheduled_tokens
        kv = self.kv_cache_manager
        for i, req in enumerate(out.requests):
            if budget <= 0:
                break
            # decoding: one new token (its last sampled one), and it is caught up after it
            if out.num_new_tokens[i] != 1 or out.num_computed_tokens[i] + 1 != req.num_tokens:
                continue
            k = min(self.num_draft_tokens_allowed(req), budget)
            if k <= 0 or kv.allocate_slots(req, 1 + k) is None:
                continue
            out.scheduled_spec_decode_tokens[req.request_id] = [0] * k  # the proposer's slots
            out.num_new_tokens[i] = 1 + k
            budget -= k
            self.stats.num_scheduled_tokens += k
        self.stats.schedule_seconds += time.perf_counter() - t0

    def _account_drafts(self, req: Request, drafts: list[int], num_accepted: int) -> None:
        """A verified request: forget its rejected drafts' K/V and count what was accepted."""
        req.num_computed_tokens -= len(drafts) - num_accepted
        if not drafts:  # its proposer found nothing to propose
            return
        self.spec_stats.observe_draft(len(drafts), num_accepted)
        metrics = req.metrics
        metrics.num_drafts += 1
        metrics.num_draft_tokens += len(drafts)
        metrics.num_accepted_tokens += num_accepted

    def spec_stats_dict(self) -> dict:
        """The speculation counters `LLMEngine.stats()` reports (vLLM's names, without the
        "vllm:" prefix and "_total" suffix of `/metrics`)."""
        s = self.spec_stats
        return {
            "spec_decode_num_drafts": s.num_drafts,
            "spec_decode_num_draft_tokens": s.num_draft_tokens,
            "spec_decode_num_accepted_tokens": s.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(s.num_accepted_tokens_per_pos),
            "spec_decode_acceptance_rate": s.acceptance_rate,
            "spec_decode_mean_acceptance_length": s.mean_acceptance_length,
        }
