"""Structured output: tokens constrained by a grammar, with xgrammar (vLLM's default backend,
`vllm/v1/structured_output/backend_xgrammar.py`).

A grammar (a JSON schema, "any JSON object", a regex, a list of choices, or an EBNF grammar)
is compiled once against the tokenizer's vocabulary. Each request that asks for one keeps a
matcher: its state after the tokens accepted so far. Before sampling, the matcher fills a
bitmask (one bit per token of the vocabulary: may this token come next?) and every token whose
bit is 0 gets logit -inf, so no sampler can pick it. After sampling, the token advances the
matcher. A token may be a *prefix* of valid text (`{"na` while the schema wants `{"name"`): the
matcher allows any token whose bytes keep the text on a path the grammar accepts. EOS is
allowed exactly when the text so far is complete.

vLLM fills the bitmask on the CPU while the GPU runs the forward, so the mask costs little
there; here the two take turns on the same cores, and the chapter measures what it costs.

JSON is generated compact (no free whitespace between tokens): a small model given the freedom
of "any whitespace" can spend its whole budget on newlines. vLLM's default allows whitespace;
its `disable_any_whitespace` option is this choice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import torch

SPEC_FIELDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass
class StructuredOutputsParams:
    """What the output must be (vLLM's `StructuredOutputsParams`); exactly one field is set.

    json: a JSON schema (dict or JSON text). json_object: True for any JSON object.
    regex: a regular expression. choice: a list of strings, the output is one of them.
    grammar: an EBNF grammar (xgrammar's GBNF dialect; the root rule is `root`).
    """

    json: dict | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [f for f in SPEC_FIELDS if getattr(self, f) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"StructuredOutputsParams: set exactly one of {SPEC_FIELDS}, got {given or 'none'}"
            )
        if self.choice is not None and not (
            isinstance(self.choice, list)
            and self.choice
            and all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(
                "StructuredOutputsParams.choice must be a non-empty list of "
                f"non-empty str, got {self.choice!r}"
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(
                    f"StructuredOutputsParams.{name} must be a non-empty str, got {value!r}"
                )
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ValueError(
                        f"StructuredOutputsParams.json is not valid JSON: {e}"
                    ) from None
            if not isinstance(schema, dict):
                raise ValueError(
                    "StructuredOutputsParams.json must be a JSON schema (an object),"
                    f" got {type(schema).__name__}"
                )
            self.json = schema

    @property
    def kind(self) -> str:
        return next(f for f in SPEC_FIELDS if getattr(self, f) not in (None, False))

    def key(self) -> str:
        """A stable text naming the grammar (the compile cache's key)."""
        value = getattr(self, self.kind)
        return f"{self.kind}:{json.dumps(value, sort_keys=True, ensure_ascii=False)}"


def _choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices` (each escaped)."""
    special = set(".^$*+?{}[]\\|()")
    escaped = ["".join("\\" + c if c in special else c for c in choice) for choice in choices]
    return "(" + "|".join(escaped) + ")"


class StructuredOutputManager:
    """Compiles grammars for one tokenizer (once per distinct spec) and makes matchers.

    vocab_size: the model's vocabulary (the bitmask's width; it may be larger than the
    tokenizer's). eos_token_ids: the tokens that end a request (allowed once the grammar is
    complete).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids) or None
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._compiled: dict[str, Any] = {}
        self.bitmask_seconds = 0.0  # time spent filling bitmasks (the chapter's cost)

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of `spec` (cached). Raises ValueError naming the field for a
        schema, regex or grammar xgrammar cannot compile."""
        key = spec.key()
        compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        c = self.compiler
        try:
            if spec.json is not None:
                compiled = c.compile_json_schema(json.dumps(spec.json), any_whitespace=False)
            elif spec.json_object:
                compiled = c.compile_json_schema('{"type": "object"}', any_whitespace=False)
            elif spec.regex is not None:
                compiled = c.compile_regex(spec.regex)
            elif spec.choice is not None:
                compiled = c.compile_regex(_choice_regex(spec.choice))
            else:
                compiled = c.compile_grammar(spec.grammar)
        except Exception as e:  # xgrammar raises RuntimeError / its own errors
            # its messages start with "[time] source.cc:line: ": keep what follows
            why = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(e).strip().splitlines()[0])
            raise ValueError(
                f"StructuredOutputsParams.{spec.kind}: cannot compile it: {why[:300]}"
            ) from None
        self._compiled[key] = compiled
        return compiled

    def matcher(self, spec: StructuredOutputsParams) -> Any:
        """A fresh matcher for one request."""
        return self.xgr.GrammarMatcher(self.compile(spec))

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply(self, logits: torch.Tensor, rows: list[int], matchers: list[Any]) -> None:
        """In place: every token the row's matcher forbids next gets logit -inf."""
        import time

        t0 = time.perf_counter()
        bitmask = self.allocate_bitmask(len(rows))  # [R, ceil(V / 32)]
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, i)
        self.bitmask_seconds += time.perf_counter() - t0
        if rows == list(range(logits.shape[0])):
            self.xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)
        else:
            sub = logits[rows]
            self.xgr.apply_token_bitmask_inplace(sub, bitmask, vocab_size=self.vocab_size)
            logits[rows] = sub
