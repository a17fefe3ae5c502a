"""Chapter 09's build exercise, the tensor-parallel split of one layer: the notebook's solution
passes its checker (properties, SmolLM2 over two gloo processes with its shard as the engine's
shard_fn, the measured line), a shrunk case is small, the engine's `shard_fn` injection point works
on its own, and the grader's sandbox and `python -m llmlab check ch09` on the student's notebook
give the same verdicts. The planted bugs and their hints: tests/test_planted_bugs.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from planted import ch09 as ch09_planted

from llmlab.course.build import ch09 as build
from llmlab.course.check import ch09, core
from llmlab.course.check.cli import load_definitions
from llmlab.course.check.cli import main as check_main
from llmlab.model import tiny_model
from llmlab.parallel import tp
from llmlab.parallel.source import ModelSource

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09-parallelism.ipynb"
NAME = ch09.BUILDS["ch09.tensor_parallel_layer"]


def skeleton_source() -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and f"class {NAME}" in c.source]
    return cell.source


LAYER = ch09_planted.EXERCISES[0]  # the planted bugs: tests/planted/ch09.py


def solution_source() -> str:
    return skeleton_source()


def planted_source(bug: str) -> str:
    return LAYER.bug(bug).source


def define(source: str, tmp_path: Path, name: str) -> type:
    """The class, defined as `python -m llmlab check` defines it from a module (in `__main__`)."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_definitions(path)[NAME]


@pytest.fixture
def english(monkeypatch):
    """English for the test (a test may switch to Chinese); the language is restored after."""
    from llmlab import i18n

    monkeypatch.setattr(i18n, "_chosen", "en")


# ---- properties: the solution, and each planted bug with its hint -------------------------------


def test_solution_holds_every_property(tmp_path):
    cls = define(solution_source(), tmp_path, "solution")
    cex = build_counterexample(cls)
    assert cex is None, ch09.tp_layer._layer_problem(cex.got, cex.expected)


def build_counterexample(cls):
    from llmlab.course.build import drive, find_counterexample

    return find_counterexample(
        ch09.layer_cases(),
        lambda case: drive(cls, f"{ch09.DRIVERS}:observe_layer", case),
        ch09.tp_layer._layer_reference,
        max_examples=ch09.MAX_EXAMPLES,
        compare=lambda got, expected: ch09.tp_layer._layer_problem(got, expected) is None,
    )


def test_the_shrunk_case_is_small(tmp_path, english):
    cls = define(planted_source("down_proj_by_rows"), tmp_path, "planted")
    cex = build_counterexample(cls)
    assert cex.case["world"] == 2 and cex.case["hidden"] == 2 and cex.case["tokens"] == 1
    assert (
        "the package’s rank 0 takes" in ch09.tp_layer._layer_problem(cex.got, cex.expected).lower()
    )


def test_unanswered_skeleton_is_not_yet_without_a_crash(tmp_path, english):
    from llmlab.course.instructor.student import strip_source

    student, _ = strip_source(solution_source())
    assert len(student.splitlines()) <= 40, "the skeleton a student sees is at most 40 lines"
    cls = define(student, tmp_path, "student")
    result = ch09.tensor_parallel_layer(cls)
    assert not result and result.message == core.NOT_ANSWERED
    assert not ch09.tensor_parallel_layer(None)


def test_a_shard_that_returns_none_on_some_layers_gets_a_hint(tmp_path, english):
    """The first probe (world 2) passes; a drawn layer of world 3 gets None from every rank."""
    source = solution_source() + textwrap.dedent(
        f"""

        _Solution = {NAME}


        class {NAME}(_Solution):
            forward = staticmethod(_Solution.forward)

            @staticmethod
            def shard(weights, rank, world, head_dim):
                return None if world == 3 else _Solution.shard(weights, rank, world, head_dim)
        """
    )
    result = ch09.tensor_parallel_layer(define(source, tmp_path, "none_at_3"))
    assert not result and "shard returned None" in result.message, result.message


