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
        "1",
    ]
    report = bench_report(decode_profile.main, args)
    assert report["omp"]["wake_us_per_region"] >= 0
    assert report["floors_ms"]["lm_head"] > 0
    assert "lm_head" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--gen-len must be >= 3"):
        decode_profile.main(["--model", "tiny", "--gen-len", "2"])


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
