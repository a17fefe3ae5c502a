"""Chapter 16's build exercise, the paged decode attention kernel in Triton
(`paged_decode_partition`, run through Triton's interpreter), and its merge of the partitions
(`merge_partitions`)."""

import pytest

from planted import Exercise, bug, notebook_definitions

KERNEL = notebook_definitions("16-gpu-step", "paged_decode_partition")
MERGE = notebook_definitions("16-gpu-step", "merge_partitions")
D = "ch16:decode."
G = "ch16:merge."
HEAD = "head = kv_head * GROUP + g"
LOOKUP = "tl.load(block_tables_ptr + seq * max_blocks + b).to(tl.int64)"
VALID = "valid = b * BLOCK_SIZE + n < seq_len"
SCORE = "s = tl.dot(q, tl.trans(k)) * scale"
WEIGHTS = "w = torch.exp(part_max - top)"
OUT = "out = (part_out * w[..., None]).sum(dim=-2) / (part_sum * w).sum(dim=-1)[..., None]"

EXERCISES = [
    Exercise(
        "ch16.paged_decode_partition",
        "paged_decode_partition",
        KERNEL,
        (
            # GQA: the query heads of a KV head taken one every NUM_KV_HEADS, not side by side
            bug(
                "kv_head_interleaved", KERNEL, D + "gqa", HEAD, "head = kv_head + g * NUM_KV_HEADS"
            ),
            bug("scale_forgotten", KERNEL, D + "scale", SCORE, "s = tl.dot(q, tl.trans(k))"),
            bug(
                "max_not_rescaled",
                KERNEL,
                D + "rescale",
                "l = l * alpha + tl.sum(p, 1)",
                "l = l + tl.sum(p, 1)",
                "acc = acc * alpha[:, None] + tl.dot(p, v)",
                "acc = acc + tl.dot(p, v)",
            ),
            bug("last_position_dropped", KERNEL, D + "end_short", VALID, VALID + " - 1"),
            bug(
                "one_position_past_the_end", KERNEL, D + "end_past", VALID, VALID.replace("<", "<=")
            ),
            bug(
                "padding_scored_zero",
                KERNEL,
                D + "zero_scores",
                '        s = tl.where(valid[None, :], s, float("-inf"))\n',
                "",
            ),
            bug(
                "values_read_unmasked",
                KERNEL,
                D + "past_seq_len",
                "v = tl.load(v_cache_ptr + offs, mask=valid[:, None], other=0.0)",
                "v = tl.load(v_cache_ptr + offs)",
            ),
            bug("block_table_ignored", KERNEL, D + "table_ignored", LOOKUP, "b"),
            bug(
                "first_sequences_table_for_all",
                KERNEL,
                D + "table_row",
                LOOKUP,
                "tl.load(block_tables_ptr + b).to(tl.int64)",
            ),
            bug(
                "every_partition_from_block_0",
                KERNEL,
                D + "partition_range",
                "first = part * PARTITION_BLOCKS",
                "first = 0",
            ),
        ),
        marks=(pytest.mark.triton,),  # the student's kernel runs through Triton's interpreter
    ),
    Exercise(
        "ch16.merge_partitions",
        "merge_partitions",
        MERGE,
        (
            bug(
                "added_as_they_are",
                MERGE,
                G + "no_rescale",
                OUT,
                "out = part_out.sum(dim=-2) / part_sum.sum(dim=-1)[..., None]",
            ),
            bug(
                "sums_not_rescaled",
                MERGE,
                G + "no_rescale",
                "(part_sum * w).sum(dim=-1)",
                "part_sum.sum(dim=-1)",
            ),
            bug(
                "largest_max_not_subtracted",
                MERGE,
                G + "no_max",
                WEIGHTS,
                "w = torch.exp(part_max)",
            ),
            bug(
                "averaged",
                MERGE,
                G + "average",
                OUT,
                "out = (part_out / part_sum[..., None]).mean(dim=-2)",
            ),
            bug(
                "weighted_without_the_sums",
                MERGE,
                G + "weights",
                OUT,
                "out = ((part_out / part_sum[..., None]).nan_to_num() * w[..., None]).sum(dim=-2)"
                " / w.sum(dim=-1)[..., None]",
            ),
            bug(
                "largest_partition_only",
                MERGE,
                G + "largest_only",
                WEIGHTS,
                "w = (part_max == top).float()",
            ),
        ),
    ),
]
