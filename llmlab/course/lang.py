"""The course in a second language, from one source: the English notebooks stay the source, and
each markdown cell's translation is kept beside them with the hash of the English text it
translates. Building the Chinese notebooks copies every code cell unchanged and swaps each
markdown cell for its translation; a cell whose English changed since it was translated is
reported as stale, never silently shipped.

    python -m llmlab lang check zh notebooks/           # which cells lack a translation, which are stale
    python -m llmlab lang extract zh notebooks/         # add the untranslated cells to the store (empty)
    python -m llmlab lang build zh notebooks/ build/zh/ # write the Chinese notebooks
    python -m llmlab lang lint zh notebooks/            # non-primary terms in the translations
                                                        # and in the package's Chinese strings
    python -m llmlab lang strings zh notebooks/         # texts in code cells the catalog lacks
    python -m llmlab lang pairs zh [--write]            # the package's (English, Chinese) pairs
                                                        # against i18n/zh/package-pairs.json

The store is one JSON file per notebook, `i18n/<lang>/<notebook stem>.json` next to `notebooks/`:

    {"cells": {"<cell id>": {"en_sha": "<sha256 of the English source>", "en": "<the English>",
                             "text": "<the translation>"}}}

Cells are matched by their notebook cell id (which survives edits and moves); `en_sha` says which
English text the translation was made from, and `en` keeps that text so a translator sees what
changed.

Code cells stay English, and so do the texts they hand to the package: the `quantity=`,
`if_high=`, `if_low=` and `explain=` of `llmlab.course.check.predict.compare` / `compare_choice`,
the lines they print with `llmlab.say`, the tables they print with `llmlab.say_table`, the
labels they wrap in `llmlab.notebook_text` and the `title=` they give a `plot_*` function (the
English prose a Chinese reader would otherwise see in an output: tests/english_prose.py finds
it). Their translations are kept in one catalog, `i18n/<lang>/notebook-strings.json`,
{"strings": {"<English text>": "<translation>"}}, and shown by `llmlab.i18n.notebook_text`. An
f-string is kept with its placeholders as written ("cache speed-up at T={lengths[-1]}"), and its
translation uses the same ones. `lang strings` adds each text the catalog lacks (an English edit
makes a new text) with an empty translation.

The package speaks Chinese through `tr(en, zh)` pairs written where they are used (checkers,
widgets, figures, analysis). `package_strings()` finds each pair by reading the source (no
import): the two arguments of every `tr(...)` call (each a text written in the call or a
constant of the module, as in `tr(PASS_WORD, PASS_WORD_ZH)`), every ("English", "中文") tuple (the
tables `tr(*pair)` unpacks) and every {"English": "中文"} entry of a dict (lookup tables keyed by
the English they translate, such as the figures' table headers). `lint_package()` holds the
Chinese halves to the glossary like the notebooks' translations; `python -m llmlab lang pairs zh`
keeps every pair in a reviewed catalog, so that an English edit flags its Chinese
(`llmlab.course.package_pairs`).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from llmlab.i18n import _PLACEHOLDER  # an f-string's placeholder, as the catalog matches it

LANGS = ("zh",)
FIRST_CELL_TAG = "llmlab-language"


def en_sha(source: str) -> str:
    return hashlib.sha256(source.strip().encode("utf-8")).hexdigest()


def store_dir(notebooks: Path, lang: str) -> Path:
    return Path(notebooks).resolve().parent / "i18n" / lang


def _check_lang(lang: str) -> str:
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    return lang


def read_store(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    cells = data.get("cells", {}) if isinstance(data, dict) else {}
    return {str(k): v for k, v in cells.items() if isinstance(v, dict)}


def write_store(path: Path, cells: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"cells": cells}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )


@dataclass(frozen=True)
class Problem:
    notebook: str
    cell: int
    cell_id: str
    what: str  # "missing" (no translation) or "stale" (the English changed since)
    english: str

    def __str__(self) -> str:
        first = self.english.strip().splitlines()[0][:70] if self.english.strip() else ""
        why = "has no translation" if self.what == "missing" else "changed since it was translated"
        return f"{self.notebook} cell {self.cell} (id {self.cell_id}) {why}: {first!r}"


def problems(nb, stem: str, store: dict[str, dict]) -> list[Problem]:
    """The markdown cells of `nb` with no translation in `store`, or a stale one."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or not cell.source.strip():
            continue
        entry = store.get(str(cell.get("id")))
        if entry is None or not str(entry.get("text", "")).strip():
            out.append(Problem(stem, i, str(cell.get("id")), "missing", cell.source))
        elif entry.get("en_sha") != en_sha(cell.source):
            out.append(Problem(stem, i, str(cell.get("id")), "stale", cell.source))
    return out


