"""The check that a reader of a Chinese notebook sees no English prose (tests/english_prose.py),
on small notebooks built here: what it flags, what it lets through, and where it looks."""

from __future__ import annotations

import json

import pytest
from english_prose import FIGURE_TEXTS_MIME, MIN_WORDS, english_runs, find_english_prose, main
from nbformat.v4 import (
    new_code_cell,
    new_markdown_cell,
    new_notebook,
    new_output,
)


def printed(*lines: str, tags: list[str] | None = None):
    """A notebook with one code cell that printed `lines`."""
    cell = new_code_cell("...")
    cell.outputs = [new_output("stream", name="stdout", text="\n".join(lines) + "\n")]
    if tags:
        cell.metadata["tags"] = tags
    return new_notebook(cells=[cell])


def shown(data: dict, tags: list[str] | None = None):
    """A notebook with one code cell that displayed `data` (mime type -> content)."""
    cell = new_code_cell("...")
    cell.outputs = [new_output("display_data", data=data)]
    if tags:
        cell.metadata["tags"] = tags
    return new_notebook(cells=[cell])


def flagged(nb) -> list[str]:
    return [f.text for f in find_english_prose(nb)]


# --------------------------------------------------------------------------- what it flags


def test_flags_an_english_label():
    nb = printed("the ranks' outputs differ by up to 0.0003")
    assert flagged(nb) == ["the ranks' outputs differ by up to"]


@pytest.mark.parametrize(
    "line",
    [
        "trained 256 merges in 0.9 s (vocabulary 512)",  # "merges" is no unit: 3 words
        "Exercise 1: Llama-3-70B, BF16 — KV bytes of one token in one layer?",
        "块表 (chapter 11): a request's list of physical block ids",  # English beside Chinese
        "{'a': 'a cache hit', 'b': 'a miss'}",  # a choice list's English labels
        "block table of a request",  # a glossary name with no Chinese beside it is English
        "median error",  # a two-word label
        "['tokenize', 'embed', 'qkv_projection', 'attention']",  # choices with no Chinese label
        "(c) 'requests_preempted_with_many_long_chats'",  # one choice: six English words
        "running  waiting  num_kv_blocks  kv_usage",  # a table's header: its columns are read
        "system         tokens  seconds  tok/s",
        "mean_latency  mean_ttft  mean_batch",  # columns' code names alone
    ],
)
def test_flags_english_prose(line):
    assert flagged(printed(line)), line


@pytest.mark.parametrize(
    "line",
    [
        "TTFT 12.3 ms, batch 8",  # acronyms, numbers with units, glossary terms
        "{'ttft': 0.3, 'tpot': 0.02}",  # a dict keyed by names
        "llmlab.kvcache.BlockPool",  # a dotted name
        "'qkv_projection'（QKV 投影）、'attention'（注意力）",  # choices with their Chinese labels
        "运行中 running  排队 waiting  KV 块数 num_kv_blocks",  # columns labelled in Chinese
        "top_k 5  top_p 0.9",  # one word in each code name
        "KV cache, prefill, decode step, TTFT, TPOT, micro-batch",  # kept in English by design
        "每个 decode step 都把 KV cache 读一遍，prompt 的 prefill 只做一次",
        "'块表' -> block table / 块表（第 11 章）：一个请求的物理块 id",  # the key beside its Chinese
        "SmolLM2-135M-Instruct on Intel(R) Xeon(R)",  # names: of a model, of a CPU
        "「My favourite fruit is the」之后的下一个 token",  # the prompt, quoted verbatim
        "    return x + self.mlp(self.post_attention_layernorm(x))  # the residual adds it back",
        "if num_new <= 0:  # nothing to compute (cannot happen between steps)",
        "batch   1: floor   42.2 ms",  # one word, under the minimum
        "        layer: int,",  # a line of a printed signature
        "    query, key_cache, metadata.seq_lens, scale, **scales",  # of a printed call
        "NVIDIA H100 Tensor Core GPU",  # a product's name
        "vllm:num_requests_running        0",
        "docs: https://docs.vllm.ai/en/latest/design/paged_attention.html",
    ],
)
def test_lets_through(line):
    assert flagged(printed(line)) == [], line


def test_the_minimum_run_is_two_words():
    assert MIN_WORDS == 2
    assert english_runs("word") == []
    assert [words for words, _ in english_runs("per word")] == ["per word"]
    assert english_runs("one.", min_words=1)
    assert flagged(printed("prompt  TTFT ms   measured here")) == ["ms   measured here"]


