"""The leak finder: an exercise's expected number shown above the exercise is found in the forms
a student reads it; below the exercise, inside other numbers, or as one digit it is not. A word
answer ("memory") is found where one line or sentence above shows it beside every number of its
case (batch 64, context 1024), and nowhere else."""

from __future__ import annotations

import json

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from llmlab.course.instructor.leaks import find_leaks, number_forms, read_expected_log


def _nb(
    markdown_above: str,
    output_above: str,
    markdown_below: str = "",
    exercise: str = "ch04.kv_gb_for_request",
):
    """A notebook: markdown, a cell that printed `output_above`, the call of `exercise`'s
    checker, markdown below it."""
    shown = new_code_cell("print(x)")
    shown.outputs = [new_output("stream", name="stdout", text=output_above)]
    chapter, _ = exercise.split(".")
    call = f"from llmlab.course.check import {chapter}\n{exercise}(None)"
    return new_notebook(
        cells=[
            new_markdown_cell(markdown_above),
            shown,
            new_code_cell(call),
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


# ---- words: a choice answer shown beside the numbers of its case ---------------------------


def _word_nb(markdown_above: str, output_above: str, below: str = ""):
    return _nb(markdown_above, output_above, below, exercise="ch07.decode_bound")


WORDS = {"ch07.decode_bound": [("memory", (64.0, 1024.0), ("compute",))]}


def test_a_word_answer_printed_for_its_case_is_found():
    """Chapter 07 once printed the verdict of exactly the case its exercise asks about."""
    line = "decode step, batch 64, context 1024: 71.6 ms -> memory-bound\n"
    leaks = find_leaks(_word_nb("nothing", line), {}, WORDS)
    assert [(l.cell, l.where, l.expected) for l in leaks] == [(1, "output", "memory")]
    sentence = "At batch 64 with 1,024 tokens of context the whole step is memory-bound. Next."
    leaks = find_leaks(_word_nb(sentence, "nothing"), {}, WORDS)
    assert [(l.cell, l.where) for l in leaks] == [(0, "markdown")]


def test_the_word_without_its_case_or_below_or_inside_other_numbers_is_no_leak():
    for above in (
        "decode is memory-bound",  # the chapter's teaching, no case
        "batch 64 -> memory-bound",  # one number of the case only
        "batch 640, context 10240 -> memory-bound",  # the numbers inside others
        "batch 64, context 1024 -> compute-bound",  # the other word
        "batch 64, context 1024\nmemory-bound",  # not on one line
        "batch 64, context 1024: memory-bound or compute-bound?",  # the question, both words
    ):
        assert find_leaks(_word_nb("nothing", above), {}, WORDS) == [], above
    split = "The batch is 64 and the context 1024. Decode is memory-bound."
    assert find_leaks(_word_nb(split, "nothing"), {}, WORDS) == []
    below = _word_nb("nothing", "nothing", "batch 64, context 1024: memory-bound")
    assert find_leaks(below, {}, WORDS) == []


def test_checkers_write_the_words_they_expect_to_the_log(tmp_path, monkeypatch):
    from llmlab.course.check import ch07, core
    from llmlab.course.instructor.leaks import read_expected_words

    log = tmp_path / "expected.jsonl"
    monkeypatch.setenv(core.EXPECTED_LOG_ENV, str(log))
    ch07.decode_bound("memory")
    assert read_expected_words(log) == {
        "ch07.decode_bound": [
            ("memory", (float(ch07.BOUND_BATCH), float(ch07.BOUND_CONTEXT)), ("compute",))
        ]
    }
    assert read_expected_log(log) == {}  # a word is no number


def test_a_chinese_sentence_ends_at_its_full_stop():
    said = "第一句说 batch 64。第二句说上下文 1024，decode 是 memory-bound。"
    assert find_leaks(_word_nb(said, "nothing"), {}, WORDS) == []
    said = "batch 64、上下文 1024 时，这一步是 memory-bound。下一句。"
    assert [(l.cell, l.where) for l in find_leaks(_word_nb(said, "nothing"), {}, WORDS)] == [
        (0, "markdown")
    ]


def test_the_digits_of_a_name_are_no_number():
    """The digits of a format's or a card's name ("bfloat16", "H100", "int8") are not the number
    16 or 100 (chapter 13 once had an answer of 16 below a cell about bfloat16)."""
    expected = {"ch04.kv_gb_for_request": [16.0, 100.0]}
    for named in ("bfloat16 loses a thousandth", "an H100 card", "fp16 and int16"):
        assert find_leaks(_nb(named, "nothing"), expected) == [], named
    leaks = find_leaks(_nb("16 requests fit", "nothing"), expected)
    assert [(l.cell, l.form) for l in leaks] == [(0, "16")]
