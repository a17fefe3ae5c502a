"""`SpeculativeConfig`: what `LLM(..., speculative_config={...})` and `serve --speculative-config`
accept, with vLLM's key names (`vllm/config/speculative.py`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How an engine speculates.

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
