"""Text for a stream of tokens, one token at a time (vLLM's `v1/engine/detokenizer.py`).

A token is not always whole characters: byte-level BPE splits a Chinese character or an emoji
over several tokens, and decoding the first alone gives U+FFFD (�). So each step decodes a
short window of recent tokens twice, with and without the new ones, sends the difference, and
holds it back while it ends in an incomplete character. Two short decodes per token, never the
whole output: the cost stays flat as the answer grows.
"""
from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """`push(token_ids)` → the new text they complete ("" while a character is unfinished)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0      # start of the window decoded for context
        self.read_offset = 0        # tokens before this are already sent as text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        if self.tokenizer is None:
            return ""
        sent = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.token_ids[self.prefix_offset:])
        if len(text) > len(sent) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            return text[len(sent):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character at the very end)."""
        if self.tokenizer is None or self.read_offset == len(self.token_ids):
            return ""
        sent = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.token_ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.token_ids)
        return text[len(sent):]
