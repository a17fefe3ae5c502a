"""The model runner: one scheduled step → one flat batch → one forward → one token per request.

vLLM's `GPUModelRunner` in miniature. A `SchedulerOutput` says which requests run and how many
tokens each brings; the runner lays those tokens end to end (`input_ids [T]`, `positions [T]`),
builds the attention metadata (`cu_seqlens_q`, `seq_lens`, `block_tables`, `slot_mapping`) with
array operations (a Python loop over requests, never over tokens), runs the model once, computes
logits only for the last token of each request that is caught up (a partial prefill chunk
samples nothing) and samples them, each request with its own parameters and generator.

The model it runs is chosen once, here: the readable `llmlab.model` for the "torch" backend (and
"triton"/"cuda" on a CPU), for "cpu" the same model with its layers swapped for the C fast path
(`llmlab.model.cpu.cpu_model`), and on a GPU with "triton" or "cuda" the fused layers of
`llmlab.model.gpu.gpu_model` (merged GEMMs, fused norms and rotary, no per-layer checks).

On a GPU the step's arrays reach the device in one transfer from pinned memory
(`llmlab.worker.input_batch`), and decode-only steps replay a CUDA graph
(`llmlab.worker.cuda_graphs`) unless `enforce_eager`. Every tensor the runner and the sampler
make lives on the model's device; the sampled tokens come back to the host once per step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from llmlab.config.engine import SpeculativeConfig
from llmlab.core.scheduler import SchedulerOutput
from llmlab.kvcache.manager import KVCacheManager
from llmlab.model import LlamaModel
from llmlab.ops.metadata import AttentionMetadata
from llmlab.sampling import apply_logits_processors, sample
from llmlab.sampling.grammar import grammar_failures
from llmlab.sampling.logprobs import fill_prompt_logprobs, logprob_entries
from llmlab.sampling.rejection_sampler import greedy_verify, rejection_sample, target_probs
from llmlab.spec_decode import make_proposer
from llmlab.worker.cuda_graphs import DecodeGraphs, capture_sizes
from llmlab.worker.input_batch import (
    StagingBuffers,
    StepArrays,
    build_step_arrays,
    host_tensors,
)

logger = logging.getLogger(__name__)

# the backends whose kernels a CUDA graph can record (the readable "torch" path plans on the host)
GRAPH_BACKENDS = ("triton", "cuda")


@dataclass
class ModelInput:
    """The flat batch of one step (what `ModelRunner.prepare_inputs` builds)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    metadata: AttentionMetadata | None  # None for a step a CUDA graph replays
    sample_rows: torch.Tensor  # [R] int64: flat index of the last token of each sampled request
    sample_requests: list  # the R requests that get a token, in order
    graph_size: int | None = None  # the captured batch size this step replays, if any
    # per sampled request, the draft tokens it verifies this step (its num_drafts + 1 last rows)
    num_drafts: list[int] = field(default_factory=list)


