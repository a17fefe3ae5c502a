"""Answers on their way out of the kernel: the wire format (everything an answer can be comes
back equal; nothing else is accepted), functions carried as source with what they use, and the
recording wrapper around a checker."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import linecache
import math
import textwrap
import types

import numpy as np
import pytest
import torch

from llmlab.course.check import ch00
from llmlab.course.check.core import CheckResult
from llmlab.course.instructor.answers import (
    AnswerFormatError,
    build_function,
    decode,
    encode,
)
from llmlab.course.instructor.recording import record_calls


def _wire(value):
    """What the grader reads back: encoded, through JSON text, decoded."""
    return decode(json.loads(json.dumps(encode(value))))


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -7,
        2**70,
        0.1,
        "llmlab.ops",
        "你好",
        [1, "a", [None]],
        (1, (2, 3)),
        {0, 1},
        frozenset({"x"}),
        {"chat": "ttft", ("a", 1): [1.5]},
        {},
    ],
    ids=repr,
)
def test_plain_answers_come_back_equal(value):
    got = _wire(value)
    assert got == value and type(got) is (set if type(value) is frozenset else type(value))


def test_numbers_from_numpy_and_torch_become_python_numbers_and_nan_survives():
    assert _wire(np.float32(0.5)) == 0.5 and type(_wire(np.int64(3))) is int
    assert _wire(torch.tensor(2.5)) == 2.5 and _wire(torch.tensor(True)) is True
    assert math.isnan(_wire(float("nan")))


def test_arrays_keep_shape_and_dtype():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    got = _wire(t)
    assert got.dtype == torch.float32 and torch.equal(got, t)
    b = _wire(t.to(torch.bfloat16))
    assert b.dtype == torch.bfloat16 and torch.equal(b, t.to(torch.bfloat16))
    a = np.arange(4, dtype=np.int32).reshape(2, 2)
    got = _wire(a)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32 and (got == a).all()


def test_a_module_comes_back_as_a_stand_in_that_imports_nothing():
    got = _wire(torch.nn.functional)
    assert isinstance(got, types.ModuleType) and got.__name__ == "torch.nn.functional"
    assert not hasattr(got, "softmax")


def test_values_it_cannot_carry_are_refused_with_what_it_accepts():
    class Mine:
        pass

    with pytest.raises(AnswerFormatError, match="cannot record a Mine; answer with a number"):
        encode([1, Mine()])
    with pytest.raises(AnswerFormatError, match="dtype"):
        encode(np.array(["a"], dtype=object))


@pytest.mark.parametrize(
    "record, fragment",
    [
        ({"answer": 13}, "not an answer record"),  # a dict is always a tag
        ({"__tuple__": [1], "__set__": [2]}, "not an answer record"),
        ({"__eval__": "1+1"}, "not an answer record"),
        ({"__set__": [[1, 2]]}, "unhashable"),
        ({"__tensor__": {"dtype": "float32", "shape": [2], "data": [1.0]}}, "prod"),
        ({"__tensor__": {"dtype": "object", "shape": [1], "data": [1]}}, "dtype"),
        ({"__module__": "os; import sys"}, "dotted module name"),
        (
            {"__function__": {"name": "f", "source": "def f(): pass", "globals": {}}},
            "needs a way to run it",
        ),
        ({"__function__": {"source": "x"}}, "__function__ needs"),
    ],
    ids=lambda x: str(x)[:30],
)
def test_decoding_refuses_anything_outside_the_format(record, fragment):
    with pytest.raises(AnswerFormatError, match=fragment):
        decode(record)


def test_decoding_refuses_deep_nesting():
    deep: list = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(AnswerFormatError, match="deeper"):
        decode(deep)


# --------------------------------------------------------------------------- functions


def _define_in_notebook(monkeypatch, source: str, **names) -> dict:
    """Run `source` the way a kernel runs a cell: in `__main__`'s namespace, with its text in
    linecache under a made-up cell file name (where inspect finds it)."""
    filename = f"<cell-{abs(hash(source))}>"
    monkeypatch.setitem(
        linecache.cache, filename, (len(source), None, source.splitlines(True), filename)
    )
    ns = {"__name__": "__main__", **names}
    exec(compile(source, filename, "exec"), ns)
    return ns


def test_a_notebook_function_travels_with_its_helpers_modules_and_constants(monkeypatch):
    ns = _define_in_notebook(
        monkeypatch,
        textwrap.dedent("""\
        import math as m
        SCALE = 3
        big = torch.zeros(10)          # not used by the function: not carried
        def helper(x):
            return m.floor(x) * SCALE
        def answer_fn(x):
            return helper(x) + 1
        """),
        torch=torch,
    )
    spec = encode(ns["answer_fn"])["__function__"]
    assert spec["name"] == "answer_fn" and spec["source"].startswith("def answer_fn")
    assert set(spec["globals"]) == {"helper"}
    assert set(spec["globals"]["helper"]["__function__"]["globals"]) == {"m", "SCALE"}
    rebuilt = decode(json.loads(json.dumps(encode(ns["answer_fn"]))), function=build_function)
    assert rebuilt(2.7) == ns["answer_fn"](2.7) == 7


def test_a_lambda_is_cut_out_of_its_statement_and_an_installed_function_goes_by_reference(
    monkeypatch,
):
    ns = _define_in_notebook(monkeypatch, "k = 2\nanswer = [lambda x: x * k][0]\n")
    spec = encode(ns["answer"])["__function__"]
    assert spec["source"] == "lambda x: x * k"
    assert decode(encode(ns["answer"]), function=build_function)(5) == 10
    assert encode(math.sqrt) == {"__function__": {"module": "math", "qualname": "sqrt"}}
    assert decode(encode(math.sqrt), function=build_function)(16.0) == 4.0
    two = _define_in_notebook(monkeypatch, "pair = (lambda a: a, lambda b: b)\n")
    with pytest.raises(AnswerFormatError, match="define the function with def"):
        encode(two["pair"][0])


def test_a_notebook_triton_kernel_travels_with_its_decorator_and_is_a_kernel_again(monkeypatch):
    """Chapter 16's answer is a launcher whose kernel (`@triton.jit`) the notebook defined: the
    kernel travels as its source, decorator kept, and the sandbox defines a kernel again, whose
    source Triton can read (a GPU compiles from it)."""
    import triton
    import triton.language as tl

    ns = _define_in_notebook(
        monkeypatch,
        textwrap.dedent("""\
        @triton.jit
        def double_kernel(x_ptr, N: tl.constexpr):
            offs = tl.arange(0, N)
            tl.store(x_ptr + offs, 2 * tl.load(x_ptr + offs))

        def double(x):
            double_kernel[(1,)](x, N=x.shape[0])
            return x
        """),
        triton=triton,
        tl=tl,
    )
    spec = encode(ns["double"])["__function__"]
    kernel = spec["globals"]["double_kernel"]["__function__"]
    assert kernel["source"].startswith("@triton.jit") and set(kernel["globals"]) == {"triton", "tl"}
    fresh: dict = {"__name__": "__main__"}
    rebuilt = build_function(json.loads(json.dumps(spec)), fresh)
    assert type(fresh["double_kernel"]).__module__.startswith("triton.")
    assert "tl.store" in inspect.getsource(fresh["double_kernel"].fn)
    assert rebuilt.__name__ == "double"


# --------------------------------------------------------------------------- recording in the kernel


def test_record_calls_appends_each_call_then_runs_the_real_checker(tmp_path, monkeypatch):
    for name in ("num_chapters", "fast_mode"):
        monkeypatch.setattr(ch00, name, getattr(ch00, name))  # restored after the test
    path = tmp_path / "answers.jsonl"
    assert record_calls(
        str(path), ["ch00.num_chapters", "ch00.fast_mode", "ch00.missing", "ch99.x"]
    ) == ["ch00.num_chapters", "ch00.fast_mode"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        first = ch00.num_chapters(np.int64(13))
        second = ch00.fast_mode(object())  # cannot be recorded; still checked
    assert isinstance(first, CheckResult) and first.passed and not second.passed
    assert "[check ch00.num_chapters] PASS" in out.getvalue()
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert lines[0] == {"exercise": "ch00.num_chapters", "args": [13], "kwargs": {}}
    assert (
        lines[1]["exercise"] == "ch00.fast_mode" and "cannot record a object" in lines[1]["error"]
    )
    assert ch00.num_chapters.__doc__ == ch00.num_chapters.__wrapped__.__doc__
