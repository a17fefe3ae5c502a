"""Self-checks of chapter 01 (tokens): UTF-8 bytes, a BPE merge by hand and the merge step in code,
the measured tokens per Chinese character, characters that take one, two and three tokens (found
with the token viewer), token id bits, embedding table bytes, and what a larger vocabulary
changes."""

from __future__ import annotations

import math
from typing import Any

from llmlab.course.check.build_guard import check_cases
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    not_yet,
    passed,
    sentences,
    staged,
)
from llmlab.course.check.question import Expected, matching, numeric

M = catalog("ch01")

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
                merged[i] = (v, M("combine_mistakes.or", first=h, other=hint))
                break
        else:
            merged.append((value, hint))
    return merged


@numeric(rel=1e-9)
def utf8_bytes() -> Expected:
    """How many UTF-8 bytes does UTF8_TEXT take? (The byte-level BPE starts from these.)"""
    text = UTF8_TEXT
    expected = len(text.encode("utf-8"))
    chars = len(text)
    two_per_han = sum(2 if "\u4e00" <= c <= "\u9fff" else len(c.encode("utf-8")) for c in text)
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (chars, M("utf8_bytes.characters")),
            (two_per_han, M("utf8_bytes.two_per_han")),
            (expected - 3, M("utf8_bytes.emoji")),
        ),
    )


def first_merge(answer: Any) -> CheckResult:
    """Which piece does byte-level BPE create first when trained on MERGE_CORPUS?

    Answer with the merged piece as a str (e.g. "xy") or the pair as a tuple ("x", "y").
    """
    from llmlab.tokenizer import train_bpe

    ex = "ch01.first_merge"
    if answer is None:
        return not_yet(ex, NOT_ANSWERED)
    if (
        isinstance(answer, (tuple, list))
        and len(answer) == 2
        and all(isinstance(a, str) for a in answer)
    ):
        answer = answer[0] + answer[1]
    if not isinstance(answer, str):
        return not_yet(ex, M("first_merge.not_a_str", got_type=type(answer).__name__))
    bpe = train_bpe(MERGE_CORPUS, 257)
    expected = bpe.vocab[256].decode("utf-8")
    if answer == expected:
        return passed(ex)
    if len(answer) != 2:
        return not_yet(ex, M("first_merge.two_bytes"))
    if answer not in MERGE_CORPUS:
        return not_yet(ex, M("first_merge.never_adjacent"))
    return not_yet(
        ex,
        staged(ex, M("first_merge.not_most_frequent"), M("first_merge.then")),
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
    return check_cases(
        "ch01.merge_function",
        fn,
        MERGE_CASES,
        call=lambda fn, case: fn(list(case[0]), case[1], case[2]),
        judge=_merge_mistake,
        hint=M("merge_function.not_a_function", got_type=type(fn).__name__),
        raised=lambda case, error_type, error: M(
            "merge_function.raised", error_type=error_type, error=error, ids=case[0], pair=case[1]
        ),
        success=M("merge_function.success"),
    )


def _merge_mistake(case: tuple, got: Any) -> str | None:
    """The hint for `got`, the student's merge of the case (ids, pair, new_id); None when it is
    the package's."""
    from llmlab.tokenizer import _merge

    ids, pair, new_id = case
    if got is None:
        return M("merge_function.returns_none")
    want, got = _merge(ids, pair, new_id), list(got)
    if got == want:
        return None
    if got == list(ids) and want != list(ids):
        first = M("merge_function.nothing_merged", ids=ids, pair=pair)
    elif got.count(new_id) > want.count(new_id) and pair[0] == pair[1]:
        first = M("merge_function.overlapping", ids=ids, pair=pair)
    elif got.count(new_id) > want.count(new_id):
        first = M("merge_function.too_many", ids=ids, pair=pair)
    elif got.count(new_id) < want.count(new_id):
        first = M("merge_function.too_few", ids=ids, pair=pair)
    elif len(got) != len(want):
        first = M("merge_function.wrong_length", ids=ids, pair=pair, got_len=len(got))
    else:
        first = M("merge_function.wrong_ids", ids=ids, pair=pair)
    return staged("ch01.merge_function", first, M("merge_function.then"))


@numeric(rel=1e-9)
def id_bits() -> Expected:
    """At least how many bits does one token id need for a vocabulary of VOCAB_SIZE?"""
    expected = math.ceil(math.log2(VOCAB_SIZE))
    return Expected(
        expected,
        mistakes=[
            (math.floor(math.log2(VOCAB_SIZE)), M("id_bits.rounded_down")),
            (math.log2(VOCAB_SIZE), M("id_bits.not_whole")),
            (expected / 8, M("id_bits.bytes")),
        ],
    )


@numeric(rel=1e-3)
def embedding_bytes() -> Expected:
    """Bytes of the token embedding table of EMBED_PRESET (vocab × hidden) in BF16."""
    from llmlab.config import get_config

    cfg = get_config(EMBED_PRESET)
    params = cfg.vocab_size * cfg.hidden_size
    expected = params * 2
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (params, M("embedding_bytes.parameters")),
            (params * 4, M("embedding_bytes.fp32")),
            (2 * expected, M("embedding_bytes.lm_head")),
            (expected * 8, M("embedding_bytes.bits")),
        ),
    )


