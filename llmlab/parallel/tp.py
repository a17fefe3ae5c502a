"""Tensor parallelism (张量并行) of our Llama: every rank holds a slice of every layer.

Megatron-style split, as vLLM does it (`ColumnParallelLinear` / `RowParallelLinear`):

- column-parallel (列切): q_proj, k_proj, v_proj, gate_proj, up_proj. Each rank keeps some
  *output* rows of the weight, so it computes some heads / some MLP channels of its own, from
  the full (replicated) input. No communication.
- row-parallel (行切): o_proj, down_proj. Each rank keeps the matching *input* columns, so its
  product is a partial sum of the full output; one all-reduce (sum over ranks) completes it.

That is two all-reduces per layer (after attention, after the MLP), each of
`num_tokens × hidden × dtype_bytes` bytes. Embedding, norms and the (tied) LM head stay
replicated here, so every rank ends with the same logits.

Heads are split in whole GQA groups: a rank that owns KV head j also owns the query heads that
read it, so attention itself needs no communication. KV heads are dealt out as evenly as
possible, so the split may be uneven: SmolLM2 (9 query / 3 KV heads) at TP=2 puts 2 KV heads
(6 query heads) on rank 0 and 1 KV head (3 query heads) on rank 1. vLLM instead requires the
head counts to divide by the TP degree (and replicates KV heads when TP > num_kv_heads); the
uneven split is legitimate because each rank still computes whole groups, it only balances the
attention work less well. TP degrees above num_key_value_heads are refused here.

Each rank's slice is itself a `LlamaModel` (with fewer heads and a narrower MLP), so the
forward, RoPE, attention ops and KV cache are the very code the single-process model runs;
only o_proj and down_proj are swapped for `RowParallelLinear`.

The split of one layer is a function of its weights (`shard_layer`: the layer's weights by
name, `LAYER_WEIGHTS`, to this rank's). `shard_model`, `tp_worker` and `run_tensor_parallel`
take another one as `shard_fn=` (chapter 09's build exercise plugs the student's in there); the
rank's model is then built from the shapes that function returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from llmlab.config import ModelConfig
from llmlab.kvcache import ContiguousKVCache
from llmlab.model import LlamaModel
from llmlab.parallel.launch import launch, rank_device, split_evenly
from llmlab.parallel.source import ModelSource


@dataclass(frozen=True)
class TPShard:
    """What rank `rank` of `world_size` owns: ranges of query heads, KV heads, MLP channels."""

    rank: int
    world_size: int
    q_heads: range
    kv_heads: range
    ffn: range  # columns of the MLP's intermediate dimension


def tp_plan(cfg: ModelConfig, world_size: int) -> list[TPShard]:
    """The shard of every rank: whole KV-head groups per rank (possibly uneven), MLP split evenly."""
    if not isinstance(world_size, int) or not 1 <= world_size <= cfg.num_key_value_heads:
        raise ValueError(
            f"world_size (TP degree) must be an int in [1, {cfg.num_key_value_heads}] "
            f"(num_key_value_heads of {cfg.name!r}: every rank needs a whole KV head), "
            f"got {world_size!r}"
        )
    group = cfg.num_queries_per_kv
    shards = []
    for r, (kv, ffn) in enumerate(
        zip(
            split_evenly(cfg.num_key_value_heads, world_size),
            split_evenly(cfg.intermediate_size, world_size),
        )
    ):
        q = range(kv.start * group, kv.stop * group)
        shards.append(TPShard(r, world_size, q, kv, ffn))
    return shards


# One decoder layer's weights, by the names `shard_layer` and a `shard_fn` use ([out, in] each for
# the projections, [hidden] for the norms).
LAYER_WEIGHTS = (
    "input_layernorm",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "post_attention_layernorm",
    "gate_proj",
    "up_proj",
    "down_proj",
)


def layer_weights(layer: nn.Module) -> dict[str, torch.Tensor]:
    """The weights of one `DecoderLayer` by the names of `LAYER_WEIGHTS` (the tensors themselves)."""
    a, m = layer.self_attn, layer.mlp
    return {
        "input_layernorm": layer.input_layernorm.weight,
        "q_proj": a.q_proj.weight,
        "k_proj": a.k_proj.weight,
        "v_proj": a.v_proj.weight,
        "o_proj": a.o_proj.weight,
        "post_attention_layernorm": layer.post_attention_layernorm.weight,
        "gate_proj": m.gate_proj.weight,
        "up_proj": m.up_proj.weight,
        "down_proj": m.down_proj.weight,
    }


def shard_layer(
    weights: dict[str, torch.Tensor], shard: TPShard, head_dim: int
) -> dict[str, torch.Tensor]:
    """This rank's weights of one layer under the package's plan (`tp_plan`): the output rows of
    its heads / MLP channels for the column-parallel projections, the matching input columns for
    the row-parallel ones (o_proj, down_proj), the norms whole."""
    d = head_dim
    q_rows = slice(shard.q_heads.start * d, shard.q_heads.stop * d)
    kv_rows = slice(shard.kv_heads.start * d, shard.kv_heads.stop * d)
    ffn = slice(shard.ffn.start, shard.ffn.stop)
    return {
        "input_layernorm": weights["input_layernorm"],
        "q_proj": weights["q_proj"][q_rows].clone(),
        "k_proj": weights["k_proj"][kv_rows].clone(),
        "v_proj": weights["v_proj"][kv_rows].clone(),
        "o_proj": weights["o_proj"][:, q_rows].clone(),
        "post_attention_layernorm": weights["post_attention_layernorm"],
        "gate_proj": weights["gate_proj"][ffn].clone(),
        "up_proj": weights["up_proj"][ffn].clone(),
        "down_proj": weights["down_proj"][:, ffn].clone(),
    }


def layer_shapes(hidden: int, q: int, kv: int, ffn: int) -> dict[str, tuple[int, ...]]:
    """The shape of each weight of one decoder layer (`LAYER_WEIGHTS`) whose q/k/v projections have
    `q`, `kv`, `kv` output rows and whose MLP has `ffn` channels (a whole layer's, or a rank's)."""
    return {
        "input_layernorm": (hidden,),
        "q_proj": (q, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, q),
        "post_attention_layernorm": (hidden,),
        "gate_proj": (ffn, hidden),
        "up_proj": (ffn, hidden),
        "down_proj": (hidden, ffn),
    }


def _checked_shard(
    got: object, cfg: ModelConfig, rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    """A `shard_fn`'s result, checked for the shapes a rank's `LlamaModel` can be built from."""
    where = f"shard_fn(weights, rank={rank}, world_size={world_size}, head_dim={cfg.head_dim})"
    if not isinstance(got, dict) or set(LAYER_WEIGHTS) - set(got):
        missing = sorted(set(LAYER_WEIGHTS) - set(got)) if isinstance(got, dict) else None
        raise ValueError(
            f"{where} must return a dict with the keys {list(LAYER_WEIGHTS)}, got "
            f"{type(got).__name__}" + (f" without {missing}" if missing else "")
        )
    d, h = cfg.head_dim, cfg.hidden_size
    q, kv, ffn = (
        got[k].shape[0] if got[k].dim() == 2 else -1 for k in ("q_proj", "k_proj", "gate_proj")
    )
    expected = layer_shapes(h, q, kv, ffn)
    for k, shape in expected.items():
        if not isinstance(got[k], torch.Tensor) or tuple(got[k].shape) != shape:
            raise ValueError(
                f"{where}[{k!r}]: expected a tensor of shape {shape}, got "
                f"{tuple(getattr(got[k], 'shape', ())) or type(got[k]).__name__}"
            )
    if q <= 0 or kv <= 0 or q % d or kv % d or (q // d) % (kv // d):
        raise ValueError(
            f"{where}: q_proj has {q} rows and k_proj {kv}; each must be a positive multiple of "
            f"head_dim={d}, with a whole number of query heads per KV head"
        )
    return got


class AllReduceCounter:
    """`dist.all_reduce` (sum, in place) that counts its calls and the bytes each rank sends in."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()
        t0 = time.perf_counter()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        self.seconds += time.perf_counter() - t0
        return tensor


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x_shard @ W_shardᵀ): this rank's input columns give a partial sum of y."""

    def __init__(self, weight_shard: torch.Tensor, all_reduce):
        out_features, in_features = weight_shard.shape  # [out, in / world_size]
        super().__init__(in_features, out_features, bias=False, device="meta")
        self.weight = nn.Parameter(weight_shard, requires_grad=False)
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(super().forward(x))  # [T, out]: partial, then full sum


