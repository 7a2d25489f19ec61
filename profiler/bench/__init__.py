"""``rrfp bench``: the matrix as data (:mod:`~profiler.bench.matrix`), its simulated cells
(:mod:`~profiler.bench.cells`), real runs (:mod:`~profiler.bench.runs`), torch's schedules against rrfp
(:mod:`~profiler.bench.external`, :mod:`~profiler.bench.torch_side`), the results folder
(:mod:`~profiler.bench.results`), the report (:mod:`~profiler.bench.report`) and the suite that runs it all
(:mod:`~profiler.bench.suite`). docs/benchmarks.md."""
