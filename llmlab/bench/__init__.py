"""Side-by-side benchmarks: `python -m llmlab bench NAME` runs `llmlab.bench.NAME.main`."""


def benchmarks() -> dict[str, str]:
    """Every benchmark (a module here with a `main`) and the first line of its docstring, read
    from the source without importing it (some import torch or vLLM's bridge)."""
    import ast
    from pathlib import Path

    found = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
            doc = (ast.get_docstring(tree) or "").strip().splitlines()
            line = doc[0] if doc else ""
            # "`python -m llmlab bench x`: what it does" -> "what it does"
            found[path.stem] = line.split("`: ", 1)[-1].rstrip(".")
    return found


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