def translate(nb, stem: str, store: dict[str, dict], lang: str):
    """A copy of notebook `stem` in `lang`: the same code cells, each markdown cell its
    translation, and a first code cell that chooses the language for the checkers, widgets and
    figures. Raises ValueError naming every missing or stale cell."""
    bad = problems(nb, stem, store)
    if bad:
        raise ValueError("cannot build: " + "; ".join(map(str, bad)))
    from nbformat.v4 import new_code_cell

    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.cell_type == "markdown" and cell.source.strip():
            cell.source = store[str(cell.get("id"))]["text"]
    first = new_code_cell(f'import llmlab\nllmlab.set_language("{lang}")')
    first.metadata["tags"] = [FIRST_CELL_TAG]
    out.cells.insert(0, first)
    out.metadata["llmlab"] = {**out.metadata.get("llmlab", {}), "lang": lang}
    return out


def _notebooks(src: Path) -> list[Path]:
    src = Path(src)
    return [src] if src.suffix == ".ipynb" else sorted(src.glob("*.ipynb"))


def _read(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)


def check(lang: str, src: Path) -> list[Problem]:
    _check_lang(lang)
    found = []
    for path in _notebooks(src):
        found += problems(
            _read(path), path.stem, read_store(store_dir(path.parent, lang) / f"{path.stem}.json")
        )
    return found


def extract(lang: str, src: Path) -> int:
    """Add every markdown cell without a translation to the store (empty text, the English kept
    beside it); stale entries keep their text and get the new English to compare. Returns how
    many entries were added or updated."""
    _check_lang(lang)
    changed = 0
    for path in _notebooks(src):
        nb = _read(path)
        file = store_dir(path.parent, lang) / f"{path.stem}.json"
        store = read_store(file)
        for p in problems(nb, path.stem, store):
            entry = store.setdefault(p.cell_id, {"text": ""})
            if p.what == "missing":
                entry.update({"en": p.english, "en_sha": en_sha(p.english)})
            else:
                entry["en_new"] = p.english
            changed += 1
        write_store(file, store)
    return changed


def lint(lang: str, src: Path) -> list[str]:
    """Each place a translation names a concept by a synonym the glossary says not to use
    (see `llmlab.course.glossary.zh_synonym_uses`), as "notebook cell N: found -> primary (context)"."""
    from llmlab.course.glossary import lint_terms, not_synonyms, zh_synonym_uses

    _check_lang(lang)
    entries, exceptions = lint_terms(), not_synonyms()  # read once, not once per cell
    found = []
    for path in _notebooks(src):
        store = read_store(store_dir(path.parent, lang) / f"{path.stem}.json")
        index = {str(c.get("id")): i for i, c in enumerate(_read(path).cells)}
        for cell_id, entry in store.items():
            for use in zh_synonym_uses(str(entry.get("text", "")), entries, exceptions):
                found.append(
                    f"{path.stem} cell {index.get(cell_id, '?')}: {use.found!r} -> write "
                    f"{use.primary!r} ({use.term}); in: {use.context!r}"
                )
    return found


@dataclass(frozen=True)
class PackageString:
    """The Chinese half of one bilingual pair in the package's source."""

    path: str  # relative to the package's parent folder: "llmlab/course/widgets/kv.py"
    line: int
    zh: str  # an f-string keeps its placeholders as written ("上下文 {context}")
    en: str = ""  # the English half ("" where the reader found none)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def _is_tr(func: ast.AST) -> bool:
    return (isinstance(func, ast.Name) and func.id == "tr") or (
        isinstance(func, ast.Attribute) and func.attr == "tr"
    )


def _has_cjk(text: str) -> bool:
    from llmlab.course.glossary import has_cjk

    return has_cjk(text)


def _module_values(tree: ast.Module) -> dict[str, ast.AST]:
    """What the top of a module binds to a name (`NAME = ...`, `NAME: T = ...`), so that a pair
    written as `tr(PASS_WORD, PASS_WORD_ZH)` is read from the constants it names."""
    values: dict[str, ast.AST] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name):
            values[target.id] = value
    return values


