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
import time
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

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        backend: Any = None,
    ) -> None:
        import xgrammar as xgr

        self.backend = backend  # None: xgrammar's matchers; else spec -> matcher (EngineConfig)

        self.xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids) or None
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._compiled: dict[str, Any] = {}
        # what the mask costs (chapter 15 measures it): seconds filling bitmasks, seconds
        # setting forbidden logits to -inf, and the steps that had at least one grammar
        self.bitmask_seconds = 0.0
        self.apply_seconds = 0.0
        self.mask_steps = 0

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
        """A fresh matcher for one request (from the engine's backend when it has one)."""
        if self.backend is not None:
            return self.backend(spec)
        # rollback without limit: a speculating request walks its drafts, then steps back
        return self.xgr.GrammarMatcher(self.compile(spec), max_rollback_tokens=-1)

    def apply_to_drafts(self, logits: torch.Tensor, matcher: Any, drafts: list[int]) -> None:
        """In place, for a request that speculates: `logits` [k + 1, V] are the target's rows at
        its last token and its k drafts; row j gets the mask of the state after drafts 1 … j.
        The matcher walks the drafts, then rolls back to where it was. Past a draft the grammar
        refuses, the rows keep that state's mask: the verifier rejects that draft (its
        probability is 0), so nothing after it is emitted."""
        t0 = time.perf_counter()
        bitmask = self.allocate_bitmask(len(drafts) + 1)
        walked = 0  # drafts the grammar accepted so far
        for j in range(len(drafts) + 1):
            live = j == walked and not matcher.is_terminated()
            if live:
                matcher.fill_next_token_bitmask(bitmask, j)
            else:  # after a refused draft, or after an accepted EOS: a row never reached
                bitmask[j] = bitmask[j - 1]
            if live and j < len(drafts):
                walked += bool(matcher.accept_token(drafts[j]))
        if walked:
            matcher.rollback(walked)
        self._apply_filled(logits, bitmask, t0)

    def allowed(self, matcher: Any) -> torch.Tensor:
        """The tokens `matcher` allows next, as a bool tensor [vocab_size]."""
        bitmask = self.allocate_bitmask(1)
        matcher.fill_next_token_bitmask(bitmask, 0)
        logits = torch.zeros(1, self.vocab_size)
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)
        return logits[0] == 0

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply(self, logits: torch.Tensor, rows: list[int], matchers: list[Any]) -> None:
        """In place: every token the row's matcher forbids next gets logit -inf."""
        t0 = time.perf_counter()
        bitmask = self.allocate_bitmask(len(rows))  # [R, ceil(V / 32)]
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, i)
        if rows == list(range(logits.shape[0])):
            self._apply_filled(logits, bitmask, t0)
        else:
            sub = logits[rows]
            self._apply_filled(sub, bitmask, t0)
            logits[rows] = sub
        self.mask_steps += 1

    def _apply_filled(
        self, logits: torch.Tensor, bitmask: torch.Tensor, filling_from: float
    ) -> None:
        """Apply a filled `bitmask` to `logits` in place (forbidden tokens to -inf), and book
        the time: filling (since `filling_from`, a perf_counter reading) and applying."""
        t1 = time.perf_counter()
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)
        self.bitmask_seconds += t1 - filling_from
        self.apply_seconds += time.perf_counter() - t1


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

    def __call__(self, spec: StructuredOutputsParams) -> FunctionGrammar:
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
