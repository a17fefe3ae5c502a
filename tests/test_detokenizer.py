"""Incremental detokenization and stop strings on the text: a stop string found however the
tokens split it, cut from the output (or kept with include_stop_str_in_output), and a stream
that never hands out text a later match removes."""

from __future__ import annotations

import random

import pytest

from llmlab.engine.detokenizer import IncrementalDetokenizer


class CharTokenizer:
    """Token i is the i-th piece of a fixed list: splits text wherever a test wants."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


def run(pieces: list[str], stop: list[str], include: bool = False):
    """Feed the pieces one token at a time; (streamed deltas, final text, stop string, tokens used)."""
    det = IncrementalDetokenizer(CharTokenizer(pieces), stop, include)
    deltas, used = [], 0
    for i in range(len(pieces)):
        used += 1
        finished = (
            det.update([i], finished=i == len(pieces) - 1) is not None or i == len(pieces) - 1
        )
        deltas.append(det.next_delta(finished))
        if finished:
            break
    return deltas, det.output_text, det.stop_string, used


def test_a_stop_string_split_over_three_tokens_is_found_and_cut():
    deltas, text, stop, used = run(["Hello", " wor", "ld", "!\n", "\nBye", " now"], ["!\n\nB"])
    assert stop == "!\n\nB" and text == "Hello world" and used == 5
    assert "".join(deltas) == text


def test_include_stop_str_keeps_it_and_drops_what_follows_in_the_same_token():
    _, text, stop, _ = run(["ab", "c\nxyz", "more"], ["\n"], include=True)
    assert stop == "\n" and text == "abc\n"


def test_the_earliest_of_two_stop_strings_wins():
    _, text, stop, _ = run(["one two three"], ["three", "two"])
    assert stop == "two" and text == "one "


def test_no_stop_string_gives_all_the_text():
    deltas, text, stop, used = run(["a", "b", "c"], ["zz"])
    assert stop is None and text == "abc" and used == 3 and "".join(deltas) == "abc"


def test_a_stop_string_is_ignored_while_stop_checks_are_off():
    det = IncrementalDetokenizer(CharTokenizer(["x", "STOP", "y", "STOP"]), ["STOP"])
    assert det.update([0], check_stop=False) is None
    assert det.update([1], check_stop=False) is None  # before min_tokens: not a stop
    assert det.update([2]) is None and det.update([3]) == "STOP"
    assert det.output_text == "xSTOPy"


@pytest.mark.parametrize("seed", range(20))
def test_streamed_text_never_includes_text_a_later_match_removes(seed):
    rng = random.Random(seed)
    text = "".join(rng.choice("ab\n ") for _ in range(60))
    stop = ["".join(rng.choice("ab\n ") for _ in range(rng.randint(2, 4)))]
    cuts = sorted(rng.sample(range(1, len(text)), 25))
    pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
    deltas, final, found, _ = run(pieces, stop)
    i = text.find(stop[0])
    assert final == (text if i == -1 else text[:i]) and found == (None if i == -1 else stop[0])
    streamed = ""
    for d in deltas:
        streamed += d
        assert final.startswith(streamed)  # every prefix a client saw stays true
    assert streamed == final


@pytest.mark.model
def test_an_unfinished_character_is_held_until_it_completes(real_model):
    _, tokenizer = real_model
    ids = tokenizer.encode("北京是中国的首都。 Emoji: 🙂 and accents: café, naïve.")
    det = IncrementalDetokenizer(tokenizer)
    got = "".join(det.push([t]) for t in ids) + det.flush()
    assert got == tokenizer.decode(ids, skip_special_tokens=True)
    assert "\ufffd" not in got
