"""Chapter 14's build exercise: the accept/reject step of speculative sampling
(`verify_drafts`)."""

from planted import Exercise, bug, notebook_definitions

SOLUTION = notebook_definitions("14-speculative-decoding", "verify_drafts")
V = "ch14:verify."
KEEP = "if torch.rand((), generator=generator, dtype=torch.float64) < target_probs[j, d]:"

EXERCISES = [
    Exercise(
        "ch14.verify_drafts",
        "verify_drafts",
        SOLUTION,
        (
            bug("every_draft_kept", SOLUTION, V + "lengths_off", KEEP, "if True:"),
            bug(
                "kept_when_above",
                SOLUTION,
                V + "lengths_off",
                KEEP,
                KEEP.replace(" < ", " > "),
            ),
            bug(
                "acceptance_from_the_next_row",
                SOLUTION,
                V + "lengths_off",
                KEEP,
                KEEP.replace("target_probs[j, d]", "target_probs[j + 1, d]"),
            ),
            bug(
                "rejected_draft_drawn_again",
                SOLUTION,
                V + "rejected_token_emitted",
                "        rest[d] = 0",
                "        pass",
            ),
            bug(
                "replacement_ignores_the_target",
                SOLUTION,
                V + "position_off",
                "rest = target_probs[j].clone()",
                "rest = torch.ones_like(target_probs[j])",
            ),
            bug(
                "goes_on_after_a_rejection",
                SOLUTION,
                V + "not_drafts_in_order",
                "        break\n",
                "        continue\n",
            ),
            bug(
                "no_bonus_token",
                SOLUTION,
                V + "no_bonus",
                "out.append(int(torch.multinomial(target_probs[-1], 1, generator=generator)))",
                "pass",
            ),
            # the hole the chi-square of the first token alone could not see
            bug(
                "bonus_from_the_last_drafts_row",
                SOLUTION,
                V + "bonus_off",
                "torch.multinomial(target_probs[-1], 1",
                "torch.multinomial(target_probs[j], 1",
            ),
        ),
    )
]
