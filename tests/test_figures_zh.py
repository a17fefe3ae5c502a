"""In Chinese (`set_language("zh")`) the figures of every chapter and the widgets' plots have
Chinese titles and labels, drawn without a "Glyph ... missing" warning (the CJK font is in use);
no title, axis label or legend entry is left in English; the widgets' labels, readouts and the
printed tables' headers are Chinese too, the tables still lined up. After `set_language("en")`
the same calls give the English text again."""

from __future__ import annotations

import io
import re
import warnings
from types import SimpleNamespace

import matplotlib
import pytest

matplotlib.use("Agg")

from test_ch10_figures import two_rates  # noqa: E402

from llmlab import i18n  # noqa: E402
from llmlab.analysis import roofline
from llmlab.analysis.hardware import get_hardware  # noqa: E402
from llmlab.config import get_config  # noqa: E402
from llmlab.course.check.ch12 import DECODE_STARTS_AT, LOOP_STEPS, LOOP_WITH_CACHE  # noqa: E402

CJK = re.compile(r"[\u3400-\u9fff]")
# words that stay in English inside Chinese text (the glossary's English terms, units, code names)
# and so may make up a label that has no Chinese character
KEPT = {
    "token",
    "tokens",
    "prefill",
    "decode",
    "batch",
    "batching",
    "cache",
    "roofline",
    "bound",
    "goodput",
    "gloo",
    "ring",
    "max_model_len",
    "max_num_batched_tokens",
    "nvlink",
    "pcie",
    "req",
    "tok",
    "mha",
    "gqa",
    "mqa",
    "mla",
    "ttft",
    "tpot",
    "itl",
    "e2el",
    "ttlt",
    "slo",
    "flop",
    "gib",
    "kib",
    "dtype",
    "head_dim",
    "top_k",
    "top_p",
    "gpu",
    "vocab_size",
    "hidden_size",
    "static",
    "continuous",
    "prompt",
    "step",
}  # "static batching", "continuous batching": the glossary keeps them
KEPT |= set(LOOP_STEPS)  # chapter 12's loop: its steps are the names the exercise asks for


@pytest.fixture
def zh(monkeypatch):
    """Chinese for the test, English (and the fonts as they were) afterwards."""
    monkeypatch.setattr(i18n, "_chosen", None)
    with matplotlib.rc_context():
        i18n.set_language("zh")
        yield
        i18n.set_language("en")


def _drawn(build):
    """Build a figure and draw it; the Figure and the glyph warnings raised on the way."""
    import matplotlib.pyplot as plt

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = build()
        fig = getattr(fig, "figure", fig)  # some plot functions return the Axes
        fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)
    return fig, [str(w.message) for w in caught if "Glyph" in str(w.message)]


def _labels(fig) -> list[str]:
    """Titles, axis labels, legend entries and annotations of a drawn figure (not tick labels:
    those are data, e.g. model names)."""
    out = [t.get_text() for t in (fig._suptitle, fig._supxlabel, fig._supylabel) if t is not None]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()] + [t.get_text() for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            out += [t.get_text() for t in legend.get_texts()] + [legend.get_title().get_text()]
    return [t for t in out if t.strip()]


def _english_left(texts: list[str]) -> list[str]:
    """The texts with no Chinese character that hold an English word outside KEPT (words in
    capitals, such as HBM or BPE, are names and count as kept)."""
    words = (re.findall(r"(?<![\w.-])[A-Za-z_]{3,}(?![\w.-])", t) for t in texts)
    return [
        t
        for t, ws in zip(texts, words)
        if not CJK.search(t) and any(w.lower() not in KEPT and not w.isupper() for w in ws)
    ]


def _step(kind, batch, seconds):
    return roofline.StepMeasurement(
        kind, batch, 16, seconds, roofline.Operation("x", flops=1e9, bytes=1e8)
    )


def _tiny():
    """A tiny random model with one logit per id of a small BPE (built once)."""
    if not _TINY:
        from llmlab.model import tiny_model
        from llmlab.tokenizer import train_bpe

        bpe = train_bpe("the cat sat on the mat. the hat. 猫坐在垫子上。猫。" * 3, 300)
        _TINY.update(model=tiny_model(seed=0, vocab_size=bpe.vocab_size), tokenizer=bpe)
    return _TINY["model"], _TINY["tokenizer"]


_TINY: dict = {}


def _sampling_settings():
    from llmlab.course.figures import ch03
    from llmlab.course.widgets.sampling import prompt_logits

    model, bpe = _tiny()
    return ch03.sampling_settings(
        prompt_logits("the cat", model, bpe),
        bpe,
        [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 5}],
        "the cat",
    )


