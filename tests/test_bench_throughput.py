"""The throughput benchmark's JSON on the tiny model: every system generates the same tokens."""

from __future__ import annotations

import pytest
import torch

from llmlab.bench import throughput


@pytest.mark.slow
def test_every_system_generates_the_same_tokens(bench_report):
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
    ]
    report = bench_report(throughput.main, args)
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


def test_random_weights_run_on_the_cpu_and_print_ratios(bench_report, capsys):
    """`--shape` with no model file and no tokenizer: random weights, random prompt ids with
    the workload's lengths, every system the same output tokens, the ratios printed."""
    args = ["--device", "cpu", "--shape", "tiny", "--fast", "--num-requests", "6"]
    args += ["--systems", "hf-static,llmlab", "--threads", "1"]
    report = bench_report(throughput.main, args)
    work = throughput.random_workload(512, 6, 8, 32)  # the tiny shape's vocabulary
    assert report["settings"]["num_requests"] == 6
    lengths = [len(p) for p, _ in work]
    assert report["settings"]["prompt_tokens"] == [min(lengths), max(lengths)]
    assert report["settings"]["model"] == "random weights, shape tiny"
    for name in ("hf-static", "llmlab"):
        assert report["systems"][name]["output_tokens"] == sum(n for _, n in work), name
    printed = capsys.readouterr().out
    assert "vs hf-static" in printed and "machine: " in printed
    ratio = report["systems"]["llmlab"]["tok_per_s"] / report["systems"]["hf-static"]["tok_per_s"]
    assert f"{ratio:.2f}x" in printed


def test_the_random_workload_keeps_lengths_repeats_and_the_shared_start():
    work = throughput.random_workload(49152, 64, 32, 128, seed=3)
    assert sorted({len(p) for p, _ in work}) == sorted(set(throughput.CHAT_PROMPT_TOKENS))
    assert all(32 <= n <= 128 for _, n in work)
    by_length: dict[int, list[int]] = {}
    for prompt, _ in work:
        assert (
            prompt[: throughput.CHAT_PREFIX_TOKENS] == work[0][0][: throughput.CHAT_PREFIX_TOKENS]
        )
        assert min(prompt) >= 3 and max(prompt) < 49152
        # the lengths 36-482 come from 30 prompts: a length seen twice with different ids is a
        # different prompt of the same length, so compare within repeats of the same start
        by_length.setdefault(len(prompt), []).append(tuple(prompt))
    assert any(len(set(v)) < len(v) for v in by_length.values()), "prompts never repeat"
    assert throughput.random_workload(49152, 64, 32, 128, seed=3) == work
    assert throughput.random_workload(49152, 64, 32, 128, seed=4) != work


@pytest.mark.model
def test_the_random_workload_has_the_real_workloads_lengths():
    """CHAT_PROMPT_TOKENS and CHAT_PREFIX_TOKENS are what SmolLM2's tokenizer makes of
    data/prompts.json, so a random-weight run serves requests of the real lengths."""
    from transformers import AutoTokenizer

    from llmlab.model.weights import model_dir

    tokenizer = AutoTokenizer.from_pretrained(model_dir("smollm2-135m"))
    real = throughput.build_workload(tokenizer, 256, 64, 192)
    fake = throughput.random_workload(49152, 256, 64, 192)
    assert [len(p) for p, _ in fake] == [len(p) for p, _ in real]
    assert [n for _, n in fake] == [n for _, n in real]
    starts = {tuple(p[: throughput.CHAT_PREFIX_TOKENS + 1]) for p, _ in real}
    assert len({s[:-1] for s in starts}) == 1 and len(starts) > 1  # shared exactly that far


def test_a_gpu_asked_for_where_there_is_none_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device='cuda': there is no CUDA GPU here"):
        throughput.main(["--device", "cuda", "--shape", "tiny"])
    with pytest.raises(ValueError, match="--device must be cpu, cuda or cuda:N"):
        throughput.main(["--device", "tpu"])
    with pytest.raises(ValueError, match="--shape: unknown 'smollm9'"):
        throughput.main(["--device", "cpu", "--shape", "smollm9"])
    with pytest.raises(ValueError, match="--model or --shape"):
        throughput.main(["--device", "cpu", "--shape", "tiny", "--model", "tiny"])
