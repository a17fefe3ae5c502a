"""Chapter 04's build exercise: a cached generation loop (`layer_with_cache`,
`forward_with_cache`, `my_generate`), checked by the text it generates greedily on SmolLM2."""

import functools

import pytest

from planted import Exercise, bug, notebook_definitions

STEM = "04-kv-cache"
SOLUTION = "\n\n".join(
    ["import torch\n"]
    + [notebook_definitions(STEM, name) for name in ("attend", "layer_with_cache")]
    + [notebook_definitions(STEM, name) for name in ("forward_with_cache", "my_generate")]
)
G = "ch04:generate_greedy."


@functools.lru_cache(maxsize=1)
def _smollm2():
    from llmlab.model import load_model

    return load_model("smollm2-135m")


def generated_text(namespace: dict) -> str:
    """What the chapter's exercise cell answers: the decoded new tokens of `my_generate`."""
    from llmlab.course.check import ch04

    model, tok = _smollm2()
    prompt_ids = tok.encode(ch04.GEN_PROMPT, add_special_tokens=False)
    return tok.decode(namespace["my_generate"](model, prompt_ids, ch04.GEN_NEW_TOKENS))


EXERCISES = [
    Exercise(
        "ch04.generate_greedy",
        "my_generate",
        SOLUTION,
        (
            bug(
                "prompt_returned",
                SOLUTION,
                G + "prompt_included",
                "    return out",
                "    return list(prompt_ids) + out",
            ),
            bug(
                "one_token_short",
                SOLUTION,
                G + "too_few",
                "for _ in range(max_new_tokens):",
                "for _ in range(max_new_tokens - 1):",
            ),
            bug(
                "logits_of_the_first_position",
                SOLUTION,
                G + "slip_first_position",
                "model.norm(x[-1:])",
                "model.norm(x[:1])",
            ),
            bug(
                "positions_from_zero",
                SOLUTION,
                G + "slip_positions_restart",
                "start = cache[0][0].shape[0]",
                "start = 0",
            ),
            bug(
                "cache_replaced",
                SOLUTION,
                G + "slip_own_token_only",
                "kv[0] = torch.cat([kv[0], k])",
                "kv[0] = k",
                "kv[1] = torch.cat([kv[1], v])",
                "kv[1] = v",
            ),
            bug(
                "whole_sequence_fed_again",
                SOLUTION,
                G + "slip_sequence_refed",
                "new = out[-1:]",
                "new = list(prompt_ids) + out",
            ),
        ),
        answer=generated_text,
        marks=(pytest.mark.model, pytest.mark.slow),
    )
]
