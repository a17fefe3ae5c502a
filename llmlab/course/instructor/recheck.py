"""The grader's own checker process: the verdicts come from here, never from the notebook.

The grader starts this process before the student's notebook runs its first cell, and it
imports the checkers (`llmlab.course.check.chNN`) of the expected exercises straight away, from the
package the grader itself runs; nothing the notebook later does to its own kernel or to files on
disk changes the code already loaded here. After the run the grader sends it the recorded
answers (`answers`) on stdin; it decodes them, calls each checker on exactly the arguments the
instructor's call passes (`Exercise.positional`, `.keywords`), reads PASS or NOT YET from the
`CheckResult` the checker returns (what it prints is discarded), and writes the verdicts as one
JSON object, tagged with the nonce the grader sent, to its stdout.

No student code runs in this process: a function answer becomes a `SandboxedFunction`, which
runs the function in a separate interpreter (`sandbox`) within a time limit.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from llmlab.course.check.core import CheckResult
from llmlab.course.instructor.answers import AnswerFormatError, decode, encode
from llmlab.course.instructor.exercises import Exercise

MAX_REPLY_BYTES = 64 * 2**20


def package_root() -> Path:
    """The folder that holds the `llmlab` package this process runs (put first on the path of
    every helper process, so that it runs the same code)."""
    import llmlab

    return Path(llmlab.__file__).resolve().parent.parent


def python_command(entry: str, *argv: str) -> list[str]:
    """A command that runs `entry` (`module:function`, called with argv) in a fresh interpreter
    that imports llmlab from `package_root()` and not from its working folder."""
    module, function = entry.split(":")
    boot = (
        f"import sys; sys.path[0] = {str(package_root())!r}; "
        f"from {module} import {function}; sys.exit({function}(sys.argv[1:]))"
    )
    return [sys.executable, "-c", boot, *argv]


def _student_exception(name: Any, message: Any) -> Exception:
    """An exception that reads like the one the student's function raised."""
    name = name if isinstance(name, str) and name.isidentifier() else "Exception"
    return type(name, (Exception,), {})(str(message))


