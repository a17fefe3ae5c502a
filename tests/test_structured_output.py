"""Structured output with xgrammar: every output under a schema parses and validates, over
many seeds and prompts; constrained requests leave free ones in the same batch untouched; the
mask forbids EOS until the grammar is complete and allows it then; choice, regex and EBNF;
refusals name the field."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
import torch

from llmlab import LLM, SamplingParams
from llmlab.sampling.grammar import compile_spec
from llmlab.sampling.structured_output import StructuredOutputManager
from llmlab.sampling.structured_output import StructuredOutputsParams as SO

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
PROMPTS = ["Give me a person as JSON:", "Describe a cat.", "北京是", "def f(x):"]

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def llm(real_model):
    model, tokenizer = real_model
    return LLM(model, tokenizer, max_model_len=256, num_kv_blocks=400, max_num_seqs=32)


def test_every_output_under_a_schema_parses_and_validates(llm):
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=96, structured_outputs=SO(json=SCHEMA))
        for s in range(24)
    ]
    outs = llm.generate([PROMPTS[i % 4] for i in range(24)], params, use_tqdm=False)
    for out in outs:
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_without_the_mask_the_small_model_rarely_writes_valid_json(llm):
    outs = llm.generate(
        [p + " Answer in JSON with name, age and pets:" for p in PROMPTS],
        SamplingParams(temperature=1.0, seed=0, max_tokens=96),
        use_tqdm=False,
    )

    def valid(text):
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    assert sum(valid(o.outputs[0].text) for o in outs) < len(outs)


def test_free_requests_keep_their_tokens_beside_constrained_ones(llm):
    free = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    alone = llm.generate(PROMPTS, free, use_tqdm=False)
    mixed = llm.generate(
        PROMPTS + PROMPTS,
        [free] * 4
        + [
            SamplingParams(
                temperature=1.0, seed=i, max_tokens=40, structured_outputs=SO(json=SCHEMA)
            )
            for i in range(4)
        ],
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in mixed[:4]] == [o.outputs[0].token_ids for o in alone]


def test_choice_regex_and_grammar(llm):
    outs = llm.generate(
        ["Is the sky blue?"] * 3,
        [
            SamplingParams(
                temperature=1.0, seed=1, max_tokens=10, structured_outputs=SO(choice=["yes", "no"])
            ),
            SamplingParams(
                temperature=1.0,
                seed=2,
                max_tokens=20,
                structured_outputs=SO(regex=r"[0-9]{3}-[0-9]{4}"),
            ),
            SamplingParams(
                temperature=1.0,
                seed=3,
                max_tokens=20,
                structured_outputs=SO(grammar='root ::= "(" digit+ ")"\ndigit ::= [0-9]'),
            ),
        ],
        use_tqdm=False,
    )
    import re

    assert outs[0].outputs[0].text in ("yes", "no")
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", outs[1].outputs[0].text)
    assert (
        re.fullmatch(r"\([0-9]+\)", outs[2].outputs[0].text)
        or outs[2].outputs[0].finish_reason == "length"
    )


def test_the_mask_forbids_eos_until_the_grammar_is_complete(real_model):
    _, tokenizer = real_model
    eos = tokenizer.eos_token_id
    mgr = StructuredOutputManager(tokenizer, 49152, frozenset([eos]))
    m = mgr.matcher(
        SO(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    )
    text = '{"a": 42}'
    ids = tokenizer.encode(text)
    for i, t in enumerate(ids):
        logits = torch.zeros(1, 49152)
        mgr.apply(logits, [0], [m])
        assert logits[0, eos] == float("-inf"), f"EOS allowed after {ids[:i]}"
        assert logits[0, t] == 0, f"token {t} of valid text forbidden"
        assert m.accept_token(t)
    logits = torch.zeros(1, 49152)
    mgr.apply(logits, [0], [m])
    assert logits[0, eos] == 0 and int((logits[0] == 0).sum()) == 1  # only EOS now


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(json={"type": "strin"}), "json"),
        (dict(regex="(unclosed"), "regex"),
        (dict(grammar="root ::= undefined_rule"), "grammar"),
    ],
)
def test_a_grammar_that_cannot_compile_is_refused_naming_its_field(llm, kwargs, field):
    engine = llm.llm_engine
    with pytest.raises(ValueError, match=f"structured_outputs|{field}"):
        engine.add_request("bad", "x", SamplingParams(structured_outputs=SO(**kwargs)))
    assert "bad" not in engine.requests and not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "kwargs",
    [{}, dict(regex="a", choice=["b"]), dict(choice=[]), dict(json="not json"), dict(json=[1])],
)
def test_bad_params_name_the_field(kwargs):
    with pytest.raises(ValueError, match="StructuredOutputsParams"):
        SO(**kwargs)


def test_structured_output_beside_speculative_decoding(real_model):
    """With speculation on, a request under a grammar takes drafts too: the verifier masks each
    of its k + 1 positions with the grammar's state after the drafts before it. Its outputs
    still validate, over seeds; a free request beside it still speculates."""
    model, tokenizer = real_model
    llm = LLM(
        model,
        tokenizer,
        max_model_len=320,
        num_kv_blocks=300,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    example = '{"name": "Ann", "age": 31, "pets": ["cat", "dog"]}'
    prompts = [f"A person as JSON, like {example} or {example}:"] * 6 + ["one two " * 8]
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=96, structured_outputs=SO(json=SCHEMA))
        for s in range(6)
    ] + [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs[:6]:
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
    assert sum(o.metrics.num_draft_tokens for o in outs[:6]) > 0
    assert outs[6].metrics.num_draft_tokens > 0


def test_greedy_under_a_grammar_gives_the_same_tokens_with_speculation(real_model):
    """Greedy and masked, speculation changes nothing but the steps: the same tokens as the
    plain engine, with drafts proposed and some accepted (the prompt holds text the output
    copies)."""
    model, tokenizer = real_model
    example = '{"name": "Ann", "age": 31, "pets": ["cat", "dog"]}'
    prompts = [f"Copy this JSON: {example} Copy: {example} Again:", "Give me a person as JSON:"]
    params = SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=SO(json=SCHEMA))
    kw = dict(max_model_len=256, num_kv_blocks=200)
    plain = LLM(model, tokenizer, **kw).generate(prompts, params, use_tqdm=False)
    spec = LLM(
        model, tokenizer, speculative_config={"method": "ngram", "num_speculative_tokens": 4}, **kw
    ).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    assert spec[0].metrics.num_draft_tokens > 0 and spec[0].metrics.num_accepted_tokens > 0
    for out in spec:
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)


def test_a_backend_without_rollback_takes_no_drafts(real_model):
    """A matcher that cannot step back (chapter 15's function backend) decodes one token a
    step under speculation, and its output still follows the grammar."""
    import re

    from llmlab.sampling.grammar import FunctionBackend, vocab_texts

    model, tokenizer = real_model
    pieces = vocab_texts(tokenizer, 49152)

    # "ab" repeated 1 to 4 times, then "!"
    allowed = regex_mask(r"(ab){0,4}|(ab){0,3}a|(ab){1,4}!", r"(ab){1,4}!")

    llm = LLM(
        model,
        tokenizer,
        max_model_len=128,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
        structured_outputs_backend=FunctionBackend(allowed, pieces, tokenizer.eos_token_id),
    )
    spec = SO(regex=r"(ab){1,4}!")
    out = llm.generate(
        ["ab ab ab ab ab ab"],
        SamplingParams(temperature=0.0, max_tokens=16, structured_outputs=spec),
        use_tqdm=False,
    )[0]
    assert re.fullmatch(r"(ab){1,4}!", out.outputs[0].text) and out.metrics.num_draft_tokens == 0


def regex_mask(prefix: str, complete: str):
    """A mask function for `FunctionBackend`: a token is allowed when the text so far plus its
    text matches `prefix` (the texts that can still grow into a whole output, by hand), EOS
    when the text so far matches `complete`."""
    import re

    def allowed(text, pieces, eos_id):
        mask = torch.tensor(
            [p != "" and re.fullmatch(prefix, text + p) is not None for p in pieces]
        )
        mask[eos_id] = re.fullmatch(complete, text) is not None
        return mask

    return allowed


def test_bitmask_row_packs_as_xgrammar_reads_it():
    """A random bool mask packed by `bitmask_row` and applied by xgrammar forbids exactly the
    tokens the mask says, for vocabularies that are and are not a multiple of 32."""
    import xgrammar as xgr

    from llmlab.sampling.grammar import bitmask_row

    g = torch.Generator().manual_seed(15)
    for vocab in (32, 100, 49152):
        allowed = torch.rand(vocab, generator=g) < 0.3
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        bitmask[0] = bitmask_row(allowed)
        logits = torch.zeros(1, vocab)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab)
        assert torch.equal(logits[0] == 0, allowed)


def test_a_function_backend_in_the_engine_gives_xgrammars_tokens(llm, real_model):
    """The regex's mask written as a function, plugged in as the engine's backend, samples the
    same tokens as xgrammar's mask for the regex (same seeds), and every output matches it."""
    import re

    from llmlab.sampling.grammar import FunctionBackend, vocab_texts

    model, tokenizer = real_model
    pieces = vocab_texts(tokenizer, 49152)
    eos = tokenizer.eos_token_id

    allowed = regex_mask(r"[ab]{0,3}|[ab]{1,3}!", r"[ab]{1,3}!")  # [ab]{1,3} then "!"

    backend = FunctionBackend(allowed, pieces, eos)
    hand = LLM(model, tokenizer, max_model_len=128, structured_outputs_backend=backend)
    spec = SO(regex=r"[ab]{1,3}!")
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=8, structured_outputs=spec)
        for s in range(6)
    ]
    prompts = ["Say a or b:", "ab"] * 3
    mine = hand.generate(prompts, params, use_tqdm=False)
    theirs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mine] == [o.outputs[0].token_ids for o in theirs]
    assert all(re.fullmatch(r"[ab]{1,3}!", o.outputs[0].text) for o in mine)
    assert len(backend.matchers) == 6 and backend.seconds > 0


