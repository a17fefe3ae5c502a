"""Column headers of the printed tables, in the language in use.

The notebooks build their tables with English keys (the notebook code is the same in both
languages); the table helpers (`figures.ch06.table_text`, `figures.ch08.text_table`,
`widgets.blocks.table_text`) print each header (and `figures.ch06.table_text` each row label)
through `header`, which looks it up by its English in the section "header" of this module's
catalog (`messages/headers.json`). A header the catalog does not hold is printed as it is
(numbers, units, code names). The table itself, aligned by screen columns (a Chinese character
takes two), is `llmlab.utils.format_table`.
"""

from __future__ import annotations

from llmlab.course.check.catalog import catalog

M = catalog("figures.headers")


def header(text: str) -> str:
    """`text` as a table header in the language in use (unchanged where the catalog holds no
    header of that English)."""
    return M.by_english(text, "header")
