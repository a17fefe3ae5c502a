"""Chapter 09's build exercise: the tensor-parallel split of one decoder layer.

The student writes a class with two static methods (the notebook's `TensorParallelLayer`):

    shard(weights, rank, world, head_dim) -> this rank's weights   (same names, `tp.LAYER_WEIGHTS`)
    forward(shard, x, all_reduce, attend, rms_norm) -> the layer's output [T, hidden]

Its drivers, run here or in the grader's sandbox, hand back plain observations:

- `observe_layer(cls, case)`: on a small random layer (`case_model`), which elements of every
  weight each rank's shard holds (the weights are filled with their own flat index first, so the
  shard says where it came from), and the ranks' outputs of the student's forward, the ranks run
  one after another in this process with a *simulated* all-reduce (`simulate_ranks`), together
  with the order in which each rank used the projections and the all-reduce (`trace`);
- `plug_in(cls, spec, prompt_ids, max_new_tokens)`: two real processes over gloo (the package's
  launcher) that load SmolLM2, run the student's `forward` on layer 0 with `dist.all_reduce`, and
  decode greedily with the package's TP engine twice: with the student's `shard` as its
  `shard_fn`, and with the package's own split (`llmlab.parallel.tp.decode_on_rank`).

The checker (`llmlab.course.check.ch09.tensor_parallel_layer`) computes the package's side itself.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from llmlab.model import LlamaModel, apply_rope, tiny_model
from llmlab.parallel import tp

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_REDUCE, ATTENTION = "all-reduce", "attention"
MAX_ALL_REDUCES = 8  # per rank and layer: the simulation gives up beyond this


# ---- the case: a one-layer random model ----------------------------------------------------------


def case_model(case: dict) -> LlamaModel:
    """The one-layer random model a property case describes (deterministic per case)."""
    return tiny_model(
        seed=case["seed"],
        vocab_size=8,
        num_hidden_layers=1,
        hidden_size=case["hidden"],
        intermediate_size=case["intermediate"],
        num_attention_heads=case["kv_heads"] * case["group"],
        num_key_value_heads=case["kv_heads"],
        head_dim=case["head_dim"],
    )


def case_input(case: dict) -> torch.Tensor:
    """The layer's input of a case, x [tokens, hidden]."""
    g = torch.Generator().manual_seed(case["seed"] + 1)
    return torch.randn(case["tokens"], case["hidden"], generator=g)


def detached_weights(layer) -> dict[str, torch.Tensor]:
    return {k: w.detach() for k, w in tp.layer_weights(layer).items()}


def make_attend(model: LlamaModel, num_tokens: int) -> Callable:
    """attend(q, k, v): causal attention of `num_tokens` tokens at positions 0.. with RoPE, q
    [T, heads·d], k and v [T, kv_heads·d] -> [T, heads·d]; query head h reads KV head
    h // (heads / kv_heads), as in the package's model."""
    d = model.config.head_dim
    cos, sin = model.rope_cos_sin(torch.arange(num_tokens))  # [T, d/2] each

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T = q.shape[0]
        q, k, v = q.view(T, -1, d), k.view(T, -1, d), v.view(T, -1, d)  # [T, h, d], [T, kvh, d]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5  # [h, T, T]
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", probs, v).reshape(T, -1)  # [T, h·d]

    return attend


def make_rms_norm(model: LlamaModel) -> Callable:
    """rms_norm(x, weight): the model's RMSNorm (its eps) with the given weight."""
    eps = model.config.rms_norm_eps

    def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    return rms_norm


def unsharded_output(case: dict) -> torch.Tensor:
    """The package's own layer (one process, no split) on the case's input: [tokens, hidden]."""
    from llmlab.ops.metadata import single_sequence_metadata

    model, x = case_model(case), case_input(case)
    T = x.shape[0]
    kv = model.allocate_kv_caches(num_blocks=1, block_size=T)
    meta = single_sequence_metadata(kv, num_cached=0, num_new=T, max_len=T)
    cos, sin = model.rope_cos_sin(torch.arange(T))
    with torch.inference_mode():
        return model.layers[0](x, cos, sin, meta, 0)


# ---- running every rank in one process ---------------------------------------------------------


class _Pause(BaseException):
    """Raised inside a rank at an all-reduce whose sum is not known yet (a BaseException, so a
    student's `except Exception` does not swallow it)."""


