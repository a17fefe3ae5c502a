"""The course: self-check checkers, widgets and figures (they only present: what they compute
lives in `llmlab.analysis`), the instructor's tools, the Chinese edition's builder and the
glossary, the notebook runner. Imports the engine, analysis and tools; nothing imports it."""

import sys


def skip_iri_format_checks() -> None:
    """Let `jsonschema` (which nbformat imports) skip its "iri" format checks: with the
    rfc3987-syntax package installed (JupyterLab brings it) it compiles about forty grammars when
    it is imported, 1.2-3.6 s of every process that reads a notebook, for formats no notebook
    schema uses. Call before nbformat is first imported (the command line and the tests do);
    without effect once jsonschema is loaded."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # None: `import` raises ImportError
