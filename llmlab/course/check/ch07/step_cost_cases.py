"""Chapter 07's build exercise, its cases: the model shapes and batches drawn for the student's
`step_cost`, the package's costs of each, and the hint that names the first mistake."""

from __future__ import annotations

import json
import math
from typing import Any

from llmlab.analysis import costs
from llmlab.config import PRESETS as MODEL_PRESETS
from llmlab.config import ModelConfig
from llmlab.config.model import SIZE_FIELDS
from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    clauses,
    sentences,
    staged,
)

M = catalog("ch07")

# ---------------------------------------------------------------------------------------------
# build exercise: the cost of one step

BUILDS = {"ch07.step_cost": "step_cost"}  # exercise -> the name of the student's function
STEP_COST_DRIVER = "llmlab.course.build.ch07:observe_step_cost"
ENGINE_STEPS_DRIVER = "llmlab.course.build.ch07:predict_engine_steps"
STEP_CASES = 40  # steps drawn per check
SHOWN_OPS = 2  # operations a hint details (the others are counted)
CONFIG_FIELDS = ("name", *SIZE_FIELDS, "head_dim")
LINEAR_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
# the rule of each operation (the skeleton's docstring says the same), shown from the second try
STEP_OP_HINTS = {
    "embed_tokens": M.key("step_op_hints.embed_tokens"),
    "qkv_proj": M.key("step_op_hints.qkv_proj"),
    "attention": M.key("step_op_hints.attention"),
    "o_proj": M.key("step_op_hints.o_proj"),
    "gate_up_proj": M.key("step_op_hints.gate_up_proj"),
    "down_proj": M.key("step_op_hints.down_proj"),
    "lm_head": M.key("step_op_hints.lm_head"),
}
# mistake -> its text: what a recognised wrong count means, the first match shown
STEP_COST_MISTAKES = {
    "weights_per_sequence": M.key("step_cost_mistakes.weights_per_sequence"),
    "query_heads_for_kv": M.key("step_cost_mistakes.query_heads_for_kv"),
    "half_the_flops": M.key("step_cost_mistakes.half_the_flops"),
    "lm_head_every_token": M.key("step_cost_mistakes.lm_head_every_token"),
    "whole_embedding_table": M.key("step_cost_mistakes.whole_embedding_table"),
    "no_causal_mask": M.key("step_cost_mistakes.no_causal_mask"),
    "kv_per_new_token": M.key("step_cost_mistakes.kv_per_new_token"),
}


def config_fields(cfg: ModelConfig) -> dict:
    """The fields of `cfg` a step's cost depends on, as plain data (what travels to a driver)."""
    return {name: getattr(cfg, name) for name in CONFIG_FIELDS}


def _drawn_config(
    layers: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    hidden: int,
    intermediate: int,
    vocab: int,
) -> dict:
    return {
        "name": "drawn",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": kv_heads * group,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
    }


def step_cases() -> Any:
    """Hypothesis strategy of (config fields, batch, dtype_bytes): drawn configs of 1-4 layers
    with MHA, GQA or MQA (up to 8 query heads per K/V head) and sizes up to real models'; 1-6
    sequences, each decoding, bringing a whole prompt, or bringing prompt tokens after a cached
    prefix; contexts up to 8K. Shrinking leads to the smallest model and batch that disagree."""
    from hypothesis import strategies as st

    configs = st.builds(
        _drawn_config,
        layers=st.integers(1, 4),
        kv_heads=st.integers(1, 8),
        group=st.integers(1, 8),
        head_dim=st.integers(1, 128),
        hidden=st.integers(1, 8192),
        intermediate=st.integers(1, 28_672),
        vocab=st.integers(1, 128_256),
    )
    sequence = st.one_of(
        st.integers(1, 8192).map(lambda c: (1, c)),  # decoding one token
        st.integers(1, 2048).map(lambda n: (n, n)),  # a whole prompt
        st.tuples(st.integers(1, 512), st.integers(1, 8192)).map(lambda t: (t[0], t[0] + t[1])),
    )
    return st.tuples(
        configs, st.lists(sequence, min_size=1, max_size=6), st.sampled_from([2, 1, 4])
    )


def _package_costs(case: tuple) -> dict[str, list[float]]:
    fields, batch, dtype_bytes = case
    ops = costs.step_costs(ModelConfig(**fields), [tuple(p) for p in batch], dtype_bytes)
    return {op: [f, b] for op, (f, b) in ops.items()}


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def _same_costs(got: Any, expected: dict) -> bool:
    return (
        isinstance(got, dict)
        and set(got) == set(expected)
        and all(_same(got[op][i], expected[op][i]) for op in expected for i in (0, 1))
    )


def _num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.6g}"


def _describe_sequence(new: int, context: int) -> str:
    if new == 1:
        return M("describe_sequence.decoding", context=context)
    if new == context:
        return M("describe_sequence.whole_prompt", new=new)
    return M("describe_sequence.after_cached", new=new, cached=context - new, context=context)


