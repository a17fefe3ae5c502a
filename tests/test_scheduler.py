"""The scheduler on its own: budgets, chunked prefill, preemption, prefix hits, static batching.

No model runs here: `_finish_step` plays the model runner's part by "sampling" a fixed token
for every request that is caught up after the step.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmlab.core.request import Request, RequestStatus
from llmlab.core.scheduler import Scheduler, SchedulerOutput
from llmlab.kvcache.manager import KVCacheManager
from llmlab.sampling import SamplingParams

BS = 4


def make_request(
    rid: str,
    prompt_len: int,
    max_tokens: int = 4,
    first_token: int = 100,
    max_model_len: int = 1000,
) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=list(range(first_token, first_token + prompt_len)),
        sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        arrival_time=0.0,
        max_model_len=max_model_len,
    )


def make_scheduler(
    num_blocks=64,
    max_num_seqs=8,
    budget=64,
    chunked=True,
    caching=True,
    scheduling="continuous",
    max_model_len=1000,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS, enable_caching=caching)
    return Scheduler(
        kv,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        scheduling=scheduling,
    )


def _finish_step(sched: Scheduler, out: SchedulerOutput, token: int = 7):
    num_samples = sum(
        c + n == r.num_tokens
        for r, n, c in zip(out.requests, out.num_new_tokens, out.num_computed_tokens)
    )
    return sched.update_from_output(out, [token] * num_samples, now=0.0)


def _scheduled(out: SchedulerOutput) -> dict[str, int]:
    return {r.request_id: n for r, n in zip(out.requests, out.num_new_tokens)}


def test_decode_gets_one_token_and_running_goes_first():
    sched = make_scheduler(budget=10)
    a = make_request("a", 6)
    sched.add_request(a)
    out = sched.schedule()
    assert _scheduled(out) == {"a": 6}
    _finish_step(sched, out)
    assert a.num_computed_tokens == 6 and a.output_token_ids == [7]
    b = make_request("b", 20, first_token=300)
    sched.add_request(b)
    out = sched.schedule()
    # a decodes (1 token) first, b's prefill takes what is left of the budget
    assert out.requests[0] is a and _scheduled(out) == {"a": 1, "b": 9}
    assert out.num_prefill_chunks == 1


def test_chunked_prefill_splits_prompt_within_budget():
    sched = make_scheduler(budget=8)
    a = make_request("a", 21, max_tokens=2)
    sched.add_request(a)
    chunks = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= 8
        chunks.append(_scheduled(out)["a"])
        _finish_step(sched, out)
    assert chunks == [8, 8, 5, 1]  # three prefill chunks, then one decode
    assert a.status == RequestStatus.FINISHED_LENGTH and a.output_token_ids == [7, 7]
    assert sched.kv_cache_manager.num_free_blocks == 64


def test_without_chunking_a_long_prompt_waits_for_a_whole_step():
    sched = make_scheduler(budget=16, chunked=False)
    a, b = make_request("a", 10), make_request("b", 12, first_token=400)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert _scheduled(out) == {"a": 10}  # b (12) does not fit the remaining 6
    _finish_step(sched, out)
    out = sched.schedule()
    assert _scheduled(out) == {"a": 1, "b": 12}


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(max_num_seqs=3, budget=100)
    for i in range(5):
        sched.add_request(make_request(f"r{i}", 3, first_token=100 * i))
    out = sched.schedule()
    assert len(out.requests) == 3 and len(sched.running) == 3 and len(sched.waiting) == 2


def test_newest_running_request_is_preempted_and_recomputed_with_its_outputs():
    # 6 blocks of 4 tokens; two requests of 10 prompt tokens need 3 blocks each, then grow
    sched = make_scheduler(num_blocks=6, budget=64, caching=False)
    a = make_request("a", 10, max_tokens=6)
    b = make_request("b", 10, max_tokens=6, first_token=500)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    _finish_step(sched, out)  # both at 11 tokens, 3 blocks each, pool full
    _finish_step(sched, sched.schedule())  # 12 tokens
    _finish_step(sched, sched.schedule())  # 13 tokens, 12 computed: still 3 blocks
    out = sched.schedule()  # computing token 13 needs a 4th block
    assert out.preempted == [b]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sched.waiting[0] is b and b.num_preemptions == 1
    assert sched.kv_cache_manager.get_block_ids("b") == []
    assert [r.request_id for r in out.requests] == ["a"]  # no admission in a preempting step
    _finish_step(sched, out)
    b_outputs_before = list(b.output_token_ids)
    while a.status == RequestStatus.RUNNING:
        _finish_step(sched, sched.schedule())
    out = sched.schedule()  # b resumes: prompt + its 3 outputs recomputed
    assert _scheduled(out) == {"b": 13} and b.output_token_ids == b_outputs_before
    while sched.has_unfinished_requests():
        _finish_step(sched, out)
        out = sched.schedule()
    assert len(a.output_token_ids) == len(b.output_token_ids) == 6
    assert sched.kv_cache_manager.num_free_blocks == 6


def test_prefix_hit_is_recorded_as_num_cached_tokens():
    sched = make_scheduler()
    a = make_request("a", 14)
    sched.add_request(a)
    _finish_step(sched, sched.schedule())
    b = make_request("b", 14)  # same prompt
    sched.add_request(b)
    out = sched.schedule()
    assert b.num_cached_tokens == 12  # 3 full blocks of 4; the last token is recomputed
    assert _scheduled(out) == {"a": 1, "b": 2}
    assert out.num_computed_tokens[1] == 12


def _add_short_long_short(sched):
    """Add three 3-token prompts to `sched`: a wants 1 token, b 5, c 1 (c waits for a slot)."""
    reqs = [
        make_request("a", 3, max_tokens=1),
        make_request("b", 3, max_tokens=5, first_token=200),
        make_request("c", 3, max_tokens=1, first_token=300),
    ]
    for r in reqs:
        sched.add_request(r)
    return reqs


def test_static_batching_admits_nothing_until_the_batch_finishes():
    sched = make_scheduler(max_num_seqs=2, budget=100, scheduling="static")
    reqs = _add_short_long_short(sched)
    out = sched.schedule()
    assert _scheduled(out) == {"a": 3, "b": 3}
    _finish_step(sched, out)  # a finishes after its first token
    for _ in range(4):
        out = sched.schedule()
        assert "c" not in _scheduled(out)  # a free slot, but the batch is still running
        _finish_step(sched, out)
    assert reqs[1].is_finished
    assert _scheduled(sched.schedule()) == {"c": 3}


def test_continuous_batching_fills_a_free_slot_at_once():
    sched = make_scheduler(max_num_seqs=2, budget=100)
    _add_short_long_short(sched)
    _finish_step(sched, sched.schedule())
    assert _scheduled(sched.schedule()) == {"b": 1, "c": 3}


def test_finish_request_frees_blocks_in_any_state():
    sched = make_scheduler(budget=8)
    a, b = make_request("a", 20), make_request("b", 5, first_token=400)
    sched.add_request(a)
    sched.add_request(b)
    _finish_step(sched, sched.schedule())  # a mid-prefill, b waiting
    sched.finish_request(a, RequestStatus.FINISHED_ABORTED)
    sched.finish_request(b, RequestStatus.FINISHED_ABORTED)
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache_manager.num_free_blocks == 64


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 8)), min_size=1, max_size=12),
    st.integers(5, 40),
    st.integers(1, 4),
    st.booleans(),
    st.sampled_from(["continuous", "static"]),
)
def test_random_workloads_keep_invariants_and_finish(specs, budget, max_num_seqs, caching, policy):
    max_model_len = 40
    sched = make_scheduler(
        num_blocks=10,
        max_num_seqs=max_num_seqs,
        budget=budget,
        caching=caching,
        scheduling=policy,
        max_model_len=max_model_len,
    )
    reqs = [
        make_request(
            f"r{i}", p, max_tokens=m, first_token=(i % 3) * 50, max_model_len=max_model_len
        )
        for i, (p, m) in enumerate(specs)
    ]
    for r in reqs:
        sched.add_request(r)
    kv = sched.kv_cache_manager
    for _ in range(2000):
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= budget
        assert len(sched.running) <= max_num_seqs
        for r, n, c in zip(out.requests, out.num_new_tokens, out.num_computed_tokens):
            assert n >= 1 and c + n <= r.num_tokens
            assert len(kv.get_block_ids(r.request_id)) * BS >= c + n
        _finish_step(sched, out)
    assert not sched.has_unfinished_requests()
    for r, (p, m) in zip(reqs, specs):
        assert r.is_finished
        assert len(r.output_token_ids) == min(m, max_model_len - p)
    assert kv.num_free_blocks == 10
