"""Text for a stream of tokens, one token at a time, and stop strings on that text (vLLM's
`v1/engine/detokenizer.py`).

A token is not always whole characters: byte-level BPE splits a Chinese character or an emoji
over several tokens, and decoding the first alone gives U+FFFD (�). So each step decodes a
short window of recent tokens twice, with and without the new ones, keeps the difference, and
holds it back while it ends in an incomplete character. Two short decodes per token, never the
whole output: the cost stays flat as the answer grows.

Stop strings are matched on that text, not on tokens: "\\n\\n" can arrive as one token, as two,
or at the end of a token that also holds other characters. Only the tail that the new text
can complete is searched. A streaming client must never see text that a later match removes,
so `next_delta()` holds back the last `len(longest stop string) - 1` characters until the
request finishes.
"""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """`push(token_ids)` → the new text they complete ("" while a character is unfinished).

    With `stop` strings, `update(token_ids)` also returns the stop string the text now contains
    (the text is cut there: before it, or after it with `include_stop_str_in_output`), and
    `next_delta(finished)` gives the text a stream may send now.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop: list[str] | None = None,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # start of the window decoded for context
        self.read_offset = 0  # tokens before this are already turned into text
        self.stop = list(stop or ())
        self.include_stop_str_in_output = include_stop_str_in_output
        self.output_text = ""  # the text so far (cut at a stop string once one matched)
        self.stop_string: str | None = None
        self._sent = 0  # characters of output_text already handed out as deltas
        longest = max(map(len, self.stop), default=0)
        self._hold_back = 0 if include_stop_str_in_output else max(longest - 1, 0)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        if self.tokenizer is None:
            return ""
        sent = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.token_ids[self.prefix_offset :])
        if len(text) > len(sent) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            return text[len(sent) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character at the very end)."""
        if self.tokenizer is None or self.read_offset == len(self.token_ids):
            return ""
        sent = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.token_ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.token_ids)
        return text[len(sent) :]

    def update(
        self, token_ids: list[int], finished: bool = False, check_stop: bool = True
    ) -> str | None:
        """Add tokens to `output_text`; return the stop string that now ends it, or None.

        `finished`: the request ends with these tokens anyway (EOS, length), so a character
        still held back is flushed too. `check_stop` False: add the text, match nothing (before
        `min_tokens` outputs exist).
        """
        if self.stop_string is not None:
            return self.stop_string
        new = self.push(token_ids)
        if finished:
            new += self.flush()
        if not new:
            return None
        self.output_text += new
        if not self.stop or not check_stop:
            return None
        text = self.output_text
        best: tuple[int, str] | None = None  # (where the text is cut, the stop string)
        for stop in self.stop:
            # a new match must end inside the new text: look from len(stop) - 1 before it
            i = text.find(stop, max(0, len(text) - len(new) - len(stop) + 1))
            if i != -1 and (best is None or i < best[0]):  # the earliest match wins
                best = (i, stop)
        if best is None:
            return None
        i, stop = best
        self.output_text = text[: i + len(stop) if self.include_stop_str_in_output else i]
        self.stop_string = stop
        return stop

    def next_delta(self, finished: bool) -> str:
        """The text not handed out yet, less the tail a stop string could still remove."""
        end = (
            len(self.output_text)
            if finished
            else max(self._sent, len(self.output_text) - self._hold_back)
        )
        delta = self.output_text[self._sent : end]
        self._sent = end
        return delta
