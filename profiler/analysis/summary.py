"""One trace at a glance (:func:`summary`) and two side by side (:func:`compare`).

Both put together the other analyses: windows, bubbles by [Note: bubble categories] in
:mod:`profiler.analysis.bubbles`, hint conformance.
"""

from __future__ import annotations

import statistics

import polars as pl

from hints.tasks import ranges
from profiler.analysis.bubbles import BUBBLE_COLUMNS, bubble_totals, bubbles
from profiler.analysis.conformance import conformance
from profiler.analysis.windows import iteration_windows, pipeline_shape, traced_iterations
from profiler.trace.reader import TraceFrames


def summary(frames: TraceFrames) -> dict:
    """The run's configuration, iterations, median makespan, utilization, idle shares by cause and conformance."""
    meta = next(iter(frames.meta.values()))
    windows = iteration_windows(frames)
    totals = bubble_totals(bubbles(frames)).filter(pl.col("rank") == "all").row(0, named=True)
    agreement = conformance(frames)
    makespans = windows.get_column("makespan_ns").to_list()
    idle = totals["makespan_ns"] - totals["busy_ns"]
    shape = pipeline_shape(frames)
    return {
        "trace": frames.path,
        "job": meta.get("job"),
        "workload": meta.get("workload"),
        "shape": shape.describe(),
        "backward": shape.describe_backward(),
        "policy": meta.get("policy"),
        "p2p": meta.get("p2p", "async"),  # traces older than --p2p ran async
        "hint": meta.get("hint"),
        "memory_budget": meta.get("memory_budget"),
        "timing": meta.get("timing"),
        "grid": f"tp {meta['tp']} x dp {meta['dp']} (analyses read the TP leaders of replica 0)"
        if "tp" in meta else None,
        "ranks": frames.ranks,
        "iterations": len(makespans),
        "iteration_numbers": traced_iterations(frames),
        "median_makespan_s": statistics.median(makespans) * 1e-9 if makespans else None,
        "utilization": totals["utilization"],
        "idle_share": {name.removesuffix("_ns"): (totals[name] / idle if idle else 0.0) for name in BUBBLE_COLUMNS},
        "skips": int(agreement.get_column("skips").sum()) if agreement.height else 0,
        "mean_kendall_tau": agreement.get_column("kendall_tau").mean() if agreement.height else None,
        "max_clock_error_ns": max(int(m.get("clock_error_ns", 0)) for m in frames.meta.values()),
        "auto": auto_decisions(frames),
        "source": meta.get("source", "rrfp"),  # torch-profiler: imported, no arbiter (profiler.trace.torch_profile)
        "warnings": frames.warnings,
    }


def auto_decisions(frames: TraceFrames) -> dict | None:
    """``--policy auto``: per iteration the rule it ran (rank 0's slices: every rank of a replica decides
    alike), how many iterations ran fixed and how often the rule switched; None for other runs."""
    rows = frames.iterations.filter(pl.col("rule").is_not_null())
    if rows.height == 0:
        return None
    rows = rows.filter(pl.col("rank") == rows.get_column("rank").min())
    rules = rows.sort("iteration").get_column("rule").to_list()
    return {"rules": rules, "fixed_iterations": sum(1 for r in rules if r == "fixed"),
            "switches": sum(1 for a, b in zip(rules, rules[1:]) if a != b)}


def compare(a: TraceFrames, b: TraceFrames) -> pl.DataFrame:
    """Two runs side by side: makespan, utilization and the bubble breakdown (seconds per iteration)."""
    rows = []
    for label, frames in (("A", a), ("B", b)):
        totals = bubble_totals(bubbles(frames)).filter(pl.col("rank") == "all").row(0, named=True)
        iterations = len(traced_iterations(frames))
        ranks = frames.ranks
        row = {"run": label, "trace": frames.path, "iterations": ranges(traced_iterations(frames)),
               "median_makespan_s": summary(frames)["median_makespan_s"],
               "utilization": totals["utilization"]}
        for name in BUBBLE_COLUMNS:
            row[name.replace("_ns", "_s")] = totals[name] * 1e-9 / max(1, iterations * ranks)
        rows.append(row)
    frame = pl.DataFrame(rows)
    speedup = rows[0]["median_makespan_s"] / rows[1]["median_makespan_s"]
    return frame.with_columns(pl.Series("speedup_vs_A", [1.0, speedup]))
