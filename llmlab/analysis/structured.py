"""Structured output, measured: how often the small model writes valid JSON with and without the
grammar's mask, and what the mask costs per step against the rest of the step (chapter 15,
`python -m llmlab bench structured`)."""

from __future__ import annotations

import json
import time
from typing import Any

# The chapter's schema: a person with a name and an age, both required, nothing else.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
# chapter 15's hand-made grammar: this text, one or more digits, a closing brace
AGE_PREFIX = '{"age": '
AGE_REGEX = r'\{"age": [0-9]+\}'

_NAMES = ("Alice", "Bob", "Chen Wei", "Dmitri", "Fatima", "Li Na", "Mateo", "Priya")
_JOBS = ("teacher", "nurse", "pilot", "baker", "student", "farmer", "chemist", "painter")


def _chat(tokenizer: Any, ask: str) -> str:
    """`ask` as the user's turn in the model's chat template, the assistant's turn opened."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": ask}], tokenize=False, add_generation_prompt=True
    )


def person_prompts(tokenizer: Any, n: int) -> list[str]:
    """n chat prompts (the model's chat template), each describing a person and asking for a
    JSON object with the keys name and age; no two alike for n <= 64."""
    prompts = []
    for i in range(n):
        name, job = _NAMES[i % 8], _JOBS[(i // 8 + i) % 8]
        age = 18 + (7 * i) % 60
        ask = (
            f"{name} is a {age}-year-old {job}. Reply with only a JSON object with the keys "
            '"name" (a string) and "age" (an integer).'
        )
        prompts.append(_chat(tokenizer, ask))
    return prompts


def age_prompts(tokenizer: Any, n: int) -> list[str]:
    """n chat prompts asking for a person's age as {"age": N}."""
    return [
        _chat(
            tokenizer,
            f'{_NAMES[i % 8]} was born {20 + (11 * i) % 60} years ago. '
            'Reply as JSON: {"age": <years>}.',
        )
        for i in range(n)
    ]


def is_valid(text: str, schema: dict) -> bool:
    """True when `text` parses as JSON and the value validates against `schema`."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def validity(llm: Any, prompts: list[str], schema: dict, masked: bool, **sampling: Any) -> dict:
    """Generate one answer per prompt (with the schema's mask or without it) and count the ones
    that parse and validate. `sampling`: SamplingParams fields (temperature, seed, max_tokens).
    Returns {"rate", "valid", "n", "texts"}."""
    from llmlab import SamplingParams
    from llmlab.sampling.structured_output import StructuredOutputsParams

    so = StructuredOutputsParams(json=schema) if masked else None
    params = [
        SamplingParams(**{**sampling, "seed": sampling.get("seed", 0) + i}, structured_outputs=so)
        for i in range(len(prompts))
    ]
    texts = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    ok = sum(is_valid(t, schema) for t in texts)
    return {"rate": ok / len(texts), "valid": ok, "n": len(texts), "texts": texts}


def mask_cost(llm: Any, prompts: list[str], schema: dict, max_tokens: int = 48) -> dict:
    """Run every prompt at once under the schema's mask and split the decode steps' time: the
    bitmask fill (xgrammar walks each request's grammar state), applying it to the logits (-inf
    for every forbidden token), and the rest of the step (the forward and sampling).

    Returns per decode step, in seconds: "fill", "apply", "step" (the whole step, mask
    included), with "steps" and "batch" (requests in the first decode step)."""
    from llmlab import SamplingParams
    from llmlab.sampling.structured_output import StructuredOutputsParams

    engine = llm.llm_engine
    manager = engine.structured_outputs()
    so = StructuredOutputsParams(json=schema)
    for i, p in enumerate(prompts):
        engine.add_request(
            f"mask-cost-{i}",
            p,
            SamplingParams(temperature=0.8, seed=i, max_tokens=max_tokens, structured_outputs=so),
        )
    while engine.scheduler.waiting or any(  # prefill first: only decode steps are timed
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    batch = len(engine.scheduler.running)
    fill0, apply0, steps0 = manager.bitmask_seconds, manager.apply_seconds, manager.mask_steps
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - t0
    steps = manager.mask_steps - steps0
    return {
        "batch": batch,
        "steps": steps,
        "fill": (manager.bitmask_seconds - fill0) / steps,
        "apply": (manager.apply_seconds - apply0) / steps,
        "step": elapsed / steps,
    }
