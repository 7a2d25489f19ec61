"""The hint search behind ``rrfp tune-hint``: a portfolio, racing, and local search on the arbiter's own choices.

Every random choice comes from one seeded generator in the parent process,
so for a seed and a ``jobs`` count the search is a fixed sequence of jobs;
a wall-clock budget, a work budget (scenario simulations), or both end it
([Note: two budgets]), and a search cut by the clock is reproduced by the
work budget it had spent.
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
   hint and the best built-in, which the verdict compares with). The race's
   leader is scored on all of them even when a budget cuts the race
   ([Note: a race the budget cut]).
3. **Local search** (:func:`local_search`) from the best few static
   candidates, by late-acceptance hill climbing (Burke and Bykov 2017):
   swap or insert two tasks of one rank's order. Only pairs of tasks that
   were *ready together* at some decision of the arbiter are moved, because
   exchanging two tasks that never compete for a rank does not change what
   the arbiter does. Each move is raced too.

Stops when a budget is spent ([Note: two budgets]), when there is nothing
left to try, or on ``KeyboardInterrupt`` (Ctrl-C, SIGTERM): the best found so
far is kept either way, and ``stopped`` says which.

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
    order torch would run. torch also needs the last stage's forwards in
    microbatch order ([Note: torch's loss order] in :mod:`hints.files.torch_csv`):
    every candidate and every local-search move is renamed so (the same order
    under other microbatch numbers: as an index says nothing of a
    microbatch's contents, neither better nor worse in expectation), and
    what is scored is what schedule.csv holds.
"""

from __future__ import annotations

import math
import multiprocessing
import random
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from hints.errors import HintError
from hints.files.torch_csv import in_torch_loss_order
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
from runtime.sched.baselines import PLANNED, SORTED_1F1B, sorted_baselines
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import resolve
from runtime.sched.split_choice import choose_split
from runtime.tune.evaluator import Candidate, Evaluator, Objective


@dataclass(frozen=True)
class SearchConfig:
    """What a search runs and when it stops ([Note: two budgets]): ``evaluations`` (scenario simulations) and
    ``seconds`` (wall clock from ``started``, a ``time.monotonic()``; None: when :meth:`Search.run` starts),
    whichever ends first; None is no limit, but one of them must be given. ``reserve``: the simulations that
    follow the search inside the same clock budget (the verdict's and the report's, on held-out scenarios),
    run ``jobs`` at a time; ``reserve_each``: and as many again for each candidate the verdict will hold out,
    counted as the search goes (the best of each family it scored in full, and the best fixed order)."""

    objective: Objective
    rules: tuple[str, ...]  # the rules candidates run under (greedy/lookahead, or fixed)
    evaluations: int | None = None  # scenario simulations to spend at most
    seed: int = 0
    jobs: int = 1
    seconds: float | None = None
    started: float | None = None
    reserve: int = 0
    reserve_each: int = 0
    reserve_s: float = 0.0  # and seconds kept back for what follows that is not a simulation
    race_first: int = 6  # scenarios a newcomer is scored on before the rest
    local_starts: int = 3
    history: int = 30  # late acceptance: compare with the value this many steps ago
    static: bool = False  # one order every step (torch): moves are renamed as as_static renames candidates


@dataclass
class Scored:
    candidate: Candidate
    makespans: list[float]  # on every tuning scenario
    value: float  # the objective over them


@dataclass
class SearchResult:
    scored: list[Scored]  # every fully scored candidate, best first
    simulations: int  # scenario simulations counted against the budgets ([Note: two budgets])
    stopped: str  # "time budget", "evaluations", "search complete" (nothing left to try) or "interrupted"
    trace: list[tuple[int, float]] = field(default_factory=list)  # (simulations, best value so far)
    interrupt: KeyboardInterrupt | None = None  # what stopped it (Ctrl-C or SIGTERM), to re-raise once saved
    seconds: float = 0.0  # wall time from the clock's start to the search's end
    raced: int = 0  # candidates the first race scored on its first scenarios (the references included)
    candidates: int = 0  # of the portfolio's

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
        # The order planned within the budget on each scenario's expected durations ([Note: planned orders] in
        # runtime.sched.baselines), built per scenario as cp is: a hint under the rules searched, and in fixed order
        # the best fixed order a user could run at this memory.
        for rule in (*rules, *(() if "fixed" in rules else ("fixed",))):
            candidates.append(Candidate(PLANNED, "planned", rule, builtin=PLANNED))

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


