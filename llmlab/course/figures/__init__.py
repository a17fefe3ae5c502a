"""The notebooks' figures, one function per figure (`llmlab.course.figures.chNN.name(...)` returns the
matplotlib Figure it drew): the notebook cell shows the idea and calls the plot, the plotting
code lives here, where it is tested."""

import warnings as _warnings

# The figures label things in English; on a machine without a CJK font a Chinese term slipping
# into a label would warn once per missing glyph. Only matplotlib's warning, only once the
# figures are in use: `import llmlab` changes no warning filter.
_warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", module="matplotlib")
