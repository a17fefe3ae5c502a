"""Answers printed before the question: find an exercise whose expected number appears, in a
form a student would read it, in a markdown cell or a cell output above the exercise.

The expected numbers come from the checkers themselves (`llmlab.course.check.core.record_expected`,
which `check_number` calls): run a notebook with the environment variable
`LLMLAB_EXPECTED_LOG` naming a file, and every checker appends what it expects to that file.

The forms scanned for a number x: x as written with and without thousands separators, and x
rounded to 2, 3 and 4 significant figures (again with and without separators, and in
scientific notation for large or small x). A number shown with one digit (2, 8, 0.5, 1.0)
is not scanned: such numbers are everywhere in any text (a whole number of two digits or
more is: "60 all-reduces"). A form counts only as a whole number
in the text: "1.34" is not found in "11.345" or "1.342", and "16" not in the name "bfloat16".

A prediction's table (`predict.compare`) prints the student's guess beside the measurement:
its rows of the guess (predicted, and prediction / measurement) are the student's own numbers,
as a checker's verdict line ("[check ...]") is, and are not scanned; the measured row is.

Words too: a checker whose answer is a word ("memory" or "compute") records it with the numbers
that set its case (`llmlab.course.check.core.record_expected_word`: batch 64, context 1024). The
word is shown when one line of an output, or one sentence of a markdown cell, above the exercise
holds the word and every one of those numbers ("decode step, batch 64, context 1024 -> memory-bound"):
the reader can copy the verdict for exactly that case. The word alone is not a leak: "decode is
memory-bound" is what the chapters teach.

A code cell tagged `measurement` (cell metadata `tags`) prints only what it measured on the
reader's machine: its numbers change from run to run and machine to machine, so one that equals
an answer about a fixed model or card does so by chance. Its outputs are not scanned; its source
and every other cell are.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from llmlab.course.instructor.exercises import exercise_calls


@dataclass(frozen=True)
class Leak:
    exercise: str
    expected: float | str  # a number, or a word answer
    form: str  # the text found
    cell: int  # index of the cell that shows it
    where: str  # "markdown" or "output"
    exercise_cell: int

    def __str__(self) -> str:
        shown = self.expected if isinstance(self.expected, str) else f"{self.expected:g}"
        return (
            f"{self.exercise} (cell {self.exercise_cell}) expects {shown}, and "
            f"{self.form!r} is shown in the {self.where} of cell {self.cell} above it"
        )


def _log_records(path: str | Path):
    """The JSON lines of a `LLMLAB_EXPECTED_LOG` file (none when it does not exist)."""
    p = Path(path)
    if not p.exists():
        return
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


def read_expected_log(path: str | Path) -> dict[str, list[float]]:
    """exercise id -> the numbers it expected, from a `LLMLAB_EXPECTED_LOG` file."""
    found: dict[str, list[float]] = {}
    for rec in _log_records(path):
        try:
            ex, x = str(rec["exercise"]), float(rec["expected"])
        except (ValueError, KeyError, TypeError):
            continue
        if x not in found.setdefault(ex, []):
            found[ex].append(x)
    return found


WordAnswer = tuple[str, tuple[float, ...], tuple[str, ...]]  # the word, its case, the other words


def read_expected_words(path: str | Path) -> dict[str, list[WordAnswer]]:
    """exercise id -> the (word, case numbers, other choices) it expected, from a
    `LLMLAB_EXPECTED_LOG` file."""
    found: dict[str, list[WordAnswer]] = {}
    for rec in _log_records(path):
        try:
            ex, word = str(rec["exercise"]), str(rec["word"])
            case = tuple(float(x) for x in rec.get("case", ()))
            others = tuple(str(o) for o in rec.get("others", ()))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if (word, case, others) not in found.setdefault(ex, []):
            found[ex].append((word, case, others))
    return found


def _digits(text: str) -> int:
    """How many digits `text` shows once leading zeros and zeros after the last nonzero decimal
    are dropped: "60" -> 2, "0.5" -> 1, "1.0" -> 1, "1.34e9" -> 3."""
    mantissa = re.split(r"e|×|x", text.lower())[0].replace(",", "").replace("-", "").strip()
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return len(mantissa.replace(".", "").lstrip("0"))


def number_forms(x: float) -> set[str]:
    """The texts a student would read `x` as (see the module docstring); empty for a number of
    one significant digit."""
    if not math.isfinite(x) or x == 0:
        return set()
    forms: set[str] = set()
    ax = abs(x)
    if float(x).is_integer() and ax < 1e16:
        forms |= {f"{int(x)}", f"{int(x):,}"}
    for sig in (2, 3, 4):
        r = float(f"{x:.{sig}g}")
        if r.is_integer() and abs(r) < 1e16:
            forms |= {f"{int(r)}", f"{int(r):,}"}
        else:
            decimals = max(0, sig - 1 - math.floor(math.log10(abs(r))))
            forms |= {f"{r:.{decimals}f}", f"{r:,.{decimals}f}"}
            # trailing zeros written or not ("1.50" and "1.5")
            forms |= {f.rstrip("0").rstrip(".") for f in list(forms) if "." in f}
        if ax >= 1e5 or ax < 1e-3:
            m = f"{x:.{sig - 1}e}"  # 1.34e+09
            mant, exp = m.split("e")
            forms |= {m, f"{mant}e{int(exp)}", f"{mant}×10^{int(exp)}", f"{mant} × 10^{int(exp)}"}
    return {f for f in forms if _digits(f) >= 2}


def _pattern(form: str) -> re.Pattern:
    # not inside another number ("11.345"), nor the digits of a name ("bfloat16", "H100", "int8")
    return re.compile(r"(?<![\d.,A-Za-z])" + re.escape(form) + r"(?![\d]|[.,]\d)")


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _in_hex_word(text: str, start: int, end: int) -> bool:
    """Whether `text[start:end]` is part of a hexadecimal word such as a block hash's shown
    prefix ("18ea.."): four or more hex digits, with a letter among the ones around the match.
    Such a word changes from run to run and is not a number the student reads."""
    if not all(c in _HEX_DIGITS for c in text[start:end]):
        return False
    i, j = start, end
    while i > 0 and text[i - 1] in _HEX_DIGITS:
        i -= 1
    while j < len(text) and text[j] in _HEX_DIGITS:
        j += 1
    around = text[i:start] + text[end:j]
    return j - i >= 4 and any(c.isalpha() for c in around)


def _shows(pattern: re.Pattern, text: str) -> bool:
    return any(not _in_hex_word(text, *m.span()) for m in pattern.finditer(text))


def _output_text(cell: Any) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        for mime in ("text/plain", "text/markdown", "text/html", "text/latex"):
            data = out.get("data", {}).get(mime)
            if data:
                parts.append(data if isinstance(data, str) else "".join(data))
    return "\n".join(parts)


@functools.cache
def _guess_rows() -> frozenset[str]:
    """The labels, in every language, of the rows of a `predict.compare` table that hold the
    student's own guess: their prediction, and prediction / measurement (read from the catalog
    once, not for every cell scanned)."""
    from llmlab.course.check.catalog import catalog
    from llmlab.i18n import speaking

    labels = set()
    for lang in ("en", "zh"):
        with speaking(lang):
            labels |= {catalog("predict")(key) for key in ("row.predicted", "row.ratio")}
    return frozenset(labels)


def _strip_check_lines(text: str) -> str:
    """Checker verdict lines ("[check chNN.x] ...") of earlier exercises are the student's own
    answers coming back: not a leak of a later exercise (and they never contain an answer). In
    the table a prediction prints ("[predict ...]", then indented rows), the rows of the
    student's guess (predicted, and the ratio to the measurement) come from the student too."""
    guesses = _guess_rows()
    kept, in_prediction = [], False
    for ln in text.splitlines():
        stripped = ln.lstrip()
        if stripped.startswith("[predict "):
            in_prediction = True
        elif not ln.startswith((" ", "\t")):
            in_prediction = False
        if stripped.startswith("[check "):
            continue
        if in_prediction and any(stripped.startswith(g) for g in guesses):
            continue
        kept.append(ln)
    return "\n".join(kept)


