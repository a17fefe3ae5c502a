"""`python -m llmlab bench spec`: tokens/s with and without speculative decoding, against batch
size, on a repetitive and a free-form workload, with the acceptance rate.

Speculation trades compute for memory traffic: a verify step over k + 1 tokens reads the
weights once, like a one-token step, so where a step is bound by reading the weights (batch 1
on a CPU) every accepted draft token is nearly free; as the batch grows the step becomes bound
by compute, the k + 1 positions cost k + 1 times the FLOPs, and rejected drafts are paid for in
full. The benchmark measures where that crossing lies on the machine at hand.

- repetitive: the model is asked to copy a paragraph of `data/text/inference_en.txt` (what
  editing code or quoting a document looks like to prompt lookup);
- free-form: the chat prompts of `data/prompts.json` (short questions, new text in the answer).

Systems, each an `LLM` built once (start-up not timed): `plain`; `ngram` (prompt lookup,
`--k` tokens, n-grams of `--prompt-lookup-min` to `--prompt-lookup-max` tokens, 1 to 4 by
default); `draft_model` (the target's first `--draft-layers` layers as the draft, greedy). Every request is greedy with EOS ignored, `--max-tokens` tokens, so every
system produces the same tokens (a test checks that speculation keeps greedy output). At batch
b, b requests run together; the systems alternate at each batch size, `--rounds` times, and the
best round counts. Prints a table and writes JSON (default `build/bench-spec.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass

from llmlab.bench import (
    add_option,
    bench_parser,
    default_attention_backend,
    machine_info,
    write_report,
)
from llmlab.paths import DATA_DIR
from llmlab.utils import cdiv, format_table

WORKLOADS = ("repetitive", "free-form")
SYSTEMS = ("plain", "ngram", "draft_model")


def build_workloads(tokenizer, num: int) -> dict[str, list[list[int]]]:
    """`num` prompts (token ids, chat template applied) for each workload."""
    paragraphs = [
        p.strip()
        for p in (DATA_DIR / "text" / "inference_en.txt").read_text().split("\n\n")
        if len(p.split()) > 40
    ]
    questions = [p["text"] for p in json.loads((DATA_DIR / "prompts.json").read_text())["prompts"]]

    def chat(text: str) -> list[int]:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer.encode(rendered)

    return {
        "repetitive": [
            chat(
                f"Request {i}. Copy the following paragraph exactly, word for word:"
                f"\n\n{paragraphs[i % len(paragraphs)]}"
            )
            for i in range(num)
        ],
        "free-form": [chat(questions[i % len(questions)]) for i in range(num)],
    }


def spec_configs(
    k: int, draft_layers: int, lookup_min: int = 1, lookup_max: int = 4
) -> dict[str, dict | None]:
    return {
        "plain": None,
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": lookup_min,
            "prompt_lookup_max": lookup_max,
        },
        "draft_model": {
            "method": "draft_model",
            "num_speculative_tokens": k,
            "draft_num_layers": draft_layers,
        },
    }


def run_once(llm, prompts: list[list[int]], max_tokens: int) -> dict:
    """Generate for `prompts` together; tokens, seconds and the speculation counters' change."""
    from llmlab import SamplingParams

    engine = llm.llm_engine
    before = engine.stats()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    after = engine.stats()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    row = {"output_tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds}
    if "spec_decode_num_drafts" in after:
        drafts = after["spec_decode_num_drafts"] - before["spec_decode_num_drafts"]
        proposed = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
        accepted = (
            after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
        )
        row.update(
            drafts=drafts,
            draft_tokens=proposed,
            accepted_tokens=accepted,
            acceptance_rate=accepted / proposed if proposed else 0.0,
            mean_acceptance_length=1 + accepted / drafts if drafts else 1.0,
            steps=after["steps"] - before["steps"],
        )
    return row


def stops_paying(rows: dict, workload: str, system: str, batches: list[int]) -> int | None:
    """The smallest batch at which `system` is slower than plain on `workload` (None: never)."""
    for b in batches:
        r = rows[workload][str(b)]
        if r[system]["tok_per_s"] < r["plain"]["tok_per_s"]:
            return b
    return None


def parser() -> argparse.ArgumentParser:
    ap = bench_parser("spec", __doc__.split("\n\n")[0])
    add_option(ap, "--model", "smollm2-135m", note="or HF directory")
    add_option(ap, "--batches", note="default 1,8,32,64; --fast 1,8")
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="output tokens per request (default 128; --fast 48)",
    )
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default 4)")
    ap.add_argument(
        "--prompt-lookup-min",
        type=int,
        default=1,
        help="shortest n-gram the ngram method matches (default 1)",
    )
    ap.add_argument(
        "--prompt-lookup-max",
        type=int,
        default=4,
        help="longest n-gram the ngram method matches (default 4)",
    )
    ap.add_argument(
        "--draft-layers",
        type=int,
        default=8,
        help="layers of the early-exit draft model (default 8 of 30)",
    )
    ap.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated subset (plain is always run: it is the baseline)",
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="alternating rounds per batch size, the best counts (default 2; --fast 1)",
    )
    add_option(ap, "--json", "build/bench-spec.json")
    add_option(ap, "--fast", note="LLMLAB_FAST=1 too")
    return ap


@dataclass
class Plan:
    """What the command line asks for, with the defaults of `--fast` filled in."""

    batches: list[int]
    max_tokens: int
    rounds: int
    systems: list[str]  # "plain" first: the baseline
    workloads: list[str]


