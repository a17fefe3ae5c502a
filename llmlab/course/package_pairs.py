"""The package's (English, Chinese) pairs as a reviewed catalog, so that an English edit never
ships its old Chinese silently.

Outside the checkers' catalogs the package speaks Chinese through pairs written in its source:
`tr(en, zh)` calls, ("English", "中文") tuples and {"English": "中文"} lookup tables, which
`llmlab.course.lang.package_strings` reads without importing anything. The
catalog `i18n/<lang>/package-pairs.json` records each distinct pair once, with the sha256 of its
English (`lang.en_sha`, as the notebooks' stores keep it) and the modules that hold it, sorted by
the English:

    {"pairs": [{"en": "L2 cache", "en_sha": "<sha256 of the English>", "zh": "L2 缓存",
                "modules": ["llmlab.course.figures.ch06"]}, ...]}

Compared with the source, a pair of module m is

- stale: not recorded, but its Chinese is, for another English in m: the English was edited and
  the Chinese was not;
- new: not recorded at all;
- reused: recorded, and now in m too; gone: recorded in m, no longer there.

    python -m llmlab lang pairs zh           # what differs from the catalog; exit status 1 if any
    python -m llmlab lang pairs zh --write   # record the pairs, once their Chinese is right

`--write` is the reviewer's signal: it stamps the Chinese of every pair as made from its English.
An entry whose `en_sha` is not its English's (the English edited in the catalog by hand) counts
as not recorded. The checkers' hints and verdicts are in `llmlab/course/check/messages/*.json`,
by key, under the same rule; only the pairs written in code are here (of the checkers, the
verdict words of `check/core.py`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llmlab.course.lang import LANGS, PackageString, en_sha, package_strings

CATALOG = "package-pairs.json"
PACKAGE = Path(__file__).resolve().parents[1]  # llmlab itself, what the command reads

Pairs = dict[tuple[str, str], set[str]]  # (English, Chinese) -> the modules holding the pair


def module_name(path: str) -> str:
    """ "llmlab/course/figures/ch06.py" -> "llmlab.course.figures.ch06" (a package's
    `__init__.py` is the package)."""
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def pairs_of(strings: Iterable[PackageString]) -> Pairs:
    """The distinct pairs of `strings` and where each is; a Chinese string without its English
    half is no pair (`tests/test_package_pairs.py` holds the reader to finding every half)."""
    found: Pairs = {}
    for s in strings:
        if s.en:
            found.setdefault((s.en, s.zh), set()).add(module_name(s.path))
    return found


def package_pairs(package: Path | None = None) -> Pairs:
    """The pairs of the package `package` (by default llmlab itself)."""
    return pairs_of(package_strings(package if package is not None else PACKAGE))


def catalog_path(lang: str, package: Path | None = None) -> Path:
    """`i18n/<lang>/package-pairs.json` beside the package folder."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    package = Path(package) if package is not None else PACKAGE
    return package.resolve().parent / "i18n" / lang / CATALOG


def entries(pairs: Pairs) -> list[dict]:
    """The catalog's entries for `pairs`: sorted by English, then Chinese; modules sorted."""
    return [
        {"en": en, "en_sha": en_sha(en), "zh": zh, "modules": sorted(pairs[en, zh])}
        for en, zh in sorted(pairs)
    ]


def write_pairs(path: Path, pairs: Pairs) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"pairs": entries(pairs)}, ensure_ascii=False, indent=1)
    path.write_text(text + "\n", encoding="utf-8")


def read_pairs(path: Path) -> Pairs:
    """The pairs the catalog `path` records (none when it is not there); an entry whose `en_sha`
    is not the hash of its English is left out, so its pair reads as not recorded."""
    path = Path(path)
    if not path.exists():
        return {}
    recorded: Pairs = {}
    for e in json.loads(path.read_text(encoding="utf-8")).get("pairs", []):
        if e.get("en_sha") == en_sha(e["en"]):
            recorded.setdefault((e["en"], e["zh"]), set()).update(e.get("modules", []))
    return recorded


