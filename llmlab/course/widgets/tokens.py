"""Token viewer: text in, coloured tokens and their ids out (any tokenizer of `llmlab.tokenizer`).

`token_html(text, tokenizer)` is the plain function (an HTML string); `show_tokens` displays
it; `token_viewer()` wraps it in a text box that re-renders as you type; `compare_tokenizers`
shows the same text cut by several tokenizers, e.g. our small BPE next to SmolLM2's.
"""

from __future__ import annotations

from html import escape
from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.tokenizer import format_piece, token_pieces

M = catalog("widgets.tokens")

# light background colours, cycled so that neighbouring tokens differ
PALETTE = ["#fde68a", "#bfdbfe", "#bbf7d0", "#fecaca", "#ddd6fe", "#fed7aa", "#a5f3fc", "#f5d0fe"]


def token_html(text: str, tokenizer: Any = None, show_ids: bool = True) -> str:
    """HTML of `text` cut into tokens: one coloured box per token with its id underneath.

    Pieces that are only part of a UTF-8 character (a Chinese character or emoji split across
    tokens) show as hex bytes, e.g. <e4 bd>. tokenizer: a `BPETokenizer`, a Hugging Face
    tokenizer, or None for the real SmolLM2 tokenizer.
    """
    if tokenizer is None:
        from llmlab.tokenizer import real_tokenizer

        tokenizer = real_tokenizer()
    pieces = token_pieces(tokenizer, text)
    boxes = []
    for k, (tid, piece) in enumerate(pieces):
        colour = PALETTE[k % len(PALETTE)]
        label = escape(format_piece(piece))
        ident = f'<br><span style="font-size:70%;color:#555">{tid}</span>' if show_ids else ""
        boxes.append(
            f'<span style="display:inline-block;background:{colour};margin:1px;'
            f'padding:1px 3px;border-radius:3px;font-family:monospace;text-align:center">'
            f'{label}{ident}</span>'
        )
    n_chars = len(text)
    n_bytes = len(text.encode("utf-8"))
    counts = M(
        "token_html.tokens_characters_utf", len_pieces=len(pieces), n_chars=n_chars, n_bytes=n_bytes
    )
    head = f'<div style="font-size:85%;color:#333">{counts}</div>'
    return f'<div class="llmlab-tokens">{head}{"".join(boxes)}</div>'


def show_tokens(text: str, tokenizer: Any = None, show_ids: bool = True) -> Any:
    """Display `token_html(...)` in a notebook and return the IPython HTML object."""
    from IPython.display import HTML, display

    h = HTML(token_html(text, tokenizer, show_ids))
    display(h)
    return h


def compare_tokenizers(text: str, tokenizers: dict[str, Any]) -> Any:
    """Show the same text cut by each tokenizer (name → tokenizer), one row per tokenizer."""
    from IPython.display import HTML, display

    rows = [
        f'<div style="margin:6px 0"><b>{escape(name)}</b>{token_html(text, tok)}</div>'
        for name, tok in tokenizers.items()
    ]
    h = HTML("".join(rows))
    display(h)
    return h


def token_viewer(text: str = "Hello, world! 今天天气真好 👋", tokenizer: Any = None) -> Any:
    """A text box and the tokens of whatever is typed in it (re-rendered on every change)."""
    import ipywidgets as w

    if tokenizer is None:
        from llmlab.tokenizer import real_tokenizer

        tokenizer = real_tokenizer()
    box = w.Textarea(
        value=text, description=M("token_viewer.text"), layout=w.Layout(width="95%", height="70px")
    )
    out = w.HTML(value=token_html(text, tokenizer))

    def update(change: dict) -> None:
        out.value = token_html(change["new"], tokenizer)

    box.observe(update, names="value")
    return w.VBox([box, out])
