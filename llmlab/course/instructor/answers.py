"""Answers as the grader carries them out of the student's kernel: plain JSON, nothing executable.

The grader never trusts what a notebook prints. Instead, before the first cell runs, it wraps
each exercise's checker in the kernel (`recording.record_calls`): every call appends the arguments it was
given to a file the grader chose, one JSON line per call, and then runs the checker as before so
the student still sees its line. After the run the grader reads that file and hands the answers
to a checker process of its own (`llmlab.course.instructor.recheck`), which decodes them here.

The wire format keeps every JSON object a tag, so that nothing in a recorded answer is ever
read as anything but data:

    13, 0.5, "b", true, null                 themselves (a numpy or 0-d torch scalar: its number)
    [..]                                     a list
    {"__tuple__": [..]}, {"__set__": [..]}   a tuple, a set or frozenset
    {"__dict__": [[key, value], ..]}         a dict (any keys the other forms can carry)
    {"__tensor__": {"dtype", "shape", "data"}}, {"__ndarray__": {..}}   a torch tensor, a numpy array
    {"__module__": "llmlab.ops"}             a module, by name (decoded as an empty stand-in)
    {"__function__": {"name", "source", "globals"}}   a function defined in the notebook: its
                                             source and the globals it names (modules by name,
                                             helper functions by source, other values encoded)
    {"__function__": {"module", "qualname"}} a function from an installed module, by reference
                                             (a class the notebook defined travels as a
                                             function does: its source and the globals it names;
                                             so does a Triton kernel, its decorator kept)

Decoding never imports or runs anything unless the caller says how (`module=`, `function=`):
the checker process turns a function into a stand-in that runs it in a separate interpreter.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import json
import linecache
import math
import sys
import textwrap
import types
from typing import Any, Callable

from llmlab.course.check.build_guard import code_names

MAX_DEPTH = 32  # nesting of lists, dicts, functions' globals
MAX_RECORD_CHARS = 8 * 2**20  # one recorded call
MAX_GLOBAL_CHARS = 2**20  # one global a recorded function uses; larger ones are left out
TENSOR_DTYPES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
}
_TAGS = {
    "__tuple__",
    "__set__",
    "__dict__",
    "__tensor__",
    "__ndarray__",
    "__module__",
    "__function__",
}


class AnswerFormatError(ValueError):
    """An answer that cannot be recorded, or a record that is not in the wire format."""


# --------------------------------------------------------------------------- encoding (in the kernel)


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_numpy(value: Any, kind: str) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, getattr(np, kind))


def _array(tag: str, dtype: str, shape: list[int], data: list) -> dict:
    if dtype not in TENSOR_DTYPES:
        raise AnswerFormatError(
            f"cannot record an array of dtype {dtype}; use one of {sorted(TENSOR_DTYPES)}"
        )
    return {tag: {"dtype": dtype, "shape": shape, "data": data}}


def encode(value: Any, _depth: int = 0) -> Any:
    """The wire form of an answer; AnswerFormatError for a value it cannot carry (an object of
    the notebook's own class, a file, ...)."""
    if _depth > MAX_DEPTH:
        raise AnswerFormatError(f"the answer nests deeper than {MAX_DEPTH} levels")
    d = _depth + 1
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if _is_numpy(value, "generic"):
        return encode(value.item(), d)
    if _is_torch_tensor(value):
        t = value.detach().cpu()
        if t.dim() == 0:
            return encode(t.item(), d)
        dtype = str(t.dtype).removeprefix("torch.")
        data = (t.float() if dtype == "bfloat16" else t).reshape(-1).tolist()
        return _array("__tensor__", dtype, list(t.shape), data)
    if _is_numpy(value, "ndarray"):
        return _array(
            "__ndarray__", str(value.dtype), list(value.shape), value.reshape(-1).tolist()
        )
    if isinstance(value, list):
        return [encode(x, d) for x in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode(x, d) for x in value]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted((encode(x, d) for x in value), key=repr)}
    if isinstance(value, dict):
        return {"__dict__": [[encode(k, d), encode(v, d)] for k, v in value.items()]}
    if isinstance(value, types.ModuleType):
        return {"__module__": value.__name__}
    if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
        return {"__function__": _function_spec(value, d, set())}
    if isinstance(value, type) and value.__module__ == "__main__":
        return {"__function__": _class_spec(value, d)}
    if _notebook_kernel(value) is not None:
        return {"__function__": _kernel_spec(value.fn, d)}
    if (
        callable(value)
        and isinstance(getattr(value, "__module__", None), str)
        and isinstance(getattr(value, "__qualname__", None), str)
        and value.__module__ != "__main__"
    ):
        return {"__function__": {"module": value.__module__, "qualname": value.__qualname__}}
    raise AnswerFormatError(
        f"cannot record a {type(value).__name__}; answer with a number, str, "
        f"list, tuple, set, dict, tensor or function"
    )


