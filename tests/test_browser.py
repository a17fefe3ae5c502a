"""The widgets in a real browser: JupyterLab driven by Chromium through Playwright.

A JupyterLab server starts on a free localhost port with a token, its root a temporary copy of
notebooks/ (LLMLAB_FAST=1) plus the Chinese edition's chapter 04 in zh/, each chapter cut to its
set-up cell, its widget's cells and its exercise (`WIDGET_CELLS`). Chromium (Debian's
/usr/bin/chromium; Playwright never downloads a browser here) opens a notebook, runs all cells,
drags a slider, and the widget's result line must become the text llmlab computes in this
process for the value the slider now shows:

- the KV calculator of the Chinese chapter 04 (its result line in Chinese);
- the roofline explorer of chapter 07, and then its task as a student would do it: move the
  batch slider (typed values, halving the interval) until the result says compute-bound, type
  that batch into the exercise's answer cell, run it and see the checker's PASS (NOT YET for the
  batch just below);
- the main-text sliders of chapters 05 (the prefill explorer), 08 (the batching simulator) and
  09 (the parallelism explorer) follow theirs;
- a notebook whose KV calculator lost its slider's callback on purpose: the same verification
  must fail, so a widget whose slider no longer updates its output cannot pass.

The calculator and the roofline explorer run in both editions: the instructor's notebooks, and
the student edition that `make lab` opens (`llmlab.course.instructor.editions`, built here into
student/ and student-zh/), where each slider sits on the required path as in the instructor's;
the sliders of 05, 08 and 09 run in the student edition (the instructor's cell is the same code).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmlab.parallel.launch import free_port
from llmlab.tools.vllm_server import stop_process_group, wait_until_answering

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KV_NOTEBOOK = "04-kv-cache.ipynb"
ROOFLINE_NOTEBOOK = "07-roofline.ipynb"
TEST_TIMEOUT_S = 300  # each test, JupyterLab start-up included
NOTEBOOK_RUN_S = 200  # run-all until the widget shows its result
SETTLE_S = 30  # after the drag, until the result matches the slider


def _skip_reason() -> str | None:
    if not Path(CHROMIUM).exists():
        return (
            f"{CHROMIUM} is missing: install Debian's Chromium (`apt-get install -y chromium`; "
            f"CI's .ci/run does). Playwright must not download its own browser."
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package `playwright` is missing: `pip install playwright` (never `playwright install`)."
    for name in (KV_NOTEBOOK, ROOFLINE_NOTEBOOK):
        if not (ROOT / "notebooks" / name).exists():
            return f"notebooks/{name} does not exist yet"
    return None


_REASON = _skip_reason()
if _REASON:
    pytestmark.append(pytest.mark.skip(reason=_REASON))


# --------------------------------------------------------------------------- server and browser


def _new_session_dying_with_parent() -> None:
    """In the child before exec: its own process group (so teardown can kill the group), and
    on Linux a SIGKILL when the test process dies without tearing down (its kernels notice
    their parent is gone and exit)."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


BROKEN_KV = """\
# The KV calculator with its batch slider's callback removed: the slider still moves, the
# result line no longer follows it. test_browser.py checks that its verification catches this.
from llmlab.course.widgets import kv_calculator

box = kv_calculator(model="llama-3-70b", context=4096, batch=1, dtype="bf16", gpu="H100-SXM")

def _widgets(w):
    yield w
    for c in getattr(w, "children", ()):
        yield from _widgets(c)

broken = [w for w in _widgets(box) if getattr(w, "description", "") == "batch"]
assert len(broken) == 1, broken
broken[0].unobserve_all("value")
box
"""


# The cells each browser test runs of its chapter, besides the first code cell (the chapter's
# set-up): the widget's own cells and its exercise. Running the whole chapter headless is
# test_notebooks.py's (and test_grading.py's) work; here it would only make the browser wait on
# the chapter's measurements before it can touch a slider.
PREFILL_NOTEBOOK, BATCHING_NOTEBOOK, PARALLEL_NOTEBOOK = (
    "05-prefill-decode.ipynb",
    "08-batching.ipynb",
    "09-parallelism.ipynb",
)
EDITIONS = {  # edition -> (folder of the English chapters, folder of the Chinese ones)
    "instructor": ("", "zh/"),
    "student": ("student/", "student-zh/"),
}
_NEEDLES = {
    KV_NOTEBOOK: ("kv_calculator(",),
    ROOFLINE_NOTEBOOK: ("roofline_explorer(", "ch07.compute_bound_batch(answer)"),
    PREFILL_NOTEBOOK: ("prefill_explorer(",),
    BATCHING_NOTEBOOK: ("batching_simulator(",),
    PARALLEL_NOTEBOOK: ("parallelism_explorer(",),
}
WIDGET_CELLS = {
    f"{folders[name == KV_NOTEBOOK]}{name}": needles
    for edition, folders in EDITIONS.items()
    for name, needles in _NEEDLES.items()
    if edition == "student" or name in (KV_NOTEBOOK, ROOFLINE_NOTEBOOK)
}


