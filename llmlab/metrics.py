"""`from llmlab.metrics import summarize`: the serving metrics as DESIGN.md's public API names
them (RequestOutputs -> TTFT, TPOT, ITL, E2EL, throughput, goodput). They are computed in
`llmlab.analysis.metrics`; the course and the tests import them from there."""

from llmlab.analysis.metrics import summarize

__all__ = ["summarize"]