def source_strings(source: str, path: str = "") -> list[PackageString]:
    """The Chinese halves of the bilingual pairs in Python `source` (see the module docstring)."""
    tree = ast.parse(source)
    values = _module_values(tree)
    found: list[PackageString] = []
    added: set[tuple[int, str]] = set()

    def named(node: ast.AST) -> ast.AST:
        return values.get(node.id, node) if isinstance(node, ast.Name) else node

    def add(node: ast.AST, en_node: ast.AST | None = None) -> None:
        text = _text(node)
        en = (_text(en_node) if en_node is not None else None) or ""
        if text is None or not _has_cjk(text) or (id(node), en) in added:
            return
        added.add((id(node), en))
        found.append(PackageString(path, node.lineno, text, en))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2 and _is_tr(node.func):
            add(named(node.args[1]), named(node.args[0]))
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2:
            en, zh = (_text(e) for e in node.elts)
            if en is not None and zh is not None and not _has_cjk(en):
                add(node.elts[1], node.elts[0])
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                en = _text(k) if k is not None else None
                if en is not None and not _has_cjk(en):
                    add(v, k)
    return sorted(found, key=lambda s: s.line)


def package_strings(package: Path | None = None) -> list[PackageString]:
    """The Chinese halves of the bilingual pairs in every module of the package `package` (by
    default llmlab itself), in file and line order."""
    package = Path(package) if package is not None else Path(__file__).resolve().parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        found += source_strings(path.read_text(encoding="utf-8"), rel)
    return found


def lint_package(lang: str, package: Path | None = None) -> list[str]:
    """Each place a Chinese package string names a concept by a name the glossary says not to
    use, as "path:line: found -> primary (context)"."""
    from llmlab.course.glossary import lint_terms, not_synonyms, zh_synonym_uses

    _check_lang(lang)
    entries, exceptions = lint_terms(), not_synonyms()
    return [
        f"{s}: {use.found!r} -> write {use.primary!r} ({use.term}); in: {use.context!r}"
        for s in package_strings(package)
        for use in zh_synonym_uses(s.zh, entries, exceptions)
    ]


# The calls whose texts a student reads, and their keyword arguments that are text.
TEXT_ARGS = {
    "compare": ("quantity", "if_high", "if_low"),
    "compare_choice": ("quantity", "explain"),
}


def _predict_call(func: ast.AST) -> str | None:
    """ "compare" or "compare_choice" when `func` names llmlab's (`compare`, `predict.compare`,
    `llmlab.course.check.predict.compare`), else None (`sim.compare` is another function)."""
    if isinstance(func, ast.Name) and func.id in TEXT_ARGS:
        return func.id
    if isinstance(func, ast.Attribute) and func.attr in TEXT_ARGS:
        owner = func.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
        return func.attr if name == "predict" else None
    return None


