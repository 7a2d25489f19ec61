"""What a job hands back to its launcher besides its outputs on disk: the results dict of one rank.

:func:`runtime.run.worker.worker_main` returns ``{job name: results}`` per rank; the launcher returns them
per local rank (``rrfp run`` reads rank 0's ``metrics``; tests and benchmarks read the rest).

Always::

    executed        the first iteration's tasks, in the order this rank ran them (canonical text)
    peak_in_flight  the first iteration's peak of microbatches in flight
    budget          this rank's memory budget (None without one)
    grid            this rank's runtime.comm.grid.ProcessGrid
    losses          each iteration's loss (mean over replicas; the metrics row's)
    metrics         rank 0: the metrics rows (runtime.run.metrics.metrics_row); None on other ranks

A resumed job has no first iteration, so only ``losses`` and ``metrics``. With ``Job.collect_grads``
(tests: gradients and parameters are compared with a single-process reference), also::

    grads           iteration 0's gradients after the data-parallel reduction, before the optimizer step
    sharded         the layouts of the TP-sharded parameters among them
    params          the parameters after every optimizer step (replicas must agree)

and when the job names no recorder, an in-memory :class:`runtime.exec.recording.ListRecorder` keeps every
decision and rendezvous, summed up as ``max_decision_in_flight`` (budgets checked from every decision) and
``rendezvous_waits`` ([Note: blocking p2p in the runtime]).

:class:`JobResults` collects them at three points of the job loop, so the loop reads as training.
"""

from __future__ import annotations

from typing import Any

from runtime.exec.recording import ListRecorder, NullRecorder


class JobResults:
    """One job's results on this rank (see the module docstring), collected as the job runs."""

    def __init__(self, collect_grads: bool, modules: dict, budget: int | None, grid) -> None:
        self.collect_grads, self.modules, self.budget, self.grid = collect_grads, modules, budget, grid
        self.collected: dict[str, Any] = {}

    def recorder(self):
        """The recorder of a job that names none: a :class:`ListRecorder` for tests, else one that keeps nothing."""
        return ListRecorder() if self.collect_grads else NullRecorder()

    def iteration_ran(self, iteration: int, result) -> None:
        """After the executor's iteration (and the gradients' reduction), before the optimizer step."""
        if iteration != 0:
            return
        self.collected.update({"executed": [str(t) for t in result.executed], "peak_in_flight": result.peak_in_flight,
                               "budget": self.budget, "grid": self.grid})
        if self.collect_grads:
            from runtime.workloads.tp_layers import local_part, stage_sharded_layouts

            self.collected["grads"] = {f"{stage}.{name}": local_part(p.grad.detach()).cpu().clone()
                                       for stage, m in self.modules.items() for name, p in m.named_parameters()
                                       if p.grad is not None}
            self.collected["sharded"] = stage_sharded_layouts(self.modules)

    def stepped(self) -> None:
        """After the optimizer step (taken or skipped) and ``zero_grad``."""
        if self.collect_grads:  # replicas must hold identical parameters after every step
            from runtime.workloads.tp_layers import local_part

            self.collected.setdefault("params", []).append(
                {f"{stage}.{name}": local_part(p.detach()).cpu().clone() for stage, m in self.modules.items()
                 for name, p in m.named_parameters()})

    def finish(self, recorder, losses: list, metrics: list | None) -> dict[str, Any]:
        """The results dict, once the job's recorder is closed."""
        if isinstance(recorder, ListRecorder):
            self.collected["max_decision_in_flight"] = max((d.in_flight for _, d in recorder.decisions), default=0)
            self.collected["rendezvous_waits"] = len(recorder.waits)  # [Note: blocking p2p in the runtime]
        return {**self.collected, "losses": losses, "metrics": metrics}
