"""Self-checks of chapter 01 (tokens): UTF-8 bytes, a BPE merge by hand and the merge step in code,
the measured tokens per Chinese character, characters that take one, two and three tokens (found
with the token viewer), token id bits, embedding table bytes, and what a larger vocabulary
changes."""

from __future__ import annotations

import math
from typing import Any

from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    check_matching,
    check_number,
    not_yet,
    passed,
    report,
    staged,
)
from llmlab.i18n import tr

# the strings and corpora the exercises ask about (the notebook prints them)
UTF8_TEXT = "你好, 世界 world 👋"  # 25 UTF-8 bytes
MERGE_CORPUS = "banana bandana"
VOCAB_SIZE = 49152  # SmolLM2's vocabulary
EMBED_PRESET = "llama-3-8b"


def combine_mistakes(*pairs: tuple[float, str]) -> list[tuple[float, str]]:
    """Mistake list for `check_number` in which mistakes that give the same value share one
    hint (both causes named), so the learner is never told only half the story."""
    merged: list[tuple[float, str]] = []
    for value, hint in pairs:
        for i, (v, h) in enumerate(merged):
            if math.isclose(v, value, rel_tol=1e-9):
                merged[i] = (v, tr(f"{h} Or: {hint}", f"{h}也可能是：{hint}"))
                break
        else:
            merged.append((value, hint))
    return merged


def utf8_bytes(answer: Any) -> CheckResult:
    """How many UTF-8 bytes does UTF8_TEXT take? (The byte-level BPE starts from these.)"""
    text = UTF8_TEXT
    expected = len(text.encode("utf-8"))
    chars = len(text)
    two_per_han = sum(2 if "\u4e00" <= c <= "\u9fff" else len(c.encode("utf-8")) for c in text)
    return check_number(
        "ch01.utf8_bytes",
        answer,
        expected,
        rel=1e-9,
        mistakes=combine_mistakes(
            (
                chars,
                tr(
                    "that counts characters (len of the str); count bytes: encode the text as UTF-8.",
                    "这数的是字符（str 的 len）；要数的是字节：把文本按 UTF-8 编码。",
                ),
            ),
            (
                two_per_han,
                tr(
                    "in UTF-8 a Chinese character takes 3 bytes, not 2 (2 is GBK or UTF-16).",
                    "在 UTF-8 里一个汉字占 3 个字节，不是 2 个（2 个是 GBK 或 UTF-16）。",
                ),
            ),
            (
                expected - 3,
                tr(
                    "the emoji is one character but 4 bytes in UTF-8; count all of them.",
                    "emoji 是一个字符，但在 UTF-8 里占 4 个字节；每个字节都要算上。",
                ),
            ),
        ),
        default_hint=tr(
            "not the number of UTF-8 bytes: the characters of this text do not all take "
            "the same number of bytes.",
            "不是 UTF-8 字节数：这段文本里的字符占的字节数并不都一样。",
        ),
        formula=tr(
            "ASCII takes 1 byte, a Chinese character 3, this emoji 4; add them up (or encode "
            "the text as UTF-8 and take the length).",
            "ASCII 字符占 1 个字节，汉字占 3 个，这个 emoji 占 4 个；把它们加起来（或者把文本"
            "按 UTF-8 编码后取长度）。",
        ),
    )


def first_merge(answer: Any) -> CheckResult:
    """Which piece does byte-level BPE create first when trained on MERGE_CORPUS?

    Answer with the merged piece as a str (e.g. "xy") or the pair as a tuple ("x", "y").
    """
    from llmlab.tokenizer import train_bpe

    ex = "ch01.first_merge"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if (
        isinstance(answer, (tuple, list))
        and len(answer) == 2
        and all(isinstance(a, str) for a in answer)
    ):
        answer = answer[0] + answer[1]
    if not isinstance(answer, str):
        return report(
            not_yet(
                ex,
                tr(
                    f"answer with a str (the merged piece), got {type(answer).__name__}.",
                    f"请用一个 str（合并出的片段）作答，你给的是 {type(answer).__name__}。",
                ),
            )
        )
    bpe = train_bpe(MERGE_CORPUS, 257)
    expected = bpe.vocab[256].decode("utf-8")
    if answer == expected:
        return report(passed(ex))
    if len(answer) != 2:
        return report(
            not_yet(
                ex,
                tr(
                    "the first merge joins exactly two bytes (here: two letters or a "
                    "space and a letter); answer with those two characters.",
                    "第一次合并恰好把两个字节连在一起（这里是两个字母，或一个空格加"
                    "一个字母）；请用这两个字符作答。",
                ),
            )
        )
    if answer not in MERGE_CORPUS:
        return report(
            not_yet(
                ex,
                tr(
                    "that pair never occurs next to each other in the corpus.",
                    "语料里这两个字符从来没有挨着出现过。",
                ),
            )
        )
    return report(
        not_yet(
            ex,
            staged(
                ex,
                tr(
                    "that pair occurs, but another one occurs more often.",
                    "这一对确实出现了，但另有一对出现得更多。",
                ),
                tr(
                    "Count every adjacent pair in both chunks ('banana' and "
                    "' bandana') and add up; a pair never spans two chunks.",
                    "把两个块（'banana' 和 ' bandana'）里每一对相邻字符都数出来"
                    "再相加；一对字符不会跨两个块。",
                ),
            ),
        )
    )


