"""A student's function, alone in its own interpreter: the only place outside the kernel where
the grader runs the student's code.

A checker that takes a function (write-your-own-attention) calls it a few times on inputs of its
own and compares the results. The checker process (`recheck`) must not run the student's code
itself, or that code could print or return any verdict it liked. So the checker gets a stand-in
(`recheck.SandboxedFunction`): calling it sends the arguments here, to an interpreter that holds
only the student's function, and reads back the result. The student's code here can compute
whatever it likes, but all it can hand back is a return value for the checker to judge.

Protocol (one JSON line each way, in the wire format of `answers`): `{"function": spec}` first,
then per call `{"args", "kwargs"}` → `{"result"}` or `{"error": [type name, message]}`. A build
exercise's answer (a class or function the student wrote a piece of the engine in) is called
through a driver of `llmlab.course.build` instead: `{"driver": "module:function", "args",
"kwargs"}` runs `driver(answer, *args, **kwargs)` here and sends back its plain return value.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Callable

from llmlab.course.instructor.answers import AnswerFormatError, build_function, decode, encode

DRIVER_PREFIX = "llmlab.course.build."


def resolve_driver(name: str) -> Callable[..., Any]:
    """The driver "module:function", which must live in `llmlab.course.build` (the sandbox calls
    only these, whatever name a record carries; `llmlab.course.build.drive` uses it too)."""
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"driver must be 'module:function', got {name!r}")
    module_name, _, function_name = name.partition(":")
    if not module_name.startswith(DRIVER_PREFIX) or not function_name.isidentifier():
        raise ValueError(f"driver must be a function of {DRIVER_PREFIX}*, got {name!r}")
    fn = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(fn) or not getattr(fn, "__module__", "").startswith(DRIVER_PREFIX):
        raise ValueError(f"no driver {name!r}")
    return fn


def serve(argv: list[str]) -> int:
    """The sandbox side: define the function from the first line of stdin, then answer each
    call. Whatever the function prints goes to stderr, never into the replies."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    first = json.loads(sys.stdin.readline() or "null")
    try:
        fn = build_function(first["function"])
        failure = None
    except Exception as e:  # the student's code: a broken definition is the answer to every call
        fn, failure = None, e
    for line in sys.stdin:
        call = json.loads(line)
        try:
            if failure is not None:
                raise failure
            args, kwargs = decode(call["args"]), decode(call["kwargs"])
            if "driver" in call:  # a build exercise: the package's driver runs the student's piece
                reply = {"result": encode(resolve_driver(call["driver"])(fn, *args, **kwargs))}
            else:
                reply = {"result": encode(fn(*args, **kwargs))}
        except AnswerFormatError as e:
            reply = {"error": ["ValueError", f"the result cannot be handed back: {e}"]}
        except Exception as e:  # the student's code: report, as the checker would in the notebook
            reply = {"error": [type(e).__name__, str(e)]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0