def as_static(candidates: Sequence[Candidate], shape: PipelineShape, mean: Durations,
              budget: MemoryBudget | None = None) -> list[Candidate]:
    """Every candidate as one index order under the fixed rule ([Note: one order every step]), without copies
    (the built-ins, the baseline and the traced hint are kept whatever they equal: the verdict compares with
    them by name); the planned order is planned on ``mean`` within ``budget`` (default 1f1b)."""
    static: list[Candidate] = []
    seen: set = set()
    for candidate in candidates:
        hint = candidate.hint
        if candidate.builtin is not None:
            hint = resolve(candidate.builtin, shape.ranks, shape.chunks, shape.microbatches, mean, shape.placement,
                           budget=budget)
        elif hint is not None and hint.cost_ranked:
            hint = resolve_cost_ranked(hint, mean.microbatch_costs)
        hint, _ = in_torch_loss_order(hint)
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
#
# [Note: two budgets]
#     A search is stopped by a wall-clock budget (``SearchConfig.seconds``, ``rrfp tune-hint --time-budget``),
#     by a work budget (``SearchConfig.evaluations``, ``--evaluations``: scenario simulations, one candidate on
#     one scenario), or by both, whichever ends first. Work is done in *jobs*, one candidate on a list of
#     scenarios, in an order fixed by the seed and the ``jobs`` count; both budgets stop the search at a job
#     boundary, with the same rule:
#
#     * a job starts only if the work budget has room for all its simulations, and its results count only
#       when the whole job is done; the first job that does not fit ends the search;
#     * when the clock runs out, the jobs done so far (a prefix, in order) are kept and counted; a job in
#       flight is abandoned (a worker of the pool is terminated, the parent stops between two scenarios), so
#       the search ends within about one simulation of its deadline.
#
#     So a search cut by the clock after ``S`` simulations ends in exactly the state a search with
#     ``evaluations = S`` ends in: ``rrfp tune-hint ... --evaluations S`` (same seed, same ``--jobs``)
#     reproduces it, and report.json says so. What comes after the search (the held-out verdict and the
#     report's rows) runs inside the clock budget too: the search's own deadline keeps back the time those
#     simulations take at the rate measured so far (``reserve``), so the command as a whole keeps to the
#     budget. The references every verdict compares with (fixed 1F1B, the traced hint) are scored on every
#     tuning scenario first, whatever the budgets: a budget smaller than that overruns by their cost.
#
# [Note: a race the budget cut]
#     A budget that ends the first race (every candidate on a few scenarios) used to leave nothing but the
#     references scored in full: on a large shape with a budget of seconds (32 ranks x 128 microbatches, 10-40 s
#     on a 2-core machine), ``tune-hint`` returned fixed 1F1B, the slowest candidate, though the race had found
#     faster ones. So the first race keeps room, in both budgets, for the rest of the tuning scenarios of one
#     candidate (``Search._held_back``: simulations the work budget does not hand out, and time the clock keeps
#     back at the rate measured so far), and when a budget cuts it, the candidate that led it so far is scored
#     on them: the search ends with it scored in full beside the references. The leader is scored so whether
#     a budget cut the race or not (it is the first of the second race, :meth:`Search.score_all`), and whether
#     or not it beats the references: a search cut by the clock after ``S`` simulations, the leader's
#     included, is then still the search ``evaluations = S`` runs (its first race stops where the room for
#     the leader begins, wherever the clock cut it).
#
#     The time kept back is priced per candidate, at each one's own rate so far: a candidate built anew
#     from each scenario's costs (``cp`` tries seven splits per scenario) takes about ten simulations' time
#     on a large shape (0.5 s against 0.05 s at 32 ranks x 128 microbatches), so a race that ``cp`` leads
#     needs ten times the room for its leader's rest and for its hold-out. The clock keeps back, for the
#     leader's rest, the rate of the candidate leading the race so far, and for the verdict's hold-out the
#     rate of the best of each family scored in full, plus the mean rate for the best fixed order and for
#     one family more; from the start of the second race, which scores the kept quarter in full (and with it
#     always the best built-in), each family it may add or change the best of at its slowest candidate's
#     rate (``_second_race``: at 32 x 128 with an 80 s budget, ``cp``'s hold-out, 25 s, was priced only once
#     that race was done, and the command ran 104 s). A candidate of a built-in built per scenario could
#     lead before it is raced, and then the race has no room left for it: so each such built-in is built on
#     the first tuning scenario before the race (the evaluator keeps it for the race), and a job of it
#     starts only if the clock has room for it to lead (its rate: twice that build, plus a mean simulation;
#     ``cp``'s builds vary 0.45-0.86 s a scenario there); once raced, its rate counts the build its job
#     reused. ``cp`` races last (``_races_last``: a structural rule, the same for both
#     budgets): a race that cannot afford it leading ends there, keeping to the budget, with every other
#     candidate raced (at 80 s with one worker: `zb lightest first`, 3.03x over fixed 1F1B, in 48 s; raced
#     where it came, fourth, the race stopped at it after 15 s with `1f1b-light`, 2.40x); a larger budget
#     races it. Which
#     candidate leads is the clock's estimate only: what the search does next depends on the simulations'
#     results, never on their times, so a search the clock cut is still the search its evaluations run.

