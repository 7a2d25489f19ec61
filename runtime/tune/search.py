"""The hint search behind ``rrfp tune-hint``: a portfolio, racing, and local search on the arbiter's own choices.

The search is deterministic for a seed and a ``jobs`` count: its effort is a
number of scenario simulations (``SearchConfig.work``), not a time, and
every random choice comes from one seeded generator in the parent process.
Candidates are scored by :class:`runtime.tune.evaluator.Evaluator` on the tuning
scenarios only; the held-out ones are for the verdict
(:mod:`runtime.tune.evaluator`, [Note: never worse]).

1. **Portfolio** (:func:`portfolio`). Every built-in under every rule the
   run may use; the 1F1B family with other warm-up depths and ``W``
   deferrals (:func:`hints.orders.one_f_one_b_family`); list-scheduling
   priorities computed on the mean of the tuning scenarios' expectations
   (longest remaining path, most remaining work, longest task first); and
   *cost classes*: the index orders read as cost-ranked slots, heaviest or
   lightest first ([Note: cost-ranked hints]). Fixed-order 1F1B is always a
   candidate: it is the baseline every verdict compares with.
2. **Racing**: every candidate is first scored on a few scenarios; only the
   best quarter is scored on all of them (and always fixed 1F1B, the traced
   hint and the best built-in, which the verdict compares with).
3. **Local search** (:func:`local_search`) from the best few static
   candidates, by late-acceptance hill climbing (Burke and Bykov 2017):
   swap or insert two tasks of one rank's order. Only pairs of tasks that
   were *ready together* at some decision of the arbiter are moved, because
   exchanging two tasks that never compete for a rank does not change what
   the arbiter does. Each move is raced too.

Stops when the work budget is spent or on ``KeyboardInterrupt`` (Ctrl-C: the
best found so far is kept, ``stopped`` says so).

[Note: one order every step]
    ``rrfp tune-hint --target torch`` tunes for a runtime that runs one CSV in
    exactly its order, every step (torch's ``_PipelineScheduleRuntime``). A
    candidate rebuilt from each scenario's costs (``bfw``, ``cp``, the sorted
    1F1Bs) or re-ranked by them (cost classes) would be scored on knowledge
    that runtime never has, so :func:`as_static` fixes every candidate to the
    index order it is for the mean expectation of the tuning scenarios (equal
    per-microbatch costs, as a recorded or sampled iteration's microbatch
    index says nothing of its contents), under the ``fixed`` rule, and drops
    the copies this makes. Each is then scored on every scenario as the one
    order torch would run.
"""

from __future__ import annotations

import math
import multiprocessing
import random
import signal
from dataclasses import dataclass, field
from typing import Callable, Sequence

from hints.errors import HintError
from hints.orders import (
    BUILTIN_HINTS,
    HintOrder,
    applicable_builtins,
    as_cost_ranked,
    baseline_hint_name,
    by_priority,
    one_f_one_b_family,
    resolve_cost_ranked,
)
from hints.priorities import list_priorities
from hints.tasks import LOOPING, PipelineShape, Task
from hints.validate import validate_orders
from runtime.durations.variability import Durations
from runtime.sched.baselines import SORTED_1F1B, sorted_baselines
from runtime.sched.evaluate import resolve
from runtime.sched.split_choice import choose_split
from runtime.tune.evaluator import Candidate, Evaluator, Objective


@dataclass(frozen=True)
class SearchConfig:
    objective: Objective
    rules: tuple[str, ...]  # the rules candidates run under (greedy/lookahead, or fixed)
    work: int  # scenario simulations to spend
    seed: int = 0
    jobs: int = 1
    race_first: int = 6  # scenarios a newcomer is scored on before the rest
    local_starts: int = 3
    history: int = 30  # late acceptance: compare with the value this many steps ago


@dataclass
class Scored:
    candidate: Candidate
    makespans: list[float]  # on every tuning scenario
    value: float  # the objective over them


@dataclass
class SearchResult:
    scored: list[Scored]  # every fully scored candidate, best first
    simulations: int
    stopped: str  # "work budget" or "interrupted"
    trace: list[tuple[int, float]] = field(default_factory=list)  # (simulations, best value so far)
    interrupt: KeyboardInterrupt | None = None  # what stopped it (Ctrl-C or SIGTERM), to re-raise once saved

    @property
    def best(self) -> Scored:
        return self.scored[0]

    def best_of(self, family: str) -> Scored | None:
        return next((s for s in self.scored if s.candidate.family == family), None)

    @property
    def best_fixed(self) -> Scored | None:
        """The fastest fixed order within the budget ([Note: fixed candidates and the budget])."""
        return next((s for s in self.scored if s.candidate.rule == "fixed" and not math.isinf(s.value)), None)


