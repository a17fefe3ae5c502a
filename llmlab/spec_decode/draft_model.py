"""A draft model that costs no extra memory: the target's own first n layers, its final norm
and its LM head (self-speculative decoding, "early exit"; LayerSkip, Elhoushi et al. 2024).

Layer l's K/V at a position depend only on the tokens up to it and layers below l, so for
l < n the draft's K/V are the target's: the draft reads the target's paged cache for the
context and writes its own tokens' K/V into the very slots the verify step then rewrites with
the same values. Drafts are greedy (the argmax of the truncated model): a deterministic
proposal, which rejection sampling verifies exactly (see `rejection_sampler`).

Honest about what it buys: a truncated SmolLM2 predicts the full model's next token far less
often than a trained draft would (`bench spec` prints its acceptance rate), and each draft token
costs n/L of the layers plus a whole LM head.
"""

from __future__ import annotations

import torch

from llmlab.model import LlamaModel
from llmlab.model.llama import inference
from llmlab.ops.metadata import AttentionMetadata


class EarlyExitProposer:
    """Greedy drafts from `model`'s first `num_layers` layers (sharing its KV cache)."""

    def __init__(self, model: LlamaModel, num_layers: int) -> None:
        total = model.config.num_hidden_layers
        if not 1 <= num_layers < total:
            raise ValueError(
                f"speculative_config['draft_num_layers'] must be in "
                f"[1, {total - 1}] (the target has {total} layers), got {num_layers}"
            )
        self.model = model
        self.num_layers = num_layers

    @inference
    def propose_step(
        self,
        requests: list,
        starts: list[int],
        num_drafts: list[int],
        block_ids: list[list[int]],
        kv_caches: list,
        block_size: int,
        backend: str,
    ) -> list[list[int]]:
        """Draft `num_drafts[i]` tokens after request i, whose last token sits at position
        `starts[i]` (the context before it is cached), its blocks `block_ids[i]` covering
        positions up to starts[i] + num_drafts[i]. One batched forward of the truncated model
        per draft position."""
        model = self.model
        device = model.device
        drafts: list[list[int]] = [[] for _ in num_drafts]
        max_blocks = max(map(len, block_ids))
        table = torch.tensor(
            [ids + [0] * (max_blocks - len(ids)) for ids in block_ids], dtype=torch.int32
        )  # [S, max_blocks]
        tokens = [req.all_token_ids[-1] for req in requests]
        for j in range(max(num_drafts)):
            rows = [i for i, k in enumerate(num_drafts) if k > j]
            idx = torch.tensor(rows, dtype=torch.long)
            positions = torch.tensor([starts[i] + j for i in rows], dtype=torch.long)  # [R]
            tables = table[idx]  # [R, max_blocks]
            slots = (
                tables[torch.arange(len(rows)), positions // block_size].long() * block_size
                + positions % block_size
            )  # [R]
            md = AttentionMetadata(
                cu_seqlens_q=torch.arange(len(rows) + 1, dtype=torch.int32).to(device),
                seq_lens=(positions + 1).to(torch.int32).to(device),
                slot_mapping=slots.to(device),
                block_tables=tables.to(device),
                kv_caches=kv_caches,
                max_query_len=1,
                backend=backend,
            )
            ids = torch.tensor([tokens[i] for i in rows], dtype=torch.long, device=device)
            # the first num_layers layers and the final norm, in whichever implementation
            hidden = model(ids, positions.to(device), md, num_layers=self.num_layers)  # [R, hidden]
            logits = model.compute_logits(hidden)  # [R, vocab]
            for i, t in zip(rows, logits.argmax(dim=-1).tolist()):
                drafts[i].append(t)
                tokens[i] = t
        return drafts
