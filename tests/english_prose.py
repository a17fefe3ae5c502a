"""English prose in what a reader of a Chinese notebook sees.

`find_english_prose(nb)` reads an executed notebook (nbformat, or the plain dict of its JSON) and
returns a `Finding` for each run of English prose in:

- the outputs of every code cell: a stream (what the cell printed); a display or a result, in
  the one form a notebook front end shows of it (its HTML with the tags stripped, else its
  markdown, else its plain text); a figure (every text it draws: titles, axis and tick labels,
  legends, annotations, which `llmlab.i18n.record_figure_texts` keeps beside its image); a widget
  (the labels, descriptions, options and HTML it shows, read from the widget state the run saved
  in the notebook's metadata); an error's message;
- every `\\text{...}` of the LaTeX in markdown cells (the rest of the markdown is the
  translation store's business: tests/test_zh_edition.py).

The rules, in the order they apply to each line of output:

0. A line that Python compiles is code, not prose: the package's source a chapter prints
   (`print(inspect.getsource(...))`), its comments and one-line docstrings included. A printed
   value (a string, a dict, a list of literals) compiles too, but is what the reader is shown:
   it is read.
1. A quotation in Chinese corner brackets, 「…」, is the model's own text or the prompt it was
   given, shown verbatim (a figure's title: 「My favourite fruit is the」之后的下一个 token): it is
   not read. Some words are neutral (they neither count nor end a run): the glossary's English names
   (`glossary_names()`: every term and its aliases, among them the ones Chinese text keeps in
   English by design: KV cache, prefill, decode step, batching, token, TTFT ...) and the names
   of `ALLOWED`, as whole words in any case, with a plural "s". A glossary name inside prose
   still leaves the prose around it: "the block table of a request" is flagged for "of a
   request".
2. The line is cut into pieces at Chinese characters or full-width punctuation, and at `|`,
   `=`, `->`, `→`; a line that holds Chinese is cut at a tab and at two spaces or more too (the
   columns of a table). A line with no Chinese at all is not: its columns are a table's English
   headers, read as one run ("policy  steps  throughput").
3. Each piece is split at spaces into words, the punctuation around a word set aside. A word
   is **English** when it is made of letters (a hyphen or an apostrophe inside, or an
   apostrophe at the end: "ranks'", "copy-on-write") and is none of: a single letter other than
   "a" or "I" (a variable); an acronym in capitals ("GPU", "FLOPs"); a CamelCase name
   ("BlockPool", "vLLM"); a unit of `UNITS` right after a number ("12.3 ms"); True, False or
   None. Numbers, those units, acronyms, Python's values and the words of rule 1 are
   **neutral**. A snake_case name or a quoted 'key' is the code name of a choice or a column:
   beside Chinese on its line it is labelled and ends the run; on a line with no Chinese its
   English words count when it holds two or more ('requests_preempted_with_many_long_chats' is
   six, `kv_usage` two; `top_k` is a name), since a choice or a column the student types is shown
   with its Chinese label. Anything else ends
   the run: a dotted.name, a namespaced:name, a path, a URL, `inline code`, a symbol.
4. A finding is a run of neutral and English words holding at least `MIN_WORDS` (2) English
   words, shown from its first English word to its last. In `\\text{...}` every English word is
   a finding (a label in a formula is a word or two), and of the glossary only the names Chinese
   text keeps in English are neutral (`kept_names()`: \\text{prompt}, not \\text{causal mask}).
   A `\\text{}` right after `_` or `^` names a symbol (`W_\\text{gate}`) and is left alone.

The model's own text: a cell that prints what the model wrote, or the English prompts it was
given, is tagged `model-output` (the cell's metadata "tags"), and what it printed (its stream
outputs) is not read; its displays are. The model is an English one: its words are what the
chapter shows, not prose to translate. The labels such a cell prints beside them go through
`llmlab.say` like any other, but this check cannot see them: keep those cells to the model's text
and a few labels.

    python tests/english_prose.py build/zh/*.ipynb     # prints each finding; exit status 1 if any
"""

from __future__ import annotations

import ast
import html
import json
import re
import sys
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

MIN_WORDS = 2
MODEL_OUTPUT_TAG = "model-output"
FIGURE_TEXTS_MIME = "application/vnd.llmlab.figure-texts+json"  # llmlab.i18n's

