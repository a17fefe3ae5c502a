"""Self-checks for chapter 16 (a step on a GPU): the paged decode attention kernel written by the
student in Triton (one program per sequence, KV head and partition; an online softmax) and its
merge of the partitions, each checked against a float64 reference; the GPU's busy share of a
step bound by launches; which step a CUDA graph cannot replay; how many partitions fill a GPU's
SMs.

The kernel's check draws fresh inputs for every call (`llmlab.course.build.ch16.CASES`, new
seeds) and compares the partial results it stores (each partition's max m, sum l and
accumulator acc) with the online softmax computed in float64 (`partials`), which
`llmlab.ops.reference` checks in the tests. When they differ, the checker finds which single slip
explains every case: `partials(t, slip)` computes what a kernel with one typical mistake stores
(the wrong KV head for a query head, the max not rescaled, the sequence's end off by one, slots
past seq_len read, the block table misread, the scale forgotten, ...), and the slip that matches
the student's on all cases names the rule the hint gives. The merge's check does the same with
the merge's slips on drawn partial results.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any

import torch

from llmlab.course.build import drive
from llmlab.course.build.ch16 import (
    BLOCK_SIZE,
    CASES,
    MERGE_CASES,
    PARTITION_SIZE,
    make_case,
    make_partials,
)
from llmlab.course.check.build_guard import run_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    not_yet,
    passed,
    staged,
)
from llmlab.course.check.question import Expected, choice, numeric

M = catalog("ch16")
BUILDS = {"ch16.paged_decode_partition": "paged_decode_partition"}  # exercise -> student's name
DRIVER = "llmlab.course.build.ch16:partial_results"
MERGE_DRIVER = "llmlab.course.build.ch16:merged"

# float32 through the interpreter is within 1e-5 of the float64 reference on these sizes; a GPU's
# tl.dot rounds float32 operands to tf32 (10-bit mantissa) unless told otherwise
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-2}

# The kernel's slips: (name, its rule's key), tried in this order; the first whose simulated
# partial results match the student's on every case names the rule.
SLIPS = (
    ("gqa", M.key("decode.gqa")),
    ("scale", M.key("decode.scale")),
    ("no_rescale", M.key("decode.rescale")),
    ("no_rescale_acc", M.key("decode.rescale")),
    ("no_rescale_sum", M.key("decode.rescale")),
    ("end_short", M.key("decode.end_short")),
    ("end_past", M.key("decode.end_past")),
    ("zero_scores", M.key("decode.zero_scores")),
    ("no_mask", M.key("decode.past_seq_len")),
    ("table_ignored", M.key("decode.table_ignored")),
    ("table_row", M.key("decode.table_row")),
    ("partition_from_zero", M.key("decode.partition_range")),
    ("partition_is_first", M.key("decode.partition_range")),
)
_SECOND_STAGE = {
    "decode.gqa": M.key("decode.gqa_then"),
    "decode.scale": M.key("decode.scale_then"),
    "decode.rescale": M.key("decode.rescale_then"),
    "decode.end_short": M.key("decode.end_then"),
    "decode.end_past": M.key("decode.end_then"),
    "decode.zero_scores": M.key("decode.zero_scores_then"),
    "decode.past_seq_len": M.key("decode.past_seq_len_then"),
    "decode.table_ignored": M.key("decode.table_then"),
    "decode.table_row": M.key("decode.table_then"),
    "decode.partition_range": M.key("decode.partition_range_then"),
}


# ----------------------------------------------------------------------------- the kernel, simulated


def _valid(slip: str | None, pos: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The positions of a block that a kernel with `slip` treats as part of the sequence."""
    if slip == "end_short":
        return pos < seq_len - 1
    if slip == "end_past":
        return pos <= seq_len
    if slip == "no_mask":
        return torch.ones_like(pos, dtype=torch.bool)
    return pos < seq_len