def _lambda_source(source: str) -> str:
    """The lambda expression inside the statement(s) `inspect.getsource` gives for a lambda."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    lambdas = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)] if tree else []
    if len(lambdas) != 1:
        raise AnswerFormatError(
            "the grader cannot tell your lambda from the code around it; "
            "define the function with def"
        )
    return ast.get_source_segment(source, lambdas[0])


def _class_source(cls: type) -> str:
    """The source of a class the notebook defined: `inspect.getsource` where it can read it, else
    the class statement found in the cell that defined one of its methods (IPython keeps each
    cell's text; a class in `__main__` has no file for `inspect` to read)."""
    try:
        return textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        pass
    for attr in vars(cls).values():
        fn = getattr(attr, "fget", None) or getattr(attr, "__func__", None) or attr
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        text = "".join(linecache.getlines(code.co_filename))
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ClassDef)
                and node.name == cls.__name__
                and node.lineno <= code.co_firstlineno <= (node.end_lineno or 0)
            ):
                lines = text.splitlines(keepends=True)
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                return textwrap.dedent("".join(lines[first - 1 : node.end_lineno]))
    raise AnswerFormatError(
        f"the source of your class {cls.__name__} cannot be read; define it with class in a "
        f"cell, with at least one method"
    )


def _class_spec(cls: type, depth: int) -> dict:
    """Source and globals of a class the notebook defined (the same shape as a function's: the
    sandbox defines it by running its source)."""
    source = _class_source(cls)
    try:
        code = compile(source, f"<your class {cls.__name__}>", "exec")
    except SyntaxError as e:
        raise AnswerFormatError(
            f"the source of your class {cls.__name__} does not parse: {e}"
        ) from None
    scope = dict(sys.modules["__main__"].__dict__) if "__main__" in sys.modules else {}
    for attr in vars(cls).values():
        fn = getattr(attr, "fget", None) or getattr(attr, "__func__", None) or attr
        if isinstance(fn, types.FunctionType):
            scope.update(fn.__globals__)
            break
    return {
        "name": cls.__name__,
        "source": source,
        "globals": _used_globals(code, scope, {cls.__name__}, depth, set()),
    }


def _notebook_kernel(value: Any) -> types.FunctionType | None:
    """The function inside a Triton kernel the notebook defined (`@triton.jit` wraps it in a
    JITFunction when compiling for a GPU, an InterpretedFunction in the interpreter), else None."""
    fn = getattr(value, "fn", None)
    if (
        type(value).__module__.startswith("triton.")
        and isinstance(fn, types.FunctionType)
        and fn.__module__ == "__main__"
    ):
        return fn
    return None


def _source(fn: types.FunctionType, kind: str, how: str) -> str:
    """The source of a `kind` ("function", "kernel") the notebook defined; a reading error
    says `how` to define it so that it can be read."""
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise AnswerFormatError(
            f"the source of your {kind} {fn.__name__} cannot be read ({e}); {how}"
        ) from None


def _kernel_spec(fn: types.FunctionType, depth: int) -> dict:
    """Source and globals of a Triton kernel the notebook defined: its source keeps the
    decorator, so that defining it again (in the sandbox) makes a kernel again, and its globals
    are those of the whole statement (`triton` of the decorator included)."""
    source = _source(fn, "kernel", "define it with @triton.jit and def in a cell")
    code = compile(source, f"<your kernel {fn.__name__}>", "exec")
    used = _used_globals(code, dict(fn.__globals__), {fn.__name__}, depth, {id(fn)})
    return {"name": fn.__name__, "source": source, "globals": used}


def _used_globals(
    code: types.CodeType, scope: dict, skip: set[str], depth: int, seen: set[int]
) -> dict:
    """The encoded values of the globals `code` names (notebook functions by source, classes the
    notebook defined by source, the rest encoded); those that cannot be carried are left out."""
    used: dict[str, Any] = {}
    for name in sorted(code_names(code)):
        if name not in scope or name in skip or name.startswith("__"):
            continue
        value = scope[name]
        try:
            if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
                if id(value) in seen:
                    continue
                used[name] = {"__function__": _function_spec(value, depth + 1, seen)}
            elif isinstance(value, type) and value.__module__ == "__main__":
                if id(value) in seen or depth > MAX_DEPTH:
                    continue
                seen = seen | {id(value)}
                used[name] = {"__function__": _class_spec(value, depth + 1)}
            else:
                used[name] = encode(value, depth + 1)
        except AnswerFormatError:
            continue  # left out: a call that needs it raises NameError, and says so
        if len(json.dumps(used[name])) > MAX_GLOBAL_CHARS:
            del used[name]
    return used


def _function_spec(fn: types.FunctionType, depth: int, seen: set[int]) -> dict:
    """Source and globals of a function the notebook defined (and of the helpers it calls)."""
    seen = seen | {id(fn)}
    source = _source(fn, "function", "define it with def in a cell")
    if fn.__name__ == "<lambda>":
        source = _lambda_source(source)
    scope = dict(fn.__globals__)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                scope[name] = cell.cell_contents
            except ValueError:  # a cell not filled yet
                pass
    used = _used_globals(fn.__code__, scope, {fn.__name__}, depth, seen)
    return {"name": fn.__name__, "source": source, "globals": used}


# --------------------------------------------------------------------------- decoding (outside the kernel)


