"""Self-checks of chapter 11 (vLLM arrives): a token's slot through a block table, what a
prefix-cache hit can reuse, which cached block the free queue evicts first, how many steps a chunked
prefill takes beside running decodes, what the block-allocation explorer shows, why our
engine-vs-Hugging-Face ratio is far from the source chapter's 24x, and the source chapter's
self-check question 5 (which operating-system idea each vLLM design borrows). Also the request trace
of the chapter's memory-waste figure, shared with its test.

Every expected value is computed by running the package (a real `KVCacheManager`, a real
`Scheduler`), never written down by hand."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    check_choice,
    check_dict_keys,
    check_matching,
    check_number,
    not_yet,
    passed,
    record_expected,
    report,
    staged,
)
from llmlab.i18n import Bilingual, tr
from llmlab.utils import cdiv

# ---- the memory-waste trace of the chapter (llmlab.analysis.sim.make_trace arguments) -----------------
WASTE_TRACE = dict(
    num_requests=120,
    arrival_rate=1.0,
    mean_output=200,
    output_spread=0.9,
    prompt_len=(20, 400),
    seed=11,
    max_tokens=400,
)
WASTE_MAX_MODEL_LEN = 2048  # what a max-length contiguous allocator reserves per request
WASTE_BLOCK_SIZE = 16
WASTE_MAX_BATCH = 32

# ---- exercise 1: a token's slot -----------------------------------------------------------
SLOT_BLOCK_TABLE = (7, 2, 9, 4)
SLOT_BLOCK_SIZE = 16
SLOT_POSITION = 37

# ---- exercise 2: a prefix-cache hit -------------------------------------------------------
HIT_BLOCK_SIZE = 16
HIT_SYSTEM_LEN = 40  # tokens of the system prompt both requests share
HIT_OWN_LEN = 25  # tokens of the second request's own question after it

# ---- exercise 3: the most a block table wastes --------------------------------------------
WASTE_Q_BLOCK_SIZE = 16


def slot_for_position(answer: Any) -> CheckResult:
    """A request's block table is SLOT_BLOCK_TABLE with SLOT_BLOCK_SIZE tokens per block. Into
    which flat KV-cache slot (slot = block_id × block_size + offset) does the token at position
    SLOT_POSITION (0-based) go?"""
    table, bs, pos = SLOT_BLOCK_TABLE, SLOT_BLOCK_SIZE, SLOT_POSITION
    expected = table[pos // bs] * bs + pos % bs
    mistakes = [
        (
            pos,
            tr(
                "that is the token's logical position; the block table maps its logical block to a "
                "physical one elsewhere in the pool.",
                "这是 token 的逻辑位置；块表会把它所在的逻辑块映射到池子里别处的一个 KV 块。",
            ),
        ),
        (
            table[pos // bs] + pos % bs,
            tr(
                "the block id counts blocks, not slots: multiply it by the "
                "block size before adding the offset.",
                "块号数的是块，不是槽位：先乘以块大小，再加偏移。",
            ),
        ),
        (
            table[pos // bs] * bs + pos,
            tr(
                "the offset inside a block is the position modulo the block size.",
                "块内偏移是位置对块大小取模。",
            ),
        ),
    ]
    if pos // bs + 1 < len(table):
        mistakes.append(
            (
                table[pos // bs + 1] * bs + pos % bs,
                tr(
                    "logical block indices start at 0: which block does position // block_size give?",
                    "逻辑块的编号从 0 开始：position // block_size 给出的是哪一块？",
                ),
            )
        )
    if pos // bs >= 1:
        mistakes.append(
            (
                table[pos // bs - 1] * bs + pos % bs,
                tr(
                    "position // block_size is the logical block; recount it.",
                    "position // block_size 就是逻辑块；再数一遍。",
                ),
            )
        )
    return check_number(
        "ch11.slot_for_position",
        answer,
        expected,
        rel=1e-9,
        mistakes=mistakes,
        default_hint=tr(
            "logical block = position // block_size, offset = position % "
            "block_size; look the logical block up in the table.",
            "逻辑块 = position // block_size，偏移 = position % block_size；"
            "再到块表里查这个逻辑块。",
        ),
    )


def _hit_expected() -> int:
    """Run the case on a real KVCacheManager: the first request computes, the second asks."""
    from llmlab.kvcache import KVCacheManager
    from llmlab.request import Request
    from llmlab.sampling import SamplingParams

    mgr = KVCacheManager(num_blocks=32, block_size=HIT_BLOCK_SIZE, enable_caching=True)
    system = list(range(1000, 1000 + HIT_SYSTEM_LEN))
    first = Request("first", system + [1, 2, 3], SamplingParams(), arrival_time=0.0)
    mgr.allocate_slots(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    second = Request(
        "second", system + list(range(2000, 2000 + HIT_OWN_LEN)), SamplingParams(), arrival_time=0.0
    )
    _, num_cached = mgr.get_computed_blocks(second)
    return num_cached


def cached_tokens(answer: Any) -> CheckResult:
    """Two requests share a HIT_SYSTEM_LEN-token system prompt; then the first has 3 tokens of
    its own, the second HIT_OWN_LEN. The first has been prefilled (block size HIT_BLOCK_SIZE,
    prefix caching on). How many of the second request's tokens come from the prefix cache
    (its `num_cached_tokens`)?"""
    expected = _hit_expected()
    bs = HIT_BLOCK_SIZE
    return check_number(
        "ch11.cached_tokens",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                HIT_SYSTEM_LEN,
                tr(
                    "only whole blocks are cached and looked up: a block that mixes shared "
                    "and own tokens has a different hash for each request.",
                    "只有整块才会被缓存和查找：一个块里既有共享的 token 又有自己的 token，"
                    "它的块哈希在两个请求里就不一样。",
                ),
            ),
            (
                cdiv(HIT_SYSTEM_LEN, bs) * bs,
                tr(
                    "round down, not up: the partly shared block differs.",
                    "要向下取整，不是向上：只共享了一部分的那个块是不同的。",
                ),
            ),
            (
                HIT_SYSTEM_LEN + HIT_OWN_LEN,
                tr(
                    "only the shared prefix can match a cached block.",
                    "只有共享的前缀才能命中缓存的块。",
                ),
            ),
            (HIT_SYSTEM_LEN // bs, tr("count tokens, not blocks.", "数的是 token，不是块。")),
        ],
        default_hint=tr(
            "how many whole blocks of the second prompt are identical to the first's?",
            "第二个 prompt 有多少个整块和第一个的完全相同？",
        ),
    )


def max_wasted_slots(answer: Any) -> CheckResult:
    """With WASTE_Q_BLOCK_SIZE tokens per block, at most how many slots of one request's block
    table can hold no token?"""
    bs = WASTE_Q_BLOCK_SIZE
    return check_number(
        "ch11.max_wasted_slots",
        answer,
        bs - 1,
        rel=1e-9,
        mistakes=[
            (
                bs,
                tr(
                    "a block is taken only when a token needs it, so the last block holds at least one.",
                    "只有当某个 token 需要时才会占用一个块，所以最后一块里至少有一个 token。",
                ),
            ),
            (
                0.0,
                tr("the last block is usually only partly filled.", "最后一块通常只填了一部分。"),
            ),
            (
                bs / 2,
                tr(
                    "that is the average over random lengths; the question asks for the most.",
                    "这是长度随机时的平均值；题目问的是最多。",
                ),
            ),
        ],
        default_hint=tr(
            "only the last block of a table can be partly empty.",
            "一张块表里只有最后一块可能没填满。",
        ),
    )


# ---- the source chapter's question 5 -------------------------------------------------------------
Q5_DESIGNS = ("block_table", "prefix_sharing", "block_eviction", "request_scheduling", "preemption")
# more concepts than designs, in no particular order: some are there to be ruled out
Q5_CONCEPTS = (
    "swapping",
    "segmentation",
    "shared_pages",
    "process_scheduling",
    "copy_on_write",
    "paging",
    "fifo_replacement",
    "lru_replacement",
    "demand_paging",
)
# the defensible mappings (several for some designs); docs/instructors.md lists them
Q5_ACCEPTED = {
    "block_table": frozenset({"paging", "demand_paging"}),
    "prefix_sharing": frozenset({"shared_pages"}),
    "block_eviction": frozenset({"lru_replacement"}),
    "request_scheduling": frozenset({"process_scheduling"}),
    # vLLM V1 frees a preempted request's blocks and recomputes its KV when it runs again
    # (preemptive scheduling; the cache re-made on demand); older vLLM could also swap it out
    "preemption": frozenset({"swapping", "process_scheduling", "demand_paging"}),
}
_Q5_WHY_WRONG = {  # (English, Chinese)
    "copy_on_write": (
        "copy-on-write copies a shared page when someone writes to it; in vLLM V1 a "
        "shared block is full, found by its hash and never written, so nothing is "
        "ever copied (older vLLM copied blocks for parallel sampling and beam search).",
        "写时复制是在有人写共享页时把它复制一份；在 vLLM V1 里，共享的块都是满的，"
        "靠块哈希找到，从不被写，所以什么也不会被复制（旧版 vLLM 在并行采样和 beam search 时会复制块）。",
    ),
    "segmentation": (
        "a segment is one variable-size contiguous region: that is the contiguous "
        "per-request reservation PagedAttention replaced.",
        "一个段是一块大小可变的连续区域：这正是 PagedAttention 取代掉的那种按请求预留连续空间的做法。",
    ),
    "fifo_replacement": (
        "FIFO evicts what was loaded first; vLLM evicts the free cached block that "
        "was freed longest ago, i.e. used least recently.",
        "FIFO 淘汰最早装入的；vLLM 淘汰的是释放得最早的那个空闲缓存块，也就是最久没被用过的。",
    ),
}
_Q5_HINTS = {
    "block_table": (
        "a per-request map from logical blocks to physical blocks anywhere in memory: "
        "which OS structure maps a process's addresses that way?",
        "每个请求一张映射，把逻辑块映射到显存中任意位置的 KV 块：操作系统里哪种结构是这样映射进程地址的？",
    ),
    "prefix_sharing": (
        "several requests' tables point at one read-only physical block, counted "
        "by a reference count: which OS mechanism lets processes map the same "
        "pages (a shared library, the page cache)?",
        "几个请求的块表指向同一个只读的 KV 块，用引用计数记着：操作系统里哪种机制让多个进程"
        "映射同一批页（共享库、页缓存）？",
    ),
    "block_eviction": (
        "a free block that still holds a cached prefix is reused when memory runs "
        "out, the one unused for longest first: which replacement policy is that?",
        "显存不够时，仍存着缓存前缀的空闲块会被重新使用，最久没用的先用：这是哪种替换策略？",
    ),
    "request_scheduling": (
        "every step the engine picks which ready requests run next on the "
        "accelerator: which OS job picks the next process for a core?",
        "每一步引擎都要挑出哪些就绪的请求接下来在加速器上跑：操作系统里哪项工作是给一个核挑下一个进程？",
    ),
    "preemption": (
        "a running request is stopped and loses its memory to others, then resumes "
        "later (vLLM V1 recomputes its KV when it runs again; older vLLM could also copy "
        "it out to CPU memory): which OS mechanism stops a process for others, or takes "
        "its pages away and brings them back?",
        "一个运行中的请求被停下，把显存让给别人，之后再恢复（vLLM V1 在它再次运行时重新计算它的 KV；"
        "旧版 vLLM 也可以把它复制到 CPU 内存里）：操作系统里哪种机制让一个进程给别人让路，"
        "或者把它的页拿走、之后再拿回来？",
    ),
}


def source_q5(answer: Any) -> CheckResult:
    """The source chapter's question 5. Answer a dict mapping each of Q5_DESIGNS (a vLLM design)
    to the operating-system concept it borrows, one of Q5_CONCEPTS (more concepts than designs;
    some designs have more than one defensible answer, `Q5_ACCEPTED`)."""
    return check_matching(
        "ch11.source_q5",
        answer,
        Q5_ACCEPTED,
        choices=Q5_CONCEPTS,
        hints={key: tr(*pair) for key, pair in _Q5_HINTS.items()},
        why_wrong={key: tr(*pair) for key, pair in _Q5_WHY_WRONG.items()},
        success=tr(
            "right: much of vLLM is an operating system's memory manager "
            "and scheduler applied to KV blocks and requests.",
            "对：vLLM 的很大一部分，就是把操作系统的内存管理器和调度器用在了 KV 块和请求上。",
        ),
    )


# ---- eviction: which cached block does the free queue hand out first? ---------------------
EVICT_BLOCK_SIZE = 4
EVICT_NUM_BLOCKS = 20
EVICT_PREFIX = tuple(range(100, 108))  # 8 tokens both requests share
EVICT_A_OWN = tuple(range(200, 206))  # A's own 6 tokens after the prefix
EVICT_B_OWN = tuple(range(300, 305))  # B's own 5 tokens after the prefix


def _evict_run() -> tuple[list[tuple[int, bool]], set[int], set[int]]:
    """Run the eviction case on a real manager: A is prefilled, then B (hitting A's prefix);
    A finishes, then B. Returns the free queue head to tail as (block id, holds a cached
    prefix), the ids of the blocks A or B ever held, and the ids of the shared prefix blocks."""
    from llmlab.kvcache import KVCacheManager
    from llmlab.request import Request
    from llmlab.sampling import SamplingParams

    mgr = KVCacheManager(EVICT_NUM_BLOCKS, EVICT_BLOCK_SIZE, enable_caching=True)
    reqs = [
        Request(rid, list(EVICT_PREFIX + own), SamplingParams(), arrival_time=0.0)
        for rid, own in (("A", EVICT_A_OWN), ("B", EVICT_B_OWN))
    ]
    used: set[int] = set()
    for req in reqs:
        hits, num_cached = mgr.get_computed_blocks(req)
        mgr.allocate_slots(req, req.num_tokens - num_cached, hits)
        req.num_computed_tokens = req.num_tokens
        used.update(mgr.get_block_ids(req.request_id))
    prefix_ids = set(mgr.get_block_ids("A")[: len(EVICT_PREFIX) // EVICT_BLOCK_SIZE])
    for req in reqs:
        mgr.free(req)
    queue = [(b.block_id, b.is_cached) for b in mgr.block_pool.free_block_queue]
    return queue, used, prefix_ids


def _evict_expected() -> dict[str, int]:
    queue, _, prefix_ids = _evict_run()
    first = next(bid for bid, cached in queue if cached)
    safe = next(i for i, (bid, _) in enumerate(queue) if bid in prefix_ids)
    return {"first": first, "safe": safe}


def first_evicted(answer: Any) -> CheckResult:
    """A fresh pool of EVICT_NUM_BLOCKS blocks of EVICT_BLOCK_SIZE tokens, prefix caching on.
    A (EVICT_PREFIX + EVICT_A_OWN) is prefilled, then B (EVICT_PREFIX + EVICT_B_OWN); then A
    finishes, then B. Answer a dict: "first": the id of the first block holding a cached
    prefix that the pool hands out again (evicts); "safe": how many blocks new, unrelated
    requests can take before any block of the shared prefix is evicted."""
    ex = "ch11.first_evicted"
    expected = _evict_expected()
    for value in expected.values():
        record_expected(ex, value)
    missing = check_dict_keys(ex, answer, ("first", "safe"))
    if missing is not None:
        return missing
    from llmlab.course.check.core import as_number

    first, safe = as_number(answer["first"]), as_number(answer["safe"])
    if first is None or safe is None:
        return report(
            not_yet(
                ex,
                tr(
                    "both values must be numbers (a block id and a count).",
                    "两个值都必须是数（一个块号和一个数目）。",
                ),
            )
        )
    if first == expected["first"] and safe == expected["safe"]:
        return report(
            passed(
                ex,
                tr(
                    "right: the never-used blocks go first, then each finished "
                    "table from its tail, so a shared prefix is evicted last.",
                    "对：从没用过的块最先被分出去，然后是每张已完成的块表从尾部开始，"
                    "所以共享的前缀最后才被淘汰。",
                ),
            )
        )
    queue, used, _ = _evict_run()
    never_used = {bid for bid, _ in queue} - used
    cached = dict(queue)
    problems = []
    if first != expected["first"]:
        if first == min(used):
            problems.append(
                tr(
                    "first: that block was allocated first, but the queue orders blocks "
                    "by when they were freed, not when they were allocated.",
                    "first：那个块是最先分配的，但队列按块被释放的先后排序，而不是按分配的先后。",
                )
            )
        elif first in never_used:
            problems.append(
                tr(
                    "first: that block is handed out early, but it was never used, so it "
                    "holds no cached prefix: nothing is evicted when it goes.",
                    "first：那个块确实很早就被分出去，但它从没被用过，里面没有缓存的前缀："
                    "把它分出去时并没有淘汰任何东西。",
                )
            )
        elif first in used and not cached.get(int(first), True):
            problems.append(
                tr(
                    "first: that block was only partly filled; only full blocks get a "
                    "hash, so it holds no cached prefix.",
                    "first：那个块只填了一部分；只有满的块才有块哈希，所以它里面没有缓存的前缀。",
                )
            )
        else:
            problems.append(
                tr(
                    "first: not the first cached block the queue reaches.",
                    "first：这不是队列遇到的第一个缓存块。",
                )
            )
    if safe != expected["safe"]:
        if safe == len(never_used):
            problems.append(
                tr(
                    "safe: you counted the never-used blocks only; A's and B's own "
                    "blocks were freed before the prefix blocks and go before them too.",
                    "safe：你只数了从没用过的块；A 和 B 自己的块比前缀块释放得早，也排在它们前面。",
                )
            )
        elif safe in (EVICT_NUM_BLOCKS, EVICT_NUM_BLOCKS - 1):
            problems.append(
                tr(
                    "safe: the prefix's blocks are not the last ones in the queue: "
                    "which of them was freed first?",
                    "safe：前缀的块并不在队列的最后：它们当中哪个最先被释放？",
                )
            )
        else:
            problems.append(
                tr(
                    "safe: recount the queue up to the first prefix block in it.",
                    "safe：从队头数到第一个前缀块，再数一遍。",
                )
            )
    then = tr(
        "free() releases a table last block first; a block joins the queue's tail only "
        "when its reference count reaches 0; the pool hands out from the head; only full "
        "blocks carry a hash.",
        "free() 从块表的最后一块开始释放；一个块只有在引用计数降到 0 时才加入队尾；"
        "块池从队头分出块；只有满的块才带块哈希。",
    )
    return report(not_yet(ex, staged(ex, " ".join(problems), then)))


# ---- chunked prefill: steps for a long prompt beside running decodes -------------------------
CHUNK_PROMPT_LEN = 1020
CHUNK_BUDGET = 256  # max_num_batched_tokens
CHUNK_DECODES = 3  # requests already decoding when the long prompt arrives


def chunked_prefill_steps(answer: Any) -> CheckResult:
    """CHUNK_DECODES requests are decoding when a CHUNK_PROMPT_LEN-token prompt arrives;
    max_num_batched_tokens is CHUNK_BUDGET, chunked prefill on, plenty of KV blocks. In how
    many steps is the prompt prefilled (its first token sampled)?"""
    from llmlab.analysis.blocks import chunked_prefill_schedule

    expected = len(chunked_prefill_schedule(CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES))
    per_step = CHUNK_BUDGET - CHUNK_DECODES
    naive = -(-CHUNK_PROMPT_LEN // CHUNK_BUDGET)
    return check_number(
        "ch11.chunked_prefill_steps",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                naive,
                tr(
                    "you gave the prompt the whole budget; the running decodes are scheduled first "
                    "and take their tokens out of every step's budget.",
                    "你把整份预算都给了这个 prompt；正在跑的 decode 会先被调度，每一步都要从预算里拿走它们的 token。",
                ),
            ),
            (
                CHUNK_PROMPT_LEN // per_step,
                tr(
                    "a partial last chunk is still a step: round up.",
                    "最后不满的一块也要占一步：向上取整。",
                ),
            ),
            (
                1,
                tr(
                    "with chunked prefill a prompt longer than the budget is split over steps.",
                    "开了 chunked prefill，比预算长的 prompt 会被拆到好几步里。",
                ),
            ),
        ],
        default_hint=tr(
            "count the prompt tokens each step leaves room for, then the steps.",
            "先数每一步还能给 prompt 留多少 token，再数步数。",
        ),
        formula=tr(
            "running requests are served first (one token per decode), the waiting prompt "
            "gets what is left of max_num_batched_tokens; steps = ceil(prompt / that).",
            "先服务正在跑的请求（每个 decode 一个 token），等待中的 prompt 拿 max_num_batched_tokens "
            "剩下的部分；步数 = ceil(prompt / 剩下的部分)。",
        ),
    )


# ---- the block-allocation explorer's task ------------------------------------------------
EXPLORER_STAGE = 4  # 1-based stage label in manager_walkthrough(): "A finishes"


def _explorer_expected() -> int:
    from llmlab.analysis.blocks import manager_walkthrough

    snap = manager_walkthrough(block_size=4, num_blocks=24, prefix_len=8)[EXPLORER_STAGE - 1]
    return sum(1 for b in snap.blocks if b.ref_cnt == 0 and b.cached)


def explorer_cached_free(answer: Any) -> CheckResult:
    """In the block-allocation explorer (manager_walkthrough(block_size=4, num_blocks=24,
    prefix_len=8)), at stage EXPLORER_STAGE: how many blocks are free and still findable in the
    prefix cache?"""
    expected = _explorer_expected()
    return check_number(
        "ch11.explorer_cached_free",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                0,
                tr(
                    "a finished request's full blocks keep their hash when they go back to the free "
                    "queue: look for grey, dotted blocks.",
                    "已完成请求的满块回到空闲块队列时会保留块哈希：找找灰色带点的块。",
                ),
            ),
            (
                expected + 2,
                tr(
                    "A's prefix blocks are still held by B (reference count 1): they are not free.",
                    "A 的前缀块还被 B 占着（引用计数为 1）：它们不是空闲的。",
                ),
            ),
            (
                expected + 1,
                tr(
                    "A's last block was only partly filled: it carries no hash.",
                    "A 的最后一块只填了一部分：它没有块哈希。",
                ),
            ),
        ],
        default_hint=tr(
            "move the slider to that stage and count the grey, dotted blocks.",
            "把滑块拖到那个阶段，数一数灰色带点的块。",
        ),
    )


# ---- why our ratio is not the source chapter's 24x -----------------------------------------------
RATIO_OPTIONS_EN = {
    "a": "With fewer requests, llmlab's scheduler and block manager take most of each step's time.",
    "b": "hf-sequential's tokens per second do not depend on how many requests wait, llmlab's do: "
    "with 12 requests at most 12 sequences share a step (fewer as they finish), so each read "
    "of the weights is spread over fewer tokens than with 64.",
    "c": "A CPU is memory-bound at small batches, so batching 12 requests helps less than "
    "batching 64.",
    "d": "Prefix caching finds fewer shared prefixes among 12 requests than among 64.",
    "e": "The fast workload's outputs are short (8 to 32 tokens, against 32 to 128), so the "
    "prompts' prefill, where one request alone already fills a matrix of many rows and "
    "batching gains little, is a larger share of the work.",
}
# the options in Chinese, for the notebook to print with tr(text, RATIO_OPTIONS_ZH[letter])
RATIO_OPTIONS_ZH = {
    "a": "请求少的时候，llmlab 的调度器和块管理器占去了每一步的大部分时间。",
    "b": "hf-sequential 每秒的 token 数与有多少请求在等无关，llmlab 的却有关：12 个请求时，一步里最多只有 "
    "12 条序列（完成一条少一条），所以每读一遍权重分摊到的 token 比 64 个请求时少。",
    "c": "CPU 在小 batch 时是 memory-bound 的，所以把 12 个请求放进一个 batch 的帮助不如 64 个。",
    "d": "12 个请求之间能找到的共享前缀比 64 个请求之间少，前缀缓存命中得少。",
    "e": "快速负载的输出很短（8 到 32 个 token，完整负载是 32 到 128），所以 prompt 的 prefill 占的工作更多；"
    "而 prefill 时一个请求本身就已是一个很多行的矩阵，batching 带来的收益很小。",
}
# shown in the language in use; the keys are what the student answers with
RATIO_OPTIONS = Bilingual(RATIO_OPTIONS_EN, RATIO_OPTIONS_ZH)
RATIO_CORRECT = frozenset({"b", "e"})
_RATIO_HINTS = {  # (English, Chinese)
    "a": (
        "the benchmark prints the scheduler's cost per step per request: microseconds, "
        "against a forward pass of tens of milliseconds.",
        "benchmark 打印了调度器每步、每个请求的开销：微秒级，而一次前向计算要几十毫秒。",
    ),
    "c": (
        "more memory-bound would mean batching helps *more*: a memory-bound step serves a "
        "bigger batch in about the same time.",
        "越是 memory-bound，batching 的帮助反而*越大*：memory-bound 的一步能在差不多的时间里服务更大的 batch。",
    ),
    "d": (
        "prefix caching is on in both runs and the benchmark's prompts share little: it changes "
        "nothing between 12 and 64 requests.",
        "两次运行都开着前缀缓存，而 benchmark 的 prompt 几乎没有共同部分：12 个和 64 个请求在这一点上没有区别。",
    ),
}


def ratio_reason(answer: Any) -> CheckResult:
    """Why does the chapter's 12-request run measure a far smaller llmlab / hf-sequential
    throughput ratio than the full 64-request benchmark on the same CPU? Answer the letters of
    every reason that holds (RATIO_OPTIONS), e.g. {"x", "y"}."""
    ex = "ch11.ratio_reason"
    if (
        isinstance(answer, (list, tuple, set, frozenset))
        and len(answer) == 1
        and {str(a).strip().lower() for a in answer} <= RATIO_CORRECT
    ):
        return report(
            not_yet(
                ex,
                tr(
                    "that reason holds, but it is not the only one.",
                    "这个原因成立，但不是唯一的一个。",
                ),
            )
        )
    if isinstance(answer, str) and answer.strip().lower() in RATIO_CORRECT:
        return report(
            not_yet(
                ex,
                tr(
                    "that reason holds, but it is not the only one: answer a set of letters.",
                    "这个原因成立，但不是唯一的一个：请回答一个字母集合。",
                ),
            )
        )
    return check_choice(
        ex,
        answer,
        set(RATIO_CORRECT),
        options=sorted(RATIO_OPTIONS),
        hints={key: tr(*pair) for key, pair in _RATIO_HINTS.items()},
    )


# ---- build exercise: the block pool (llmlab.course.build.ch11_pool) -----------------------------
POOL_MAX_EXAMPLES = 60  # drawn cases of operations (then the failing one is shrunk)
POOL_DRIVER = "llmlab.course.build.ch11_pool:"
# the build exercises of this chapter: exercise id -> the name of the student's class
BUILDS = {"ch11.block_pool": "MyBlockPool"}


@functools.lru_cache(maxsize=1)
def _package_pool_run() -> dict:
    """The package's BlockPool under the engine on the exercise's workload (tokens and
    measurements), computed once per process."""
    from llmlab.course.build.ch11_pool import run_engine
    from llmlab.kvcache import BlockPool

    return run_engine(BlockPool)


def block_pool(answer: Any) -> CheckResult:
    """Your block pool class (a subclass of `llmlab.course.build.ch11_pool.BlockPoolBase` with
    get_new_blocks, touch, free_blocks, cache_full_blocks and find_cached_blocks). Checked on
    POOL_MAX_EXAMPLES drawn sequences of operations against the package's pool (the first
    difference shrunk to the smallest case), then plugged into the engine on SmolLM2, where its
    tokens must equal the package's; the measured hit rate, peak blocks and throughput are shown
    beside the package's."""
    ex = "ch11.block_pool"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    stand_in = getattr(answer, "grader_stand_in", False)
    if not stand_in and not isinstance(answer, type):
        return report(
            not_yet(
                ex,
                tr(
                    f"pass your block pool class itself (MyBlockPool), got {type(answer).__name__}.",
                    f"请传入你的块池类本身（MyBlockPool），你给的是 {type(answer).__name__}。",
                ),
            )
        )
    from llmlab.course.build import ch11_pool as pool
    from llmlab.course.build import drive, find_counterexample

    if stand_in:  # the grader: the package's engine run first, before the sandbox's clock starts
        _package_pool_run()
    cex = find_counterexample(
        pool.pool_cases(),
        lambda case: drive(answer, POOL_DRIVER + "observe_pool", case),
        lambda case: pool.observe_pool(pool.REFERENCE_POOL, case),
        max_examples=POOL_MAX_EXAMPLES,
    )
    then = tr(
        "The rules: get_new_blocks takes blocks from the head of the free queue and drops a "
        "cached block's hash before handing it out; touch takes a reference (a free block leaves "
        "the queue); free_blocks drops one, and a block that reaches 0 joins the tail with its "
        "hash kept; cache_full_blocks chains each hash on the previous block's and files every "
        "newly full block under it, beside any other block with the same prefix.",
        "规则是：get_new_blocks 从空闲块队列的队头取块，分出去之前先去掉缓存块的块哈希；"
        "touch 加一个引用（空闲的块要离开队列）；free_blocks 减一个引用，降到 0 的块带着块哈希"
        "排到队尾；cache_full_blocks 把每个块哈希接在前一块的块哈希后面，把每个新写满的块登记"
        "在它的块哈希下，和前缀相同的其他块并存。",
    )
    if cex is not None:
        en, zh = pool.explain(cex.case, cex.got, cex.expected)
        first = tr(f"your pool differs from the package's {en}", f"你的块池和包里的不一样，{zh}")
        return report(not_yet(ex, staged(ex, first, then)))
    try:
        got = drive(answer, POOL_DRIVER + "run_engine")
    except Exception as e:  # the student's pool inside the engine
        return report(
            not_yet(
                ex,
                tr(
                    f"your pool agrees with the package's on the drawn cases, but plugged into the "
                    f"engine it raised {type(e).__name__}: {e}",
                    f"你的块池在抽到的用例上和包里的一致，但接进引擎后抛出了 {type(e).__name__}：{e}",
                ),
            )
        )
    ref = _package_pool_run()
    wrong = [rid for rid in ref["tokens"] if got["tokens"].get(rid) != ref["tokens"][rid]]
    if wrong:
        rid = wrong[0]
        return report(
            not_yet(
                ex,
                tr(
                    f"your pool agrees with the package's on the drawn cases, but plugged into the "
                    f"engine request {rid!r} got tokens {got['tokens'].get(rid)} where the "
                    f"package's pool gives {ref['tokens'][rid]} (a hit that served K/V of other "
                    f"tokens?)",
                    f"你的块池在抽到的用例上和包里的一致，但接进引擎后，请求 {rid!r} 得到的 token 是 "
                    f"{got['tokens'].get(rid)}，而包里的块池给出的是 {ref['tokens'][rid]}"
                    f"（是不是某次命中拿到了别的 token 的 K/V？）",
                ),
            )
        )
    speed = got["tokens_per_s"] / ref["tokens_per_s"] if ref["tokens_per_s"] else 1.0
    n = len(ref["tokens"])
    return report(
        passed(
            ex,
            tr(
                f"right: your pool matches the package's on {POOL_MAX_EXAMPLES} drawn sequences of "
                f"operations, and in the engine (SmolLM2, {n} requests: a shared prefix, two "
                f"identical prompts in one step, evictions) it gives the package's tokens. "
                f"Measured here, yours (the package's): prefix-cache hit rate "
                f"{got['hit_rate']:.0%} ({ref['hit_rate']:.0%}), blocks held at peak "
                f"{got['peak_blocks']} of {got['num_blocks']} ({ref['peak_blocks']}), throughput "
                f"{got['tokens_per_s']:.1f} ({ref['tokens_per_s']:.1f}) tokens/s: {speed:.2f}x "
                f"the package's speed.",
                f"对：你的块池在 {POOL_MAX_EXAMPLES} 个抽到的操作序列上和包里的一致，接进引擎后"
                f"（SmolLM2，{n} 个请求：共享前缀、同一步到达的两个相同 prompt、淘汰）给出的 token "
                f"也和包里的相同。在这台机器上测得，你的（包里的）：前缀缓存命中率 "
                f"{got['hit_rate']:.0%}（{ref['hit_rate']:.0%}），峰值占用 {got['peak_blocks']} / "
                f"{got['num_blocks']} 个块（{ref['peak_blocks']}），吞吐 {got['tokens_per_s']:.1f}"
                f"（{ref['tokens_per_s']:.1f}）token/s：速度是包里的 {speed:.2f} 倍。",
            ),
        )
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "slot_for_position": ExerciseInfo(
        "plug-in",
        mistakes=(
            "logical position as the slot",
            "block id not scaled by the block size",
            "position instead of offset",
            "off-by-one logical block",
        ),
    ),
    "cached_tokens": ExerciseInfo(
        "plug-in",
        mistakes=("partial block counted as a hit", "rounded up", "blocks instead of tokens"),
    ),
    "first_evicted": ExerciseInfo(
        "reasoning",
        mistakes=(
            "oldest allocation evicted first",
            "never-used block taken for a cached one",
            "partial block taken for a cached one",
            "only the never-used blocks counted",
            "the prefix taken as the queue's last block",
        ),
    ),
    "chunked_prefill_steps": ExerciseInfo(
        "reasoning",
        mistakes=(
            "decodes' tokens not taken from the budget",
            "rounded down",
            "whole prompt in one step",
        ),
    ),
    "explorer_cached_free": ExerciseInfo(
        "plug-in",
        mistakes=(
            "freed blocks thought uncached",
            "blocks still held counted as free",
            "partial block counted as cached",
        ),
    ),
    "ratio_reason": ExerciseInfo(
        "reasoning",
        mistakes=(
            "scheduler overhead blamed",
            "memory-bound thought to hurt batching",
            "prefix caching blamed",
            "only one of two reasons",
        ),
    ),
    "block_pool": ExerciseInfo(
        "reasoning",
        mistakes=(
            "freed block put at the head of the free queue",
            "reference count not dropped on free",
            "cached block handed out with its hash kept",
            "a same-prefix block replaces the other in the cache",
        ),
    ),
    "source_q5": ExerciseInfo(
        "reasoning",
        mistakes=(
            "copy-on-write for prefix sharing",
            "segmentation for block tables",
            "FIFO for LRU eviction",
        ),
        source_question=5,
    ),
}