def test_a_backend_that_is_not_callable_is_refused_by_name(real_model):
    model, tokenizer = real_model
    with pytest.raises(ValueError, match="structured_outputs_backend"):
        LLM(model, tokenizer, structured_outputs_backend="guidance")


def test_outputs_still_validate_when_requests_are_preempted(real_model):
    """A KV pool too small for the batch preempts requests mid-output; their matchers keep their
    state (the output tokens are kept and recomputed), and every output still validates."""
    model, tokenizer = real_model
    small = LLM(model, tokenizer, max_model_len=128, num_kv_blocks=12, block_size=16)
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=80, structured_outputs=SO(json=SCHEMA))
        for s in range(6)
    ]
    outs = small.generate(["Give me a person as JSON:"] * 6, params, use_tqdm=False)
    assert small.llm_engine.scheduler.stats.num_preemptions > 0
    for out in outs:
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)


# ---- what a server needs: refusals, a bounded cache, a fill budget ------------------------------

# schemas with a keyword xgrammar 0.2 accepts and ignores, and an instance that breaks it
IGNORED_BY_XGRAMMAR = [
    (
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        ["b", "b"],
        "uniqueItems",
    ),
    ({"not": {}}, 1, "not"),
    ({"type": "string", "not": {"const": "a"}}, "a", "not"),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        {"a": 1},
        "dependentRequired",
    ),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, 1, "allOf"),
    ({"type": "string", "pattern": "[a-z]+", "maxLength": 3}, "abcdef", "minLength / maxLength"),
    (
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
            },
            "required": ["tags"],
        },
        {"tags": ["b", "b"]},
        "properties.tags: uniqueItems",
    ),
]