def _chapter_figures():
    """(name, build) of at least one figure of every chapter module, and of the widgets' plots."""
    return [
        *_figures_of_chapters_00_to_07(),
        *_figures_of_chapters_08_to_11(),
        *_figures_of_chapters_12_to_16(),
        *_widget_figures(),
        *_module_figures(),
    ]


def _figures_of_chapters_00_to_07():
    from llmlab.course.figures import ch00, ch01, ch02, ch03, ch04, ch05, ch06, ch07

    return [
        ("ch00.chapter_map", ch00.chapter_map),
        (
            "ch01.token_ratios",
            lambda: ch01.token_ratios(
                {"BPE": {"tokens per English word": 1.2, "tokens per Chinese character": 1.5}}
            ),
        ),
        ("ch01.vocab_sizes", lambda: ch01.vocab_sizes(["a", "b"], [32000, 128000], [2048, 4096])),
        ("ch02.gqa_grouping", ch02.gqa_grouping),
        (
            "ch02.attention_heatmaps",
            lambda: ch02.attention_heatmaps(_tiny()[0], [5, 6, 7], ["a", "b", "c"]),
        ),
        ("ch02.rope_scores", lambda: ch02.rope_scores({(5, 3): 1.0, (12, 10): 1.0, (3, 5): -0.5})),
        (
            "ch03.naive_step_times",
            lambda: ch03.naive_step_times(
                [8, 16], [0.01, 0.02], [8], [0.011], gpu_seconds=[0.001, 0.001]
            ),
        ),
        ("ch03.sampling_settings", _sampling_settings),
        (
            "ch04.plot_step_times",
            lambda: ch04.plot_step_times(
                [8, 16], [0.01, 0.02], [0.005, 0.005], [8, 16], [0.001, 0.002], [0.001, 0.001]
            ),
        ),
        ("ch04.plot_source_example", lambda: ch04.plot_source_example(1.34e9, 5.4e9)),
        ("ch04.plot_kv_layouts", lambda: ch04.plot_kv_layouts(["llama-3-8b"])),
        (
            "ch05.plot_prefill_decode",
            lambda: ch05.plot_prefill_decode(
                [8, 16], [0.02, 0.03], [8, 16], [0.01, 0.01], [0.001, 0.001], [0.002, 0.002]
            ),
        ),
        (
            "ch05.plot_intensity",
            lambda: ch05.plot_intensity([1, 64], [1.0, 60.0], [1.0, 50.0], 295.0),
        ),
        ("ch06.chip_memory", ch06.chip_memory),
        (
            "ch07.throughput_vs_batch",
            lambda: ch07.throughput_vs_batch(
                [_step("decode", 1, 0.02), _step("decode", 4, 0.04)],
                "CPU",
                get_config("llama-3-70b"),
                gpu_batches=(1, 8),
            ),
        ),
    ]