def describe_step(fields: dict, batch: list, dtype_bytes: float) -> str:
    """A drawn step in words: the batch, the model's shape and the bytes per number."""
    seqs = [_describe_sequence(n, c) for n, c in batch]
    if len(seqs) == 1:
        sequences = M("describe_step.one_sequence", sequence=seqs[0])
    elif len(set(seqs)) == 1:
        sequences = M("describe_step.same_sequences", n=len(seqs), sequence=seqs[0])
    else:
        each = clauses(f"({i + 1}) {s}" for i, s in enumerate(seqs))
        sequences = M("describe_step.sequences", n=len(seqs), sequences=each)
    preset = MODEL_PRESETS.get(fields["name"])
    if preset is not None and config_fields(preset) == fields:
        model = M("describe_step.preset", name=fields["name"])
    else:
        model = M("describe_step.model", config=fields)
    return M("describe_step.step", batch=sequences, model=model, dtype_bytes=_num(dtype_bytes))


def _step_cost_mistake(case: tuple, got: dict, expected: dict) -> str | None:
    """The key of the first mistake of STEP_COST_MISTAKES that explains the student's counts on
    `case`."""
    fields, batch, dtype_bytes = case
    seqs, tokens = len(batch), sum(n for n, _ in batch)
    group = fields["num_attention_heads"] // fields["num_key_value_heads"]
    layers, head_dim = fields["num_hidden_layers"], fields["head_dim"]
    kv = fields["num_key_value_heads"] * head_dim
    q = fields["num_attention_heads"] * head_dim
    all_pairs = sum(n * c for n, c in batch)

    def ratio(op: str, i: int) -> float | None:
        return got[op][i] / expected[op][i] if expected[op][i] else None

    def is_(x: float | None, y: float) -> bool:
        return x is not None and _same(x, y)

    def differs(op: str, i: int) -> bool:
        return not _same(got[op][i], expected[op][i])

    checks = {
        "weights_per_sequence": seqs > 1
        and any(is_(ratio(op, 1), seqs) or is_(ratio(op, 1), tokens) for op in LINEAR_OPS),
        "query_heads_for_kv": group > 1 and is_(ratio("attention", 1), group),
        "half_the_flops": any(is_(ratio(op, 0), 0.5) for op in LINEAR_OPS),
        "lm_head_every_token": tokens > seqs and is_(ratio("lm_head", 0), tokens / seqs),
        "whole_embedding_table": differs("embed_tokens", 1)
        and is_(got["embed_tokens"][1], fields["vocab_size"] * fields["hidden_size"] * dtype_bytes),
        "no_causal_mask": differs("attention", 0)
        and is_(got["attention"][0], 4 * q * layers * all_pairs),
        "kv_per_new_token": differs("attention", 1)
        and is_(got["attention"][1], 2 * kv * layers * dtype_bytes * all_pairs),
    }
    return next((key for name, key in STEP_COST_MISTAKES.items() if checks[name]), None)


# what a StepCostShapeError of the driver says, by its kind
SHAPE_PROBLEMS = {
    "not_a_dict": M.key("step_cost_shape.not_a_dict"),
    "not_a_pair": M.key("step_cost_shape.not_a_pair"),
}


def _shape_problem(error: str, message: str) -> str | None:
    """What was wrong with the shape of the counter's return value, in the language in use, when
    the driver refused it (`StepCostShapeError`: its kind and values); else None."""
    if error != "StepCostShapeError":
        return None
    values = json.loads(message)
    return M(SHAPE_PROBLEMS[values.pop("kind")], **values)


def step_cost_hint(cex: Any) -> str:
    """The hint of a counterexample: the shrunk step, each operation counted differently (the
    student's and the package's), the mistake when it is a known one; from the second try on,
    the rule of the first wrong operation."""
    from llmlab.course.build import Raised

    fields, batch, dtype_bytes = cex.case
    where = describe_step(fields, batch, dtype_bytes)
    got, expected = cex.got, cex.expected
    if isinstance(got, Raised):
        problem = _shape_problem(got.error, got.message)
        if problem is not None:
            return M("step_cost_hint.step_shape", where=where, problem=problem)
        return M(
            "step_cost_hint.step_where_step", where=where, error=got.error, message=got.message
        )
    if not isinstance(got, dict) or set(got) != set(expected):
        ops = sorted(got) if isinstance(got, dict) else got
        return M(
            "step_cost_hint.step_where_step_2", where=where, ops=ops, step_ops=list(costs.STEP_OPS)
        )
    wrong = [op for op in costs.STEP_OPS if not _same_costs({op: got[op]}, {op: expected[op]})]
    shown, more = wrong[:SHOWN_OPS], len(wrong) - SHOWN_OPS
    diffs = clauses(
        M(
            "step_cost_hint.op_differs",
            op=op,
            flops=_num(got[op][0]),
            nbytes=_num(got[op][1]),
            package_flops=_num(expected[op][0]),
            package_nbytes=_num(expected[op][1]),
        )
        for op in shown
    ) + (M("step_cost_hint.more_differ", more=more) if more > 0 else "")
    first = M("step_cost_hint.on_the_step", where=where, diffs=diffs)
    mistake = _step_cost_mistake(cex.case, got, expected)
    if mistake is not None:
        first = sentences(first, M(mistake))
    return staged("ch07.step_cost", first, M(STEP_OP_HINTS[wrong[0]]))