# (ids, pair, new_id): overlapping runs, pairs at both ends, no occurrence, a one-id sequence
MERGE_CASES = (
    ([1, 2, 3, 1, 2], (1, 2), 256),
    ([7, 7, 7], (7, 7), 300),
    ([7, 7, 7, 7], (7, 7), 300),
    ([5, 6, 5, 6, 6, 5], (6, 5), 257),
    ([4, 4], (4, 5), 260),
    ([9], (9, 9), 261),
    ([], (1, 2), 262),
)


def merge_function(fn: Any) -> CheckResult:
    """Write the step that applies one learned merge: fn(ids, pair, new_id) returns a new list
    in which every occurrence of `pair` (two adjacent ids), scanned left to right and without
    overlaps, is replaced by `new_id`."""
    from llmlab.tokenizer import _merge

    ex = "ch01.merge_function"
    if fn is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not callable(fn):
        return report(
            not_yet(
                ex,
                tr(
                    f"expected a function, got {type(fn).__name__}.",
                    f"这里要一个函数，你给的是 {type(fn).__name__}。",
                ),
            )
        )
    then = tr(
        "Walk i from the left: when ids[i], ids[i + 1] is the pair, emit new_id and move i on "
        "by two (the ids it used are gone); otherwise emit ids[i] and move on by one.",
        "让 i 从左往右走：ids[i], ids[i + 1] 正好是这一对时，输出 new_id，i 前进两步（用掉的"
        "两个 id 就没了）；否则输出 ids[i]，前进一步。",
    )
    for ids, pair, new_id in MERGE_CASES:
        want = _merge(ids, pair, new_id)
        try:
            got = fn(list(ids), pair, new_id)
        except Exception as e:  # the learner's code: report, never crash the notebook
            return report(
                not_yet(
                    ex,
                    tr(
                        f"your function raised {type(e).__name__} on ids={ids}, pair={pair}: {e}",
                        f"你的函数在 ids={ids}, pair={pair} 上抛出了 {type(e).__name__}：{e}",
                    ),
                )
            )
        if got is None:
            return report(
                not_yet(
                    ex,
                    tr(
                        "your function returns None: return the new list.",
                        "你的函数返回了 None：请返回新的列表。",
                    ),
                )
            )
        got = list(got)
        if got == want:
            continue
        if got == list(ids) and want != list(ids):
            first = tr(
                f"nothing was merged in ids={ids} with pair={pair}.",
                f"ids={ids}, pair={pair}：什么也没有合并。",
            )
        elif got.count(new_id) > want.count(new_id) and pair[0] == pair[1]:
            first = tr(
                f"ids={ids}, pair={pair}: an id used by one merge cannot also start the "
                f"next one (the occurrences must not overlap).",
                f"ids={ids}, pair={pair}：被一次合并用掉的 id 不能再当下一次合并的开头"
                f"（各次出现不能重叠）。",
            )
        elif got.count(new_id) > want.count(new_id):
            first = tr(
                f"ids={ids}, pair={pair}: you merged more often than the pair occurs.",
                f"ids={ids}, pair={pair}：你合并的次数比这一对出现的次数还多。",
            )
        elif got.count(new_id) < want.count(new_id):
            first = tr(
                f"ids={ids}, pair={pair}: you merged fewer occurrences than there are.",
                f"ids={ids}, pair={pair}：你合并的次数比这一对实际出现的次数少。",
            )
        elif len(got) != len(want):
            first = tr(
                f"ids={ids}, pair={pair}: the result has {len(got)} ids; each merge turns "
                f"two ids into one and leaves the others as they are.",
                f"ids={ids}, pair={pair}：结果有 {len(got)} 个 id；每次合并把两个 id 变成"
                f"一个，其余的保持原样。",
            )
        else:
            first = tr(
                f"ids={ids}, pair={pair}: the right length, but the wrong ids.",
                f"ids={ids}, pair={pair}：长度对了，但 id 不对。",
            )
        return report(not_yet(ex, staged(ex, first, then)))
    return report(
        passed(
            ex,
            tr(
                "correct: that is the step train_bpe repeats after every merge it learns.",
                "正确：train_bpe 每学到一次合并，都要重复这一步。",
            ),
        )
    )