def _figures_of_chapters_08_to_11():
    from llmlab.course.figures import ch08, ch09, ch10, ch11

    steps8 = [
        roofline.StepMeasurement(
            "decode", b, 63, s, roofline.decode_step(get_config("smollm2-135m"), b, 64, 4)
        )
        for b, s in {1: 0.010, 8: 0.020}.items()
    ]
    dp_rows = [
        {"arrivals/s": r, "replicas": n, "tokens/s": 100.0 * r, "mean latency s": 1.0 + r / n}
        for r in (1, 2)
        for n in (1, 2)
    ]
    return [
        (
            "ch08.batch_scaling",
            lambda: ch08.batch_scaling(
                steps8, get_hardware("A100-80GB"), get_config("smollm2-135m")
            ),
        ),
        ("ch09.dp_replicas", lambda: ch09.dp_replicas(dp_rows)),
        ("ch09.allreduce_cpu_vs_gpu", lambda: ch09.allreduce_cpu_vs_gpu(1e-3, 8e3)),
        ("ch10.ttlt_prediction", lambda: ch10.ttlt_prediction(two_rates())),
        ("ch10.goodput_vs_rate", lambda: ch10.goodput_vs_rate(two_rates(), {"ttft": 0.25})),
        (
            "ch10.tpot_vs_batch",
            lambda: ch10.tpot_vs_batch({1: 0.01, 4: 0.02}, {"H100": {1: 0.01, 4: 0.0101}}),
        ),
        (
            "ch11.token_split",
            lambda: ch11.token_split(
                [{"prefill": 60, "decode": 4}, {"prefill": 20, "decode": 5}], 64
            ),
        ),
        (
            "ch11.throughput_bars",
            lambda: ch11.throughput_bars(
                {
                    "systems": {
                        "llmlab": {"tok_per_s": 50.0},
                        "hf-sequential": {"tok_per_s": 10.0},
                    },
                    "settings": {"num_requests": 8},
                    "machine": {"threads": 2},
                }
            ),
        ),
    ]


def _figures_of_chapters_12_to_16():
    from llmlab.analysis import dtypes, step_time
    from llmlab.course.figures import ch12, ch13, ch14, ch15, ch16

    return [
        ("ch12.terms_per_chapter", ch12.terms_per_chapter),
        ("ch12.generation_loop", lambda: ch12.generation_loop(LOOP_WITH_CACHE, DECODE_STARTS_AT)),
        ("ch13.plot_formats", lambda: ch13.plot_formats(dtypes.formats())),
        (
            "ch13.plot_decode_speeds",
            lambda: ch13.plot_decode_speeds(["float32", "int8"], [538.0, 135.0], [30.0, 45.0]),
        ),
        (
            "ch14.plot_verify_cost",
            lambda: ch14.plot_verify_cost([1, 2, 5], [0.01, 0.011, 0.013], 256),
        ),
        (
            "ch14.plot_speedup",
            lambda: ch14.plot_speedup({"repetitive": {1: 1.8, 8: 0.9}, "free-form": {1: 1.1}}),
        ),
        (
            "ch15.plot_validity",
            lambda: ch15.plot_validity({"without": 0.06, "with": 1.0}, 16),
        ),
        (
            "ch15.plot_mask_cost",
            lambda: ch15.plot_mask_cost(
                {
                    1: {"fill": 1e-4, "apply": 2e-4, "step": 0.03},
                    64: {"fill": 5e-4, "apply": 7e-3, "step": 0.19},
                }
            ),
        ),
        (
            "ch16.plot_step_split",
            lambda: ch16.plot_step_split(
                {"step": 0.06, "host": 0.01, "compute": 0.05},
                step_time.gpu_run(),
                {
                    "eager": {"step": 0.03, "busy": 0.006, "kernels": 1317.0},
                    "graphs": {"step": 0.008, "busy": 0.006, "kernels": 1317.0},
                },
            ),
        ),
    ]


