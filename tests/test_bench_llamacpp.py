"""The llmlab-vs-llama.cpp bench: the same prompts to both, and the missing extra skipped with its
install command while llmlab is still measured."""

from __future__ import annotations

import sys

import pytest

from llmlab.bench import llamacpp

TINY = [
    "--model",
    "tiny",
    "--prompt-len",
    "24",
    "--gen-len",
    "5",
    "--rounds",
    "1",
    "--threads",
    "1",
]


def test_workload_is_exact_length_distinct_and_repeatable():
    _, tokenizer = llamacpp.load_model("tiny")
    work = llamacpp.build_workload(tokenizer, 40, 48)
    assert len(work) == 40 and all(len(ids) == 48 for ids in work)
    assert len({tuple(ids[:16]) for ids in work}) == 40, "two prompts share a first block"
    assert llamacpp.build_workload(tokenizer, 40, 48) == work
    assert llamacpp.build_workload(tokenizer, 40, 48, seed=1) != work
    assert llamacpp.build_workload(tokenizer, 8, 48) == work[:8], "a smaller batch is a prefix"


def test_workload_rejects_what_it_cannot_build():
    _, tokenizer = llamacpp.load_model("tiny")
    with pytest.raises(ValueError, match="prompt_len"):
        llamacpp.build_workload(tokenizer, 4, 8)
    with pytest.raises(ValueError, match="prompt_len=1000000"):
        llamacpp.build_workload(tokenizer, 1, 1_000_000)


@pytest.mark.model
def test_real_prompts_end_where_the_assistant_takes_over():
    from transformers import AutoTokenizer

    from llmlab.model.weights import model_dir

    tokenizer = AutoTokenizer.from_pretrained(model_dir("smollm2-135m"))
    hand_over = tokenizer.encode("<|im_start|>assistant\n")
    for ids in llamacpp.build_workload(tokenizer, 8, 128):
        assert len(ids) == 128 and ids[-len(hand_over) :] == hand_over


