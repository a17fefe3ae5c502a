"""The model runner: one scheduled step → one flat batch → one forward → one token per request.

vLLM's `GPUModelRunner` in miniature. A `SchedulerOutput` says which requests run and how many
tokens each brings; the runner lays those tokens end to end (`input_ids [T]`, `positions [T]`),
builds the attention metadata (`cu_seqlens_q`, `seq_lens`, `block_tables`, `slot_mapping`) with
tensor operations (a Python loop over requests, never over tokens), runs the model once, computes
logits only for the last token of each request that is caught up (a partial prefill chunk
samples nothing) and samples them, each request with its own parameters and generator.

The model it runs is chosen once, here: the readable `llmlab.model` for the "torch", "triton"
and "cuda" attention backends, or, for "cpu", the same model with its layers swapped for the C
fast path (`llmlab.model_cpu.cpu_model`, weights prepared once at start-up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from llmlab.engine.scheduler import SchedulerOutput
from llmlab.kvcache.manager import KVCacheManager
from llmlab.model import LlamaModel
from llmlab.ops.metadata import AttentionMetadata
from llmlab.sampling import Logprob, apply_logits_processors, sample


@dataclass
class ModelInput:
    """The flat batch of one step (what `ModelRunner.prepare_inputs` builds)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    metadata: AttentionMetadata
    sample_rows: torch.Tensor  # [R] int64: flat index of the last token of each sampled request
    sample_requests: list  # the R requests that get a token, in order