def _widget_figures():
    from llmlab.course.widgets import blocks, kv, memory, metrics, parallel, serving
    from llmlab.course.widgets import roofline as roofline_widget

    timelines = [
        SimpleNamespace(stage=s, intervals=[(0.0 + s, 0.5 + s), (0.6 + s, 1.0 + s)]) for s in (0, 1)
    ]
    return [
        ("widgets.kv.plot_kv_memory", lambda: kv.plot_kv_memory(weight_bytes=140e9)),
        ("widgets.memory.plot_weight_read", lambda: memory.plot_weight_read(70, "bf16", 3.0)),
        ("widgets.roofline.plot_roofline_explorer", roofline_widget.plot_roofline_explorer),
        (
            "widgets.parallel.plot_parallel_cost",
            lambda: parallel.plot_parallel_cost(model="llama-3-70b", tp=4),
        ),
        (
            "widgets.parallel.plot_pipeline_timeline",
            lambda: parallel.plot_pipeline_timeline(timelines),
        ),
        (
            "widgets.parallel.plot_bubble",
            lambda: parallel.plot_bubble(
                {1: {"theory": 0.5, "measured": 0.55}, 4: {"theory": 0.2, "measured": 0.3}}
            ),
        ),
        (
            "widgets.metrics.plot_latency_cdfs",
            lambda: metrics.plot_latency_cdfs({"2/s": two_rates()[2.0]}),
        ),
        (
            "widgets.metrics.plot_percentiles_vs_rate",
            lambda: metrics.plot_percentiles_vs_rate(two_rates()),
        ),
        (
            "widgets.metrics.plot_request_timelines",
            lambda: metrics.plot_request_timelines(two_rates()[8.0]),
        ),
        ("widgets.metrics.plot_arrivals", lambda: metrics.plot_arrivals(2.0, 2.0, 50)),
        (
            "widgets.metrics.plot_latency_vs_load",
            lambda: metrics.plot_latency_vs_load(two_rates()),
        ),
        (
            "widgets.metrics.plot_throughput_latency",
            lambda: metrics.plot_throughput_latency({"HTTP": two_rates()}),
        ),
        ("widgets.serving.plot_serving", lambda: serving.plot_serving(batch=64, max_batch=4096)),
        (
            "widgets.blocks.plot_block_tables",
            lambda: blocks.plot_block_tables(blocks.manager_walkthrough()[2]),
        ),
    ]


def _module_figures():
    """(name, build) of the plots of the numbers llmlab.analysis.roofline, llmlab.analysis.sim
    and llmlab.analysis.hardware compute (drawn by chapters 06, 07, 08 and 11's figures), on small
    inputs; the memory mountain on a tiny made-up measurement."""
    from llmlab.analysis import hardware, sim
    from llmlab.course.figures import ch06, ch07, ch08, ch11

    cfg = get_config("smollm2-135m")
    cpu = get_hardware("laptop-cpu").replace(name="test cpu, 2 threads", measured=True)
    steps = [
        roofline.StepMeasurement(
            "decode", b, 64, 0.02 * b**0.5, roofline.decode_step(cfg, b, 65, 4)
        )
        for b in (1, 4)
    ] + [roofline.StepMeasurement("prefill", 1, 32, 0.05, roofline.prefill_step(cfg, 32))]
    cfg70 = get_config("llama-3-70b")
    trace = sim.make_trace(6, 1.0, 4, seed=0)
    mountain = hardware.MountainResult(
        [16384, 1 << 20], [1e11, 5e10], "cpu", 1, [{"level": 1, "type": "Data", "size": 49152}]
    )
    return [
        (
            "ch07.plot_roofline",
            lambda: ch07.plot_roofline(
                ["H100-SXM", cpu],
                ops=[
                    roofline.decode_gemv(cfg70, 1),
                    roofline.decode_attention(cfg70, 1, 1024),
                    roofline.decode_step(cfg70, 8, 1024),
                    roofline.prefill_gemm(cfg70, 512),
                    roofline.prefill_step(cfg70, 512),
                ],
            ),
        ),
        ("ch07.plot_measured_roofline", lambda: ch07.plot_measured_roofline(cpu, steps)),
        (
            "ch07.plot_batch_sweep",
            lambda: ch07.plot_batch_sweep(cfg70, "H100-SXM", (1, 64, 512))[0],
        ),
        ("ch07.plot_measured_batches", lambda: ch07.plot_measured_batches(cpu, steps)[0]),
        ("ch08.plot_compare", lambda: ch08.plot_compare(sim.compare(trace, max_batch=2))),
        (
            "ch08.plot_compare_seconds",
            lambda: ch08.plot_compare(
                sim.compare(trace, max_batch=2), time_unit="s", time_scale=0.01
            ),
        ),
        ("ch08.plot_gantt", lambda: ch08.plot_gantt(sim.simulate(trace, "static", 2))),
        ("ch11.plot_kv_waste", lambda: ch11.plot_kv_waste(sim.kv_memory_waste(trace, 64, 16, 4))),
        ("ch06.plot_memory_mountain", lambda: ch06.plot_memory_mountain(mountain)),
        ("ch06.plot_hierarchy", lambda: ch06.plot_hierarchy("H100-SXM")),
    ]


