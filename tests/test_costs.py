"""llmlab.analysis.costs: the seed's numbers reproduced, parameter counts of real configs, FLOPs/bytes laws."""

from __future__ import annotations

import pytest

from llmlab.analysis import costs
from llmlab.config import PRESETS, get_config, tiny_config


def test_head_size_from_hidden_and_heads_is_128():
    assert costs.head_size(4096, 32) == 128
    assert get_config("llama-3-8b").head_dim == costs.head_size(4096, 32)
    with pytest.raises(ValueError, match="divisible"):
        costs.head_size(4096, 30)


def test_llama3_70b_kv_numbers_of_the_seed():
    cfg = get_config("llama-3-70b")
    assert costs.kv_bytes_per_token_per_layer(cfg, 2) == 4_096
    assert costs.kv_bytes_per_token(cfg, 2) == 327_680
    request = costs.kv_bytes(cfg, 4096, 2)
    assert request == 1_342_177_280
    assert round(request / 1e9, 2) == 1.34
    assert request / 2**30 == 1.25
    wrong = costs.kv_bytes_per_token_from_hidden(cfg, 2) * 4096
    assert round(wrong / 1e9, 1) == 10.7
    assert wrong / request == 8  # 64 query heads / 8 KV heads


def test_llama3_8b_kv_per_token_and_gqa_quarter():
    cfg = get_config("llama-3-8b")
    assert costs.kv_bytes_per_token(cfg, 2) == 131_072
    v = costs.kv_variants(cfg, 2)
    assert v["GQA"] * 4 == v["MHA"]  # 8 KV heads for 32 query heads: 1/4
    assert v["MQA"] * 32 == v["MHA"]


def test_param_counts_of_llama_3_1_presets():
    assert costs.param_count(get_config("llama-3.1-8b")) == 8_030_261_248
    assert costs.param_count(get_config("llama-3.1-70b")) == 70_553_706_496


def test_param_count_of_tied_model_counts_the_shared_matrix_once():
    tied, untied = tiny_config(tie_word_embeddings=True), tiny_config(tie_word_embeddings=False)
    assert costs.param_count(untied) - costs.param_count(tied) == 512 * 64


def test_param_count_matches_a_torch_model_of_the_same_shape():
    from llmlab.model import LlamaModel

    for cfg in (tiny_config(), tiny_config(tie_word_embeddings=False, num_key_value_heads=1)):
        model = LlamaModel(cfg)
        unique = {id(p): p.numel() for p in model.parameters()}
        assert costs.param_count(cfg) == sum(unique.values())


@pytest.mark.model
def test_param_count_of_smollm2_equals_the_loaded_model(real_model):
    model, _ = real_model
    unique = {id(p): p.numel() for p in model.parameters()}
    assert costs.param_count(model.config) == sum(unique.values())
    assert costs.param_count(get_config("smollm2-135m")) == sum(unique.values())


def test_deepseek_v3_mla_kv_and_moe_parameters():
    cfg = get_config("deepseek-v3")
    assert costs.is_mla(cfg)
    # (kv_lora_rank 512 + qk_rope_head_dim 64) numbers per layer, BF16, 61 layers
    assert costs.kv_bytes_per_token_per_layer(cfg, 2) == (512 + 64) * 2
    assert costs.kv_bytes_per_token(cfg, 2) == (512 + 64) * 2 * 61
    v = costs.kv_variants(cfg, 2)
    assert set(v) == {"MHA", "MQA", "MLA"} and v["MLA"] < v["MHA"] / 50
    # DeepSeek-V3's published size: 671B parameters in total, 37B active per token
    assert abs(costs.param_count(cfg) / 671e9 - 1) < 0.002
    assert abs(costs.active_param_count(cfg) / 37e9 - 1) < 0.03


def test_kv_variants_of_gqa_model_order():
    v = costs.kv_variants(get_config("llama-3-70b"), 2)
    assert v["MHA"] > v["GQA"] > v["MQA"]
    assert v["GQA"] == costs.kv_bytes_per_token(get_config("llama-3-70b"), 2)


def test_decode_flops_are_about_twice_the_parameters_at_short_context():
    cfg = get_config("llama-3-70b")
    f = costs.flops_per_token(cfg, 1, "decode")
    assert 0.97 < f / (2 * costs.param_count(cfg)) < 1.0  # the embedding lookup is free


def test_attention_flops_grow_linearly_with_context():
    cfg = get_config("llama-3-8b")
    f1, f2, f3 = (costs.flops_per_token(cfg, c, "decode") for c in (1000, 2000, 3000))
    assert f3 - f2 == pytest.approx(f2 - f1)
    # per extra key: QKᵀ and weights·V, 2·d FLOPs each, for every head of every layer
    assert f2 - f1 == pytest.approx(1000 * 4 * 32 * 32 * 128)