@numeric(rel=0.02)
def tokens_per_han() -> Expected:
    """Tokens per Chinese character of data/text/inference_zh.txt with the real tokenizer,
    as `llmlab.tokenizer.tokens_per_char` defines it (all tokens / Chinese characters)."""
    from llmlab.paths import DATA_DIR
    from llmlab.tokenizer import count_tokens, real_tokenizer, tokens_per_char

    text = (DATA_DIR / "text" / "inference_zh.txt").read_text(encoding="utf-8")
    tok = real_tokenizer()
    expected = tokens_per_char(tok, text)
    per_len = count_tokens(tok, text) / len(text)
    return Expected(
        expected,
        mistakes=combine_mistakes(
            (1 / expected, M("tokens_per_han.upside_down")),
            (per_len, M("tokens_per_han.len_text")),
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
        return not_yet(ex, NOT_ANSWERED)
    if not isinstance(answer, dict) or {int(k) for k in answer if str(k).isdigit()} != {1, 2, 3}:
        return not_yet(ex, M("han_by_tokens.missing_keys"))
    answer = {int(k): v for k, v in answer.items()}
    problems = []
    for n in (1, 2, 3):
        ch = answer[n]
        if not (isinstance(ch, str) and len(ch) == 1 and count_han(ch) == 1):
            problems.append(M("han_by_tokens.not_one_character", n=n, ch=ch))
            continue
        got = _han_tokens(ch)
        if got != n:
            problems.append(M("han_by_tokens.wrong_count", n=n, ch=ch, got=got))
    if not problems:
        return passed(ex, M("han_by_tokens.success"))
    first = sentences(*problems)
    then = M("han_by_tokens.then")
    return not_yet(ex, staged(ex, first, then))


# ----------------------------------------------------------------------------- vocabulary size

BIGGER_VOCAB = 2 * VOCAB_SIZE
CHANGES = ("up", "down", "unchanged")
# how each effect changes (the answer); the keys are what the student answers with
_EFFECTS_RIGHT = {
    "embedding_table_bytes": "up",
    "bits_per_token_id": "up",
    "kv_bytes_per_token": "unchanged",
    "prompt_kv_bytes": "down",
    "lm_head_flops_per_token": "up",
    "forwards_for_the_reply": "down",
}
# each effect (VOCAB_EFFECTS, the notebook prints it) and the hint for it, in the language in use
VOCAB_EFFECTS = M.texts("vocab_effects", tuple(_EFFECTS_RIGHT))
_EFFECTS_HINTS = M.texts("vocab_tradeoff", tuple(_EFFECTS_RIGHT))


@matching(CHANGES, _EFFECTS_HINTS)
def vocab_tradeoff() -> dict[str, str]:
    """SmolLM2 retrained with BIGGER_VOCAB tokens (more merges learned, the rest of the model as it
    is), which cuts a typical prompt's tokens by a tenth. For each key of VOCAB_EFFECTS: "up",
    "down" or "unchanged"?"""
    return dict(_EFFECTS_RIGHT)


EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
