"""What every widget's redraw shares: swap the figure an Output widget shows."""

from __future__ import annotations


def show_figure(out, fig) -> None:
    """Replace what the ipywidgets Output `out` shows with `fig`, then close `fig` in pyplot."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    with out:
        out.clear_output(wait=True)
        display(fig)
    plt.close(fig)
