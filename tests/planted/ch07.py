"""Chapter 07's build exercise: the FLOPs and bytes of one engine step (`step_cost`)."""

import pytest

from planted import Exercise, bug, notebook_definitions

SOLUTION = notebook_definitions("07-roofline", "step_cost")
MISTAKE = "ch07:step_cost_mistakes."

EXERCISES = [
    Exercise(
        "ch07.step_cost",
        "step_cost",
        SOLUTION,
        (
            bug(
                "weights_per_sequence",
                SOLUTION,
                MISTAKE + "weights_per_sequence",
                "n_in * n_out * copies * dtype_bytes\n",
                "n_in * n_out * copies * dtype_bytes * len(batch)\n",
            ),
            bug(
                "kv_with_query_heads",
                SOLUTION,
                MISTAKE + "query_heads_for_kv",
                "kv = cfg.num_key_value_heads * cfg.head_dim",
                "kv = cfg.num_attention_heads * cfg.head_dim",
            ),
            bug(
                "one_flop_per_multiply_add",
                SOLUTION,
                MISTAKE + "half_the_flops",
                "return 2 * rows * n_in",
                "return rows * n_in",
            ),
            bug(
                "lm_head_every_token",
                SOLUTION,
                MISTAKE + "lm_head_every_token",
                "linear(h, cfg.vocab_size, len(batch), copies=1)",
                "linear(h, cfg.vocab_size, tokens, copies=1)",
            ),
            bug(
                "whole_embedding_table",
                SOLUTION,
                MISTAKE + "whole_embedding_table",
                '(0, tokens * h * dtype_bytes)',
                '(0, cfg.vocab_size * h * dtype_bytes)',
            ),
            bug(
                "no_causal_mask",
                SOLUTION,
                MISTAKE + "no_causal_mask",
                "keys = sum(n * (c - n) + n * (n + 1) // 2 for n, c in batch)",
                "keys = sum(n * c for n, c in batch)",
            ),
            bug(
                "kv_read_per_new_token",
                SOLUTION,
                MISTAKE + "kv_per_new_token",
                "2 * kv * sum(c for _, c in batch) * layers",
                "2 * kv * sum(n * c for n, c in batch) * layers",
            ),
        ),
        solution_marks=(pytest.mark.slow, pytest.mark.model),  # it goes on to SmolLM2
    )
]
