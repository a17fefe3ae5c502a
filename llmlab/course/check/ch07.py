"""Self-checks of chapter 07 (roofline): the ridge point, the intensity of a batched decode
GEMV and of GQA decode attention, which roof a decode step sits under, the batch at which it
leaves the memory roof (the roofline explorer's task), and why context moves that batch.

Build exercise `step_cost`: the student counts the FLOPs and bytes of every operation of one
engine step; checked against `llmlab.analysis.costs.step_costs` on steps drawn with hypothesis,
then plugged into `roofline.engine_step` on the real engine's steps of SmolLM2 (measured)."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from llmlab.analysis import costs, roofline
from llmlab.analysis.hardware import PRESETS
from llmlab.config import PRESETS as MODEL_PRESETS
from llmlab.config import ModelConfig, get_config
from llmlab.course.build import drive, find_counterexample
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch01 import combine_mistakes
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    as_number,
    check_choice,
    check_number,
    clauses,
    not_yet,
    passed,
    record_expected,
    record_expected_word,
    refuse_package_piece,
    report,
    sentences,
    staged,
)

M = catalog("ch07")

GEMV_BATCH = 8  # decode_gemv_intensity: batch size
BOUND_BATCH = 64  # decode_bound: batch size of the Llama-3-70B decode step on H100 SXM
BOUND_CONTEXT = 1024
TASK_HARDWARE = "H100-SXM"  # compute_bound_batch: the roofline explorer's defaults
TASK_MODEL = "llama-3-70b"
TASK_CONTEXT = 1024

# why_crossover_grows: keys of the options (the notebook lists them in another order)
CROSSOVER_OPTIONS = (
    "ridge_moves",
    "attention_flops",
    "kv_bytes_per_sequence",
    "weights_per_sequence",
    "hbm_capacity",
)
# (English, Chinese) for each wrong option
CROSSOVER_WHY_WRONG = {
    "ridge_moves": M.key("crossover_why_wrong.ridge_moves"),
    "attention_flops": M.key("crossover_why_wrong.attention_flops"),
    "weights_per_sequence": M.key("crossover_why_wrong.weights_per_sequence"),
    "hbm_capacity": M.key("crossover_why_wrong.hbm_capacity"),
}


def ridge_point(answer: Any) -> CheckResult:
    """Ridge point of the H100-SXM preset (datasheet) in BF16, in FLOP/byte."""
    h = PRESETS["H100-SXM"]
    expected = roofline.ridge_point(h, "bf16")
    return check_number(
        "ch07.ridge_point",
        answer,
        expected,
        rel=0.02,
        mistakes=combine_mistakes(
            (
                roofline.ridge_point(PRESETS["H100-SXM-source"], "bf16"),
                M("ridge_point.source_chapter_s"),
            ),
            (1 / expected, M("ridge_point.upside_down_ridge")),
            (roofline.ridge_point(h, "fp32"), M("ridge_point.fp32_peak_question")),
            (roofline.ridge_point(h, "fp8"), M("ridge_point.fp8_peak_question")),
            (2 * h.peak_flops["bf16"] / h.mem_bw, M("ridge_point.uses_sparsity_peak")),
        ),
        default_hint=M("ridge_point.default_hint"),
        formula=M("ridge_point.formula"),
    )


def decode_gemv_intensity(answer: Any) -> CheckResult:
    """Arithmetic intensity (FLOP/byte) of a decode step's linear layers at batch GEMV_BATCH, BF16
    weights, counting only the weight bytes (a large model: activations are negligible)."""
    b = GEMV_BATCH
    expected = 2 * b / 2  # 2 FLOP per weight per token, 2 bytes per weight
    return check_number(
        "ch07.decode_gemv_intensity",
        answer,
        expected,
        rel=0.05,
        mistakes=combine_mistakes(
            (2 * b, M("decode_gemv_intensity.forgets_each_bf16")),
            (b / 2, M("decode_gemv_intensity.multiply_add_flop")),
            (1.0, M("decode_gemv_intensity.batch_batch_every")),
            (2 * b / 4, M("decode_gemv_intensity.uses_bytes_per")),
        ),
        default_hint=M("decode_gemv_intensity.default_hint"),
        formula=M("decode_gemv_intensity.formula"),
    )


def attention_intensity(answer: Any) -> CheckResult:
    """Arithmetic intensity (FLOP/byte) of Llama-3-70B's decode attention (GQA, BF16 KV cache)."""
    cfg = get_config("llama-3-70b")
    op = roofline.decode_attention(cfg, batch=1, context=1024, dtype_bytes=2)
    expected = op.intensity
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    return check_number(
        "ch07.attention_intensity",
        answer,
        expected,
        rel=0.02,
        mistakes=combine_mistakes(
            (expected / group, M("attention_intensity.plain_multi_head")),
            (expected * 2, M("attention_intensity.each_cached_number")),
            (expected / 2, M("attention_intensity.multiply_add_flop")),
            (
                expected * cfg.num_attention_heads / group,
                M("attention_intensity.count_query_heads"),
            ),
        ),
        default_hint=M("attention_intensity.default_hint"),
        formula=M("attention_intensity.formula"),
    )


