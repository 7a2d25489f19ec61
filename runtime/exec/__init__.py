"""One rank's executor: the loop (:mod:`~runtime.exec.executor`), its handlers and their wrappers
(:mod:`~runtime.exec.handlers`), the split backward they run (:mod:`~runtime.exec.split_backward`), the
lookahead rule's forecasts (:mod:`~runtime.exec.forecast`), TP
coordination (:mod:`~runtime.exec.tp_follow`), what the loop reports (:mod:`~runtime.exec.recording`) and the
profiler ranges it opens around each task (:mod:`~runtime.exec.ranges`)."""
