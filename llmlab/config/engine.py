"""The engine's settings and their defaults, stated once: `EngineConfig` and the speculative
path's `SpeculativeConfig` (vLLM keeps these in `vllm/config/`).

This module sits below the engine: the `Scheduler` and the `KVCacheManager` take their defaults
from `EngineConfig`'s fields (`EngineConfig.block_size`, ...), so a default changed here changes
everywhere. It imports only torch, the ops' list of backends and `llmlab.utils`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from llmlab.ops import BACKENDS
from llmlab.utils import check_positive_int

SCHEDULING_POLICIES = ("continuous", "static")
METHODS = ("ngram", "draft_model")  # of speculative decoding
DEFAULT_MAX_MODEL_LEN = 4096
# the accepted values of EngineConfig's dtype settings and their torch dtypes (None: the model's)
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
QUANTIZATIONS = (None, "int8")
KV_CACHE_DTYPES = {"auto": None, "fp8": torch.float8_e4m3fn}
# the precisions the course and the benchmarks compare, by name: the EngineConfig settings that
# select each (float32 first: the reference the others are measured against)
PRECISIONS = {
    "float32": {},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "fp8-kv": {"kv_cache_dtype": "fp8"},
    "bf16+int8+fp8-kv": {"dtype": "bfloat16", "quantization": "int8", "kv_cache_dtype": "fp8"},
}
DEFAULT_KV_CACHE_BYTES = 1 << 30  # 1 GiB: the pool's size cap when num_kv_blocks is None


@dataclass(frozen=True)
class SpeculativeConfig:
    """How an engine speculates: what `LLM(..., speculative_config={...})` and
    `serve --speculative-config` accept, with vLLM's key names (`vllm/config/speculative.py`).

    method: "ngram" (prompt lookup, no model) or "draft_model" (the target truncated to its
    first `draft_num_layers` layers, sharing its embedding, final norm and LM head: a
    self-speculative, early-exit draft). num_speculative_tokens: k, tokens proposed per step
    and verified in one target forward over k + 1 positions. prompt_lookup_min /
    prompt_lookup_max: the shortest and longest n-gram the "ngram" method matches.
    draft_num_layers: layers of the "draft_model" draft (default: a quarter of the target's).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    draft_num_layers: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"speculative_config['method'] must be one of {METHODS}, got {self.method!r}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"speculative_config[{name!r}] must be an int >= 1, got {v!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config['prompt_lookup_min'] must be <= "
                f"prompt_lookup_max={self.prompt_lookup_max}, "
                f"got {self.prompt_lookup_min}"
            )
        v = self.draft_num_layers
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(
                f"speculative_config['draft_num_layers'] must be None or an int >= 1, got {v!r}"
            )

    @classmethod
    def from_value(cls, value: Any) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, or a dict of its fields (vLLM's form) → a config."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(
                f"speculative_config must be None or a dict such as "
                f'{{"method": "ngram", "num_speculative_tokens": 3}}, '
                f"got {type(value).__name__}"
            )
        allowed = tuple(f.name for f in fields(cls))
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; allowed: {allowed}")
        return cls(**value)


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings and their defaults (the one place they are stated), validated once;
    each error names the argument.

    block_size: tokens per KV block. num_kv_blocks: KV pool size (None: enough for max_num_seqs
    requests of max_model_len, capped at `kv_cache_memory_bytes`). max_model_len: longest
    prompt + output (None: min(model's max_position_embeddings, `DEFAULT_MAX_MODEL_LEN`)). max_num_seqs: most
    requests running at once. max_num_batched_tokens: most tokens per step.
    enable_chunked_prefill: split long prompts over steps. enable_prefix_caching: reuse cached
    blocks of shared prefixes. block_pool_cls: None (the package's `BlockPool`) or another block
    pool class with its interface, which the KV cache manager makes and runs on (chapter 11's
    build exercise plugs the student's pool in here; see `KVCacheManager`). attention_backend: None picks the fastest one here ("cpu", the C
    fast path, for a float32 or bfloat16 model on a CPU with a C compiler; "triton" on a GPU; else
    "torch"); by name: "torch" (the readable model, plain PyTorch), "triton", "cuda", "cpu".
    seed: the RNG of unseeded sampled requests. scheduling: "continuous" or "static" (chapter
    08's baseline). dtype: the weights' and activations' dtype, "auto" (the model's own),
    "float32" or "bfloat16" (vLLM's `--dtype`; the C fast path keeps activations in float32
    and reads bf16 weights). quantization: None or "int8" (weight-only, a float32 scale per
    output channel; vLLM's `--quantization`). kv_cache_dtype: "auto" (the model's dtype) or
    "fp8" (e4m3 with a per-layer k/v scale calibrated at start-up; vLLM's `--kv-cache-dtype`).
    speculative_config: None (no speculation) or vLLM's dict, e.g.
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
    "prompt_lookup_max": 4} or {"method": "draft_model", "num_speculative_tokens": 3,
    "draft_num_layers": 8} (see `SpeculativeConfig` above).
    scheduler_cls: the scheduler's class, None for the package's `Scheduler`: a subclass of it
    (e.g. one that overrides `schedule`, as the build exercises of chapters 08 and 11 do), or a
    class with its interface (`SCHEDULER_INTERFACE`), built as
    `scheduler_cls(kv_cache_manager, max_num_seqs=..., max_num_batched_tokens=...,
    max_model_len=..., enable_chunked_prefill=..., scheduling=...)`. Not with
    speculative_config (its scheduler is a subclass of its own).
    structured_outputs_backend: None (xgrammar, vLLM's default backend) or a callable that takes
    a request's `StructuredOutputsParams` and returns its matcher: an object with
    `accept_token(token_id) -> bool`, `fill_next_token_bitmask(bitmask, row)` and
    `is_terminated() -> bool`, as xgrammar's `GrammarMatcher` (chapter 15 plugs the student's
    hand-written mask in here through `llmlab.sampling.grammar.FunctionBackend`).
    device: where the model, the KV cache and every per-step tensor live: None (`LLM`: "cuda"
    when a CUDA GPU is present, else "cpu"; `LLMEngine`: the model's own device), "cpu",
    "cuda" or "cuda:N" (vLLM's `--device`). dtype "auto" on a GPU runs a float32 model in
    bfloat16. enforce_eager: never replay a CUDA graph (vLLM's name); on a GPU with the
    "triton" or "cuda" backend, decode-only steps otherwise replay a graph captured per batch
    size at start-up.
    num_scheduler_steps: forwards per scheduled step (vLLM V0's multi-step scheduling,
    `--num-scheduler-steps`). 1: the scheduler runs before every forward. K > 1: a step whose
    requests all decode, and whose sampling is the plain sampler's (no logprobs, penalties,
    logit bias or grammar, min_tokens reached), runs up to K forwards back to back, each fed
    the tokens the one before sampled; the scheduler, the step's inputs and its outputs then
    cost once per K tokens, and each delta output brings up to K tokens (a request that stops
    mid-way gets the tokens up to its stop; the K slots of each are reserved up front). Not
    with speculative_config, nor with a scheduler_cls that does not subclass `Scheduler`. On a
    GPU each step runs one forward (its inputs go through one staging buffer, and its decode
    steps replay CUDA graphs, which already take most of what a step costs the host).
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_pool_cls: type | None = None
    attention_backend: str | None = None
    seed: int = 0
    scheduling: str = "continuous"
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    speculative_config: dict | None = None
    scheduler_cls: type | None = None
    structured_outputs_backend: Any = None
    device: str | None = None
    enforce_eager: bool = False
    num_scheduler_steps: int = 1

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_memory_bytes",
            "num_scheduler_steps",
        ):
            check_positive_int(name, getattr(self, name))
        for name in ("num_kv_blocks", "max_model_len"):
            check_positive_int(name, getattr(self, name), allow_none=True)
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.block_pool_cls is not None and not isinstance(self.block_pool_cls, type):
            raise ValueError(
                f"block_pool_cls must be None or a block pool class (not an instance), "
                f"got {self.block_pool_cls!r}"
            )
        if self.attention_backend is not None and self.attention_backend not in BACKENDS:
            raise ValueError(
                f"attention_backend must be None (the fastest here) or one of "
                f"{BACKENDS}, got {self.attention_backend!r}"
            )
        if self.scheduling not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling must be one of {SCHEDULING_POLICIES}, got {self.scheduling!r}"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        SpeculativeConfig.from_value(self.speculative_config)  # raises naming the key
        check_scheduler_cls(self.scheduler_cls)
        if self.scheduler_cls is not None and self.speculative_config is not None:
            raise ValueError(
                "scheduler_cls cannot be combined with speculative_config (speculative decoding "
                "brings a scheduler of its own); give one or the other"
            )
        if self.num_scheduler_steps > 1:
            check_multi_step(self.speculative_config, self.scheduler_cls)
        if self.structured_outputs_backend is not None and not callable(
            self.structured_outputs_backend
        ):
            raise ValueError(
                "structured_outputs_backend must be None (xgrammar) or a callable that makes a "
                f"request's matcher from its StructuredOutputsParams, got "
                f"{self.structured_outputs_backend!r}"
            )
        check_device(self.device)
        for name, allowed in (
            ("dtype", DTYPES),
            ("quantization", QUANTIZATIONS),
            ("kv_cache_dtype", KV_CACHE_DTYPES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} must be one of {tuple(allowed)}, got {getattr(self, name)!r}"
                )

    @property
    def torch_kv_cache_dtype(self) -> torch.dtype | None:
        """The cache's torch dtype, or None for the model's own."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype]


def check_device(device: Any) -> None:
    """ValueError naming `device` unless it is None, "cpu", "cuda" or "cuda:N" (a GPU asked for
    where there is none is refused when the engine is built, saying so)."""
    if device is None:
        return
    try:
        parsed = torch.device(device) if isinstance(device, str) else None
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f'device must be None, "cpu", "cuda" or "cuda:N", got {device!r}')


def resolve_device(
    device: str | None, model_device: torch.device | None, option: str = "device"
) -> torch.device | None:
    """The device an engine runs on: `device`, or the model's own when None. Raises ValueError
    naming `option` (the keyword; a command line's "--device") for a GPU this machine does not
    have."""
    if device is None:
        return model_device
    parsed = torch.device(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{option}={device!r}: there is no CUDA GPU here (torch.cuda.is_available() is "
                f"False, torch {torch.__version__}, CUDA {torch.version.cuda}); use {option}='cpu'"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(
                f"{option}={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return parsed


# what the engine calls on its scheduler (and reads: `running`, `waiting`, `stats`,
# `num_unfinished_requests`); `llmlab.engine.Scheduler` has every one
SCHEDULER_INTERFACE = (
    "add_request",
    "schedule",
    "update_from_output",
    "finish_request",
    "has_unfinished_requests",
)


def check_multi_step(speculative_config: Any, scheduler_cls: Any) -> None:
    """ValueError naming num_scheduler_steps where the rest of the settings cannot run it:
    speculative decoding (a step verifies drafts instead), or a scheduler class without
    `Scheduler.schedule_steps`."""
    if speculative_config is not None:
        raise ValueError(
            "num_scheduler_steps > 1 cannot be combined with speculative_config (a step "
            "verifies drafts instead); give one or the other"
        )
    if scheduler_cls is not None and not callable(getattr(scheduler_cls, "schedule_steps", None)):
        raise ValueError(
            "num_scheduler_steps > 1 needs a scheduler_cls that subclasses "
            "llmlab.engine.Scheduler (for its schedule_steps), got "
            f"{getattr(scheduler_cls, '__name__', scheduler_cls)!r}"
        )


def check_scheduler_cls(scheduler_cls: Any) -> None:
    """ValueError naming `scheduler_cls` unless it is None or a class with every method of
    `SCHEDULER_INTERFACE` (a subclass of `llmlab.engine.Scheduler` has them all)."""
    if scheduler_cls is None:
        return
    if not isinstance(scheduler_cls, type):
        raise ValueError(
            f"scheduler_cls must be a class (a subclass of llmlab.engine.Scheduler, or one with "
            f"its interface), got {type(scheduler_cls).__name__} {scheduler_cls!r}"
        )
    missing = [m for m in SCHEDULER_INTERFACE if not callable(getattr(scheduler_cls, m, None))]
    if missing:
        raise ValueError(
            f"scheduler_cls must subclass llmlab.engine.Scheduler or have its methods "
            f"{list(SCHEDULER_INTERFACE)}; {scheduler_cls.__name__} lacks {missing}"
        )
