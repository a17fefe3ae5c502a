"""Chapter 08's build exercise: the continuous-batching step (`MyScheduler.schedule`)."""

from planted import Bug, Exercise, bug, notebook_definitions

SOLUTION = notebook_definitions("08-batching", "MyScheduler")


def _waiting_first(source: str) -> str:
    """Waiting requests admitted before the running ones are served (decodes not first)."""
    a = source.index("        for req in list(running):")
    b = source.index("        while not out.preempted")
    c = source.index("        self.record_step(out)")
    running, waiting = source[a:b], source[b:c]
    waiting = "        old = list(running)\n" + waiting.replace(
        "while not out.preempted and ", "while "
    )
    return (
        source[:a]
        + waiting
        + running.replace("for req in list(running):", "for req in old:")
        + source[c:]
    )


RULE = "ch08:rule."
EXERCISES = [
    Exercise(
        "ch08.build_scheduler",
        "MyScheduler",
        SOLUTION,
        (
            Bug("waiting_first", _waiting_first(SOLUTION), RULE + "running_requests_come"),
            bug(
                "oldest_preempted",
                SOLUTION,
                RULE + "wrong_request_preempted",
                "self.preempt(running.pop(), out)                # the newest",
                "self.preempt(running.pop(0), out)               # the newest",
            ),
            bug(
                "max_num_seqs_ignored",
                SOLUTION,
                RULE + "more_requests_running",
                " and len(running) < self.max_num_seqs:",
                ":",
            ),
            bug(
                "budget_not_decreased",
                SOLUTION,
                RULE + "over_token_budget",
                "            budget -= num_new\n        self.record_step",
                "        self.record_step",
            ),
            bug(
                "admits_in_a_step_that_preempted",
                SOLUTION,
                RULE + "no_admission_after_preemption",
                "while not out.preempted and ",
                "while ",
            ),
            bug(
                "decode_one_token_short",
                SOLUTION,
                RULE + "running_request_brings",
                "num_new = min(req.num_tokens - req.num_computed_tokens, budget)",
                "num_new = min(req.num_tokens - req.num_computed_tokens - 1, budget)",
            ),
            bug(
                "prefix_cache_ignored",
                SOLUTION,
                RULE + "running_request_brings",
                "num_new = min(req.num_tokens - num_cached, budget)",
                "num_new = min(req.num_tokens, budget)",
                "self.admit(req, num_cached)",
                "self.admit(req, 0)",
            ),
        ),
    )
]