def plan(args: argparse.Namespace, ap: argparse.ArgumentParser) -> Plan:
    fast = args.fast or os.environ.get("LLMLAB_FAST") == "1"
    bad = [s for s in args.systems.split(",") if s not in SYSTEMS]
    bad += [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown system or workload {bad}; systems: {SYSTEMS}, workloads: {WORKLOADS}")
    return Plan(
        batches=[int(b) for b in (args.batches or ("1,8" if fast else "1,8,32,64")).split(",")],
        max_tokens=args.max_tokens or (48 if fast else 128),
        rounds=args.rounds or (1 if fast else 2),
        systems=["plain"] + [s for s in args.systems.split(",") if s != "plain"],
        workloads=args.workloads.split(","),
    )


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    p = plan(args, ap)
    from llmlab.model import load_model

    model, tokenizer = load_model(args.model)
    work = build_workloads(tokenizer, max(p.batches))
    configs = spec_configs(
        args.k, args.draft_layers, args.prompt_lookup_min, args.prompt_lookup_max
    )
    llms, attention = build_systems(model, tokenizer, work, p, args, configs)
    rows = measure(llms, work, p)
    report = {
        "rows": rows,
        "machine": machine_info(),
        "settings": {
            "model": args.model,
            "attention_backend": attention,
            "batches": p.batches,
            "max_tokens": p.max_tokens,
            "rounds": p.rounds,
            "greedy": True,
            "ignore_eos": True,
            "speculative_configs": {n: configs[n] for n in p.systems},
        },
        "stops_paying_at_batch": {
            w: {s: stops_paying(rows, w, s, p.batches) for s in p.systems if s != "plain"}
            for w in p.workloads
        },
    }
    print_table(report)
    write_report(report, args.json)
    return 0


def build_systems(
    model,
    tokenizer,
    work: dict[str, list[list[int]]],
    p: Plan,
    args: argparse.Namespace,
    configs: dict,
) -> tuple[dict, str]:
    """An `LLM` per system, sized for the largest batch and the longest request, warmed up
    (start-up and the first step are not timed); and the attention backend they use."""
    import torch

    from llmlab import LLM

    attention = default_attention_backend(model)
    longest = max(len(prompt) for prompts in work.values() for prompt in prompts)
    max_len = longest + p.max_tokens + args.k + 1
    llms = {
        name: LLM(
            model,
            tokenizer,
            attention_backend=attention,
            max_model_len=max_len,
            max_num_seqs=max(p.batches),
            num_kv_blocks=max(p.batches) * cdiv(max_len, 16) + 16,
            speculative_config=configs[name],
        )
        for name in p.systems
    }
    print(
        f"bench spec: {args.model}, attention {attention}, {torch.get_num_threads()} threads, "
        f"greedy, {p.max_tokens} tokens per request, k={args.k}, draft model "
        f"{args.draft_layers} layers; {machine_info()['cpu']}",
        flush=True,
    )
    for llm in llms.values():  # warm-up, not timed
        run_once(llm, [work["free-form"][0][:16]], 4)
    return llms, attention


def measure(llms: dict, work: dict[str, list[list[int]]], p: Plan) -> dict[str, dict[str, dict]]:
    """rows[workload][batch][system]: the best of `p.rounds` rounds, the systems' order
    alternating from round to round; a line printed per batch size."""
    rows: dict[str, dict[str, dict]] = {}
    for workload in p.workloads:
        rows[workload] = {}
        for b in p.batches:
            prompts = work[workload][:b]
            best: dict[str, dict] = {}
            for r in range(p.rounds):
                for name in p.systems if r % 2 == 0 else p.systems[::-1]:
                    row = run_once(llms[name], prompts, p.max_tokens)
                    if name not in best or row["tok_per_s"] > best[name]["tok_per_s"]:
                        best[name] = row
            rows[workload][str(b)] = best
            line = f"  {workload:<11} batch {b:>3}: " + ", ".join(
                f"{n} {best[n]['tok_per_s']:.1f} tok/s" for n in p.systems
            )
            print(line, flush=True)
    return rows


def print_table(report: dict) -> None:
    rows, s = report["rows"], report["settings"]
    systems = [n for n in s["speculative_configs"] if n != "plain"]
    print(
        f"\nspeculative decoding, greedy, {s['max_tokens']} tokens per request, "
        f"{report['machine']['cpu']}, {report['machine']['threads']} threads"
    )
    headers = ["workload", "batch", "plain tok/s"]
    for n in systems:
        headers += [f"{n} tok/s", "speed-up", "accept", "len"]
    table = []
    for workload, by_batch in rows.items():
        for b, r in by_batch.items():
            plain = r["plain"]["tok_per_s"]
            line = [workload, b, f"{plain:.1f}"]
            for n in systems:
                x = r[n]
                line += [
                    f"{x['tok_per_s']:.1f}",
                    f"{x['tok_per_s'] / plain:.2f}x",
                    f"{100 * x['acceptance_rate']:.0f}%",
                    f"{x['mean_acceptance_length']:.2f}",
                ]
            table.append(line)
    print(format_table(table, headers))
    print(
        "accept: accepted / proposed draft tokens; len: tokens per verify step with a draft "
        "(1 + accepted / drafts)"
    )
    for workload, per in report["stops_paying_at_batch"].items():
        print(
            f"{workload}: speculation stops paying at batch "
            + ", ".join(
                f"{n} {b if b is not None else 'never (up to the largest batch)'}"
                for n, b in per.items()
            )
        )