def id_bits(answer: Any) -> CheckResult:
    """At least how many bits does one token id need for a vocabulary of VOCAB_SIZE?"""
    expected = math.ceil(math.log2(VOCAB_SIZE))
    return check_number(
        "ch01.id_bits",
        answer,
        expected,
        rel=1e-9,
        mistakes=[
            (
                math.floor(math.log2(VOCAB_SIZE)),
                tr(
                    "rounded down: that many bits cannot count up to the "
                    "vocabulary size; round up.",
                    "你向下取整了：这么多 bit 表示不了词表里的全部 id；应向上取整。",
                ),
            ),
            (
                math.log2(VOCAB_SIZE),
                tr("bits come in whole numbers; round up.", "bit 数只能是整数；向上取整。"),
            ),
            (
                expected / 8,
                tr(
                    "that is bytes; the question asks for bits.",
                    "这是 byte 数；题目问的是 bit 数。",
                ),
            ),
        ],
        default_hint=tr(
            "not the fewest bits that can tell every id of this vocabulary apart.",
            "这不是能把这个词表里每个 id 区分开的最少 bit 数。",
        ),
        formula=tr(
            "With n bits you can name 2**n different ids; find the smallest n for which that reaches "
            "the vocabulary size.",
            "n 个 bit 能表示 2**n 个不同的 id；找出使它达到词表大小的最小 n。",
        ),
    )


def embedding_bytes(answer: Any) -> CheckResult:
    """Bytes of the token embedding table of EMBED_PRESET (vocab × hidden) in BF16."""
    from llmlab.config import get_config

    cfg = get_config(EMBED_PRESET)
    params = cfg.vocab_size * cfg.hidden_size
    expected = params * 2
    return check_number(
        "ch01.embedding_bytes",
        answer,
        expected,
        rel=1e-3,
        mistakes=combine_mistakes(
            (
                params,
                tr(
                    "that is the number of parameters; multiply by the bytes per BF16 number.",
                    "这是参数个数；还要乘上每个 BF16 数占的字节数。",
                ),
            ),
            (
                params * 4,
                tr(
                    "that uses 4 bytes per number (FP32); BF16 has 2.",
                    "这里每个数按 4 个字节（FP32）算了；BF16 只占 2 个。",
                ),
            ),
            (
                2 * expected,
                tr(
                    "that counts the lm_head as well; this model does not tie it to the "
                    "embedding, but the question asks for the embedding table only.",
                    "这把 lm_head 也算进去了；这个模型的 lm_head 确实不和 embedding 共用权重，"
                    "但题目只问 embedding 表。",
                ),
            ),
            (
                expected * 8,
                tr(
                    "that is bits; the question asks for bytes.",
                    "这是 bit 数；题目问的是 byte 数。",
                ),
            ),
        ),
        default_hint=tr(
            "not the size of the table: count its numbers first, then the bytes per number.",
            "不是这张表的大小：先数表里有多少个数，再看每个数占几个字节。",
        ),
        formula=tr(
            "The table has one row of hidden_size numbers per vocabulary entry, 2 bytes per "
            "number in BF16.",
            "词表里每个条目在表中占一行，每行 hidden_size 个数；BF16 下每个数占 2 个字节。",
        ),
    )