def test_missing_extra_is_skipped_with_the_install_command(monkeypatch, capsys, bench_report):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` fails
    assert llamacpp.import_llama_cpp() is None
    report = bench_report(llamacpp.main, TINY + ["--batches", "1,3"])
    printed = capsys.readouterr().out
    assert llamacpp.install_command() in printed and "skipped" in printed
    assert "not installed" in report["skipped"]["llama.cpp"]
    assert set(report["config"]) == {"llmlab"}
    assert report["config"]["llmlab"]["attention_backend"] == "cpu"  # what LLM() picks here
    for b in (1, 3):
        row = report["results"][str(b)]
        assert set(row) == {"llmlab"}, "no llama.cpp figures without llama.cpp"
        ours = row["llmlab"]
        # the whole batch's prompts are one step, so decode is the other gen_len - 1 steps
        assert ours["decode_tokens"] == b * 4
        assert ours["decode_tok_per_s"] == pytest.approx(b * 4 / ours["decode_seconds"])
        assert ours["total_tok_per_s"] == pytest.approx(
            b * (24 + 5) / (ours["prefill_seconds"] + ours["decode_seconds"])
        )


def test_both_systems_get_the_same_token_ids(monkeypatch, tmp_path, bench_report):
    seen: dict[str, list] = {"llmlab": [], "llama.cpp": []}
    real_run_llmlab = llamacpp.run_llmlab

    def recording_llmlab(model, prompts, gen_len, **engine_kwargs):
        seen["llmlab"].append([list(p) for p in prompts])
        return real_run_llmlab(model, prompts, gen_len, **engine_kwargs)

    class FakeLlamaCpp:
        def __init__(self, gguf, threads, kv_type="f32"):
            self.threads = threads

        def run(self, prompts, gen_len):
            seen["llama.cpp"].append([list(p) for p in prompts])
            return llamacpp.GreedyRun(
                tokens=[[0] * gen_len for _ in prompts],
                prefill_seconds=1.0,
                decode_seconds=1.0,
                decode_tokens=len(prompts) * (gen_len - 1),
                prompt_tokens=sum(map(len, prompts)),
                config={
                    "kv_cache_dtype": "f32",
                    "threads": self.threads,
                    "llama_cpp_python": "fake",
                },
            )

        def close(self):
            pass

    monkeypatch.setattr(llamacpp, "run_llmlab", recording_llmlab)
    monkeypatch.setattr(llamacpp, "llama_cpp_skip_reason", lambda name: None)
    monkeypatch.setattr(llamacpp, "gguf_of", lambda name, kind, threads: tmp_path / "fake.gguf")
    monkeypatch.setattr(llamacpp, "LlamaCpp", FakeLlamaCpp)
    report = bench_report(llamacpp.main, TINY + ["--batches", "2,4"])
    # warm-up, then batch 2 and batch 4: the same prompts, in the same order, to both
    assert [len(b) for b in seen["llmlab"]] == [1, 2, 4]
    assert seen["llmlab"] == seen["llama.cpp"]
    assert all(len(ids) == 24 for batch in seen["llmlab"] for ids in batch)
    row = report["results"]["4"]
    assert row["ratio_decode_tok_per_s"] == pytest.approx(
        row["llmlab"]["decode_tok_per_s"] / row["llama.cpp"]["decode_tok_per_s"]
    )


def test_bad_arguments_name_the_option():
    with pytest.raises(ValueError, match="--batches"):
        llamacpp.main(["--model", "tiny", "--batches", "0,8"])
    with pytest.raises(ValueError, match="--batches"):
        llamacpp.main(["--model", "tiny", "--batches", "one"])
    with pytest.raises(ValueError, match="--gen-len must be >= 2"):
        llamacpp.main(["--model", "tiny", "--gen-len", "1"])
    with pytest.raises(ValueError, match="--threads"):
        llamacpp.main(["--model", "tiny", "--threads", "0"])


def test_all_precisions_in_one_sitting_each_table_with_its_machine(
    monkeypatch, capsys, bench_report
):
    from pathlib import Path

    from llmlab.bench import llamacpp_report

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # llmlab alone
    report = bench_report(llamacpp.main, TINY + ["--all-precisions", "--batches", "2"])
    printed = capsys.readouterr().out
    assert list(report["precisions"]) == ["float32", "bfloat16", "int8"]
    flags = llamacpp_report.cpu_flags()
    assert set(flags) <= set(llamacpp_report.FLAGS)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # each flag reported exactly when the CPU lists it
        listed = {
            f
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("flags")
            for f in line.split(":", 1)[1].split()
        }
        assert flags == [f for f in llamacpp_report.FLAGS if f in listed]
    for precision, table in report["precisions"].items():
        assert table["settings"]["precision"] == precision
        assert table["machine"]["cpu_flags"] == flags and table["machine"]["cpu"]
        assert table["results"]["2"]["llmlab"]["decode_tokens"] == 2 * 4
        assert f"{precision}: {table['machine']['cpu']} ({' '.join(flags) or '-'})" in printed
    assert (
        report["precisions"]["int8"]["config"]["llmlab"]["dtype"]
        != (report["precisions"]["float32"]["config"]["llmlab"]["dtype"])
    )


def test_the_table_says_how_the_threads_waited_and_warns_when_llamacpp_slept():
    from llmlab.bench.llamacpp_report import openmp_line

    asleep = {"omp_wait_policy": "PASSIVE", "gomp_spincount": None}
    assert "sleep" in openmp_line(asleep, True) and "GOMP_SPINCOUNT=10000" in openmp_line(
        asleep, True
    )
    assert "GOMP_SPINCOUNT" not in openmp_line(asleep, False)  # llmlab alone: no comparison
    spinning = {"omp_wait_policy": None, "gomp_spincount": "10000"}
    assert openmp_line(spinning, True).startswith("OpenMP threads: spin 10000 rounds")
    assert "default" in openmp_line({"omp_wait_policy": None, "gomp_spincount": None}, True)
