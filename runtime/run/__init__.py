"""A run: from a configuration to processes, and what they leave behind. The plan of hints
(:mod:`~runtime.run.plan`), the launcher (:mod:`~runtime.run.launch`) and its diagnosis of failures
(:mod:`~runtime.run.diagnose`), a rank's process (:mod:`~runtime.run.worker`) with its health reports
(:mod:`~runtime.run.health`), metrics (:mod:`~runtime.run.metrics`), injected noise (:mod:`~runtime.run.noise`),
results (:mod:`~runtime.run.collect`) and progress bar (:mod:`~runtime.run.progress`); checkpoints
(:mod:`~runtime.run.checkpoint`), data parallelism (:mod:`~runtime.run.dp`), and the Python API's
pipeline (:mod:`~runtime.run.pipeline`)."""
