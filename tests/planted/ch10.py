"""Chapter 10's build exercise: the serving metrics of a raw trace (`my_metrics`)."""

import pytest

from planted import Exercise, bug, notebook_definitions

SOLUTION = notebook_definitions("10-metrics", "my_metrics")

EXERCISES = [
    Exercise(
        "ch10.metrics_from_trace",
        "my_metrics",
        SOLUTION,
        (
            bug(
                "tpot_over_n",
                SOLUTION,
                "ch10:request_hint.divided_n_n",
                "(e - f) / (n - 1) if n > 1",
                "(e - f) / n if n > 1",
            ),
            bug(
                "tokens_counted_as_chunks",
                SOLUTION,
                "ch10:request_hint.n_output_tokens",
                'tokens = [sum(k for _, k in r["chunks"]) for r in done]',
                'tokens = [len(r["chunks"]) for r in done]',
            ),
            bug(
                "itl_per_token",
                SOLUTION,
                "ch10:request_hint.gap_per_token",
                'itl = [[b - a for (a, _), (b, _) in zip(r["chunks"], r["chunks"][1:])] for r in done]',
                'itl = [[(b - a) / k for (a, _), (b, k) in zip(r["chunks"], r["chunks"][1:]) '
                "for _ in range(k)] for r in done]",
            ),
            bug(
                "ttft_from_scheduled",
                SOLUTION,
                "ch10:request_hint.measured_when_engine",
                'ttft = [r["chunks"][0][0] - r["sent"] for r in done]',
                'ttft = [r["chunks"][0][0] - r["scheduled"] for r in done]',
            ),
            bug(
                "goodput_any_target",
                SOLUTION,
                "ch10:goodput_hint.request_counts_only",
                "all(v is None or v <= slo[k]",
                "any(v is None or v <= slo[k]",
            ),
            bug(
                "goodput_not_a_rate",
                SOLUTION,
                "ch10:goodput_hint.goodput_rate_divide",
                "goodput = good / duration",
                "goodput = good",
            ),
            bug(
                "failed_requests_counted",
                SOLUTION,
                ("ch10:build_hint.m_r_n", "ch10:build_hint.raised_on_failed"),
                'done = [r for r in trace if r["ok"]]',
                "done = list(trace)",
            ),
            bug(
                "itl_averaged_per_request",
                SOLUTION,
                "ch10:stats_hint.itl_s_statistics",
                '"itl": stats([g for gaps in itl for g in gaps])',
                '"itl": stats([sum(gaps) / len(gaps) for gaps in itl if gaps])',
            ),
        ),
        solution_marks=(pytest.mark.slow, pytest.mark.model),  # it goes on to SmolLM2
    )
]
