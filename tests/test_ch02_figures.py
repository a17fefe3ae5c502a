"""Chapter 02's figures draw what they are given, and the printed comparison with layer 0."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import torch

import llmlab.course.figures.ch02 as fig02
from llmlab.config import get_config
from llmlab.model import attention_probs, tiny_model


def test_gqa_grouping_fills_the_kv_head_of_each_query_head():
    fig = fig02.gqa_grouping(["smollm2-135m", "llama-3-8b"])
    for ax, name in zip(fig.axes, ["smollm2-135m", "llama-3-8b"]):
        c = get_config(name)
        grid = ax.images[0].get_array()
        assert grid.shape == (c.num_key_value_heads, c.num_attention_heads)
        for h in range(c.num_attention_heads):
            assert grid[h // c.num_queries_per_kv, h] == 1 and grid[:, h].sum() == 1


def test_attention_heatmaps_show_the_models_weights():
    model = tiny_model()
    ids = [1, 5, 9, 2, 7]
    fig = fig02.attention_heatmaps(model, ids, [str(i) for i in ids], layers=[0, 1], heads=[0, 1])
    assert len(fig.axes) == 4
    want = attention_probs(model, ids, layer=1)[1].numpy()
    np.testing.assert_allclose(np.asarray(fig.axes[3].images[0].get_array()), want, rtol=1e-6)


def test_rope_scores_depend_on_the_distance_and_the_bars_show_them():
    values = fig02.rope_score_values([(7, 3), (107, 103), (14, 6)], head_dim=16, theta=10000.0)
    assert abs(values[(7, 3)] - values[(107, 103)]) < 1e-4
    assert abs(values[(7, 3)] - values[(14, 6)]) > 1e-3
    fig = fig02.rope_scores(values)
    heights = [p.get_height() for p in fig.axes[0].patches]
    np.testing.assert_allclose(heights, list(values.values()))


def test_against_layer0_prints_the_largest_difference(capsys):
    x = torch.randn(3, 4)
    assert fig02.against_layer0("same", lambda a: a * 1, (x,), x) == 0.0
    assert "(the same)" in capsys.readouterr().out
    assert fig02.against_layer0("off", lambda a: a + 1, (x,), x) == 1.0
    assert "DIFFERENT" in capsys.readouterr().out
    assert fig02.against_layer0("none", None, (x,), x) is None
    assert "write the function" in capsys.readouterr().out