# ---- build exercise: chunked prefill (the student's plan_step) ----------------------------------
BUILDS["ch11.build_chunked_prefill"] = "plan_step"
CHUNK_DRIVERS = "llmlab.course.build.ch11_chunk"
CHUNK_MAX_EXAMPLES = 50
# plugged in: three short requests decode when a prompt of CHUNK_ENGINE_LONG tokens arrives
CHUNK_ENGINE_LONG = 70
CHUNK_ENGINE_WORKLOAD = {
    "first": [list(range(20 + 9 * i, 26 + 9 * i)) for i in range(CHUNK_DECODES)],
    "later": [list(range(100, 100 + CHUNK_ENGINE_LONG))],
    "max_tokens": 6,
    "engine": {
        "block_size": 16,
        "num_kv_blocks": 64,
        "max_model_len": 128,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
    },
}


def plan_cases():
    """Step states: some requests decoding (1 token left each), perhaps one part-way through its
    prompt (the last running one), waiting prompts, and the step's budget."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        decodes = draw(st.integers(0, 4))
        partial = draw(st.one_of(st.none(), st.integers(2, 40)))
        lefts = [1] * decodes + ([] if partial is None else [partial])
        waiting = draw(st.lists(st.integers(1, 40), max_size=3))
        names = [chr(65 + i) for i in range(len(lefts) + len(waiting))]
        return {
            "running": [[names[i], n] for i, n in enumerate(lefts)],
            "waiting": [[names[len(lefts) + i], n] for i, n in enumerate(waiting)],
            "budget": draw(st.integers(1, 48)),
        }

    return cases()


def _fmt_plan(plan: Any) -> str:
    if plan and plan[0] == "raised":
        return tr(f"raised {plan[1]}: {plan[2]}", f"抛出了 {plan[1]}：{plan[2]}")
    return "[" + ", ".join(f"{rid}:{n}" for rid, n in plan) + "]"


def _plan_rule(case: dict, got: list, expected: list) -> str:
    """Which rule of chunked prefill the student's plan broke on `case`."""
    budget = case["budget"]
    running = {rid for rid, _ in case["running"]}
    if not got or got[0] == "raised":
        return ""
    counts = [n for _, n in got]
    ids = [rid for rid, _ in got]
    if any(n > budget for n in counts):
        return tr(
            "a prompt longer than what is left of the budget is cut into a chunk of what is "
            "left; the rest comes in later steps.",
            "比剩余预算长的 prompt 要切成剩余预算那么大的一块；其余的在后面几步里算。",
        )
    if sum(counts) > budget:
        return tr(
            "over the budget: the tokens already in the step (the decodes, and any request "
            "before) come out of the budget first, and a prompt's chunk gets only what is left.",
            "超出了预算：这一步里已经排上的 token（decode，以及排在前面的请求）先从预算里扣掉，"
            "prompt 的分块只能拿剩下的。",
        )
    if any(n <= 0 for n in counts):
        return tr(
            "a chunk of 0 tokens makes no progress: schedule a request only when it gets at "
            "least one token, and stop once the budget is spent.",
            "0 个 token 的分块没有任何进展：只有能分到至少一个 token 的请求才调度；预算用完就停。",
        )
    first_waiting = next((i for i, rid in enumerate(ids) if rid not in running), len(ids))
    skipped = [rid for rid, _ in expected if rid in running and rid not in ids]
    if any(rid in running for rid in ids[first_waiting:]) or (first_waiting < len(ids) and skipped):
        return tr(
            "decodes first: every running request (decoding, or part-way through its prompt) is "
            "scheduled before a waiting prompt gets a chunk.",
            "decode 优先：每个运行中的请求（在 decode 的，或 prompt 算到一半的）都要排在等待中的 prompt 分块之前。",
        )
    return tr(
        "in order, each request gets min(tokens it has left, budget left): one token for a "
        "decode, the rest of a prompt or a chunk of it.",
        "按顺序，每个请求拿 min(它还剩的 token 数, 剩余预算)：decode 拿一个 token，prompt 拿剩下的全部或其中一块。",
    )


