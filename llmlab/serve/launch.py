"""Starting a server: `python -m llmlab serve`, a background process, or a thread.

- `main(argv)`: the command line (vLLM's `vllm serve` option names where they exist).
- `ServerProcess(...)`: the command in a child process, for a notebook or a benchmark; waits
  until it listens, `.url`, `.stop()`; a context manager.
- `ServerThread(app)`: uvicorn on a thread of this process (tests: the engine stays
  inspectable); the same `.url` / `.stop()`.
Both listen on 127.0.0.1 and, with port 0, on a free port the OS picks.
"""
from __future__ import annotations

import argparse
import atexit
import collections
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any

LISTENING = re.compile(r"llmlab serve: listening on (http://\S+)")


def load(model: str = "smollm2-135m") -> tuple[Any, Any]:
    """(LlamaModel, tokenizer) for `model`; "tiny": the random tiny model and no tokenizer."""
    if model == "tiny":
        from llmlab.model import tiny_model

        return tiny_model(seed=0), None
    from llmlab.model import load_model

    return load_model(model)


def build_engine(model: str = "smollm2-135m", **engine_kwargs: Any):
    """An `LLMEngine` for `model` ("tiny": the random tiny model, token-id prompts only)."""
    from llmlab.engine import LLMEngine

    return LLMEngine(*load(model), **engine_kwargs)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `LLMEngine` keyword arguments of parsed `serve` options."""
    return dict(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                enable_prefix_caching=args.enable_prefix_caching,
                enable_chunked_prefill=args.enable_chunked_prefill,
                attention_backend=args.attention_backend, seed=args.seed)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m llmlab serve",
        description="An OpenAI-compatible server over llmlab's engine: /v1/completions, "
                    "/v1/chat/completions, /v1/models, /health, /metrics.")
    ap.add_argument("model", nargs="?", default="smollm2-135m",
                    help="model name or Hugging Face directory; 'tiny' for the random tiny "
                         "model (token-id prompts only)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
    ap.add_argument("--served-model-name", nargs="+", default=None,
                    help="name(s) clients use in 'model' (default: the model argument)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-kv-blocks", type=int, default=None)
    ap.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--attention-backend", default=None,
                    help="torch | triton | cuda | cpu (default: the fastest available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-waiting", type=int, default=256,
                    help="requests admitted but not yet scheduled before new ones get 503")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument("--log-level", default="warning")
    return ap


def main(argv: list[str] | None = None) -> int:
    """`python -m llmlab serve [MODEL] [--port P] ...`: serve until interrupted."""
    import asyncio

    import torch
    import uvicorn

    from llmlab.serve.api_server import build_app

    from llmlab.engine import LLMEngine

    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    engine = LLMEngine(model, tokenizer, **engine_kwargs(args))
    app = build_app(engine, args.served_model_name or [args.model], max_waiting=args.max_waiting)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level, access_log=False))

    async def run() -> None:
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            print(f"llmlab serve: listening on http://{host}:{port} (model {args.model}, "
                  f"max_model_len {engine.max_model_len}, {engine.num_kv_blocks} KV blocks, "
                  f"attention {engine.config.attention_backend})", flush=True)
        await task

    asyncio.run(run())
    return 0


class ServerThread:
    """uvicorn serving `app` on a daemon thread of this process (port 0: a free one)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 start_timeout: float = 60.0) -> None:
        import uvicorn

        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                                    log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, name="llmlab-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, even by SIGKILL (Linux)."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """`python -m llmlab serve MODEL ARGS...` in a child process, started and waited for.

    `args`: further command-line options, e.g. ["--max-model-len", "512"]. Raises
    RuntimeError with the child's output when it exits or is not listening within
    `start_timeout` seconds. `log()` gives its last lines.
    """

    def __init__(self, model: str | None = "smollm2-135m", args: list[str] | None = None,
                 start_timeout: float = 180.0, env: dict[str, str] | None = None) -> None:
        # model None: `args` names it (or the default model is served)
        cmd = [sys.executable, "-m", "llmlab", "serve", *([model] if model else []),
               "--port", "0", *(args or [])]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})},
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        atexit.register(self.stop)          # a notebook kernel that exits takes it along
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.url: str | None = None
        found = threading.Event()

        def drain() -> None:              # keep reading so the child never blocks on a pipe
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                m = LISTENING.search(line)
                if m and self.url is None:
                    self.url = m.group(1)
                    found.set()
            found.set()

        self._reader = threading.Thread(target=drain, daemon=True)
        self._reader.start()
        if not found.wait(start_timeout) or self.url is None:
            code = self.stop()
            why = (f"exited with code {code}" if self.proc.returncode is not None and found.is_set()
                   else f"did not start listening within {start_timeout:.0f} s")
            raise RuntimeError(f"`{' '.join(cmd)}` {why}; its output:\n{self.log()}")

    def log(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout: float = 20.0) -> int | None:
        """Interrupt the server (then kill it if it lingers); returns its exit code."""
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
