"""Self-checks for chapter 14 (speculative decoding): the accept/reject step of speculative
sampling written by the student and tested for the distribution it keeps, the tokens a verify
step yields on average, and why speculation stops paying as the batch grows."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.analysis.speculation import chi_square_sf, expected_tokens_per_step
from llmlab.course.build import drive
from llmlab.course.check.build_guard import run_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    not_yet,
    passed,
    staged,
)
from llmlab.course.check.question import Expected, choice, numeric

M = catalog("ch14")
BUILDS = {"ch14.verify_drafts": "verify_drafts"}  # exercise -> the student's name
DRIVER = "llmlab.course.build.ch14:emitted_counts"

# The toy cases: (the target's probabilities at the k + 1 positions over a vocabulary of 4
# tokens, the k drafts). Every probability is far from 0 and 1, so each rule shows in the counts.
CASES = (
    (
        [[0.1, 0.5, 0.3, 0.1], [0.25, 0.2, 0.4, 0.15], [0.55, 0.15, 0.1, 0.2]],
        [1, 2],
    ),
    ([[0.3, 0.2, 0.1, 0.4], [0.1, 0.2, 0.3, 0.4]], [3]),
)
TRIALS = 4000
SEED = 14
# A correct function fails one chi-square test with at most this probability. A case of k drafts
# runs k + 2 tests (the number emitted, and the token at each of the k + 1 positions), so the
# check's false-alarm rate is at most 7 × 1e-7 < 1e-6 (a union bound over the CASES' 4 + 3).
FALSE_ALARM = 1e-7

# Exercise 2: the tokens a verify step yields on average
ACCEPTANCE, K = 0.6, 4

# Exercise 3: why speculation stops paying at a large batch
CROSSING_OPTIONS = M.texts(
    "crossing_options", ("compute_bound", "acceptance_falls", "memory_full", "drafts_cost")
)
_CROSSING_HINTS = M.texts("crossing_hints", ("acceptance_falls", "memory_full", "drafts_cost"))


def expected_counts(rows: list[list[float]], drafts: list[int], trials: int) -> list[float]:
    """How many of `trials` runs of a correct step emit 1, 2, … k + 1 tokens:
    P(length = L) = p_0(d_1)···p_{L-2}(d_{L-1}) · (1 − p_{L-1}(d_L)), the last length (all k
    accepted) the product of all k. (Whatever the length, the token a correct step emits at
    position j, among the runs that reach j, is distributed as p_j: see `_problem`.)"""
    lengths, reach = [], 1.0
    for j, d in enumerate(drafts):
        lengths.append(trials * reach * (1 - rows[j][d]))
        reach *= rows[j][d]
    lengths.append(trials * reach)
    return lengths


def verify_drafts(answer: Any) -> CheckResult:
    """The student's verify_drafts(target_probs, draft_tokens, generator), run TRIALS times on
    each toy case: every run must follow the rules, and the number of tokens emitted and the
    token at every position, the bonus included, must follow the target's distribution
    (chi-square)."""
    ex = "ch14.verify_drafts"
    hint = M("verify.not_a_function", got_type=type(answer).__name__)
    for rows, drafts in CASES:
        where = M("verify.where", k=len(drafts), drafts=drafts, rows=rows)
        raised = functools.partial(M, M.key("verify.raised"), where=where)
        args = (rows, drafts, TRIALS, SEED)
        run = functools.partial(drive, answer, DRIVER, args)
        got = run_build_answer(ex, answer, run, hint=hint, raised=raised)
        if isinstance(got, CheckResult):
            return got
        problem = _problem(got, rows, drafts)
        if problem is not None:
            return not_yet(ex, staged(ex, f"{where} {problem}", M("verify.rule")))
    return passed(ex, M("verify.success", trials=TRIALS, n=len(CASES)))


def _problem(got: dict, rows: list[list[float]], drafts: list[int]) -> str | None:
    """What the counts show is wrong, in words, or None."""
    k = len(drafts)
    if got["bad"] == "not_token_ids":
        return M("verify.not_token_ids", got=got["got"])
    if got["bad"] == "length":
        return M("verify.length", got=got["got"], k=k)
    if got["bad"] == "out_of_vocab":
        return M("verify.out_of_vocab", got=got["got"], vocab=got["vocab"])
    lengths = expected_counts(rows, drafts, got["trials"])
    if got["broken"]["not_drafts_in_order"]:
        return M("verify.not_drafts_in_order", n=got["broken"]["not_drafts_in_order"])
    if got["lengths"][k] == 0 and lengths[k] > 50:
        return M("verify.no_bonus", k=k, kplus=k + 1)
    if got["broken"]["rejected_token_emitted"]:
        return M("verify.rejected_token_emitted", n=got["broken"]["rejected_token_emitted"])
    if chi_square_sf(got["lengths"], lengths) < FALSE_ALARM:
        shares = [round(c / got["trials"], 3) for c in got["lengths"]]
        want = [round(c / got["trials"], 3) for c in lengths]
        return M("verify.lengths_off", got=shares, want=want)
    # the token at position j, among the runs that reached j: distributed as p_j (an accepted
    # draft and a replacement together at j < k, the bonus token alone at k)
    for j, counts in enumerate(got["positions"]):
        reached = sum(counts)
        if chi_square_sf(counts, [reached * p for p in rows[j]]) < FALSE_ALARM:
            shares = [round(c / reached, 3) for c in counts]
            if j == k:
                return M("verify.bonus_off", got=shares, want=rows[k], kplus=k + 1)
            return M("verify.position_off", position=j + 1, got=shares, want=rows[j])
    return None


@numeric(rel=0.005)
def tokens_per_step() -> Expected:
    """Each draft token is accepted with probability ACCEPTANCE, independently, until the first
    rejection; a verify step proposes K drafts. How many tokens does it yield on average?"""
    expected = expected_tokens_per_step(ACCEPTANCE, K)
    a = ACCEPTANCE
    return Expected(
        expected,
        mistakes=[
            (1 + a * K, M("tokens_per_step.independent_positions")),
            (a * K, M("tokens_per_step.no_own_token")),
            (expected - 1, M("tokens_per_step.no_own_token")),
            (expected - a**K, M("tokens_per_step.bonus_forgotten")),
            (K + 1, M("tokens_per_step.all_accepted")),
        ],
    )


# Exercise 4: a speed-up from the tokens per step and the verify step's relative cost
TOKENS_PER_STEP, VERIFY_COST = 2.4, 1.25


@numeric(rel=0.005)
def speedup_estimate() -> Expected:
    """A verify step yields TOKENS_PER_STEP tokens per request on average and takes VERIFY_COST
    times a plain decode step: how many times faster is the speculative engine?"""
    return Expected(
        TOKENS_PER_STEP / VERIFY_COST,
        mistakes=[
            (TOKENS_PER_STEP * VERIFY_COST, M("speedup_estimate.multiplied")),
            (TOKENS_PER_STEP, M("speedup_estimate.cost_left_out")),
            (VERIFY_COST / TOKENS_PER_STEP, M("speedup_estimate.upside_down")),
            ((TOKENS_PER_STEP - 1) / VERIFY_COST, M("speedup_estimate.own_token_left_out")),
        ],
    )


@choice(CROSSING_OPTIONS, _CROSSING_HINTS)
def why_it_stops_paying() -> str:
    """At a large batch the speculative engine is slower than plain decoding on the same
    workload. The main reason: one key of CROSSING_OPTIONS."""
    return "compute_bound"


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