_EVALUATOR: Evaluator | None = None  # the forked workers' copy (set in the parent before forking)
# An unraced built-in's build, priced at this much its build on the first tuning scenario (cp at 32 x 128: 0.45-0.86
# s a scenario, median 0.67 s; [Note: a race the budget cut])
_BUILD_MARGIN = 2.0


def _races_last(candidate: Candidate) -> bool:
    """A built-in computed from each scenario's task graph (``cp``: critical-path priorities, several splits tried),
    about ten simulations' time a scenario on a large shape; the planned order, which plans from ``cp`` with two
    more): the race scores it after every other candidate, so a budget that cannot afford it ends the race there,
    not before the candidates behind it."""
    if candidate.builtin == PLANNED:
        return True
    return candidate.builtin is not None and BUILTIN_HINTS[candidate.builtin].takes_priorities


def _rate_key(candidate: Candidate) -> Any:
    """Whose rate a candidate's simulations share: a built-in built per scenario is built once per scenario
    for every rule (the evaluator keeps it), so the first of its candidates pays for it; others each their own."""
    return ("built", candidate.builtin) if candidate.builtin is not None else id(candidate)


_QUIET = (signal.SIGINT, signal.SIGTERM)


def _score(job: tuple[Candidate, str, tuple[int, ...]]) -> tuple[list[float], float]:
    candidate, which, indices = job
    began = time.perf_counter()
    makespans = _EVALUATOR.makespans(candidate, which, indices)
    return makespans, time.perf_counter() - began


def _pairs(job: tuple[Candidate, tuple[int, ...]]) -> list:
    candidate, indices = job
    return ready_pairs(_EVALUATOR, candidate, indices)


def _held_out(job: tuple[Candidate, tuple[int, ...]]) -> list:
    candidate, indices = job
    return [_EVALUATOR.outcome(candidate, "holdout", index) for index in indices]


