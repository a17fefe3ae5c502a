"""The package's (English, Chinese) pairs never go stale: every pair in the source is in the
reviewed catalog `i18n/zh/package-pairs.json` with the English its Chinese was written for. An
English edit whose Chinese was not revised is named as stale, with its module and both Englishes;
a pair the catalog lacks is named as new. Once the Chinese is right,
`python -m llmlab lang pairs zh --write` records them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmlab.__main__ import main as cli
from llmlab.course import lang, package_pairs
from llmlab.course.check.catalog import MESSAGES_DIR
from llmlab.course.lang import en_sha

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "llmlab"
FIGURE = "llmlab/course/planted.py"  # the module the planted edits are made in
MODULE = "llmlab.course.planted"
# a module with pairs of each form the reader finds (the figures keep their words in catalogs)
PLANTED = """from llmlab.i18n import tr

LEVELS = (
    ("shared memory / L1", "共享内存 / L1"),
    ("L2 cache", "L2 缓存"),
)


def title(name):
    return tr(f"{name}: memory levels", f"{name}：各级存储")
"""


@pytest.fixture(scope="module")
def found():
    return package_pairs.package_pairs(PACKAGE)


def test_the_catalog_holds_every_pair_of_the_package(found):
    path = package_pairs.catalog_path("zh", PACKAGE)
    problems = package_pairs.differences(found, package_pairs.read_pairs(path))
    assert not problems, (
        "the package's pairs differ from i18n/zh/package-pairs.json; check the Chinese of each, "
        "then run `python -m llmlab lang pairs zh --write`:\n" + "\n".join(map(str, problems))
    )
    written = json.dumps({"pairs": package_pairs.entries(found)}, ensure_ascii=False, indent=1)
    assert path.read_text(encoding="utf-8") == written + "\n", "rewrite it with --write"


def test_every_chinese_string_of_the_package_has_its_english_half():
    orphans = [str(s) for s in lang.package_strings(PACKAGE) if not s.en]
    assert not orphans, f"Chinese with no English half found by the reader: {orphans}"


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    """A package in tmp_path holding one planted module of pairs, and its catalog written."""
    package = tmp_path / "llmlab"
    target = package / FIGURE.removeprefix("llmlab/")
    target.parent.mkdir(parents=True)
    target.write_text(PLANTED, encoding="utf-8")
    assert package_pairs.check("zh", package, write=True) != []  # all new the first time
    assert package_pairs.check("zh", package) == []
    return package, target


def test_an_english_edit_is_stale_naming_the_module_and_both_englishes(tmp_path):
    package, module = _copy(tmp_path)
    source = module.read_text(encoding="utf-8")
    assert '("L2 cache", "L2 缓存")' in source
    module.write_text(source.replace('"L2 cache"', '"L2 cache, whole chip"'), encoding="utf-8")
    [stale] = package_pairs.check("zh", package)
    assert (stale.what, stale.module, stale.en, stale.was, stale.zh) == (
        "stale",
        MODULE,
        "L2 cache, whole chip",
        "L2 cache",
        "L2 缓存",
    )
    assert all(text in str(stale) for text in (MODULE, "'L2 cache, whole chip'", "'L2 cache'"))
    # reviewed and recorded: clean again, and the catalog keeps the new English's hash
    package_pairs.check("zh", package, write=True)
    assert package_pairs.check("zh", package) == []
    catalog = json.loads(package_pairs.catalog_path("zh", package).read_text(encoding="utf-8"))
    [entry] = [e for e in catalog["pairs"] if e["zh"] == "L2 缓存"]
    assert entry["en_sha"] == en_sha("L2 cache, whole chip")


def test_a_new_pair_is_new_and_a_removed_one_gone(tmp_path):
    package, module = _copy(tmp_path)
    source = module.read_text(encoding="utf-8")
    module.write_text(
        source.replace('("L2 cache", "L2 缓存"),\n', "")
        + '\nNOTE = tr("bytes per level", "每一级的字节数")\n',
        encoding="utf-8",
    )
    found = package_pairs.check("zh", package)
    assert [(d.what, d.module, d.en, d.zh) for d in found] == [
        ("new", MODULE, "bytes per level", "每一级的字节数"),
        ("gone", MODULE, "L2 cache", "L2 缓存"),
    ]
    assert str(found[0]) == f"{MODULE}: new pair 'bytes per level' -> '每一级的字节数'"


def test_the_english_hash_decides_what_is_recorded(tmp_path):
    """An entry whose English was edited in the catalog by hand, without its hash, records
    nothing: the pair reads as not recorded until --write stamps it."""
    package, module = _copy(tmp_path)
    module.write_text(
        module.read_text(encoding="utf-8").replace('"L2 cache"', '"L2 caches"'), encoding="utf-8"
    )
    path = package_pairs.catalog_path("zh", package)
    data = json.loads(path.read_text(encoding="utf-8"))
    for e in data["pairs"]:
        if e["en"] == "L2 cache":
            e["en"] = "L2 caches"  # en_sha left as it was
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    assert [d.what for d in package_pairs.check("zh", package)] == ["new"]


def test_the_same_chinese_in_another_module_is_a_new_pair_not_a_stale_one():
    recorded = {("step", "步"): {"llmlab.analysis.sim"}}
    found = {("step", "步"): {"llmlab.analysis.sim"}, ("stage", "步"): {"llmlab.other"}}
    [d] = package_pairs.differences(found, recorded)
    assert (d.what, d.module) == ("new", "llmlab.other")
    found = {("step", "步"): {"llmlab.analysis.sim", "llmlab.other"}}
    [d] = package_pairs.differences(found, recorded)
    assert (d.what, d.module) == ("reused", "llmlab.other")


def test_the_reader_pairs_named_constants_tuples_and_tables():
    source = (
        'WORD = "PASS"\n'
        'WORD_ZH: str = "通过"\n'
        'HEADERS_ZH = {"policy": "策略"}\n'
        'LEVELS = (("L2 cache", "L2 缓存"),)\n'
        "def word():\n"
        "    return tr(WORD, WORD_ZH) + tr(WORD, WORD_ZH)\n"
    )
    strings = lang.source_strings(source, "llmlab/m.py")
    assert [(s.line, s.zh, s.en) for s in strings] == [
        (2, "通过", "PASS"),  # once, though two calls name it
        (3, "策略", "policy"),
        (4, "L2 缓存", "L2 cache"),
    ]
    assert package_pairs.pairs_of(strings) == {
        ("PASS", "通过"): {"llmlab.m"},
        ("policy", "策略"): {"llmlab.m"},
        ("L2 cache", "L2 缓存"): {"llmlab.m"},
    }


def test_checker_texts_kept_in_their_catalogs_are_not_pairs(found):
    messages = {
        entry["en"]
        for path in MESSAGES_DIR.glob("*.json")
        for entry in json.loads(path.read_text(encoding="utf-8"))["messages"].values()
    }
    kept_twice = [
        (en, sorted(modules))
        for (en, _), modules in found.items()
        if en in messages and any(".check." in m or ".build." in m for m in modules)
    ]
    assert kept_twice == []


def test_the_command_reports_and_writes(tmp_path, capsys, monkeypatch):
    assert cli(["lang", "pairs", "zh"]) == 0
    assert "0 differences" in capsys.readouterr().out
    assert cli(["lang", "pairs"]) == 2
    assert cli(["lang", "pairs", "fr"]) == 1
    assert "lang must be one of" in capsys.readouterr().err
    package, module = _copy(tmp_path)
    module.write_text(
        module.read_text(encoding="utf-8").replace('"L2 cache"', '"L2"'), encoding="utf-8"
    )
    monkeypatch.setattr(package_pairs, "PACKAGE", package)
    assert cli(["lang", "pairs", "zh"]) == 1
    out = capsys.readouterr().out
    assert f"{MODULE}: stale" in out and "1 differences" in out and "--write" in out
    assert cli(["lang", "pairs", "zh", "--write"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert cli(["lang", "pairs", "zh"]) == 0
