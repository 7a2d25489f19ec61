"""The runtime's injected noise draws through the variability model's own functions, and gives, for a seed,
the very draws (same values, same order, same generator state) that the runtime drew with
``random.Random.lognormvariate`` before the model was written once."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from hints.tasks import Task
from runtime.config import RunConfig
from runtime.run.noise import NOISE_SEED_SALT, NoiseInjector
from runtime.workloads.base import mix_seed


def _config(**knobs):
    """A real run configuration (the injector reads its knobs through ``config.variability``)."""
    return RunConfig(workload="gpt", seed=7, delay={"1B0": 0.3}, **knobs)


class _Reference:
    """The injector as the runtime wrote it before (lognormvariate per task and per message)."""

    def __init__(self, config, rank):
        self.c, self.delays = config, config.delays_by_task()
        self.rng = random.Random(mix_seed(config.seed, 104729, rank))

    def extra(self, iteration, task, elapsed):
        c, factor = self.c, 1.0
        if c.jitter > 0:
            factor *= self.rng.lognormvariate(-c.jitter * c.jitter / 2, c.jitter)
        if c.straggler_prob > 0 and self.rng.random() < c.straggler_prob:
            factor *= c.straggler_slowdown
        return self.delays.get(task, 0.0) + max(0.0, elapsed * (factor - 1.0))

    def latency(self, dst, producer):
        c = self.c
        if c.comm_latency <= 0:
            return 0.0
        if c.comm_jitter > 0:
            return c.comm_latency * self.rng.lognormvariate(-c.comm_jitter ** 2 / 2, c.comm_jitter)
        return c.comm_latency


@pytest.mark.parametrize("knobs", [
    {},
    {"jitter": 0.3},
    {"straggler_prob": 0.2},
    {"jitter": 0.5, "straggler_prob": 0.1, "straggler_slowdown": 3.0},
    {"comm_latency": 0.002},
    {"comm_latency": 0.002, "comm_jitter": 0.4},
    {"jitter": 0.2, "straggler_prob": 0.3, "comm_latency": 0.001, "comm_jitter": 0.6},
])
def test_injected_noise_draws_equal_the_reference(knobs):
    config = _config(**knobs)
    injector = NoiseInjector(config, 3, SimpleNamespace(name="gpt"))
    reference = _Reference(config, 3)
    assert NOISE_SEED_SALT == 104729  # a seed gives the same stream as before
    tasks = [Task.parse(t) for t in ("0F0", "1F0", "1B0", "0B0", "0F1", "1F1", "1B1", "0B1")] * 20
    for step, task in enumerate(tasks):
        elapsed = 0.001 * (1 + step % 5)
        assert injector.extra(step // 8, task, elapsed) == reference.extra(step // 8, task, elapsed)
        assert injector.latency(1, task) == reference.latency(1, task)
    assert injector.rng.getstate() == reference.rng.getstate()


def test_emulated_workload_gets_only_its_delays_and_its_sampled_latencies():
    durations = SimpleNamespace(send_forward=[[0.25, 0.5]], send_backward=[[0.75, 1.0]])
    workload = SimpleNamespace(name="emulated", durations=lambda iteration: durations)
    injector = NoiseInjector(_config(jitter=0.5), 0, workload)
    state = injector.rng.getstate()
    assert injector.extra(2, Task.parse("1B0"), 1.0) == 0.3
    assert injector.iteration == 2
    assert injector.latency(1, Task.parse("0F1")) == 0.5
    assert injector.latency(1, Task.parse("0B0")) == 0.75
    assert injector.rng.getstate() == state  # no draws
