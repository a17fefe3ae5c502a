"""The throughput benchmark's JSON on the tiny model: every system generates the same tokens."""

from __future__ import annotations

import json

import pytest
import torch

from llmlab.bench import throughput


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_every_system_generates_the_same_tokens(tmp_path, restore_threads):
    path = tmp_path / "bench.json"
    args = [
        "--model",
        "tiny",
        "--num-requests",
        "6",
        "--min-tokens",
        "3",
        "--max-tokens",
        "9",
        "--batch-size",
        "4",
        "--threads",
        "1",
        "--json",
        str(path),
    ]
    assert throughput.main(args) == 0
    report = json.loads(path.read_text())
    assert set(report["systems"]) == set(throughput.SYSTEMS)
    model, tokenizer, _ = throughput.load_models("tiny")
    work = throughput.build_workload(tokenizer, 6, 3, 9)
    expected = sum(n for _, n in work)
    assert expected > 6 * 3  # output lengths really vary
    for name, r in report["systems"].items():
        assert set(r) == {"requests", "output_tokens", "seconds", "tok_per_s"}, name
        assert r["requests"] == 6
        assert r["output_tokens"] == expected, name
        assert r["tok_per_s"] == pytest.approx(r["output_tokens"] / r["seconds"])
    assert report["machine"]["threads"] == 1 and report["machine"]["torch"] == torch.__version__
    overhead = report["llmlab_overhead"]
    assert overhead["steps"] >= 9 and overhead["schedule_us_per_step_per_request"] > 0
    assert 0 < overhead["replay_median_us_per_step_per_request"] < 1e4
    # llmlab runs the C kernels here (a C compiler is present); llmlab-torch the torch backend
    assert report["settings"]["llmlab"]["attention_backend"] == "cpu"
    bound = report["compute_bound"]
    assert bound["matmul_peak_flops"] > 1e9 and bound["max_tok_per_s_at_peak"] > 0


def test_bad_arguments_name_the_option():
    with pytest.raises(ValueError, match="--systems"):
        throughput.main(["--model", "tiny", "--systems", "sglang"])
    with pytest.raises(ValueError, match="--min-tokens"):
        throughput.main(["--model", "tiny", "--min-tokens", "9", "--max-tokens", "3"])
