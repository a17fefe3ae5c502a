"""The batch-1 decode profile splits each step into parts that do not overlap, and leaves the
model as it found it."""

from __future__ import annotations

import pytest
import torch

from llmlab.bench import decode_profile
from llmlab.bench.llamacpp import build_workload, load_model


def test_parts_are_disjoint_and_cover_the_step():
    model, tokenizer = load_model("tiny")
    prompt = build_workload(tokenizer, 1, 32)[0]
    before = {name: vars(m).get("forward") for name, m in model.named_modules()}
    prof = decode_profile.profile_decode(model, prompt, 6)
    assert prof["decode_steps"] == 5 and prof["attention_backend"] == "cpu"
    for step in prof["steps"]:
        for part in decode_profile.PARTS:
            assert part == "rest" or step[part] > 0, f"{part} was not timed"
        # a part counted twice (one wrapped call inside another) would make the rest negative
        assert step["rest"] >= 0
        assert sum(step[p] for p in decode_profile.PARTS) == pytest.approx(step["total"])
    assert prof["num_layers"] == model.config.num_hidden_layers
    # the fused C layers split by phase: every phase timed, and inside the layers' time
    from llmlab.ops.cpu_decode import LAYER_PHASES

    assert list(prof["layer_phases_ms"]) == list(LAYER_PHASES)
    for step in prof["steps"]:
        phases = [step[f"layer: {name}"] for name in LAYER_PHASES]
        assert min(phases) >= 0 and step["layer: norm + qkv"] > 0 and step["layer: down_proj"] > 0
        assert sum(phases) <= step["layers"]
    assert prof["lm_head_weight_bytes"] == model.config.vocab_size * model.config.hidden_size * 4
    # the timers are gone: the shared embedding and norm modules carry no wrapper
    assert {name: vars(m).get("forward") for name, m in model.named_modules()} == before


def test_main_writes_the_table_and_json(bench_report, capsys):
    args = [
        "--model",
        "tiny",
        "--prompt-len",
        "24",
        "--gen-len",
        "4",
        "--rounds",
        "2",
    ]
    report = bench_report(decode_profile.main, args)
    assert report["omp"]["wake_us_per_region"] >= 0
    # the floors come from the bandwidth read beside the fastest round
    totals, reads = report["rounds_total_ms"], report["rounds_read_bandwidth"]
    assert len(totals) == len(reads) == 2 and min(reads) > 0
    assert report["machine"]["read_bandwidth"] == reads[totals.index(min(totals))]
    assert report["floors_ms"]["lm_head"] > 0
    assert "lm_head" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--gen-len must be >= 3"):
        decode_profile.main(["--model", "tiny", "--gen-len", "2"])


def test_each_round_is_held_against_the_bandwidth_read_just_before_and_after_it():
    events = []
    reads = iter([40e9, 50e9, 90e9, 80e9, 45e9, 41e9])

    def roof():
        events.append("read")
        return next(reads)

    def run_round():
        events.append("round")
        return {"ms_per_step": {"total": 10.0}}

    rounds = decode_profile.paired_rounds(run_round, 3, roof)
    assert events == ["read", "round", "read"] * 3
    assert [r["read_bandwidth"] for r in rounds] == [50e9, 90e9, 45e9]


def test_a_part_under_its_floor_is_reported_as_a_changed_bandwidth(capsys):
    from llmlab.bench.decode_profile_table import PARTS, print_table

    ms = {part: 0.1 for part in PARTS} | {"layers": 8.0, "lm_head": 1.5, "total": 10.1}
    report = {
        "machine": {
            "cpu": "test CPU",
            "threads": 2,
            "read_bandwidth": 50e9,
            "omp_wait_policy": None,
            "gomp_spincount": None,
        },
        "settings": {"model": "smollm2-135m"},
        "profile": {"ms_per_step": ms, "decode_steps": 127, "attention_backend": "cpu"},
        "rounds_total_ms": [10.1],
        "rounds_read_bandwidth": [50e9],
        "omp": {"all_threads_us": 4.0, "one_thread_us": 3.0, "wake_us_per_region": 1.0},
        "floors_ms": {"layers": 7.0, "lm_head": 2.0},
    }
    print_table(report)
    out = capsys.readouterr().out
    assert "10.1 ms at 50.0 GB/s" in out
    assert "note: lm_head ran faster" in out and "layers ran" not in out
    report["floors_ms"]["lm_head"] = 1.0
    print_table(report)
    assert "note:" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "settings, bytes_per_weight", [({"dtype": "bfloat16"}, 2), ({"quantization": "int8"}, 1)]
)
def test_the_floor_follows_the_bytes_of_the_weights_in_use(settings, bytes_per_weight):
    model, tokenizer = load_model("tiny")
    prompt = build_workload(tokenizer, 1, 32)[0]
    f32 = decode_profile.profile_decode(model, prompt, 4)
    low = decode_profile.profile_decode(model, prompt, 4, **settings)
    cfg = model.config
    assert low["lm_head_weight_bytes"] == cfg.vocab_size * cfg.hidden_size * bytes_per_weight
    # the layers' matrices shrink by that factor (norms and int8 scales stay float32)
    assert low["layer_weight_bytes"] < f32["layer_weight_bytes"] * (bytes_per_weight / 4) * 1.1
    assert str(bytes_per_weight == 2 and "bfloat16" or "int8") in low["precision"]


def test_gpu_options_are_refused_on_a_machine_without_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device='cuda': there is no CUDA GPU here"):
        decode_profile.main(["--device", "cuda", "--shape", "smollm2-1.7b"])
    with pytest.raises(ValueError, match="--batch and --graphs profile a GPU"):
        decode_profile.main(["--device", "cpu", "--model", "tiny", "--batch", "64"])
