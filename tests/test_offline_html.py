"""`make run`'s HTML reads offline: math is MathML (no raw LaTeX left, no MathJax loaded) and no
script, style or image comes from another host."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab.course.offline_html import markdown_math_to_mathml, remote_loads, to_html

ROOT = Path(__file__).resolve().parent.parent


def test_math_becomes_mathml_outside_code_only():
    out = markdown_math_to_mathml(
        "inline $\\sqrt{d}$ and\n$$\\frac{a}{b}$$\nbut `$HOME` and $5 or $10"
    )
    assert (
        out.count("<math") == 2
        and 'display="block"' in out
        and "<msqrt>" in out
        and "<mfrac>" in out
    )
    assert "`$HOME`" in out and "$5 or $10" in out


def test_a_page_with_math_loads_nothing_from_elsewhere():
    nb = new_notebook(
        cells=[
            new_markdown_cell("$$\\mathrm{Attention}(Q,K,V)=\\mathrm{softmax}(QK^T/\\sqrt{d})V$$"),
            new_code_cell("1 + 1"),
        ]
    )
    html = to_html(nb)
    assert "<math" in html and "$$" not in html and "\\mathrm" not in html
    assert remote_loads(html) == []
    assert "mathjax" not in html.lower().replace("mathml", "")


def test_remote_loads_are_found():
    assert remote_loads('<script src="https://cdn.example/x.js"></script>')
    assert remote_loads('<link rel="stylesheet" href="//cdn.example/a.css">')
    assert remote_loads("<style>@import url('https://fonts.example/css');</style>")
    assert remote_loads('<script src="local.js"></script><a href="https://example.org">x</a>') == []


@pytest.mark.parametrize("name", ["02-attention"])
def test_a_chapter_with_math_reads_offline(name):
    html = to_html(nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4))
    assert "<math" in html and "$$" not in html and remote_loads(html) == []
