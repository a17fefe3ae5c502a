"""Texts that notebook code cells pass to the package (the `quantity=`, `if_high=`, `if_low=`,
`explain=` of `predict.compare` / `compare_choice`, a plot's `title=`), print with `say` /
`say_table` or wrap in `notebook_text` stay English in the notebooks, whose code is the same in
both editions, and are shown in Chinese from the catalog i18n/zh/notebook-strings.json: every
one the notebooks use has a translation, an edited English text is reported as missing, and
`compare`, `say` and the plots show the translation under `set_language("zh")` and the English
under "en"."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from course_folder import write_course
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab import i18n
from llmlab.course import lang
from llmlab.course.check.predict import compare, compare_choice
from llmlab.course.glossary import zh_synonym_uses

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CJK = re.compile(r"[\u4e00-\u9fff]")
PLACEHOLDER = re.compile(r"\{[^{}]+\}")


@pytest.fixture(autouse=True)
def english_afterwards():
    yield
    i18n.set_language("en")


@pytest.fixture(scope="module")
def collected() -> list[str]:
    return lang.notebook_strings(NOTEBOOKS)


@pytest.fixture(scope="module")
def catalog() -> dict[str, str]:
    return lang.read_catalog(lang.catalog_path(NOTEBOOKS, "zh"))


def test_the_tool_and_the_package_read_the_same_catalog():
    assert lang.catalog_path(NOTEBOOKS, "zh").resolve() == i18n.notebook_strings_path("zh")
    assert i18n.notebook_strings_path("zh") == ROOT / "i18n" / "zh" / "notebook-strings.json"


def test_every_notebook_string_has_its_chinese(collected, catalog):
    # one prediction cell or more in each of chapters 03-11, each with a quantity and two hints
    assert len(collected) >= 27, collected
    assert "cache speed-up at T={lengths[-1]}" in collected  # an f-string, with its placeholder
    bad = []
    for en in collected:
        zh = catalog.get(en, "")
        if not zh.strip() or not CJK.search(zh):
            bad.append(f"no Chinese for {en!r}")
            continue
        if sorted(PLACEHOLDER.findall(zh)) != sorted(PLACEHOLDER.findall(en)):
            bad.append(f"placeholders differ: {en!r} -> {zh!r}")
        bad += [f"{u.found!r} -> write {u.primary!r} in {zh!r}" for u in zh_synonym_uses(zh)]
    assert not bad, "\n".join(bad)


def test_the_real_notebooks_lack_nothing(capsys):
    assert lang.main(["strings", "zh", str(NOTEBOOKS)]) == 0
    assert "0 notebook strings to translate" in capsys.readouterr().out


def _course(tmp_path, code: str, catalog: dict[str, str]) -> Path:
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Predict"),
            new_code_cell("my_prediction = 3"),
            new_code_cell(code),
        ]
    )
    nbs = write_course(tmp_path, "03-x.ipynb", nb)
    lang.write_catalog(lang.catalog_path(nbs, "zh"), catalog)
    return nbs


CELL = '''from llmlab.course.check import predict
%time x = 1
predict.compare(my_prediction, 2.0, quantity="step ratio", unit="x",
                if_high="you pictured {word} the weights read " "once per token.",
                if_low=LOW_HINT)
compare(my_prediction, 2.0, quantity=f"speed-up at T={lengths[-1]:d}", if_low="{0} free")
results = sim.compare(requests=trace, max_batch=4, label="not a prediction")
predict.compare_choice("memory", "memory", quantity="bound", options=("memory", "compute"),
                       explain="the weights dominate.")
'''


def test_collects_the_texts_of_prediction_calls_only():
    assert lang.code_strings(CELL) == [
        "step ratio",
        "you pictured {word} the weights read once per token.",
        "speed-up at T={lengths[-1]:d}",
        "{0} free",
        "bound",
        "the weights dominate.",
    ]


def test_an_edited_english_text_is_reported_missing(tmp_path, capsys):
    cell = CELL.replace("{word} ", "")
    old = "you pictured the weights read once per token."
    translated = {text: "中文" for text in lang.code_strings(cell)}
    assert old in translated
    nbs = _course(tmp_path, cell, translated)
    assert lang.main(["strings", "zh", str(nbs)]) == 0
    assert "0 notebook strings to translate" in capsys.readouterr().out

    nb = nbformat.read(nbs / "03-x.ipynb", as_version=4)  # the English hint is edited
    nb.cells[2].source = nb.cells[2].source.replace("once per token", "once per step")
    nbformat.write(nb, nbs / "03-x.ipynb")
    assert lang.main(["strings", "zh", str(nbs)]) == 1
    out = capsys.readouterr().out
    assert "you pictured the weights read once per step" in out and "1 notebook strings" in out
    new = "you pictured the weights read once per step."
    stored = lang.read_catalog(lang.catalog_path(nbs, "zh"))
    assert stored[new] == "" and stored[old] == "中文"  # added empty; the old one kept
    assert lang.strings("zh", nbs) == [new]  # still missing until translated


def test_compare_shows_the_catalog_chinese_under_zh_and_english_under_en(catalog, capsys):
    quantity = "decode token / prompt token at 256"
    hint = (
        "a decode step reads every weight for one token; prefill shares that read among all "
        "its tokens."
    )
    assert catalog[quantity] and catalog[hint]

    i18n.set_language("zh")
    low = compare(1.0, 50.0, quantity=quantity, unit="x", if_low=hint)
    out = capsys.readouterr().out
    assert catalog[quantity] in out and catalog[hint] in out and hint not in out
    assert low.message.endswith(catalog[hint]) and low.quantity == quantity
    compare(None, 50.0, quantity=quantity)
    assert f"[predict {catalog[quantity]}]" in capsys.readouterr().out
    compare(30.0, 50.0, quantity="cache speed-up at T=384", unit="x")  # an f-string's text
    assert "[predict T=384 时 cache 带来的加速]" in capsys.readouterr().out
    compare(30.0, 50.0, quantity="a text no notebook has")
    assert "[predict a text no notebook has]" in capsys.readouterr().out
    choice = compare_choice(
        "compute", "memory", quantity=quantity, options=("memory", "compute"), explain=hint
    )
    assert choice.message.endswith(catalog[hint]) and catalog[quantity] in capsys.readouterr().out

    i18n.set_language("en")
    low = compare(1.0, 50.0, quantity=quantity, unit="x", if_low=hint)
    out = capsys.readouterr().out
    assert f"[predict {quantity}]" in out and low.message.endswith(" " + hint)
    assert not CJK.search(out)


def test_english_never_reads_the_catalog(monkeypatch, capsys):
    monkeypatch.setattr(i18n, "_catalogs", {})

    def unreadable(lang):
        raise AssertionError("the English path read the catalog")

    monkeypatch.setattr(i18n, "notebook_strings_path", unreadable)
    i18n.set_language("en")
    assert i18n.notebook_text("one all-reduce on this machine") == "one all-reduce on this machine"
    compare(1.0, 2.0, quantity="one all-reduce on this machine", if_low="x")
    assert i18n._catalogs == {}
    capsys.readouterr()


def test_the_catalog_is_read_once(monkeypatch):
    monkeypatch.setattr(i18n, "_catalogs", {})
    reads = []
    real = i18n.notebook_strings_path
    monkeypatch.setattr(
        i18n, "notebook_strings_path", lambda lang: reads.append(lang) or real(lang)
    )
    i18n.set_language("zh")
    first = i18n.notebook_text("one all-reduce on this machine")
    assert CJK.search(first) and i18n.notebook_text("one all-reduce on this machine") == first
    assert i18n.notebook_text("") == "" and reads == ["zh"]


SHOWN = '''from llmlab import notebook_text, say, say_table
say(f"engine ready in {time.perf_counter() - t0:.1f} s (measured on this machine)")
say("results by rank:", ranks, f"({s:.1f} s, mostly starting processes)")
say("generate_with_cache:", repr(text), " slot_mapping:", 3)
say_table([[name, f"{v:.2f}"] for name, v in {**rows, "the source chapter's rule": 1.3}.items()],
          ["T", "per English word", "ms"])
say_table([["Where the figure comes from:", presets["H100-SXM"].sources["mem_bw"]]], align="l")
llmlab.say("the same, spelled out")
other.say("not llmlab's say")
table = {notebook_text(f"{hw.name} (measured, fp32)"): 1, notebook_text("never"): 2}
figures.plot_roofline(["H100-SXM"], title="Rooflines from datasheets, dense bf16")
plt.plot(xs, ys, label="not a plot of llmlab's")
'''


def test_collects_the_texts_cells_print_label_and_title():
    assert sorted(lang.code_strings(SHOWN)) == sorted(
        [
            "engine ready in {time.perf_counter() - t0:.1f} s (measured on this machine)",
            "results by rank:",
            "({s:.1f} s, mostly starting processes)",
            "the source chapter's rule",
            "per English word",
            "Where the figure comes from:",
            "the same, spelled out",
            "{hw.name} (measured, fp32)",
            "never",
            "Rooflines from datasheets, dense bf16",
        ]
    )  # not names ("generate_with_cache:"), units ("ms"), keys ("mem_bw") or others' calls


def test_every_placeholder_of_a_notebook_text_can_be_matched(collected):
    # a placeholder holding braces ({[f'{p:.1f}' for p in x]}) cannot be found in the printed
    # line: compute the value on the line before and print its name
    bad = [
        en for en in collected if "{" in PLACEHOLDER.sub("", en) or "}" in PLACEHOLDER.sub("", en)
    ]
    assert not bad, bad


def test_say_prints_the_catalog_chinese_under_zh_and_english_under_en(catalog, capsys):
    label = "results by rank:"
    line = "SmolLM2-135M loaded in {time.perf_counter() - t0:.1f} s"
    assert catalog[label] and catalog[line]
    i18n.set_language("zh")
    i18n.say(label, [3.0, 3.0], "SmolLM2-135M loaded in 2.5 s")
    shown = catalog[line].replace(PLACEHOLDER.findall(line)[0], "2.5")
    # no space after the label's full-width colon
    assert catalog[label].endswith("：")
    assert capsys.readouterr().out == f"{catalog[label]}[3.0, 3.0] {shown}\n"
    i18n.say_table([["the source chapter's rule", "1.30"]], ["", "per English word"])
    out = capsys.readouterr().out
    assert catalog["per English word"] in out and catalog["the source chapter's rule"] in out
    assert i18n.notebook_text("a text no notebook has") == "a text no notebook has"

    i18n.set_language("en")
    i18n.say(label, [3.0, 3.0], sep=" | ", end="!\n")
    assert capsys.readouterr().out == "results by rank: | [3.0, 3.0]!\n"
    i18n.say_table([["the source chapter's rule", "1.30"]], ["", "per English word"])
    assert capsys.readouterr().out.splitlines() == [
        "                           per English word",
        "the source chapter's rule              1.30",
    ]


def test_a_plot_shows_the_title_a_cell_gives_it_in_chinese(catalog):
    import matplotlib

    matplotlib.use("Agg")
    from llmlab.course.figures import ch07

    title = "Rooflines from datasheets, dense bf16"
    i18n.set_language("zh")
    ax = ch07.plot_roofline(["H100-SXM"], title=title)
    assert ax.get_title() == catalog[title]
    i18n.set_language("en")
    assert ch07.plot_roofline(["H100-SXM"], title=title).get_title() == title