def decode_bound(answer: Any) -> CheckResult:
    """Llama-3-70B, BF16, on the H100-SXM preset: is a decode step at batch BOUND_BATCH (context
    BOUND_CONTEXT) "memory"- or "compute"-bound?"""
    cfg = get_config("llama-3-70b")
    p = roofline.place(roofline.decode_step(cfg, BOUND_BATCH, BOUND_CONTEXT, 2), "H100-SXM", "bf16")
    wrong = "compute" if p.bound == "memory" else "memory"
    record_expected_word("ch07.decode_bound", p.bound, (BOUND_BATCH, BOUND_CONTEXT), [wrong])
    hint = staged(
        "ch07.decode_bound",
        M("decode_bound.compare_step_s"),
        M("decode_bound.weights_intensity_about"),
    )
    return check_choice(
        "ch07.decode_bound", answer, p.bound, options=["memory", "compute"], hints={wrong: hint}
    )


def _crossover(hardware: str = TASK_HARDWARE, context: int = TASK_CONTEXT) -> int | None:
    return roofline.crossover_batch(get_config(TASK_MODEL), hardware, context=context)


def compute_bound_batch(answer: Any) -> CheckResult:
    """The smallest batch at which a decode step of Llama-3-70B (BF16, TASK_CONTEXT tokens of
    context per sequence) on the H100-SXM preset is no longer memory-bound: the roofline
    explorer's task."""
    expected = _crossover()
    mistakes = combine_mistakes(
        (_crossover(context=1), M("compute_bound_batch.crossover_without_kv")),
        (roofline.ridge_point(TASK_HARDWARE), M("compute_bound_batch.ridge_point_intensity")),
        (_crossover("H100-SXM-source"), M("compute_bound_batch.source_chapter_s")),
        (_crossover("H200"), M("compute_bound_batch.h200_question_about")),
        (expected - 1, M("compute_bound_batch.batch_step_still")),
        (1024, M("compute_bound_batch.batch_slider_moves")),
    )
    record_expected("ch07.compute_bound_batch", expected)
    x = as_number(answer)
    if x is not None and expected < x < 1024 and x == int(x):
        return report(
            not_yet("ch07.compute_bound_batch", M("compute_bound_batch.batch_compute_bound"))
        )
    return check_number(
        "ch07.compute_bound_batch",
        answer,
        expected,
        rel=0.1 / expected,
        mistakes=mistakes,
        default_hint=M("compute_bound_batch.default_hint"),
        formula=M("compute_bound_batch.formula"),
    )


def why_crossover_grows(answer: Any) -> CheckResult:
    """Why does the batch at which decode turns compute-bound grow with the context, and at long
    contexts never come? One of CROSSOVER_OPTIONS."""
    return check_choice(
        "ch07.why_crossover_grows",
        answer,
        "kv_bytes_per_sequence",
        options=list(CROSSOVER_OPTIONS),
        hints={key: M(pair) for key, pair in CROSSOVER_WHY_WRONG.items()},
    )


# ---------------------------------------------------------------------------------------------
# build exercise: the cost of one step

