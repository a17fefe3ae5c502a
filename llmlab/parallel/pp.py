"""Pipeline parallelism (流水并行): each rank holds a contiguous run of layers (a stage).

Stage 0 embeds the tokens and runs the first layers, sends the hidden states [T, hidden] to
stage 1, which runs the next layers, and so on; the last stage applies the final norm and the
LM head. Communication is one point-to-point send per stage boundary per micro-batch, far less
than tensor parallelism's two all-reduces per layer, which is why PP is what spans machines.

The price is the bubble (气泡): with one batch, stage 1 waits while stage 0 works and stage 0
idles while stage 1 works. Splitting the batch into m micro-batches (微批) lets the stages
overlap; with p equal stages each stage is idle a fraction (p − 1)/(m + p − 1) of the time.
`run_pipeline_parallel` records when each stage computes each micro-batch so that fraction can
be measured and set against the formula.

Each stage reuses the model's own `DecoderLayer`s, RoPE and KV cache; only the layer range
differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from llmlab.kvcache import ContiguousKVCache
from llmlab.model import LlamaModel
from llmlab.model.llama import inference
from llmlab.ops.metadata import AttentionMetadata
from llmlab.parallel.launch import launch, rank_device, split_evenly
from llmlab.parallel.source import ModelSource


def pp_plan(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges, one per stage, sizes differing by at most one."""
    _check_parts("num_stages", num_stages, num_layers, "layers")
    return split_evenly(num_layers, num_stages)


def _check_parts(name: str, parts: int, total: int, of_what: str) -> None:
    """`parts` (argument `name`) must cut `total` things into non-empty groups."""
    if not isinstance(parts, int) or not 1 <= parts <= total:
        raise ValueError(
            f"{name} must be an int in [1, {total}] (the number of {of_what}), got {parts!r}"
        )


class PipelineStage(nn.Module):
    """Layers `layers` of `model`; the first stage also embeds, the last also norms and projects."""

    def __init__(self, model: LlamaModel, layers: range, num_stages: int, stage: int):
        super().__init__()
        cfg = model.config
        self.config = cfg.replace(num_hidden_layers=len(layers))  # what this stage's KV cache holds
        self.layer_ids = layers
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.layers = nn.ModuleList(model.layers[i] for i in layers)
        self.embed_tokens = model.embed_tokens if self.is_first else None
        self.norm = model.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        self.register_buffer("inv_freq", model.inv_freq.clone(), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].input_layernorm.weight.dtype

    rope_cos_sin = LlamaModel.rope_cos_sin  # the model's own RoPE tables

    @inference
    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """First stage: token ids [T]; later stages: hidden [T, hidden]. Returns [T, hidden]."""
        cos, sin = self.rope_cos_sin(positions)  # [T, d/2] each
        if self.is_first:
            x = self.embed_tokens(x)  # [T, hidden]
        for local_index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, metadata, local_index)  # this stage's cache index
        return self.norm(x) if self.is_last else x

    @inference
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # [N, vocab]


def split_microbatches(num_seqs: int, num_microbatches: int) -> list[range]:
    """Sequences 0..num_seqs-1 in `num_microbatches` contiguous groups (sizes differ by ≤ 1)."""
    _check_parts("num_microbatches", num_microbatches, num_seqs, "sequences")
    return split_evenly(num_seqs, num_microbatches)


@dataclass
class StageTimeline:
    """When one stage computed each micro-batch of one pass: (start, end) in perf_counter seconds."""

    stage: int
    intervals: list[tuple[float, float]]


def theoretical_bubble(num_stages: int, num_microbatches: int) -> float:
    """Idle fraction of each stage with equal stage times and free communication: (p−1)/(m+p−1)."""
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError(
            f"num_stages and num_microbatches must be >= 1, got {num_stages} and {num_microbatches}"
        )
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def measured_bubble(timelines: list[StageTimeline]) -> list[float]:
    """Idle fraction of each stage over one pass: 1 − busy time / (last end − first start)."""
    start = min(iv[0] for t in timelines for iv in t.intervals)
    end = max(iv[1] for t in timelines for iv in t.intervals)
    span = end - start
    return [1.0 - sum(e - s for s, e in t.intervals) / span for t in timelines]


