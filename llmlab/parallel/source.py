"""Which model a spawned rank builds: each process loads its own copy, then keeps its part."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from llmlab.model import LlamaModel


@dataclass(frozen=True)
class ModelSource:
    """A recipe a rank can rebuild from (a model object itself would be pickled to every rank).

    name "tiny": `llmlab.model.tiny_model(seed, **overrides)` (random weights, fast);
    anything else: a model `llmlab.model.weights.model_dir(name)` finds (e.g. "smollm2-135m",
    converted once and cached), loaded as `load_model` would load it but without the tokenizer
    and without first filling the model with random numbers: a rank needs neither.
    """

    name: str = "tiny"
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)

    def build(self) -> LlamaModel:
        """The full single-process model (float32, CPU, eval mode)."""
        from llmlab.model import tiny_model

        if self.name == "tiny":
            return tiny_model(seed=self.seed, **self.overrides)
        if self.overrides:
            raise ValueError(
                f"overrides apply only to name='tiny', got {self.overrides!r} for {self.name!r}"
            )
        return load_weights_only(self.name)


def load_weights_only(name: str) -> LlamaModel:
    """Our `LlamaModel` with the converted safetensors of `name`, built on the meta device and
    given the loaded tensors directly (no random initialisation, no copy, no tokenizer)."""
    from safetensors.torch import load_file

    from llmlab.config import ModelConfig
    from llmlab.model import rope_inv_freq
    from llmlab.model.weights import model_dir

    path = model_dir(name)
    cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()), name=name)
    state = {}
    for f in sorted(path.glob("*.safetensors")):
        for k, v in load_file(f).items():
            state[k.removeprefix("model.")] = v.float()
    with torch.device("meta"):
        model = LlamaModel(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(
            f"weights of {name!r} do not fit the Llama layout: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.inv_freq = rope_inv_freq(cfg)
    return model.eval()
