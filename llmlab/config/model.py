"""Model configurations: the `ModelConfig` dataclass and presets of real models.

The presets live in `data/models.json` (each with the source of its numbers) so that a
learner can read them and so that `llmlab.analysis.costs` can compute sizes for models we never load.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from llmlab.paths import DATA_DIR

# the sizes every shape states, each a positive int (head_dim may be left to be derived)
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder. Field names follow Hugging Face's config.json."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 puts a bias on q, k and v
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # Models whose attention or MLP is not plain GQA + dense SwiGLU (DeepSeek's MLA and
    # mixture of experts) keep their extra fields here; `llmlab.analysis.costs` reads them.
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        for name in SIZE_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) is not divisible by "
                    f"num_attention_heads ({self.num_attention_heads}); give head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def num_queries_per_kv(self) -> int:
        """How many query heads share one K/V head (1 = MHA, num_heads = MQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, hf: dict | Any, name: str = "") -> "ModelConfig":
        """Build from a Hugging Face config (a dict or a `PretrainedConfig`)."""
        d = hf if isinstance(hf, dict) else hf.to_dict()
        rope = d.get("rope_parameters") or {}
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_scaling = d.get("rope_scaling")
        if rope_scaling is None and rope.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        known = {f.name for f in dataclasses.fields(cls)}
        extra = {k: v for k, v in d.items() if k in _EXTRA_KEYS}
        kwargs = {
            k: d[k]
            for k in known
            if k in d and k not in ("name", "extra", "source", "rope_theta", "rope_scaling")
        }
        if d.get("model_type") == "qwen2":
            kwargs["attention_bias"] = True
        return cls(
            name=name or d.get("_name_or_path", "") or d.get("model_type", "model"),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            extra=extra,
            **kwargs,
        )

    def to_hf_dict(self) -> dict:
        """A `LlamaConfig`-compatible dict (what `transformers` needs to build the same model)."""
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("name", "extra", "source")
        }
        d["model_type"] = "llama"
        d["architectures"] = ["LlamaForCausalLM"]
        d["hidden_act"] = "silu"
        return d


_EXTRA_KEYS = (
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "attention_type",
)


def _load_presets() -> dict[str, ModelConfig]:
    raw = json.loads((DATA_DIR / "models.json").read_text())
    presets = {}
    for key, entry in raw["models"].items():
        entry = dict(entry)
        extra = entry.pop("extra", {})
        presets[key] = ModelConfig(name=key, extra=extra, **entry)
    return presets


PRESETS: dict[str, ModelConfig] = _load_presets()


def get_config(name: str) -> ModelConfig:
    """A preset by name, e.g. `get_config("llama-3-70b")`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}") from None


def tiny_config(**overrides: Any) -> ModelConfig:
    """A small random-weight model of SmolLM2's architecture (GQA 4 query / 2 KV heads) for fast tests."""
    base = dict(
        name="tiny-llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    base.update(overrides)
    return ModelConfig(**base)
