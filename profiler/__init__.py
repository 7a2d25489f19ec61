"""Trace writing, reading and analysis (Perfetto). Filled in by the tracing work; see docs/ARCHITECTURE.md."""
