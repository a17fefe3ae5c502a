"""llama.cpp as a second engine for the benchmarks, through llama-cpp-python's low-level API.

The optional extra `llama-cpp-python` (`make llamacpp`: pip compiles llama.cpp for this CPU,
about ten minutes; `make lab`/`make test` never install it). `f32_gguf` makes, once, an all-F32
GGUF of a built-in model from its shipped (Q4_1) GGUF with llama.cpp's own quantize function,
requantising allowed: element for element the float32 weights llmlab dequantises from the same
file. `LlamaCpp.run` decodes many sequences greedily at once, one sequence id each: one
`llama_decode` of every prompt, then one `llama_decode` of one token per sequence per step,
greedy being an argmax over the logits it returns.

`GreedyRun` is what a system's run gives the benchmark (`llmlab.bench.llamacpp`), llmlab's
included: the tokens, and the time until every sequence had its first token (prefill) and after.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

REQUIREMENT = "llama-cpp-python>=0.3"  # pyproject's `llamacpp` extra (a test keeps them equal)
KV_TYPES = {"f32": 0, "f16": 1}  # ggml_type ids of llama.cpp's KV cache element


def install_command() -> str:
    """The exact command that adds llama.cpp to this Python."""
    return f'{sys.executable} -m pip install "{REQUIREMENT}"'


def import_llama_cpp():
    """The `llama_cpp` module, or None where the optional extra is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


@dataclass
class GreedyRun:
    """One system's run of one batch: the tokens and where the time went."""

    tokens: list[list[int]]  # generated token ids per sequence
    prefill_seconds: float  # until every sequence had its first token
    decode_seconds: float  # the rest
    decode_tokens: int  # tokens made during decode
    prompt_tokens: int
    config: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)  # a system's own extra figures

    def summary(self) -> dict:
        generated = sum(map(len, self.tokens))
        seconds = self.prefill_seconds + self.decode_seconds
        return {
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "decode_tokens": self.decode_tokens,
            "decode_tok_per_s": self.decode_tokens / self.decode_seconds,
            "total_tok_per_s": (self.prompt_tokens + generated) / seconds,
            "ms_per_decode_step": 1e3
            * self.decode_seconds
            / max(self.decode_tokens // len(self.tokens), 1),
            **self.measured,
        }


GGML_LOG_LEVEL_ERROR = 4


def _errors_only(level: int, text: bytes, _user_data) -> None:
    if level == GGML_LOG_LEVEL_ERROR:
        sys.stderr.write(text.decode(errors="replace"))


@functools.cache
def _quiet(llama_cpp):
    """Keep llama.cpp's log to its errors (it logs every tensor it loads or converts); the
    callback is cached because llama.cpp calls it for as long as the process lives."""
    callback = llama_cpp.llama_log_callback(_errors_only)
    llama_cpp.llama_log_set(callback, None)
    return callback


# llama.cpp's file types for the precisions the bench compares (llama_ftype names)
GGUF_TYPES = {
    "F32": "LLAMA_FTYPE_ALL_F32",
    "BF16": "LLAMA_FTYPE_MOSTLY_BF16",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
}


def f32_gguf(name: str = "smollm2-135m", threads: int | None = None) -> Path:
    """An all-F32 GGUF of the built-in model `name`, made once from its shipped (Q4_1) GGUF by
    llama.cpp's quantize with requantising allowed, cached in `cache_dir()/gguf`."""
    return gguf_of(name, "F32", threads)


def gguf_of(name: str = "smollm2-135m", kind: str = "F32", threads: int | None = None) -> Path:
    """A GGUF of the built-in model `name` in `kind` (F32, BF16 or Q8_0: int8 in blocks of 32
    weights with an fp16 scale each), made once by llama.cpp's own quantize and cached in
    `cache_dir()/gguf`: F32 from the shipped Q4_1 file, the others from that F32 file (the same
    float32 weights llmlab dequantises)."""
    from llmlab.model.weights import gguf_path
    from llmlab.paths import cache_dir

    if kind not in GGUF_TYPES:
        raise ValueError(f"kind must be one of {list(GGUF_TYPES)}, got {kind!r}")
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        raise RuntimeError(
            f"llama-cpp-python is not installed; add it with:\n    {install_command()}"
        )
    _quiet(llama_cpp)
    shipped = gguf_path(name)
    src = shipped if kind == "F32" else gguf_of(name, "F32", threads)
    target = cache_dir() / "gguf" / shipped.name.replace(".Q4_1.", f".{kind}.")
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, GGUF_TYPES[kind])
    params.allow_requantize = True  # the Q4_1 source is quantised: dequantise it
    params.nthread = threads or torch.get_num_threads()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({src} -> {kind}) failed with {rc}")
    tmp.rename(target)
    return target