def test_a_run_is_cut_at_chinese_and_at_the_columns_of_a_line_with_chinese():
    assert flagged(printed("measured 这台 here 机器 again")) == []
    assert flagged(printed("实测  measured  sentence  all")) == []  # columns beside Chinese
    assert flagged(printed("measured  sentence  all")) == ["measured  sentence  all"]


def test_a_code_name_counts_only_where_no_chinese_labels_it():
    assert flagged(printed("  a) 'kv_usage'")) == ["a) 'kv_usage'"]
    assert flagged(printed("  a) 'kv_usage' KV 使用率")) == []
    assert flagged(printed("vllm:num_requests_running  llmlab.kvcache.block_pool")) == []


# --------------------------------------------------------------------------- where it looks


def test_reads_the_html_a_display_shows_not_its_plain_text():
    nb = shown({"text/html": "<b>每步</b> 的耗时", "text/plain": "time of every step, measured"})
    assert flagged(nb) == []
    nb = shown({"text/html": "<p>the cache is <b>full</b> now</p>", "text/plain": "<HTML>"})
    assert flagged(nb) == ["the cache is full now"]


def test_html_table_cells_are_pieces_of_their_own():
    nb = shown({"text/html": "<table><tr><td>tokens</td><td>per</td><td>word</td></tr></table>"})
    assert flagged(nb) == []
    nb = shown({"text/html": "<table><tr><td>tokens per English word</td></tr></table>"})
    assert flagged(nb) == ["per English word"]  # a finding runs from its first English word


def test_html_code_and_styles_are_not_read():
    markup = (
        "<style>.a { font-family: the sans serif one }</style>"
        "<code>the_value = read it back</code>结果"
    )
    assert flagged(shown({"text/html": markup})) == []


