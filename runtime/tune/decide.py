"""``tune``: from scenarios to a hint, a rule and a memory budget, with the evidence, as one report.

The search (:mod:`runtime.tune.search`) proposes and scores on the tuning
scenarios; this module decides on the held-out ones ([Note: never worse] in
:mod:`runtime.tune.evaluator`), explores memory when asked (``--memory-budget
auto``), and writes what a user needs to act and to check: the report as a
dict (``report.json``) and as Markdown (``report.md``).

Memory (``auto``): the winner's family is re-scored at several budgets
(:data:`AUTO_BUDGETS`); the Pareto table gives makespan against slots per
rank, and the chosen budget is the smallest whose objective is within 1% of
the best one's. A :class:`HeldBudget` is a budget of given slots per rank:
what a user's own schedule held (``tune-hint --target torch``).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from hints.errors import UserError
from hints.orders import HintOrder, baseline_hint_name
from runtime.sched.budget import MemoryBudget
from runtime.sched.evaluate import resolve, versus_label
from runtime.sched.rules import RULES
from runtime.tune.evaluator import Candidate, Evaluator, Objective, paired_bootstrap, summary
from runtime.tune.scenarios import ScenarioSet
from runtime.tune.search import Scored, Search, SearchConfig, SearchResult, as_static, portfolio

AUTO_BUDGETS = ("1f1b", "1.25x", "1.5x", "2x", "3x", "4x")


class Stopwatch:
    """Wall and CPU time since a command started: the clock a time budget runs on ([Note: two budgets] in
    :mod:`runtime.tune.search`), and the effort report.json records. CPU time is this process's and its
    children's (the search's workers, once joined), user and system."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._cpu = os.times()

    def wall(self) -> float:
        return time.monotonic() - self.started

    def cpu(self) -> tuple[float, float]:
        """(this process, its children) CPU seconds since the start."""
        now, then = os.times(), self._cpu
        return (now.user + now.system - then.user - then.system,
                now.children_user + now.children_system - then.children_user - then.children_system)


@dataclass
class Verdict:
    """What is written out, and why ([Note: never worse])."""

    chosen: Scored
    tuned_kept: bool
    reason: str
    holdout: dict[str, list[float]]  # label -> held-out makespans (tuned, best built-in, fixed 1F1B, chosen)
    gain: dict[str, float] = field(default_factory=dict)  # interval of the tuned hint over the best built-in


@dataclass(frozen=True)
class HeldBudget:
    """Slots per rank as a schedule held them (``slots``, from ``source``): a budget no
    :class:`MemoryBudget` spelling gives (not 1F1B's, not one count on every rank). It answers what the
    evaluator asks of a budget (``per_rank``, ``spec``)."""

    slots: tuple[int, ...]
    source: str

    @property
    def spec(self) -> str:
        return f"as {self.source} held"

    def per_rank(self, shape) -> list[int]:
        if len(self.slots) != shape.ranks:
            raise UserError(f"{self.source} holds {len(self.slots)} ranks but the shape has {shape.ranks}",
                            "`memory_budget`")
        return list(self.slots)

    def __str__(self) -> str:
        return self.spec


@dataclass
class TuneOutcome:
    search: SearchResult
    verdict: Verdict
    budget: str  # the budget chosen (the one given, or auto's pick)
    pareto: list[dict]  # auto only: per budget, slots and objective
    evaluator: Evaluator
    objective: Objective
    jobs: int = 1
    time_budget: float | None = None  # the budgets given ([Note: two budgets] in runtime.tune.search)
    evaluations: int | None = None
    clock: Stopwatch = field(default_factory=Stopwatch)


ROW_BOUND_SCENARIOS = 4  # held-out scenarios each report row's bubble fraction and bound ratios are averaged on


