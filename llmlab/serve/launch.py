"""Starting a server: `python -m llmlab serve`, a background process, or a thread.

- `main(argv)`: the command line (vLLM's `vllm serve` option names where they exist).
- `ServerProcess(...)`: the command in a child process, for a notebook or a benchmark; waits
  until it listens, `.url`, `.stop()`; a context manager.
- `ServerThread(app)`: uvicorn on a thread of this process (tests: the engine stays
  inspectable); the same `.url` / `.stop()`.
Both listen on 127.0.0.1 and, with port 0, on a free port the OS picks; uvicorn's connections
are bounded as `llmlab.serve.connections` says.
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

from llmlab.serve.connections import (
    connection_limits,
    connection_options,
    raise_file_limit,
    uvicorn_config,
)

LISTENING = re.compile(r"llmlab serve: listening on (http://\S+)")
API_KEY_ENV = "LLMLAB_API_KEY"  # as vLLM's VLLM_API_KEY: the key without a command line


def load(model: str = "smollm2-135m") -> tuple[Any, Any]:
    """(LlamaModel, tokenizer) for `model`; "tiny": the random tiny model and no tokenizer."""
    if model == "tiny":
        from llmlab.model import tiny_model

        return tiny_model(seed=0), None
    from llmlab.model import load_model

    return load_model(model)


def build_engine(model: str = "smollm2-135m", **engine_kwargs: Any):
    """An `LLMEngine` for `model` ("tiny": the random tiny model, token-id prompts only), on
    `device` (default: the GPU where there is one, as `LLM` and vLLM choose)."""
    import torch

    from llmlab.engine import LLMEngine

    if engine_kwargs.get("device") is None:
        engine_kwargs["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return LLMEngine(*load(model), **engine_kwargs)


def speculative_config_arg(text: str) -> dict:
    """`--speculative-config`: a JSON object of `SpeculativeConfig`'s keys, checked here so a
    mistake is a usage error that names the key."""
    import json

    from llmlab.config.engine import SpeculativeConfig

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    try:
        SpeculativeConfig.from_value(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


# The engine's options: each an `EngineConfig` field, its flag the field's name with dashes (as
# vLLM's are) and its default the field's; beside it, the flag's other argparse keywords.
ENGINE_OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("max_model_len", dict(type=int)),
    ("max_num_seqs", dict(type=int)),
    ("max_num_batched_tokens", dict(type=int)),
    ("block_size", dict(type=int)),
    ("num_kv_blocks", dict(type=int)),
    ("enable_prefix_caching", dict(action=argparse.BooleanOptionalAction)),
    ("enable_chunked_prefill", dict(action=argparse.BooleanOptionalAction)),
    (
        "attention_backend",
        dict(help="torch | triton | cuda | cpu (default: the fastest available)"),
    ),
    ("seed", dict(type=int)),
    (
        "device",
        dict(help="cpu | cuda | cuda:N (default: cuda where a CUDA GPU is present, else cpu)"),
    ),
    (
        "enforce_eager",
        dict(
            action="store_true",
            help="never replay a CUDA graph (decode steps on a GPU otherwise replay one)",
        ),
    ),
    (
        "num_scheduler_steps",
        dict(
            type=int,
            help="forwards per scheduled step (multi-step scheduling; streams then bring up to "
            "that many tokens at a time)",
        ),
    ),
    (
        "speculative_config",
        dict(
            type=speculative_config_arg,
            help='speculative decoding as JSON, vLLM\'s keys, e.g. \'{"method": "ngram", '
            '"num_speculative_tokens": 3, "prompt_lookup_max": 4}\' or '
            '\'{"method": "draft_model", "num_speculative_tokens": 3, '
            '"draft_num_layers": 8}\' (default: none)',
        ),
    ),
)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `LLMEngine` keyword arguments of parsed `serve` options."""
    return {field: getattr(args, field) for field, _ in ENGINE_OPTIONS}


def engine_options(ap: argparse.ArgumentParser) -> None:
    """The engine's options (`ENGINE_OPTIONS`), each defaulting to `EngineConfig`'s value."""
    from llmlab.config.engine import EngineConfig  # the engine's defaults, stated there

    for field, keywords in ENGINE_OPTIONS:
        flag = "--" + field.replace("_", "-")
        ap.add_argument(flag, default=getattr(EngineConfig, field), **keywords)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m llmlab serve",
        description="An OpenAI-compatible server over llmlab's engine: /v1/completions, "
        "/v1/chat/completions, /v1/models, /health, /metrics.",
    )
    ap.add_argument(
        "model",
        nargs="?",
        default="smollm2-135m",
        help="model name or Hugging Face directory; 'tiny' for the random tiny "
        "model (token-id prompts only)",
    )
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ap.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
    ap.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) clients use in 'model' (default: the model argument)",
    )
    engine_options(ap)
    door_options(ap)
    connection_options(ap)
    grammar_options(ap)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument("--log-level", default="warning")
    return ap


def door_options(ap: argparse.ArgumentParser) -> None:
    """The options of what the server admits: the queue, the key, the body cap, the docs."""
    ap.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests admitted but not yet scheduled before new ones get 503",
    )
    ap.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV}). A key "
        f"given here is visible to every user of this machine in the process list (ps): "
        f"prefer setting {API_KEY_ENV}",
    )
    ap.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body (default: 1 MiB + 96 bytes per token of max_model_len)",
    )
    ap.add_argument(
        "--disable-fastapi-docs", action="store_true", help="no /docs, /redoc or /openapi.json"
    )