def _keep_widget_cells(path: Path, needles: tuple[str, ...]) -> None:
    """Rewrite notebook `path` with its markdown, its first code cell and the code cells that
    contain one of `needles` (each needle must be found)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    keep = [c for c in code[1:] if any(n in c.source for n in needles)]
    missing = [n for n in needles if not any(n in c.source for c in keep)]
    assert not missing, f"{path.name}: no code cell contains {missing}"
    kept = {id(code[0]), *map(id, keep)}
    nb.cells = [c for c in nb.cells if c.cell_type != "code" or id(c) in kept]
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base url, token, root folder) of a JupyterLab server over a temporary copy of notebooks/ plus a
    notebook with a broken slider callback; the server's process group is killed afterwards."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    from llmlab.course import lang
    from llmlab.course.instructor import editions

    lang.build(
        "zh", ROOT / "notebooks" / KV_NOTEBOOK, root / "zh"
    )  # the Chinese edition's chapter 04
    for name in _NEEDLES:  # the student edition, as `make lab` builds it
        if name != KV_NOTEBOOK:
            editions.build("en", ROOT / "notebooks" / name, root / "student")
    editions.build("zh", ROOT / "notebooks" / KV_NOTEBOOK, root / "student-zh")
    for path, needles in WIDGET_CELLS.items():
        _keep_widget_cells(root / path, needles)
    nb = new_notebook(cells=[new_code_cell(BROKEN_KV)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, root / "broken-kv.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "LLMLAB_FAST": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
    }
    log = open(tmp / "jupyterlab.log", "w")
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--port={port}",
        "--ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_new_session_dying_with_parent,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        status = f"{base}/api/status?token={token}"
        wait_until_answering(proc, status, 90, "JupyterLab", tmp / "jupyterlab.log", poll_s=0.5)
        yield base, token, str(root)
    finally:
        stop_process_group(proc, timeout_s=15)
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _open_and_run_all(browser, lab, name: str):
    """A new page with notebook `name` open in a fresh workspace, its kernel started (the
    "Select Kernel" dialog accepted when it shows), and Run > Run All Cells clicked."""
    base, token, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    workspace = f"t{secrets.token_hex(4)}"  # no tabs restored from an earlier page
    page.goto(f"{base}/lab/workspaces/{workspace}/tree/{name}?reset&token={token}")
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    panel.first.wait_for(state="visible", timeout=90_000)
    kernel = panel.first.locator(".jp-Toolbar-kernelName")
    deadline = time.monotonic() + 90
    while True:
        dialog = page.locator(".jp-Dialog")
        if dialog.count() and dialog.first.is_visible():
            dialog.first.locator(".jp-mod-accept").first.click()
        elif kernel.count() and "No Kernel" not in kernel.first.inner_text():
            break
        assert time.monotonic() < deadline, f"{name}: no kernel started within 90 s"
        page.wait_for_timeout(250)

    def run_all() -> None:
        panel.first.locator(".jp-Notebook").first.click()
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()

    run_all()
    # wait until the last non-empty code cell shows its execution count and none shows "[*]"
    # (queued or running): widget messages sent while cells still run would queue behind them.
    # Run All stops at a cell that raises; then a traceback shows and _result reports it.
    last = _last_code_cell(lab, name)
    prompts = panel.first.locator(".jp-CodeCell .jp-InputPrompt")
    tracebacks = panel.first.locator(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]',
        has_text="Traceback",
    )
    deadline = time.monotonic() + NOTEBOOK_RUN_S
    # Run All clicked while the page was still settling has been seen to queue nothing (every
    # prompt still "[ ]:" 200 s later): clicked again, twice at most, when nothing has started
    retry_at, retries = time.monotonic() + 15, 2
    while True:
        texts = [t.strip() for t in prompts.all_inner_texts()]
        if not any("*" in t for t in texts) and (
            (len(texts) > last and re.search(r"\[\d+\]", texts[last])) or tracebacks.count()
        ):
            break
        started = any("*" in t or re.search(r"\[\d+\]", t) for t in texts)
        if not started and retries and time.monotonic() > retry_at:
            run_all()
            retry_at, retries = time.monotonic() + 15, retries - 1
        assert time.monotonic() < deadline, (
            f"{name}: Run All not finished after {NOTEBOOK_RUN_S} s; prompts {texts}"
        )
        page.wait_for_timeout(500)
    return page


def _last_code_cell(lab, name: str) -> int:
    """Position, among the code cells, of the last code cell with some code in it."""
    import nbformat

    nb = nbformat.read(Path(lab[2]) / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    return max(i for i, c in enumerate(code) if c.source.strip())


def _result(page, css: str):
    """The widget's result element (the notebook has run already); a failure quotes the
    notebook's error output."""
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    loc = panel.locator(css).first
    try:
        loc.wait_for(state="attached", timeout=30_000)
    except Exception:
        errors = [
            e.inner_text()[-1500:]
            for e in panel.locator(
                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
            ).all()
        ]
        prompts = [
            p.inner_text().strip() for p in panel.locator(".jp-CodeCell .jp-InputPrompt").all()
        ]
        shot = ROOT / "build" / "browser" / f"{secrets.token_hex(3)}-missing-result.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        raise AssertionError(
            f"no {css} in the notebook after Run All (screenshot: {shot}); "
            f"prompts {prompts}; stderr/error outputs:\n" + "\n---\n".join(errors)
        ) from None
    loc.scroll_into_view_if_needed()
    return loc