# -- the portfolio --------------------------------------------------------------


def portfolio(shape: PipelineShape, rules: Sequence[str], mean: Durations, cost_model=None,
              slots: Sequence[int] | None = None, budget: str = "1f1b") -> list[Candidate]:
    """Every starting candidate (see the module docstring), in a fixed order; ``slots`` (per rank, the budget
    ``budget`` gives) adds the sorted 1F1Bs whose warm-ups fill it."""
    p, v, m, placement = shape.ranks, shape.chunks, shape.microbatches, shape.placement
    candidates: list[Candidate] = []

    def add(name: str, family: str, hint: HintOrder | None = None, builtin: str | None = None) -> None:
        for rule in rules:
            candidates.append(Candidate(name, family, rule, hint, builtin))

    # The built-ins in index order (bfw and cp are built per scenario, from its costs): resolved once, for
    # the built-in family here and the cost classes below.
    builtins = [*applicable_builtins(p, v, m, placement=placement), "cp"]
    slots_heavy_first = [float(m - i) for i in range(m)]  # slot k already is microbatch k: ranks stay as written
    index_orders = {n: resolve(n, p, v, m, placement=placement) for n in builtins
                    if not (BUILTIN_HINTS[n].takes_costs or BUILTIN_HINTS[n].takes_priorities)}
    for name in builtins:
        add(name, "built-in", index_orders.get(name), None if name in index_orders else name)
    baseline = baseline_hint_name(v, placement)
    if "fixed" not in rules:
        candidates.append(Candidate(baseline, "baseline", "fixed", resolve(baseline, p, v, m, placement=placement)))
        for name in SORTED_1F1B:  # the best fixed orders a user could run from the same costs
            if name in builtins:
                candidates.append(Candidate(name, "sorted 1F1B", "fixed", builtin=name))
    if slots is not None:
        # A cost-ranked order: slot k is the k-th heaviest, so index costs m..1 make the sorted order its slots
        for name, hint in sorted_baselines(shape.with_split(False), slots_heavy_first, slots, budget).items():
            ranked = as_cost_ranked(hint, slots_heavy_first, name, cost_model)
            candidates.append(Candidate(name, "sorted 1F1B", "fixed", ranked))

    if placement == LOOPING:  # the 1F1B family places stages looping (zbv is V's counterpart, a built-in)
        for offset in (-2, -1, 1, 2, 4):
            add(f"1f1b-family warmup {offset:+d}", "parametric", one_f_one_b_family(p, v, m, offset))
        lags: dict[str, Callable[[int], int]] = {"0": lambda r: 0, "r": lambda r: r, "2r": lambda r: 2 * r,
                                                  "end": lambda r: v * m}
        for offset in (-1, 0, 1, 2):
            for label, lag in lags.items():
                if offset == 0 and label == "r":
                    continue  # that is zb
                add(f"zb-family warmup {offset:+d}, W lag {label}", "parametric",
                    one_f_one_b_family(p, v, m, offset, lag))

    for name, priority in list_priorities(shape, mean).items():
        hint = by_priority(p, v, m, priority, placement)
        add(name, "priority", HintOrder(shape.with_split(True), tuple(map(tuple, hint)), name,
                                        {"generator": name}))
    # The same rules on the stages where a split pays ([Note: which stages split] in runtime.sched.split_choice)
    chosen = choose_split(shape, mean)
    if chosen.fused_stages:
        for name, priority in list_priorities(chosen, mean).items():
            hint = by_priority(p, v, m, priority, placement)
            label = f"{name}, split at stages {chosen.split_stages_text()}"
            add(label, "priority", HintOrder(chosen, tuple(map(tuple, hint)), label, {"generator": name}))

    for name, hint in index_orders.items():
        heavy = as_cost_ranked(hint, slots_heavy_first, f"{name} heaviest first", cost_model)
        light = as_cost_ranked(hint, slots_heavy_first[::-1], f"{name} lightest first", cost_model)
        add(heavy.name, "cost classes", heavy)
        add(light.name, "cost classes", light)
    return candidates


def as_static(candidates: Sequence[Candidate], shape: PipelineShape, mean: Durations) -> list[Candidate]:
    """Every candidate as one index order under the fixed rule ([Note: one order every step]), without copies
    (the built-ins, the baseline and the traced hint are kept whatever they equal: the verdict compares with
    them by name)."""
    static: list[Candidate] = []
    seen: set = set()
    for candidate in candidates:
        hint = candidate.hint
        if candidate.builtin is not None:
            hint = resolve(candidate.builtin, shape.ranks, shape.chunks, shape.microbatches, mean, shape.placement)
        elif hint is not None and hint.cost_ranked:
            hint = resolve_cost_ranked(hint, mean.microbatch_costs)
        key = (hint.shape, hint.orders)
        if key in seen and candidate.family not in ("built-in", "baseline", "traced"):
            continue
        seen.add(key)
        static.append(Candidate(candidate.name, candidate.family, "fixed", hint, None, dict(candidate.notes)))
    return static


