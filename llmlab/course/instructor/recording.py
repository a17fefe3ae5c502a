"""The grader's recording in the student's kernel: each expected exercise's checker wrapped so
that every call first appends its arguments, encoded as `answers` carries them, as one JSON line
to a file the grader chose, then runs the checker as before (the student still sees its line)."""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any, Callable, Iterable

from llmlab.course.instructor.answers import MAX_RECORD_CHARS, AnswerFormatError, encode


def record_calls(path: str, exercise_ids: Iterable[str]) -> list[str]:
    """Wrap the checker of each exercise in this interpreter so that every call first appends
    `{"exercise", "args", "kwargs"}` (or `{"exercise", "error"}`) as one JSON line to `path`,
    then runs the checker. Returns the ids whose checker was found and wrapped."""
    wrapped = []
    for ex in exercise_ids:
        module_name, _, name = ex.partition(".")
        try:
            module = importlib.import_module(f"llmlab.course.check.{module_name}")
        except ImportError:
            continue
        checker = getattr(module, name, None)
        if callable(checker):
            setattr(module, name, _recording(ex, checker, path))
            wrapped.append(ex)
    return wrapped


def _recording(exercise: str, checker: Callable, path: str) -> Callable:
    @functools.wraps(checker)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            record = {
                "exercise": exercise,
                "args": [encode(a) for a in args],
                "kwargs": {k: encode(v) for k, v in kwargs.items()},
            }
            line = json.dumps(record)
            if len(line) > MAX_RECORD_CHARS:
                raise AnswerFormatError(
                    f"the answer takes more than {MAX_RECORD_CHARS} characters to record"
                )
        except (AnswerFormatError, RecursionError, TypeError, ValueError) as e:
            line = json.dumps({"exercise": exercise, "error": str(e)})
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        return checker(*args, **kwargs)

    return recorded
