"""Self-checks of chapter 01 (tokens): UTF-8 bytes, a BPE merge by hand and the merge step in code,
the measured tokens per Chinese character, characters that take one, two and three tokens (found
with the token viewer), token id bits, embedding table bytes, and what a larger vocabulary
changes."""
from __future__ import annotations

import math
from typing import Any

from llmlab.check.core import (CheckResult, ExerciseInfo, NOT_ANSWERED, check_matching, check_number, not_yet,
                               passed, report, staged)

# the strings and corpora the exercises ask about (the notebook prints them)
UTF8_TEXT = "你好, world 👋"
MERGE_CORPUS = "banana bandana"
VOCAB_SIZE = 49152                       # SmolLM2's vocabulary
EMBED_PRESET = "llama-3-8b"


def combine_mistakes(*pairs: tuple[float, str]) -> list[tuple[float, str]]:
    """Mistake list for `check_number` in which mistakes that give the same value share one
    hint (both causes named), so the learner is never told only half the story."""
    merged: list[tuple[float, str]] = []
    for value, hint in pairs:
        for i, (v, h) in enumerate(merged):
            if math.isclose(v, value, rel_tol=1e-9):
                merged[i] = (v, f"{h} Or: {hint}")
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
    return check_number("ch01.utf8_bytes", answer, expected, rel=1e-9, mistakes=combine_mistakes(
        (chars, "that counts characters (len of the str); count bytes: encode the text as UTF-8."),
        (two_per_han, "in UTF-8 a Chinese character takes 3 bytes, not 2 (2 is GBK or UTF-16)."),
        (expected - 3, "the emoji is one character but 4 bytes in UTF-8; count all of them."),
    ), default_hint="not the number of UTF-8 bytes: the characters of this text do not all take "
                    "the same number of bytes.",
       formula="ASCII takes 1 byte, a Chinese character 3, this emoji 4; add them up (or encode "
               "the text as UTF-8 and take the length).")


def first_merge(answer: Any) -> CheckResult:
    """Which piece does byte-level BPE create first when trained on MERGE_CORPUS?

    Answer with the merged piece as a str (e.g. "xy") or the pair as a tuple ("x", "y").
    """
    from llmlab.tokenizer import train_bpe

    ex = "ch01.first_merge"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    if isinstance(answer, (tuple, list)) and len(answer) == 2 and all(isinstance(a, str) for a in answer):
        answer = answer[0] + answer[1]
    if not isinstance(answer, str):
        return report(not_yet(ex, f"answer with a str (the merged piece), got {type(answer).__name__}."))
    bpe = train_bpe(MERGE_CORPUS, 257)
    expected = bpe.vocab[256].decode("utf-8")
    if answer == expected:
        return report(passed(ex))
    if len(answer) != 2:
        return report(not_yet(ex, "the first merge joins exactly two bytes (here: two letters or a "
                                  "space and a letter); answer with those two characters."))
    if answer not in MERGE_CORPUS:
        return report(not_yet(ex, "that pair never occurs next to each other in the corpus."))
    return report(not_yet(ex, staged(ex, "that pair occurs, but another one occurs more often.",
                                     "Count every adjacent pair in both chunks ('banana' and "
                                     "' bandana') and add up; a pair never spans two chunks.")))


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
        return report(not_yet(ex, f"expected a function, got {type(fn).__name__}."))
    then = ("Walk i from the left: when ids[i], ids[i + 1] is the pair, emit new_id and move i on "
            "by two (the ids it used are gone); otherwise emit ids[i] and move on by one.")
    for ids, pair, new_id in MERGE_CASES:
        want = _merge(ids, pair, new_id)
        try:
            got = fn(list(ids), pair, new_id)
        except Exception as e:  # the learner's code: report, never crash the notebook
            return report(not_yet(ex, f"your function raised {type(e).__name__} on ids={ids}, "
                                      f"pair={pair}: {e}"))
        if got is None:
            return report(not_yet(ex, "your function returns None: return the new list."))
        got = list(got)
        if got == want:
            continue
        if got == list(ids) and want != list(ids):
            first = f"nothing was merged in ids={ids} with pair={pair}."
        elif got.count(new_id) > want.count(new_id) and pair[0] == pair[1]:
            first = (f"ids={ids}, pair={pair}: an id used by one merge cannot also start the "
                     f"next one (the occurrences must not overlap).")
        elif got.count(new_id) > want.count(new_id):
            first = f"ids={ids}, pair={pair}: you merged more often than the pair occurs."
        elif got.count(new_id) < want.count(new_id):
            first = f"ids={ids}, pair={pair}: you merged fewer occurrences than there are."
        elif len(got) != len(want):
            first = (f"ids={ids}, pair={pair}: the result has {len(got)} ids; each merge turns "
                     f"two ids into one and leaves the others as they are.")
        else:
            first = f"ids={ids}, pair={pair}: the right length, but the wrong ids."
        return report(not_yet(ex, staged(ex, first, then)))
    return report(passed(ex, "correct: that is the step train_bpe repeats after every merge it learns."))