def _slider(result, label: str):
    """The slider labelled `label` in the widget box that holds `result`."""
    box = result.locator(
        "xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '), ' widget-vbox ')][1]"
    )
    slider = box.locator(".widget-slider").filter(
        has=result.page.locator(
            ".widget-label", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$")
        )
    )
    assert slider.count() == 1, f"expected one slider labelled {label!r}, found {slider.count()}"
    return slider


def _drag(slider, fraction: float) -> None:
    """Drag the slider's handle to `fraction` of its track with the mouse."""
    page = slider.page
    handle = slider.locator(".noUi-handle").first
    track = slider.locator(".noUi-base, .noUi-target").first
    h, t = handle.bounding_box(), track.bounding_box()
    assert h and t, "the slider is not laid out"
    page.mouse.move(h["x"] + h["width"] / 2, h["y"] + h["height"] / 2)
    page.mouse.down()
    target_x = t["x"] + fraction * t["width"]
    for i in range(1, 6):
        page.mouse.move(
            h["x"] + h["width"] / 2 + (target_x - h["x"] - h["width"] / 2) * i / 5,
            h["y"] + h["height"] / 2,
        )
        page.wait_for_timeout(30)
    page.mouse.up()


def _readout(slider) -> str:
    return slider.locator(".widget-readout").first.inner_text().strip()


def _move_and_expect(
    page,
    result_css: str,
    slider_label: str,
    fraction: float,
    expected_for,
    settle_s: float = SETTLE_S,
) -> tuple[str, str]:
    """Drag the slider, then wait (up to `settle_s`) until the result text equals
    expected_for(readout). Returns (readout, text); raises AssertionError when the result does not follow."""
    result = _result(page, result_css)
    page.wait_for_function("el => el.innerText.trim().length > 0", arg=result.element_handle())
    before = result.inner_text().strip()
    slider = _slider(result, slider_label)
    start = _readout(slider)
    _drag(slider, fraction)
    deadline = time.monotonic() + settle_s
    readout, text, expected = start, before, None
    while time.monotonic() < deadline:
        readout = _readout(slider)
        text = result.inner_text().strip()
        if readout != start:
            expected = expected_for(readout)
            if text == expected:
                return readout, text
        page.wait_for_timeout(250)
    assert readout != start, (
        f"dragging the {slider_label!r} slider did not move it (readout stayed {start!r})"
    )
    raise AssertionError(
        f"after moving {slider_label!r} from {start} to {readout}, the widget shows\n"
        f"{text!r}\nbut llmlab computes\n{expected!r}\n(before the move: {before!r})"
    )


# --------------------------------------------------------------------------- expected texts


