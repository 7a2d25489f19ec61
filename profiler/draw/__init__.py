"""Pictures: the pipeline timeline (:mod:`~profiler.draw.timeline`, one scene written as SVG or PNG) and the
benchmark charts drawn on the same scene (:mod:`~profiler.draw.charts`). No matplotlib."""