@dataclass(frozen=True)
class Difference:
    """One way the source's pairs differ from the catalog's, in one module."""

    what: str  # "stale", "new", "reused" or "gone"
    module: str
    en: str
    zh: str
    was: str = ""  # stale: the English the Chinese was written for

    def __str__(self) -> str:
        pair = f"{self.en!r} -> {self.zh!r}"
        if self.what == "stale":
            return (
                f"{self.module}: stale: the English is now {self.en!r}; its Chinese {self.zh!r} "
                f"was written for {self.was!r}"
            )
        if self.what == "new":
            return f"{self.module}: new pair {pair}"
        if self.what == "reused":
            return f"{self.module}: a recorded pair, now here too: {pair}"
        return f"{self.module}: gone: {pair}"


def differences(found: Pairs, recorded: Pairs) -> list[Difference]:
    """How the pairs `found` in the source differ from those `recorded`, module by module,
    stale ones first, then new, reused and gone ones."""
    here = {(en, zh, m) for (en, zh), modules in found.items() for m in modules}
    there = {(en, zh, m) for (en, zh), modules in recorded.items() for m in modules}
    out: list[Difference] = []
    explained: set[tuple[str, str, str]] = set()  # recorded places a stale pair accounts for
    for en, zh, m in sorted(here - there):
        if (en, zh) in recorded:
            out.append(Difference("reused", m, en, zh))
            continue
        # the English this Chinese was recorded for in this module; one no longer here first
        written_for = sorted(old for old, z, mm in there if z == zh and mm == m)
        left = [o for o in written_for if (o, zh, m) not in here and (o, zh, m) not in explained]
        if written_for:
            was = (left or written_for)[0]
            explained.add((was, zh, m))
            out.append(Difference("stale", m, en, zh, was))
        else:
            out.append(Difference("new", m, en, zh))
    out += [Difference("gone", m, en, zh) for en, zh, m in sorted(there - here - explained)]
    order = {"stale": 0, "new": 1, "reused": 2, "gone": 3}
    return sorted(out, key=lambda d: order[d.what])


def check(lang: str, package: Path | None = None, write: bool = False) -> list[Difference]:
    """How the pairs of the package `package` (by default llmlab) differ from its catalog of
    `lang`; with `write`, the catalog is then rewritten to hold exactly those pairs."""
    path = catalog_path(lang, package)
    found = package_pairs(package)
    out = differences(found, read_pairs(path))
    if write:
        write_pairs(path, found)
    return out


USAGE = """usage: python -m llmlab lang pairs LANG [--write]

Compare the package's (English, Chinese) pairs with i18n/LANG/package-pairs.json and print each
difference: stale (the English edited since its Chinese was written, both Englishes named), new,
reused (a recorded pair in another module) or gone; exit status 1 when there is any.
--write records the package's pairs in the catalog: run it once their Chinese is right."""


def main(args: list[str]) -> int:
    """`lang pairs LANG [--write]`: print each difference from the catalog; exit status 1 when
    there is any and the catalog was not rewritten."""
    if "-h" in args or "--help" in args:
        print(USAGE)
        return 0
    write = "--write" in args
    rest = [a for a in args if a != "--write"]
    if len(rest) != 1 or rest[0].startswith("-"):
        print(USAGE.splitlines()[0], file=sys.stderr)
        return 2
    try:
        path = catalog_path(rest[0])
        found = check(rest[0], write=write)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for d in found:
        print(d)
    if write:
        print(f"wrote {len(read_pairs(path))} pairs to {path} ({len(found)} differences recorded)")
        return 0
    fix = f"; check their Chinese, then run `python -m llmlab lang pairs {rest[0]} --write`"
    print(f"{len(found)} differences from {path}" + (fix if found else ""))
    return 1 if found else 0
