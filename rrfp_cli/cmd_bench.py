"""``rrfp bench``: the headline comparisons in one command, written as a results folder.

A thin layer over :mod:`profiler.bench.suite` (the matrix, simulation, results), :mod:`profiler.bench.runs`
(real runs and torch's schedules) and :mod:`profiler.bench.report` (Markdown, plots): it parses and
checks the options, shows the progress bar, and prints where the results went.
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.bench.matrix import Settings
from rrfp_cli.options import SPLIT_OVERHEAD_HELP, JsonFlag
from rrfp_cli.output import Output

# Plain data (no torch, no polars): each option's default, full suite and --quick, in its help text.
_FULL, _QUICK = Settings(), Settings.quick_defaults()


def _default(field: str, spell=lambda value: f"{value:g}" if isinstance(value, float) else str(value)) -> str:
    """``[default: X; --quick Y]`` (``[default: X]`` where --quick keeps it) for a field of :class:`Settings`."""
    full, quick = spell(getattr(_FULL, field)), spell(getattr(_QUICK, field))
    return f"[default: {full}]" if full == quick else f"[default: {full}; --quick {quick}]"


def _listed(values) -> str:  # ", ": the lists take spaces, and a help line wraps between items
    return ", ".join(map(str, values))


def _sweep(sweep) -> str:
    return ", ".join(f"{kind}=" + ":".join(f"{level:g}" for level in levels) for kind, levels in sweep)


def bench(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Results folder (created; its files are never "
                                      "overwritten without --force).")],
    quick: Annotated[bool, typer.Option("--quick", help="A smaller matrix, fewer seeds and tiny real runs: under "
                                        "5 minutes on 2 cores.")] = False,
    workloads: Annotated[Optional[str], typer.Option(
        "--workloads", help=f"Comma-separated workload presets (rrfp simulate --help lists them) "
        f"{_default('workloads', _listed)}.")] = None,
    ranks: Annotated[Optional[str], typer.Option("--ranks", help="Comma-separated rank counts, e.g. 8,16,32 "
                                                 f"{_default('ranks', _listed)}.")] = None,
    budgets: Annotated[Optional[str], typer.Option("--budgets", help="Comma-separated memory budgets "
                                                   f"{_default('budgets', _listed)}.")] = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", help=f"Seeds per cell {_default('seeds')}.")] = None,
    iterations: Annotated[Optional[int], typer.Option("--iterations", help="Sampled iterations per seed "
                                                      f"{_default('iterations')}.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="First seed.")] = 0,
    jitter: Annotated[Optional[float], typer.Option("--jitter", help="Task noise (log-sd) of the matrix "
                                                    f"{_default('jitter')}.")] = None,
    tune_seconds: Annotated[Optional[float], typer.Option(
        "--tune-seconds", help=f"Search time of the tuned row per cell in seconds, 0 skips it "
        f"{_default('tune_seconds')}.")] = None,
    split_overhead: Annotated[Optional[float], typer.Option("--split-overhead", help=SPLIT_OVERHEAD_HELP)] = None,
    unknown_sweep: Annotated[Optional[str], typer.Option(
        "--unknown-sweep", help="Levels of the sweep of variability nobody knows beforehand, e.g. "
        "moe=1.3:1.7,cost-error=0.2, or none to skip it (rrfp simulate --unknown says what each kind is) "
        f"{_default('unknown_sweep', _sweep)}.")] = None,
    real: Annotated[bool, typer.Option("--real/--no-real", help="Real rrfp runs on this machine.")] = True,
    external: Annotated[bool, typer.Option("--external/--no-external", help="torch's schedules through "
                                           "benchmarks/cross_framework.py.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the suite's files in --out.")] = False,
    json_mode: JsonFlag = False,
) -> None:
    """Run the benchmark matrix (simulation, real runs, external systems); write tables, JSON and plots."""
    from profiler.bench.matrix import Settings, check_settings, parse_ranks, parse_unknown_sweep
    from profiler.bench.results import check_out
    from profiler.bench.suite import run_suite

    output = Output(json_mode)
    settings = Settings.quick_defaults() if quick else Settings()
    changes = {"seed": seed, "real": real, "external": external}
    if workloads is not None:
        changes["workloads"] = tuple(dict.fromkeys(w.strip() for w in workloads.split(",") if w.strip()))
    if ranks is not None:
        changes["ranks"] = parse_ranks(ranks)
    if unknown_sweep is not None:
        changes["unknown_sweep"] = parse_unknown_sweep(unknown_sweep)
    if budgets is not None:
        changes["budgets"] = tuple(dict.fromkeys(b.strip() for b in budgets.split(",") if b.strip()))
    for name, value in (("seeds", seeds), ("iterations", iterations), ("jitter", jitter),
                        ("tune_seconds", tune_seconds), ("split_overhead", split_overhead)):
        if value is not None:
            changes[name] = value
    settings = replace(settings, **changes)
    if "ranks" in changes:  # the sweep and the bubbles run at a rank count of the matrix: the largest
        def of_matrix(default: int) -> int:  # not above their default (they cost more per rank), else the smallest
            return max((r for r in settings.ranks if r <= default), default=settings.ranks[0])

        settings = replace(settings, variability_ranks=of_matrix(settings.variability_ranks),
                           bubble_ranks=of_matrix(settings.bubble_ranks))
    check_settings(settings)
    check_out(out, force)
    command = _command_line(ctx)

    @contextmanager
    def progress(total: int):
        with output.status_progress("benchmarking", total) as update:
            yield update

    data = run_suite(settings, out, command, progress)
    summary = {"out": str(out), "files": sorted(["results.json", "results.md", "benchmarks_section.md",
                                                 *data.get("plots", [])]),
               "wall_seconds": data.get("wall_seconds"), "notes": data.get("notes", [])}
    output.result(summary, lambda console: (
        [console.print(f"note: {n}", markup=False) for n in summary["notes"]],
        console.print(f"wrote {len(summary['files'])} files to {out} in {summary['wall_seconds']:.0f} s "
                      f"(results.md, benchmarks_section.md, results.json, plots/)", markup=False)))


def _command_line(ctx: typer.Context) -> str:
    """The command as given: every option the user set (not the defaults), in its canonical spelling."""
    words = ["rrfp", "bench"]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name != "COMMANDLINE":
            continue
        value = ctx.params[param.name]
        if param.is_flag:
            if param.secondary_opts:  # --real/--no-real
                words.append(param.opts[0] if value else param.secondary_opts[0])
            elif value:
                words.append(param.opts[0])
        else:
            words += [param.opts[0], str(value)]
    return shlex.join(words)
