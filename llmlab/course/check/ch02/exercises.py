"""Chapter 02's exercises as the instructors' table describes them (its catalog's "exercises"),
and the model, prompt and tolerance of the whole-layer check."""

from __future__ import annotations

from llmlab.course.check.catalog import catalog

M = catalog("ch02")

MODEL = "smollm2-135m"
PROMPT = "The cat sat on the mat because it was warm"  # the chapter's real prompt
ATOL = 1e-4  # float32, a few hundred terms per sum

EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
