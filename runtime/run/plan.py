"""From a run configuration to the hint each iteration follows, checked before any rank starts.

:func:`validate_run` is what the launcher calls first: it resolves the hint
for the run's shape, checks the memory budget, and for the fixed policy
checks that the hint completes in exactly its order (with ``--p2p blocking``,
under that rule too), so bad input fails with
one clear error instead of a hang across processes.

``bfw``, ``cp`` and ``planned`` are built from expected costs, which change every
iteration (new sequence lengths, new image counts): :class:`HintPlan`
rebuilds them per iteration from what the workload knows before the
iteration starts (``Workload.expected``); every other hint is built once.
Which stages ``cp`` splits ([Note: which stages split] in
:mod:`runtime.sched.split_choice`), and which order the planned one is planned
from ([Note: planned orders] in :mod:`runtime.sched.baselines`), is chosen on
the first iteration and kept: the ranks' task graphs and handlers are built
once, for one shape.
"""

from __future__ import annotations

from hints.errors import UserError, input_name
from hints.orders import BUILTIN_HINTS, HintOrder
from hints.tasks import PipelineShape
from runtime.config import hint_spec, run_shape
from runtime.sched.baselines import PLANNED
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import concrete, resolve


def _per_iteration(spec: str) -> bool:
    if spec == PLANNED:
        return True
    builtin = BUILTIN_HINTS.get(spec)
    return builtin is not None and (builtin.takes_costs or builtin.takes_priorities)


class HintPlan:
    """The hint of each iteration of one job."""

    def __init__(self, config, workload, split: PipelineShape | None = None) -> None:
        """``split``: the shape whose split stages ``cp`` keeps (default: its choice on the first iteration)."""
        self.config, self.workload = config, workload
        self.spec = hint_spec(config)
        self._static: HintOrder | None = None
        self._split = split  # cp's split stages, once chosen

    def for_iteration(self, iteration: int) -> HintOrder:
        c = self.config
        if _per_iteration(self.spec):
            hint = resolve(self.spec, c.ranks, c.chunks, c.microbatches, self.workload.expected(iteration),
                           c.placement, split=self._split, budget=MemoryBudget.parse(c.memory_budget))
            self._split = hint.shape
            return hint
        if self._static is None:
            self._static = resolve(self.spec, c.ranks, c.chunks, c.microbatches, placement=c.placement)
        if self._static.cost_ranked:  # [Note: cost-ranked hints]: slots -> this iteration's microbatches
            return concrete(self._static, self.workload.expected(iteration))
        return self._static


def validate_run(config) -> HintOrder:
    """Resolve and check the job's hint and budget; raises ``UserError`` before anything starts."""
    # bfw and cp are checked as built without costs: their shape and validity do not depend on them.
    hint = resolve(hint_spec(config), config.ranks, config.chunks, config.microbatches,
                   placement=config.placement, budget=MemoryBudget.parse(config.memory_budget))
    shape = hint.shape
    run = run_shape(config)
    if (shape.ranks, shape.chunks, shape.microbatches, shape.placement) != \
            (run.ranks, run.chunks, run.microbatches, run.placement):
        from hints.errors import HintError

        raise HintError(f"the hint is for {shape.describe()} but the run has {run.describe()}", "`hint`")
    _check_task_flags(config, shape)
    rule = config.rule()
    if rule.uses_budget:
        MemoryBudget.parse(config.memory_budget).per_rank(shape)
    if rule.exact_order:
        from runtime.sched.simulator import check_completes

        check_completes(hint, config.p2p)  # [Note: blocking p2p] (runtime.sched.fixed_order): a deadlock is refused here too
    return hint


def _check_task_flags(config, shape: PipelineShape) -> None:
    """``--fail-at``, ``--hang-at`` and ``--delay`` name tasks of this job (else they would silently never fire)."""
    faults = [(name, config.fault(name)) for name in ("fail_at", "hang_at")]
    named = [(name, fault[0]) for name, fault in faults if fault]
    named += [("delay", task) for task in config.delays_by_task()]
    for name, task in named:
        if not shape.contains(task):
            raise UserError(f"{task} is not a task of this run ({shape.describe()})", input_name(name))
