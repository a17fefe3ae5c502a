"""Block-allocation visualiser (chapter 11): the block tables of live requests and the physical
KV block pool they point into.

`snapshot(manager, requests)` copies the state of a `KVCacheManager` (which request holds which
blocks, reference counts, which blocks are in the prefix cache, how many tokens each stores);
`plot_block_tables(snap)` draws it: one row per request with its logical blocks and the
physical block each maps to, above a grid of every physical block coloured by owner, shared
prefix blocks hatched with their reference count, free blocks that still hold a cached prefix
in grey. `manager_walkthrough()` records a small scenario on a real manager (two requests
sharing a prefix, one finishing, a third hitting the cache); `record_engine(engine)` records
every step of a real engine run; `waste_from_snapshots` turns a recording into the same
`sim.WasteResult` the simulator gives, measured. `block_allocation_explorer(snaps)` adds a
step slider. `pool_table(manager)` prints the pool's blocks (holders, reference counts, hashes,
place in the free queue); `chunked_prefill_schedule` steps a real `Scheduler` (no model) and
records each step's prefill and decode tokens (`split_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from llmlab.analysis.blocks import (  # noqa: F401
    BlockSnapshot,
    BlockView,
    chunked_prefill_schedule,
    manager_walkthrough,
    record_engine,
    snapshot,
    split_tokens,
    waste_from_snapshots,
)
from llmlab.course.check.catalog import catalog
from llmlab.course.figures.headers import header
from llmlab.course.widgets._show import control, explorer
from llmlab.i18n import notebook_text
from llmlab.kvcache.manager import KVCacheManager
from llmlab.utils import cdiv, format_table

M = catalog("widgets.blocks")

# colourblind-friendly owner colours (the owners are named by their request ids)
OWNER_COLOURS = (
    "#2563eb",
    "#d97706",
    "#059669",
    "#db2777",
    "#7c3aed",
    "#0891b2",
    "#65a30d",
    "#dc2626",
    "#4b5563",
    "#b45309",
)
FREE_COLOUR = "#ffffff"
CACHED_FREE_COLOUR = "#d1d5db"


def snapshot_text(snap: BlockSnapshot) -> str:
    """One line: requests, blocks held and shared, tokens in slots, waste."""
    cached_free = sum(1 for b in snap.blocks if b.ref_cnt == 0 and b.cached)
    label = M("snapshot_text.text", label=snap.label) if snap.label else ""
    return M(
        "snapshot_text.live_requests_blocks",
        label=label,
        live=len(snap.tables),
        held=len(snap.held_blocks),
        num_blocks=snap.num_blocks,
        shared=len(snap.shared_blocks),
        cached_free=cached_free,
        tokens_stored=snap.tokens_stored,
        logical_slots=snap.logical_slots,
        paged_waste=snap.paged_waste,
    )


def table_text(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table (one line per row, columns aligned) of dicts with the same keys; the
    headers in the language in use (`llmlab.course.figures.headers`)."""
    if not rows:
        return M("table_text.no_rows")
    keys = list(rows[0])
    body = [[r.get(k, "") for k in keys] for r in rows]
    return format_table(body, [header(str(k)) for k in keys], align="r")


