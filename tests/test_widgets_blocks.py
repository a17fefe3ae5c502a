"""The block-allocation visualiser: snapshots agree with the manager they copy, the
walk-through tells its story (sharing, freeing, a cache hit), a real engine run records
consistent snapshots and a measured waste, the figure marks shared blocks, and the widget
redraws when its slider moves."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import Rectangle

from llmlab.core.request import Request
from llmlab.course.widgets.blocks import (
    block_allocation_explorer,
    manager_walkthrough,
    plot_block_tables,
    record_engine,
    snapshot,
    snapshot_text,
    waste_from_snapshots,
)
from llmlab.kvcache import KVCacheManager
from llmlab.sampling import SamplingParams

BS, PREFIX = 4, 8


@pytest.fixture(scope="module")
def story():
    return manager_walkthrough(block_size=BS, num_blocks=24, prefix_len=PREFIX)


def _consistent(snap):
    """Invariants every snapshot must satisfy."""
    free = set(snap.free_queue)
    for b in snap.blocks:
        assert b.ref_cnt == len(b.owners), b
        assert (b.ref_cnt == 0) == (b.block_id in free), b
        if b.filled is not None:
            assert 0 <= b.filled <= snap.block_size
    assert len(free) + len(snap.held_blocks) == snap.num_blocks
    for rid, table in snap.tables.items():
        stored = snap.num_stored[rid]
        assert (len(table) - 1) * snap.block_size < stored <= len(table) * snap.block_size, rid
    assert 0 <= snap.logical_slots - snap.tokens_stored < snap.block_size * max(1, len(snap.tables))


def test_walkthrough_shares_frees_and_hits(story):
    for s in story:
        _consistent(s)
    first, shared, decoded, a_done, c_hit = story
    assert first.tables["A"] and not first.shared_blocks
    n_prefix_blocks = PREFIX // BS
    assert shared.tables["B"][:n_prefix_blocks] == shared.tables["A"][:n_prefix_blocks]
    assert sorted(shared.shared_blocks) == sorted(shared.tables["A"][:n_prefix_blocks])
    assert shared.num_cached["B"] == n_prefix_blocks * BS
    assert decoded.tokens_stored == shared.tokens_stored + 2 * BS
    # A finished: the shared blocks drop to one holder; A's own full block stays cached while free
    assert "A" not in a_done.tables and not a_done.shared_blocks
    a_own = [b for b in decoded.tables["A"] if b not in decoded.tables["B"]]
    assert any(a_done.blocks[b].cached and a_done.blocks[b].ref_cnt == 0 for b in a_own)
    assert set(a_own) <= set(a_done.free_queue)
    # C takes the prefix straight from the cache
    assert c_hit.tables["C"][:n_prefix_blocks] == c_hit.tables["B"][:n_prefix_blocks]
    assert c_hit.num_cached["C"] == n_prefix_blocks * BS
    assert all(c_hit.blocks[b].ref_cnt == 2 for b in c_hit.tables["C"][:n_prefix_blocks])


def test_snapshot_is_a_copy_not_a_view():
    mgr = KVCacheManager(8, 4)
    req = Request("r", list(range(6)), SamplingParams(), arrival_time=0.0)
    mgr.allocate_slots(req, 6)
    req.num_computed_tokens = 6
    snap = snapshot(mgr, [req])
    mgr.free(req)
    assert snap.tables == {"r": (0, 1)} and snap.num_stored == {"r": 6}
    assert [b.filled for b in snap.blocks[:2]] == [4, 2]
    assert "2/8 blocks held" in snapshot_text(
        snap
    ) and "6 tokens in 8 table slots" in snapshot_text(snap)
    assert snapshot(mgr).tables == {}


def test_bad_arguments_name_themselves(story):
    with pytest.raises(ValueError, match="manager"):
        snapshot("not a manager")
    with pytest.raises(ValueError, match="cols"):
        plot_block_tables(story[0], cols=0)
    with pytest.raises(ValueError, match="max_model_len"):
        waste_from_snapshots(story, 0)
    with pytest.raises(ValueError, match="snaps"):
        waste_from_snapshots([], 64)
    with pytest.raises(ValueError, match="prefix_len"):
        manager_walkthrough(block_size=4, prefix_len=2)
    with pytest.raises(ValueError, match="max_steps"):
        record_engine(None, max_steps=0)


def test_figure_marks_every_shared_block(story):
    snap = story[-1]
    fig = plot_block_tables(snap, cols=8)
    top, bottom = fig.axes[:2]
    hatched_pool = [p for p in bottom.patches if isinstance(p, Rectangle) and p.get_hatch() == "//"]
    assert len(hatched_pool) == len(snap.shared_blocks)
    hatched_tables = [p for p in top.patches if isinstance(p, Rectangle) and p.get_hatch() == "//"]
    assert len(hatched_tables) == sum(snap.blocks[b].ref_cnt for b in snap.shared_blocks)
    texts = {t.get_text() for t in bottom.texts}
    assert {str(b) for b in range(snap.num_blocks)} <= {t.split("\n")[0] for t in texts}
    assert all(f"{rid} (" in lbl.get_text() for rid, lbl in zip(snap.tables, top.get_yticklabels()))
    plt.close(fig)


def test_widget_redraws_on_slider(story):
    box = block_allocation_explorer(story)
    slider, html = box.children[0], box.children[1]
    assert snapshot_text(story[0]) in html.value
    slider.value = len(story) - 1
    assert snapshot_text(story[-1]) in html.value
    plt.close("all")


def test_real_engine_recording_and_measured_waste():
    from llmlab import LLM
    from llmlab.model import tiny_model

    llm = LLM(tiny_model(seed=0), block_size=4, num_kv_blocks=64, max_model_len=128, max_num_seqs=4)
    engine = llm.llm_engine
    prefix = list(range(10, 22))  # 12 tokens = 3 full blocks
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("a", prefix + [40, 41], params)
    engine.step()  # a's prefix is now cached
    engine.add_request("b", prefix + [50], params)
    engine.add_request("c", list(range(60, 75)), params)
    tokens: dict[str, list[int]] = {}
    snaps = record_engine(engine, tokens=tokens)
    assert not engine.has_unfinished_requests()
    assert sorted(tokens) == ["a", "b", "c"]
    assert [len(tokens[r]) for r in "bc"] == [6, 6] and len(
        tokens["a"]
    ) == 5  # a's first came earlier
    # the recorded tokens are the engine's own greedy output for the same prompts
    again = LLM(tiny_model(seed=0), block_size=4, num_kv_blocks=64, max_model_len=128).generate(
        [prefix + [50], list(range(60, 75))], params, use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in again] == [tokens["b"], tokens["c"]]
    assert len(snaps) >= 6
    for s in snaps:
        _consistent(s)
    assert any(s.shared_blocks for s in snaps), "b never shared a's prefix blocks"
    assert max(s.num_cached.get("b", 0) for s in snaps) == 12
    assert snaps[-1].tables == {} and not snaps[-1].held_blocks
    w = waste_from_snapshots(snaps, engine.max_model_len)
    assert len(w.used) == sum(1 for s in snaps if s.tables)
    for u, c, p, s in zip(w.used, w.contiguous, w.paged, [s for s in snaps if s.tables]):
        assert u <= p <= c
        assert c == len(s.tables) * 128
    assert w.contiguous_waste > 0.8 and w.paged_waste < w.contiguous_waste


def test_pool_table_shows_holders_ref_counts_hashes_and_queue_places():
    from llmlab.course.widgets.blocks import pool_table, table_text

    mgr = KVCacheManager(6, 4)
    a = Request(
        "A", list(range(10, 19)), SamplingParams(), arrival_time=0.0
    )  # 9 tokens: 2 full blocks
    mgr.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    lines = pool_table(mgr).splitlines()
    assert lines[0].split()[:3] == ["block", "held", "by"]
    rows = {int(line.split()[0]): line for line in lines[2:]}
    assert set(rows) == {0, 1, 2, 3}  # A's three blocks and the free queue's head
    assert "10 11 12 13" in rows[0]  # cached: its tokens and its hash's last 16 bits
    assert f"0x{mgr.block_pool.blocks[0].block_hash & 0xFFFF:04x}.." in rows[0].split()
    assert rows[2].split()[1:5] == ["A", "1", "-", "-"]  # partial block: no hash
    assert rows[3].split()[-1] == "0"  # next to be handed out
    mgr.free(a)
    after = {
        int(line.split()[0]): line.split()[-1]
        for line in pool_table(mgr, range(6)).splitlines()[2:]
    }
    assert after[2] == "3" and after[1] == "4" and after[0] == "5"  # freed last block first
    assert table_text([]) == "(no rows)"
    with pytest.raises(ValueError, match="manager"):
        pool_table("not a manager")


def test_chunked_prefill_schedule_checks_its_arguments():
    from llmlab.course.widgets.blocks import chunked_prefill_schedule

    with pytest.raises(ValueError, match="decodes"):
        chunked_prefill_schedule(100, 8, 8)
    with pytest.raises(ValueError, match="budget"):
        chunked_prefill_schedule(100, 0, 0)
    assert chunked_prefill_schedule(10, 64, 0) == [{"prefill": 10, "decode": 0}]
