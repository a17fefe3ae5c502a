"""Chapter 15's build exercise: a grammar's token mask written by hand (`allowed_tokens`)."""

import pytest

from planted import Exercise, bug, notebook_definitions

# torch comes from the chapter's first cell
SOLUTION = "import torch\n\n" + notebook_definitions("15-structured-output", "allowed_tokens")
A = "ch15:allowed."
COMPLETE = "mask[eos_id] = re.fullmatch(r'\\{\"age\": [0-9]+\\}', generated) is not None"
GROWS = 'mask[:] = torch.tensor([p != "" and could_grow(generated + p) for p in pieces])'

EXERCISES = [
    Exercise(
        "ch15.allowed_tokens",
        "allowed_tokens",
        SOLUTION,
        (
            bug("eos_always", SOLUTION, A + "eos_early", COMPLETE, "mask[eos_id] = True"),
            bug("eos_never", SOLUTION, A + "eos_never", COMPLETE, "mask[eos_id] = False"),
            bug(
                "single_characters_only",
                SOLUTION,
                A + "prefix_forbidden",
                GROWS,
                GROWS.replace('p != ""', "len(p) == 1"),
            ),
            bug(
                "first_character_only",
                SOLUTION,
                A + "first_char_only",
                GROWS,
                GROWS.replace("generated + p)", "generated + p[:1])"),
            ),
            bug(
                "digits_after_the_brace",
                SOLUTION,
                A + "after_complete",
                r'"[0-9]*|[0-9]+\}"',
                r'"[0-9]*|[0-9]+\}[0-9]*"',
            ),
            bug(
                "brace_without_a_digit",
                SOLUTION,
                A + "no_digit",
                r'"[0-9]*|[0-9]+\}"',
                r'"[0-9]*|[0-9]*\}"',
            ),
            bug(
                "prefix_test_the_wrong_way_round",
                SOLUTION,
                A + "prefix_forbidden",
                "        return PREFIX.startswith(text)",
                "        return text.startswith(PREFIX)",
            ),
        ),
        marks=(pytest.mark.model,),  # the real tokenizer and xgrammar's grammar for it
    )
]
