"""Side-by-side benchmarks: `python -m llmlab bench NAME` runs `llmlab.bench.NAME.main`."""


def default_attention_backend() -> str:
    """The attention backend the benchmarks give our engine on a CPU: "cpu" (C kernels reading
    the paged cache in place) where a C compiler builds them, else "torch"."""
    from llmlab.ops import cpu_backend

    return "cpu" if cpu_backend.available()[0] else "torch"
