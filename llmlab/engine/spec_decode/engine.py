"""The engine step of an engine that speculates (`LLMEngine.step` runs it when the engine was
built with a `speculative_config`; the plain step is untouched).

The same four stages as the plain step (schedule, execute, update, outputs); what differs is
that a request may receive several tokens in one step, so its delta output carries all of them,
and a stop string met among them ends the text there and drops the tokens after it (as if they
had been generated one step at a time).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from llmlab.engine.outputs import RequestOutput
from llmlab.request import RequestStatus

if TYPE_CHECKING:
    from llmlab.engine.llm_engine import LLMEngine


def spec_step(engine: LLMEngine) -> list[RequestOutput]:
    """One scheduled step with draft tokens; a delta RequestOutput per request that got tokens."""
    from llmlab.engine.llm_engine import delta_output

    scheduler = engine.scheduler
    t0 = time.perf_counter()
    sched_out = scheduler.schedule()
    t1 = time.perf_counter()
    engine.last_scheduler_output = sched_out
    if sched_out.is_empty:
        return []
    sampled = engine.model_runner.execute_model(sched_out)
    now = time.perf_counter()
    engine.forward_seconds += now - t1
    failed = engine._fail_requests(sched_out, sampled, now)
    got_token, finished = scheduler.update_from_output(sched_out, sampled, now)
    finished = failed + finished
    engine.step_overheads.append((t1 - t0 + time.perf_counter() - now, sched_out.num_requests))
    logprobs = engine.model_runner.last_logprobs
    outputs = []
    for req, n in zip(got_token, scheduler.last_num_new_tokens):
        if logprobs and req.logprobs is not None:  # only undrafted requests: n == 1
            req.logprobs.append(logprobs[req.request_id])
        new_ids = req.output_token_ids[-n:]
        if req.grammar is not None:
            new_ids = _advance_grammar(engine, req, new_ids, finished)
            n = len(new_ids)
        text = ""
        det = req.detokenizer
        if det is not None:
            min_tokens = req.sampling_params.min_tokens
            first = req.num_output_tokens - n  # outputs before this step's
            for j, token in enumerate(new_ids):
                last = j == n - 1
                check = first + j + 1 > min_tokens  # stop strings count after min_tokens
                if det.update([token], req.is_finished and last, check) and not (
                    req.is_finished and last
                ):
                    new_ids = _keep_first(req, new_ids, j + 1)  # none after the stop string
                    if not req.is_finished:
                        scheduler.finish_request(req, RequestStatus.FINISHED_STOPPED)
                        finished.append(req)
                    else:  # it had stopped later anyway
                        req.status = RequestStatus.FINISHED_STOPPED
                    req.stop_reason = det.stop_string
                    req.metrics.finished_time = now
                    break
            text = det.next_delta(req.is_finished)
        outputs.append(delta_output(req, new_ids, text))
    outputs += [delta_output(req, [], "") for req in failed]
    for req in finished:
        engine.requests.pop(req.request_id, None)
    return outputs


def _advance_grammar(engine: LLMEngine, req, new_ids: list[int], finished: list) -> list[int]:
    """Feed the step's tokens to the request's matcher one by one, as the plain step feeds its
    one token; where the grammar ends the request (complete, with EOS ignored), the tokens
    after that one are dropped. Returns the tokens kept."""
    n = len(new_ids)
    for j, token in enumerate(new_ids):
        if engine._advance_grammar(req, token, last=j == n - 1):
            continue
        kept = _keep_first(req, new_ids, j + 1)
        req.metrics.finished_time = req.metrics.token_times[-1]
        if req not in finished:
            finished.append(req)
        return kept
    return new_ids


def _keep_first(req, new_ids: list[int], keep: int) -> list[int]:
    """Drop the step's tokens after its first `keep` (from the request's outputs and their
    times): something among them ended the request. Returns the tokens kept."""
    drop = len(new_ids) - keep
    if drop:
        req.remove_last_output_tokens(drop)
        del req.metrics.token_times[-drop:]
    return new_ids[:keep]