_PROBE = """
import sys
from pathlib import Path
from llmlab.bench.llamacpp_engine import LlamaCpp
LlamaCpp(Path(sys.argv[1]), int(sys.argv[2]), repack=True).run([list(range(1, 9))], 3)
"""


@functools.lru_cache(maxsize=None)
def repacked_weights_run(gguf: str, threads: int) -> bool:
    """Whether llama.cpp runs `gguf` on this CPU with its repacked weights (the "extra buffer
    types": AMX and AVX-512 layouts chosen at load time, llama.cpp's default). A child process
    loads the model and decodes a few tokens with them; some builds crash there (a Q8_0 model on
    an AMX Xeon with llama-cpp-python 0.3.36), and then the bench runs llama.cpp without them and
    says so in its header."""
    import subprocess

    try:
        run = subprocess.run(
            [sys.executable, "-c", _PROBE, gguf, str(threads)], capture_output=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return False
    return run.returncode == 0


class LlamaCpp:
    """llama.cpp on one GGUF through llama-cpp-python's low-level API, greedy, many sequences.

    Each `run` makes a context sized for its batch (`n_seq_max` sequences of prompt + output
    tokens), so a run starts with an empty KV cache as llmlab's fresh engine does.
    """

    def __init__(
        self, gguf: Path, threads: int, kv_type: str = "f32", repack: bool | None = None
    ) -> None:
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        llama_cpp = import_llama_cpp()
        if llama_cpp is None:
            raise RuntimeError(
                f"llama-cpp-python is not installed; add it with:\n    {install_command()}"
            )
        self.lib = lib = llama_cpp
        _quiet(lib)
        lib.llama_backend_init()
        self.gguf, self.threads, self.kv_type = Path(gguf), threads, kv_type
        if repack is None:
            repack = repacked_weights_run(str(gguf), threads)
        self.repack = repack
        params = lib.llama_model_default_params()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = repack
        self.model = lib.llama_model_load_from_file(str(gguf).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))

    def close(self) -> None:
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None

    def config(self) -> dict:
        lib = self.lib
        return {
            "gguf": str(self.gguf),
            "weights": next(
                (k for k in GGUF_TYPES if f".{k}." in self.gguf.name), self.gguf.suffixes[0][1:]
            ),
            "repacked_weights": self.repack,
            "kv_cache_dtype": self.kv_type,
            "threads": self.threads,
            "flash_attention": "llama.cpp's default (auto)",
            "llama_cpp_python": getattr(lib, "__version__", None),
            "system_info": lib.llama_print_system_info().decode().strip(),
        }

    def _context(self, num_seqs: int, max_len: int, prompt_tokens: int):
        lib = self.lib
        p = lib.llama_context_default_params()
        p.n_ctx = num_seqs * max_len
        p.n_batch = max(prompt_tokens, num_seqs)  # every prompt in one llama_decode
        p.n_seq_max = num_seqs
        p.n_threads = p.n_threads_batch = self.threads
        p.type_k = p.type_v = KV_TYPES[self.kv_type]
        ctx = lib.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError(
                f"llama.cpp could not make a context for {num_seqs} sequences of {max_len} tokens"
            )
        return ctx

    def _decode(self, ctx, batch, rows: int) -> tuple:
        """One llama_decode; (the argmax of each of the `rows` logits it outputs, seconds
        inside llama_decode)."""
        import numpy as np

        t0 = time.perf_counter()
        rc = self.lib.llama_decode(ctx, batch)
        seconds = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        logits = np.ctypeslib.as_array(
            self.lib.llama_get_logits(ctx), shape=(rows, self.n_vocab)
        )  # [rows, vocab]
        return logits.argmax(axis=1), seconds

    def run(self, prompts: list[list[int]], gen_len: int) -> GreedyRun:
        """Greedy `gen_len` tokens per prompt (EOS is just another token), all at once."""
        import numpy as np

        lib = self.lib
        if not prompts or not prompts[0] or any(len(p) != len(prompts[0]) for p in prompts):
            raise ValueError(
                f"prompts must be non-empty token lists of one length, got lengths "
                f"{sorted({len(p) for p in prompts})}"
            )
        if gen_len < 2:
            raise ValueError(
                f"gen_len must be >= 2 (one token from the prefill, at least one "
                f"decode step), got {gen_len}"
            )
        num_seqs, prompt_len = len(prompts), len(prompts[0])
        n_prompt = num_seqs * prompt_len
        ctx = self._context(num_seqs, prompt_len + gen_len, n_prompt)
        prefill = lib.llama_batch_init(n_prompt, 0, 1)
        step = lib.llama_batch_init(num_seqs, 0, 1)
        try:
            # sequence ids and output flags are fixed; tokens and positions change
            for b, n, seq_of in (
                (prefill, n_prompt, lambda j: j // prompt_len),
                (step, num_seqs, lambda j: j),
            ):
                for j in range(n):
                    b.n_seq_id[j] = 1
                    b.seq_id[j][0] = seq_of(j)
                b.n_tokens = n
            flags = np.ctypeslib.as_array(prefill.logits, shape=(n_prompt,))
            flags[:] = 0
            flags[prompt_len - 1 :: prompt_len] = 1  # logits of each prompt's last token
            np.ctypeslib.as_array(step.logits, shape=(num_seqs,))[:] = 1
            step_tokens = np.ctypeslib.as_array(step.token, shape=(num_seqs,))
            step_pos = np.ctypeslib.as_array(step.pos, shape=(num_seqs,))
            out = np.empty((num_seqs, gen_len), dtype=np.int64)

            t0 = time.perf_counter()
            np.ctypeslib.as_array(prefill.token, shape=(n_prompt,))[:] = np.asarray(
                prompts
            ).reshape(-1)
            np.ctypeslib.as_array(prefill.pos, shape=(n_prompt,))[:] = np.tile(
                np.arange(prompt_len), num_seqs
            )
            out[:, 0], _ = self._decode(ctx, prefill, num_seqs)
            t_first = time.perf_counter()
            inside = 0.0
            for i in range(1, gen_len):
                step_tokens[:] = out[:, i - 1]
                step_pos[:] = prompt_len + i - 1
                out[:, i], seconds = self._decode(ctx, step, num_seqs)
                inside += seconds
            t_end = time.perf_counter()
            threads = lib.llama_n_threads(ctx)
        finally:
            lib.llama_batch_free(prefill)
            lib.llama_batch_free(step)
            lib.llama_free(ctx)
        # the time inside llama_decode: without the argmax and the Python around it
        inner = {"llama_decode_ms_per_step": 1e3 * inside / (gen_len - 1)}
        return GreedyRun(
            tokens=out.tolist(),
            prefill_seconds=t_first - t0,
            decode_seconds=t_end - t_first,
            decode_tokens=num_seqs * (gen_len - 1),
            prompt_tokens=n_prompt,
            config={**self.config(), "threads": threads},
            measured=inner,
        )