class RankMismatch(RuntimeError):
    """The ranks did not meet at the same all-reduces (a real run would hang or fail there)."""


def simulate_ranks(run_rank: Callable, world: int) -> tuple[list[Any], int]:
    """`run_rank(rank, all_reduce)` for every rank, in this one process, as if the ranks ran side
    by side: returns (each rank's result, all-reduces per rank).

    The ranks run one after another, each from the start, until each reaches its next all-reduce
    whose sum is unknown; that call stops it (`_Pause`); the partial tensors of all ranks are
    summed, and the ranks run again from the start, every all-reduce up to there returning its
    known sum. A rank's code must therefore be deterministic, which a layer's forward is.
    """
    sums: list[torch.Tensor] = []
    while True:
        partial: list[torch.Tensor | None] = []
        results: list[Any] = []
        for rank in range(world):
            calls = 0

            def all_reduce(t: torch.Tensor) -> torch.Tensor:
                nonlocal calls
                calls += 1
                if calls <= len(sums):
                    return sums[calls - 1].clone()
                raise _Pause(t.detach().clone())

            try:
                results.append(run_rank(rank, all_reduce))
                partial.append(None)
            except _Pause as p:
                results.append(None)
                partial.append(p.args[0])
        done = [r for r, p in enumerate(partial) if p is None]
        if len(done) == world:
            return results, len(sums)
        if done:
            waiting = next(r for r, p in enumerate(partial) if p is not None)
            raise RankMismatch(
                f"rank {done[0]} returned after {len(sums)} all-reduce(s) while rank {waiting} "
                f"called all_reduce once more (every rank must call it equally often)"
            )
        shapes = [tuple(p.shape) for p in partial]
        if len(set(shapes)) > 1:
            raise RankMismatch(
                f"all-reduce number {len(sums) + 1}: the ranks passed tensors of different "
                f"shapes {shapes} (a sum over ranks needs one shape)"
            )
        sums.append(torch.stack(partial).sum(0))
        if len(sums) > MAX_ALL_REDUCES:
            raise RankMismatch(f"more than {MAX_ALL_REDUCES} all-reduces in one layer")


class Trace(TorchFunctionMode):
    """The order in which code uses the given weights (by storage), with marks added by hand."""

    _META = {"size", "dim", "numel", "__get__", "shape", "dtype", "device"}

    def __init__(self, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.names = {w.untyped_storage().data_ptr(): n for n, w in weights.items()}
        self.events: list[str] = []

    def mark(self, event: str) -> None:
        self.events.append(event)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in self._META or name == "__get__" and "T" in repr(func):
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, torch.Tensor):
                    n = self.names.get(a.untyped_storage().data_ptr())
                    if n is not None and (not self.events or self.events[-1] != n):
                        self.events.append(n)
        return func(*args, **kwargs)


# ---- the drivers ---------------------------------------------------------------------------------


def _where(shard: Any, name: str) -> dict:
    """What a shard holds of one weight: its shape and the flat indices of its elements."""
    if not isinstance(shard, dict) or name not in shard:
        return {"missing": True}
    t = shard[name]
    if not isinstance(t, torch.Tensor):
        return {"type": type(t).__name__}
    return {"shape": list(t.shape), "index": [int(i) for i in t.reshape(-1).tolist()]}


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def observe_layer(answer: Any, case: dict) -> dict:
    """The student's split and forward on a case (see the module docstring); plain data."""
    world, d = case["world"], case["head_dim"]
    model = case_model(case)
    weights = detached_weights(model.layers[0])
    numbered = {
        k: torch.arange(w.numel(), dtype=torch.float64).reshape(w.shape) for k, w in weights.items()
    }
    out: dict[str, Any] = {"split": None, "forward": None}
    try:
        shards = [answer.shard(numbered, r, world, d) for r in range(world)]
    except Exception as e:  # the student's code
        out["split"] = {"error": _error(e)}
        return out
    if all(s is None for s in shards):
        out["split"] = {"none": True}
        return out
    out["split"] = {"ranks": [{k: _where(s, k) for k in tp.LAYER_WEIGHTS} for s in shards]}
    try:
        mine = [answer.shard(weights, r, world, d) for r in range(world)]
        mine = [{k: v.clone() for k, v in s.items()} for s in mine]
    except Exception as e:
        out["forward"] = {"error": _error(e)}
        return out
    x, attend_full = case_input(case), make_attend(model, case["tokens"])
    rms_norm = make_rms_norm(model)
    traces: dict[int, list[str]] = {}

    def run_rank(rank: int, all_reduce: Callable) -> torch.Tensor:
        trace = Trace({k: mine[rank][k] for k in PROJECTIONS if k in mine[rank]})

        def traced_all_reduce(t):
            trace.mark(ALL_REDUCE)
            return all_reduce(t)

        def traced_attend(q, k, v):
            trace.mark(ATTENTION)
            return attend_full(q, k, v)

        traces[rank] = trace.events
        with torch.inference_mode(), trace:
            return answer.forward(mine[rank], x.clone(), traced_all_reduce, traced_attend, rms_norm)

    try:
        outputs, calls = simulate_ranks(run_rank, world)
    except Exception as e:
        out["forward"] = {"error": _error(e), "traces": [traces.get(r, []) for r in range(world)]}
        return out
    out["forward"] = {
        "traces": [traces[r] for r in range(world)],
        "outputs": [
            o.detach().float().reshape(-1).tolist() if isinstance(o, torch.Tensor) else None
            for o in outputs
        ],
        "shapes": [list(o.shape) if isinstance(o, torch.Tensor) else None for o in outputs],
    }
    return out


