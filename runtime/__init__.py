"""What may run now, what it costs, and the machinery that runs it. Rooms, in import order (each imports only
the ones before it, and ``hints``):

* :mod:`runtime.durations` -- how long tasks and transfers take: variability models, workload presets,
  duration tables on disk.
* :mod:`runtime.sched` -- choosing: the arbiter and its rules, the memory budget, the simulator, the lower
  bound, the evaluation of hints side by side. Pure Python.
* :mod:`runtime.tune` -- ``rrfp tune-hint``'s search: scenarios, the evaluator, the search, the decision.
* :mod:`runtime.config` -- ``rrfp run``'s typed configuration and what follows from it alone.
* :mod:`runtime.comm` -- all communication: wire format, inbox, links, sockets, the transport, the clock,
  the process grid.
* :mod:`runtime.workloads` -- the models a run trains, cut into stages (built-in, a user's, TP-sharded).
* :mod:`runtime.exec` -- one rank's executor: the loop, its handlers, forecasts, TP following, recording.
* :mod:`runtime.run` -- a run: the rank's process, the launcher, diagnosis, health, metrics, checkpoints,
  DP, the Python API's pipeline.

``durations``, ``sched``, ``tune`` and ``config`` import no torch. See docs/ARCHITECTURE.md.
"""