class ModelRunner:
    """Runs `model` over the paged KV cache `kv_caches` for the requests a scheduler picks.

    max_num_seqs, max_model_len: the engine's caps (the CUDA graphs' batch sizes and their block
    tables' width). enforce_eager: never replay a CUDA graph (vLLM's name). speculative_config:
    the proposer it holds (n-gram or a draft model) for the draft slots the scheduler gives;
    the drafts are verified in the same forward (vLLM's `GPUModelRunner` with its drafter and
    rejection sampler).
    """

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
        max_num_seqs: int = 64,
        max_model_len: int = 4096,
        enforce_eager: bool = False,
        speculative_config: SpeculativeConfig | None = None,
    ) -> None:
        self.model = select_model_implementation(model, attention_backend)
        self.kv_cache_manager = kv_cache_manager
        self.block_size = block_size
        self.attention_backend = attention_backend
        self.device = self.model.device
        # not zeroed: no backend reads a slot before a token was written to it
        self.kv_caches = self.model.allocate_kv_caches(
            num_blocks, block_size, dtype=kv_cache_dtype, zeroed=False
        )
        self.kv_scales = kv_scales  # per layer (k_scale, v_scale) of an fp8 cache
        # unseeded requests draw from this one (seeded by the engine's `seed`)
        self.default_generator = default_generator
        self.prepare_seconds = 0.0  # time spent building flat batches (engine overhead)
        self.last_logprobs: dict = {}  # request id -> the last step's logprob entry
        # request id -> why its sampling failed this step (the engine finishes it alone)
        self.failed_requests: dict[str, str] = {}
        self.structured_output_manager = None  # set by the engine on its first grammar
        # speculative decoding's proposer (`llmlab.spec_decode`), None without speculation; a
        # draft model is the first layers of the model this runner computes with
        self.drafter = make_proposer(speculative_config, self.model)
        self.draft_seconds = 0.0
        self.max_blocks_per_seq = -(-max_model_len // block_size) + 1
        # a GPU's inputs go through pinned staging buffers; a CPU's are used where they are
        self.staging = None if self.device.type == "cpu" else StagingBuffers(self.device)
        self.graphs: DecodeGraphs | None = None
        if not enforce_eager and self.device.type == "cuda" and attention_backend in GRAPH_BACKENDS:
            self.graphs = DecodeGraphs(capture_sizes(max_num_seqs))
            self.capture_graphs()

    def weight_bytes(self) -> int:
        """Bytes of the weights this runner computes with: parameters plus prepared copies."""
        from llmlab.model.cpu import weight_bytes

        return weight_bytes(self.model)

    # ---- inputs ---------------------------------------------------------------------------

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInput:
        """Build input ids, positions and attention metadata for one step. A request verifying
        drafts brings its last token and its k drafts (k + 1 positions), and its k + 1 last
        rows are sampled; every other caught-up request its last row."""
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
            drafts = specs.get(req.request_id) or ()
            k = len(drafts)
            token_ids.extend(all_ids[start : start + n - k])
            token_ids.extend(drafts)  # after the last token: k + 1 in all
            block_ids.append(get_block_ids(req.request_id))
            end += n
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
        inp.num_drafts = num_drafts
        return inp

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
        `sample_idx` (flat indices) are the ones whose logits are computed. A decode-only step
        that a CUDA graph can replay is padded to the graph's batch size and gets no metadata
        (the graph holds its own)."""
        num_seqs = len(starts_list)
        size = None
        if self.graphs is not None and len(token_ids) == num_seqs:
            size = self.graphs.bucket(num_seqs)
        arrays = build_step_arrays(
            token_ids,
            block_ids,
            starts_list,
            q_lens_list,
            sample_idx,
            self.block_size,
            pad_to=size,
            table_width=self.max_blocks_per_seq if size is not None else None,
        )
        if size is not None and self.graphs.generation != self.staging.generation:
            self.capture_graphs()  # the staging buffers grew: the graphs' addresses moved
        t = self._to_device(arrays)
        metadata = None if size is not None else self._metadata(t, max(q_lens_list))
        return ModelInput(
            input_ids=t["input_ids"],
            positions=t["positions"],
            metadata=metadata,
            sample_rows=t["sample_rows"],
            sample_requests=sample_requests,
            graph_size=size,
        )

    def _to_device(self, arrays: StepArrays) -> dict[str, torch.Tensor]:
        return host_tensors(arrays) if self.staging is None else self.staging.send(arrays)

    def _metadata(self, t: dict[str, torch.Tensor], max_query_len: int) -> AttentionMetadata:
        # checked here, once; every layer of the step then uses it as it is
        return AttentionMetadata(
            cu_seqlens_q=t["cu_seqlens_q"],
            seq_lens=t["seq_lens"],
            slot_mapping=t["slot_mapping"],
            block_tables=t["block_tables"],
            kv_caches=self.kv_caches,
            max_query_len=max_query_len,
            backend=self.attention_backend,
            kv_scales=self.kv_scales,
        )

    # ---- CUDA graphs ----------------------------------------------------------------------

    def capture_graphs(self, use_cuda_graphs: bool = True) -> None:
        """Record a decode step's forward once per batch-size bucket (see `llmlab.engine.
        cuda_graphs`); `use_cuda_graphs=False` records nothing and replays eagerly on the
        same buffers (how the tests check the padding and the buffers on a CPU)."""
        graphs = self.graphs

        def dummy_views(size: int) -> dict[str, torch.Tensor]:
            arrays = build_step_arrays(
                [0] * size,
                [[0]] * size,
                [0] * size,
                [1] * size,
                list(range(size)),
                self.block_size,
                table_width=self.max_blocks_per_seq,
            )
            arrays.slot_mapping[:] = -1  # a dummy step writes nothing into the cache
            return self.staging.send(arrays)

        def forward(views: dict[str, torch.Tensor]) -> torch.Tensor:
            metadata = self._metadata(views, 1)
            return self.model(views["input_ids"], views["positions"], metadata)

        graphs.capture(dummy_views, forward, self.staging.generation, use_cuda_graphs)

    def forward(self, inp: ModelInput) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's tokens: a graph's replay (its padding rows
        after the real ones), or the model run eagerly."""
        if inp.graph_size is not None:
            return self.graphs.replay(inp.graph_size)
        return self.model(inp.input_ids, inp.positions, inp.metadata)

    # ---- the step -------------------------------------------------------------------------

    def execute_model(self, out: SchedulerOutput) -> list[list[int] | None]:
        """Run one step; return, per caught-up request (in `out` order), the tokens its step
        emitted: one sampled token, or with drafts the accepted drafts then one more; None for a
        request whose sampling or verification failed (`failed_requests` says why).

        Requests that asked for logprobs get them too: `last_logprobs` maps their ids to this
        step's entry, and prompt logprobs are written into `request.prompt_logprobs`.
        """
        self.last_logprobs = {}
        self.failed_requests = {}
        if out.is_empty:
            return []
        if out.num_steps > 1:
            return self.execute_steps(out)
        if out.scheduled_spec_decode_tokens:
            t0 = time.perf_counter()
            self.propose_drafts(out)
            self.draft_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        inp = self.prepare_inputs(out)
        self.prepare_seconds += time.perf_counter() - t0
        with torch.inference_mode():
            hidden = self.forward(inp)  # [T, hidden]
            if any(r.prompt_logprobs is not None for r in out.requests):
                fill_prompt_logprobs(self.model.compute_logits, out, hidden)
            if not inp.sample_requests:
                return []
            # [sum(k + 1), hidden]; a decode step without padding samples every row, in order
            every = inp.sample_rows.shape[0] == hidden.shape[0]
            rows = hidden if every else hidden[inp.sample_rows]
            return self.verify(rows, inp.sample_requests, inp.num_drafts, out)

    @property
    def runs_multi_step(self) -> bool:
        """Whether `execute_steps` can run here: a CPU's step inputs are tensors of their own,
        a GPU's share one staging buffer (and its decode steps replay CUDA graphs)."""
        return self.staging is None

    def execute_steps(self, out: SchedulerOutput) -> list[list[int] | None]:
        """A multi-step decode (`Scheduler.schedule_steps`): `out.num_steps` forwards back to
        back, every request of `out` decoding one token in each, fed the token it sampled in the
        one before. One greedy request on the CPU fast path runs them in one C call
        (`_greedy_steps`); otherwise the inputs and metadata of every forward are built (and
        checked) first, while the host's caches are warm, and the sampled tokens then written
        into each forward's `input_ids`. Returns per request its tokens, up to the first that
        stops it (EOS, a stop token); None where its sampling failed (`failed_requests`)."""
        if not self.runs_multi_step:
            raise RuntimeError("execute_steps: multi-step decoding runs on a CPU only")
        t0 = time.perf_counter()
        requests, num = out.requests, out.num_requests
        block_ids = [self.kv_cache_manager.get_block_ids(r.request_id) for r in requests]
        greedy_decode_applies = getattr(self.model, "greedy_decode_applies", None)
        if (
            num == 1
            and requests[0].sampling_params.greedy
            and greedy_decode_applies is not None
            and greedy_decode_applies(self.kv_caches)
        ):
            return [self._greedy_steps(out, block_ids, t0)]
        inputs = [
            self.build_model_input(
                [r.all_token_ids[-1] for r in requests] if j == 0 else [0] * num,
                block_ids,
                [start + j for start in out.num_computed_tokens],
                [1] * num,
                list(range(num)),
                requests,
            )
            for j in range(out.num_steps)
        ]
        self.prepare_seconds += time.perf_counter() - t0
        return self._run_steps(inputs, requests)

    def _run_steps(self, inputs: list[ModelInput], requests: list) -> list[list[int] | None]:
        """`execute_steps`'s forwards on their prepared inputs, each sampling every request."""
        stopping = [r.stopping_token_ids() for r in requests]
        emitted: list[list[int] | None] = [[] for _ in requests]
        running = set(range(len(requests)))  # requests not stopped (nor failed) yet
        fed: list[int] = []  # the tokens the forward before sampled (any id where it failed)
        with torch.inference_mode():
            for inp in inputs:
                if fed:
                    inp.input_ids.copy_(torch.tensor(fed, dtype=inp.input_ids.dtype))
                sampled = self.sample_tokens(self.forward(inp), requests)
                for i, token in enumerate(sampled):
                    if i not in running:
                        continue
                    if token is None:
                        emitted[i] = None
                        running.discard(i)
                        continue
                    emitted[i].append(token)
                    if token in stopping[i]:
                        running.discard(i)
                if not running:
                    break
                fed = [0 if t is None else t for t in sampled]
        return emitted

    def _greedy_steps(self, out: SchedulerOutput, block_ids: list, t0: float) -> list[int]:
        """`execute_steps` for one greedy request on the CPU fast path: its K tokens as one
        chunk of metadata, built and checked once, and the model's own loop
        (`CpuLlamaModel.greedy_decode`): one C call for all of them."""
        req, num_steps = out.requests[0], out.num_steps
        inp = self.build_model_input(
            [req.all_token_ids[-1]] + [0] * (num_steps - 1),
            block_ids,
            out.num_computed_tokens,
            [num_steps],
            [num_steps - 1],
            out.requests,
        )
        self.prepare_seconds += time.perf_counter() - t0
        return self.model.greedy_decode(
            req.all_token_ids[-1], inp.positions, inp.metadata, sorted(req.stopping_token_ids())
        )

    def propose_drafts(self, out: SchedulerOutput) -> None:
        """Fill the draft slots the scheduler gave (`out.scheduled_spec_decode_tokens`, in
        place) with the proposer's tokens; a request given fewer drafts than slots brings fewer
        tokens (`out.num_new_tokens`); the scheduler frees the slots left over."""
        specs = out.scheduled_spec_decode_tokens
        rows = [
            (i, req, start)
            for i, (req, start) in enumerate(zip(out.requests, out.num_computed_tokens))
            if req.request_id in specs
        ]
        get_block_ids = self.kv_cache_manager.get_block_ids
        drafts = self.drafter.propose_step(
            [req for _, req, _ in rows],
            [start for _, _, start in rows],
            [len(specs[req.request_id]) for _, req, _ in rows],
            [get_block_ids(req.request_id) for _, req, _ in rows],
            self.kv_caches,
            self.block_size,
            self.attention_backend,
        )
        for (i, req, _), d in zip(rows, drafts):
            specs[req.request_id][:] = d
            out.num_new_tokens[i] = 1 + len(d)

    def verify(
        self, hidden: torch.Tensor, requests: list, num_drafts: list[int], out: SchedulerOutput
    ) -> list[list[int] | None]:
        """Per request, the tokens its step emits (None: it failed, alone). `hidden` holds
        num_drafts[i] + 1 rows for request i, in order; requests without drafts go through the
        plain sampler (logprobs and all), the others through verification."""
        plain = [i for i, k in enumerate(num_drafts) if k == 0]
        if len(plain) == len(requests):  # nothing drafted (always, without speculation)
            return [None if t is None else [t] for t in self.sample_tokens(hidden, requests)]
        result: list[list[int] | None] = [None] * len(requests)
        offsets = [0]
        for k in num_drafts:
            offsets.append(offsets[-1] + k + 1)
        if plain:
            rows = torch.tensor([offsets[i] for i in plain], dtype=torch.long).to(hidden.device)
            sampled = self.sample_tokens(hidden[rows], [requests[i] for i in plain])
            for i, t in zip(plain, sampled):
                result[i] = None if t is None else [t]
        drafted = [i for i, k in enumerate(num_drafts) if k]
        specs = out.scheduled_spec_decode_tokens
        verified = self._verify_drafted(hidden, requests, drafted, offsets, specs)
        for i, tokens in zip(drafted, verified):
            result[i] = tokens
        # a grammar whose mask fill overran its budget fails its request alone
        self.failed_requests.update(grammar_failures(requests[i] for i in drafted))
        return result

    def _verify_drafted(self, hidden, requests, drafted, offsets, specs) -> list[list[int] | None]:
        """The tokens each drafted request's step emits: its k + 1 rows' logits, its grammar's
        mask at each, then greedy verification or rejection sampling. A request whose
        verification raises gets None; the others go on."""
        rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in drafted])
        logits = self.model.compute_logits(hidden[rows.to(hidden.device)])  # [sum(k + 1), V]
        result: list[list[int] | None] = []
        at = 0
        for i in drafted:
            req = requests[i]
            k1 = offsets[i + 1] - offsets[i]
            try:
                result.append(self._verify_one(logits[at : at + k1], req, specs[req.request_id]))
            except Exception:
                self._fail(req)
                result.append(None)
            at += k1
        return result

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

    def sample_tokens(self, hidden: torch.Tensor, sample_requests: list) -> list[int | None]:
        """One token per row of `hidden` [R, hidden], row r for `sample_requests[r]`: its
        logits, logits processors, banned tokens, grammar mask, logprobs and sampling
        parameters applied. A failure inside one request's sampling fails that request alone:
        the batch is sampled again row by row, and the rows that raise get None."""
        try:
            sampled = self._sample(self.model.compute_logits(hidden), sample_requests)
            # a grammar whose mask fill overran its budget fails its request alone
            self.failed_requests.update(grammar_failures(sample_requests))
            return sampled
        except Exception:
            if len(sample_requests) == 1:
                self._fail(sample_requests[0])
                return [None]
        out: list[int | None] = []
        for r, req in enumerate(sample_requests):
            try:
                out.extend(self._sample(self.model.compute_logits(hidden[r : r + 1]), [req]))
            except Exception:
                self._fail(req)
                out.append(None)
        return out

    def _fail(self, req) -> None:
        logger.exception("sampling failed for request %s; it is finished alone", req.request_id)
        self.failed_requests[req.request_id] = "sampling failed"

    def _sample(self, logits: torch.Tensor, sample_requests: list) -> list[int]:
        """`sample_tokens` for rows that all succeed (`logits` [R, vocab] is changed in place)."""
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
                logits[row, sorted(banned)] = float("-inf")
        if any(r.has_grammar for r in sample_requests):  # structured output's bitmask
            rows = [i for i, r in enumerate(sample_requests) if r.grammar is not None]
            self.structured_output_manager.apply(
                logits, rows, [sample_requests[i].grammar for i in rows]
            )
        params = [r.sampling_params for r in sample_requests]
        default = self.default_generator
        generators = [r.generator if r.generator is not None else default for r in sample_requests]
        sampled = sample(logits, params, generators).tolist()  # the step's one read-back
        for row, lp in raw_logprobs.items():
            req = sample_requests[row]
            self.last_logprobs[req.request_id] = logprob_entries(
                lp.unsqueeze(0), [sampled[row]], req.sampling_params.logprobs
            )[0]
        return sampled


def select_model_implementation(model: LlamaModel, attention_backend: str) -> LlamaModel:
    """The implementation a runner computes with, chosen once: the C fast path for "cpu", the
    fused GPU layers for "triton"/"cuda" on a GPU, else the readable model itself."""
    if attention_backend == "cpu":
        from llmlab.model.cpu import cpu_model

        return cpu_model(model)  # the C fast path, weights prepared once
    if model.device.type == "cuda" and attention_backend in GRAPH_BACKENDS:
        from llmlab.model.gpu import gpu_model, gpu_model_applies

        if gpu_model_applies(model)[0]:
            return gpu_model(model)  # merged GEMMs and fused kernels, prepared once
    return model
