"""The scheduler of an engine that speculates: the plain scheduler's step, then draft slots.

`SpecDecodeScheduler.schedule()` runs `Scheduler.schedule()` unchanged (running requests,
chunked prefill, preemption, prefix caching) and then gives each request that is decoding up to
k more tokens: its draft tokens, verified with its last token in the same forward. The slots of
the drafts are allocated like any other token's; when the pool or the step's token budget has
no room, the request simply decodes one token (speculation never preempts).
`update_from_output` then advances each request by what was accepted and hands back the
blocks that only rejected drafts occupied, so a request holds exactly the blocks of its
computed tokens between steps, as without speculation (vLLM's scheduler does the same
bookkeeping with `num_tokens_with_spec` in `vllm/v1/core/sched/scheduler.py`).
"""

from __future__ import annotations

import time

from llmlab.engine.scheduler import Scheduler, SchedulerOutput
from llmlab.engine.spec_decode.metrics import SpecDecodingStats
from llmlab.engine.spec_decode.ngram_proposer import NgramProposer
from llmlab.request import Request


class SpecDecodeScheduler(Scheduler):
    """`Scheduler` plus draft tokens. num_speculative_tokens: k. proposer: an `NgramProposer`
    (drafts chosen here, from the token history), or None for a draft model (the scheduler
    reserves k slots; the model runner's draft model fills `scheduled_spec_decode_tokens`)."""

    def __init__(
        self, *args, num_speculative_tokens: int, proposer: NgramProposer | None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.num_speculative_tokens = num_speculative_tokens
        self.proposer = proposer
        self.spec_stats = SpecDecodingStats(num_speculative_tokens)
        # tokens each request of the last update's `got_token` received, in that order
        self.last_num_new_tokens: list[int] = []

    def num_draft_tokens_allowed(self, req: Request) -> int:
        """The most drafts `req` may take this step: k, fewer near max_tokens or max_model_len
        (a step emits up to drafts + 1 tokens), none while its sampling needs more than the
        plain sampler's rows (logprobs, penalties, logit bias, min_tokens still pending, a
        grammar whose matcher cannot step back: the verifier masks each position with the state
        after the drafts before it, walking the drafts and rolling back, as vLLM does)."""
        params = req.sampling_params
        if (
            req.needs_extra_sampling
            or (req.has_grammar and not callable(getattr(req.grammar, "rollback", None)))
            or req.num_output_tokens < params.min_tokens
        ):
            return 0
        return min(
            self.num_speculative_tokens,
            params.max_tokens - req.num_output_tokens - 1,
            self.max_model_len - req.num_tokens - 1,
        )

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        t0 = time.perf_counter()
        budget = self.max_num_batched_tokens - out.total_num_scheduled_tokens
        kv = self.kv_cache_manager
        specs = out.scheduled_spec_decode_tokens
        for i, req in enumerate(out.requests):
            if budget <= 0:
                break
            # decoding: one new token (its last sampled one), and it is caught up after it
            if out.num_new_tokens[i] != 1 or out.num_computed_tokens[i] + 1 != req.num_tokens:
                continue
            k = min(self.num_draft_tokens_allowed(req), budget)
            if k <= 0:
                continue
            if self.proposer is not None:
                drafts = self.proposer.propose(req.all_token_ids, k)
            else:
                drafts = [0] * k  # placeholders: the runner's draft model proposes
            if not drafts or kv.allocate_slots(req, 1 + len(drafts)) is None:
                continue
            specs[req.request_id] = drafts
            out.num_new_tokens[i] = 1 + len(drafts)
            budget -= len(drafts)
            self.stats.num_scheduled_tokens += len(drafts)
        self.stats.schedule_seconds += time.perf_counter() - t0
        return out

    def update_from_output(
        self, out: SchedulerOutput, sampled_token_ids: list[list[int]], now: float
    ) -> tuple[list[Request], list[Request]]:
        """Advance each request by its accepted tokens and append them (stopping at a stop
        condition among them); `sampled_token_ids` has, per request of `out` that was caught up,
        the tokens its verify step emitted (accepted drafts, then one target token)."""
        t0 = time.perf_counter()
        got_token: list[Request] = []
        finished: list[Request] = []
        self.last_num_new_tokens = num_new_tokens = []
        kv = self.kv_cache_manager
        specs = out.scheduled_spec_decode_tokens
        j = 0
        for req, n in zip(out.requests, out.num_new_tokens):
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a partial prefill chunk: no token yet
            tokens = sampled_token_ids[j]
            j += 1
            drafts = specs.get(req.request_id)
            if drafts:
                num_accepted = len(tokens) - 1
                # the rejected drafts' K/V are not the sequence's: forget them
                req.num_computed_tokens -= len(drafts) - num_accepted
                self.spec_stats.observe_draft(len(drafts), num_accepted)
                metrics = req.metrics
                metrics.num_drafts += 1
                metrics.num_draft_tokens += len(drafts)
                metrics.num_accepted_tokens += num_accepted
            metrics = req.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            status = None
            count = 0
            for token in tokens:
                req.append_output_token(token)
                metrics.token_times.append(now)
                count += 1
                status = req.check_stop()
                if status is not None:
                    break
            got_token.append(req)
            num_new_tokens.append(count)
            if status is not None:
                metrics.finished_time = now
                req.status = status
                finished.append(req)
            elif drafts:
                kv.free_blocks_beyond(req, req.num_computed_tokens)
        if finished:
            self.running = [r for r in self.running if not r.status.is_finished]
            for req in finished:
                self.kv_cache_manager.free(req)
        self.stats.schedule_seconds += time.perf_counter() - t0
        return got_token, finished

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