# -- moves -----------------------------------------------------------------------


def ready_pairs(evaluator: Evaluator, candidate: Candidate, indices: Sequence[int]) -> list[tuple[int, Task, Task]]:
    """``(rank, a, b)``: tasks of ``candidate``'s own numbering that were ready together at a decision."""
    pairs: set[tuple[int, Task, Task]] = set()
    for index in indices:
        try:
            result = evaluator.simulate(candidate, "tuning", index, record=True)
        except Exception:  # a deadlocking order has nothing to learn from
            continue
        to_slot = None
        if candidate.hint is not None and candidate.hint.cost_ranked:
            resolved = evaluator.hint_for(candidate, "tuning", index)
            to_slot = {mb: slot for slot, mb in enumerate(resolved.provenance["slot_to_microbatch"])}
        for decision in result.decisions:
            ready = [task for task, _ in decision.ready]
            if len(ready) < 2:
                continue
            chosen = decision.chosen
            for other in ready:
                if other != chosen:
                    a, b = (chosen, other) if chosen < other else (other, chosen)
                    if to_slot is not None:
                        a, b = Task(a.stage, a.kind, to_slot[a.microbatch]), Task(b.stage, b.kind, to_slot[b.microbatch])
                    pairs.add((decision.rank, a, b))
    return sorted(pairs)


def apply_move(hint: HintOrder, move: tuple[str, int, Task, Task], name: str) -> HintOrder | None:
    """``hint`` with ``move`` (``swap`` or ``insert`` a before b) applied on one rank; None if invalid."""
    kind, rank, a, b = move
    order = list(hint.orders[rank])
    try:
        i, j = order.index(a), order.index(b)
    except ValueError:
        return None
    if kind == "swap":
        order[i], order[j] = order[j], order[i]
    else:  # move a to just before b (or just after, when a comes first)
        task = order.pop(i)
        order.insert(order.index(b) + (1 if i < j else 0), task)
    orders = list(hint.orders)
    orders[rank] = tuple(order)
    try:
        validate_orders(hint.shape, orders, "move")  # a forward must stay before its backward, I before W
    except HintError:
        return None
    return HintOrder(hint.shape, tuple(orders), name, {**hint.provenance, "tuned": True}, hint.microbatches,
                     hint.cost_model)


# -- running the search -------------------------------------------------------------

_EVALUATOR: Evaluator | None = None  # the forked workers' copy (set in the parent before forking)


def _worker_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _score(job: tuple[Candidate, str, tuple[int, ...]]) -> list[float]:
    candidate, which, indices = job
    return _EVALUATOR.makespans(candidate, which, indices)


