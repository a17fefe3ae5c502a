"""The instructor's tools: one source, two versions, and a headless grader.

`student` writes the student version of the instructor's notebooks (`python -m llmlab student`)
and the manifest of their exercises; `grading` runs a handed-in notebook and grades it
(`python -m llmlab grade`); `exercises` finds the exercises of a notebook, for both.
"""
from llmlab.instructor.exercises import (MANIFEST_NAME, Exercise, exercise_calls, exercise_ids, exercises,
                                         exercises_for, read_manifest, write_manifest)
from llmlab.instructor.grading import (DEFAULT_CELL_TIMEOUT_S, NO_LINE_MESSAGE, ExerciseResult, GradeReport,
                                       check_lines, grade_main, grade_notebook)
from llmlab.instructor.student import (PLACEHOLDER, Solution, bound_names, fill_solutions, strip_source,
                                       student_main, student_notebook, write_student_versions)

__all__ = ["DEFAULT_CELL_TIMEOUT_S", "MANIFEST_NAME", "NO_LINE_MESSAGE", "PLACEHOLDER", "Exercise",
           "ExerciseResult", "GradeReport", "Solution", "bound_names", "check_lines", "exercise_calls",
           "exercise_ids", "exercises", "exercises_for", "fill_solutions", "grade_main", "grade_notebook",
           "read_manifest", "strip_source", "student_main", "student_notebook", "write_manifest",
           "write_student_versions"]
