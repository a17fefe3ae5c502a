"""The scheduler and the requests it schedules (vLLM: `vllm/v1/core/sched/`, `vllm/v1/request.py`):
below the model runner and the engine loop, which both read its `SchedulerOutput`."""
