"""llmlab.tokenizer: byte-level BPE trained from scratch, and helpers over the real tokenizer."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmlab.paths import DATA_DIR
from llmlab.tokenizer import (
    BPETokenizer,
    count_han,
    count_words,
    format_piece,
    merge_steps,
    pretokenize,
    token_pieces,
    tokens_per_char,
    tokens_per_word,
    train_bpe,
)

EN = (DATA_DIR / "text" / "inference_en.txt").read_text(encoding="utf-8")
ZH = (DATA_DIR / "text" / "inference_zh.txt").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def trained() -> BPETokenizer:
    return train_bpe(EN[:3000] + "\n" + ZH[:1000], 400)


def test_data_text_is_a_few_pages_in_each_language():
    assert count_words(EN) > 1000
    assert count_han(ZH) > 1500


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_pretokenize_chunks_join_back_to_the_text(text):
    assert "".join(pretokenize(text)) == text


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_round_trip_is_exact_on_any_unicode(text):
    tok = trained()
    assert tok.decode(tok.encode(text)) == text


def test_round_trip_on_chinese_emoji_and_code():
    tok = trained()
    for s in [ZH[:200], "👋🏽 family: 👨‍👩‍👧", "def f(x):\n\treturn x_1 ** 2  # ok", "", " \n\n  "]:
        assert tok.decode(tok.encode(s)) == s


def test_first_merge_is_the_most_frequent_adjacent_pair():
    text = "banana bandana"
    tok = train_bpe(text, 257)
    counts = Counter()
    for chunk in pretokenize(text):
        b = chunk.encode()
        counts.update(zip(b, b[1:]))
    best = max(counts.values())
    assert counts[tok.merges[0]] == best
    assert tok.vocab[256] == b"an"


def test_merges_compress_and_vocab_grows_by_one_per_merge():
    tok = trained()
    assert tok.vocab_size == 256 + len(tok.merges) == 400
    sample = EN[:3000]
    assert len(tok.encode(sample)) < 0.7 * len(sample.encode("utf-8"))
    for i, (a, b) in enumerate(tok.merges):
        assert tok.vocab[256 + i] == tok.vocab[a] + tok.vocab[b]


def test_training_is_deterministic_and_stops_when_nothing_repeats():
    assert train_bpe("abcabc xyz", 300).merges == train_bpe("abcabc xyz", 300).merges
    small = train_bpe("abcd", 300)
    assert small.merges == []  # no pair occurs twice
    assert small.encode("abcd") == list(b"abcd")


def test_merge_steps_end_at_encode():
    tok = trained()
    text = "the tokenizer 分词器"
    rows = merge_steps(tok, text)
    assert rows[0] == [bytes([b]) for b in text.encode()]
    assert rows[-1] == [tok.token_bytes(i) for i in tok.encode(text)]
    assert all(len(a) > len(b) for a, b in zip(rows, rows[1:]))


def test_format_piece_shows_partial_characters_as_hex():
    assert format_piece(" the".encode()) == "␣the"
    assert format_piece("你".encode()[:2]) == "<e4 bd>"
    assert format_piece(b" \xf0\x9f") == "␣<f0 9f>"


@pytest.mark.parametrize("bad", [255, -1, "300", True, 300.0])
def test_bad_vocab_size_is_rejected(bad):
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe("abc", bad)


def test_decode_rejects_unknown_ids():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        trained().decode([10**6])


def test_ratios_on_our_bpe_and_word_counting():
    assert count_words("Hello, world! 42 -- ok") == 4
    assert count_han("你好，world。") == 2
    tok = trained()
    assert tokens_per_word(tok, "a b c") == pytest.approx(len(tok.encode("a b c")) / 3)
    with pytest.raises(ValueError, match="Chinese"):
        tokens_per_char(tok, "no han here")


@pytest.mark.model
def test_real_tokenizer_pieces_are_its_bytes():
    from llmlab.tokenizer import real_tokenizer

    tok = real_tokenizer()
    for text in ["Hello, world", ZH[:80], "emoji 👋 and code x_1 = 2"]:
        pieces = token_pieces(tok, text)
        assert [i for i, _ in pieces] == tok.encode(text, add_special_tokens=False)
        assert b"".join(p for _, p in pieces).decode("utf-8") == text
    assert tok.vocab_size == 49152


@pytest.mark.model
def test_the_converted_tokenizer_loads_directly_and_equals_autotokenizers():
    """`load_tokenizer` skips AutoTokenizer for the generic class a conversion saves: the same
    ids, chat template and special tokens."""
    from transformers import AutoTokenizer

    from llmlab.model.weights import load_tokenizer, model_dir

    path = model_dir("smollm2-135m")
    direct, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(path)
    for text in [EN[:300], ZH[:120], "<|im_start|>user\nx_1 = 2 👋<|im_end|>"]:
        assert direct(text)["input_ids"] == auto(text)["input_ids"]
    chat = [{"role": "user", "content": "你好"}]
    render = dict(add_generation_prompt=True, tokenize=False)
    assert direct.apply_chat_template(chat, **render) == auto.apply_chat_template(chat, **render)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(direct, name) == getattr(auto, name), name
    assert len(direct) == len(auto)


def test_a_tokenizer_of_another_class_goes_through_autotokenizer(tmp_path, monkeypatch):
    import json

    import transformers

    from llmlab.model.weights import load_tokenizer

    asked = []
    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", lambda path: asked.append(path) or "auto"
    )
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Qwen2Tokenizer"})
    )
    assert load_tokenizer(tmp_path) == "auto" and asked == [tmp_path]


@pytest.mark.model
def test_measured_ratios_on_our_text_are_near_the_seed_rule_of_thumb():
    """Measured, not asserted exactly: within a broad band around the seed's 1.3 and 2."""
    from llmlab.tokenizer import real_tokenizer

    tok = real_tokenizer()
    assert 1.0 < tokens_per_word(tok, EN) < 1.6
    assert 1.2 < tokens_per_char(tok, ZH) < 3.0
