"""Build exercises: the student writes a piece of the engine and plugs it into the real one.

A build exercise gives a skeleton (a class or a function of at most 40 lines) that the student
completes in the notebook. Its checker (in `llmlab.course.check.chNN`) then

1. **checks properties**: it draws small cases (sequences of operations, sets of requests) with
   hypothesis, runs each through the student's piece and through the package's, and on the first
   disagreement *shrinks* the case to the smallest one that still disagrees; the hint shows that
   case, what the student's piece did and what the package did;
2. **plugs it in**: the student's piece replaces the package's in the real engine (an injection
   point such as `LLM(model, scheduler_cls=...)` or `KVCacheManager(..., block_pool=...)`) on a
   workload that exercises it, and the tokens must equal the package's;
3. **measures**: what the student's version achieved, beside the package's; a time is compared
   only when both were timed in alternating rounds (`alternating_rounds`), and called the same
   when the rounds' noise cannot tell them apart.

The student's code never runs in the grader's checker process: `drive(answer, driver, ...)`
calls a *driver* (a function of this package, named by "module:function" inside
`llmlab.course.build`) with the student's class or function as its first argument. In the
notebook that happens right there; under the grader the answer is a stand-in and the call runs in
the sandbox interpreter, which sends back only the driver's plain return value (observations,
tokens, counts) for the checker to compare with the package's own, computed in the checker's
process.

`python -m llmlab check chNN [NOTEBOOK_OR_MODULE]` runs a chapter's build checks on the student's
code outside Jupyter (see `llmlab.course.check.cli`).
"""

from llmlab.course.build.core import (
    DRIVER_PREFIX,
    Counterexample,
    Raised,
    Timing,
    alternating_rounds,
    drive,
    find_counterexample,
    resolve_driver,
)

__all__ = [
    "DRIVER_PREFIX",
    "Counterexample",
    "Raised",
    "Timing",
    "alternating_rounds",
    "drive",
    "find_counterexample",
    "resolve_driver",
]
