"""Chapter 03's build exercise: the nucleus of top-p sampling (`top_p_keep`)."""

from planted import Exercise, bug, notebook_definitions

SOLUTION = "import torch\n\n\n" + notebook_definitions("03-generation", "top_p_keep")
F = "ch03:top_p_function."
KEEP = "return set(order[mass_before < top_p].tolist())"

EXERCISES = [
    Exercise(
        "ch03.top_p_function",
        "top_p_keep",
        SOLUTION,
        (
            bug(
                "mass_with_the_token_itself",
                SOLUTION,
                F + "one_short",
                "mass_before < top_p",
                "probs[order].cumsum(0) < top_p",
            ),
            bug(
                "one_past_the_edge",
                SOLUTION,
                F + "one_too_many",
                KEEP,
                "return set(order[: int((mass_before < top_p).sum()) + 1].tolist())",
            ),
            bug(
                "ranks_not_ids",
                SOLUTION,
                F + "index_order",
                KEEP,
                "return set((mass_before < top_p).nonzero().flatten().tolist())",
            ),
            bug(
                "ids_in_index_order",
                SOLUTION,
                F + "index_order",
                "order = probs.argsort(descending=True)",
                "order = torch.arange(len(probs))",
            ),
            bug(
                "least_likely_first",
                SOLUTION,
                (F + "wrong_tokens", F + "wrong_nucleus"),
                "probs.argsort(descending=True)",
                "probs.argsort()",
            ),
            bug(
                "top_p_fixed_at_0_9",
                SOLUTION,
                F + "wrong_nucleus",
                "mass_before < top_p",
                "mass_before < 0.9",
            ),
        ),
    )
]