# The options bounding what a client's grammar may cost: (flag, `GrammarLimits` field, type,
# help); each defaults to the field's value.
GRAMMAR_OPTIONS = (
    (
        "--grammar-compile-timeout",
        "compile_timeout_s",
        float,
        "seconds a grammar may take to compile and probe (its worker is killed past it)",
    ),
    ("--grammar-workers", "workers", int, "grammar compile processes"),
    (
        "--grammar-cache-mb",
        "cache_mb",
        int,
        "compiled grammars kept for reuse, in MB (vLLM's VLLM_XGRAMMAR_CACHE_MB)",
    ),
    (
        "--grammar-fill-budget",
        "fill_budget_s",
        float,
        "CPU seconds one request's grammar mask may take in a step (five times that in wall "
        "time) before the request is stopped with an error",
    ),
)


def grammar_options(ap: argparse.ArgumentParser) -> None:
    """The options of `GRAMMAR_OPTIONS`, each defaulting to `GrammarLimits`' value."""
    from llmlab.serve.grammar_compiler import GrammarLimits

    defaults = GrammarLimits()
    for flag, field, kind, text in GRAMMAR_OPTIONS:
        ap.add_argument(flag, type=kind, default=getattr(defaults, field), help=text)


def grammar_limits(args: argparse.Namespace) -> Any:
    """The `GrammarLimits` of parsed `serve` options (ValueError naming a bad field)."""
    from llmlab.serve.grammar_compiler import GrammarLimits

    # argparse keeps each option under its flag's name with underscores
    return GrammarLimits(
        **{field: getattr(args, flag[2:].replace("-", "_")) for flag, field, *_ in GRAMMAR_OPTIONS}
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m llmlab serve [MODEL] [--port P] ...`: serve until interrupted."""
    import asyncio

    import torch
    import uvicorn

    from llmlab.engine import LLMEngine
    from llmlab.serve.api_server import build_app

    ap = parser()
    args = ap.parse_args(argv)
    try:
        limits = grammar_limits(args)
    except ValueError as e:
        ap.error(str(e).replace("GrammarLimits.", ""))
    if args.api_key and "--api-key" in (argv if argv is not None else sys.argv):
        print(
            f"llmlab serve: the API key is visible in the process list; set {API_KEY_ENV} "
            "instead of --api-key",
            file=sys.stderr,
            flush=True,
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    raise_file_limit()
    model, tokenizer = load(args.model)
    engine = LLMEngine(model, tokenizer, **engine_kwargs(args))
    exit_code = [0]
    server: Any = None

    def on_fatal(error: BaseException) -> None:
        # the engine cannot continue: stop, and exit non-zero so a supervisor restarts us
        exit_code[0] = 1
        if server is not None:
            server.should_exit = True

    app = build_app(
        engine,
        args.served_model_name or [args.model],
        max_waiting=args.max_waiting,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        enable_docs=not args.disable_fastapi_docs,
        on_fatal=on_fatal,
        grammar_limits=limits,
    )
    server = uvicorn.Server(
        uvicorn_config(app, args.host, args.port, args.log_level, **connection_limits(args))
    )

    about = (
        f"model {args.model}, max_model_len {engine.max_model_len}, {engine.num_kv_blocks} KV "
        f"blocks, attention {engine.config.attention_backend}"
        f"{', API key required' if args.api_key else ''}"
    )
    asyncio.run(serve(server, app, about))
    if exit_code[0]:
        print(
            "llmlab serve: the engine failed and cannot continue; exiting with status 1 "
            "(see the log above)",
            file=sys.stderr,
            flush=True,
        )
    return exit_code[0]


async def serve(server: Any, app: Any, about: str) -> None:
    """Run uvicorn's `server` until it stops; print the listening line (which `ServerProcess`
    waits for) once it listens. As soon as it is asked to stop (SIGTERM), the grammar workers
    are killed: a compile in flight must not hold the exit."""
    import asyncio

    task = asyncio.ensure_future(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        print(f"llmlab serve: listening on http://{host}:{port} ({about})", flush=True)
    while not server.should_exit and not task.done():
        await asyncio.sleep(0.05)
    app.state.serving.close()
    await task


class ServerThread:
    """uvicorn serving `app` on a daemon thread of this process (port 0: a free one)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout: float = 60.0,
        **limits: Any,
    ) -> None:
        import uvicorn

        self.app = app
        self.server = uvicorn.Server(uvicorn_config(app, host, port, **limits))
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

    def __init__(
        self,
        model: str | None = "smollm2-135m",
        args: list[str] | None = None,
        start_timeout: float = 180.0,
        env: dict[str, str] | None = None,
    ) -> None:
        # model None: `args` names it (or the default model is served)
        cmd = [
            sys.executable,
            "-m",
            "llmlab",
            "serve",
            *([model] if model else []),
            "--port",
            "0",
            *(args or []),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        atexit.register(self.stop)  # a notebook kernel that exits takes it along
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.url: str | None = None
        found = threading.Event()

        def drain() -> None:  # keep reading so the child never blocks on a pipe
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
            why = (
                f"exited with code {code}"
                if self.proc.returncode is not None and found.is_set()
                else f"did not start listening within {start_timeout:.0f} s"
            )
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