def test_reads_the_words_a_figure_draws():
    image = {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure size 640x480 with 1 Axes>"}
    words = {"texts": ["KV memory measured on the llmlab engine", "0.5", "1.0"]}
    nb = shown({**image, FIGURE_TEXTS_MIME: words})
    assert [(f.kind, f.text) for f in find_english_prose(nb)] == [
        ("figure", "memory measured on the llmlab engine")
    ]
    words["texts"][0] = "在 llmlab 引擎上实测的 KV 内存（SmolLM2-135M）"
    assert flagged(shown({**image, FIGURE_TEXTS_MIME: words})) == []


def test_a_kernel_keeps_the_words_of_each_figure_it_shows():
    """`llmlab.i18n.record_figure_texts`, which `set_language` calls, in an IPython shell: a
    Figure's display carries its texts, any other object's does not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell

    from llmlab import i18n

    shell = InteractiveShell.instance()
    try:
        i18n.record_figure_texts()
        fig, ax = plt.subplots()
        ax.plot([1, 2], [3, 4], label="实测")
        ax.set_title("每步耗时")
        ax.set_xlabel("batch")
        ax.legend()
        data, _ = shell.display_formatter.format(fig)
        texts = data[i18n.FIGURE_TEXTS_MIME]["texts"]
        assert {"每步耗时", "batch", "实测"} <= set(texts)
        assert i18n.FIGURE_TEXTS_MIME not in shell.display_formatter.format([1, 2])[0]
        plt.close(fig)
    finally:
        InteractiveShell.clear_instance()


def test_reads_markdown_and_plain_results():
    assert flagged(shown({"text/markdown": "| 术语 | what it means in the course |"}))
    assert flagged(shown({"text/plain": "'what the checker said to you'"}))


def test_reads_an_error_message():
    cell = new_code_cell("...")
    cell.outputs = [
        new_output("error", ename="ValueError", evalue="rows must not be empty", traceback=[])
    ]
    assert flagged(new_notebook(cells=[cell])) == ["rows must not be empty"]


def test_reads_what_a_widget_shows():
    cell = new_code_cell("...")
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    cell.outputs = [
        new_output(
            "display_data",
            data={"application/vnd.jupyter.widget-view+json": view, "text/plain": "VBox()"},
        )
    ]
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_l"]}},
        "s": {"model_name": "IntSliderModel", "state": {"description": "number of requests"}},
        "l": {
            "model_name": "HTMLModel",
            "state": {"value": "<b>一步</b>的耗时", "description": ""},
        },
    }
    nb = new_notebook(cells=[cell])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    assert [(f.kind, f.text) for f in find_english_prose(nb)] == [("widget", "number of requests")]
    nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]["s"]["state"][
        "description"
    ] = "请求数"
    assert flagged(nb) == []


def test_a_widget_without_saved_state_is_not_read_as_its_python_repr():
    cell = new_code_cell("...")
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    repr_ = "VBox(children=(Text(value='My favourite fruit is the', description='prompt'),))"
    cell.outputs = [
        new_output(
            "display_data",
            data={"application/vnd.jupyter.widget-view+json": view, "text/plain": repr_},
        )
    ]
    assert flagged(new_notebook(cells=[cell])) == []
    # a plain display beside no widget is read
    cell.outputs = [new_output("display_data", data={"text/plain": "My favourite fruit is the"})]
    assert flagged(new_notebook(cells=[cell]))


def test_the_model_s_own_text_is_not_read_in_a_tagged_cell():
    line = "A GPU is a specialized hardware component used to perform calculations."
    assert flagged(printed(line))
    assert flagged(printed(line, tags=["model-output"])) == []
    # its displays still are
    assert flagged(shown({"text/plain": "the table of results"}, tags=["model-output"]))


def test_text_in_formulas_must_be_chinese():
    nb = new_notebook(
        cells=[
            new_markdown_cell(r"$$\text{bytes per token} = 2 \times \text{层数}$$"),
            new_markdown_cell(r"$W_\text{gate}$，$\text{prompt} + i$，$47\ \text{ms}$"),
            new_markdown_cell(r"$\text{num\_kv\_heads} \times \texttt{head\_dim}$"),
            new_markdown_cell(r"$\mathrm{softmax}(QK^\top + \text{causal mask})$"),
        ]
    )
    found = find_english_prose(nb)
    assert [(f.cell, f.kind, f.text, f.line) for f in found] == [
        (0, "\\text{}", "bytes per", "\\text{bytes per token}"),
        (3, "\\text{}", "causal mask", "\\text{causal mask}"),  # 因果掩码 in Chinese text
    ]


def test_each_finding_prints_its_cell_kind_and_words():
    nb = new_notebook(cells=[new_markdown_cell("# 标题"), printed("so the ranks differ").cells[0]])
    [finding] = find_english_prose(nb)
    assert (finding.cell, finding.kind) == (1, "stream")
    assert str(finding) == "cell 1 stream: 'so the ranks differ'"


def test_reads_a_notebook_as_plain_json_too():
    nb = json.loads(json.dumps(printed("the ranks differ by up to")))
    assert flagged(nb) == ["the ranks differ by up to"]


def test_the_command_line_prints_the_findings(tmp_path, capsys):
    import nbformat

    bad, good = tmp_path / "bad.ipynb", tmp_path / "good.ipynb"
    nbformat.write(printed("the ranks' outputs differ by up to"), bad)
    nbformat.write(printed("各 rank 的输出最多相差 0.0003"), good)
    assert main([str(good)]) == 0
    assert "good.ipynb: 0 runs" in capsys.readouterr().out
    assert main([str(bad), str(good)]) == 1
    out = capsys.readouterr().out
    assert "bad.ipynb cell 0 stream: \"the ranks' outputs differ by up to\"" in out


def test_vllms_quoted_source_is_shown_as_code_in_a_notebook(monkeypatch, capsys):
    """The optional vLLM section quotes vLLM's own files, docstrings and all: in a notebook they
    are displayed as a code block, which the check does not read, and printed elsewhere."""
    import IPython
    import IPython.display

    from llmlab.tools import vllm_bridge

    # the first lines of a file: cut inside a docstring, so they do not parse as Python
    source = 'class BlockPool:\n    """This class organizes a list of blocks in eviction order.\n'
    vllm_bridge._show_code(source)  # no IPython shell here: printed
    assert capsys.readouterr().out == source + "\n"
    shown_data = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda d, raw: shown_data.append(d))
    vllm_bridge._show_code(source)
    [data] = shown_data
    assert data["text/plain"] == source and "<code>" in data["text/html"]
    assert flagged(shown(data)) == []
    assert flagged(printed(source)) != []  # printed, the same lines would be read as prose


def test_loading_the_reference_model_prints_nothing(capfd):
    # transformers draws an English "Loading weights" bar; chapter 11 loads the reference in a cell
    from transformers.utils import logging as hf_logging

    from llmlab.model.weights import load_hf_model

    shown = hf_logging.is_progress_bar_enabled()
    model = load_hf_model("smollm2-135m")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert hf_logging.is_progress_bar_enabled() == shown  # the setting is put back
    assert not model.training