class ModelRunner:
    """Runs `model` over the paged KV cache `kv_caches` for the requests a scheduler picks."""

    def __init__(
        self,
        model: LlamaModel,
        kv_cache_manager: KVCacheManager,
        num_blocks: int,
        block_size: int,
        attention_backend: str,
        default_generator: torch.Generator | None,
        kv_cache_dtype: torch.dtype | None = None,
        kv_scales: list[tuple[float, float]] | None = None,
    ) -> None:
        if attention_backend == "cpu":
            from llmlab.model_cpu import cpu_model

            model = cpu_model(model)  # the C fast path, weights prepared once
        self.model = model
        self.kv_cache_manager = kv_cache_manager
        self.block_size = block_size
        self.attention_backend = attention_backend
        self.device = model.device
        # not zeroed: no backend reads a slot before a token was written to it
        self.kv_caches = model.allocate_kv_caches(
            num_blocks, block_size, dtype=kv_cache_dtype, zeroed=False
        )
        self.kv_scales = kv_scales  # per layer (k_scale, v_scale) of an fp8 cache
        # unseeded requests draw from this one (seeded by the engine's `seed`)
        self.default_generator = default_generator
        self.prepare_seconds = 0.0  # time spent building flat batches (engine overhead)
        self.last_logprobs: dict = {}  # request id -> the last step's logprob entry
        self.structured_output_manager = None  # set by the engine on its first grammar

    def weight_bytes(self) -> int:
        """Bytes of the weights this runner computes with: parameters plus prepared copies."""
        from llmlab.model_cpu import weight_bytes

        return weight_bytes(self.model)

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInput:
        """Build input ids, positions and attention metadata for one step."""
        requests = out.requests
        starts_list = out.num_computed_tokens
        q_lens_list = out.num_new_tokens
        token_ids: list[int] = []
        block_ids: list[list[int]] = []
        sample_idx: list[int] = []
        sample_requests = []
        get_block_ids = self.kv_cache_manager.get_block_ids
        end = 0
        for req, start, n in zip(requests, starts_list, q_lens_list):
            all_ids = req.all_token_ids
            token_ids.extend(all_ids[start : start + n])
            block_ids.append(get_block_ids(req.request_id))
            end += n
            if start + n == len(all_ids):
                sample_idx.append(end - 1)
                sample_requests.append(req)
        return self.build_model_input(
            token_ids, block_ids, starts_list, q_lens_list, sample_idx, sample_requests
        )

    def build_model_input(
        self,
        token_ids: list[int],
        block_ids: list[list[int]],
        starts_list: list[int],
        q_lens_list: list[int],
        sample_idx: list[int],
        sample_requests: list,
    ) -> ModelInput:
        """The step's tensors from its flat token list: sequence s brings `q_lens_list[s]`
        tokens from position `starts_list[s]` on, its blocks `block_ids[s]`; the rows
        `sample_idx` (flat indices) are the ones whose logits are computed."""
        bs = self.block_size
        num_seqs = len(starts_list)
        max_blocks = max(map(len, block_ids))
        table = [ids + [0] * (max_blocks - len(ids)) for ids in block_ids]

        device = self.device
        input_ids = torch.tensor(token_ids, dtype=torch.long)  # [T]
        starts = torch.tensor(starts_list, dtype=torch.long)  # [S]
        q_lens = torch.tensor(q_lens_list, dtype=torch.long)  # [S]
        block_tables = torch.tensor(table, dtype=torch.int32)  # [S, max_blocks]
        cu_seqlens_q = torch.zeros(num_seqs + 1, dtype=torch.int32)  # [S + 1]
        torch.cumsum(q_lens, 0, out=cu_seqlens_q[1:])
        num_tokens = input_ids.shape[0]
        if num_tokens == num_seqs:  # decode only: one token per request
            seq_idx = torch.arange(num_seqs)
            positions = starts
        else:
            seq_idx = torch.repeat_interleave(torch.arange(num_seqs), q_lens)  # [T]
            offset_in_seq = torch.arange(num_tokens) - cu_seqlens_q[:-1].long()[seq_idx]
            positions = starts[seq_idx] + offset_in_seq  # [T]
        # slot of token t = block_tables[its sequence, pos // bs] * bs + pos % bs
        block_of_token = block_tables[seq_idx, positions // bs].long()  # [T]
        slot_mapping = block_of_token * bs + positions % bs  # [T]
        seq_lens = (starts + q_lens).to(torch.int32)  # [S]
        # checked here, once; every layer of the step then uses it as it is
        metadata = AttentionMetadata(
            cu_seqlens_q=cu_seqlens_q.to(device),
            seq_lens=seq_lens.to(device),
            slot_mapping=slot_mapping.to(device),
            block_tables=block_tables.to(device),
            kv_caches=self.kv_caches,
            max_query_len=max(q_lens_list),
            backend=self.attention_backend,
            kv_scales=self.kv_scales,
        )
        return ModelInput(
            input_ids=input_ids.to(device),
            positions=positions.to(device),
            metadata=metadata,
            sample_rows=torch.tensor(sample_idx, dtype=torch.long, device=device),
            sample_requests=sample_requests,
        )

    def execute_model(self, out: SchedulerOutput) -> list[int]:
        """Run one step; return one sampled token per caught-up request (in `out` order).

        Requests that asked for logprobs get them too: `last_logprobs` maps their ids to this
        step's entry, and prompt logprobs are written into `request.prompt_logprobs`.
        """
        self.last_logprobs = {}
        if out.is_empty:
            return []
        t0 = time.perf_counter()
        inp = self.prepare_inputs(out)
        self.prepare_seconds += time.perf_counter() - t0
        with torch.inference_mode():
            hidden = self.model(inp.input_ids, inp.positions, inp.metadata)  # [T, hidden]
            if any(r.prompt_logprobs is not None for r in out.requests):
                self._prompt_logprobs(out, hidden)
            if not inp.sample_requests:
                return []
            logits = self.model.compute_logits(hidden[inp.sample_rows])  # [R, vocab]
            return self.sample_tokens(logits, inp.sample_requests)

    def sample_tokens(self, logits: torch.Tensor, sample_requests: list) -> list[int]:
        """One token per row of `logits` [R, vocab], row r for `sample_requests[r]`: its logits
        processors, banned tokens, logprobs and sampling parameters applied. Call it under
        `torch.inference_mode()`, as `execute_model` does (`logits` is changed in place)."""
        raw_logprobs = {}
        for row, req in enumerate(sample_requests):
            if req.needs_extra_sampling:  # logprobs, a penalty or a logit bias
                params = req.sampling_params
                if params.logprobs is not None:  # of the raw logits, as vLLM's default
                    raw_logprobs[row] = logits[row].log_softmax(-1)
                if params.needs_logits_processing:
                    apply_logits_processors(
                        logits, row, params, req.prompt_token_ids, req.output_token_ids
                    )
            banned = req.banned_token_ids()  # EOS / stop tokens before min_tokens
            if banned:
                logits[row, list(banned)] = float("-inf")
        if any(r.has_grammar for r in sample_requests):  # structured output's bitmask
            rows = [i for i, r in enumerate(sample_requests) if r.grammar is not None]
            self.structured_output_manager.apply(
                logits, rows, [sample_requests[i].grammar for i in rows]
            )
        params = [r.sampling_params for r in sample_requests]
        default = self.default_generator
        generators = [r.generator if r.generator is not None else default for r in sample_requests]
        sampled = sample(logits, params, generators).tolist()
        for row, lp in raw_logprobs.items():
            req = sample_requests[row]
            self.last_logprobs[req.request_id] = logprob_entries(
                lp.unsqueeze(0), [sampled[row]], req.sampling_params.logprobs
            )[0]
        return sampled

    def _prompt_logprobs(self, out: SchedulerOutput, hidden: torch.Tensor) -> None:
        """Logprobs of the prompt tokens this step computes: the logits at position p score
        prompt token p + 1 (vLLM computes them the same way, chunk by chunk)."""
        flat = 0
        for req, start, n in zip(out.requests, out.num_computed_tokens, out.num_new_tokens):
            num_prompt = req.num_prompt_tokens
            if req.prompt_logprobs is not None and start < num_prompt - 1:
                last = min(start + n, num_prompt - 1)  # positions start .. last - 1
                k = req.sampling_params.prompt_logprobs
                for lo in range(start, last, PROMPT_LOGPROBS_CHUNK):  # bound the [N, V] logits
                    hi = min(lo + PROMPT_LOGPROBS_CHUNK, last)
                    rows = hidden[flat + lo - start : flat + hi - start]  # [N, hidden]
                    lp = self.model.compute_logits(rows).log_softmax(-1)  # [N, vocab]
                    targets = req.prompt_token_ids[lo + 1 : hi + 1]
                    req.prompt_logprobs[lo + 1 : hi + 1] = logprob_entries(lp, targets, k)
            flat += n


PROMPT_LOGPROBS_CHUNK = 256


def logprob_entries(
    logprobs: torch.Tensor, token_ids: list[int], k: int
) -> list[dict[int, Logprob]]:
    """One {token id: Logprob} per row of `logprobs` [N, V]: the given token first (with its
    rank), then the k most likely tokens (OpenAI's top_logprobs)."""
    ids = torch.tensor(token_ids, dtype=torch.long).unsqueeze(1)  # [N, 1]
    chosen = logprobs.gather(1, ids)  # [N, 1]
    ranks = ((logprobs > chosen).sum(1) + 1).tolist()  # [N]
    chosen = chosen.squeeze(1).tolist()
    top_vals, top_ids = logprobs.topk(k, dim=1) if k else (None, None)  # [N, k]
    entries = []
    for i, tok in enumerate(token_ids):
        entry = {tok: Logprob(chosen[i], ranks[i])}
        if k:
            for j, (t, v) in enumerate(zip(top_ids[i].tolist(), top_vals[i].tolist())):
                entry.setdefault(t, Logprob(v, j + 1))
        entries.append(entry)
    return entries
