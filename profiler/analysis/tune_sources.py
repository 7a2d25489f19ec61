"""Scenarios for ``rrfp tune-hint`` from traced runs: realized iterations, a cost model, and a replay check.

For each run directory: every complete traced iteration (iteration 0, which
pays for start-up, is dropped unless ``keep_first``) becomes a recorded
scenario: its realized durations and latencies
(:func:`profiler.analysis.realized.realized_iterations`) and, as what could be known
beforehand, the expectation a cost model fitted on the tuning iterations
predicts from what each microbatch held (:mod:`profiler.analysis.costs`). Bootstrap
and hold-out follow :func:`runtime.tune.scenarios.from_recorded`; the iterations
of several runs are put one after the other, in the order given.

The replay check replays each iteration's traced hint under the traced rule
with the dispatch overhead calibrated from the trace, against the measured
makespan (as ``rrfp trace sensitivity`` does): if the simulator cannot
reproduce the run, nothing it predicts for other hints can be trusted, and
the report says so.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hints.costs import CostModel
from hints.errors import UserError
from hints.tasks import PipelineShape
from profiler.analysis.costs import expected_from_model, fit_cost_model, microbatch_features
from profiler.analysis.realized import dispatch_overhead, realized_iterations
from profiler.analysis.replay import trace_hint, traced_rule
from profiler.analysis.windows import complete_iterations, iteration_windows, pipeline_shape, traced_iterations
from profiler.trace.reader import read_trace
from runtime.tune.scenarios import ScenarioSet, from_recorded


@dataclass
class TracedSources:
    scenarios: ScenarioSet
    cost_model: CostModel
    overhead: float  # calibrated per-dispatch overhead (median over runs)
    meta: dict  # the first run's trace metadata (hint, rule, budget, workload)
    config: dict | None  # the first run's config.json, when present
    replay: dict  # median and worst replay error of the traced hint, per-iteration errors
    traced_hint: object  # hints.orders.HintOrder of the first replayed iteration


def from_runs(runs: Sequence[str | Path], shape: PipelineShape | None, holdout: float, tuning_scenarios: int,
              holdout_scenarios: int, seed: int, keep_first: bool = False) -> TracedSources:
    """Scenarios from the traces of ``runs`` (see the module docstring); ``shape`` checks ranks/chunks/microbatches."""
    if not runs:
        raise UserError("give at least one run directory", "rrfp tune-hint")
    loaded = []
    for run in runs:
        frames = read_trace(run)
        run_shape = pipeline_shape(frames)
        unsplit = run_shape.with_split(False)
        if shape is not None and (shape.ranks, shape.chunks, shape.microbatches) != \
                (unsplit.ranks, unsplit.chunks, unsplit.microbatches):
            raise UserError(f"the trace is of {unsplit.describe()} but {shape.describe()} was asked "
                            f"(-p/-v/-m)", str(run))
        if loaded and unsplit != loaded[0][2]:
            raise UserError(f"the trace is of {unsplit.describe()}, the first run of "
                            f"{loaded[0][2].describe()}: tune runs of one shape together", str(run))
        complete = _complete(frames)
        iterations = complete if keep_first else [i for i in complete if i != 0]
        if not iterations:
            traced = traced_iterations(frames)
            raise UserError(f"no complete traced iteration after dropping iteration 0 (traced: "
                            f"{traced or 'none'}); run more iterations, or trace them", str(run))
        loaded.append((run, frames, unsplit, iterations))
    shape = loaded[0][2]
    # The cost model is fitted on the iterations that will be tuned on (the held-out ones stay unseen).
    ordered = [(run, frames, it) for run, frames, _, its in loaded for it in its]
    cut = max(1, len(ordered) - max(1, round(len(ordered) * holdout))) if len(ordered) > 1 else 1
    tuning_part = ordered[:cut]
    cost_model = _fit(tuning_part, shape)
    recorded, errors, overheads = [], [], []
    traced_hint = None
    for number, (run, frames, iteration) in enumerate(ordered):
        (realized,) = realized_iterations(frames, [iteration])
        features = microbatch_features(frames, iteration)
        expected = expected_from_model(cost_model, shape, features, realized.durations)
        realized.durations.features = features
        expected.features = features
        realized.durations.expectation = expected
        recorded.append((number, realized.durations, expected))
    measured = []
    for run, frames, _, iterations in loaded:
        calibration = dispatch_overhead(frames, iterations)
        overheads.append(calibration.per_task_s)
        errors += _replay_errors(frames, iterations, calibration.per_task_s)
        traced_hint = traced_hint or trace_hint(frames, iterations[0])
        windows = dict(iteration_windows(frames).select("iteration", "makespan_ns").iter_rows())
        measured += [windows[i] * 1e-9 for i in iterations]
    overhead = statistics.median(overheads)
    source = ", ".join(str(run) for run, *_ in loaded)
    scenarios = from_recorded(shape, recorded, holdout, tuning_scenarios, holdout_scenarios, seed,
                              f"{len(ordered)} traced iterations of {source}")
    first_run = Path(loaded[0][0])
    config_file = first_run / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else None
    meta = dict(next(iter(loaded[0][1].meta.values())))
    meta["rule"] = traced_rule(loaded[0][1])
    replay = {"median_error": statistics.median(errors) if errors else 0.0,
              "worst_error": max(errors, key=abs) if errors else 0.0, "errors": errors,
              "task_overhead_s": overhead, "measured_s": statistics.median(measured)}
    return TracedSources(scenarios, cost_model, overhead, meta, config, replay, traced_hint)


def _complete(frames) -> list[int]:
    try:
        return complete_iterations(frames)
    except UserError:
        return []


def _fit(part, shape: PipelineShape) -> CostModel:
    by_run: dict[int, tuple] = {}
    for run, frames, iteration in part:
        by_run.setdefault(id(frames), (frames, []))[1].append(iteration)
    models = [fit_cost_model(frames, iterations) for frames, iterations in by_run.values()]
    if len(models) == 1:
        return models[0]
    # Several runs: the mean of their coefficients (the runs are of one shape and workload).
    keys = models[0].coefficients.keys()
    return CostModel(models[0].stages, {k: tuple(statistics.fmean(m.coefficients[k][j] for m in models
                                                                   if k in m.coefficients) for j in range(3))
                                        for k in keys})


def _replay_errors(frames, iterations: list[int], overhead: float) -> list[float]:
    """Per iteration, (replayed - measured) / measured for the traced hint under the traced rule."""
    from runtime.sched.budget import MemoryBudget
    from runtime.sched.simulator import simulate

    meta = next(iter(frames.meta.values()))
    budget = MemoryBudget.parse(meta.get("memory_budget", "1f1b"))
    rule = traced_rule(frames)
    measured = {i: ns * 1e-9 for i, ns in iteration_windows(frames).select("iteration", "makespan_ns").iter_rows()}
    errors = []
    for realized in realized_iterations(frames, iterations):
        result = simulate(trace_hint(frames, realized.iteration), realized.durations, rule, budget, overhead=overhead)
        replayed = result.makespan - overhead
        errors.append((replayed - measured[realized.iteration]) / measured[realized.iteration])
    return errors


__all__ = ["TracedSources", "from_runs"]
