"""`python -m llmlab bench serve`: a benchmark client for any OpenAI-compatible server.

It plays many users at once, as vLLM's `vllm bench serve` does: requests leave at arrival
times drawn from a Poisson process (or gamma gaps, `--burstiness`) at `--request-rate`, at most
`--max-concurrency` in flight, each streamed. For every request it stamps the time it was sent
and the time each chunk with a non-empty `choices` came back; `llmlab.analysis.metrics` turns those into
TTFT, TPOT, ITL, E2EL (mean, median, p90, p99), request and token throughput, and goodput under
SLOs (`--goodput ttft:500 tpot:50`, milliseconds, vLLM's syntax). Output lengths come from the
server's `usage` (requested with `stream_options.include_usage`), else one token per chunk.

Against llmlab's own server (`--launch` starts one) `--compare-offline` also runs the same
requests in this process: `LLM.generate` at saturation (the throughput ratio) and the engine
driven at the same arrivals (`metrics.run_with_arrivals`) for each finite rate, which gives the
HTTP cost per token: median ITL over HTTP minus median ITL in process.

Results go to JSON (default `build/bench-serve.json`) with the machine, the settings and the date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import os
from dataclasses import dataclass
from typing import Any

from llmlab.analysis.metrics import BenchmarkSummary
from llmlab.bench import add_option, bench_parser, machine_info, write_report
from llmlab.bench.serve_client import (
    BenchRequest,
    RequestRecord,
    build_requests,
    fetch_json,
    parse_goodput,
    run_requests,
    summarize_records,
    summary_dict,
)
from llmlab.bench.serve_offline import engine_prompt_ids, offline_llm, run_in_process, run_offline

# ---- a run from sync code ---------------------------------------------------------------------


def benchmark(
    base_url: str,
    requests: list[BenchRequest],
    model: str,
    slo: dict[str, float] | None = None,
    **kwargs: Any,
) -> tuple[BenchmarkSummary, list[RequestRecord]]:
    """Run `run_requests` to the end (from sync code, e.g. a notebook) and summarize it."""
    records, duration = _run_async(run_requests(base_url, requests, model, **kwargs))
    return summarize_records(records, duration, slo, [r.prompt_len for r in requests]), records


def _run_async(coro: Any) -> Any:
    """asyncio.run, also where a loop already runs (a Jupyter kernel): then on a thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def warm_up(
    base_url: str,
    model: str,
    prompt: str | list[int],
    endpoint: str = "/v1/completions",
    timeout: float = 300.0,
) -> None:
    """One two-token request before measuring (as vLLM's client does): a server's first steps
    pay one-time costs that are not serving."""
    (rec,) = _run_async(
        run_requests(
            base_url,
            [BenchRequest(prompt, 2)],
            model,
            endpoint=endpoint,
            timeout=timeout,
            max_seconds=timeout,
            progress=False,
        )
    )[0]
    if not rec.success:
        raise RuntimeError(f"the warm-up request failed: {rec.error}")


def scrape_metrics(base_url: str) -> dict[str, float]:
    """The server's `/metrics`, `{name: value}` (labels dropped; buckets left out)."""
    import httpx

    from llmlab.serve.prometheus import parse_prometheus

    text = httpx.get(base_url.rstrip("/") + "/metrics", timeout=10).text
    return {
        k.split("{")[0]: v
        for k, v in parse_prometheus(text).items()
        if "_bucket{" not in k and "finished_reason" not in k
    }


def http_cost_per_token(http: BenchmarkSummary, in_process: BenchmarkSummary) -> float | None:
    """Median ITL over HTTP minus median ITL in process (seconds per token), same workload."""
    if http.itl.median is None or in_process.itl.median is None:
        return None
    return http.itl.median - in_process.itl.median


# ---- the command ------------------------------------------------------------------------------


def machine_and_date() -> dict[str, Any]:
    return {
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--request-rate: numbers or inf, comma-separated; got {text!r}"
        ) from None
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"--request-rate values must be > 0, got {text!r}")
    return rates


def parser() -> argparse.ArgumentParser:
    ap = bench_parser("serve", __doc__)
    _server_args(ap)
    _workload_args(ap)
    _run_args(ap)
    return ap


def _server_args(ap: argparse.ArgumentParser) -> None:
    """Which server, which endpoint, which model."""
    ap.add_argument("--base-url", default=None, help="server (default http://127.0.0.1:8000)")
    ap.add_argument(
        "--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions"
    )
    ap.add_argument("--model", default=None, help="model name (default: the server's first)")
    ap.add_argument(
        "--launch",
        nargs="?",
        const="",
        default=None,
        metavar="SERVE_ARGS",
        help="start `python -m llmlab serve SERVE_ARGS` for the run, e.g. "
        "--launch='--max-model-len 1024'",
    )