def test_simulated_all_reduce_sums_the_ranks_and_refuses_mismatched_calls():
    def run_rank(rank, all_reduce):
        return all_reduce(torch.tensor([float(rank + 1)])) * 10

    outs, calls = build.simulate_ranks(run_rank, 3)
    assert calls == 1 and [o.item() for o in outs] == [60.0, 60.0, 60.0]

    def uneven(rank, all_reduce):
        t = all_reduce(torch.ones(2))
        return all_reduce(t) if rank == 0 else t

    with pytest.raises(build.RankMismatch, match="every rank must call it equally often"):
        build.simulate_ranks(uneven, 2)
    with pytest.raises(build.RankMismatch, match="different shapes"):
        build.simulate_ranks(lambda r, ar: ar(torch.ones(r + 1)), 2)


def test_the_trace_names_the_projection_each_all_reduce_follows(tmp_path):
    cls = define(solution_source(), tmp_path, "solution")
    case = {"world": 2, "kv_heads": 2, "group": 2, "head_dim": 2, "hidden": 4,
            "intermediate": 4, "tokens": 2, "seed": 3}  # fmt: skip
    trace = build.observe_layer(cls, case)["forward"]["traces"][1]
    assert tuple(trace) == ch09.PACKAGE_SEQUENCE
    assert ch09.tp_layer._all_reduce_steps(trace) == ["o_proj", "down_proj"]


# ---- the injection point on its own ---------------------------------------------------------------


def test_package_split_through_shard_fn_equals_the_plan():
    model = tiny_model(seed=2, num_attention_heads=6, num_key_value_heads=3, head_dim=8)
    plan = tp.tp_plan(model.config, 2)
    calls = []

    def package_split(weights, rank, world, head_dim):
        calls.append(rank)
        return tp.shard_layer(weights, plan[rank], head_dim)

    x = torch.randint(0, model.config.vocab_size, (5,)).tolist()
    for shard in plan:
        mine = tp.shard_model(model, shard, lambda t: t, shard_fn=package_split)
        theirs = tp.shard_model(model, shard, lambda t: t)
        assert mine.config == theirs.config
        with torch.inference_mode():
            assert torch.equal(mine.logits_for(x), theirs.logits_for(x))
    assert calls == [0] * model.config.num_hidden_layers + [1] * model.config.num_hidden_layers


def test_a_student_split_other_than_the_plan_builds_its_own_rank_shapes(tmp_path):
    """Rank 0 taking the *last* KV heads: a valid split, so the partial sums still add up."""
    cls = define(solution_source(), tmp_path, "solution")

    def reversed_ranks(weights, rank, world, head_dim):
        return cls.shard(weights, world - 1 - rank, world, head_dim)

    model = tiny_model(seed=1, num_attention_heads=6, num_key_value_heads=3, head_dim=8)
    x = [3, 1, 4, 1, 5]
    with torch.inference_mode():
        ranks = [
            tp.shard_model(model, s, lambda t: t, shard_fn=reversed_ranks)
            for s in tp.tp_plan(model.config, 2)
        ]
    assert [r.config.num_key_value_heads for r in ranks] == [1, 2]  # the plan gives [2, 1]
    assert all(r.logits_for(x).shape == model.logits_for(x).shape for r in ranks)


def test_shard_fn_with_a_wrong_shape_is_refused_naming_the_weight():
    model = tiny_model(seed=0)
    shard = tp.tp_plan(model.config, 2)[0]

    def bad(weights, rank, world, head_dim):
        out = tp.shard_layer(weights, shard, head_dim)
        out["down_proj"] = weights["down_proj"][: out["gate_proj"].shape[0]]  # rows, not columns
        return out

    with pytest.raises(ValueError, match=r"shard_fn\(weights, rank=0.*\['down_proj'\]"):
        tp.shard_model(model, shard, lambda t: t, shard_fn=bad)
    with pytest.raises(ValueError, match="must return a dict"):
        tp.shard_model(model, shard, lambda t: t, shard_fn=lambda *a: None)


def refusing_shard_fn(weights, rank, world_size, head_dim):
    """A module-level shard_fn (picklable for the spawned ranks) that proves it is called."""
    raise ValueError(f"shard_fn called on rank {rank} of {world_size}")


