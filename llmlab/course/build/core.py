"""What every build exercise's checker shares: running the student's piece through a driver,
finding the smallest case on which it disagrees with the package, and timing the two honestly.

    cex = find_counterexample(
        cases,                                   # a hypothesis strategy of cases
        lambda case: drive(answer, "llmlab.course.build.ch11:observe_pool", case),
        reference_observations,                  # the package's piece on the same case
    )
    if cex is not None:
        ... hint built from cex.case, cex.got, cex.expected ...

The run is reproducible: hypothesis draws the same cases every time (`derandomize`), keeps no
example database, and is bounded by `max_examples` (plus its own bounded shrinking).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

# what the grader's sandbox may call on a student's piece: the drivers of this package
from llmlab.course.instructor.sandbox import DRIVER_PREFIX, resolve_driver  # noqa: E402,F401


@dataclass(frozen=True)
class Raised:
    """What the student's piece did instead of returning: it raised `error` with `message`."""

    error: str
    message: str

    def __str__(self) -> str:
        return f"raised {self.error}: {self.message}"


@dataclass(frozen=True)
class Counterexample:
    """The smallest case found on which the student's piece and the package's disagree."""

    case: Any
    got: Any  # the student's observations, or a Raised
    expected: Any  # the package's observations


@dataclass(frozen=True)
class Timing:
    """The student's piece and the package's, timed in alternating rounds: each one's fastest
    round (seconds) and whether the two are the same within the rounds' noise."""

    mine: float
    package: float
    same: bool

    @property
    def ratio(self) -> float:
        """The student's fastest round over the package's."""
        return self.mine / max(self.package, 1e-12)


TIMING_ROUNDS = 5


def alternating_rounds(
    mine: Callable[[], float], package: Callable[[], float], rounds: int = TIMING_ROUNDS
) -> Timing:
    """Time the two pieces in `rounds` alternating rounds (`mine()` and `package()` each run one
    round and return its seconds), so that a neighbour's load falls on both alike. Each one's
    time is its fastest round (load only ever slows a round down); they are "the same" when each
    one's fastest round is no slower than the other's median round, as for identical code."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a.append(mine())
        b.append(package())
    same = min(a) <= statistics.median(b) and min(b) <= statistics.median(a)
    return Timing(min(a), min(b), same)


def drive(answer: Any, driver: str, *args: Any, **kwargs: Any) -> Any:
    """`driver(answer, *args, **kwargs)`: here for the notebook's own class or function, in the
    sandbox interpreter for the grader's stand-in (only the plain return value comes back)."""
    if getattr(answer, "grader_stand_in", False):
        return answer.drive(driver, *args, **kwargs)
    return resolve_driver(driver)(answer, *args, **kwargs)


class _Disagreement(Exception):
    pass


def find_counterexample(
    cases: Any,
    observe: Callable[[Any], Any],
    reference: Callable[[Any], Any],
    *,
    max_examples: int = 60,
    compare: Callable[[Any, Any], bool] | None = None,
    examples: Sequence[Any] = (),
) -> Counterexample | None:
    """The smallest case drawn from the hypothesis strategy `cases` on which `observe(case)`
    (the student's piece) differs from `reference(case)` (the package's), or None when none of
    `max_examples` cases does. `examples` are cases built by hand, always tried first (drawn
    cases may never reach a situation a rule is about; a built one is not shrunk). An exception
    from `observe` is a disagreement (`Raised`); a TimeoutError ends the search at once (the
    stand-in is dead after one)."""
    from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings

    compare = compare or (lambda a, b: a == b)
    last: dict[str, Any] = {}

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        report_multiple_bugs=False,
        print_blob=False,
    )
    @given(cases)
    def agrees(case: Any) -> None:
        expected = reference(case)
        if "timeout" in last:  # the student's process is gone: fail fast, shrink nothing
            raise _Disagreement
        try:
            got = observe(case)
        except TimeoutError as e:
            last.update(timeout=Counterexample(case, Raised("TimeoutError", str(e)), expected))
            raise _Disagreement from None
        except Exception as e:  # the student's code: its error is what it did on this case
            got = Raised(type(e).__name__, str(e))
        if not compare(got, expected):
            last.update(case=case, got=got, expected=expected)
            raise _Disagreement

    for case in reversed(examples):  # decorators apply bottom-up: the first example runs first
        agrees = example(case)(agrees)
    try:
        agrees()
    except Exception:  # our disagreement, or hypothesis's word for one it could not replay
        if "timeout" in last:
            return last["timeout"]
        if "case" not in last:
            raise
        return Counterexample(last["case"], last["got"], last["expected"])
    return None