def tune(scenarios: ScenarioSet, policy: str, budget: str | HeldBudget, objective: Objective,
         time_budget: float | None = None, jobs: int = 1, seed: int = 0, overhead: float = 0.0, cost_model=None,
         traced: Candidate | None = None, progress: Callable[[int, float, str], None] | None = None,
         static: bool = False, evaluations: int | None = None, clock: Stopwatch | None = None) -> TuneOutcome:
    """Search, decide, and (with ``budget == "auto"``) explore memory. See the module docstring.

    The search ends when ``time_budget`` seconds of wall clock (from ``clock``'s start, this call's when
    None; the verdict and report inside it) or ``evaluations`` scenario simulations are spent, whichever
    comes first ([Note: two budgets] in :mod:`runtime.tune.search`); give at least one. For a seed and a
    ``jobs`` count, ``evaluations`` alone makes the result the same on every machine.

    ``traced`` is the hint and rule of the run the scenarios come from (family ``traced``): scored like
    every candidate, and the reference of the predicted gain ``rrfp tune-hint --check`` verifies.
    ``static``: every candidate is one index order run in fixed order ([Note: one order every step] in
    :mod:`runtime.tune.search`), for a runtime that runs the same order every step (torch).
    """
    clock = clock or Stopwatch()
    if time_budget is None and evaluations is None:
        raise UserError("give a time budget, a number of evaluations, or both", "`time_budget`")
    if time_budget is not None and not (math.isfinite(time_budget) and time_budget > 0):
        raise UserError(f"must be a number of seconds above 0, got {time_budget!r}", "`time_budget`")
    if evaluations is not None and evaluations < 1:
        raise UserError(f"must be at least 1, got {evaluations!r}", "`evaluations`")
    shape = scenarios.shape
    rules = ("greedy", "lookahead") if policy == "ready" else ("fixed",)
    if static and rules != ("fixed",):
        raise UserError("a static order runs under the fixed policy only", "`policy`")
    explore = budget == "auto"
    if isinstance(budget, HeldBudget):
        limit = budget
    else:
        limit = MemoryBudget.parse("1f1b" if explore else budget)
    evaluator = Evaluator(scenarios, limit, overhead)
    mean = scenarios.tuning[0].expected if len(scenarios.tuning) == 1 else _mean_expectation(scenarios)
    candidates = ([traced] if traced is not None else []) + portfolio(shape, rules, mean, cost_model,
                                                                      evaluator.slots, str(evaluator.budget))
    if static:
        candidates = as_static(candidates, shape, mean, evaluator.budget)
    # What follows the search in the same clock budget: each family's best, the references and the best fixed
    # order on every held-out scenario (in the pool: counted by the search as it scores families,
    # ``reserve_each``), and with auto the memory sweep and the verdict at the budget it picks (here, one process).
    held_out = len(scenarios.holdout) * (len({c.family for c in candidates} | {"local search"}) + 2)
    after = (len(AUTO_BUDGETS) * len(scenarios.tuning) + held_out) * jobs if explore else 0
    # Besides simulations: five paired bootstraps of 2,000 resamples of the held-out scenarios, the report's text
    # and its files (measured on the development machine: about 3 ms per held-out scenario, and 50 ms), and each
    # report row's lower bounds on its first held-out scenarios: computed now for the first (kept for the
    # report) and timed, so the clock keeps back the rest (at 32 x 128 about 0.5 s a scenario; with auto, the
    # evaluator at the budget it picks shares them: Evaluator.at_budget).
    bounds_s = 0.0
    if time_budget is not None:
        bounds_s = evaluator.price_bounds() * (min(ROW_BOUND_SCENARIOS, len(scenarios.holdout)) - 1)
    config = SearchConfig(objective, rules, evaluations, seed, jobs, seconds=time_budget, started=clock.started,
                          static=static,
                          reserve=after, reserve_each=0 if explore else len(scenarios.holdout),
                          reserve_s=0.05 + 0.003 * len(scenarios.holdout) + bounds_s)
    with Search(evaluator, config, progress) as search:
        result = search.run(candidates)
        if result.interrupt is None and not explore:
            search.hold_out(holdout_candidates(result, shape))
    if not result.scored and result.interrupt is not None:
        raise result.interrupt  # stopped before any candidate was scored: nothing to keep (exit 130 / 143)
    if result.scored and math.isinf(result.best.value) and result.stopped != "interrupted":
        raise UserError(f"no fixed order fits the memory budget {evaluator.budget} "
                        f"({min(evaluator.slots)}..{max(evaluator.slots)} slots per rank) on these scenarios; give a "
                        f"larger budget{'' if static else ' or `policy` ready'}", "`memory_budget`")
    pareto: list[dict] = []
    chosen_budget = str(budget)
    if explore and RULES[result.best.candidate.rule].uses_budget:
        pareto, chosen_budget, evaluator = _memory_pareto(evaluator, result.best.candidate, objective)
    elif explore:
        chosen_budget = "1f1b"
    verdict = decide(evaluator, result, objective, seed)
    return TuneOutcome(result, verdict, chosen_budget, pareto, evaluator, objective, jobs, time_budget, evaluations,
                       clock)


