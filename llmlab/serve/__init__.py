"""Serving over HTTP: an OpenAI-compatible server over the engine (`python -m llmlab serve`).

- `protocol`: the request bodies, checked at the door (errors name the field)
- `conversion`: a checked body as the engine takes it (prompts, grammar, `SamplingParams`)
- `async_engine`: `AsyncLLM`, the engine loop behind the server (requests join between steps)
- `prometheus`: `/metrics` in Prometheus' text format, vLLM's metric names
- `grammar_compiler`: grammars compiled and probed in worker processes it can kill
- `serving`: `OpenAIServing`, a request's admission (prompts tokenized, grammar compiled)
- `responses`: the answers in OpenAI's JSON, whole or as server-sent events
- `api_server`: `build_app(engine, name)`, the FastAPI app and its routes
- `connections`: uvicorn's connections bounded (header timeout, connection cap, quiet logs)
- `launch`: the command line, `ServerProcess` (a child process) and `ServerThread`

The benchmark client that measures such a server is `llmlab.bench.serve`.
"""

from llmlab.serve.launch import ServerProcess, ServerThread, build_engine

__all__ = ["ServerProcess", "ServerThread", "build_engine", "build_app", "AsyncLLM"]


def __getattr__(name: str):
    if name == "build_app":
        from llmlab.serve.api_server import build_app

        return build_app
    if name == "AsyncLLM":
        from llmlab.serve.async_engine import AsyncLLM

        return AsyncLLM
    raise AttributeError(f"module 'llmlab.serve' has no attribute {name!r}")
