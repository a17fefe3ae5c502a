"""The source chapter's five self-check questions, with the checkers that ask each; the chapter's
exercises, read from its catalog."""

from __future__ import annotations

from collections.abc import Mapping

from llmlab.course.check.catalog import catalog

M = catalog("ch12")

# The checkers (module, function) that ask each of the source chapter's five self-check questions.
_SEED_CHECKERS: dict[int, tuple[tuple[str, str], ...]] = {
    1: (("ch12", "generation_loop_steps"), ("ch05", "write_before_read"), ("ch05", "cache_reads")),
    2: (
        ("ch04", "kv_bytes_per_token"),
        ("ch04", "kv_gb_for_request"),
        ("ch12", "kv_gb_fresh_case"),
    ),
    3: (("ch08", "source_q3"), ("ch12", "q3_fresh_case")),
    4: (("ch10", "source_q4"), ("ch12", "q4_fresh_case")),
    5: (("ch11", "source_q5"), ("ch12", "q5_fresh_case")),
}
# each question in the language in use: the Chinese quotes the source chapter's own words
_SEED_TEXTS = M.texts("seed_questions", (1, 2, 3, 4, 5))


class _SeedQuestions(Mapping):
    """{question: (its text in the language in use, the checkers that ask it)}, each text read
    when looked up (a language chosen after the import shows)."""

    def __getitem__(self, q: int) -> tuple[str, tuple[tuple[str, str], ...]]:
        return _SEED_TEXTS[q], _SEED_CHECKERS[q]

    def __iter__(self):
        return iter(_SEED_CHECKERS)

    def __len__(self) -> int:
        return len(_SEED_CHECKERS)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


SEED_QUESTIONS = _SeedQuestions()

EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