def _text(node: ast.AST) -> str | None:
    """The text of a string literal; an f-string with its placeholders as written
    (f"at T={lengths[-1]}" -> "at T={lengths[-1]}"); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                conv = f"!{chr(v.conversion)}" if v.conversion > 0 else ""
                spec = f":{_text(v.format_spec)}" if v.format_spec is not None else ""
                out.append("{" + ast.unparse(v.value) + conv + spec + "}")
        return "".join(out)
    return None


# The calls of `llmlab.i18n` that show texts written in a code cell: `say` (each text it is
# given), `notebook_text` (its text) and `say_table` (every text in its headers and rows). Of
# these, only the texts with a word to translate are collected: not "T", "ms" or f"{x:.2f}".
SHOWN_CALLS = ("say", "say_table", "notebook_text")
_WORD = re.compile(r"(?<![\w.])[a-z]{3,}(?!\w)")  # a word of its own, not part of a name


def _shown_call(func: ast.AST) -> str | None:
    """The name of the `llmlab.i18n` call `func` names (`say`, `llmlab.say`, `i18n.say`), else
    None."""
    if isinstance(func, ast.Name) and func.id in SHOWN_CALLS:
        return func.id
    if isinstance(func, ast.Attribute) and func.attr in SHOWN_CALLS:
        owner = func.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
        return func.attr if name in ("llmlab", "i18n") else None
    return None


# the keyword arguments of llmlab's plots that are text a cell writes
PLOT_TEXTS = ("title", "source")


def _plot_call(func: ast.AST) -> bool:
    """True for a call of one of llmlab's plots (`plot_roofline`, `mw.plot_latency_vs_load`):
    each shows its `title=` (and `plot_compare` its `source=`) through
    `llmlab.i18n.notebook_text`."""
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name.startswith("plot_")


def _texts_under(node: ast.AST) -> list[str]:
    """Every string literal and f-string under `node` (an f-string whole, not its pieces) that
    is shown as it is: not a key it is indexed by (`sources["mem_bw"]`) nor what it hands
    another call."""
    text = _text(node)
    if text is not None:
        return [text]
    if isinstance(node, ast.Subscript):
        children = [node.value]
    elif isinstance(node, ast.Call):
        children = [node.func]
    else:
        children = list(ast.iter_child_nodes(node))
    return [t for child in children for t in _texts_under(child)]


def _shown_texts(name: str, call: ast.Call) -> list[str]:
    if name == "say_table":
        texts = [t for arg in call.args for t in _texts_under(arg)]
    else:
        texts = [_text(arg) for arg in call.args[: 1 if name == "notebook_text" else None]]
    return [t for t in texts if t and _WORD.search(_PLACEHOLDER.sub("", t))]


def code_strings(source: str) -> list[str]:
    """The texts that the code `source` passes to `compare` / `compare_choice`, shows with
    `say`, `say_table` and `notebook_text`, and gives a plot as its `title=`, in order."""
    plain = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )  # IPython magics are not Python
    found = []
    for node in ast.walk(ast.parse(plain)):
        if not isinstance(node, ast.Call):
            continue
        name = _predict_call(node.func)
        texts = (
            [_text(kw.value) for kw in node.keywords if kw.arg in TEXT_ARGS[name]] if name else []
        )
        shown = _shown_call(node.func)
        texts += _shown_texts(shown, node) if shown else []
        if _plot_call(node.func):  # llmlab's plots show the `title=` and `source=` of a cell
            texts += [_text(kw.value) for kw in node.keywords if kw.arg in PLOT_TEXTS]
        found += [t for t in texts if t and t.strip() and t not in found]
    return found


def notebook_strings(src: Path) -> list[str]:
    """The texts that the code cells of the notebook(s) `src` show through the catalog (see
    `code_strings`), each once, in the order of the course. Raises ValueError naming a code
    cell that is not Python."""
    found = []
    for path in _notebooks(src):
        for i, cell in enumerate(_read(path).cells):
            if cell.cell_type != "code":
                continue
            try:
                texts = code_strings(cell.source)
            except SyntaxError as e:
                raise ValueError(f"{path.stem} cell {i} is not Python: {e}") from None
            found += [t for t in texts if t not in found]
    return found


def catalog_path(notebooks: Path, lang: str) -> Path:
    return store_dir(notebooks, lang) / "notebook-strings.json"


def read_catalog(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    strings = data.get("strings", {}) if isinstance(data, dict) else {}
    return {str(k): str(v) for k, v in strings.items()}


def write_catalog(path: Path, strings: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"strings": strings}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )


def strings(lang: str, src: Path) -> list[str]:
    """The texts in the code cells of `src` with no translation in the catalog; each one the
    catalog lacks is added to it with an empty translation."""
    _check_lang(lang)
    src = Path(src)
    file = catalog_path(src.parent if src.suffix == ".ipynb" else src, lang)
    catalog = read_catalog(file)
    texts = notebook_strings(src)
    added = {t: "" for t in texts if t not in catalog}
    if added:
        write_catalog(file, {**catalog, **added})
    return [t for t in texts if not catalog.get(t, "").strip()]


def _edited(old, new) -> bool:
    """True when the notebook `old` (already in the output folder) holds cells other than the
    build `new` writes: a student may have worked in it, so it is kept, not overwritten."""

    def sources(nb):
        return [(c.cell_type, c.source) for c in nb.cells]

    return sources(old) != sources(new)


def _free_backup(target: Path) -> Path:
    """`target` + ".bak", or ".bak2", ".bak3", ... where an earlier kept copy already sits."""
    backup, n = target.with_name(target.name + ".bak"), 1
    while backup.exists():
        n += 1
        backup = target.with_name(f"{target.name}.bak{n}")
    return backup


def write_keeping_edits(nb, target: Path) -> None:
    """Write the built notebook `nb` to `target`. A notebook already there that holds other
    cells (the student worked in it) is kept first, renamed to `target.bak` (or `.bak2`, ... so
    that no kept copy is ever overwritten), and the rename is printed."""
    import nbformat

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and _edited(nbformat.read(target, as_version=4), nb):
        backup = _free_backup(target)
        target.replace(backup)
        print(f"{target} differs from the new build (your answers?): kept as {backup}")
    nbformat.write(nb, target)


def build(lang: str, src: Path, out: Path) -> list[Path]:

    _check_lang(lang)
    out = Path(out)
    if out.resolve() in (
        Path(src).resolve(),
        Path(src).resolve().parent if Path(src).is_file() else None,
    ):
        raise ValueError("out must not be the folder of the English notebooks")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in _notebooks(src):
        nb = _read(path)
        store = read_store(store_dir(path.parent, lang) / f"{path.stem}.json")
        zh = translate(nb, path.stem, store, lang)
        target = out / path.name
        write_keeping_edits(zh, target)
        written.append(target)
    return written


# The documents translated from an English one beside it (the repository's root-relative paths):
# each records the hash of the English it was made from, as a store entry's en_sha does, so an
# English edit flags the translation. The blocks a command writes in both (the chapter times)
# are left out of the hash.
TRANSLATED_DOCS = {"zh": {"README.zh.md": "README.md"}}
DOC_STAMP = re.compile(r"<!-- translated from (\S+) at en_sha ([0-9a-f]{64}) -->\n?")
_GENERATED_BLOCK = re.compile(r"<!-- (chapter times|exercises table):.*?<!-- end of \1 -->", re.S)
ROOT = Path(__file__).resolve().parents[2]


def doc_sha(text: str) -> str:
    """The hash of an English document as its translation records it (generated blocks out)."""
    return en_sha(_GENERATED_BLOCK.sub("", text))


def stale_docs(lang: str, root: Path = ROOT) -> list[str]:
    """Each translated document whose English changed since it was translated (or that records
    no hash), as "README.zh.md: ..."."""
    _check_lang(lang)
    found = []
    for doc, source in TRANSLATED_DOCS[lang].items():
        m = DOC_STAMP.search((root / doc).read_text(encoding="utf-8"))
        if m is None or m.group(1) != source:
            found.append(f"{doc}: records no hash of {source} (a line '<!-- translated from ...')")
        elif m.group(2) != doc_sha((root / source).read_text(encoding="utf-8")):
            found.append(f"{doc}: {source} changed since it was translated")
    return found


def stamp_docs(lang: str, root: Path = ROOT) -> None:
    """Record in each translated document the hash of its English as it is now (after the
    translation has been revised to follow it)."""
    _check_lang(lang)
    for doc, source in TRANSLATED_DOCS[lang].items():
        text = DOC_STAMP.sub("", (root / doc).read_text(encoding="utf-8")).rstrip("\n")
        sha = doc_sha((root / source).read_text(encoding="utf-8"))
        line = f"<!-- translated from {source} at en_sha {sha} -->"
        (root / doc).write_text(f"{text}\n\n{line}\n", encoding="utf-8")


USAGE = """usage: python -m llmlab lang (check|extract|lint|strings) LANG NOTEBOOKS
       python -m llmlab lang build LANG NOTEBOOKS OUT
       python -m llmlab lang pairs LANG [--write]
       python -m llmlab lang docs LANG [--stamp]