def _describe_plan_case(case: dict) -> str:
    running = ", ".join(f"{rid}:{n}" for rid, n in case["running"]) or "-"
    waiting = ", ".join(f"{rid}:{n}" for rid, n in case["waiting"]) or "-"
    return tr(
        f"running [{running}] (tokens left), waiting [{waiting}] (prompt tokens), budget "
        f"{case['budget']}",
        f"运行中 [{running}]（还剩的 token 数），等待中 [{waiting}]（prompt token 数），"
        f"预算 {case['budget']}",
    )


def build_chunked_prefill(answer: Any) -> CheckResult:
    """Chapter 11's build exercise: `answer` is the student's `plan_step(running, waiting,
    budget)` (see `llmlab.course.build.ch11_chunk`). Checked (1) against the package's
    `Scheduler` on step states drawn by hypothesis (the smallest disagreeing one in the hint),
    (2) on the chapter's prediction (CHUNK_PROMPT_LEN tokens beside CHUNK_DECODES decodes under
    CHUNK_BUDGET), (3) plugged into the engine: the same tokens and steps as the package's
    `enable_chunked_prefill=True`."""
    from llmlab.analysis.blocks import chunked_prefill_schedule
    from llmlab.course.build import drive, find_counterexample
    from llmlab.course.build.ch11_chunk import package_plan, run_engine
    from llmlab.course.check.core import NOT_ANSWERED

    ex = "ch11.build_chunked_prefill"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not callable(answer):
        return report(
            not_yet(
                ex,
                tr(
                    f"expected your function plan_step, got {type(answer).__name__}.",
                    f"这里要你的函数 plan_step，你给的是 {type(answer).__name__}。",
                ),
            )
        )
    cex = find_counterexample(
        plan_cases(),
        lambda case: drive(answer, f"{CHUNK_DRIVERS}:observe_plans", [case])[0],
        package_plan,
        max_examples=CHUNK_MAX_EXAMPLES,
    )
    if cex is not None:
        got = cex.got
        if not isinstance(got, list):  # the sandbox itself failed (a Raised)
            got = ["raised", getattr(got, "error", "Error"), getattr(got, "message", str(got))]
        return report(
            not_yet(
                ex,
                tr(
                    f"{_describe_plan_case(cex.case)}: your plan {_fmt_plan(got)}; the "
                    f"package's scheduler {_fmt_plan(cex.expected)}. {_plan_rule(cex.case, got, cex.expected)}",
                    f"{_describe_plan_case(cex.case)}：你的计划是 {_fmt_plan(got)}；包里的调度器是 "
                    f"{_fmt_plan(cex.expected)}。{_plan_rule(cex.case, got, cex.expected)}",
                ),
            )
        )
    expected_steps = len(chunked_prefill_schedule(CHUNK_PROMPT_LEN, CHUNK_BUDGET, CHUNK_DECODES))
    try:
        mine = drive(
            answer,
            f"{CHUNK_DRIVERS}:prefill_steps",
            CHUNK_PROMPT_LEN,
            CHUNK_BUDGET,
            CHUNK_DECODES,
        )
        engine = drive(answer, f"{CHUNK_DRIVERS}:run_engine", CHUNK_ENGINE_WORKLOAD)
    except Exception as e:  # the student's function inside the scheduler
        return report(
            not_yet(
                ex,
                tr(
                    f"inside the scheduler, your plan_step raised {type(e).__name__}: {e}",
                    f"放进调度器后，你的 plan_step 抛出了 {type(e).__name__}：{e}",
                ),
            )
        )
    ref = run_engine(None, CHUNK_ENGINE_WORKLOAD)
    if mine["steps"] != expected_steps:
        return report(
            not_yet(
                ex,
                tr(
                    f"your plan prefills the {CHUNK_PROMPT_LEN:,}-token prompt beside "
                    f"{CHUNK_DECODES} decodes in {mine['steps']} steps under a budget of "
                    f"{CHUNK_BUDGET}, not in the number Exercise 5 predicts.",
                    f"在 {CHUNK_BUDGET} 的预算下、旁边有 {CHUNK_DECODES} 个 decode，你的计划用 "
                    f"{mine['steps']} 步算完 {CHUNK_PROMPT_LEN} 个 token 的 prompt，和练习 5 预测的步数不同。",
                ),
            )
        )
    if engine["tokens"] != ref["tokens"] or engine["steps"] != ref["steps"]:
        return report(
            not_yet(
                ex,
                tr(
                    f"plugged into the engine (LLM(..., scheduler_cls=...)), your plan takes "
                    f"{engine['steps']} steps and its tokens "
                    f"{'equal' if engine['tokens'] == ref['tokens'] else 'differ from'} those of "
                    f"enable_chunked_prefill=True, which takes {ref['steps']}.",
                    f"接进引擎（LLM(..., scheduler_cls=...)）后，你的计划用了 {engine['steps']} 步，"
                    f"生成的 token {'和' if engine['tokens'] == ref['tokens'] else '不同于'} "
                    f"enable_chunked_prefill=True 的{'相同' if engine['tokens'] == ref['tokens'] else ''}"
                    f"（它用了 {ref['steps']} 步）。",
                ),
            )
        )
    chunks = ", ".join(map(str, mine["prefill"]))
    return report(
        passed(
            ex,
            tr(
                f"your plan prefills the {CHUNK_PROMPT_LEN:,}-token prompt beside {CHUNK_DECODES} "
                f"decodes in {mine['steps']} steps under a budget of {CHUNK_BUDGET} (chunks of "
                f"{chunks} tokens; the chapter predicted {expected_steps}). Plugged into the "
                f"engine: the same tokens as enable_chunked_prefill=True, in {engine['steps']} "
                f"steps to its {ref['steps']}.",
                f"在 {CHUNK_BUDGET} 的预算下、旁边有 {CHUNK_DECODES} 个 decode，你的计划用 "
                f"{mine['steps']} 步算完 {CHUNK_PROMPT_LEN} 个 token 的 prompt（分块为 {chunks} 个 "
                f"token；本章预测的是 {expected_steps} 步）。接进引擎后：生成的 token 和 "
                f"enable_chunked_prefill=True 完全相同，用了 {engine['steps']} 步，它用了 {ref['steps']} 步。",
            ),
        )
    )


EXERCISES["build_chunked_prefill"] = ExerciseInfo(
    "reasoning",
    mistakes=(
        "prompt scheduled whole beyond the budget",
        "chunk not counting the decodes already in the step",
        "chunk of 0 tokens",
        "prefill chunk before the decodes",
    ),
)


def __getattr__(name: str) -> Any:
    """`seed_q5`: the earlier name of `source_q5`, which notebooks handed out before the rename
    call; the call goes through `source_q5` as the module holds it then, so the grader records it
    under the current id."""
    if name == "seed_q5":
        return lambda answer: source_q5(answer)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