def _stand_in_module(name: str) -> types.ModuleType:
    return types.ModuleType(name)


def _refuse_function(spec: dict) -> Any:
    raise AnswerFormatError("a function answer needs a way to run it (decode(..., function=...))")


def _array_parts(body: Any, tag: str) -> tuple[str, list[int], list]:
    if not isinstance(body, dict) or set(body) != {"dtype", "shape", "data"}:
        raise AnswerFormatError(f"{tag} needs exactly dtype, shape and data")
    dtype, shape, data = body["dtype"], body["shape"], body["data"]
    if dtype not in TENSOR_DTYPES:
        raise AnswerFormatError(f"{tag}: dtype {dtype!r} is not one of {sorted(TENSOR_DTYPES)}")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise AnswerFormatError(f"{tag}: shape must be a list of sizes, got {shape!r}")
    if (
        not isinstance(data, list)
        or len(data) != math.prod(shape)
        or not all(isinstance(x, (int, float, bool)) for x in data)
    ):
        raise AnswerFormatError(f"{tag}: data must hold prod(shape) numbers")
    return dtype, shape, data


def decode(
    obj: Any,
    *,
    module: Callable[[str], Any] = _stand_in_module,
    function: Callable[[dict], Any] = _refuse_function,
    _depth: int = 0,
) -> Any:
    """The answer a wire form carries. Modules become what `module(name)` returns (an empty
    stand-in by default); functions what `function(spec)` returns (refused by default).
    AnswerFormatError for anything not in the format."""
    if _depth > MAX_DEPTH:
        raise AnswerFormatError(f"the record nests deeper than {MAX_DEPTH} levels")
    again = functools.partial(decode, module=module, function=function, _depth=_depth + 1)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [again(x) for x in obj]
    if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in _TAGS:
        raise AnswerFormatError(f"not an answer record: {str(obj)[:80]}")
    ((tag, body),) = obj.items()
    try:
        if tag == "__tuple__":
            return tuple(again(x) for x in _list(body, tag))
        if tag == "__set__":
            return {again(x) for x in _list(body, tag)}
        if tag == "__dict__":
            pairs = _list(body, tag)
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise AnswerFormatError("__dict__ needs [key, value] pairs")
            return {again(k): again(v) for k, v in pairs}
    except TypeError as e:  # an unhashable key or set member
        raise AnswerFormatError(f"{tag}: {e}") from None
    if tag == "__tensor__":
        import torch

        dtype, shape, data = _array_parts(body, tag)
        return torch.tensor(data, dtype=getattr(torch, dtype)).reshape(shape)
    if tag == "__ndarray__":
        import numpy as np

        dtype, shape, data = _array_parts(body, tag)
        return np.array(data, dtype=np.float32 if dtype == "bfloat16" else dtype).reshape(shape)
    if tag == "__module__":
        if not isinstance(body, str) or not all(part.isidentifier() for part in body.split(".")):
            raise AnswerFormatError(f"__module__ needs a dotted module name, got {body!r}")
        return module(body)
    return function(_function_body(body))


def _list(body: Any, tag: str) -> list:
    if not isinstance(body, list):
        raise AnswerFormatError(f"{tag} needs a list")
    return body


def _function_body(body: Any) -> dict:
    """A function spec checked for shape (its globals stay encoded)."""
    if (
        isinstance(body, dict)
        and set(body) == {"module", "qualname"}
        and all(isinstance(body[k], str) for k in body)
    ):
        return body
    if (
        isinstance(body, dict)
        and set(body) == {"name", "source", "globals"}
        and isinstance(body["name"], str)
        and isinstance(body["source"], str)
        and isinstance(body["globals"], dict)
        and all(isinstance(k, str) and k.isidentifier() for k in body["globals"])
    ):
        return body
    raise AnswerFormatError("__function__ needs {name, source, globals} or {module, qualname}")


def build_function(spec: dict, namespace: dict | None = None) -> Callable:
    """The function a spec describes, defined in `namespace` (a fresh one by default) together
    with the helpers and modules it uses. Runs the spec's code: call this only in a process
    meant for the student's code (`llmlab.course.instructor.sandbox`)."""
    spec = _function_body(spec)
    if "module" in spec:
        target: Any = importlib.import_module(spec["module"])
        for part in spec["qualname"].split("."):
            target = getattr(target, part)
        return target
    ns = {"__name__": "__main__", "__builtins__": builtins} if namespace is None else namespace
    for name, value in spec["globals"].items():
        ns[name] = decode(
            value, module=importlib.import_module, function=lambda s: build_function(s, ns)
        )
    if spec["name"] == "<lambda>":
        return eval(compile(spec["source"], "<your lambda>", "eval"), ns)
    filename = f"<your function {spec['name']}>"
    # kept where `inspect` reads sources, as a notebook's cell is: a decorator that reads its
    # function's source (Triton's `@triton.jit`) works here as it did in the notebook
    lines = spec["source"].splitlines(keepends=True)
    linecache.cache[filename] = (len(spec["source"]), None, lines, filename)
    exec(compile(spec["source"], filename, "exec"), ns)
    return ns[spec["name"]]