def holdout_candidates(result: SearchResult, shape) -> list[Candidate]:
    """Every candidate the verdict and the report simulate on the held-out scenarios: the best of each family
    (the best built-in and the traced hint among them), the baseline, and the best fixed order within budget."""
    picked: dict[int, Candidate] = {}
    families: set[str] = set()
    for scored in result.scored:
        if scored.candidate.family not in families:
            families.add(scored.candidate.family)
            picked[id(scored.candidate)] = scored.candidate
    baseline = _baseline(result, shape)
    for extra in (baseline, result.best_fixed):
        if extra is not None:
            picked[id(extra.candidate)] = extra.candidate
    return list(picked.values())


def _baseline(result: SearchResult, shape) -> Scored | None:
    """Fixed 1F1B (the shape's baseline order in fixed order) as the search scored it."""
    return next((s for s in result.scored if s.candidate.family == "baseline"
                 or (s.candidate.rule == "fixed" and s.candidate.name == baseline_hint_name(shape.chunks,
                                                                                           shape.placement))), None)


def _mean_expectation(scenarios: ScenarioSet):
    """The average expectation over the tuning scenarios (what static priorities are computed on)."""
    first = scenarios.tuning[0].expected
    n = len(scenarios.tuning)

    def mean(rows_of):
        return [[statistics.fmean(rows_of(s.expected)[k][i] for s in scenarios.tuning) for i in range(first.microbatches)]
                for k in range(first.stages)]

    from runtime.durations.variability import Durations

    return Durations(first.stages, first.microbatches, mean(lambda d: d.forward), mean(lambda d: d.backward),
                     mean(lambda d: d.send_forward), mean(lambda d: d.send_backward), [1.0] * first.microbatches,
                     input_grad=mean(lambda d: d.input_grad) if first.input_grad else None,
                     weight_grad=mean(lambda d: d.weight_grad) if first.weight_grad else None,
                     source=f"mean expectation of {n} scenarios", split_overhead=first.split_overhead)


