"""``rrfp bench``: the headline comparisons as one matrix, run side by side, written as one results folder.

The matrix is data (:mod:`profiler.bench.matrix`); its cells are simulated by :mod:`profiler.bench.cells`,
the real runs (``rrfp run`` jobs, and torch's schedules through :mod:`profiler.bench.external`) are in
:mod:`profiler.bench.runs`, the tables, the paper's rows and the plots in :mod:`profiler.bench.report`, the
results folder (JSON, Markdown, the section for docs/benchmarks/bench-suite.md) in
:mod:`profiler.bench.results`. :func:`run_suite` runs them in order; the command line is :mod:`rrfp_cli.cmd_bench`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from profiler.bench import runs as bench_runs
from profiler.bench.cells import run_simulation, simulation_units
from profiler.bench.matrix import MATRIX_ROWS, TUNED, Settings, row_unavailable
from profiler.bench.report import write_plots
from profiler.bench.results import PLOTS, RESULTS_JSON, Suite, save, versions


def run_suite(settings: Settings, out: Path, command: str, progress_factory) -> dict:
    """Everything, in order: simulation, real runs, external; plots and Markdown at the end.

    ``progress_factory(total)`` is a context manager yielding ``update(done, status)``. Ctrl-C (or
    SIGTERM) keeps what finished: results are saved with ``interrupted: true`` and plots drawn from what
    is there, then the interrupt goes on (exit 130 / 143).
    """
    # The tree's commit as the run starts: a commit made while it runs must not be credited with its figures.
    suite = Suite(settings, out, command, {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": versions()})
    for row in MATRIX_ROWS:
        why = row_unavailable(row, settings)
        if why is not None and row.hint != TUNED:
            suite.note(f"row {row.name} skipped: {why}")
    began = time.perf_counter()
    real_units = bench_runs.units(settings)
    total = simulation_units(settings) + real_units
    try:
        with progress_factory(total) as update:
            done = run_simulation(suite, update)
            if settings.real:
                done = bench_runs.run_real(suite, update, done)
            else:
                suite.note("real runs skipped (--no-real)")
            if settings.external:
                bench_runs.run_external(suite, update, done)
            else:
                suite.note("external systems (torch.distributed.pipelining) skipped (--no-external)")
    except KeyboardInterrupt:
        suite.results["interrupted"] = True
        suite.results["wall_seconds"] = time.perf_counter() - began
        save(suite, final=True)
        _plots_if_any(suite, write_plots)
        raise
    suite.results["wall_seconds"] = time.perf_counter() - began
    save(suite, final=True)
    suite.results["plots"] = _plots_if_any(suite, write_plots)
    save(suite, final=True)
    return json.loads((out / RESULTS_JSON).read_text())


def _plots_if_any(suite: Suite, write_plots) -> list[str]:
    data = json.loads((suite.out / RESULTS_JSON).read_text())
    return [str(p.relative_to(suite.out)) for p in write_plots(data, suite.out / PLOTS)]
