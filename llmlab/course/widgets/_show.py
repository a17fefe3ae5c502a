"""What every widget shares: its controls, the redraw that swaps the figure an Output widget
shows, and the explorer a set of controls, a result line and a figure make."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any


def headless() -> bool:
    """Whether a notebook runs without a browser (the grader, `make run`, the tests set
    LLMLAB_HEADLESS=1): no one sees an Output widget's contents there, and nbclient can wait out
    its whole cell timeout after an image is displayed inside one (seen with this machine's
    Jupyter packages), so the figure is displayed on its own instead."""
    return os.environ.get("LLMLAB_HEADLESS") == "1"


def show_figure(out, fig) -> None:
    """Replace what the ipywidgets Output `out` shows with `fig`, then close `fig` in pyplot
    (headless: display `fig` itself)."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    if headless():
        display(fig)
    else:
        with out:
            out.clear_output(wait=True)
            display(fig)
    plt.close(fig)


def defaults(compute: Callable[..., Any]) -> dict[str, Any]:
    """The default of each parameter of `compute`: where a widget's controls start, kept by the
    function that computes what the widget shows."""
    return {name: p.default for name, p in inspect.signature(compute).parameters.items()}


def control(kind: str, value: Any, description: str, width: str, **options: Any) -> Any:
    """An ipywidgets control of class `kind` ("IntSlider", "Dropdown", ...) whose label takes
    `width`, so the controls of one explorer line up."""
    import ipywidgets as w

    style = {"description_width": width}
    return getattr(w, kind)(value=value, description=description, style=style, **options)


def controls_of(
    table: Mapping[str, tuple[Any, ...]], start: Mapping[str, Any], width: str, **common: Any
) -> dict[str, Any]:
    """The controls of one explorer by name, from `table`'s rows `name: (kind, label, *limits)`:
    `limits` are a slider's min, max and (optionally) step, or the options of a "Dropdown" or
    "SelectionSlider". Each starts at `start[name]`, its label `width` wide (see `control`), with
    the keywords `common` (continuous_update=False, ...) given to every one."""
    made = {}
    for name, (kind, label, *limits) in table.items():
        if len(limits) == 1:  # a list to choose from
            options = {"options": limits[0]}
        else:
            options = dict(zip(("min", "max", "step"), limits))
        made[name] = control(kind, start[name], label, width, **options, **common)
    return made


def explorer(
    controls: dict[str, Any],
    rows: list[tuple[str, ...]],
    css: str,
    text: Callable[..., str],
    plot: Callable[..., Any],
    fixed: dict[str, Any] | None = None,
    refuse: Callable[..., str | None] | None = None,
) -> Any:
    """A VBox of the `controls` (a row of `rows` with one name is the control itself, with more
    an HBox), then a result line `<pre class=css>` and the figure. On every change both are
    redrawn from the controls' values by name, plus `fixed`: `text(**args)` and `plot(**args)`;
    where `refuse(**args)` gives a message, the line shows it and the figure stays."""
    import ipywidgets as w

    result = w.HTML()
    out = w.Output()

    def redraw(*_: Any) -> None:
        args = {name: c.value for name, c in controls.items()} | (fixed or {})
        message = refuse(**args) if refuse is not None else None
        result.value = f'<pre class="{css}">{text(**args) if message is None else message}</pre>'
        if message is None:
            show_figure(out, plot(**args))

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    boxes = [controls[r[0]] if len(r) == 1 else w.HBox([controls[n] for n in r]) for r in rows]
    return w.VBox([*boxes, result, out])