def _kv_text(readout: str, lang: str) -> str:
    from llmlab.course.widgets.kv import kv_summary, kv_text
    from llmlab.i18n import language, set_language

    before = language()
    set_language(lang)
    try:
        return kv_text(
            kv_summary(
                num_layers=80,
                num_kv_heads=8,
                head_dim=128,
                dtype="bf16",
                context=4096,
                batch=int(readout),
                gpu="H100-SXM",
                weight_bytes=0.0,
            )
        )
    finally:
        set_language(before)


def _kv_expected(readout: str) -> str:
    """The calculator's text for this batch, in Chinese (the test drives the zh notebook)."""
    return _kv_text(readout, "zh")


def _kv_expected_en(readout: str) -> str:
    """The same in English (the broken-callback notebook is an English one)."""
    return _kv_text(readout, "en")


def _roofline_expected(readout: str) -> str:
    from llmlab.course.widgets.roofline import roofline_summary, roofline_text

    return roofline_text(
        roofline_summary("H100-SXM", "llama-3-70b", "bf16", batch=int(readout), context=1024)
    )


# --------------------------------------------------------------------------- tests


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("edition", EDITIONS)
def test_kv_calculator_follows_its_batch_slider(lab, browser, edition):
    """In the Chinese edition of chapter 04: the calculator speaks Chinese and follows its slider."""
    from llmlab.course.widgets.kv import KV_TEXT_PATTERN_ZH

    page = _open_and_run_all(browser, lab, EDITIONS[edition][1] + KV_NOTEBOOK)
    try:
        initial = _result(page, "pre.llmlab-kv-result")
        page.wait_for_function("el => el.innerText.trim().length > 0", arg=initial.element_handle())
        assert initial.inner_text().strip() == _kv_expected("1"), (
            "the calculator does not start at its defaults"
        )
        assert re.search(r"[\u4e00-\u9fff]", initial.inner_text()), (
            "the zh notebook's calculator is not in Chinese"
        )
        readout, text = _move_and_expect(page, "pre.llmlab-kv-result", "batch", 0.4, _kv_expected)
        assert int(readout) > 1
        gb = float(KV_TEXT_PATTERN_ZH.search(text)[1])
        assert gb > float(
            KV_TEXT_PATTERN_ZH.search(_kv_expected("1"))[1]
        )  # more requests, more cache
    finally:
        page.close()


def _set_by_typing(page, result, slider, value: int, expected_for) -> str:
    """Type `value` into the slider's readout (as a student clicks the number and types), then
    wait until the result line is what llmlab computes for it; returns that line."""
    readout = slider.locator(".widget-readout").first
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")
    expected = expected_for(str(value))
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        if _readout(slider) == str(value) and result.inner_text().strip() == expected:
            return expected
        page.wait_for_timeout(200)
    raise AssertionError(
        f"typing {value} into the batch readout: readout {_readout(slider)!r}, "
        f"result {result.inner_text().strip()!r}, expected {expected!r}"
    )