def id_bits(answer: Any) -> CheckResult:
    """At least how many bits does one token id need for a vocabulary of VOCAB_SIZE?"""
    expected = math.ceil(math.log2(VOCAB_SIZE))
    return check_number("ch01.id_bits", answer, expected, rel=1e-9, mistakes=[
        (math.floor(math.log2(VOCAB_SIZE)), "rounded down: that many bits cannot count up to the "
                                             "vocabulary size; round up."),
        (math.log2(VOCAB_SIZE), "bits come in whole numbers; round up."),
        (expected / 8, "that is bytes; the question asks for bits."),
    ], default_hint="not the fewest bits that can tell every id of this vocabulary apart.",
       formula="With n bits you can name 2**n different ids; find the smallest n for which that reaches "
               "the vocabulary size.")


def embedding_bytes(answer: Any) -> CheckResult:
    """Bytes of the token embedding table of EMBED_PRESET (vocab × hidden) in BF16."""
    from llmlab.config import get_config

    cfg = get_config(EMBED_PRESET)
    params = cfg.vocab_size * cfg.hidden_size
    expected = params * 2
    return check_number("ch01.embedding_bytes", answer, expected, rel=1e-3, mistakes=combine_mistakes(
        (params, "that is the number of parameters; multiply by the bytes per BF16 number."),
        (params * 4, "that uses 4 bytes per number (FP32); BF16 has 2."),
        (2 * expected, "that counts the lm_head as well; this model does not tie it to the "
                       "embedding, but the question asks for the embedding table only."),
        (expected * 8, "that is bits; the question asks for bytes."),
    ), default_hint="not the size of the table: count its numbers first, then the bytes per number.",
       formula="The table has one row of hidden_size numbers per vocabulary entry, 2 bytes per "
               "number in BF16.")


