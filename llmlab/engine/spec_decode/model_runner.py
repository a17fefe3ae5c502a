"""The model runner of an engine that speculates: drafts in, one verify forward, tokens out.

Each request with drafts brings its last token and its k drafts to the step's flat batch (k + 1
positions whose K/V go into the paged cache); the target's logits at all k + 1 positions are
computed and the rejection sampler decides how many drafts stand. Requests without drafts
(prefill chunks, requests whose sampling the verifier does not cover) are sampled as by the
plain `ModelRunner`, in the same forward. vLLM: `GPUModelRunner` with its `drafter` and
`rejection_sampler` (`vllm/v1/worker/gpu_model_runner.py`).
"""

from __future__ import annotations

import time

import torch

from llmlab.engine.model_runner import ModelRunner
from llmlab.engine.scheduler import SchedulerOutput
from llmlab.engine.spec_decode.draft_model import EarlyExitProposer
from llmlab.engine.spec_decode.rejection_sampler import (
    greedy_verify,
    rejection_sample,
    target_probs,
)
from llmlab.structured_output import grammar_failures


class SpecDecodeModelRunner(ModelRunner):
    """`ModelRunner` whose `execute_model` returns, per caught-up request, the list of tokens
    its step emitted. draft_num_layers: None for the n-gram method (drafts come from the
    scheduler), else the layers of the early-exit draft model."""

    def __init__(self, *args, draft_num_layers: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drafter = (
            None if draft_num_layers is None else EarlyExitProposer(self.model, draft_num_layers)
        )
        self.draft_seconds = 0.0

    def propose_drafts(self, out: SchedulerOutput) -> None:
        """Fill the scheduler's placeholder drafts with the draft model's tokens, in place."""
        specs = out.scheduled_spec_decode_tokens
        rows = [
            (req, start)
            for req, start in zip(out.requests, out.num_computed_tokens)
            if req.request_id in specs
        ]
        get_block_ids = self.kv_cache_manager.get_block_ids
        drafts = self.drafter.propose(
            [req.all_token_ids[-1] for req, _ in rows],
            [start for _, start in rows],
            [len(specs[req.request_id]) for req, _ in rows],
            [get_block_ids(req.request_id) for req, _ in rows],
            self.kv_caches,
            self.block_size,
            self.attention_backend,
        )
        for (req, _), d in zip(rows, drafts):
            specs[req.request_id][:] = d

    def execute_model(self, out: SchedulerOutput) -> list[list[int] | None]:  # type: ignore[override]
        self.last_logprobs = {}
        self.failed_requests = {}
        if out.is_empty:
            return []
        specs = out.scheduled_spec_decode_tokens
        if specs and self.drafter is not None:
            t0 = time.perf_counter()
            self.propose_drafts(out)
            self.draft_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        inp, num_drafts = self._verify_inputs(out)
        self.prepare_seconds += time.perf_counter() - t0
        with torch.inference_mode():
            hidden = self.forward(inp)  # [T, hidden]
            if any(r.prompt_logprobs is not None for r in out.requests):
                self._prompt_logprobs(out, hidden)
            if not inp.sample_requests:
                return []
            rows = hidden[inp.sample_rows]  # [sum(k + 1), hidden]
            return self.verify(rows, inp.sample_requests, num_drafts, specs)

    def _verify_inputs(self, out: SchedulerOutput):
        """The step's flat batch, each drafted request's k drafts after its last token; and
        per caught-up request, how many drafts it brings (its k + 1 last rows sample)."""
        specs = out.scheduled_spec_decode_tokens
        token_ids: list[int] = []
        block_ids: list[list[int]] = []
        sample_idx: list[int] = []
        sample_requests = []
        num_drafts: list[int] = []
        get_block_ids = self.kv_cache_manager.get_block_ids
        end = 0
        for req, start, n in zip(out.requests, out.num_computed_tokens, out.num_new_tokens):
            all_ids = req.all_token_ids
            drafts = specs.get(req.request_id)
            token_ids.extend(all_ids[start : start + n])
            if drafts:
                token_ids.extend(drafts)  # after the last token: k + 1 in all
            block_ids.append(get_block_ids(req.request_id))
            end += n
            k = len(drafts) if drafts else 0
            if start + n - k == len(all_ids):  # caught up: its k + 1 last rows sample
                sample_idx.extend(range(end - 1 - k, end))
                sample_requests.append(req)
                num_drafts.append(k)
        inp = self.build_model_input(
            token_ids,
            block_ids,
            out.num_computed_tokens,
            out.num_new_tokens,
            sample_idx,
            sample_requests,
        )
        return inp, num_drafts

    def verify(
        self,
        hidden: torch.Tensor,
        requests: list,
        num_drafts: list[int],
        specs: dict[str, list[int]],
    ) -> list[list[int] | None]:
        """Per request, the tokens its step emits (None: its verification failed, and it
        alone is finished). `hidden` holds num_drafts[i] + 1 rows for request i, in order;
        requests without drafts go through the plain sampler, logprobs and all."""
        result: list[list[int] | None] = [None] * len(requests)
        offsets = [0]
        for k in num_drafts:
            offsets.append(offsets[-1] + k + 1)
        plain = [i for i, k in enumerate(num_drafts) if k == 0]
        if plain:
            rows = torch.tensor([offsets[i] for i in plain], dtype=torch.long).to(hidden.device)
            sampled = self.sample_tokens(hidden[rows], [requests[i] for i in plain])
            for i, t in zip(plain, sampled):
                result[i] = None if t is None else [t]
        drafted = [i for i, k in enumerate(num_drafts) if k]
        if drafted:
            for i, tokens in zip(
                drafted, self._verify_drafted(hidden, requests, drafted, offsets, specs)
            ):
                result[i] = tokens
            self.failed_requests.update(grammar_failures(requests[i] for i in drafted))
        return result

    def _verify_drafted(self, hidden, requests, drafted, offsets, specs) -> list[list[int] | None]:
        """The tokens each drafted request's step emits: its k + 1 rows' logits, its grammar's
        mask at each, then greedy verification or rejection sampling. A request whose
        verification raises gets None; the others go on."""
        rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in drafted])
        logits = self.model.compute_logits(hidden[rows.to(hidden.device)])  # [sum(k + 1), V]
        out: list[list[int] | None] = []
        at = 0
        for i in drafted:
            req = requests[i]
            k1 = offsets[i + 1] - offsets[i]
            try:
                out.append(self._verify_one(logits[at : at + k1], req, specs[req.request_id]))
            except Exception:
                self._fail(req)
                out.append(None)
            at += k1
        return out

    def _verify_one(self, logits: torch.Tensor, req, drafts: list[int]) -> list[int]:
        """One request's verify step: logits [k + 1, V] at its last token and its k drafts."""
        if req.grammar is not None:  # a grammar's mask at each of the k + 1 positions
            self.structured_output_manager.apply_to_drafts(logits, req.grammar, drafts)
        params = req.sampling_params
        if params.greedy:
            return greedy_verify(logits.argmax(dim=-1).tolist(), drafts)
        probs = target_probs(logits, [params] * logits.shape[0])  # [k + 1, V]
        g = req.generator if req.generator is not None else self.default_generator
        return rejection_sample(probs, drafts, None, g)
