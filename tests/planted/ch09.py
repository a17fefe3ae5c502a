"""Chapter 09's build exercise: one decoder layer split over ranks, Megatron-style
(`TensorParallelLayer.shard` and `.forward`)."""

import pytest

from planted import Exercise, bug, notebook_definitions

SOLUTION = notebook_definitions("09-parallelism", "TensorParallelLayer")
SPLIT, FORWARD = "ch09:split_problem.", "ch09:forward_problem."

EXERCISES = [
    Exercise(
        "ch09.tensor_parallel_layer",
        "TensorParallelLayer",
        SOLUTION,
        (
            bug(
                "down_proj_by_rows",
                SOLUTION,
                SPLIT + "row_parallel",
                'down_proj=weights["down_proj"][:, ffn]',
                'down_proj=weights["down_proj"][ffn]',
            ),
            bug(
                "all_reduce_after_gate_up",
                SOLUTION,
                FORWARD + "early_all_reduce",
                'act = F.silu(h @ shard["gate_proj"].T) * (h @ shard["up_proj"].T)',
                'act = F.silu(all_reduce(h @ shard["gate_proj"].T)) * all_reduce(h @ shard["up_proj"].T)',
                'out = x + all_reduce(act @ shard["down_proj"].T)',
                'out = x + act @ shard["down_proj"].T',
            ),
            bug(
                "no_all_reduce_after_o_proj",
                SOLUTION,
                FORWARD + "no_all_reduce",
                'x = x + all_reduce(attend(q, k, v) @ shard["o_proj"].T)',
                'x = x + attend(q, k, v) @ shard["o_proj"].T',
            ),
            bug(
                "query_heads_split_alone",
                SOLUTION,
                SPLIT + "gqa_groups",
                "q_rows = slice(kv.start * group * d, kv.stop * group * d)",
                "q_rows = slice(span(len(weights['q_proj']) // d).start * d, "
                "span(len(weights['q_proj']) // d).stop * d)",
            ),
            bug(
                "span_off_by_one",
                SOLUTION,
                SPLIT + "exactly_once",
                "return slice(start, start + base + (rank < extra))",
                "return slice(start, start + base + (rank <= extra))",
            ),
            bug(
                "o_proj_columns_of_the_kv_heads",
                SOLUTION,
                SPLIT + "exactly_once",
                'o_proj=weights["o_proj"][:, q_rows]',
                'o_proj=weights["o_proj"][:, kv_rows]',
            ),
            bug(
                "residual_inside_the_sum",
                SOLUTION,
                FORWARD + "differs",
                'x = x + all_reduce(attend(q, k, v) @ shard["o_proj"].T)',
                'x = all_reduce(x + attend(q, k, v) @ shard["o_proj"].T)',
            ),
        ),
        # the solution goes on to SmolLM2 over two gloo processes
        solution_marks=(pytest.mark.slow, pytest.mark.model, pytest.mark.dist),
    )
]
