"""The endpoints' logic apart from the web framework: checks at the door, a request's prompts
tokenized and its grammar compiled, its sequences admitted into `AsyncLLM` (vLLM:
`entrypoints/openai/serving_engine.py`); the answers are `llmlab.serve.responses`'.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from llmlab.engine import LLMEngine
from llmlab.sampling.params import INT64_MAX, SamplingParams
from llmlab.sampling.structured_output import StructuredOutputsParams
from llmlab.serve.async_engine import AsyncLLM, EngineDeadError, QueueFullError
from llmlab.serve.conversion import (
    check_token_ids,
    prompt_count,
    prompts_of,
    structured_outputs_of,
    to_sampling_params,
)
from llmlab.serve.grammar_compiler import (
    GrammarBusy,
    GrammarCompilePool,
    GrammarLimits,
    GrammarRefused,
)
from llmlab.serve.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, short
from llmlab.serve.responses import Answers, Choice, Generation, body_echo

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
TOKENIZE_INLINE_CHARS = 4096  # one prompt up to this long is tokenized on the event loop
PARSE_INLINE_BYTES = 64 * 1024  # a larger body is parsed and checked on a worker thread
MAX_OVERRUNNING_FILLS = 2  # grammar fills left running past their budget before new grammars wait
logger = logging.getLogger("llmlab.serve")


def default_max_body_bytes(max_model_len: int) -> int:
    """The body cap for a context of `max_model_len` tokens: room for a prompt that fills it
    even as escaped JSON (a token is rarely over 16 characters, a character at most 6 bytes
    as \\uXXXX) plus 1 MiB for the rest of the body."""
    return (1 << 20) + 96 * max_model_len


class OpenAIServing:
    """The endpoints' logic, apart from the web framework (so it reads top to bottom)."""

    def __init__(
        self,
        async_llm: AsyncLLM,
        served_model_names: list[str],
        grammar_limits: GrammarLimits | None = None,
    ) -> None:
        self.llm = async_llm
        self.engine: LLMEngine = async_llm.engine
        self.tokenizer = self.engine.tokenizer
        self.names = list(served_model_names)
        self.created = int(time.time())
        self.grammar_limits = grammar_limits or GrammarLimits()
        self.grammar_pool: GrammarCompilePool | None = None  # made on the first grammar
        self._grammar_setup: asyncio.Lock | None = None
        self.answers = Answers(self.tokenizer, self.abort)

    def client_gone(self, kind: str) -> None:
        """Count a client that left early; log the 1st, 10th, 100th, ... of each kind."""
        counts = self.llm.metrics.client_disconnects
        n = counts[kind] = counts.get(kind, 0) + 1
        if n == 10 ** (len(str(n)) - 1):
            logger.warning(
                "a client left before its answer, during %s (%d so far of that kind; "
                "llmlab:client_disconnects_total counts them all)",
                kind,
                n,
            )

    def close(self) -> None:
        """Stop the grammar workers (a compile in flight too)."""
        if self.grammar_pool is not None:
            self.grammar_pool.close()

    # ---- checks at the door ---------------------------------------------------------------

    def _check_model(self, model: str | None) -> str:
        if model is None:
            return self.names[0]
        if model not in self.names:
            raise OpenAIError(
                404,
                f"model {short(model)} does not exist; this server serves {self.names}",
                "model",
                "NotFoundError",
            )
        return model

    async def _prompt_ids(self, body: CompletionRequest | ChatCompletionRequest) -> list[list[int]]:
        """The prompts' token ids, checked. On a worker thread (the tokenizer lets the event
        loop run meanwhile) unless it is one short text: a chat template, a batch of prompts or
        a long text never stalls the other streams."""
        if isinstance(body, ChatCompletionRequest):
            if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
                raise OpenAIError(
                    400,
                    "messages: this model has no chat template; use /v1/completions",
                    "messages",
                )
            return [await asyncio.to_thread(self._chat_ids, body)]
        p = body.prompt
        if isinstance(p, str) and self.tokenizer is not None and len(p) <= TOKENIZE_INLINE_CHARS:
            return self._completion_ids(body)
        return await asyncio.to_thread(self._completion_ids, body)

    def _chat_ids(self, body: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer.encode(text))

    def _completion_ids(self, body: CompletionRequest) -> list[list[int]]:
        out = []
        batch = prompts_of(body)
        for i, prompt in enumerate(batch):
            param = "prompt" if len(batch) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise OpenAIError(
                        400, f"{param}: this model has no tokenizer; send token ids", param
                    )
                ids = list(self.tokenizer.encode(prompt))
            else:
                ids = prompt
            check_token_ids(ids, self.engine.vocab_size, param)
            out.append(ids)
        return out

    def _check_fits(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        """A request of more sequences than the waiting queue ever holds can never be admitted:
        a 400 (a 503 would have the client retry in vain), before anything is tokenized."""
        count = 1 if isinstance(body, ChatCompletionRequest) else prompt_count(body)
        total = count * body.n
        if total > self.llm.max_waiting:
            raise OpenAIError(
                400,
                f"prompt: {count} prompt(s) with n={short(body.n)} make {short(total)} "
                "sequences, more than this server ever queues at once "
                f"(max_waiting={self.llm.max_waiting}); send fewer per request",
                "prompt",
            )

    async def _grammar_pool(self) -> GrammarCompilePool | None:
        """The compile workers, made on the first grammar with the engine's grammar manager
        (xgrammar reads the vocabulary then); None when the engine has its own backend."""
        if self._grammar_setup is None:
            self._grammar_setup = asyncio.Lock()
        async with self._grammar_setup:
            if self.grammar_pool is None:
                manager = await asyncio.to_thread(self.engine.structured_outputs)
                if manager.backend is not None:
                    return None
                limits = self.grammar_limits
                manager.set_limits(
                    cache_limit_bytes=limits.cache_mb << 20, fill_budget_s=limits.fill_budget_s
                )
                self.grammar_pool = GrammarCompilePool(manager.info, limits)
            return self.grammar_pool

    async def _compile_grammar(self, spec: StructuredOutputsParams, field: str) -> None:
        """Compile `spec` (or find it in the cache) before its request is admitted, and attach
        it: the engine never compiles in its step. Refusals name `field`."""
        pool = await self._grammar_pool()
        if pool is None:
            return
        manager = self.engine.structured_outputs()
        if manager.overrunning_fills >= MAX_OVERRUNNING_FILLS:
            raise OpenAIError(
                503,
                "grammar masks left running past their budget still hold this server's cores; "
                "try again later",
                field,
                "ServiceUnavailableError",
            )
        compiled = manager.cached(spec)
        if compiled is None:
            try:
                compiled, resident = await pool.compile(spec)
            except GrammarRefused as e:
                if e.why != "invalid":  # one that costs too much
                    refused = self.llm.metrics.grammars_refused
                    refused[e.why] = refused.get(e.why, 0) + 1
                raise OpenAIError(400, f"{field}: {e}", field) from None
            except GrammarBusy as e:
                raise OpenAIError(503, f"{field}: {e}", field, "ServiceUnavailableError") from None
            manager.remember(spec, compiled, resident)
        spec._compiled = compiled

    # ---- one request ----------------------------------------------------------------------

    async def admit(self, body: CompletionRequest | ChatCompletionRequest) -> Generation:
        """Check a parsed request and hand its n × prompts sequences to the engine."""
        model = self._check_model(body.model)
        chat = isinstance(body, ChatCompletionRequest)
        if body.n > self.engine.config.max_num_seqs:
            raise OpenAIError(
                400,
                f"n must be in [1, max_num_seqs={self.engine.config.max_num_seqs}]"
                f" (the choices of a request run in one batch), got {short(body.n)}",
                "n",
            )
        if (body.stop or body_echo(body)) and self.tokenizer is None:
            raise OpenAIError(
                400,
                "stop strings and echo need a tokenizer; this model has none (use stop_token_ids)",
                "stop",
            )
        self._check_fits(body)
        spec = structured_outputs_of(body)
        if spec is not None:
            field = "response_format" if body.response_format is not None else "structured_outputs"
            if self.tokenizer is None:
                raise OpenAIError(
                    400, "structured output needs a tokenizer; this model has none", field
                )
            await self._compile_grammar(spec, field)
        prompts = await self._prompt_ids(body)
        default = None if chat else DEFAULT_COMPLETION_MAX_TOKENS
        params = [
            to_sampling_params(
                body, len(ids), self.engine.max_model_len, self.engine.vocab_size, default, spec
            )
            for ids in prompts
        ]
        total = len(prompts) * body.n
        if self.llm.num_waiting + total > self.llm.max_waiting:
            self.llm.metrics.rejected_queue_full += 1
            raise OpenAIError(
                503,
                f"the waiting queue is full ({self.llm.max_waiting} requests); try again later",
                None,
                "ServiceUnavailableError",
            )
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        choices: list[Choice] = []
        try:
            for p, (ids, base) in enumerate(zip(prompts, params)):
                for j in range(body.n):
                    child = base if body.n == 1 else _child_params(base, j)
                    rid = request_id if total == 1 else f"{request_id}-{len(choices)}"
                    choices.append(Choice(len(choices), p, self.llm.add_request(rid, ids, child)))
        except (QueueFullError, EngineDeadError, ValueError) as e:
            for c in choices:  # all or nothing
                self.llm.abort(c.stream.request_id)
            if isinstance(e, QueueFullError):
                raise OpenAIError(503, str(e), None, "ServiceUnavailableError") from None
            if isinstance(e, EngineDeadError):
                raise OpenAIError(503, str(e), None, "ServiceUnavailableError") from None
            raise OpenAIError(400, str(e), "prompt") from None
        return Generation(request_id, model, chat, prompts, choices, params[0])

    def abort(self, gen: Generation) -> None:
        for c in gen.choices:
            if not c.stream.finished:
                self.llm.abort(c.stream.request_id)

    def model_card(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "llmlab",
            "max_model_len": self.engine.max_model_len,
        }

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card(name) for name in self.names]}


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Child `index` of a request with n > 1: the same parameters, seed + index when seeded
    (vLLM's parallel sampling), wrapped to stay a 64-bit int."""
    if params.seed is None:
        return params
    seed = params.seed + index
    if seed > INT64_MAX:
        seed -= 1 << 64
    return SamplingParams(**{**params.__dict__, "seed": seed})