MEASUREMENT_TAG = "measurement"


def _is_measurement(cell: Any) -> bool:
    return MEASUREMENT_TAG in cell.get("metadata", {}).get("tags", [])


def _texts_above(nb: Any, index: int) -> list[tuple[int, str, str]]:
    """(cell index, "markdown" or "output", text) of what a reader sees above cell `index`."""
    texts = []
    for i, cell in enumerate(nb.cells[:index]):
        if cell.cell_type == "markdown":
            texts.append((i, "markdown", cell.source))
        elif cell.cell_type == "code" and not _is_measurement(cell):
            texts.append((i, "output", _strip_check_lines(_output_text(cell))))
    return texts


_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n\s*\n")


def _units(where: str, text: str) -> list[str]:
    """What a reader takes in at once: a line of an output, a sentence of a markdown cell."""
    if where == "output":
        return text.splitlines()
    return [" ".join(s.split()) for s in _SENTENCE_END.split(text)]


def _whole_word(word: str, unit: str) -> re.Match | None:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w])", unit, re.I)


def word_shown(
    word: str, case: Iterable[float], unit: str, others: Iterable[str] = ()
) -> str | None:
    """The matched word when `unit` holds `word` (a whole word: "memory" in "memory-bound") and
    every number of `case` as a whole number, and none of the `others` (a unit offering the
    choice, "memory- or compute-bound?", is the question, not its answer); else None."""
    m = _whole_word(word, unit)
    if m is None or any(_whole_word(o, unit) for o in others):
        return None
    for x in case:
        forms = {f"{x:g}", f"{int(x):,}"} if float(x).is_integer() else {f"{x:g}"}
        if not any(_pattern(f).search(unit) for f in forms):
            return None
    return m.group(0)


def _word_leaks(ex: str, index: int, texts, words) -> list[Leak]:
    leaks = []
    for word, case, others in words:
        for i, where, text in texts:
            for unit in _units(where, text):
                if word_shown(word, case, unit, others):
                    leaks.append(Leak(ex, word, unit.strip()[:120], i, where, index))
                    break
    return leaks


def find_leaks(
    nb: Any,
    expected: dict[str, Iterable[float]],
    words: dict[str, Iterable[WordAnswer]] | None = None,
) -> list[Leak]:
    """Every place an exercise's expected number, or its expected word beside the numbers of its
    case, is shown above the exercise's first call."""
    leaks: list[Leak] = []
    words = words or {}
    for ex, index in exercise_calls(nb):
        values = list(expected.get(ex, ()))
        ex_words = list(words.get(ex, ()))
        if not values and not ex_words:
            continue
        texts = _texts_above(nb, index)
        leaks += _word_leaks(ex, index, texts, ex_words)
        for x in values:
            for form in sorted(number_forms(x), key=len, reverse=True):
                pat = _pattern(form)
                for i, where, text in texts:
                    if _shows(pat, text):
                        leaks.append(Leak(ex, x, form, i, where, index))
    # one report per (exercise, cell): the longest form found there
    seen: set[tuple[str, int]] = set()
    unique = []
    for leak in leaks:
        if (leak.exercise, leak.cell) not in seen:
            seen.add((leak.exercise, leak.cell))
            unique.append(leak)
    return unique
