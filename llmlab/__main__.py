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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    from llmlab.course import skip_iri_format_checks

    skip_iri_format_checks()
    if cmd == "doctor":
        from llmlab.tools.doctor import main as doctor_main

        return doctor_main(rest)
    if cmd == "model":
        return _model(rest)
    if cmd == "openmp":
        from llmlab.openmp import main as openmp_main

        return openmp_main(rest)
    if cmd == "check":
        from llmlab.course.check.cli import main as check_main

        return check_main(rest)
    if cmd == "lang" and rest[:1] == ["pairs"]:  # a module of its own, above lang
        from llmlab.course.package_pairs import main as pairs_main

        return pairs_main(rest[1:])
    if cmd == "lang":
        from llmlab.course.lang import main as lang_main

        return lang_main(rest)
    if cmd == "exercises":
        from llmlab.course.instructor.table import main as table_main

        return table_main(rest)
    if cmd == "run":
        from llmlab.course.notebook_runner import main as run_main

        return run_main(rest)
    if cmd == "serve":
        from llmlab.serve.launch import main as serve_main

        return serve_main(rest)
    if cmd == "bench":
        from llmlab.bench import benchmarks

        names = benchmarks()
        if not rest or rest[0] in ("-h", "--help"):
            from llmlab.utils import format_table

            print(
                "usage: python -m llmlab bench NAME [args]   (python -m llmlab bench NAME --help)\n"
            )
            print(textwrap.indent(format_table(names.items(), align="l"), "  "))
            return 0 if rest else 2
        if rest[0] not in names:
            print(f"unknown benchmark {rest[0]!r}; choose one of: {', '.join(names)}")
            return 2
        return importlib.import_module(f"llmlab.bench.{rest[0]}").main(rest[1:])
    if cmd == "edition":
        from llmlab.course.instructor.editions import main as edition_main

        return edition_main(rest)
    if cmd == "student":
        from llmlab.course.instructor.student import student_main

        return student_main(rest)
    if cmd == "grade":
        from llmlab.course.instructor.grading import grade_main

        return grade_main(rest)
    print(f"unknown command {cmd!r}\n{__doc__}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
