"""Tokens: a byte-level BPE trained from scratch, and small helpers over the real tokenizer.

Byte-level BPE (byte pair encoding, 字节对编码) in four steps:

1. Text becomes UTF-8 bytes, so every string (English, Chinese, emoji, code) is a sequence of
   the 256 possible byte values. Those 256 values are the first 256 token ids, and nothing is
   ever "unknown".
2. The text is first cut into chunks (a word with its leading space, a run of digits, a run of
   punctuation, whitespace) so that merges never glue a word to the next one.
3. Training repeats: count every adjacent pair of ids inside the chunks, merge the most frequent
   pair into a new id (256, 257, ...), until the vocabulary has `vocab_size` ids.
4. Encoding replays the merges in the order they were learned; decoding concatenates each id's
   bytes and decodes UTF-8.

The real SmolLM2 tokenizer is the same algorithm trained on far more text (49,152 ids).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

__all__ = [
    "BPETokenizer",
    "train_bpe",
    "pretokenize",
    "real_tokenizer",
    "token_pieces",
    "id_bytes",
    "encode_ids",
    "count_tokens",
    "count_words",
    "count_han",
    "tokens_per_word",
    "tokens_per_char",
    "merge_steps",
    "format_piece",
]

# A word (letters of any script, with an optional leading space), up to 3 digits, a run of
# other symbols, trailing whitespace, other whitespace; the final [\s\S] catches anything left
# (e.g. "_") so that the chunks always concatenate back to the text.
_CHUNK = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+(?!\S)|\s+|[\s\S]")


def pretokenize(text: str) -> list[str]:
    """Cut text into the chunks BPE works inside; "".join(result) == text."""
    return _CHUNK.findall(text)


def _merge(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every non-overlapping occurrence of `pair` in `ids`, left to right."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@dataclass
class BPETokenizer:
    """A trained byte-level BPE: `merges[i]` is the pair of ids that became id 256 + i."""

    merges: list[tuple[int, int]]
    vocab: dict[int, bytes] = field(init=False)
    _ranks: dict[tuple[int, int], int] = field(init=False, repr=False)
    _cache: dict[str, list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.vocab = {i: bytes([i]) for i in range(256)}
        for i, (a, b) in enumerate(self.merges):
            if a not in self.vocab or b not in self.vocab:
                raise ValueError(f"merge {i} uses ids ({a}, {b}) that are not defined before it")
            self.vocab[256 + i] = self.vocab[a] + self.vocab[b]
        self._ranks = {pair: i for i, pair in enumerate(self.merges)}
        self._cache = {}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _encode_chunk(self, chunk: str) -> list[int]:
        if chunk in self._cache:
            return self._cache[chunk]
        ids = list(chunk.encode("utf-8"))
        while len(ids) > 1:
            # of all adjacent pairs, apply the one learned earliest (lowest rank) first
            pairs = set(zip(ids, ids[1:]))
            best = min(pairs, key=lambda p: self._ranks.get(p, len(self._ranks)))
            if best not in self._ranks:
                break
            ids = _merge(ids, best, 256 + self._ranks[best])
        self._cache[chunk] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Text → token ids."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return [i for chunk in pretokenize(text) for i in self._encode_chunk(chunk)]

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids → text. Ids that cut a UTF-8 character in half decode to U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Token ids → the raw bytes they stand for."""
        try:
            return b"".join(self.vocab[int(i)] for i in ids)
        except KeyError as e:
            raise ValueError(
                f"token id {e.args[0]} is outside the vocabulary [0, {self.vocab_size})"
            ) from None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for."""
        return self.decode_bytes([token_id])

    def merges_readable(self, n: int | None = None) -> list[tuple[str, str, str]]:
        """The first `n` merges as (left piece, right piece, merged piece), readable strings."""
        rows = []
        for i, (a, b) in enumerate(self.merges[:n]):
            rows.append(
                (
                    format_piece(self.vocab[a]),
                    format_piece(self.vocab[b]),
                    format_piece(self.vocab[256 + i]),
                )
            )
        return rows


def train_bpe(text: str, vocab_size: int) -> BPETokenizer:
    """Learn byte-level BPE merges from `text` until the vocabulary has `vocab_size` ids.

    Stops early when no adjacent pair occurs at least twice (a merge would save nothing), so
    the result may be smaller than asked. Ties between equally frequent pairs go to the pair
    with the smaller ids, which makes training deterministic.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(
            f"vocab_size must be an int >= 256 (the 256 byte values), got {vocab_size!r}"
        )
    # each distinct chunk once, with how often it occurs: merges are counted per occurrence
    chunk_counts = Counter(pretokenize(text))
    words = [list(c.encode("utf-8")) for c in chunk_counts]
    freqs = list(chunk_counts.values())
    merges: list[tuple[int, int]] = []
    while 256 + len(merges) < vocab_size:
        pair_counts: Counter[tuple[int, int]] = Counter()
        for ids, f in zip(words, freqs):
            for pair in zip(ids, ids[1:]):
                pair_counts[pair] += f
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        if pair_counts[best] < 2:
            break
        new_id = 256 + len(merges)
        merges.append(best)
        words = [_merge(ids, best, new_id) if len(ids) > 1 else ids for ids in words]
    return BPETokenizer(merges)


