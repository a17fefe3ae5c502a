"""The course's printed texts as data: one catalog per module, both languages side by side.

A checker holds logic and keys; its hints, mistake descriptions and verdicts live in
`messages/<name>.json` beside this module. The figures and the widgets keep their words the same
way, in `llmlab/course/figures/messages/` and `llmlab/course/widgets/messages/` (the catalogs
"figures.ch07" and "widgets.kv"). Each is in the store format of the notebooks' translations
(`llmlab.course.lang`): each entry keeps the English, the sha256 of that English, and the Chinese
made from it, so an edit of the English marks the Chinese as stale.

    {"messages": {"kv_bytes.wrong_dtype": {
        "en": "that uses {got} bytes per number; the cache here is BF16.",
        "en_sha": "<sha256 of the English>",
        "zh": "这里每个数按 {got} 个字节算了；本题的 KV cache 是 BF16。"}}}

Templates take named placeholders in `str.format` syntax ({got}, {expected:.1f}, {answer!r};
literal braces doubled). A text that describes a record reads its fields itself: the call passes
the record once (`M("roofline_text.decode_step_floor", s=summary, ...)`, `case=case`) and the
template names the fields ({s.bound}, {case[budget]}); the placeholder is the name before the dot
or bracket. A checker module reads its catalog once and calls it:

    M = catalog("ch04")
    M("kv_bytes.wrong_dtype", got=4)     # the text in the language in use
    (per_layer * 2, M("kv.fp32")),       # a mistake row of check_number: one line

`M.key("...")` marks a key kept in a table (a hint per answer option) for `M(table[option])`
later; `M.figure("kv_waste")` reads a figure's axis texts by their roles ("kv_waste.xlabel",
"kv_waste.ylabel", "kv_waste.title"). The catalog test (`tests/test_check_catalogs.py`) reads the
keys of `M(...)`, `M.key(...)` and `M.figure(...)` from the source and checks them against the
catalog.

A chapter's catalog also says what the instructors' table says about each of its exercises, in
a section "exercises" beside "messages": its kind, the source chapter's self-check question it
covers, and the keys of the mistakes its checker names, whose texts are entries of "messages" like
any other (both languages, `en_sha`), so that a mistake named by several exercises is one entry:

    "exercises": {"id_bits": {"kind": "plug-in", "source_question": null, "mistakes": [
        "mistake.rounded_down", "mistake.not_a_whole_number", "mistake.bytes_for_bits"]}}

    EXERCISES = M.exercises()   # {"id_bits": ExerciseInfo("plug-in", ("rounded down", ...), None)}

A Chinese entry that is missing or stale (its `en_sha` is not the hash of the English) is never
shown: the student reads the English instead, and the catalog test fails until it is translated
again and stamped (`stamp`).
"""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llmlab.course.lang import en_sha
from llmlab.i18n import language

MESSAGES_DIR = Path(__file__).resolve().parent / "messages"
COURSE_DIR = MESSAGES_DIR.parent.parent  # llmlab/course
TRANSLATED = ("zh",)  # the languages a catalog entry carries besides English
# a figure's axis texts by role: the entries "<figure>.xlabel", ... that `Catalog.figure` reads
FIGURE_TEXTS = ("xlabel", "ylabel", "title")
KINDS = ("recall", "plug-in", "reasoning")  # the kinds of exercise the instructors' table counts


def catalog_path(name: str) -> Path:
    """The file of the catalog `name`: a checker's ("ch04") in `MESSAGES_DIR`; a folder's module's
    ("figures.ch07", "widgets.kv") in that folder's `messages/`."""
    folder, _, stem = name.rpartition(".")
    return (COURSE_DIR / folder / "messages" if folder else MESSAGES_DIR) / f"{stem}.json"


def placeholders(template: str) -> set[str]:
    """The names of the fields of a `str.format` template: "{got:.1f} of {n}" -> {"got", "n"}."""
    return {
        field.split(".")[0].split("[")[0]
        for _, field, _, _ in string.Formatter().parse(template)
        if field is not None
    }


@dataclass(frozen=True)
class ExerciseInfo:
    """What the instructors' table says about one exercise (an entry of a chapter catalog's
    "exercises", read by `Catalog.exercises`).

    kind: "recall" (a fact stated in the chapter), "plug-in" (numbers into a formula the text
    gives) or "reasoning" (a step the text does not spell out: a fresh case, a why, a design).
    mistakes: the mistakes the checker recognises and names in its hint.
    source_question: the number of the source chapter's self-check question it covers, if any.
    """

    kind: str
    mistakes: tuple[str, ...] = ()
    source_question: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")


