"""Analyses of a trace: pure functions of the frames of :mod:`profiler.trace.reader`, one module per topic.

Nothing is imported here, so importing one analysis does not import them all. Each module imports only those
before it in this list:

* ``windows``: which iterations an analysis reads ([Note: iteration 0]), pipeline shape, iteration windows,
  ready times; the conventions the others follow.
* ``realized``: realized durations and latencies of complete iterations (what the simulator replays), the
  calibrated per-dispatch overhead.
* ``bubbles``: idle time by cause ([Note: bubble categories]), misaligned gaps, idle segments for the
  timeline, the same split of a simulation.
* ``conformance``: executed order against the hint (skips, Kendall tau, displacement).
* ``critical_path``: the chain of compute, transfers and waits that set an iteration's makespan.
* ``tp``: TP coordination (how long followers take to follow their leader's decisions).
* ``replay``: hint sensitivity, the trace's iterations replayed under every built-in; the traced hint and rule.
* ``summary``: one trace at a glance, two side by side.
* ``costs``: per-(stage, kind) cost models fitted on traced tasks.
* ``tune_sources``: tune-hint's scenarios from traced runs.
"""
