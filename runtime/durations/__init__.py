"""How long each task and each transfer takes: the variability models (:mod:`~runtime.durations.variability`),
the workload presets fitted to dataset statistics (:mod:`~runtime.durations.presets`) and duration tables on
disk (:mod:`~runtime.durations.tables`). Pure Python; imports nothing else of ``runtime``."""