def _pipeline_pass(
    stage: PipelineStage,
    rank: int,
    world_size: int,
    inputs: list,
    num_new: list[list[int]],
    caches: list[ContiguousKVCache],
    device: torch.device,
) -> tuple[list, list[tuple[float, float]]]:
    """Push every micro-batch through this stage once. Returns (outputs, compute intervals).

    `inputs[i]` is micro-batch i's token ids [T_i] on the first stage (ignored elsewhere).
    Outputs: the last stage's hidden states [T_i, hidden] per micro-batch; None elsewhere.
    """
    hidden_size = stage.config.hidden_size
    intervals, outputs, pending = [], [], []
    for i, cache in enumerate(caches):
        n = num_new[i]
        if stage.is_first:
            x = inputs[i]  # [T_i] token ids
        else:
            x = torch.empty(sum(n), hidden_size, dtype=stage.dtype, device=device)
            dist.recv(x, src=rank - 1)  # waiting here is bubble
        t0 = time.perf_counter()
        h = stage(x, cache.positions(n).to(device), cache.context(n))  # [T_i, hidden]
        intervals.append((t0, time.perf_counter()))
        cache.advance(n)
        if stage.is_last:
            outputs.append(h)
        else:
            # asynchronous: this stage moves on to the next micro-batch while the send runs
            pending.append((dist.isend(h.contiguous(), dst=rank + 1), h))
            outputs.append(None)
    for work, _ in pending:
        work.wait()
    return outputs, intervals


def _build_stage(
    source: ModelSource, rank: int, world_size: int, backend: str
) -> tuple[PipelineStage, torch.device]:
    """This rank's stage of the model built from `source`, on the rank's device (the rest of the
    model is dropped)."""
    device = rank_device(rank, backend)
    full = source.build()
    layers = pp_plan(full.config.num_hidden_layers, world_size)[rank]
    return PipelineStage(full, layers, world_size, rank).to(device), device


def pp_worker(
    rank: int,
    world_size: int,
    source: ModelSource,
    prompts: list[list[int]],
    num_microbatches: int,
    max_new_tokens: int,
    backend: str = "gloo",
) -> dict:
    """One stage of a PP run: prefill every prompt, then greedy-decode, micro-batch by micro-batch."""
    stage, device = _build_stage(source, rank, world_size, backend)
    groups = split_microbatches(len(prompts), num_microbatches)
    max_len = max(len(p) for p in prompts) + max_new_tokens
    caches = [
        ContiguousKVCache(stage.config, batch_size=len(g), max_len=max_len, device=device)
        for g in groups
    ]
    num_new = [[len(prompts[s]) for s in g] for g in groups]
    inputs = [
        torch.tensor([t for s in g for t in prompts[s]], dtype=torch.long, device=device)
        for g in groups
    ]
    tokens: list[list[int]] = [[] for _ in prompts]
    timelines, prefill_logits = [], None
    dist.barrier()
    for step in range(max_new_tokens):
        outputs, intervals = _pipeline_pass(
            stage, rank, world_size, inputs, num_new, caches, device
        )
        timelines.append(intervals)
        next_ids = torch.empty(len(prompts), dtype=torch.long, device=device)  # [num_seqs]
        if stage.is_last:
            logits = [stage.compute_logits(h) for h in outputs]  # [T_i, vocab] each
            if step == 0:
                prefill_logits = []
                for n, lg in zip(num_new, logits):
                    prefill_logits += list(lg.cpu().split(n))  # [len(prompt), vocab]
            last = [lg[torch.cumsum(torch.tensor(n), 0) - 1] for n, lg in zip(num_new, logits)]
            next_ids = torch.cat(last).argmax(dim=-1)  # [num_seqs]
        if world_size > 1:
            # the sampled tokens go back to the first stage, which embeds them next pass
            if stage.is_last:
                dist.send(next_ids, dst=0)
            elif stage.is_first:
                dist.recv(next_ids, src=world_size - 1)
        for s, t in enumerate(next_ids.tolist()):
            tokens[s].append(t)
        inputs = [next_ids[g.start : g.stop] for g in groups]
        num_new = [[1] * len(g) for g in groups]
    return {
        "rank": rank,
        "layers": stage.layer_ids,
        "timelines": timelines,
        "tokens": tokens if (stage.is_first or stage.is_last) else None,
        "logits": prefill_logits,
    }


