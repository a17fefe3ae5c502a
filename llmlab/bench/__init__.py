"""Side-by-side benchmarks: `python -m llmlab bench NAME` runs `llmlab.bench.NAME.main`."""


def default_attention_backend(model) -> str:
    """The backend the benchmarks give our engine: what `LLM(model)` picks by default (the
    fastest here: "cpu", the C fast path, where a C compiler builds it, else "torch")."""
    from llmlab.engine.llm_engine import resolve_attention_backend

    return resolve_attention_backend(None, model)
