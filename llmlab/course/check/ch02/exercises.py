"""What the instructors' table says about each of chapter 02's exercises, and the model and
prompt of the whole-layer check."""

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    ExerciseInfo,
)

M = catalog("ch02")

MODEL = "smollm2-135m"
PROMPT = "The cat sat on the mat because it was warm"  # the chapter's real prompt
ATOL = 1e-4  # float32, a few hundred terms per sum

EXERCISES: dict[str, ExerciseInfo] = {
    "rms_norm": ExerciseInfo(
        "plug-in",
        (
            "LayerNorm's mean subtraction",
            "eps missing or outside the root",
            "weight missing",
            "sum instead of mean",
            "wrong axis",
        ),
    ),
    "attention": ExerciseInfo(
        "plug-in",
        (
            "mask missing",
            "scale missing",
            "softmax over the wrong axis",
            "scaled by d instead of √d",
            "future masked after the softmax",
            "own key masked too",
            "wrong output shape",
            "a fused attention called",
        ),
    ),
    "gqa_attention": ExerciseInfo(
        "plug-in",
        (
            "round-robin instead of consecutive groups",
            "every query head on KV head 0",
            "mask missing",
            "scale missing",
            "a fused attention called",
        ),
    ),
    "gqa_consequences": ExerciseInfo(
        "reasoning",
        (
            "query projection thought to shrink",
            "fewer score matrices thought",
            "output shape thought to change",
        ),
    ),
    "rope": ExerciseInfo(
        "plug-in",
        (
            "neighbouring pairs instead of (i, i + d/2)",
            "positions ignored",
            "rotated the wrong way",
            "frequencies i/d instead of 2i/d",
            "cos and sin swapped",
            "the rotated halves swapped",
        ),
    ),
    "rope_relative": ExerciseInfo(
        "reasoning",
        (
            "absolute positions thought to matter",
            "ratio instead of difference",
            "direction ignored",
        ),
    ),
    "swiglu": ExerciseInfo(
        "plug-in", ("silu on the up branch", "ReLU or GELU instead of SiLU", "gate missing")
    ),
    "layer0_output": ExerciseInfo(
        "plug-in", ("residual missing", "norm after the residual add", "the input handed back")
    ),
}
