"""Self-checks of chapter 01 (tokens): UTF-8 bytes, a BPE merge by hand, token id bits,
embedding table bytes, and the measured tokens per Chinese character."""
from __future__ import annotations

import math
from typing import Any

from llmlab.check.core import CheckResult, NOT_ANSWERED, check_number, not_yet, passed, report

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
    ), default_hint="encode the text with .encode('utf-8') and count: ASCII takes 1 byte, a "
                    "Chinese character 3, this emoji 4.")


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
    return report(not_yet(ex, "that pair occurs, but another one occurs more often. Count every "
                              "adjacent pair in both chunks ('banana' and ' bandana') and add up."))


def id_bits(answer: Any) -> CheckResult:
    """At least how many bits does one token id need for a vocabulary of VOCAB_SIZE?"""
    expected = math.ceil(math.log2(VOCAB_SIZE))
    return check_number("ch01.id_bits", answer, expected, rel=1e-9, mistakes=[
        (math.floor(math.log2(VOCAB_SIZE)), "rounded down: that many bits cannot count up to the "
                                             "vocabulary size; round up."),
        (math.log2(VOCAB_SIZE), "bits come in whole numbers; round up."),
        (expected / 8, "that is bytes; the question asks for bits."),
    ], default_hint="n bits can name 2**n different ids; find the smallest n that covers the vocabulary.")


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
    ), default_hint="the table has one row of hidden_size numbers per vocabulary entry.")


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
    ), default_hint="encode the whole text without special tokens, count the tokens, divide by "
                    "the number of Chinese characters.")