# Names a Chinese text writes in English, beyond the glossary's kept terms. Each says why.
ALLOWED = (
    # the models and machines the course names (Chinese text names them as they are)
    "Llama",
    "Qwen",
    "Mistral",
    "Intel",
    "Xeon",
    "Processor",  # in a CPU's name ("Intel(R) Xeon(R) Processor", "AMD EPYC 7B13 64-Core Processor")
    "Tensor Core",  # in a GPU's name ("NVIDIA H100 Tensor Core GPU", its datasheet's title)
    "Python",  # with its version on the first line of every chapter
    # libraries and tools, by their package names
    "torch",
    "transformers",
    "triton",
    "numpy",
    "matplotlib",
    "safetensors",
    "gloo",  # torch.distributed's CPU backend
    "llmlab",
    "Hugging Face",
    "llama.cpp",
    # "batch" (one batch, as in "batch 64"): the glossary keeps its term "batching" in English
    "batch",
)

PYTHON_VALUES = ("True", "False", "None")  # printed values, not words
# units written after a number; the ones in capitals (GB, FLOP, TB/s) are acronyms anyway
UNITS = {"s", "ms", "us", "µs", "ns", "min", "h", "x", "byte", "bytes", "bit", "bits", "k"}

SPACES = re.compile(r"[\u00a0\u2000-\u200a\u202f]")  # no-break and figure spaces: a space
URL = re.compile(r"\b\w+://\S+")
INLINE_CODE = re.compile(r"`[^`\n]*`")
QUOTATION = re.compile(r"「[^」\n]*」")  # the model's text or its prompt, quoted verbatim
# pieces: a line end, a tab, 2+ spaces, CJK or full-width text, and the separators | = -> →
CUT = re.compile(
    r"\n|\t| {2,}|[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\u3000-\u303f]+"
    r"|\||->|=|→"
)
WORD = re.compile(r"[A-Za-z]+(?:[-'][A-Za-z]+)*'?")
NUMBER = re.compile(r"[-+~≈]?(?:\d[\d,_]*(?:\.\d+)?|\.\d+)(?:e[-+]?\d+)?(?:%|x|×|k|K|M|G|B)?")
ACRONYM = re.compile(r"[A-Z][A-Z0-9]+s?")  # GPU, FLOPs, L2; "A" and "I" are words
CAMEL = re.compile(r"[a-z][A-Z]")
QUOTED = re.compile(r"""(['"])\S+\1""")  # 'ttft', "prefill": a key or the repr of a name
SNAKE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+")  # kv_usage, mean_latency
CHINESE = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\u3000-\u303f]")
COLUMNS = re.compile(r"\t| {2,}")
OPEN = "([{\"“‘*_«"
CLOSE = ")]}\".,;:!?”’*_»"

TEXT_IN_LATEX = re.compile(r"(?<![_^])\\(?:text|textrm|mbox)\s*\{([^{}]*)\}")
HTML_DROP = re.compile(r"<(style|script|code)\b.*?</\1\s*>", re.S | re.I)
HTML_INLINE = re.compile(r"</?(?:b|i|em|strong|span|a|sub|sup|small|u|abbr|font)\b[^>]*>", re.I)
HTML_TAG = re.compile(r"<[^>]+>")
# a widget shows these fields of its state; the values of text inputs are the reader's own text
WIDGET_FIELDS = ("description", "tooltip", "placeholder", "_options_labels", "_titles")
WIDGET_SHOWS_VALUE = ("HTMLModel", "HTMLMathModel", "LabelModel")


@dataclass(frozen=True)
class Finding:
    """A run of English prose: the cell it is in, the kind of output ("stream", "text/html",
    "widget", "\\text{}" ...), the English words, and the line they are on."""

    cell: int
    kind: str
    text: str
    line: str = ""

    def __str__(self) -> str:
        where = f" in {self.line.strip()[:120]!r}" if self.line.strip() != self.text else ""
        return f"cell {self.cell} {self.kind}: {self.text!r}{where}"


@cache
def glossary_names() -> re.Pattern:
    """The glossary's English names (every term and its aliases) with `kept_names()`'s: the
    neutral words of rule 1."""
    from llmlab.course.glossary import load_glossary

    names = set(ALLOWED) | _kept()
    for entry in load_glossary():
        names.update((entry.term, *entry.aliases))
    return _whole_words(names)


@cache
def kept_names() -> re.Pattern:
    """The English that Chinese text keeps by design (the glossary's Chinese term where it is
    English: "KV cache", "prefill", the "roofline" of "roofline 模型") and the allow-list: the
    only neutral words in a formula's `\\text{}`."""
    return _whole_words(set(ALLOWED) | _kept())


def _kept() -> set[str]:
    from llmlab.course.glossary import load_glossary

    latin = (re.sub(r"[^\x00-\x7f]+", " ", e.primary_zh).strip() for e in load_glossary())
    return {name for name in latin if name}