def test_prefill_flops_are_the_sum_of_per_position_decode_flops():
    cfg = tiny_config()
    n = 17
    by_position = sum(costs.flops_per_token(cfg, i, "decode") for i in range(1, n + 1))
    assert costs.prefill_flops(cfg, n) == pytest.approx(by_position)
    assert costs.prefill_flops(cfg, n) == pytest.approx(
        n * costs.flops_per_token(cfg, n, "prefill")
    )


def test_matmul_flops_count_every_linear_of_a_real_forward():
    """2 FLOPs per weight of every nn.Linear one token passes through (lm_head included)."""
    from torch import nn

    from llmlab.model import LlamaModel

    cfg = tiny_config()
    model = LlamaModel(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert costs.matmul_params_per_token(cfg) == linear


def test_decode_bytes_read_weights_once_and_kv_per_sequence():
    cfg = get_config("llama-3-8b")
    w = costs.weight_bytes(cfg, 2)
    one = costs.decode_bytes_per_step(cfg, 1, 4096, 2)
    many = costs.decode_bytes_per_step(cfg, 32, 4096, 2)
    assert one == w + costs.kv_bytes(cfg, 4096, 2)
    assert many - one == 31 * costs.kv_bytes(cfg, 4096, 2)


def test_every_preset_has_positive_costs():
    for name, cfg in PRESETS.items():
        assert costs.param_count(cfg) > 0, name
        assert costs.kv_bytes_per_token(cfg) > 0, name
        assert costs.flops_per_token(cfg, 128, "prefill") < costs.flops_per_token(
            cfg, 128, "decode"
        )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c: costs.flops_per_token(c, 10, "train"), "phase"),
        (lambda c: costs.flops_per_token(c, 0), "context"),
        (lambda c: costs.kv_bytes(c, -1), "num_tokens"),
        (lambda c: costs.kv_bytes_per_token(c, 0), "dtype_bytes"),
        (lambda c: costs.decode_bytes_per_step(c, 0, 10), "batch"),
        (lambda c: costs.prefill_flops(c, 0), "prompt_len"),
        (lambda c: costs.dtype_bytes_of("fp7"), "dtype"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(call, match):
    with pytest.raises(ValueError, match=match):
        call(tiny_config())


def test_dtype_names_map_to_bytes():
    assert costs.dtype_bytes_of("bf16") == 2 and costs.dtype_bytes_of("fp8") == 1
    assert costs.dtype_bytes_of("float32") == 4 and costs.dtype_bytes_of(2) == 2


def test_step_costs_of_a_decode_batch_add_up_to_decode_flops_and_bytes():
    cfg = get_config("llama-3-8b")
    ops = costs.step_costs(cfg, [(1, 2048)] * 16, 2)
    assert list(ops) == list(costs.STEP_OPS)
    assert sum(f for f, _ in ops.values()) == costs.decode_flops(cfg, 16, 2048)
    weights = costs.matmul_params_per_token(cfg) * 2  # each read once, whatever the batch
    linear = sum(
        ops[op][1] for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
    )
    assert linear == weights
    assert ops["attention"][1] == 16 * costs.kv_bytes(cfg, 2048, 2)  # kv_heads, not query heads


def test_step_costs_of_a_prompt_match_prefill_with_last_token_logits():
    cfg = get_config("smollm2-135m")
    ops = costs.step_costs(cfg, [(300, 300)], 4)
    total = sum(f for f, _ in ops.values())
    assert total == pytest.approx(roofline_prefill_flops(cfg, 300), rel=1e-12)
    assert ops["lm_head"][0] == 2 * cfg.hidden_size * cfg.vocab_size  # one sampled row
    cached = costs.step_costs(cfg, [(100, 300)], 4)  # the last 100 tokens after 200 cached
    assert (
        cached["attention"][0] < ops["attention"][0]
        and cached["attention"][1] == ops["attention"][1]
    )


def roofline_prefill_flops(cfg, n):
    from llmlab.analysis import roofline

    return roofline.prefill_step(cfg, n, 1, 4, last_token_logits=True).flops


@pytest.mark.parametrize(
    "batch, match",
    [
        ([], "non-empty"),
        ([(0, 3)], "1 <= new_tokens"),
        ([(4, 3)], "1 <= new_tokens"),
        ([(1,)], "pairs"),
    ],
)
def test_step_costs_refuse_bad_batches_and_mla(batch, match):
    with pytest.raises(ValueError, match=match):
        costs.step_costs(get_config("llama-3-8b"), batch)
    with pytest.raises(ValueError, match="dense GQA"):
        costs.step_costs(get_config("deepseek-v3"), [(1, 1)])