check    the markdown cells with no translation, or a stale one
extract  add the untranslated cells to i18n/LANG/ (empty translations)
lint     names the glossary says to avoid, in the translations and the package's strings
strings  texts the notebooks' code cells pass to the package that the catalog lacks
build    write the notebooks in LANG into OUT
pairs    the package's (English, Chinese) pairs against i18n/LANG/package-pairs.json: stale
         ones (the English edited since its Chinese was written), new, reused and gone ones;
         exit status 1 when any differs. --write records them once their Chinese is right.
docs     the translated documents (README.zh.md) whose English changed since; --stamp records
         the English as it is now, once the translation follows it."""


def _report(lines: list[str], what: str) -> int:
    """Print each finding and their count; exit status 1 when there is any."""
    for line in lines:
        print(line)
    print(f"{len(lines)} {what}")
    return 1 if lines else 0


def main(args: list[str]) -> int:
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if args[:1] == ["docs"] and len(args) in (2, 3) and args[2:] in ([], ["--stamp"]):
        try:
            if args[2:]:
                stamp_docs(args[1])
            return _report(stale_docs(args[1]), "translated documents to revise")
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if len(args) < 3 or args[0] not in ("check", "extract", "lint", "strings", "build"):
        print(USAGE, file=sys.stderr)
        return 2
    cmd, lang, src = args[0], args[1], Path(args[2])
    try:
        if cmd == "check":
            return _report(list(map(str, check(lang, src))), "cells to translate")
        if cmd == "lint":
            return _report(lint(lang, src) + lint_package(lang), "non-primary terms")
        if cmd == "strings":
            return _report(
                [f"no translation: {text[:70]!r}" for text in strings(lang, src)],
                "notebook strings to translate",
            )
        if cmd == "extract":
            print(f"{extract(lang, src)} entries added or marked for update")
            return 0
        if len(args) != 4:
            print(USAGE, file=sys.stderr)
            return 2
        for path in build(lang, src, Path(args[3])):
            print(f"wrote {path}")
        return 0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
