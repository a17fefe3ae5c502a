"""Predict, then measure: the student writes a guess down before a measurement runs, and after
it a cell sets the guess beside their own measurement and says what the gap means.

Machines differ by large factors, so a prediction is judged on what carries over between them:
the order of magnitude (within a factor `tolerance`, 3 by default) and, where the question is
about a change from a baseline, its direction. Predictions are not graded: a wrong guess that
the measurement corrects is the point of the exercise.

    my_guess = 20  # SOLUTION                      (before the measurement; None in the handout)
    ...measure...
    compare(my_guess, measured_ms, quantity="decode step at batch 8", unit="ms",
            if_high="...what over-predicting means...", if_low="...")
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any, Sequence

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import as_number, sentences
from llmlab.i18n import notebook_text
from llmlab.utils import format_table

M = catalog("predict")

# The message of a missing prediction, in English and in Chinese (shown in the language in use).
NO_PREDICTION = M.template("no_prediction")
NO_PREDICTION_ZH = M.template("no_prediction", "zh")


@dataclass(frozen=True)
class Comparison:
    """The outcome of one prediction: `verdict` is "close", "too high", "too low",
    "wrong direction", "as observed", "not as observed" or "no prediction" (codes, the same in
    every language); `message` is in the language in use."""

    quantity: str
    prediction: Any
    measured: Any
    verdict: str
    message: str

    def __str__(self) -> str:
        return self.message

    def _ipython_display_(self) -> None:
        """`compare` already printed the table."""


def _fmt(x: float, unit: str) -> str:
    if x == 0:
        text = "0"
    elif abs(x) >= 1e5 or abs(x) < 1e-3:
        text = f"{x:.2e}"
    else:
        text = f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return f"{text} {unit}".strip()


# (a far miss in decades, a near one) per side of the measurement
_MISS_KEYS = {
    "too high": (M.key("verdict.decades_too_high"), M.key("verdict.too_high")),
    "too low": (M.key("verdict.decades_too_low"), M.key("verdict.too_low")),
}


def _verdict(
    p: float,
    m: float,
    ratio: float | None,
    baseline: float | None,
    tolerance: float,
    if_high: str,
    if_low: str,
) -> tuple[str, str, str]:
    """(verdict, its message, what the miss suggests) for prediction `p` beside measurement `m`."""
    if baseline is not None and (p - baseline) * (m - baseline) < 0:
        up = M("direction.up") if m > baseline else M("direction.down")
        return "wrong direction", M("verdict.wrong_direction", up=up), if_high if p > m else if_low
    if ratio is not None and 1 / tolerance <= ratio <= tolerance:
        key = M.key("verdict.close") if baseline is None else M.key("verdict.close_direction")
        return "close", M(key, tolerance=tolerance), ""
    verdict = "too high" if p > m else "too low"
    decades = math.log10(max(p, m) / min(p, m)) if ratio else float("nan")
    far, near = _MISS_KEYS[verdict]
    msg = M(far, decades=decades) if ratio and decades >= 1 else M(near, tolerance=tolerance)
    return verdict, msg, if_high if p > m else if_low


def compare(
    prediction: Any,
    measured: Any,
    *,
    quantity: str,
    unit: str = "",
    baseline: float | None = None,
    tolerance: float = 3.0,
    if_high: str = "",
    if_low: str = "",
) -> Comparison:
    """Set a numeric `prediction` beside the `measured` value and print what the gap means.

    With `baseline` (the value before the change the question is about), a prediction that
    moves the other way from the baseline than the measurement is "wrong direction" whatever
    its size. Otherwise a prediction within a factor `tolerance` of the measurement is "close";
    beyond it "too high" (and `if_high` is printed: what over-predicting suggests one believed)
    or "too low" (`if_low`).

    The texts come from a notebook's code cell, in English; they are shown in the language in
    use (`llmlab.i18n.notebook_text`). The returned `Comparison` keeps `quantity` as given.
    """
    if tolerance <= 1:
        raise ValueError(M("compare.bad_tolerance", tolerance=tolerance))
    m = as_number(measured)
    if m is None:
        raise ValueError(M("compare.measured_not_a_number", got_type=type(measured).__name__))
    shown = notebook_text(quantity)
    if_high, if_low = notebook_text(if_high), notebook_text(if_low)
    p = as_number(prediction)
    if prediction is None or p is None:
        msg = (
            M("no_prediction")
            if prediction is None
            else M("compare.prediction_not_a_number", got_type=type(prediction).__name__)
        )
        print(f"[predict {shown}] {msg}")
        return Comparison(quantity, prediction, m, "no prediction", msg)
    rows = [
        (M("row.predicted"), _fmt(p, unit)),
        (M("row.measured"), _fmt(m, unit)),
    ]
    if p != 0 and m != 0 and (p > 0) == (m > 0):
        ratio = p / m
        rows.append((M("row.ratio"), f"{ratio:.2g}x"))
    else:
        ratio = None
    if baseline is not None:
        rows.append((M("row.baseline"), _fmt(baseline, unit)))
    verdict, msg, extra = _verdict(p, m, ratio, baseline, tolerance, if_high, if_low)
    message = sentences(msg, extra) if extra else msg
    print(f"[predict {shown}]")
    print(textwrap.indent(format_table(rows, align="l"), "  "))
    print(f"  {message}")
    return Comparison(quantity, p, m, verdict, message)


def compare_choice(
    prediction: Any, observed: str, *, quantity: str, options: Sequence[str], explain: str = ""
) -> Comparison:
    """Set a predicted choice (one of `options`) beside the `observed` one and print `explain`
    (why the measurement came out as it did) whether or not the prediction was right.

    `quantity` and `explain` are shown in the language in use (`llmlab.i18n.notebook_text`);
    `options` and `observed` are answers the student types, the same in every language."""
    if observed not in options:
        raise ValueError(M("compare_choice.bad_observed", options=list(options), observed=observed))
    shown, explain = notebook_text(quantity), notebook_text(explain)
    if prediction is None:
        msg = M("no_prediction")
        print(f"[predict {shown}] {msg}")
        return Comparison(quantity, None, observed, "no prediction", msg)
    got = str(prediction).strip().lower()
    if got not in {o.lower() for o in options}:
        msg = M(
            "compare_choice.prediction_not_an_option", options=list(options), prediction=prediction
        )
        print(f"[predict {shown}] {msg}")
        return Comparison(quantity, prediction, observed, "no prediction", msg)
    right = got == observed.lower()
    verdict = "as observed" if right else "not as observed"
    said = [M("compare_choice.said", prediction=prediction, observed=observed)]
    if not right:
        said.append(M("compare_choice.contradicted"))
    msg = sentences(*said, explain).strip()
    print(f"[predict {shown}] {msg}")
    return Comparison(quantity, prediction, observed, verdict, msg)
