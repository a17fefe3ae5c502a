"""Tools beside the course: the environment report (`doctor`) and the bridge to vLLM itself.
The benchmarks (`llmlab.bench`) are tools too. They import the engine and analysis, never the
course."""
