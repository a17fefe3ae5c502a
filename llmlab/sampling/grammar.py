"""The grammars a request carries, and how a spec becomes one (vLLM's
`vllm/v1/structured_output/backend_xgrammar.py`).

- The checks of a JSON schema before it is compiled: a keyword xgrammar does not enforce is
  refused, naming where it sits (vLLM's `has_xgrammar_unsupported_json_features`).
- `compile_spec`: a `StructuredOutputsParams` compiled by xgrammar against the vocabulary.
- `XgrammarGrammar`: one request's matcher, and the error that failed it (`grammar_failures`).
- `FunctionGrammar` / `FunctionBackend`: a grammar written as a Python function over the text so
  far, for the chapter that builds a constrained decoder before it meets xgrammar.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Iterable

import torch

# the string formats xgrammar enforces (vLLM's STRING_SUPPORTED_FORMATS); others it ignores
STRING_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)


def short_repr(value: Any, limit: int = 80) -> str:
    """repr of a refused value, cut to `limit` characters (an error quotes no whole input)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def schema_of(schema: Any) -> dict:
    """The `json` field as a dict, checked: JSON text parsed, and refused (ValueError naming
    the field) when it is not an object or asks for what xgrammar does not enforce."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ValueError(
            "StructuredOutputsParams.json must be a JSON schema (an object),"
            f" got {type(schema).__name__}"
        )
    where = unsupported_schema_feature(schema)
    if where is not None:
        raise ValueError(
            f"StructuredOutputsParams.json: {where} is not enforced by xgrammar, so the output "
            "could break the schema; refused, as vLLM refuses such schemas"
        )
    return schema


# where a JSON schema holds other schemas: one, a name -> schema map, or a list
_SUBSCHEMA = (
    "items",
    "additionalItems",
    "additionalProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def unsupported_schema_feature(schema: dict) -> str | None:
    """The first keyword of `schema` that xgrammar accepts but does not enforce, with where it
    is ("properties.tags: uniqueItems"), or None. vLLM's list
    (`has_xgrammar_unsupported_json_features`): multipleOf; uniqueItems, contains, minContains,
    maxContains; a string format xgrammar lacks; minLength / maxLength beside a pattern or
    format; propertyNames and patternProperties beside other property keywords. Added here,
    each seen ignored by xgrammar 0.2 (tests/test_structured_output.py checks it): `not`,
    `dependentRequired`, `allOf` of several schemas, a `$ref` outside the document."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        keyword = _unenforced_keyword(node)
        if keyword is not None:
            return f"{path}: {keyword}" if path else keyword
        at = f"{path}." if path else ""
        for key in _SUBSCHEMA:
            stack.append((node.get(key), f"{at}{key}"))
        for key in _SUBSCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((sub, f"{at}{key}.{name}") for name, sub in node[key].items())
        for key in _SUBSCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend((sub, f"{at}{key}[{i}]") for i, sub in enumerate(node[key]))
    return None


def _unenforced_keyword(node: dict) -> str | None:
    """The keyword of this one schema object (not its subschemas) xgrammar would ignore."""
    kind = node.get("type")
    types = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    if node.get("uniqueItems") is True:
        return "uniqueItems"
    for key in ("contains", "minContains", "maxContains", "multipleOf", "not", "dependentRequired"):
        if key in node:
            return key
    if "string" in types:
        fmt = node.get("format")
        if fmt is not None and fmt not in STRING_FORMATS:
            return f"format {short_repr(fmt, 40)}"
        if _pattern_with_length(node):
            return "minLength / maxLength beside a pattern or format"
    names = node.get("propertyNames")
    if isinstance(names, dict) and _pattern_with_length(names):
        return "propertyNames with minLength / maxLength beside a pattern or format"
    if names is not None and (
        "properties" in node
        or "patternProperties" in node
        or isinstance(node.get("additionalProperties"), dict)
        or node.get("unevaluatedProperties", True) is not True
    ):
        return "propertyNames beside other property keywords"
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and ("properties" in node or len(patterns) > 1):
        return "patternProperties beside properties or another pattern"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "allOf of several schemas"
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"$ref {short_repr(ref, 40)} (outside the schema)"
    return None


def _pattern_with_length(node: dict) -> bool:
    return ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node)


