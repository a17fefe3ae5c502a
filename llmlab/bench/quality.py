"""`python -m llmlab bench quality`: what fewer bytes per number cost in quality, measured.

For each precision (float32, bfloat16, int8 weights, fp8 KV cache, and bf16 + int8 + fp8
together), one engine on the same weights and three numbers:

- **perplexity** of `data/quality/heldout_en.txt` (prose written for llmlab, never used to
  calibrate anything; the fp8 scales come from `data/text/inference_en.txt`): exp of the mean
  negative log-probability of each token given the ones before it, from the engine's own
  prompt logprobs (vLLM's `prompt_logprobs`), so the KV cache's dtype takes part;
- **top-1 agreement**: on the same text, the share of positions whose most likely next token
  equals float32's (teacher-forced: every position sees the true text before it);
- **greedy agreement**: on a fixed set of prompts (`data/prompts.json`, English, chat template),
  32 greedy tokens each; the share of float32's tokens reproduced before the first difference
  (after a difference the two continuations are about different text), and how many of the
  prompts came out identical.

Float32 is the reference: its row reads 100 % agreement by definition. Prints a table and
writes JSON (default `build/bench-quality.json`).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from llmlab.bench import add_option, bench_parser, prefix_agreement, write_report
from llmlab.config import PRECISIONS
from llmlab.utils import format_table

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
HELDOUT = DATA_DIR / "quality" / "heldout_en.txt"


def heldout_token_ids(tokenizer, max_tokens: int) -> list[int]:
    """The held-out text's first `max_tokens` tokens."""
    return list(tokenizer.encode(HELDOUT.read_text()))[:max_tokens]


def greedy_prompts(tokenizer, num_prompts: int) -> list[list[int]]:
    """The first `num_prompts` English prompts of data/prompts.json, chat-rendered."""
    prompts = [
        p["text"]
        for p in json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]
        if p["lang"] == "en"
    ][:num_prompts]
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
            )
        )
        for p in prompts
    ]


def score_text(llm, token_ids: list[int]) -> tuple[float, list[int]]:
    """(perplexity of token_ids[1:], the most likely token at each position) from the engine's
    prompt logprobs."""
    from llmlab import SamplingParams

    out = llm.generate(
        [token_ids],
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
        use_tqdm=False,
    )[0]
    nll, top1 = 0.0, []
    for tok, entry in zip(token_ids[1:], out.prompt_logprobs[1:]):
        nll -= entry[tok].logprob
        top1.append(next(t for t, lp in entry.items() if lp.rank == 1))
    return math.exp(nll / (len(token_ids) - 1)), top1


def greedy(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from llmlab import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def measure(
    model,
    tokenizer,
    precisions: dict[str, dict],
    attention_backend: str | None,
    text_tokens: int,
    num_prompts: int,
    gen_len: int,
) -> dict:
    """The table's rows: {name: {perplexity, top1_agreement, greedy_agreement, ...}}."""
    from llmlab import LLM
    from llmlab.analysis.dtypes import precision_label

    text = heldout_token_ids(tokenizer, text_tokens)
    prompts = greedy_prompts(tokenizer, num_prompts)
    rows, ref = {}, None
    for name, kwargs in precisions.items():
        t0 = time.perf_counter()
        llm = LLM(
            model,
            tokenizer,
            attention_backend=attention_backend,
            max_model_len=max(len(text), max(map(len, prompts)) + gen_len) + 1,
            **kwargs,
        )
        ppl, top1 = score_text(llm, text)
        outs = greedy(llm, prompts, gen_len)
        if ref is None:
            ref = {"top1": top1, "greedy": outs}
        agree = [prefix_agreement(r, o) for r, o in zip(ref["greedy"], outs)]
        rows[name] = {
            "settings": kwargs,
            "precision": precision_label(llm.llm_engine),
            "attention_backend": llm.llm_engine.config.attention_backend,
            "weight_bytes": llm.llm_engine.model_runner.weight_bytes(),
            "perplexity": ppl,
            "top1_agreement": sum(a == b for a, b in zip(ref["top1"], top1)) / len(top1),
            "greedy_agreement": sum(agree) / sum(map(len, ref["greedy"])),
            "greedy_identical": sum(a == len(r) for a, r in zip(agree, ref["greedy"])),
            "seconds": time.perf_counter() - t0,
        }
        del llm
    return {"rows": rows, "text_tokens": len(text), "prompts": len(prompts), "gen_len": gen_len}


def print_table(report: dict) -> None:
    rows = report["rows"]
    print(
        f"\nquality against float32: perplexity of {report['text_tokens']} held-out tokens "
        f"(data/quality/heldout_en.txt), top-1 agreement on them, greedy agreement over "
        f"{report['prompts']} prompts x {report['gen_len']} tokens "
        f"(attention_backend={next(iter(rows.values()))['attention_backend']!r})"
    )
    table = [
        [
            name,
            f"{r['weight_bytes'] / 1e6:.0f}",
            f"{r['perplexity']:.3f}",
            f"{r['top1_agreement']:.1%}",
            f"{r['greedy_agreement']:.1%}",
            f"{r['greedy_identical']}/{report['prompts']}",
        ]
        for name, r in rows.items()
    ]
    headers = ["precision", "weights MB", "perplexity", "top-1 agree", "greedy agree", "identical"]
    print(format_table(table, headers))
    for name, r in rows.items():
        print(f"  {name}: {r['precision']}")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser("quality", __doc__.split("\n\n")[0])
    add_option(ap, "--model", "smollm2-135m", note="'tiny' for smoke runs")
    ap.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help=f"comma-separated, from {', '.join(PRECISIONS)} (float32 first: the reference)",
    )
    add_option(
        ap,
        "--attention",
        note="default: the fastest here, as LLM() picks",
        choices=["cpu", "torch"],
    )
    ap.add_argument("--text-tokens", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=8, help="prompts for greedy agreement")
    ap.add_argument("--gen-len", type=int, default=32)
    add_option(ap, "--json", "build/bench-quality.json")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.precisions.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown or not names or names[0] != "float32":
        raise ValueError(
            f"--precisions: got {names}, expected float32 first, then names from {list(PRECISIONS)}"
        )
    for name, low in (("text_tokens", 16), ("prompts", 1), ("gen_len", 1)):
        if getattr(args, name) < low:
            raise ValueError(
                f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}"
            )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llmlab.bench.llamacpp import load_model
    from llmlab.utils import cpu_name

    model, tokenizer = load_model(args.model)
    report = measure(
        model,
        tokenizer,
        {n: PRECISIONS[n] for n in names},
        args.attention,
        args.text_tokens,
        args.prompts,
        args.gen_len,
    )
    report["machine"] = {"cpu": cpu_name()}
    report["model"] = args.model
    print_table(report)
    write_report(report, args.json)
    return 0