def shard_model(model: LlamaModel, shard: TPShard, all_reduce, *, shard_fn=None) -> LlamaModel:
    """This rank's slice of `model` as a smaller `LlamaModel` whose o/down projections all-reduce.

    `all_reduce(tensor) -> tensor` sums over ranks (an `AllReduceCounter` in a real run; the
    identity when one process wants a rank's partial result).

    `shard_fn(weights, rank, world_size, head_dim) -> weights`, if given, splits every layer
    instead of the package's `shard_layer` (same names, `LAYER_WEIGHTS`; the rank's head counts
    and MLP width are read from the shapes it returns). Attention biases (not in SmolLM2) follow
    the package's plan, so a model with them takes no `shard_fn`.
    """
    cfg = model.config
    d = cfg.head_dim
    if shard_fn is not None and cfg.attention_bias:
        raise ValueError(
            f"shard_fn: {cfg.name!r} has attention biases; shard_fn splits weights only"
        )
    split = []
    for layer in model.layers:
        if shard_fn is None:
            split.append(shard_layer(layer_weights(layer), shard, d))
        else:
            weights = {k: w.detach() for k, w in layer_weights(layer).items()}
            got = shard_fn(weights, shard.rank, shard.world_size, d)
            split.append(_checked_shard(got, cfg, shard.rank, shard.world_size))
    sizes = {(w["q_proj"].shape[0], w["k_proj"].shape[0], w["gate_proj"].shape[0]) for w in split}
    if len(sizes) != 1:
        raise ValueError(f"shard_fn gave the layers different shapes (q, kv, ffn rows): {sizes}")
    ((q_rows, kv_rows, ffn),) = sizes
    local_cfg = cfg.replace(
        name=f"{cfg.name}-tp{shard.rank}of{shard.world_size}",
        num_attention_heads=q_rows // d,
        num_key_value_heads=kv_rows // d,
        intermediate_size=ffn,
        head_dim=d,
    )
    state = {"embed_tokens.weight": model.embed_tokens.weight, "norm.weight": model.norm.weight}
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = model.lm_head.weight
    row_parallel = []
    for i, (layer, w) in enumerate(zip(model.layers, split)):
        p = f"layers.{i}."
        state[p + "input_layernorm.weight"] = w["input_layernorm"]
        state[p + "post_attention_layernorm.weight"] = w["post_attention_layernorm"]
        # column-parallel: the output rows of this rank's heads / MLP channels
        for proj in ("q_proj", "k_proj", "v_proj"):
            state[p + f"self_attn.{proj}.weight"] = w[proj]
            if cfg.attention_bias:
                rows = slice(shard.q_heads.start * d, shard.q_heads.stop * d)
                if proj != "q_proj":
                    rows = slice(shard.kv_heads.start * d, shard.kv_heads.stop * d)
                state[p + f"self_attn.{proj}.bias"] = (
                    getattr(layer.self_attn, proj).bias[rows].clone()
                )
        state[p + "mlp.gate_proj.weight"] = w["gate_proj"]
        state[p + "mlp.up_proj.weight"] = w["up_proj"]
        # row-parallel: the matching input columns, summed over ranks afterwards
        row_parallel.append((w["o_proj"], w["down_proj"]))
    with torch.device("meta"):  # no random init: every tensor is assigned below
        local = LlamaModel(local_cfg)
    local.load_state_dict(state, strict=False, assign=True)
    for mine, (o_w, down_w) in zip(local.layers, row_parallel):
        mine.self_attn.o_proj = RowParallelLinear(o_w, all_reduce)
        mine.mlp.down_proj = RowParallelLinear(down_w, all_reduce)
    if cfg.tie_word_embeddings:
        local.lm_head.weight = local.embed_tokens.weight
    local.inv_freq = model.inv_freq.clone()
    leftover = [
        n for n, t in list(local.named_parameters()) + list(local.named_buffers()) if t.is_meta
    ]
    if leftover:
        raise ValueError(f"shard_model left tensors unset: {leftover[:5]}")
    return local.eval()


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@dataclass
class TPResult:
    """What a tensor-parallel run produced (rank 0's view; every rank agrees on the tokens)."""

    world_size: int
    logits: torch.Tensor  # [prompt_len, vocab] float32, the prefill's logits
    token_ids: list[int]  # greedy continuation
    all_reduces_per_forward: list[int]  # per forward pass, counted on rank 0
    all_reduce_bytes: int  # bytes rank 0 put into all-reduces, whole run
    all_reduce_seconds: float  # time rank 0 spent inside all-reduces
    forward_seconds: list[float]  # wall time of each forward on rank 0
    shards: list[TPShard]
    params_per_rank: list[int]
    kv_cache_bytes_per_rank: list[int]
    extra: dict = field(default_factory=dict)


