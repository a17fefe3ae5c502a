"""Self-checks of chapter 02 (one Llama decoder layer, written by the student).

Each piece of the layer is a function the student writes and a checker that runs it on fresh
random inputs against `llmlab.model`'s own code: RMSNorm (`llmlab.model.RMSNorm`), causal
attention of one head and grouped-query attention (the model's readable attention,
`llmlab.ops.torch_backend.attend`), rotary position embedding (`llmlab.model.apply_rope`) and the
SwiGLU MLP (`llmlab.model.MLP`). `layer0_output` then checks the student's whole layer, built
from those pieces, against the real layer 0 of SmolLM2 on a real prompt.

The attention checkers refuse a function that calls a fused attention (PyTorch's, llmlab's):
by its source (and the functions and modules it uses), and at run time, while the function
runs, every such entry point is replaced by one that raises (`fused_attention_banned`). In the
grader the function runs in a sandbox interpreter (`llmlab.course.instructor.sandbox`); the checker
then wraps it in a small function of its own that turns the same ban on there.
"""

# The chapter's names are its modules' (a notebook calls `ch02.<name>`): imported to be read here.
# ruff: noqa: F401

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch02.exercises import ATOL, EXERCISES, MODEL, PROMPT
from llmlab.course.check.ch02.harness import (
    FusedAttentionError,
    fused_attention_banned,
    fused_call_in,
)
from llmlab.course.check.ch02.layer import layer0_output
from llmlab.course.check.ch02.pieces import (
    GQA_OPTIONS,
    RELATIVE_OPTIONS,
    attention,
    gqa_attention,
    gqa_consequences,
    rms_norm,
    rope,
    rope_relative,
    swiglu,
)

M = catalog("ch02")  # the chapter's texts, the catalog its modules read
