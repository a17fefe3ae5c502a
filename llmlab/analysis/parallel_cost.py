"""How long one decode step spends computing vs communicating under TP and PP (a cost model).

Per decode step (every running request gets one token, so this is also each request's TPOT):

- compute: the roofline of the step on one GPU. With TP=t each GPU reads 1/t of the weights
  and KV cache and does 1/t of the FLOPs; with PP the stages run one after another for a given
  token, so PP does not shorten a token's compute (it adds memory, and throughput once
  micro-batches fill the pipeline). time = max(FLOPs / (t · peak), bytes / (t · HBM bandwidth)).
- TP communication: 2 all-reduces per layer, each of `batch × hidden × dtype_bytes` bytes.
  A ring all-reduce over t GPUs takes 2(t − 1) steps, each moving 1/t of the message:
      time = 2(t − 1) · α  +  2(t − 1)/t · bytes / B
  α (latency per step: kernel launch, synchronisation, link hop) dominates small messages;
  the bandwidth term (B = one direction of the link) dominates large ones.
- PP communication: one send of `batch × hidden × dtype_bytes` per stage boundary: α + bytes/B.

Units: bytes, seconds, FLOP/s. GPU and link figures come from `llmlab.analysis.hardware` presets
(datasheet peaks); FLOPs and bytes from `llmlab.analysis.costs`; α values are assumptions of the right
order, not measurements (nccl-tests on a real machine gives both). Real libraries switch to
one-shot or tree all-reduces for small messages, whose latency grows more slowly than 2(t−1)α,
and overlap some communication with compute; this model does neither, on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.analysis import costs
from llmlab.analysis.hardware import Hardware, get_hardware
from llmlab.config import ModelConfig, get_config
from llmlab.utils import check_positive_int


@dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU link as an all-reduce sees it."""

    name: str
    bandwidth: float  # bytes/s, one direction, per GPU
    latency: float  # seconds per ring step (α)
    source: str


# α per ring step: kernel launch, flag synchronisation and the hop itself. Assumed values of
# the right order (microseconds), not measurements.
LINK_LATENCY = {"nvlink": 1e-6, "pcie": 5e-6}
LINK_NAMES = {"nvlink": "NVLink", "pcie": "PCIe 5.0 x16"}


def get_interconnect(name: str = "nvlink", hardware: str | Hardware = "H100-SXM") -> Interconnect:
    """The link `name` ("nvlink" or "pcie") of a `llmlab.analysis.hardware` preset, one direction.

    Datasheets (and the source chapter) quote both directions added: an H100's NVLink 900 GB/s is
    18 links × 50 GB/s counting send and receive, PCIe 5.0 x16's 128 GB/s is 64 GB/s each way.
    A ring all-reduce sends and receives at once, so each of its steps runs at half the quote.
    """
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    key = str(name).lower()
    if key not in hw.interconnect:
        raise ValueError(
            f"interconnect must be one of {sorted(hw.interconnect)} for {hw.name}, got {name!r}"
        )
    alpha = LINK_LATENCY.get(key, 5e-6)
    return Interconnect(
        f"{LINK_NAMES.get(key, name)} ({hw.name})",
        bandwidth=hw.interconnect[key] / 2,
        latency=alpha,
        source=f"{hw.sources.get('interconnect', hw.name)}; halved for one "
        f"direction; alpha = {alpha * 1e6:g} us per ring step, assumed",
    )


def ring_all_reduce_time(nbytes: float, world_size: int, link: Interconnect) -> float:
    """Seconds for a ring all-reduce of `nbytes` over `world_size` GPUs: 2(p−1)α + 2(p−1)/p·bytes/B."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if world_size == 1:
        return 0.0
    steps = 2 * (world_size - 1)
    return steps * link.latency + steps / world_size * nbytes / link.bandwidth


def p2p_time(nbytes: float, link: Interconnect) -> float:
    """Seconds to send `nbytes` from one GPU to the next: α + bytes/B."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return link.latency + nbytes / link.bandwidth


@dataclass(frozen=True)
class StepCost:
    """One decode step of `batch` sequences: where the time goes (seconds)."""

    model: str
    tp: int
    pp: int
    batch: int
    interconnect: str
    compute: float
    tp_comm: float
    pp_comm: float
    all_reduces: int  # per step, on each GPU
    all_reduce_bytes: float  # one all-reduce's message
    weight_bytes_per_gpu: float

    @property
    def comm(self) -> float:
        return self.tp_comm + self.pp_comm

    @property
    def total(self) -> float:
        """Compute plus communication, no overlap (what a plain implementation does)."""
        return self.compute + self.comm

    @property
    def comm_fraction(self) -> float:
        return self.comm / self.total if self.total > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per second of the whole group, one batch in flight."""
        return self.batch / self.total


def decode_step_cost(
    cfg: ModelConfig | str = "llama-3-70b",
    tp: int = 8,
    pp: int = 1,
    batch: int = 1,
    interconnect: str | Interconnect = "nvlink",
    hardware: str | Hardware = "H100-SXM",
    dtype: str = "bf16",
    dtype_bytes: int = 2,
    context: int = 1,
) -> StepCost:
    """Compute vs communication of one decode step (`batch` sequences, one new token each).

    `context`: tokens each sequence attends to; their KV cache is read once per step and split
    over the TP ranks with the KV heads.
    """
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    for name, value in (("tp", tp), ("pp", pp), ("batch", batch), ("context", context)):
        check_positive_int(f"{name}", value)
    if pp > cfg.num_hidden_layers:
        raise ValueError(f"pp must be in [1, {cfg.num_hidden_layers}] (layers), got {pp}")
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    link = (
        interconnect
        if isinstance(interconnect, Interconnect)
        else get_interconnect(interconnect, hw)
    )
    flops = costs.decode_flops(cfg, batch, context)
    nbytes = costs.decode_bytes_per_step(cfg, batch, context, dtype_bytes)
    # the stages run in turn for one token, each on 1/pp of the layers: together 1/tp of the model
    compute = max(flops / (tp * hw.flops(dtype)), nbytes / (tp * hw.mem_bw))
    message = batch * cfg.hidden_size * dtype_bytes  # [batch, hidden]
    all_reduces = 2 * cfg.num_hidden_layers if tp > 1 else 0
    tp_comm = all_reduces * ring_all_reduce_time(message, tp, link)
    pp_comm = (pp - 1) * p2p_time(message, link)
    return StepCost(
        cfg.name,
        tp,
        pp,
        batch,
        link.name,
        compute,
        tp_comm,
        pp_comm,
        all_reduces,
        float(message),
        costs.weight_bytes(cfg, dtype_bytes) / (tp * pp),
    )


def tp_sweep(
    cfg: ModelConfig | str = "llama-3-70b",
    tps: tuple[int, ...] = (2, 4, 8),
    interconnects: tuple[str, ...] = ("nvlink", "pcie"),
    batch: int = 1,
    **kwargs,
) -> list[StepCost]:
    """`decode_step_cost` for every (interconnect, TP degree) pair."""
    return [
        decode_step_cost(cfg, tp=t, batch=batch, interconnect=ic, **kwargs)
        for ic in interconnects
        for t in tps
    ]
