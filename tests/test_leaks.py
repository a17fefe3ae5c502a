"""The leak finder: an exercise's expected number shown above the exercise is found in the forms
a student reads it; below the exercise, inside other numbers, or as one digit it is not."""

from __future__ import annotations

import json

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from llmlab.course.instructor.leaks import find_leaks, number_forms, read_expected_log


def _nb(markdown_above: str, output_above: str, markdown_below: str = ""):
    shown = new_code_cell("print(x)")
    shown.outputs = [new_output("stream", name="stdout", text=output_above)]
    return new_notebook(
        cells=[
            new_markdown_cell(markdown_above),
            shown,
            new_code_cell("from llmlab.course.check import ch04\nch04.kv_gb_for_request(None)"),
            new_markdown_cell(markdown_below),
        ]
    )


def test_forms_a_student_reads():
    assert {"1,342,177,280", "1342177280", "1.34e9", "1.3e+09"} <= number_forms(1342177280)
    assert {"1.34", "1.342"} <= number_forms(1.342177)
    assert "60" in number_forms(60) and number_forms(8) == set() and number_forms(0.5) == set()


def test_a_planted_leak_is_found_in_markdown_and_output():
    expected = {"ch04.kv_gb_for_request": [1.34217728]}
    leaks = find_leaks(_nb("so a 4K request takes 1.34 GB.", "nothing here"), expected)
    assert [(l.cell, l.where, l.form) for l in leaks] == [(0, "markdown", "1.34")]
    leaks = find_leaks(_nb("nothing", "total: 1.342 GB\n"), expected)
    assert [(l.cell, l.where) for l in leaks] == [(1, "output")]


def test_no_leak_below_the_exercise_inside_other_numbers_or_in_verdicts():
    expected = {"ch04.kv_gb_for_request": [1.34217728]}
    nb = _nb(
        "11.345 and 1.3427 and 21.34", "[check ch03.x] NOT YET: 1.34\n", "1.34 GB, revealed after"
    )
    assert find_leaks(nb, expected) == []


def test_a_measurement_cells_output_is_not_scanned_but_its_source_and_other_cells_are():
    expected = {"ch04.kv_gb_for_request": [1.34217728]}
    nb = _nb("nothing", "L3: 1.34 GB/s\n")
    nb.cells[1].metadata["tags"] = ["measurement"]
    assert find_leaks(nb, expected) == []
    nb.cells[1].source = "print(1.342)"
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="1.342\n")]
    assert find_leaks(nb, expected) == []  # outputs skipped; the source is not prose, as before
    nb.cells[0].source = "a 4K request takes 1.34 GB"
    assert [(l.cell, l.where) for l in find_leaks(nb, expected)] == [(0, "markdown")]
    nb.cells[1].metadata["tags"] = ["other"]
    assert sorted(l.cell for l in find_leaks(nb, expected)) == [0, 1]


def test_the_guess_rows_of_a_prediction_table_are_not_scanned_but_its_measurement_is():
    expected = {"ch04.kv_gb_for_request": [1.34217728]}
    table = (
        "[predict cache speed-up]\n  you predicted             1.34 x\n"
        "  you measured              {measured} x\n  prediction / measurement  1.3x\n"
    )
    assert find_leaks(_nb("nothing", table.format(measured="9.9")), expected) == []
    zh = "[predict 加速]\n  你的预测     1.34 x\n  你的测量     9.9 x\n  预测 / 测量  1.3x\n"
    assert find_leaks(_nb("nothing", zh), expected) == []
    leaks = find_leaks(_nb("nothing", table.format(measured="1.34")), expected)
    assert [(l.cell, l.form) for l in leaks] == [(1, "1.34")]
    # the same rows outside a prediction table are scanned as any output
    assert find_leaks(_nb("nothing", "you predicted 1.34\n"), expected) != []


def test_read_expected_log_skips_bad_lines(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(
        json.dumps({"exercise": "a.b", "expected": 60})
        + "\nnot json\n"
        + json.dumps({"exercise": "a.b", "expected": 60})
        + "\n"
    )
    assert read_expected_log(log) == {"a.b": [60.0]}
    assert read_expected_log(tmp_path / "missing") == {}


def test_checkers_write_what_they_expect_to_the_log(tmp_path, monkeypatch):
    from llmlab.course.check import core

    log = tmp_path / "expected.jsonl"
    monkeypatch.setenv(core.EXPECTED_LOG_ENV, str(log))
    core.check_number("test.logged", None, 4096.0)
    core.record_expected("test.logged", 12.5)
    core.record_expected("test.logged", "not a number")
    assert read_expected_log(log) == {"test.logged": [4096.0, 12.5]}


def test_a_hash_prefix_is_not_a_number_but_a_number_with_its_unit_is():
    """A block hash's shown prefix ("18ea..") differs every run and is no number a student reads;
    18 with a unit glued to it (18ms, 18GB, 18x) still is one."""
    expected = {"ch04.kv_gb_for_request": [18.0]}
    for hashes in ("  1  A  1  18ea..  105 106", "hash 0a18 and 9f18c2..", "ab18de"):
        assert find_leaks(_nb("nothing", hashes), expected) == [], hashes
    for shown in ("took 18ms", "18GB free", "18x faster", "18.", "18ea and then 18 blocks"):
        leaks = find_leaks(_nb("nothing", shown), expected)
        assert [(l.cell, l.form) for l in leaks] == [(1, "18")], shown
