"""Fitting per-(stage, kind) cost models on a trace, and the expectation they give each iteration.

:func:`fit_cost_model` fits ``duration = a + b * tokens + c * images`` (see
:mod:`hints.costs`) by least squares on the traced tasks of some iterations,
one fit per model stage and task kind. A feature that does not vary in the
trace (every microbatch has the same tokens; no images at all) carries no
information and is left out of that fit (its coefficient is 0), so the fit
never divides by zero; a (stage, kind) whose durations do not depend on the
features gets its mean.

:func:`expected_from_model` turns the model and an iteration's microbatch
features into what the tuner and the lookahead rule may know before the
iteration runs ([Note: expected durations] in :mod:`runtime.durations.variability`).
"""

from __future__ import annotations

import statistics
from typing import Sequence

import polars as pl

from hints.costs import CostModel
from hints.errors import UserError
from hints.tasks import PipelineShape
from profiler.trace.reader import TraceFrames
from runtime.durations.variability import Durations


def microbatch_features(frames: TraceFrames, iteration: int) -> list[dict[str, float]]:
    """Per microbatch of ``iteration``: its ``tokens`` and ``images`` as the trace recorded them (0 if absent)."""
    tasks = frames.tasks.filter((pl.col("iteration") == iteration) & (pl.col("kind") == "F"))
    m = int(next(iter(frames.meta.values()))["microbatches"])
    features = [{"tokens": 0.0, "images": 0.0} for _ in range(m)]
    for mb, tokens, images in tasks.select("microbatch", "tokens", "images").iter_rows():
        if 0 <= mb < m:
            features[mb] = {"tokens": float(tokens or 0), "images": float(images or 0)}
    return features


def fit_cost_model(frames: TraceFrames, iterations: Sequence[int]) -> CostModel:
    """Least-squares ``a + b * tokens + c * images`` per (stage, kind) over ``iterations`` of the trace."""
    meta = next(iter(frames.meta.values()))
    stages = int(meta["stages"]) * int(meta["chunks"])
    tasks = frames.tasks.filter(pl.col("iteration").is_in(list(iterations)))
    if tasks.height == 0:
        raise UserError(f"no traced task in iterations {list(iterations)}", frames.path)
    coefficients = {}
    for (stage, kind), group in tasks.group_by(["stage", "kind"], maintain_order=True):
        y = [d * 1e-9 for d in group.get_column("duration_ns").to_list()]
        columns = [[float(v or 0) for v in group.get_column(name).to_list()] for name in ("tokens", "images")]
        coefficients[f"{stage}{kind}"] = _fit(y, columns)
    return CostModel(stages, dict(sorted(coefficients.items(), key=lambda kv: (int(kv[0][:-1]), kv[0][-1]))))


def _fit(y: list[float], columns: list[list[float]]) -> tuple[float, float, float]:
    """Intercept and one slope per column; columns that do not vary (or are collinear) get slope 0."""
    varying = [i for i, column in enumerate(columns) if len(set(column)) > 1]
    while varying:
        solution = _least_squares(y, [columns[i] for i in varying])
        if solution is not None:
            slopes = [0.0] * len(columns)
            for i, slope in zip(varying, solution[1:]):
                slopes[i] = slope
            return (solution[0], *slopes)
        varying.pop()  # singular: drop the last feature and try again
    return (statistics.fmean(y), 0.0, 0.0)


def _least_squares(y: list[float], columns: list[list[float]]) -> list[float] | None:
    """Normal equations with Gaussian elimination (at most 3 unknowns); None if singular."""
    rows = [[1.0, *values] for values in zip(*columns)]
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * t for r, t in zip(rows, y)) for i in range(n)]
    scale = max(abs(a[i][i]) for i in range(n)) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-12 * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * p for x, p in zip(a[r], a[col])]
                b[r] -= factor * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def expected_from_model(model: CostModel, shape: PipelineShape, features: Sequence[dict[str, float]],
                        latencies: Durations | None = None) -> Durations:
    """The expectation of an iteration whose microbatches hold ``features``, per the cost model.

    Latencies are ``latencies``' per (stage, direction) means when given, else 0.
    """
    stages, m = shape.stages, shape.microbatches
    if model.stages != stages:
        raise UserError(f"the cost model covers {model.stages} model stages but the run has {stages}", "cost model")

    def predicted(kind: str) -> list[list[float]] | None:
        if f"0{kind}" not in model.coefficients:
            return None
        return [[model.predict(k, kind, f["tokens"], f["images"]) for f in features] for k in range(stages)]

    forward, backward = predicted("F"), predicted("B")
    input_grad, weight_grad = predicted("I"), predicted("W")
    if backward is None:
        backward = [[i + w for i, w in zip(ri, rw)] for ri, rw in zip(input_grad, weight_grad)]

    def means(rows):
        return [[sum(row) / m] * m for row in rows]

    zeros = [[0.0] * m for _ in range(stages)]
    expected = Durations(stages, m, forward, backward,
                         means(latencies.send_forward) if latencies else zeros,
                         means(latencies.send_backward) if latencies else [row[:] for row in zeros],
                         model.microbatch_costs(features), input_grad=input_grad, weight_grad=weight_grad,
                         source="cost model", features=list(features))
    expected.expectation = expected
    return expected


__all__ = ["expected_from_model", "fit_cost_model", "microbatch_features"]