def _whole_words(names: set[str]) -> re.Pattern:
    """`names` as whole words in any case, a plural "s" or "es" allowed, longest first."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w.-])(?:{alternatives})(?:e?s)?(?![\w-])", re.IGNORECASE)


def _code_name_words(token: str) -> int:
    """How many English words the code name in `token` holds (a snake_case name, a quoted key):
    0 when it is no code name."""
    quoted = token.lstrip("([{").rstrip(")]},:;.")
    name = quoted[1:-1] if QUOTED.fullmatch(quoted) else token.lstrip(OPEN).rstrip(CLOSE)
    if not SNAKE.fullmatch(name):
        return 0
    words = sum(_kind_of(part, False) == "word" for part in name.split("_"))
    return words if words >= 2 else 0  # top_k, 'ttft': a name, not a phrase


def _kind_of(token: str, after_number: bool) -> str:
    """ "word" (English), "neutral" or "break" (see rule 3)."""
    if QUOTED.fullmatch(token.lstrip("([{").rstrip(")]},:;.")):
        return "break"
    core = token.lstrip(OPEN + "'").rstrip(CLOSE)
    if not core:
        return "neutral"  # punctuation alone: "—", "(", ":"
    if NUMBER.fullmatch(core):
        return "number"
    if not WORD.fullmatch(core):
        return "break"
    if after_number and core in UNITS:
        return "neutral"
    if len(core) == 1 and core not in ("a", "A", "I"):
        return "break"
    if core in PYTHON_VALUES:
        return "neutral"
    if ACRONYM.fullmatch(core) or CAMEL.search(core):
        return "neutral" if ACRONYM.fullmatch(core) else "break"
    return "word"


def english_runs(
    text: str, min_words: int = MIN_WORDS, names: re.Pattern | None = None
) -> list[tuple[str, str]]:
    """(the English words, the line) of each run of `min_words` English words or more in
    `text` (rules 0-4 of the module docstring); `names`: the neutral names of rule 1 (by
    default `glossary_names()`)."""
    names = glossary_names() if names is None else names
    found = []
    for line in SPACES.sub(" ", text).splitlines():
        if _is_code(line):
            continue
        chinese = CHINESE.search(line) is not None
        neutral = _covered(names, line)
        code = _covered(URL, line) | _covered(INLINE_CODE, line) | _covered(QUOTATION, line)
        run: list[tuple[int, int]] = []
        words_at: list[tuple[int, int]] = []
        words, after_number = 0, False
        for token in _tokens(line, columns=chinese):
            named = 0 if token is None or chinese else _code_name_words(line[slice(*token)])
            if token is None:
                kind = "break"
            elif neutral.intersection(range(*token)):
                kind = "neutral"
            elif code.intersection(range(*token)):
                kind = "break"
            elif named:
                kind = "word"  # a code name shown with no Chinese label: its words count
            else:
                kind = _kind_of(line[slice(*token)], after_number)
            after_number = kind == "number"
            if kind != "break":
                run.append(token)
                if kind == "word":
                    words += max(named, 1)
                    words_at.append(token)
                continue
            if words >= min_words:
                first, last = words_at[0], words_at[-1]  # the run from its first English word
                found.append((line[first[0] : last[1]], line))
            run, words, words_at = [], 0, []
    return found


def _covered(pattern: re.Pattern, line: str) -> set[int]:
    """The positions in `line` that the matches of `pattern` cover."""
    return {i for m in pattern.finditer(line) for i in range(m.start(), m.end())}


def _tokens(line: str, columns: bool = True):
    """The (start, end) of each word of `line`, and None where the line is cut (rule 2; at its
    columns only where `columns`) and at its end."""
    pos = 0
    cuts = [m for m in CUT.finditer(line) if columns or not COLUMNS.fullmatch(m.group())]
    for cut in [*cuts, None]:
        stop = cut.start() if cut else len(line)
        for m in re.finditer(r"[^ ]+", line[pos:stop]):
            yield (pos + m.start(), pos + m.end())
        yield None
        pos = cut.end() if cut else stop


# rule 0: a line of code compiles alone, or as the head of a block ("if x:"), or inside one
# ("else:", "return x")
CODE_CONTEXTS = (
    "{}",
    "{}\n pass",
    "if 1:\n pass\n{}\n pass",
    "try:\n pass\n{}\n pass",
    "def f():\n {}\n pass",
)
# a line of a signature or a call split over lines ("layer: int,", "q, k, **scales"): code when it
# ends with a comma or unpacks keywords, which prose does not do
FRAGMENT_CONTEXTS = ("def f(\n{}\n): pass", "f(\n{}\n)")


def _is_code(line: str) -> bool:
    """True when Python compiles `line` (rule 0): a statement, a comment, a docstring; but not a
    printed value (a string, a dict, a list of literals), which is what the reader is shown."""
    code = line.strip()
    if not code:
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "invalid decimal literal" and the like: not code
        for context in CODE_CONTEXTS:
            try:
                tree = ast.parse(context.format(code))
            except (SyntaxError, ValueError):
                continue
            return not (context == "{}" and _is_value(tree) and not code.startswith(DOCSTRING))
        if code.endswith(",") or "**" in code:
            for context in FRAGMENT_CONTEXTS:
                try:
                    ast.parse(context.format(code))
                except (SyntaxError, ValueError):
                    continue
                return True
    return False


DOCSTRING = ('"""', "'''")