class SandboxedFunction:
    """Stands in for the student's function: each call runs it in the sandbox interpreter.

    The interpreter starts at the first call; `timeout_s` bounds everything from then on
    (start-up included). Past it the interpreter is killed and every call raises TimeoutError.
    """

    grader_stand_in = True  # checkers look for this, not for the class (they never import it)

    def __init__(self, spec: dict, *, timeout_s: float, env: dict[str, str] | None = None):
        self.spec = spec
        self.timeout_s = timeout_s
        self.env = env
        self.__name__ = str(spec.get("name") or spec.get("qualname", "function"))
        self._proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._deadline = 0.0
        self._failure: Exception | None = None

    def __repr__(self) -> str:
        return f"<your function {self.__name__}, run in a separate process>"

    def _start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(
            prefix="llmlab-sandbox-", ignore_cleanup_errors=True
        )
        self._deadline = time.monotonic() + self.timeout_s
        server = _fork_server() if self.env is None else None
        if server is not None:
            self._proc = server.spawn(self._tmp.name, timeout_s=self.timeout_s)
        else:
            self._proc = subprocess.Popen(
                python_command("llmlab.course.instructor.sandbox:serve"),
                cwd=self._tmp.name,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._send({"function": self.spec})

    def _send(self, message: dict) -> None:
        """Write one line, within the deadline (a sandbox busy elsewhere stops reading)."""
        assert self._proc is not None and self._proc.stdin is not None
        data = memoryview(json.dumps(message).encode() + b"\n")
        fd = self._proc.stdin.fileno()
        os.set_blocking(fd, False)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while data:
                left = self._deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError(f"your function ran longer than {self.timeout_s:g} s in all")
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    continue
                except OSError:
                    return  # the process is gone: the read that follows says so

    def _read_reply(self) -> dict:
        assert self._proc is not None and self._proc.stdout is not None
        buf = bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while not buf.endswith(b"\n"):
                left = self._deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError(f"your function ran longer than {self.timeout_s:g} s in all")
                chunk = os.read(self._proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise RuntimeError(
                        "your function's process ended without returning (did it call exit?)"
                    )
                buf += chunk
                if len(buf) > MAX_REPLY_BYTES:
                    raise ValueError(f"your function returned more than {MAX_REPLY_BYTES} bytes")
        reply = json.loads(buf)
        if not isinstance(reply, dict):
            raise ValueError("your function's process answered something that is not a reply")
        return reply

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call({"args": encode(list(args)), "kwargs": encode(kwargs)})

    def drive(self, driver: str, *args: Any, **kwargs: Any) -> Any:
        """`driver(answer, *args, **kwargs)` in the sandbox (`llmlab.course.build.drive`): a
        build exercise's piece, run by the package's driver; only its return value comes back."""
        return self._call({"driver": driver, "args": encode(list(args)), "kwargs": encode(kwargs)})

    def _call(self, message: dict) -> Any:
        if self._failure is not None:
            raise self._failure
        try:
            if self._proc is None:
                self._start()
            self._send(message)
            reply = self._read_reply()
        except (TimeoutError, RuntimeError, ValueError) as e:
            self._failure = e
            self.close()
            raise
        if isinstance(reply.get("error"), list) and len(reply["error"]) == 2:
            raise _student_exception(*reply["error"])
        if "result" not in reply:
            raise ValueError("your function's process answered something that is not a reply")
        return decode(reply["result"])

    def close(self) -> None:
        """Kill the sandbox interpreter (and anything it started)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._proc is not None:
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


class _ForkedSandbox:
    """A sandbox the fork server started: what `SandboxedFunction` uses of a `Popen` (it is
    not this process's child, so `wait` watches for the pid to go away)."""

    def __init__(self, pid: int, stdin: int, stdout: int):
        self.pid = pid
        self.stdin = os.fdopen(stdin, "wb", buffering=0)
        self.stdout = os.fdopen(stdout, "rb", buffering=0)

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -1
        except PermissionError:  # the pid went to another user's process: ours is gone
            return -1
        return None

    def wait(self, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < end:
            time.sleep(0.005)


class _ForkServer:
    """`sandbox.zygote` in its own interpreter, and the socket to ask it for sandboxes."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._proc = subprocess.Popen(
                python_command("llmlab.course.instructor.sandbox:zygote"),
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._sock = ours
        self._lock = threading.Lock()

    def spawn(self, cwd: str, timeout_s: float) -> _ForkedSandbox:
        """A new sandbox working in `cwd`, its stdin and stdout connected to pipes of ours.
        TimeoutError past `timeout_s` (the server is then closed: a late answer must not be
        read as the next request's)."""
        child_in, our_in = os.pipe()
        our_out, child_out = os.pipe()
        try:
            with self._lock:
                self._sock.settimeout(timeout_s)
                try:
                    socket.send_fds(
                        self._sock, [json.dumps({"cwd": cwd}).encode()], [child_in, child_out]
                    )
                    reply = json.loads(self._sock.recv(1 << 16) or b"null")
                except TimeoutError:
                    self.close()
                    raise TimeoutError(
                        f"your function's process did not start within {timeout_s:g} s"
                    ) from None
        except BaseException:
            for fd in (our_in, our_out):
                os.close(fd)
            raise
        finally:
            os.close(child_in)
            os.close(child_out)
        if not isinstance(reply, dict) or not isinstance(reply.get("pid"), int):
            for fd in (our_in, our_out):
                os.close(fd)
            self.close()
            raise RuntimeError(f"the sandbox fork server answered {reply!r}")
        return _ForkedSandbox(reply["pid"], our_in, our_out)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        self._sock.close()
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


_FORK_SERVER: _ForkServer | None = None


def _fork_server() -> _ForkServer | None:
    """This process's fork server, started at the first sandbox and again if it has died
    (Linux only: elsewhere each sandbox is a fresh interpreter)."""
    global _FORK_SERVER
    if not sys.platform.startswith("linux"):
        return None
    if _FORK_SERVER is None or not _FORK_SERVER.alive():
        if _FORK_SERVER is not None:
            _FORK_SERVER.close()
        _FORK_SERVER = _ForkServer()
        atexit.register(_FORK_SERVER.close)
    return _FORK_SERVER


# --------------------------------------------------------------------------- the grader's side


class RecheckError(RuntimeError):
    """The checker process failed, or its reply is not the one it was asked for."""


class Recheck:
    """A handle on the checker process: start it before the notebook runs, ask it once after.

    exercises: those to judge (their checker modules are imported at start); env, cwd: the
    process's environment and working folder.
    """

    def __init__(self, exercises: list[Exercise], *, env: dict[str, str], cwd: str | Path):
        self.exercises = list(exercises)
        spec = json.dumps([e.to_dict() for e in self.exercises])
        self._proc = subprocess.Popen(
            python_command("llmlab.course.instructor.recheck:main", spec),
            cwd=str(cwd),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def __enter__(self) -> "Recheck":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def verdicts(
        self, answers: dict[str, dict], *, timeout_s: float, function_timeout_s: float
    ) -> dict[str, tuple[bool, str]]:
        """Exercise id → (passed, message) for each recorded answer (`{"args", "kwargs"}` or
        `{"error"}`, as `recording.record_calls` wrote it). Raises RecheckError when the process
        fails, runs past `timeout_s`, or answers with anything but its verdicts."""
        nonce = secrets.token_hex(16)
        request = json.dumps(
            {"nonce": nonce, "answers": answers, "function_timeout": function_timeout_s}
        )
        try:
            out, err = self._proc.communicate(request.encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            why = f"the checker process did not finish within {timeout_s:g} s"
            raise RecheckError(why) from None
        if self._proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise RecheckError(
                f"the checker process exited with code {self._proc.returncode}: " + " | ".join(tail)
            )
        try:
            reply = json.loads(out)
            if reply["nonce"] != nonce or set(reply["verdicts"]) != set(answers):
                raise ValueError("a reply to another request")
            return {
                ex: (v["passed"] is True, str(v["message"])) for ex, v in reply["verdicts"].items()
            }
        except (ValueError, KeyError, TypeError) as e:
            raise RecheckError(f"the checker process's reply cannot be used ({e})") from None

    def close(self) -> None:
        """Kill the process if it still runs."""
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


# --------------------------------------------------------------------------- the process's side


def judge(exercise: Exercise, checker: Any, record: Any, function_timeout_s: float) -> dict:
    """{"passed", "message"}: the checker's verdict on one recorded call, with the call cut to
    the instructor's shape (extra arguments are dropped, so that a student cannot pass the
    checker context of their own)."""

    def no(message: str) -> dict:
        return {"passed": False, "message": message}

    if isinstance(checker, str):
        return no(checker)
    fields = record if isinstance(record, dict) else {}  # anything else: not in the format
    if "error" in fields:
        return no(f"your answer could not be recorded: {fields['error']}")
    args, kwargs = fields.get("args"), fields.get("kwargs")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return no("the recorded answer is not in the grader's format")
    if len(args) < exercise.positional:
        return no(
            f"the checker was called with {len(args)} positional argument(s); this exercise "
            f"passes {exercise.positional}"
        )
    stand_ins: list[SandboxedFunction] = []

    def function(spec: dict) -> SandboxedFunction:
        stand_ins.append(SandboxedFunction(spec, timeout_s=function_timeout_s))
        return stand_ins[-1]

    try:
        call_args = [decode(a, function=function) for a in args[: exercise.positional]]
        call_kwargs = {
            k: decode(kwargs[k], function=function) for k in exercise.keywords if k in kwargs
        }
        with contextlib.redirect_stdout(io.StringIO()):
            result = checker(*call_args, **call_kwargs)
    except AnswerFormatError as e:
        return no(f"the recorded answer cannot be read: {e}")
    except Exception as e:  # a checker that trips over an odd answer: not yet, and why
        return no(f"the checker could not use your answer ({type(e).__name__}: {e})")
    finally:
        for f in stand_ins:
            f.close()
    if not isinstance(result, CheckResult):
        return no(f"the checker returned {type(result).__name__}, not a verdict")
    return {"passed": result.passed is True, "message": result.message}


def _load_checkers(exercises: list[Exercise]) -> dict[str, Any]:
    """Exercise id → its checker function, or a message saying why there is none."""
    checkers: dict[str, Any] = {}
    for ex in exercises:
        try:
            module = importlib.import_module(f"llmlab.course.check.{ex.module}")
        except ImportError as e:
            checkers[ex.id] = f"there is no checker module llmlab.course.check.{ex.module} ({e})"
            continue
        fn = getattr(module, ex.function, None)
        missing = f"llmlab.course.check.{ex.module} has no checker {ex.function}"
        checkers[ex.id] = fn if callable(fn) else missing
    return checkers


def main(argv: list[str]) -> int:
    """The process: argv[0] holds the exercises (JSON); one request on stdin, one reply on stdout."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr  # the checkers' own lines, and anything else, go to stderr
    exercises = [Exercise.from_dict(d) for d in json.loads(argv[0])]
    checkers = _load_checkers(exercises)
    request = json.loads(sys.stdin.read())
    answers, timeout = request["answers"], float(request["function_timeout"])
    verdicts = {
        ex.id: judge(ex, checkers[ex.id], answers[ex.id], timeout)
        for ex in exercises
        if ex.id in answers
    }
    replies.write(json.dumps({"nonce": request["nonce"], "verdicts": verdicts}))
    replies.close()
    return 0
