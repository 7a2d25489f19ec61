"""Choosing a rank's next task, and what a choice costs: the arbiter (:mod:`~runtime.sched.arbiter`) and the
rule table that selects it (:mod:`~runtime.sched.rules`), the memory budget (:mod:`~runtime.sched.budget`),
the discrete-event simulator (:mod:`~runtime.sched.simulator`, with its fixed-order fast paths in
:mod:`~runtime.sched.fixed_order` and its outputs in :mod:`~runtime.sched.results`), the makespan lower
bound (:mod:`~runtime.sched.bounds`) and every (hint, rule) on one graph (:mod:`~runtime.sched.evaluate`).
The same arbiters run in the simulator and in the runtime. Pure Python."""
