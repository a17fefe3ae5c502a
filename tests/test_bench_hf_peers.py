"""transformers as the throughput benchmark's peer: it holds llmlab's very tensors, and its
continuous batching API is named where the installed version has it."""

from __future__ import annotations

import torch

from llmlab.bench import hf_peers


def test_transformers_holds_our_very_tensors():
    from llmlab.config import tiny_config
    from llmlab.model import random_model

    model = random_model(tiny_config(), seed=0, dtype=torch.bfloat16)
    hf = hf_peers.hf_twin(model)
    ours = model.layers[0].self_attn.q_proj.weight
    assert hf.model.layers[0].self_attn.q_proj.weight.data_ptr() == ours.data_ptr()
    assert hf.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    assert hf.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert hf.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE's table stays float32
    assert torch.get_default_dtype() == torch.float32  # put back


def test_transformers_continuous_batching_is_named_or_found_missing():
    import transformers

    from llmlab.model import tiny_model

    hf = hf_peers.hf_twin(tiny_model(seed=0))
    api = hf_peers.hf_continuous_api(hf)
    assert api.startswith(f"transformers {transformers.__version__}: ")
    assert "continuous_batching_context_manager" in api
    older = torch.nn.Module()  # a model of a transformers version without the manager
    assert hf_peers.hf_continuous_api(older) is None
