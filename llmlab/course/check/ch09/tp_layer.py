"""Chapter 09's build exercise, checked: the student's tensor-parallel layer on drawn cases (its
split, its all-reduces, its output beside the unsharded layer), then plugged into the model."""

from __future__ import annotations

import functools
from typing import Any

from llmlab.course.check.build_guard import refuse_build_answer
from llmlab.course.check.catalog import catalog
from llmlab.course.check.ch09.questions import PROJECTIONS
from llmlab.course.check.ch09.tp_split import (
    COLUMN_PARALLEL,
    DRIVERS,
    MAX_EXAMPLES,
    PACKAGE_SEQUENCE,
    PLUG_MODEL,
    PLUG_PROMPT,
    PLUG_TOKENS,
    PLUG_WORLD,
    TOLERANCE,
    _describe,
    _split_problem,
    layer_cases,
)
from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    not_yet,
    passed,
    staged,
)
from llmlab.parallel import tp

M = catalog("ch09")


def _all_reduce_steps(trace: list[str]) -> list[str]:
    """The projection each all-reduce of a rank's trace came right after."""
    steps, last = [], "input"
    for event in trace:
        if event == "all-reduce":
            steps.append(last)
        elif event in PROJECTIONS:
            last = event
    return steps


def _forward_problem(case: dict, forward: dict, expected: list[float]) -> str | None:
    at = _describe(case)
    traces = forward.get("traces") or [[]]
    steps = _all_reduce_steps(traces[0])
    ran = " → ".join(traces[0]) or M("forward_problem.nothing")
    seq = M("forward_problem.sequence", ran=ran, package=" → ".join(PACKAGE_SEQUENCE))
    early = [s for s in steps if s in COLUMN_PARALLEL]
    if early:
        return M("forward_problem.early_all_reduce", at=at, proj=early[0], seq=seq)
    if "error" in forward:
        return M("forward_problem.raised", at=at, error=forward["error"], seq=seq)
    for block in ("o_proj", "down_proj"):
        if block not in steps:
            return M("forward_problem.no_all_reduce", at=at, block=block, seq=seq)
    if len(steps) != 2:
        return M("forward_problem.count", at=at, n=len(steps), seq=seq)
    for r, out in enumerate(forward["outputs"]):
        if out is None or len(out) != len(expected):
            return M(
                "forward_problem.shape",
                at=at,
                r=r,
                shape=forward["shapes"][r],
                tokens=case["tokens"],
                hidden=case["hidden"],
            )
        scale = 1 + max(abs(e) for e in expected)
        diff = max(abs(a - b) for a, b in zip(out, expected))
        if not diff <= TOLERANCE * scale:
            return M("forward_problem.differs", at=at, r=r, diff=diff)
    return None


def _layer_problem(got: Any, expected: dict) -> str | None:
    case = expected["case"]
    if not isinstance(got, dict) or "split" not in got:
        return M("tensor_parallel_layer.did_not_run", error=got)
    split = got["split"] or {}
    if split.get("none"):  # every rank's shard was None: nothing to look into
        return M("tensor_parallel_layer.shard_none")
    problem = _split_problem(case, split) if split else None
    return problem or _forward_problem(case, got["forward"], expected["output"])


def _layer_reference(case: dict) -> dict:
    from llmlab.course.build.ch09 import unsharded_output

    return {"case": case, "output": unsharded_output(case).reshape(-1).tolist()}


@functools.lru_cache(maxsize=1)
def _plug_reference(model: str, prompt: tuple[int, ...], new_tokens: int):
    """The package's side of the plug-in, in this process: SmolLM2's layer 0 on the prompt's
    embeddings (no split), and the one-process greedy tokens."""
    import torch

    from llmlab.ops.metadata import single_sequence_metadata
    from llmlab.parallel.source import ModelSource

    full = ModelSource(model).build()
    T = len(prompt)
    with torch.inference_mode():
        x = full.embed_tokens(torch.tensor(prompt))
        kv = full.allocate_kv_caches(num_blocks=1, block_size=T)
        meta = single_sequence_metadata(kv, num_cached=0, num_new=T, max_len=T)
        cos, sin = full.rope_cos_sin(torch.arange(T))
        layer0 = full.layers[0](x, cos, sin, meta, 0)
    tokens = tp.greedy_reference(full, list(prompt), new_tokens)
    return (
        layer0.reshape(-1).tolist(),
        tokens,
        full.config.hidden_size,
        full.config.num_hidden_layers,
    )