def _plug_in_rank(
    rank: int, world: int, spec: dict, source, prompt_ids: list[int], max_new_tokens: int
) -> dict:
    """One rank of the plug-in run (a spawned process): the student's class from its source."""
    from llmlab.course.instructor.answers import build_function

    cls = build_function(spec)
    full = source.build()
    layer0 = full.layers[0]
    ids = torch.tensor(prompt_ids)
    with torch.inference_mode():
        x = full.embed_tokens(ids)  # [T, hidden]: layer 0's input
    counter = tp.AllReduceCounter()
    mine = cls.shard(detached_weights(layer0), rank, world, full.config.head_dim)
    dist.barrier()  # the ranks start together: an all-reduce then times the exchange, not a wait
    t0 = time.perf_counter()
    with torch.inference_mode():
        y = cls.forward(mine, x.clone(), counter, make_attend(full, len(ids)), make_rms_norm(full))
    layer_seconds = time.perf_counter() - t0
    dist.barrier()
    student = tp.decode_on_rank(full, rank, world, prompt_ids, max_new_tokens, shard_fn=cls.shard)
    dist.barrier()
    package = tp.decode_on_rank(full, rank, world, prompt_ids, max_new_tokens)
    return {
        "layer_out": y.detach().float().reshape(-1).tolist(),
        "layer_shape": list(y.shape),
        "layer_calls": counter.calls,
        "layer_bytes": counter.bytes,
        "layer_ar_seconds": counter.seconds,
        "layer_seconds": layer_seconds,
        "tokens": student["tokens"],
        "package_tokens": package["tokens"],
        **{
            f"{who}_{k}": r[k]
            for who, r in (("student", student), ("package", package))
            for k in ("calls", "bytes", "ar_seconds", "times")
        },
    }


def plug_in(
    answer: Any,
    spec: dict | None,
    prompt_ids: list[int],
    max_new_tokens: int,
    model: str = "smollm2-135m",
    world: int = 2,
    timeout: float = 55.0,
) -> dict:
    """The student's class in two real processes over gloo (see the module docstring). `spec`:
    the class as source and globals (`answers.encode`); None to encode `answer` here."""
    from llmlab.course.instructor.answers import encode
    from llmlab.parallel.launch import launch
    from llmlab.parallel.source import ModelSource

    if spec is None:
        spec = encode(answer)["__function__"]
    t0 = time.perf_counter()
    outs = launch(
        _plug_in_rank,
        world,
        (spec, ModelSource(model), list(prompt_ids), max_new_tokens),
        timeout=timeout,
    )
    result = {k: [o[k] for o in outs] for k in outs[0]}
    result["seconds"] = time.perf_counter() - t0
    return result


def tokens_processed(prompt_len: int, max_new_tokens: int) -> int:
    """Tokens a greedy run of `max_new_tokens` pushes through the layers: the prompt, then one per
    later step."""
    return prompt_len + max_new_tokens - 1


__all__ = [
    "case_model",
    "case_input",
    "make_attend",
    "make_rms_norm",
    "observe_layer",
    "plug_in",
    "simulate_ranks",
    "unsharded_output",
]
