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

What a server needs on top (a client's grammar must not hurt anyone else):
- a JSON schema with a keyword xgrammar does not enforce (`uniqueItems`, `not`, ...) is
  refused when the params are made, as vLLM's `has_xgrammar_unsupported_json_features` does:
  an output that breaks the schema it was promised would look like a bug in the client;
- compiled grammars are cached up to a number of bytes, least recently used first out (vLLM
  bounds xgrammar's cache with `VLLM_XGRAMMAR_CACHE_MB`, 512 MB). Each is charged what it
  added to the process's resident memory, at least xgrammar's own count (`resident_cost`):
  a large regex's grammar holds 6.6 MB by xgrammar's `memory_size_bytes` and 8.3 MB resident
  here, so a cache charged by xgrammar's count alone held more than its bound;
- with `fill_budget_s` set, each request's mask fill in a step gets that many seconds: an
  ambiguous grammar (nested repetition such as `(.{1,50}){1,50}`) can take seconds per token,
  and longer at every token. A fill cannot be interrupted (one C++ call), so fills run on a
  helper thread (`MaskFiller`); one that overruns is left to finish there, its request's
  grammar is failed (`XgrammarGrammar.error`, read by `grammar_failures`) and the step goes
  on for everyone else. The server also compiles in worker processes it can kill and probes
  each grammar's cost before admitting it (`llmlab.serve.grammar_compiler`).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from llmlab.sampling.grammar import XgrammarGrammar, compile_spec, schema_of, short_repr
from llmlab.sampling.mask_filler import MaskFiller

SPEC_FIELDS = ("json", "json_object", "regex", "choice", "grammar")
DEFAULT_CACHE_LIMIT_BYTES = 512 * 2**20  # vLLM's VLLM_XGRAMMAR_CACHE_MB
_MEASURING = threading.Lock()  # one resident-cost measurement at a time


def release_freed_memory() -> None:
    """Give the memory freed since the last call back to the system (glibc's malloc_trim; a
    no-op elsewhere). Without it the allocator keeps what each compile's JSON and each evicted
    grammar used, and resident memory creeps past the cache's bound (20 ms a call here, the
    GIL released)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def make_freed_memory_returnable(threshold_bytes: int = 1 << 20) -> None:
    """Set glibc's allocator so that what an evicted grammar held can go back to the system
    (mallopt; a no-op elsewhere): every block of `threshold_bytes` or more in a mapping of its
    own (M_MMAP_THRESHOLD), and threads started from now on in the arenas that exist
    (M_ARENA_MAX 1). By default glibc raises the mmap threshold as large blocks are freed, up
    to 32 MB, and later ones land between small ones in the heap; and each thread may get an
    arena of its own, where a grammar's pieces and a compile's 60 MB of parsed JSON
    interleave. Either leaves holes that no trim gives back: 100 large regexes through a 64 MB
    cache grew the process by 69.5 MB with the threshold alone and 58.3 MB with both (60
    through a 32 MB cache: 34.5 and 28.5 MB). The server sets them with its first grammar."""
    M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes)
        libc.mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass


def resident_bytes() -> int:
    """This process's resident memory in bytes (Linux's /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def resident_cost(make: Callable[[], Any]) -> tuple[Any, int]:
    """`make()` and the bytes of resident memory it added, counted after what it freed went
    back to the system. One measurement at a time: two beside each other would each count
    both. Another thread allocating meanwhile can only make the count larger, which makes the
    cache evict sooner, never hold more than its bound."""
    with _MEASURING:
        release_freed_memory()
        before = resident_bytes()
        made = make()
        release_freed_memory()
        return made, max(0, resident_bytes() - before)


@dataclass
class StructuredOutputsParams:
    """What the output must be (vLLM's `StructuredOutputsParams`); exactly one field is set.

    json: a JSON schema (dict or JSON text). json_object: True for any JSON object.
    regex: a regular expression. choice: a list of strings, the output is one of them.
    grammar: an EBNF grammar (xgrammar's GBNF dialect; the root rule is `root`).
    A schema asking for what xgrammar does not enforce is refused (`unsupported_schema_feature`).
    """

    json: dict | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    # the compiled grammar, when a server compiled it before admitting the request (so the
    # engine never compiles in its step, whatever the cache has evicted meanwhile)
    _compiled: Any = field(default=None, init=False, repr=False, compare=False)

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
                f"non-empty str, got {short_repr(self.choice)}"
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(
                    f"StructuredOutputsParams.{name} must be a non-empty str, got {short_repr(value)}"
                )
        if self.json is not None:
            self.json = schema_of(self.json)

    @property
    def kind(self) -> str:
        return next(f for f in SPEC_FIELDS if getattr(self, f) not in (None, False))

    def key(self) -> str:
        """A stable text naming the grammar (the compile cache's key)."""
        value = getattr(self, self.kind)
        return f"{self.kind}:{json.dumps(value, sort_keys=True, ensure_ascii=False)}"


class StructuredOutputManager:
    """Compiles grammars for one tokenizer (once per distinct spec) and makes matchers.

    vocab_size: the model's vocabulary (the bitmask's width; it may be larger than the
    tokenizer's). eos_token_ids: the tokens that end a request (allowed once the grammar is
    complete). cache_limit_bytes: the most bytes of compiled grammars kept for reuse.
    fill_budget_s: None (fills run inline, as long as they take), or the seconds one
    request's mask may take in a step before its grammar is failed (`set_limits`).
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: frozenset[int],
        backend: Any = None,
        cache_limit_bytes: int = DEFAULT_CACHE_LIMIT_BYTES,
        fill_budget_s: float | None = None,
    ) -> None:
        import xgrammar as xgr

        self.backend = backend  # None: xgrammar's matchers; else spec -> matcher (EngineConfig)

        self.xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids) or None
        )
        # xgrammar's own cache is unbounded by default: ours, below, is bounded in bytes
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        # spec key -> (compiled grammar, bytes charged), least recently used first
        self._cache: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self.cache_bytes = 0
        self.cache_limit_bytes = DEFAULT_CACHE_LIMIT_BYTES
        self.fill_budget_s: float | None = None
        self.set_limits(cache_limit_bytes=cache_limit_bytes, fill_budget_s=fill_budget_s)
        self.filler = MaskFiller()
        # what the mask costs (chapter 15 measures it): seconds filling bitmasks, seconds
        # setting forbidden logits to -inf, and the steps that had at least one grammar
        self.bitmask_seconds = 0.0
        self.apply_seconds = 0.0
        self.mask_steps = 0

    def set_limits(
        self, cache_limit_bytes: int | None = None, fill_budget_s: float | None = None
    ) -> None:
        """Bound the compile cache (bytes; evicts at once) and/or set the per-step fill budget
        (seconds). Raises ValueError naming the argument, changing nothing."""
        if cache_limit_bytes is not None and (
            not isinstance(cache_limit_bytes, int) or cache_limit_bytes < 0
        ):
            raise ValueError(f"cache_limit_bytes must be an int >= 0, got {cache_limit_bytes!r}")
        if fill_budget_s is not None and (
            not isinstance(fill_budget_s, (int, float)) or not 0 < fill_budget_s <= 60
        ):
            raise ValueError(
                f"fill_budget_s must be None or a number of seconds in (0, 60], got "
                f"{fill_budget_s!r}"
            )
        if cache_limit_bytes is not None:
            self.cache_limit_bytes = cache_limit_bytes
            self._evict()
        if fill_budget_s is not None:
            self.fill_budget_s = float(fill_budget_s)

    # ---- compiled grammars ----------------------------------------------------------------

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of `spec`: the one a server attached to it, else the cache's,
        else compiled here (and cached). Raises ValueError naming the field for a schema,
        regex or grammar xgrammar cannot compile."""
        if spec._compiled is not None:
            return spec._compiled
        compiled = self.cached(spec)
        if compiled is None:
            compiled, resident = resident_cost(lambda: compile_spec(self.compiler, spec))
            self.remember(spec, compiled, resident)
        return compiled

    def cached(self, spec: StructuredOutputsParams) -> Any | None:
        """The cached compiled grammar of `spec` (now the most recently used), or None."""
        entry = self._cache.get(spec.key())
        if entry is None:
            return None
        self._cache.move_to_end(spec.key())
        return entry[0]

    def remember(self, spec: StructuredOutputsParams, compiled: Any, resident: int = 0) -> None:
        """Cache `compiled` for `spec`, charged the larger of xgrammar's count and `resident`
        (the bytes its making left resident, `resident_cost`), evicting the least recently used
        beyond the limit (a grammar larger than the whole limit is not kept)."""
        key = spec.key()
        charge = max(compiled.memory_size_bytes, resident)
        if key in self._cache or charge > self.cache_limit_bytes:
            return
        self._cache[key] = (compiled, charge)
        self.cache_bytes += charge
        self._evict()

    def _evict(self) -> None:
        if self.cache_bytes <= self.cache_limit_bytes:
            return
        while self.cache_bytes > self.cache_limit_bytes:
            _, (_, charge) = self._cache.popitem(last=False)
            self.cache_bytes -= charge
        release_freed_memory()  # what the evicted grammars held, back to the system

    @property
    def cache_size(self) -> int:
        """Grammars in the compile cache."""
        return len(self._cache)

    def matcher(self, spec: StructuredOutputsParams) -> Any:
        """A fresh matcher for one request (from the engine's backend when it has one)."""
        if self.backend is not None:
            return self.backend(spec)
        # rollback without limit: a speculating request walks its drafts, then steps back
        return XgrammarGrammar(self.xgr.GrammarMatcher(self.compile(spec), max_rollback_tokens=-1))

    # ---- masks ----------------------------------------------------------------------------

    def apply_to_drafts(self, logits: torch.Tensor, matcher: Any, drafts: list[int]) -> None:
        """In place, for a request that speculates: `logits` [k + 1, V] are the target's rows at
        its last token and its k drafts; row j gets the mask of the state after drafts 1 … j.
        The matcher walks the drafts, then rolls back to where it was. Past a draft the grammar
        refuses, the rows keep that state's mask: the verifier rejects that draft (its
        probability is 0), so nothing after it is emitted. A failed grammar masks nothing;
        with a budget, the walk gets it once per row."""
        if getattr(matcher, "error", None) is not None:
            return
        t0 = time.perf_counter()
        bitmask = self.allocate_bitmask(len(drafts) + 1)
        walk = lambda: _walk_drafts(matcher, drafts, bitmask)  # noqa: E731
        if self.fill_budget_s is not None and isinstance(matcher, XgrammarGrammar):
            budget = self.fill_budget_s * (len(drafts) + 1)
            if self.filler.run([walk], budget):
                matcher.fail(budget)
                return
        else:
            walk()
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
        """In place: every token the row's matcher forbids next gets logit -inf (a row whose
        grammar failed, before or in this fill, is left unmasked: its request ends)."""
        t0 = time.perf_counter()
        bitmask = self.allocate_bitmask(len(rows))  # [R, ceil(V / 32)]
        filled = self._fill(matchers, bitmask)
        indices = None if len(filled) == len(rows) else filled
        if rows == list(range(logits.shape[0])):
            self._apply_filled(logits, bitmask, t0, indices)
        else:
            sub = logits[rows]
            self._apply_filled(sub, bitmask, t0, indices)
            logits[rows] = sub
        self.mask_steps += 1

    def _fill(self, matchers: list[Any], bitmask: torch.Tensor) -> list[int]:
        """Fill row i of `bitmask` for `matchers[i]`; returns the rows filled. With a budget,
        xgrammar's fills run on the filler, and one that overruns fails its grammar."""
        live = [i for i, m in enumerate(matchers) if getattr(m, "error", None) is None]
        budget = self.fill_budget_s
        timed = [i for i in live if budget is not None and isinstance(matchers[i], XgrammarGrammar)]
        for i in live:
            if budget is None or not isinstance(matchers[i], XgrammarGrammar):
                matchers[i].fill_next_token_bitmask(bitmask, i)
        if timed:
            calls = [_filling(matchers[i], bitmask, i) for i in timed]
            for j in self.filler.run(calls, budget):
                matchers[timed[j]].fail(budget)
        return [i for i in live if getattr(matchers[i], "error", None) is None]

    @property
    def overrunning_fills(self) -> int:
        """Fills left running past their budget (each holds a core until it ends)."""
        return self.filler.overrunning

    def _apply_filled(
        self,
        logits: torch.Tensor,
        bitmask: torch.Tensor,
        filling_from: float,
        indices: list[int] | None = None,
    ) -> None:
        """Apply a filled `bitmask` to `logits` in place (forbidden tokens to -inf; only the
        rows `indices` when given), and book the time: filling (since `filling_from`, a
        perf_counter reading) and applying."""
        t1 = time.perf_counter()
        if indices != []:
            # xgrammar fills the mask on the host; the logits may be on a GPU (vLLM sends its
            # bitmask the same way, one small copy per step)
            bitmask = bitmask.to(logits.device, non_blocking=True)
            self.xgr.apply_token_bitmask_inplace(
                logits, bitmask, vocab_size=self.vocab_size, indices=indices
            )
        self.bitmask_seconds += t1 - filling_from
        self.apply_seconds += time.perf_counter() - t1


def _filling(matcher: Any, bitmask: torch.Tensor, row: int) -> Callable[[], None]:
    return lambda: matcher.fill_next_token_bitmask(bitmask, row)


def _walk_drafts(matcher: Any, drafts: list[int], bitmask: torch.Tensor) -> None:
    """Row j of `bitmask`: the mask after drafts 1 … j (see `apply_to_drafts`); the matcher
    ends where it started."""
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