@pytest.mark.parametrize(
    "schema,bad,where", IGNORED_BY_XGRAMMAR, ids=[w for *_, w in IGNORED_BY_XGRAMMAR]
)
def test_a_schema_keyword_xgrammar_ignores_is_refused_naming_where(real_model, schema, bad, where):
    """The reason for each refusal: given the schema, xgrammar accepts an instance that breaks
    it (if a newer xgrammar enforces the keyword, this fails: then allow it)."""
    import xgrammar as xgr

    _, tokenizer = real_model
    mgr = StructuredOutputManager(tokenizer, 49152, frozenset([tokenizer.eos_token_id]))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    matcher = xgr.GrammarMatcher(
        mgr.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    )
    assert matcher.accept_string(json.dumps(bad)) and matcher.is_completed()
    with pytest.raises(ValueError, match=f"StructuredOutputsParams.json: {where}.* not enforced"):
        SO(json=schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 3},  # vLLM's list, from here on
        {"type": "array", "contains": {"type": "integer"}},
        {"type": "string", "format": "credit-card"},
        {"type": "object", "propertyNames": {"pattern": "^a"}, "properties": {"a": {}}},
        {"type": "object", "patternProperties": {"^a": {}, "^b": {}}},
        {"$ref": "https://example.com/schema.json"},
    ],
)
def test_vllms_unsupported_schema_features_are_refused(schema):
    with pytest.raises(ValueError, match="not enforced by xgrammar"):
        SO(json=schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"not": {"type": "string"}}},  # a property named "not"
        {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}},
        {"allOf": [{"$ref": "#/$defs/pet"}], "$defs": {"pet": {"enum": ["cat", "dog"]}}},
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": False},
        {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}]},
    ],
)
def test_schemas_xgrammar_enforces_are_accepted(schema):
    assert SO(json=schema).json == schema


