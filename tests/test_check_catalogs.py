"""The course's catalogs (the checkers' `llmlab/course/check/messages/*.json`, the figures' and
the widgets' `llmlab/course/{figures,widgets}/messages/*.json`) and the code that uses them
agree: every key a module uses (read from its source: the literal first argument of `M(...)`,
`M.key(...)`, `M.template(...)`, `M.text(...)` where `M = catalog("...")`, every key of the
section `M.by_english(text, "section")` looks in, the key "section.name" of each option of
`M.choices("section", (...names))` or `M.texts(...)` (the names written in the call, or a table of
the module's top, `tuple(TABLE)`: a dict's keys), and a figure's three texts "name.xlabel",
"name.ylabel", "name.title" of `M.figure("name")`) is in its catalog, every catalog key is used,
the keywords of a call fill exactly the template's placeholders, and every entry has a Chinese
text made from its current English (`en_sha`) with the same placeholders. Planted mistakes (a
stale hash, a missing key, an unused key, a wrong keyword, an English text in the zh) are caught,
and a stale Chinese text falls back to English at run time. The checkers, the build exercises'
drivers (`llmlab/course/build`), the figures and the widgets hold no prose of their own: what
`tr(...)` is left is counted."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from checker_modules import chapter_exercises, checker_modules

from llmlab import i18n
from llmlab.course.check.catalog import (
    COURSE_DIR,
    FIGURE_TEXTS,
    MESSAGES_DIR,
    Catalog,
    ExerciseInfo,
    catalog,
    catalog_path,
    placeholders,
    stamp,
    write_catalog,
)
from llmlab.course.lang import en_sha

CHECK_DIR = Path(__file__).resolve().parent.parent / "llmlab" / "course" / "check"
BUILD_DIR = CHECK_DIR.parent / "build"
LOOKUPS = {"__call__", "key", "template", "text", "by_english", "choices", "texts", "figure"}
# the folders whose modules keep their words in catalogs of their own ("figures.ch07")
TEXT_FOLDERS = ("figures", "widgets")
CJK = re.compile(r"[\u4e00-\u9fff]")
# Chinese writing: a Chinese character, or Chinese punctuation where a template holds only
# placeholders and the way the two languages join them ("{what}：{why}。", "{where}——{what}")
CHINESE = re.compile(r"[\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]|——")


def _reads_as_chinese(zh: str) -> bool:
    """True for Chinese writing, or for a label made only of the names Chinese text keeps in
    English ("KV cache", "decode step", "batch {b}": the glossary's kept terms)."""
    from english_prose import kept_names

    if CHINESE.search(zh):
        return True
    rest = kept_names().sub(" ", re.sub(r"\{[^{}]*\}", " ", zh))
    return re.search(r"[A-Za-z]{2,}", rest) is None


@dataclass(frozen=True)
class Use:
    where: str  # "ch04.py:52"
    catalog: str  # "ch04"
    key: str | None  # None: not a literal (a key taken from a table of M.key(...))
    keywords: frozenset[str] | None  # the placeholders a call fills; None: not a formatting call
    optional: bool = False  # read by a question decorator where the catalog holds it unfilled
    fills: tuple[str, ...] = ()  # the other keys `keywords` fill with `key`'s (a figure's texts)


# The texts `llmlab.course.check.question`'s decorators read by the question's name, where the
# catalog holds them, and chapter 02's `piece` and `selection` read by the name (all, always):
# {decorator: the suffixes of "<name>.<suffix>"}.
IMPLICIT_KEYS = {
    "numeric": ("default_hint", "formula"),
    "matching": ("success",),
    "piece": ("default_hint", "formula", "success"),
    "selection": ("missing", "success"),
}
REQUIRED_IMPLICIT = {"piece", "selection"}  # the decorators whose texts the catalog must hold


def uses(source: str, name: str) -> list[Use]:
    """Every use of a catalog in the module `name`'s source: the names bound at module level to
    `catalog("...")`, and each call of them or of their lookup methods."""
    tree = ast.parse(source)
    bound = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "catalog"
        ):
            (arg,) = node.value.args
            for target in node.targets:
                bound[target.id] = arg.value
    tables = {  # the tuples and dicts written at the top of the module, by name
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, (ast.Tuple, ast.List, ast.Dict))
    }
    found = implicit_uses(tree, name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in bound:
            owner, method = f.id, "__call__"
        elif isinstance(f, ast.Attribute) and getattr(f.value, "id", None) in bound:
            owner, method = f.value.id, f.attr
        else:
            continue
        if method not in LOOKUPS:
            continue
        if (
            method in ("choices", "texts")
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
        ):
            names = _literal_names(node.args[1], tables)
            if names is not None:  # a key per option
                found += [
                    Use(
                        f"{name}.py:{node.lineno}",
                        bound[owner],
                        f"{node.args[0].value}.{n.value}",
                        None,
                    )
                    for n in names
                    if isinstance(n, ast.Constant)
                ]
                continue
        if method in ("by_english", "choices", "texts"):  # every key of the section it names
            section = node.args[1] if len(node.args) > 1 else None
            prefix = section.value if isinstance(section, ast.Constant) else "<not a literal>"
            found.append(Use(f"{name}.py:{node.lineno}", bound[owner], f"{prefix}.*", None))
            continue
        if method == "figure":
            found += figure_uses(node, f"{name}.py:{node.lineno}", bound[owner])
            continue
        first = node.args[0] if node.args else None
        key = first.value if isinstance(first, ast.Constant) else None
        if first is None or not (key is not None or isinstance(first, (ast.Name, ast.Subscript))):
            key = "<a key built at run time: keep keys literal, tables of keys use M.key>"
        keywords = None
        if method in ("__call__", "text") and not any(k.arg is None for k in node.keywords):
            keywords = frozenset(k.arg for k in node.keywords)
        found.append(Use(f"{name}.py:{node.lineno}", bound[owner], key, keywords))
    return found


def _literal_names(node: ast.AST, tables: dict[str, ast.AST]) -> list[ast.AST] | None:
    """The option names `M.choices` / `M.texts` is given, where they are written: a tuple in the
    call, or a table of the module by name, `TABLE` or `tuple(TABLE)` (a dict: its keys)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tuple" and node.args:
        node = node.args[0]
    if isinstance(node, ast.Name):
        node = tables.get(node.id, node)
    if isinstance(node, ast.Dict):
        return node.keys
    return node.elts if isinstance(node, (ast.Tuple, ast.List)) else None


def figure_uses(node: ast.Call, where: str, catalog_name: str) -> list[Use]:
    """The texts `M.figure("name", **values)` reads: "name.xlabel", "name.ylabel", "name.title",
    the call's keywords filling the placeholders of the three together."""
    first = node.args[0] if node.args else None
    if not isinstance(first, ast.Constant):
        return [Use(where, catalog_name, "<a figure named at run time: keep it literal>", None)]
    keys = [f"{first.value}.{role}" for role in FIGURE_TEXTS]
    keywords = None
    if not any(k.arg is None for k in node.keywords):
        keywords = frozenset(k.arg for k in node.keywords)
    return [Use(where, catalog_name, keys[0], keywords, fills=tuple(keys[1:]))] + [
        Use(where, catalog_name, key, None) for key in keys[1:]
    ]


def implicit_uses(tree: ast.Module, name: str) -> list[Use]:
    """The keys a question decorator (or chapter 02's `piece`, `selection`) reads by the
    decorated function's name, in the catalog of the module's chapter ("ch09/questions" ->
    "ch09"); filled with no values."""
    chapter = re.match(r"ch\d\d", name)
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or chapter is None:
            continue
        for deco in node.decorator_list:
            kind = getattr(getattr(deco, "func", None), "id", None)
            found += [
                Use(
                    f"{name}.py:{node.lineno}",
                    chapter[0],
                    f"{node.name}.{s}",
                    frozenset(),
                    kind not in REQUIRED_IMPLICIT,
                )
                for s in IMPLICIT_KEYS.get(kind, ())
            ]
    return found


def findings(sources: dict[str, str], catalogs: dict[str, Catalog]) -> list[str]:
    """What is wrong between checker `sources` ({module name: source}) and `catalogs`."""
    out = []
    used: dict[str, set[str]] = {name: set() for name in catalogs}
    for module, source in sources.items():
        for use in uses(source, module):
            cat = catalogs.get(use.catalog)
            if cat is None:
                out.append(f"{use.where}: no catalog {use.catalog!r}")
                continue
            if use.key is None:
                continue
            if use.key.endswith(".*"):  # a section, looked up by its English
                section = {k for k in cat.entries if k.startswith(use.key[:-1])}
                if not section:
                    out.append(f"{use.where}: no section {use.key[:-2]!r} in {cat.path.name}")
                used[use.catalog] |= section
                continue
            if use.optional and (
                use.key not in cat.entries or placeholders(cat.entries[use.key]["en"])
            ):
                continue  # not there, or to be filled: the question gives it itself
            used[use.catalog].add(use.key)
            if use.key not in cat.entries:
                out.append(f"{use.where}: {use.key!r} is not in {cat.path.name}")
            elif use.keywords is not None:
                filled = [k for k in (use.key, *use.fills) if k in cat.entries]
                want = set().union(*(placeholders(cat.entries[k]["en"]) for k in filled))
                if use.keywords != want:
                    what = ", ".join(map(repr, (use.key, *use.fills)))
                    given, texts = (
                        ("are", "their texts have") if use.fills else ("is", "its text has")
                    )
                    out.append(
                        f"{use.where}: {what} {given} given {sorted(use.keywords)}, {texts} "
                        f"{sorted(want)}"
                    )
    for name, cat in catalogs.items():
        used[name] |= {key for e in cat.exercise_entries.values() for key in e["mistakes"]}
        out += [
            f"{cat.path.name}: {key!r} is used nowhere" for key in cat.entries.keys() - used[name]
        ]
        out += cat.problems()
        for key, entry in cat.entries.items():
            zh = entry.get("zh")
            if CJK.search(entry["en"]) or (zh and not _reads_as_chinese(zh)):
                out.append(f"{cat.path.name}: {key!r}: Chinese in the English, or none in the zh")
    return out


def checker_sources() -> dict[str, str]:
    """{module name: source} of the checkers ("ch04"), the build exercises ("build/ch07"), the
    figures and the widgets ("figures/ch07")."""
    found = {  # a chapter's package by its modules: "ch11/questions"
        p.relative_to(CHECK_DIR).with_suffix("").as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(CHECK_DIR.rglob("*.py"))
    }
    for folder in ("build", *TEXT_FOLDERS):
        found |= {
            f"{folder}/{p.stem}": p.read_text(encoding="utf-8")
            for p in sorted((COURSE_DIR / folder).glob("*.py"))
        }
    return found


def catalog_files() -> list[Path]:
    """Every catalog file the course ships."""
    return sorted(MESSAGES_DIR.glob("*.json")) + [
        p
        for folder in TEXT_FOLDERS
        for p in sorted((COURSE_DIR / folder / "messages").glob("*.json"))
    ]


def shipped_catalogs() -> dict[str, Catalog]:
    names = [
        p.stem if p.parent == MESSAGES_DIR else f"{p.parent.parent.name}.{p.stem}"
        for p in catalog_files()
    ]
    return {name: Catalog(name) for name in names}


def test_checkers_and_their_catalogs_agree():
    sources, catalogs = checker_sources(), shipped_catalogs()
    assert {"core", "predict", "ch04", "ch09", "ch12", "figures.ch07", "widgets.kv"} <= set(
        catalogs
    )
    assert {"ch09/questions", "build/ch07", "build/ch11_pool", "figures/ch07", "widgets/kv"} <= set(
        sources
    )
    problems = findings(sources, catalogs)
    assert not problems, "\n".join(problems)
    users = {use.catalog for name, src in sources.items() for use in uses(src, name)}
    assert set(catalogs) <= users, f"catalogs no module uses: {sorted(set(catalogs) - users)}"


# the tr() calls a module keeps; every other checker and build module has none. core: the verdict
# words and the punctuation between texts (`sentences`, `labelled`, `clauses`, `listed`).
TR_LEFT = {"core": 6}


@pytest.mark.parametrize("name", sorted(checker_sources()))
def test_checkers_and_drivers_hold_keys_not_prose(name):
    calls = [
        ast.unparse(n)[:60]
        for n in ast.walk(ast.parse(checker_sources()[name]))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "tr"
    ]
    assert len(calls) == TR_LEFT.get(name, 0), calls  # one fewer: lower its TR_LEFT entry


def test_catalog_files_are_written_as_the_store_writes_them():
    for path in catalog_files():
        data = json.loads(path.read_text(encoding="utf-8"))
        chapter = re.fullmatch(r"ch\d\d", path.stem) and path.parent == MESSAGES_DIR
        assert list(data) == (["messages", "exercises"] if chapter else ["messages"]), path.name
        for key, entry in data["messages"].items():
            assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*", key), (path.name, key)
            assert list(entry) == ["en", "en_sha", "zh"], (path.name, key)
        for name, entry in data.get("exercises", {}).items():
            assert list(entry) == ["kind", "source_question", "mistakes"], (path.name, name)
        text = path.read_text(encoding="utf-8")
        write_catalog(path.with_suffix(".tmp"), data["messages"], data.get("exercises"))
        try:
            assert path.with_suffix(".tmp").read_text(encoding="utf-8") == text, path.name
        finally:
            path.with_suffix(".tmp").unlink()


# ---------------------------------------------------------------------------- planted mistakes

PLANTED = '''
from llmlab.course.check.catalog import catalog

M = catalog("planted")
TABLE = {"a": M.key("table.a")}


def check(answer, got):
    if answer is None:
        return M("kv.missing_key")
    if answer == 1:
        return M("kv.wrong_dtype", gotten=got)
    return M("kv.wrong_dtype", got=got) + M(TABLE["a"])
'''


def _catalog_of(tmp_path: Path, texts: dict[str, tuple[str, str]], **zh_sha) -> Catalog:
    """The catalog "planted" of `texts` {key: (English, Chinese)}, each Chinese made from its
    English unless `zh_sha` gives the key ("kv.x" as kv_x) the hash of another English."""
    messages = {
        key: {"en": en, "en_sha": zh_sha.get(key.replace(".", "_"), en_sha(en)), "zh": zh}
        for key, (en, zh) in texts.items()
    }
    path = tmp_path / "planted.json"
    write_catalog(path, messages)
    return Catalog("planted", path)


def _planted_catalog(tmp_path: Path, **zh_sha) -> Catalog:
    entries = {
        "kv.wrong_dtype": ("that uses {got} bytes per number.", "这里每个数按 {got} 个字节算了。"),
        "table.a": ("a hint.", "一个提示。"),
        "kv.unused": ("nobody shows this.", "没有人显示这句。"),
    }
    return _catalog_of(tmp_path, entries, **zh_sha)


def test_planted_mistakes_are_caught(tmp_path):
    cat = _planted_catalog(tmp_path, kv_wrong_dtype=en_sha("an older English text."))
    problems = findings({"planted": PLANTED}, {"planted": cat})
    text = "\n".join(problems)
    assert "'kv.missing_key' is not in planted.json" in text  # a key the catalog lacks
    assert "'kv.wrong_dtype' is given ['gotten'], its text has ['got']" in text  # a wrong keyword
    assert "'kv.unused' is used nowhere" in text  # a key no checker uses
    assert "'kv.wrong_dtype': the English changed since the zh text" in text  # a stale hash
    assert len(problems) == 4, text  # the table's key and the right call are fine


def test_planted_placeholder_mismatch_and_missing_translation_are_caught(tmp_path):
    texts = {"a": ("{got} bytes.", "{n} 个字节。"), "b": ("no Chinese yet.", "")}
    problems = _catalog_of(tmp_path, texts).problems()
    assert any("'a': placeholders ['n'] in zh" in p for p in problems), problems
    assert any("'b' has no zh text" in p for p in problems), problems


def test_an_untranslated_zh_is_caught_and_a_template_of_punctuation_is_not(tmp_path):
    texts = {
        "joined": ("{what}: {why}.", "{what}：{why}。"),
        "dashed": ("{where} — {what}", "{where}——{what}"),
        "untranslated": ("a hint.", "a hint."),
        "kept": ("decode step {n}", "decode step {n}"),  # terms Chinese keeps in English
    }
    cat = _catalog_of(tmp_path, texts)
    source = (
        'from x import catalog\nM = catalog("planted")\ndef f():\n'
        '    return M("joined", what=1, why=2) + M("dashed", where=1, what=2) + M("untranslated")'
        ' + M("kept", n=1)\n'
    )
    problems = findings({"planted": source}, {"planted": cat})
    assert problems == ["planted.json: 'untranslated': Chinese in the English, or none in the zh"]


def test_a_dynamic_key_is_reported():
    source = 'from x import catalog\nM = catalog("planted")\ndef f(k):\n    return M(f"kv.{k}")\n'
    (use,) = uses(source, "planted")
    assert use.key.startswith("<a key built at run time")


def test_a_stale_translation_falls_back_to_english_until_stamped(tmp_path):
    cat = _planted_catalog(tmp_path, kv_wrong_dtype=en_sha("an older English text."))
    with i18n.speaking("zh"):
        assert cat("kv.wrong_dtype", got=4) == "that uses 4 bytes per number."
        assert cat("table.a") == "一个提示。"
        stamp(cat.path, "kv.wrong_dtype")
        fresh = Catalog("planted", cat.path)
        assert fresh("kv.wrong_dtype", got=4) == "这里每个数按 4 个字节算了。"
        assert fresh.problems() == []
    assert fresh("kv.wrong_dtype", got=4) == "that uses 4 bytes per number."


def test_an_unknown_key_names_the_catalog(tmp_path):
    cat = _planted_catalog(tmp_path)
    with pytest.raises(KeyError, match="no message 'kv.nope' in the catalog planted.json"):
        cat("kv.nope")


def test_the_catalogs_are_package_data():
    """A built wheel carries the catalogs: pyproject's package-data names them."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    pyproject = tomllib.loads((CHECK_DIR.parents[2] / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]
    for package in ("llmlab.course.check", *(f"llmlab.course.{f}" for f in TEXT_FOLDERS)):
        assert "messages/*.json" in data.get(package, []), (package, data)


def test_a_folder_s_catalog_sits_beside_its_modules():
    assert catalog_path("ch04") == MESSAGES_DIR / "ch04.json"
    assert catalog_path("figures.ch07") == COURSE_DIR / "figures" / "messages" / "ch07.json"


def test_choices_are_a_tuple_of_names_printed_with_their_labels(tmp_path):
    import copy

    texts = {"step.tokenize": ("split the text", "分词"), "step.lm_head": ("logits", "输出层")}
    cat = _catalog_of(tmp_path, texts)
    steps = cat.choices("step", ("tokenize", "lm_head"))
    assert steps == ("tokenize", "lm_head") and steps.index("lm_head") == 1 and "tokenize" in steps
    assert copy.deepcopy(steps) == ("tokenize", "lm_head")
    with i18n.speaking("zh"):
        assert repr(steps) == "'tokenize'  分词\n'lm_head'   输出层"
    assert str(steps).splitlines()[0] == "'tokenize'  split the text"
    source = 'M = catalog("planted")\nS = M.choices("step", ("tokenize", "embed"))\n'
    problems = findings({"planted": source}, {"planted": cat})
    assert problems == [
        "planted.py:2: 'step.embed' is not in planted.json",
        "planted.json: 'step.lm_head' is used nowhere",
    ]


def test_a_section_is_looked_up_by_its_english(tmp_path):
    texts = {"header.policy": ("policy", "策略"), "title.policy": ("policy", "政策")}
    cat = _catalog_of(tmp_path, texts)
    with i18n.speaking("zh"):
        assert cat.by_english("policy", "header") == "策略"
        assert cat.by_english("steps", "header") == "steps"  # not in the section: as it is
    assert cat.by_english("policy", "header") == "policy"
    source = 'M = catalog("planted")\ndef f(h):\n    return M.by_english(h, "header")\n'
    problems = findings({"planted": source}, {"planted": cat})
    assert problems == ["planted.json: 'title.policy' is used nowhere"]


def test_a_figure_s_texts_are_read_by_their_roles(tmp_path):
    texts = {
        "steps.xlabel": ("batch size", "批大小"),
        "steps.ylabel": ("ms per step", "每步毫秒数"),
        "steps.title": ("{n} runs on {machine}", "在 {machine} 上跑 {n} 次"),
        "bare.xlabel": ("tokens", "token 数"),
    }
    cat = _catalog_of(tmp_path, texts)
    labels = {"xlabel": "batch size", "ylabel": "ms per step", "title": "3 runs on a CPU"}
    assert cat.figure("steps", n=3, machine="a CPU") == labels
    with i18n.speaking("zh"):
        assert cat.figure("steps", n=3, machine="CPU")["title"] == "在 CPU 上跑 3 次"
    source = (
        'M = catalog("planted")\ndef f():\n    return M.figure("steps", n=1, machine="x")\n'
        'def g():\n    return M.figure("steps", n=1), M.figure("bare")\n'
    )
    problems = findings({"planted": source}, {"planted": cat})
    assert problems == [
        "planted.py:5: 'steps.xlabel', 'steps.ylabel', 'steps.title' are given ['n'], their"
        " texts have ['machine', 'n']",
        "planted.py:5: 'bare.ylabel' is not in planted.json",
        "planted.py:5: 'bare.title' is not in planted.json",
    ]


def test_texts_are_a_table_of_a_section_s_entries_in_the_language_in_use(tmp_path):
    texts = {
        "options.a": ("the batch", "批大小"),
        "options.b": ("the context", "上下文"),
        "options.c": ("nothing read", "没人读"),
    }
    cat = _catalog_of(tmp_path, texts)
    options = cat.texts("options", ("a", "b"))
    assert list(options) == ["a", "b"] and len(options) == 2 and "c" not in options
    assert dict(options) == {"a": "the batch", "b": "the context"}
    with i18n.speaking("zh"):
        assert options["b"] == "上下文"
    source = 'M = catalog("planted")\nO = M.texts("options", ("a", "b", "d"))\n'
    problems = findings({"planted": source}, {"planted": cat})
    assert problems == [
        "planted.py:2: 'options.d' is not in planted.json",
        "planted.json: 'options.c' is used nowhere",
    ]


# ---------------------------------------------------------------------------- the exercises' table

CHAPTERS = sorted(p.stem for p in MESSAGES_DIR.glob("ch[0-9][0-9].json"))
# checkers no notebook calls, so the instructors' table leaves them out: chapter 00's three grader
# fixtures (a number, a letter, a module)
NOT_EXERCISES = {
    "ch00.num_chapters",
    "ch00.module_for_paged_attention",
    "ch00.fast_mode",
}


def chapter_checkers(chapter: str) -> set[str]:
    """The public functions of `chapter`'s checker modules that return a verdict."""
    return {
        name
        for module in checker_modules(chapter)
        for name, fn in vars(module).items()
        if callable(fn)
        and not name.startswith("_")
        and getattr(fn, "__module__", "") == module.__name__
        and getattr(fn, "__annotations__", {}).get("return") == "CheckResult"
    }


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_checker_of_a_chapter_is_an_exercise_of_its_catalog(chapter):
    described = catalog(chapter).exercise_entries
    checkers = {n for n in chapter_checkers(chapter) if f"{chapter}.{n}" not in NOT_EXERCISES}
    assert checkers == set(described), (
        f"checkers with no entry in {chapter}.json's exercises: {sorted(checkers - set(described))}"
        f"; entries with no checker: {sorted(set(described) - checkers)}"
    )
    listed = dict(chapter_exercises(chapter))  # what the grader and the chapter tests walk
    assert [ex.split(".")[1] for ex in listed] == list(described)
    assert all(fn.__name__ == ex.split(".")[1] for ex, fn in listed.items())


def test_exercise_entries_with_a_bad_kind_or_an_untranslated_mistake_are_caught(tmp_path):
    cat = _catalog_of(tmp_path, {"mistake.rounded_down": ("rounded down", "")})
    data = json.loads(cat.path.read_text(encoding="utf-8"))
    exercises = {
        "id_bits": {"kind": "guess", "source_question": 0, "mistakes": ["mistake.rounded_down"]},
        "kv_bytes": {"kind": "plug-in", "source_question": 2, "mistakes": ["mistake.k_only"]},
    }
    write_catalog(cat.path, data["messages"], exercises)
    problems = Catalog("planted", cat.path).problems()
    assert sorted(problems) == [
        "planted: 'mistake.rounded_down' has no zh text",
        "planted: exercise 'id_bits': kind 'guess', not one of ('recall', 'plug-in', 'reasoning')",
        "planted: exercise 'id_bits': source_question 0",
        "planted: exercise 'kv_bytes': the mistake 'mistake.k_only' has no entry",
    ]


def test_exercises_show_their_mistakes_in_the_language_in_use_when_read(tmp_path):
    texts = {"mistake.rounded_down": ("rounded down", "向下取整了"), "m.k": ("K only", "只算了 K")}
    cat = _catalog_of(tmp_path, texts)
    data = json.loads(cat.path.read_text(encoding="utf-8"))
    exercises = {
        "id_bits": {"kind": "plug-in", "source_question": None, "mistakes": list(texts)},
        "why": {"kind": "reasoned", "source_question": 3, "mistakes": []},
    }
    write_catalog(cat.path, data["messages"], exercises)
    table = Catalog("planted", cat.path).exercises()  # read once, as a module does on import
    with i18n.speaking("en"):
        assert table["id_bits"] == ExerciseInfo("plug-in", ("rounded down", "K only"), None)
    with i18n.speaking("zh"):
        assert table["id_bits"].mistakes == ("向下取整了", "只算了 K")
    assert list(table) == ["id_bits", "why"]
    with pytest.raises(ValueError, match="kind must be one of .*, got 'reasoned'"):
        table["why"]
    stamp(cat.path, "m.k")  # a translator's stamp keeps the section
    assert Catalog("planted", cat.path).exercise_entries == exercises
