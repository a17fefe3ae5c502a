"""Side-by-side benchmarks: `python -m llmlab bench NAME` runs `llmlab.bench.NAME.main`."""