def _workload_args(ap: argparse.ArgumentParser) -> None:
    """What to send and when: prompts, output lengths, rates, SLOs."""
    ap.add_argument("--dataset", default="prompts", choices=("prompts", "random"))
    ap.add_argument("--random-input-len", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=None, help="requests (default 64; --fast 8)")
    ap.add_argument(
        "--output-len", type=int, default=None, help="output tokens (default 64; --fast 8)"
    )
    ap.add_argument(
        "--min-output-len",
        type=int,
        default=None,
        help="draw output lengths uniformly from [this, --output-len]",
    )
    ap.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at EOS (default: exactly --output-len tokens)",
    )
    ap.add_argument(
        "--request-rate",
        type=_rates,
        default=[math.inf],
        help="requests/s, comma-separated for several runs; inf: all at once",
    )
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson")
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="KEY:MS",
        help="SLOs in ms, e.g. ttft:500 tpot:50 (keys ttft, tpot, e2el)",
    )


def _run_args(ap: argparse.ArgumentParser) -> None:
    """How to run and what to write: the offline comparison, rounds, limits, the result file."""
    ap.add_argument(
        "--compare-offline",
        action="store_true",
        help="also run the requests in this process (llmlab servers), with the "
        "engine settings of --launch (else serve's defaults): offline "
        "LLM.generate throughput at rate inf, and the engine at the same "
        "arrivals for finite rates (the HTTP cost per token)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --compare-offline at rate inf: alternate offline and HTTP this "
        "many times, report the best of each",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--client-nice",
        type=int,
        default=None,
        help="lower this client's CPU priority by N once the server runs (default: "
        "10 with --launch, where client and server share this machine's cores "
        "and the client would otherwise take CPU a remote client would not; 0 "
        "with --base-url)",
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="seconds per run, at most")
    ap.add_argument("--disable-tqdm", action="store_true")
    add_option(ap, "--fast")
    add_option(ap, "--json", "build/bench-serve.json")


@dataclass
class Setup:
    """What every measured rate shares: the workload, the server and the in-process twin."""

    args: argparse.Namespace
    requests: list[BenchRequest]
    slo: dict[str, float] | None
    base_url: str
    model: str = ""
    llm: Any = None  # with --compare-offline: the engine with the server's settings
    prompts: list[list[int]] | None = None  # the token ids the server makes of each request


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.client_nice is not None and not 0 <= args.client_nice <= 19:
        raise ValueError(f"--client-nice must be in [0, 19], got {args.client_nice}")
    requests, slo = workload(args)
    server, serve_args, base_url = start_server(args)
    report: dict[str, Any] = {}
    try:
        setup = prepare(Setup(args, requests, slo, base_url), serve_args)
        runs = [measure_rate(setup, rate) for rate in args.request_rate]
        report = build_report(setup, serve_args, runs)
    finally:
        if server is not None:
            server.stop()
    write_report(report, args.json, default=_jsonable)
    return 0


def workload(args: argparse.Namespace) -> tuple[list[BenchRequest], dict[str, float] | None]:
    """The requests to send (`--fast`: a small workload) and the goodput SLOs."""
    requests = build_requests(
        _num_prompts(args),
        _output_len(args),
        args.min_output_len,
        args.dataset,
        args.random_input_len,
        args.seed,
    )
    return requests, parse_goodput(args.goodput)


def _num_prompts(args: argparse.Namespace) -> int:
    return args.num_prompts or (8 if args.fast else 64)


def _output_len(args: argparse.Namespace) -> int:
    return args.output_len or (8 if args.fast else 64)


def start_server(args: argparse.Namespace) -> tuple[Any, list[str] | None, str]:
    """(the launched server or None, its arguments, the base URL); then this client's CPU
    priority lowered (after the server started, which keeps its own)."""
    from llmlab import openmp

    server = serve_args = None
    base_url = args.base_url or "http://127.0.0.1:8000"
    if args.launch is not None:
        from llmlab.serve.launch import ServerProcess

        serve_args = args.launch.split()
        server = ServerProcess(None, serve_args)
        base_url = server.url
    nice = args.client_nice if args.client_nice is not None else (10 if server else 0)
    if nice and hasattr(os, "nice"):
        os.nice(nice)
        print(f"client priority lowered by {nice} (the server's is unchanged)", flush=True)
    print(
        f"OpenMP: {openmp.describe()} (this client's offline runs and a launched server alike)",
        flush=True,
    )
    return server, serve_args, base_url


