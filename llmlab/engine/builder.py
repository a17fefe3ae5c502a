"""What an engine is built from, decided once when it is made: the model on its device, in its
dtype and quantization; the attention backend; the context length and the size of the KV pool
(vLLM settles the same in `vllm/engine/arg_utils.py` and `vllm/v1/core/kv_cache_utils.py`)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from llmlab import ops
from llmlab.config.engine import DEFAULT_MAX_MODEL_LEN, DTYPES, EngineConfig, resolve_device
from llmlab.model import LlamaModel
from llmlab.paths import DATA_DIR
from llmlab.utils import cdiv


def prepare_model(model: LlamaModel, config: EngineConfig) -> LlamaModel:
    """`model` on the config's device, in its dtype and quantization: `model` itself when
    nothing changes, else a converted copy (the caller's model is left as it was). On a GPU,
    dtype "auto" runs a float32 model in bfloat16 (what a GPU computes fast; SmolLM2's own
    weights are bfloat16)."""
    device = resolve_device(config.device, model.device)
    dtype = DTYPES[config.dtype]
    if dtype is None and device.type == "cuda" and model.dtype == torch.float32:
        dtype = torch.bfloat16
    if device != model.device or (dtype is not None and dtype != model.dtype):
        model = _copy_to(model, device, dtype or model.dtype)
    if config.quantization == "int8":
        from llmlab.model.quantization import quantize_model_int8

        model = quantize_model_int8(model)
    return model


def _copy_to(model: LlamaModel, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    """A copy of `model` on `device` in `dtype`, made without a second copy on the host when the
    device is another one (the layers are built on "meta" and take the converted weights)."""
    if device == model.device:
        return copy.deepcopy(model).to(dtype)
    with torch.device("meta"):
        moved = LlamaModel(model.config)
    state = {k: v.to(device=device, dtype=dtype) for k, v in model.state_dict().items()}
    moved.load_state_dict(state, assign=True)
    if model.config.tie_word_embeddings:
        moved.lm_head.weight = moved.embed_tokens.weight
    moved.inv_freq = model.inv_freq.to(device)
    return moved.eval()


def calibration_token_ids(model: LlamaModel, tokenizer: Any, max_tokens: int = 256) -> list[int]:
    """The tokens an fp8 cache's scales are measured on: the start of data/text/inference_en.txt
    (with a tokenizer), else a fixed pseudo-random sequence."""
    if tokenizer is not None:
        text = DATA_DIR / "text" / "inference_en.txt"
        return list(tokenizer.encode(text.read_text()))[:max_tokens]
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (max_tokens,), generator=g).tolist()


def resolve_attention_backend(name: str | None, model: LlamaModel) -> str:
    """The backend an engine on `model` runs: `name`, checked to run here, or for None the
    fastest one that does. Only "cpu" compiles anything (its C kernels)."""
    if name is None:
        if model.device.type == "cuda":
            return "triton" if ops.backend_available("triton")[0] else "torch"
        from llmlab.model.cpu import cpu_model_applies

        return "cpu" if cpu_model_applies(model)[0] else "torch"
    ok, why = ops.backend_available(name)
    if ok and name == "cpu":
        from llmlab.model.cpu import cpu_model_applies

        ok, why = cpu_model_applies(model)
    if not ok:
        raise ValueError(f"attention_backend {name!r} cannot run here: {why}")
    return name


def kv_bytes_per_block(
    model: LlamaModel, block_size: int, kv_dtype: torch.dtype | None = None
) -> int:
    """Bytes of one block of K and V over all layers (in `kv_dtype`, default the model's)."""
    cfg = model.config
    elem = torch.empty((), dtype=kv_dtype or model.dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


def max_model_len_of(config: EngineConfig, model: LlamaModel) -> int:
    """The longest prompt + output: the config's, or the model's positions capped at
    `DEFAULT_MAX_MODEL_LEN`. ValueError naming the setting that does not fit."""
    positions = model.config.max_position_embeddings
    if config.max_model_len is None:
        max_len = min(positions, DEFAULT_MAX_MODEL_LEN)
    elif config.max_model_len > positions:
        raise ValueError(
            f"max_model_len must be <= the model's max_position_embeddings={positions}, "
            f"got {config.max_model_len}"
        )
    else:
        max_len = config.max_model_len
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_len:
        raise ValueError(
            f"max_num_batched_tokens must be >= max_model_len={max_len} when "
            f"enable_chunked_prefill is False (a whole prompt must fit in one step), got "
            f"{config.max_num_batched_tokens}"
        )
    return max_len


def num_kv_blocks_of(config: EngineConfig, model: LlamaModel, max_model_len: int) -> int:
    """The KV pool's blocks: the config's, or enough for max_num_seqs requests of max_model_len
    capped by the memory budget. ValueError when it cannot hold one request of max_model_len."""
    bs = config.block_size
    blocks_per_seq = cdiv(max_model_len, bs)
    if config.num_kv_blocks is None:
        wanted = config.max_num_seqs * blocks_per_seq
        per_block = kv_bytes_per_block(model, bs, config.torch_kv_cache_dtype)
        num_blocks = max(min(wanted, config.kv_cache_memory_bytes // per_block), blocks_per_seq)
    else:
        num_blocks = config.num_kv_blocks
    if num_blocks < blocks_per_seq:
        raise ValueError(
            f"num_kv_blocks={num_blocks} cannot hold even one request of "
            f"max_model_len={max_model_len} (needs {blocks_per_seq} blocks of "
            f"{bs} tokens); raise num_kv_blocks or lower max_model_len"
        )
    return num_blocks


def eos_token_ids(config_eos: int | list[int] | None, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a request: the model config's EOS ids and the tokenizer's."""
    ids: set[int] = set()
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(config_eos)
    tok_eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if isinstance(tok_eos, int):
        ids.add(tok_eos)
    return frozenset(ids)
