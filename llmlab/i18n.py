"""The language the course speaks to the student: English (the default) or Chinese.

`tr(en, zh)` picks the text of the language in use.

`set_language("zh")` (or the environment variable `LLMLAB_LANG=zh`, which the Chinese notebooks'
first cell sets) chooses Chinese; it also gives matplotlib a CJK font, so that Chinese figure
titles and axis labels are drawn instead of empty boxes. The font is Noto Sans CJK SC, which
the set-up installs from the package registry inside the Python package `mplfonts`; nothing is
fetched at run time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

LANGUAGES = ("en", "zh")
LANG_ENV = "LLMLAB_LANG"
CJK_FONT_FILE = "NotoSansCJKsc-Regular.otf"
CJK_FONT_NAME = "Noto Sans CJK SC"

_chosen: str | None = None


def language() -> str:
    """ "en" or "zh": what `set_language` chose, else `LLMLAB_LANG`, else "en"."""
    if _chosen is not None:
        return _chosen
    env = os.environ.get(LANG_ENV, "en").strip().lower() or "en"
    return env if env in LANGUAGES else "en"


def tr(en: str, zh: str) -> str:
    """The text the student reads: `en` in English (the default), `zh` in Chinese.

    A student-facing string written where it is used is such a pair, so that the two languages
    are edited together: `ax.set_ylabel(tr("time per token", "每个 token 的时间"))`. The
    checkers' hints and verdicts go in keyed catalogs instead (`llmlab.course.check.catalog`).
    """
    return zh if language() == "zh" else en


class Bilingual(Mapping):
    """A read-only mapping whose values are shown in the language in use, the keys the same in
    both (the hardware presets' texts, whose Chinese their data file gives beside the English).

        LEVEL = Bilingual({"name": "L2 cache"}, {"name": "L2 缓存"})
        for key, text in LEVEL.items(): print(key, text)     # English, or Chinese after set_language("zh")
    """

    def __init__(self, en: dict, zh: dict) -> None:
        missing = set(en) ^ set(zh)
        if missing:
            raise ValueError(
                f"zh must have exactly the keys of en; differing keys: {sorted(map(str, missing))}"
            )
        self.en, self.zh = dict(en), dict(zh)

    def __getitem__(self, key):
        return tr(self.en[key], self.zh[key])

    def __iter__(self):
        return iter(self.en)

    def __len__(self) -> int:
        return len(self.en)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def set_language(lang: str) -> None:
    """Speak `lang` ("en" or "zh") from now on in this process. Returns nothing, so the
    notebook cell that calls it shows no output."""
    global _chosen
    lang = str(lang).strip().lower()
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    _chosen = lang
    if lang == "zh":
        use_cjk_font()
    record_figure_texts()


@contextlib.contextmanager
def speaking(lang: str):
    """Speak `lang` inside the `with` block, and whatever was spoken before after it."""
    global _chosen
    before = _chosen
    set_language(lang)
    try:
        yield
    finally:
        _chosen = before


# A figure a notebook cell shows is an image: a reader sees its words, a check of the notebook
# cannot. So each figure shown carries its words beside the image, under a type of output no
# front end draws; tests/english_prose.py reads them there.
FIGURE_TEXTS_MIME = "application/vnd.llmlab.figure-texts+json"


def figure_texts(fig) -> list[str]:
    """Every piece of text the matplotlib Figure `fig` shows, in drawing order: titles, axis
    labels, tick labels, legend entries and titles, texts and annotations (the visible ones)."""
    from matplotlib.text import Text

    return [
        t.get_text() for t in fig.findobj(match=Text) if t.get_visible() and t.get_text().strip()
    ]


def record_figure_texts() -> None:
    """Inside IPython (a notebook's kernel): every Figure a cell shows from now on carries its
    `figure_texts` beside its image, under `FIGURE_TEXTS_MIME`. Outside IPython, nothing."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or FIGURE_TEXTS_MIME in shell.display_formatter.formatters:
        return
    from IPython.core.formatters import BaseFormatter
    from traitlets import Unicode

    class FigureTexts(BaseFormatter):
        # matplotlib's inline backend drops every formatter's printer for Figure when pyplot
        # loads, so this one recognises a Figure itself rather than registering a printer
        format_type = Unicode(FIGURE_TEXTS_MIME)

        def __call__(self, obj):
            figure = sys.modules.get("matplotlib.figure")  # no figure before matplotlib loads
            if figure is None or not isinstance(obj, figure.Figure):
                return None
            return {"texts": figure_texts(obj)}

    formatter = FigureTexts(parent=shell.display_formatter)
    shell.display_formatter.formatters[FIGURE_TEXTS_MIME] = formatter


def cjk_font_path() -> Path | None:
    """The CJK font file the set-up installed, or None when it is not there."""
    spec = importlib.util.find_spec("mplfonts")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "fonts" / CJK_FONT_FILE
        if path.is_file():
            return path
    return None


def use_cjk_font() -> str:
    """Register the CJK font with matplotlib and put it first among the sans-serif fonts (Latin
    text keeps a Latin look: the font has Latin glyphs too). Returns the font's name; raises
    RuntimeError naming the fix when the font is not installed."""
    import matplotlib
    from matplotlib import font_manager

    path = cjk_font_path()
    if path is None:
        raise RuntimeError(
            f"the CJK font {CJK_FONT_FILE} is not installed: run `make setup` "
            f"(or `pip install mplfonts`)"
        )
    font_manager.fontManager.addfont(str(path))
    name = font_manager.FontProperties(fname=str(path)).get_name()
    fonts = [name] + [f for f in matplotlib.rcParams["font.sans-serif"] if f != name]
    matplotlib.rcParams["font.sans-serif"] = fonts
    matplotlib.rcParams["font.family"] = ["sans-serif"]
    matplotlib.rcParams["axes.unicode_minus"] = False  # the font's minus sign is the ASCII one
    return name


# Texts written in notebook code cells: the ones they hand to the package (the `quantity=`,
# `if_high=`, ... of `llmlab.course.check.predict.compare`, the `title=` of a `plot_*`), the lines
# they print with `say`, the tables they print with `say_table`, and the labels they wrap in
# `notebook_text`. The code cells are the same in every language, so these texts are English in
# the notebook and are translated where they are shown, from the catalog
# `i18n/<lang>/notebook-strings.json` at the repository root ({"strings": {"<English>": "<text>"}};
# `python -m llmlab lang strings zh notebooks/` lists the ones it lacks). A text built by an
# f-string is kept with its placeholders as written in the notebook
# ("cache speed-up at T={lengths[-1]}"); the translation uses the same placeholders.
NOTEBOOK_STRINGS = "notebook-strings.json"
_PLACEHOLDER = re.compile(r"\{[^{}]+\}")
_catalogs: dict[str, tuple[dict[str, str], list[tuple[re.Pattern, list[str], str]]]] = {}


def notebook_strings_path(lang: str) -> Path:
    return Path(__file__).resolve().parent.parent / "i18n" / lang / NOTEBOOK_STRINGS


def _catalog(lang: str) -> tuple[dict[str, str], list[tuple[re.Pattern, list[str], str]]]:
    """The catalog of `lang`, read once: exact texts, and the templates of f-strings as
    (pattern matching the shown text, its placeholders, translation)."""
    if lang not in _catalogs:
        path = notebook_strings_path(lang)
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        strings = {str(k): str(v) for k, v in (data.get("strings") or {}).items() if str(v).strip()}
        templates = []
        for en, text in strings.items():
            names = _PLACEHOLDER.findall(en)
            if names:
                parts = _PLACEHOLDER.split(en)
                pattern = "(.*?)".join(re.escape(p) for p in parts)
                templates.append((len("".join(parts)), re.compile(pattern, re.DOTALL), names, text))
        # the template with the most fixed text first: "{n} tokens" never shadows "{n} tokens/s"
        templates.sort(key=lambda t: -t[0])
        _catalogs[lang] = (strings, [t[1:] for t in templates])
    return _catalogs[lang]


def notebook_text(en: str) -> str:
    """A text written in a notebook's code cell (English), in the language in use: its
    translation from the catalog in Chinese, else `en` unchanged."""
    lang = language()
    if lang == "en" or not isinstance(en, str) or not en:
        return en
    strings, templates = _catalog(lang)
    if en in strings:
        return strings[en]
    for pattern, names, text in templates:
        m = pattern.fullmatch(en)
        if m:
            values = dict(zip(names, m.groups()))
            return _PLACEHOLDER.sub(lambda p: values.get(p.group(), p.group()), text)
    return en


def say(*values: object, sep: str = " ", end: str = "\n") -> None:
    """`print` in the language in use, for the lines a notebook cell prints: each text among
    `values` is shown by `notebook_text` (its translation from the catalog in Chinese, itself in
    English), anything else as `print` shows it; no space follows a text that ends in full-width
    punctuation ("层数：61"). A line written as one f-string translates as a whole, with its
    placeholders where the translation puts them:

        say(f"engine ready in {seconds:.1f} s (measured on this machine)")
    """
    parts = [notebook_text(v) if isinstance(v, str) else str(v) for v in values]
    line = "".join(
        part + ("" if i == len(parts) - 1 or (sep == " " and part.endswith(_FULL_WIDTH)) else sep)
        for i, part in enumerate(parts)
    )
    print(line, end=end)


# a Chinese label ends in full-width punctuation, which already holds its space: "层数：61"
_FULL_WIDTH = ("：", "，", "；", "。", "）")


def say_table(
    rows: Iterable[Sequence[object]],
    headers: Sequence[object] | None = None,
    *,
    align: str = "lr",
    rule: bool = False,
) -> None:
    """Print a table that a notebook cell builds (`llmlab.utils.format_table`, aligned by screen
    columns, so Chinese headers line up): every text among the headers and the cells is shown
    by `notebook_text`; numbers format before (`f"{x:.2f}"`)."""
    from llmlab.utils import format_table

    def shown(cell: object) -> object:
        return notebook_text(cell) if isinstance(cell, str) else cell

    body = [[shown(c) for c in row] for row in rows]
    head = None if headers is None else [shown(h) for h in headers]
    print(format_table(body, head, align=align, rule=rule))
