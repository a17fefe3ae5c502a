"""llama.cpp through llama-cpp-python: the extra pyproject declares, and (where it is installed)
the F32 GGUF holding llmlab's weights and giving llmlab's greedy tokens."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import tomllib
import torch

from llmlab.bench import llamacpp_engine
from llmlab.bench.llamacpp import build_workload, run_llmlab

ROOT = Path(__file__).resolve().parent.parent


def test_the_install_hint_asks_for_what_pyproject_declares():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    requirement = llamacpp_engine.REQUIREMENT
    assert extras["llamacpp"] == [requirement]
    assert llamacpp_engine.install_command() == f'{sys.executable} -m pip install "{requirement}"'


def test_llama_cpp_needs_the_extra_and_says_how_to_add_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` fails
    for call in (
        lambda: llamacpp_engine.f32_gguf("smollm2-135m"),
        lambda: llamacpp_engine.LlamaCpp(tmp_path / "x.gguf", threads=1),
    ):
        with pytest.raises(RuntimeError, match="pip install"):
            call()


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason=f"needs the llamacpp extra: {llamacpp_engine.install_command()}",
)
def test_llama_cpp_f32_runs_llmlabs_weights_and_greedy_tokens(real_model, hf_model):
    import gguf
    from greedy_match import assert_greedy_match

    model, tokenizer = real_model
    path = llamacpp_engine.f32_gguf("smollm2-135m")
    assert llamacpp_engine.f32_gguf("smollm2-135m") == path, "made once, then cached"
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert {t.tensor_type for t in tensors.values()} == {gguf.GGMLQuantizationType.F32}
    # the unpermuted matrices, element for element (q and k are stored rotated for llama.cpp)
    for name, ours in (
        ("token_embd.weight", model.embed_tokens.weight),
        ("blk.0.attn_v.weight", model.layers[0].self_attn.v_proj.weight),
        ("blk.29.ffn_down.weight", model.layers[29].mlp.down_proj.weight),
    ):
        theirs = torch.from_numpy(tensors[name].data.copy()).reshape(ours.shape)
        assert torch.equal(theirs, ours.detach()), f"{name} differs from llmlab's dequantised copy"

    prompt = build_workload(tokenizer, 1, 128)[0]
    llama = llamacpp_engine.LlamaCpp(path, threads=torch.get_num_threads())
    try:
        theirs = llama.run([prompt], 32).tokens[0]
    finally:
        llama.close()
    ours = run_llmlab(model, [prompt], 32).tokens[0]
    # equal token for token, or diverging only at a near-tie of the same weights' logits
    assert_greedy_match(ours, theirs, prompt, hf_model, label="llmlab vs llama.cpp F32")
