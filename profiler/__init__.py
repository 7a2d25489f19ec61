"""Traces and what is read from them. Rooms, in import order: :mod:`profiler.trace` (the ``rrfp-trace/1``
schema, the recorder each rank runs, the reader), :mod:`profiler.analysis` (pure functions of the frames:
bubbles, conformance, critical path, realized durations, replay, TP, summaries; tune-hint's sources),
:mod:`profiler.draw` (the timeline and charts) and :mod:`profiler.bench` (``rrfp bench``). See
docs/ARCHITECTURE.md."""