def tensor_parallel_layer(answer: Any) -> CheckResult:
    """The student's `TensorParallelLayer` (static `shard` and `forward`): properties on small
    layers drawn by hypothesis (the shards partition the weights as Megatron's split does; the
    ranks' forward, simulated in one process, equals the unsharded layer), then SmolLM2 over two
    gloo processes: layer 0 equal to the package's, and the package's TP engine with the
    student's `shard` as its `shard_fn` decoding the same tokens as one process."""
    from llmlab.course.build import drive, find_counterexample

    ex = "ch09.tensor_parallel_layer"
    refused = refuse_build_answer(
        ex,
        answer,
        ("shard", "forward"),
        fits=lambda a: all(callable(getattr(a, m, None)) for m in ("shard", "forward")),
        hint=M("tensor_parallel_layer.not_a_class"),
    )
    if refused is not None:
        return refused
    first = {"world": 2, "kv_heads": 2, "group": 1, "head_dim": 2, "hidden": 2,
             "intermediate": 2, "tokens": 1, "seed": 0}  # fmt: skip
    try:
        probe = drive(answer, f"{DRIVERS}:observe_layer", first)
    except Exception as e:  # the student's process died, or ran out of time
        return not_yet(ex, M("tensor_parallel_layer.did_not_run", error=e))
    if probe.get("split") == {"none": True}:
        return not_yet(ex, NOT_ANSWERED)
    cex = find_counterexample(
        layer_cases(),
        lambda case: drive(answer, f"{DRIVERS}:observe_layer", case),
        _layer_reference,
        max_examples=MAX_EXAMPLES,
        compare=lambda got, expected: _layer_problem(got, expected) is None,
    )
    if cex is not None:
        problem = (
            _layer_problem(cex.got, cex.expected)
            if not hasattr(cex.got, "error")
            else M("tensor_parallel_layer.raised_on", case=_describe(cex.case), raised=cex.got)
        )
        first = M("tensor_parallel_layer.smallest", problem=problem)
        hint = staged(ex, first, M("tensor_parallel_layer.megatron_rule"))
        return not_yet(ex, hint)
    return _plug_in_verdict(ex, answer)


def _plug_in_verdict(ex: str, answer: Any) -> CheckResult:
    from llmlab.course.build import drive
    from llmlab.course.build.ch09 import tokens_processed

    spec = answer.spec if getattr(answer, "grader_stand_in", False) else None
    try:
        run = drive(answer, f"{DRIVERS}:plug_in", spec, list(PLUG_PROMPT), PLUG_TOKENS)
    except Exception as e:
        return not_yet(ex, M("plug_in_verdict.run_failed", world=PLUG_WORLD, error=e))
    layer0, tokens, hidden, layers = _plug_reference(PLUG_MODEL, PLUG_PROMPT, PLUG_TOKENS)
    scale = 1 + max(abs(v) for v in layer0)
    diffs = [
        max(abs(a - b) for a, b in zip(out, layer0)) if len(out) == len(layer0) else float("inf")
        for out in run["layer_out"]
    ]
    if not max(diffs) <= TOLERANCE * scale:
        return not_yet(ex, M("plug_in_verdict.layer_differs", world=PLUG_WORLD, diff=max(diffs)))
    if any(t != tokens for t in run["tokens"]):
        return not_yet(
            ex, M("plug_in_verdict.tokens_differ", decoded=run["tokens"][0], tokens=tokens)
        )
    T = len(PLUG_PROMPT)
    mine_bytes = run["layer_bytes"][0] / T
    package_bytes = run["package_bytes"][0] / (tokens_processed(T, PLUG_TOKENS) * layers)
    # No time is compared: an all-reduce of the student's and one of the package's are the same
    # gloo call over localhost, and one run's times measure the machine's load (6018 against
    # 2305 µs was seen for equal bytes); the bytes and the calls are the split's own
    same = run["package_tokens"][0] == tokens
    return passed(
        ex,
        M(
            "plug_in_verdict.success",
            world=PLUG_WORLD,
            diff=max(diffs),
            decoded=run["tokens"][0],
            same=M("plug_in_verdict.same_as_package") if same else "",
            mine_bytes=mine_bytes,
            calls=run["layer_calls"][0],
            package_bytes=package_bytes,
            hidden=hidden,
        ),
    )
