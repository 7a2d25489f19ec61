"""The rule table: the ways of choosing a rank's next task, and how a user's options select one.

Rules (:data:`RULES`, the one table every other module derives from):

``fixed`` (policy ``fixed``)
    Strictly the hint order: only the head of the rank's order may run, and it
    runs when its inputs have arrived. The memory budget is not applied (the
    order itself decides memory); this is the baseline every speedup is
    measured against.
``greedy`` (policy ``ready``, ``--lookahead off``)
    Readiness-first: among the ready tasks, the one with the lowest hint
    position (its place in the rank's hint order). A forward that the memory budget
    cannot take is not ready. Each decision is O(log n) in the ready-set size:
    two binary heaps keyed by hint position, one for admissions and one for
    everything else.
``lookahead`` (policy ``ready``, ``--lookahead on``)
    ``greedy`` plus [Note: lookahead admission] (:mod:`runtime.sched.arbiter`): do not start a task that
    would still be running when the hint's head, already on its way (a forward's input computed upstream, a
    backward's input gradient computed downstream), arrives; a forward still may where memory does not bind,
    and a backward ahead of a backward head.

``--policy auto`` runs the ready rule and falls back to ``fixed`` per iteration ([Note: the auto policy] in
:mod:`runtime.sched.auto`). The CLI's ``--policy fixed|ready|auto`` and ``--lookahead on|off`` select a rule (:func:`rule_for`); tables
print a rule by its :attr:`ArbiterRule.label` (``fixed``, ``ready``, ``ready+la``). Library code names
rules (:func:`as_rule`). ``--p2p`` (how a fixed order's messages meet) is checked against the rule here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from hints.deps import TaskGraph
from hints.errors import UserError
from hints.tasks import Task
from runtime.sched.arbiter import Arbiter, Estimates, FixedArbiter, LookaheadArbiter, ReadyArbiter


class Policy(str, Enum):
    FIXED = "fixed"
    READY = "ready"
    AUTO = "auto"  # ready, falling back to fixed per iteration ([Note: the auto policy] in runtime.sched.auto)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ArbiterRule:
    """One way of choosing: what ``--policy`` and ``--lookahead`` select, and what follows from it."""

    name: str
    policy: Policy
    arbiter: type[Arbiter]
    uses_budget: bool  # the memory budget applies (otherwise the order alone decides memory)
    exact_order: bool  # runs the hint order exactly (so the order must complete on its own)
    lookahead: bool  # needs duration estimates and arrival predictions
    summary: str

    def __str__(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        """How tables name it: ``fixed``, ``ready``, ``ready+la``."""
        return str(self.policy) + ("+la" if self.lookahead else "")


RULES: dict[str, ArbiterRule] = {
    rule.name: rule
    for rule in (
        ArbiterRule("fixed", Policy.FIXED, FixedArbiter, uses_budget=False, exact_order=True, lookahead=False,
                    summary="the hint order exactly"),
        ArbiterRule("greedy", Policy.READY, ReadyArbiter, uses_budget=True, exact_order=False, lookahead=False,
                    summary="the best-ranked ready task within the memory budget"),
        ArbiterRule("lookahead", Policy.READY, LookaheadArbiter, uses_budget=True, exact_order=False,
                    lookahead=True,
                    summary="greedy, but what would delay a head already on its way waits for it"),
    )
}
for _rule in RULES.values():
    _rule.arbiter.rule = _rule
del _rule

# Hints under which the ready policy looks ahead when --lookahead is not given. Measured in
# docs/benchmarks/lookahead.md (forward heads) and readiness-credit.md (both heads, the never-lose grid): on
# for every built-in; off would only matter for a hint that wants a task to overtake the head already on its
# way, and no built-in does (greedy is ahead on a few cases of that grid, by at most 0.5%: cp 1.002x / 0.997x).
LOOKAHEAD_OFF_BY_DEFAULT: frozenset[str] = frozenset()


def rule_for(policy: "Policy | str", lookahead: bool | None = None, hint: str | None = None) -> ArbiterRule:
    """The rule that the user's ``--policy`` and ``--lookahead`` select (the CLI and ``rrfp run``).

    ``lookahead=None`` is the default: on for the ready policy unless ``hint`` is in
    :data:`LOOKAHEAD_OFF_BY_DEFAULT`. Asking for lookahead under the fixed policy is a
    :class:`UserError`. The ``auto`` policy gets the ready rule it runs and replays ([Note: the auto policy]
    in :mod:`runtime.sched.auto`); its callers build the :class:`runtime.sched.auto.AutoPolicy`.
    """
    try:
        policy = Policy(str(policy))
    except ValueError:
        raise UserError(f"{policy!r} is not a policy; choose from {', '.join(p.value for p in Policy)}",
                        "`policy`") from None
    if policy is Policy.FIXED:
        if lookahead is not None:
            raise UserError("applies to `policy` ready only: the fixed policy runs the hint exactly",
                            "`lookahead`")
        return RULES["fixed"]
    if lookahead is None:
        lookahead = hint not in LOOKAHEAD_OFF_BY_DEFAULT
    return RULES["lookahead" if lookahead else "greedy"]  # auto: the ready rule it runs and replays


P2P_MODES = ("async", "blocking")  # --p2p: how a fixed order's messages meet ([Note: blocking p2p] in runtime.sched.fixed_order)


def check_p2p(p2p: str, rule: ArbiterRule) -> str:
    """``--p2p`` for ``rule``: ``async`` (buffered links, every rule) or ``blocking`` (``fixed`` only).

    Blocking point-to-point is Megatron's 1F1B baseline: a rank waits after each task until its peers
    took its messages ([Note: blocking p2p] in :mod:`runtime.sched.fixed_order`). A readiness-first rule runs
    whatever has arrived, so a receive posted before a chosen task means nothing to it: refused.
    """
    if p2p not in P2P_MODES:
        raise UserError(f"{p2p!r} is not one of {', '.join(P2P_MODES)}", "`p2p`")
    if p2p == "blocking" and not rule.exact_order:
        raise UserError(f"blocking applies to `policy` fixed only (this is {rule.policy}): readiness-first runs "
                        f"whatever message has arrived, so it cannot post its receives in a fixed order", "`p2p`")
    return p2p


def as_rule(rule: "ArbiterRule | Policy | str") -> ArbiterRule:
    """A rule, or its name (``fixed``, ``greedy``, ``lookahead``); the bare policy ``ready`` means ``greedy``.

    This is the library's reading, used by :func:`make_arbiter` and the simulator: explicit and
    independent of hints. Users' ``--policy``/``--lookahead`` go through :func:`rule_for`.
    """
    if isinstance(rule, ArbiterRule):
        return rule
    name = "greedy" if str(rule) == Policy.READY.value else str(rule)
    if name not in RULES:
        raise UserError(f"{rule!r} is not a rule; choose from {', '.join(RULES)} (or the policy 'ready')", "policy")
    return RULES[name]


def make_arbiter(
    rule: "ArbiterRule | Policy | str",
    graph: TaskGraph,
    rank: int,
    order: Sequence[Task],
    budget: int | None = None,
    record: bool = False,
    positions: list[int] | None = None,
    estimates: Estimates | None = None,
    safe: bool = False,
    numbers: Sequence[int] | None = None,
) -> Arbiter:
    """Build the arbiter of ``rule`` (see :func:`as_rule`) for ``rank``.

    ``budget`` is that rank's slot count. ``positions`` (task id -> hint position) may be one list shared
    by the arbiters of all ranks of one process (the simulator); each arbiter fills in its own tasks, with
    position numbers taken from ``numbers`` (``0, 1, ...``; shared too: see :class:`Arbiter`).
    ``estimates`` (task id -> expected seconds) is needed by the lookahead rule. ``safe``: the hint
    completes in fixed order within every rank's budget, so admission uses [Note: safe-state admission]
    (:func:`runtime.sched.fixed_order.completes_within` decides; the same for every rank).
    """
    return as_rule(rule).arbiter(graph, rank, order, budget=budget, record=record, positions=positions,
                                 estimates=estimates, safe=safe, numbers=numbers)