def tokens_per_han(answer: Any) -> CheckResult:
    """Tokens per Chinese character of data/text/inference_zh.txt with the real tokenizer,
    as `llmlab.tokenizer.tokens_per_char` defines it (all tokens / Chinese characters)."""
    from llmlab.config import DATA_DIR
    from llmlab.tokenizer import count_tokens, real_tokenizer, tokens_per_char

    text = (DATA_DIR / "text" / "inference_zh.txt").read_text(encoding="utf-8")
    tok = real_tokenizer()
    expected = tokens_per_char(tok, text)
    per_len = count_tokens(tok, text) / len(text)
    return check_number(
        "ch01.tokens_per_han",
        answer,
        expected,
        rel=0.02,
        mistakes=combine_mistakes(
            (
                1 / expected,
                tr(
                    "upside down: that is characters per token; divide tokens by characters.",
                    "颠倒了：这是每个 token 对应的字符数；应该用 token 数除以字符数。",
                ),
            ),
            (
                per_len,
                tr(
                    "that divides by len(text), which counts punctuation and newlines too; divide "
                    "by the Chinese characters only (llmlab.tokenizer.count_han).",
                    "这里除以的是 len(text)，它把标点和换行也算了进去；只能除以汉字的个数"
                    "（llmlab.tokenizer.count_han）。",
                ),
            ),
        ),
        default_hint=tr(
            "not the measured ratio: check what you counted and what you divided by.",
            "不是实测的比值：检查一下你数的是什么、除以的又是什么。",
        ),
        formula=tr(
            "Encode the whole text without special tokens, count the tokens, divide by the "
            "number of Chinese characters.",
            "把整段文本编码（不加特殊 token），数出 token 数，再除以汉字的个数。",
        ),
    )


# ----------------------------------------------------------------------------- the token viewer


def _han_tokens(ch: str) -> int:
    from llmlab.tokenizer import count_tokens, real_tokenizer

    return count_tokens(real_tokenizer(), ch)


def han_by_tokens(answer: Any) -> CheckResult:
    """With the token viewer, find one Chinese character that SmolLM2's tokenizer encodes (on its
    own) as 1 token, one as 2 tokens and one as 3 tokens. Answer {1: "…", 2: "…", 3: "…"}."""
    from llmlab.tokenizer import count_han

    ex = "ch01.han_by_tokens"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if not isinstance(answer, dict) or {int(k) for k in answer if str(k).isdigit()} != {1, 2, 3}:
        return report(
            not_yet(
                ex,
                tr(
                    "answer a dict with the keys 1, 2 and 3, each mapped to one Chinese character.",
                    "请用一个 dict 作答，键为 1、2、3，每个键对应一个汉字。",
                ),
            )
        )
    answer = {int(k): v for k, v in answer.items()}
    problems = []
    for n in (1, 2, 3):
        ch = answer[n]
        if not (isinstance(ch, str) and len(ch) == 1 and count_han(ch) == 1):
            problems.append(
                tr(
                    f"{n}: give exactly one Chinese character (a str of length 1), got {ch!r}.",
                    f"{n}：只能给一个汉字（长度为 1 的 str），你给的是 {ch!r}。",
                )
            )
            continue
        got = _han_tokens(ch)
        if got != n:
            problems.append(
                tr(
                    f"{n}: {ch} takes {got} token(s) on its own.",
                    f"{n}：{ch} 单独编码是 {got} 个 token。",
                )
            )
    if not problems:
        return report(
            passed(
                ex,
                tr(
                    "correct: a UTF-8 character of 3 bytes ends up as 1, 2 or 3 "
                    "tokens, depending on how often the tokenizer's training text "
                    "had it.",
                    "正确：同样是 3 个字节的 UTF-8 字符，最后是 1 个、2 个还是 3 个 "
                    "token，取决于它在分词器的训练文本里出现得多不多。",
                ),
            )
        )
    first = tr(" ", "").join(problems)
    then = tr(
        "Only the characters the tokenizer's mostly English training text used most often "
        "became single tokens: try the most common characters of Chinese; rare ones stay "
        "as bytes.",
        "分词器的训练文本以英文为主，只有其中用得最多的字才成了单个 token：试试汉语里最常用"
        "的字；生僻字会停留在字节层面。",
    )
    return report(not_yet(ex, staged(ex, first, then)))


# ----------------------------------------------------------------------------- vocabulary size

