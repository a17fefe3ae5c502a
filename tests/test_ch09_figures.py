"""Chapter 09's figures draw exactly the values they are given (and the ring model's)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from llmlab.analysis import parallel_cost
from llmlab.course.figures import ch09


def test_dp_replicas_draws_one_line_per_replica_count():
    rows = [
        {
            "arrivals/s": r,
            "replicas": n,
            "tokens/s": 100.0 * r * n,
            "mean latency s": 1.0 / n + r / 100,
        }
        for r in (20, 10)
        for n in (1, 2)
    ]
    fig = ch09.dp_replicas(rows)
    tput, lat = fig.axes[:2]
    one, two = tput.get_lines()
    assert list(one.get_xdata()) == [10, 20]  # sorted by arrival rate
    assert list(one.get_ydata()) == [1000.0, 2000.0] and list(two.get_ydata()) == [2000.0, 4000.0]
    assert list(lat.get_lines()[1].get_ydata()) == pytest.approx([0.6, 0.7])
    assert [t.get_text() for t in tput.get_legend().get_texts()] == ["1 replica", "2 replicas"]
    with pytest.raises(ValueError):
        ch09.dp_replicas([])


def test_allreduce_bars_are_measured_and_ring_model():
    nbytes = 6 * 576 * 4
    fig = ch09.allreduce_cpu_vs_gpu(2.5e-3, nbytes, world_size=2)
    heights = [p.get_height() for p in fig.axes[0].patches]
    nv = parallel_cost.ring_all_reduce_time(nbytes, 2, parallel_cost.get_interconnect("nvlink"))
    pcie = parallel_cost.ring_all_reduce_time(nbytes, 2, parallel_cost.get_interconnect("pcie"))
    assert heights == pytest.approx([2500.0, nv * 1e6, pcie * 1e6])
    assert fig.axes[0].get_yscale() == "log"
    assert ch09.allreduce_times(nbytes, 2) == pytest.approx({"nvlink": nv, "pcie": pcie})
    with pytest.raises(ValueError, match="measured_s"):
        ch09.allreduce_cpu_vs_gpu(0.0, nbytes)