def package_plan_shard_fn(weights, rank, world_size, head_dim):
    q = weights["q_proj"].shape[0] // head_dim
    kv = weights["k_proj"].shape[0] // head_dim
    cfg = tiny_model().config.replace(
        num_attention_heads=q,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=weights["gate_proj"].shape[0],
        hidden_size=weights["q_proj"].shape[1],
    )
    return tp.shard_layer(weights, tp.tp_plan(cfg, world_size)[rank], head_dim)


@pytest.mark.dist
def test_run_tensor_parallel_uses_the_shard_fn_in_every_rank():
    src = ModelSource("tiny", seed=4)
    with pytest.raises(RuntimeError, match="shard_fn called on rank"):
        tp.run_tensor_parallel(src, [1, 2, 3], 2, 2, shard_fn=refusing_shard_fn, timeout=120)
    theirs = tp.run_tensor_parallel(src, [1, 2, 3], 2, 3, timeout=120)
    mine = tp.run_tensor_parallel(src, [1, 2, 3], 2, 3, shard_fn=package_plan_shard_fn, timeout=120)
    assert mine.token_ids == theirs.token_ids == tp.greedy_reference(src.build(), [1, 2, 3], 3)
    assert mine.all_reduce_bytes == theirs.all_reduce_bytes


# ---- plugged in: SmolLM2 over two gloo processes ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.dist
def test_solution_passes_and_its_engine_run_is_token_identical_to_the_package(
    tmp_path, english, record_driver
):
    cls = define(solution_source(), tmp_path, "solution")
    # the verdict's own plug-in run (build.plug_in on this class and the exercise's prompt) is the
    # one read below: two processes with SmolLM2, started once instead of twice
    runs = record_driver(build, "plug_in", cls)
    result = ch09.tp_layer._plug_in_verdict("ch09.tensor_parallel_layer", cls)
    assert len(runs) == 1, result.message  # the checker stops before it on a wrong answer
    [run] = runs
    layer0, tokens, hidden, layers = ch09.tp_layer._plug_reference(
        ch09.PLUG_MODEL, ch09.PLUG_PROMPT, ch09.PLUG_TOKENS
    )
    assert run["tokens"] == run["package_tokens"] == [tokens, tokens]
    assert run["layer_calls"] == [2, 2]
    assert run["layer_bytes"][0] == 2 * len(ch09.PLUG_PROMPT) * hidden * 4
    assert result, result.message
    for part in ("over gloo", "Measured (CPU, gloo", "yours 4608 B in 2 calls", "package's 4608 B"):
        assert part in result.message, result.message


# ---- the grader's sandbox and the command line ---------------------------------------------------


def stand_in(cls):
    from llmlab.course.instructor.answers import encode
    from llmlab.course.instructor.grading import FUNCTION_TIMEOUT_S
    from llmlab.course.instructor.recheck import SandboxedFunction

    return SandboxedFunction(encode(cls)["__function__"], timeout_s=FUNCTION_TIMEOUT_S)


def test_sandbox_fails_a_planted_bug_naming_the_step(tmp_path, english):
    answer = stand_in(define(planted_source("no_all_reduce_after_o_proj"), tmp_path, "planted"))
    try:
        result = ch09.tensor_parallel_layer(answer)
    finally:
        answer.close()
    assert not result and "after o_proj your forward did not all-reduce" in result.message


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.dist
def test_sandbox_passes_the_solution(tmp_path, english):
    answer = stand_in(define(solution_source(), tmp_path, "solution"))
    try:
        result = ch09.tensor_parallel_layer(answer)
    finally:
        answer.close()
    assert result, result.message


def test_check_command_reads_the_skeleton_from_a_notebook(tmp_path, capsys):
    """The student's edition (a notebook) is checked from its definition cells: NOT YET, exit 1."""
    from llmlab.course.instructor.student import student_notebook

    student, _ = student_notebook(nbformat.read(NOTEBOOK, as_version=4))
    path = tmp_path / "09-parallelism.ipynb"
    nbformat.write(student, path)
    assert check_main(["ch09", str(path)]) == 1
    assert "not answered yet" in capsys.readouterr().out
