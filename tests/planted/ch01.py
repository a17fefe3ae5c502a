"""Chapter 01's build exercise: one BPE merge applied to a sequence of ids (`merge`)."""

from planted import Exercise, bug, notebook_definitions

SOLUTION = notebook_definitions("01-tokens", "merge")
F = "ch01:merge_function."
HIT = "hit = tuple(ids[i:i + 2]) == tuple(pair)"

EXERCISES = [
    Exercise(
        "ch01.merge_function",
        "merge",
        SOLUTION,
        (
            bug(
                "second_id_of_a_merge_kept",
                SOLUTION,
                F + "wrong_length",
                "i += 2 if hit else 1",
                "i += 1",
            ),
            bug(
                "first_occurrence_only",
                SOLUTION,
                F + "too_few",
                HIT,
                HIT + " and new_id not in out",
            ),
            bug(
                "pair_read_backwards",
                SOLUTION,
                F + "nothing_merged",
                HIT,
                HIT.replace("tuple(pair)", "tuple(pair)[::-1]"),
            ),
            bug(
                "last_id_dropped",
                SOLUTION,
                F + "wrong_length",
                "while i < len(ids):",
                "while i < len(ids) - 1:",
            ),
            bug(
                "first_id_of_the_pair_only",
                SOLUTION,
                F + "wrong_ids",
                HIT,
                "hit = ids[i] == pair[0] and i + 1 < len(ids)",
            ),
            bug("result_not_returned", SOLUTION, F + "returns_none", "    return out", "    out"),
        ),
    )
]
