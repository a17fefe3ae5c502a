"""The roofline model: how fast an operation *can* run on a device, from two numbers.

An operation does `flops` floating-point operations and moves `bytes` between main memory and
the chip. Its arithmetic intensity (算术强度) is flops / bytes (FLOP per byte). A device
streams at most `mem_bw` bytes/s and computes at most `peak` FLOP/s, so the operation takes
at least

    time_floor = max(bytes / mem_bw, flops / peak)

and reaches at most `attainable = min(peak, intensity * mem_bw)` FLOP/s. The two limits cross
at the ridge point (拐点) `peak / mem_bw`: below it an operation is memory-bound (访存受限),
above it compute-bound (计算受限). H100 SXM in bf16: 989.4e12 / 3.35e12 ≈ 295 FLOP/byte
(the source chapter's round 1000 TFLOPS / 3 TB/s gives ≈ 330).

LLM operations placed on the roof (costs from `llmlab.analysis.costs`):
- decode GEMV at batch B: every weight is read once and used B times → intensity ≈ 2B / dtype_bytes;
- prefill GEMM over n prompt tokens → intensity ≈ 2n / dtype_bytes;
- decode attention with GQA: each cached K/V byte is used by num_heads / num_kv_heads queries,
  → intensity ≈ 2 · group / dtype_bytes, whatever the batch (each sequence has its own cache).

`roofline.model` computes the roof and the operations; `roofline.measure` measures the real
model's step times (`measure_decode_step`, `measure_prefill`) so they can be drawn against the
measured roof of this machine; the drawings are chapter 07's figures
(`llmlab.course.figures.ch07`). Both are read as `llmlab.analysis.roofline.NAME`.
"""

from llmlab.analysis.roofline.measure import (
    EngineStep,
    PairedRatios,
    StepMeasurement,
    measure_decode_step,
    measure_paired,
    measure_prefill,
    quick_roof,
    record_engine_steps,
    step_fn,
)
from llmlab.analysis.roofline.model import (
    DTYPE_FOR_BYTES,
    Operation,
    Placement,
    attainable,
    crossover_batch,
    decode_attention,
    decode_batch_sweep,
    decode_gemv,
    decode_step,
    decode_step_floor,
    dtype_for_bytes,
    engine_step,
    place,
    prefill_decode_floors,
    prefill_floor,
    prefill_gemm,
    prefill_step,
    ridge_point,
    weight_read_time,
)

__all__ = [
    "DTYPE_FOR_BYTES",
    "Operation",
    "Placement",
    "StepMeasurement",
    "attainable",
    "ridge_point",
    "place",
    "decode_gemv",
    "prefill_gemm",
    "decode_attention",
    "decode_step",
    "prefill_step",
    "engine_step",
    "EngineStep",
    "record_engine_steps",
    "quick_roof",
    "decode_step_floor",
    "prefill_floor",
    "prefill_decode_floors",
    "decode_batch_sweep",
    "weight_read_time",
    "crossover_batch",
    "measure_decode_step",
    "measure_prefill",
    "measure_paired",
    "PairedRatios",
    "step_fn",
    "dtype_for_bytes",
]
