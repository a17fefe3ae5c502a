"""Chapter 03's figures draw the values they are given; the timing harness times a forward; the
GPU floors come from the presets."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from llmlab.course.figures import ch03  # noqa: E402


def test_naive_step_times_plots_the_values_in_ms():
    fig = ch03.naive_step_times([16, 64], [0.1, 0.3], [20, 21], [0.12, 0.13], [1e-4, 2e-4])
    ax = fig.axes[0]
    cpu, steps, gpu = ax.get_lines()
    assert list(cpu.get_xdata()) == [16, 64] and list(cpu.get_ydata()) == pytest.approx([100, 300])
    assert list(steps.get_ydata()) == pytest.approx([120, 130])
    assert list(gpu.get_ydata()) == pytest.approx([0.1, 0.2])
    assert ax.get_yscale() == "log" and "ms" in ax.get_ylabel() and ax.get_legend() is not None
    plt.close(fig)


def test_gpu_floors_hardly_grow_while_memory_bound():
    from llmlab.config import get_config

    cfg = get_config("smollm2-135m")
    short, mid, long = ch03.gpu_forward_floors(cfg, [16, 256, 4096])
    assert mid < 1.2 * short < long


def test_forward_seconds_times_one_forward_over_the_prefix():
    seen = []

    class Fake:
        def logits_for(self, ids):
            seen.append(len(ids))
            return torch.zeros(len(ids), 3)

    assert ch03.forward_seconds(Fake(), list(range(10)), 4, repeats=3) >= 0
    assert seen == [4, 4, 4]
    with pytest.raises(ValueError, match="n_tokens"):
        ch03.forward_seconds(Fake(), [1, 2], 3)


def test_sampling_settings_draws_one_panel_per_setting():
    from llmlab.tokenizer import train_bpe

    tok = train_bpe("the cat sat on the mat " * 20, 270)
    logits = torch.linspace(-2, 2, tok.vocab_size)
    fig = ch03.sampling_settings(
        logits,
        tok,
        [dict(temperature=1.0), dict(temperature=1.0, top_k=3), dict(temperature=0.5)],
        "the cat",
        top_n=5,
    )
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == 3
    assert "3 token(s)" in panels[1].get_title()
    plt.close(fig)
