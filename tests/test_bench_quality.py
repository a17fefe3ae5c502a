"""`bench quality`: float32 is its own reference (100 % agreement), every precision gets a
perplexity from the engine's prompt logprobs, and the table and JSON come out."""

from __future__ import annotations

import math

import pytest

from llmlab.bench import prefix_agreement, quality


def test_prefix_agreement_stops_at_the_first_difference():
    assert prefix_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert prefix_agreement([1, 2], [1, 2]) == 2


def test_main_on_the_tiny_model(bench_report, capsys):
    args = [
        "--model",
        "tiny",
        "--precisions",
        "float32,bfloat16,fp8-kv",
        "--text-tokens",
        "48",
        "--prompts",
        "2",
        "--gen-len",
        "4",
    ]
    rows = bench_report(quality.main, args)["rows"]
    assert rows["float32"]["top1_agreement"] == 1.0 == rows["float32"]["greedy_agreement"]
    for r in rows.values():
        assert math.isfinite(r["perplexity"]) and r["perplexity"] > 1
    assert rows["bfloat16"]["weight_bytes"] < rows["float32"]["weight_bytes"]
    assert "perplexity" in capsys.readouterr().out


def test_precisions_must_start_with_the_reference():
    with pytest.raises(ValueError, match="--precisions"):
        quality.main(["--model", "tiny", "--precisions", "bfloat16"])
