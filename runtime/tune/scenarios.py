"""Scenarios: the duration tables a hint is tuned and judged on.

A *scenario* is one iteration's worth of task durations and message
latencies (a :class:`runtime.durations.variability.Durations` table) together with what
could have been known of it before it ran, its *expectation* ([Note:
expected durations]): hints that need costs (``bfw``, ``cp``, cost-ranked
hints) and the lookahead rule see only the expectation, never the table.

Where scenarios come from (:class:`ScenarioSet`):

* recorded iterations (``rrfp trace export --durations``, or the trace
  itself), each with the per-microbatch expectation the caller predicts;
* a workload model, one seed per scenario.

[Note: scenario bootstrap]
    A handful of traced iterations is too few to judge a hint on, so new
    scenarios are drawn from the recorded ones by resampling. A scenario
    resamples *whole microbatches*: microbatch ``j`` of the new scenario is
    microbatch ``i`` of recorded iteration ``t``, with its F/B/I/W on every
    stage and its expectation, which keeps the correlation between stages
    (a heavy multimodal sample is heavy on every stage). Message latencies
    are resampled separately, per link direction and stage, from all the
    recorded latencies of that stage: they depend on the link, not on the
    microbatch. Every candidate hint is scored on the same scenarios (common
    random numbers), so differences between candidates are not noise of the
    draw.

The held-out scenarios are drawn only from the last ``holdout`` fraction of
the recorded iterations (or from seeds never used for tuning), so a hint
tuned on the others is judged on iterations it has not seen.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Sequence

from hints.errors import UserError
from hints.tasks import PipelineShape
from runtime.durations.variability import Durations, VariabilityModel, sample_durations


@dataclass
class Scenario:
    """One iteration to simulate: its durations and latencies, and what was known of it beforehand."""

    name: str
    table: Durations
    expected: Durations


@dataclass
class ScenarioSet:
    """Tuning and held-out scenarios of one shape, and where they came from."""

    shape: PipelineShape
    tuning: list[Scenario]
    holdout: list[Scenario]
    source: str
    recorded: list[int] = field(default_factory=list)  # recorded iterations used for tuning
    recorded_holdout: list[int] = field(default_factory=list)  # and for the held-out scenarios

    def describe(self) -> str:
        return (f"{len(self.tuning)} tuning and {len(self.holdout)} held-out scenarios from {self.source}")


def from_model(model: VariabilityModel, shape: PipelineShape, tuning: int, holdout: int, seed: int) -> ScenarioSet:
    """``tuning`` + ``holdout`` tables sampled from ``model``, with seeds that never overlap."""
    if tuning < 1 or holdout < 1:
        raise UserError("needs at least one tuning and one held-out scenario", "scenarios")
    base = 1_000_003 * (seed + 1)  # far from the seeds a user passes to rrfp simulate by hand

    def scenario(k: int) -> Scenario:
        table = sample_durations(model, shape, base + k)
        return Scenario(f"{model.workload} seed {base + k}", table, table.expected())

    return ScenarioSet(shape, [scenario(k) for k in range(tuning)],
                       [scenario(tuning + k) for k in range(holdout)],
                       f"the {model.workload} model (seed {seed})")


def from_recorded(shape: PipelineShape, recorded: Sequence[tuple[int, Durations, Durations]], holdout: float,
                  tuning_scenarios: int, holdout_scenarios: int, seed: int, source: str) -> ScenarioSet:
    """Scenarios bootstrapped from recorded iterations ``(iteration, table, expectation)`` ([Note: scenario
    bootstrap]); the last ``holdout`` fraction of the iterations (at least one) feeds the held-out ones.

    With a single recorded iteration both sets draw from it (the report says so).
    """
    if not recorded:
        raise UserError("no recorded iteration to tune on", source)
    if not 0.0 < holdout < 1.0:
        raise UserError(f"must be between 0 and 1 (exclusive), got {holdout}", "`holdout`")
    ordered = sorted(recorded, key=lambda r: r[0])
    cut = len(ordered) - max(1, math.floor(len(ordered) * holdout + 0.5)) if len(ordered) > 1 else 1
    tune_pool, hold_pool = ordered[:cut], ordered[cut:] or ordered[:cut]
    rng = random.Random(f"{seed}:scenarios")
    tuning = [Scenario(f"bootstrap {k} of iterations {_span(tune_pool)}",
                       *bootstrap(shape, [(t, e) for _, t, e in tune_pool], rng)) for k in range(tuning_scenarios)]
    held = [Scenario(f"bootstrap {k} of iterations {_span(hold_pool)}",
                     *bootstrap(shape, [(t, e) for _, t, e in hold_pool], rng)) for k in range(holdout_scenarios)]
    return ScenarioSet(shape, tuning, held, source, [i for i, _, _ in tune_pool], [i for i, _, _ in hold_pool])


def bootstrap(shape: PipelineShape, pool: Sequence[tuple[Durations, Durations]], rng: random.Random
              ) -> tuple[Durations, Durations]:
    """One resampled ``(table, expectation)`` from ``pool`` ([Note: scenario bootstrap])."""
    stages, m = shape.stages, shape.microbatches
    picks = [(rng.randrange(len(pool)), rng.randrange(m)) for _ in range(m)]

    def resample(which: int) -> Durations:
        source = lambda entry: entry[which]  # noqa: E731 - the table or its expectation
        split = pool[0][which].input_grad is not None
        return Durations(
            stages, m,
            [[source(pool[t]).forward[k][i] for t, i in picks] for k in range(stages)],
            [[source(pool[t]).backward[k][i] for t, i in picks] for k in range(stages)],
            [[0.0] * m for _ in range(stages)], [[0.0] * m for _ in range(stages)],
            [source(pool[t]).microbatch_costs[i] for t, i in picks],
            input_grad=[[source(pool[t]).input_grad[k][i] for t, i in picks] for k in range(stages)]
            if split else None,
            weight_grad=[[source(pool[t]).weight_grad[k][i] for t, i in picks] for k in range(stages)]
            if split else None,
            source="bootstrap", split_overhead=pool[0][which].split_overhead,
        )

    table, expected = resample(0), resample(1)
    features = [entry[0].microbatch_features() for entry in pool]
    if all(f is not None for f in features):  # what each picked microbatch held goes with it
        table.features = expected.features = [features[t][i] for t, i in picks]
    # Latencies: per stage and direction, drawn from every recorded message of that stage.
    for k in range(stages):
        forward_pool = [t.send_forward[k][i] for t, _ in pool for i in range(m)]
        backward_pool = [t.send_backward[k][i] for t, _ in pool for i in range(m)]
        table.send_forward[k] = [rng.choice(forward_pool) for _ in range(m)]
        table.send_backward[k] = [rng.choice(backward_pool) for _ in range(m)]
        expected.send_forward[k] = [sum(forward_pool) / len(forward_pool)] * m
        expected.send_backward[k] = [sum(backward_pool) / len(backward_pool)] * m
    table.expectation = expected
    return table, expected


def _span(pool) -> str:
    iterations = [i for i, _, _ in pool]
    return f"{iterations[0]}..{iterations[-1]}" if len(iterations) > 1 else str(iterations[0])


__all__ = ["Scenario", "ScenarioSet", "bootstrap", "from_model", "from_recorded"]
