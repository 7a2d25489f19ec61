"""From a run configuration to the hint each iteration follows, checked before any rank starts.

:func:`validate_run` is what the launcher calls first: it resolves the hint
for the run's shape, checks the memory budget, and for the fixed policy
checks that the hint completes in exactly its order, so bad input fails with
one clear error instead of a hang across processes.

``bfw`` ranks microbatches by estimated cost, which changes every iteration
(new sequence lengths, new image counts): :class:`HintPlan` rebuilds it per
iteration from that iteration's estimates; every other hint is built once.
"""

from __future__ import annotations

from hints.hintfile import resolve_hint
from hints.orders import HintOrder, baseline_hint_name
from hints.tasks import PipelineShape
from runtime.arbiter import MemoryBudget
from runtime.variability import stage_cost


def hint_spec(config) -> str:
    return config.hint or baseline_hint_name(config.chunks)


def microbatch_costs(config, workload, iteration: int) -> list[float]:
    """Estimated relative cost of each microbatch in ``iteration`` (summed over stages)."""
    durations = workload.durations(iteration)
    if durations is not None:
        return list(durations.microbatch_costs)
    model = workload.variability()
    stages = workload.shape.stages
    return [sum(stage_cost(model, spec, k, stages) for k in range(stages)) for spec in workload._specs(iteration)]


class HintPlan:
    """The hint of each iteration of one job."""

    def __init__(self, config, workload) -> None:
        self.config, self.workload = config, workload
        self.spec = hint_spec(config)
        self._static: HintOrder | None = None

    def for_iteration(self, iteration: int) -> HintOrder:
        c = self.config
        if self.spec == "bfw":
            costs = microbatch_costs(c, self.workload, iteration)
            return resolve_hint("bfw", c.stages, c.chunks, c.microbatches, costs)
        if self._static is None:
            self._static = resolve_hint(self.spec, c.stages, c.chunks, c.microbatches)
        return self._static


def validate_run(config) -> HintOrder:
    """Resolve and check the job's hint and budget; raises ``UserError`` before anything starts."""
    hint = resolve_hint(hint_spec(config), config.stages, config.chunks, config.microbatches)
    shape = hint.shape
    if (shape.ranks, shape.chunks, shape.microbatches) != (config.stages, config.chunks, config.microbatches):
        from hints.errors import HintError

        raise HintError(f"the hint is for {shape.describe()} but the run has {config.stages} stages x "
                        f"{config.chunks} chunks, {config.microbatches} microbatches", "--hint")
    if config.policy == "ready":
        MemoryBudget.parse(config.memory_budget).per_rank(shape)
    else:
        from runtime.simulator import check_completes

        check_completes(hint)
    return hint


def run_shape(config) -> PipelineShape:
    return PipelineShape(config.stages, config.chunks, config.microbatches)
