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

On Linux the interpreters are forked from one that has already imported torch and this package
(`zygote`, a fork server as in `multiprocessing`'s "forkserver"): each sandbox then starts in
milliseconds instead of the second or two an import of torch costs. The fork server itself runs
no student code and holds nothing of the grader's but the socket it gets requests on.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pkgutil
import signal
import socket
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


def zygote(argv: list[str]) -> int:
    """The fork server (Linux): stdin is a SOCK_SEQPACKET socket. Each request is a JSON
    `{"cwd": folder}` carrying two file descriptors, the new sandbox's stdin and stdout; the
    answer is `{"pid": pid}` of a child that runs `serve` in its own session (so that
    `os.killpg(pid, ...)` stops it and whatever it starts). The server ends when the socket
    closes, that is when the process that started it ends."""
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    # what a sandbox needs, imported once here rather than in each sandbox: the drivers too
    drivers = importlib.import_module(DRIVER_PREFIX.rstrip("."))
    for module in pkgutil.iter_modules(drivers.__path__):
        importlib.import_module(DRIVER_PREFIX + module.name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # finished sandboxes are reaped by the kernel
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        except (ConnectionResetError, OSError):
            return 0
        if not message:
            return 0
        try:
            cwd = json.loads(message)["cwd"]
            if len(fds) != 2:
                raise ValueError(f"a request carries two file descriptors, got {len(fds)}")
        except (ValueError, KeyError, TypeError) as e:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": str(e)}).encode())
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.chdir(cwd)
                os.dup2(fds[0], 0)
                os.dup2(fds[1], 1)
                os.dup2(devnull, 2)
                for fd in (*fds, devnull):
                    os.close(fd)
                sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8")
                code = serve([])
                sys.stderr.flush()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