class Search:
    """One search run: owns the evaluator, the optional process pool and the work accounting."""

    def __init__(self, evaluator: Evaluator, config: SearchConfig,
                 progress: Callable[[int, float, str], None] | None = None) -> None:
        self.evaluator, self.config = evaluator, config
        self.progress = progress or (lambda spent, best, note: None)
        self.rng = random.Random(f"{config.seed}:search")
        self.spent = 0
        self.best_value = math.inf
        self.trace: list[tuple[int, float]] = []
        self._pool = None

    # -- scoring ---------------------------------------------------------------
    def _map(self, jobs: list[tuple[Candidate, str, tuple[int, ...]]]) -> list[list[float]]:
        self.spent += sum(len(indices) for _, _, indices in jobs)
        if self._pool is None:
            return [self.evaluator.makespans(c, w, i) for c, w, i in jobs]
        return self._pool.map(_score, jobs, chunksize=1)

    def score_all(self, candidates: Sequence[Candidate]) -> list[Scored]:
        """Race ``candidates``: a few scenarios each, then every scenario for the best quarter."""
        n = len(self.evaluator.sets["tuning"])
        first = tuple(range(min(self.config.race_first, n)))
        rest = tuple(range(len(first), n))
        objective = self.config.objective
        early = self._map([(c, "tuning", first) for c in candidates])
        ranked = sorted(range(len(candidates)), key=lambda k: (objective(early[k]), k))
        keep = ranked[:max(4, math.ceil(len(ranked) / 4))] if rest else ranked
        # The references every verdict and report compares with are always scored in full.
        best_builtin = next((k for k in ranked if candidates[k].family == "built-in"), None)
        best_sorted = next((k for k in ranked if candidates[k].family == "sorted 1F1B"), None)
        shape = self.evaluator.shape
        baseline = baseline_hint_name(shape.chunks, shape.placement)
        for k in ranked:
            reference = candidates[k].family in ("baseline", "traced") or (
                candidates[k].rule == "fixed" and candidates[k].name == baseline)
            if k not in keep and (k in (best_builtin, best_sorted) or reference):
                keep.append(k)
        late = self._map([(candidates[k], "tuning", rest) for k in keep]) if rest else [[] for _ in keep]
        scored = [Scored(candidates[k], early[k] + more, self._value(candidates[k], early[k] + more))
                  for k, more in zip(keep, late)]
        scored.sort(key=lambda s: s.value)
        self._improved(scored[0].value, "portfolio")
        return scored

    def _value(self, candidate: Candidate, makespans: list[float]) -> float:
        """The objective, or inf for a fixed order over the budget ([Note: fixed candidates and the budget])."""
        if candidate.family != "baseline" and not self.evaluator.fits(candidate):
            return math.inf
        return self.config.objective(makespans)

    def _improved(self, value: float, note: str) -> None:
        if value < self.best_value:
            self.best_value = value
        self.trace.append((self.spent, self.best_value))
        self.progress(self.spent, self.best_value, note)

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.config.work

    # -- local search -------------------------------------------------------------
    def local_search(self, start: Scored) -> list[Scored]:
        """Late-acceptance hill climbing from ``start``; every fully scored improvement is returned."""
        evaluator, objective, config = self.evaluator, self.config.objective, self.config
        n = len(evaluator.sets["tuning"])
        first = tuple(range(min(config.race_first, n)))
        rest = tuple(range(len(first), n))
        current = best = start
        found: list[Scored] = []
        history = [start.value] * config.history
        self.spent += min(3, n)
        pairs = ready_pairs(evaluator, start.candidate, range(min(3, n)))
        step = idle = 0
        while pairs and not self.exhausted and idle < 200:  # 200 proposals in a row all invalid: give up
            batch = []
            for _ in range(max(1, config.jobs)):
                rank, a, b = pairs[self.rng.randrange(len(pairs))]
                kind = "swap" if self.rng.random() < 0.5 else "insert"
                a, b = (a, b) if self.rng.random() < 0.5 else (b, a)
                hint = apply_move(current.candidate.hint, (kind, rank, a, b),
                                  f"{start.candidate.name} + local search")
                if hint is not None:
                    batch.append(Candidate(hint.name, "local search", current.candidate.rule, hint,
                                           notes={"from": start.candidate.label, "step": step}))
            step += 1
            idle = 0 if batch else idle + 1
            if not batch:
                continue
            early = self._map([(c, "tuning", first) for c in batch])
            bound = objective(current.makespans[:len(first)]) * 1.02  # racing: clearly worse on the first ones
            promising = [k for k in range(len(batch)) if objective(early[k]) <= bound]
            if not promising:
                continue
            late = self._map([(batch[k], "tuning", rest) for k in promising]) if rest else [[] for _ in promising]
            trial = min((Scored(batch[k], early[k] + more, self._value(batch[k], early[k] + more))
                         for k, more in zip(promising, late)), key=lambda s: s.value)
            slot = step % config.history
            if trial.value <= current.value or trial.value <= history[slot]:
                if trial.value < current.value:
                    pairs = ready_pairs(evaluator, trial.candidate, range(min(3, n))) or pairs
                    self.spent += min(3, n)
                current = trial
                if trial.value < best.value:
                    best = trial
                    found.append(trial)
                    self._improved(trial.value, "local search")
            history[slot] = current.value
        return found

    # -- the whole search ------------------------------------------------------------
    def run(self, candidates: Sequence[Candidate]) -> SearchResult:
        global _EVALUATOR
        stopped, interrupt = "work budget", None
        scored: list[Scored] = []
        try:
            if self.config.jobs > 1:
                self.evaluator.prepare()
                _EVALUATOR = self.evaluator
                self._pool = multiprocessing.get_context("fork").Pool(self.config.jobs, initializer=_worker_init)
            scored = self.score_all(candidates)
            starts = [s for s in scored if s.candidate.hint is not None][:self.config.local_starts]
            while not self.exhausted and starts:
                for start in starts:
                    if self.exhausted:
                        break
                    scored += self.local_search(start)
                    scored.sort(key=lambda s: s.value)
                starts = [s for s in scored if s.candidate.family == "local search"][:1]
        except KeyboardInterrupt as err:
            stopped, interrupt = "interrupted", err
        finally:
            if self._pool is not None:
                self._pool.terminate()
                self._pool.join()
                self._pool = None
            _EVALUATOR = None
        scored.sort(key=lambda s: s.value)
        return SearchResult(scored, self.spent, stopped, self.trace, interrupt)


__all__ = ["Scored", "Search", "SearchConfig", "SearchResult", "apply_move", "as_static", "portfolio", "ready_pairs"]