def _partition(t: dict, slip: str | None, s: int, part: int) -> tuple:
    """(m, l, acc) of every query head [H], [H], [H, D] for partition `part` of sequence `s`:
    the online softmax one cache block at a time, as the kernel runs it, with `slip` (a masked
    load reads 0; an invalid position scores -inf, or 0 with "zero_scores")."""
    q = t["query"][s].double()  # [H, D]
    num_heads, head_dim = q.shape
    num_kv_heads = t["key_cache"].shape[2]
    heads = torch.arange(num_heads)
    kv_of = heads % num_kv_heads if slip == "gqa" else heads // (num_heads // num_kv_heads)
    scale = 1.0 if slip == "scale" else t["scale"]
    row = 0 if slip == "table_row" else s
    seq_len = int(t["seq_lens"][s])
    blocks = PARTITION_SIZE // BLOCK_SIZE
    first = 0 if slip in ("partition_from_zero", "partition_is_first") else part * blocks
    end = blocks if slip == "partition_is_first" else part * blocks + blocks
    m = torch.full((num_heads,), -math.inf, dtype=torch.float64)
    l = torch.zeros(num_heads, dtype=torch.float64)
    acc = torch.zeros(num_heads, head_dim, dtype=torch.float64)
    for b in range(first, min(end, -(-seq_len // BLOCK_SIZE))):
        pos = b * BLOCK_SIZE + torch.arange(BLOCK_SIZE)  # [n]
        valid = _valid(slip, pos, seq_len)[None, :, None]  # [1, n, 1]
        block = b if slip == "table_ignored" else int(t["block_tables"][row, b])
        k = t["key_cache"][block][:, kv_of].transpose(0, 1).double()  # [H, n, D]
        v = t["value_cache"][block][:, kv_of].transpose(0, 1).double()
        k, v = torch.where(valid, k, 0.0), torch.where(valid, v, 0.0)
        score = torch.einsum("hd,hnd->hn", q, k) * scale  # [H, n]
        if slip != "zero_scores":
            score = torch.where(valid[..., 0], score, -math.inf)
        m_new = torch.maximum(m, score.max(dim=1).values)
        alpha = torch.exp(m - m_new)  # [H]
        p = torch.exp(score - m_new[:, None])  # [H, n]
        keep_l = 1.0 if slip in ("no_rescale", "no_rescale_sum") else alpha
        keep_acc = 1.0 if slip in ("no_rescale", "no_rescale_acc") else alpha[:, None]
        l = l * keep_l + p.sum(dim=1)
        acc = acc * keep_acc + torch.einsum("hn,hnd->hd", p, v)
        m = m_new
    return m, l, acc


def partials(t: dict, slip: str | None = None) -> tuple[torch.Tensor, ...]:
    """What the kernel stores on the case `t` (`make_case`'s tensors) with one `slip` (None:
    none), in float64: (part_out [S, H, P, D], part_max [S, H, P], part_sum [S, H, P]), the
    launcher's layout."""
    num_parts = -(-t["block_tables"].shape[1] * BLOCK_SIZE // PARTITION_SIZE)
    per_seq = []
    for s in range(t["query"].shape[0]):
        m, l, acc = map(torch.stack, zip(*(_partition(t, slip, s, p) for p in range(num_parts))))
        per_seq.append((acc.transpose(0, 1), m.T, l.T))  # [H, P, D], [H, P], [H, P]
    acc, m, l = (torch.stack(x) for x in zip(*per_seq))
    return acc, m, l


def merge(part_out: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor) -> torch.Tensor:
    """The partitions merged in float64: each brought from its own max to the largest, then the
    summed acc over the summed l -> [S, H, D] (the reference of exercise 2)."""
    acc, m, l = part_out.double(), part_max.double(), part_sum.double()
    w = torch.exp(m - m.amax(dim=-1, keepdim=True))  # [S, H, P]; 0 when empty
    return (acc * w[..., None]).sum(dim=-2) / (l * w).sum(dim=-1)[..., None]


# ----------------------------------------------------------------------------- exercise 1


def _is_kernel(answer: Any) -> bool:
    """A Triton kernel is launched by indexing it with its grid (`kernel[grid](...)`)."""
    return callable(getattr(answer, "__getitem__", None))


def paged_decode_partition(answer: Any) -> CheckResult:
    """The student's kernel paged_decode_partition, run by the launcher on every case of CASES
    with fresh inputs (through Triton's interpreter on a CPU, compiled on a GPU): the partial
    results it stores must equal the float64 online softmax's."""
    ex = "ch16.paged_decode_partition"
    hint = M("decode.not_a_kernel", got_type=type(answer).__name__)
    raised = functools.partial(M, M.key("decode.raised"))
    seeds = [random.SystemRandom().randrange(2**31) for _ in CASES]
    run = functools.partial(drive, answer, DRIVER, seeds)
    got = run_build_answer(ex, answer, run, fits=_is_kernel, hint=hint, raised=raised)
    if isinstance(got, CheckResult):
        return got
    cases = [make_case(case, seed) for case, seed in zip(CASES, seeds)]
    stored, tol = got["partials"], TOLERANCE[got["device"]]
    wrong = [i for i, (t, p) in enumerate(zip(cases, stored)) if not _same(p, partials(t), tol)]
    if not wrong:
        where = M("decode.on_gpu") if got["device"] == "cuda" else M("decode.on_cpu")
        return passed(ex, M("decode.success", n=len(CASES), where=where))
    return not_yet(ex, _diagnosis(cases, stored, wrong[0], tol))


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    return torch.allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


def _same(got: tuple, want: tuple, tol: float) -> bool:
    """Two kernels' partial results (acc, m, l) mean the same attention: where `want` holds
    positions (l > 0), the same output acc / l and the same log-sum-exp m + log l (a kernel may
    keep its sums under any max it likes); where it holds none, l = 0 and acc = 0 under a max
    that is not NaN (-inf, or a very negative number as llmlab's own kernel stores)."""
    (g_acc, g_m, g_l), (w_acc, w_m, w_l) = got, want
    empty = w_l == 0  # [S, H, P]
    if not (
        (g_l[empty] == 0).all()
        and (g_acc[empty] == 0).all()
        and not torch.isnan(g_m[empty]).any()
        and not (g_m[empty] == math.inf).any()
    ):
        return False
    full = ~empty
    return _close(
        g_acc[full] / g_l[full][:, None], w_acc[full] / w_l[full][:, None], tol
    ) and _close(g_m[full] + torch.log(g_l[full]), w_m[full] + torch.log(w_l[full]), tol)


def _diagnosis(cases: list[dict], stored: list[tuple], first: int, tol: float) -> str:
    """The hint for partial results that differ from the reference's (case `first` is the first
    that does): the rule of the one slip that explains every case, else where the first case
    goes wrong."""
    ex = "ch16.paged_decode_partition"
    if all(torch.isnan(x).all() for p in stored for x in p):
        return M("decode.nothing_written")
    for slip, key in SLIPS:
        if all(_same(p, partials(t, slip), tol) for t, p in zip(cases, stored)):
            return staged(ex, M(key), M(_SECOND_STAGE[key]))
    t, (acc, m, l) = cases[first], stored[first]
    want_acc, want_m, want_l = partials(t)
    empty = torch.isinf(want_m)  # [S, H, P]: partitions past the sequence's end
    if torch.isnan(m[empty]).any() or torch.isnan(l[empty]).any():
        return staged(ex, M("decode.empty_partition"), M("decode.empty_partition_then"))
    if torch.isnan(acc).any() and not torch.isnan(want_acc).any():
        return staged(ex, M("decode.past_seq_len"), M("decode.past_seq_len_then"))
    err = (acc - want_acc).abs().nan_to_num(math.inf).amax(dim=(2, 3))  # [S, H]
    s, h = divmod(int(err.argmax()), err.shape[1])
    name, seq_lens, num_heads, num_kv_heads, _ = CASES[first]
    where = M(
        "decode.wrong",
        case=name,
        seq_lens=list(seq_lens),
        heads=num_heads,
        kv_heads=num_kv_heads,
        seq=s,
        head=h,
        err=float(err[s, h]),
    )
    return staged(ex, where, M("decode.rules"))


# ----------------------------------------------------------------------------- exercise 2

# The merge's slips, simulated on the partial results: (name, its rule's key)
MERGE_SLIPS = (
    ("plain_sum", M.key("merge.no_rescale")),
    ("acc_only", M.key("merge.no_rescale")),
    ("no_max", M.key("merge.no_max")),
    ("mean", M.key("merge.average")),
    ("mean_zeros", M.key("merge.average")),
    ("mean_nonempty", M.key("merge.average")),
    ("weights_without_sums", M.key("merge.weights")),
    ("largest_only", M.key("merge.largest_only")),
)


def merge_slip(part_out: torch.Tensor, part_max: torch.Tensor, part_sum: torch.Tensor, slip: str):
    """What a merge with `slip` returns (float64, [S, H, D])."""
    acc, m, l = part_out.double(), part_max.double(), part_sum.double()
    top = m.amax(dim=-1, keepdim=True)
    w = torch.exp(m - top)  # [S, H, P]
    norm = acc / l[..., None]  # each partition's own output (0 / 0 when empty)
    if slip == "plain_sum":
        return acc.sum(-2) / l.sum(-1)[..., None]
    if slip == "acc_only":
        return (acc * w[..., None]).sum(-2) / l.sum(-1)[..., None]
    if slip == "no_max":  # in float32 throughout, as the student's tensors are: exp(m) overflows
        e = torch.exp(part_max)
        return ((part_out * e[..., None]).sum(-2) / (part_sum * e).sum(-1)[..., None]).double()
    if slip == "mean":
        return norm.mean(-2)
    if slip == "mean_zeros":
        return norm.nan_to_num().mean(-2)
    if slip == "mean_nonempty":
        return norm.nanmean(-2)
    if slip == "weights_without_sums":
        return (norm.nan_to_num() * w[..., None]).sum(-2) / w.sum(-1)[..., None]
    if slip == "largest_only":
        pick = m.argmax(dim=-1, keepdim=True)  # [S, H, 1]
        return norm.gather(-2, pick[..., None].expand(*pick.shape, acc.shape[-1])).squeeze(-2)
    raise ValueError(f"slip: got {slip!r}, expected one of {[s for s, _ in MERGE_SLIPS]}")


def merge_partitions(answer: Any) -> CheckResult:
    """The student's merge_partitions(part_out, part_max, part_sum) on drawn partial results
    (maxima far apart, empty partitions): its output must equal the float64 merge's."""
    ex = "ch16.merge_partitions"
    hint = M("merge.not_a_function", got_type=type(answer).__name__)
    raised = functools.partial(M, M.key("merge.raised"))
    seeds = [random.SystemRandom().randrange(2**31) for _ in MERGE_CASES]
    run = functools.partial(drive, answer, MERGE_DRIVER, seeds)
    got = run_build_answer(ex, answer, run, hint=hint, raised=raised)
    if isinstance(got, CheckResult):
        return got
    if got["bad"] is not None:
        return not_yet(ex, M(_BAD_MERGE[got["bad"]], **got))
    cases = [make_partials(case, seed) for case, seed in zip(MERGE_CASES, seeds)]
    outs = got["outputs"]
    wants = [merge(**c) for c in cases]
    if all(_close(o, w, TOLERANCE["cpu"]) for o, w in zip(outs, wants)):
        return passed(ex, M("merge.success", n=len(MERGE_CASES)))
    for slip, key in MERGE_SLIPS:
        if all(_close(o, merge_slip(**c, slip=slip), 1e-4) for o, c in zip(outs, cases)):
            return not_yet(ex, staged(ex, M(key), M("merge.formula")))
    return not_yet(ex, staged(ex, M("merge.default_hint"), M("merge.formula")))


_BAD_MERGE = {
    "not_a_tensor": M.key("merge.not_a_tensor"),
    "shape": M.key("merge.shape"),
    "dtype": M.key("merge.dtype"),
}


# ----------------------------------------------------------------------------- exercise 3

# a decode step bound by its launches: each kernel is launched by the host, then runs on the GPU
KERNELS, LAUNCH_US, RUN_US = 800, 20.0, 6.0


@numeric(rel=0.01)
def busy_share() -> Expected:
    """A step of KERNELS kernels, each launched in LAUNCH_US µs by the host and run in RUN_US µs
    by the GPU, launches asynchronous: the share of the step (0 to 1) the GPU is busy."""
    step = KERNELS * max(LAUNCH_US, RUN_US)
    busy = KERNELS * RUN_US
    return Expected(
        busy / step,
        mistakes=[
            (LAUNCH_US / RUN_US, M("busy_share.upside_down")),
            (RUN_US / (LAUNCH_US + RUN_US), M("busy_share.taking_turns")),
            (100 * busy / step, M("busy_share.percent")),
            (1 - busy / step, M("busy_share.idle_share")),
        ],
    )


# ----------------------------------------------------------------------------- exercise 4

EAGER_OPTIONS = M.texts("eager_options", ("a", "b", "c", "d"))
_EAGER_HINTS = M.texts("eager_hints", ("a", "c", "d"))


@choice(EAGER_OPTIONS, _EAGER_HINTS)
def eager_step() -> str:
    """With CUDA graphs on (captured for batches 1, 2, 4, 8, 16, ... up to 64), which one step
    of EAGER_OPTIONS runs eagerly?"""
    return "b"


# ----------------------------------------------------------------------------- exercise 5

# split-K at batch 1: programs per (sequence, KV head) are too few for a GPU's SMs
SMS, KV_HEADS, QUERY_HEADS = 132, 8, 32


@numeric(rel=1e-6)
def partitions_for_sms() -> Expected:
    """Batch 1, KV_HEADS KV heads (QUERY_HEADS query heads), one program per (sequence, KV head,
    partition): the fewest partitions per sequence that give each of SMS SMs a program."""
    return Expected(
        math.ceil(SMS / KV_HEADS),
        mistakes=[
            (math.ceil(SMS / QUERY_HEADS), M("partitions_for_sms.query_heads")),
            (SMS // KV_HEADS, M("partitions_for_sms.rounded_down")),
            (SMS / KV_HEADS, M("partitions_for_sms.fraction")),
            (SMS, M("partitions_for_sms.heads_forgotten")),
        ],
    )


# ----------------------------------------------------------------------------- exercise 6

# multi-step scheduling at batch 1: a forward of FORWARD_MS, the host's work around it HOST_MS,
# paid once per STEPS forwards
FORWARD_MS, HOST_MS, STEPS = 5.0, 1.0, 8


@numeric(rel=0.005)
def multi_step_speedup() -> Expected:
    """A batch-1 step is a forward of FORWARD_MS and HOST_MS of the host's work around it
    (scheduling, inputs, sampling, the output); with STEPS forwards per scheduling the host's
    part is paid once per STEPS tokens. How many times faster does the request decode, ideally?"""
    before = FORWARD_MS + HOST_MS
    after = FORWARD_MS + HOST_MS / STEPS
    return Expected(
        before / after,
        mistakes=[
            (before / FORWARD_MS, M("multi_step_speedup.host_gone", k=STEPS)),
            (float(STEPS), M("multi_step_speedup.k_times", k=STEPS, forward=FORWARD_MS)),
            (after / before, M("multi_step_speedup.upside_down")),
            (
                before / (FORWARD_MS / STEPS + HOST_MS),
                M("multi_step_speedup.forward_shared", k=STEPS),
            ),
        ],
    )


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
