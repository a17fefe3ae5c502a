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
  bounds xgrammar's cache with `VLLM_XGRAMMAR_CACHE_MB`, 512 MB);
- with `fill_budget_s` set, each request's mask fill in a step gets that many seconds: an
  ambiguous grammar (nested repetition such as `(.{1,50}){1,50}`) can take seconds per token,
  and longer at every token. A fill cannot be interrupted (one C++ call), so fills run on a
  helper thread (`MaskFiller`); one that overruns is left to finish there, its request's
  grammar is failed (`XgrammarGrammar.error`, read by `grammar_failures`) and the step goes
  on for everyone else. The server also compiles in worker processes it can kill and probes
  each grammar's cost before admitting it (`llmlab.serve.grammar_compiler`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

SPEC_FIELDS = ("json", "json_object", "regex", "choice", "grammar")
DEFAULT_CACHE_LIMIT_BYTES = 512 * 2**20  # vLLM's VLLM_XGRAMMAR_CACHE_MB
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
                f"non-empty str, got {_short(self.choice)}"
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(
                    f"StructuredOutputsParams.{name} must be a non-empty str, got {_short(value)}"
                )
        if self.json is not None:
            self.json = _schema_of(self.json)

    @property
    def kind(self) -> str:
        return next(f for f in SPEC_FIELDS if getattr(self, f) not in (None, False))

    def key(self) -> str:
        """A stable text naming the grammar (the compile cache's key)."""
        value = getattr(self, self.kind)
        return f"{self.kind}:{json.dumps(value, sort_keys=True, ensure_ascii=False)}"


def _short(value: Any, limit: int = 80) -> str:
    """repr of a refused value, cut to `limit` characters (an error quotes no whole input)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _schema_of(schema: Any) -> dict:
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
            return f"format {_short(fmt, 40)}"
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
        return f"$ref {_short(ref, 40)} (outside the schema)"
    return None


def _pattern_with_length(node: dict) -> bool:
    return ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node)


def _choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices` (each escaped)."""
    special = set(".^$*+?{}[]\\|()")
    escaped = ["".join("\\" + c if c in special else c for c in choice) for choice in choices]
    return "(" + "|".join(escaped) + ")"


def compile_spec(compiler: Any, spec: StructuredOutputsParams) -> Any:
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


@dataclass
class _FillJob:
    calls: list[Callable[[], None]]
    next: int = 0  # the first call not yet started
    current: int | None = None  # the call running now
    clock: Any = None  # the CPU clock of the thread running it (None: wall time only)
    started: float = 0.0  # that clock's reading when it started
    started_wall: float = 0.0  # time.perf_counter() then
    late: list[int] = field(default_factory=list)
    error: BaseException | None = None

    def over(self, budget_s: float) -> float:
        """How far (0: not yet, else > 0) the current call is past its budget: `budget_s` CPU
        seconds of its thread where the system tells them (a fill waiting for a core on a busy
        machine is not charged for the wait), or WALL_FACTOR times that in wall time (whatever
        the load, a step waits no longer); wall time alone elsewhere."""
        wall = time.perf_counter() - self.started_wall
        cpu = wall if self.clock is None else _clock_now(self.clock) - self.started
        return max(cpu - budget_s, wall - WALL_FACTOR * budget_s, 0.0)


WALL_FACTOR = 5  # a fill's budget in wall time, in multiples of its CPU budget


def _thread_clock() -> Any:
    """The calling thread's CPU clock id (Linux), or None."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def _clock_now(clock: Any) -> float:
    if clock is not None:
        try:
            return time.clock_gettime(clock)
        except OSError:  # the thread has ended
            pass
    return time.perf_counter()


class MaskFiller:
    """Runs mask fills in order on a helper thread, each within a time budget.

    A fill is one C++ call that cannot be interrupted. The caller waits; when a fill passes
    its budget, the caller records it as late and hands the rest of the batch to a fresh
    thread; the stuck one finishes its fill alone (xgrammar releases the GIL meanwhile) and
    exits. The budget is in CPU seconds of the filling thread (on Linux): what the grammar
    costs, not how busy the machine is; and, so that a step never waits long, five times that
    in wall time. `overrunning`: fills still running past their budget."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._job: _FillJob | None = None
        self._thread: threading.Thread | None = None
        self.overrunning = 0

    def run(self, calls: list[Callable[[], None]], budget_s: float) -> list[int]:
        """Run `calls` in order; returns the indices of those that passed `budget_s` (left
        running). An exception raised by a call is raised here, after the batch."""
        job = _FillJob(calls)
        with self._cond:
            self._job = job
            self._start_thread()
            self._cond.notify_all()
            while job.next < len(calls):
                if job.current is not None and job.over(budget_s):
                    self._leave_behind(job)
                    continue
                self._cond.wait(budget_s / 4)
            self._job = None
        if job.error is not None:
            raise job.error
        return job.late

    def _leave_behind(self, job: _FillJob) -> None:
        """The running call passed its budget: skip it, and let a fresh thread go on."""
        job.late.append(job.current)
        job.next, job.current = job.current + 1, None
        self.overrunning += 1
        self._thread = None  # the stuck thread sees this and exits after its call
        if job.next < len(job.calls):
            self._start_thread()
            self._cond.notify_all()

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="llmlab-mask", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        me, clock = threading.current_thread(), _thread_clock()
        while True:
            with self._cond:
                while self._thread is me and not self._has_work():
                    self._cond.wait()
                if self._thread is not me:
                    return
                job = self._job
                i = job.current = job.next
                job.clock, job.started = clock, _clock_now(clock)
                job.started_wall = time.perf_counter()
            error = None
            try:
                job.calls[i]()
            except BaseException as e:  # noqa: BLE001 (raised in the caller's thread)
                error = e
            with self._cond:
                if job.current != i:  # left behind: it passed its budget
                    self.overrunning -= 1
                    return
                job.current, job.next = None, i + 1
                job.error = job.error or error
                if job.next == len(job.calls):
                    self._cond.notify_all()

    def _has_work(self) -> bool:
        job = self._job
        return job is not None and job.current is None and job.next < len(job.calls)


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
        self._cache: OrderedDict[str, Any] = OrderedDict()  # least recently used first
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
            compiled = compile_spec(self.compiler, spec)
            self.remember(spec, compiled)
        return compiled

    def cached(self, spec: StructuredOutputsParams) -> Any | None:
        """The cached compiled grammar of `spec` (now the most recently used), or None."""
        compiled = self._cache.get(spec.key())
        if compiled is not None:
            self._cache.move_to_end(spec.key())
        return compiled

    def remember(self, spec: StructuredOutputsParams, compiled: Any) -> None:
        """Cache `compiled` for `spec`, evicting the least recently used beyond the limit (a
        grammar larger than the whole limit is not kept)."""
        key = spec.key()
        if key in self._cache or compiled.memory_size_bytes > self.cache_limit_bytes:
            return
        self._cache[key] = compiled
        self.cache_bytes += compiled.memory_size_bytes
        self._evict()

    def _evict(self) -> None:
        while self.cache_bytes > self.cache_limit_bytes:
            _, old = self._cache.popitem(last=False)
            self.cache_bytes -= old.memory_size_bytes

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
