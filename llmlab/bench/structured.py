"""`python -m llmlab bench structured`: structured output measured, the share of answers that
parse and validate with and without the grammar's token mask, and what the mask costs a decode
step at each batch size.

Workload: chapter 15's prompts (`llmlab.analysis.structured.person_prompts`: a person described,
a JSON object with "name" and "age" asked for) and its schema (`PERSON_SCHEMA`). Validity: one
answer per prompt at temperature 0.7 (seeded), `--max-tokens` tokens at most, without the mask
and with it; an answer is valid when `json.loads` parses it and jsonschema accepts the value.
Cost: at batch b, b requests under the mask run to the end; once every prompt is prefilled, the
decode steps' time is split into the bitmask fill (xgrammar), applying the mask to the logits,
and the whole step; the best of `--rounds` rounds (the lowest step time) counts. Prints a table
and writes JSON (default `build/bench-structured.json`).
"""

from __future__ import annotations

import os

from llmlab.bench import (
    add_option,
    bench_parser,
    default_attention_backend,
    machine_info,
    write_report,
)
from llmlab.utils import format_table


def main(argv: list[str] | None = None) -> int:
    fast = os.environ.get("LLMLAB_FAST") == "1"
    ap = bench_parser("structured", __doc__.split("\n\n")[0])
    add_option(ap, "--model", "smollm2-135m", note="or HF directory")
    ap.add_argument("--prompts", type=int, default=None, help="validity prompts (default 64)")
    add_option(ap, "--batches", note="default 1,64; --fast 1,8")
    ap.add_argument("--max-tokens", type=int, default=48, help="output tokens at most (48)")
    ap.add_argument("--rounds", type=int, default=None, help="cost rounds, best counts (2)")
    add_option(ap, "--json", "build/bench-structured.json")
    add_option(ap, "--fast", note="LLMLAB_FAST=1 too")
    args = ap.parse_args(argv)
    fast = fast or args.fast
    n = args.prompts or (8 if fast else 64)
    batches = [int(b) for b in (args.batches or ("1,8" if fast else "1,64")).split(",")]
    rounds = args.rounds or (1 if fast else 2)
    if n < 1 or n > 64 or any(not 1 <= b <= 64 for b in batches) or rounds < 1:
        ap.error("--prompts and each of --batches must be in [1, 64], --rounds >= 1")

    import torch

    from llmlab import LLM
    from llmlab.analysis import structured
    from llmlab.model import load_model

    model, tokenizer = load_model(args.model)
    attention = default_attention_backend(model)
    llm = LLM(
        model,
        tokenizer,
        attention_backend=attention,
        max_model_len=128 + args.max_tokens,
        max_num_seqs=max(batches + [n]),
    )
    print(
        f"bench structured: {args.model}, attention {attention}, {torch.get_num_threads()} "
        f"threads; {machine_info()['cpu']}",
        flush=True,
    )
    schema = structured.PERSON_SCHEMA
    prompts = structured.person_prompts(tokenizer, n)
    validity = {}
    for masked in (False, True):
        r = structured.validity(
            llm, prompts, schema, masked, temperature=0.7, max_tokens=args.max_tokens
        )
        validity["with" if masked else "without"] = {k: r[k] for k in ("rate", "valid", "n")}
        print(f"  {'with' if masked else 'without'} the mask: {r['valid']}/{r['n']} valid")
    cost = {}
    for b in batches:
        best = None
        for _ in range(rounds):
            c = structured.mask_cost(
                llm, structured.person_prompts(tokenizer, b), schema, args.max_tokens
            )
            if best is None or c["step"] < best["step"]:
                best = c
        cost[str(b)] = best
        print(f"  batch {b}: step {1e3 * best['step']:.1f} ms", flush=True)
    report = {
        "validity": validity,
        "mask_cost": cost,
        "machine": machine_info(),
        "settings": {
            "model": args.model,
            "attention_backend": attention,
            "prompts": n,
            "batches": batches,
            "max_tokens": args.max_tokens,
            "rounds": rounds,
            "temperature": 0.7,
        },
    }
    print_table(report)
    write_report(report, args.json)
    return 0


def print_table(report: dict) -> None:
    v = report["validity"]
    print(
        f"\nstructured output, {report['machine']['cpu']}, {report['machine']['threads']} threads"
    )
    print(
        format_table(
            [[k, f"{x['valid']}/{x['n']}", f"{100 * x['rate']:.0f}%"] for k, x in v.items()],
            ["mask", "valid answers", "rate"],
        )
    )
    rows = []
    for b, c in report["mask_cost"].items():
        share = (c["fill"] + c["apply"]) / c["step"]
        rows.append(
            [
                b,
                f"{1e3 * c['fill']:.3f}",
                f"{1e3 * c['fill'] / c['batch']:.4f}",
                f"{1e3 * c['apply']:.3f}",
                f"{1e3 * c['step']:.1f}",
                f"{100 * share:.1f}%",
            ]
        )
    print(
        format_table(
            rows,
            ["batch", "fill ms", "fill ms/request", "apply ms", "step ms", "mask share"],
        )
    )
    print("per decode step: fill = xgrammar fills the bitmask; apply = forbidden logits to -inf")