@dataclass
class PPResult:
    """What a pipeline-parallel run produced, with each stage's compute timeline per pass."""

    num_stages: int
    num_microbatches: int
    logits: list[torch.Tensor]  # per prompt, [len(prompt), vocab] (prefill pass)
    token_ids: list[list[int]]  # greedy continuation per prompt
    stage_layers: list[range]
    timelines: list[list[StageTimeline]]  # [pass][stage]
    extra: dict = field(default_factory=dict)

    @property
    def prefill_bubble(self) -> list[float]:
        """Measured idle fraction of each stage during the prefill pass."""
        return measured_bubble(self.timelines[0])

    @property
    def theory(self) -> float:
        return theoretical_bubble(self.num_stages, self.num_microbatches)


def run_pipeline_parallel(
    source: ModelSource,
    prompts: list[list[int]],
    num_stages: int = 2,
    num_microbatches: int = 2,
    max_new_tokens: int = 4,
    *,
    timeout: float = 180.0,
    backend: str = "gloo",
) -> PPResult:
    """Run the model as a `num_stages`-stage pipeline over real processes; greedy-decode."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    split_microbatches(len(prompts), num_microbatches)  # validate before starting processes
    outs = launch(
        pp_worker,
        num_stages,
        (source, [list(p) for p in prompts], num_microbatches, max_new_tokens, backend),
        timeout=timeout,
        backend=backend,
    )
    first, last = outs[0], outs[-1]
    if first["tokens"] != last["tokens"]:
        raise RuntimeError("the first and last stage disagree on the sampled tokens")
    timelines = [
        [StageTimeline(o["rank"], o["timelines"][p]) for o in outs] for p in range(max_new_tokens)
    ]
    return PPResult(
        num_stages,
        num_microbatches,
        last["logits"],
        last["tokens"],
        [o["layers"] for o in outs],
        timelines,
    )


def pp_bubble_worker(
    rank: int,
    world_size: int,
    source: ModelSource,
    batch_size: int,
    seq_len: int,
    microbatch_counts: list[int],
    repeats: int,
    backend: str = "gloo",
) -> dict:
    """Prefill-only passes of a random batch for each micro-batch count m (timelines only)."""
    stage, device = _build_stage(source, rank, world_size, backend)
    vocab = stage.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=g)  # [B, T]
    out: dict[int, list[list[tuple[float, float]]]] = {}
    for m in microbatch_counts:
        groups = split_microbatches(batch_size, m)
        runs = []
        for r in range(repeats + 1):  # the first run warms up and is dropped
            caches = [
                ContiguousKVCache(stage.config, batch_size=len(gr), max_len=seq_len, device=device)
                for gr in groups
            ]
            inputs = [ids[gr.start : gr.stop].reshape(-1).to(device) for gr in groups]
            num_new = [[seq_len] * len(gr) for gr in groups]
            dist.barrier()
            _, intervals = _pipeline_pass(stage, rank, world_size, inputs, num_new, caches, device)
            if r > 0:
                runs.append(intervals)
        out[m] = runs
    return {"rank": rank, "runs": out}


def measure_bubble(
    source: ModelSource,
    num_stages: int = 2,
    batch_size: int = 8,
    seq_len: int = 32,
    microbatch_counts: tuple[int, ...] = (1, 2, 4, 8),
    repeats: int = 3,
    *,
    timeout: float = 180.0,
    backend: str = "gloo",
) -> dict[int, dict[str, float]]:
    """Measured vs theoretical bubble for each micro-batch count (median over `repeats` passes).

    Returns {m: {"measured": mean idle fraction over stages, "theory": (p−1)/(m+p−1),
    "stages": [idle per stage], "pass_seconds": wall time of the pass, "timelines": the
    median pass's [StageTimeline] per stage}}.
    """
    for m in microbatch_counts:
        split_microbatches(batch_size, m)
    outs = launch(
        pp_bubble_worker,
        num_stages,
        (source, batch_size, seq_len, list(microbatch_counts), repeats, backend),
        timeout=timeout,
        backend=backend,
    )
    result = {}
    for m in microbatch_counts:
        per_run = []
        for r in range(repeats):
            tl = [StageTimeline(o["rank"], o["runs"][m][r]) for o in outs]
            ivs = [iv for t in tl for iv in t.intervals]
            span = max(e for _, e in ivs) - min(s for s, _ in ivs)
            per_run.append((measured_bubble(tl), span, tl))
        per_run.sort(key=lambda x: sum(x[0]))
        stages, span, tl = per_run[len(per_run) // 2]
        result[m] = {
            "measured": sum(stages) / len(stages),
            "stages": stages,
            "theory": theoretical_bubble(num_stages, m),
            "pass_seconds": span,
            "timelines": tl,
        }
    return result
