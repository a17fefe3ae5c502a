"""The course: self-check checkers, widgets and figures (they only present: what they compute
lives in `llmlab.analysis`), the instructor's tools, the Chinese edition's builder and the
glossary, the notebook runner. Imports the engine, analysis and tools; nothing imports it."""
