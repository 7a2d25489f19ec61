"""Variability injected into a run: a sleep after each task's compute, and a latency per message.

The noise model is :mod:`runtime.durations.variability`'s (mean-one lognormal
jitter, stragglers, transfer latency with lognormal jitter), drawn here through
its own functions (:func:`~runtime.durations.variability.task_noise`,
:func:`~runtime.durations.variability.transfer_latencies`) from one
``random.Random`` per rank, seeded from ``(--seed, rank)``: a seed gives the
same draws, in the order the rank runs its tasks and sends its messages. A
checkpoint saves that generator's state (``"noise"``, :mod:`runtime.run.checkpoint`).

* Real workloads (``gpt``, ``multimodal``, a user's model): after a task's
  compute, sleep ``elapsed x (noise - 1)`` plus its ``--delay``; each message
  waits a sampled latency on its link's thread.
* The emulated workload's sampled durations already contain jitter and
  stragglers, so there only ``--delay`` is added; its transfers take the
  latencies it sampled for the iteration running.

The worker installs :meth:`NoiseInjector.extra` as a handler wrapper
(:func:`runtime.exec.handlers.delay_after`) and :meth:`NoiseInjector.latency`
as the transport's latency.
"""

from __future__ import annotations

import random

from hints.tasks import Task
from runtime.durations.variability import task_noise, transfer_latencies
from runtime.workloads.base import mix_seed

NOISE_SEED_SALT = 104729  # the injected-noise stream of a rank: mix_seed(seed, NOISE_SEED_SALT, rank)


class NoiseInjector:
    """One rank's injected noise (see the module docstring)."""

    def __init__(self, config, rank: int, workload) -> None:
        self.config, self.workload = config, workload
        self.delays = config.delays_by_task()
        self.rng = random.Random(mix_seed(config.seed, NOISE_SEED_SALT, rank))
        self.emulated = workload.name == "emulated"
        self.iteration = 0  # of the last task run: the emulated workload's latencies are the iteration's

    def extra(self, iteration: int, task: Task, elapsed: float) -> float:
        """Seconds to sleep after ``task``, whose compute took ``elapsed`` seconds."""
        self.iteration = iteration
        extra = self.delays.get(task, 0.0)
        if self.emulated:
            return extra
        model = self.config.variability
        factor = task_noise([1.0], self.rng.random, model.jitter, model.straggler_prob, model.straggler_slowdown)[0]
        return extra + max(0.0, elapsed * (factor - 1.0))

    def latency(self, dst: int, producer: Task) -> float:
        """Seconds the message of ``producer`` to rank ``dst`` waits before it is sent."""
        if self.emulated:
            table = self.workload.durations(self.iteration)
            sends = table.send_forward if producer.kind.value == "F" else table.send_backward
            return sends[producer.stage][producer.microbatch]
        model = self.config.variability
        return transfer_latencies(1, self.rng.random, model.comm_latency, model.comm_jitter)[0]
