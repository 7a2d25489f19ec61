"""The trace format and its two ends: :mod:`~profiler.trace.schema` (``rrfp-trace/1``: tracks, annotations,
uuids, flow ids), :mod:`~profiler.trace.recorder` (what each rank writes, and merging rank files) and
:mod:`~profiler.trace.reader` (a ``.pftrace`` to polars frames, robust to truncation)."""
