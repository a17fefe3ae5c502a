"""Turning logits into the next token: greedy, temperature, top-k, top-p (nucleus).

`sample()` works on a batch of logits, one row per request, each row with its own
`SamplingParams`, so one engine step samples every request at once (vLLM's `v1/sample/sampler.py`
and `ops/topk_topp_sampler.py`). Everything stays on the logits' device; the caller reads the
sampled tokens back once per step.
"""

from __future__ import annotations

import torch

from llmlab.i18n import tr
from llmlab.ops import cpu_backend, cpu_library
from llmlab.sampling.params import SamplingParams


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask (to -inf) every token outside each row's top-k and outside its top-p nucleus.

    logits [B, V] on any device; top_k [B] int (V means off), top_p [B] float (1.0 means off),
    host tensors (they come from the requests' parameters; they are copied to the logits'
    device here). The nucleus is the smallest set of most likely tokens whose probability sums
    to >= top_p. Only the rows that ask for a cut are sorted (vLLM skips the others the same
    way): for a row with neither, the sort would change nothing and costs more than the rest of
    sampling. Which rows those are is read from the host tensors, so the device never waits.
    """
    vocab = logits.shape[-1]
    cut = [i for i, (k, p) in enumerate(zip(top_k.tolist(), top_p.tolist())) if k < vocab or p < 1]
    if not cut:
        return logits.clone()
    knobs = torch.stack([top_k[cut].to(torch.float32), top_p[cut].to(torch.float32)])
    knobs = knobs.to(logits.device)  # [2, C]: one small copy
    if len(cut) == logits.shape[0]:
        return _cut_sorted(logits, knobs[0], knobs[1])
    out = logits.clone()
    out[cut] = _cut_sorted(logits[cut], knobs[0], knobs[1])
    return out


def _cut_sorted(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`apply_top_k_top_p` for rows that all ask for a cut: sort each row once, cut, put back.
    top_k, top_p: [B] float32 on the logits' device."""
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [B, V]
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)  # [B, V]
    remove = ranks >= top_k.unsqueeze(1)  # outside top-k
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # probability mass strictly before each token; a token is kept while that mass < top_p,
    # so the token that crosses top_p is kept and the nucleus is the smallest such set
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p = 1 means off: compare only where it is < 1, since float rounding can make the
    # running sum reach 1.0 before the last token
    remove |= (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1)
    remove[:, 0] = False  # always keep the best
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
) -> torch.Tensor:
    """Pick one token per row of `logits` [B, V] with that row's `SamplingParams` → [B] int64,
    on the logits' device (the caller reads it back once, for the whole batch).

    A row whose params have a `seed` must come with its own `torch.Generator` on the logits'
    device (the engine keeps one per request: `make_generator(seed, device)`) so that the same
    seed gives the same tokens whatever else is in the batch. Rows that share a generator (the
    engine's default one) draw their noise in one call.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params):
        raise ValueError(
            tr(
                f"logits must be [len(params)={len(params)}, vocab], got {tuple(logits.shape)}",
                f"logits 的形状必须是 [len(params)={len(params)}, vocab]，你给的是 {tuple(logits.shape)}",
            )
        )
    if generators is not None:
        check_generators(generators, logits.device)
    logits = logits.float()
    out = _argmax(logits)  # [B]: greedy, the default
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    vocab = logits.shape[-1]
    chosen = [params[i] for i in rows]
    temp = torch.tensor([p.temperature for p in chosen], dtype=torch.float32)
    top_k = torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in chosen])
    top_p = torch.tensor([float(p.top_p) for p in chosen])
    sub = logits if len(rows) == len(params) else logits[rows]  # [R, V]
    sub = apply_top_k_top_p(sub / temp.to(logits.device).unsqueeze(1), top_k, top_p)
    probs = sub.softmax(dim=-1)  # [R, V]
    # Exponential-race sampling: argmax(p / E) with E ~ Exp(1) picks token i with probability
    # p_i, and lets each row draw its noise from its own generator. E = -log U with U uniform
    # on [0, 1): the same law as `exponential_`, several times faster on a CPU (a vectorised log
    # over a uniform draw); U = 0 gives E = inf, so that one token cannot win.
    noise = _uniform_noise(probs, [generators[i] if generators else None for i in rows])
    picked = _argmax(probs / noise.log_().neg_())  # [R]
    if len(rows) == len(params):
        return picked
    out[rows] = picked
    return out


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) of [B, V] -> [B] int64: through the C kernel (`cpu_backend.
    argmax_rows`, the same answer ten times faster) for float32 CPU rows where this process
    already runs the C kernels (an engine on the fast path loaded them: the readable path builds
    nothing for this), through torch otherwise."""
    if cpu_library.loaded() and cpu_backend.argmax_applies(x):
        return cpu_backend.argmax_rows(x)
    return x.argmax(dim=-1)


def _uniform_noise(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Uniform [0, 1) noise shaped like `probs` [R, V], row r drawn from `generators[r]`; rows
    that share a generator (or the global RNG, None) are drawn together, in row order."""
    noise = torch.empty_like(probs)
    groups: dict[int, list[int]] = {}
    for r, g in enumerate(generators):
        groups.setdefault(id(g), []).append(r)
    for members in groups.values():
        g = generators[members[0]]
        if len(members) == len(generators):
            noise.uniform_(generator=g)
        elif len(members) == 1:
            noise[members[0]].uniform_(generator=g)
        else:
            drawn = torch.empty((len(members), probs.shape[1]), device=probs.device)
            noise[members] = drawn.uniform_(generator=g)
    return noise


def check_generators(generators: list[torch.Generator | None], device: torch.device) -> None:
    """Every generator must draw on `device` (the logits'): a CPU generator cannot fill a CUDA
    tensor, and on a CPU-only machine the same mistake would go unseen, so it is refused here
    for every device alike."""
    for i, g in enumerate(generators):
        if g is not None and g.device.type != device.type:
            raise ValueError(
                f"generators[{i}] draws on {g.device}, the logits are on {device}: make a "
                f"request's generator on the logits' device (make_generator(seed, device))"
            )


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A per-request generator on `device` for a seeded request; None uses the global RNG."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
