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

from llmlab.course.check.core import as_number
from llmlab.i18n import notebook_text, tr
from llmlab.utils import format_table

# The message of a missing prediction (shown in the language in use, see `_no_prediction`).
NO_PREDICTION = (
    "no prediction recorded: write your guess in the prediction cell above, then "
    "run the measurement and this cell again (a guess made after seeing the number "
    "teaches nothing)."
)
NO_PREDICTION_ZH = (
    "还没有记下预测：先在上面的预测单元格里写下你的猜测，再运行测量和这个单元格"
    "（看到数字之后才做的猜测，什么也学不到）。"
)


def _no_prediction() -> str:
    return tr(NO_PREDICTION, NO_PREDICTION_ZH)


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
        raise ValueError(
            tr(
                f"tolerance must be > 1 (a factor), got {tolerance}",
                f"tolerance 必须 > 1（是一个倍数），你给的是 {tolerance}",
            )
        )
    m = as_number(measured)
    if m is None:
        raise ValueError(
            tr(
                f"measured must be a number, got {type(measured).__name__}",
                f"measured 必须是一个数，你给的是 {type(measured).__name__}",
            )
        )
    shown = notebook_text(quantity)
    if_high, if_low = notebook_text(if_high), notebook_text(if_low)
    p = as_number(prediction)
    if prediction is None or p is None:
        msg = (
            _no_prediction()
            if prediction is None
            else tr(
                f"the prediction must be a number, got {type(prediction).__name__}.",
                f"预测必须是一个数，你给的是 {type(prediction).__name__}。",
            )
        )
        print(f"[predict {shown}] {msg}")
        return Comparison(quantity, prediction, m, "no prediction", msg)
    rows = [
        (tr("you predicted", "你的预测"), _fmt(p, unit)),
        (tr("you measured", "你的测量"), _fmt(m, unit)),
    ]
    if p != 0 and m != 0 and (p > 0) == (m > 0):
        ratio = p / m
        rows.append((tr("prediction / measurement", "预测 / 测量"), f"{ratio:.2g}x"))
    else:
        ratio = None
    if baseline is not None:
        rows.append((tr("baseline", "基线"), _fmt(baseline, unit)))
    if baseline is not None and (p - baseline) * (m - baseline) < 0:
        up = tr("up", "上升") if m > baseline else tr("down", "下降")
        verdict, msg = (
            "wrong direction",
            tr(
                f"the measurement went {up} from the baseline and your "
                f"prediction the other way: the mechanism works the "
                f"opposite way to the one you pictured.",
                f"测量值相对基线{up}了，你的预测却走向另一边：这个机制"
                f"的作用方向和你设想的正好相反。",
            ),
        )
        extra = if_high if p > m else if_low
    elif ratio is not None and 1 / tolerance <= ratio <= tolerance:
        verdict, msg, extra = (
            "close",
            tr(
                f"within a factor {tolerance:g}: right order of magnitude"
                + (" and direction." if baseline is not None else "."),
                f"相差不到 {tolerance:g} 倍：数量级"
                + ("和方向都对。" if baseline is not None else "对了。"),
            ),
            "",
        )
    elif p > m:
        decades = math.log10(p / m) if ratio else float("nan")
        verdict = "too high"
        msg = (
            tr(
                f"about {decades:.1f} orders of magnitude too high.",
                f"高了大约 {decades:.1f} 个数量级。",
            )
            if ratio and decades >= 1
            else tr(
                f"too high by more than a factor {tolerance:g}.", f"高了不止 {tolerance:g} 倍。"
            )
        )
        extra = if_high
    else:
        decades = math.log10(m / p) if ratio else float("nan")
        verdict = "too low"
        msg = (
            tr(
                f"about {decades:.1f} orders of magnitude too low.",
                f"低了大约 {decades:.1f} 个数量级。",
            )
            if ratio and decades >= 1
            else tr(f"too low by more than a factor {tolerance:g}.", f"低了不止 {tolerance:g} 倍。")
        )
        extra = if_low
    message = msg + (tr(" ", "") + extra if extra else "")  # no space after a Chinese "。"
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
        raise ValueError(
            tr(
                f"observed must be one of {list(options)}, got {observed!r}",
                f"observed 必须是 {list(options)} 中的一个，你给的是 {observed!r}",
            )
        )
    shown, explain = notebook_text(quantity), notebook_text(explain)
    if prediction is None:
        msg = _no_prediction()
        print(f"[predict {shown}] {msg}")
        return Comparison(quantity, None, observed, "no prediction", msg)
    got = str(prediction).strip().lower()
    if got not in {o.lower() for o in options}:
        msg = tr(
            f"the prediction must be one of {list(options)}, got {prediction!r}.",
            f"预测必须是 {list(options)} 中的一个，你给的是 {prediction!r}。",
        )
        print(f"[predict {shown}] {msg}")
        return Comparison(quantity, prediction, observed, "no prediction", msg)
    right = got == observed.lower()
    verdict = "as observed" if right else "not as observed"
    msg = tr(
        f"you predicted {prediction!r}; the measurement says {observed!r}. "
        + ("" if right else "Find the step in your reasoning that the measurement contradicts. ")
        + explain,
        f"你预测的是 {prediction!r}；测量结果是 {observed!r}。"
        + ("" if right else "找出你推理中被测量结果否定的那一步。")
        + explain,
    ).strip()
    print(f"[predict {shown}] {msg}")
    return Comparison(quantity, prediction, observed, verdict, msg)