def test_every_chapter_has_a_chinese_figure_here():
    chapters = {name.split(".")[0] for name, _ in _chapter_figures()}
    assert chapters >= {f"ch{n:02d}" for n in range(16)}


@pytest.mark.parametrize("name", [name for name, _ in _chapter_figures()])
def test_figure_speaks_chinese_with_every_glyph_drawn(zh, name):
    build = dict(_chapter_figures())[name]
    fig, glyphs = _drawn(build)
    assert glyphs == [], f"{name}: {glyphs[:3]}"
    titles = [t.get_text() for t in (fig._suptitle, fig._supxlabel) if t is not None]
    titles += [
        text for ax in fig.axes for text in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel())
    ]
    assert any(CJK.search(t) for t in titles), f"{name}: no Chinese in {titles}"
    left = _english_left(_labels(fig))
    assert left == [], f"{name}: still English: {left}"


def test_english_figures_are_unchanged_after_switching_back(zh):
    from llmlab.course.figures import ch00, ch04

    fig, _ = _drawn(ch00.chapter_map)
    assert CJK.search(fig.axes[0].get_title())
    i18n.set_language("en")
    fig, _ = _drawn(ch00.chapter_map)
    assert fig.axes[0].get_title() == "The chapter map: from a token to PagedAttention"
    fig, _ = _drawn(lambda: ch04.plot_source_example(1.34e9, 5.4e9))
    assert fig.axes[0].get_xlabel() == "KV cache of one 4K-token request (GB)"


def test_roofline_sim_and_hardware_plots_switch_back_to_their_english(zh):
    from llmlab.analysis import sim
    from llmlab.course.figures import ch06, ch07, ch08

    cfg70 = get_config("llama-3-70b")
    op = roofline.decode_attention(cfg70, 1, 1024)
    assert op.name == "decode 注意力，batch 1，上下文 1024"
    assert CJK.search(roofline.place(op, "H100-SXM").summary())
    fig, _ = _drawn(
        lambda: ch08.plot_compare(sim.compare(sim.make_trace(6, 1.0, 4, seed=0), max_batch=2))
    )
    assert fig.axes[0].get_title().startswith("模拟：static batching，batch 上限 2，")
    i18n.set_language("en")
    op = roofline.decode_attention(cfg70, 1, 1024)
    assert op.name == "decode attention, batch 1, context 1024"
    assert (
        roofline.place(op, "H100-SXM")
        .summary()
        .startswith("decode attention, batch 1, context 1024: intensity ")
    )
    ax = ch07.plot_roofline(["H100-SXM"], ops=[op])
    assert (ax.get_xlabel(), ax.get_title()) == (
        "arithmetic intensity (FLOP / byte, log scale)",
        "Roofline, dense bf16 peaks",
    )
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["H100-SXM (bf16, datasheet)"]
    fig, _ = _drawn(
        lambda: ch08.plot_compare(sim.compare(sim.make_trace(6, 1.0, 4, seed=0), max_batch=2))
    )
    assert (
        fig.axes[0].get_title().startswith("simulated: static batching, max batch 2 - throughput ")
    )
    assert fig.axes[-1].get_xlabel() == "time (steps)"
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()] == ["static", "continuous"]
    assert ch06.plot_hierarchy("H100-SXM").get_xlabel() == "capacity (bytes, log scale)"


def _width(line: str) -> int:
    from llmlab.utils import width

    return width(line)


def test_printed_tables_have_chinese_headers_and_stay_aligned(zh):
    from llmlab.course.figures import ch06, ch08
    from llmlab.course.widgets import blocks

    for text in (
        blocks.table_text(
            [
                {"block": 1, "held by": "A,B", "ref_cnt": 2},
                {"block": 12, "held by": "-", "ref_cnt": 0},
            ]
        ),
        ch08.text_table([{"policy": "static", "steps": 40, "mean batch": 3.5}]),
        ch06.table_text({"H100-SXM": {"bandwidth TB/s": 3.35, "SMs": 132}}, "preset"),
    ):
        lines = text.splitlines()
        assert CJK.search(lines[0]), lines[0]
        assert len({_width(line) for line in lines}) == 1, text  # every line as wide on screen
    assert "持有者" in blocks.table_text([{"held by": "A"}]) and "策略" in ch08.text_table(
        [{"policy": "x"}]
    )
    i18n.set_language("en")
    assert blocks.table_text([{"block": 1, "held by": "A"}]).splitlines()[0] == "block  held by"