BIGGER_VOCAB = 2 * VOCAB_SIZE
VOCAB_EFFECTS = {
    "embedding_table_bytes": "bytes of the token embedding table",
    "bits_per_token_id": "bits needed for one token id",
    "kv_bytes_per_token": "KV-cache bytes per token",
    "prompt_kv_bytes": "KV-cache bytes for the whole prompt",
    "lm_head_flops_per_token": "FLOPs of the final lm_head per generated token",
    "forwards_for_the_reply": "forward passes to generate the same reply text",
}
CHANGES = ("up", "down", "unchanged")
_EFFECTS_RIGHT = {
    "embedding_table_bytes": "up",
    "bits_per_token_id": "up",
    "kv_bytes_per_token": "unchanged",
    "prompt_kv_bytes": "down",
    "lm_head_flops_per_token": "up",
    "forwards_for_the_reply": "down",
}
# (English, Chinese) hint per effect, resolved with tr when shown.
_EFFECTS_HINTS = {
    "embedding_table_bytes": (
        "the table has one row per vocabulary entry.",
        "词表里的每个条目在这张表里占一行。",
    ),
    "bits_per_token_id": (
        "count how many different ids the new vocabulary has to tell apart.",
        "数一数新词表要区分多少个不同的 id。",
    ),
    "kv_bytes_per_token": (
        "what the cache stores per token depends on the layers and heads, "
        "not on which token it is or how many tokens exist.",
        "KV cache 为每个 token 存多少，取决于层数和注意力头，与是哪个 token、"
        "总共有多少种 token 都无关。",
    ),
    "prompt_kv_bytes": (
        "the bytes per token stay as they were, but how many tokens does the prompt have now?",
        "每个 token 的字节数没变，可 prompt 现在有多少个 token？",
    ),
    "lm_head_flops_per_token": (
        "the lm_head scores every vocabulary entry for every generated token.",
        "每生成一个 token，lm_head 都要给词表里的每个条目打一次分。",
    ),
    "forwards_for_the_reply": (
        "one forward per generated token; the same text is now fewer tokens.",
        "每生成一个 token 做一次前向计算；同样的文字现在变成了更少的 token。",
    ),
}


def vocab_tradeoff(answer: Any) -> CheckResult:
    """SmolLM2 retrained with BIGGER_VOCAB tokens (more merges learned, the rest of the model as it
    is), which cuts a typical prompt's tokens by a tenth. For each key of VOCAB_EFFECTS: "up",
    "down" or "unchanged"?"""
    return check_matching(
        "ch01.vocab_tradeoff",
        answer,
        dict(_EFFECTS_RIGHT),
        choices=CHANGES,
        hints={k: tr(*v) for k, v in _EFFECTS_HINTS.items()},
        success=tr(
            "correct: a bigger vocabulary buys shorter sequences (less KV "
            "cache, fewer forwards) with a bigger embedding and lm_head.",
            "正确：更大的词表以更大的 embedding 和 lm_head 为代价，换来更短"
            "的序列（KV cache 更少，前向计算更少）。",
        ),
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "utf8_bytes": ExerciseInfo(
        "plug-in",
        mistakes=(
            "characters counted, not bytes",
            "2 bytes per Chinese character (GBK/UTF-16)",
            "emoji counted as 1 byte",
        ),
    ),
    "first_merge": ExerciseInfo(
        "reasoning",
        mistakes=(
            "a pair that is not the most frequent",
            "a pair across the word boundary",
            "more than two symbols merged",
        ),
    ),
    "merge_function": ExerciseInfo(
        "reasoning",
        mistakes=(
            "overlapping occurrences merged",
            "only the first occurrence merged",
            "ids outside the pair dropped",
        ),
    ),
    "tokens_per_han": ExerciseInfo(
        "plug-in",
        mistakes=(
            "characters per token (upside down)",
            "divided by all characters, punctuation included",
        ),
    ),
    "han_by_tokens": ExerciseInfo(
        "plug-in", mistakes=("a character that splits differently", "more than one character")
    ),
    "id_bits": ExerciseInfo(
        "plug-in", mistakes=("rounded down", "not a whole number", "bytes for bits")
    ),
    "embedding_bytes": ExerciseInfo(
        "plug-in",
        mistakes=(
            "parameters, not bytes",
            "FP32 for BF16",
            "lm_head counted too",
            "bits for bytes",
        ),
    ),
    "vocab_tradeoff": ExerciseInfo(
        "reasoning",
        mistakes=(
            "KV bytes per token thought to depend on the vocabulary",
            "fewer tokens not carried to the KV cache",
            "lm_head cost ignored",
        ),
    ),
}
