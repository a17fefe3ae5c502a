"""The instructor's tools: one source, two versions, and a grader that decides for itself.

- `exercises`: which exercises a notebook has (the calls of `llmlab.course.check` functions in its
  source), and the manifest that lists them;
- `student`: the student version of the instructor's notebooks (`python -m llmlab student`);
- `grading`: runs a handed-in notebook and grades it (`python -m llmlab grade`), with
  `answers` (how answers leave the kernel), `recheck` (the grader's own checker process) and
  `sandbox` (where a function answer runs).
"""

from llmlab.course.instructor.exercises import (
    MANIFEST_NAME,
    Exercise,
    exercise_calls,
    exercise_ids,
    exercises,
    exercises_for,
    read_manifest,
    write_manifest,
)
from llmlab.course.instructor.grading import (
    DEFAULT_CELL_TIMEOUT_S,
    NOT_RECORDED,
    ExerciseResult,
    GradeReport,
    grade_main,
    grade_notebook,
    read_answers,
)
from llmlab.course.instructor.student import (
    PLACEHOLDER,
    Solution,
    bound_names,
    fill_solutions,
    strip_source,
    student_main,
    student_notebook,
    write_student_versions,
)

__all__ = [
    "DEFAULT_CELL_TIMEOUT_S",
    "MANIFEST_NAME",
    "NOT_RECORDED",
    "PLACEHOLDER",
    "Exercise",
    "ExerciseResult",
    "GradeReport",
    "Solution",
    "bound_names",
    "exercise_calls",
    "exercise_ids",
    "exercises",
    "exercises_for",
    "fill_solutions",
    "grade_main",
    "grade_notebook",
    "read_answers",
    "read_manifest",
    "strip_source",
    "student_main",
    "student_notebook",
    "write_manifest",
    "write_student_versions",
]