def tp_worker(
    rank: int,
    world_size: int,
    source: ModelSource,
    prompt_ids: list[int],
    max_new_tokens: int,
    backend: str = "gloo",
    shard_fn=None,
) -> dict:
    """One rank of a TP run: build the model, keep this rank's shard, prefill + greedy decode
    (`shard_fn`: see `shard_model`)."""
    return decode_on_rank(
        source.build(), rank, world_size, prompt_ids, max_new_tokens, backend, shard_fn
    )


def decode_on_rank(
    full: LlamaModel,
    rank: int,
    world_size: int,
    prompt_ids: list[int],
    max_new_tokens: int,
    backend: str = "gloo",
    shard_fn=None,
) -> dict:
    """The body of `tp_worker` once the rank has built the full model (`full` is left as it was)."""
    device = rank_device(rank, backend)
    shard = tp_plan(full.config, world_size)[rank]
    counter = AllReduceCounter()
    model = shard_model(full, shard, counter, shard_fn=shard_fn).to(device)
    del full  # this frame's reference: tp_worker's copy is freed here
    T = len(prompt_ids)
    cache = ContiguousKVCache(model.config, batch_size=1, max_len=T + max_new_tokens, device=device)
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=device)  # [T]
    calls, times, tokens, prefill_logits = [], [], [], None
    for step in range(max_new_tokens):
        num_new = [ids.shape[0]]
        before, t0 = counter.calls, time.perf_counter()
        hidden = model(
            ids, cache.positions(num_new).to(device), cache.context(num_new)
        )  # [n, hidden]
        logits = model.compute_logits(hidden)  # [n, vocab]
        times.append(time.perf_counter() - t0)
        calls.append(counter.calls - before)
        cache.advance(num_new)
        if step == 0:
            prefill_logits = logits.cpu()
        next_id = int(logits[-1].argmax())
        tokens.append(next_id)
        ids = torch.tensor([next_id], dtype=torch.long, device=device)
    return {
        "rank": rank,
        "tokens": tokens,
        "calls": calls,
        "bytes": counter.bytes,
        "ar_seconds": counter.seconds,
        "times": times,
        "shard": shard,
        "params": num_parameters(model),
        "kv_bytes": cache.nbytes,
        "logits": prefill_logits if rank == 0 else None,
    }