def merge_steps(tokenizer: BPETokenizer, text: str) -> list[list[bytes]]:
    """How `text` looks after 0, 1, 2, ... merges: each row is the list of pieces (bytes).

    Only steps that change `text` are kept; row 0 is the raw bytes, the last row equals
    `tokenizer.encode(text)`. Used to show BPE at work.
    """
    chunks = [list(c.encode("utf-8")) for c in pretokenize(text)]
    vocab = {i: bytes([i]) for i in range(256)}
    rows = [[vocab[i] for ids in chunks for i in ids]]
    for rank, pair in enumerate(tokenizer.merges):
        new_id = 256 + rank
        vocab[new_id] = vocab[pair[0]] + vocab[pair[1]]
        changed = False
        for k, ids in enumerate(chunks):
            merged = _merge(ids, pair, new_id)
            if len(merged) != len(ids):
                chunks[k], changed = merged, True
        if changed:
            rows.append([vocab[i] for ids in chunks for i in ids])
    return rows


def format_piece(piece: bytes) -> str:
    """A token's bytes as readable text: valid UTF-8 as text (space shown as '␣', newline as
    '↵'), bytes that are only part of a character as hex, e.g. '<e4 bd>'."""
    # surrogateescape keeps every byte that is not valid UTF-8 as U+DC80..U+DCFF
    s = piece.decode("utf-8", errors="surrogateescape")
    shown, pending = [], []
    for ch in s + "\0":
        if 0xDC80 <= ord(ch) <= 0xDCFF:
            pending.append(f"{ord(ch) - 0xDC00:02x}")
            continue
        if pending:
            shown.append("<" + " ".join(pending) + ">")
            pending = []
        if ch == " ":
            shown.append("␣")
        elif ch == "\n":
            shown.append("↵")
        elif unicodedata.category(ch)[0] == "C":
            shown.append(f"<{ord(ch):02x}>")
        else:
            shown.append(ch)
    return "".join(shown[:-1])  # drop the sentinel's <00>


# ---------------------------------------------------------------------------------------------
# the real tokenizer


@lru_cache(maxsize=1)
def real_tokenizer() -> Any:
    """The tokenizer of the course model (SmolLM2-135M-Instruct), a transformers fast tokenizer.

    Loads only the tokenizer from the converted model's directory (converting the model on
    first use), once per process. `llmlab.model.load_model()` returns the same tokenizer.
    """
    from llmlab.model.weights import load_tokenizer, model_dir

    return load_tokenizer(model_dir("smollm2-135m"))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's map from the printable characters byte-level tokenizers use back to bytes."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


_BYTE_DECODER = _byte_decoder()


def token_pieces(tokenizer: Any, text: str) -> list[tuple[int, bytes]]:
    """(id, bytes) for each token of `text`, for our `BPETokenizer` or a Hugging Face one.

    A byte-level token may hold part of a UTF-8 character (common for Chinese and emoji), so
    pieces are bytes, not str. Special tokens (BOS) are not added.
    """
    ids = encode_ids(tokenizer, text)
    return list(zip(ids, id_bytes(tokenizer, ids)))


def id_bytes(tokenizer: Any, ids: Sequence[int]) -> list[bytes]:
    """The bytes each token id stands for (our `BPETokenizer` or a Hugging Face tokenizer)."""
    if isinstance(tokenizer, BPETokenizer):
        return [tokenizer.token_bytes(i) for i in ids]
    out = []
    for i, tok in zip(ids, tokenizer.convert_ids_to_tokens(list(ids))):
        if tok is not None and all(ch in _BYTE_DECODER for ch in tok):
            out.append(bytes(_BYTE_DECODER[ch] for ch in tok))
        else:  # not byte-level (e.g. SentencePiece) or special: decode the single id
            out.append(tokenizer.decode([i]).encode("utf-8"))
    return out


def encode_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` for our `BPETokenizer` or a Hugging Face one (no special tokens)."""
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.encode(text)
    return tokenizer.encode(text, add_special_tokens=False)


def count_tokens(tokenizer: Any, text: str) -> int:
    """Number of tokens of `text` (no special tokens added)."""
    return len(encode_ids(tokenizer, text))


def count_words(text: str) -> int:
    """English words: whitespace-separated items that contain at least one letter or digit."""
    return sum(1 for w in text.split() if any(ch.isalnum() for ch in w))


def _is_han(ch: str) -> bool:
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0xF900 <= cp <= 0xFAFF
    )


def count_han(text: str) -> int:
    """Chinese characters (汉字, CJK unified ideographs) in `text`; punctuation not counted."""
    return sum(1 for ch in text if _is_han(ch))


def tokens_per_word(tokenizer: Any, english_text: str) -> float:
    """Tokens per English word for this text (the source chapter's rule of thumb: ≈ 1.3)."""
    words = count_words(english_text)
    if words == 0:
        raise ValueError("english_text must contain at least one word")
    return count_tokens(tokenizer, english_text) / words


def tokens_per_char(tokenizer: Any, chinese_text: str) -> float:
    """Tokens per Chinese character for this text, punctuation's tokens included in the count
    (the source chapter's rule of thumb: ≈ 2)."""
    han = count_han(chinese_text)
    if han == 0:
        raise ValueError("chinese_text must contain at least one Chinese character")
    return count_tokens(tokenizer, chinese_text) / han