def _choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices` (each escaped)."""
    special = set(".^$*+?{}[]\\|()")
    escaped = ["".join("\\" + c if c in special else c for c in choice) for choice in choices]
    return "(" + "|".join(escaped) + ")"


def compile_spec(compiler: Any, spec: Any) -> Any:
    """`spec` compiled by xgrammar's `compiler` (a GrammarCompiler). Raises ValueError naming
    the field for a schema, regex or grammar xgrammar cannot compile. The engine compiles with
    it, and so does a server's compile worker (`llmlab.serve.grammar_compiler`)."""
    try:
        if spec.json is not None:
            return compiler.compile_json_schema(json.dumps(spec.json), any_whitespace=False)
        if spec.json_object:
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.regex is not None:
            return compiler.compile_regex(spec.regex)
        if spec.choice is not None:
            return compiler.compile_regex(_choice_regex(spec.choice))
        return compiler.compile_grammar(spec.grammar)
    except Exception as e:  # xgrammar raises RuntimeError / its own errors
        # its messages start with "[time] source.cc:line: ": keep what follows
        why = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip().splitlines()[0])
        raise ValueError(
            f"StructuredOutputsParams.{spec.kind}: cannot compile it: {why[:300]}"
        ) from None


class XgrammarGrammar:
    """One request's grammar: xgrammar's `GrammarMatcher` (its state after the tokens accepted
    so far) and, once the grammar has failed, `error` (vLLM's `XgrammarGrammar`).

    A failed grammar's matcher may still be busy in a fill left running past its budget, so it
    is never touched again: accepting is a no-op, it never terminates, it fills no mask (the
    engine finishes its request; `grammar_failures` says which)."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.error: str | None = None
        self.num_accepted = 0  # tokens accepted (the position a failure is reported at)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token: int) -> bool:
        if self.error is not None:
            return True
        accepted = bool(self.matcher.accept_token(token))
        self.num_accepted += accepted
        return accepted

    def accept_string(self, text: str) -> bool:
        return self.error is None and bool(self.matcher.accept_string(text))

    def is_terminated(self) -> bool:
        return self.error is None and self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        if self.error is None:
            self.matcher.rollback(num_tokens)
            self.num_accepted -= num_tokens

    def fail(self, budget_s: float) -> None:
        """Mark this grammar failed: its fill took more than `budget_s` seconds of CPU."""
        self.error = (
            f"structured output stopped: the grammar took more than {budget_s:g} s of CPU to "
            f"compute the tokens allowed after output token {self.num_accepted}; a grammar "
            "whose steps grow slower token after token (nested repetition such as "
            "(.{1,50}){1,50}) cannot be served"
        )


def grammar_failures(requests: Iterable[Any]) -> dict[str, str]:
    """{request id: why} for the requests whose grammar failed (its mask fill overran the
    manager's `fill_budget_s`). The engine finishes each alone with that error after the step
    that failed it; its token of that step was sampled without the mask and must be dropped."""
    failed = {}
    for req in requests:
        error = getattr(req.grammar, "error", None)
        if error is not None:
            failed[req.request_id] = error
    return failed


def bitmask_row(allowed: torch.Tensor) -> torch.Tensor:
    """A bool mask [V] packed as xgrammar lays out one bitmask row: int32 words [ceil(V / 32)],
    bit b of word w set when token 32 * w + b is allowed."""
    v = allowed.numel()
    bits = torch.zeros(-(-v // 32) * 32, dtype=torch.int64)
    bits[:v] = allowed.to(torch.int64)
    words = (bits.view(-1, 32) << torch.arange(32)).sum(1)  # each word's bits, 0 … 2**32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


class FunctionGrammar:
    """One request's matcher for a grammar written as a function (chapter 15's hand-made mask):
    `allowed(text so far, pieces, eos_id)` returns a bool tensor [V] of the tokens that may come
    next. It offers what the engine calls on xgrammar's `GrammarMatcher`."""

    def __init__(self, allowed: Any, pieces: list[str], eos_id: int) -> None:
        self.allowed, self.pieces, self.eos_id = allowed, pieces, eos_id
        self.text = ""
        self.terminated = False
        self.seconds = 0.0  # time spent in `allowed`
        self._last: torch.Tensor | None = None

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        t0 = time.perf_counter()
        mask = torch.as_tensor(self.allowed(self.text, self.pieces, self.eos_id), dtype=torch.bool)
        self.seconds += time.perf_counter() - t0
        if mask.shape != (len(self.pieces),):
            raise ValueError(
                f"the mask function must return a bool tensor of shape ({len(self.pieces)},), "
                f"got shape {tuple(mask.shape)}"
            )
        self._last = mask
        bitmask[row, : -(-mask.numel() // 32)] = bitmask_row(mask)

    def accept_token(self, token: int) -> bool:
        """Advance by `token`; False (and no change) when the last mask forbade it."""
        if self._last is not None and not bool(self._last[token]):
            return False
        if token == self.eos_id:
            self.terminated = True
        else:
            self.text += self.pieces[token]
        self._last = None
        return True

    def is_terminated(self) -> bool:
        return self.terminated


class FunctionBackend:
    """A structured-output backend (`EngineConfig.structured_outputs_backend`) whose every
    request follows the one grammar `allowed` describes; the request's spec only turns the mask
    on. vLLM chooses among its backends (xgrammar, guidance, outlines) the same way, per engine."""

    def __init__(self, allowed: Any, pieces: list[str], eos_id: int) -> None:
        self.allowed, self.pieces, self.eos_id = allowed, pieces, eos_id
        self.matchers: list[FunctionGrammar] = []

    def __call__(self, spec: Any) -> FunctionGrammar:
        m = FunctionGrammar(self.allowed, self.pieces, self.eos_id)
        self.matchers.append(m)
        return m

    @property
    def seconds(self) -> float:
        """Time spent in the mask function, over every request so far."""
        return sum(m.seconds for m in self.matchers)


def vocab_texts(tokenizer: Any, vocab_size: int) -> list[str]:
    """Each token's text (special tokens as their names; ids past the tokenizer's as "")."""
    n = min(vocab_size, len(tokenizer))
    return [tokenizer.decode([i]) for i in range(n)] + [""] * (vocab_size - n)
