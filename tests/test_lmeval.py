"""lm-evaluation-harness, an outside client, scores llmlab's server: its `local-completions`
model asks for echo + logprobs (multiple choice) and for stop strings (generation). The
loglikelihoods it reports must equal the engine's own prompt logprobs, computed in process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from llmlab import LLM, SamplingParams
from llmlab.model.weights import model_dir
from llmlab.serve.launch import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
LM_EVAL = ROOT / ".venv-lmeval" / "bin" / "lm_eval"
MODEL = "smollm2-135m"

pytestmark = [
    pytest.mark.lmeval,
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.skipif(
        not LM_EVAL.is_file(),
        reason="lm-evaluation-harness is not installed here: `make lmeval` adds it (.venv-lmeval)",
    ),
]


def run_lm_eval(url: str, out: Path) -> None:
    args = (
        f"base_url={url}/v1/completions,model={MODEL},tokenizer={model_dir(MODEL)},"
        "num_concurrent=4,max_retries=1"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            str(LM_EVAL),
            "--model",
            "local-completions",
            "--model_args",
            args,
            "--include_path",
            "data/lm_eval",
            "--tasks",
            "llmlab_capitals,llmlab_capitals_gen",
            "--output_path",
            str(out),
            "--log_samples",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_lm_eval_through_the_server_scores_what_the_engine_computes(real_model, tmp_path):
    with ServerProcess(MODEL, ["--max-model-len", "512"]) as srv:
        run_lm_eval(srv.url, tmp_path)
    results = json.loads(next(tmp_path.rglob("results_*.json")).read_text())["results"]
    assert results["llmlab_capitals"]["acc,none"] >= 0.5
    mc = [
        json.loads(line)
        for f in tmp_path.rglob("samples_llmlab_capitals_2*.jsonl")
        for line in f.read_text().splitlines()
    ]
    gen = [
        json.loads(line)
        for f in tmp_path.rglob("samples_llmlab_capitals_gen_*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert len(mc) == 8 and len(gen) == 8
    model, tokenizer = real_model
    llm = LLM(model, tokenizer, max_model_len=512, num_kv_blocks=256)
    checked = 0
    for sample in mc:
        pairs = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        for (context, continuation), resp in zip(pairs, sample["resps"]):
            # lm-evaluation-harness's split: the context's tokens, then the rest of the whole
            whole = tokenizer.encode(context + continuation)
            start = len(tokenizer.encode(context))
            out = llm.generate(
                [whole],
                SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0),
                use_tqdm=False,
            )[0]
            want = sum(out.prompt_logprobs[i][whole[i]].logprob for i in range(start, len(whole)))
            assert float(resp[0][0]) == pytest.approx(want, abs=1e-3)
            checked += 1
    assert checked == 32
    for sample in gen:  # the stop strings ("until") ended every answer
        answer = sample["resps"][0][0]
        assert answer.strip() and not any(s in answer for s in ("\n", ".", ","))
    assert results["llmlab_capitals_gen"]["exact_match,none"] >= 0.5