def decide(evaluator: Evaluator, result: SearchResult, objective: Objective, seed: int) -> Verdict:
    """[Note: never worse]: keep the tuned hint only if its held-out gain over the best built-in is sure."""
    best = result.best
    builtin = result.best_of("built-in") or best
    baseline = _baseline(result, evaluator.shape)
    held = {"tuned": evaluator.makespans(best.candidate, "holdout"),
            "best built-in": evaluator.makespans(builtin.candidate, "holdout")}
    if baseline is not None:
        held["fixed 1F1B"] = evaluator.makespans(baseline.candidate, "holdout")
    traced = next((s for s in result.scored if s.candidate.family == "traced"), None)
    if traced is not None:
        held["traced hint"] = evaluator.makespans(traced.candidate, "holdout")
    # [Note: the best fixed order at equal memory] in runtime.sched.baselines
    if result.best_fixed is not None:
        held["best fixed order"] = evaluator.makespans(result.best_fixed.candidate, "holdout")
    if best.candidate.family in ("built-in", "traced", "baseline"):
        chosen, kept, reason = best, False, f"the best candidate is the built-in {best.candidate.label} itself"
        if result.best_of("built-in") is None and result.stopped in ("time budget", "evaluations"):
            # the budget ran out before the race scored any candidate in full: nothing was compared with the reference
            reason = (f"the {result.stopped} ended the search before any candidate but {best.candidate.label} was "
                      f"scored in full, so it is kept; give a larger budget")
        gain = {}
    else:
        interval = paired_bootstrap(held["best built-in"], held["tuned"], seed=seed)
        gain = {"estimate": interval.estimate, "low": interval.low, "high": interval.high}
        if interval.above_zero():
            chosen, kept = best, True
            reason = (f"held-out gain over {builtin.candidate.label}: {interval.estimate:+.2%} "
                      f"(95% interval {interval.low:+.2%} .. {interval.high:+.2%}, above zero)")
        else:
            chosen, kept = builtin, False
            reason = (f"the tuned hint's held-out gain over {builtin.candidate.label} is not sure "
                      f"({interval.estimate:+.2%}, 95% interval {interval.low:+.2%} .. {interval.high:+.2%}): "
                      f"keeping the built-in")
    if chosen is not best and chosen is builtin:
        held["chosen"] = held["best built-in"]
    else:
        held["chosen"] = held["tuned"]
    # At the 1f1b budget nothing written out may be slower than fixed 1F1B on the held-out scenarios.
    if baseline is not None and evaluator.budget.spec == "1f1b" and \
            objective(held["chosen"]) > objective(held["fixed 1F1B"]):
        name = baseline_label(evaluator.shape.chunks, evaluator.shape.placement)
        reason += f"; but it is slower than {name} on the held-out scenarios: keeping {name}"
        chosen, kept, held["chosen"] = baseline, False, held["fixed 1F1B"]
    return Verdict(chosen, kept, reason, held, gain)


def _memory_pareto(searched: Evaluator, candidate: Candidate, objective: Objective):
    """``candidate`` on the tuning scenarios at each of :data:`AUTO_BUDGETS`: the rows of the memory table, the
    smallest budget within 1% of the best, and the evaluator at that budget."""
    rows, evaluators = [], {}
    for spec in AUTO_BUDGETS:
        evaluator = evaluators[spec] = searched.at_budget(MemoryBudget.parse(spec))
        value = objective(evaluator.makespans(candidate))
        rows.append({"budget": spec, "slots": evaluator.slots, "max_slots": max(evaluator.slots), "objective": value})
    best = min(r["objective"] for r in rows)
    chosen = next(r["budget"] for r in rows if r["objective"] <= best * 1.01)
    for r in rows:
        r["chosen"] = r["budget"] == chosen
    return rows, chosen, evaluators[chosen]


# -- the report --------------------------------------------------------------------


def report(outcome: TuneOutcome, context: dict) -> dict:
    """Everything report.json holds; ``context`` adds the inputs, commands and replay check from the caller."""
    evaluator, objective = outcome.evaluator, outcome.objective
    verdict, search = outcome.verdict, outcome.search
    held = verdict.holdout
    families: dict[str, Scored] = {}
    for scored in search.scored:
        families.setdefault(scored.candidate.family, scored)
    reference = {label: held[label] for label in ("fixed 1F1B", "best built-in", "traced hint", "best fixed order")
                 if label in held}
    rows = []
    for family, scored in families.items():
        tuning = scored.makespans
        holdout = evaluator.makespans(scored.candidate, "holdout")
        rows.append(_row(f"best {family}", scored.candidate, tuning, holdout, objective, reference, evaluator))
    chosen = verdict.chosen
    rows.insert(0, _row("written out", chosen.candidate, chosen.makespans, held["chosen"], objective, reference,
                        evaluator))
    return {
        "format": "rrfp-tune-report/1",
        "objective": str(objective),
        "shape": evaluator.shape.to_json(),
        "memory_budget": outcome.budget,
        "memory_budget_slots": evaluator.slots,
        "scenarios": {"tuning": len(evaluator.sets["tuning"]), "holdout": len(evaluator.sets["holdout"]),
                      "source": context.get("source")},
        "search": _search_effort(outcome),
        "verdict": {"kept_tuned": verdict.tuned_kept, "reason": verdict.reason, "gain_over_best_builtin": verdict.gain,
                    "hint": chosen.candidate.name, "rule": chosen.candidate.rule, "family": chosen.candidate.family},
        "best_fixed_order": _best_fixed(search, evaluator),
        "prediction": _prediction(held["chosen"], {"over_fixed_1f1b": held.get("fixed 1F1B"),
                                                   "over_best_builtin": held.get("best built-in"),
                                                   "over_traced_hint": held.get("traced hint"),
                                                   "over_best_fixed_order": held.get("best fixed order")},
                                  (context.get("replay") or {}).get("errors")),
        "rows": rows,
        "pareto": outcome.pareto,
        **context,
    }


