"""Command line: `python -m llmlab COMMAND ...`.

doctor                     environment report
openmp [--probe]           how OpenMP threads wait here; --probe measures and saves the choice
model [NAME]               convert and cache the model (once), report the load time
run NOTEBOOKS OUT          execute notebooks headless into OUT (executed copies + HTML);
                           run --measure NOTEBOOK... measures chapters' run times into data/
serve [MODEL] [options]    OpenAI-compatible server (127.0.0.1:8000 by default)
bench NAME [args]          benchmarks (`bench --help` lists them)
edition LANG NOTEBOOKS OUT the student edition (en or zh) into OUT: the chapters without
                           solutions, and solutions/ with each chapter's worked solutions
student SRC DST            write the student version of the notebooks (solutions stripped)
grade NOTEBOOK --source SRC  execute a student's notebook and grade its exercises
                           (SRC: the instructor's notebook, or the manifest `student` wrote)
check chNN [NOTEBOOK|MODULE]  a chapter's build exercises on the student's code (by default
                           the chapter in the student's edition); exit status 0 when all pass
lang check|extract|lint|strings|build LANG NOTEBOOKS [OUT]
                           the notebooks in another language (zh) from one English source
lang pairs LANG [--write]  the package's (English, Chinese) pairs against their reviewed
                           catalog i18n/LANG/package-pairs.json (`lang --help` says more)
exercises [--write DOC]    the instructors' table of exercises (kind, mistakes named, source
                           question), printed or written into DOC between its markers;
                           --times each chapter's two times (required path, whole chapter),
                           --write-times writes them wherever the course states them
"""

from __future__ import annotations

import importlib
import sys
import textwrap


def _model(args: list[str]) -> int:
    import time

    from llmlab.model import load_model
    from llmlab.model.weights import model_dir

    name = args[0] if args else "smollm2-135m"
    t0 = time.perf_counter()
    path = model_dir(name)
    t1 = time.perf_counter()
    model, _ = load_model(name)
    t2 = time.perf_counter()
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n:,} parameters in {path} (prepare {t1 - t0:.1f} s, load {t2 - t1:.1f} s)")
    return 0


def _bench(args: list[str]) -> int:
    """`bench NAME [args]`: run benchmark NAME's main; without NAME, list them."""
    from llmlab.bench import benchmarks

    names = benchmarks()
    if not args or args[0] in ("-h", "--help"):
        from llmlab.utils import format_table

        print("usage: python -m llmlab bench NAME [args]   (python -m llmlab bench NAME --help)\n")
        print(textwrap.indent(format_table(names.items(), align="l"), "  "))
        return 0 if args else 2
    if args[0] not in names:
        print(f"unknown benchmark {args[0]!r}; choose one of: {', '.join(names)}")
        return 2
    return importlib.import_module(f"llmlab.bench.{args[0]}").main(args[1:])


# each command run by a function of its own module, imported when the command runs (most
# import torch): command -> (module, function)
COMMANDS = {
    "doctor": ("llmlab.tools.doctor", "main"),
    "openmp": ("llmlab.openmp", "main"),
    "check": ("llmlab.course.check.cli", "main"),
    "lang pairs": ("llmlab.course.package_pairs", "main"),  # a module of its own, above lang
    "lang": ("llmlab.course.lang", "main"),
    "exercises": ("llmlab.course.instructor.table", "main"),
    "run": ("llmlab.course.notebook_runner", "main"),
    "serve": ("llmlab.serve.launch", "main"),
    "edition": ("llmlab.course.instructor.editions", "main"),
    "student": ("llmlab.course.instructor.student", "student_main"),
    "grade": ("llmlab.course.instructor.grading", "grade_main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    from llmlab.course import skip_iri_format_checks

    skip_iri_format_checks()
    if cmd == "model":
        return _model(rest)
    if cmd == "bench":
        return _bench(rest)
    if cmd == "lang" and rest[:1] == ["pairs"]:
        cmd, rest = "lang pairs", rest[1:]
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}\n{__doc__}")
        return 2
    module, function = COMMANDS[cmd]
    return getattr(importlib.import_module(module), function)(rest)


if __name__ == "__main__":
    sys.exit(main())
