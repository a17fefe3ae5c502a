"""llmlab.course.instructor.reading_time: the one formula for how long a chapter takes, on synthetic
notebooks (prose, code cells, exercises of each kind, a "Going further" section left out)."""
from __future__ import annotations

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from llmlab.course.instructor import reading_time as rt


def _nb(*cells):
    return new_notebook(cells=list(cells))


def test_prose_code_and_each_kind_of_exercise_add_up():
    nb = _nb(new_markdown_cell("# 04 · A chapter\n\n**Time:** about 20 minutes.\n\n" + "word " * 293),
             new_code_cell("from llmlab.course.check import ch04\nanswer = 1  # SOLUTION\nch04.kv_bytes_per_token(answer)"),
             new_code_cell("# BEGIN SOLUTION\ndef f(x):\n    return x\nanswer = f\n# END SOLUTION\nch04.generate_greedy(answer)"),
             new_code_cell("answer = 'b'  # SOLUTION\nch04.utilization_gain(answer)"))
    est = rt.estimate(nb)
    assert est.words == 300 and est.code_cells == 3
    assert est.exercises == {"plug-in": 1, "coding": 1, "reasoning": 1}
    assert est.minutes == pytest.approx(300 / 150 + 3 * 0.25 + 2 + 12.5 + 4.5)
    assert rt.stated_minutes(nb) == 20


def test_going_further_sections_are_left_out_until_the_next_section():
    required = [new_markdown_cell("## 1. Required\n\none two three"), new_code_cell("x = 1")]
    optional = [new_markdown_cell("## Going further: more\n\n" + "word " * 600),
                new_code_cell("from llmlab.course.check import ch04\nch04.kv_bytes_per_token(None)")]
    after = [new_markdown_cell("## Summary\n\n- four five")]
    short, long = rt.estimate(_nb(*required, *after)), rt.estimate(_nb(*required, *optional, *after))
    assert long == short, "a Going further section adds nothing to the required path"
    assert short.words == len("Required one two three Summary four five".split()) + 1    # "1" counts