def _is_value(tree: ast.Module) -> bool:
    """True when `tree` is one expression made of literals only: the repr of a printed value."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return False
    try:
        ast.literal_eval(tree.body[0].value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _html_text(markup: str) -> str:
    """The text an HTML display shows: code, styles and scripts out; inline tags join their
    text to the sentence, the other tags end a line (a table's cells, a div's lines)."""
    text = HTML_INLINE.sub("", HTML_DROP.sub(" ` ", markup))
    return html.unescape(HTML_TAG.sub("\n", text))


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _widget_texts(nb, model_id: str, seen: set[str] | None = None) -> list[str]:
    """The texts the widget `model_id` and its children show, from the saved widget state."""
    state = (
        (nb.get("metadata") or {})
        .get("widgets", {})
        .get("application/vnd.jupyter.widget-state+json", {})
        .get("state", {})
    )
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in state:
        return []
    seen.add(model_id)
    model = state[model_id]
    fields = model.get("state", {})
    texts = []
    for name in WIDGET_FIELDS:
        value = fields.get(name)
        values = value if isinstance(value, list) else [value]
        texts += [v for v in values if isinstance(v, str) and v.strip("\u200b ")]
    if model.get("model_name") in WIDGET_SHOWS_VALUE and isinstance(fields.get("value"), str):
        texts.append(_html_text(fields["value"]))
    for child in fields.get("children", []) or []:
        if isinstance(child, str) and child.startswith("IPY_MODEL_"):
            texts += _widget_texts(nb, child.removeprefix("IPY_MODEL_"), seen)
    return texts


def _output_texts(nb, output) -> list[tuple[str, str]]:
    """(kind, text) of what the reader sees of one output."""
    kind = output.get("output_type")
    if kind == "stream":
        return [("stream", _joined(output.get("text", "")))]
    if kind == "error":
        return [("error", f"{output.get('ename', '')}: {output.get('evalue', '')}")]
    data = output.get("data") or {}
    drawn = data.get(FIGURE_TEXTS_MIME)
    figure = [("figure", "\n".join(drawn.get("texts", [])))] if isinstance(drawn, dict) else []
    view = data.get("application/vnd.jupyter.widget-view+json")
    if isinstance(view, dict) and view.get("model_id"):
        # the reader sees the widget, not the Python repr in text/plain: its texts come from the
        # saved state where the run kept it; without it, nothing (its labels are the package's,
        # held by the term and label lints and the pairs catalog)
        texts = _widget_texts(nb, view["model_id"])
        return [("widget", "\n".join(texts))] if texts else []
    for mime in ("text/html", "text/markdown", "text/plain"):
        if mime in data:
            text = _joined(data[mime])
            return figure + [(mime, _html_text(text) if mime == "text/html" else text)]
    return figure


def find_english_prose(nb) -> list[Finding]:
    """Every run of English prose a reader of the executed notebook `nb` sees (see the module
    docstring for the rules), in cell order."""
    found: list[Finding] = []
    for index, cell in enumerate(nb.get("cells", [])):
        source = _joined(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            for label in TEXT_IN_LATEX.findall(source):
                label_text = label.replace("\\_", "_")
                for words, _ in english_runs(label_text, min_words=1, names=kept_names()):
                    found.append(Finding(index, "\\text{}", words, f"\\text{{{label}}}"))
            continue
        if cell.get("cell_type") != "code":
            continue
        model_output = MODEL_OUTPUT_TAG in (cell.get("metadata") or {}).get("tags", [])
        seen = set()
        for output in cell.get("outputs", []):
            for kind, text in _output_texts(nb, output):
                if model_output and kind == "stream":
                    continue
                for words, line in english_runs(text):
                    if (kind, words, line) not in seen:
                        seen.add((kind, words, line))
                        found.append(Finding(index, kind, words, line))
    return found


def main(paths: list[str]) -> int:
    if not paths or paths[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if paths else 2
    total = 0
    for path in paths:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        findings = find_english_prose(nb)
        total += len(findings)
        for f in findings:
            print(f"{Path(path).name} {f}")
        print(f"{Path(path).name}: {len(findings)} runs of English prose")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
