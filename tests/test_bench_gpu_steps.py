"""The GPU side of the decode profile: kernels, launches and copies booked to their step, busy
time as a union of intervals, and the whole measurement run on a CPU (where it finds no kernel)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llmlab.bench import gpu_steps
from llmlab.bench.llamacpp import load_model


def _event(name, start, end, device="cpu", annotation=False):
    kind = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU
    return SimpleNamespace(
        name=name,
        device_type=kind,
        time_range=SimpleNamespace(start=start, end=end),
        is_user_annotation=annotation,
    )


def test_each_kernel_launch_and_copy_is_booked_to_its_own_step():
    label = gpu_steps.STEP_LABEL
    events = [
        _event(f"{label}1", 100, 200, annotation=True),  # listed out of order on purpose
        _event(f"{label}0", 0, 90, annotation=True),
        _event(f"{label}0", 2, 80, device="cuda", annotation=True),  # the GPU-side range
        _event("cudaLaunchKernel", 5, 6),
        _event("cuLaunchKernel", 7, 8),
        _event("cudaMemcpyAsync", 9, 10),  # a copy call, not a launch
        _event("Memcpy HtoD (Pinned -> Device)", 10, 14, device="cuda"),
        _event("gemm_kernel", 20, 40, device="cuda"),
        _event("attention_kernel", 30, 50, device="cuda"),  # overlaps the GEMM by 10
        _event("Memset (Device)", 60, 61, device="cuda"),
        _event("cudaGraphLaunch", 110, 111),
        _event("graph_node_kernel", 120, 150, device="cuda"),
        _event("graph_node_kernel", 150, 151, device="cuda"),
        _event("cudaLaunchKernel", 250, 251),  # after the last step: nobody's
        _event("early_kernel", -5, -1, device="cuda"),  # before the first step: nobody's
    ]
    first, second = gpu_steps.split_profile(events)
    assert first == {"wall_us": 90, "kernels": 2, "launches": 2, "copy_us": 4, "busy_us": 31}
    assert second == {"wall_us": 100, "kernels": 2, "launches": 1, "copy_us": 0, "busy_us": 31}


def test_the_device_profile_runs_its_steps_through_the_profiler_on_a_cpu():
    """The GPU profile's machinery on a CPU (no kernel to see there): the prefill is left out,
    every decode step is timed, the profiled steps are found, and the floor is its bytes."""
    from llmlab.analysis import costs

    model, _ = load_model("tiny")
    run = gpu_steps.profile_device_decode(
        model, 4, 32, 6, profile_steps=3, rounds=2, attention_backend="torch"
    )
    assert run["decode_steps"] == 5 and run["profiled_steps"] == 3
    assert len(run["wall_ms_rounds"]) == 2 and run["wall_ms"] == min(run["wall_ms_rounds"])
    assert run["profiled_wall_ms"] > 0 and run["kernels_per_step"] == 0 == run["busy_ms"]
    assert not run["cuda_graphs"] and run["context"] == 35 and run["preemptions"] == 0
    gpu_steps.add_floor(run, model.config, copy_bw=1e9)
    cfg = model.config
    weights = costs.param_count(cfg) * 4
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    assert run["bytes_read"] == weights + 4 * 35 * kv_per_token
    assert run["floor_ms"] == pytest.approx(1e3 * run["bytes_read"] / 1e9)
    assert run["floor_fraction"] == pytest.approx(run["floor_ms"] / run["wall_ms"])


def test_a_profiler_that_cannot_trace_leaves_the_wall_times(monkeypatch):
    def cannot_trace(engine, requests):
        raise RuntimeError("CUPTI is not available")

    monkeypatch.setattr(gpu_steps, "profiled_decode", cannot_trace)
    model, _ = load_model("tiny")
    run = gpu_steps.profile_device_decode(model, 2, 16, 4, attention_backend="torch")
    assert run["wall_ms"] > 0 and run["decode_steps"] == 3
    assert run["busy_ms"] is None and "CUPTI is not available" in run["profile_error"]
    gpu_steps.add_floor(run, model.config, copy_bw=1e9)
    assert run["busy_fraction"] is None and run["floor_ms"] > 0
