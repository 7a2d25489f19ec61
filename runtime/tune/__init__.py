"""``rrfp tune-hint`` without traces: the scenarios a hint is tuned and judged on
(:mod:`~runtime.tune.scenarios`), what a candidate scores (:mod:`~runtime.tune.evaluator`: objectives,
candidates, the evaluator, the paired bootstrap), the search (:mod:`~runtime.tune.search`) and the decision
with its report (:mod:`~runtime.tune.decide`). Pure Python; traces become scenarios in
:mod:`profiler.analysis.tune_sources`."""