def test_the_compile_cache_keeps_at_most_its_bytes_least_recently_used_out(real_model):
    _, tokenizer = real_model
    mgr = StructuredOutputManager(tokenizer, 49152, frozenset([tokenizer.eos_token_id]))
    specs = [SO(choice=[f"answer {i:02d}", f"other {i:02d}"]) for i in range(10)]
    grammars = [compile_spec(mgr.compiler, s) for s in specs]
    size = max(g.memory_size_bytes for g in grammars)
    mgr.set_limits(cache_limit_bytes=int(size * 3.5))
    for spec, grammar in zip(specs, grammars):
        mgr.remember(spec, grammar, resident=size)  # each charged `size`: three fit
        assert mgr.cache_bytes <= mgr.cache_limit_bytes
    assert mgr.cache_size == 3 and mgr.cache_bytes == 3 * size and mgr.cached(specs[0]) is None
    assert mgr.cached(specs[7]) is mgr.compile(specs[7])  # now the most recently used
    mgr.remember(SO(choice=["fresh 00", "other 99"]), grammars[0], resident=size)
    assert mgr.cached(specs[7]) is not None and mgr.cached(specs[8]) is None
    mgr.set_limits(cache_limit_bytes=size // 2)  # shrinking evicts; too big a grammar is not kept
    assert mgr.cache_size == 0 and mgr.cache_bytes == 0
    assert mgr.compile(specs[1]) is not None and mgr.cache_size == 0
    with pytest.raises(ValueError, match="cache_limit_bytes"):
        mgr.set_limits(cache_limit_bytes=-1)
    with pytest.raises(ValueError, match="fill_budget_s"):
        mgr.set_limits(fill_budget_s=0)


def test_a_grammar_is_charged_at_least_what_xgrammar_counts(real_model):
    _, tokenizer = real_model
    mgr = StructuredOutputManager(tokenizer, 49152, frozenset([tokenizer.eos_token_id]))
    grammar = compile_spec(mgr.compiler, SO(regex="[a-z]{1,9}"))
    mgr.remember(SO(regex="[a-z]{1,9}"), grammar, resident=0)
    assert mgr.cache_bytes == grammar.memory_size_bytes
    mgr.remember(SO(regex="[a-z]{1,8}"), grammar, resident=grammar.memory_size_bytes * 3)
    assert mgr.cache_bytes == grammar.memory_size_bytes * 4
    compiled = mgr.compile(SO(regex="[0-9]{1,7}"))  # compiled here: its resident cost measured
    assert mgr.cache_bytes >= grammar.memory_size_bytes * 4 + compiled.memory_size_bytes


@pytest.mark.slow
def test_resident_memory_after_many_large_grammars_stays_within_the_cache_bound(real_model):
    """Large regexes (8.3 MB resident each, 6.6 MB by xgrammar's count) through the server's
    compile workers into a 60 MB cache: the process grows by no more than the bound (55 MB
    here). Charged by xgrammar's count alone, with glibc's default settings, a 64 MB cache grew
    it by 71 MB after 12 such grammars."""
    import asyncio

    from llmlab.sampling.structured_output import release_freed_memory, resident_bytes
    from llmlab.serve.grammar_compiler import GrammarCompilePool, GrammarLimits

    _, tokenizer = real_model
    mgr = StructuredOutputManager(tokenizer, 49152, frozenset([tokenizer.eos_token_id]))
    bound = 60 * 2**20
    mgr.set_limits(cache_limit_bytes=bound)
    specs = [SO(regex=f"[a-z ]{{{20 + i},{200 + i}}}[0-9]{{1,{30 + i}}}") for i in range(13)]

    async def compile_all() -> int:
        pool = GrammarCompilePool(mgr.info, GrammarLimits(workers=1, compile_timeout_s=60))
        try:
            await pool.compile(specs[0])  # the pool's own memory is not the cache's
            release_freed_memory()
            before = resident_bytes()
            for spec in specs[1:]:
                compiled, resident = await pool.compile(spec)
                mgr.remember(spec, compiled, resident)
                del compiled
            return resident_bytes() - before
        finally:
            pool.close()

    grew = asyncio.run(compile_all())
    assert 2 <= mgr.cache_size < 12  # it did evict
    assert grew <= bound, f"grew {grew / 2**20:.1f} MB, charged {mgr.cache_bytes / 2**20:.1f} MB"


class CpuBurningMatcher:
    """Stands in for an ambiguous grammar's matcher: a fill burns `seconds` of CPU (as
    xgrammar's does for `(.{1,50}){1,50}`), then allows every token."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def fill_next_token_bitmask(self, bitmask, row):
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.seconds:
            pass
        bitmask[row] = -1

    def accept_token(self, token):
        return True

    def is_terminated(self):
        return False


def test_a_fill_past_its_budget_fails_that_grammar_alone_and_the_step_goes_on(real_model):
    """The mask of a grammar that overruns its budget is left to finish on its own: `apply`
    returns before it has (load-proof: no wall-clock bound), that grammar is failed, its row
    left unmasked, and the rows beside it get exactly their masks. Its request is reported by
    `grammar_failures`, and the next step fills the others without waiting for it."""
    from types import SimpleNamespace

    from llmlab.sampling.grammar import XgrammarGrammar, grammar_failures

    _, tokenizer = real_model
    mgr = StructuredOutputManager(
        tokenizer, 49152, frozenset([tokenizer.eos_token_id]), fill_budget_s=0.05
    )
    digits = SO(regex="[0-9]{3}")
    slow = XgrammarGrammar(CpuBurningMatcher(0.3))
    grammars = [mgr.matcher(digits), slow, mgr.matcher(digits)]
    want = mgr.allowed(mgr.matcher(digits))  # [V] bool
    for step in range(2):
        logits = torch.zeros(3, 49152)
        mgr.apply(logits, [0, 1, 2], grammars)
        if step == 0:
            assert mgr.overrunning_fills == 1, "apply waited for the whole slow fill"
        assert slow.error is not None and "0.05 s of CPU" in slow.error
        assert torch.equal(logits[0] == 0, want) and torch.equal(logits[2] == 0, want)
        assert torch.equal(logits[1], torch.zeros(49152))
        for g in (grammars[0], grammars[2]):
            assert g.error is None and g.accept_token(tokenizer.encode("1")[0])
    requests = [SimpleNamespace(request_id=f"r{i}", grammar=g) for i, g in enumerate(grammars)]
    assert grammar_failures(requests) == {"r1": slow.error}
    assert slow.accept_token(5) and not slow.is_terminated()  # never touched again
    drafted = XgrammarGrammar(CpuBurningMatcher(0.3))
    logits = torch.zeros(3, 49152)
    mgr.apply_to_drafts(logits, drafted, [5, 6])
    assert drafted.error is not None and torch.equal(logits, torch.zeros(3, 49152))
    deadline = time.monotonic() + 120
    while mgr.overrunning_fills and time.monotonic() < deadline:  # the left fills end alone
        time.sleep(0.05)
    assert mgr.overrunning_fills == 0
