"""The reader's edition (`make run`) as HTML that needs nothing from the internet: math in the
markdown is turned into MathML at build time (browsers draw MathML themselves) and the page
loads no MathJax; a test checks that no script or style comes from elsewhere."""

from __future__ import annotations

import copy
import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"
# fenced code blocks and inline code spans keep their dollars
_CODE = re.compile(r"(```.*?```|~~~.*?~~~|`[^`\n]*`)", re.S)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$\w])\$(?!\s)([^$\n]+?)(?<![\s\\])\$(?![\w$])")


def _mathml(latex: str, display: bool) -> str:
    from latex2mathml.converter import convert

    return convert(latex.strip(), display="block" if display else "inline")


def markdown_math_to_mathml(text: str) -> str:
    """`text` with every $$...$$ and $...$ outside code replaced by MathML."""
    parts = _CODE.split(text)
    for i in range(0, len(parts), 2):  # even parts: outside code
        part = _DISPLAY.sub(lambda m: "\n\n" + _mathml(m[1], True) + "\n\n", parts[i])
        parts[i] = _INLINE.sub(lambda m: _mathml(m[1], False), part)
    return "".join(parts)


def to_html(nb) -> str:
    """The HTML page of an executed notebook, math as MathML, nothing fetched at read time."""
    from nbconvert import HTMLExporter

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = markdown_math_to_mathml(cell.source)
    exporter = HTMLExporter(template_name="offline", extra_template_basedirs=[str(TEMPLATES)])
    html, _ = exporter.from_notebook_node(nb)
    return html


REMOTE = re.compile(
    r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//[^>]*>"""
    r"""|@import\s+(?:url\()?["']?(?:https?:)?//[^;]*|url\(["']?(?:https?:)?//[^)]*\)""",
    re.I,
)


def remote_loads(html: str) -> list[str]:
    """The tags of `html` that would fetch something from another host when the page opens."""
    return [m[0] for m in REMOTE.finditer(html)]
