"""vLLM across the wire: its OpenAI-compatible server (`VLLMServer`, `vllm serve` in vLLM's own
environment, on llmlab's SmolLM2) and its benchmark client (`bench_serve`, `vllm bench serve`)
against any server, so llmlab's server and vLLM's are measured by the same client. Like
`llmlab.tools.vllm_bridge` it never imports vLLM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from llmlab.tools.vllm_bridge import (
    QUIET_ENV,
    ROOT,
    available,
    how_to_add,
    model_folder,
    vllm_python,
)


def wait_until_answering(
    proc: subprocess.Popen, url: str, timeout_s: float, name: str, log: Path, poll_s: float = 1.0
) -> None:
    """Poll `url` every `poll_s` seconds until it answers 200, while `proc` (the server `name`,
    writing to `log`) runs. RuntimeError with the log's tail if the process exits first, or
    naming the log after `timeout_s` seconds (the process is left running: the caller stops
    it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{name} exited with code {proc.returncode}: "
                f"{log.read_text(errors='replace')[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not answer within {timeout_s:.0f} s; see {log}")
        time.sleep(poll_s)


def stop_process_group(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM to the process group `proc` leads (started in a new session), SIGKILL to it after
    `timeout_s` seconds; returns once `proc` is reaped."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout_s)


class VLLMServer:
    """vLLM's OpenAI-compatible server (`vllm serve`) on llmlab's SmolLM2, in its own process
    group on 127.0.0.1: `.url` once it answers /health; `.stop()`; a context manager.

    Started as `python -m vllm.entrypoints.openai.api_server`: the `vllm` command of the CPU
    build looks up the package under the name "vllm" and fails, the module does not."""

    def __init__(
        self,
        port: int | None = None,
        *,
        max_model_len: int = 1024,
        max_num_seqs: int = 64,
        served_model_name: str = "smollm2-135m",
        start_timeout: float = 300,
    ) -> None:
        from llmlab.parallel.launch import free_port  # imports torch: only when a server starts

        if not available():
            raise RuntimeError(how_to_add())
        if port is None:
            port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = ROOT / "build" / f"vllm-serve-{port}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_folder()),
            "--served-model-name",
            served_model_name,
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            str(max_model_len),
            "--max-num-seqs",
            str(max_num_seqs),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        env = {
            **os.environ,
            **QUIET_ENV,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }
        with open(self.log, "w") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(ROOT),
                start_new_session=True,
            )
        try:
            wait_until_answering(
                self._proc, f"{self.url}/health", start_timeout, "vLLM's server", self.log
            )
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process_group(self._proc)

    def __enter__(self) -> "VLLMServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_BENCH = r"""
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def bench_serve(
    base_url: str,
    *,
    num_prompts: int = 8,
    input_len: int = 64,
    output_len: int = 16,
    request_rate: str = "inf",
    model: str = "smollm2-135m",
    timeout: float = 600,
) -> dict:
    """vLLM's own benchmark client (`vllm bench serve`, random prompts, EOS ignored) against any
    OpenAI-compatible server, e.g. `python -m llmlab serve`. Returns the figures it prints
    ({"Successful requests": 8.0, "Mean TTFT (ms)": ..., ...}) and its text as "report"."""
    import re

    if not available():
        raise RuntimeError(how_to_add())
    if not 1 <= num_prompts <= 10_000:
        raise ValueError(f"num_prompts must be in [1, 10000], got {num_prompts}")
    args = [
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        str(model_folder()),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(num_prompts),
        "--request-rate",
        str(request_rate),
        "--ignore-eos",
        "--temperature",
        "0",
        "--disable-tqdm",
    ]
    proc = subprocess.run(
        [str(vllm_python()), "-c", _BENCH, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **QUIET_ENV},
        cwd=str(ROOT),
    )
    start = proc.stdout.find("============ Serving Benchmark Result")
    if start < 0:
        raise RuntimeError(
            f"vLLM's benchmark printed no result (exit {proc.returncode}):\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    report = proc.stdout[start:]
    figures = {
        m.group(1).strip(): float(m.group(2))
        for m in re.finditer(r"^([A-Za-z][^:\n]*):\s+([-0-9.]+)\s*$", report, re.M)
    }
    return {**figures, "report": report}
