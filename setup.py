"""The optional compiled part of rrfp: the trace reader's packet walk ([Note: the compiled reader] in
profiler/trace/reader.py). Everything else is in pyproject.toml. ``optional=True``: where no C compiler is at
hand the install goes on without it and the reader walks the packets in Python (the same frames, slower)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("profiler.trace._fastread", ["profiler/trace/_fastread.c"], optional=True)])
