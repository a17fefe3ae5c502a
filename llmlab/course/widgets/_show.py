"""What every widget's redraw shares: swap the figure an Output widget shows."""

from __future__ import annotations

import os


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