class Catalog:
    """The texts of one catalog file, read on first use; calling it formats one of them."""

    def __init__(self, name: str, path: Path | None = None) -> None:
        self.name = name
        self.path = Path(path) if path is not None else catalog_path(name)
        self._data: dict[str, dict] | None = None
        self._sections: dict[str, dict[str, str]] | None = None  # section -> {English: key}

    @property
    def entries(self) -> dict[str, dict]:
        """key -> {"en", "en_sha", "zh"}, as the file holds them."""
        return self._file["messages"]

    @property
    def exercise_entries(self) -> dict[str, dict]:
        """exercise -> {"kind", "source_question", "mistakes": [key, ...]}, as the file holds
        them; empty for a catalog that describes no exercise."""
        return self._file.get("exercises", {})

    @property
    def _file(self) -> dict[str, dict]:
        if self._data is None:
            self._data = json.loads(self.path.read_text(encoding="utf-8"))
        return self._data

    def exercises(self) -> Exercises:
        """{exercise: its `ExerciseInfo`}, the mistakes in the language in use when read (a
        checker module's `EXERCISES`)."""
        return Exercises(self)

    def template(self, key: str, lang: str = "en") -> str:
        """The unformatted text of `key` in `lang`; the English when the translation is
        missing or stale. Raises KeyError naming the catalog for a key it does not hold."""
        try:
            entry = self.entries[key]
        except KeyError:
            raise KeyError(f"no message {key!r} in the catalog {self.path.name}") from None
        text = entry.get(lang) if lang != "en" else None
        if text and entry.get("en_sha") == en_sha(entry["en"]):
            return text
        return entry["en"]

    def text(self, key: str, lang: str, /, **values) -> str:
        """`key` in `lang`, its placeholders filled with `values`."""
        return self.template(key, lang).format(**values)

    def __call__(self, key: str, /, **values) -> str:
        """`key` in the language in use (`llmlab.i18n.language()`), filled with `values`."""
        return self.text(key, language(), **values)

    def key(self, key: str) -> str:
        """`key` itself: marks a string kept in a table as a key of this catalog."""
        return key

    def choices(self, section: str, names: tuple[str, ...]) -> Choices:
        """The options `names` of an exercise, labelled by the entries "<section>.<name>"."""
        return Choices(self, section, names)

    def texts(self, section: str, names: tuple[str, ...]) -> Texts:
        """{name: the entry "<section>.<name>" in the language in use} for each of `names`: the
        options of a multiple-choice exercise, or its hint per wrong option."""
        return self.table({name: f"{section}.{name}" for name in names})

    def figure(self, name: str, /, **values) -> dict[str, str]:
        """The axis texts of the figure `name`, the entries "<name>.xlabel", "<name>.ylabel" and
        "<name>.title" in the language in use, each filled with the `values` it names, keyed as
        the figures' `label` and `finish` take them: `finish(ax, **M.figure("kv_waste"))`."""
        return {role: self(f"{name}.{role}", **values) for role in FIGURE_TEXTS}

    def table(self, keys: Mapping[str, str]) -> Texts:
        """`keys` ({answer: key of this catalog}) read as {answer: text in the language in use}:
        an exercise's hint per wrong answer, held as keys by its checker. A table read already
        (a `Texts`, as `texts` makes) is handed back as it is."""
        return keys if isinstance(keys, Texts) else Texts(self, keys)

    def by_english(self, text: str, section: str) -> str:
        """The entry of `section` (the keys "<section>.…") whose English is `text`, in the
        language in use; `text` itself where the section has none. For texts that arrive in
        English from elsewhere: a table's headers written in notebook code, a workload's name."""
        if self._sections is None:
            self._sections = {}
            for key, entry in self.entries.items():
                self._sections.setdefault(key.split(".")[0], {})[entry["en"]] = key
        key = self._sections.get(section, {}).get(text)
        return text if key is None else self(key)

    def problems(self) -> list[str]:
        """What a translator has to do: entries whose translation is missing or stale, or whose
        placeholders differ from the English's; and what is wrong in the exercises' section: a
        kind that is not one of `KINDS`, a mistake with no entry."""
        out = self._exercise_problems()
        for key, entry in self.entries.items():
            en = entry.get("en", "")
            for lang in TRANSLATED:
                text = entry.get(lang)
                if not text:
                    out.append(f"{self.name}: {key!r} has no {lang} text")
                elif entry.get("en_sha") != en_sha(en):
                    out.append(f"{self.name}: {key!r}: the English changed since the {lang} text")
                elif placeholders(text) != placeholders(en):
                    out.append(
                        f"{self.name}: {key!r}: placeholders {sorted(placeholders(text))} in {lang}"
                        f", {sorted(placeholders(en))} in English"
                    )
        return out

    def _exercise_problems(self) -> list[str]:
        out = []
        for name, entry in self.exercise_entries.items():
            if entry.get("kind") not in KINDS:
                out.append(
                    f"{self.name}: exercise {name!r}: kind {entry.get('kind')!r}, not one of {KINDS}"
                )
            question = entry.get("source_question")
            if question is not None and not (isinstance(question, int) and question > 0):
                out.append(f"{self.name}: exercise {name!r}: source_question {question!r}")
            out += [
                f"{self.name}: exercise {name!r}: the mistake {key!r} has no entry"
                for key in entry.get("mistakes", ())
                if key not in self.entries
            ]
        return out

    def __repr__(self) -> str:
        return f"Catalog({self.name!r})"