def tokens_per_han(answer: Any) -> CheckResult:
    """Tokens per Chinese character of data/text/inference_zh.txt with the real tokenizer,
    as `llmlab.tokenizer.tokens_per_char` defines it (all tokens / Chinese characters)."""
    from llmlab.config import DATA_DIR
    from llmlab.tokenizer import count_tokens, real_tokenizer, tokens_per_char

    text = (DATA_DIR / "text" / "inference_zh.txt").read_text(encoding="utf-8")
    tok = real_tokenizer()
    expected = tokens_per_char(tok, text)
    per_len = count_tokens(tok, text) / len(text)
    return check_number("ch01.tokens_per_han", answer, expected, rel=0.02, mistakes=combine_mistakes(
        (1 / expected, "upside down: that is characters per token; divide tokens by characters."),
        (per_len, "that divides by len(text), which counts punctuation and newlines too; divide "
                  "by the Chinese characters only (llmlab.tokenizer.count_han)."),
    ), default_hint="not the measured ratio: check what you counted and what you divided by.",
       formula="Encode the whole text without special tokens, count the tokens, divide by the "
               "number of Chinese characters.")


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
        return report(not_yet(ex, "answer a dict with the keys 1, 2 and 3, each mapped to one "
                                  "Chinese character."))
    answer = {int(k): v for k, v in answer.items()}
    problems = []
    for n in (1, 2, 3):
        ch = answer[n]
        if not (isinstance(ch, str) and len(ch) == 1 and count_han(ch) == 1):
            problems.append(f"{n}: give exactly one Chinese character (a str of length 1), got {ch!r}.")
            continue
        got = _han_tokens(ch)
        if got != n:
            problems.append(f"{n}: {ch} takes {got} token(s) on its own.")
    if not problems:
        return report(passed(ex, "correct: a UTF-8 character of 3 bytes ends up as 1, 2 or 3 "
                                 "tokens, depending on how often the tokenizer's training text "
                                 "had it."))
    first = " ".join(problems)
    then = ("Only the characters the tokenizer's mostly English training text used most often "
            "became single tokens: try the most common characters of Chinese; rare ones stay "
            "as bytes.")
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
_EFFECTS_HINTS = {
    "embedding_table_bytes": "the table has one row per vocabulary entry.",
    "bits_per_token_id": "count how many different ids the new vocabulary has to tell apart.",
    "kv_bytes_per_token": "what the cache stores per token depends on the layers and heads, "
                          "not on which token it is or how many tokens exist.",
    "prompt_kv_bytes": "the bytes per token stay as they were, but how many tokens does the "
                       "prompt have now?",
    "lm_head_flops_per_token": "the lm_head scores every vocabulary entry for every generated token.",
    "forwards_for_the_reply": "one forward per generated token; the same text is now fewer tokens.",
}


def vocab_tradeoff(answer: Any) -> CheckResult:
    """SmolLM2 retrained with BIGGER_VOCAB tokens (more merges learned, the rest of the model as it
    is), which cuts a typical prompt's tokens by a tenth. For each key of VOCAB_EFFECTS: "up",
    "down" or "unchanged"?"""
    return check_matching("ch01.vocab_tradeoff", answer, dict(_EFFECTS_RIGHT), choices=CHANGES,
                          hints=_EFFECTS_HINTS,
                          success="correct: a bigger vocabulary buys shorter sequences (less KV "
                                  "cache, fewer forwards) with a bigger embedding and lm_head.")


EXERCISES: dict[str, ExerciseInfo] = {
    "utf8_bytes": ExerciseInfo("plug-in", mistakes=("characters counted, not bytes",
                                                    "2 bytes per Chinese character (GBK/UTF-16)",
                                                    "emoji counted as 1 byte")),
    "first_merge": ExerciseInfo("reasoning", mistakes=("a pair that is not the most frequent",
                                                       "a pair across the word boundary",
                                                       "more than two symbols merged")),
    "merge_function": ExerciseInfo("reasoning", mistakes=("overlapping occurrences merged",
                                                          "only the first occurrence merged",
                                                          "ids outside the pair dropped")),
    "tokens_per_han": ExerciseInfo("plug-in", mistakes=("characters per token (upside down)",
                                                        "divided by all characters, punctuation included")),
    "han_by_tokens": ExerciseInfo("plug-in", mistakes=("a character that splits differently",
                                                       "more than one character")),
    "id_bits": ExerciseInfo("plug-in", mistakes=("rounded down", "not a whole number", "bytes for bits")),
    "embedding_bytes": ExerciseInfo("plug-in", mistakes=("parameters, not bytes", "FP32 for BF16",
                                                         "lm_head counted too", "bits for bytes")),
    "vocab_tradeoff": ExerciseInfo("reasoning", mistakes=("KV bytes per token thought to depend on the vocabulary",
                                                          "fewer tokens not carried to the KV cache",
                                                          "lm_head cost ignored")),
}
