"""Chinese for the later checkers (ch06-ch12), the grader's report, doctor's report and the
argument errors a student meets: with `set_language("zh")` the hints are Chinese and still never
show the expected number, hint tables hold an (English, Chinese) pair for every key, Chinese
text uses the glossary's one term per concept, and English stays what it was."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from checker_modules import chapter_exercises, checker_files, checker_modules, quiet
from notebook_grading import sample_report
from source_chapter import WHERE, source_chapter_text
from test_zh_terms import PENDING_TERMS

from llmlab import i18n
from llmlab.course.check import core
from llmlab.course.check.catalog import Texts, catalog_path
from llmlab.course.glossary import SOURCE_QUOTE, has_cjk, zh_synonym_uses
from llmlab.course.instructor.leaks import number_forms

ROOT = Path(__file__).resolve().parent.parent
MODULES = [f"ch{n:02d}" for n in range(6, 13)]
# a module's file, or each module of a chapter's package
FILES = [p.relative_to(ROOT).as_posix() for m in MODULES for p in checker_files(m)] + [
    "llmlab/course/instructor/grading.py",
    "llmlab/course/instructor/kernel_run.py",
    "llmlab/tools/doctor.py",
    "llmlab/sampling/params.py",
    "llmlab/sampling/sampler.py",
    "llmlab/engine/processor.py",
    "llmlab/engine/llm.py",
    "llmlab/engine/llm_engine.py",
    "llmlab/analysis/costs.py",
    "llmlab/analysis/roofline/model.py",
    "llmlab/analysis/roofline/measure.py",
    "llmlab/analysis/hardware.py",
]
# the quiz's wrong choices are Chinese names the glossary lists on purpose
QUIZ_DATA = {("llmlab/course/check/ch12/matching.py", "GLOSSARY_CHOICES")}
WRONG_FACTORS = (1.37, 0.61, 2, 0.5, 8, 0.125, 1000, 1e-3, 4, 0.25, -1)
CJK = re.compile(r"[\u4e00-\u9fff]")
# core.check_number's own fallbacks (core.py is translated on its own)
CORE_FALLBACKS = ("off by a factor of 8", "off by a unit prefix")


@pytest.fixture
def zh():
    i18n.set_language("zh")
    yield
    i18n.set_language("en")


def _single_number_exercises():
    out = []
    for m in MODULES:
        for ex, fn in chapter_exercises(m):
            try:
                quiet(fn, None)
            except TypeError:  # an exercise of more than one argument
                continue
            expected = core.expected_values(ex)
            if len(expected) == 1 and expected[0] != 0:
                out.append((ex, fn, expected[0]))
    return out


def test_wrong_numbers_get_chinese_hints_that_never_show_the_number(zh):
    numeric = _single_number_exercises()
    assert len(numeric) >= 20, numeric
    shown, english = [], []
    for ex, fn, x in numeric:
        forms = number_forms(x)
        for factor in WRONG_FACTORS:
            for _ in range(2):  # the second try adds the formula
                r = quiet(fn, x * factor)
                assert not r.passed, f"{ex} passed {x * factor}"
                if not CJK.search(r.message) and not r.message.startswith(CORE_FALLBACKS):
                    english.append(f"{ex} <- {x * factor:g}: {r.message}")
                for form in forms:
                    if re.search(r"(?<![\d.,])" + re.escape(form) + r"(?![\d]|[.,]\d)", r.message):
                        shown.append(f"{ex}: hint for {x * factor:g} shows {form!r}: {r.message}")
                again = quiet(fn, r.message)
                assert not again.passed, f"{ex}: its own Chinese hint passes: {r.message}"
    assert not shown, "\n".join(shown)
    assert not english, "hints left in English:\n" + "\n".join(english)


def _pair_tables():
    """Every module-level dict of (English, Chinese) pairs in the checkers (hint tables); a
    table of catalog keys (`M.key(...)`) or of catalog entries (`M.texts(...)`) counts with the
    two texts of each key."""
    for m in MODULES:
        for module in checker_modules(m):
            named = module.__name__.removeprefix("llmlab.course.check.")
            for name, value in vars(module).items():
                cat = getattr(module, "M", None)
                if isinstance(value, Texts):
                    value = {k: value.key(k) for k in value}
                if (
                    cat is not None
                    and isinstance(value, dict)
                    and value
                    and all(isinstance(v, str) and v in cat.entries for v in value.values())
                ):
                    value = {k: (cat.template(v), cat.template(v, "zh")) for k, v in value.items()}
                if (
                    isinstance(value, dict)
                    and value
                    and all(
                        isinstance(v, tuple) and len(v) == 2 and all(isinstance(t, str) for t in v)
                        for v in value.values()
                    )
                ):
                    yield f"{named}.{name}", value


def test_every_hint_table_pairs_english_with_chinese():
    tables = dict(_pair_tables())
    assert {
        "ch07.questions.CROSSOVER_WHY_WRONG",
        "ch08.questions.CPU_WHY_WRONG",
        "ch09.questions.DP_HINTS",
        "ch10.questions.Q4_HINTS",
        "ch10.questions.BURSTINESS_MISSED",
        "ch11.questions._Q5_HINTS",
        "ch12.loop._MARK_HINTS",
        "ch12.matching._SYMPTOM_WHY",
    } <= set(tables)
    for name, table in tables.items():
        for key, (en, zh) in table.items():
            assert not CJK.search(en) and CJK.search(zh), f"{name}[{key!r}]"


def test_choice_and_matching_hints_speak_chinese_and_english_stays(zh):
    from llmlab.course.check import ch07, ch10, ch11, ch12

    r = quiet(ch07.why_crossover_grows, "ridge_moves")
    assert not r and r.message == ch07.M.template("crossover_why_wrong.ridge_moves", "zh")
    r = quiet(
        ch10.source_q4, {"chat": "gpu_util", "batch_jobs": "throughput", "code_completion": "ttft"}
    )
    assert not r and "利用率" in r.message
    r = quiet(ch11.ratio_reason, "b")
    assert not r and CJK.search(r.message)
    r = quiet(ch12.symptoms, dict(zip(ch12.SYMPTOMS, ["tokenizer_too_slow"] * 4)))
    assert not r and "分词" in r.message
    r = quiet(
        ch12.generation_loop_steps,
        {
            "prefill": [("tokenize", "none"), ("embed", "none"), ("qkv_projection", "write")],
            "decode_starts_at": "embed",
        },
    )
    assert not r and r.message.startswith("第 3 步") and "Attention.forward" in r.message
    i18n.set_language("en")
    r = quiet(ch07.why_crossover_grows, "ridge_moves")
    assert r.message == ch07.M.template("crossover_why_wrong.ridge_moves") and not CJK.search(
        r.message
    )


def test_dict_answers_name_each_wrong_key_in_chinese(zh):
    from llmlab.course.check import ch08, ch11

    r = quiet(
        ch08.source_q3,
        {"step_ms_batch1": 1, "step_ms_batch32": 2, "throughput_ratio": 32.0, "bound": "sideways"},
    )
    assert (
        not r
        and "step_ms_batch1：" in r.message
        and 'bound 必须是 "memory" 或 "compute"' in r.message
    )
    r = quiet(ch11.first_evicted, {"first": "x", "safe": 1})
    assert not r and "两个值都必须是数" in r.message


def test_right_answers_pass_in_chinese_with_a_chinese_verdict(zh):
    from llmlab.course.check import ch09, ch12

    right = {k: "row" if k in ("o_proj", "down_proj") else "column" for k in ch09.PROJECTIONS}
    r = quiet(ch09.parallel_style, right)
    assert r and CJK.search(r.message)
    r = quiet(
        ch12.generation_loop_steps,
        {"prefill": list(ch12.LOOP_WITH_CACHE), "decode_starts_at": ch12.DECODE_STARTS_AT},
    )
    assert r and "memory-bound" in r.message and CJK.search(r.message)


def _chinese_strings():
    read = set()
    for f in FILES:
        # the module's catalog (llmlab.course.check.catalog); a chapter package's is the chapter's
        folder = (ROOT / f).parent
        messages = (
            catalog_path(folder.name)
            if folder.name in MODULES
            else folder / "messages" / f"{Path(f).stem}.json"
        )
        if messages.exists() and messages not in read:
            read.add(messages)
            for key, entry in json.loads(messages.read_text(encoding="utf-8"))["messages"].items():
                yield f"{messages.name} {key}", 0, entry["zh"]
        tree = ast.parse((ROOT / f).read_text(encoding="utf-8"))
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and (f, t.id) in QUIZ_DATA for t in node.targets
            ):
                skip |= {id(n) for n in ast.walk(node.value)}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and has_cjk(node.value)
                and id(node) not in skip
            ):
                yield f, node.lineno, node.value


def test_chinese_text_uses_one_term_per_concept():
    found = [
        f"{f}:{line}: {u.found!r} (write {u.primary!r})"
        for f, line, text in _chinese_strings()
        for u in zh_synonym_uses(text)
        if (f, u.found) not in PENDING_TERMS
    ]
    assert not found, "\n".join(found)
    assert not [t for _, _, t in _chinese_strings() if "内核" in t or "对数几率" in t]


def test_argument_errors_speak_chinese_and_keep_the_english(zh):
    from llmlab.analysis import costs, roofline
    from llmlab.analysis.hardware import get_hardware
    from llmlab.engine import LLMEngine
    from llmlab.model import tiny_model
    from llmlab.sampling import SamplingParams

    cases = [
        (lambda: SamplingParams(temperature=-1), "temperature", "贪心解码"),
        (lambda: SamplingParams(top_k=0), "top_k", "关闭"),
        (lambda: costs.dtype_bytes_of("fp9"), "dtype", "字节数"),
        (lambda: costs.head_size(4096, 0), "num_heads", "整数"),
        (lambda: costs.head_size(10, 3), "num_heads", "整除"),
        (lambda: roofline.dtype_for_bytes(3), "dtype_bytes", "之一"),
        (lambda: roofline.attainable("H100-SXM", -1.0), "intensity", "必须"),
        (lambda: get_hardware("H900"), "H900", "硬件预设"),
    ]
    engine = LLMEngine(tiny_model(seed=1), max_model_len=64)
    cases += [
        (lambda: engine.add_request("", [1, 2], SamplingParams()), "request_id", "非空"),
        (lambda: engine.add_request("a", [], SamplingParams()), "prompt", "不能为空"),
        (
            lambda: engine.add_request("b", list(range(65)), SamplingParams()),
            "max_model_len",
            "超过了",
        ),
    ]
    for make, name, word in cases:
        with pytest.raises(ValueError, match=re.escape(name)) as err:
            make()
        assert word in str(err.value) and CJK.search(str(err.value)), str(err.value)
    i18n.set_language("en")
    with pytest.raises(
        ValueError,
        match=r"^SamplingParams\.temperature must be a number in \[0, 2\] \(0 means greedy\)",
    ):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match=r"^unknown hardware preset 'H900'; known: "):
        get_hardware("H900")


def test_llm_generate_refuses_mismatched_params_in_chinese(zh):
    from llmlab.engine import LLM
    from llmlab.model import tiny_model
    from llmlab.sampling import SamplingParams

    llm = LLM(tiny_model(seed=1), max_model_len=64)
    with pytest.raises(ValueError, match="sampling_params") as err:
        llm.generate([[1, 2], [3, 4]], [SamplingParams()] * 3, use_tqdm=False)
    assert "每个 prompt 各给一个" in str(err.value)


def test_grade_report_text_speaks_chinese_and_its_json_stays(zh):
    from llmlab.course.instructor import grading

    rep = sample_report()
    lines = rep.text().splitlines()
    assert lines[1].split()[:2] == ["通过", "ch00.a"] and lines[2].split()[:2] == [
        "还不对",
        "ch00.bb",
    ]
    assert "单元格 3 (1/0) 出错" in lines[3] and "得分：1 / 2" in lines[4]
    zh_dict = rep.to_dict()
    i18n.set_language("en")
    assert rep.to_dict() == zh_dict and "score: 1 of 2" in rep.text()
    i18n.set_language("zh")
    # a run that stopped is still recognised from its Chinese message
    stopped = {
        "cell": "4",
        "index": 4,
        "ename": "CellTimeoutError",
        "evalue": f"单元格运行超过了 5 s，中断后 kernel 也没有停下；{grading.DID_NOT_RUN[1]}",
    }
    assert grading._ended_run(stopped)
    assert grading.grading_env()[i18n.LANG_ENV] == "zh"


def test_missing_answer_message_in_chinese(zh):
    import nbformat

    from llmlab.course.instructor import grading

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(1)")]
    msg = grading._missing_message(nb, "ch00.fast_mode", [])
    assert msg.startswith(grading.NOT_RECORDED_ZH) and "llmlab.course.check.ch00.fast_mode" in msg
    i18n.set_language("en")
    assert grading._missing_message(nb, "ch00.fast_mode", []).startswith(grading.NOT_RECORDED)


def test_doctor_report_speaks_chinese_and_still_finds_a_missing_model(zh, monkeypatch, capsys):
    from llmlab.tools import doctor

    info = doctor.report()
    assert "triton 模式" in info and "模型包" in info and "torch" in info
    assert not doctor.model_missing(info)
    assert doctor.main() == 0 and "模型包 :" in capsys.readouterr().out

    def gone():
        raise FileNotFoundError("no gguf")

    monkeypatch.setattr("llmlab.model.weights.gguf_path", gone)
    info = doctor.report()
    assert info["模型包"].startswith("缺失") and doctor.model_missing(info)
    assert doctor.main() == 1
    i18n.set_language("en")
    info = doctor.report()
    assert info["model package"] == "MISSING: no gguf" and doctor.main() == 1


def test_texts_the_notebooks_print_have_chinese_for_every_key():
    from llmlab.course.check import ch00, ch01, ch05, ch10, ch11, ch12

    tables = [
        ch00.NUMBERS,
        ch00.SYMPTOMS,
        ch01.VOCAB_EFFECTS,
        ch05.ORDER_OPTIONS,
        ch10.BURSTINESS_STATEMENTS,
        ch11.RATIO_OPTIONS,
        ch12.Q4_PRODUCTS,
        ch12.SEED_QUESTIONS,
    ]
    with i18n.speaking("en"):
        english = [dict(table) for table in tables]
    with i18n.speaking("zh"):
        chinese = [dict(table) for table in tables]
    for en, zh in zip(english, chinese):
        assert list(zh) == list(en)
        for key in en:  # (question, checkers): the question is the text, the checkers the same
            en_text, *en_rest = en[key] if isinstance(en[key], tuple) else (en[key],)
            zh_text, *zh_rest = zh[key] if isinstance(zh[key], tuple) else (zh[key],)
            assert not CJK.search(en_text) and CJK.search(zh_text) and en_rest == zh_rest, key


def test_quotes_of_the_seed_are_verbatim():
    text = source_chapter_text()
    if text is None:
        pytest.skip(WHERE)
    quotes = [q for _, _, s in _chinese_strings() for q in SOURCE_QUOTE.findall(s)]
    assert len(quotes) >= 5
    assert [q for q in quotes if q not in text] == []