def prepare(setup: Setup, serve_args: list[str] | None) -> Setup:
    """The model's name, the in-process engine where asked, and one short request to each first
    (as vLLM's client does): a first step pays one-time costs that are not serving."""
    args, requests = setup.args, setup.requests
    setup.model = args.model or fetch_json(setup.base_url, "/v1/models")["data"][0]["id"]
    if args.compare_offline:
        chat = "chat" in args.endpoint
        setup.llm = offline_llm(serve_args or [])
        tokenizer = setup.llm.get_tokenizer()
        setup.prompts = [engine_prompt_ids(tokenizer, r, chat) for r in requests]
    warm_up(setup.base_url, setup.model, requests[0].prompt, args.endpoint, args.timeout)
    if setup.llm is not None:
        run_offline(setup.llm, setup.prompts[:1], [BenchRequest(requests[0].prompt, 2)], True)
    return setup


def measure_rate(setup: Setup, rate: float) -> dict[str, Any]:
    """One request rate: the HTTP run (best of `--rounds`, alternating with the offline run at
    rate inf), and with --compare-offline the in-process comparison; printed as it goes."""
    args = setup.args
    summary, records, offline, rounds = _best_of_rounds(setup, rate)
    run: dict[str, Any] = {"request_rate": _rate(rate), "http": summary_dict(summary, records)}
    print(f"\n--- {setup.base_url}{args.endpoint}, rate {rate:g} req/s ---\n{summary.table()}")
    if offline is not None:
        ratio = summary.output_throughput / offline["output_throughput"]
        run["offline"] = dict(offline, http_over_offline=ratio)
        print(
            f"offline LLM.generate: {offline['output_throughput']:.1f} tok/s; "
            f"HTTP / offline = {ratio:.3f} (best of {rounds})"
        )
    if setup.llm is not None and not math.isinf(rate):
        run.update(_in_process(setup, rate, summary))
    return run


def _best_of_rounds(
    setup: Setup, rate: float
) -> tuple[BenchmarkSummary, list[RequestRecord], dict[str, float] | None, int]:
    """(the best HTTP summary, its records, the best offline run or None, the rounds run)."""
    args, requests = setup.args, setup.requests
    offline_too = setup.llm is not None and math.isinf(rate)
    rounds = args.rounds if offline_too else 1
    best_http, best_offline = None, None
    for k in range(rounds):
        if offline_too:
            off = run_offline(setup.llm, setup.prompts, requests, args.ignore_eos)
            if best_offline is None or off["output_throughput"] > best_offline["output_throughput"]:
                best_offline = off
        summary, records = benchmark(
            setup.base_url,
            requests,
            setup.model,
            setup.slo,
            endpoint=args.endpoint,
            request_rate=rate,
            burstiness=args.burstiness,
            max_concurrency=args.max_concurrency,
            ignore_eos=args.ignore_eos,
            seed=args.seed,
            timeout=args.timeout,
            max_seconds=args.max_seconds,
            progress=not args.disable_tqdm,
        )
        if rounds > 1:
            print(
                f"round {k + 1}: offline {off['output_throughput']:.1f} tok/s, "
                f"HTTP {summary.output_throughput:.1f} tok/s",
                flush=True,
            )
        if best_http is None or summary.output_throughput > best_http[0].output_throughput:
            best_http = (summary, records)
    return best_http[0], best_http[1], best_offline, rounds


def _in_process(setup: Setup, rate: float, http: BenchmarkSummary) -> dict[str, Any]:
    """The engine at the HTTP run's arrivals, and the HTTP cost per token it shows."""
    args = setup.args
    inproc = run_in_process(
        setup.llm,
        setup.prompts,
        setup.requests,
        rate,
        args.burstiness,
        args.seed,
        args.ignore_eos,
        setup.slo,
    )
    cost = http_cost_per_token(http, inproc)
    print(
        f"in process at the same arrivals:\n{inproc.table()}\nHTTP cost per "
        f"token (median ITL, HTTP − in process): "
        f"{'—' if cost is None else f'{cost * 1e3:.2f} ms'}"
    )
    return {
        "in_process": summary_dict(inproc, []),
        "http_cost_per_token_p50_ms": None if cost is None else cost * 1e3,
    }


def build_report(
    setup: Setup, serve_args: list[str] | None, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON report: the machine and date, every setting, the runs."""
    from llmlab import openmp

    args, slo = setup.args, setup.slo
    settings = {
        "base_url": setup.base_url,
        "endpoint": args.endpoint,
        "model": setup.model,
        "dataset": args.dataset,
        "num_prompts": _num_prompts(args),
        "output_len": _output_len(args),
        "min_output_len": args.min_output_len,
        "ignore_eos": args.ignore_eos,
        "request_rates": [_rate(r) for r in args.request_rate],
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "seed": args.seed,
        "goodput_slo_ms": None if slo is None else {k: v * 1e3 for k, v in slo.items()},
        "launched_server_args": serve_args,
        "rounds": args.rounds,
        "openmp": openmp.describe(),
    }
    return {**machine_and_date(), "settings": settings, "runs": runs}


def _rate(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate


def _jsonable(x: Any) -> Any:
    return str(x)
