"""Side-by-side benchmarks: `python -m llmlab bench NAME` runs `llmlab.bench.NAME.main`."""


def default_attention_backend(model) -> str:
    """The backend the benchmarks give our engine: what `LLM(model)` picks by default (the
    fastest here: "cpu", the C fast path, where a C compiler builds it, else "torch")."""
    from llmlab.engine.llm_engine import resolve_attention_backend

    return resolve_attention_backend(None, model)


def write_report(report: dict, path, default=None) -> None:
    """Write a benchmark's results as JSON to `path` (folders made as needed) and say where."""
    import json
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=default))
    print(f"wrote {path}")