def pool_table(manager: KVCacheManager, block_ids: Iterable[int] | None = None) -> str:
    """The pool's blocks as a table: holders (request ids), ref_cnt, whether the block is in the
    prefix cache (the first digits of its hash), its cached token ids, and its place in the free
    queue (0 = handed out next; "-" while held). Without `block_ids`: every block some request
    holds or that is cached, plus the free queue's head."""
    if not isinstance(manager, KVCacheManager):
        raise ValueError(
            M("pool_table.manager_must_kvcachemanager", got_type=type(manager).__name__)
        )
    pool = manager.block_pool
    place = {b.block_id: i for i, b in enumerate(pool.free_block_queue)}
    holders: dict[int, list[str]] = {}
    for rid, table in manager.req_to_blocks.items():
        for b in table:
            holders.setdefault(b.block_id, []).append(rid)
    if block_ids is None:
        head = [b.block_id for b, _ in zip(pool.free_block_queue, range(1))]
        block_ids = sorted(
            {b.block_id for b in pool.blocks if b.ref_cnt or b.is_cached} | set(head)
        )
    rows = []
    for bid in block_ids:
        b = pool.blocks[bid]
        rows.append(
            {
                "block": bid,
                "held by": ",".join(holders.get(bid, [])) or "-",
                "ref_cnt": b.ref_cnt,
                # 0x: four hex digits of letters only ("daca") beside a request id ("A")
                # would read as a word
                "hash": f"0x{b.block_hash & 0xFFFF:04x}.." if b.block_hash is not None else "-",
                "cached tokens": "-" if b.token_ids is None else " ".join(map(str, b.token_ids)),
                "free-queue place": place.get(bid, "-"),
            }
        )
    return table_text(rows)


def _owner_colours(snap: BlockSnapshot) -> dict[str, str]:
    return {rid: OWNER_COLOURS[i % len(OWNER_COLOURS)] for i, rid in enumerate(snap.tables)}


def _cell(
    ax: Any,
    x: float,
    y: float,
    colour: str,
    fill: float | None,
    text: str,
    shared: bool = False,
    cached_free: bool = False,
) -> None:
    from matplotlib.patches import Rectangle

    light = colour if colour in (FREE_COLOUR, CACHED_FREE_COLOUR) else colour + "40"
    ax.add_patch(
        Rectangle(
            (x + 0.05, y + 0.05),
            0.9,
            0.9,
            facecolor=light,
            edgecolor="black" if shared else "#6b7280",
            linewidth=2.2 if shared else 0.8,
            linestyle=":" if cached_free else "-",
            hatch="//" if shared else None,
        )
    )
    if fill:
        # the axes run top-down, so y + 0.77 is the cell's bottom edge
        ax.add_patch(
            Rectangle((x + 0.05, y + 0.77), 0.9 * fill, 0.18, facecolor=colour, edgecolor="none")
        )
    ax.text(
        x + 0.5,
        y + 0.45,
        text,
        ha="center",
        va="center",
        fontsize=7,
        bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
        if shared
        else None,
    )


def plot_block_tables(snap: BlockSnapshot, cols: int = 16, title: str | None = None) -> Any:
    """Draw the block tables (top) and the physical block pool (bottom); returns the figure.

    Colours are owners; a hatched, thick-edged block is shared (its reference count is printed
    as ×n); a grey dotted block is free but still in the prefix cache (evictable); white is free.
    The bar along a block's bottom shows how full it is.
    """
    import matplotlib.pyplot as plt

    title = notebook_text(title)  # a title a notebook cell wrote, in the language in use

    if not isinstance(cols, int) or cols < 1:
        raise ValueError(M("plot_block_tables.cols_must_int", cols=cols))
    colours = _owner_colours(snap)
    width = max([4] + [len(t) for t in snap.tables.values()])
    n_req = max(1, len(snap.tables))
    pool_rows = cdiv(snap.num_blocks, cols)
    # square cells in both panels: the tables panel is only as wide as the longest table
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(min(0.5 * max(cols, width) + 4.5, 16), 0.5 * (n_req + pool_rows) + 2.6),
        gridspec_kw={"height_ratios": [n_req + 0.6, pool_rows + 0.6]},
    )
    top.set_aspect("equal")
    bottom.set_aspect("equal")
    _plot_tables(top, snap, colours, width, n_req)
    _plot_pool(bottom, snap, colours, cols, pool_rows)
    fig.suptitle(title or M("plot_block_tables.paged_kv_cache"), fontsize=11)
    fig.tight_layout()
    return fig