def test_widgets_label_their_controls_and_readouts_in_chinese(zh):
    from llmlab.course.widgets import (
        batching,
        blocks,
        kv,
        memory,
        metrics,
        parallel,
        sampling,
        serving,
        tokens,
    )
    from llmlab.course.widgets import roofline as rw

    boxes = {
        "kv_calculator": kv.kv_calculator(),
        "roofline_explorer": rw.roofline_explorer(),
        "weight_read_explorer": memory.weight_read_explorer(),
        "parallelism_explorer": parallel.parallelism_explorer(),
        "batching_simulator": batching.batching_simulator(num_requests=8),
        "arrival_explorer": metrics.arrival_explorer(num_requests=40),
        "serving_explorer": serving.serving_explorer(),
        "block_allocation_explorer": blocks.block_allocation_explorer(),
        "token_viewer": tokens.token_viewer("the cat", _tiny()[1]),
        "sampling_explorer": sampling.sampling_explorer("the cat", *_tiny()),
    }
    for name, box in boxes.items():
        controls, readouts = [], []
        todo = [box]
        while todo:
            w = todo.pop()
            todo += list(getattr(w, "children", ()))
            if getattr(w, "description", ""):
                controls.append(w.description)
            if type(w).__name__ == "HTML":
                readouts.append(w.value)
        assert controls and readouts, name
        assert _english_left(controls) == [], f"{name}: {controls}"
        assert any(CJK.search(c) for c in controls), f"{name}: {controls}"
        assert all(CJK.search(r) for r in readouts), f"{name}: {readouts}"


def test_readouts_keep_their_numbers_in_chinese(zh):
    from llmlab.course.widgets import kv, memory

    s = kv.kv_summary()
    zh_line = kv.kv_text(s)
    i18n.set_language("en")
    en_line = kv.kv_text(s)
    assert CJK.search(zh_line) and not CJK.search(en_line)
    assert sorted(re.findall(r"\d[\d.,]*", zh_line)) == sorted(re.findall(r"\d[\d.,]*", en_line))
    assert memory.weight_read_text(70, "bf16", 3.0).startswith("Per-token floor: 46.7 ms")


def _chinese_strings():
    """(file, string) of every Chinese text of the figures' and the widgets' catalogs, and of
    every string literal with a Chinese character left in their modules and in the analysis
    modules a figure reads labels from (roofline, sim, hardware)."""
    import ast
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "llmlab"
    for folder in ("figures", "widgets"):
        for path in sorted((root / "course" / folder / "messages").glob("*.json")):
            for entry in json.loads(path.read_text(encoding="utf-8"))["messages"].values():
                yield path.name, entry["zh"]
    files = sorted((root / "course" / "figures").glob("*.py")) + sorted(
        (root / "course" / "widgets").glob("*.py")
    )
    files += [
        root / "analysis" / name
        for name in ("roofline/model.py", "roofline/measure.py", "sim.py", "hardware.py")
    ]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and CJK.search(node.value)
            ):
                yield path.name, node.value


def test_chinese_labels_use_the_glossary_terms():
    from test_zh_terms import PENDING_TERMS  # the analysis modules' pending names

    from llmlab.course.glossary import load_glossary, zh_synonym_uses

    entries = load_glossary()
    strings = list(_chinese_strings())
    assert len(strings) > 200
    found = [
        (name, use.found, use.primary, text)
        for name, text in strings
        for use in zh_synonym_uses(text, entries)
        if (f"llmlab/analysis/{name}", use.found) not in PENDING_TERMS
    ]
    assert found == []
    assert not [(name, text) for name, text in strings if "内核" in text or "对数几率" in text]