def _search_effort(outcome: TuneOutcome) -> dict:
    """How the search was bounded and what it cost ([Note: two budgets] in runtime.tune.search): the budgets
    given, which one stopped it, the simulations that reproduce it (``--evaluations``), wall and CPU time so far
    (the report is the command's last work), and the throughput per worker."""
    search, jobs = outcome.search, outcome.jobs
    process, children = outcome.clock.cpu()
    rate = search.simulations / search.seconds if search.seconds > 0 else None
    return {"simulations": search.simulations, "stopped": search.stopped,
            "budgets": {"time_budget_s": outcome.time_budget, "evaluations": outcome.evaluations},
            "reproduce_with_evaluations": search.simulations, "jobs": jobs,
            "wall_s": outcome.clock.wall(), "search_wall_s": search.seconds,
            "cpu_s": process + children, "cpu_s_main": process, "cpu_s_workers": children,
            "simulations_per_second": rate,
            "simulations_per_second_per_worker": rate / jobs if rate is not None else None,
            "candidates_scored": len(search.scored), "candidates_raced": search.raced,
            "candidates": search.candidates, "trace": search.trace}


def _best_fixed(search: SearchResult, evaluator: Evaluator) -> dict | None:
    """The fastest fixed order within the budget the search scored ([Note: fixed candidates and the budget])."""
    best = search.best_fixed
    if best is None:
        return None
    return {"hint": best.candidate.name, "family": best.candidate.family, "tuning_objective": best.value,
            "peak_in_flight_per_rank": evaluator.peak_in_flight(best.candidate, "holdout")}


def baseline_label(chunks: int, placement: str) -> str:
    """What the baseline every gain is measured against is called in text (report.json keys say fixed 1F1B):
    ``fixed`` and the name tables give it (:func:`runtime.sched.evaluate.versus_label`)."""
    return "fixed " + versus_label(baseline_hint_name(chunks, placement)).removeprefix("vs ")