def _plot_tables(
    ax: Any, snap: BlockSnapshot, colours: dict[str, str], width: int, n_req: int
) -> None:
    """The block tables, a row per request: logical block i of each request -> physical id."""
    bs = snap.block_size
    for row, (rid, table) in enumerate(snap.tables.items()):
        stored = snap.num_stored[rid]
        for i, bid in enumerate(table):
            fill = max(0, min(bs, stored - i * bs)) / bs
            view = snap.blocks[bid]
            text = f"#{bid}" + (f" x{view.ref_cnt}" if view.shared else "")
            _cell(ax, i, row, colours[rid], fill, text, shared=view.shared)
    ax.set_xlim(0, width)
    ax.set_ylim(n_req, 0)
    ax.set_yticks([r + 0.5 for r in range(len(snap.tables))])
    ax.set_yticklabels(
        [
            M("plot_block_tables.tok", rid=rid, stored=snap.num_stored[rid])
            + (
                M("plot_block_tables.cached", cached=snap.num_cached[rid])
                if snap.num_cached[rid]
                else M("plot_block_tables.text")
            )
            for rid in snap.tables
        ],
        fontsize=8,
    )
    ax.set_xticks([i + 0.5 for i in range(width)])
    ax.set_xticklabels([str(i) for i in range(width)], fontsize=7)
    ax.set_xlabel(M("plot_block_tables.logical_block_block", bs=bs))
    ax.set_title(M("plot_block_tables.block_tables_logical"), fontsize=10)
    if not snap.tables:
        ax.text(width / 2, 0.5, M("plot_block_tables.no_live_requests"), ha="center", va="center")


def _plot_pool(
    ax: Any, snap: BlockSnapshot, colours: dict[str, str], cols: int, pool_rows: int
) -> None:
    """The physical pool, `cols` blocks a row, with the legend of owners and states."""
    from matplotlib.patches import Patch

    for bid, view in enumerate(snap.blocks):
        if view.owners:
            colour = colours[view.owners[0]]
        else:
            colour = CACHED_FREE_COLOUR if view.cached else FREE_COLOUR
        fill = None if view.filled is None or not view.owners else view.filled / snap.block_size
        text = f"{bid}" + (f"\nx{view.ref_cnt}" if view.shared else "")
        cached_free = view.ref_cnt == 0 and view.cached
        _cell(ax, bid % cols, bid // cols, colour, fill, text, view.shared, cached_free)
    ax.set_xlim(0, cols)
    ax.set_ylim(pool_rows, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(M("plot_block_tables.physical_kv_blocks", last_block=snap.num_blocks - 1))
    handles = [
        Patch(facecolor=colours[r] + "40", edgecolor=colours[r], label=r) for r in snap.tables
    ]
    handles += [
        Patch(
            facecolor="white",
            edgecolor="black",
            hatch="//",
            linewidth=2,
            label=M("plot_block_tables.shared_x_ref"),
        ),
        Patch(
            facecolor=CACHED_FREE_COLOUR,
            edgecolor="#6b7280",
            linestyle=":",
            label=M("plot_block_tables.free_prefix_still"),
        ),
        Patch(facecolor=FREE_COLOUR, edgecolor="#6b7280", label=M("plot_block_tables.free")),
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(snapshot_text(snap), fontsize=8)


# ---- the widget --------------------------------------------------------------------------------


def block_allocation_explorer(snaps: Sequence[BlockSnapshot] | None = None, cols: int = 16) -> Any:
    """A slider over recorded snapshots (default: `manager_walkthrough()`), redrawing the block
    tables and the pool at each position."""
    snaps = list(snaps) if snaps is not None else manager_walkthrough()
    if not snaps:
        raise ValueError(M("block_allocation_explorer.snaps_must_hold"))
    slider = control(
        "IntSlider", 0, M("block_allocation_explorer.snapshot"), "80px", min=0, max=len(snaps) - 1
    )
    return explorer(
        {"position": slider},
        [("position",)],
        "llmlab-blocks-result",
        lambda position: snapshot_text(snaps[position]),
        lambda position: plot_block_tables(snaps[position], cols=cols),
    )