def _worker(connection, parent_end) -> None:
    """A worker's life: run each ``(function, job)`` it receives and send back ``(True, result)`` or
    ``(False, error)``, until None or the parent's end closes ([Note: workers that stop quietly])."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at a terminal reaches the group: the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # stopped in the middle of a job: end without a word
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _QUIET)  # blocked by the parent around the fork
    parent_end.close()  # so the parent's death is an end of file here
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        function, job = message
        try:
            reply = (True, function(job))
        except Exception as err:  # the parent raises it
            reply = (False, err)
        try:
            connection.send(reply)
        except Exception:  # an error that does not pickle
            connection.send((False, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))


class _Workers:
    """``count`` forked worker processes, one pipe each.

    [Note: workers that stop quietly]
        ``multiprocessing.Pool`` cannot stop a job in flight cleanly: ``terminate()`` SIGTERMs workers that
        inherited the CLI's SIGTERM handler (a ``ForkPoolWorker ... Interrupted: SIGTERM`` traceback from
        each, on every normal exit), and a worker killed while the pool's task queue is full leaves the pool's
        task thread blocked on the pipe, so ``terminate()`` can hang. Here each worker has its own pipe and no
        lock shared with the others; it ignores SIGINT (Ctrl-C is the parent's), dies of SIGTERM without a
        word, and reads one job at a time. Stopping a busy worker (a budget ended in the middle of its job)
        is SIGTERM and a join; a fresh worker takes its place. Closing sends each idle worker None. The
        parent blocks SIGINT and SIGTERM around each fork, so a signal never meets a worker before its
        handlers are set (they arrive afterwards, in the parent).
    """

    def __init__(self, count: int) -> None:
        self._context = multiprocessing.get_context("fork")
        self._workers = [self._start() for _ in range(count)]

    def _start(self):
        parent_end, child_end = self._context.Pipe()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _QUIET)
        try:
            process = self._context.Process(target=_worker, args=(child_end, parent_end), daemon=True)
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child_end.close()
        return process, parent_end

    def run(self, function: Callable, jobs: Sequence, time_left: Callable[[], float],
            arrived: Callable[[int, Any], None] | None = None, may_start: Callable[[int], bool] | None = None
            ) -> tuple[list, bool]:
        """``function`` on a prefix of ``jobs``, results in order; True when the clock (``time_left``, or
        ``may_start(index)`` before a job is handed out) cut it: the workers still in the middle of a job are
        then stopped. ``arrived(index, result)`` is called as each result comes in, in any order."""
        pending = list(enumerate(jobs))[::-1]
        idle = list(range(len(self._workers)))
        busy: dict[int, int] = {}  # worker -> job
        results: dict[int, Any] = {}
        done: list = []
        while len(done) < len(jobs):
            while idle and pending:
                if may_start is not None and not may_start(pending[-1][0]):
                    self._replace(busy)
                    return done, True
                worker = idle.pop()
                job = pending.pop()
                self._workers[worker][1].send((function, job[1]))
                busy[worker] = job[0]
            if len(done) in results:
                done.append(results.pop(len(done)))
                continue
            left = time_left()
            if left <= 0:
                self._replace(busy)
                return done, True
            connections = {self._workers[w][1]: w for w in busy}
            for connection in wait(list(connections), None if math.isinf(left) else left):
                worker = connections[connection]
                try:
                    ok, value = connection.recv()
                except (EOFError, OSError):
                    raise RuntimeError(f"a tune-hint worker (pid {self._workers[worker][0].pid}) died, "
                                       f"exit code {self._workers[worker][0].exitcode}") from None
                if not ok:
                    raise value
                index = busy.pop(worker)
                results[index] = value
                idle.append(worker)
                if arrived is not None:
                    arrived(index, value)
        return done, False

    def _replace(self, busy: dict[int, int]) -> None:
        """Stop the workers in the middle of a job and start fresh ones in their place."""
        for worker in busy:
            process, connection = self._workers[worker]
            process.terminate()
            process.join()
            connection.close()
            self._workers[worker] = self._start()
        busy.clear()

    def close(self, stop: bool = False) -> None:
        """Idle workers end on None; with ``stop`` (an interrupt or an error: some may be busy), SIGTERM."""
        for process, connection in self._workers:
            if stop:
                process.terminate()
            else:
                try:
                    connection.send(None)
                except OSError:
                    process.terminate()
        for process, connection in self._workers:
            process.join()
            connection.close()
        self._workers = []


class _Stop(Exception):
    """A budget ended the search ([Note: two budgets]); ``reason`` is what report.json says stopped it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Search:
    """One search run: owns the evaluator, the optional process pool and the work and time accounting.

    A context manager: the pool lives until the ``with`` block ends, so the held-out figures the verdict
    reads can be computed in it too (:meth:`hold_out`)."""

    def __init__(self, evaluator: Evaluator, config: SearchConfig,
                 progress: Callable[[int, float, str], None] | None = None) -> None:
        self.evaluator, self.config = evaluator, config
        self.progress = progress or (lambda spent, best, note: None)
        self.rng = random.Random(f"{config.seed}:search")
        self.spent = 0
        self.best_value = math.inf
        self.trace: list[tuple[int, float]] = []
        self.scored: list[Scored] = []  # every candidate scored on all tuning scenarios so far
        self.started = time.monotonic() if config.started is None else config.started
        self.seconds = 0.0  # the search's own wall time, once it ended
        self._sim_seconds = 0.0  # wall time of the simulations timed so far, where they ran, and how many
        self._sims_timed = 0
        self._rates: dict[Any, float] = {}  # _rate_key(candidate) -> seconds per simulation of its slowest job
        # per family the verdict will hold out the best of, the rate keys it may be priced at (the slowest counts):
        # its best scored in full (see _keep), and during the second race each candidate that may become it
        self._held_out: dict[str, tuple[Any, ...]] = {}
        self._held_back = 0  # simulations the clock keeps room for besides the reserve (a race's leader)
        self.raced = 0  # candidates the first race got through, the references included
        self._racing: dict[int, tuple[int, int]] | None = None  # id(candidate) -> (job, scenarios) in a race
        self._leader: tuple[float, int, Any] | None = None  # the race so far: (objective, job, its rate's key)
        # built-ins built per scenario, not raced yet: the seconds their build before the race took (the race reuses it)
        self._prebuilt: dict[Any, float] = {}
        self._pool: _Workers | None = None

    def __enter__(self) -> "Search":
        return self

    def __exit__(self, *exc) -> None:
        self._close_pool(terminate=exc[0] is not None)

    # -- the workers -----------------------------------------------------------------
    def _open_pool(self) -> None:
        global _EVALUATOR
        self.evaluator.prepare()
        _EVALUATOR = self.evaluator
        self._pool = _Workers(self.config.jobs)

    def _close_pool(self, terminate: bool) -> None:
        """Close the workers: idle ones end; with ``terminate`` (an interrupt, an error) each is stopped."""
        global _EVALUATOR
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(stop=terminate)
        _EVALUATOR = None

    # -- the budgets ---------------------------------------------------------------
    def time_left(self, starting: Candidate | None = None) -> float:
        """Seconds the search may still run: the clock budget less the reserve at the rates measured so far;
        ``starting``: before a job of this candidate starts, which may lead the race once it is done."""
        if self.config.seconds is None:
            return math.inf
        mean = self._sim_seconds / self._sims_timed if self._sims_timed else 0.0
        # Each at its own rate ([Note: a race the budget cut]): the verdict holds out the best of each family
        # scored so far, the best fixed order (at the mean rate) and the best of a family the next job may add
        # (the race's leader so far, else at the mean rate), and the race keeps room for its leader's rest.
        rates = self._rates
        held_out = sum(max(rates.get(key, mean) for key in keys) for keys in self._held_out.values())
        coming = self._rates.get(self._leader[2], mean) if self._leader is not None else mean
        built = self._prebuilt.get(_rate_key(starting)) if starting is not None else None
        if built is not None:  # it may lead once raced: its builds priced at a margin over the first
            coming = max(coming, _BUILD_MARGIN * built + mean)
        seconds = (self.config.reserve * mean + self.config.reserve_each * (held_out + mean + coming)
                   + self._held_back * coming)
        after = seconds / max(1, self.config.jobs) + self.config.reserve_s
        return self.started + self.config.seconds - after - time.monotonic()

    def _fitting(self, jobs: list) -> tuple[list, bool]:
        """The jobs the work budget has room for, less what it keeps back, a prefix; whether it cut any."""
        if self.config.evaluations is None:
            return jobs, False
        room = self.config.evaluations - self.spent - self._held_back
        for k, (_, _, indices) in enumerate(jobs):
            if len(indices) > room:
                return jobs[:k], True
            room -= len(indices)
        return jobs, False

    def _timed(self, seconds: float, simulations: int) -> None:
        self._sim_seconds += seconds
        self._sims_timed += simulations

    def _job_timed(self, candidate: Candidate, seconds: float, simulations: int) -> None:
        """A job of ``candidate`` (or a worker's part of one) took ``seconds`` for ``simulations``: its rate, if
        the slowest yet for its key ([Note: a race the budget cut])."""
        if simulations:
            key = _rate_key(candidate)
            seconds += self._prebuilt.pop(key, 0.0)  # the build this job reused: its rate would not see it
            self._rates[key] = max(self._rates.get(key, 0.0), seconds / simulations)

    def _price_builds(self, candidates: Sequence[Candidate]) -> None:
        """Time building each built-in that is built per scenario on the first tuning scenario (the evaluator keeps
        it, so the race reuses it; before the workers fork, so they share it): until it is raced, the clock keeps
        room for it to lead the race, a build priced at that one with a margin ([Note: a race the budget cut])."""
        if self.config.seconds is None:
            return
        for candidate in candidates:
            key = _rate_key(candidate)
            if candidate.builtin is not None and key not in self._prebuilt and self.time_left() > 0:
                began = time.perf_counter()
                self.evaluator.hint_for(candidate, "tuning", 0)
                self._prebuilt[key] = time.perf_counter() - began

    def _raced(self, candidate: Candidate, makespans: list[float]) -> None:
        """A job of the race is done: its candidate leads if it is the best so far (ties: the earlier job)."""
        job = self._racing.get(id(candidate)) if self._racing is not None else None
        if job is None or len(makespans) < job[1]:
            return
        entry = (self.config.objective(makespans), job[0], _rate_key(candidate))
        if self._leader is None or entry[:2] < self._leader[:2]:
            self._leader = entry

    # -- scoring ---------------------------------------------------------------
    def _map(self, jobs: list[tuple[Candidate, str, tuple[int, ...]]], required: bool = False
             ) -> tuple[list[list[float]], str | None]:
        """Makespans of a prefix of ``jobs``, in order, and what stopped it before the end (None: nothing).
        ``required`` jobs run whatever the budgets ([Note: two budgets])."""
        stop = None
        if not required:
            jobs, cut = self._fitting(jobs)
            stop = "evaluations" if cut else None
        done: list[list[float]] = []
        if self._pool is None:
            for candidate, which, indices in jobs:
                makespans, job_seconds = [], 0.0
                for index in indices:
                    if not required and self.time_left(None if makespans else candidate) <= 0:
                        return done, "time budget"
                    began = time.perf_counter()
                    makespans += self.evaluator.makespans(candidate, which, (index,))
                    seconds = time.perf_counter() - began
                    self._timed(seconds, 1)
                    job_seconds += seconds
                self._job_timed(candidate, job_seconds, len(indices))
                self._raced(candidate, makespans)
                done.append(makespans)
                self.spent += len(indices)
            return done, stop
        # Fewer jobs than workers (a local search step's few candidates on the rest of the scenarios) leave
        # workers idle: each job is then run in parts, and still counts only once all its parts are done.
        parts = max(1, math.ceil(2 * self.config.jobs / max(1, len(jobs))))
        pieces = []  # (job, part of its scenarios), in job order
        for k, (candidate, which, indices) in enumerate(jobs):
            size = max(1, math.ceil(len(indices) / parts))
            pieces += [(k, (candidate, which, indices[i:i + size])) for i in range(0, len(indices), size)]
        of_piece: dict[int, list[float]] = {}

        def arrived(i: int, result: tuple[list[float], float]) -> None:  # as each piece's result comes in
            _, (candidate, _, indices) = pieces[i]
            of_piece[i], seconds = result
            self._timed(seconds, len(indices))
            self._job_timed(candidate, seconds, len(indices))
            if parts == 1:
                self._raced(candidate, of_piece[i])

        _, cut = self._pool.run(_score, [piece for _, piece in pieces],
                                (lambda: math.inf) if required else self.time_left, arrived,
                                None if required else lambda i: self.time_left(pieces[i][1][0]) > 0)
        makespans_of: dict[int, list[float]] = {}
        for i, (k, _) in enumerate(pieces):  # a job's pieces in order, whichever came in first
            if i in of_piece:
                makespans_of.setdefault(k, []).extend(of_piece[i])
        for k, (_, _, indices) in enumerate(jobs):
            if len(makespans_of.get(k, ())) < len(indices):
                break  # cut by the clock in the middle of this job: it and the rest are abandoned
            done.append(makespans_of[k])
            self.spent += len(indices)
        return done, "time budget" if cut else stop

    def _tick(self, note: str = "") -> None:
        self.progress(self.spent, self.best_value, note)

    def score_all(self, candidates: Sequence[Candidate]) -> list[Scored]:
        """Race ``candidates``: a few scenarios each, then every scenario for the best quarter. The references
        every verdict and report compares with are scored on every scenario first, whatever the budgets."""
        n = len(self.evaluator.sets["tuning"])
        first = tuple(range(min(self.config.race_first, n)))
        rest = tuple(range(len(first), n))
        objective = self.config.objective
        shape = self.evaluator.shape
        baseline = baseline_hint_name(shape.chunks, shape.placement)
        references = [k for k, c in enumerate(candidates)
                      if c.family in ("baseline", "traced") or (c.rule == "fixed" and c.name == baseline)]
        full, _ = self._map([(candidates[k], "tuning", first + rest) for k in references], required=True)
        scored = {k: self._scored(candidates[k], makespans) for k, makespans in zip(references, full)}
        self._keep(list(scored.values()), "references")
        # the built-ins computed from each scenario's task graph race last ([Note: a race the budget cut])
        others = sorted((k for k in range(len(candidates)) if k not in scored), key=lambda k: _races_last(candidates[k]))
        early = {k: s.makespans[:len(first)] for k, s in scored.items()}
        self._held_back = len(rest)  # [Note: a race the budget cut]
        self._racing = {id(candidates[k]): (k, len(first)) for k in others}
        try:
            done, stop = self._map([(candidates[k], "tuning", first) for k in others])
        finally:
            self._held_back, self._racing, self._leader = 0, None, None
            self._prebuilt.clear()
        early.update(zip(others, done))
        raced = others[:len(done)]
        self.raced = len(references) + len(raced)
        leader = min(raced, key=lambda k: (objective(early[k]), k), default=None)
        if leader is not None and rest:  # in the room kept for it, whatever the budgets
            (more,), _ = self._map([(candidates[leader], "tuning", rest)], required=True)
            scored[leader] = self._scored(candidates[leader], early[leader] + more)
            self._keep([scored[leader]], "race")  # the clock keeps back its hold-out from now on
        if stop:
            if not rest:  # the first scenarios were all of them: every candidate raced is scored in full
                scored.update((k, self._scored(candidates[k], early[k])) for k in raced)
                self._keep([scored[k] for k in raced], "race")
            raise _Stop(stop)
        ranked = sorted(range(len(candidates)), key=lambda k: (objective(early[k]), k))
        keep = ranked[:max(4, math.ceil(len(ranked) / 4))] if rest else ranked
        # The references, the best built-in and the best sorted 1F1B are always scored in full.
        best_builtin = next((k for k in ranked if candidates[k].family == "built-in"), None)
        best_sorted = next((k for k in ranked if candidates[k].family == "sorted 1F1B"), None)
        for k in ranked:
            if k not in keep and (k in (best_builtin, best_sorted) or k in scored):
                keep.append(k)
        late = [k for k in keep if k not in scored]
        self._second_race([candidates[k] for k in late])
        done, stop = self._map([(candidates[k], "tuning", rest) for k in late]) if rest else ([[]] * len(late), None)
        scored.update((k, self._scored(candidates[k], early[k] + more)) for k, more in zip(late, done))
        # In the racing order (it breaks ties between equal values), the references among them
        self.scored = [scored[k] for k in keep if k in scored]
        self._keep([], "portfolio")
        if stop:
            raise _Stop(stop)
        return list(self.scored)

    def _second_race(self, late: Sequence[Candidate]) -> None:
        """Before the second race scores ``late`` in full, the clock keeps back, for each family it may add to the
        verdict's hold-out or change the best of, the rate of its slowest candidate there: a family's best is
        known only once the race is done, and ``cp``, always scored in full as the best built-in, costs ten
        simulations' time on each held-out scenario ([Note: a race the budget cut])."""
        for candidate in late:  # beside each family's best so far (_keep)
            keys, key = self._held_out.get(candidate.family, ()), _rate_key(candidate)
            if key not in keys:
                self._held_out[candidate.family] = (*keys, key)

    def _scored(self, candidate: Candidate, makespans: list[float]) -> Scored:
        return Scored(candidate, makespans, self._value(candidate, makespans))

    def _keep(self, scored: list[Scored], note: str) -> None:
        """``scored`` joins the candidates scored in full (kept sorted: best first)."""
        self.scored += scored
        self.scored.sort(key=lambda s: s.value)
        self._held_out = {}  # what the verdict will hold out, for the clock (time_left, a hot path)
        for kept in self.scored:  # best first
            self._held_out.setdefault(kept.candidate.family, (_rate_key(kept.candidate),))
        if self.scored:
            self._improved(self.scored[0].value, note)

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
        return self.config.evaluations is not None and self.spent >= self.config.evaluations

    # -- local search -------------------------------------------------------------
    def _ready_pairs(self, candidate: Candidate, n: int) -> list[tuple[int, Task, Task]]:
        """:func:`ready_pairs` on the first three tuning scenarios, as one job of the budgets."""
        count = min(3, n)
        if self.config.evaluations is not None and self.spent + count > self.config.evaluations:
            raise _Stop("evaluations")
        pairs: list[tuple[int, Task, Task]] = []
        if self._pool is not None:  # one scenario per worker, while the parent waits
            found, cut = self._pool.run(_pairs, [(candidate, (index,)) for index in range(count)], self.time_left)
            if cut:
                raise _Stop("time budget")
            pairs = [pair for part in found for pair in part]
        for index in range(count if self._pool is None else 0):
            if self.time_left() <= 0:
                raise _Stop("time budget")
            began = time.perf_counter()
            pairs += ready_pairs(self.evaluator, candidate, (index,))
            self._timed(time.perf_counter() - began, 1)
        self.spent += count
        return sorted(set(pairs))

    def local_search(self, start: Scored) -> list[Scored]:
        """Late-acceptance hill climbing from ``start``; every fully scored improvement is also kept in
        :attr:`scored` as it is found, so a budget that ends it loses none."""
        evaluator, objective, config = self.evaluator, self.config.objective, self.config
        n = len(evaluator.sets["tuning"])
        first = tuple(range(min(config.race_first, n)))
        rest = tuple(range(len(first), n))
        current = best = start
        found: list[Scored] = []
        history = [start.value] * config.history
        pairs = self._ready_pairs(start.candidate, n)
        step = idle = 0
        while pairs and not self.exhausted and idle < 200:  # 200 proposals in a row all invalid: give up
            if self.time_left() <= 0:
                raise _Stop("time budget")
            batch = []
            for _ in range(max(1, config.jobs)):
                rank, a, b = pairs[self.rng.randrange(len(pairs))]
                kind = "swap" if self.rng.random() < 0.5 else "insert"
                a, b = (a, b) if self.rng.random() < 0.5 else (b, a)
                hint = apply_move(current.candidate.hint, (kind, rank, a, b),
                                  f"{start.candidate.name} + local search")
                if hint is not None and config.static:
                    hint, _ = in_torch_loss_order(hint)
                if hint is not None:
                    batch.append(Candidate(hint.name, "local search", current.candidate.rule, hint,
                                           notes={"from": start.candidate.label, "step": step}))
            step += 1
            idle = 0 if batch else idle + 1
            if not batch:
                continue
            early, stop = self._map([(c, "tuning", first) for c in batch])
            if stop:
                raise _Stop(stop)
            bound = objective(current.makespans[:len(first)]) * 1.02  # racing: clearly worse on the first ones
            promising = [k for k in range(len(batch)) if objective(early[k]) <= bound]
            if not promising:
                self._tick()
                continue
            late, stop = self._map([(batch[k], "tuning", rest) for k in promising]) if rest else \
                ([[] for _ in promising], None)
            if stop:  # part of the batch scored: the step is abandoned whole, as a work budget would
                raise _Stop(stop)
            trial = min((Scored(batch[k], early[k] + more, self._value(batch[k], early[k] + more))
                         for k, more in zip(promising, late)), key=lambda s: s.value)
            slot = step % config.history
            if trial.value <= current.value or trial.value <= history[slot]:
                better = trial.value < current.value
                current = trial
                if trial.value < best.value:
                    best = trial
                    found.append(trial)
                    self._keep([trial], "local search")  # kept before the next job: a budget may end there
                if better:
                    pairs = self._ready_pairs(trial.candidate, n) or pairs
            history[slot] = current.value
            self._tick()
        return found

    # -- the whole search ------------------------------------------------------------
    def run(self, candidates: Sequence[Candidate]) -> SearchResult:
        stopped, interrupt = "search complete", None
        try:
            self._price_builds(candidates)
            if self.config.jobs > 1:
                self._open_pool()
            self.score_all(candidates)
            starts = [s for s in self.scored if s.candidate.hint is not None][:self.config.local_starts]
            while starts:
                for start in starts:
                    if self.exhausted:
                        raise _Stop("evaluations")
                    self.local_search(start)
                starts = [s for s in self.scored if s.candidate.family == "local search"][:1]
            if self.exhausted:
                stopped = "evaluations"
        except _Stop as stop:
            stopped = stop.reason
        except KeyboardInterrupt as err:
            stopped, interrupt = "interrupted", err
            self._close_pool(terminate=True)
        finally:
            self.seconds = time.monotonic() - self.started
        return SearchResult(sorted(self.scored, key=lambda s: s.value), self.spent, stopped, self.trace, interrupt,
                            self.seconds, self.raced, len(candidates))

    def hold_out(self, candidates: Sequence[Candidate]) -> None:
        """Simulate ``candidates`` on every held-out scenario in the pool (with ``jobs`` > 1; without, the
        evaluator does it when asked), so the verdict and the report read them from the evaluator."""
        n = len(self.evaluator.sets["holdout"])
        if self.config.jobs <= 1 or not candidates or not n:
            return
        if self._pool is None:
            self._open_pool()
        split = max(1, math.ceil(n / self.config.jobs))
        jobs = [(c, tuple(range(i, min(n, i + split)))) for c in candidates for i in range(0, n, split)]
        results, _ = self._pool.run(_held_out, jobs, lambda: math.inf)
        for (candidate, indices), figures in zip(jobs, results):
            for index, outcome in zip(indices, figures):
                self.evaluator.keep_holdout(candidate, index, outcome)


__all__ = ["Scored", "Search", "SearchConfig", "SearchResult", "apply_move", "as_static", "portfolio", "ready_pairs"]