class Exercises(Mapping):
    """A catalog's "exercises" read as {exercise: `ExerciseInfo`}; each is made when looked up,
    so its mistakes are in the language in use then (a language chosen after the import shows)."""

    def __init__(self, texts: Catalog) -> None:
        self._catalog = texts

    def __getitem__(self, name: str) -> ExerciseInfo:
        entry = self._catalog.exercise_entries[name]
        mistakes = tuple(self._catalog(key) for key in entry["mistakes"])
        return ExerciseInfo(entry["kind"], mistakes, entry["source_question"])

    def __iter__(self):
        return iter(self._catalog.exercise_entries)

    def __len__(self) -> int:
        return len(self._catalog.exercise_entries)


class Choices(tuple):
    """The code names of an exercise's options (what the student types), as a tuple; printed, each
    name stands beside its label in the language in use, the catalog's entry "<section>.<name>":

        LOOP_STEPS = M.choices("loop_step", ("tokenize", "embed"))
        print(LOOP_STEPS)      # 'tokenize'  分词
                               # 'embed'     词嵌入
    """

    def __new__(cls, texts: Catalog, section: str, names: tuple[str, ...]) -> Choices:
        choices = super().__new__(cls, names)
        choices._texts, choices._section = texts, section
        return choices

    def label(self, name: str) -> str:
        """The label of the option `name`, in the language in use."""
        return self._texts(f"{self._section}.{name}")

    def __reduce__(self):  # copied or pickled, the names alone: a plain tuple
        return (tuple, (tuple(self),))

    def __repr__(self) -> str:
        shown = [repr(name) for name in self]
        wide = max(map(len, shown), default=0)
        return "\n".join(
            f"{code.ljust(wide)}  {self.label(name)}" for code, name in zip(shown, self)
        )


class Texts(Mapping):
    """A table {answer key: catalog key} read as {answer key: text in the language in use}: the
    options of a multiple-choice exercise, printed by the notebook, held as keys by its checker."""

    def __init__(self, texts: Catalog, keys: dict[str, str]) -> None:
        self._catalog, self._keys = texts, dict(keys)

    def __getitem__(self, key: str) -> str:
        return self._catalog(self._keys[key])

    def key(self, answer: str) -> str:
        """The catalog key of the entry shown for `answer` (its text in another language:
        `catalog.template(texts.key(answer), "zh")`)."""
        return self._keys[answer]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:  # shown in a notebook: the texts, as a dict
        return repr(dict(self.items()))


@functools.lru_cache(maxsize=None)
def catalog(name: str) -> Catalog:
    """The catalog `name` ("ch04", "core", "predict", "figures.ch07"; see `catalog_path`), one
    object per name."""
    return Catalog(name)


def stamp(path: Path, key: str) -> None:
    """Mark the translation of `key` in the catalog file `path` as made from its current English
    (after the Chinese has been revised to follow an English edit)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    entry = data["messages"][key]
    entry["en_sha"] = en_sha(entry["en"])
    write_catalog(path, data["messages"], data.get("exercises"))


def write_catalog(
    path: Path, messages: dict[str, dict], exercises: dict[str, dict] | None = None
) -> None:
    """Write a catalog file as the translation store is written (UTF-8, one-space indent): its
    messages, and the section "exercises" after them where the catalog has one."""
    data = (
        {"messages": messages}
        if exercises is None
        else {"messages": messages, "exercises": exercises}
    )
    Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