def _prediction(chosen: list[float], references: dict[str, list[float] | None],
                replay_errors: list[float] | None = None) -> dict:
    """What --check compares a new run with: the chosen hint's held-out makespans and gains.

    Each gain has the paired bootstrap interval of its mean, the p10..p90 range of the per-scenario
    gains (what one iteration may show), and ``range``: that p10..p90 widened by the simulator's own
    error, as measured on the traced run ([Note: predicted ranges]). ``makespan_range`` is widened the
    same way. Without a traced run (tables, a model) there is no measured error and no widening.

    [Note: predicted ranges]
        A replay of the traced hint on its own realized durations is off the measured step by
        ``e_i`` in iteration ``i`` (report.json ``replay.errors``). A measured makespan is then
        ``replayed / (1 + e)``, so the measured range is ``p10 / (1 + max e) .. p90 / (1 + min e)``.
        For a gain ``g = 1 - C / R`` a bias common to both makespans cancels; what is left is each
        one's deviation from the typical error, at most ``d = max |e_i - median e|``, and
        ``C (1 + a) / (R (1 + b)) ~ (C / R)(1 + a - b)`` moves ``g`` by at most ``2 d (1 - g)``.
        That is the margin added on each side of p10..p90, with ``g`` the estimate.
    """
    errors = [e for e in replay_errors or () if e > -1.0]
    low, high = _quantile(chosen, 0.1), _quantile(chosen, 0.9)
    out = {"makespan": summary(chosen), "makespan_range": [low, high]}
    deviation = 0.0
    if errors:
        typical = statistics.median(errors)
        deviation = max(abs(e - typical) for e in errors)
        out["makespan_range"] = [low / (1.0 + max(errors)), high / (1.0 + min(errors))]
        out["makespan_scenarios_range"] = [low, high]
        out["replay_deviation"] = deviation
    for label, reference in references.items():
        if reference:
            interval = paired_bootstrap(reference, chosen, seed=1)
            gains = [(r - c) / r for r, c in zip(reference, chosen) if r > 0]
            p10, p90 = _quantile(gains, 0.1), _quantile(gains, 0.9)
            margin = 2.0 * deviation * (1.0 - interval.estimate)
            out[f"gain_{label}"] = {"estimate": interval.estimate, "low": interval.low, "high": interval.high,
                                    "p10": p10, "p90": p90, "range": [p10 - margin, p90 + margin]}
    return out


def gain_range(gain: dict) -> tuple[float, float]:
    """The predicted range of a realized gain ([Note: predicted ranges]); p10..p90 in reports older than it."""
    low, high = gain.get("range", (gain["p10"], gain["p90"]))
    return low, high


def _quantile(values: list[float], level: float) -> float:
    from runtime.tune.evaluator import quantile

    return quantile(sorted(values), level)


def _row(label: str, candidate: Candidate, tuning: list[float], holdout: list[float], objective: Objective,
         reference: dict[str, list[float]], evaluator: Evaluator) -> dict:
    peaks = evaluator.peak_in_flight(candidate, "holdout")
    bubble, over_bound, over_universal, family = [], [], [], None
    for index in range(min(ROW_BOUND_SCENARIOS, len(evaluator.sets["holdout"]))):
        figures = evaluator.outcome(candidate, "holdout", index)
        if figures.bubble_fraction is not None:
            bubble.append(figures.bubble_fraction)
        own, universal, family = evaluator.bounds(candidate, "holdout", index)
        if math.isfinite(figures.makespan) and own > 0:
            over_bound.append(figures.makespan / own)
            over_universal.append(figures.makespan / universal)
    row = {"row": label, "hint": candidate.name, "family": candidate.family, "rule": candidate.rule,
           "tuning": {**summary(tuning), "objective": objective(tuning)},
           "holdout": {**summary(holdout), "objective": objective(holdout)},
           "bubble_fraction": statistics.fmean(bubble) if bubble else None,
           # [Note: bound per hint family]: over the bound of the row's family, and the universal one
           "makespan_over_bound": statistics.fmean(over_bound) if over_bound else None, "bound_family": family,
           "makespan_over_universal_bound": statistics.fmean(over_universal) if over_universal else None,
           "peak_in_flight": max(peaks), "peak_in_flight_per_rank": peaks}
    for name, values in reference.items():
        row[f"speedup_vs_{name.replace(' ', '_')}"] = objective(values) / objective(holdout) if holdout else None
    return row


def _over_bound(row: dict) -> str:
    own, universal = row.get("makespan_over_bound"), row.get("makespan_over_universal_bound")
    if own is None:
        return "-"
    return f"{own:.2f} ({row.get('bound_family')}; {universal:.2f})"


