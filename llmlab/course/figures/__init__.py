"""The notebooks' figures, one function per figure (`llmlab.course.figures.chNN.name(...)` returns the
matplotlib Figure it drew): the notebook cell shows the idea and calls the plot, the plotting
code lives here, where it is tested."""