def _run_answer_cell(page, checker_call: str, answer: int) -> str:
    """Replace the code of the cell that holds `checker_call` with `answer = <answer>` and that
    call, run it (Shift+Enter), and return the checker's line once it shows."""
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    cell = panel.locator(".jp-CodeCell").filter(has_text=checker_call)
    assert cell.count() == 1, f"expected one cell calling {checker_call}, found {cell.count()}"
    cell.scroll_into_view_if_needed()
    prompt = cell.locator(".jp-InputPrompt").first
    before = prompt.inner_text().strip()
    cell.locator(".cm-content").first.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(f"answer = {answer}\n{checker_call}")
    page.keyboard.press("Shift+Enter")
    pattern = re.compile(rf"\[check {re.escape(checker_call.split('(')[0])}\] (PASS|NOT YET)")
    deadline, text = time.monotonic() + SETTLE_S, ""
    while time.monotonic() < deadline:
        now = prompt.inner_text().strip()
        if now != before and re.search(r"\[\d+\]", now):  # this run finished (a new count)
            text = " ".join(cell.locator(".jp-OutputArea-output").all_inner_texts()).strip()
            if pattern.search(text):
                return text
        page.wait_for_timeout(250)
    raise AssertionError(f"running the answer cell gave no checker line; outputs {text!r}")


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("edition", EDITIONS)
def test_roofline_task_found_with_the_slider_passes_its_check(lab, browser, edition):
    """The roofline explorer follows its batch slider, and its task works end to end: find the
    smallest compute-bound batch with the slider, answer it in the exercise cell, and the checker
    says PASS (the batch below: NOT YET). (One page, one Run All of chapter 07, for both.)"""
    from llmlab.course.check import ch07
    from llmlab.course.widgets.roofline import MAX_BATCH, ROOFLINE_TEXT_PATTERN

    page = _open_and_run_all(browser, lab, EDITIONS[edition][0] + ROOFLINE_NOTEBOOK)
    try:
        css = "pre.llmlab-roofline-result"
        initial = _result(page, css)
        page.wait_for_function("el => el.innerText.trim().length > 0", arg=initial.element_handle())
        assert initial.inner_text().strip() == _roofline_expected("1")
        page.wait_for_timeout(1000)  # the figures above finish laying out before the drag
        # the explorer follows its slider (a first, rough drag) ...
        readout, text = _move_and_expect(page, css, "batch", 0.75, _roofline_expected)
        assert int(readout) > 1 and ROOFLINE_TEXT_PATTERN.match(text)
        # ... and the task is found with it
        bound = lambda line: ROOFLINE_TEXT_PATTERN.search(line)[2]  # noqa: E731
        result = _result(page, css)
        slider = _slider(result, "batch")
        lo, hi = 1, MAX_BATCH  # memory-bound at lo, compute-bound at hi: checked, then halved
        assert bound(_set_by_typing(page, result, slider, lo, _roofline_expected)) == "memory"
        assert bound(_set_by_typing(page, result, slider, hi, _roofline_expected)) == "compute"
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if bound(_set_by_typing(page, result, slider, mid, _roofline_expected)) == "compute":
                hi = mid
            else:
                lo = mid
        found = hi
        assert found == ch07.questions._crossover(), (found, ch07.questions._crossover())
        line = _run_answer_cell(page, "ch07.compute_bound_batch(answer)", found - 1)
        assert "NOT YET" in line, line
        line = _run_answer_cell(page, "ch07.compute_bound_batch(answer)", found)
        assert "[check ch07.compute_bound_batch] PASS" in line, line
    finally:
        page.close()


def _prefill_expected(readout: str) -> str:
    from llmlab.course.widgets.roofline import prefill_summary, prefill_text

    return prefill_text(prefill_summary("H100-SXM", "llama-3-8b", "bf16", int(readout)))


def _batching_expected(readout: str) -> str:
    from llmlab.course.widgets.batching import batching_text

    return batching_text(max_batch=int(readout))


def _parallel_expected(readout: str) -> str:
    from llmlab.course.widgets.parallel import parallel_text

    return parallel_text(tp=8, interconnect="nvlink", batch=int(readout), context=1024)


# chapter -> (the result element, the slider dragged, where it is dragged to, the text llmlab
# computes for the readout)
MAIN_TEXT_SLIDERS = {
    PREFILL_NOTEBOOK: ("pre.llmlab-prefill-result", "prompt tokens", 0.3, _prefill_expected),
    BATCHING_NOTEBOOK: ("pre.llmlab-batching-result", "max batch", 0.6, _batching_expected),
    PARALLEL_NOTEBOOK: ("pre.llmlab-parallel-result", "batch", 0.7, _parallel_expected),
}


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("notebook", MAIN_TEXT_SLIDERS)
def test_a_main_text_slider_follows_its_slider(lab, browser, notebook):
    """The slider of chapters 05, 08 and 09, on their required path in the student edition (the
    instructor's runs the same cell; the calculator and the roofline explorer run in both): it
    starts at its defaults and its result line becomes what llmlab computes for the value
    dragged to."""
    css, label, fraction, expected_for = MAIN_TEXT_SLIDERS[notebook]
    page = _open_and_run_all(browser, lab, EDITIONS["student"][0] + notebook)
    try:
        result = _result(page, css)
        page.wait_for_function("el => el.innerText.trim().length > 0", arg=result.element_handle())
        start = _readout(_slider(result, label))
        assert result.inner_text().strip() == expected_for(start), "not at its defaults"
        readout, _ = _move_and_expect(page, css, label, fraction, expected_for)
        assert readout != start
    finally:
        page.close()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_broken_slider_callback_fails_the_check(lab, browser):
    page = _open_and_run_all(browser, lab, "broken-kv.ipynb")
    try:
        # the working calculator follows within a second or two; a dead callback never does
        with pytest.raises(AssertionError, match="llmlab computes"):
            _move_and_expect(
                page, "pre.llmlab-kv-result", "batch", 0.4, _kv_expected_en, settle_s=8
            )
    finally:
        page.close()