def render_markdown(data: dict) -> str:
    """report.md: readable on its own, with the commands to reproduce and to check."""
    lines = ["# rrfp tune-hint report", ""]
    shape = data["shape"]
    lines += [f"Shape: {shape['ranks']} ranks x {shape['chunks']} chunks, {shape['microbatches']} microbatches. "
              f"Objective: {data['objective']} makespan. Memory budget: {data['memory_budget']} "
              f"({min(data['memory_budget_slots'])}..{max(data['memory_budget_slots'])} slots per rank).", ""]
    if shape.get("placement", "looping") != "looping":
        lines += [f"Placement: {shape['placement']}. The baseline this report calls fixed 1F1B is fixed "
                  f"{baseline_hint_name(shape['chunks'], shape['placement'])} (ZB-V), V placement's counterpart: "
                  "the 1f1b budget is its per-rank peak in flight, and the 1F1B family is not searched (it places "
                  "stages looping).", ""]
    s = data["scenarios"]
    lines += [f"Scenarios: {s['tuning']} for tuning, {s['holdout']} held out, from {s['source']}.", ""]
    v = data["verdict"]
    lines += ["## Verdict", "", f"Written out: **{v['hint']}** under **{RULES[v['rule']].label}** "
              f"({v['family']}). {v['reason']}.", ""]
    torch = data.get("target") or {}
    if torch.get("csv"):
        checked = (f"torch {torch['torch_lowering']}'s lowering accepts it" if torch.get("torch_lowering")
                   else "torch did not import, so its lowering was not run")
        lines += ["## For torch", "", f"{torch['csv']}: the written-out order as torch's schedule CSV, tuned in "
                  f"fixed order (torch runs one order every step) within the memory {torch['memory_budget_from']} "
                  f"held. It completes in exactly its order and {checked}. Load it into a _PipelineScheduleRuntime "
                  f"with stages placed as Schedule{torch['schedule']} places them, {torch['microbatches']} "
                  f"microbatches: {torch['notes']} has the torchtitan options and the torch lines.", ""]
    p = data["prediction"]
    m = p["makespan"]
    scenarios_range = p.get("makespan_scenarios_range", p["makespan_range"])
    widened = "" if "makespan_scenarios_range" not in p else (
        f"; a run should measure {p['makespan_range'][0] * 1e3:.2f}..{p['makespan_range'][1] * 1e3:.2f} ms with the "
        f"simulator's error on the traced run")
    lines += [f"Predicted makespan on held-out scenarios: mean {m['mean'] * 1e3:.2f} ms, p50 {m['p50'] * 1e3:.2f} ms, "
              f"p90 {m['p90'] * 1e3:.2f} ms (p10..p90 {scenarios_range[0] * 1e3:.2f}..{scenarios_range[1] * 1e3:.2f} ms"
              f"{widened})."]
    best_fixed = data.get("best_fixed_order")
    fixed_label = "the best fixed order" + (f" ({best_fixed['hint']})" if best_fixed else "")
    for key, label in (("gain_over_fixed_1f1b", "fixed 1F1B"), ("gain_over_best_builtin", "the best built-in"),
                       ("gain_over_traced_hint", "the traced hint"), ("gain_over_best_fixed_order", fixed_label)):
        if key in p:
            g = p[key]
            low, high = gain_range(g)
            lines.append(f"Predicted gain over {label}: {g['estimate']:+.1%} (95% interval of the mean "
                         f"{g['low']:+.1%} .. {g['high']:+.1%}; per iteration p10..p90 {g['p10']:+.1%} .. "
                         f"{g['p90']:+.1%}; with the simulator's measured error {low:+.1%} .. {high:+.1%}).")
    lines += ["", "## Candidates (best of each family)", "",
              "| row | hint | rule | tuning mean | held-out mean | held-out p90 | held-out CVaR90 | bubble | peak in flight "
              "| vs fixed 1F1B | vs best built-in | vs best fixed | /bound |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        h = row["holdout"]

        def ratio(key):
            value = row.get(key)
            return "-" if value is None else f"{value:.3f}x"

        bubble = "-" if row["bubble_fraction"] is None else f"{row['bubble_fraction']:.1%}"
        over = " (over budget)" if row["rule"] == "fixed" and any(
            peak > slot for peak, slot in zip(row["peak_in_flight_per_rank"], data["memory_budget_slots"])) else ""
        lines.append(f"| {row['row']} | {row['hint']} | {RULES[row['rule']].label} | {row['tuning']['mean'] * 1e3:.2f} ms "
                     f"| {h['mean'] * 1e3:.2f} ms | {h['p90'] * 1e3:.2f} ms | {h['cvar90'] * 1e3:.2f} ms | {bubble} "
                     f"| {row['peak_in_flight']}{over} | {ratio('speedup_vs_fixed_1F1B')} | {ratio('speedup_vs_best_built-in')} "
                     f"| {ratio('speedup_vs_best_fixed_order')} | {_over_bound(row)} |")
    lines += ["", "Vs best fixed: over the fastest fixed order within the budget the search scored (sorted 1F1B, the "
              "built-ins and tuned fixed orders whose peak fits; docs/tuning.md), what readiness and search add "
              "beyond ordering by known cost at this memory. /bound: the held-out makespan over the lower bound of "
              "the row's hint family (full-backward or split graph; docs/simulator.md), mean of the first four "
              "held-out scenarios, and in brackets over the universal (free-split) bound, valid across families."]
    if data.get("pareto"):
        lines += ["", "## Memory (--memory-budget auto)", "", "| budget | max slots per rank | objective | chosen |",
                  "|---|---|---|---|"]
        for row in data["pareto"]:
            lines.append(f"| {row['budget']} | {row['max_slots']} | {row['objective'] * 1e3:.2f} ms | "
                         f"{'yes' if row['chosen'] else ''} |")
    replay = data.get("replay")
    if replay:
        lines += ["", "## Does the simulator reproduce the traced run?", "",
                  f"The traced hint replayed on its own realized durations is off by {replay['median_error']:+.1%} "
                  f"(median over iterations; worst {replay['worst_error']:+.1%})."]
        if abs(replay["worst_error"]) > 0.05:
            lines.append("**Warning: above 5%: predictions from these scenarios are less reliable.**")
    search = data["search"]
    raced = ""
    if search.get("candidates") and search.get("candidates_raced", 0) < search["candidates"]:
        raced = (f" The first race got through {search['candidates_raced']} of the portfolio's {search['candidates']} "
                 f"candidates before it stopped" + ("; a larger budget races the rest." if search["stopped"] in
                                                    ("time budget", "evaluations") else "."))
    lines += ["", "## Search", "", f"{search['simulations']:,} scenario simulations, {search['candidates_scored']} "
              f"candidates scored in full; stopped: {search['stopped']}.{raced}"]
    if "budgets" in search:  # wall and CPU time are in report.json only: with --evaluations this text is the same
        given = search["budgets"]  # on every machine, every time
        budgets = [f"{given['time_budget_s']:g} s" if given["time_budget_s"] else "",
                   f"{given['evaluations']:,} evaluations" if given["evaluations"] else ""]
        lines += [f"Budget: {' or '.join(filter(None, budgets))} ({search['jobs']} "
                  f"{'worker' if search['jobs'] == 1 else 'workers'}). The same search on any machine: "
                  f"--evaluations {search['reproduce_with_evaluations']} with the same seed and --jobs (below); "
                  "report.json has its wall and CPU time and simulations per second per worker."]
    commands = data.get("commands", {})
    if commands:
        lines += ["", "## Reproduce and check", ""]
        for label, command in commands.items():
            lines += [f"{label}:", "", "```sh", command, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def chosen_hint(outcome: TuneOutcome) -> HintOrder:
    """The hint to write: a static one as it is; a per-scenario built-in by its name's built form."""
    candidate = outcome.verdict.chosen.candidate
    if candidate.hint is not None:
        return candidate.hint
    shape = outcome.evaluator.shape
    return resolve(candidate.builtin, shape.ranks, shape.chunks, shape.microbatches, placement=shape.placement,
                   budget=outcome.evaluator.budget)  # cp and the planned order on uniform durations


__all__ = ["AUTO_BUDGETS", "HeldBudget", "Stopwatch", "TuneOutcome", "Verdict", "chosen_hint", "decide",
           "holdout_candidates", "render_markdown", "report", "tune"]