BUILDS = {"ch07.step_cost": "step_cost"}  # exercise -> the name of the student's function
STEP_COST_DRIVER = "llmlab.course.build.ch07:observe_step_cost"
ENGINE_STEPS_DRIVER = "llmlab.course.build.ch07:predict_engine_steps"
STEP_CASES = 40  # steps drawn per check
SHOWN_OPS = 2  # operations a hint details (the others are counted)
CONFIG_FIELDS = (
    "name",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
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
        model = M(
            "describe_step.model",
            layers=fields["num_hidden_layers"],
            hidden_size=fields["hidden_size"],
            heads=fields["num_attention_heads"],
            kv_heads=fields["num_key_value_heads"],
            head_dim=fields["head_dim"],
            intermediate_size=fields["intermediate_size"],
            vocab_size=fields["vocab_size"],
        )
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


@functools.lru_cache(maxsize=1)
def engine_steps() -> tuple[ModelConfig, tuple[roofline.EngineStep, ...], int]:
    """SmolLM2-135M's real engine steps (cached per process, one model load per kernel): a
    prompt alone (prefill), then it decoding beside a prompt whose first 32 tokens it had
    cached and a fresh one (mixed), then all three decoding."""
    import torch

    from llmlab.engine.llm import LLM
    from llmlab.model import load_model
    from llmlab.sampling import SamplingParams

    model, _ = load_model("smollm2-135m")
    llm = LLM(model, max_model_len=128)
    first = list(range(1000, 1048))
    steps = roofline.record_engine_steps(
        llm,
        [first, first[:32] + list(range(2000, 2005)), list(range(3000, 3010))],
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
        arrive_at=[0, 1, 1],
    )
    return model.config, tuple(steps), torch.tensor([], dtype=model.dtype).element_size()


def _plugged_in(answer: Any) -> CheckResult:
    """The student's counter on the engine's real steps, through `roofline.engine_step`'s
    `step_cost`: its totals must equal the package's; the measured times are shown beside."""
    ex = "ch07.step_cost"
    cfg, steps, dtype_bytes = engine_steps()
    batches = [[list(p) for p in s.batch] for s in steps]
    try:
        mine = drive(answer, ENGINE_STEPS_DRIVER, config_fields(cfg), batches, dtype_bytes)
    except TimeoutError:
        raise
    except Exception as e:  # the student's code, on a step of the real engine
        problem = _shape_problem(type(e).__name__, str(e))
        if problem is not None:
            return report(not_yet(ex, M("plugged_in.engine_steps_shape", problem=problem)))
        return report(not_yet(ex, M("plugged_in.engine_s_steps", e_type=type(e).__name__, e=e)))
    hw = roofline.quick_roof("cpu")
    ridge = roofline.ridge_point(hw, "fp32")
    lines = [
        M(
            "plugged_in.measured_machine_quick",
            mem_bw=hw.mem_bw / 1000000000.0,
            flops=hw.flops('fp32') / 1000000000.0,
            ridge=ridge,
            name=cfg.name,
            n_steps=len(steps),
        )
    ]
    for i, (step, (flops, nbytes)) in enumerate(zip(steps, mine), 1):
        ref = roofline.engine_step(cfg, step.batch, dtype_bytes)
        shape = " ".join(f"{n}/{c}" for n, c in step.batch)
        if not (_same(flops, ref.flops) and _same(nbytes, ref.bytes)):
            return report(
                not_yet(
                    ex,
                    M(
                        "plugged_in.engine_s_step",
                        i=i,
                        kind=step.kind,
                        shape=shape,
                        flops=_num(flops),
                        nbytes=_num(nbytes),
                        ref_flops=_num(ref.flops),
                        bytes=_num(ref.bytes),
                    ),
                )
            )
        yours = roofline.place(roofline.Operation("", flops, nbytes), hw, "fp32")
        pkg = roofline.place(ref, hw, "fp32")
        lines.append(
            M(
                "plugged_in.step_i_kind",
                i=i,
                kind=step.kind,
                shape=shape,
                intensity=yours.op.intensity,
                time_floor=yours.time_floor * 1000.0,
                bound=yours.bound,
                op_intensity=pkg.op.intensity,
                value=pkg.time_floor * 1000.0,
                seconds=step.seconds * 1000.0,
            )
        )
    print("\n".join(lines))
    return report(passed(ex, M("plugged_in.counter_equals_package", n_steps=len(steps))))


def step_cost(answer: Any) -> CheckResult:
    """Build exercise: the student's `step_cost(cfg, batch, dtype_bytes)` -> {op: (flops, bytes)}
    against `costs.step_costs` on STEP_CASES drawn steps (the smallest disagreement shown), then
    plugged into `roofline.engine_step` on the real engine's steps of SmolLM2, measured."""
    ex = "ch07.step_cost"
    if answer is None:
        return report(not_yet(ex, NOT_ANSWERED))
    refused = refuse_package_piece(ex, answer)
    if refused is not None:
        return refused
    if not callable(answer):
        return report(
            not_yet(ex, M("step_cost.expected_function_step", answer_type=type(answer).__name__))
        )
    cex = find_counterexample(
        step_cases(),
        lambda case: drive(answer, STEP_COST_DRIVER, case),
        _package_costs,
        max_examples=STEP_CASES,
        compare=_same_costs,
    )
    if cex is not None:
        return report(not_yet(ex, step_cost_hint(cex)))
    return _plugged_in(answer)


EXERCISES: dict[str, ExerciseInfo] = {
    "ridge_point": ExerciseInfo(
        "plug-in", ("source preset", "upside down", "FP32 peak", "FP8 peak", "sparse peak")
    ),
    "decode_gemv_intensity": ExerciseInfo(
        "plug-in", ("BF16 bytes forgotten", "1 FLOP per multiply-add", "batch 1", "FP32 bytes")
    ),
    "attention_intensity": ExerciseInfo(
        "reasoning", ("MHA instead of GQA", "bytes per number", "half the FLOPs", "all heads")
    ),
    "decode_bound": ExerciseInfo("reasoning", ("intensity vs ridge",)),
    "compute_bound_batch": ExerciseInfo(
        "plug-in",
        (
            "no KV cache",
            "ridge instead of batch",
            "source preset",
            "H200",
            "last memory-bound batch",
            "power of two",
        ),
    ),
    "why_crossover_grows": ExerciseInfo(
        "reasoning", ("ridge moves", "attention FLOPs", "weights per sequence", "HBM capacity")
    ),
    "step_cost": ExerciseInfo(
        "reasoning",
        tuple(name.replace("_", " ") for name in STEP_COST_MISTAKES),
    ),
}