def run_tensor_parallel(
    source: ModelSource,
    prompt_ids: list[int],
    world_size: int = 2,
    max_new_tokens: int = 4,
    *,
    timeout: float = 180.0,
    backend: str = "gloo",
    shard_fn=None,
) -> TPResult:
    """Run the model with TP over `world_size` real processes; greedy-decode `max_new_tokens`.

    `shard_fn(weights, rank, world_size, head_dim) -> weights` splits each layer instead of the
    package's plan (see `shard_model`); it is sent to the spawned ranks, so it must be picklable
    (a module-level function). `shards` then still lists the package's plan."""
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token, got an empty list")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    outs = launch(
        tp_worker,
        world_size,
        (source, list(prompt_ids), max_new_tokens, backend, shard_fn),
        timeout=timeout,
        backend=backend,
    )
    for o in outs[1:]:
        if o["tokens"] != outs[0]["tokens"]:
            raise RuntimeError(
                f"ranks disagree on the greedy tokens: rank 0 {outs[0]['tokens']}, "
                f"rank {o['rank']} {o['tokens']}"
            )
    r0 = outs[0]
    return TPResult(
        world_size=world_size,
        logits=r0["logits"],
        token_ids=r0["tokens"],
        all_reduces_per_forward=r0["calls"],
        all_reduce_bytes=r0["bytes"],
        all_reduce_seconds=r0["ar_seconds"],
        forward_seconds=r0["times"],
        shards=[o["shard"] for o in outs],
        params_per_rank=[o["params"] for o in outs],
        kv_cache_bytes_per_rank=[o["kv_bytes"] for o in outs],
    )


def greedy_reference(model: LlamaModel, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Single-process greedy tokens, recomputed from scratch each step (no cache, no sharding)."""
    ids = list(prompt_ids)
    out = []
    for _ in range(max_new_tokens):
        next_id = int(model.logits_for(ids)[-1].argmax())
        out.append(next_id)
        ids.append(next_id)
    return out
