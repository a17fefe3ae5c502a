"""How every figure and widget ends a panel: its axis labels, its title, its legend, then the
figure laid out and returned. One place, so a figure's code shows what it draws."""

from __future__ import annotations

from typing import Any


def label(
    ax: Any,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    legend: float | None = None,
) -> None:
    """Set the labels and title of the matplotlib Axes `ax` that are given (None: left as they
    are) and, where `legend` is a font size, draw its legend at that size."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    if legend is not None:
        ax.legend(fontsize=legend)


def finish(ax: Any, *labels: Any, **named: Any) -> Any:
    """`label(ax, *labels, **named)`, then lay out the figure `ax` belongs to (the last panel
    drawn: every panel is in place) and return that Figure. A figure whose catalog holds its
    three texts by role ("kv_waste.xlabel", ".ylabel", ".title") passes them as one:
    `finish(ax, **M.figure("kv_waste"), legend=8)`."""
    label(ax, *labels, **named)
    ax.figure.tight_layout()
    return ax.figure


def plot_ms(ax: Any, xs: Any, seconds: Any, fmt: str, **style: Any) -> None:
    """Draw the times `seconds` (one per x of `xs`) on `ax` in milliseconds, as the line format
    `fmt` ("o-", "s--", ...) with matplotlib's `style` keywords (colour, label)."""
    ax.plot(xs, [1e3 * s for s in seconds], fmt, **style)
